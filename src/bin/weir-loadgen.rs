//! weir-loadgen: pushes real remote-write traffic at one or more weir replicas, open loop,
//! and reports what was offered, admitted and rejected, per target and per second.
//!
//! ```text
//! weir-loadgen --target http://127.0.0.1:8080 --target http://127.0.0.1:8081 \
//!     --split 70,30 --samples-per-second 30000 --series-per-request 100 \
//!     --tenants team-a --duration 30s --output result.json
//! ```
//!
//! Open loop: request *i* is due at `start + i / rate` whether or not earlier ones have
//! answered, so a slow server cannot slow the offered load down (no coordinated omission).
//! When `--max-outstanding` requests are already waiting, a due request is not sent and is
//! counted as `unsent`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use serde::Serialize;
use tokio::sync::Semaphore;
use weir::remote_write::prompb::WriteRequest;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "weir-loadgen",
    about = "Open-loop remote-write load generator for weir"
)]
struct Args {
    /// Base URL of a replica (repeat for several); requests go to `<target>/api/v1/push`.
    #[arg(long = "target", required = true)]
    targets: Vec<String>,

    /// Share of requests per target, e.g. `70,20,10` (default: even).
    #[arg(long, value_delimiter = ',')]
    split: Vec<f64>,

    /// A later split: `SECONDS=W1,W2,…` switches the split at that second (repeatable),
    /// e.g. `10=0,0,100`.
    #[arg(long = "split-at")]
    split_at: Vec<String>,

    /// Offered load in samples per second (total over all targets and tenants).
    #[arg(long, conflicts_with = "requests_per_second")]
    samples_per_second: Option<f64>,

    /// Offered load in requests per second.
    #[arg(long)]
    requests_per_second: Option<f64>,

    /// Series per request, one sample each.
    #[arg(long, default_value_t = 100)]
    series_per_request: usize,

    /// Tenants, comma-separated; requests go to them in turn.
    #[arg(long, value_delimiter = ',', default_value = "loadgen")]
    tenants: Vec<String>,

    /// How long to send.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,

    /// Requests waiting for an answer at once, at most.
    #[arg(long, default_value_t = 512)]
    max_outstanding: usize,

    /// Per-request timeout.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    timeout: Duration,

    /// Where to write the JSON report.
    #[arg(long, default_value = "loadgen-result.json")]
    output: String,

    /// No live progress line.
    #[arg(long)]
    quiet: bool,

    /// Treat a target that refuses connections as gone: its share moves to the others, as a
    /// load balancer's health check would move it.
    #[arg(long)]
    failover: bool,
}

/// Counts for one target, or for all.
#[derive(Debug, Clone, Default, Serialize)]
struct Counts {
    requests: u64,
    offered_samples: u64,
    admitted_samples: u64,
    rejected_samples: u64,
    failed_samples: u64,
    unsent_requests: u64,
    status: BTreeMap<String, u64>,
}

impl Counts {
    fn record(&mut self, outcome: &Outcome, samples: u64) {
        self.requests += 1;
        self.offered_samples += samples;
        match outcome {
            Outcome::Unsent => self.unsent_requests += 1,
            Outcome::Status(200..=299) => self.admitted_samples += samples,
            Outcome::Status(429) => self.rejected_samples += samples,
            Outcome::Status(_) | Outcome::Error(_) => self.failed_samples += samples,
        }
        let key = match outcome {
            Outcome::Unsent => "unsent".to_string(),
            Outcome::Status(code) => code.to_string(),
            Outcome::Error(kind) => kind.to_string(),
        };
        *self.status.entry(key).or_default() += 1;
    }
}

enum Outcome {
    Status(u16),
    Error(&'static str),
    Unsent,
}

#[derive(Default)]
struct Stats {
    total: Counts,
    targets: Vec<Counts>,
    latencies_us: Vec<Vec<u64>>,
    /// Per second (by send time): per target (offered, admitted).
    timeline: Vec<Vec<(u64, u64)>>,
}

#[derive(Serialize)]
struct Rates {
    offered_samples_per_second: f64,
    admitted_samples_per_second: f64,
    rejected_samples_per_second: f64,
    failed_samples_per_second: f64,
    latency_ms_p50: Option<f64>,
    latency_ms_p99: Option<f64>,
}

#[derive(Serialize)]
struct TargetReport {
    target: String,
    #[serde(flatten)]
    rates: Rates,
    counts: Counts,
}

#[derive(Serialize)]
struct Second {
    second: usize,
    offered_samples: u64,
    admitted_samples: u64,
    admitted_per_target: Vec<u64>,
}

#[derive(Serialize)]
struct Report {
    targets: Vec<String>,
    tenants: Vec<String>,
    duration_seconds: f64,
    series_per_request: usize,
    requests_per_second: f64,
    total: TargetReport,
    per_target: Vec<TargetReport>,
    timeline: Vec<Second>,
}

/// Which target request `index` goes to: smooth weighted round robin, deterministic.
struct Splitter {
    schedule: Vec<(f64, Vec<f64>)>,
    current: Vec<f64>,
}

/// Targets found unreachable with `--failover`.
type Down = Arc<Vec<std::sync::atomic::AtomicBool>>;

impl Splitter {
    fn new(first: Vec<f64>, later: Vec<(f64, Vec<f64>)>) -> Self {
        let mut schedule = vec![(0.0, first)];
        schedule.extend(later);
        schedule.sort_by(|a, b| a.0.total_cmp(&b.0));
        let targets = schedule[0].1.len();
        Splitter {
            schedule,
            current: vec![0.0; targets],
        }
    }

    /// The next target; targets marked down get no share (unless all are down).
    fn pick(&mut self, elapsed_seconds: f64, down: &[bool]) -> usize {
        let scheduled = &self
            .schedule
            .iter()
            .rev()
            .find(|(at, _)| *at <= elapsed_seconds)
            .expect("schedule starts at 0")
            .1;
        let mut weights: Vec<f64> = scheduled
            .iter()
            .zip(down)
            .map(|(weight, down)| if *down { 0.0 } else { *weight })
            .collect();
        if weights.iter().sum::<f64>() == 0.0 {
            // The split sends nothing to the live targets: spread evenly over them.
            weights = down
                .iter()
                .map(|down| if *down { 0.0 } else { 1.0 })
                .collect();
            if weights.iter().sum::<f64>() == 0.0 {
                weights = scheduled.clone();
            }
        }
        let total: f64 = weights.iter().sum();
        for (current, weight) in self.current.iter_mut().zip(&weights) {
            *current += weight;
        }
        let (best, _) = self
            .current
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .expect("at least one target");
        self.current[best] -= total;
        best
    }
}

fn parse_weights(text: &str, targets: usize) -> anyhow::Result<Vec<f64>> {
    let weights: Vec<f64> = text
        .split(',')
        .map(|w| w.trim().parse::<f64>())
        .collect::<Result<_, _>>()?;
    check_weights(&weights, targets)?;
    Ok(weights)
}

fn check_weights(weights: &[f64], targets: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        weights.len() == targets,
        "a split needs one weight per target ({targets}), got {}",
        weights.len()
    );
    anyhow::ensure!(
        weights.iter().all(|w| w.is_finite() && *w >= 0.0) && weights.iter().sum::<f64>() > 0.0,
        "split weights must be ≥ 0 and not all 0"
    );
    Ok(())
}

fn percentile(sorted: &[u64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Some(sorted[index] as f64 / 1000.0)
}

fn rates(counts: &Counts, latencies: &mut [u64], seconds: f64) -> Rates {
    latencies.sort_unstable();
    Rates {
        offered_samples_per_second: counts.offered_samples as f64 / seconds,
        admitted_samples_per_second: counts.admitted_samples as f64 / seconds,
        rejected_samples_per_second: counts.rejected_samples as f64 / seconds,
        failed_samples_per_second: counts.failed_samples as f64 / seconds,
        latency_ms_p50: percentile(latencies, 0.5),
        latency_ms_p99: percentile(latencies, 0.99),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let targets = args.targets.len();
    let split = if args.split.is_empty() {
        vec![1.0; targets]
    } else {
        check_weights(&args.split, targets)?;
        args.split.clone()
    };
    let mut later = Vec::new();
    for entry in &args.split_at {
        let (at, weights) = entry
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--split-at wants SECONDS=W1,W2,…, got {entry:?}"))?;
        later.push((at.parse::<f64>()?, parse_weights(weights, targets)?));
    }
    anyhow::ensure!(
        args.series_per_request > 0,
        "--series-per-request must be ≥ 1"
    );
    let requests_per_second = match (args.samples_per_second, args.requests_per_second) {
        (Some(samples), None) => samples / args.series_per_request as f64,
        (None, Some(requests)) => requests,
        _ => anyhow::bail!("give --samples-per-second or --requests-per-second"),
    };
    anyhow::ensure!(requests_per_second > 0.0, "the rate must be > 0");

    // Bodies are encoded up front (a few per tenant) so the generator spends its CPU sending.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let bodies: Vec<Vec<bytes::Bytes>> = args
        .tenants
        .iter()
        .enumerate()
        .map(|(t, _)| {
            (0..4)
                .map(|k| {
                    bytes::Bytes::from(
                        WriteRequest::synthetic(
                            args.series_per_request,
                            (t * 4 + k) as u64,
                            now_ms,
                        )
                        .encode_snappy(),
                    )
                })
                .collect()
        })
        .collect();
    let urls: Vec<String> = args
        .targets
        .iter()
        .map(|t| format!("{}/api/v1/push", t.trim_end_matches('/')))
        .collect();
    let client = reqwest::Client::builder()
        .timeout(args.timeout)
        .pool_max_idle_per_host(args.max_outstanding)
        .build()?;

    let seconds = args.duration.as_secs_f64().ceil() as usize;
    let stats = Arc::new(Mutex::new(Stats {
        targets: vec![Counts::default(); targets],
        latencies_us: vec![Vec::new(); targets],
        timeline: vec![vec![(0, 0); targets]; seconds + 1],
        ..Stats::default()
    }));
    let outstanding = Arc::new(Semaphore::new(args.max_outstanding));
    let samples = args.series_per_request as u64;
    let total_requests = (requests_per_second * args.duration.as_secs_f64()).round() as u64;
    let mut splitter = Splitter::new(split, later);
    let down: Down = Arc::new((0..targets).map(|_| Default::default()).collect());
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let progress = (!args.quiet).then(|| spawn_progress(Arc::clone(&stats), start, targets));

    for index in 0..total_requests {
        let due = start + Duration::from_secs_f64(index as f64 / requests_per_second);
        tokio::time::sleep_until(due.into()).await;
        let elapsed = due.duration_since(start).as_secs_f64();
        let down_now: Vec<bool> = down
            .iter()
            .map(|flag| flag.load(std::sync::atomic::Ordering::Relaxed))
            .collect();
        let target = splitter.pick(elapsed, &down_now);
        let second = (elapsed as usize).min(seconds);
        let tenant = (index % args.tenants.len() as u64) as usize;
        let Ok(permit) = Arc::clone(&outstanding).try_acquire_owned() else {
            let mut stats = stats.lock().unwrap();
            stats.total.record(&Outcome::Unsent, samples);
            stats.targets[target].record(&Outcome::Unsent, samples);
            stats.timeline[second][target].0 += samples;
            continue;
        };
        let request = client
            .post(&urls[target])
            .header("Content-Encoding", "snappy")
            .header("Content-Type", "application/x-protobuf")
            .header("X-Prometheus-Remote-Write-Version", "0.1.0")
            .header("X-Scope-OrgID", &args.tenants[tenant])
            .body(bodies[tenant][(index / args.tenants.len() as u64 % 4) as usize].clone());
        let stats = Arc::clone(&stats);
        let down = Arc::clone(&down);
        let failover = args.failover;
        tasks.spawn(async move {
            let sent = Instant::now();
            let outcome = match request.send().await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let _ = response.bytes().await;
                    Outcome::Status(status)
                }
                Err(err) if err.is_timeout() => Outcome::Error("timeout"),
                Err(err) if err.is_connect() => {
                    if failover {
                        down[target].store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    Outcome::Error("connect_error")
                }
                Err(_) => Outcome::Error("error"),
            };
            let latency = sent.elapsed().as_micros() as u64;
            drop(permit);
            let mut stats = stats.lock().unwrap();
            stats.total.record(&outcome, samples);
            stats.targets[target].record(&outcome, samples);
            stats.latencies_us[target].push(latency);
            let cell = &mut stats.timeline[second][target];
            cell.0 += samples;
            if matches!(outcome, Outcome::Status(200..=299)) {
                cell.1 += samples;
            }
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    if let Some(progress) = progress {
        progress.abort();
        eprintln!();
    }

    let elapsed = args.duration.as_secs_f64();
    let mut stats = Arc::try_unwrap(stats)
        .map_err(|_| anyhow::anyhow!("tasks still hold the stats"))?
        .into_inner()
        .unwrap();
    let mut all_latencies: Vec<u64> = stats.latencies_us.iter().flatten().copied().collect();
    let per_target: Vec<TargetReport> = (0..targets)
        .map(|t| TargetReport {
            target: args.targets[t].clone(),
            rates: rates(&stats.targets[t], &mut stats.latencies_us[t], elapsed),
            counts: stats.targets[t].clone(),
        })
        .collect();
    let report = Report {
        targets: args.targets.clone(),
        tenants: args.tenants.clone(),
        duration_seconds: elapsed,
        series_per_request: args.series_per_request,
        requests_per_second,
        total: TargetReport {
            target: "total".into(),
            rates: rates(&stats.total, &mut all_latencies, elapsed),
            counts: stats.total.clone(),
        },
        per_target,
        timeline: stats
            .timeline
            .iter()
            .enumerate()
            .take(seconds)
            .map(|(second, cells)| Second {
                second,
                offered_samples: cells.iter().map(|c| c.0).sum(),
                admitted_samples: cells.iter().map(|c| c.1).sum(),
                admitted_per_target: cells.iter().map(|c| c.1).collect(),
            })
            .collect(),
    };
    std::fs::write(&args.output, serde_json::to_string_pretty(&report)?)?;
    print_summary(&report);
    eprintln!("report written to {}", args.output);
    Ok(())
}

fn spawn_progress(
    stats: Arc<Mutex<Stats>>,
    start: Instant,
    targets: usize,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(Duration::from_secs(1));
        ticker.tick().await;
        let mut last = (0u64, 0u64, 0u64);
        loop {
            ticker.tick().await;
            let stats = stats.lock().unwrap();
            let now = (
                stats.total.offered_samples,
                stats.total.admitted_samples,
                stats.total.rejected_samples,
            );
            let per_target: Vec<String> = (0..targets)
                .map(|t| stats.targets[t].admitted_samples.to_string())
                .collect();
            eprint!(
                "\r[{:>5.1}s] offered {:>9}/s admitted {:>9}/s rejected {:>9}/s | admitted per target (total): {}   ",
                start.elapsed().as_secs_f64(),
                now.0 - last.0,
                now.1 - last.1,
                now.2 - last.2,
                per_target.join(" "),
            );
            last = now;
        }
    })
}

fn print_summary(report: &Report) {
    println!(
        "{:<28} {:>12} {:>12} {:>12} {:>10} {:>10}  status",
        "target", "offered/s", "admitted/s", "rejected/s", "p50 ms", "p99 ms"
    );
    for row in report
        .per_target
        .iter()
        .chain(std::iter::once(&report.total))
    {
        println!(
            "{:<28} {:>12.0} {:>12.0} {:>12.0} {:>10.2} {:>10.2}  {:?}",
            row.target,
            row.rates.offered_samples_per_second,
            row.rates.admitted_samples_per_second,
            row.rates.rejected_samples_per_second,
            row.rates.latency_ms_p50.unwrap_or(f64::NAN),
            row.rates.latency_ms_p99.unwrap_or(f64::NAN),
            row.counts.status,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitter_follows_weights_and_schedule() {
        let mut splitter = Splitter::new(vec![70.0, 20.0, 10.0], vec![(10.0, vec![0.0, 0.0, 1.0])]);
        let mut counts = [0; 3];
        let up = [false; 3];
        for _ in 0..1000 {
            counts[splitter.pick(0.0, &up)] += 1;
        }
        assert_eq!(counts, [700, 200, 100]);
        assert!((0..100).all(|_| splitter.pick(10.0, &up) == 2));
    }

    #[test]
    fn down_targets_get_no_share() {
        let mut splitter = Splitter::new(vec![1.0, 1.0, 1.0], vec![]);
        let down = [false, true, false];
        assert!((0..100).all(|_| splitter.pick(0.0, &down) != 1));
        // A split that sends everything to a down target spreads over the live ones.
        let mut splitter = Splitter::new(vec![0.0, 1.0, 0.0], vec![]);
        let mut counts = [0; 3];
        for _ in 0..100 {
            counts[splitter.pick(0.0, &down)] += 1;
        }
        assert_eq!(counts, [50, 0, 50]);
    }

    #[test]
    fn weights_are_checked() {
        assert!(parse_weights("1,2", 3).is_err());
        assert!(parse_weights("0,0", 2).is_err());
        assert!(parse_weights("-1,2", 2).is_err());
        assert_eq!(parse_weights("1, 2", 2).unwrap(), vec![1.0, 2.0]);
    }
}

//! weir-loadgen: pushes real remote-write traffic at one or more weir replicas, open loop or
//! closed loop, and reports what was offered, admitted and rejected, per target, per tenant and per
//! second, beside what one ideal bucket would have admitted of the same traffic.
//!
//! ```text
//! weir-loadgen --target http://127.0.0.1:8080 --target http://127.0.0.1:8081 \
//!     --split 70,30 --samples-per-second 30000 --series-per-request 100 \
//!     --tenants team-a --duration 30s --output result.json
//! ```
//!
//! Two arrival modes:
//! - **dense** (the default): each tenant's requests are evenly spaced at its rate.
//! - **senders** (`--senders N`): the way Prometheus and agents really send. Each tenant has N
//!   senders with uneven rates; each sender sends when it holds `--series-per-request`
//!   samples (Prometheus' `max_samples_per_send`) or when `--batch-send-deadline` has passed,
//!   with the interval jittered. A tenant then arrives as a few large requests a second.
//!
//! Open loop: the whole schedule is drawn up front and each request is sent when it is due,
//! whether or not earlier ones have answered, so a slow server cannot slow the offered load
//! down (no coordinated omission). When `--max-outstanding` requests are already waiting, a
//! due request is not sent and is counted as `unsent`.
//!
//! `--ideal-rate`/`--ideal-burst` give the baseline: one exact token bucket per tenant, fed
//! the same schedule. What it refuses, no fleet could admit without exceeding the limit.
//!
//! **Closed loop** (`--closed-loop`, in `closed_loop.rs`): senders that wait for answers and
//! retry, modelled on Prometheus' queue manager, so a refusal's `Retry-After` shapes what is
//! sent next. It reports delivered ÷ produced, refusals, drops and the senders' lag.
//!
//! # Layout
//! - `main.rs`: the flags, and the open-loop schedule, sender and report.
//! - `closed_loop.rs`: the closed-loop senders and their report.
//! - `common.rs`: what both use: target URLs, the split and its routing, the HTTP client.

mod closed_loop;
mod common;

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use common::{check_weights, error_chain, parse_weights, percentile, Down, Route, Splitter};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::Semaphore;
use weir::remote_write::prompb::WriteRequest;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "weir-loadgen",
    about = "Remote-write load generator for weir: open loop, or closed loop like Prometheus"
)]
struct Args {
    /// Base URL of a replica (repeat for several); requests go to `<target>/api/v1/push`.
    #[arg(long = "target", required_unless_present = "write_body")]
    targets: Vec<String>,

    /// Share of requests per target, e.g. `70,20,10` (default: even).
    #[arg(long, value_delimiter = ',')]
    split: Vec<f64>,

    /// A later split: `SECONDS=W1,W2,…` switches the split at that second (repeatable),
    /// e.g. `10=0,0,100`.
    #[arg(long = "split-at")]
    split_at: Vec<String>,

    /// How each request picks its target among the split's weights: `round-robin` (smooth
    /// weighted round robin, like nginx) or `random` (weighted, seeded).
    #[arg(long, value_enum, default_value_t = Route::RoundRobin)]
    route: Route,

    /// Offered load in samples per second (total over all targets and tenants).
    #[arg(long, conflicts_with = "requests_per_second")]
    samples_per_second: Option<f64>,

    /// Offered load in requests per second (dense mode only).
    #[arg(long)]
    requests_per_second: Option<f64>,

    /// Series per request, one sample each. With `--senders`, the most a sender puts in one
    /// request (Prometheus' `max_samples_per_send`).
    #[arg(long, default_value_t = 100)]
    series_per_request: usize,

    /// Realistic arrival: this many senders per tenant, each batching its samples (0: dense).
    #[arg(long, default_value_t = 0)]
    senders: usize,

    /// With `--senders` or `--closed-loop`: a sender with fewer samples than a full request
    /// sends what it has after this long (Prometheus' `batch_send_deadline`).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    batch_send_deadline: Duration,

    /// With `--senders`: each sender's rate is the tenant's mean × a factor drawn uniformly
    /// from [1 − spread, 1 + spread].
    #[arg(long, default_value_t = 0.5)]
    sender_spread: f64,

    /// With `--senders`: each interval between a sender's requests is stretched or shrunk
    /// by up to this fraction, at random.
    #[arg(long, default_value_t = 0.1)]
    jitter: f64,

    /// `CLUSTER/REPLICA`: every series also carries `cluster` and `__replica__` labels, as
    /// one server of a Prometheus HA pair sends (for the HA tracker's cost).
    #[arg(long, value_name = "CLUSTER/REPLICA")]
    ha_replica: Option<String>,

    /// Tenants, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "loadgen")]
    tenants: Vec<String>,

    /// `TENANTS×PREFIX`: generate this many tenants named PREFIX0001, … instead of
    /// `--tenants`, e.g. `1000×t` (an ASCII `x` works too).
    #[arg(long)]
    tenant_count: Option<String>,

    /// How the offered load is shared among tenants: `even`, or `zipf:S` (the k-th tenant
    /// offers in proportion to 1 ÷ k^S).
    #[arg(long, default_value = "even")]
    tenant_weights: String,

    /// Tenant churn, with `--tenant-count`: this many tenants a minute are replaced by new
    /// ones (PREFIX10001, … for 10 000 tenants), each taking over its predecessor's share, so
    /// the old ones go idle. 1 000 with 10 000 tenants replaces every tenant in 10 minutes.
    #[arg(long, default_value_t = 0.0)]
    tenant_churn: f64,

    /// Leave the per-tenant, per-second timeline out of the report (it is tenants × seconds
    /// big); per-tenant totals stay.
    #[arg(long)]
    no_tenant_timeline: bool,

    /// Seed for the schedule and the random route.
    #[arg(long, default_value_t = 1)]
    seed: u64,

    /// How long to send.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,

    /// Requests waiting for an answer at once, at most.
    #[arg(long, default_value_t = 512)]
    max_outstanding: usize,

    /// Per-request timeout.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    timeout: Duration,

    /// The ideal baseline: every tenant's limit (samples/s) for one exact bucket per tenant.
    #[arg(long)]
    ideal_rate: Option<f64>,

    /// The ideal baseline's burst (samples); defaults to the rate.
    #[arg(long)]
    ideal_burst: Option<f64>,

    /// Where to write the JSON report.
    #[arg(long, default_value = "loadgen-result.json")]
    output: String,

    /// No live progress line.
    #[arg(long)]
    quiet: bool,

    /// Write one request body (snappy remote-write 1.0, --series-per-request series, as the
    /// generator sends them) to this file and exit: for other clients, e.g. wrk.
    #[arg(long, value_name = "FILE")]
    write_body: Option<std::path::PathBuf>,

    /// Treat a target that refuses connections as gone: its share moves to the others, as a
    /// load balancer's health check would move it.
    #[arg(long)]
    failover: bool,

    /// Closed loop: senders that wait for each answer and retry refused batches, like
    /// Prometheus' queue manager (see `closed_loop.rs`), in place of the open-loop schedule.
    #[arg(long, conflicts_with_all = ["senders", "requests_per_second", "write_body", "ideal_rate", "tenant_churn"])]
    closed_loop: bool,

    #[command(flatten)]
    closed: closed_loop::ClosedLoopArgs,
}

/// One request of the schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Send {
    /// Seconds from the start.
    at: f64,
    tenant: usize,
    samples: u32,
}

/// Each tenant's share of the offered load.
fn tenant_weights(spec: &str, tenants: usize) -> anyhow::Result<Vec<f64>> {
    let weights: Vec<f64> = match spec.split_once(':') {
        None if spec == "even" => vec![1.0; tenants],
        Some(("zipf", exponent)) => {
            let exponent: f64 = exponent.parse()?;
            (1..=tenants)
                .map(|rank| 1.0 / (rank as f64).powf(exponent))
                .collect()
        }
        _ => anyhow::bail!("--tenant-weights wants `even` or `zipf:S`, got {spec:?}"),
    };
    let total: f64 = weights.iter().sum();
    Ok(weights.into_iter().map(|w| w / total).collect())
}

/// Dense: each tenant's requests evenly spaced at its rate, its first at a seeded offset so
/// tenants do not all send at once.
fn dense_schedule(rates: &[f64], size: u32, seconds: f64, rng: &mut StdRng) -> Vec<Send> {
    let mut schedule = Vec::new();
    for (tenant, rate) in rates.iter().enumerate() {
        let interval = size as f64 / rate;
        let mut at = if rates.len() == 1 {
            0.0
        } else {
            rng.random_range(0.0..interval.min(seconds))
        };
        while at < seconds {
            schedule.push(Send {
                at,
                tenant,
                samples: size,
            });
            at += interval;
        }
    }
    schedule.sort_by(|a, b| a.at.total_cmp(&b.at));
    schedule
}

/// Senders: per tenant, `senders` batching senders with uneven rates (see the module docs).
struct SenderModel {
    senders: usize,
    max_batch: u32,
    deadline: f64,
    spread: f64,
    jitter: f64,
}

impl SenderModel {
    fn schedule(&self, rates: &[f64], seconds: f64, rng: &mut StdRng) -> Vec<Send> {
        let mut schedule = Vec::new();
        for (tenant, rate) in rates.iter().enumerate() {
            let factors: Vec<f64> = (0..self.senders)
                .map(|_| 1.0 + rng.random_range(-self.spread..=self.spread))
                .collect();
            let total: f64 = factors.iter().sum();
            for factor in factors {
                let sender_rate = rate * factor / total;
                if sender_rate <= 0.0 {
                    continue;
                }
                // A full batch as soon as it has one, or what it has at the deadline.
                let interval = (self.max_batch as f64 / sender_rate).min(self.deadline);
                let batch = ((sender_rate * interval).round() as u32).max(1);
                let mut at = rng.random_range(0.0..interval);
                while at < seconds {
                    schedule.push(Send {
                        at,
                        tenant,
                        samples: batch,
                    });
                    at += interval * (1.0 + rng.random_range(-self.jitter..=self.jitter));
                }
            }
        }
        schedule.sort_by(|a, b| a.at.total_cmp(&b.at));
        schedule
    }
}

/// One exact token bucket per tenant fed the schedule: what an ideal, central limiter would
/// admit. Returns, per request, whether it would pass.
fn ideal_admissions(schedule: &[Send], tenants: usize, rate: f64, burst: f64) -> Vec<bool> {
    let mut buckets = vec![(burst, 0.0f64); tenants];
    schedule
        .iter()
        .map(|send| {
            let (tokens, last) = &mut buckets[send.tenant];
            *tokens = (*tokens + (send.at - *last) * rate).min(burst);
            *last = send.at;
            let passes = *tokens >= send.samples as f64;
            if passes {
                *tokens -= send.samples as f64;
            }
            passes
        })
        .collect()
}

/// Counts for one target, one tenant, or all.
#[derive(Debug, Clone, Default, Serialize)]
struct Counts {
    requests: u64,
    offered_samples: u64,
    admitted_samples: u64,
    rejected_samples: u64,
    failed_samples: u64,
    unsent_requests: u64,
    /// What the ideal bucket would have admitted of the same requests.
    ideal_admitted_samples: u64,
    status: BTreeMap<String, u64>,
}

impl Counts {
    fn record(&mut self, outcome: &Outcome, samples: u64, ideal: bool) {
        self.requests += 1;
        self.offered_samples += samples;
        if ideal {
            self.ideal_admitted_samples += samples;
        }
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

/// Per second: offered, admitted, ideal admitted.
type Cell = [u64; 3];

#[derive(Default)]
struct Stats {
    total: Counts,
    targets: Vec<Counts>,
    tenants: Vec<Counts>,
    latencies_us: Vec<Vec<u64>>,
    /// Per second (by due time): per target.
    timeline: Vec<Vec<Cell>>,
    /// Per tenant: per second.
    tenant_timeline: Vec<Vec<Cell>>,
    /// Per second (by due time): latencies, microseconds.
    second_latencies_us: Vec<Vec<u64>>,
    /// The first transport error, with its causes, to say why requests failed.
    first_error: Option<String>,
    /// Samples admitted, by the whole second (from the start) their answer came in.
    admitted_by_answer: Vec<u64>,
}

impl Stats {
    fn record(
        &mut self,
        send: &Send,
        target: usize,
        second: usize,
        outcome: &Outcome,
        ideal: bool,
    ) {
        let samples = send.samples as u64;
        self.total.record(outcome, samples, ideal);
        self.targets[target].record(outcome, samples, ideal);
        self.tenants[send.tenant].record(outcome, samples, ideal);
        let admitted = matches!(outcome, Outcome::Status(200..=299));
        let tenant_cell = self
            .tenant_timeline
            .get_mut(send.tenant)
            .map(|timeline| &mut timeline[second]);
        for cell in std::iter::once(&mut self.timeline[second][target]).chain(tenant_cell) {
            cell[0] += samples;
            cell[1] += if admitted { samples } else { 0 };
            cell[2] += if ideal { samples } else { 0 };
        }
    }
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
    ideal_admitted_samples: u64,
    admitted_per_target: Vec<u64>,
    /// Requests sent that second, and their latency.
    requests: usize,
    latency_ms_p50: Option<f64>,
    latency_ms_p99: Option<f64>,
}

#[derive(Serialize)]
struct TenantReport {
    tenant: String,
    offered_samples_per_second: f64,
    counts: Counts,
    /// Per second: [offered, admitted, ideal admitted].
    per_second: Vec<Cell>,
}

#[derive(Serialize)]
struct Report {
    targets: Vec<String>,
    tenants: usize,
    duration_seconds: f64,
    mode: &'static str,
    series_per_request: usize,
    requests: usize,
    ideal: Option<(f64, f64)>,
    total: TargetReport,
    per_target: Vec<TargetReport>,
    timeline: Vec<Second>,
    /// Samples admitted, by the second their answer came in. The timeline counts a push in
    /// the second it was sent, which puts a push the server held for its tokens (up to
    /// `--max-admission-delay`) in a second before it was admitted; this counts it when it was.
    admitted_by_answer_second: Vec<u64>,
    /// With an ideal bucket: the most the answers went over it in any span of whole seconds.
    answer_time_excess: Option<Excess>,
    per_tenant: Vec<TenantReport>,
}

/// How far admissions went over the ideal buckets (`tenants × (B + L·t)`) in their worst
/// span of whole seconds, counted when admitted.
#[derive(Serialize, Debug, PartialEq)]
struct Excess {
    samples: f64,
    from_second: usize,
    to_second: usize,
}

/// The span of whole seconds (`from..=to`) in which `admitted` goes furthest over a bucket of
/// `burst` refilling at `rate` a second: a token bucket admits at most `burst + rate × span`
/// in any span, so a positive excess is admissions the bucket would have refused. One pass,
/// as for the largest sum of a run of numbers (each second adds its admissions less `rate`).
fn worst_excess(admitted: &[u64], rate: f64, burst: f64) -> Option<Excess> {
    let mut best: Option<Excess> = None;
    let (mut run, mut from) = (0.0f64, 0);
    for (second, &samples) in admitted.iter().enumerate() {
        if run < 0.0 {
            (run, from) = (0.0, second);
        }
        run += samples as f64 - rate;
        if best.as_ref().is_none_or(|best| run - burst > best.samples) {
            best = Some(Excess {
                samples: run - burst,
                from_second: from,
                to_second: second,
            });
        }
    }
    best
}

/// Replaces `per_minute` tenants a minute: slot k of n tenants gets its g-th successor
/// (tenant k + g·n) at minute (k + (g − 1)·n) ÷ per_minute, so replacements are spread evenly
/// and every slot keeps its share of the load.
fn churn(schedule: &mut [Send], names: &mut Vec<String>, rates: &mut Vec<f64>, per_minute: f64) {
    let slots = names.len();
    let generation = |slot: usize, at: f64| {
        let replaced = at * per_minute / 60.0;
        ((replaced - slot as f64) / slots as f64 + 1.0).floor() as usize
    };
    let mut last = 0;
    for send in schedule.iter_mut() {
        send.tenant += slots * generation(send.tenant, send.at);
        last = last.max(send.tenant);
    }
    let prefix = names[0]
        .trim_end_matches(|c: char| c.is_ascii_digit())
        .to_string();
    for index in slots..=last {
        names.push(format!("{prefix}{:04}", index + 1));
        rates.push(rates[index % slots]);
    }
}

fn tenant_names(args: &Args) -> anyhow::Result<Vec<String>> {
    let Some(spec) = &args.tenant_count else {
        return Ok(args.tenants.clone());
    };
    let (count, prefix) = spec
        .split_once('×')
        .or_else(|| spec.split_once('x'))
        .ok_or_else(|| anyhow::anyhow!("--tenant-count wants COUNT×PREFIX, got {spec:?}"))?;
    let count: usize = count.parse()?;
    anyhow::ensure!(count >= 1, "--tenant-count needs at least one tenant");
    Ok((1..=count).map(|i| format!("{prefix}{i:04}")).collect())
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
        args.series_per_request > 0 && args.series_per_request <= u32::MAX as usize,
        "--series-per-request must be ≥ 1"
    );
    let size = args.series_per_request as u32;
    if let Some(path) = &args.write_body {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis() as i64;
        let body = WriteRequest::synthetic(size as usize, size as u64, now_ms).encode_snappy();
        std::fs::write(path, &body)?;
        println!("{} bytes written to {}", body.len(), path.display());
        return Ok(());
    }
    let urls = common::push_urls(&args.targets)?;
    if args.closed_loop {
        let tenants = tenant_names(&args)?;
        let weights = tenant_weights(&args.tenant_weights, tenants.len())?;
        let rates: Vec<f64> = match (args.samples_per_second, args.closed.series_per_tenant) {
            (Some(total), None) => weights.iter().map(|weight| weight * total).collect(),
            (None, Some(series)) if args.tenant_weights == "even" => {
                let per_tenant = series as f64 / args.closed.scrape_interval.as_secs_f64();
                vec![per_tenant; tenants.len()]
            }
            (None, Some(_)) => anyhow::bail!(
                "--series-per-tenant gives every tenant the same series; with --tenant-weights, \
                 give --samples-per-second"
            ),
            _ => anyhow::bail!("give --samples-per-second or --series-per-tenant"),
        };
        return closed_loop::run_and_report(closed_loop::Plan {
            sender: args.closed.clone(),
            batch_send_deadline: args.batch_send_deadline,
            targets: args.targets.clone(),
            urls,
            split,
            later,
            route: args.route,
            failover: args.failover,
            tenants,
            rates,
            duration: args.duration,
            timeout: args.timeout,
            seed: args.seed,
            output: args.output.clone(),
            quiet: args.quiet,
        })
        .await;
    }
    let samples_per_second = match (args.samples_per_second, args.requests_per_second) {
        (Some(samples), None) => samples,
        (None, Some(_)) if args.senders > 0 => {
            anyhow::bail!("with --senders, give --samples-per-second")
        }
        (None, Some(requests)) => requests * size as f64,
        _ => anyhow::bail!("give --samples-per-second or --requests-per-second"),
    };
    anyhow::ensure!(samples_per_second > 0.0, "the rate must be > 0");
    let mut tenants = tenant_names(&args)?;
    let mut tenant_rates: Vec<f64> = tenant_weights(&args.tenant_weights, tenants.len())?
        .into_iter()
        .map(|weight| weight * samples_per_second)
        .collect();
    let seconds = args.duration.as_secs_f64();
    let mut rng = StdRng::seed_from_u64(args.seed);
    let (mode, mut schedule) = if args.senders == 0 {
        (
            "dense",
            dense_schedule(&tenant_rates, size, seconds, &mut rng),
        )
    } else {
        let model = SenderModel {
            senders: args.senders,
            max_batch: size,
            deadline: args.batch_send_deadline.as_secs_f64(),
            spread: args.sender_spread.clamp(0.0, 0.99),
            jitter: args.jitter.clamp(0.0, 0.99),
        };
        ("senders", model.schedule(&tenant_rates, seconds, &mut rng))
    };
    if args.tenant_churn > 0.0 {
        anyhow::ensure!(
            args.tenant_count.is_some(),
            "--tenant-churn needs --tenant-count"
        );
        churn(
            &mut schedule,
            &mut tenants,
            &mut tenant_rates,
            args.tenant_churn,
        );
    }
    let ideal = args
        .ideal_rate
        .map(|rate| (rate, args.ideal_burst.unwrap_or(rate)));
    let ideal_passes = match ideal {
        Some((rate, burst)) => ideal_admissions(&schedule, tenants.len(), rate, burst),
        None => vec![false; schedule.len()],
    };

    // Bodies are encoded up front, one per request size, so the generator spends its CPU
    // sending.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let ha_labels = match &args.ha_replica {
        Some(pair) => {
            let (cluster, replica) = pair.split_once('/').ok_or_else(|| {
                anyhow::anyhow!("--ha-replica wants CLUSTER/REPLICA, got {pair:?}")
            })?;
            vec![("cluster", cluster), ("__replica__", replica)]
        }
        None => Vec::new(),
    };
    let mut bodies: HashMap<u32, bytes::Bytes> = HashMap::new();
    for send in &schedule {
        bodies.entry(send.samples).or_insert_with(|| {
            WriteRequest::synthetic(send.samples as usize, send.samples as u64, now_ms)
                .with_labels(&ha_labels)
                .encode_snappy()
                .into()
        });
    }
    let client = common::http_client(args.timeout, args.max_outstanding)?;

    let whole_seconds = seconds.ceil() as usize;
    let stats = Arc::new(Mutex::new(Stats {
        targets: vec![Counts::default(); targets],
        tenants: vec![Counts::default(); tenants.len()],
        latencies_us: vec![Vec::new(); targets],
        timeline: vec![vec![[0; 3]; targets]; whole_seconds + 1],
        tenant_timeline: if args.no_tenant_timeline {
            Vec::new()
        } else {
            vec![vec![[0; 3]; whole_seconds + 1]; tenants.len()]
        },
        second_latencies_us: vec![Vec::new(); whole_seconds + 1],
        ..Stats::default()
    }));
    let outstanding = Arc::new(Semaphore::new(args.max_outstanding));
    let mut splitter = Splitter::new(split, later, args.route, args.seed);
    let down: Down = Arc::new((0..targets).map(|_| Default::default()).collect());
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let progress = (!args.quiet).then(|| spawn_progress(Arc::clone(&stats), start, targets));

    for (send, ideal) in schedule.iter().copied().zip(ideal_passes.iter().copied()) {
        let due = start + Duration::from_secs_f64(send.at);
        tokio::time::sleep_until(due.into()).await;
        let down_now: Vec<bool> = down
            .iter()
            .map(|flag| flag.load(std::sync::atomic::Ordering::Relaxed))
            .collect();
        let target = splitter.pick(send.at, &down_now);
        let second = (send.at as usize).min(whole_seconds);
        let Ok(permit) = Arc::clone(&outstanding).try_acquire_owned() else {
            stats
                .lock()
                .unwrap()
                .record(&send, target, second, &Outcome::Unsent, ideal);
            continue;
        };
        let request = client
            .post(&urls[target])
            .header("Content-Encoding", "snappy")
            .header("Content-Type", "application/x-protobuf")
            .header("X-Prometheus-Remote-Write-Version", "0.1.0")
            .header("X-Scope-OrgID", &tenants[send.tenant])
            .body(bodies[&send.samples].clone());
        let stats = Arc::clone(&stats);
        let down = Arc::clone(&down);
        let failover = args.failover;
        tasks.spawn(async move {
            let sent = Instant::now();
            let answered_at = || start.elapsed().as_secs() as usize;
            let mut error = None;
            let outcome = match request.send().await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let _ = response.bytes().await;
                    Outcome::Status(status)
                }
                Err(err) => {
                    error = Some(error_chain(&err));
                    if err.is_timeout() {
                        Outcome::Error("timeout")
                    } else if err.is_connect() {
                        if failover {
                            down[target].store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                        Outcome::Error("connect_error")
                    } else {
                        Outcome::Error("error")
                    }
                }
            };
            let latency = sent.elapsed().as_micros() as u64;
            drop(permit);
            let mut stats = stats.lock().unwrap();
            if stats.first_error.is_none() {
                stats.first_error = error;
            }
            stats.record(&send, target, second, &outcome, ideal);
            if matches!(outcome, Outcome::Status(200..=299)) {
                let answered = answered_at();
                if stats.admitted_by_answer.len() <= answered {
                    stats.admitted_by_answer.resize(answered + 1, 0);
                }
                stats.admitted_by_answer[answered] += send.samples as u64;
            }
            stats.latencies_us[target].push(latency);
            stats.second_latencies_us[second].push(latency);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    if let Some(progress) = progress {
        progress.abort();
        // Wait until it is gone: it holds a reference to the stats.
        let _ = progress.await;
        common::progress_done();
    }

    let mut stats = Arc::try_unwrap(stats)
        .map_err(|_| anyhow::anyhow!("tasks still hold the stats"))?
        .into_inner()
        .unwrap();
    let mut all_latencies: Vec<u64> = stats.latencies_us.iter().flatten().copied().collect();
    let per_target: Vec<TargetReport> = (0..targets)
        .map(|t| TargetReport {
            target: args.targets[t].clone(),
            rates: rates(&stats.targets[t], &mut stats.latencies_us[t], seconds),
            counts: stats.targets[t].clone(),
        })
        .collect();
    let report = Report {
        targets: args.targets.clone(),
        tenants: tenants.len(),
        duration_seconds: seconds,
        mode,
        series_per_request: args.series_per_request,
        requests: schedule.len(),
        ideal,
        total: TargetReport {
            target: "total".into(),
            rates: rates(&stats.total, &mut all_latencies, seconds),
            counts: stats.total.clone(),
        },
        per_target,
        timeline: stats
            .timeline
            .iter()
            .zip(stats.second_latencies_us.iter_mut())
            .enumerate()
            .take(whole_seconds)
            .map(|(second, (cells, latencies))| {
                latencies.sort_unstable();
                Second {
                    second,
                    offered_samples: cells.iter().map(|c| c[0]).sum(),
                    admitted_samples: cells.iter().map(|c| c[1]).sum(),
                    ideal_admitted_samples: cells.iter().map(|c| c[2]).sum(),
                    admitted_per_target: cells.iter().map(|c| c[1]).collect(),
                    requests: latencies.len(),
                    latency_ms_p50: percentile(latencies, 0.5),
                    latency_ms_p99: percentile(latencies, 0.99),
                }
            })
            .collect(),
        answer_time_excess: ideal.and_then(|(rate, burst)| {
            let fleet = tenants.len() as f64;
            worst_excess(&stats.admitted_by_answer, rate * fleet, burst * fleet)
        }),
        admitted_by_answer_second: std::mem::take(&mut stats.admitted_by_answer),
        per_tenant: tenants
            .iter()
            .enumerate()
            .map(|(i, tenant)| TenantReport {
                tenant: tenant.clone(),
                offered_samples_per_second: tenant_rates[i],
                counts: stats.tenants[i].clone(),
                per_second: stats
                    .tenant_timeline
                    .get(i)
                    .map_or_else(Vec::new, |timeline| timeline[..whole_seconds].to_vec()),
            })
            .collect(),
    };
    std::fs::write(&args.output, serde_json::to_string(&report)?)?;
    print_summary(&report);
    eprintln!("report written to {}", args.output);
    let answered: u64 = report
        .total
        .counts
        .status
        .iter()
        .filter(|(status, _)| status.parse::<u16>().is_ok())
        .map(|(_, count)| count)
        .sum();
    match stats.first_error {
        Some(error) if answered == 0 => {
            anyhow::bail!("no request was answered; the first failed with: {error}")
        }
        Some(error) => eprintln!("some requests failed; the first with: {error}"),
        None if answered == 0 => {
            anyhow::bail!("no request was sent (all {} unsent)", schedule.len())
        }
        None => {}
    }
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
            common::progress(format_args!(
                "[{:>5.1}s] offered {:>9}/s admitted {:>9}/s rejected {:>9}/s | admitted per target (total): {}",
                start.elapsed().as_secs_f64(),
                now.0 - last.0,
                now.1 - last.1,
                now.2 - last.2,
                per_target.join(" "),
            ));
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
    if report.ideal.is_some() {
        let total = &report.total.counts;
        println!(
            "ideal bucket: would admit {} of {} samples ({:.2} % refused); admitted {}",
            total.ideal_admitted_samples,
            total.offered_samples,
            100.0
                * (1.0 - total.ideal_admitted_samples as f64 / total.offered_samples.max(1) as f64),
            total.admitted_samples,
        );
    }
    if let Some(excess) = &report.answer_time_excess {
        println!(
            "counted when admitted: at most {:.0} samples over the ideal buckets, in seconds {}-{} \
             (negative: never over)",
            excess.samples, excess.from_second, excess.to_second,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worst_excess_finds_the_span_most_over_the_bucket() {
        // B = 10, L = 10: 30 in second 2 and 25 in second 3 are 55 in 2 s against 30.
        let excess = worst_excess(&[10, 0, 30, 25, 0, 10], 10.0, 10.0).unwrap();
        assert_eq!(
            excess,
            Excess {
                samples: 25.0,
                from_second: 2,
                to_second: 3
            }
        );
        // A bucket's own admissions never go over: a burst, then the rate.
        let exact = worst_excess(&[20, 10, 10, 10], 10.0, 10.0).unwrap();
        assert_eq!(exact.samples, 0.0);
        assert!(worst_excess(&[], 10.0, 10.0).is_none());
    }

    #[test]
    fn churn_replaces_the_tenants_one_slot_at_a_time() {
        // 10 tenants, 60 a minute: slot k gets its successor at second k, another at k + 10.
        let mut names: Vec<String> = (1..=10).map(|i| format!("t{i:04}")).collect();
        let mut rates: Vec<f64> = (0..10).map(f64::from).collect();
        let mut schedule: Vec<Send> = (0..25)
            .flat_map(|second| {
                (0..10).map(move |tenant| Send {
                    at: second as f64 + 0.5,
                    tenant,
                    samples: 1,
                })
            })
            .collect();
        churn(&mut schedule, &mut names, &mut rates, 60.0);
        let at = |second: usize, slot: usize| names[schedule[second * 10 + slot].tenant].clone();
        assert_eq!(at(0, 0), "t0011"); // slot 0 is replaced at 0 s
        assert_eq!(at(0, 1), "t0002");
        assert_eq!(at(3, 2), "t0013");
        assert_eq!(at(3, 5), "t0006");
        assert_eq!(at(12, 1), "t0022"); // its second successor (index 1 + 2·10) at 11 s
        assert_eq!(at(12, 5), "t0016");
        assert_eq!(names.len(), 35); // slots 0-4 reach their third successors by 24.5 s
                                     // Every successor keeps its slot's share.
        assert_eq!(rates[schedule[12 * 10 + 1].tenant], 1.0);
    }

    #[test]
    fn senders_offer_the_rate_in_batches_of_at_most_the_batch_size() {
        let model = SenderModel {
            senders: 10,
            max_batch: 2000,
            deadline: 5.0,
            spread: 0.5,
            jitter: 0.1,
        };
        let mut rng = StdRng::seed_from_u64(3);
        let schedule = model.schedule(&[9000.0], 60.0, &mut rng);
        let offered: u64 = schedule.iter().map(|s| s.samples as u64).sum();
        let per_second = offered as f64 / 60.0;
        assert!((8500.0..9500.0).contains(&per_second), "{per_second}");
        assert!(schedule.iter().all(|s| s.samples <= 2000));
        // 10 senders at ~900 samples/s each: ~4.5 requests/s, not a dense stream.
        let requests_per_second = schedule.len() as f64 / 60.0;
        assert!(
            (4.0..5.5).contains(&requests_per_second),
            "{requests_per_second}"
        );
        // Slow senders flush what they have at the deadline.
        let slow = model.schedule(&[100.0], 60.0, &mut rng);
        assert!(slow.iter().all(|s| s.samples < 2000));
    }

    #[test]
    fn zipf_weights_favour_the_first_tenants() {
        let weights = tenant_weights("zipf:1", 3).unwrap();
        assert!((weights[0] / weights[1] - 2.0).abs() < 1e-9);
        assert!((weights.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        assert!(tenant_weights("pareto:1", 3).is_err());
    }

    #[test]
    fn the_ideal_bucket_is_exact() {
        let send = |at, samples| Send {
            at,
            tenant: 0,
            samples,
        };
        let schedule = [send(0.0, 60), send(0.0, 50), send(0.5, 50), send(0.5, 1)];
        // 100/s, burst 100: 60 passes, 50 does not (40 left), 50 passes at 0.5 s (90), 1 too.
        assert_eq!(
            ideal_admissions(&schedule, 1, 100.0, 100.0),
            [true, false, true, true]
        );
    }
}

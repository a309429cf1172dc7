//! Closed loop: senders that wait for answers and retry, modelled on Prometheus' remote-write
//! queue manager (`storage/remote/queue_manager.go`), so that what a refusal says
//! (`Retry-After`, or a late 200 when the server holds the request) shapes what is sent next.
//!
//! Per tenant:
//! - a **producer** "scrapes" the tenant's series every `--scrape-interval`: its series are
//!   split over `--scrape-targets` targets, each scraped at once, all at the same instant on
//!   the second boundary (`--scrape-phase aligned`) or each at its own random phase (`spread`);
//! - the samples go to `--shards` **shards** by series (series i to shard i mod shards), each
//!   with a queue of `--capacity` samples; what does not fit is dropped and counted;
//! - each shard sends when it holds `--max-samples-per-send` samples, or what it has when
//!   `--batch-send-deadline` has passed since its last send, with **one request in flight**;
//! - a batch refused with 429 or 5xx, or lost to a transport error, is sent again, to a target
//!   picked afresh by the split (a balancer's choice), after `Retry-After` seconds when the
//!   answer carries a positive integer one (unless `--retry-after ignore`, as vmagent does) or
//!   else after the shard's own backoff: `sleep = retry_after > 0 ? retry_after : backoff;
//!   backoff = min(2 × sleep, max_backoff)`, from `--min-backoff`, as Prometheus does. Retries
//!   carry `Retry-Attempt`. Other 4xx answers drop the batch (Prometheus does too), and
//!   `--drop-on-http-429` drops on 429 (Prometheus' default `retry_on_http_429: false`).
//!
//! Not modelled: resharding (the shard count is fixed), and the write-ahead log. Prometheus
//! stops reading its WAL when a queue is full rather than dropping; `--capacity 0` (no bound)
//! is that, with the backlog showing as lag.
//!
//! Production stops after `--duration`; the senders then flush what they hold, for at most
//! `--drain`, so that delivered ÷ produced counts samples that were merely late. The lag (the
//! age of the oldest sample produced but not yet delivered) is sampled five times a second.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clap::ValueEnum;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::{watch, Notify};
use weir::remote_write::prompb::WriteRequest;

use crate::common::{
    error_chain, http_client, percentile, progress, progress_done, Down, Route, Splitter,
};

/// The closed-loop sender's flags (Prometheus' `queue_config` names where it has one).
#[derive(Debug, Clone, clap::Args)]
pub struct ClosedLoopArgs {
    /// Closed loop: shards per tenant, each with one request in flight (fixed; Prometheus
    /// reshards between `min_shards` and `max_shards`).
    #[arg(long, default_value_t = 4)]
    pub shards: usize,

    /// Closed loop: samples one shard's queue holds (Prometheus' `capacity`); samples that do
    /// not fit are dropped. 0: no bound.
    #[arg(long, default_value_t = 10_000)]
    pub capacity: u64,

    /// Closed loop: the most samples in one request (Prometheus' `max_samples_per_send`).
    #[arg(long, default_value_t = 2000)]
    pub max_samples_per_send: u64,

    /// Closed loop: the first backoff after a refusal without `Retry-After`.
    #[arg(long, default_value = "30ms", value_parser = humantime::parse_duration)]
    pub min_backoff: Duration,

    /// Closed loop: the longest backoff.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub max_backoff: Duration,

    /// Closed loop: `honour` waits `Retry-After` seconds before a retry (Prometheus);
    /// `ignore` always uses the sender's own backoff (vmagent).
    #[arg(long, value_enum, default_value_t = RetryAfter::Honour)]
    pub retry_after: RetryAfter,

    /// Closed loop: drop a batch refused with 429 instead of retrying it (Prometheus'
    /// default, `retry_on_http_429: false`).
    #[arg(long)]
    pub drop_on_http_429: bool,

    /// Closed loop: how often each tenant's series are scraped.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub scrape_interval: Duration,

    /// Closed loop: scrape targets per tenant; the tenant's series are split among them.
    #[arg(long, default_value_t = 10)]
    pub scrape_targets: usize,

    /// Closed loop: `aligned` scrapes every target of every tenant at once, on the second
    /// boundary; `spread` scrapes each target at its own random phase.
    #[arg(long, value_enum, default_value_t = Phase::Spread)]
    pub scrape_phase: Phase,

    /// Closed loop: series per tenant, each one sample a scrape (in place of
    /// `--samples-per-second`, which is shared by `--tenant-weights`).
    #[arg(long)]
    pub series_per_tenant: Option<u64>,

    /// Closed loop: after `--duration`, how long the senders may go on flushing what they
    /// hold (0: stop at once).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub drain: Duration,

    /// Closed loop: the report's steady admitted rate leaves out this first stretch.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub warm_up: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RetryAfter {
    Honour,
    Ignore,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Aligned,
    Spread,
}

/// Everything a closed-loop run needs, checked by `main`.
pub struct Plan {
    pub sender: ClosedLoopArgs,
    pub batch_send_deadline: Duration,
    pub targets: Vec<String>,
    pub urls: Vec<String>,
    pub split: Vec<f64>,
    pub later: Vec<(f64, Vec<f64>)>,
    pub route: Route,
    pub failover: bool,
    pub tenants: Vec<String>,
    /// Offered samples per second, per tenant.
    pub rates: Vec<f64>,
    pub duration: Duration,
    pub timeout: Duration,
    pub seed: u64,
    pub output: String,
    pub quiet: bool,
}

impl Plan {
    fn validate(&self) -> anyhow::Result<()> {
        let sender = &self.sender;
        anyhow::ensure!(sender.shards >= 1, "--shards must be ≥ 1");
        anyhow::ensure!(
            sender.max_samples_per_send >= 1,
            "--max-samples-per-send must be ≥ 1"
        );
        anyhow::ensure!(
            sender.capacity == 0 || sender.capacity >= sender.max_samples_per_send,
            "--capacity ({}) must hold at least one full request (--max-samples-per-send {}), \
             or be 0 for no bound",
            sender.capacity,
            sender.max_samples_per_send
        );
        anyhow::ensure!(sender.scrape_targets >= 1, "--scrape-targets must be ≥ 1");
        anyhow::ensure!(
            !sender.scrape_interval.is_zero(),
            "--scrape-interval must be > 0"
        );
        anyhow::ensure!(
            !self.batch_send_deadline.is_zero(),
            "--batch-send-deadline must be > 0"
        );
        anyhow::ensure!(
            sender.min_backoff <= sender.max_backoff,
            "--min-backoff must not exceed --max-backoff"
        );
        anyhow::ensure!(!self.duration.is_zero(), "--duration must be > 0");
        anyhow::ensure!(
            self.rates
                .iter()
                .all(|rate| rate.is_finite() && *rate > 0.0),
            "the offered rate must be > 0"
        );
        Ok(())
    }
}

/// Samples produced at one instant, waiting in a shard's queue.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    produced: Instant,
    samples: u64,
}

/// One shard's queue. A `std::sync::Mutex`: nothing awaits while it is held.
#[derive(Debug, Default)]
struct Queue {
    chunks: VecDeque<Chunk>,
    queued: u64,
    /// When the oldest sample of the batch in flight (or waiting to be retried) was produced.
    in_flight_since: Option<Instant>,
    in_flight_samples: u64,
    /// Production has ended: send what is held without waiting for the deadline.
    flushing: bool,
}

impl Queue {
    /// Adds samples, keeping what fits in `capacity` (0: no bound); returns how many were
    /// dropped.
    fn push(&mut self, chunk: Chunk, capacity: u64) -> u64 {
        let fits = if capacity == 0 {
            chunk.samples
        } else {
            chunk.samples.min(capacity.saturating_sub(self.queued))
        };
        if fits > 0 {
            self.chunks.push_back(Chunk {
                samples: fits,
                ..chunk
            });
            self.queued += fits;
        }
        chunk.samples - fits
    }

    /// Takes up to `max` samples from the front as the next batch, which stays counted as
    /// unsent (for the lag) until `finish`.
    fn take(&mut self, max: u64) -> u64 {
        let mut taken = 0;
        self.in_flight_since = self.chunks.front().map(|chunk| chunk.produced);
        while taken < max {
            let Some(front) = self.chunks.front_mut() else {
                break;
            };
            let part = front.samples.min(max - taken);
            front.samples -= part;
            taken += part;
            if front.samples == 0 {
                self.chunks.pop_front();
            }
        }
        self.queued -= taken;
        self.in_flight_samples = taken;
        taken
    }

    fn finish(&mut self) {
        self.in_flight_since = None;
        self.in_flight_samples = 0;
    }

    /// The oldest sample not yet delivered (in flight, or queued).
    fn oldest(&self) -> Option<Instant> {
        self.in_flight_since
            .or_else(|| self.chunks.front().map(|chunk| chunk.produced))
    }

    fn unsent(&self) -> u64 {
        self.queued + self.in_flight_samples
    }
}

struct Shard {
    queue: Mutex<Queue>,
    /// The producer rings when a full batch is waiting, or production has ended.
    wake: Notify,
}

/// Per-second columns of a tenant's timeline; `lag_ms` is the largest lag sampled that second.
const COLUMNS: [&str; 6] = [
    "produced",
    "delivered",
    "attempted_samples",
    "refused_samples",
    "dropped",
    "lag_ms",
];
const PRODUCED: usize = 0;
const DELIVERED: usize = 1;
const ATTEMPTED: usize = 2;
const REFUSED: usize = 3;
const DROPPED: usize = 4;
const LAG_MS: usize = 5;

/// One tenant's counters (also used per target and in total).
#[derive(Debug, Clone, Default)]
struct Counts {
    produced: u64,
    delivered: u64,
    attempts: u64,
    attempted_samples: u64,
    refused_requests: u64,
    refused_samples: u64,
    failed_requests: u64,
    retries: u64,
    dropped_queue_full: u64,
    dropped_refused: u64,
    status: BTreeMap<String, u64>,
    /// Latency of accepted requests, microseconds.
    latencies_us: Vec<u64>,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.produced += other.produced;
        self.delivered += other.delivered;
        self.attempts += other.attempts;
        self.attempted_samples += other.attempted_samples;
        self.refused_requests += other.refused_requests;
        self.refused_samples += other.refused_samples;
        self.failed_requests += other.failed_requests;
        self.retries += other.retries;
        self.dropped_queue_full += other.dropped_queue_full;
        self.dropped_refused += other.dropped_refused;
        for (status, count) in &other.status {
            *self.status.entry(status.clone()).or_default() += count;
        }
        self.latencies_us.extend_from_slice(&other.latencies_us);
    }
}

struct TenantStats {
    counts: Counts,
    per_second: Vec<[u64; 6]>,
}

/// The outcome of one HTTP attempt.
enum Answer {
    Accepted,
    /// 429 or 5xx, or a transport error: send again after the delay.
    Retry {
        retry_after: Option<Duration>,
    },
    /// Any other status: the batch is lost.
    Drop,
}

/// What the senders share.
struct Run {
    start: Instant,
    /// Production ends here.
    end: Instant,
    /// Rows in each per-second timeline.
    seconds: usize,
    sender: ClosedLoopArgs,
    batch_send_deadline: Duration,
    client: reqwest::Client,
    urls: Vec<String>,
    splitter: Mutex<Splitter>,
    down: Down,
    failover: bool,
    bodies: Mutex<HashMap<u64, Bytes>>,
    now_ms: i64,
    tenants: Vec<String>,
    stats: Vec<Mutex<TenantStats>>,
    per_target: Vec<Mutex<Counts>>,
    shards: Vec<Vec<Arc<Shard>>>,
    first_error: Mutex<Option<String>>,
}

impl Run {
    fn second(&self, at: Instant) -> usize {
        let second = at.saturating_duration_since(self.start).as_secs() as usize;
        second.min(self.seconds - 1)
    }

    fn body(&self, samples: u64) -> Bytes {
        if let Some(body) = self.bodies.lock().unwrap().get(&samples) {
            return body.clone();
        }
        // Encoded outside the lock; two shards may both encode a new size once.
        let body: Bytes = WriteRequest::synthetic(samples as usize, samples, self.now_ms)
            .encode_snappy()
            .into();
        self.bodies.lock().unwrap().insert(samples, body.clone());
        body
    }

    /// One attempt at sending `samples` of `tenant`'s to a target the split picks.
    async fn attempt(&self, tenant: usize, samples: u64, attempt: u32) -> Answer {
        let target = {
            let down: Vec<bool> = self
                .down
                .iter()
                .map(|flag| flag.load(Ordering::Relaxed))
                .collect();
            let elapsed = self.start.elapsed().as_secs_f64();
            self.splitter.lock().unwrap().pick(elapsed, &down)
        };
        let mut request = self
            .client
            .post(&self.urls[target])
            .header("Content-Encoding", "snappy")
            .header("Content-Type", "application/x-protobuf")
            .header("X-Prometheus-Remote-Write-Version", "0.1.0")
            .header("X-Scope-OrgID", &self.tenants[tenant])
            .body(self.body(samples));
        if attempt > 0 {
            request = request.header("Retry-Attempt", attempt.to_string());
        }
        let sent = Instant::now();
        let result = request.send().await;
        let (status, answer) = match result {
            Ok(response) => {
                let code = response.status().as_u16();
                let retry_after = response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|value| value.to_str().ok())
                    .and_then(parse_retry_after);
                let _ = response.bytes().await;
                let answer = match code {
                    200..=299 => Answer::Accepted,
                    429 if self.sender.drop_on_http_429 => Answer::Drop,
                    429 | 500..=599 => Answer::Retry { retry_after },
                    _ => Answer::Drop,
                };
                (code.to_string(), answer)
            }
            Err(err) => {
                if self.failover && err.is_connect() {
                    self.down[target].store(true, Ordering::Relaxed);
                }
                let kind = if err.is_timeout() {
                    "timeout"
                } else if err.is_connect() {
                    "connect_error"
                } else {
                    "error"
                };
                self.first_error
                    .lock()
                    .unwrap()
                    .get_or_insert_with(|| error_chain(&err));
                (kind.to_string(), Answer::Retry { retry_after: None })
            }
        };
        let answered = Instant::now();
        let latency_us = answered.duration_since(sent).as_micros() as u64;
        let refused = status == "429";
        let failed = !refused && !matches!(answer, Answer::Accepted);
        let record = |counts: &mut Counts| {
            counts.attempts += 1;
            counts.attempted_samples += samples;
            counts.retries += u64::from(attempt > 0);
            if refused {
                counts.refused_requests += 1;
                counts.refused_samples += samples;
            } else if failed {
                counts.failed_requests += 1;
            }
            match answer {
                Answer::Accepted => {
                    counts.delivered += samples;
                    counts.latencies_us.push(latency_us);
                }
                Answer::Drop => counts.dropped_refused += samples,
                Answer::Retry { .. } => {}
            }
            *counts.status.entry(status.clone()).or_default() += 1;
        };
        record(&mut self.per_target[target].lock().unwrap());
        let (sent_second, answered_second) = (self.second(sent), self.second(answered));
        let mut stats = self.stats[tenant].lock().unwrap();
        record(&mut stats.counts);
        stats.per_second[sent_second][ATTEMPTED] += samples;
        if refused {
            stats.per_second[sent_second][REFUSED] += samples;
        }
        // An admission counts when its answer arrives: a held request is admitted late.
        if matches!(answer, Answer::Accepted) {
            stats.per_second[answered_second][DELIVERED] += samples;
        }
        answer
    }
}

/// `Retry-After` as Prometheus reads it for a retry: whole seconds, and only when positive
/// (an HTTP date is not sent by weir and not modelled). Anything else means "use your own
/// backoff".
fn parse_retry_after(value: &str) -> Option<Duration> {
    let seconds: i64 = value.trim().parse().ok()?;
    (seconds > 0).then(|| Duration::from_secs(seconds as u64))
}

/// Prometheus' retry delay: the server's `Retry-After` when honoured and given, else the
/// shard's backoff; the next backoff is twice this delay, capped.
fn retry_delay(
    retry_after: Option<Duration>,
    honour: bool,
    backoff: Duration,
    max_backoff: Duration,
) -> (Duration, Duration) {
    let sleep = match retry_after {
        Some(retry_after) if honour => retry_after,
        _ => backoff,
    };
    (sleep, (sleep * 2).min(max_backoff))
}

/// One shard: batch, send, retry, one request in flight.
async fn run_shard(
    run: Arc<Run>,
    tenant: usize,
    shard: Arc<Shard>,
    mut stop: watch::Receiver<bool>,
) {
    let max = run.sender.max_samples_per_send;
    let mut deadline = tokio::time::Instant::now() + run.batch_send_deadline;
    loop {
        // Wait for a full batch, the deadline, or the end of production.
        let samples = loop {
            {
                let mut queue = shard.queue.lock().unwrap();
                let due = tokio::time::Instant::now() >= deadline;
                if queue.queued >= max || (queue.queued > 0 && (due || queue.flushing)) {
                    break queue.take(max);
                }
                if queue.flushing {
                    return; // drained
                }
                if due {
                    deadline = tokio::time::Instant::now() + run.batch_send_deadline;
                }
            }
            tokio::select! {
                _ = shard.wake.notified() => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
        };
        let mut backoff = run.sender.min_backoff;
        let mut attempt = 0;
        loop {
            if *stop.borrow() {
                return;
            }
            match run.attempt(tenant, samples, attempt).await {
                Answer::Accepted | Answer::Drop => break,
                Answer::Retry { retry_after } => {
                    let (sleep, next) = retry_delay(
                        retry_after,
                        run.sender.retry_after == RetryAfter::Honour,
                        backoff,
                        run.sender.max_backoff,
                    );
                    backoff = next;
                    attempt += 1;
                    tokio::select! {
                        _ = tokio::time::sleep(sleep) => {}
                        _ = stop.wait_for(|stopped| *stopped) => return,
                    }
                }
            }
        }
        shard.queue.lock().unwrap().finish();
        // Prometheus resets its batch timer after every send.
        deadline = tokio::time::Instant::now() + run.batch_send_deadline;
    }
}

/// One tenant's scrape targets: when each is scraped within an interval, and how many of its
/// series go to each shard.
struct Scrapes {
    /// (phase within the interval, samples per shard), sorted by phase.
    targets: Vec<(Duration, Vec<u64>)>,
}

impl Scrapes {
    fn new(
        series: u64,
        targets: usize,
        shards: usize,
        phase: Phase,
        interval: Duration,
        rng: &mut StdRng,
    ) -> Self {
        let targets = (targets as u64).min(series).max(1);
        let mut out: Vec<(Duration, Vec<u64>)> = (0..targets)
            .map(|target| {
                // Target t owns series [t·S/T, (t+1)·S/T); series i goes to shard i mod shards.
                let (first, last) = (target * series / targets, (target + 1) * series / targets);
                let mut per_shard = vec![0u64; shards];
                for series in first..last {
                    per_shard[(series % shards as u64) as usize] += 1;
                }
                let phase = match phase {
                    Phase::Aligned => Duration::ZERO,
                    Phase::Spread => interval.mul_f64(rng.random_range(0.0..1.0)),
                };
                (phase, per_shard)
            })
            .collect();
        out.sort_by_key(|(phase, _)| *phase);
        Scrapes { targets: out }
    }
}

/// One tenant's producer: scrapes until the end of production, then tells its shards to
/// flush.
async fn produce(run: Arc<Run>, tenant: usize, scrapes: Scrapes, drain: bool) {
    let interval = run.sender.scrape_interval;
    let shards = &run.shards[tenant];
    'scraping: for cycle in 0u32.. {
        for (phase, per_shard) in &scrapes.targets {
            let at = run.start + interval * cycle + *phase;
            if at >= run.end {
                break 'scraping;
            }
            tokio::time::sleep_until(at.into()).await;
            let mut dropped = 0;
            for (shard, samples) in shards.iter().zip(per_shard) {
                if *samples == 0 {
                    continue;
                }
                let mut queue = shard.queue.lock().unwrap();
                dropped += queue.push(
                    Chunk {
                        produced: at,
                        samples: *samples,
                    },
                    run.sender.capacity,
                );
                if queue.queued >= run.sender.max_samples_per_send {
                    shard.wake.notify_one();
                }
            }
            let produced: u64 = per_shard.iter().sum();
            let second = run.second(at);
            let mut stats = run.stats[tenant].lock().unwrap();
            stats.counts.produced += produced;
            stats.counts.dropped_queue_full += dropped;
            stats.per_second[second][PRODUCED] += produced;
            stats.per_second[second][DROPPED] += dropped;
        }
    }
    if drain {
        for shard in shards {
            shard.queue.lock().unwrap().flushing = true;
            shard.wake.notify_one();
        }
    }
}

/// Each tenant's lag now: the age of its oldest undelivered sample, over its shards.
fn lags(run: &Run, now: Instant) -> Vec<Duration> {
    run.shards
        .iter()
        .map(|shards| {
            shards
                .iter()
                .filter_map(|shard| shard.queue.lock().unwrap().oldest())
                .map(|oldest| now.saturating_duration_since(oldest))
                .max()
                .unwrap_or_default()
        })
        .collect()
}

/// Runs the senders, writes the report to `--output` and prints a summary; fails, saying
/// why, when no request was answered.
pub async fn run_and_report(plan: Plan) -> anyhow::Result<()> {
    let report = run(&plan).await?;
    std::fs::write(&plan.output, serde_json::to_string(&report)?)?;
    print_summary(&report);
    eprintln!("report written to {}", plan.output);
    let answered: u64 = report
        .total
        .status
        .iter()
        .filter(|(status, _)| status.parse::<u16>().is_ok())
        .map(|(_, count)| count)
        .sum();
    match report.first_error {
        Some(error) if answered == 0 => {
            anyhow::bail!("no request was answered; the first failed with: {error}")
        }
        Some(error) => eprintln!("some requests failed; the first with: {error}"),
        None if answered == 0 => anyhow::bail!(
            "no request was sent: no shard filled a batch (--max-samples-per-send) or reached \
             --batch-send-deadline within --duration"
        ),
        None => {}
    }
    Ok(())
}

async fn run(plan: &Plan) -> anyhow::Result<Report> {
    plan.validate()?;
    let sender = plan.sender.clone();
    let shards_per_tenant = sender.shards;
    // Start on a wall-clock second, so aligned senders scrape on the second as real ones do.
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH)?;
    let to_next_second =
        Duration::from_secs(1) - Duration::from_nanos(since_epoch.subsec_nanos() as u64);
    let start = Instant::now() + to_next_second;
    let end = start + plan.duration;
    let seconds = (plan.duration + sender.drain).as_secs_f64().ceil() as usize + 1;
    let client = http_client(
        plan.timeout,
        (plan.tenants.len() * shards_per_tenant).max(16),
    )?;
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let series: Vec<u64> = plan
        .rates
        .iter()
        .map(|rate| ((rate * sender.scrape_interval.as_secs_f64()).round() as u64).max(1))
        .collect();
    let targets = plan.urls.len();
    let run = Arc::new(Run {
        start,
        end,
        seconds,
        sender: sender.clone(),
        batch_send_deadline: plan.batch_send_deadline,
        client,
        urls: plan.urls.clone(),
        splitter: Mutex::new(Splitter::new(
            plan.split.clone(),
            plan.later.clone(),
            plan.route,
            plan.seed,
        )),
        down: Arc::new((0..targets).map(|_| AtomicBool::default()).collect()),
        failover: plan.failover,
        bodies: Mutex::default(),
        now_ms: since_epoch.as_millis() as i64,
        tenants: plan.tenants.clone(),
        stats: plan
            .tenants
            .iter()
            .map(|_| {
                Mutex::new(TenantStats {
                    counts: Counts::default(),
                    per_second: vec![[0; 6]; seconds],
                })
            })
            .collect(),
        per_target: (0..targets).map(|_| Mutex::default()).collect(),
        shards: plan
            .tenants
            .iter()
            .map(|_| {
                (0..shards_per_tenant)
                    .map(|_| {
                        Arc::new(Shard {
                            queue: Mutex::default(),
                            wake: Notify::new(),
                        })
                    })
                    .collect()
            })
            .collect(),
        first_error: Mutex::default(),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut senders = tokio::task::JoinSet::new();
    let mut producers = tokio::task::JoinSet::new();
    let drain = !sender.drain.is_zero();
    for (tenant, tenant_series) in series.iter().enumerate() {
        let scrapes = Scrapes::new(
            *tenant_series,
            sender.scrape_targets,
            shards_per_tenant,
            sender.scrape_phase,
            sender.scrape_interval,
            &mut rng,
        );
        producers.spawn(produce(Arc::clone(&run), tenant, scrapes, drain));
        for shard in &run.shards[tenant] {
            senders.spawn(run_shard(
                Arc::clone(&run),
                tenant,
                Arc::clone(shard),
                stop_rx.clone(),
            ));
        }
    }

    // Sample the lag five times a second until the senders stop.
    let monitor = {
        let run = Arc::clone(&run);
        let mut stop = stop_rx.clone();
        let quiet = plan.quiet;
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval_at(start.into(), Duration::from_millis(200));
            let mut max_during_run = vec![Duration::ZERO; run.tenants.len()];
            let mut last_print = start;
            loop {
                tokio::select! {
                    _ = ticker.tick() => {}
                    _ = stop.wait_for(|stopped| *stopped) => return max_during_run,
                }
                let now = Instant::now();
                let lags = lags(&run, now);
                let second = run.second(now);
                for (tenant, lag) in lags.iter().enumerate() {
                    if now <= run.end {
                        max_during_run[tenant] = max_during_run[tenant].max(*lag);
                    }
                    let mut stats = run.stats[tenant].lock().unwrap();
                    let cell = &mut stats.per_second[second][LAG_MS];
                    *cell = (*cell).max(lag.as_millis() as u64);
                }
                if !quiet && now.duration_since(last_print) >= Duration::from_secs(1) {
                    last_print = now;
                    let (mut delivered, mut refused, mut attempted) = (0, 0, 0);
                    for stats in &run.stats {
                        let stats = stats.lock().unwrap();
                        delivered += stats.counts.delivered;
                        refused += stats.counts.refused_samples;
                        attempted += stats.counts.attempted_samples;
                    }
                    progress(format_args!(
                        "[{:>5.1}s] delivered {delivered:>10} refused {refused:>9} of {attempted:>10} attempted, lag now {:>6.2}s",
                        now.duration_since(start).as_secs_f64(),
                        lags.iter().max().copied().unwrap_or_default().as_secs_f64(),
                    ));
                }
            }
        })
    };

    while producers.join_next().await.is_some() {}
    tokio::time::sleep_until(end.into()).await;
    let lag_final = lags(&run, end);
    let unsent_at_end: Vec<u64> = unsent(&run);
    // Flush for at most --drain, then stop: a batch waiting to be retried is abandoned, a
    // request in flight is answered (within --timeout) and counted.
    let _ = tokio::time::timeout_at((end + sender.drain).into(), async {
        while senders.join_next().await.is_some() {}
    })
    .await;
    let stopped_at = Instant::now();
    let lag_after_drain = lags(&run, stopped_at);
    let unsent_after_drain = unsent(&run);
    let _ = stop_tx.send(true);
    while senders.join_next().await.is_some() {}
    let lag_max = monitor.await?;
    if !plan.quiet {
        progress_done();
    }

    let mut report = build_report(
        plan,
        &run,
        &series,
        Ends {
            lag_final,
            lag_max,
            lag_after_drain,
            unsent_at_end,
            unsent_after_drain,
            drained_seconds: stopped_at.saturating_duration_since(end).as_secs_f64(),
        },
    );
    report.first_error = run.first_error.lock().unwrap().clone();
    Ok(report)
}

fn unsent(run: &Run) -> Vec<u64> {
    run.shards
        .iter()
        .map(|shards| {
            shards
                .iter()
                .map(|shard| shard.queue.lock().unwrap().unsent())
                .sum()
        })
        .collect()
}

/// What was left when production ended and when the senders stopped, per tenant.
struct Ends {
    lag_final: Vec<Duration>,
    lag_max: Vec<Duration>,
    lag_after_drain: Vec<Duration>,
    unsent_at_end: Vec<u64>,
    unsent_after_drain: Vec<u64>,
    drained_seconds: f64,
}

#[derive(Serialize)]
struct SenderReport {
    shards: usize,
    capacity: u64,
    max_samples_per_send: u64,
    batch_send_deadline_seconds: f64,
    min_backoff_seconds: f64,
    max_backoff_seconds: f64,
    retry_after: RetryAfter,
    drop_on_http_429: bool,
    scrape_interval_seconds: f64,
    scrape_targets: usize,
    scrape_phase: Phase,
}

/// The figures for one tenant, one target, or all.
#[derive(Serialize)]
struct Totals {
    produced_samples: u64,
    /// Samples in requests answered 2xx (during the run and the drain).
    delivered_samples: u64,
    delivered_per_produced: Option<f64>,
    /// Every HTTP attempt, retries included.
    attempts: u64,
    attempted_samples: u64,
    retries: u64,
    refused_requests: u64,
    refused_samples: u64,
    /// Refused (429) samples ÷ attempted samples.
    refused_per_arrivals: Option<f64>,
    refused_requests_per_attempts: Option<f64>,
    /// 5xx and transport errors (retried).
    failed_requests: u64,
    dropped_queue_full_samples: u64,
    /// Lost to a non-retried refusal (`--drop-on-http-429`, other 4xx).
    dropped_refused_samples: u64,
    /// Produced but not delivered when production ended / when the senders stopped.
    unsent_at_end_samples: u64,
    unsent_after_drain_samples: u64,
    /// The age of the oldest undelivered sample when production ended, the most it reached
    /// during production, and when the senders stopped.
    lag_final_seconds: f64,
    lag_max_seconds: f64,
    lag_after_drain_seconds: f64,
    /// Delivered per second from `--warm-up` to the end of production.
    delivered_per_second_after_warm_up: f64,
    /// Accepted requests only: a held request's late 200 shows here.
    latency_ms_p50: Option<f64>,
    latency_ms_p99: Option<f64>,
    latency_ms_max: Option<f64>,
    status: BTreeMap<String, u64>,
}

#[derive(Serialize)]
struct TargetTotals {
    target: String,
    attempts: u64,
    attempted_samples: u64,
    delivered_samples: u64,
    refused_samples: u64,
    latency_ms_p50: Option<f64>,
    latency_ms_p99: Option<f64>,
    status: BTreeMap<String, u64>,
}

#[derive(Serialize)]
struct TenantReport {
    tenant: String,
    offered_samples_per_second: f64,
    series: u64,
    #[serde(flatten)]
    totals: Totals,
    /// Per second, in `per_second_columns` order.
    per_second: Vec<[u64; 6]>,
}

#[derive(Serialize)]
struct Second {
    second: usize,
    produced: u64,
    delivered: u64,
    attempted_samples: u64,
    refused_samples: u64,
    dropped: u64,
    /// The largest lag of any tenant sampled that second.
    lag_max_seconds: f64,
}

#[derive(Serialize)]
struct Report {
    mode: &'static str,
    targets: Vec<String>,
    tenants: usize,
    duration_seconds: f64,
    drain_seconds: f64,
    drained_seconds: f64,
    warm_up_seconds: f64,
    offered_samples_per_second: f64,
    sender: SenderReport,
    total: Totals,
    per_target: Vec<TargetTotals>,
    timeline: Vec<Second>,
    per_second_columns: [&'static str; 6],
    per_tenant: Vec<TenantReport>,
    /// The first transport error, with its causes.
    first_error: Option<String>,
}

fn ratio(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

fn totals(
    counts: &mut Counts,
    per_second: &[[u64; 6]],
    warm_up: usize,
    production: usize,
    ends: (Duration, Duration, Duration, u64, u64),
) -> Totals {
    counts.latencies_us.sort_unstable();
    let (lag_final, lag_max, lag_after_drain, unsent_at_end, unsent_after_drain) = ends;
    let window = production.saturating_sub(warm_up).max(1);
    let delivered_in_window: u64 = per_second
        .iter()
        .skip(warm_up)
        .take(production.saturating_sub(warm_up))
        .map(|row| row[DELIVERED])
        .sum();
    Totals {
        produced_samples: counts.produced,
        delivered_samples: counts.delivered,
        delivered_per_produced: ratio(counts.delivered, counts.produced),
        attempts: counts.attempts,
        attempted_samples: counts.attempted_samples,
        retries: counts.retries,
        refused_requests: counts.refused_requests,
        refused_samples: counts.refused_samples,
        refused_per_arrivals: ratio(counts.refused_samples, counts.attempted_samples),
        refused_requests_per_attempts: ratio(counts.refused_requests, counts.attempts),
        failed_requests: counts.failed_requests,
        dropped_queue_full_samples: counts.dropped_queue_full,
        dropped_refused_samples: counts.dropped_refused,
        unsent_at_end_samples: unsent_at_end,
        unsent_after_drain_samples: unsent_after_drain,
        lag_final_seconds: lag_final.as_secs_f64(),
        lag_max_seconds: lag_max.as_secs_f64(),
        lag_after_drain_seconds: lag_after_drain.as_secs_f64(),
        delivered_per_second_after_warm_up: delivered_in_window as f64 / window as f64,
        latency_ms_p50: percentile(&counts.latencies_us, 0.5),
        latency_ms_p99: percentile(&counts.latencies_us, 0.99),
        latency_ms_max: counts.latencies_us.last().map(|us| *us as f64 / 1000.0),
        status: counts.status.clone(),
    }
}

fn build_report(plan: &Plan, run: &Run, series: &[u64], ends: Ends) -> Report {
    let production = plan.duration.as_secs() as usize;
    let warm_up = (plan.sender.warm_up.as_secs() as usize).min(production.saturating_sub(1));
    let mut all = Counts::default();
    let mut all_seconds = vec![[0u64; 6]; run.seconds];
    let mut per_tenant = Vec::with_capacity(run.tenants.len());
    for (tenant, stats) in run.stats.iter().enumerate() {
        let mut stats = stats.lock().unwrap();
        all.add(&stats.counts);
        for (sum, row) in all_seconds.iter_mut().zip(&stats.per_second) {
            for column in 0..LAG_MS {
                sum[column] += row[column];
            }
            sum[LAG_MS] = sum[LAG_MS].max(row[LAG_MS]);
        }
        let per_second = stats.per_second.clone();
        per_tenant.push(TenantReport {
            tenant: run.tenants[tenant].clone(),
            offered_samples_per_second: plan.rates[tenant],
            series: series[tenant],
            totals: totals(
                &mut stats.counts,
                &per_second,
                warm_up,
                production,
                (
                    ends.lag_final[tenant],
                    ends.lag_max[tenant],
                    ends.lag_after_drain[tenant],
                    ends.unsent_at_end[tenant],
                    ends.unsent_after_drain[tenant],
                ),
            ),
            per_second,
        });
    }
    let max = |lags: &[Duration]| lags.iter().max().copied().unwrap_or_default();
    let total = totals(
        &mut all,
        &all_seconds,
        warm_up,
        production,
        (
            max(&ends.lag_final),
            max(&ends.lag_max),
            max(&ends.lag_after_drain),
            ends.unsent_at_end.iter().sum(),
            ends.unsent_after_drain.iter().sum(),
        ),
    );
    let sender = &plan.sender;
    Report {
        mode: "closed-loop",
        targets: plan.targets.clone(),
        tenants: plan.tenants.len(),
        duration_seconds: plan.duration.as_secs_f64(),
        drain_seconds: sender.drain.as_secs_f64(),
        drained_seconds: ends.drained_seconds,
        warm_up_seconds: warm_up as f64,
        offered_samples_per_second: plan.rates.iter().sum(),
        sender: SenderReport {
            shards: sender.shards,
            capacity: sender.capacity,
            max_samples_per_send: sender.max_samples_per_send,
            batch_send_deadline_seconds: plan.batch_send_deadline.as_secs_f64(),
            min_backoff_seconds: sender.min_backoff.as_secs_f64(),
            max_backoff_seconds: sender.max_backoff.as_secs_f64(),
            retry_after: sender.retry_after,
            drop_on_http_429: sender.drop_on_http_429,
            scrape_interval_seconds: sender.scrape_interval.as_secs_f64(),
            scrape_targets: sender.scrape_targets,
            scrape_phase: sender.scrape_phase,
        },
        total,
        per_target: run
            .per_target
            .iter()
            .zip(&plan.targets)
            .map(|(counts, target)| {
                let mut counts = counts.lock().unwrap();
                counts.latencies_us.sort_unstable();
                TargetTotals {
                    target: target.clone(),
                    attempts: counts.attempts,
                    attempted_samples: counts.attempted_samples,
                    delivered_samples: counts.delivered,
                    refused_samples: counts.refused_samples,
                    latency_ms_p50: percentile(&counts.latencies_us, 0.5),
                    latency_ms_p99: percentile(&counts.latencies_us, 0.99),
                    status: counts.status.clone(),
                }
            })
            .collect(),
        timeline: all_seconds
            .iter()
            .enumerate()
            .map(|(second, row)| Second {
                second,
                produced: row[PRODUCED],
                delivered: row[DELIVERED],
                attempted_samples: row[ATTEMPTED],
                refused_samples: row[REFUSED],
                dropped: row[DROPPED],
                lag_max_seconds: row[LAG_MS] as f64 / 1000.0,
            })
            .collect(),
        per_second_columns: COLUMNS,
        per_tenant,
        first_error: None,
    }
}

fn print_summary(report: &Report) {
    let total = &report.total;
    let percent = |value: Option<f64>| value.map_or(f64::NAN, |v| 100.0 * v);
    println!(
        "closed loop, {} tenant(s), {:.0} samples/s offered: produced {}, delivered {} ({:.2} %), \
         refused {:.2} % of {} attempts' samples, dropped (queue full) {}",
        report.tenants,
        report.offered_samples_per_second,
        total.produced_samples,
        total.delivered_samples,
        percent(total.delivered_per_produced),
        percent(total.refused_per_arrivals),
        total.attempts,
        total.dropped_queue_full_samples,
    );
    println!(
        "delivered after warm-up {:.0} samples/s; lag final {:.2} s, max {:.2} s; accepted \
         latency p50 {:.2} ms, p99 {:.2} ms; status {:?}",
        total.delivered_per_second_after_warm_up,
        total.lag_final_seconds,
        total.lag_max_seconds,
        total.latency_ms_p50.unwrap_or(f64::NAN),
        total.latency_ms_p99.unwrap_or(f64::NAN),
        total.status,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// When each request arrived, and its `Retry-Attempt`.
    type Arrivals = Arc<Mutex<Vec<(Instant, Option<String>)>>>;

    /// A push endpoint that refuses the first request with `Retry-After: 1` and admits the
    /// rest.
    async fn refuse_once() -> (String, Arrivals) {
        use axum::http::{HeaderMap, StatusCode};
        let seen: Arrivals = Arc::default();
        let log = Arc::clone(&seen);
        let app = axum::Router::new().route(
            "/api/v1/push",
            axum::routing::post(move |headers: HeaderMap| {
                let log = Arc::clone(&log);
                async move {
                    let attempt = headers
                        .get("retry-attempt")
                        .map(|v| v.to_str().unwrap().to_string());
                    let mut log = log.lock().unwrap();
                    log.push((Instant::now(), attempt));
                    if log.len() == 1 {
                        (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")])
                    } else {
                        (StatusCode::OK, [("retry-after", "0")])
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (url, seen)
    }

    /// One tenant scraping 100 series once (a 1 s run), one shard, batches of 100.
    fn one_batch(url: &str, retry_after: RetryAfter) -> Plan {
        Plan {
            sender: ClosedLoopArgs {
                shards: 1,
                capacity: 1000,
                max_samples_per_send: 100,
                min_backoff: Duration::from_millis(30),
                max_backoff: Duration::from_secs(5),
                retry_after,
                drop_on_http_429: false,
                scrape_interval: Duration::from_secs(1),
                scrape_targets: 1,
                scrape_phase: Phase::Aligned,
                series_per_tenant: None,
                drain: Duration::from_secs(5),
                warm_up: Duration::ZERO,
            },
            batch_send_deadline: Duration::from_secs(5),
            targets: vec![url.to_string()],
            urls: vec![format!("{url}/api/v1/push")],
            split: vec![1.0],
            later: Vec::new(),
            route: Route::RoundRobin,
            failover: false,
            tenants: vec!["t".into()],
            rates: vec![100.0],
            duration: Duration::from_secs(1),
            timeout: Duration::from_secs(5),
            seed: 1,
            output: String::new(),
            quiet: true,
        }
    }

    #[tokio::test]
    async fn a_refused_batch_is_sent_again_after_retry_after() {
        let (url, seen) = refuse_once().await;
        let report = run(&one_batch(&url, RetryAfter::Honour)).await.unwrap();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2, "{seen:?}");
        let gap = seen[1].0 - seen[0].0;
        assert!(gap >= Duration::from_secs(1), "{gap:?}");
        assert_eq!(
            (seen[0].1.as_deref(), seen[1].1.as_deref()),
            (None, Some("1"))
        );
        let total = &report.total;
        assert_eq!(total.produced_samples, 100);
        assert_eq!(total.delivered_samples, 100);
        assert_eq!(
            (total.attempts, total.retries, total.refused_samples),
            (2, 1, 100)
        );
        assert_eq!(total.refused_per_arrivals, Some(0.5));
        // The sample waited for the retry: it was at least a second old when production
        // ended, and nothing was left after the drain.
        assert!(
            total.lag_final_seconds >= 0.9,
            "{}",
            total.lag_final_seconds
        );
        assert_eq!(total.unsent_after_drain_samples, 0);
    }

    #[tokio::test]
    async fn ignoring_retry_after_retries_after_the_senders_own_backoff() {
        let (url, seen) = refuse_once().await;
        let report = run(&one_batch(&url, RetryAfter::Ignore)).await.unwrap();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2, "{seen:?}");
        let gap = seen[1].0 - seen[0].0;
        assert!(
            (Duration::from_millis(30)..Duration::from_millis(500)).contains(&gap),
            "{gap:?}"
        );
        assert_eq!(report.total.delivered_samples, 100);
    }

    #[test]
    fn retry_after_is_honoured_then_doubled_as_prometheus_does() {
        let (min, max) = (Duration::from_millis(30), Duration::from_secs(5));
        // No Retry-After: the backoff, doubling to the cap.
        assert_eq!(retry_delay(None, true, min, max), (min, min * 2));
        // Retry-After: 2 → sleep 2 s, next backoff 4 s; 6 s → capped at 5 s.
        let two = Duration::from_secs(2);
        assert_eq!(retry_delay(Some(two), true, min, max), (two, two * 2));
        let six = Duration::from_secs(6);
        assert_eq!(retry_delay(Some(six), true, min, max), (six, max));
        // Ignored (vmagent-like): the header plays no part.
        assert_eq!(retry_delay(Some(six), false, min, max), (min, min * 2));
    }

    #[test]
    fn only_positive_whole_seconds_count_as_retry_after() {
        assert_eq!(parse_retry_after("6"), Some(Duration::from_secs(6)));
        assert_eq!(parse_retry_after(" 1 "), Some(Duration::from_secs(1)));
        assert_eq!(parse_retry_after("0"), None);
        assert_eq!(parse_retry_after("0.5"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }

    #[test]
    fn a_full_queue_drops_what_does_not_fit_and_the_lag_follows_the_oldest_sample() {
        let t0 = Instant::now();
        let chunk = |after_ms, samples| Chunk {
            produced: t0 + Duration::from_millis(after_ms),
            samples,
        };
        let mut queue = Queue::default();
        assert_eq!(queue.push(chunk(0, 600), 1000), 0);
        assert_eq!(queue.push(chunk(10, 600), 1000), 200);
        assert_eq!(queue.queued, 1000);
        assert_eq!(queue.push(chunk(20, 1), 0), 0); // no bound
                                                    // A batch of 700 takes the first chunk and part of the second; the lag still counts
                                                    // the batch in flight.
        assert_eq!(queue.take(700), 700);
        assert_eq!(queue.oldest(), Some(t0));
        assert_eq!(queue.unsent(), 1001);
        queue.finish();
        assert_eq!(queue.oldest(), Some(t0 + Duration::from_millis(10)));
        assert_eq!(queue.take(2000), 301);
        queue.finish();
        assert_eq!((queue.oldest(), queue.unsent()), (None, 0));
    }

    #[test]
    fn scrapes_split_series_over_targets_and_shards() {
        let mut rng = StdRng::seed_from_u64(1);
        let interval = Duration::from_secs(1);
        let scrapes = Scrapes::new(9000, 10, 4, Phase::Spread, interval, &mut rng);
        assert_eq!(scrapes.targets.len(), 10);
        let total: u64 = scrapes.targets.iter().flat_map(|(_, s)| s).sum();
        assert_eq!(total, 9000);
        assert!(scrapes.targets.iter().all(|(phase, _)| *phase < interval));
        assert!(scrapes.targets.windows(2).all(|w| w[0].0 <= w[1].0));
        let aligned = Scrapes::new(3, 10, 4, Phase::Aligned, interval, &mut rng);
        assert_eq!(aligned.targets.len(), 3); // no more targets than series
        assert!(aligned.targets.iter().all(|(phase, _)| phase.is_zero()));
    }
}

//! weir-admission-bench: drives weir's admission API over gRPC and reports what it measured,
//! as JSON on stdout.
//!
//! ```text
//! # Decisions per second and call latency, AllowBatch of 100, one replica:
//! weir-admission-bench throughput --target 127.0.0.1:9095 --tenant bench --key k --batch 100
//! # Fleet accuracy: 3× the limit offered, split over the replicas, admitted ÷ allowance:
//! weir-admission-bench rate --target A --target B --target C --split 100,0,0 \
//!     --tenant t --key k --rate 1000 --burst 1000 --offered 3 --duration 20s
//! # Fleet-wide in flight: 500 clients holding leases 50–500 ms:
//! weir-admission-bench concurrency --target A --target B --target C --tenant t --key slots \
//!     --clients 500 --limit 100 --duration 20s
//! # The yardstick: a bare tonic server for weir.admission.v1 that allows everything:
//! weir-admission-bench serve-bare --listen 127.0.0.1:0
//! ```
//!
//! `rate` paces single `Allow`s open loop (every millisecond, the due count is sent whether
//! or not earlier calls answered). `concurrency` counts, client side, the leases granted and
//! not yet released: a lease is counted once its grant arrives and uncounted just before its
//! release is sent, so the count can only under-read the server's by one round trip.
//!
//! `serve-bare` is what weir's admission API costs without weir: the same generated types and
//! the same tonic server settings as `server::serve_grpc`, and an `Allow` answered with a
//! fixed response as large as weir's, with no authentication, name check or limiter.
//! `scripts/admission-bench.py` drives both with `throughput` and divides their CPU per call.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use rand::{Rng, SeedableRng};
use serde_json::json;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use weir::grpc::proto::weir::admission::v1 as api;
use weir::grpc::proto::weir::admission::v1::admission_client::AdmissionClient;

/// weir's allocator, so the bare server differs from weir only in what weir does per call.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "weir-admission-bench",
    about = "Benchmarks weir's admission API over gRPC"
)]
struct Args {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(clap::Args, Clone)]
struct Common {
    /// A replica's gRPC address, host:port (repeat for several).
    #[arg(long = "target", required = true)]
    targets: Vec<String>,
    /// Share of calls per target, e.g. `100,0,0` (default: even).
    #[arg(long, value_delimiter = ',')]
    split: Vec<f64>,
    #[arg(long, default_value = "bench")]
    tenant: String,
    #[arg(long, default_value = "k")]
    key: String,
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
}

#[derive(Subcommand)]
enum Mode {
    /// Closed loop, as fast as the server answers: decisions/s and call latency.
    Throughput {
        #[command(flatten)]
        common: Common,
        /// Decisions per call (AllowBatch); 1 uses Allow.
        #[arg(long, default_value_t = 100)]
        batch: usize,
        /// Calls outstanding at once.
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        /// HTTP/2 connections (calls are spread over them).
        #[arg(long, default_value_t = 4)]
        connections: usize,
    },
    /// Open loop at `offered` × `rate` single Allows per second: admitted ÷ allowance.
    Rate {
        #[command(flatten)]
        common: Common,
        /// The key's configured rate, per second, fleet-wide.
        #[arg(long)]
        rate: f64,
        /// What the limit allows at once beyond the rate (the burst, a window's worth, the
        /// queue bound): the allowance is rate × duration + burst.
        #[arg(long)]
        burst: f64,
        /// Offered load, as a multiple of the rate.
        #[arg(long, default_value_t = 3.0)]
        offered: f64,
    },
    /// `clients` loops of Acquire, hold 50–500 ms, Release: the fleet-wide in-flight count.
    Concurrency {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value_t = 500)]
        clients: usize,
        /// The key's max_concurrent (for the report).
        #[arg(long)]
        limit: u64,
        #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
        hold_min: Duration,
        #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
        hold_max: Duration,
    },
    /// Serve weir.admission.v1 with tonic alone, allowing every call; prints
    /// `listening on ADDR` and serves until killed.
    ServeBare {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: std::net::SocketAddr,
    },
}

fn request(common: &Common, cost: u64) -> api::AllowRequest {
    api::AllowRequest {
        tenant: common.tenant.clone(),
        key: common.key.clone(),
        cost,
        limit: None,
    }
}

async fn connect(target: &str) -> anyhow::Result<AdmissionClient<Channel>> {
    Ok(AdmissionClient::connect(format!("http://{target}")).await?)
}

/// Smooth weighted round robin over the split (nginx's): deterministic, exact in the long
/// run.
struct Router {
    weights: Vec<f64>,
    current: Vec<f64>,
}

impl Router {
    fn new(targets: usize, split: &[f64]) -> Router {
        let weights = if split.is_empty() {
            vec![1.0; targets]
        } else {
            assert_eq!(
                split.len(),
                targets,
                "--split needs one weight per --target"
            );
            split.to_vec()
        };
        Router {
            current: vec![0.0; targets],
            weights,
        }
    }

    fn next(&mut self) -> usize {
        let total: f64 = self.weights.iter().sum();
        for (current, weight) in self.current.iter_mut().zip(&self.weights) {
            *current += weight;
        }
        let best = (0..self.current.len())
            .max_by(|&a, &b| self.current[a].total_cmp(&self.current[b]))
            .unwrap_or(0);
        self.current[best] -= total;
        best
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index].as_secs_f64() * 1e3
}

async fn throughput(
    common: Common,
    batch: usize,
    concurrency: usize,
    connections: usize,
) -> anyhow::Result<serde_json::Value> {
    let mut clients = Vec::new();
    for i in 0..connections.max(1) {
        clients.push(connect(&common.targets[i % common.targets.len()]).await?);
    }
    let deadline = Instant::now() + common.duration;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..concurrency.max(1) {
        let mut client = clients[i % clients.len()].clone();
        let common = common.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut decisions = 0u64;
            let mut allowed = 0u64;
            // An item's error by its reason (AllowBatch answers each item on its own).
            let mut errors = std::collections::BTreeMap::<String, u64>::new();
            let requests: Vec<_> = (0..batch.max(1)).map(|_| request(&common, 1)).collect();
            while Instant::now() < deadline {
                let sent = Instant::now();
                if batch <= 1 {
                    let answer = client.allow(requests[0].clone()).await?.into_inner();
                    allowed += answer.allowed as u64;
                    decisions += 1;
                } else {
                    use api::allow_batch_response::result::Result as Item;
                    let answer = client
                        .allow_batch(api::AllowBatchRequest {
                            requests: requests.clone(),
                        })
                        .await?
                        .into_inner();
                    decisions += answer.results.len() as u64;
                    for result in answer.results {
                        match result.result {
                            Some(Item::Response(response)) => allowed += response.allowed as u64,
                            Some(Item::Error(error)) => {
                                *errors.entry(error.reason).or_default() += 1
                            }
                            None => *errors.entry("NO_RESULT".into()).or_default() += 1,
                        }
                    }
                }
                latencies.push(sent.elapsed());
            }
            anyhow::Ok((latencies, decisions, allowed, errors))
        }));
    }
    let mut latencies = Vec::new();
    let (mut decisions, mut allowed) = (0, 0);
    let mut errors = std::collections::BTreeMap::<String, u64>::new();
    for task in tasks {
        let (mine, d, a, e) = task.await??;
        latencies.extend(mine);
        decisions += d;
        allowed += a;
        for (reason, count) in e {
            *errors.entry(reason).or_default() += count;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort();
    Ok(json!({
        "mode": "throughput",
        "batch": batch,
        "concurrency": concurrency,
        "connections": connections,
        "seconds": elapsed,
        "calls": latencies.len(),
        "decisions": decisions,
        "allowed": allowed,
        "item_errors": errors,
        "decisions_per_second": decisions as f64 / elapsed,
        "calls_per_second": latencies.len() as f64 / elapsed,
        "call_p50_ms": percentile(&latencies, 0.50),
        "call_p99_ms": percentile(&latencies, 0.99),
    }))
}

async fn rate(
    common: Common,
    rate: f64,
    burst: f64,
    offered: f64,
) -> anyhow::Result<serde_json::Value> {
    let mut clients = Vec::new();
    for target in &common.targets {
        clients.push(connect(target).await?);
    }
    let mut router = Router::new(clients.len(), &common.split);
    let per_second = rate * offered;
    let admitted = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let codes = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<
        String,
        u64,
    >::new()));
    let started = Instant::now();
    let mut sent = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = tokio::task::JoinSet::new();
    while started.elapsed() < common.duration {
        tick.tick().await;
        let due = (started.elapsed().as_secs_f64() * per_second) as u64;
        while sent < due {
            sent += 1;
            let mut client = clients[router.next()].clone();
            let call = request(&common, 1);
            let (admitted, refused, errors, codes) = (
                Arc::clone(&admitted),
                Arc::clone(&refused),
                Arc::clone(&errors),
                Arc::clone(&codes),
            );
            tasks.spawn(async move {
                match client.allow(call).await {
                    Ok(answer) if answer.get_ref().allowed => {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(status) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        let code = format!("{:?}: {}", status.code(), status.message());
                        *codes.lock().unwrap().entry(code).or_default() += 1;
                    }
                }
            });
        }
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let seconds = common.duration.as_secs_f64();
    let allowance = rate * seconds + burst;
    let admitted = admitted.load(Ordering::Relaxed);
    Ok(json!({
        "mode": "rate",
        "split": common.split,
        "key": common.key,
        "rate": rate,
        "burst": burst,
        "offered_per_second": per_second,
        "seconds": seconds,
        "sent": sent,
        "admitted": admitted,
        "refused": refused.load(Ordering::Relaxed),
        "errors": errors.load(Ordering::Relaxed),
        "error_codes": *codes.lock().unwrap(),
        "allowance": allowance,
        "admitted_over_allowance": admitted as f64 / allowance,
    }))
}

async fn concurrency(
    common: Common,
    clients: usize,
    limit: u64,
    hold_min: Duration,
    hold_max: Duration,
) -> anyhow::Result<serde_json::Value> {
    let mut stubs = Vec::new();
    for target in &common.targets {
        stubs.push(connect(target).await?);
    }
    let mut router = Router::new(stubs.len(), &common.split);
    let in_flight = Arc::new(AtomicI64::new(0));
    let granted = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + common.duration;
    let mut tasks = Vec::new();
    for i in 0..clients {
        let mut stub = stubs[router.next()].clone();
        let (in_flight, granted, refused, errors) = (
            Arc::clone(&in_flight),
            Arc::clone(&granted),
            Arc::clone(&refused),
            Arc::clone(&errors),
        );
        let common = common.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(i as u64);
            while Instant::now() < deadline {
                let answer = stub
                    .acquire(api::AcquireRequest {
                        tenant: common.tenant.clone(),
                        key: common.key.clone(),
                        limit: None,
                        ttl: Some(prost_types::Duration {
                            seconds: 30,
                            nanos: 0,
                        }),
                    })
                    .await;
                let answer = match answer {
                    Ok(answer) => answer.into_inner(),
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if !answer.granted {
                    refused.fetch_add(1, Ordering::Relaxed);
                    let wait = answer
                        .retry_after
                        .and_then(|d| Duration::try_from(d).ok())
                        .unwrap_or(Duration::from_millis(10))
                        .clamp(Duration::from_millis(5), Duration::from_millis(50));
                    tokio::time::sleep(wait).await;
                    continue;
                }
                in_flight.fetch_add(1, Ordering::SeqCst);
                granted.fetch_add(1, Ordering::Relaxed);
                let hold = rng.random_range(hold_min..=hold_max.max(hold_min));
                tokio::time::sleep(hold).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                if stub
                    .release(api::ReleaseRequest {
                        lease_id: answer.lease_id,
                    })
                    .await
                    .is_err()
                {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    // Sample the count every millisecond.
    let mut samples = Vec::new();
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    while Instant::now() < deadline {
        tick.tick().await;
        samples.push(in_flight.load(Ordering::SeqCst).max(0) as u64);
    }
    for task in tasks {
        task.await?;
    }
    // The first second fills up; judge the rest.
    let skip = samples.len().min(1000);
    let steady = &samples[skip..];
    let max = steady.iter().copied().max().unwrap_or(0);
    let mean = steady.iter().sum::<u64>() as f64 / steady.len().max(1) as f64;
    let over = steady.iter().filter(|&&n| n > limit).count() as f64 / steady.len().max(1) as f64;
    let mut sorted = steady.to_vec();
    sorted.sort_unstable();
    let p99 = sorted
        .get(((sorted.len() as f64 * 0.99) as usize).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0);
    Ok(json!({
        "mode": "concurrency",
        "split": common.split,
        "clients": clients,
        "limit": limit,
        "seconds": started.elapsed().as_secs_f64(),
        "granted": granted.load(Ordering::Relaxed),
        "refused": refused.load(Ordering::Relaxed),
        "errors": errors.load(Ordering::Relaxed),
        "max_in_flight": max,
        "p99_in_flight": p99,
        "mean_in_flight": mean,
        "share_of_time_over_limit": over,
        "max_over_limit": max as f64 / limit as f64,
    }))
}

/// Answers `Allow` and `AllowBatch` with `allowed`; the rest are unimplemented.
struct BareAdmission {
    /// weir's answer for the bench key of `scripts/admission-bench.py` (rate 1e12, burst 4e9),
    /// so both servers encode and send the same 42 bytes.
    allowed: api::AllowResponse,
}

impl BareAdmission {
    fn new() -> BareAdmission {
        let zero = Some(prost_types::Duration::default());
        BareAdmission {
            allowed: api::AllowResponse {
                allowed: true,
                remaining: 4_000_000_000,
                retry_after: zero,
                reset_after: zero,
                limit_in_force: Some(api::LimitSpec {
                    algorithm: api::Algorithm::TokenBucket as i32,
                    rate: 1e12,
                    burst: 4_000_000_000,
                    window: Some(prost_types::Duration {
                        seconds: 1,
                        nanos: 0,
                    }),
                    max_concurrent: 0,
                }),
                delay: zero,
                limit_source: "key".to_string(),
            },
        }
    }
}

#[tonic::async_trait]
impl api::admission_server::Admission for BareAdmission {
    async fn allow(
        &self,
        _: Request<api::AllowRequest>,
    ) -> Result<Response<api::AllowResponse>, Status> {
        Ok(Response::new(self.allowed.clone()))
    }

    async fn allow_batch(
        &self,
        request: Request<api::AllowBatchRequest>,
    ) -> Result<Response<api::AllowBatchResponse>, Status> {
        use api::allow_batch_response::{result, Result as Item};
        let results = (request.get_ref().requests.iter())
            .map(|_| Item {
                result: Some(result::Result::Response(self.allowed.clone())),
            })
            .collect();
        Ok(Response::new(api::AllowBatchResponse { results }))
    }

    async fn acquire(
        &self,
        _: Request<api::AcquireRequest>,
    ) -> Result<Response<api::AcquireResponse>, Status> {
        Err(Status::unimplemented("bare server"))
    }

    async fn release(
        &self,
        _: Request<api::ReleaseRequest>,
    ) -> Result<Response<api::ReleaseResponse>, Status> {
        Err(Status::unimplemented("bare server"))
    }

    async fn renew(
        &self,
        _: Request<api::RenewRequest>,
    ) -> Result<Response<api::RenewResponse>, Status> {
        Err(Status::unimplemented("bare server"))
    }

    async fn lease(
        &self,
        _: Request<api::LeaseRequest>,
    ) -> Result<Response<api::LeaseResponse>, Status> {
        Err(Status::unimplemented("bare server"))
    }
}

/// The settings of `server::serve_grpc` with weir's defaults (--http-header-read-timeout 30s,
/// --http-max-header-bytes 1 MiB), and TCP_NODELAY as `grpc::incoming` sets it.
async fn serve_bare(listen: std::net::SocketAddr) -> anyhow::Result<()> {
    use api::admission_server::AdmissionServer;
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("listening on {}", listener.local_addr()?);
    let incoming = tonic::transport::server::TcpIncoming::from_listener(listener, true, None)
        .map_err(|err| anyhow::anyhow!("{err}"))?;
    tonic::transport::Server::builder()
        .max_concurrent_streams(256)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(30)))
        .http2_max_header_list_size(1 << 20)
        .add_service(AdmissionServer::new(BareAdmission::new()))
        .serve_with_incoming(incoming)
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let report = match Args::parse().mode {
        Mode::Throughput {
            common,
            batch,
            concurrency: outstanding,
            connections,
        } => throughput(common, batch, outstanding, connections).await?,
        Mode::Rate {
            common,
            rate: per_second,
            burst,
            offered,
        } => rate(common, per_second, burst, offered).await?,
        Mode::Concurrency {
            common,
            clients,
            limit,
            hold_min,
            hold_max,
        } => concurrency(common, clients, limit, hold_min, hold_max).await?,
        Mode::ServeBare { listen } => return serve_bare(listen).await,
    };
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

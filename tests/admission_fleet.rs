//! The admission API across three real `weir` processes gossiping on 127.0.0.x, driven by the
//! real `weir-admission-bench` binary over gRPC: each algorithm's fleet-wide accuracy at 3× its
//! limit, evenly spread and all on one replica, and the fleet-wide in-flight count of many
//! clients holding leases, under `divided`, `weighted` and (against a real Redis) `shared`.

mod common;

#[path = "../redis-store/tests/redis_server.rs"]
mod redis_server;

use std::time::Duration;

use common::fleet::{free_gossip_addr, spawn, until_healthy, Replica};
use serde_json::Value;

const RATE: f64 = 100.0;

/// One fleet at a time: three fleets and eighteen load processes at once would starve two
/// cores, and starvation is not what these tests measure.
static ONE_FLEET_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const MAX_CONCURRENT: u64 = 30;
/// The share of the cap the concurrency bench must keep in use on average. A slot the bench
/// has let go is held at its replica until the release's round trip through a debug build
/// ends, and a refused client waits out the hint (clamped to 50 ms) before it asks again: on
/// a slow day (2026-12-02) the means read 20.6 of 30 under `weighted` and 18.3-19.9 under
/// `shared`, at this build and the one before alike, where the floor was 0.7. Half the cap
/// still fails a fleet that leaks slots or refuses with room to spare.
const IN_USE_FLOOR: f64 = 0.5;

/// Every algorithm at RATE per second, one key per algorithm and split.
fn overrides(strategy: &str) -> String {
    let mut limits = String::new();
    for split in ["even", "one"] {
        limits += &format!(
            "      tb-{split}: {{rate: {RATE}, burst: {RATE}}}\n      \
             sw-{split}: {{algorithm: sliding_window, rate: {RATE}, window: 1s}}\n      \
             lb-{split}: {{algorithm: leaky_bucket, rate: {RATE}, burst: {RATE}}}\n"
        );
    }
    format!(
        "overrides:\n  t:\n    rate_limit_strategy: {strategy}\n    on_store_failure: closed\n    \
         limits:\n{limits}      slots: {{max_concurrent: {MAX_CONCURRENT}}}\n"
    )
}

struct Fleet {
    replicas: Vec<Replica>,
    _dir: tempfile::TempDir,
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

async fn fleet(first_ip: u8, strategy: &str, extra: &[&str]) -> Fleet {
    let serial = ONE_FLEET_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("overrides.yaml");
    std::fs::write(&path, overrides(strategy)).unwrap();
    let gossip: Vec<_> = (0..3)
        .map(|i| free_gossip_addr([127, 0, 0, first_ip + i]))
        .collect();
    let mut args = vec![
        "--runtime-config",
        path.to_str().unwrap(),
        "--gossip-interval",
        "100ms",
    ];
    args.extend_from_slice(extra);
    let cluster = format!("admission-{strategy}-{}", std::process::id());
    let replicas: Vec<_> = gossip
        .iter()
        .map(|addr| spawn(*addr, &gossip, &cluster, &args))
        .collect();
    until_healthy(
        &replicas.iter().collect::<Vec<_>>(),
        3,
        Duration::from_secs(20),
    )
    .await;
    Fleet {
        replicas,
        _dir: dir,
        _serial: serial,
    }
}

impl Fleet {
    fn targets(&self) -> Vec<String> {
        self.replicas.iter().map(|r| r.grpc.to_string()).collect()
    }
}

/// Runs the bench binary with `args` against `targets` (split as given) and parses its report.
async fn bench(targets: Vec<String>, mode: &str, key: &str, split: &str, args: &[String]) -> Value {
    common::processes::admission_bench(&targets, mode, key, split, args).await
}

/// admitted ÷ allowance for each algorithm, evenly spread and all on one replica: the three
/// algorithms at once, one split after the other (six bench processes at once beside a debug
/// fleet and Redis overloaded 2 cores: a CI run saw `shared`'s store calls time out).
/// The allowance is what one exact limiter admits of 3× the rate over 5 s: rate × 5 s plus
/// the burst (token bucket) or the queue bound (leaky bucket); the sliding window has no
/// burst beyond its rate. `divided` (Mimir's) divides the rate by the replicas and keeps each
/// replica's burst whole, so its allowance is per replica.
async fn accuracy(fleet: &Fleet, divided: bool) -> Vec<(String, f64)> {
    let mut results = Vec::new();
    for (split, weights) in [("even", "1,1,1"), ("one", "100,0,0")] {
        results.extend(accuracy_of_split(fleet, divided, split, weights).await);
    }
    results
}

async fn accuracy_of_split(
    fleet: &Fleet,
    divided: bool,
    split: &'static str,
    weights: &'static str,
) -> Vec<(String, f64)> {
    let mut runs = tokio::task::JoinSet::new();
    for algorithm in ["tb", "sw", "lb"] {
        let key = format!("{algorithm}-{split}");
        let burst = if algorithm == "sw" { 0.0 } else { RATE };
        let (rate, burst) = match (divided, split) {
            (false, _) => (RATE, burst),
            (true, "even") => (RATE, 3.0 * burst),
            (true, _) => (RATE / 3.0, burst),
        };
        let args: Vec<String> = [
            "--rate".to_string(),
            rate.to_string(),
            "--burst".to_string(),
            burst.to_string(),
            "--offered".to_string(),
            (3.0 * RATE / rate).to_string(),
            "--duration".to_string(),
            "5s".to_string(),
        ]
        .into();
        let targets = fleet.targets();
        runs.spawn(async move {
            let report = bench(targets, "rate", &key, weights, &args).await;
            assert_eq!(report["errors"], 0, "{report}");
            (key, report["admitted_over_allowance"].as_f64().unwrap())
        });
    }
    runs.join_all().await
}

async fn concurrency(fleet: &Fleet) -> Value {
    let args: Vec<String> = [
        "--clients",
        "120",
        "--limit",
        "30",
        "--hold-min",
        "20ms",
        "--hold-max",
        "100ms",
        "--duration",
        "5s",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    let report = bench(fleet.targets(), "concurrency", "slots", "1,1,1", &args).await;
    assert_eq!(report["errors"], 0, "{report}");
    report
}

fn assert_within(results: &[(String, f64)], low: f64, high: f64, which: &str) {
    for (key, ratio) in results.iter().filter(|(key, _)| key.ends_with(which)) {
        assert!(
            (low..=high).contains(ratio),
            "{key}: admitted ÷ allowance {ratio:.3} outside [{low}, {high}]; all: {results:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_holds_each_algorithm_and_the_in_flight_cap_fleet_wide() {
    let fleet = fleet(150, "weighted", &[]).await;
    let results = accuracy(&fleet, false).await;
    eprintln!("weighted: {results:?}");
    // However the calls are spread, the fleet admits the configured limit.
    assert_within(&results, 0.9, 1.1, "even");
    assert_within(&results, 0.9, 1.1, "one");
    let report = concurrency(&fleet).await;
    eprintln!("weighted: {report}");
    // Each replica holds a fixed share of the cap by its rank in the ring: never over.
    let max = report["max_in_flight"].as_u64().unwrap();
    assert!(max <= MAX_CONCURRENT, "{report}");
    assert!(
        report["mean_in_flight"].as_f64().unwrap() > MAX_CONCURRENT as f64 * IN_USE_FLOOR,
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn divided_holds_its_share_on_each_replica() {
    let fleet = fleet(160, "divided", &[]).await;
    let results = accuracy(&fleet, true).await;
    assert_within(&results, 0.9, 1.1, "even");
    // All on one replica, divided admits that replica's share only (a third of the rate):
    // its documented weakness. The allowance here is that share.
    assert_within(&results, 0.9, 1.1, "one");
    let report = concurrency(&fleet).await;
    // 30 ÷ 3 per replica: never more than 30 at once, fleet-wide.
    assert!(
        report["max_in_flight"].as_u64().unwrap() <= MAX_CONCURRENT,
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_holds_each_algorithm_and_the_cap_exactly_in_redis() {
    let redis = redis_server::RedisServer::start();
    let url = redis.url();
    // A debug build on a loaded CI machine: a generous store timeout, so the test measures
    // the limits rather than the scheduler.
    let fleet = fleet(
        170,
        "shared",
        &["--store-url", &url, "--store-timeout", "1s"],
    )
    .await;
    let results = accuracy(&fleet, false).await;
    assert_within(&results, 0.9, 1.05, "even");
    assert_within(&results, 0.9, 1.05, "one");
    let report = concurrency(&fleet).await;
    // One sorted set in Redis, changed only by atomic scripts: never over.
    assert!(
        report["max_in_flight"].as_u64().unwrap() <= MAX_CONCURRENT,
        "{report}"
    );
    // And used, as under `weighted`; here a slot is also held in Redis until its release's
    // round trip ends.
    assert!(
        report["mean_in_flight"].as_f64().unwrap() > MAX_CONCURRENT as f64 * IN_USE_FLOOR,
        "{report}"
    );
}

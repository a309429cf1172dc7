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
    gossip: Vec<std::net::SocketAddr>,
    cluster: String,
    args: Vec<String>,
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
        args: args.iter().map(ToString::to_string).collect(),
        gossip,
        cluster,
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

/// `POST /api/v1/{call}` on `replica` with `body`: the JSON answer.
async fn call(replica: &Replica, call: &str, body: Value) -> Value {
    let url = format!("http://{}/api/v1/{call}", replica.http);
    let response = reqwest::Client::new()
        .post(url)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let answer: Value = response.json().await.unwrap_or_default();
    assert!(status.is_success(), "{call}: {status} {answer}");
    answer
}

/// One slot of key `slots` on `replica` for `ttl` seconds: its lease id, if granted.
async fn acquire(replica: &Replica, ttl: f64) -> Option<String> {
    let answer = call(
        replica,
        "acquire",
        serde_json::json!({"tenant": "t", "key": "slots", "ttl": ttl}),
    )
    .await;
    answer["granted"]
        .as_bool()
        .unwrap()
        .then(|| answer["lease_id"].as_str().unwrap().to_string())
}

/// A lease is held by its client, not by the replica that granted it: when that replica is
/// `kill -9`ed, its holders are still at work until their deadlines. The survivors' shares of
/// the cap grow only after the dead replica's leases may have ended (it published how long
/// that is), and a replica that joins grants nothing while its peers hold more than their new
/// shares. Before this, the survivors granted the dead replica's share again at once: 13
/// holders for a cap of 10 in a probe (2026-12-06).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replicas_share_is_not_granted_again_while_its_leases_may_be_held() {
    let mut fleet = fleet(180, "weighted", &[]).await;
    // 30 over 3: 10 each. The survivors' leases last the whole test; the doomed replica's 5 s.
    let mut held: Vec<Vec<String>> = vec![Vec::new(), Vec::new()];
    for (replica, leases) in fleet.replicas[..2].iter().zip(&mut held) {
        for _ in 0..10 {
            leases.push(acquire(replica, 60.0).await.expect("within the share"));
        }
        assert_eq!(acquire(replica, 60.0).await, None, "past the share");
    }
    for _ in 0..10 {
        acquire(&fleet.replicas[2], 5.0)
            .await
            .expect("within the share");
    }
    let doomed_granted = std::time::Instant::now();
    // The survivors have heard how long the doomed replica's leases may run.
    let doomed_id = format!("{}-{}", fleet.cluster, fleet.gossip[2]);
    common::wait_until(
        "the survivors hear the lease horizon",
        Duration::from_secs(10),
        || async {
            let ring = fleet.replicas[0].ring().await.unwrap_or_default();
            ring["members"].as_array().is_some_and(|members| {
                members.iter().any(|member| {
                    member["node_id"] == doomed_id.as_str()
                        && member["lease_horizon"].as_f64().unwrap_or(0.0) > 0.0
                })
            })
        },
    )
    .await;
    let doomed = fleet.replicas.pop().unwrap();
    doomed.signal("-KILL");
    drop(doomed);
    let survivors: Vec<&Replica> = fleet.replicas.iter().collect();
    until_healthy(&survivors, 2, Duration::from_secs(20)).await;
    // The survivors say why their shares are held back: the dead replica's 5 s leases, as
    // it last published them (whole seconds, rounded up from what was left).
    let ring = fleet.replicas[0].ring().await.unwrap();
    let horizon = ring["departed_lease_horizon"].as_f64().unwrap();
    assert!((4.0..=5.0).contains(&horizon), "{horizon}");

    // Each survivor may grow to 15, but not before the dead replica's leases have ended.
    let mut first_grown = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while held.iter().any(|leases| leases.len() < 15) && std::time::Instant::now() < deadline {
        for (replica, leases) in fleet.replicas.iter().zip(&mut held) {
            if leases.len() < 15 {
                if let Some(lease) = acquire(replica, 60.0).await {
                    first_grown.get_or_insert_with(std::time::Instant::now);
                    leases.push(lease);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let grown_after = first_grown
        .expect("the survivors' shares never grew")
        .duration_since(doomed_granted);
    assert!(
        grown_after > Duration::from_secs(5),
        "a survivor granted the dead replica's share {grown_after:?} after its leases of 5 s"
    );
    assert!(
        held.iter().all(|leases| leases.len() == 15),
        "the shares did not grow to 15 each: {:?}",
        held.iter().map(Vec::len).collect::<Vec<_>>()
    );

    // It comes back (a new incarnation under its id): its share is 10, but the survivors
    // hold 15 each, so it grants nothing while they do.
    let args: Vec<&str> = fleet.args.iter().map(String::as_str).collect();
    let back = spawn(fleet.gossip[2], &fleet.gossip, &fleet.cluster, &args);
    fleet.replicas.push(back);
    let all: Vec<&Replica> = fleet.replicas.iter().collect();
    until_healthy(&all, 3, Duration::from_secs(20)).await;
    for _ in 0..10 {
        assert_eq!(
            acquire(&fleet.replicas[2], 60.0).await,
            None,
            "a joining replica granted a slot while its peers held the whole cap"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The survivors' holders finish: the fleet's horizon drops to 0, and it grants its 10.
    for (replica, leases) in fleet.replicas.iter().zip(&held) {
        for lease in leases {
            call(replica, "release", serde_json::json!({"lease_id": lease})).await;
        }
    }
    let mut granted = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while granted < 10 && std::time::Instant::now() < deadline {
        while acquire(&fleet.replicas[2], 60.0).await.is_some() {
            granted += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        granted, 10,
        "the joined replica's share, once its peers released theirs"
    );
    assert_eq!(
        acquire(&fleet.replicas[2], 60.0).await,
        None,
        "past its share"
    );
}

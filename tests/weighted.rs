//! `weighted` with real processes: 3 replicas gossiping on 127.0.0.x, driven by the load
//! generator. Tolerances are generous (CI machines are slow and shared); the exact figures are
//! in the README, measured by `scripts/accuracy.py`, not here.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::fleet::{free_gossip_addr, spawn, until_healthy, Replica};

const LIMIT: f64 = 10_000.0;

async fn fleet(first_ip: u8, cluster: &str, dir: &std::path::Path) -> Vec<Replica> {
    let overrides = dir.join("overrides.yaml");
    std::fs::write(
        &overrides,
        "overrides:\n  t:\n    ingestion_rate: 10000\n    ingestion_burst_size: 10000\n    \
         rate_limit_strategy: weighted\n",
    )
    .unwrap();
    let addrs: Vec<SocketAddr> = (first_ip..first_ip + 3)
        .map(|i| free_gossip_addr([127, 0, 0, i]))
        .collect();
    // Refusals at once: the load generator counts an admission in the second its request
    // was sent, and a held push is admitted up to --max-admission-delay later, which that
    // measure would put in the wrong second (the first 3 s read 6.8 L with holds).
    let runtime_config = [
        "--runtime-config",
        overrides.to_str().unwrap(),
        "--max-admission-delay",
        "0s",
    ];
    let replicas: Vec<_> = addrs
        .iter()
        .map(|addr| spawn(*addr, &addrs, cluster, &runtime_config))
        .collect();
    until_healthy(
        &replicas.iter().collect::<Vec<_>>(),
        3,
        Duration::from_secs(10),
    )
    .await;
    replicas
}

/// Runs the load generator against the fleet; returns its JSON report.
fn load(replicas: &[Replica], dir: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let report = dir.join("report.json");
    let mut loadgen = Command::new(env!("CARGO_BIN_EXE_weir-loadgen"));
    for replica in replicas {
        loadgen.args(["--target", &format!("http://{}", replica.http)]);
    }
    let status = loadgen
        .args([
            "--tenants",
            "t",
            "--quiet",
            "--output",
            report.to_str().unwrap(),
        ])
        .args(["--ideal-rate", "10000"])
        .args(args)
        .status()
        .unwrap();
    assert!(status.success());
    serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap()
}

fn per_second(report: &serde_json::Value, field: &str) -> Vec<f64> {
    report["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|second| second[field].as_f64().unwrap())
        .collect()
}

/// The traffic that broke the demand-share design: a tenant at 0.9 L sending Prometheus'
/// 2 000-sample batches from ten senders, spread evenly. A replica sees it about 1.5 times a
/// second; nothing should be refused that one ideal bucket would admit.
#[tokio::test]
async fn sparse_batches_under_the_limit_are_not_refused() {
    let dir = tempfile::tempdir().unwrap();
    let replicas = fleet(11, "weighted-sparse", dir.path()).await;
    let report = load(
        &replicas,
        dir.path(),
        &[
            "--samples-per-second",
            "9000",
            "--series-per-request",
            "2000",
            "--senders",
            "10",
            "--route",
            "random",
            "--duration",
            "12s",
        ],
    );
    let offered: f64 = per_second(&report, "offered_samples")[3..].iter().sum();
    let admitted: f64 = per_second(&report, "admitted_samples")[3..].iter().sum();
    let ideal: f64 = per_second(&report, "ideal_admitted_samples")[3..]
        .iter()
        .sum();
    let refused = 1.0 - admitted / offered;
    let ideal_refused = 1.0 - ideal / offered;
    eprintln!("refused {refused:.4}, an ideal bucket {ideal_refused:.4}");
    assert!(
        refused <= ideal_refused + 0.03,
        "refused {:.1} % of a tenant under its limit (an ideal bucket: {:.1} %)",
        refused * 100.0,
        ideal_refused * 100.0
    );
}

/// All of a tenant's traffic on one replica: under `divided` it would admit a third of the
/// limit; `weighted` admits about the whole limit, and its first seconds stay near one burst
/// plus the rate, not N bursts.
#[tokio::test]
async fn skewed_traffic_gets_the_whole_fleet_limit() {
    let report = three_times_the_limit(14, "weighted-skewed", &["--split", "100,0,0"]).await;
    assert_held_to_the_limit(&report, "divided would give ~0.33");
}

/// A tenant at 3 L spread evenly over the fleet: each replica sees a third of it, under what
/// one replica may admit alone, so only what the others published keeps the fleet at L. A
/// fleet whose replicas never heard of each other's admissions would admit about 3 L here.
#[tokio::test]
async fn even_traffic_over_the_limit_is_held_to_the_limit() {
    let report = three_times_the_limit(17, "weighted-even", &[]).await;
    assert_held_to_the_limit(&report, "the load spread over three replicas");
    // And each replica admits about its third: none takes the refill from the others. When
    // each held back what its peers were measured to admit, the replica admitting most held
    // back least and took more, and a replica's senders could get under a tenth of the limit.
    let timeline = report["timeline"].as_array().unwrap();
    let steady = &timeline[3..];
    for replica in 0..3 {
        let admitted: f64 = steady
            .iter()
            .map(|second| second["admitted_per_target"][replica].as_f64().unwrap())
            .sum();
        let share = admitted / steady.len() as f64 / LIMIT;
        assert!(
            share >= 0.15,
            "replica {replica} admitted {share:.3} L a second of the even load"
        );
    }
}

/// 3 L of 100-series requests for 8 s on a fresh fleet, split as `split` says (evenly when
/// empty): the load generator's report.
async fn three_times_the_limit(first_ip: u8, cluster: &str, split: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let replicas = fleet(first_ip, cluster, dir.path()).await;
    let mut args = split.to_vec();
    args.extend([
        "--samples-per-second",
        "30000",
        "--series-per-request",
        "100",
        "--duration",
        "8s",
    ]);
    load(&replicas, dir.path(), &args)
}

/// After the first 3 s the fleet admits about L a second; in those 3 s, no more than one
/// burst (B = L) and the rate.
fn assert_held_to_the_limit(report: &serde_json::Value, case: &str) {
    let per_second: Vec<f64> = per_second(report, "admitted_samples")
        .into_iter()
        .map(|admitted| admitted / LIMIT)
        .collect();
    eprintln!("admitted ÷ L per second: {per_second:?}");
    let steady = &per_second[3..];
    let mean = steady.iter().sum::<f64>() / steady.len() as f64;
    assert!(
        (0.85..=1.15).contains(&mean),
        "steady admitted ÷ L = {mean:.3} ({case})"
    );
    let first: f64 = per_second[..3].iter().sum();
    assert!(
        first <= 1.0 + 3.0 * 1.15,
        "first 3 s admitted {first:.2} L ({case})"
    );
}

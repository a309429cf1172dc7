//! `weighted` with real processes: 3 replicas, all of a tenant's traffic sent to one of them.
//! Under `divided` that replica would admit a third of the limit; `weighted` must admit about
//! the whole limit. Tolerances are generous: the exact figures are in the README, measured by
//! `scripts/accuracy.py`, not here.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::fleet::{free_gossip_addr, spawn, until_healthy};

const LIMIT: f64 = 10_000.0;

#[tokio::test]
async fn skewed_traffic_gets_the_whole_fleet_limit() {
    let dir = tempfile::tempdir().unwrap();
    let overrides = dir.path().join("overrides.yaml");
    std::fs::write(
        &overrides,
        "overrides:\n  skewed:\n    ingestion_rate: 10000\n    ingestion_burst_size: 10000\n    \
         rate_limit_strategy: weighted\n",
    )
    .unwrap();
    let addrs: Vec<SocketAddr> = (11..=13)
        .map(|i| free_gossip_addr([127, 0, 0, i]))
        .collect();
    let runtime_config = ["--runtime-config", overrides.to_str().unwrap()];
    let replicas: Vec<_> = addrs
        .iter()
        .map(|addr| spawn(*addr, &addrs, "weighted", &runtime_config))
        .collect();
    until_healthy(
        &replicas.iter().collect::<Vec<_>>(),
        3,
        Duration::from_secs(10),
    )
    .await;

    let report = dir.path().join("report.json");
    let targets: Vec<String> = replicas
        .iter()
        .map(|r| format!("http://{}", r.http))
        .collect();
    let mut loadgen = Command::new(env!("CARGO_BIN_EXE_weir-loadgen"));
    for target in &targets {
        loadgen.args(["--target", target]);
    }
    let status = loadgen
        .args(["--split", "100,0,0", "--samples-per-second", "30000"])
        .args([
            "--series-per-request",
            "100",
            "--tenants",
            "skewed",
            "--duration",
            "8s",
        ])
        .args(["--quiet", "--output", report.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let per_second: Vec<f64> = report["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|second| second["admitted_samples"].as_f64().unwrap() / LIMIT)
        .collect();
    let steady = &per_second[3..];
    let mean = steady.iter().sum::<f64>() / steady.len() as f64;
    eprintln!("admitted ÷ L per second: {per_second:?}");
    assert!(
        (0.85..=1.15).contains(&mean),
        "steady admitted ÷ L = {mean:.3} (divided would give ~0.33)"
    );
    // The whole fleet's first seconds stay near one burst plus the rate, not N bursts.
    let first: f64 = per_second[..3].iter().sum();
    assert!(first <= 1.0 + 3.0 * 1.15, "first 3 s admitted {first:.2} L");
}

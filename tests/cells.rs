//! Cells on real processes: one real `redis-server` started here on a free port, 3 cells × 2
//! weir replicas on 127.0.0.90–95 (each cell its own ring), and a tenant with a global limit
//! L = 10 000 items/s offered 1.5 L from this test (open loop, pushes of 100 items sent
//! straight to each cell's replicas in turn). One scenario, in order:
//!
//! 1. demand 80/20/0 across cells a, b, c: global admitted ÷ L within [0.95, 1.05] once 3
//!    sync intervals have passed;
//! 2. the demand moves from a to c: c admits ≥ 0.9 of its new share within 3 intervals;
//! 3. one of c's replicas SIGKILLed: the survivor and the other cells keep receiving slices
//!    within 2 intervals, and c keeps its share;
//! 4. the store killed for 20 s, then started again on the same port: every cell keeps
//!    admitting (its last slice for the slice TTL, then L ÷ 3), no push waits on the store,
//!    and the cells converge again within a few intervals.
//!
//! A second test slices an admission key's rate and in-flight cap (the path a tenant's
//! `max_inflight_push_requests` takes too) across 3 cells of one replica each, driven by
//! `weir-admission-bench` over gRPC.
//!
//! One cell cut from the store while the others reach it is `tests/cells_cut.rs` (network
//! namespaces).
//!
//! Every figure is measured by this test from the answers it got (2xx admitted, 429
//! refused), never read from weir.

mod common;

#[path = "common/cells_load.rs"]
mod cells_load;

#[path = "../redis-store/tests/redis_server.rs"]
mod redis_server;

use std::time::Duration;

use serde_json::Value;

use cells_load::{metric, until, until_synced, Load, SYNCED};
use common::fleet::{self, Replica};
use common::wait_until;
use redis_server::RedisServer;

const L: f64 = 10_000.0;
/// `--cell-sync-interval`.
const INTERVAL: Duration = Duration::from_millis(500);
/// `--cell-slice-ttl`.
const TTL: Duration = Duration::from_secs(5);
/// `--cell-floor`: a fraction of the even share L ÷ 3.
const FLOOR: f64 = 0.05;

const OVERRIDES: &str =
    "overrides:\n  t:\n    ingestion_rate: 10000\n    ingestion_burst_size: 5000\n";

const SLICES: &str = "weir_cell_slices_received_total";

fn spawn_cell(cell: &str, ips: [u8; 2], store: &str, overrides: &str) -> [Replica; 2] {
    let extra = cell_args(cell, store, overrides);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let first_gossip = fleet::free_gossip_addr([127, 0, 0, ips[0]]);
    let first = fleet::spawn(first_gossip, &[], "cells", &extra);
    let second = fleet::spawn(
        fleet::free_gossip_addr([127, 0, 0, ips[1]]),
        &[first_gossip],
        "cells",
        &extra,
    );
    [first, second]
}

fn cell_args(cell: &str, store: &str, overrides: &str) -> Vec<String> {
    [
        "--runtime-config",
        overrides,
        "--store-url",
        store,
        "--cell",
        cell,
        "--cell-sync-interval",
        "500ms",
        "--cell-slice-ttl",
        "5s",
        "--cell-floor",
        "0.05",
        "--max-admission-delay",
        "0s",
        "--http-workers",
        "1",
    ]
    .map(String::from)
    .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cells_share_a_global_limit_through_the_store_and_survive_its_loss() {
    let port = redis_server::free_port();
    let mut redis = RedisServer::start_with(port, &[]);
    let dir = tempfile::tempdir().unwrap();
    let overrides = dir.path().join("overrides.yaml");
    std::fs::write(&overrides, OVERRIDES).unwrap();
    let overrides = overrides.to_str().unwrap();
    let url = redis.url();
    let [a1, a2] = spawn_cell("a", [90, 91], &url, overrides);
    let [b1, b2] = spawn_cell("b", [92, 93], &url, overrides);
    let [c1, c2] = spawn_cell("c", [94, 95], &url, overrides);
    let all = [&a1, &a2, &b1, &b2, &c1, &c2];

    // Each cell is a ring of its own: two members, its own cluster id.
    fleet::until_healthy(&all, 2, Duration::from_secs(20)).await;
    for (replica, cell) in all.iter().zip(["a", "a", "b", "b", "c", "c"]) {
        let ring = replica.ring().await.unwrap();
        assert_eq!(ring["cluster_id"], format!("cells/{cell}"), "{ring}");
    }
    until_synced(&all).await;

    let load = Load::start([
        vec![a1.http, a2.http],
        vec![b1.http, b2.http],
        vec![c1.http, c2.http],
    ]);
    let interval = INTERVAL.as_secs_f64();
    let floor = FLOOR * L / 3.0;

    // 1. 80/20/0 of 1.5 L.
    let start = load.set([0.8 * 1.5 * L, 0.2 * 1.5 * L, 0.0]);
    until(&load, start + 3.0 * interval + 4.0).await;
    let global = load.admitted(&[0, 1, 2], start + 3.0 * interval, load.now()) / L;
    let by_cell: Vec<f64> = (0..3)
        .map(|cell| load.admitted(&[cell], start + 3.0 * interval, load.now()) / L)
        .collect();
    eprintln!("80/20/0: global admitted ÷ L = {global:.3}, by cell {by_cell:.3?}");
    assert!((0.95..=1.05).contains(&global), "global {global:.3}");
    // b offers 0.3 L, under its fair half: it gets nearly all of it.
    assert!(
        by_cell[1] >= 0.27,
        "b admitted {:.3} L of 0.3 L",
        by_cell[1]
    );

    // 2. The demand moves from a to c. c's new share: L less b's 0.3 L and a's floor.
    let shift = load.set([0.0, 0.2 * 1.5 * L, 0.8 * 1.5 * L]);
    let share_c = L - 0.3 * L - floor;
    until(&load, shift + 3.0 * interval + 3.0).await;
    let seconds: Vec<f64> = (0..6)
        .map(|i| {
            let from = shift + i as f64 * interval;
            load.admitted(&[2], from, from + interval) / share_c
        })
        .collect();
    let c = load.admitted(&[2], shift + 3.0 * interval, load.now()) / share_c;
    let global = load.admitted(&[0, 1, 2], shift + 3.0 * interval, load.now()) / L;
    eprintln!(
        "a → c: c admitted {c:.3} of its new share ({share_c:.0}/s) from 3 intervals on; per \
         interval from the shift {seconds:.2?}; global {global:.3}"
    );
    assert!(c >= 0.9, "c admitted {c:.3} of its share");
    assert!(global <= 1.05, "global {global:.3}");

    // 3. c1 SIGKILLed; its pushes go to c2.
    let c1_pid = c1.child.id();
    let slices_before = [
        metric(&c2, SLICES).await,
        metric(&a1, SLICES).await,
        metric(&b1, SLICES).await,
    ];
    c1.signal("-KILL");
    let killed = load.now();
    load.targets.lock().unwrap()[2] = vec![c2.http];
    until(&load, killed + 2.0 * interval).await;
    let slices_after = [
        metric(&c2, SLICES).await,
        metric(&a1, SLICES).await,
        metric(&b1, SLICES).await,
    ];
    eprintln!(
        "c1 (pid {c1_pid}) killed: slices received within 2 intervals by c2, a1, b1: \
         {:?} → {:?}",
        slices_before, slices_after
    );
    // a1 has no demand left to report (a tenant it does not report keeps no slice), so
    // its syncs show that the store still answers it.
    assert!(slices_after[0] > slices_before[0], "c2 got no slice");
    assert!(slices_after[2] > slices_before[2], "b1 got no slice");
    until(&load, killed + 3.0 * interval + 3.0).await;
    let c = load.admitted(&[2], killed + 3.0 * interval, load.now()) / share_c;
    eprintln!("after the kill, c (c2 alone) admitted {c:.3} of its share");
    assert!(c >= 0.9, "c admitted {c:.3} of its share after the kill");

    // 4. The store down for 20 s, with demand in every cell: 0.1 L, 0.3 L, 1.2 L.
    load.set([0.1 * L, 0.3 * L, 1.2 * L]);
    until(&load, load.now() + 4.0 * interval).await;
    let synced_before = metric(&a1, SYNCED).await;
    redis.kill();
    let down = load.now();
    until(&load, down + 20.0).await;
    let answers = load.answers(down, load.now());
    let failed_syncs = metric(&a1, "weir_cell_syncs_total{outcome=\"failed\"}").await;
    // The last slices (a 0.1, b 0.3, c 0.6 - floor) for the TTL, then L ÷ 3 each.
    let held: Vec<f64> = (0..3)
        .map(|cell| load.admitted(&[cell], down + interval, down + TTL.as_secs_f64()) / L)
        .collect();
    let fallback: Vec<f64> = (0..3)
        .map(|cell| {
            load.admitted(
                &[cell],
                down + TTL.as_secs_f64() + 2.0 * interval,
                down + 20.0,
            ) / L
        })
        .collect();
    let global_down = load.admitted(&[0, 1, 2], down, down + 20.0) / L;
    eprintln!(
        "store down 20 s: {} pushes, {} unanswered or failed, slowest answer {:?}; admitted ÷ L \
         while the slices held {held:.3?}, on the fallback {fallback:.3?}, all 20 s {global_down:.3}; \
         a1's failed syncs {failed_syncs}",
        answers.0, answers.1, answers.2
    );
    assert!(failed_syncs >= 10.0, "the sync noticed: {failed_syncs}");
    assert_eq!(answers.1, 0, "every push was answered 2xx or 429");
    assert!(
        answers.2 < Duration::from_millis(500),
        "slowest {:?}",
        answers.2
    );
    // Held: a and b about their demand, c the rest (0.6 L). A held slice is the last
    // estimate of a lumpy demand (a: 10 pushes/s over two replicas), frozen: within 20 %.
    assert!(held[0] >= 0.08 && held[1] >= 0.27, "{held:?}");
    assert!((0.5..=0.7).contains(&held[2]), "{held:?}");
    // Fallback: a and b under L ÷ 3 keep their demand; c is held to L ÷ 3.
    assert!(fallback[0] >= 0.09 && fallback[1] >= 0.27, "{fallback:?}");
    assert!((0.3..=0.37).contains(&fallback[2]), "{fallback:?}");
    assert!(
        global_down <= 1.05,
        "over-admission while the store was down: {global_down:.3}"
    );

    let _redis = RedisServer::start_with(port, &[]);
    let back = load.now();
    wait_until("a1 synced again", Duration::from_secs(10), || async {
        metric(&a1, SYNCED).await > synced_before
    })
    .await;
    let resynced = load.now() - back;
    until(&load, load.now() + 3.0 * interval + 3.0).await;
    let converged_from = back + resynced + 3.0 * interval;
    let c = load.admitted(&[2], converged_from, load.now()) / L;
    let global = load.admitted(&[0, 1, 2], converged_from, load.now()) / L;
    eprintln!(
        "store back: a1 synced again after {resynced:.2} s; from 3 intervals later c admitted \
         {c:.3} L (its share: 0.6 L), global {global:.3}"
    );
    assert!(c >= 0.9 * 0.6 - 0.01, "c {c:.3}");
    assert!((0.95..=1.05).contains(&global), "global {global:.3}");
}

/// Runs `weir-admission-bench` against one replica per cell, `split` across them.
async fn bench(targets: &[&Replica], mode: &str, key: &str, split: &str, args: &[&str]) -> Value {
    let targets: Vec<String> = targets.iter().map(|r| r.grpc.to_string()).collect();
    let args: Vec<String> = args.iter().map(ToString::to_string).collect();
    let report = common::processes::admission_bench(&targets, mode, key, split, &args).await;
    assert_eq!(report["errors"], 0, "{report}");
    report
}

const KEY_RATE: f64 = 300.0;
const KEY_SLOTS: u64 = 30;

/// An admission key's limits are one global limit across cells: its rate (80/20/0 across
/// the cells, 1.5× offered) and its in-flight cap (short holds from every cell at once, the
/// case gossip could not bound). Without slices each cell would enforce the whole limit:
/// 1.3× the rate, and up to 3× the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_key_rate_and_in_flight_cap_are_global_across_cells() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let overrides = dir.path().join("overrides.yaml");
    std::fs::write(
        &overrides,
        format!(
            "overrides:\n  t:\n    limits:\n      k: {{rate: {KEY_RATE}, burst: {KEY_RATE}}}\n      \
             slots: {{max_concurrent: {KEY_SLOTS}}}\n"
        ),
    )
    .unwrap();
    let url = redis.url();
    let replicas: Vec<Replica> = [("a", 96), ("b", 97), ("c", 98)]
        .into_iter()
        .map(|(cell, ip)| {
            let extra = cell_args(cell, &url, overrides.to_str().unwrap());
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            fleet::spawn(
                fleet::free_gossip_addr([127, 0, 0, ip]),
                &[],
                "keys",
                &extra,
            )
        })
        .collect();
    let all: Vec<&Replica> = replicas.iter().collect();
    fleet::until_healthy(&all, 1, Duration::from_secs(20)).await;
    until_synced(&all).await;

    // The in-flight cap: 90 clients holding 20–100 ms, evenly over the cells.
    let report = bench(
        &all,
        "concurrency",
        "slots",
        "1,1,1",
        &[
            "--clients",
            "90",
            "--limit",
            "30",
            "--hold-min",
            "20ms",
            "--hold-max",
            "100ms",
            "--duration",
            "6s",
        ],
    )
    .await;
    let (max, mean) = (
        report["max_in_flight"].as_u64().unwrap(),
        report["mean_in_flight"].as_f64().unwrap(),
    );
    eprintln!("in flight across 3 cells, cap {KEY_SLOTS}: max {max}, mean {mean:.1}");
    assert!(max <= KEY_SLOTS, "{report}");
    assert!(mean >= 0.6 * KEY_SLOTS as f64, "the slices flow: {report}");

    // The rate: 80/20/0 at 1.5×, 2 s to settle (the buckets drain their bursts), then 6 s
    // measured against the rate alone.
    let rate_args = |seconds: &'static str| {
        [
            "--rate",
            "300",
            "--burst",
            "300",
            "--offered",
            "1.5",
            "--duration",
            seconds,
        ]
    };
    bench(&all, "rate", "k", "80,20,0", &rate_args("2s")).await;
    let report = bench(&all, "rate", "k", "80,20,0", &rate_args("6s")).await;
    let admitted = report["admitted"].as_f64().unwrap();
    let seconds = report["seconds"].as_f64().unwrap();
    let global = admitted / (KEY_RATE * seconds);
    eprintln!("key rate across 3 cells, 80/20/0 at 1.5×: admitted ÷ (rate × t) = {global:.3}");
    assert!((0.9..=1.05).contains(&global), "{report}");
}

//! The cells' scripts against a real `redis-server`: `cell_slice.lua` gives the same shares
//! as its pure twin (`engine::cells::reconcile`) for any sequence of reports, forgets a
//! replica and then a cell on the store's clock, and `cell_heartbeat.lua` counts live cells.

mod redis_server;

use std::time::Duration;

use engine::cells::{self, CellReport, CellSubject, ReconcileParams, SubjectLimits};
use engine::KeyName;
use proptest::prelude::*;
use redis_server::RedisServer;
use redis_store::{RedisConfig, RedisStore};

fn config(url: String) -> RedisConfig {
    RedisConfig {
        urls: vec![url],
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(2),
    }
}

fn report(cell: &str, replica: &str, requests: f64, items: f64) -> CellReport {
    CellReport {
        cell: cell.into(),
        replica: replica.into(),
        at_micros: 0,
        demand: [requests, items],
        spent: [7, 700],
        answered: [0.0; 2],
    }
}

/// Windows far longer than a test: every report stays current.
const STILL: ReconcileParams = ReconcileParams {
    fresh_micros: 3_600_000_000,
    hold_micros: 7_200_000_000,
    live_cells: 3,
    floor_fraction: 0.05,
};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Any sequence of reports from up to 4 cells × 2 replicas, of a tenant's two rates or of
    /// an admission key's rate and in-flight cap (whole slots): the script's share for the
    /// reporting cell is the twin's, to float rounding (the sums run in another order).
    #[test]
    fn the_slice_script_matches_its_pure_twin(
        steps in prop::collection::vec((0usize..4, 0usize..2, 0.0f64..40.0, 0.0f64..30_000.0), 1..14),
        live in 0u32..6,
        floor_fraction in 0.0f64..0.3,
        request_limit in prop_oneof![Just(0.0), 1.0f64..100.0],
        cap in prop_oneof![Just(None), (1u64..40).prop_map(Some)],
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let url = SERVER.with(|server| server.url());
        runtime.block_on(async {
            let store = RedisStore::connect(&config(url)).await.unwrap();
            let tenant = format!("twin-{}", next());
            let params = ReconcileParams { live_cells: live, floor_fraction, ..STILL };
            // A tenant's two rates, or a key's rate and in-flight cap (its demand in slots).
            let (subject, limits, slots) = match cap {
                None => (CellSubject::Tenant(&tenant), [request_limit, 10_000.0].into(), 1.0),
                Some(cap) => (
                    CellSubject::Key(KeyName { tenant: &tenant, key: "k" }),
                    SubjectLimits::key(request_limit, cap),
                    1.0 / 1_000.0,
                ),
            };
            let mut stored = Vec::new();
            for (cell, replica, requests, items) in steps {
                let items = (items * slots).round();
                let entry = report(&format!("c{cell}"), &format!("r{replica}"), requests, items);
                let script = store.cell_slice(subject, &entry, limits, params).await.unwrap();
                let (kept, twin) = cells::reconcile(stored, entry, 0, limits, params);
                stored = kept;
                prop_assert_eq!(script.cells, twin.cells);
                for (a, b) in [
                    (script.share.request, twin.share.request),
                    (script.share.ingestion, twin.share.ingestion),
                ] {
                    prop_assert!((a.rate - b.rate).abs() < 1e-9, "{:?} vs {:?}", script, twin);
                    prop_assert!((a.burst - b.burst).abs() < 1e-9, "{:?} vs {:?}", script, twin);
                }
            }
            Ok(())
        })?;
    }
}

/// On the store's clock: a replica that stops reporting stops counting once it is no longer
/// current, a cell none of whose replicas reports is held at its last demand, and after the
/// hold both are deleted.
#[tokio::test]
async fn stale_replicas_and_silent_cells_are_forgotten_on_the_store_clock() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&config(server.url())).await.unwrap();
    let params = ReconcileParams {
        fresh_micros: 300_000,
        hold_micros: 1_200_000,
        live_cells: 2,
        floor_fraction: 0.0,
    };
    let limits = [0.0, 10_000.0];
    let ask = |cell: &'static str, replica: &'static str, items: f64| {
        let store = store.clone();
        async move {
            store
                .cell_slice(
                    CellSubject::Tenant("t"),
                    &report(cell, replica, 0.0, items),
                    limits,
                    params,
                )
                .await
                .unwrap()
                .share
                .ingestion
                .rate
        }
    };
    ask("a", "a1", 6_000.0).await;
    ask("a", "a2", 6_000.0).await;
    let b = ask("b", "b1", 4_000.0).await;
    // a claims 12 000, b 4 000: b gets all of its 4 000.
    assert!((b - 0.4).abs() < 1e-9, "{b}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    // a1 and b1 are no longer current. a (a2 alone: 6 000) against b held at 4 000.
    let a = ask("a", "a2", 6_000.0).await;
    assert!((a - 0.6).abs() < 1e-9, "{a}");
    assert_eq!(server.cli(&["HLEN", "weir:{t}:cells"]), "3");
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    // Past the hold: a1 and b1 deleted; a2 reports again, the only one.
    let a = ask("a", "a2", 6_000.0).await;
    assert!((a - 1.0).abs() < 1e-9, "{a}");
    assert_eq!(server.cli(&["HLEN", "weir:{t}:cells"]), "1");
    let ttl: i64 = server.cli(&["PTTL", "weir:{t}:cells"]).parse().unwrap();
    assert!(ttl > 0 && ttl <= 2_200, "PTTL {ttl}");
}

#[tokio::test]
async fn the_heartbeat_counts_live_cells() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&config(server.url())).await.unwrap();
    let hold = Duration::from_millis(400);
    assert_eq!(store.cell_heartbeat("a", hold).await.unwrap(), 1);
    assert_eq!(store.cell_heartbeat("b", hold).await.unwrap(), 2);
    assert_eq!(
        store.cell_heartbeat("a", hold).await.unwrap(),
        2,
        "once each"
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(store.cell_heartbeat("a", hold).await.unwrap(), 2);
    tokio::time::sleep(Duration::from_millis(250)).await;
    // b last heard 500 ms ago: dropped; a 250 ms ago: kept.
    assert_eq!(store.cell_heartbeat("c", hold).await.unwrap(), 2);
    assert_eq!(server.cli(&["ZSCORE", "weir:cells", "b"]), "");
}

thread_local! {
    static SERVER: RedisServer = RedisServer::start();
}

fn next() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

//! A tenant's fleet-wide `max_inflight_push_requests`, measured where it matters: by the
//! pushes an upstream sees at once. Three real `weir` processes gossip on 127.0.0.x and
//! forward to an upstream in this test that holds each push 0.1-0.5 s (short holds, which
//! gossip cannot follow) and records the most it held at once. 60 clients push as fast as
//! they are answered, spread evenly, 70/20/10, or moving from one replica to another.
//! Under every strategy the upstream must never see more than the cap × 1.05 + 1.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use common::fleet::{free_gossip_addr, spawn, until_healthy, Replica};
use weir::remote_write::prompb::WriteRequest;

const CAP: u64 = 30;
const CLIENTS: usize = 60;

/// The upstream: holds every push for 100-500 ms, counting how many it holds at once.
#[derive(Default)]
struct Upstream {
    now: AtomicU64,
    peak: AtomicU64,
    seen: AtomicU64,
}

async fn upstream() -> (SocketAddr, Arc<Upstream>) {
    let state = Arc::new(Upstream::default());
    let held = Arc::clone(&state);
    let app = axum::Router::new().route(
        "/api/v1/push",
        post(move || {
            let held = Arc::clone(&held);
            async move {
                let now = held.now.fetch_add(1, Ordering::AcqRel) + 1;
                held.peak.fetch_max(now, Ordering::AcqRel);
                held.seen.fetch_add(1, Ordering::Relaxed);
                let millis = 100 + rand::random::<u64>() % 400;
                tokio::time::sleep(Duration::from_millis(millis)).await;
                held.now.fetch_sub(1, Ordering::AcqRel);
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, state)
}

struct Fleet {
    replicas: Vec<Replica>,
    _dir: tempfile::TempDir,
}

async fn fleet(first_ip: u8, strategy: &str, upstream: SocketAddr) -> Fleet {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("overrides.yaml");
    // Rate limits far above what the test sends: only the in-flight cap binds.
    std::fs::write(
        &path,
        format!(
            "overrides:\n  t:\n    rate_limit_strategy: {strategy}\n    \
             max_inflight_push_requests: {CAP}\n    ingestion_rate: 1000000000\n    \
             ingestion_burst_size: 1000000000\n    request_rate: 0\n"
        ),
    )
    .unwrap();
    let gossip: Vec<_> = (0..3)
        .map(|i| free_gossip_addr([127, 0, 0, first_ip + i]))
        .collect();
    let upstream = format!("http://{upstream}/api/v1/push");
    let args = [
        "--runtime-config",
        path.to_str().unwrap(),
        "--gossip-interval",
        "100ms",
        "--upstream",
        &upstream,
    ];
    let cluster = format!("push-inflight-{strategy}-{}", std::process::id());
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
    }
}

/// Which replica client `i` pushes to, `elapsed` into the run.
type Spread = fn(usize, Duration) -> usize;

fn even(client: usize, _: Duration) -> usize {
    client % 3
}

fn skewed(client: usize, _: Duration) -> usize {
    match client % 10 {
        0..=6 => 0,
        7 | 8 => 1,
        _ => 2,
    }
}

/// All on the first replica, then all on the third.
fn switching(_: usize, elapsed: Duration) -> usize {
    if elapsed < Duration::from_secs(2) {
        0
    } else {
        2
    }
}

/// 60 clients for `run`; returns (admitted, refused).
async fn drive(fleet: &Fleet, spread: Spread, run: Duration) -> (u64, u64) {
    let body = WriteRequest::synthetic(10, 1, 1).encode_snappy();
    let urls: Vec<String> = fleet
        .replicas
        .iter()
        .map(|replica| format!("http://{}/api/v1/push", replica.http))
        .collect();
    let started = tokio::time::Instant::now();
    let admitted = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let mut clients = tokio::task::JoinSet::new();
    for client in 0..CLIENTS {
        let (urls, body) = (urls.clone(), body.clone());
        let (admitted, refused) = (Arc::clone(&admitted), Arc::clone(&refused));
        clients.spawn(async move {
            let http = reqwest::Client::new();
            while started.elapsed() < run {
                let url = &urls[spread(client, started.elapsed())];
                let status = http
                    .post(url)
                    .header("X-Scope-OrgID", "t")
                    .header("Content-Encoding", "snappy")
                    .header("Content-Type", "application/x-protobuf")
                    .body(body.clone())
                    .send()
                    .await
                    .map(|response| response.status().as_u16());
                match status {
                    Ok(200) => admitted.fetch_add(1, Ordering::Relaxed),
                    Ok(429) => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        refused.fetch_add(1, Ordering::Relaxed)
                    }
                    other => panic!("client {client}: {other:?}"),
                };
            }
        });
    }
    clients.join_all().await;
    (
        admitted.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
    )
}

async fn holds_the_cap(first_ip: u8, strategy: &str) {
    let bound = (CAP as f64 * 1.05 + 1.0).floor() as u64;
    let (addr, upstream) = upstream().await;
    let fleet = fleet(first_ip, strategy, addr).await;
    for (name, spread) in [
        ("even", even as Spread),
        ("70,20,10", skewed),
        ("switching", switching),
    ] {
        upstream.peak.store(0, Ordering::Release);
        upstream.seen.store(0, Ordering::Release);
        let (admitted, refused) = drive(&fleet, spread, Duration::from_secs(4)).await;
        let peak = upstream.peak.load(Ordering::Acquire);
        eprintln!("{strategy} {name}: peak {peak} at the upstream, {admitted} admitted, {refused} refused");
        assert!(
            peak <= bound,
            "{strategy} {name}: the upstream held {peak} pushes at once, over {bound} (cap {CAP})"
        );
        // The cap is in use, not merely respected by refusing everything.
        assert!(
            admitted >= 50,
            "{strategy} {name}: only {admitted} admitted"
        );
        assert!(
            refused > 0,
            "{strategy} {name}: 60 clients never met the cap"
        );
        assert_eq!(upstream.seen.load(Ordering::Relaxed), admitted);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_holds_the_fleet_in_flight_cap_at_the_upstream() {
    holds_the_cap(190, "weighted").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn divided_holds_the_fleet_in_flight_cap_at_the_upstream() {
    holds_the_cap(200, "divided").await;
}

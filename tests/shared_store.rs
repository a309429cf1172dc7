//! `shared` over real HTTP against a real `redis-server` started here on a free port: leased
//! decisions, each failure policy (Redis killed and paused), two policies in one process,
//! leases returned on SIGTERM, and the configuration errors.

mod common;

#[path = "../redis-store/tests/redis_server.rs"]
mod redis_server;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Options, Weir};
use redis_server::RedisServer;

const OVERRIDES: &str = "overrides:\n  open:\n    ingestion_rate: 1000\n    ingestion_burst_size: 1000\n    rate_limit_strategy: shared\n    on_store_failure: open\n  closed:\n    ingestion_rate: 1000\n    ingestion_burst_size: 1000\n    rate_limit_strategy: shared\n    on_store_failure: closed\n";

async fn weir_with_store(url: String) -> Weir {
    Weir::start(Options {
        overrides: OVERRIDES.into(),
        configure: Box::new(move |config| {
            config.store_url = vec![url];
            config.store_timeout = Duration::from_millis(50);
            config.store_breaker_open_for = Duration::from_millis(200);
        }),
        ..Options::default()
    })
    .await
}

async fn wait_until_stored(weir: &Weir) {
    assert!(
        weir.eventually(Duration::from_secs(10), || async {
            weir.status("closed", 1).await == 200
        })
        .await,
        "the store never answered"
    );
}

#[tokio::test]
async fn a_shared_limit_is_held_in_redis() {
    let redis = RedisServer::start();
    let weir = weir_with_store(redis.url()).await;
    wait_until_stored(&weir).await;
    // The bucket holds 1 000 (less the 1 just spent): 999 more, then 429. A store call past
    // its 50 ms timeout on a loaded machine is a 503 (`closed`), not the bucket's answer: it is
    // sent again once the breaker has closed (the CI run at 75da0fe counted two as refused).
    let mut admitted = 1;
    let mut decided = 0;
    for _ in 0..60 {
        match weir.status("closed", 100).await {
            200 => admitted += 100,
            503 => {
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
            _ => {}
        }
        decided += 1;
        if decided == 30 {
            break;
        }
    }
    assert_eq!(decided, 30, "the store answered too few of 60 pushes");
    assert!((900..=1_300).contains(&admitted), "admitted {admitted}");
    // The push past the bucket: a 503 here is again the store's timeout, not its answer.
    let mut response = weir.push("closed", 100).await;
    for _ in 0..10 {
        if response.status() != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        response = weir.push("closed", 100).await;
    }
    assert_eq!(response.status(), 429);
    // 100 items at 1 000/s are a tenth of a second away (plus a lease window): no
    // Retry-After, which would claim a whole second at least; RateLimit says t=0.
    assert!(!response.headers().contains_key("retry-after"));
    let state = response.headers()["ratelimit"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(state.ends_with(";t=0"), "{state}");
    // The bucket is in Redis, under the tenant's hash tag, with an expiry.
    let ttl: i64 = redis.cli(&["PTTL", "weir:{closed}:i"]).parse().unwrap();
    assert!(ttl > 0, "{ttl}");
    assert!(weir
        .metric("weir_store_calls_total{op=\"take\",outcome=\"ok\"}")
        .await
        .is_some_and(|calls| calls >= 1.0));
    let ready = weir
        .client
        .get(weir.url("/ready"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(ready.contains("shared store: reachable"), "{ready}");
    weir.stop().await.unwrap();
}

/// Both policies in one process, two tenants: with Redis killed, `open` falls back to the
/// fleet view and `closed` answers 503 naming the outage, each within the store timeout.
#[tokio::test]
async fn each_tenant_follows_its_policy_when_redis_dies_and_recovers_after() {
    let port = redis_server::free_port();
    let mut redis = RedisServer::start_with(port, &[]);
    let weir = weir_with_store(redis.url()).await;
    wait_until_stored(&weir).await;
    assert_eq!(weir.status("open", 1).await, 200);
    redis.kill();

    let started = Instant::now();
    let response = weir.push("closed", 1).await;
    let took = started.elapsed();
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
    let body = response.text().await.unwrap();
    assert!(body.contains("err-weir-store-unavailable"), "{body}");
    assert!(took < Duration::from_millis(500), "took {took:?}");
    assert_eq!(weir.status("open", 1).await, 200, "open falls back");
    // The breaker opens: decisions stop waiting on the dead store.
    for _ in 0..10 {
        weir.status("closed", 1).await;
    }
    assert_eq!(
        weir.metric("weir_store_breaker_state").await,
        Some(2.0),
        "open"
    );
    assert!(weir
        .metric("weir_store_policy_decisions_total{outcome=\"refused\",policy=\"closed\"}")
        .await
        .is_some_and(|n| n >= 1.0));
    let ready = weir.client.get(weir.url("/ready")).send().await.unwrap();
    assert_eq!(ready.status(), 200, "a dead store does not fail readiness");
    assert!(ready.text().await.unwrap().contains("unreachable"));

    // Redis is back, and no push comes: the replica's own probe closes the breaker, so its
    // gauge (and the alert on it) clears without traffic to make a probe.
    let _redis = RedisServer::start_with(port, &[]);
    assert!(
        weir.eventually(Duration::from_secs(10), || async {
            weir.metric("weir_store_breaker_state").await == Some(0.0)
        })
        .await,
        "the breaker stayed open with Redis back"
    );
    assert_eq!(weir.status("closed", 1).await, 200);
    weir.stop().await.unwrap();
}

/// Redis dies while no `shared` push comes: the replica's own pings open the breaker, so its
/// gauge (and the alert on it) tells the outage, as `/ready` does, with no push to find it.
#[tokio::test]
async fn with_no_traffic_a_dead_redis_opens_the_breaker() {
    let mut redis = RedisServer::start();
    let weir = weir_with_store(redis.url()).await;
    wait_until_stored(&weir).await;
    assert_eq!(weir.metric("weir_store_breaker_state").await, Some(0.0));
    redis.kill();
    assert!(
        weir.eventually(Duration::from_secs(15), || async {
            weir.metric("weir_store_breaker_state").await == Some(2.0)
        })
        .await,
        "the breaker stayed closed with Redis dead and no traffic"
    );
    assert!(
        weir.metric(r#"weir_store_calls_total{op="ping",outcome="error"}"#)
            .await
            .is_some_and(|n| n >= 1.0)
            || weir
                .metric(r#"weir_store_calls_total{op="ping",outcome="timeout"}"#)
                .await
                .is_some_and(|n| n >= 1.0)
    );
    weir.stop().await.unwrap();
}

/// A paused Redis (SIGSTOP) is slow, not down: treated the same, within the timeout.
#[tokio::test]
async fn a_paused_redis_is_treated_like_a_dead_one() {
    let redis = RedisServer::start();
    let weir = weir_with_store(redis.url()).await;
    wait_until_stored(&weir).await;
    redis.signal("-STOP");
    let started = Instant::now();
    let status = weir.status("closed", 1).await;
    let took = started.elapsed();
    redis.signal("-CONT");
    // Either the lease still held a token, or the store was asked and did not answer.
    assert!(status == 200 || status == 503, "{status}");
    assert!(took < Duration::from_millis(500), "took {took:?}");
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn shared_without_a_store_is_a_clear_error() {
    // At start-up, as the default strategy…
    let output = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([
            "--rate-limit-strategy",
            "shared",
            "--gossip-addr",
            "127.0.0.1:0",
        ])
        .args(["--http-addr", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--store-url"));
    // …or in the overrides file.
    let dir = tempfile::tempdir().unwrap();
    let overrides = dir.path().join("overrides.yaml");
    std::fs::write(&overrides, OVERRIDES).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["--runtime-config", overrides.to_str().unwrap()])
        .args([
            "--gossip-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("needs the shared store"), "{stderr}");
}

#[tokio::test]
async fn a_reload_that_adds_shared_without_a_store_is_refused() {
    let weir = Weir::with_overrides("overrides:\n  t:\n    ingestion_rate: 10\n").await;
    std::fs::write(
        &weir.overrides,
        "overrides:\n  t:\n    rate_limit_strategy: shared\n",
    )
    .unwrap();
    assert!(
        weir.eventually(Duration::from_secs(15), || async {
            weir.metric("weir_runtime_config_last_reload_successful")
                .await
                == Some(0.0)
        })
        .await,
        "the reload was not refused"
    );
    weir.stop().await.unwrap();
}

/// Leases go back on SIGTERM: the real binary leases from Redis, is stopped, and the bucket
/// holds what it had not spent.
#[tokio::test]
async fn leases_are_returned_on_sigterm() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let overrides = dir.path().join("overrides.yaml");
    // Slow refill, so what is in the bucket afterwards is what was given back.
    std::fs::write(
        &overrides,
        "overrides:\n  t:\n    ingestion_rate: 1\n    ingestion_burst_size: 100000\n    rate_limit_strategy: shared\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["--runtime-config", overrides.to_str().unwrap()])
        .args([
            "--gossip-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
        ])
        .args(["--store-url", &redis.url(), "--store-lease-ttl", "60s"])
        .args(["--store-lease-window", "10s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let http = common::fleet::listening_addr(&mut child);
    let client = reqwest::Client::new();
    let body = weir::remote_write::prompb::WriteRequest::synthetic(10, 1, 1).encode_snappy();
    let push = || {
        client
            .post(format!("http://{http}/api/v1/push"))
            .header("X-Scope-OrgID", "t")
            .body(body.clone())
            .send()
    };
    // A steady 500 items/s for 0.4 s, so the replica measures a demand and leases ahead of
    // it (its lease window is long: 10 s).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut admitted = 0;
    while admitted < 20 && Instant::now() < deadline {
        if push().await.map(|r| r.status() == 200).unwrap_or(false) {
            admitted += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(admitted, 20);
    let tokens = |redis: &RedisServer| -> f64 {
        redis
            .cli(&["HGET", "weir:{t}:i", "tokens"])
            .parse()
            .unwrap_or(f64::NAN)
    };
    let while_leased = tokens(&redis);
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(child.wait().unwrap().success());
    let after = tokens(&redis);
    // 200 items spent; what was leased beyond them is back.
    assert!(after > while_leased, "{while_leased} -> {after}");
    assert!(
        (99_790.0..=100_000.0).contains(&after),
        "200 spent of 100 000: {after}"
    );
}

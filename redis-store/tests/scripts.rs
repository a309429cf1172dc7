//! The Lua scripts against a real `redis-server`: the same answers as their pure twins in the
//! engine (the bucket, the sliding window, the leaky bucket), atomic under concurrent callers
//! (no lost updates, no slot taken twice), `NOSCRIPT` recovered, idle keys expired, leases
//! freed at their deadline.

mod redis_server;

use std::sync::Arc;
use std::time::Duration;

use engine::store::{self, BucketKey, KeyName, Store};
use engine::{LimitKind, Rate};
use proptest::prelude::*;
use redis_server::RedisServer;
use redis_store::{RedisConfig, RedisStore};

fn config(urls: Vec<String>) -> RedisConfig {
    RedisConfig {
        urls,
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(2),
    }
}

fn key(tenant: &str) -> BucketKey<'_> {
    BucketKey::push(tenant, LimitKind::Ingestion, 0, 1)
}

/// Slow enough that the refill during a test is far below one token.
const ALMOST_STILL: Rate = Rate {
    per_second: 0.001,
    burst: 1000,
};

#[tokio::test]
async fn take_and_give_back_follow_the_bucket_rules() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&config(vec![server.url()]))
        .await
        .unwrap();
    assert!(!store.is_cluster());
    let grant = store.take(key("a"), ALMOST_STILL, 600, 1).await.unwrap();
    assert_eq!(grant.granted, 600);
    // 400 left: a request of at least 500 gets nothing and is told how long to wait.
    let grant = store.take(key("a"), ALMOST_STILL, 700, 500).await.unwrap();
    assert_eq!(grant.granted, 0);
    assert!((grant.remaining - 400.0).abs() < 0.01, "{grant:?}");
    assert!(
        grant.wait > Duration::from_secs(99_000),
        "100 tokens at 0.001/s"
    );
    // What is there, up to want.
    let grant = store.take(key("a"), ALMOST_STILL, 700, 1).await.unwrap();
    assert_eq!(grant.granted, 400);
    // Giving back never overfills.
    store
        .give_back(key("a"), ALMOST_STILL, 5_000)
        .await
        .unwrap();
    let grant = store.take(key("a"), ALMOST_STILL, 5_000, 1).await.unwrap();
    assert_eq!(grant.granted, 1000);
    // The key expires once it would be full again.
    let ttl: i64 = server.cli(&["PTTL", "weir:{a}:i"]).parse().unwrap();
    assert!(ttl > 0, "PTTL {ttl}");
}

#[tokio::test]
async fn the_store_clock_refills() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&config(vec![server.url()]))
        .await
        .unwrap();
    let fast = Rate {
        per_second: 1000.0,
        burst: 100,
    };
    assert_eq!(
        store.take(key("r"), fast, 100, 1).await.unwrap().granted,
        100
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let grant = store.take(key("r"), fast, 100, 1).await.unwrap();
    assert!((40..=100).contains(&grant.granted), "{grant:?}");
}

/// No lost updates: 32 concurrent callers take one token at a time from a bucket of 5 000
/// that barely refills; exactly 5 000 are granted, whatever the interleaving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_never_spend_the_same_token() {
    let server = RedisServer::start();
    let store = Arc::new(
        RedisStore::connect(&config(vec![server.url()]))
            .await
            .unwrap(),
    );
    let rate = Rate {
        per_second: 0.001,
        burst: 5_000,
    };
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let mut granted = 0;
            for _ in 0..200 {
                granted += store.take(key("hot"), rate, 1, 1).await.unwrap().granted;
            }
            granted
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    assert_eq!(total, 5_000, "6 400 asks for one token, 5 000 tokens");
}

#[tokio::test]
async fn a_flushed_script_is_loaded_again() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&config(vec![server.url()]))
        .await
        .unwrap();
    assert_eq!(
        store
            .take(key("n"), ALMOST_STILL, 1, 1)
            .await
            .unwrap()
            .granted,
        1
    );
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"]), "OK");
    // EVALSHA now answers NOSCRIPT; the client loads the script and retries.
    assert_eq!(
        store
            .take(key("n"), ALMOST_STILL, 1, 1)
            .await
            .unwrap()
            .granted,
        1
    );
    store.give_back(key("n"), ALMOST_STILL, 1).await.unwrap();
}

#[tokio::test]
async fn a_restarted_server_is_reconnected() {
    let port = redis_server::free_port();
    let mut server = RedisServer::start_with(port, &[]);
    let store = RedisStore::connect(&config(vec![server.url()]))
        .await
        .unwrap();
    assert!(store.take(key("x"), ALMOST_STILL, 1, 1).await.is_ok());
    server.kill();
    assert!(store.take(key("x"), ALMOST_STILL, 1, 1).await.is_err());
    let _server = RedisServer::start_with(port, &[]);
    // The connection manager reconnects in the background; the script is loaded again.
    let mut ok = false;
    for _ in 0..50 {
        if store.take(key("x"), ALMOST_STILL, 1, 1).await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "the store never came back");
}

#[tokio::test]
async fn leases_are_counted_released_renewed_and_expire() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&config(vec![server.url()]))
        .await
        .unwrap();
    let key = KeyName {
        tenant: "t",
        key: "slots",
    };
    let long = Duration::from_secs(60);
    for (i, lease) in ["a", "b"].iter().enumerate() {
        let acquired = store.acquire(key, lease, 2, long).await.unwrap();
        assert!(acquired.granted);
        assert_eq!(acquired.in_flight, i as u64 + 1);
    }
    let full = store.acquire(key, "c", 2, long).await.unwrap();
    assert!(!full.granted);
    assert_eq!(full.in_flight, 2);
    assert!(full.retry_after > Duration::from_secs(59), "{full:?}");
    assert!(store.release(key, "a").await.unwrap());
    assert!(
        !store.release(key, "a").await.unwrap(),
        "a second release is refused"
    );
    assert!(!store.renew(key, "never", long).await.unwrap());
    // A short lease expires by itself: not renewable, and its slot is free again.
    assert!(
        store
            .acquire(key, "short", 2, Duration::from_millis(100))
            .await
            .unwrap()
            .granted
    );
    assert!(!store.acquire(key, "d", 2, long).await.unwrap().granted);
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(!store.renew(key, "short", long).await.unwrap());
    assert!(store.acquire(key, "d", 2, long).await.unwrap().granted);
    assert!(store
        .renew(key, "b", Duration::from_secs(600))
        .await
        .unwrap());
    let ttl: i64 = server
        .cli(&["PTTL", &redis_store::keys::admission(&key, 'c')])
        .parse()
        .unwrap();
    assert!(
        ttl > 590_000,
        "the key lives as long as its last lease: {ttl} ms"
    );
}

#[tokio::test]
async fn concurrent_acquires_never_exceed_max() {
    let server = RedisServer::start();
    let store = Arc::new(
        RedisStore::connect(&config(vec![server.url()]))
            .await
            .unwrap(),
    );
    let mut tasks = Vec::new();
    for i in 0..200 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let lease = format!("lease-{i}");
            store
                .acquire(
                    KeyName {
                        tenant: "t",
                        key: "race",
                    },
                    &lease,
                    37,
                    Duration::from_secs(60),
                )
                .await
                .unwrap()
                .granted
        }));
    }
    let mut granted = 0;
    for task in tasks {
        granted += task.await.unwrap() as usize;
    }
    assert_eq!(granted, 37);
    let held: u64 = server.cli(&["ZCARD", "weir:{t}:k:race:c"]).parse().unwrap();
    assert_eq!(held, 37);
}

#[tokio::test]
async fn the_sliding_window_refreshes_as_it_slides() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&config(vec![server.url()]))
        .await
        .unwrap();
    let meter = store::StoredMeter::SlidingWindow {
        limit: 5.0,
        window: Duration::from_millis(300),
    };
    let mut allowed = 0;
    for _ in 0..8 {
        allowed += store
            .meter(
                KeyName {
                    tenant: "t",
                    key: "w",
                },
                meter,
                1,
            )
            .await
            .unwrap()
            .allowed as u32;
    }
    assert_eq!(allowed, 5);
    let refused = store
        .meter(
            KeyName {
                tenant: "t",
                key: "w",
            },
            meter,
            1,
        )
        .await
        .unwrap();
    assert!(!refused.allowed);
    assert!(
        refused.retry_after > Duration::ZERO && refused.retry_after <= Duration::from_millis(360)
    );
    // Two windows on, the count is gone.
    tokio::time::sleep(Duration::from_millis(650)).await;
    let mut allowed = 0;
    for _ in 0..8 {
        allowed += store
            .meter(
                KeyName {
                    tenant: "t",
                    key: "w",
                },
                meter,
                1,
            )
            .await
            .unwrap()
            .allowed as u32;
    }
    assert_eq!(allowed, 5);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    /// The sliding-window and leaky-bucket scripts give the same answers as their pure twins
    /// for any sequence of costs (at rates too slow to move within the test: a window of an
    /// hour, a drain of one unit per thousand seconds).
    #[test]
    fn the_meter_scripts_match_their_pure_twins(
        costs in prop::collection::vec(1u64..40, 1..16),
        limit in 1u64..200,
    ) {
        use engine::algorithms::{LeakyBucket, SlidingWindow};
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let server = SERVER.with(|server| server.url());
        runtime.block_on(async {
            let store = RedisStore::connect(&config(vec![server])).await.unwrap();
            let id = rand_suffix();
            let hour = Duration::from_secs(3600);
            let window = SlidingWindow::new(limit as f64, hour, 0);
            let leaky = LeakyBucket::new(0.001, limit, 0);
            for cost in costs {
                let meter = store::StoredMeter::SlidingWindow { limit: limit as f64, window: hour };
                let script = store.meter(KeyName { tenant: &format!("w{id}"), key: "x" }, meter, cost).await;
                match window.check(cost, 0) {
                    Ok(twin) => {
                        let script = script.unwrap();
                        prop_assert_eq!(script.allowed, twin.allowed);
                        prop_assert_eq!(script.remaining, twin.remaining);
                    }
                    Err(_) => prop_assert!(script.is_err() || !script.unwrap().allowed),
                }
                let meter = store::StoredMeter::LeakyBucket { rate: 0.001, capacity: limit };
                let script = store.meter(KeyName { tenant: &format!("l{id}"), key: "x" }, meter, cost).await;
                match leaky.check(cost, 0) {
                    Ok(twin) => {
                        let script = script.unwrap();
                        prop_assert_eq!(script.allowed, twin.allowed);
                        prop_assert_eq!(script.remaining, twin.remaining);
                        let drift = script.delay.abs_diff(twin.delay);
                        prop_assert!(drift < Duration::from_millis(50), "{:?} vs {:?}", script.delay, twin.delay);
                    }
                    Err(_) => prop_assert!(script.is_err() || !script.unwrap().allowed),
                }
            }
            Ok(())
        })?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// The script and its pure twin give the same answers for any sequence of takes and
    /// returns (at a rate too slow to refill within the test).
    #[test]
    fn the_script_matches_its_pure_twin(
        steps in prop::collection::vec((1u64..400, 0u64..400, any::<bool>()), 1..12)
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let server = SERVER.with(|server| server.url());
        runtime.block_on(async {
            let store = RedisStore::connect(&config(vec![server])).await.unwrap();
            let tenant = format!("twin-{}", rand_suffix());
            let mut bucket: Option<store::StoredBucket> = None;
            for (want, min, give) in steps {
                if give {
                    store.give_back(key(&tenant), ALMOST_STILL, want).await.unwrap();
                    bucket = Some(store::give_back(bucket, 0, ALMOST_STILL, want));
                } else {
                    let min = min.min(want);
                    let grant = store.take(key(&tenant), ALMOST_STILL, want, min).await.unwrap();
                    let (state, expected) = store::take(bucket, 0, ALMOST_STILL, want, min);
                    bucket = Some(state);
                    prop_assert_eq!(grant.granted, expected.granted);
                    prop_assert!((grant.remaining - expected.remaining).abs() < 0.01);
                }
            }
            Ok(())
        })?;
    }
}

thread_local! {
    static SERVER: RedisServer = RedisServer::start();
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

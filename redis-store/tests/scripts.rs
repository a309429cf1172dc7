//! The Lua scripts against a real `redis-server`: the same answers as their pure twins in the
//! engine, atomic under concurrent callers (no lost updates), `NOSCRIPT` recovered, idle keys
//! expired.

mod redis_server;

use std::sync::Arc;
use std::time::Duration;

use engine::store::{self, BucketKey, Store};
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
    BucketKey {
        tenant,
        kind: LimitKind::Ingestion,
        shard: 0,
    }
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

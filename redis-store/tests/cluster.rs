//! The Redis store against a real Redis Cluster (3 masters, 3 replicas, started here):
//! sub-buckets spread over masters, `MOVED`/`ASK` followed while a slot migrates, and a
//! master's failover survived.

mod redis_server;

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::store::{BucketKey, Store};
use engine::{LimitKind, Rate};
use redis_server::RedisCluster;
use redis_store::{keys, RedisConfig, RedisStore};

fn config(urls: Vec<String>) -> RedisConfig {
    RedisConfig {
        urls,
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(2),
    }
}

/// Sub-bucket `shard` of a tenant's three.
fn key(tenant: &str, shard: u32) -> BucketKey<'_> {
    BucketKey::push(tenant, LimitKind::Ingestion, shard, 3)
}

const STILL: Rate = Rate {
    per_second: 0.001,
    burst: 1_000_000,
};

/// The node id and port of the master that owns `key`'s slot.
fn owner(cluster: &RedisCluster, key: &str) -> (String, u16) {
    let node = &cluster.nodes[0];
    let slot: u16 = node.cli(&["CLUSTER", "KEYSLOT", key]).parse().unwrap();
    let nodes = node.cli(&["CLUSTER", "NODES"]);
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if !fields[2].contains("master") || fields[2].contains("fail") {
            continue;
        }
        for range in &fields[8..] {
            if range.starts_with('[') {
                continue;
            }
            let (start, end) = match range.split_once('-') {
                Some((a, b)) => (a.parse::<u16>().unwrap(), b.parse::<u16>().unwrap()),
                None => (range.parse().unwrap(), range.parse().unwrap()),
            };
            if (start..=end).contains(&slot) {
                let port = fields[1].split(['@', ':']).nth(1).unwrap().parse().unwrap();
                return (fields[0].to_string(), port);
            }
        }
    }
    panic!("no master owns {key}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_buckets_spread_over_masters_and_migrating_slots_are_followed() {
    let cluster = RedisCluster::start(3);
    let store = Arc::new(RedisStore::connect(&config(cluster.urls())).await.unwrap());
    assert!(store.is_cluster());

    // Any tenant's three sub-buckets land on three different masters: their tags are picked
    // in three thirds of the slot space, which the masters own in contiguous ranges.
    for i in 0..20 {
        let tenant = format!("tenant-{i}");
        let owners: BTreeSet<u16> = (0..3)
            .map(|shard| owner(&cluster, &keys::bucket(&key(&tenant, shard))).1)
            .collect();
        assert_eq!(owners.len(), 3, "{tenant}'s sub-buckets share a master");
    }
    let tenant = "hot".to_string();
    for shard in 0..3 {
        assert_eq!(
            store
                .take(key(&tenant, shard), STILL, 10, 1)
                .await
                .unwrap()
                .granted,
            10
        );
    }
    // Each master ran the script: the load of one tenant is on three masters.
    let masters: BTreeSet<u16> = (0..3)
        .map(|shard| owner(&cluster, &keys::bucket(&key(&tenant, shard))).1)
        .collect();
    assert_eq!(masters.len(), 3);
    for port in &masters {
        let stats = Command::new("redis-cli")
            .args(["-p", &port.to_string(), "INFO", "commandstats"])
            .output()
            .unwrap();
        let stats = String::from_utf8_lossy(&stats.stdout);
        assert!(
            stats.contains("cmdstat_evalsha") || stats.contains("cmdstat_eval"),
            "{port}: {stats}"
        );
    }

    // Move the slot of one bucket to another master while takes run against it: every
    // take is answered (MOVED and ASK are followed), and no token is spent twice.
    let moving = keys::bucket(&key(&tenant, 0));
    let (_, from_port) = owner(&cluster, &moving);
    let (to_id, _) = owner(&cluster, &keys::bucket(&key(&tenant, 1)));
    let slot = cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", &moving]);
    let running = Arc::new(AtomicBool::new(true));
    let granted = Arc::new(AtomicU64::new(10));
    let failures = Arc::new(AtomicU64::new(0));
    let worker = {
        let (store, running, granted, failures, tenant) = (
            Arc::clone(&store),
            Arc::clone(&running),
            Arc::clone(&granted),
            Arc::clone(&failures),
            tenant.clone(),
        );
        tokio::spawn(async move {
            while running.load(Ordering::Relaxed) {
                match store.take(key(&tenant, 0), STILL, 1, 1).await {
                    Ok(grant) => {
                        granted.fetch_add(grant.granted, Ordering::Relaxed);
                    }
                    Err(err) => {
                        eprintln!("take failed during the migration: {err}");
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // What `redis-cli --cluster reshard` does for one slot, step by step, so the slot is
    // ours: while its keys move, the source answers ASK; once it is assigned, MOVED.
    tokio::task::block_in_place(|| migrate_slot(&cluster, slot.parse().unwrap(), &moving, &to_id));
    tokio::time::sleep(Duration::from_millis(300)).await;
    running.store(false, Ordering::Relaxed);
    worker.await.unwrap();
    assert_eq!(
        failures.load(Ordering::Relaxed),
        0,
        "every take was answered"
    );
    assert_ne!(owner(&cluster, &moving).1, from_port, "the slot moved");
    // The bucket kept its count across the move: what is left is what was not granted.
    let left = store
        .take(key(&tenant, 0), STILL, 0, 0)
        .await
        .unwrap()
        .remaining;
    let spent = granted.load(Ordering::Relaxed) as f64;
    assert!(
        (left - (1_000_000.0 - spent)).abs() < 1.0,
        "left {left}, spent {spent}"
    );
}

/// Moves one slot (and its keys) to the master `to_id`, the way `redis-cli --cluster
/// reshard` does: IMPORTING/MIGRATING, MIGRATE the keys, then assign the slot.
fn migrate_slot(cluster: &RedisCluster, slot: u16, key: &str, to_id: &str) {
    let (from_id, from_port) = owner(cluster, key);
    if from_id == to_id {
        return;
    }
    let to = cluster
        .nodes
        .iter()
        .find(|node| node.cli(&["CLUSTER", "MYID"]) == to_id)
        .unwrap();
    let from = cluster
        .nodes
        .iter()
        .find(|node| node.port == from_port)
        .unwrap();
    let slot = slot.to_string();
    assert_eq!(
        to.cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]),
        "OK"
    );
    assert_eq!(
        from.cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", to_id]),
        "OK"
    );
    // Keys move one by one; meanwhile the source answers ASK for keys already moved.
    loop {
        let keys = from.cli(&["CLUSTER", "GETKEYSINSLOT", &slot, "100"]);
        if keys.is_empty() {
            break;
        }
        for key in keys.lines() {
            std::thread::sleep(Duration::from_millis(50));
            from.cli(&[
                "MIGRATE",
                "127.0.0.1",
                &to.port.to_string(),
                key,
                "0",
                "5000",
            ]);
        }
    }
    // The destination first, then the source, then the rest, as `redis-cli --cluster reshard`
    // does: the other way round, each would send the client to the other (MOVED both ways).
    to.cli(&["CLUSTER", "SETSLOT", &slot, "NODE", to_id]);
    from.cli(&["CLUSTER", "SETSLOT", &slot, "NODE", to_id]);
    for node in &cluster.nodes {
        if node.port != to.port && node.port != from.port {
            node.cli(&["CLUSTER", "SETSLOT", &slot, "NODE", to_id]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_failover_is_survived() {
    let mut cluster = RedisCluster::start(3);
    let store = RedisStore::connect(&config(cluster.urls())).await.unwrap();
    let bucket = key("failover", 0);
    assert_eq!(store.take(bucket, STILL, 5, 1).await.unwrap().granted, 5);
    let (_, port) = owner(&cluster, &keys::bucket(&bucket));
    let index = cluster
        .nodes
        .iter()
        .position(|node| node.port == port)
        .unwrap();
    cluster.nodes[index].kill();
    let killed = Instant::now();
    // A replica is promoted after the node timeout (1 s); takes fail until then, and the
    // store answers again within 5 s of the promotion.
    let mut recovered = None;
    while killed.elapsed() < Duration::from_secs(20) {
        let answer =
            tokio::time::timeout(Duration::from_millis(500), store.take(bucket, STILL, 1, 1)).await;
        if let Ok(Ok(grant)) = answer {
            assert_eq!(grant.granted, 1);
            recovered = Some(killed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let recovered = recovered.expect("the store never answered after the failover");
    eprintln!("answered again {recovered:?} after the master was killed");
    assert!(recovered < Duration::from_secs(10), "{recovered:?}");
}

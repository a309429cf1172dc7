//! Two real rings on 127.0.0.1 over UDP: membership and usage travel between them.

use std::time::{Duration, Instant};

use weir_ring::{Ring, RingConfig, UsageEntry};

fn config(node_id: &str, listen: std::net::SocketAddr, seeds: Vec<String>) -> RingConfig {
    RingConfig {
        node_id: node_id.into(),
        cluster_id: "gossip-test".into(),
        listen_addr: listen,
        advertise_addr: None,
        seeds,
        seeds_refresh_interval: Duration::from_secs(10),
        gossip_interval: Duration::from_millis(100),
        phi_threshold: 12.0,
        dead_node_grace_period: Duration::from_secs(60),
        join_timeout: Duration::from_secs(1),
        http_addr: "127.0.0.1:1".into(),
        grpc_addr: None,
        version: "test".into(),
        max_members: 1000,
        gossip_keys: None,
        usage_forget_after: Duration::from_secs(3600),
    }
}

#[tokio::test]
async fn usage_published_by_one_replica_reaches_the_other() {
    let first = Ring::join(config("a", "127.0.0.1:0".parse().unwrap(), vec![]))
        .await
        .unwrap();
    let seed = first.gossip_addr().to_string();
    let second = Ring::join(config("b", "127.0.0.1:0".parse().unwrap(), vec![seed]))
        .await
        .unwrap();
    let entry = |items| UsageEntry {
        tenant: "t".into(),
        requests: 10,
        items,
        requests_level: None,
        items_level: Some(-5.0),
        in_flight: 0,
    };
    assert_eq!(first.publish_usage(&[entry(1000)], false).await, 1);
    let membership = second.membership();
    let wait_for = |items: u64| {
        let membership = membership.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(5);
            // The changes since the last wait: the awaited count is one of them.
            let mut view = weir_ring::PeerUsage::default();
            loop {
                let current = membership.borrow().clone();
                for batch in current.peer_usage.take() {
                    batch.apply_to(&mut view);
                }
                let usage = view.get("t").copied();
                if current.healthy == 2 && usage.map(|u| u.items) == Some(items) {
                    return usage.unwrap();
                }
                assert!(
                    Instant::now() < deadline,
                    "usage never arrived: healthy {}, {usage:?}",
                    current.healthy
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let usage = wait_for(1000).await;
    assert_eq!((usage.requests, usage.items_level), (10, Some(-5.0)));
    // Cumulative: the next report adds only what is new.
    first.publish_usage(&[entry(1500)], false).await;
    wait_for(1500).await;
    // The publisher does not count its own usage as a peer's.
    let own = first.membership().borrow().clone();
    assert_eq!(own.peer_usage_tenants, 0);
    assert!(own.peer_usage.take().is_empty());
    first.shutdown().await;
    second.shutdown().await;
}

/// Gossip is untrusted input: however many members it reports, a replica counts at most
/// `max_members` (itself first), and says how many it ignored.
#[tokio::test]
async fn members_beyond_the_cap_are_ignored() {
    let capped = |node_id: &str, seeds: Vec<String>| {
        let mut config = config(node_id, "127.0.0.1:0".parse().unwrap(), seeds);
        config.max_members = 2;
        config
    };
    let first = Ring::join(capped("a", vec![])).await.unwrap();
    let seed = first.gossip_addr().to_string();
    let mut others = Vec::new();
    for id in ["b", "c", "d"] {
        others.push(Ring::join(capped(id, vec![seed.clone()])).await.unwrap());
    }
    let membership = first.membership();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let current = membership.borrow().clone();
        if current.ignored_members == 2 {
            assert_eq!(current.healthy, 2, "itself and one peer");
            assert_eq!(current.members.len(), 2);
            assert!(current.members.iter().any(|member| member.is_self));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ignored {}",
            current.ignored_members
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.shutdown().await;
    for other in others {
        other.shutdown().await;
    }
}

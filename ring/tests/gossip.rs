//! Two real rings on 127.0.0.1 over UDP: membership and demand travel between them.

use std::time::{Duration, Instant};

use weir_ring::{DemandEntry, Ring, RingConfig};

fn config(node_id: &str, listen: std::net::SocketAddr, seeds: Vec<String>) -> RingConfig {
    RingConfig {
        node_id: node_id.into(),
        cluster_id: "gossip-test".into(),
        listen_addr: listen,
        advertise_addr: None,
        seeds,
        gossip_interval: Duration::from_millis(100),
        phi_threshold: 12.0,
        dead_node_grace_period: Duration::from_secs(60),
        join_timeout: Duration::from_secs(1),
        http_addr: "127.0.0.1:1".into(),
        version: "test".into(),
    }
}

#[tokio::test]
async fn demand_published_by_one_replica_reaches_the_other() {
    let first = Ring::join(config("a", "127.0.0.1:0".parse().unwrap(), vec![]))
        .await
        .unwrap();
    let seed = first.gossip_addr().to_string();
    let second = Ring::join(config("b", "127.0.0.1:0".parse().unwrap(), vec![seed]))
        .await
        .unwrap();
    first
        .publish_demand(vec![DemandEntry {
            tenant: "t".into(),
            requests: 10.0,
            items: 1000.0,
        }])
        .await;
    let membership = second.membership();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let current = membership.borrow().clone();
        if current.healthy == 2 && current.peer_demand.get("t") == (10.0, 1000.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "demand never arrived: healthy {}, {:?}",
            current.healthy,
            current.peer_demand
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The publisher does not count its own demand as a peer's.
    assert_eq!(first.membership().borrow().peer_demand.get("t"), (0.0, 0.0));
    first.shutdown().await;
    second.shutdown().await;
}

//! Encrypted gossip with real `weir` processes: two replicas on 127.0.0.100 and .101 gossip
//! only through a UDP relay the test runs (each advertises a relay socket, on .102 and .103,
//! as its gossip address), so the test sees every datagram on the wire. A captured datagram
//! carries the tenant's usage but shows neither the tenant nor a node id; sent again, at once
//! and after the replay window, it is refused and counted, and the ring and the usage views
//! do not move.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::fleet::{free_gossip_addr, spawn, until_healthy, Replica};
use common::processes::{metrics_page, sum};
use tokio::net::UdpSocket;
use weir::remote_write::prompb::WriteRequest;

const SECRET: &str = "encrypted-gossip-secret-0123456789";
const TENANT: &str = "tenant-confidential-7";
const CLUSTER: &str = "crypt";

/// Datagrams the relay passed on to replica A, with when they arrived.
type Captured = Arc<Mutex<Vec<(Instant, Vec<u8>)>>>;

/// Forwards what reaches `to_a` to A (from `to_b`, so A's answer comes back through the
/// relay) and what reaches `to_b` to B, recording what goes to A.
fn relay(
    to_a: Arc<UdpSocket>,
    to_b: Arc<UdpSocket>,
    a: SocketAddr,
    b: SocketAddr,
) -> (Captured, tokio::task::JoinHandle<()>) {
    let captured: Captured = Arc::default();
    let record = Arc::clone(&captured);
    let task = tokio::spawn(async move {
        let mut for_a = vec![0u8; 65_536];
        let mut for_b = vec![0u8; 65_536];
        loop {
            tokio::select! {
                Ok((len, _)) = to_a.recv_from(&mut for_a) => {
                    record.lock().unwrap().push((Instant::now(), for_a[..len].to_vec()));
                    let _ = to_b.send_to(&for_a[..len], a).await;
                }
                Ok((len, _)) = to_b.recv_from(&mut for_b) => {
                    let _ = to_a.send_to(&for_b[..len], b).await;
                }
            }
        }
    });
    (captured, task)
}

/// What a replay must not move: the members (id, generation, state), the healthy count and
/// each tenant's usage as this replica sees it.
async fn views(replica: &Replica) -> serde_json::Value {
    let ring = replica.ring().await.expect("/ring answers");
    let members: Vec<_> = ring["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|member| serde_json::json!([member["node_id"], member["generation"], member["state"]]))
        .collect();
    let tenants: Vec<_> = ring["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tenant| {
            serde_json::json!([
                tenant["tenant"],
                tenant["admitted_requests_here"],
                tenant["admitted_items_here"],
                tenant["admitted_requests_by_peers"],
                tenant["admitted_items_by_peers"],
            ])
        })
        .collect();
    serde_json::json!({"healthy": ring["healthy"], "members": members, "tenants": tenants})
}

/// Items admitted by the peers, as this replica's view shows them (requests are counted only
/// under a request rate).
fn by_peers(views: &serde_json::Value) -> u64 {
    views["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|tenant| tenant[0] == TENANT)
        .and_then(|tenant| tenant[4].as_u64())
        .unwrap_or(0)
}

async fn rejected(replica: &Replica, reason: &str) -> f64 {
    let page = metrics_page(&format!("http://{}", replica.http)).await;
    sum(
        &page,
        "weir_ring_rejected_gossip_total",
        &[("reason", reason)],
    )
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

#[tokio::test]
async fn a_replayed_gossip_datagram_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let overrides = dir.path().join("overrides.yaml");
    std::fs::write(
        &overrides,
        format!(
            "overrides:\n  {TENANT}:\n    ingestion_rate: 100000\n    \
             ingestion_burst_size: 100000\n    rate_limit_strategy: weighted\n"
        ),
    )
    .unwrap();
    let a_addr = free_gossip_addr([127, 0, 0, 100]);
    let b_addr = free_gossip_addr([127, 0, 0, 101]);
    let to_a = Arc::new(UdpSocket::bind("127.0.0.102:0").await.unwrap());
    let to_b = Arc::new(UdpSocket::bind("127.0.0.103:0").await.unwrap());
    let (advertise_a, advertise_b) = (to_a.local_addr().unwrap(), to_b.local_addr().unwrap());
    let (captured, relay_task) = relay(Arc::clone(&to_a), Arc::clone(&to_b), a_addr, b_addr);

    let replica = |gossip: SocketAddr, advertise: SocketAddr, seed: SocketAddr| {
        let advertise = advertise.to_string();
        let args = [
            "--gossip-secret",
            SECRET,
            "--gossip-advertise-addr",
            &advertise,
            "--runtime-config",
            overrides.to_str().unwrap(),
            "--ring-join-timeout",
            "1s",
        ];
        spawn(gossip, &[seed], CLUSTER, &args)
    };
    let a = replica(a_addr, advertise_a, advertise_b);
    let b = replica(b_addr, advertise_b, advertise_a);
    until_healthy(&[&a, &b], 2, Duration::from_secs(10)).await;

    // Both replicas admit the tenant's pushes, and each learns the other's over gossip.
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        for replica in [&a, &b] {
            let body = WriteRequest::synthetic(5, 1, 1).encode_snappy();
            let base = format!("http://{}", replica.http);
            let status = common::push_request(&client, &base, Some(TENANT), body)
                .send()
                .await
                .unwrap()
                .status();
            assert!(status.is_success(), "push refused: {status}");
        }
        if by_peers(&views(&a).await) > 0 && by_peers(&views(&b).await) > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "usage never crossed the relay: {} {}",
            a.ring().await.unwrap(),
            b.ring().await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The views settle once the pushes stop: two reads a few rounds apart agree.
    let settle_deadline = Instant::now() + Duration::from_secs(10);
    let (before_a, before_b) = loop {
        let first = (views(&a).await, views(&b).await);
        tokio::time::sleep(Duration::from_millis(800)).await;
        let second = (views(&a).await, views(&b).await);
        if first == second {
            break second;
        }
        assert!(Instant::now() < settle_deadline, "the views never settled");
    };
    assert_eq!(before_a["healthy"], 2);

    // On the wire: a datagram that, decrypted, names the tenant (so the check below can
    // fail) shows neither the tenant nor a node id in clear.
    let keys = ring::GossipKeys::new(&[SECRET]).unwrap();
    let datagrams = captured.lock().unwrap().clone();
    let mut plaintext = Vec::new();
    let with_tenant = datagrams
        .iter()
        .rev()
        .find(|(_, bytes)| {
            keys.open(bytes, &mut plaintext)
                .is_ok_and(|opened| contains(opened.payload, TENANT.as_bytes()))
        })
        .expect("a captured datagram carries the tenant's usage")
        .1
        .clone();
    let node_id_prefix = format!("{CLUSTER}-127.0.0.");
    for (_, bytes) in &datagrams {
        assert!(
            !contains(bytes, TENANT.as_bytes()),
            "a tenant name in clear"
        );
        assert!(
            !contains(bytes, node_id_prefix.as_bytes()),
            "a node id in clear"
        );
        assert!(!contains(bytes, b"ACTIVE"), "member state in clear");
    }

    // An exact replay, within the window: the most recent datagram to A, sent again.
    let (latest_at, latest) = datagrams.last().unwrap().clone();
    let (replays, stale) = (rejected(&a, "replay").await, rejected(&a, "stale").await);
    to_b.send_to(&latest, a_addr).await.unwrap();
    assert!(
        latest_at.elapsed() < ring::auth::DEFAULT_REPLAY_WINDOW,
        "the test was too slow to replay within the window"
    );
    common::wait_until("the replay counted", Duration::from_secs(5), || async {
        rejected(&a, "replay").await > replays
    })
    .await;
    // The datagram that carried the tenant's usage, replayed: refused as replay or stale,
    // depending on its age.
    to_b.send_to(&with_tenant, a_addr).await.unwrap();
    common::wait_until(
        "the usage replay counted",
        Duration::from_secs(5),
        || async {
            rejected(&a, "replay").await + rejected(&a, "stale").await >= replays + stale + 2.0
        },
    )
    .await;

    // After the window, the same datagram is refused as stale (its nonce may be forgotten).
    let late = latest_at + ring::auth::DEFAULT_REPLAY_WINDOW + Duration::from_secs(1);
    tokio::time::sleep_until(late.into()).await;
    let stale = rejected(&a, "stale").await;
    to_b.send_to(&latest, a_addr).await.unwrap();
    to_a.send_to(&latest, b_addr).await.unwrap(); // and to B, which never received it
    common::wait_until(
        "the late replays counted",
        Duration::from_secs(5),
        || async { rejected(&a, "stale").await > stale && rejected(&b, "stale").await > 0.0 },
    )
    .await;

    // Nothing moved: the ring and the usage views are as they were, and gossip still flows.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(views(&a).await, before_a);
    assert_eq!(views(&b).await, before_b);
    assert_eq!(
        rejected(&a, "key").await + rejected(&a, "format").await,
        0.0
    );
    relay_task.abort();
}

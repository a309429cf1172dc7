//! `--join` with a host name that resolves to many addresses, as a Kubernetes headless
//! Service's does, resolved again every `--join-refresh-interval`. Real `weir` processes on
//! 127.0.0.x, one gossip port for all (as pods share one); the name is resolved through
//! /etc/hosts by the system resolver, as in a pod. Each replica runs in its own mount namespace
//! (`unshare --mount`) with this test's hosts file bind-mounted over /etc/hosts, so the test
//! can change what the name resolves to without touching the machine's. That needs root, as
//! the chaos test's namespaces do. Without it, under CI (`CI` set) the test fails with the
//! reason, since CI runs as root; elsewhere it passes having checked nothing and says so on
//! the terminal, past cargo's capture (`common::cannot_run_here`).

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::fleet::{spawn_joining, until_healthy, Replica};

const NAME: &str = "weir-gossip.dns-test.svc";

fn can_unshare() -> bool {
    Command::new("unshare")
        .args(["--mount", "true"])
        .status()
        .is_ok_and(|status| status.success())
}

/// Rewrites the hosts file in place (same inode: the bind mounts see it) so `NAME` resolves
/// to `ips`.
fn resolve_name_to(hosts: &std::path::Path, ips: &[[u8; 4]]) {
    let mut text = String::from("127.0.0.1 localhost\n");
    for [a, b, c, d] in ips {
        text.push_str(&format!("{a}.{b}.{c}.{d} {NAME}\n"));
    }
    std::fs::write(hosts, text).unwrap();
}

fn replica(hosts: &std::path::Path, ip: [u8; 4], port: u16) -> Replica {
    let mut wrapper = Command::new("unshare");
    wrapper.args(["--mount", "--propagation", "private", "sh", "-c"]);
    wrapper.arg(r#"mount --bind "$0" /etc/hosts && exec "$@""#);
    wrapper.arg(hosts).arg(env!("CARGO_BIN_EXE_weir"));
    spawn_joining(
        wrapper,
        SocketAddr::from((ip, port)),
        &format!("{NAME}:{port}"),
        "dns",
        &["--join-refresh-interval", "1s", "--ring-join-timeout", "1s"],
    )
}

#[tokio::test]
async fn a_name_with_many_addresses_is_the_seed_list_and_is_resolved_again() {
    if !can_unshare() {
        common::cannot_run_here(
            "dns_discovery",
            "`unshare --mount` is not permitted here (needs root)",
        );
        return;
    }
    let ips = [[127, 0, 0, 2], [127, 0, 0, 3], [127, 0, 0, 4]];
    let port = common::ports::udp_port_on_all(&ips);
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");

    // The name lists only an address where nobody listens: two replicas start alone.
    resolve_name_to(&hosts, &[[127, 0, 0, 9]]);
    let a = replica(&hosts, ips[0], port);
    let b = replica(&hosts, ips[1], port);
    until_healthy(&[&a], 1, Duration::from_secs(5)).await;
    until_healthy(&[&b], 1, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        (a.healthy().await, b.healthy().await),
        (Some(1), Some(1)),
        "nothing joins them yet"
    );

    // The name now lists both (pods came up): each resolves it again and finds the other.
    resolve_name_to(&hosts, &ips);
    let changed = Instant::now();
    until_healthy(&[&a, &b], 2, Duration::from_secs(10)).await;
    let merged = changed.elapsed();
    eprintln!("two replicas found each other {merged:?} after the name changed");
    assert!(
        merged <= Duration::from_secs(4),
        "re-resolution every 1 s, merge took {merged:?}"
    );

    // A third replica resolves the name to all three at start and joins at once.
    let c = replica(&hosts, ips[2], port);
    let joined = until_healthy(&[&a, &b, &c], 3, Duration::from_secs(10)).await;
    eprintln!("a third replica was counted by all within {joined:?}");
    assert!(joined <= Duration::from_secs(3), "join took {joined:?}");
    assert_eq!(c.ready().await, Some(200));
    let members = a.ring().await.unwrap()["members"].as_array().unwrap().len();
    assert_eq!(members, 3);
}

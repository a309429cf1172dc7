//! Ports handed to another process (nginx, Prometheus, redis-server, a weir child).
//!
//! A port the kernel picks for `bind(…:0)` comes from the ephemeral range
//! (`net.ipv4.ip_local_port_range`, 32768–60999 by default), the same range it draws the
//! source ports of outgoing connections from. Once the probe socket is released, any
//! connection on the machine may take that port before the child binds it: CI saw Prometheus
//! fail with "bind: address already in use" that way. So these ports come from below the
//! ephemeral range, which outgoing connections never use, each one checked free on bind, and
//! never the same twice in one test process.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// Below the ephemeral range, in two halves. Redis servers take the lower half; everything else
/// the upper. Some test binaries hold two copies of this module (through `common` and through
/// `redis_server.rs`), each with its own counter, and the halves keep them apart. A Redis
/// Cluster node's bus listens 10 000 above its port, in the upper half: only the cluster
/// tests start nodes, and they hold one copy.
const LOW: u32 = 12_000;
const MIDDLE: u32 = 22_000;
const HIGH: u32 = 32_000;

/// A machine whose ephemeral range starts lower than usual may hand out the ports this module
/// picks to outgoing connections: say so, so that a bind failure that follows is explained.
fn check_ephemeral_range() {
    static CHECKED: OnceLock<()> = OnceLock::new();
    CHECKED.get_or_init(|| {
        let range =
            std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
        if let Some(low) = range
            .split_whitespace()
            .next()
            .and_then(|low| low.parse::<u32>().ok())
        {
            if low < HIGH {
                eprintln!(
                    "warning: the ephemeral port range starts at {low}, below {HIGH}: ports \
                     picked in {LOW}..{HIGH} for other processes may race outgoing connections"
                );
            }
        }
    });
}

fn next(low: u32, high: u32) -> u16 {
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    // Each test binary starts at its own place, so two test processes rarely probe the same
    // ports; the bind check settles the rest.
    let next = NEXT.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        AtomicU32::new(std::process::id().wrapping_mul(7_919).wrapping_add(nanos))
    });
    let span = high - low;
    low as u16 + (next.fetch_add(1, Ordering::Relaxed) % span) as u16
}

fn tcp_free(ip: [u8; 4], port: u16) -> bool {
    TcpListener::bind(SocketAddr::from((ip, port))).is_ok()
}

fn udp_free(ip: [u8; 4], port: u16) -> bool {
    UdpSocket::bind(SocketAddr::from((ip, port))).is_ok()
}

fn find(low: u32, high: u32, free: impl Fn(u16) -> bool) -> u16 {
    check_ephemeral_range();
    for _ in 0..10_000 {
        let port = next(low, high);
        if free(port) {
            return port;
        }
    }
    panic!("no free port in {low}..{high}");
}

/// A TCP address on 127.0.0.1 that is free.
pub fn tcp_addr() -> SocketAddr {
    let port = find(MIDDLE, HIGH, |port| tcp_free([127, 0, 0, 1], port));
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A UDP address on `ip` that is free.
pub fn udp_addr(ip: [u8; 4]) -> SocketAddr {
    SocketAddr::from((ip, find(MIDDLE, HIGH, |port| udp_free(ip, port))))
}

/// A UDP port free on every one of `ips`.
pub fn udp_port_on_all(ips: &[[u8; 4]]) -> u16 {
    find(MIDDLE, HIGH, |port| {
        ips.iter().all(|ip| udp_free(*ip, port))
    })
}

/// A TCP port on 127.0.0.1 for a `redis-server`.
pub fn redis_port() -> u16 {
    find(LOW, MIDDLE, |port| tcp_free([127, 0, 0, 1], port))
}

/// A TCP port for a Redis Cluster node: it and its bus port (10 000 above) are free.
pub fn cluster_port() -> u16 {
    find(LOW, MIDDLE, |port| {
        tcp_free([127, 0, 0, 1], port) && tcp_free([127, 0, 0, 1], port + 10_000)
    })
}

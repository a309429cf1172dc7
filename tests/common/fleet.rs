//! Real `weir` processes on 127.0.0.x, as an operator would run a fleet.

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Replica {
    pub child: Child,
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    pub started: Instant,
}

/// A free UDP port on `ip` for a replica's gossip (see `ports`).
pub fn free_gossip_addr(ip: [u8; 4]) -> SocketAddr {
    super::ports::udp_addr(ip)
}

/// The HTTP and gRPC addresses a `weir` child prints on its first two lines of stdout.
pub fn listening_addrs(child: &mut Child) -> (SocketAddr, SocketAddr) {
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
    let mut address = |prefixes: &[&str]| -> SocketAddr {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        prefixes
            .iter()
            .find_map(|prefix| line.strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("expected {prefixes:?}, got {line:?}"))
            .parse()
            .unwrap()
    };
    let http = address(&["weir listening on http://", "weir listening on https://"]);
    (http, address(&["weir gRPC on "]))
}

/// The HTTP address a `weir` child prints on its first line of stdout.
pub fn listening_addr(child: &mut Child) -> SocketAddr {
    listening_addrs(child).0
}

pub fn spawn(gossip: SocketAddr, seeds: &[SocketAddr], cluster: &str, extra: &[&str]) -> Replica {
    let join = seeds
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let weir = Command::new(env!("CARGO_BIN_EXE_weir"));
    spawn_joining(weir, gossip, &join, cluster, extra)
}

/// As [`spawn`], with `--join` as given (host names too), started by `command`: the `weir`
/// binary, or a wrapper that runs it with the arguments appended.
pub fn spawn_joining(
    mut command: Command,
    gossip: SocketAddr,
    join: &str,
    cluster: &str,
    extra: &[&str],
) -> Replica {
    let ip: IpAddr = gossip.ip();
    let started = Instant::now();
    let mut child = command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["--http-addr", &format!("{ip}:0")])
        .args(["--grpc-addr", &format!("{ip}:0")])
        .args(["--gossip-addr", &gossip.to_string()])
        .args(["--join", join])
        .args(["--cluster-id", cluster])
        .args(["--node-id", &format!("{cluster}-{gossip}")])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (http, grpc) = listening_addrs(&mut child);
    Replica {
        child,
        http,
        grpc,
        started,
    }
}

impl Replica {
    pub async fn ring(&self) -> Option<serde_json::Value> {
        let url = format!("http://{}/ring?format=json", self.http);
        reqwest::get(url).await.ok()?.json().await.ok()
    }

    pub async fn healthy(&self) -> Option<u64> {
        self.ring().await?["healthy"].as_u64()
    }

    pub async fn ready(&self) -> Option<u16> {
        let url = format!("http://{}/ready", self.http);
        Some(reqwest::get(url).await.ok()?.status().as_u16())
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until every replica reports `healthy`; returns how long that took.
pub async fn until_healthy(replicas: &[&Replica], healthy: u64, timeout: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let mut all = true;
        for replica in replicas {
            all &= replica.healthy().await == Some(healthy);
        }
        if all {
            return started.elapsed();
        }
        if started.elapsed() > timeout {
            let mut seen = Vec::new();
            for replica in replicas {
                seen.push(replica.healthy().await);
            }
            panic!("healthy never reached {healthy} within {timeout:?}: {seen:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One weir process with `overrides` as its runtime config, forwarding to `upstream`'s
/// `/api/v1/write`, gossiping alone on 127.0.0.`ip`, ready: the replica and its overrides'
/// directory (kept while the test runs).
pub async fn forwarding_to(
    upstream: SocketAddr,
    overrides: &str,
    ip: u8,
    cluster: &str,
    extra: &[&str],
) -> (Replica, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("overrides.yaml");
    std::fs::write(&path, overrides).unwrap();
    let upstream_url = format!("http://{upstream}/api/v1/write");
    let mut args = vec![
        "--runtime-config",
        path.to_str().unwrap(),
        "--upstream",
        &upstream_url,
    ];
    args.extend_from_slice(extra);
    let replica = spawn(free_gossip_addr([127, 0, 0, ip]), &[], cluster, &args);
    super::wait_until("weir is ready", Duration::from_secs(20), || async {
        replica.ready().await == Some(200)
    })
    .await;
    (replica, dir)
}

//! Real `redis-server` processes for tests, each on a free port, killed on drop.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    pub port: u16,
    child: Child,
    pub dir: tempfile::TempDir,
}

// Test binaries of the top-level crate load `ports.rs` through `common` too; the two copies
// keep apart by their port ranges (see the module).
#[allow(clippy::duplicate_mod)]
#[path = "../../tests/common/ports.rs"]
mod ports;

/// A free port for a `redis-server` (see `ports`: below the ephemeral range).
pub fn free_port() -> u16 {
    ports::redis_port()
}

/// A free port for a cluster node: its cluster bus listens 10 000 above it, so that port must
/// be free too.
pub fn free_cluster_port() -> u16 {
    ports::cluster_port()
}

fn redis_server() -> &'static str {
    for path in ["/usr/bin/redis-server", "/usr/local/bin/redis-server"] {
        if std::path::Path::new(path).exists() {
            return path;
        }
    }
    panic!("redis-server is not installed: run ./scripts/test, which installs it");
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(free_port(), &[])
    }

    pub fn start_with(port: u16, extra: &[&str]) -> RedisServer {
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new(redis_server())
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", dir.path().to_str().unwrap()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let server = RedisServer { port, child, dir };
        server.wait_ready();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.cli(&["PING"]) == "PONG" {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on {} did not start", self.port);
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn signal(&self, signal: &str) {
        Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A real Redis Cluster: `masters` masters with one replica each, on free ports.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start(masters: usize) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..masters * 2)
            .map(|_| {
                RedisServer::start_with(
                    free_cluster_port(),
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-node-timeout",
                        "1000",
                        // Replicas sync at once (Redis 7 waits 5 s by default), so a replica
                        // has the data and may be promoted as soon as the cluster is up.
                        "--repl-diskless-sync-delay",
                        "0",
                    ],
                )
            })
            .collect();
        for node in &nodes {
            // Each node writes its cluster config into its own directory.
            let _ = node;
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_ok();
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    pub fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let alive: Vec<&RedisServer> = self
                .nodes
                .iter()
                .filter(|node| node.child_alive())
                .collect();
            let ok = alive
                .iter()
                .all(|node| node.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"));
            // And every replica in sync with its master.
            let synced = alive.iter().all(|node| {
                let replication = node.cli(&["INFO", "replication"]);
                !replication.contains("role:slave") || replication.contains("master_link_status:up")
            });
            if ok && synced {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the cluster did not reach cluster_state:ok");
    }
}

impl RedisServer {
    fn child_alive(&self) -> bool {
        self.cli(&["PING"]) == "PONG"
    }
}

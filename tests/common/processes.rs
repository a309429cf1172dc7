//! Real programs (nginx, Prometheus, vmagent, weir) started by a test and stopped when it
//! ends, however it ends; and their logs shown when it fails.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;

/// The configs of the real clients and their balancer (`tests/real_clients/`).
pub const REAL_CLIENT_CONFIGS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/real_clients");

/// A child process stopped when the test ends: SIGTERM (nginx's master then stops its
/// workers; SIGKILL would orphan them), SIGKILL if it lingers past 5 s.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.0.try_wait() {
            return; // already ended (a test may kill it itself)
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Prints the last `lines` of each of `files` (under `dir`) if the test fails, since the
/// programs' logs say why.
pub struct DumpLogsOnFailure {
    pub dir: PathBuf,
    pub files: &'static [&'static str],
    pub lines: usize,
}

impl Drop for DumpLogsOnFailure {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for name in self.files {
            let text = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(self.lines).collect();
            eprintln!("--- {name} (last lines)");
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

/// The synthetic scrape target: `series` lines `synthetic{i="…"} 1`, or none once quiet.
pub struct Target {
    pub addr: SocketAddr,
    state: Arc<TargetState>,
    server: tokio::task::JoinHandle<()>,
}

pub struct TargetState {
    body: Bytes,
    quiet: AtomicBool,
    scrapes: AtomicU64,
}

impl Target {
    pub async fn serve(series: usize) -> Target {
        let mut body = String::with_capacity(series * 24);
        for i in 0..series {
            body.push_str(&format!("synthetic{{i=\"{i}\"}} 1\n"));
        }
        let state = Arc::new(TargetState {
            body: Bytes::from(body),
            quiet: AtomicBool::new(false),
            scrapes: AtomicU64::new(0),
        });
        let router = axum::Router::new()
            .route("/metrics", axum::routing::get(scrape))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        Target {
            addr,
            state,
            server,
        }
    }

    pub fn scrapes(&self) -> u64 {
        self.state.scrapes.load(Ordering::Relaxed)
    }

    pub fn quiet(&self) {
        self.state.quiet.store(true, Ordering::Relaxed);
    }

    /// Serves the series again after [`Target::quiet`].
    pub fn loud(&self) {
        self.state.quiet.store(false, Ordering::Relaxed);
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn scrape(
    State(state): State<Arc<TargetState>>,
) -> ([(&'static str, &'static str); 1], Bytes) {
    state.scrapes.fetch_add(1, Ordering::Relaxed);
    let body = if state.quiet.load(Ordering::Relaxed) {
        Bytes::new()
    } else {
        state.body.clone()
    };
    ([("content-type", "text/plain; version=0.0.4")], body)
}

/// Starts `command` with its stderr in `log`; stopped when the test ends, however it ends
/// (SIGKILL if it lingers past 5 s: Prometheus may try to flush its queue).
pub fn spawn_logged(command: &mut Command, log: &Path) -> Process {
    let log = std::fs::File::create(log).unwrap();
    Process(command.stdout(Stdio::null()).stderr(log).spawn().unwrap())
}

/// The program's path; a missing one fails the test under CI and skips it elsewhere.
pub fn require(program: &str) -> Option<PathBuf> {
    for dir in ["/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"] {
        let path = Path::new(dir).join(program);
        if path.exists() {
            return Some(path);
        }
    }
    let message = format!("`{program}` is not installed: run ./scripts/test, which installs it");
    if std::env::var_os("CI").is_some() {
        panic!("{message}");
    }
    eprintln!("skipped: {message}");
    None
}

/// A free TCP address on 127.0.0.1 for another process to listen on (see `ports`).
pub fn free_tcp() -> SocketAddr {
    super::ports::tcp_addr()
}

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A config from `tests/real_clients/` with its example addresses replaced.
pub fn real_client_config(name: &str, replacements: &[(&str, String)]) -> String {
    let mut text = std::fs::read_to_string(Path::new(REAL_CLIENT_CONFIGS).join(name)).unwrap();
    for (from, to) in replacements {
        assert!(text.contains(from), "{name} no longer mentions {from}");
        text = text.replace(from, to);
    }
    text
}

/// The `/metrics` page at `base`, empty when it cannot be read.
pub async fn metrics_page(base: &str) -> String {
    read_metrics_page(base).await.unwrap_or_default()
}

/// The `/metrics` page at `base`, or why it could not be read: the request failed, the answer
/// was not 200, or its body broke off.
pub async fn read_metrics_page(base: &str) -> Result<String, String> {
    let response = reqwest::get(format!("{base}/metrics"))
        .await
        .map_err(|err| format!("{base}/metrics: {err:?}"))?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("{base}/metrics answered {status}"));
    }
    response
        .text()
        .await
        .map_err(|err| format!("{base}/metrics: reading the body: {err:?}"))
}

/// The sum of the series of family `name` that carry every label in `labels`.
pub fn sum(page: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    page.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let rest = series.strip_prefix(name)?;
            let matches = (rest.is_empty() || rest.starts_with('{'))
                && labels.iter().all(|(label, value)| {
                    [
                        format!("{{{label}=\"{value}\""),
                        format!(",{label}=\"{value}\""),
                        format!(" {label}=\"{value}\""),
                    ]
                    .iter()
                    .any(|needle| rest.contains(needle.as_str()))
                });
            matches.then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}

/// nginx (`program`) in front of three weir replicas' HTTP addresses, with the real clients'
/// config (`tests/real_clients/nginx.conf`: round robin, `keepalive 16`, the access log of
/// pushes); its files in `dir/nginx`, its stderr in `dir/nginx.stderr`. Returns the address it
/// listens on, its directory (the access log is `access.log` there) and the process.
pub fn nginx_in_front(
    program: &Path,
    dir: &Path,
    replicas: [SocketAddr; 3],
) -> (SocketAddr, PathBuf, Process) {
    let addr = free_tcp();
    let nginx_dir = dir.join("nginx");
    std::fs::create_dir_all(&nginx_dir).unwrap();
    let config = real_client_config(
        "nginx.conf",
        &[
            ("127.0.0.1:9009", addr.to_string()),
            ("127.0.0.1:8081", replicas[0].to_string()),
            ("127.0.0.1:8082", replicas[1].to_string()),
            ("127.0.0.1:8083", replicas[2].to_string()),
        ],
    );
    let config = if is_root() {
        format!("user root;\n{config}")
    } else {
        config
    };
    std::fs::write(nginx_dir.join("nginx.conf"), config).unwrap();
    let process = spawn_logged(
        Command::new(program)
            .arg("-p")
            .arg(&nginx_dir)
            .arg("-c")
            .arg(nginx_dir.join("nginx.conf")),
        &dir.join("nginx.stderr"),
    );
    (addr, nginx_dir, process)
}

/// Runs `weir-admission-bench` in `mode` on tenant `t`'s `key` against `targets` (gRPC
/// `host:port`), `split` across them, and parses its JSON report.
pub async fn admission_bench(
    targets: &[String],
    mode: &str,
    key: &str,
    split: &str,
    args: &[String],
) -> serde_json::Value {
    let mut command = Command::new(env!("CARGO_BIN_EXE_weir-admission-bench"));
    command.arg(mode);
    for target in targets {
        command.args(["--target", target]);
    }
    command.args(["--split", split, "--tenant", "t", "--key", key]);
    command.args(args);
    let output = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

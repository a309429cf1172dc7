//! A real weir on 127.0.0.1:0 in this process, spoken to over real HTTP.
#![allow(dead_code)] // each test binary uses a different part of this

pub mod fleet;
pub mod ports;
pub mod processes;
pub mod receiver;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use engine::EngineClock;
use governor::clock::FakeRelativeClock;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use weir::config::Config;
use weir::remote_write::prompb::{Label, Sample, TimeSeries, WriteRequest};

pub struct Weir {
    pub addr: SocketAddr,
    /// Where it serves the admission API (gRPC).
    pub grpc: SocketAddr,
    pub overrides: PathBuf,
    pub clock: Option<FakeRelativeClock>,
    pub client: reqwest::Client,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<anyhow::Result<()>>>,
    _dir: tempfile::TempDir,
}

pub struct Options {
    pub overrides: String,
    /// Drive the limiter's clock by hand instead of the real one.
    pub manual_clock: bool,
    pub configure: Box<dyn FnOnce(&mut Config) + Send>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            overrides: String::new(),
            manual_clock: false,
            configure: Box::new(|_| {}),
        }
    }
}

/// A configuration for tests: the defaults, with HTTP, gRPC and gossip on ephemeral ports
/// and the overrides file given.
pub fn test_config(runtime_config: &std::path::Path) -> Config {
    let mut config = Config::load_from(["weir"]).expect("defaults are valid");
    config.http_addr = "127.0.0.1:0".parse().unwrap();
    config.gossip_addr = "127.0.0.1:0".parse().unwrap();
    config.grpc_addr = "127.0.0.1:0".parse().unwrap();
    config.runtime_config = Some(runtime_config.to_path_buf());
    // Tests of the limits see each refusal at once; holding has tests of its own.
    config.max_admission_delay = Duration::ZERO;
    config
}

impl Weir {
    pub async fn start(options: Options) -> Weir {
        let dir = tempfile::tempdir().unwrap();
        let overrides = dir.path().join("overrides.yaml");
        std::fs::write(&overrides, &options.overrides).unwrap();
        let mut config = test_config(&overrides);
        (options.configure)(&mut config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (clock, engine_clock) = if options.manual_clock {
            let clock = FakeRelativeClock::default();
            (Some(clock.clone()), EngineClock::Manual(clock))
        } else {
            (None, EngineClock::real())
        };
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(weir::server::run_with_clock(
            config,
            listener,
            async move {
                let _ = shutdown_rx.await;
            },
            engine_clock,
        ));
        let mut weir = Weir {
            addr,
            grpc: addr,
            overrides,
            clock,
            client: reqwest::Client::new(),
            shutdown: Some(shutdown_tx),
            handle: Some(handle),
            _dir: dir,
        };
        weir.wait_ready().await;
        let ring: serde_json::Value = weir
            .client
            .get(weir.url("/ring?format=json"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        weir.grpc = ring["grpc_addr"].as_str().unwrap().parse().unwrap();
        weir
    }

    pub async fn with_overrides(overrides: &str) -> Weir {
        Weir::start(Options {
            overrides: overrides.into(),
            ..Options::default()
        })
        .await
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(response) = self.client.get(self.url("/ready")).send().await {
                if response.status() == 200 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("weir did not become ready");
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn advance(&self, by: Duration) {
        self.clock.as_ref().expect("manual clock").advance(by);
    }

    /// Pushes a raw body for `tenant` (no header when `None`).
    pub async fn push_body(&self, tenant: Option<&str>, body: Vec<u8>) -> reqwest::Response {
        push_request(&self.client, &self.url(""), tenant, body)
            .send()
            .await
            .unwrap()
    }

    /// Pushes `series` series with one sample each.
    pub async fn push(&self, tenant: &str, series: usize) -> reqwest::Response {
        self.push_body(
            Some(tenant),
            WriteRequest::synthetic(series, 1, 1).encode_snappy(),
        )
        .await
    }

    pub async fn status(&self, tenant: &str, series: usize) -> u16 {
        self.push(tenant, series).await.status().as_u16()
    }

    /// The value of one series from /metrics, e.g. `weir_discarded_requests_total{reason="rate_limited",user="t"}`.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        metric_at(&self.client, &self.url(""), series).await
    }

    /// Polls `check` until it holds or `timeout` passes; returns whether it held.
    pub async fn eventually<F, Fut>(&self, timeout: Duration, mut check: F) -> bool
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            if check().await {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    pub async fn stop(mut self) -> anyhow::Result<()> {
        let _ = self.shutdown.take().unwrap().send(());
        self.handle.take().unwrap().await.unwrap()
    }
}

/// A hand-written HTTP/1.1 request on a raw socket, for what a client library will not do:
/// chunked bodies of a chosen shape, bodies sent slowly, bodies never finished.
pub struct RawRequest {
    stream: tokio::net::TcpStream,
}

impl RawRequest {
    pub async fn connect(addr: SocketAddr) -> RawRequest {
        RawRequest {
            stream: tokio::net::TcpStream::connect(addr).await.unwrap(),
        }
    }

    /// Headers of a push with a Content-Length of `length`; the body is sent separately.
    pub async fn start_push(addr: SocketAddr, tenant: &str, length: usize) -> RawRequest {
        let mut request = RawRequest::connect(addr).await;
        request
            .send(
                format!(
                    "POST /api/v1/push HTTP/1.1\r\nHost: weir\r\nX-Scope-OrgID: {tenant}\r\n\
                     Content-Length: {length}\r\nConnection: close\r\n\r\n"
                )
                .as_bytes(),
            )
            .await;
        request
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.stream.write_all(bytes).await.unwrap();
    }

    /// Sends, reporting whether the server still takes bytes (false once it has closed).
    pub async fn try_send(&mut self, bytes: &[u8]) -> bool {
        use tokio::io::AsyncWriteExt;
        self.stream.write_all(bytes).await.is_ok()
    }

    /// Reads the answer until the server closes the connection or 5 s pass.
    pub async fn response(mut self) -> String {
        use tokio::io::AsyncReadExt;
        let mut answer = Vec::new();
        let mut buffer = [0u8; 4096];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            match tokio::time::timeout_at(deadline, self.stream.read(&mut buffer)).await {
                Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
                Ok(Ok(n)) => {
                    answer.extend_from_slice(&buffer[..n]);
                    if answer.windows(4).any(|w| w == b"\r\n\r\n") && answer_complete(&answer) {
                        break;
                    }
                }
            }
        }
        String::from_utf8_lossy(&answer).into_owned()
    }
}

impl RawRequest {
    /// Reads everything until the server closes the connection, or `timeout` passes.
    pub async fn response_until_closed(mut self, timeout: Duration) -> String {
        use tokio::io::AsyncReadExt;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(timeout, self.stream.read_to_end(&mut answer)).await;
        String::from_utf8_lossy(&answer).into_owned()
    }
}

/// Whether a response with a Content-Length has all its body.
fn answer_complete(answer: &[u8]) -> bool {
    let text = String::from_utf8_lossy(answer);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    head.lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())
                .flatten()
        })
        .is_some_and(|length| body.len() >= length)
}

/// The value of one series from the /metrics of the weir at `base` (`http://host:port`), with
/// `client` (an HTTPS one where the weir serves TLS).
pub async fn metric_at(client: &reqwest::Client, base: &str, series: &str) -> Option<f64> {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().unwrap())
    })
}

/// Polls `check` every 25 ms until it holds; panics naming `what` once `timeout` has passed.
/// What a test waits on before a check, instead of a fixed sleep.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// For a test (or part of one) that cannot run on this machine, for want of root, `unshare`
/// or `ip netns`. Under CI (`CI` set, as CI services set it; weir's CI runs as root) that
/// fails the test with the reason. Elsewhere the test goes on without that part and says so
/// straight to stderr, which cargo does not capture and hide as it does `eprintln!`.
pub fn cannot_run_here(part: &str, reason: &str) {
    let ci = std::env::var("CI").is_ok_and(|value| !matches!(value.as_str(), "" | "0" | "false"));
    assert!(!ci, "CI must run {part}, and it cannot run here: {reason}");
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED {part}: {reason}. Nothing of it was checked; as root it runs, and with \
         CI set this fails. ***\n"
    );
}

/// Serves `app` on a free loopback port, in the background (a receiver standing in for an
/// upstream, a scrape target, …).
pub async fn serve_on_loopback(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A remote-write 1.0 push of `body` (snappy protobuf) to weir at `base`, for `tenant` (no
/// `X-Scope-OrgID` when `None`).
pub fn push_request(
    client: &reqwest::Client,
    base: &str,
    tenant: Option<&str>,
    body: Vec<u8>,
) -> reqwest::RequestBuilder {
    let request = client
        .post(format!("{base}/api/v1/push"))
        .header("Content-Encoding", "snappy")
        .header("Content-Type", "application/x-protobuf")
        .header("X-Prometheus-Remote-Write-Version", "0.1.0")
        .body(body);
    match tenant {
        Some(tenant) => request.header("X-Scope-OrgID", tenant),
        None => request,
    }
}

/// A 1.0 series with these labels, in the order given, and a sample of 1.0 at each timestamp.
pub fn series(labels: &[(&str, &str)], timestamps: &[i64]) -> TimeSeries {
    TimeSeries {
        labels: labels
            .iter()
            .map(|(name, value)| Label {
                name: name.to_string(),
                value: value.to_string(),
            })
            .collect(),
        samples: timestamps
            .iter()
            .map(|timestamp| Sample {
                value: 1.0,
                timestamp: *timestamp,
            })
            .collect(),
        ..TimeSeries::default()
    }
}

/// A forwarded 1.0 body, decompressed and decoded.
pub fn decoded(body: &[u8]) -> WriteRequest {
    let raw = snap::raw::Decoder::new().decompress_vec(body).unwrap();
    <WriteRequest as prost::Message>::decode(raw.as_slice()).unwrap()
}

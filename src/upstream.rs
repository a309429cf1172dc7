//! Forwarding admitted writes to a remote-write receiver (Prometheus, Mimir, VictoriaMetrics,
//! Thanos Receive), passing the client's compressed bytes through unchanged.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use axum::http::{header, HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;

mod pool;

pub use pool::Pool;

use crate::format::Format;
use crate::metrics::Metrics;
use crate::otlp::Compression;
use crate::remote_write::Written;
use crate::tls::{ClientFiles, ClientTls};

const USER_AGENT: HeaderValue =
    HeaderValue::from_static(concat!("weir/", env!("CARGO_PKG_VERSION")));

/// How a pool connects: TCP without Nagle's delay, then TLS for `https://`.
pub fn connector(timeout: Duration, tls: rustls::ClientConfig) -> pool::Connector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(timeout.min(Duration::from_secs(5))));
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http)
}

/// A worker's connections: to the remote-write URL and to the OTLP one.
struct Pools {
    push: Pool,
    otlp: Pool,
}

/// `workers + 1` of them: one per HTTP worker, then one for other threads. hyper's own
/// connections without reqwest's layers (redirects, retries, proxies, default headers): they
/// cost about a sixth of weir's CPU per forward, and a remote-write forward needs none of
/// them.
fn build_pools(
    workers: usize,
    timeout: Duration,
    tls: &ClientTls,
    uri: &Uri,
    otlp_uri: &Uri,
) -> anyhow::Result<Vec<Pools>> {
    let config = tls.client_config()?;
    (0..=workers)
        .map(|_| {
            let connector = connector(timeout, config.clone());
            let pool = |uri: &Uri| {
                Pool::new(connector.clone(), uri.clone())
                    .map_err(|err| anyhow::anyhow!("upstream {uri}: {err}"))
            };
            Ok(Pools {
                push: pool(uri)?,
                otlp: pool(otlp_uri)?,
            })
        })
        .collect()
}

/// The headers that matter to a receiver, written for the format weir read the body as, not
/// copied from the client: what weir charged is what the receiver is told it gets. A client's
/// `Content-Type: application/json; charset=utf-8`, `Content-Encoding: GZIP` or `proto=` with
/// a space before it is read as its format, and a receiver that matches these headers
/// exactly (Mimir does) must not refuse, after weir has charged it, what weir accepted.
fn forwarded_headers(format: Format) -> &'static [(&'static str, &'static str)] {
    match format {
        Format::V1 => &[
            ("content-encoding", "snappy"),
            ("content-type", "application/x-protobuf"),
            ("x-prometheus-remote-write-version", "0.1.0"),
        ],
        Format::V2 => &[
            ("content-encoding", "snappy"),
            (
                "content-type",
                "application/x-protobuf;proto=io.prometheus.write.v2.Request",
            ),
            ("x-prometheus-remote-write-version", "2.0.0"),
        ],
        Format::Otlp(otlp) => {
            const PROTOBUF: (&str, &str) = ("content-type", "application/x-protobuf");
            const JSON: (&str, &str) = ("content-type", "application/json");
            const GZIP: (&str, &str) = ("content-encoding", "gzip");
            const LZ4: (&str, &str) = ("content-encoding", "lz4");
            const ZSTD: (&str, &str) = ("content-encoding", "zstd");
            match (otlp.json, otlp.compression) {
                (false, Compression::None) => &[PROTOBUF],
                (true, Compression::None) => &[JSON],
                (false, Compression::Gzip) => &[GZIP, PROTOBUF],
                (true, Compression::Gzip) => &[GZIP, JSON],
                (false, Compression::Lz4) => &[LZ4, PROTOBUF],
                (true, Compression::Lz4) => &[LZ4, JSON],
                (false, Compression::Zstd) => &[ZSTD, PROTOBUF],
                (true, Compression::Zstd) => &[ZSTD, JSON],
            }
        }
    }
}

/// A forward's count in `weir_upstream_requests_total`, made when it ends however it ends.
struct Outcome<'a> {
    metrics: &'a Metrics,
    class: &'static str,
}

impl Drop for Outcome<'_> {
    fn drop(&mut self) {
        self.metrics
            .upstream_requests
            .with_label_values(&[self.class])
            .inc();
    }
}

/// Upstream answers kept in a pass-through body, at most.
const MAX_UPSTREAM_BODY: usize = 4096;

/// Why a forward did not end in a 2xx.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ForwardError {
    /// The receiver refused the data (4xx): the client must not retry it as is.
    #[error("{body}")]
    Rejected {
        status: StatusCode,
        body: String,
        /// The receiver's `Retry-After`, in seconds, if it gave one.
        retry_after: Option<u64>,
    },
    /// The receiver failed (5xx): worth a retry.
    #[error("the upstream receiver failed with {status}: {body}")]
    Failed {
        status: StatusCode,
        body: String,
        retry_after: Option<u64>,
    },
    #[error("the upstream receiver did not answer within {0:?}")]
    Timeout(Duration),
    #[error("cannot reach the upstream receiver: {0}")]
    Unreachable(String),
}

impl ForwardError {
    /// What the client is told: the receiver's own 4xx; 502 for a failed or unreachable
    /// receiver; 504 for one that did not answer in time. 5xx makes clients retry.
    pub fn status(&self) -> StatusCode {
        match self {
            ForwardError::Rejected { status, .. } => *status,
            ForwardError::Failed { .. } | ForwardError::Unreachable(_) => StatusCode::BAD_GATEWAY,
            ForwardError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The receiver wrote nothing and the client should send the push again: it failed
    /// (5xx), was unreachable, did not answer in time, or said 429. Such a push is not
    /// charged (see `push.rs`). A timeout may hide a write that happened: that data is then
    /// written twice and charged once. Any other 4xx refuses the data itself, which stays
    /// charged.
    pub fn wrote_nothing(&self) -> bool {
        match self {
            ForwardError::Rejected { status, .. } => *status == StatusCode::TOO_MANY_REQUESTS,
            ForwardError::Failed { .. }
            | ForwardError::Timeout(_)
            | ForwardError::Unreachable(_) => true,
        }
    }

    /// The receiver's own `Retry-After`, in seconds: when it will take data again is its
    /// to say.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ForwardError::Rejected { retry_after, .. }
            | ForwardError::Failed { retry_after, .. } => *retry_after,
            ForwardError::Timeout(_) | ForwardError::Unreachable(_) => None,
        }
    }

    fn class(&self) -> &'static str {
        match self {
            ForwardError::Rejected { .. } => "4xx",
            ForwardError::Failed { .. } => "5xx",
            ForwardError::Timeout(_) => "timeout",
            ForwardError::Unreachable(_) => "error",
        }
    }
}

pub struct Upstream {
    /// Connections per HTTP worker thread (and one set for any other thread), so that a
    /// forward runs on the thread of its request: a connection's task lives on the runtime
    /// that opened it. Rebuilt when the TLS files change; requests in flight finish on the
    /// old ones.
    pools: ArcSwap<Vec<Pools>>,
    workers: usize,
    tls: ClientTls,
    tls_files: ClientFiles,
    url: url::Url,
    /// Where OTLP exports go (`--upstream-otlp`).
    otlp_url: url::Url,
    /// The two URLs again, as hyper takes them.
    uri: Uri,
    otlp_uri: Uri,
    tenant_header: HeaderName,
    timeout: Duration,
}

impl Upstream {
    pub fn new(
        url: &str,
        otlp_url: Option<&str>,
        timeout: Duration,
        tenant_header: &str,
        tls: ClientTls,
        workers: usize,
    ) -> anyhow::Result<Self> {
        let url = url::Url::parse(url)
            .map_err(|err| anyhow::anyhow!("--upstream {url:?} is not a URL: {err}"))?;
        anyhow::ensure!(
            matches!(url.scheme(), "http" | "https"),
            "--upstream must be an http:// or https:// URL, got {url}"
        );
        let otlp_url = match otlp_url {
            Some(otlp) => url::Url::parse(otlp)
                .map_err(|err| anyhow::anyhow!("--upstream-otlp {otlp:?} is not a URL: {err}"))?,
            None => default_otlp_url(&url),
        };
        anyhow::ensure!(
            matches!(otlp_url.scheme(), "http" | "https"),
            "--upstream-otlp must be an http:// or https:// URL, got {otlp_url}"
        );
        let tenant_header = HeaderName::from_bytes(tenant_header.as_bytes()).map_err(|_| {
            anyhow::anyhow!("--upstream-tenant-header {tenant_header:?} is not a header name")
        })?;
        let as_uri = |url: &url::Url| {
            url.as_str()
                .parse::<Uri>()
                .map_err(|err| anyhow::anyhow!("{url} is not a URL hyper takes: {err}"))
        };
        let (uri, otlp_uri) = (as_uri(&url)?, as_uri(&otlp_url)?);
        let pools = build_pools(workers, timeout, &tls, &uri, &otlp_uri)?;
        Ok(Upstream {
            pools: ArcSwap::from_pointee(pools),
            workers,
            uri,
            otlp_uri,
            tls_files: tls.watch(),
            tls,
            url,
            otlp_url,
            tenant_header,
            timeout,
        })
    }

    /// Rebuilds the client if its CA or client certificate files changed; on error the last
    /// good client stays.
    pub fn reload_tls_if_changed(&self) {
        if !self.tls_files.changed() {
            return;
        }
        match build_pools(
            self.workers,
            self.timeout,
            &self.tls,
            &self.uri,
            &self.otlp_uri,
        ) {
            Ok(pools) => {
                self.pools.store(Arc::new(pools));
                tracing::info!("reloaded the upstream TLS files");
            }
            Err(err) => tracing::error!(
                error = format!("{err:#}"),
                "the new upstream TLS files do not load; keeping the last good ones"
            ),
        }
    }

    pub fn url(&self) -> &url::Url {
        &self.url
    }

    pub fn otlp_url(&self) -> &url::Url {
        &self.otlp_url
    }

    /// Sends `body` (the client's bytes, or weir's edit of them) for `tenant`, as `format`,
    /// and maps the answer. On
    /// success, what the receiver says it wrote, if it says (remote-write 2.0 receivers do).
    pub async fn forward(
        &self,
        tenant: &str,
        format: Format,
        body: Bytes,
        metrics: &Metrics,
    ) -> Result<Option<Written>, ForwardError> {
        let started = Instant::now();
        // Dropped before the answer (the client hung up): counted as abandoned.
        let mut outcome = Outcome {
            metrics,
            class: "abandoned",
        };
        let result = self.send(tenant, format, body).await;
        outcome.class = match &result {
            Ok(_) => "2xx",
            Err(err) => err.class(),
        };
        drop(outcome);
        metrics
            .upstream_duration
            .observe(started.elapsed().as_secs_f64());
        result
    }

    async fn send(
        &self,
        tenant: &str,
        format: Format,
        body: Bytes,
    ) -> Result<Option<Written>, ForwardError> {
        let otlp = matches!(format, Format::Otlp(_));
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        let headers = request.headers_mut();
        headers.insert(header::USER_AGENT, USER_AGENT);
        for &(name, value) in forwarded_headers(format) {
            headers.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let tenant = HeaderValue::from_str(tenant).map_err(|_| {
            ForwardError::Unreachable(format!("the tenant ID {tenant:?} is not a header value"))
        })?;
        headers.insert(self.tenant_header.clone(), tenant);

        let pools = self.pools.load();
        let pools = &pools
            [crate::http_serve::current_worker().map_or(0, |worker| worker + 1) % pools.len()];
        let pool = if otlp { &pools.otlp } else { &pools.push };
        let exchange = async {
            let (response, lease) = pool
                .send(request)
                .await
                .map_err(|err| transport_error(&*err))?;
            let status = response.status();
            // Delta-seconds only; an HTTP date is left to the client's own backoff.
            let retry_after = response
                .headers()
                .get(header::RETRY_AFTER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.trim().parse::<u64>().ok());
            let written = if status.is_success() && !otlp {
                Written::from_headers(response.headers())
            } else {
                None
            };
            // Read to its end, so the connection goes back to the pool; a refusal's first
            // bytes are kept for the client.
            let keep = if status.is_success() {
                0
            } else {
                MAX_UPSTREAM_BODY
            };
            let body = read_body(response.into_body(), keep).await?;
            lease.finished();
            Ok((status, written, body, retry_after))
        };
        let (status, written, body, retry_after) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| ForwardError::Timeout(self.timeout))??;
        if status.is_success() {
            return Ok(written);
        }
        let body = String::from_utf8_lossy(&body).trim_end().to_string();
        if status.is_client_error() {
            Err(ForwardError::Rejected {
                status,
                body,
                retry_after,
            })
        } else {
            Err(ForwardError::Failed {
                status,
                body,
                retry_after,
            })
        }
    }
}

/// Reads an upstream answer's body to its end, keeping its first `keep` bytes.
async fn read_body(mut body: hyper::body::Incoming, keep: usize) -> Result<Vec<u8>, ForwardError> {
    let mut kept = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|err| transport_error(&err))?;
        if let Some(data) = frame.data_ref() {
            let room = keep.saturating_sub(kept.len());
            kept.extend_from_slice(&data[..data.len().min(room)]);
        }
    }
    Ok(kept)
}

/// A transport failure, with its source chain: that says why (refused, reset, DNS); the top
/// level rarely does.
fn transport_error(err: &dyn std::error::Error) -> ForwardError {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        message = format!("{message}: {cause}");
        source = cause.source();
    }
    ForwardError::Unreachable(message)
}

/// `--upstream-otlp`'s default, from `--upstream`: Mimir's `/api/v1/push` → `/otlp/v1/metrics`;
/// Prometheus' `/api/v1/write` → `/api/v1/otlp/v1/metrics`; any other path → `/otlp/v1/metrics`
/// on the same host.
pub fn default_otlp_url(upstream: &url::Url) -> url::Url {
    let mut url = upstream.clone();
    let path = upstream.path();
    let otlp = match path.strip_suffix("/api/v1/write") {
        Some(prefix) => format!("{prefix}/api/v1/otlp/v1/metrics"),
        None => match path.strip_suffix("/api/v1/push") {
            Some(prefix) => format!("{prefix}/otlp/v1/metrics"),
            None => "/otlp/v1/metrics".to_string(),
        },
    };
    url.set_path(&otlp);
    url.set_query(None);
    url
}

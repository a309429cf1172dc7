//! Forwarding admitted writes to a remote-write receiver (Prometheus, Mimir, VictoriaMetrics,
//! Thanos Receive), passing the client's compressed bytes through unchanged.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use bytes::Bytes;

use crate::metrics::Metrics;
use crate::remote_write::{Format, Written};
use crate::tls::{ClientFiles, ClientTls};

/// One pooled client: keep-alive connections are reused across requests and tenants.
fn build_client(timeout: Duration, tls: &ClientTls) -> anyhow::Result<reqwest::Client> {
    let builder = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(5)))
        .pool_idle_timeout(Duration::from_secs(90))
        .tcp_nodelay(true)
        .user_agent(concat!("weir/", env!("CARGO_PKG_VERSION")));
    Ok(tls.apply(builder)?.build()?)
}

/// `workers + 1` clients: one per HTTP worker, then one for other threads.
fn build_clients(
    workers: usize,
    timeout: Duration,
    tls: &ClientTls,
) -> anyhow::Result<Vec<reqwest::Client>> {
    (0..=workers).map(|_| build_client(timeout, tls)).collect()
}

/// The headers that matter to a remote-write receiver, with what to send when the client
/// did not say.
const PASSED_THROUGH: &[(&str, Option<&str>)] = &[
    ("content-encoding", Some("snappy")),
    ("content-type", Some("application/x-protobuf")),
    ("x-prometheus-remote-write-version", Some("0.1.0")),
];

/// An OTLP export's: its own `Content-Type` and `Content-Encoding`, only when it sent them.
const OTLP_PASSED_THROUGH: &[(&str, Option<&str>)] =
    &[("content-encoding", None), ("content-type", None)];

/// Upstream answers kept in a pass-through body, at most.
const MAX_UPSTREAM_BODY: usize = 4096;

/// Why a forward did not end in a 2xx.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ForwardError {
    /// The receiver refused the data (4xx): the client must not retry it as is.
    #[error("{body}")]
    Rejected { status: StatusCode, body: String },
    /// The receiver failed (5xx): worth a retry.
    #[error("the upstream remote-write receiver failed with {status}: {body}")]
    Failed { status: StatusCode, body: String },
    #[error("the upstream remote-write receiver did not answer within {0:?}")]
    Timeout(Duration),
    #[error("cannot reach the upstream remote-write receiver: {0}")]
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
    /// One pool per HTTP worker thread (and one for any other thread), so that a forward runs
    /// on the thread of its request: a connection's task lives on the runtime that opened it.
    /// Rebuilt when the TLS files change; requests in flight finish on the old ones.
    clients: ArcSwap<Vec<reqwest::Client>>,
    workers: usize,
    tls: ClientTls,
    tls_files: ClientFiles,
    url: reqwest::Url,
    /// Where OTLP exports go (`--upstream-otlp`).
    otlp_url: reqwest::Url,
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
        let url = reqwest::Url::parse(url)
            .map_err(|err| anyhow::anyhow!("--upstream {url:?} is not a URL: {err}"))?;
        anyhow::ensure!(
            matches!(url.scheme(), "http" | "https"),
            "--upstream must be an http:// or https:// URL, got {url}"
        );
        let otlp_url = match otlp_url {
            Some(otlp) => reqwest::Url::parse(otlp)
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
        let clients = build_clients(workers, timeout, &tls)?;
        Ok(Upstream {
            clients: ArcSwap::from_pointee(clients),
            workers,
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
        match build_clients(self.workers, self.timeout, &self.tls) {
            Ok(clients) => {
                self.clients.store(Arc::new(clients));
                tracing::info!("reloaded the upstream TLS files");
            }
            Err(err) => tracing::error!(
                error = format!("{err:#}"),
                "the new upstream TLS files do not load; keeping the last good ones"
            ),
        }
    }

    pub fn url(&self) -> &reqwest::Url {
        &self.url
    }

    pub fn otlp_url(&self) -> &reqwest::Url {
        &self.otlp_url
    }

    /// Sends `body` (the client's bytes, unchanged) for `tenant`, and maps the answer. On
    /// success, what the receiver says it wrote, if it says (remote-write 2.0 receivers do).
    pub async fn forward(
        &self,
        tenant: &str,
        format: Format,
        client_headers: &HeaderMap,
        body: Bytes,
        metrics: &Metrics,
    ) -> Result<Option<Written>, ForwardError> {
        let started = Instant::now();
        let result = self.send(tenant, format, client_headers, body).await;
        let class = match &result {
            Ok(_) => "2xx",
            Err(err) => err.class(),
        };
        metrics.upstream_requests.with_label_values(&[class]).inc();
        metrics
            .upstream_duration
            .observe(started.elapsed().as_secs_f64());
        result
    }

    async fn send(
        &self,
        tenant: &str,
        format: Format,
        client_headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Option<Written>, ForwardError> {
        let otlp = matches!(format, Format::Otlp(_));
        let (url, passed_through) = if otlp {
            (&self.otlp_url, OTLP_PASSED_THROUGH)
        } else {
            (&self.url, PASSED_THROUGH)
        };
        let clients = self.clients.load();
        let client = &clients
            [crate::http_serve::current_worker().map_or(0, |worker| worker + 1) % clients.len()];
        let mut request = client.post(url.clone()).body(body);
        for &(name, default) in passed_through {
            let value = match (client_headers.get(name), default) {
                (Some(value), _) => value.clone(),
                (None, Some(default)) => HeaderValue::from_static(default),
                (None, None) => continue,
            };
            request = request.header(name, value);
        }
        request = request.header(self.tenant_header.clone(), tenant);
        let response = request
            .send()
            .await
            .map_err(|err| self.transport_error(err))?;
        let status = response.status();
        if status.is_success() {
            let written = if otlp {
                None
            } else {
                Written::from_headers(response.headers())
            };
            // Drain the body so the connection goes back to the pool.
            let _ = response.bytes().await;
            return Ok(written);
        }
        let body = match response.bytes().await {
            Ok(bytes) => String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_UPSTREAM_BODY)])
                .trim_end()
                .to_string(),
            Err(err) => return Err(self.transport_error(err)),
        };
        let status = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
        if status.is_client_error() {
            Err(ForwardError::Rejected { status, body })
        } else {
            Err(ForwardError::Failed { status, body })
        }
    }

    fn transport_error(&self, err: reqwest::Error) -> ForwardError {
        if err.is_timeout() {
            ForwardError::Timeout(self.timeout)
        } else {
            // The source chain says why (refused, reset, DNS); the top level rarely does.
            let mut message = err.to_string();
            let mut source = std::error::Error::source(&err);
            while let Some(cause) = source {
                message = format!("{message}: {cause}");
                source = cause.source();
            }
            ForwardError::Unreachable(message)
        }
    }
}

/// `--upstream-otlp`'s default, from `--upstream`: Mimir's `/api/v1/push` → `/otlp/v1/metrics`;
/// Prometheus' `/api/v1/write` → `/api/v1/otlp/v1/metrics`; any other path → `/otlp/v1/metrics`
/// on the same host.
pub fn default_otlp_url(upstream: &reqwest::Url) -> reqwest::Url {
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

//! The HTTP listener, hardened: what `axum::serve` does (HTTP/1.1 and HTTP/2 on one port,
//! graceful shutdown), plus the bounds a server facing untrusted clients needs, each a flag:
//!
//! - `--http-header-read-timeout`: a client has this long to send a request's headers, and an
//!   idle keep-alive connection is closed after it (hyper starts the timer whenever it waits
//!   for a request head). A slowloris holds nothing for long.
//! - `--http-max-header-bytes`: the most a request head (HTTP/1.1 read buffer, HTTP/2 header
//!   list) may take; beyond it, 431 or a closed connection.
//! - `--http-max-connections`: connections open at once; past it a new one is closed at once
//!   (counted in `weir_http_refused_connections_total`), so a flood cannot exhaust memory or
//!   file descriptors.
//! - `--http2-max-concurrent-streams` (256): requests one HTTP/2 connection may have in
//!   flight; HTTP/2 pings go out at the header timeout.
//! - With TLS (`--http-tls-cert-file`), the handshake must also finish within the header
//!   read timeout.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    pub header_read_timeout: Duration,
    pub max_header_bytes: usize,
    /// 0: no cap.
    pub max_connections: usize,
    pub http2_max_concurrent_streams: u32,
}

/// The listener's metrics: connections refused at the cap, and open now.
pub struct ConnectionCounters {
    pub refused: prometheus::IntCounter,
    pub open: prometheus::IntGauge,
}

/// Serves `router` on `listener` until `stop` resolves, then stops accepting and waits for the
/// open connections to finish their requests (each closes once its current request is
/// answered).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    tls: Option<TlsAcceptor>,
    counters: ConnectionCounters,
    stop: impl Future<Output = ()>,
) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(limits.max_header_bytes.min(u32::MAX as usize) as u32)
        .max_concurrent_streams(limits.http2_max_concurrent_streams)
        .keep_alive_interval(limits.header_read_timeout)
        .keep_alive_timeout(limits.header_read_timeout);
    let slots = Arc::new(Semaphore::new(if limits.max_connections == 0 {
        Semaphore::MAX_PERMITS
    } else {
        limits.max_connections
    }));
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => break,
        };
        let (stream, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                tracing::warn!(%err, "accepting an HTTP connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            counters.refused.inc();
            tracing::debug!(%remote, "refusing a connection: --http-max-connections reached");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (builder, router, watcher) = (builder.clone(), router.clone(), graceful.watcher());
        let tls = tls.clone();
        let open = counters.open.clone();
        open.inc();
        tokio::spawn(async move {
            let served = match tls {
                None => serve_connection(stream, builder, router, watcher).await,
                Some(tls) => {
                    match tokio::time::timeout(limits.header_read_timeout, tls.accept(stream)).await
                    {
                        Ok(Ok(stream)) => serve_connection(stream, builder, router, watcher).await,
                        Ok(Err(err)) => Err(err.into()),
                        Err(_) => Err("no TLS handshake within --http-header-read-timeout".into()),
                    }
                }
            };
            if let Err(err) = served {
                tracing::debug!(%remote, %err, "HTTP connection ended with an error");
            }
            drop(slot);
            open.dec();
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

type ConnectionError = Box<dyn std::error::Error + Send + Sync>;

async fn serve_connection<S>(
    stream: S,
    builder: Builder<TokioExecutor>,
    router: Router,
    watcher: Watcher,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let connection = builder
        .serve_connection_with_upgrades(TokioIo::new(stream), TowerToHyperService::new(router))
        .into_owned();
    watcher.watch(connection).await
}

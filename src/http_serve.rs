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
//!
//! Connections are served on `--http-workers` threads (one per core by default), each running
//! its own current-thread runtime; the accept loop hands each new connection to the worker
//! with the fewest open. A request, its forward upstream (each worker has its own pool, see
//! [`current_worker`]) and its answer then run on one thread, with no hand-off between
//! threads: on the multi-threaded runtime the idle worker was woken to steal about twice a
//! request, which cost about a fifth of weir's CPU at moderate load (docs/performance.md, "CPU per
//! sample").

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    pub header_read_timeout: Duration,
    pub max_header_bytes: usize,
    /// 0: no cap.
    pub max_connections: usize,
    pub http2_max_concurrent_streams: u32,
    /// Threads serving connections, at least 1.
    pub workers: usize,
    /// Whether each is pinned to a core of its own.
    pub pin_workers: crate::affinity::PinWorkers,
}

/// The listener's metrics: connections refused at the cap, and open now.
pub struct ConnectionCounters {
    pub refused: prometheus::IntCounter,
    pub open: prometheus::IntGauge,
    /// Told each worker runtime's handle once it starts (to count the tasks on it).
    pub on_worker: Option<Arc<dyn Fn(tokio::runtime::Handle) + Send + Sync>>,
}

/// Serves `router` on `listener` until `stop` resolves, then stops accepting and waits for the
/// open connections to finish their requests (each closes once its current request is
/// answered). Fails only if the worker threads cannot start.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    tls: Option<TlsAcceptor>,
    counters: ConnectionCounters,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let mut workers = Workers::start(limits.workers, limits.pin_workers)?;
    if let Some(on_worker) = &counters.on_worker {
        for worker in &workers.workers {
            on_worker(worker.handle.clone());
        }
    }
    let mut builder = Builder::new(workers.stream_executor());
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
        // Off this runtime's reactor, onto the worker's.
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(err) => {
                tracing::debug!(%remote, %err, "cannot hand a connection to a worker");
                continue;
            }
        };
        let (builder, router, watcher) = (builder.clone(), router.clone(), graceful.watcher());
        let tls = tls.clone();
        let worker = workers.pick();
        let guard = ConnectionGuard::new(slot, counters.open.clone(), &worker.connections);
        // Shutdown waits for every watcher: this one is dropped after the guard (locals drop in
        // reverse order), so a stopped server has counted its connections closed.
        let hold = graceful.watcher();
        worker.handle.spawn(async move {
            let _hold = hold;
            let _guard = guard;
            let stream = match TcpStream::from_std(stream) {
                Ok(stream) => stream,
                Err(err) => {
                    tracing::debug!(%remote, %err, "cannot register a connection");
                    return;
                }
            };
            let served = match tls {
                None => {
                    let peer = crate::auth::Peer::with_certificates(Some(remote), None);
                    serve_connection(stream, builder, router, watcher, peer).await
                }
                Some(tls) => {
                    match tokio::time::timeout(limits.header_read_timeout, tls.accept(stream)).await
                    {
                        Ok(Ok(stream)) => {
                            // A client certificate here was verified in the handshake
                            // (--http-tls-client-ca-file); its names are read once.
                            let peer = crate::auth::Peer::with_certificates(
                                Some(remote),
                                stream.get_ref().1.peer_certificates(),
                            );
                            serve_connection(stream, builder, router, watcher, peer).await
                        }
                        Ok(Err(err)) => Err(err.into()),
                        Err(_) => Err("no TLS handshake within --http-header-read-timeout".into()),
                    }
                }
            };
            if let Err(err) = served {
                tracing::debug!(%remote, %err, "HTTP connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

thread_local! {
    static WORKER: Cell<Option<usize>> = const { Cell::new(None) };
}

/// A request whose body is sent with a transfer coding other than `chunked` alone (`gzip,
/// chunked`): hyper frames the body by its last coding and hands over the gzip bytes as if
/// they were the body, which then read as a bad snappy block or bad JSON, naming the wrong
/// fault. RFC 9112 says a server that does not understand a transfer coding should answer
/// 501, and Go's server (so Mimir's) does: 501 "Unsupported transfer encoding", the value
/// not echoed, and the connection closed, as the body's framing cannot be trusted.
pub fn unsupported_transfer_coding(
    headers: &axum::http::HeaderMap,
) -> Option<axum::response::Response> {
    use axum::http::{header, StatusCode};
    use axum::response::IntoResponse;
    let codings = headers.get_all(header::TRANSFER_ENCODING);
    let mut codings = codings.iter();
    let only_chunked = match (codings.next(), codings.next()) {
        (None, _) => return None,
        (Some(value), None) => value
            .to_str()
            .is_ok_and(|value| value.trim().eq_ignore_ascii_case("chunked")),
        (Some(_), Some(_)) => false,
    };
    if only_chunked {
        return None;
    }
    Some(
        (
            StatusCode::NOT_IMPLEMENTED,
            [(header::CONNECTION, "close")],
            "Unsupported transfer encoding: only chunked is read\n",
        )
            .into_response(),
    )
}

/// [`unsupported_transfer_coding`] as a route layer, for the routes that read a body.
pub async fn only_chunked_transfer_coding(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    match unsupported_transfer_coding(request.headers()) {
        Some(refused) => refused,
        None => next.run(request).await,
    }
}

/// Which HTTP worker this thread is, if it is one. Per-worker state (the forwarding client's
/// connection pool) is kept apart by it, so that a request never waits on another thread.
pub fn current_worker() -> Option<usize> {
    WORKER.with(Cell::get)
}

/// The period of a timer each worker keeps pending, so that a request's own timer (the
/// forward's `--upstream-timeout`, longer than this) is never the earliest on its worker.
/// tokio wakes a runtime's driver whenever a new timer is due before every pending one: an
/// eventfd write, then an `epoll_wait` that returns at once. Without this timer a worker has
/// none pending between requests, so nearly every forward paid both (765 writes in 800
/// forwards at 200 requests/s, traced to `time::Handle::reregister`); with it, a worker wakes
/// once a period.
const TIMER_ANCHOR: Duration = Duration::from_secs(1);

/// The `--http-workers` threads, each running a current-thread runtime until dropped.
/// `weir-bare-forward`, the floor under the push path, runs on the same threads.
pub struct Workers {
    workers: Vec<Worker>,
    /// Where the search for the least-loaded worker starts: ties rotate.
    next: usize,
}

struct Worker {
    handle: tokio::runtime::Handle,
    /// Connections open on this worker.
    connections: Arc<AtomicUsize>,
    /// Dropped with the worker: its thread then leaves `block_on`, and dropping its runtime
    /// cancels what is left on it.
    _stop: oneshot::Sender<()>,
}

impl Workers {
    /// `count` workers (at least one), pinned to cores as `pin` and the machine say.
    pub fn start(count: usize, pin: crate::affinity::PinWorkers) -> std::io::Result<Workers> {
        let count = count.max(1);
        let cpus = crate::affinity::plan(
            pin,
            &crate::affinity::allowed_cpus(),
            crate::affinity::online_cpus(),
            count,
        );
        match &cpus {
            Some(cpus) => tracing::info!(?cpus, "HTTP workers pinned, one to each of these CPUs"),
            None => tracing::debug!(?pin, "HTTP workers not pinned"),
        }
        let mut workers = Vec::with_capacity(count);
        for index in 0..count {
            let cpu = cpus.as_ref().map(|cpus| cpus[index]);
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let handle = runtime.handle().clone();
            let (stop, mut stopped) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("weir-http-{index}"))
                .spawn(move || {
                    WORKER.with(|worker| worker.set(Some(index)));
                    if let Some(cpu) = cpu {
                        if let Err(err) = crate::affinity::pin_current_thread(cpu) {
                            tracing::warn!(%err, cpu, "cannot pin HTTP worker {index}; it runs unpinned");
                        }
                    }
                    runtime.block_on(async {
                        let mut anchor = tokio::time::interval(TIMER_ANCHOR);
                        anchor.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        loop {
                            tokio::select! {
                                _ = &mut stopped => break,
                                _ = anchor.tick() => {}
                            }
                        }
                    });
                })?;
            workers.push(Worker {
                handle,
                connections: Arc::default(),
                _stop: stop,
            });
        }
        Ok(Workers { workers, next: 0 })
    }

    /// Where HTTP/2 streams run.
    fn stream_executor(&self) -> StreamExecutor {
        StreamExecutor {
            handles: self
                .workers
                .iter()
                .map(|worker| worker.handle.clone())
                .collect(),
            next: Arc::default(),
        }
    }

    /// The runtime of the worker with the fewest open connections: where the next one goes.
    pub fn least_busy(&mut self) -> &tokio::runtime::Handle {
        &self.pick().handle
    }

    /// The worker with the fewest open connections.
    fn pick(&mut self) -> &Worker {
        let count = self.workers.len();
        let start = self.next;
        self.next = (self.next + 1) % count;
        let index = (0..count)
            .map(|offset| (start + offset) % count)
            .min_by_key(|&index| self.workers[index].connections.load(Ordering::Relaxed))
            .unwrap_or(0);
        &self.workers[index]
    }
}

/// Runs HTTP/2 streams on the workers in turn, so that one HTTP/2 connection carrying many
/// requests at once (a proxy's, say) uses every core, as HTTP/1.1 clients do by opening many
/// connections. A stream then crosses threads to reach its connection, as every request did
/// on the work-stealing runtime. HTTP/1.1 spawns nothing.
#[derive(Clone)]
struct StreamExecutor {
    handles: Arc<[tokio::runtime::Handle]>,
    next: Arc<AtomicUsize>,
}

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        self.handles[index].spawn(future);
    }
}

/// A connection's share of the listener's bounds, given back when the connection ends however
/// it ends (its task may be cancelled with its worker).
struct ConnectionGuard {
    _slot: OwnedSemaphorePermit,
    open: prometheus::IntGauge,
    connections: Arc<AtomicUsize>,
}

impl ConnectionGuard {
    fn new(
        slot: OwnedSemaphorePermit,
        open: prometheus::IntGauge,
        connections: &Arc<AtomicUsize>,
    ) -> Self {
        open.inc();
        connections.fetch_add(1, Ordering::Relaxed);
        ConnectionGuard {
            _slot: slot,
            open,
            connections: Arc::clone(connections),
        }
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.open.dec();
        self.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

type ConnectionError = Box<dyn std::error::Error + Send + Sync>;

async fn serve_connection<S>(
    stream: S,
    builder: Builder<StreamExecutor>,
    router: Router,
    watcher: Watcher,
    peer: crate::auth::Peer,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use tower::ServiceExt;
    // Every request carries its connection's peer (address, client certificate) for
    // tenant authentication (crate::auth).
    let service = router.map_request(move |mut request: axum::http::Request<_>| {
        request.extensions_mut().insert(peer.clone());
        request
    });
    let connection = builder
        .serve_connection_with_upgrades(TokioIo::new(stream), TowerToHyperService::new(service))
        .into_owned();
    watcher.watch(connection).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Sends one HTTP/1.1 GET on a kept-alive connection and returns the body.
    async fn get_on(stream: &mut TcpStream) -> String {
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: weir\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let mut buffer = [0u8; 1024];
        loop {
            let read = stream.read(&mut buffer).await.unwrap();
            assert!(read > 0, "the connection closed mid-answer");
            answer.extend_from_slice(&buffer[..read]);
            let text = String::from_utf8_lossy(&answer).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                assert!(head.starts_with("HTTP/1.1 200"), "{head}");
                let length: usize = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length: "))
                    .expect("a content-length")
                    .parse()
                    .unwrap();
                if body.len() >= length {
                    return body[..length].to_string();
                }
            }
        }
    }

    /// `serve` on a loopback port with 3 workers: its address, its open-connections gauge,
    /// what stops it, and its task.
    async fn serve_on_three_workers(
        router: Router,
    ) -> (
        std::net::SocketAddr,
        prometheus::IntGauge,
        oneshot::Sender<()>,
        tokio::task::JoinHandle<std::io::Result<()>>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let limits = HttpLimits {
            header_read_timeout: Duration::from_secs(5),
            max_header_bytes: 8192,
            max_connections: 0,
            http2_max_concurrent_streams: 16,
            workers: 3,
            pin_workers: crate::affinity::PinWorkers::Off,
        };
        let open = prometheus::IntGauge::new("open", "open").unwrap();
        let counters = ConnectionCounters {
            refused: prometheus::IntCounter::new("refused", "refused").unwrap(),
            open: open.clone(),
            on_worker: None,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, router, limits, None, counters, async {
            let _ = stopped.await;
        }));
        (address, open, stop, server)
    }

    /// Real HTTP over loopback: a connection is served on one worker thread from its first
    /// request to its last, and new connections go to the least-loaded worker.
    #[tokio::test]
    async fn connections_spread_over_the_workers_and_stay_on_theirs() {
        let router = Router::new().route(
            "/",
            get(|| async {
                let thread = std::thread::current();
                format!("{:?} {}", current_worker(), thread.name().unwrap_or("?"))
            }),
        );
        let (address, open, stop, server) = serve_on_three_workers(router).await;

        let mut connections = Vec::new();
        let mut served_by = Vec::new();
        for _ in 0..6 {
            let mut stream = TcpStream::connect(address).await.unwrap();
            let first = get_on(&mut stream).await;
            for _ in 0..3 {
                assert_eq!(
                    get_on(&mut stream).await,
                    first,
                    "a connection changed thread"
                );
            }
            served_by.push(first);
            connections.push(stream);
        }
        assert_eq!(open.get(), 6);
        let mut workers = served_by.clone();
        workers.sort();
        workers.dedup();
        assert_eq!(
            workers,
            [
                "Some(0) weir-http-0",
                "Some(1) weir-http-1",
                "Some(2) weir-http-2"
            ],
            "served by {served_by:?}"
        );
        for worker in &workers {
            let count = served_by.iter().filter(|by| *by == worker).count();
            assert_eq!(
                count, 2,
                "{worker} has {count} of 6 connections: {served_by:?}"
            );
        }

        // Both connections of one worker close; the next two both go to it, the least loaded.
        let emptied = served_by[0].clone();
        let mut kept = Vec::new();
        for (stream, by) in connections.drain(..).zip(&served_by) {
            if *by != emptied {
                kept.push(stream);
            }
        }
        connections = kept;
        while open.get() != 4 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for _ in 0..2 {
            let mut stream = TcpStream::connect(address).await.unwrap();
            assert_eq!(get_on(&mut stream).await, emptied);
            connections.push(stream);
        }

        // Stop: the server waits for its connections, which close once idle.
        stop.send(()).unwrap();
        drop(connections);
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the server stops once its connections close")
            .unwrap()
            .unwrap();
        assert_eq!(open.get(), 0);
    }

    /// Real HTTP/2 over loopback: the streams of one connection run on every worker.
    #[tokio::test]
    async fn one_http2_connection_uses_every_worker() {
        use http_body_util::{BodyExt, Empty};
        let router = Router::new().route("/", get(|| async { format!("{:?}", current_worker()) }));
        let (address, open, stop, server) = serve_on_three_workers(router).await;

        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .http2_only(true)
                .build_http::<Empty<bytes::Bytes>>();
        let uri: axum::http::Uri = format!("http://{address}/").parse().unwrap();
        let mut requests = tokio::task::JoinSet::new();
        for _ in 0..9 {
            let (client, uri) = (client.clone(), uri.clone());
            requests.spawn(async move {
                let response = client.get(uri).await.unwrap();
                assert_eq!(response.version(), axum::http::Version::HTTP_2);
                let body = response.into_body().collect().await.unwrap().to_bytes();
                String::from_utf8(body.to_vec()).unwrap()
            });
        }
        let answers = requests.join_all().await;
        assert_eq!(open.get(), 1, "one connection carried every request");
        let mut workers = answers.clone();
        workers.sort();
        workers.dedup();
        assert_eq!(workers, ["Some(0)", "Some(1)", "Some(2)"], "{answers:?}");

        drop(client);
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the server stops once its connection closes")
            .unwrap()
            .unwrap();
    }
}

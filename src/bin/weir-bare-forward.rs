//! weir-bare-forward: the floor under weir's push path. A hyper server that reads each
//! request's body whole, forwards it unchanged to `--upstream` with weir's own upstream
//! connections (`weir::upstream::Pool`), and answers with the upstream's status: no tenant,
//! no decode, no validation, no limit, no metrics, no timeouts.
//!
//! ```text
//! weir-bare-forward --listen 127.0.0.1:18190 --upstream http://127.0.0.1:18199/api/v1/push
//! weir-bare-forward --listen 127.0.0.1:18191    # no upstream: reads each body, answers 204
//! ```
//!
//! Without `--upstream` it is the floor's inbound half alone: each request read whole and
//! answered 204, nothing forwarded. That is what any server costs a push on this machine that
//! answers each push over HTTP/1.1, before it does anything with it.
//!
//! Its threads are weir's own (`http_serve::Workers`): one current-thread runtime a core,
//! pinned as weir pins them (`--pin-workers`), each with its own upstream pool, and an accept
//! loop that hands each connection to the worker with the fewest (here, to each in turn). So what it costs a request is what the HTTP exchange in, the forward and the
//! answer cost on this machine, and weir's CPU above it is what weir does per request.
//! `scripts/mimir-side-by-side --systems mimir,weir,bare` measures it beside the other two.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use weir::upstream::Pool;

/// weir's allocator, so the floor differs from weir only in what weir does per request.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "weir-bare-forward",
    about = "Forwards every request unchanged: the floor under weir's push path"
)]
struct Args {
    /// Where to listen, host:port.
    #[arg(long)]
    listen: SocketAddr,
    /// Where every request's body goes, as a POST; without it, every body is read whole and
    /// answered 204.
    #[arg(long)]
    upstream: Option<Uri>,
    /// Worker threads; 0 = one per core.
    #[arg(long, default_value_t = 0)]
    workers: usize,
    /// Pin the workers to cores, as weir's `--http-pin-workers`.
    #[arg(long, value_enum, default_value_t = weir::affinity::PinWorkers::Auto)]
    pin_workers: weir::affinity::PinWorkers,
}

/// The headers a remote-write receiver reads, copied from the client (weir writes its own,
/// for the format it read the body as: as many headers).
const FORWARDED: [&str; 4] = [
    "content-type",
    "content-encoding",
    "x-prometheus-remote-write-version",
    "x-scope-orgid",
];

/// The upstream, as `--upstream` named it.
static UPSTREAM: OnceLock<Uri> = OnceLock::new();

thread_local! {
    /// Each worker's own upstream connections, as weir keeps them a worker.
    static POOL: Arc<Pool> = Arc::new(new_pool().expect("the upstream was checked at start"));
}

fn new_pool() -> anyhow::Result<Pool> {
    let tls = weir::tls::ClientTls::default().client_config()?;
    let connector = weir::upstream::connector(Duration::from_secs(5), tls);
    let upstream = UPSTREAM
        .get()
        .expect("set before any worker serves")
        .clone();
    Pool::new(connector, upstream).map_err(|err| anyhow::anyhow!("--upstream: {err}"))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(upstream) = &args.upstream {
        UPSTREAM.set(upstream.clone()).expect("set once, here");
        new_pool()?;
    }
    let count = match args.workers {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        workers => workers,
    };
    let mut workers = weir::http_serve::Workers::start(count, args.pin_workers)?;
    let accept = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    accept.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen).await?;
        println!(
            "weir-bare-forward listening on http://{}",
            listener.local_addr()?
        );
        loop {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            let stream = stream.into_std()?;
            workers.least_busy().spawn(serve(stream));
        }
    })
}

/// One client connection, HTTP/1.1, on the worker it was handed to.
async fn serve(stream: std::net::TcpStream) {
    let Ok(stream) = tokio::net::TcpStream::from_std(stream) else {
        return;
    };
    let connection = hyper::server::conn::http1::Builder::new();
    if UPSTREAM.get().is_none() {
        let service = hyper::service::service_fn(answer);
        let _ = connection
            .serve_connection(TokioIo::new(stream), service)
            .await;
        return;
    }
    let pool = POOL.with(Arc::clone);
    let service = hyper::service::service_fn(move |request| forward(Arc::clone(&pool), request));
    let _ = connection
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// With no upstream: the request's body, whole, and 204 (400 if it could not be read).
async fn answer(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let status = match request.into_body().collect().await {
        Ok(_) => StatusCode::NO_CONTENT,
        Err(_) => StatusCode::BAD_REQUEST,
    };
    Ok(empty(status))
}

/// The request's body, whole, to the upstream; the upstream's status, or 502, back.
async fn forward(
    pool: Arc<Pool>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let status = match body.collect().await {
        Err(_) => StatusCode::BAD_REQUEST,
        Ok(body) => {
            let mut out = Request::post("/")
                .body(Full::new(body.to_bytes()))
                .expect("a POST is a valid request");
            for name in FORWARDED {
                if let Some(value) = parts.headers.get(name) {
                    out.headers_mut().insert(name, value.clone());
                }
            }
            match pool.send(out).await {
                Ok((response, lease)) => {
                    let status = response.status();
                    if response.into_body().collect().await.is_ok() {
                        lease.finished();
                    }
                    status
                }
                Err(_) => StatusCode::BAD_GATEWAY,
            }
        }
    };
    Ok(empty(status))
}

/// An answer with no body.
fn empty(status: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

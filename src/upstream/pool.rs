//! One worker's keep-alive HTTP/1.1 connections to one receiver URL.
//!
//! hyper's own connections (`hyper::client::conn::http1`), kept in a stack. hyper-util's
//! pooled client does the same job for any number of hosts, and pays for that on every
//! request: a lock and a hash lookup keyed by the host, a boxed future, and a task spawned
//! per request to return its connection once the answer's body is read. A forward has one
//! host and reads each answer to its end, so here the connection goes back when the caller
//! says the answer is read ([`Lease::finished`]), with no task of its own.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{header, HeaderValue, Request, Response, Uri};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use tower::ServiceExt;

pub type Connector = HttpsConnector<HttpConnector>;
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Idle connections kept, at most. A worker has as many connections open as it has forwards
/// in flight at once, hundreds at saturation; a cap below that would close and open
/// connections all the time (hyper-util's pool has none). Those a burst leaves idle go after
/// [`IDLE_TIMEOUT`].
const MAX_IDLE: usize = 1024;

/// A connection idle longer than this is closed rather than used, when the pool next takes or
/// puts back a connection (hyper-util's default; longer than nginx's 75 s keep-alive, so the
/// receiver usually closes first, and a connection the receiver closed ends its task at once).
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

pub struct Pool {
    connector: Connector,
    /// Where to connect (scheme and authority).
    target: Uri,
    /// What the request line names: the path and query (origin-form).
    path: Uri,
    host: HeaderValue,
    /// Least recently used first.
    idle: Mutex<VecDeque<Idle>>,
}

struct Idle {
    sender: SendRequest<Full<Bytes>>,
    since: Instant,
}

/// A connection carrying one exchange. [`Lease::finished`] once the answer's body is read to
/// its end puts it back; dropped before that, the connection closes with it.
pub struct Lease<'a> {
    pool: &'a Pool,
    sender: SendRequest<Full<Bytes>>,
}

impl Lease<'_> {
    pub fn finished(self) {
        self.pool.put_back(self.sender);
    }
}

impl Pool {
    pub fn new(connector: Connector, target: Uri) -> Result<Pool, Error> {
        let authority = target
            .authority()
            .ok_or_else(|| format!("{target} names no host"))?;
        let host = HeaderValue::from_str(authority.as_str())?;
        let path = target
            .path_and_query()
            .map_or("/", |path| path.as_str())
            .parse::<Uri>()?;
        Ok(Pool {
            connector,
            target,
            path,
            host,
            idle: Mutex::new(VecDeque::new()),
        })
    }

    /// Sends `request` to the pool's URL (its URI and `Host` are set here) on an idle
    /// connection, or a new one. A request a reused connection closed under before sending
    /// it is sent again on another: hyper hands it back unsent.
    pub async fn send(
        &self,
        mut request: Request<Full<Bytes>>,
    ) -> Result<(Response<Incoming>, Lease<'_>), Error> {
        *request.uri_mut() = self.path.clone();
        request
            .headers_mut()
            .insert(header::HOST, self.host.clone());
        loop {
            let (mut sender, reused) = match self.take_idle() {
                Some(sender) => (sender, true),
                None => (self.connect().await?, false),
            };
            if reused && sender.ready().await.is_err() {
                continue;
            }
            match sender.try_send_request(request).await {
                Ok(response) => return Ok((response, Lease { pool: self, sender })),
                Err(mut err) => match err.take_message() {
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(err.into_error().into()),
                },
            }
        }
    }

    /// The most recently used idle connection that is still open and not too old.
    fn take_idle(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        while let Some(Idle { sender, since }) = idle.pop_back() {
            if !sender.is_closed() && since.elapsed() < IDLE_TIMEOUT {
                return Some(sender);
            }
        }
        None
    }

    fn put_back(&self, sender: SendRequest<Full<Bytes>>) {
        if sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // The least recently used go first: too old, or beyond the cap. A closed one further
        // up goes when it is taken.
        while idle
            .front()
            .is_some_and(|old| now - old.since >= IDLE_TIMEOUT || idle.len() >= MAX_IDLE)
        {
            idle.pop_front();
        }
        idle.push_back(Idle { sender, since: now });
    }

    /// A new connection, its task on this thread's runtime.
    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, Error> {
        let io = self.connector.clone().oneshot(self.target.clone()).await?;
        let (sender, connection) = http1::handshake(io).await?;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "upstream connection closed");
            }
        });
        Ok(sender)
    }
}

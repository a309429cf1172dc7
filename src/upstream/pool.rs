//! One worker's keep-alive HTTP/1.1 connections to one receiver URL.
//!
//! hyper's own connections (`hyper::client::conn::http1`), kept in a stack. hyper-util's
//! pooled client does the same job for any number of hosts, and pays for that on every
//! request: a lock and a hash lookup keyed by the host, a boxed future, and a task spawned
//! per request to return its connection once the answer's body is read. A forward has one
//! host and reads each answer to its end, so here the connection goes back when the caller
//! says the answer is read ([`Lease::finished`]), with no task of its own.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
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

/// A connection idle longer than this is closed (hyper-util's default; longer than nginx's
/// 75 s keep-alive, so the receiver usually closes first, and a connection the receiver closed
/// ends its task at once). The pool drops such connections when it next takes or puts one
/// back, and a sweep drops them every third of this when no forward comes.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

type IdleStack = Mutex<VecDeque<Idle>>;

pub struct Pool {
    connector: Connector,
    /// Where to connect (scheme and authority).
    target: Uri,
    /// What the request line names: the path and query (origin-form).
    path: Uri,
    host: HeaderValue,
    /// Least recently used first.
    idle: Arc<IdleStack>,
    idle_timeout: Duration,
    /// Whether the sweep of idle connections runs (started with the first connection, on the
    /// runtime that opened it).
    sweeping: AtomicBool,
}

struct Idle {
    sender: SendRequest<Full<Bytes>>,
    since: Instant,
}

impl Idle {
    /// Still open, and idle for less than `timeout` at `now`.
    fn usable(&self, now: Instant, timeout: Duration) -> bool {
        !self.sender.is_closed() && now - self.since < timeout
    }
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
        Pool::with_idle_timeout(connector, target, IDLE_TIMEOUT)
    }

    /// [`Pool::new`], closing connections idle for `idle_timeout`.
    pub fn with_idle_timeout(
        connector: Connector,
        target: Uri,
        idle_timeout: Duration,
    ) -> Result<Pool, Error> {
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
            idle: Arc::default(),
            idle_timeout,
            sweeping: AtomicBool::new(false),
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
        let now = Instant::now();
        while let Some(kept) = idle.pop_back() {
            if kept.usable(now, self.idle_timeout) {
                return Some(kept.sender);
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
            .is_some_and(|old| now - old.since >= self.idle_timeout || idle.len() >= MAX_IDLE)
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
        if !self.sweeping.swap(true, Ordering::Relaxed) {
            tokio::spawn(sweep(Arc::downgrade(&self.idle), self.idle_timeout));
        }
        Ok(sender)
    }
}

/// Every third of `idle_timeout`, closes the connections idle that long or closed by the
/// receiver, until the pool is gone: idle connections do not outlive the forwards that used
/// them.
async fn sweep(idle: Weak<IdleStack>, idle_timeout: Duration) {
    let mut ticker = tokio::time::interval(idle_timeout / 3);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(idle) = idle.upgrade() else {
            return;
        };
        let now = Instant::now();
        idle.lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .retain(|kept| kept.usable(now, idle_timeout));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connection left idle is closed by the sweep with no forward coming, over a real
    /// socket: the receiver reads the end of it.
    #[tokio::test]
    async fn idle_connections_close_without_another_forward() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut chunk = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let read = stream.read(&mut chunk).await.unwrap();
                request.extend_from_slice(&chunk[..read]);
            }
            stream
                .write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
                .await
                .unwrap();
            // Kept alive: the next read ends only when weir closes the connection.
            let read = stream.read(&mut chunk).await.unwrap_or(0);
            let _ = closed_tx.send((read, Instant::now()));
        });
        let tls = crate::tls::ClientTls::default().client_config().unwrap();
        let connector = super::super::connector(Duration::from_secs(2), tls);
        let target: Uri = format!("http://{address}/push").parse().unwrap();
        let idle_timeout = Duration::from_millis(300);
        let pool = Pool::with_idle_timeout(connector, target, idle_timeout).unwrap();

        let (response, lease) = pool
            .send(Request::new(Full::new(Bytes::new())))
            .await
            .unwrap();
        assert_eq!(response.status(), 204);
        let answered = Instant::now();
        lease.finished();
        assert_eq!(
            pool.idle.lock().unwrap().len(),
            1,
            "kept for the next forward"
        );

        let (read, closed_at) = tokio::time::timeout(Duration::from_secs(5), closed_rx)
            .await
            .expect("the idle connection was never closed")
            .unwrap();
        assert_eq!(read, 0, "the receiver read the connection's end");
        let idle_for = closed_at - answered;
        assert!(
            idle_for >= idle_timeout && idle_for < idle_timeout * 3,
            "closed after {idle_for:?} idle"
        );
        assert!(pool.idle.lock().unwrap().is_empty());
    }
}

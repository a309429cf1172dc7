//! Forwarding over real HTTP: a real weir forwards to a real HTTP receiver in this process
//! (an axum server that records what it gets and answers as told). The end-to-end test with
//! real Prometheus and nginx is `tests/e2e_prometheus.rs`.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use common::{push_request, serve_on_loopback, Options, Weir};
use weir::remote_write::prompb::WriteRequest;

#[derive(Clone, Default)]
struct Receiver {
    received: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
    /// What to answer, and how long to wait first.
    answer: Arc<Mutex<(StatusCode, &'static str, Duration)>>,
    /// A `Retry-After` to answer with, if any.
    retry_after: Arc<Mutex<Option<&'static str>>>,
}

async fn receive(
    State(receiver): State<Receiver>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, HeaderMap, &'static str) {
    receiver.received.lock().unwrap().push((headers, body));
    let (status, text, delay) = *receiver.answer.lock().unwrap();
    let mut headers = HeaderMap::new();
    if let Some(seconds) = *receiver.retry_after.lock().unwrap() {
        headers.insert("retry-after", seconds.parse().unwrap());
    }
    tokio::time::sleep(delay).await;
    (status, headers, text)
}

async fn start_receiver() -> (SocketAddr, Receiver) {
    let receiver = Receiver::default();
    *receiver.answer.lock().unwrap() = (StatusCode::NO_CONTENT, "", Duration::ZERO);
    let app = Router::new()
        .route("/api/v1/write", post(receive))
        .route("/api/v1/otlp/v1/metrics", post(receive))
        .with_state(receiver.clone());
    (serve_on_loopback(app).await, receiver)
}

async fn weir_forwarding_to(upstream: String, timeout: Duration) -> Weir {
    Weir::start(Options {
        configure: Box::new(move |config| {
            config.upstream = Some(upstream);
            config.upstream_timeout = timeout;
            config.upstream_tenant_header = "X-Tenant".into();
        }),
        ..Options::default()
    })
    .await
}

#[tokio::test]
async fn admitted_push_is_forwarded_byte_for_byte_with_its_headers() {
    let (addr, receiver) = start_receiver().await;
    let weir = weir_forwarding_to(
        format!("http://{addr}/api/v1/write"),
        Duration::from_secs(5),
    )
    .await;
    let body = WriteRequest::synthetic(10, 3, 1).encode_snappy();
    let response = weir.push_body(Some("team-a"), body.clone()).await;
    assert_eq!(response.status(), 200);

    let received = receiver.received.lock().unwrap().clone();
    assert_eq!(received.len(), 1);
    let (headers, forwarded) = &received[0];
    assert_eq!(
        forwarded.as_ref(),
        body.as_slice(),
        "the original compressed bytes, unchanged"
    );
    assert_eq!(headers["content-encoding"], "snappy");
    assert_eq!(headers["content-type"], "application/x-protobuf");
    assert_eq!(headers["x-prometheus-remote-write-version"], "0.1.0");
    assert_eq!(
        headers["x-tenant"], "team-a",
        "the tenant, under the configured header name"
    );
    assert_eq!(
        weir.metric("weir_upstream_requests_total{status_class=\"2xx\"}")
            .await,
        Some(1.0)
    );
    assert_eq!(weir.metric("weir_sink_requests_total").await, Some(0.0));
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn refused_pushes_are_not_forwarded() {
    let (addr, receiver) = start_receiver().await;
    let weir = weir_forwarding_to(
        format!("http://{addr}/api/v1/write"),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(
        weir.push_body(Some("t"), b"garbage".to_vec())
            .await
            .status(),
        400
    );
    assert_eq!(
        weir.push_body(None, WriteRequest::synthetic(1, 1, 1).encode_snappy())
            .await
            .status(),
        401
    );
    assert!(receiver.received.lock().unwrap().is_empty());
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn upstream_answers_are_mapped() {
    let (addr, receiver) = start_receiver().await;
    let weir = weir_forwarding_to(
        format!("http://{addr}/api/v1/write"),
        Duration::from_millis(500),
    )
    .await;

    // 4xx: the same status and body, so the client does not retry.
    *receiver.answer.lock().unwrap() = (
        StatusCode::BAD_REQUEST,
        "out of order sample",
        Duration::ZERO,
    );
    let response = weir.push("t", 1).await;
    assert_eq!(response.status(), 400);
    assert!(!response.headers().contains_key("retry-after"));
    assert_eq!(response.text().await.unwrap(), "out of order sample\n");

    // 5xx: 502 with a clear message, so the client retries, after its own backoff: the
    // upstream's recovery is unknown, so no Retry-After claims to know it.
    *receiver.answer.lock().unwrap() = (
        StatusCode::SERVICE_UNAVAILABLE,
        "tsdb closed",
        Duration::ZERO,
    );
    let response = weir.push("t", 1).await;
    assert_eq!(response.status(), 502);
    assert!(!response.headers().contains_key("retry-after"));
    let text = response.text().await.unwrap();
    assert!(
        text.contains("upstream receiver failed with 503 Service Unavailable: tsdb closed"),
        "{text}"
    );

    // The receiver says when to come back: weir passes it on, on a 429 and on a 5xx (502).
    *receiver.retry_after.lock().unwrap() = Some("7");
    *receiver.answer.lock().unwrap() = (StatusCode::TOO_MANY_REQUESTS, "slow down", Duration::ZERO);
    let response = weir.push("t", 1).await;
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "7");
    *receiver.answer.lock().unwrap() = (
        StatusCode::SERVICE_UNAVAILABLE,
        "tsdb closed",
        Duration::ZERO,
    );
    let response = weir.push("t", 1).await;
    assert_eq!(response.status(), 502);
    assert_eq!(response.headers()["retry-after"], "7");
    // An HTTP date is not passed on: the client's own backoff decides.
    *receiver.retry_after.lock().unwrap() = Some("Wed, 21 Oct 2026 07:28:00 GMT");
    let response = weir.push("t", 1).await;
    assert_eq!(response.status(), 502);
    assert!(!response.headers().contains_key("retry-after"));
    *receiver.retry_after.lock().unwrap() = None;

    // Too slow: 504 after the timeout, never later, and the wait counts as in flight.
    *receiver.answer.lock().unwrap() = (StatusCode::OK, "", Duration::from_secs(5));
    let started = Instant::now();
    let slow = weir.push("t", 1);
    let inflight = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        weir.metric("weir_distributor_inflight_push_requests").await
    };
    let (response, inflight) = tokio::join!(slow, inflight);
    assert_eq!(inflight, Some(1.0), "the upstream wait is in flight");
    assert_eq!(response.status(), 504);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(450) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    assert!(response
        .text()
        .await
        .unwrap()
        .contains("did not answer within 500ms"));

    for (class, count) in [("4xx", 2.0), ("5xx", 3.0), ("timeout", 1.0)] {
        let series = format!("weir_upstream_requests_total{{status_class=\"{class}\"}}");
        assert_eq!(weir.metric(&series).await, Some(count), "{class}");
    }
    weir.stop().await.unwrap();
}

/// A client that hangs up while the receiver has not answered: the receiver gets the push
/// and its tokens stay charged, so it is counted received, and the forward abandoned.
#[tokio::test]
async fn a_push_whose_client_hangs_up_during_the_forward_is_counted() {
    let (addr, receiver) = start_receiver().await;
    *receiver.answer.lock().unwrap() = (StatusCode::NO_CONTENT, "", Duration::from_secs(1));
    let weir = weir_forwarding_to(
        format!("http://{addr}/api/v1/write"),
        Duration::from_secs(5),
    )
    .await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let body = WriteRequest::synthetic(5, 1, 1).encode_snappy();
    let hung_up = push_request(&client, &weir.url(""), Some("gone"), body)
        .send()
        .await;
    assert!(hung_up.is_err_and(|err| err.is_timeout()));
    assert!(
        weir.eventually(Duration::from_secs(3), || async {
            weir.metric(r#"weir_upstream_requests_total{status_class="abandoned"}"#)
                .await
                == Some(1.0)
        })
        .await,
        "the forward counted abandoned"
    );
    assert_eq!(receiver.received.lock().unwrap().len(), 1);
    assert_eq!(
        weir.metric(r#"weir_distributor_received_requests_total{user="gone"}"#)
            .await,
        Some(1.0)
    );
    assert_eq!(
        weir.metric(r#"weir_distributor_received_samples_total{user="gone"}"#)
            .await,
        Some(5.0)
    );
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn unreachable_upstream_is_a_502_with_the_reason() {
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let weir = weir_forwarding_to(
        format!("http://{closed}/api/v1/write"),
        Duration::from_secs(2),
    )
    .await;
    let response = weir.push("t", 1).await;
    assert_eq!(response.status(), 502);
    let text = response.text().await.unwrap();
    assert!(
        text.contains("cannot reach the upstream receiver"),
        "{text}"
    );
    assert!(text.to_lowercase().contains("refused"), "{text}");
    assert_eq!(
        weir.metric("weir_upstream_requests_total{status_class=\"error\"}")
            .await,
        Some(1.0)
    );
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn bad_upstream_urls_are_refused_at_start() {
    for (url, expected) in [
        ("not a url", "is not a URL"),
        ("ftp://x/y", "http:// or https://"),
    ] {
        let err = weir::config::Config::load_from(["weir", "--upstream", url])
            .map(|config| {
                weir::upstream::Upstream::new(
                    config.upstream.as_deref().unwrap(),
                    None,
                    config.upstream_timeout,
                    &config.upstream_tenant_header,
                    config.upstream_tls(),
                    config.http_workers(),
                )
            })
            .unwrap()
            .err()
            .unwrap();
        assert!(err.to_string().contains(expected), "{url}: {err}");
    }
}

/// weir connects to the upstream it was given: a redirect is the upstream failing (502),
/// not an address to send tenant data to.
#[tokio::test]
async fn upstream_redirects_are_not_followed() {
    let followed = Arc::new(Mutex::new(0usize));
    let counter = Arc::clone(&followed);
    let app = Router::new()
        .route(
            "/api/v1/write",
            post(|| async {
                (
                    StatusCode::TEMPORARY_REDIRECT,
                    [("location", "/elsewhere")],
                    "moved",
                )
            }),
        )
        .route(
            "/elsewhere",
            post(move || async move {
                *counter.lock().unwrap() += 1;
                StatusCode::NO_CONTENT
            }),
        );
    let addr = serve_on_loopback(app).await;
    let weir = weir_forwarding_to(
        format!("http://{addr}/api/v1/write"),
        Duration::from_secs(2),
    )
    .await;

    let response = weir.push("t", 1).await;
    assert_eq!(response.status(), 502);
    let text = response.text().await.unwrap();
    assert!(text.contains("failed with 307"), "{text}");
    assert_eq!(*followed.lock().unwrap(), 0);
    weir.stop().await.unwrap();
}

/// `weir-bare-forward`, the floor `scripts/mimir-side-by-side --systems …,bare` measures: a
/// real push through the real binary reaches the receiver byte for byte with the headers a
/// receiver reads, and the receiver's status comes back.
#[tokio::test]
async fn the_bare_forwarder_passes_bodies_through_unchanged() {
    let receiver = common::receiver::Receiver::default();
    let upstream = receiver.serve().await;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_weir-bare-forward"))
        .args(["--listen", "127.0.0.1:0", "--workers", "2"])
        .args(["--upstream", &format!("http://{upstream}/api/v1/write")])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let _stop = common::processes::Process(child);
    let address = line
        .trim()
        .strip_prefix("weir-bare-forward listening on http://")
        .unwrap_or_else(|| panic!("{line:?}"))
        .to_string();
    let body = WriteRequest::synthetic(10, 1, 1).encode_snappy();
    let client = reqwest::Client::new();
    for _ in 0..3 {
        let response = client
            .post(format!("http://{address}/api/v1/push"))
            .header("Content-Encoding", "snappy")
            .header("X-Scope-OrgID", "t1")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 204);
        let (headers, forwarded) = receiver.one();
        assert_eq!(forwarded, body);
        assert_eq!(headers["x-scope-orgid"], "t1");
        assert_eq!(headers["content-encoding"], "snappy");
    }
}

/// A receiver on a real socket speaking just enough HTTP/1.1: each request answered 204 on a
/// kept-alive connection, which it closes right after the answer when `close_after_answer`,
/// as a receiver whose keep-alive timeout runs out just then. Counts connections and requests.
async fn raw_receiver(
    close_after_answer: bool,
) -> (SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (connections, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (accepted, answered) = (Arc::clone(&connections), Arc::clone(&requests));
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            accepted.fetch_add(1, Ordering::SeqCst);
            let answered = Arc::clone(&answered);
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    // One request: its head, then Content-Length bytes of body.
                    let (head_end, length) = loop {
                        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buffer[..end]).to_lowercase();
                            let length = head
                                .lines()
                                .find_map(|line| line.strip_prefix("content-length:"))
                                .map_or(0, |value| value.trim().parse::<usize>().unwrap());
                            break (end + 4, length);
                        }
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(read) => buffer.extend_from_slice(&chunk[..read]),
                        }
                    };
                    while buffer.len() < head_end + length {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(read) => buffer.extend_from_slice(&chunk[..read]),
                        }
                    }
                    buffer.drain(..head_end + length);
                    answered.fetch_add(1, Ordering::SeqCst);
                    if stream
                        .write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
                        .await
                        .is_err()
                        || close_after_answer
                    {
                        return;
                    }
                }
            });
        }
    });
    (address, connections, requests)
}

/// weir forwarding to a [`raw_receiver`], and the receiver's two counts.
async fn weir_before_raw_receiver(
    close_after_answer: bool,
) -> (Weir, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (address, connections, requests) = raw_receiver(close_after_answer).await;
    let weir = weir_forwarding_to(
        format!("http://{address}/api/v1/write"),
        Duration::from_secs(2),
    )
    .await;
    (weir, connections, requests)
}

/// A push's forward goes out on a connection kept from an earlier one: twenty pushes, one
/// after another, open no more upstream connections than weir has workers.
#[tokio::test]
async fn forwards_reuse_kept_alive_connections() {
    let (weir, connections, requests) = weir_before_raw_receiver(false).await;
    for _ in 0..20 {
        assert_eq!(weir.status("t", 3).await, 200);
    }
    assert_eq!(requests.load(Ordering::SeqCst), 20);
    let opened = connections.load(Ordering::SeqCst);
    let workers = weir::config::Config::load_from(["weir"])
        .unwrap()
        .http_workers();
    assert!(
        (1..=workers).contains(&opened),
        "{opened} connections for 20 pushes, {workers} workers"
    );
    weir.stop().await.unwrap();
}

/// A receiver that closes each connection after its answer costs no push: the next forward
/// finds the kept connection closed and opens another.
#[tokio::test]
async fn a_receiver_closing_kept_connections_loses_no_push() {
    let (weir, connections, requests) = weir_before_raw_receiver(true).await;
    for _ in 0..20 {
        assert_eq!(weir.status("t", 3).await, 200);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(requests.load(Ordering::SeqCst), 20);
    assert_eq!(connections.load(Ordering::SeqCst), 20);
    weir.stop().await.unwrap();
}

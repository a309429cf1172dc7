//! The HTTP listener's bounds, on a real server over raw sockets: a slow sender of headers (a
//! slowloris) is cut off, an idle keep-alive connection is closed, an oversized head is
//! refused, and connections past the cap are closed at once.

mod common;

use std::time::{Duration, Instant};

use common::{Options, RawRequest, Weir};

async fn weir() -> Weir {
    Weir::start(Options {
        configure: Box::new(|config| {
            config.http_header_read_timeout = Duration::from_millis(500);
            config.http_max_header_bytes = 16 << 10;
            config.http_max_connections = 20;
            config.http2_max_concurrent_streams = 4;
        }),
        ..Options::default()
    })
    .await
}

#[tokio::test]
async fn a_slowloris_is_cut_off_at_the_header_timeout() {
    let weir = weir().await;
    let started = Instant::now();
    let mut slow = RawRequest::connect(weir.addr).await;
    slow.send(b"POST /api/v1/push HTTP/1.1\r\nHost: weir\r\n")
        .await;
    // A header line every 100 ms, never the blank line that ends the head: the server stops
    // taking them once the 500 ms header timeout has passed.
    let mut lines = 0;
    while lines < 50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if !slow
            .try_send(format!("X-Slow-{lines}: y\r\n").as_bytes())
            .await
        {
            break;
        }
        lines += 1;
    }
    let answer = slow.response_until_closed(Duration::from_secs(5)).await;
    let closed = started.elapsed();
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );
    assert!(
        lines < 50,
        "the server took a header line every 100 ms for 5 s"
    );
    assert!(closed < Duration::from_secs(3), "held for {closed:?}");
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed() {
    let weir = weir().await;
    let mut idle = RawRequest::connect(weir.addr).await;
    idle.send(b"GET /health HTTP/1.1\r\nHost: weir\r\n\r\n")
        .await;
    let started = Instant::now();
    let answer = idle.response_until_closed(Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let closed = started.elapsed();
    assert!(
        closed >= Duration::from_millis(400) && closed < Duration::from_secs(3),
        "{closed:?}"
    );
}

#[tokio::test]
async fn an_oversized_head_is_refused() {
    let weir = weir().await;
    let mut big = RawRequest::connect(weir.addr).await;
    let filler = "x".repeat(64 << 10);
    big.send(format!("GET /health HTTP/1.1\r\nHost: weir\r\nX-Big: {filler}\r\n\r\n").as_bytes())
        .await;
    let answer = big.response_until_closed(Duration::from_secs(5)).await;
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "{}",
        &answer[..answer.len().min(200)]
    );
    // An ordinary request still gets through.
    assert_eq!(
        weir.client
            .get(weir.url("/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn connections_past_the_cap_are_closed_at_once() {
    let weir = weir().await;
    // Hold every slot with connections that have sent nothing yet (the header timer runs, so
    // they would be closed after 500 ms: the test is quicker than that).
    let mut held = Vec::new();
    for _ in 0..20 {
        held.push(RawRequest::connect(weir.addr).await);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut extra = RawRequest::connect(weir.addr).await;
    extra
        .send(b"GET /health HTTP/1.1\r\nHost: weir\r\n\r\n")
        .await;
    let answer = extra.response_until_closed(Duration::from_secs(2)).await;
    assert!(answer.is_empty(), "{answer}");
    drop(held);
    // Slots free as the held connections close; the server answers again.
    let back = weir
        .eventually(Duration::from_secs(3), || async {
            weir.client.get(weir.url("/health")).send().await.is_ok()
        })
        .await;
    assert!(back);
    assert!(
        weir.metric("weir_http_refused_connections_total").await >= Some(1.0),
        "the refusal is counted"
    );
}

#[tokio::test]
async fn open_connections_are_counted_and_uncounted() {
    let weir = weir().await;
    let mut held = Vec::new();
    for _ in 0..10 {
        held.push(RawRequest::connect(weir.addr).await);
    }
    // The ten, plus the scrape's own connection (they close at the 500 ms header timeout).
    let open = weir.metric("weir_http_open_connections").await.unwrap();
    assert!((11.0..=12.0).contains(&open), "{open}");
    drop(held);
    let settled = weir
        .eventually(Duration::from_secs(3), || async {
            weir.metric("weir_http_open_connections").await <= Some(2.0)
        })
        .await;
    assert!(settled, "closed connections are still counted");
}

#[tokio::test]
async fn an_http2_connection_gets_at_most_the_configured_streams() {
    let weir = weir().await;
    let tcp = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    // The server's SETTINGS (max concurrent streams 4) in force before streams are opened.
    let mut client = client.ready().await.unwrap();
    common::wait_until("the server's SETTINGS", Duration::from_secs(5), || {
        let streams = client.current_max_send_streams();
        async move { streams == 4 }
    })
    .await;
    let push = || {
        http::Request::post(format!("http://{}/api/v1/push", weir.addr))
            .header("X-Scope-OrgID", "h2")
            .body(())
            .unwrap()
    };
    // Five pushes whose bodies have not ended: four get streams, the fifth waits in the
    // client's queue (h2 queues a request past the peer's limit).
    let mut open = Vec::new();
    for _ in 0..5 {
        let (response, body) = client.send_request(push(), false).unwrap();
        open.push((response, body));
        if open.len() < 5 {
            client = client.ready().await.unwrap();
        }
    }
    // The server handles four at once (that it lets no fifth in is checked below).
    common::wait_until(
        "exactly four pushes in flight",
        Duration::from_secs(5),
        || async { weir.metric("weir_distributor_inflight_push_requests").await == Some(4.0) },
    )
    .await;
    // Ending the fifth's body does not get it answered while the four hold the streams...
    let (fifth, mut fifth_body) = open.pop().unwrap();
    fifth_body.send_data(bytes::Bytes::new(), true).unwrap();
    let mut fifth = Box::pin(fifth);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut fifth)
            .await
            .is_err(),
        "the fifth request was served beside four open streams"
    );
    // ...one of the four ending frees a stream, and the fifth is served (an empty body is
    // refused as invalid: 4xx).
    let (first, mut first_body) = open.pop().unwrap();
    first_body.send_data(bytes::Bytes::new(), true).unwrap();
    assert!(first.await.unwrap().status().is_client_error());
    let status = tokio::time::timeout(Duration::from_secs(2), fifth)
        .await
        .expect("a stream freed up")
        .unwrap()
        .status();
    assert!(status.is_client_error(), "{status}");
}

/// A body sent with a transfer coding weir does not read (`gzip, chunked`) is 501 and the
/// connection closes, as Go's server (Mimir's) answers, on the push routes and the admission
/// API's JSON twin alike; it was read as the body, and answered 400 for a bad snappy block.
/// `chunked` alone is read as before.
#[tokio::test]
async fn a_transfer_coding_other_than_chunked_is_not_implemented() {
    let weir = weir().await;
    let send = |path: &'static str, coding: &'static str| {
        let addr = weir.addr;
        async move {
            let mut request = RawRequest::connect(addr).await;
            request
                .send(
                    format!(
                        "POST {path} HTTP/1.1\r\nHost: weir\r\nX-Scope-OrgID: t\r\n\
                         Content-Type: application/json\r\nTransfer-Encoding: {coding}\r\n\r\n\
                         5\r\nhello\r\n0\r\n\r\n"
                    )
                    .as_bytes(),
                )
                .await;
            request
        }
    };
    for path in ["/api/v1/push", "/otlp/v1/metrics", "/api/v1/allow"] {
        for coding in ["gzip, chunked", "identity, chunked"] {
            let started = Instant::now();
            let answer = send(path, coding)
                .await
                .response_until_closed(Duration::from_secs(5))
                .await;
            assert!(started.elapsed() < Duration::from_secs(4), "left open");
            assert!(
                answer.starts_with("HTTP/1.1 501"),
                "{path} {coding}: {answer}"
            );
            assert!(answer.contains("Unsupported transfer encoding"), "{answer}");
            assert!(answer.to_ascii_lowercase().contains("connection: close"));
        }
        // `chunked` alone reaches the route, which reads "hello" and says what is wrong.
        let answer = send(path, "Chunked").await.response().await;
        assert!(answer.starts_with("HTTP/1.1 4"), "{path}: {answer}");
    }
}

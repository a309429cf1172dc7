//! A refusal reaches the client: a push refused before its body is read (here by the tenant's
//! request rate) is answered at once, its body is still read and thrown away, so a client that
//! is still sending sees the 429 instead of a reset connection, and the connection is reused.
//! Python's `http.client` is the client, on bodies of 100 KB, 2 MB and the size limit; a body
//! that never finishes is cut off by `--body-read-timeout`.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Options, RawRequest, Weir};

const MAX_BODY: u64 = 8 << 20;

async fn weir() -> Weir {
    Weir::start(Options {
        overrides: "overrides:\n  slow:\n    request_rate: 0.001\n    request_burst_size: 1\n"
            .into(),
        configure: Box::new(|config| {
            config.max_request_body_size = MAX_BODY;
            config.body_read_timeout = Duration::from_secs(2);
        }),
        ..Options::default()
    })
    .await
}

/// Runs the Python client: `count` pushes of `size` random bytes on one keep-alive connection.
async fn python_pushes(weir: &Weir, size: u64, count: usize) -> serde_json::Value {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/refusal_client.py"
    );
    let (host, port) = (weir.addr.ip().to_string(), weir.addr.port().to_string());
    let output = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .args([
                script,
                &host,
                &port,
                "slow",
                &size.to_string(),
                &count.to_string(),
            ])
            .output()
            .expect("python3 runs the client")
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_client_sees_every_refusal_on_one_connection() {
    let weir = weir().await;
    for (size, count) in [(100 << 10, 20), (2 << 20, 20), (MAX_BODY, 6)] {
        let report = python_pushes(&weir, size, count).await;
        assert_eq!(
            report["errors"],
            serde_json::json!([]),
            "{size} bytes: {report}"
        );
        let statuses: Vec<u64> = report["statuses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|status| status.as_u64().unwrap())
            .collect();
        assert_eq!(statuses.len(), count, "{report}");
        // The first push of the run may spend the tenant's one token (its random body is then
        // read and refused as bad snappy, 400); every other is over the request rate.
        assert!(
            statuses[1..].iter().all(|&status| status == 429),
            "{report}"
        );
        assert!(
            report["retry_after"].as_u64().unwrap() >= count as u64 - 1,
            "{report}"
        );
        assert_eq!(
            report["connections"], 1,
            "{size} bytes: the connection was not reused: {report}"
        );
    }
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_and_the_connection_closed() {
    let weir = weir().await;
    let mut request = RawRequest::start_push(weir.addr, "slow", MAX_BODY as usize + 1).await;
    request.send(b"x").await;
    let answer = request.response().await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
}

#[tokio::test]
async fn a_refused_body_that_never_ends_is_cut_off() {
    let weir = weir().await;
    // Spend the token, so the next push is refused by the request rate.
    weir.push("slow", 1).await;
    let started = Instant::now();
    let mut request = RawRequest::connect(weir.addr).await;
    request
        .send(
            b"POST /api/v1/push HTTP/1.1\r\nHost: weir\r\nX-Scope-OrgID: slow\r\n\
              Content-Length: 1000\r\n\r\nxx",
        )
        .await;
    // The answer comes at once; the connection closes once the timeout (2 s) has passed.
    let answer = request.response_until_closed(Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    let closed = started.elapsed();
    assert!(
        closed >= Duration::from_millis(1900) && closed < Duration::from_secs(5),
        "{closed:?}"
    );
}

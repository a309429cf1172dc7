//! Remote-write 2.0 over real HTTP, with bodies built from Prometheus' own proto
//! (`proto/prometheus/write/v2/types.proto`): counted, charged, answered with the `*-Written`
//! headers, refused with the right status when weir cannot count them, forwarded unchanged.

mod common;

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use common::{Options, Weir};
use weir::remote_write::v2_proto::{Exemplar, Histogram, Metadata, Request, Sample, TimeSeries};

const V2: &str = "application/x-protobuf;proto=io.prometheus.write.v2.Request";

/// Tenant `t` keeps exemplars (Mimir's default, `max_global_exemplars_per_user: 0`, drops
/// them before they are charged or forwarded).
const EXEMPLARS_ON: &str = "overrides:\n  t:\n    max_global_exemplars_per_user: 1000\n";

/// `series` series of `up`-like gauges with one sample each, plus one series with two
/// histograms and an exemplar (charged and forwarded for a tenant with exemplars on,
/// [`EXEMPLARS_ON`]).
fn request(series: usize) -> Request {
    let mut symbols: Vec<String> = ["", "__name__", "http_requests_total", "instance", "help"]
        .into_iter()
        .map(String::from)
        .collect();
    let mut timeseries = Vec::new();
    for i in 0..series {
        symbols.push(format!("host-{i}"));
        timeseries.push(TimeSeries {
            labels_refs: vec![1, 2, 3, symbols.len() as u32 - 1],
            samples: vec![Sample {
                value: i as f64,
                timestamp: 1_700_000_000_000,
            }],
            metadata: Some(Metadata {
                r#type: 1,
                help_ref: 4,
                unit_ref: 0,
            }),
            ..TimeSeries::default()
        });
    }
    timeseries.push(TimeSeries {
        labels_refs: vec![1, 2],
        // Two timestamps: one repeating the other would be dropped, as Mimir drops it.
        histograms: vec![
            Histogram {
                timestamp: 1_700_000_000_000,
                ..Histogram::default()
            },
            Histogram {
                timestamp: 1_700_000_000_001,
                ..Histogram::default()
            },
        ],
        exemplars: vec![Exemplar {
            labels_refs: vec![3, 4],
            value: 1.0,
            timestamp: 1_700_000_000_000,
        }],
        ..TimeSeries::default()
    });
    Request {
        symbols,
        timeseries,
    }
}

async fn push(weir: &Weir, tenant: &str, content_type: &str, body: Vec<u8>) -> reqwest::Response {
    weir.client
        .post(weir.url("/api/v1/push"))
        .header("Content-Encoding", "snappy")
        .header("Content-Type", content_type)
        .header("X-Prometheus-Remote-Write-Version", "2.0.0")
        .header("X-Scope-OrgID", tenant)
        .body(body)
        .send()
        .await
        .unwrap()
}

fn written(response: &reqwest::Response) -> [u64; 3] {
    [
        "x-prometheus-remote-write-samples-written",
        "x-prometheus-remote-write-histograms-written",
        "x-prometheus-remote-write-exemplars-written",
    ]
    .map(|name| {
        response.headers()[name]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    })
}

/// The reproduction: a tenant limited to 10 samples/s sends three 2.0 requests of
/// 5 000 samples. Before, all three got 200 and nothing was counted.
#[tokio::test]
async fn a_2_0_body_is_charged_to_the_tenant() {
    let weir = Weir::with_overrides(
        "overrides:\n  small:\n    ingestion_rate: 10\n    ingestion_burst_size: 10\n    \
         max_global_exemplars_per_user: 1000\n",
    )
    .await;
    for _ in 0..3 {
        let response = push(&weir, "small", V2, request(5_000).encode_snappy()).await;
        assert_eq!(response.status(), 429);
        assert_eq!(written(&response), [0, 0, 0], "nothing was written");
        let body = response.text().await.unwrap();
        assert!(
            body.contains("err-weir-tenant-max-ingestion-burst-size"),
            "{body}"
        );
    }
    // 5 000 samples + 2 histograms, 1 exemplar and 1 metadata family, three times: each
    // counted apart, as Mimir counts a rate-limited push.
    for (family, items) in [
        ("weir_discarded_samples_total", 5_002.0),
        ("weir_discarded_exemplars_total", 1.0),
        ("weir_discarded_metadata_total", 1.0),
    ] {
        assert_eq!(
            weir.metric(&format!(
                "{family}{{reason=\"ingestion_burst_exceeded\",user=\"small\"}}"
            ))
            .await,
            Some(3.0 * items),
            "{family}"
        );
    }
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn an_admitted_2_0_body_says_what_was_written() {
    let weir = Weir::with_overrides(EXEMPLARS_ON).await;
    let response = push(&weir, "t", V2, request(100).encode_snappy()).await;
    assert_eq!(response.status(), 200);
    assert_eq!(written(&response), [100, 2, 1]);
    assert_eq!(
        weir.metric("weir_distributor_received_samples_total{user=\"t\"}")
            .await,
        Some(102.0),
        "samples and histograms, as Mimir counts them"
    );
    assert_eq!(
        weir.metric("weir_distributor_received_metadata_total{user=\"t\"}")
            .await,
        Some(1.0),
        "one metadata entry per metric family"
    );
    // A 1.0 push gets no 2.0 headers.
    let response = weir.push("t", 3).await;
    assert_eq!(response.status(), 200);
    assert!(response
        .headers()
        .get("x-prometheus-remote-write-samples-written")
        .is_none());
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn what_weir_cannot_count_is_refused_with_the_right_status() {
    let weir = Weir::with_overrides("").await;
    // An unknown message: 415, as the specification says.
    let response = push(
        &weir,
        "t",
        "application/x-protobuf;proto=io.prometheus.write.v3.Request",
        request(1).encode_snappy(),
    )
    .await;
    assert_eq!(response.status(), 415);
    assert!(response.text().await.unwrap().contains("proto="));
    // An encoding other than snappy: 415.
    let response = weir
        .client
        .post(weir.url("/api/v1/push"))
        .header("Content-Encoding", "gzip")
        .header("Content-Type", V2)
        .header("X-Scope-OrgID", "t")
        .body(request(1).encode_snappy())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 415);
    // Still a 2.0 push by its content type: it hears that nothing was written.
    assert_eq!(
        response
            .headers()
            .get("x-prometheus-remote-write-samples-written")
            .and_then(|v| v.to_str().ok()),
        Some("0")
    );
    // A 2.0 body labelled as 1.0 (the hole this closes) and the other way round: 400.
    let response = push(
        &weir,
        "t",
        "application/x-protobuf",
        request(10).encode_snappy(),
    )
    .await;
    assert_eq!(response.status(), 400);
    assert!(response.text().await.unwrap().contains("remote-write 2.0"));
    let v1 = weir::remote_write::prompb::WriteRequest::synthetic(10, 1, 1).encode_snappy();
    let response = push(&weir, "t", V2, v1).await;
    assert_eq!(response.status(), 400);
    assert_eq!(written(&response), [0, 0, 0]);
    // A reference out of range: 400 naming it.
    let mut bad = request(2);
    bad.timeseries[1].labels_refs[3] = 999;
    let response = push(&weir, "t", V2, bad.encode_snappy()).await;
    assert_eq!(response.status(), 400);
    let body = response.text().await.unwrap();
    assert!(
        body.contains("timeseries[1]: labels_refs[3] = 999 is out of range"),
        "{body}"
    );
    assert_eq!(
        weir.metric("weir_distributor_received_samples_total{user=\"t\"}")
            .await,
        Some(0.0),
        "nothing refused was counted as received"
    );
    weir.stop().await.unwrap();
}

#[derive(Clone, Default)]
struct Receiver {
    received: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
}

/// A 2.0 receiver that wrote less than it was sent, and says so.
async fn receive(
    State(receiver): State<Receiver>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, [(&'static str, &'static str); 3]) {
    receiver.received.lock().unwrap().push((headers, body));
    (
        StatusCode::NO_CONTENT,
        [
            ("x-prometheus-remote-write-samples-written", "7"),
            ("x-prometheus-remote-write-histograms-written", "0"),
            ("x-prometheus-remote-write-exemplars-written", "1"),
        ],
    )
}

#[tokio::test]
async fn a_2_0_body_is_forwarded_unchanged_and_the_receiver_s_count_is_passed_back() {
    let receiver = Receiver::default();
    let app = Router::new()
        .route("/api/v1/write", post(receive))
        .with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let weir = Weir::start(Options {
        overrides: EXEMPLARS_ON.into(),
        configure: Box::new(move |config| {
            config.upstream = Some(format!("http://{addr}/api/v1/write"));
        }),
        ..Options::default()
    })
    .await;
    let body = request(10).encode_snappy();
    let response = push(&weir, "t", V2, body.clone()).await;
    assert_eq!(response.status(), 200);
    assert_eq!(written(&response), [7, 0, 1], "the receiver's own account");
    let received = receiver.received.lock().unwrap().clone();
    let (headers, forwarded) = &received[0];
    assert_eq!(forwarded.as_ref(), body.as_slice());
    assert_eq!(headers["content-type"], V2);
    assert_eq!(headers["x-prometheus-remote-write-version"], "2.0.0");

    // A 2.0 body with the media type spelt otherwise (a space, the value quoted, upper
    // case) and no version header is forwarded under the headers of what weir read it as:
    // a receiver that matches them exactly (Mimir) takes what weir charged as 2.0.
    let response = weir
        .client
        .post(weir.url("/api/v1/push"))
        .header("Content-Encoding", "SNAPPY")
        .header(
            "Content-Type",
            "Application/X-Protobuf; proto=\"io.prometheus.write.v2.Request\"",
        )
        .header("X-Scope-OrgID", "t")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let received = receiver.received.lock().unwrap().clone();
    let (headers, forwarded) = &received[1];
    assert_eq!(forwarded.as_ref(), body.as_slice());
    assert_eq!(headers["content-type"], V2);
    assert_eq!(headers["content-encoding"], "snappy");
    assert_eq!(headers["x-prometheus-remote-write-version"], "2.0.0");
    weir.stop().await.unwrap();
}

//! `POST /otlp/v1/metrics` over real HTTP. The client that matters is one this project did not
//! write: the OpenTelemetry Python SDK's OTLP/HTTP exporter (`tests/otlp/export.py` drives it;
//! `scripts/test` installs it). Its expected charge comes from `tests/otlp/mimir_charge.py`,
//! the counting rules written down from Mimir's translator, independently of weir's code.
//! Forwarding goes to a real HTTP receiver in this process that records what it gets.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use common::{Options, Weir};
use prost::Message;
use weir::otlp::RpcStatus;

const SAMPLE: &[u8] = include_bytes!("otlp/sample.json");

fn python_sdk_installed() -> bool {
    Command::new("python3")
        .args([
            "-c",
            "import opentelemetry.sdk, opentelemetry.exporter.otlp.proto.http",
        ])
        .status()
        .is_ok_and(|status| status.success())
}

/// Runs `export.py` against `weir` and returns its JSON report.
async fn export(weir: &Weir, tenant: &str, args: &[&str]) -> serde_json::Value {
    assert!(
        python_sdk_installed(),
        "the OpenTelemetry Python SDK is missing: python3 -m pip install opentelemetry-sdk \
         opentelemetry-exporter-otlp-proto-http (scripts/test installs it)"
    );
    let endpoint = weir.url("/otlp/v1/metrics");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/otlp/export.py");
    let mut command = tokio::process::Command::new("python3");
    command
        .arg(script)
        .args(["--endpoint", &endpoint, "--tenant", tenant, "--quiet"])
        .args(args);
    let output = command.output().await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap_or_else(|err| {
        panic!(
            "export.py printed {stdout:?} ({err}); stderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

async fn counter(weir: &Weir, family: &str, labels: &str) -> u64 {
    weir.metric(&format!("{family}{{{labels}}}"))
        .await
        .unwrap_or(0.0) as u64
}

#[tokio::test]
async fn the_python_sdk_exporter_is_charged_what_mimir_would_charge() {
    // `otel` keeps exemplars; `plain` has Mimir's default, exemplars off.
    let weir = Weir::with_overrides(
        "overrides:\n  otel:\n    ingestion_rate: 1000000\n    ingestion_burst_size: 1000000\n    \
         max_global_exemplars_per_user: 100000\n  \
         plain:\n    ingestion_rate: 1000000\n    ingestion_burst_size: 1000000\n",
    )
    .await;
    for (tenant, compression) in [("otel", "gzip"), ("otel", "none"), ("plain", "gzip")] {
        let before = admitted(&weir, tenant).await;
        let report = export(
            &weir,
            tenant,
            &[
                "--kind",
                "all",
                "--points",
                "7",
                "--metrics",
                "2",
                "--bounds",
                "5",
                "--exemplars",
                "1",
                "--compression",
                compression,
            ],
        )
        .await;
        assert_eq!(report["result"], "SUCCESS", "{report}");
        assert_eq!(report["attempts"][0]["status"], 200, "{report}");
        // Mimir's charge for the tenant's setting: with exemplars enabled, or its default.
        let expected = if tenant == "otel" {
            &report["expected_with_exemplars"]
        } else {
            &report["expected"]
        };
        let samples =
            expected["samples"].as_u64().unwrap() + expected["histograms"].as_u64().unwrap();
        assert!(samples > 100, "a real workload: {report}");
        if tenant == "otel" {
            assert!(expected["exemplars"].as_u64().unwrap() > 0, "{report}");
        }
        let after = admitted(&weir, tenant).await;
        assert_eq!(after[0] - before[0], samples, "{report}");
        assert_eq!(
            after[1] - before[1],
            expected["exemplars"].as_u64().unwrap(),
            "{report}"
        );
        assert_eq!(
            after[2] - before[2],
            expected["metadata"].as_u64().unwrap(),
            "{report}"
        );
    }
}

#[tokio::test]
async fn a_tenant_s_translation_settings_change_the_charge_as_they_change_mimir_s() {
    // `converting` has its classic histograms made native ones with custom buckets and its
    // delta temporality taken (and keeps exemplars); `plain` has Mimir's defaults, which refuse
    // delta sums and histograms.
    let weir = Weir::with_overrides(
        "overrides:\n  converting:\n    ingestion_rate: 1000000\n    ingestion_burst_size: 1000000\n    \
         max_global_exemplars_per_user: 100000\n    otel_convert_histograms_to_nhcb: true\n    \
         otel_native_delta_ingestion: true\n  \
         plain:\n    ingestion_rate: 1000000\n    ingestion_burst_size: 1000000\n",
    )
    .await;
    let args = |temporality| {
        [
            "--kind",
            "all",
            "--points",
            "5",
            "--bounds",
            "8",
            "--exemplars",
            "1",
            "--temporality",
            temporality,
        ]
    };
    for temporality in ["cumulative", "delta"] {
        let before = admitted(&weir, "converting").await;
        let report = export(&weir, "converting", &args(temporality)).await;
        assert_eq!(report["attempts"][0]["status"], 200, "{report}");
        let expected = &report["expected_converting"];
        // A classic histogram's point is one histogram: 5 of them, and 5 exponential ones.
        assert_eq!(expected["histograms"], 10, "{report}");
        let after = admitted(&weir, "converting").await;
        let items = |field: &str| expected[field].as_u64().unwrap();
        assert_eq!(
            [
                after[0] - before[0],
                after[1] - before[1],
                after[2] - before[2]
            ],
            [
                items("samples") + items("histograms"),
                items("exemplars"),
                items("metadata")
            ],
            "{temporality}: {report}"
        );
        assert_ne!(
            report["expected_converting"], report["expected_with_exemplars"],
            "the settings change Mimir's charge: {report}"
        );
    }
    // By default the delta metrics are left out and what is left is charged and written, and
    // the export answered 400 for what was left out, as Mimir answers it; each metric left
    // out counted as Mimir counts it.
    let before = admitted(&weir, "plain").await;
    let report = export(&weir, "plain", &args("delta")).await;
    assert_eq!(report["attempts"][0]["status"], 400, "{report}");
    let expected = &report["expected"];
    assert_eq!(expected["status"], 400, "{report}");
    let left_out = expected["errors"].as_array().unwrap().len() as u64;
    assert_eq!(
        left_out, 4,
        "the sums, the histogram, the exponential one: {report}"
    );
    let parse_errors = "reason=\"otlp_parse_error\",user=\"plain\"";
    assert_eq!(
        counter(&weir, "weir_discarded_samples_total", parse_errors).await,
        left_out
    );
    assert_eq!(expected["histograms"], 0, "{report}");
    let after = admitted(&weir, "plain").await;
    assert_eq!(
        after[0] - before[0],
        expected["samples"].as_u64().unwrap(),
        "{report}"
    );
}

/// A tenant's admitted samples (with histograms), exemplars and metadata.
async fn admitted(weir: &Weir, tenant: &str) -> [u64; 3] {
    let user = format!("user=\"{tenant}\"");
    [
        counter(weir, "weir_distributor_received_samples_total", &user).await,
        counter(weir, "weir_distributor_received_exemplars_total", &user).await,
        counter(weir, "weir_distributor_received_metadata_total", &user).await,
    ]
}

#[tokio::test]
async fn a_tenant_over_its_ingestion_rate_is_refused_with_429_and_retry_after() {
    let weir = Weir::with_overrides(
        "overrides:\n  small:\n    ingestion_rate: 1\n    ingestion_burst_size: 50\n",
    )
    .await;
    // 200 gauge points: over the whole burst, so it can never pass.
    let report = export(&weir, "small", &["--kind", "gauge", "--points", "200"]).await;
    assert_eq!(report["result"], "FAILURE", "{report}");
    let attempt = &report["attempts"][0];
    assert_eq!(attempt["status"], 429, "{report}");
    assert!(
        attempt["retry_after"]
            .as_str()
            .is_some_and(|value| !value.is_empty()),
        "{report}"
    );
    // Counted as Mimir counts a rate-limited push: its samples and its metadata entries apart.
    let expected = |kind: &str| report["expected"][kind].as_u64().unwrap();
    assert_eq!(
        counter(
            &weir,
            "weir_discarded_samples_total",
            r#"reason="ingestion_burst_exceeded",user="small""#
        )
        .await,
        expected("samples") + expected("histograms")
    );
    assert_eq!(
        counter(
            &weir,
            "weir_discarded_metadata_total",
            r#"reason="ingestion_burst_exceeded",user="small""#
        )
        .await,
        expected("metadata")
    );
    assert_eq!(
        counter(
            &weir,
            "weir_distributor_received_samples_total",
            r#"user="small""#
        )
        .await,
        0
    );

    // Within the burst it passes, then the bucket is empty: the next one is rate limited.
    let report = export(
        &weir,
        "small",
        &["--kind", "gauge", "--points", "30", "--resource", "none"],
    )
    .await;
    assert_eq!(report["result"], "SUCCESS", "{report}");
    let report = export(
        &weir,
        "small",
        &["--kind", "gauge", "--points", "30", "--resource", "none"],
    )
    .await;
    assert_eq!(report["attempts"][0]["status"], 429, "{report}");
    assert_eq!(
        counter(
            &weir,
            "weir_discarded_samples_total",
            r#"reason="rate_limited",user="small""#
        )
        .await,
        30
    );
    assert_eq!(
        counter(
            &weir,
            "weir_discarded_metadata_total",
            r#"reason="rate_limited",user="small""#
        )
        .await,
        1
    );
}

#[derive(Clone, Default)]
struct Receiver {
    received: Arc<Mutex<Vec<(String, HeaderMap, Bytes)>>>,
}

async fn receive(
    State(receiver): State<Receiver>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    receiver
        .received
        .lock()
        .unwrap()
        .push((uri.path().to_string(), headers, body));
    StatusCode::OK
}

async fn start_receiver() -> (SocketAddr, Receiver) {
    let receiver = Receiver::default();
    let app = Router::new()
        .route("/api/v1/push", post(receive))
        .route("/otlp/v1/metrics", post(receive))
        .with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, receiver)
}

/// A weir forwarding to the receiver at `addr`, with these overrides. Mimir's push path: OTLP
/// goes to the same host's `/otlp/v1/metrics` by default.
async fn forwarding_to(addr: SocketAddr, overrides: &str) -> Weir {
    Weir::start(Options {
        configure: Box::new(move |config| {
            config.upstream = Some(format!("http://{addr}/api/v1/push"));
        }),
        overrides: overrides.into(),
        ..Options::default()
    })
    .await
}

/// Sends `body`, an OTLP protobuf export, for `tenant`.
async fn export_protobuf(weir: &Weir, tenant: &str, body: Vec<u8>) -> reqwest::Response {
    reqwest::Client::new()
        .post(weir.url("/otlp/v1/metrics"))
        .header("X-Scope-OrgID", tenant)
        .header("Content-Type", "application/x-protobuf")
        .body(body)
        .send()
        .await
        .unwrap()
}

fn gzip(raw: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(raw).unwrap();
    encoder.finish().unwrap()
}

/// Now, in the Unix nanoseconds of an OTLP point.
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// An export of six gauges at now, in two parts: one gauge, then five.
fn one_and_five_gauges() -> (Vec<u8>, Vec<u8>) {
    let now = now_ns();
    let first = one_scope(vec![gauge_of_one("a".into(), String::new(), now)]);
    let rest = one_scope(
        (0..5)
            .map(|i| gauge_of_one(format!("b{i}"), String::new(), now))
            .collect(),
    );
    (first, rest)
}

/// A string attribute.
/// How many data points each metric of an encoded export's first scope has (gauges and sums).
fn points_of(export: &[u8]) -> Vec<usize> {
    use weir::otlp::proto::{metrics, ExportMetricsServiceRequest};
    let export = ExportMetricsServiceRequest::decode(export).unwrap();
    export.resource_metrics[0].scope_metrics[0]
        .metrics
        .iter()
        .map(|metric| match &metric.data {
            Some(metrics::metric::Data::Sum(sum)) => sum.data_points.len(),
            Some(metrics::metric::Data::Gauge(gauge)) => gauge.data_points.len(),
            other => panic!("{other:?}"),
        })
        .collect()
}

/// An export of `metrics` in one scope of one resource with no attributes, encoded.
fn one_scope(metrics: Vec<weir::otlp::proto::metrics::Metric>) -> Vec<u8> {
    use weir::otlp::proto::{metrics, resource, ExportMetricsServiceRequest};
    ExportMetricsServiceRequest {
        resource_metrics: vec![metrics::ResourceMetrics {
            resource: Some(resource::Resource::default()),
            scope_metrics: vec![metrics::ScopeMetrics {
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

fn kv(key: &str, value: &str) -> weir::otlp::proto::common::KeyValue {
    use weir::otlp::proto::common;
    common::KeyValue {
        key: key.into(),
        value: Some(common::AnyValue {
            value: Some(common::any_value::Value::StringValue(value.into())),
        }),
    }
}

/// A gauge with one point of value 1 at `time_unix_nano`.
fn gauge_of_one(
    name: String,
    unit: String,
    time_unix_nano: u64,
) -> weir::otlp::proto::metrics::Metric {
    use weir::otlp::proto::metrics;
    metrics::Metric {
        name,
        unit,
        data: Some(metrics::metric::Data::Gauge(metrics::Gauge {
            data_points: vec![metrics::NumberDataPoint {
                time_unix_nano,
                value: Some(metrics::number_data_point::Value::AsInt(1)),
                ..Default::default()
            }],
        })),
        ..Default::default()
    }
}

fn gunzip(compressed: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(compressed)
        .read_to_end(&mut raw)
        .unwrap();
    raw
}

#[tokio::test]
async fn json_and_gzip_are_counted_and_forwarded_to_the_otlp_path_without_exemplars_when_off() {
    let (addr, receiver) = start_receiver().await;
    // `traced` keeps exemplars; `json-tenant` has Mimir's default, exemplars off.
    let weir = forwarding_to(
        addr,
        "overrides:\n  traced:\n    max_global_exemplars_per_user: 100000\n",
    )
    .await;
    let body = gzip(SAMPLE);
    for tenant in ["traced", "json-tenant"] {
        let response = reqwest::Client::new()
            .post(weir.url("/otlp/v1/metrics"))
            .header("X-Scope-OrgID", tenant)
            .header("Content-Type", "application/json")
            .header("Content-Encoding", "gzip")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        // `sample.empty` has no data points: Mimir 3.0.3 leaves it out, charges and writes
        // the rest, and answers 400 (a real Mimir, 2026-12-06: `otlp parse error: empty data
        // points. sample.empty is dropped`).
        assert_eq!(response.status(), 400);
        assert_eq!(response.headers()["content-type"], "application/json");
        let answer: serde_json::Value = response.json().await.unwrap();
        assert_eq!(answer["code"], 400, "{answer}");
        let message = answer["message"].as_str().unwrap();
        assert!(
            message.starts_with("otlp parse error: metric \"sample.empty\": empty data points"),
            "{message}"
        );
    }
    assert_eq!(
        counter(
            &weir,
            "weir_discarded_samples_total",
            r#"reason="otlp_parse_error",user="json-tenant""#
        )
        .await,
        1
    );

    let received = receiver.received.lock().unwrap().clone();
    assert_eq!(received.len(), 2);
    for (path, headers, _) in &received {
        assert_eq!(path, "/otlp/v1/metrics");
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(headers["content-encoding"], "gzip");
        assert!(headers.get("x-prometheus-remote-write-version").is_none());
    }
    let (_, headers, forwarded) = &received[0];
    assert_eq!(headers["x-scope-orgid"], "traced");
    assert_eq!(
        forwarded.as_ref(),
        &body[..],
        "the client's bytes, unchanged"
    );
    // With exemplars off, the export without them: every other field as sent.
    let (_, headers, forwarded) = &received[1];
    assert_eq!(headers["x-scope-orgid"], "json-tenant");
    let json =
        |bytes: &[u8]| -> serde_json::Value { serde_json::from_slice(&gunzip(bytes)).unwrap() };
    let mut expected = json(&body);
    let mut cut = 0;
    for resource in expected["resourceMetrics"].as_array_mut().unwrap() {
        for scope in resource["scopeMetrics"].as_array_mut().unwrap() {
            for metric in scope["metrics"].as_array_mut().unwrap() {
                for (_, data) in metric.as_object_mut().unwrap().iter_mut() {
                    let Some(points) = data.get_mut("dataPoints") else {
                        continue;
                    };
                    for point in points.as_array_mut().unwrap() {
                        let exemplars = point.as_object_mut().unwrap().remove("exemplars");
                        cut += exemplars.map_or(0, |e| e.as_array().unwrap().len());
                    }
                }
            }
        }
    }
    // tests/otlp/sample.expected.json: `otlp_exemplars`, the gauge's among them.
    assert_eq!(cut, 3);
    assert_eq!(json(forwarded), expected);

    // tests/otlp/sample.expected.json: 21 samples + 1 histogram + 7 metadata, and its 2
    // exemplars that Mimir translates when the tenant keeps them.
    // (samples with histograms, exemplars, metadata)
    assert_eq!(admitted(&weir, "traced").await, [22, 2, 7]);
    assert_eq!(admitted(&weir, "json-tenant").await, [22, 0, 7]);
}

/// An export is charged as weir reads it and forwarded under the headers of what it read:
/// every member of a gzip body (Go's reader, Mimir's, reads them all), and a media type or an
/// encoding spelt otherwise than a receiver that matches them exactly (Mimir) would take.
#[tokio::test]
async fn an_export_is_charged_whole_and_forwarded_under_the_headers_weir_read_it_by() {
    let (addr, receiver) = start_receiver().await;
    let weir = forwarding_to(addr, "").await;
    let (first, rest) = one_and_five_gauges();
    let now = now_ns();
    let members = [gzip(&first), gzip(&rest)].concat();
    let response = reqwest::Client::new()
        .post(weir.url("/otlp/v1/metrics"))
        .header("X-Scope-OrgID", "members")
        .header("Content-Type", "Application/X-Protobuf; foo=bar")
        .header("Content-Encoding", "GZIP")
        .body(members.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        admitted(&weir, "members").await[0],
        6,
        "both members charged"
    );
    let (_, headers, forwarded) = receiver.received.lock().unwrap().remove(0);
    assert_eq!(
        forwarded.as_ref(),
        &members[..],
        "the client's bytes, unchanged"
    );
    assert_eq!(headers["content-type"], "application/x-protobuf");
    assert_eq!(headers["content-encoding"], "gzip");

    let body = format!(
        r#"{{"resourceMetrics":[{{"scopeMetrics":[{{"metrics":[{{"name":"j","gauge":{{"dataPoints":[{{"asDouble":1,"timeUnixNano":"{now}"}}]}}}}]}}]}}]}}"#
    );
    let response = reqwest::Client::new()
        .post(weir.url("/otlp/v1/metrics"))
        .header("X-Scope-OrgID", "charset")
        .header("Content-Type", "application/json; charset=utf-8")
        .header("Content-Encoding", "identity")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(admitted(&weir, "charset").await[0], 1);
    let (_, headers, forwarded) = receiver.received.lock().unwrap().remove(0);
    assert_eq!(forwarded.as_ref(), body.as_bytes());
    assert_eq!(headers["content-type"], "application/json");
    assert!(headers.get("content-encoding").is_none(), "{headers:?}");
}

/// LZ4 and Zstandard exports, which Mimir reads: every frame charged, the client's bytes
/// forwarded under their encoding, and an export weir edits (exemplars cut for a tenant with
/// them off) forwarded in the encoding it came in.
#[tokio::test]
async fn lz4_and_zstd_exports_are_charged_whole_and_forwarded_in_their_encoding() {
    use std::io::{Read, Write};
    let (addr, receiver) = start_receiver().await;
    let weir = forwarding_to(addr, "").await;
    let lz4 = |raw: &[u8]| {
        let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::new());
        encoder.write_all(raw).unwrap();
        encoder.finish().unwrap()
    };
    let unlz4 = |compressed: &[u8]| {
        let mut raw = Vec::new();
        lz4_flex::frame::FrameDecoder::new(compressed)
            .read_to_end(&mut raw)
            .unwrap();
        raw
    };
    let zstd = |raw: &[u8]| zstd::encode_all(raw, 3).unwrap();
    let unzstd = |compressed: &[u8]| zstd::decode_all(compressed).unwrap();
    type Codec<'a> = (
        &'a str,
        &'a dyn Fn(&[u8]) -> Vec<u8>,
        &'a dyn Fn(&[u8]) -> Vec<u8>,
    );
    let codecs: [Codec; 2] = [("lz4", &lz4, &unlz4), ("zstd", &zstd, &unzstd)];

    let (first, rest) = one_and_five_gauges();
    for (name, compress, decompress) in codecs {
        let tenant = format!("frames-{name}");
        let frames = [compress(&first), compress(&rest)].concat();
        let response = reqwest::Client::new()
            .post(weir.url("/otlp/v1/metrics"))
            .header("X-Scope-OrgID", &tenant)
            .header("Content-Type", "application/x-protobuf")
            .header("Content-Encoding", name)
            .body(frames.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{name}");
        assert_eq!(admitted(&weir, &tenant).await[0], 6, "{name}: both frames");
        let (path, headers, forwarded) = receiver.received.lock().unwrap().remove(0);
        assert_eq!(path, "/otlp/v1/metrics");
        assert_eq!(
            forwarded.as_ref(),
            &frames[..],
            "{name}: the client's bytes"
        );
        assert_eq!(headers["content-encoding"], name);
        assert_eq!(headers["content-type"], "application/x-protobuf");

        // Mimir's default tenant has exemplars off: the export is edited, then compressed
        // again as it came.
        let tenant = format!("json-{name}");
        let response = reqwest::Client::new()
            .post(weir.url("/otlp/v1/metrics"))
            .header("X-Scope-OrgID", &tenant)
            .header("Content-Type", "application/json")
            .header("Content-Encoding", name)
            .body(compress(SAMPLE))
            .send()
            .await
            .unwrap();
        // `sample.empty` has no data points: charged and forwarded without it, answered 400.
        assert_eq!(response.status(), 400, "{name}");
        assert_eq!(admitted(&weir, &tenant).await, [22, 0, 7], "{name}");
        let (_, headers, forwarded) = receiver.received.lock().unwrap().remove(0);
        assert_eq!(headers["content-encoding"], name);
        assert_eq!(headers["content-type"], "application/json");
        let json: serde_json::Value = serde_json::from_slice(&decompress(&forwarded)).unwrap();
        assert!(json["resourceMetrics"]
            .as_array()
            .is_some_and(|r| !r.is_empty()));
        fn exemplars(value: &serde_json::Value) -> usize {
            match value {
                serde_json::Value::Object(fields) => fields
                    .iter()
                    .map(|(key, value)| {
                        let here = value.as_array().filter(|_| key == "exemplars");
                        here.map_or(0, Vec::len) + exemplars(value)
                    })
                    .sum(),
                serde_json::Value::Array(items) => items.iter().map(exemplars).sum(),
                _ => 0,
            }
        }
        assert_eq!(exemplars(&json), 0, "{name}: {json}");
        let sent: serde_json::Value = serde_json::from_slice(SAMPLE).unwrap();
        assert_eq!(exemplars(&sent), 3);
    }
}

#[tokio::test]
async fn bad_requests_get_the_right_status_and_an_rpc_status_body() {
    let weir = Weir::with_overrides("").await;
    let client = reqwest::Client::new();
    let send = |content_type: &'static str, encoding: Option<&'static str>, body: Vec<u8>| {
        let mut request = client
            .post(weir.url("/otlp/v1/metrics"))
            .header("X-Scope-OrgID", "t")
            .header("Content-Type", content_type)
            .body(body);
        if let Some(encoding) = encoding {
            request = request.header("Content-Encoding", encoding);
        }
        request.send()
    };

    let response = send("text/plain", None, b"x".to_vec()).await.unwrap();
    assert_eq!(response.status(), 415);
    assert_eq!(response.headers()["content-type"], "application/x-protobuf");
    let status = RpcStatus::decode(response.bytes().await.unwrap()).unwrap();
    assert!(status.message.contains("application/json"), "{status:?}");

    let response = send("application/x-protobuf", Some("br"), b"x".to_vec())
        .await
        .unwrap();
    assert_eq!(response.status(), 415);
    let status = RpcStatus::decode(response.bytes().await.unwrap()).unwrap();
    assert!(status.message.contains("gzip, lz4, zstd"), "{status:?}");

    let response = send("application/json", None, b"{not json".to_vec())
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(response.headers()["content-type"], "application/json");
    let status: serde_json::Value = response.json().await.unwrap();
    // A body Mimir's parser refuses is an HTTP error there: its status is the code.
    assert_eq!(status["code"], 400);
    assert!(
        status["message"].as_str().unwrap().contains("invalid JSON"),
        "{status}"
    );

    let response = send("application/x-protobuf", None, vec![0xff; 16])
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let status = RpcStatus::decode(response.bytes().await.unwrap()).unwrap();
    assert!(status.message.contains("invalid protobuf"), "{status:?}");

    for encoding in ["gzip", "lz4", "zstd"] {
        let response = send("application/x-protobuf", Some(encoding), b"not it".to_vec())
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{encoding}");
        let status = RpcStatus::decode(response.bytes().await.unwrap()).unwrap();
        assert!(
            status.message.contains(&format!("invalid {encoding} body")),
            "{status:?}"
        );
    }

    // Only delta temporality: nothing Mimir would ingest, so nothing is charged: 400.
    let delta = br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"d","sum":{"aggregationTemporality":1,"dataPoints":[{"asInt":"1"}]}}]}]}]}"#;
    let response = send("application/json", None, delta.to_vec())
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert!(response.text().await.unwrap().contains("cumulative"));

    // No tenant: 401, as for remote write.
    let response = client
        .post(weir.url("/otlp/v1/metrics"))
        .header("Content-Type", "application/json")
        .body(SAMPLE)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    assert_eq!(
        counter(
            &weir,
            "weir_distributor_received_samples_total",
            r#"user="t""#
        )
        .await,
        0
    );
}

/// Mimir checks the series an export becomes; weir checks the series the export would become,
/// cuts the failing data points from the forwarded export, charges the rest and answers 400
/// with the first failure, as Mimir answers a partly refused push.
#[tokio::test]
async fn a_data_point_whose_series_fails_mimir_s_checks_is_cut_and_answered_400() {
    use weir::otlp::proto::{metrics, resource, ExportMetricsServiceRequest};
    let (addr, receiver) = start_receiver().await;
    let weir = forwarding_to(addr, "overrides:\n  v:\n    max_label_value_length: 64\n").await;
    let now_ns = now_ns();
    let point = |path: &str| metrics::NumberDataPoint {
        attributes: vec![kv("url.path", path)],
        time_unix_nano: now_ns,
        value: Some(metrics::number_data_point::Value::AsInt(1)),
        ..Default::default()
    };
    let long = format!("/{}", "x".repeat(64));
    let export = ExportMetricsServiceRequest {
        resource_metrics: vec![metrics::ResourceMetrics {
            resource: Some(resource::Resource {
                attributes: vec![kv("service.name", "api")],
                ..Default::default()
            }),
            scope_metrics: vec![metrics::ScopeMetrics {
                metrics: vec![metrics::Metric {
                    name: "http.server.requests".into(),
                    data: Some(metrics::metric::Data::Gauge(metrics::Gauge {
                        data_points: vec![point("/a"), point(&long), point("/b")],
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let response = export_protobuf(&weir, "v", export.encode_to_vec()).await;
    assert_eq!(response.status(), 400);
    let status = RpcStatus::decode(response.bytes().await.unwrap()).unwrap();
    assert_eq!(status.code, 3, "INVALID_ARGUMENT");
    assert!(
        status
            .message
            .contains("label value length exceeds the limit")
            && status.message.contains("label: 'url_path'"),
        "{status:?}"
    );

    // The receiver got the export without the refused point.
    let received = receiver.received.lock().unwrap().clone();
    assert_eq!(received.len(), 1);
    let (path, _, forwarded) = &received[0];
    assert_eq!(path, "/otlp/v1/metrics");
    let forwarded = ExportMetricsServiceRequest::decode(forwarded.as_ref()).unwrap();
    let Some(metrics::metric::Data::Gauge(gauge)) =
        &forwarded.resource_metrics[0].scope_metrics[0].metrics[0].data
    else {
        panic!("{forwarded:?}")
    };
    assert_eq!(gauge.data_points, vec![point("/a"), point("/b")]);
    // Charged: the two samples kept and the family's metadata; the refused one counted.
    assert_eq!(admitted(&weir, "v").await, [2, 0, 1]);
    assert_eq!(
        counter(
            &weir,
            "weir_discarded_samples_total",
            r#"reason="label_value_too_long",user="v""#
        )
        .await,
        1
    );
}

/// Mimir's metadata checks on the entries an export's translation makes: a family name or a
/// unit (as the translator names it) over `max_metadata_length` (1 024 by default) refuses
/// the entry, which is neither charged nor kept, and the push is answered 400; the series go
/// on, so the export is forwarded as sent. A unit in braces is left out by the translator, so
/// however long it is it passes.
#[tokio::test]
async fn a_metadata_entry_over_max_metadata_length_is_refused_and_its_series_forwarded() {
    use weir::otlp::proto::{metrics, resource, ExportMetricsServiceRequest};
    let (addr, receiver) = start_receiver().await;
    let weir = forwarding_to(addr, "").await;
    let now_ns = now_ns();
    let gauge = |name: String, unit: String| gauge_of_one(name, unit, now_ns);
    let export = ExportMetricsServiceRequest {
        resource_metrics: vec![metrics::ResourceMetrics {
            resource: Some(resource::Resource {
                attributes: vec![kv("service.name", "api")],
                ..Default::default()
            }),
            scope_metrics: vec![metrics::ScopeMetrics {
                metrics: vec![
                    // 1 025 bytes as a unit, and one byte under: the limit's two sides.
                    gauge("queue.depth".into(), "x".repeat(1025)),
                    gauge("queue.size".into(), "x".repeat(1024)),
                    // A family name of 1 030 bytes: a label value under the 2 048 limit.
                    gauge("n".repeat(1030), "By".into()),
                    gauge("queue.age".into(), format!("{{{}}}", "x".repeat(1100))),
                ],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let sent = export.encode_to_vec();
    let response = export_protobuf(&weir, "m", sent.clone()).await;
    assert_eq!(response.status(), 400);
    let status = RpcStatus::decode(response.bytes().await.unwrap()).unwrap();
    assert!(
        status
            .message
            .contains("metric metadata whose unit name length exceeds the limit")
            && status.message.contains("metric name: 'queue_depth'"),
        "{status:?}"
    );
    // Forwarded as sent: the series all passed.
    let received = receiver.received.lock().unwrap().clone();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].2.as_ref(), &sent[..]);
    // Charged: the four samples and the two entries kept.
    assert_eq!(admitted(&weir, "m").await, [4, 0, 2]);
    for reason in ["unit_too_long", "metric_name_too_long"] {
        let labels = format!(r#"reason="{reason}",user="m""#);
        let refused = counter(&weir, "weir_discarded_metadata_total", &labels).await;
        assert_eq!(refused, 1, "{reason}");
    }
}

/// The OpenTelemetry Python SDK's exporter, against a tenant whose series may have 3 labels: a
/// gauge's or a sum's point (`series`, `job`, `__name__`) passes, a histogram's or a summary's
/// does not (its bucket and quantile series add `le` and `quantile`). Those points are cut
/// from what the receiver gets, counted, and the exporter hears 400, which it does not retry.
#[tokio::test]
async fn the_python_sdk_exporter_s_points_that_fail_mimir_s_checks_are_cut() {
    use weir::otlp::proto::{metrics::metric::Data, ExportMetricsServiceRequest};
    let (addr, receiver) = start_receiver().await;
    let weir = forwarding_to(
        addr,
        "overrides:\n  small:\n    max_label_names_per_series: 3\n",
    )
    .await;
    let report = export(
        &weir,
        "small",
        &[
            "--kind",
            "all",
            "--points",
            "3",
            "--metrics",
            "1",
            "--bounds",
            "2",
            "--resource",
            "service",
        ],
    )
    .await;
    assert_eq!(report["result"], "FAILURE", "{report}");
    assert_eq!(report["attempts"].as_array().unwrap().len(), 1, "{report}");
    assert_eq!(report["attempts"][0]["status"], 400, "{report}");

    let received = receiver.received.lock().unwrap().clone();
    assert_eq!(received.len(), 1, "the valid rest is forwarded");
    let forwarded = ExportMetricsServiceRequest::decode(received[0].2.as_ref()).unwrap();
    let mut kept = Vec::new();
    for metric in forwarded
        .resource_metrics
        .iter()
        .flat_map(|resource| &resource.scope_metrics)
        .flat_map(|scope| &scope.metrics)
    {
        let (kind, points) = match metric.data.as_ref().unwrap() {
            Data::Gauge(gauge) => ("gauge", gauge.data_points.len()),
            Data::Sum(sum) => ("sum", sum.data_points.len()),
            Data::ExponentialHistogram(h) => ("exponential", h.data_points.len()),
            Data::Histogram(h) => ("histogram", h.data_points.len()),
            Data::Summary(summary) => ("summary", summary.data_points.len()),
        };
        kept.push((kind, points));
    }
    kept.sort();
    assert_eq!(
        kept,
        [
            ("exponential", 3),
            ("gauge", 3),
            ("histogram", 0),
            ("sum", 3),
            ("sum", 3),
            ("summary", 0)
        ],
        "{report}"
    );
    // Each histogram point: 2 buckets, `+Inf`, `_count` and `_sum`.
    let discarded = counter(
        &weir,
        "weir_discarded_samples_total",
        r#"reason="max_label_names_per_series",user="small""#,
    )
    .await;
    assert!(discarded >= 3 * 5, "{discarded}");
}

#[tokio::test]
async fn the_python_sdk_exporter_s_exemplars_reach_the_receiver_only_when_the_tenant_keeps_them() {
    use weir::otlp::proto::{metrics::metric::Data, ExportMetricsServiceRequest};
    let (addr, receiver) = start_receiver().await;
    // `traced` keeps exemplars; `plain` has Mimir's default, exemplars off.
    let weir = forwarding_to(
        addr,
        "overrides:\n  traced:\n    max_global_exemplars_per_user: 100000\n",
    )
    .await;
    for (tenant, compression) in [("traced", "gzip"), ("plain", "gzip"), ("plain", "none")] {
        let report = export(
            &weir,
            tenant,
            &[
                "--kind",
                "all",
                "--points",
                "3",
                "--metrics",
                "1",
                "--exemplars",
                "1",
                "--compression",
                compression,
            ],
        )
        .await;
        assert_eq!(report["result"], "SUCCESS", "{report}");
    }
    let received = receiver.received.lock().unwrap().clone();
    assert_eq!(received.len(), 3);
    let exemplars = |(_, headers, body): &(String, HeaderMap, Bytes)| -> usize {
        let raw = if headers
            .get("content-encoding")
            .is_some_and(|encoding| encoding == "gzip")
        {
            gunzip(body)
        } else {
            body.to_vec()
        };
        let export = ExportMetricsServiceRequest::decode(&raw[..]).unwrap();
        export
            .resource_metrics
            .iter()
            .flat_map(|resource| &resource.scope_metrics)
            .flat_map(|scope| &scope.metrics)
            .map(|metric| match metric.data.as_ref().unwrap() {
                Data::Gauge(g) => g.data_points.iter().map(|p| p.exemplars.len()).sum(),
                Data::Sum(s) => s.data_points.iter().map(|p| p.exemplars.len()).sum(),
                Data::Histogram(h) => h.data_points.iter().map(|p| p.exemplars.len()).sum(),
                Data::ExponentialHistogram(h) => {
                    h.data_points.iter().map(|p| p.exemplars.len()).sum()
                }
                Data::Summary(_) => 0,
            })
            .sum()
    };
    assert!(exemplars(&received[0]) > 0, "the SDK sent exemplars");
    assert_eq!(received[1].1["content-encoding"], "gzip");
    assert_eq!(exemplars(&received[1]), 0);
    assert_eq!(exemplars(&received[2]), 0);
}

/// An HA pair of OTLP senders, deduplicated as Mimir's distributor deduplicates it: the HA
/// tracker reads `cluster` and `__replica__` from the first series the export translates to,
/// its first data point (attributes, then `job` and `instance`); the elected replica's export
/// is forwarded without `__replica__` (on its points and its resource, whose `target_info` it
/// would label), the other's is answered 202 with Mimir's message as a `google.rpc.Status`,
/// neither forwarded nor charged; the election is shared with remote-write pushes; a replica
/// label on the resource only, which Mimir's translation does not promote, is not HA.
#[tokio::test]
async fn an_otlp_ha_pair_is_deduplicated_on_its_first_series() {
    use weir::otlp::proto::{common, metrics, resource, ExportMetricsServiceRequest};
    let (addr, receiver) = start_receiver().await;
    let weir = forwarding_to(
        addr,
        "overrides:\n  ha:\n    accept_ha_samples: true\n    ha_max_clusters: 1\n    \
         ingestion_rate: 100000\n",
    )
    .await;
    let now_ns = now_ns();
    // Two points labelled `point`, and `resource` on the resource (then `target_info`).
    let export = |point: &[(&str, &str)], resource: &[(&str, &str)]| {
        let point = |path: &str| metrics::NumberDataPoint {
            attributes: [("path", path)]
                .iter()
                .chain(point)
                .map(|(key, value)| kv(key, value))
                .collect(),
            time_unix_nano: now_ns,
            value: Some(metrics::number_data_point::Value::AsInt(1)),
            ..Default::default()
        };
        ExportMetricsServiceRequest {
            resource_metrics: vec![metrics::ResourceMetrics {
                resource: Some(resource::Resource {
                    attributes: [("service.name", "api")]
                        .iter()
                        .chain(resource)
                        .map(|(key, value)| kv(key, value))
                        .collect(),
                    ..Default::default()
                }),
                scope_metrics: vec![metrics::ScopeMetrics {
                    metrics: vec![metrics::Metric {
                        name: "requests".into(),
                        data: Some(metrics::metric::Data::Gauge(metrics::Gauge {
                            data_points: vec![point("/a"), point("/b")],
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    };
    let client = reqwest::Client::new();
    let send = |body: Vec<u8>, content_type: &'static str| {
        client
            .post(weir.url("/otlp/v1/metrics"))
            .header("X-Scope-OrgID", "ha")
            .header("Content-Type", content_type)
            .body(body)
            .send()
    };
    let keys = |attributes: &[common::KeyValue]| -> Vec<String> {
        attributes.iter().map(|kv| kv.key.clone()).collect()
    };
    let charged = || weir.metric("weir_distributor_received_samples_total{user=\"ha\"}");

    // Replica a is elected by its first export, which goes on without `__replica__`.
    let from_a = export(
        &[("cluster", "c1"), ("__replica__", "a")],
        &[("__replica__", "a"), ("region", "eu")],
    );
    let response = send(from_a.encode_to_vec(), "application/x-protobuf")
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
    let received = receiver.received.lock().unwrap().split_off(0);
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].0, "/otlp/v1/metrics");
    let forwarded = ExportMetricsServiceRequest::decode(received[0].2.clone()).unwrap();
    let resource = &forwarded.resource_metrics[0];
    assert_eq!(
        keys(&resource.resource.as_ref().unwrap().attributes),
        ["service.name", "region"]
    );
    let Some(metrics::metric::Data::Gauge(gauge)) = &resource.scope_metrics[0].metrics[0].data
    else {
        panic!("a gauge: {forwarded:?}");
    };
    for point in &gauge.data_points {
        assert_eq!(keys(&point.attributes), ["path", "cluster"]);
    }
    let after_a = charged().await.unwrap_or(0.0);
    assert_eq!(after_a, 3.0, "two points and target_info");

    // Replica b's export, protobuf or JSON, is answered 202 and goes nowhere.
    let from_b = export(&[("cluster", "c1"), ("__replica__", "b")], &[]);
    let json = serde_json::json!({"resourceMetrics": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "api"}}]},
        "scopeMetrics": [{"metrics": [{"name": "requests", "gauge": {"dataPoints": [{
            "attributes": [
                {"key": "cluster", "value": {"stringValue": "c1"}},
                {"key": "__replica__", "value": {"stringValue": "b"}}
            ],
            "timeUnixNano": now_ns.to_string(), "asInt": "1"
        }]}}]}]
    }]});
    for (body, content_type) in [
        (from_b.encode_to_vec(), "application/x-protobuf"),
        (json.to_string().into_bytes(), "application/json"),
    ] {
        let response = send(body, content_type).await.unwrap();
        assert_eq!(response.status(), 202, "{content_type}");
        let message = if content_type == "application/json" {
            let status: serde_json::Value = response.json().await.unwrap();
            status["message"].as_str().unwrap().to_string()
        } else {
            RpcStatus::decode(response.bytes().await.unwrap())
                .unwrap()
                .message
        };
        assert_eq!(
            message,
            "replicas did not match, rejecting sample: replica=b, elected=a"
        );
    }
    assert!(receiver.received.lock().unwrap().is_empty());
    assert_eq!(charged().await.unwrap_or(0.0), after_a, "b is not charged");
    assert_eq!(
        weir.metric("weir_distributor_deduped_samples_total{cluster=\"c1\",user=\"ha\"}")
            .await,
        Some(3.0),
        "b's two points (no target_info: its resource has only `service.name`), then the JSON export's one"
    );
    // Remote write shares the election.
    let v1 = weir::remote_write::prompb::WriteRequest {
        timeseries: vec![weir::remote_write::prompb::TimeSeries {
            labels: [("__name__", "up"), ("__replica__", "b"), ("cluster", "c1")]
                .iter()
                .map(|(name, value)| weir::remote_write::prompb::Label {
                    name: name.to_string(),
                    value: value.to_string(),
                })
                .collect(),
            samples: vec![weir::remote_write::prompb::Sample {
                value: 1.0,
                timestamp: (now_ns / 1_000_000) as i64,
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let response = weir.push_body(Some("ha"), v1.encode_snappy()).await;
    assert_eq!(response.status(), 202);

    // The replica label on the resource alone is not on the first series: not HA, forwarded
    // as sent.
    let resource_only = export(&[], &[("cluster", "c1"), ("__replica__", "b")]);
    let response = send(resource_only.encode_to_vec(), "application/x-protobuf")
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let received = receiver.received.lock().unwrap().split_off(0);
    assert_eq!(received[0].2, resource_only.encode_to_vec(), "as sent");
    assert_eq!(
        weir.metric("weir_distributor_non_ha_samples_received_total{user=\"ha\"}")
            .await,
        Some(3.0)
    );

    // A second cluster is one more than `ha_max_clusters`: 400.
    let other = export(&[("cluster", "c2"), ("__replica__", "a")], &[]);
    let response = send(other.encode_to_vec(), "application/x-protobuf")
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert!(receiver.received.lock().unwrap().is_empty());
}

/// The metrics Mimir's translation leaves out are counted as it counts them, as it
/// translates: also in an export its HA tracker then deduplicates, and in one of which
/// nothing translates (400, nothing charged).
#[tokio::test]
async fn metrics_left_out_are_counted_before_the_ha_tracker_and_when_nothing_translates() {
    use weir::otlp::proto::metrics;
    let (addr, _receiver) = start_receiver().await;
    let weir = forwarding_to(
        addr,
        "overrides:\n  ha:\n    accept_ha_samples: true\n    ha_max_clusters: 1\n",
    )
    .await;
    let now_ns = now_ns();
    let delta = metrics::Metric {
        name: "requests".into(),
        data: Some(metrics::metric::Data::Sum(metrics::Sum {
            data_points: vec![metrics::NumberDataPoint {
                time_unix_nano: now_ns,
                value: Some(metrics::number_data_point::Value::AsInt(1)),
                ..Default::default()
            }],
            aggregation_temporality: metrics::AggregationTemporality::Delta as i32,
            is_monotonic: true,
        })),
        ..Default::default()
    };
    let export = |replica: Option<&str>, with_gauge: bool| {
        let mut up = gauge_of_one("up".into(), String::new(), now_ns);
        if let (Some(replica), Some(metrics::metric::Data::Gauge(gauge))) = (replica, &mut up.data)
        {
            gauge.data_points[0].attributes = vec![kv("cluster", "c"), kv("__replica__", replica)];
        }
        if with_gauge {
            one_scope(vec![up, delta.clone()])
        } else {
            one_scope(vec![delta.clone()])
        }
    };
    let parse_errors = || {
        counter(
            &weir,
            "weir_discarded_samples_total",
            "reason=\"otlp_parse_error\",user=\"ha\"",
        )
    };
    // Replica a is elected; its delta sum is left out: 400 for it, `up` charged.
    let response = export_protobuf(&weir, "ha", export(Some("a"), true)).await;
    assert_eq!(response.status(), 400);
    let status = RpcStatus::decode(response.bytes().await.unwrap()).unwrap();
    assert!(
        status.message.starts_with("otlp parse error: "),
        "{status:?}"
    );
    assert_eq!(status.code, 400);
    assert_eq!(parse_errors().await, 1);
    assert_eq!(admitted(&weir, "ha").await, [1, 0, 1]);
    // Replica b's export is deduplicated (202), its delta sum counted all the same.
    let response = export_protobuf(&weir, "ha", export(Some("b"), true)).await;
    assert_eq!(response.status(), 202, "{:?}", response.text().await);
    assert_eq!(parse_errors().await, 2);
    // An export of the delta sum alone: nothing translates, 400, counted, nothing charged.
    let response = export_protobuf(&weir, "ha", export(None, false)).await;
    assert_eq!(response.status(), 400);
    let status = RpcStatus::decode(response.bytes().await.unwrap()).unwrap();
    assert!(
        status
            .message
            .contains("nothing in the request can be ingested"),
        "{status:?}"
    );
    assert_eq!(status.code, 400, "an HTTP error in Mimir, as the parser's");
    assert_eq!(parse_errors().await, 3);
    assert_eq!(admitted(&weir, "ha").await, [1, 0, 1]);
    weir.stop().await.unwrap();
}

/// `promote_otel_resource_attributes`, a comma-separated string as in Mimir: the promoted
/// resource attributes are labels of every series the export becomes, for Mimir's checks (a
/// point whose series now has too many labels is cut, answered 400, where the same export to
/// a tenant that promotes nothing passes) and for the HA tracker (cluster and replica carried
/// on the resource, as an OpenTelemetry Collector pair sets them).
#[tokio::test]
async fn promoted_resource_attributes_are_labels_for_the_checks_and_the_ha_tracker() {
    use weir::otlp::proto::{metrics, resource, ExportMetricsServiceRequest};
    let (addr, receiver) = start_receiver().await;
    let weir = forwarding_to(
        addr,
        "overrides:\n  p:\n    max_label_names_per_series: 4\n    \
         promote_otel_resource_attributes: k8s.namespace.name,k8s.pod.name,k8s.node.name\n  \
         q:\n    max_label_names_per_series: 4\n  \
         h:\n    accept_ha_samples: true\n    promote_otel_resource_attributes: cluster,__replica__\n",
    )
    .await;
    let now_ns = now_ns();
    let export = |resource: &[(&str, &str)]| {
        ExportMetricsServiceRequest {
            resource_metrics: vec![metrics::ResourceMetrics {
                resource: Some(resource::Resource {
                    attributes: resource.iter().map(|(key, value)| kv(key, value)).collect(),
                    ..Default::default()
                }),
                scope_metrics: vec![metrics::ScopeMetrics {
                    metrics: vec![gauge_of_one("up".into(), String::new(), now_ns)],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
        .encode_to_vec()
    };
    let pod = export(&[
        ("service.name", "api"),
        ("k8s.namespace.name", "ns"),
        ("k8s.pod.name", "pod-1"),
        ("k8s.node.name", "node-1"),
    ]);

    // `up{job, k8s_namespace_name, k8s_node_name, k8s_pod_name}`: five labels, over 4 (the
    // export's attributes alone, 3 resource ones and none on the point, could not be).
    let response = export_protobuf(&weir, "p", pod.clone()).await;
    assert_eq!(response.status(), 400);
    let status = RpcStatus::decode(response.bytes().await.unwrap()).unwrap();
    assert!(
        status.message.contains("max-label-names-per-series"),
        "{}",
        status.message
    );
    // `up{job}` for a tenant that promotes nothing.
    receiver.received.lock().unwrap().clear();
    let response = export_protobuf(&weir, "q", pod).await;
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
    assert_eq!(receiver.received.lock().unwrap().len(), 1, "forwarded");

    // The HA pair names itself on the resource only: promoted, it is a pair.
    let replica = |name: &str| {
        export(&[
            ("service.name", "collector"),
            ("cluster", "c1"),
            ("__replica__", name),
        ])
    };
    let response = export_protobuf(&weir, "h", replica("a")).await;
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
    let response = export_protobuf(&weir, "h", replica("b")).await;
    assert_eq!(response.status(), 202, "{:?}", response.text().await);
    weir.stop().await.unwrap();
}

/// A tenant's `metric_relabel_configs` on an export, as Mimir runs them on the series it
/// becomes: a point a rule drops is neither charged nor forwarded (20 dropped and 3 kept pass
/// a burst of 5), a point a rule changes is checked as the rule left it (a label dropped
/// cannot fail it), and a tenant whose rules are off is charged all of it.
#[tokio::test]
async fn a_promoted_scope_is_labels_for_the_checks() {
    use weir::otlp::proto::{common, metrics, resource, ExportMetricsServiceRequest};
    let (addr, receiver) = start_receiver().await;
    let weir = forwarding_to(
        addr,
        "overrides:\n  s:\n    max_label_value_length: 24\n    otel_promote_scope_metadata: true\n  \
         q:\n    max_label_value_length: 24\n",
    )
    .await;
    let now_ns = now_ns();
    let export = |version: &str| {
        ExportMetricsServiceRequest {
            resource_metrics: vec![metrics::ResourceMetrics {
                resource: Some(resource::Resource {
                    attributes: vec![kv("service.name", "api")],
                    ..Default::default()
                }),
                scope_metrics: vec![metrics::ScopeMetrics {
                    scope: Some(common::InstrumentationScope {
                        name: "io.opentelemetry.http".into(),
                        version: version.into(),
                        ..Default::default()
                    }),
                    metrics: vec![gauge_of_one("up".into(), String::new(), now_ns)],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
        .encode_to_vec()
    };
    // `otel_scope_version` of 30 characters, over 24, for the tenant that promotes scopes.
    let long = export(&"1".repeat(30));
    let response = export_protobuf(&weir, "s", long.clone()).await;
    assert_eq!(response.status(), 400);
    let status = RpcStatus::decode(response.bytes().await.unwrap()).unwrap();
    assert!(
        status.message.contains("otel_scope_version"),
        "{}",
        status.message
    );
    assert!(receiver.received.lock().unwrap().is_empty(), "nothing left");
    // The same export for a tenant that does not; a short version for the one that does.
    let response = export_protobuf(&weir, "q", long).await;
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
    let response = export_protobuf(&weir, "s", export("1.2")).await;
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
    assert_eq!(receiver.received.lock().unwrap().len(), 2, "forwarded");
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn with_suffixes_rules_see_the_names_mimir_gives_the_metrics() {
    use weir::otlp::proto::metrics;
    let (addr, receiver) = start_receiver().await;
    // The same rule for both tenants; only `sfx` names its metrics with suffixes, so only
    // its monotonic sum is `http_requests_total`.
    let rule = "    metric_relabel_configs:\n    - source_labels: [__name__]\n      \
                regex: http_requests_total\n      action: drop\n";
    let weir = forwarding_to(
        addr,
        &format!(
            "overrides:\n  sfx:\n    otel_metric_suffixes_enabled: true\n{rule}  plain:\n{rule}"
        ),
    )
    .await;
    let now_ns = now_ns();
    let requests = metrics::Metric {
        name: "http.requests".into(),
        data: Some(metrics::metric::Data::Sum(metrics::Sum {
            data_points: (0..4)
                .map(|i| metrics::NumberDataPoint {
                    attributes: vec![kv("route", &format!("/{i}"))],
                    time_unix_nano: now_ns,
                    value: Some(metrics::number_data_point::Value::AsInt(i)),
                    ..Default::default()
                })
                .collect(),
            aggregation_temporality: metrics::AggregationTemporality::Cumulative as i32,
            is_monotonic: true,
        })),
        ..Default::default()
    };
    let sent = one_scope(vec![
        requests,
        gauge_of_one("up".into(), String::new(), now_ns),
    ]);
    // `sfx`: the sum's 4 points dropped and cut, `up` charged; both families' entries.
    let response = export_protobuf(&weir, "sfx", sent.clone()).await;
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
    assert_eq!(admitted(&weir, "sfx").await, [1, 0, 2]);
    let received = std::mem::take(&mut *receiver.received.lock().unwrap());
    assert_eq!(points_of(&received[0].2), [0, 1], "the sum's points cut");
    // `plain`: `http_requests` is not the rule's name; everything charged and forwarded.
    let response = export_protobuf(&weir, "plain", sent.clone()).await;
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
    assert_eq!(admitted(&weir, "plain").await, [5, 0, 2]);
    let received = std::mem::take(&mut *receiver.received.lock().unwrap());
    assert_eq!(received[0].2.as_ref(), &sent[..], "as sent");
    weir.stop().await.unwrap();
}

/// Mimir's name options per tenant: under `name_validation_scheme: utf8` the translation keeps
/// names as sent (its derived strategy `NoTranslation`), so a rule sees `http.requests`, and
/// `a.b` and `a_b` are two metadata families; `otel_label_name_preserve_multiple_underscores:
/// false` makes `http...route` the label `http_route`, short enough where `http___route` is not.
#[tokio::test]
async fn the_name_scheme_and_the_label_options_name_series_as_mimir_does() {
    use weir::otlp::proto::metrics;
    let (addr, receiver) = start_receiver().await;
    let rule = "    metric_relabel_configs:\n    - source_labels: [__name__]\n      \
                regex: 'http[.]requests'\n      action: drop\n";
    let weir = forwarding_to(
        addr,
        &format!(
            "overrides:\n  utf8:\n    name_validation_scheme: utf8\n{rule}  plain:\n{rule}  \
             short:\n    max_label_name_length: 10\n  \
             collapse:\n    max_label_name_length: 10\n    \
             otel_label_name_preserve_multiple_underscores: false\n"
        ),
    )
    .await;
    let now_ns = now_ns();
    let named = one_scope(vec![
        gauge_of_one("http.requests".into(), String::new(), now_ns),
        gauge_of_one("a.b".into(), String::new(), now_ns),
        gauge_of_one("a_b".into(), String::new(), now_ns),
    ]);
    // `utf8`: `http.requests` dropped by the rule (its point cut, its entry kept); three
    // families.
    let response = export_protobuf(&weir, "utf8", named.clone()).await;
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
    assert_eq!(admitted(&weir, "utf8").await, [2, 0, 3]);
    let received = std::mem::take(&mut *receiver.received.lock().unwrap());
    assert_eq!(points_of(&received[0].2), [0, 1, 1], "http.requests cut");
    // `plain`: the names are `http_requests` and `a_b` twice; nothing dropped, two families.
    let response = export_protobuf(&weir, "plain", named.clone()).await;
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
    assert_eq!(admitted(&weir, "plain").await, [3, 0, 2]);
    let received = std::mem::take(&mut *receiver.received.lock().unwrap());
    assert_eq!(received[0].2.as_ref(), &named[..], "as sent");

    let mut routed = gauge_of_one("up".into(), String::new(), now_ns);
    if let Some(metrics::metric::Data::Gauge(gauge)) = &mut routed.data {
        gauge.data_points[0].attributes = vec![kv("http...route", "/")];
    }
    let routed = one_scope(vec![routed]);
    let response = export_protobuf(&weir, "short", routed.clone()).await;
    assert_eq!(response.status(), 400);
    let text = String::from_utf8_lossy(&response.bytes().await.unwrap()).into_owned();
    assert!(text.contains("http___route"), "{text}");
    assert_eq!(admitted(&weir, "short").await, [0, 0, 0]);
    let response = export_protobuf(&weir, "collapse", routed.clone()).await;
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
    assert_eq!(admitted(&weir, "collapse").await, [1, 0, 1]);
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn relabelling_rules_drop_points_before_they_are_charged_and_forwarded() {
    use weir::otlp::proto::{metrics, resource, ExportMetricsServiceRequest};
    let (addr, receiver) = start_receiver().await;
    let rules = "    metric_relabel_configs:\n    - source_labels: [__name__]\n      \
                 regex: go_.*\n      action: drop\n    - regex: blob\n      action: labeldrop\n";
    let overrides = format!(
        "overrides:\n  r:\n    ingestion_rate: 5\n    ingestion_burst_size: 5\n{rules}  \
         off:\n    ingestion_rate: 5\n    ingestion_burst_size: 5\n    \
         metric_relabeling_enabled: false\n{rules}"
    );
    let weir = forwarding_to(addr, &overrides).await;
    let now_ns = now_ns();
    let points = |name: &str, n: usize, key: &str| metrics::Metric {
        name: name.into(),
        data: Some(metrics::metric::Data::Gauge(metrics::Gauge {
            data_points: (0..n)
                .map(|i| metrics::NumberDataPoint {
                    attributes: vec![kv(key, &i.to_string())],
                    time_unix_nano: now_ns,
                    value: Some(metrics::number_data_point::Value::AsInt(1)),
                    ..Default::default()
                })
                .collect(),
        })),
        ..Default::default()
    };
    let export = |metrics| ExportMetricsServiceRequest {
        resource_metrics: vec![metrics::ResourceMetrics {
            resource: Some(resource::Resource {
                attributes: vec![kv("service.name", "api")],
                ..Default::default()
            }),
            scope_metrics: vec![metrics::ScopeMetrics {
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let sent = export(vec![points("go_gc", 20, "i"), points("up", 3, "pod")]);

    // 3 samples and the two families' metadata (go_gc's entry stays, as Mimir makes it before
    // the rules run): 5 of the burst of 5.
    let response = export_protobuf(&weir, "r", sent.encode_to_vec()).await;
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    assert_eq!(admitted(&weir, "r").await, [3, 0, 2]);
    let received = std::mem::take(&mut *receiver.received.lock().unwrap());
    assert_eq!(received.len(), 1);
    let forwarded = ExportMetricsServiceRequest::decode(received[0].2.as_ref()).unwrap();
    let kept: Vec<(&str, usize)> = forwarded.resource_metrics[0].scope_metrics[0]
        .metrics
        .iter()
        .map(|metric| match &metric.data {
            Some(metrics::metric::Data::Gauge(gauge)) => {
                (metric.name.as_str(), gauge.data_points.len())
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(kept, [("go_gc", 0), ("up", 3)], "go_gc's points cut");

    // Rules off: 23 samples and 2 entries, over the burst; nothing forwarded.
    let response = export_protobuf(&weir, "off", sent.encode_to_vec()).await;
    assert_eq!(response.status(), 429);
    assert!(receiver.received.lock().unwrap().is_empty());

    // A label over max_label_value_length (2 048) that a rule drops: checked without it,
    // so charged and forwarded as sent. (The bucket has no token left and refills 5 a second.)
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    let mut long = export(vec![points("blob_carrier", 1, "blob")]);
    let Some(metrics::metric::Data::Gauge(gauge)) =
        &mut long.resource_metrics[0].scope_metrics[0].metrics[0].data
    else {
        unreachable!("points() makes a gauge")
    };
    gauge.data_points[0].attributes = vec![kv("blob", &"x".repeat(3_000))];
    let response = export_protobuf(&weir, "r", long.encode_to_vec()).await;
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    assert_eq!(admitted(&weir, "r").await, [4, 0, 3]);
    let received = std::mem::take(&mut *receiver.received.lock().unwrap());
    assert_eq!(received[0].2.as_ref(), long.encode_to_vec(), "as sent");
}

#[tokio::test]
async fn a_resource_sent_twice_is_charged_its_target_info_once() {
    use weir::otlp::proto::{metrics, resource, ExportMetricsServiceRequest};
    // A batching collector's export: one SDK's resource twice, a point each, at one time.
    // Mimir's translator stamps their `target_info` once (same labels, same millisecond):
    // 2 samples + 1 `target_info` sample + 2 entries = 5, the tenant's whole burst.
    let (addr, receiver) = start_receiver().await;
    let weir = forwarding_to(
        addr,
        "overrides:\n  c:\n    ingestion_rate: 5\n    ingestion_burst_size: 5\n",
    )
    .await;
    let now_ns = now_ns();
    let resource = |value: i64| metrics::ResourceMetrics {
        resource: Some(resource::Resource {
            attributes: vec![kv("service.name", "api"), kv("host.name", "h-1")],
            ..Default::default()
        }),
        scope_metrics: vec![metrics::ScopeMetrics {
            metrics: vec![metrics::Metric {
                name: "queue_depth".into(),
                data: Some(metrics::metric::Data::Gauge(metrics::Gauge {
                    data_points: vec![metrics::NumberDataPoint {
                        attributes: vec![kv("queue", &value.to_string())],
                        time_unix_nano: now_ns,
                        value: Some(metrics::number_data_point::Value::AsInt(value)),
                        ..Default::default()
                    }],
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let sent = ExportMetricsServiceRequest {
        resource_metrics: vec![resource(1), resource(2)],
    }
    .encode_to_vec();
    let response = export_protobuf(&weir, "c", sent.clone()).await;
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    assert_eq!(admitted(&weir, "c").await, [3, 0, 2]);
    let received = std::mem::take(&mut *receiver.received.lock().unwrap());
    assert_eq!(received[0].2.as_ref(), sent, "forwarded as sent");
}

#[tokio::test]
async fn a_metric_is_charged_up_to_its_first_point_with_a_key_that_makes_no_label_name() {
    use weir::otlp::proto::{metrics, ExportMetricsServiceRequest};
    // Mimir's translator builds each point's label names in turn; `..` escapes to `__`, no
    // label name, an error for the metric from that point on: the first point is charged
    // and pushed, the push answered 400 `otlp parse error`, the metric counted once.
    let (addr, receiver) = start_receiver().await;
    let weir = forwarding_to(addr, "overrides:\n  k: {}\n").await;
    let now_ns = now_ns();
    let point = |key: &str| metrics::NumberDataPoint {
        attributes: vec![kv(key, "v")],
        time_unix_nano: now_ns,
        value: Some(metrics::number_data_point::Value::AsInt(1)),
        ..Default::default()
    };
    let gauge = metrics::Metric {
        name: "queue_depth".into(),
        data: Some(metrics::metric::Data::Gauge(metrics::Gauge {
            data_points: vec![point("queue"), point(".."), point("queue")],
        })),
        ..Default::default()
    };
    let sent = one_scope(vec![gauge]);
    let response = export_protobuf(&weir, "k", sent.clone()).await;
    assert_eq!(response.status(), 400);
    let status = RpcStatus::decode(response.bytes().await.unwrap()).unwrap();
    assert!(
        status.message.starts_with("otlp parse error: ")
            && status.message.contains("makes no label name"),
        "{status:?}"
    );
    assert_eq!(status.code, 400);
    assert_eq!(admitted(&weir, "k").await, [1, 0, 1]);
    let left_out = "reason=\"otlp_parse_error\",user=\"k\"";
    assert_eq!(
        counter(&weir, "weir_discarded_samples_total", left_out).await,
        1
    );
    // Forwarded as sent: a Mimir behind weir leaves out the same points.
    let received = std::mem::take(&mut *receiver.received.lock().unwrap());
    let forwarded = ExportMetricsServiceRequest::decode(received[0].2.as_ref()).unwrap();
    assert_eq!(forwarded.encode_to_vec(), sent);
    weir.stop().await.unwrap();
}

/// A `target_info` refused by Mimir's checks is cut from the forwarded export by taking its
/// resource's other attributes; the labels the tenant promotes from them go with the points
/// as attributes, so the receiver makes each point the series it was sent as, and no
/// `target_info`. Protobuf and JSON alike.
#[tokio::test]
async fn a_refused_target_info_is_cut_and_its_points_keep_their_promoted_labels() {
    use weir::otlp::proto::{common, metrics, resource, ExportMetricsServiceRequest};
    let (addr, receiver) = start_receiver().await;
    // `target_info`: `__name__`, `job`, and three attributes, 5 labels over 4. A point:
    // `__name__`, `job`, `deployment_environment`, `queue`, 4.
    let weir = forwarding_to(
        addr,
        "overrides:\n  t:\n    max_label_names_per_series: 4\n    \
         max_label_names_per_info_series: 4\n    \
         promote_otel_resource_attributes: deployment.environment\n",
    )
    .await;
    let now_ns = now_ns();
    let resource = vec![
        kv("service.name", "api"),
        kv("deployment.environment", "prod"),
        kv("host.name", "h-1"),
        kv("os.type", "linux"),
    ];
    let point = |attributes: Vec<common::KeyValue>| metrics::NumberDataPoint {
        attributes,
        time_unix_nano: now_ns,
        value: Some(metrics::number_data_point::Value::AsInt(1)),
        ..Default::default()
    };
    let export = |resource: Vec<common::KeyValue>, extra: Vec<common::KeyValue>| {
        ExportMetricsServiceRequest {
            resource_metrics: vec![metrics::ResourceMetrics {
                resource: Some(resource::Resource {
                    attributes: resource,
                    ..Default::default()
                }),
                scope_metrics: vec![metrics::ScopeMetrics {
                    metrics: vec![metrics::Metric {
                        name: "queue_depth".into(),
                        data: Some(metrics::metric::Data::Gauge(metrics::Gauge {
                            data_points: vec![point([vec![kv("queue", "q")], extra].concat())],
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    };
    let response =
        export_protobuf(&weir, "t", export(resource.clone(), vec![]).encode_to_vec()).await;
    assert_eq!(response.status(), 400);
    let status = RpcStatus::decode(response.bytes().await.unwrap()).unwrap();
    assert!(status.message.contains("target_info"), "{status:?}");
    // The point and the two entries (`queue_depth`'s, `target_info`'s: Mimir keeps the entry
    // of a refused series) charged, the `target_info` sample counted as refused.
    assert_eq!(admitted(&weir, "t").await, [1, 0, 2]);
    assert_eq!(
        counter(
            &weir,
            "weir_discarded_samples_total",
            r#"reason="max_label_names_per_info_series",user="t""#
        )
        .await,
        1
    );
    let received = std::mem::take(&mut *receiver.received.lock().unwrap());
    let forwarded = ExportMetricsServiceRequest::decode(received[0].2.as_ref()).unwrap();
    let expected = export(
        vec![kv("service.name", "api")],
        vec![kv("deployment_environment", "prod")],
    );
    assert_eq!(forwarded, expected);

    // The same export in OTLP/JSON: the forwarded JSON's point gains the same attribute.
    let json = serde_json::json!({
        "resourceMetrics": [{
            "resource": {"attributes": resource.iter().map(|kv| serde_json::json!({
                "key": kv.key,
                "value": {"stringValue": weir::otlp::translate::value_string(kv.value.as_ref())},
            })).collect::<Vec<_>>()},
            "scopeMetrics": [{"metrics": [{
                "name": "queue_depth",
                "gauge": {"dataPoints": [{
                    "attributes": [{"key": "queue", "value": {"stringValue": "q"}}],
                    "timeUnixNano": now_ns.to_string(),
                    "asInt": "1",
                }]},
            }]}],
        }],
    });
    let response = reqwest::Client::new()
        .post(weir.url("/otlp/v1/metrics"))
        .header("X-Scope-OrgID", "t")
        .header("Content-Type", "application/json")
        .body(json.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(admitted(&weir, "t").await, [2, 0, 4]);
    let received = std::mem::take(&mut *receiver.received.lock().unwrap());
    let forwarded: serde_json::Value = serde_json::from_slice(&received[0].2).unwrap();
    let resource = &forwarded["resourceMetrics"][0]["resource"]["attributes"];
    assert_eq!(
        resource,
        &serde_json::json!([{"key": "service.name", "value": {"stringValue": "api"}}])
    );
    let point = &forwarded["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]["gauge"]
        ["dataPoints"][0]["attributes"];
    assert_eq!(
        point,
        &serde_json::json!([
            {"key": "queue", "value": {"stringValue": "q"}},
            {"key": "deployment_environment", "value": {"stringValue": "prod"}},
        ])
    );
}

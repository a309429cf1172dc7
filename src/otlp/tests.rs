use std::io::Write;

use prost::Message;

use super::proto::{common, metrics, resource, ExportMetricsServiceRequest};
use super::*;

const SAMPLE: &[u8] = include_bytes!("../../tests/otlp/sample.json");

fn protobuf() -> OtlpFormat {
    OtlpFormat {
        json: false,
        gzip: false,
    }
}

fn json() -> OtlpFormat {
    OtlpFormat {
        json: true,
        gzip: false,
    }
}

fn gzip(raw: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(raw).unwrap();
    encoder.finish().unwrap()
}

/// The fixture's charge, worked out by hand and by `tests/otlp/mimir_charge.py` (its
/// `exemplars_enabled` figures: weir charges exemplars, as in remote write).
fn sample_counts(counts: WriteCounts) {
    assert_eq!(
        (
            counts.samples,
            counts.histograms,
            counts.exemplars,
            counts.metadata
        ),
        (21, 1, 2, 7),
        "{counts:?}"
    );
    assert_eq!(counts.cost(), 31);
}

#[test]
fn the_json_fixture_costs_what_mimir_charges() {
    sample_counts(decode(SAMPLE, 1 << 20, json()).unwrap());
    let gzipped = OtlpFormat {
        json: true,
        gzip: true,
    };
    sample_counts(decode(&gzip(SAMPLE), 1 << 20, gzipped).unwrap());
}

#[test]
fn protobuf_and_json_count_alike() {
    // What the JSON decoder keeps is everything the count reads; as protobuf it counts the same.
    let request = json::decode(SAMPLE).unwrap();
    let raw = request.encode_to_vec();
    sample_counts(decode(&raw, 1 << 20, protobuf()).unwrap());
}

fn gauge(name: &str, points: usize, time: u64) -> metrics::Metric {
    metrics::Metric {
        name: name.into(),
        data: Some(metrics::metric::Data::Gauge(metrics::Gauge {
            data_points: (0..points)
                .map(|_| metrics::NumberDataPoint {
                    time_unix_nano: time,
                    ..Default::default()
                })
                .collect(),
        })),
        ..Default::default()
    }
}

fn delta_sum(name: &str) -> metrics::Metric {
    metrics::Metric {
        name: name.into(),
        data: Some(metrics::metric::Data::Sum(metrics::Sum {
            data_points: vec![Default::default(); 3],
            aggregation_temporality: metrics::AggregationTemporality::Delta as i32,
            is_monotonic: true,
        })),
        ..Default::default()
    }
}

fn request(attributes: &[&str], metrics: Vec<metrics::Metric>) -> ExportMetricsServiceRequest {
    ExportMetricsServiceRequest {
        resource_metrics: vec![metrics::ResourceMetrics {
            resource: Some(resource::Resource {
                attributes: attributes
                    .iter()
                    .map(|key| common::KeyValue {
                        key: key.to_string(),
                        value: None,
                    })
                    .collect(),
                ..Default::default()
            }),
            scope_metrics: vec![metrics::ScopeMetrics {
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

#[test]
fn target_info_follows_mimir_rules() {
    let second = 1_000_000_000;
    // No identifying attribute: no target_info.
    let counts = count(&request(&["host.name"], vec![gauge("g", 2, 0)])).unwrap();
    assert_eq!((counts.samples, counts.metadata), (2, 1));
    // Only identifying attributes: none either.
    let counts = count(&request(&["service.name"], vec![gauge("g", 2, 0)])).unwrap();
    assert_eq!((counts.samples, counts.metadata), (2, 1));
    // Identity and another attribute, one timestamp: one sample and its metadata.
    let attributes = ["service.name", "host.name"];
    let counts = count(&request(&attributes, vec![gauge("g", 2, 0)])).unwrap();
    assert_eq!((counts.samples, counts.metadata), (3, 2));
    // Points 10 minutes apart: samples every 150 s before the latest, plus the latest.
    let spread = vec![gauge("a", 1, 0), gauge("b", 1, 600 * second)];
    let counts = count(&request(&attributes, spread)).unwrap();
    assert_eq!((counts.samples, counts.metadata), (2 + 5, 3));
    // A resource with no points adds nothing.
    let counts = count(&request(&attributes, vec![gauge("g", 0, 0)])).unwrap();
    assert_eq!(counts.cost(), 0);
}

#[test]
fn metadata_is_one_per_family_by_prometheus_name() {
    let metrics = vec![
        gauge("http.requests", 1, 0),
        gauge("http_requests", 1, 0),
        gauge("http.errors", 1, 0),
    ];
    let counts = count(&request(&[], metrics)).unwrap();
    assert_eq!((counts.samples, counts.metadata), (3, 2));
}

#[test]
fn refused_metrics_cost_nothing_and_a_request_of_only_them_is_refused() {
    let mixed = count(&request(&[], vec![delta_sum("d"), gauge("g", 4, 0)])).unwrap();
    assert_eq!((mixed.samples, mixed.metadata), (4, 1));
    let err = count(&request(&[], vec![delta_sum("d")])).unwrap_err();
    assert!(err.to_string().contains("cumulative"), "{err}");
    let no_data = metrics::Metric {
        name: "empty".into(),
        ..Default::default()
    };
    let err = count(&request(&[], vec![no_data])).unwrap_err();
    assert!(err.to_string().contains("no data"), "{err}");
    // An empty export is fine and free.
    assert_eq!(
        count(&ExportMetricsServiceRequest::default())
            .unwrap()
            .cost(),
        0
    );
}

#[test]
fn bad_bodies_are_clear_errors() {
    for (body, format, expected) in [
        (&b"\xff\xff\xff"[..], protobuf(), "invalid protobuf"),
        (&b"{"[..], json(), "invalid JSON"),
        (&b"[]"[..], json(), "not an object"),
        (
            &br#"{"resourceMetrics":{}}"#[..],
            json(),
            "resourceMetrics is not an array",
        ),
        (
            &br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"g","gauge":{"dataPoints":[{"timeUnixNano":"soon"}]}}]}]}]}"#[..],
            json(),
            "not an unsigned integer",
        ),
    ] {
        let err = decode(body, 1 << 20, format).unwrap_err();
        assert!(err.to_string().contains(expected), "{err} for {body:?}");
    }
    let gzipped = OtlpFormat {
        json: false,
        gzip: true,
    };
    let err = decode(b"not gzip", 1 << 20, gzipped).unwrap_err();
    assert!(err.to_string().contains("invalid gzip"), "{err}");
    // A small gzip body that inflates past the limit is refused as too large.
    let bomb = gzip(&vec![0u8; 2 << 20]);
    let err = decode(&bomb, 1 << 20, gzipped).unwrap_err();
    assert!(matches!(err, DecodeError::TooLarge { .. }), "{err}");
}

/// The client hears that its OTLP export is invalid, not a remote-write request.
#[test]
fn a_refused_export_is_called_otlp() {
    for (body, format) in [(&b"{"[..], json()), (&b"\xff\xff"[..], protobuf())] {
        let err = decode(body, 1 << 20, format).unwrap_err();
        let message = crate::rejection::PushError::Decode(err).to_string();
        assert!(
            message.starts_with("invalid OTLP metrics request: "),
            "{message}"
        );
        assert!(!message.contains("remote-write"), "{message}");
    }
}

#[test]
fn headers_choose_the_encoding_or_415() {
    let parse = |content_type: &str, encoding: Option<&str>| {
        OtlpFormat::from_headers(
            Some(content_type.as_bytes()),
            encoding.map(|value| value.as_bytes()),
        )
    };
    assert_eq!(parse("application/x-protobuf", None), Ok(protobuf()));
    assert_eq!(parse("application/json; charset=utf-8", None), Ok(json()));
    assert_eq!(
        parse("application/x-protobuf", Some("gzip")),
        Ok(OtlpFormat {
            json: false,
            gzip: true
        })
    );
    for (content_type, encoding) in [
        ("text/plain", None),
        ("application/x-protobuf", Some("deflate")),
        ("application/x-protobuf", Some("snappy")),
    ] {
        let err = parse(content_type, encoding).unwrap_err();
        assert!(err.0.contains("OTLP"), "{err}");
    }
    assert!(OtlpFormat::from_headers(None, None).is_err());
}

#[test]
fn error_bodies_are_rpc_statuses_in_the_request_encoding() {
    let body = json().status_body(8, "slow down");
    let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        value,
        serde_json::json!({"code": 8, "message": "slow down"})
    );
    let body = protobuf().status_body(8, "slow down");
    let status = RpcStatus::decode(&body[..]).unwrap();
    assert_eq!((status.code, status.message.as_str()), (8, "slow down"));
}

#[test]
fn the_default_otlp_upstream_follows_the_receiver() {
    let otlp = |upstream: &str| {
        crate::upstream::default_otlp_url(&url::Url::parse(upstream).unwrap()).to_string()
    };
    assert_eq!(
        otlp("http://mimir:8080/api/v1/push"),
        "http://mimir:8080/otlp/v1/metrics"
    );
    assert_eq!(
        otlp("http://prometheus:9090/api/v1/write"),
        "http://prometheus:9090/api/v1/otlp/v1/metrics"
    );
    assert_eq!(
        otlp("https://r:1/ingest?x=1"),
        "https://r:1/otlp/v1/metrics"
    );
}

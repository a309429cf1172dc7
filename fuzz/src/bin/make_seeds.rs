//! Writes the starting inputs of every fuzz target into `fuzz/seeds/<target>/`: valid and
//! nearly valid examples the fuzzer mutates from. `scripts/fuzz` runs it once.
use std::path::Path;

use prost::Message;
use weir::otlp::proto::{common, metrics, resource, ExportMetricsServiceRequest};
use weir::remote_write::prompb::{self, WriteRequest};
use weir::remote_write::v2_proto;

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) {
    let dir = dir.join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn main() {
    let dir = Path::new(&std::env::args().nth(1).unwrap_or("seeds".into())).to_path_buf();
    let mut rich = WriteRequest::synthetic(2, 7, 1000);
    rich.timeseries[0].exemplars.push(prompb::Exemplar {
        labels: vec![prompb::Label {
            name: "trace_id".into(),
            value: "abc".into(),
        }],
        value: 1.5,
        timestamp: 1000,
    });
    rich.timeseries[1].histograms.push(prompb::Histogram {
        count: Some(prompb::histogram::Count::CountInt(3)),
        schema: 1,
        positive_spans: vec![prompb::BucketSpan {
            offset: 0,
            length: 2,
        }],
        positive_deltas: vec![1, 1],
        timestamp: 1000,
        ..Default::default()
    });
    rich.metadata.push(prompb::MetricMetadata {
        r#type: 1,
        metric_family_name: "weir_loadgen_series".into(),
        help: "help".into(),
        unit: String::new(),
    });
    let v1 = [
        WriteRequest::synthetic(3, 1, 1).encode_to_vec(),
        rich.encode_to_vec(),
    ];
    let v2 = v2_proto::Request {
        symbols: ["", "__name__", "up", "job", "a", "help"]
            .map(String::from)
            .to_vec(),
        timeseries: vec![v2_proto::TimeSeries {
            labels_refs: vec![1, 2, 3, 4],
            samples: vec![v2_proto::Sample {
                value: 1.0,
                timestamp: 1,
            }],
            exemplars: vec![v2_proto::Exemplar {
                labels_refs: vec![3, 4],
                value: 1.0,
                timestamp: 1,
            }],
            metadata: Some(v2_proto::Metadata {
                r#type: 1,
                help_ref: 5,
                unit_ref: 0,
            }),
            ..Default::default()
        }],
    }
    .encode_to_vec();
    for (i, body) in v1.iter().enumerate() {
        write(&dir, "remote_write_v1", &format!("v1-{i}"), body);
        write(
            &dir,
            "snappy",
            &format!("v1-{i}"),
            &snap::raw::Encoder::new().compress_vec(body).unwrap(),
        );
    }
    write(&dir, "remote_write_v2", "v2-0", &v2);
    write(
        &dir,
        "snappy",
        "v2-0",
        &snap::raw::Encoder::new().compress_vec(&v2).unwrap(),
    );
    write(
        &dir,
        "overrides",
        "example",
        include_bytes!("../../../runtime-config/overrides.yaml"),
    );
    write(&dir, "overrides", "small", b"overrides:\n  t:\n    ingestion_rate: 5\n    ingestion_burst_size: 5\ndistributor_limits:\n  max_inflight_push_requests: 3\n");
    for (i, tenant) in ["team-a", "a.b_c", "..", "x*y(z)"].iter().enumerate() {
        write(&dir, "tenant", &format!("t{i}"), tenant.as_bytes());
    }
    write(
        &dir,
        "gossip",
        "usage",
        b"2\nt 10 1000 - -5 0\na/GET%20%2Fs 0 7 - - 3",
    );
    write(&dir, "gossip", "state", b"ACTIVE");
    for (name, report) in [
        ("plain", &b"2\nt 10 1000 - -5 0\na/GET%20%2Fs 0 7 - - 3"[..]),
        (
            "escaped",
            b"3\nmy%20team 1 2 3 - 0\n 0 0 - - 0\nt/k%25%0A\xc3\xa9 4 5 - - 1",
        ),
        ("one-bad", b"2\nmy team 1 2 - - 0\nt 1 2 - - 0\nu 1 x - - 0"),
        ("old-format", b"1\nt 1 2"),
    ] {
        write(&dir, "usage_report", name, report);
    }
    for (name, seed) in [
        ("bearer", &b"Bearer s3cr3t-token"[..]),
        ("basic", b"Basic dXNlcjpwYXNz"),
        ("basic-lower", b"basic  dXNlcjo= "),
        ("no-colon", b"Basic dXNlcg=="),
        ("other", b"Digest x"),
        (
            "file",
            b"credentials:\n  - name: team-a\n    bearer_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n    tenants: [team-a]\n  - name: ops\n    basic_user: ops\n    basic_password_sha256: 5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8\n    any_tenant: true\n  - name: proxy\n    certificate: proxy.example\n    tenants: [a, b]\n",
        ),
        ("empty-file", b"credentials: []\n"),
    ] {
        write(&dir, "auth", name, seed);
    }
    write(&dir, "admission", "allow", br#"{"tenant":"a","key":"GET /s","cost":2,"limit":{"algorithm":"sliding_window","rate":10,"window":1.5}}"#);
    write(
        &dir,
        "admission",
        "batch",
        br#"{"requests":[{"tenant":"a"},{"tenant":"b","cost":-1}]}"#,
    );
    use weir::grpc::proto::weir::admission::v1 as api;
    let allow = api::AllowRequest {
        tenant: "a".into(),
        key: "k".into(),
        cost: 3,
        limit: Some(api::LimitSpec {
            algorithm: 2,
            rate: 5.0,
            burst: 2,
            window: None,
            max_concurrent: 1,
        }),
    };
    write(&dir, "admission", "proto", &allow.encode_to_vec());
    for (name, request) in otlp_seeds() {
        write(&dir, "otlp_scan", name, &request.encode_to_vec());
    }
}

/// OTLP exports for `otlp_scan`: every kind of metric, exemplars, nested attribute values,
/// `target_info`, refused metrics, and an export of nothing but refused ones.
fn otlp_seeds() -> Vec<(&'static str, ExportMetricsServiceRequest)> {
    use metrics::metric::Data;
    let string = |text: &str| common::AnyValue {
        value: Some(common::any_value::Value::StringValue(text.into())),
    };
    let attribute = |key: &str, value: common::AnyValue| common::KeyValue {
        key: key.into(),
        value: Some(value),
    };
    let nested = common::AnyValue {
        value: Some(common::any_value::Value::KvlistValue(
            common::KeyValueList {
                values: vec![attribute(
                    "list",
                    common::AnyValue {
                        value: Some(common::any_value::Value::ArrayValue(common::ArrayValue {
                            values: vec![string("a"), string("é")],
                        })),
                    },
                )],
            },
        )),
    };
    const T: u64 = 1_700_000_000_000_000_000;
    let exemplar = metrics::Exemplar {
        filtered_attributes: vec![attribute("k", string("v"))],
        time_unix_nano: T,
        span_id: vec![1; 8],
        trace_id: vec![2; 16],
        value: Some(metrics::exemplar::Value::AsDouble(0.5)),
    };
    let number = |time: u64| metrics::NumberDataPoint {
        attributes: vec![
            attribute("route", string("/a")),
            attribute("deep", nested.clone()),
        ],
        time_unix_nano: time,
        exemplars: vec![exemplar.clone()],
        value: Some(metrics::number_data_point::Value::AsInt(3)),
        ..Default::default()
    };
    let metric = |name: &str, data: Data| metrics::Metric {
        name: name.into(),
        description: "d".into(),
        unit: "s".into(),
        data: Some(data),
        metadata: vec![attribute("m", string("x"))],
    };
    let gauge = metric(
        "a.gauge",
        Data::Gauge(metrics::Gauge {
            data_points: vec![number(T), number(T + 600_000_000_000)],
        }),
    );
    let sum = |temporality: i32| {
        metric(
            "a_sum",
            Data::Sum(metrics::Sum {
                data_points: vec![number(T)],
                aggregation_temporality: temporality,
                is_monotonic: true,
            }),
        )
    };
    let histogram = metric(
        "a.histogram",
        Data::Histogram(metrics::Histogram {
            data_points: vec![metrics::HistogramDataPoint {
                time_unix_nano: T,
                bucket_counts: vec![1, 2, 3, 4],
                explicit_bounds: vec![0.1, 0.5, 1.0],
                sum: Some(2.5),
                exemplars: vec![exemplar.clone()],
                ..Default::default()
            }],
            aggregation_temporality: 2,
        }),
    );
    let exponential = |scale: i32| {
        metric(
            "a.exponential",
            Data::ExponentialHistogram(metrics::ExponentialHistogram {
                data_points: vec![metrics::ExponentialHistogramDataPoint {
                    time_unix_nano: T,
                    scale,
                    positive: Some(metrics::exponential_histogram_data_point::Buckets {
                        offset: -2,
                        bucket_counts: vec![1, 300, 0],
                    }),
                    exemplars: vec![exemplar.clone()],
                    ..Default::default()
                }],
                aggregation_temporality: 2,
            }),
        )
    };
    let summary = metric(
        "a.summary",
        Data::Summary(metrics::Summary {
            data_points: vec![metrics::SummaryDataPoint {
                time_unix_nano: T,
                quantile_values: vec![Default::default(); 2],
                ..Default::default()
            }],
        }),
    );
    let export = |resource_attributes: Vec<common::KeyValue>, metrics: Vec<metrics::Metric>| {
        ExportMetricsServiceRequest {
            resource_metrics: vec![metrics::ResourceMetrics {
                resource: Some(resource::Resource {
                    attributes: resource_attributes,
                    ..Default::default()
                }),
                scope_metrics: vec![metrics::ScopeMetrics {
                    scope: Some(common::InstrumentationScope {
                        name: "lib".into(),
                        version: "1".into(),
                        attributes: vec![attribute("s", string("t"))],
                        ..Default::default()
                    }),
                    metrics,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    };
    let service = vec![
        attribute("service.name", string("svc")),
        attribute("service.instance.id", string("i-1")),
        attribute("host.name", string("h")),
    ];
    vec![
        (
            "every-kind",
            export(
                service.clone(),
                vec![
                    gauge.clone(),
                    sum(2),
                    sum(1),
                    histogram,
                    exponential(3),
                    exponential(-5),
                    summary,
                    metrics::Metric {
                        name: "no.data".into(),
                        ..Default::default()
                    },
                ],
            ),
        ),
        ("gauge", export(vec![], vec![gauge])),
        // A refused metric's points still give its resource a `target_info`.
        (
            "refused-with-target-info",
            export(service, vec![sum(1), exponential(-6)]),
        ),
        (
            "only-refused",
            export(vec![], vec![sum(0), exponential(-6)]),
        ),
        ("empty", ExportMetricsServiceRequest::default()),
    ]
}

//! The hot path: one admission decision, and the remote-write body scan against a full
//! prost decode (the data-structure choice this justifies: scan, not decode).
//!
//! `cargo bench --bench hot_path`

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use engine::{Ask, EngineClock, LimitKind, Limiter};
use runtime_config::{Defaults, RuntimeConfig};
use weir::format::{self, Format};
use weir::metrics::{Metrics, TenantSeries};
use weir::remote_write::{self, prompb::WriteRequest, v2_proto};

fn limiter(extra_tenants: usize) -> Limiter<TenantSeries> {
    let config = RuntimeConfig::parse(
        "overrides:\n  open:\n    ingestion_rate: 1e9\n    ingestion_burst_size: 4000000000\n    request_rate: 1e9\n    request_burst_size: 4000000000\n  open-divided:\n    ingestion_rate: 1e9\n    ingestion_burst_size: 4000000000\n    rate_limit_strategy: divided\n  limited:\n    ingestion_rate: 1\n    ingestion_burst_size: 1\n    request_rate: 1\n    request_burst_size: 1\n",
        Defaults::default(),
    )
    .unwrap();
    let limiter = Limiter::with_clock(
        Arc::new(config),
        Duration::from_secs(3600),
        TenantSeries(Arc::new(Metrics::new())),
        EngineClock::real(),
    );
    for i in 0..extra_tenants {
        limiter.tenant(&format!("tenant-{i}")).unwrap();
    }
    limiter
}

/// One admission decision = tenant lookup + one bucket check (the issue's definition);
/// `both_limits` is what a push pays: lookup + request-rate + ingestion-rate checks.
/// `admitted` is `weighted` (the fleet view); `admitted_divided` the governor bucket.
fn decision(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision");
    for tenants in [1, 10_000] {
        let limiter = limiter(tenants);
        group.bench_with_input(
            BenchmarkId::new("admitted", tenants),
            &limiter,
            |b, limiter| {
                b.iter(|| {
                    let tenant = limiter.tenant(black_box("open")).unwrap();
                    black_box(limiter.check(&tenant, LimitKind::Ingestion, black_box(100)))
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("admitted_divided", tenants),
            &limiter,
            |b, limiter| {
                b.iter(|| {
                    let tenant = limiter.tenant(black_box("open-divided")).unwrap();
                    black_box(limiter.check(&tenant, LimitKind::Ingestion, black_box(100)))
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("rejected", tenants),
            &limiter,
            |b, limiter| {
                b.iter(|| {
                    let tenant = limiter.tenant(black_box("limited")).unwrap();
                    black_box(limiter.check(&tenant, LimitKind::Request, 1))
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("both_limits", tenants),
            &limiter,
            |b, limiter| {
                b.iter(|| {
                    let tenant = limiter.tenant(black_box("open")).unwrap();
                    let request = limiter.check(&tenant, LimitKind::Request, 1);
                    let ingestion = limiter.check(&tenant, LimitKind::Ingestion, black_box(100));
                    black_box((request, ingestion))
                })
            },
        );
    }
    group.finish();
}

/// The parts of a decision, to see where its time goes.
fn decision_parts(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision_parts");
    let clock = EngineClock::real();
    group.bench_function("clock_now", |b| {
        b.iter(|| black_box(governor::clock::Clock::now(&clock)))
    });
    let limiter = limiter(10_000);
    group.bench_function("tenant_lookup_10000_tenants", |b| {
        b.iter(|| black_box(limiter.tenant(black_box("open"))))
    });
    let tenant = limiter.tenant("open").unwrap();
    group.bench_function("ingestion_check", |b| {
        b.iter(|| black_box(limiter.check(&tenant, LimitKind::Ingestion, black_box(100))))
    });
    group.finish();
}

fn scan(c: &mut Criterion) {
    let mut group = c.benchmark_group("remote_write");
    for series in [100, 2000] {
        // Prometheus' default max_samples_per_send is 2000.
        let request = WriteRequest::synthetic(series, 42, 1_700_000_000_000);
        let body = request.encode_snappy();
        let raw = snap::raw::Decoder::new().decompress_vec(&body).unwrap();
        group.throughput(Throughput::Elements(series as u64));
        group.bench_with_input(BenchmarkId::new("snappy+scan", series), &body, |b, body| {
            b.iter(|| format::decode(black_box(body), 100 << 20, Format::V1).unwrap())
        });
        // The push path's decode: the same, with Mimir's series validation (defaults, a
        // clock 1 s after the samples), which refuses nothing here.
        let validation = remote_write::validate::Validation::new(
            runtime_config::ValidationLimits::default(),
            1_700_000_001_000,
        );
        group.bench_with_input(
            BenchmarkId::new("snappy+scan+validation", series),
            &body,
            |b, body| {
                b.iter(|| {
                    format::decode_validated(black_box(body), 100 << 20, Format::V1, &validation)
                        .unwrap()
                })
            },
        );
        // One label more, last: `zone` keeps the labels in name order, as Prometheus sends
        // them; `job` does not, as vmagent may send them (it sorts only with `-sortLabels`;
        // Mimir's checks sort them, so weir looks for duplicates among the names).
        for (name, label) in [("zone-last", "zone"), ("job-last", "job")] {
            let body = request.clone().with_labels(&[(label, "a")]).encode_snappy();
            group.bench_with_input(
                BenchmarkId::new(format!("snappy+scan+validation+{name}"), series),
                &body,
                |b, body| {
                    b.iter(|| {
                        format::decode_validated(
                            black_box(body),
                            100 << 20,
                            Format::V1,
                            &validation,
                        )
                        .unwrap()
                    })
                },
            );
        }
        // A tenant with `metric_relabel_configs`: a rule that changes no series here (the
        // usual drop of a few metrics), and one that adds a label to every series.
        let rules = |config: runtime_config::relabel::RuleConfig| {
            validation
                .clone()
                .relabelling(Some(remote_write::relabel::Relabelling {
                    rules: std::sync::Arc::new(runtime_config::Relabel::new(vec![config]).unwrap()),
                    tenant: std::sync::Arc::from("t"),
                }))
        };
        let drop_none = rules(runtime_config::relabel::RuleConfig {
            source_labels: Some(vec!["__name__".into()]),
            regex: Some("go_.*".into()),
            action: Some("drop".into()),
            ..Default::default()
        });
        let add_label = rules(runtime_config::relabel::RuleConfig {
            target_label: Some("env".into()),
            replacement: Some("prod".into()),
            ..Default::default()
        });
        for (name, validation) in [("drop-none", &drop_none), ("add-label", &add_label)] {
            group.bench_with_input(
                BenchmarkId::new(format!("snappy+relabel-{name}+scan+validation"), series),
                &body,
                |b, body| {
                    b.iter(|| {
                        format::decode_validated(black_box(body), 100 << 20, Format::V1, validation)
                            .unwrap()
                    })
                },
            );
        }
        group.bench_with_input(BenchmarkId::new("scan_only", series), &raw, |b, raw| {
            b.iter(|| remote_write::scan(black_box(raw)).unwrap())
        });
        group.bench_with_input(
            BenchmarkId::new("snappy+prost_decode", series),
            &body,
            |b, body| {
                b.iter(|| {
                    let raw = snap::raw::Decoder::new()
                        .decompress_vec(black_box(body))
                        .unwrap();
                    <WriteRequest as prost::Message>::decode(&raw[..])
                        .unwrap()
                        .counts()
                })
            },
        );
    }
    group.finish();
}

/// Remote-write 2.0: the same series as a 2.0 request (symbols, references, per-series
/// metadata), scanned zero-copy against a full prost decode with Prometheus' own types.
fn scan_v2(c: &mut Criterion) {
    let mut group = c.benchmark_group("remote_write_v2");
    for series in [100, 2000] {
        let request = v2_request(series);
        let body = request.encode_snappy();
        group.throughput(Throughput::Elements(series as u64));
        group.bench_with_input(BenchmarkId::new("snappy+scan", series), &body, |b, body| {
            b.iter(|| format::decode(black_box(body), 100 << 20, Format::V2).unwrap())
        });
        // The push path's decode: with Mimir's series validation (defaults, a clock 1 s after
        // the samples), which refuses nothing here.
        let validation = remote_write::validate::Validation::new(
            runtime_config::ValidationLimits::default(),
            1_700_000_001_000,
        );
        group.bench_with_input(
            BenchmarkId::new("snappy+scan+validation", series),
            &body,
            |b, body| {
                b.iter(|| {
                    format::decode_validated(black_box(body), 100 << 20, Format::V2, &validation)
                        .unwrap()
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("snappy+prost_decode", series),
            &body,
            |b, body| {
                b.iter(|| {
                    let raw = snap::raw::Decoder::new()
                        .decompress_vec(black_box(body))
                        .unwrap();
                    <v2_proto::Request as prost::Message>::decode(&raw[..])
                        .unwrap()
                        .timeseries
                        .len()
                })
            },
        );
    }
    group.finish();
}

/// `series` series with four labels each, one sample and a metadata entry, as Prometheus 3
/// sends them.
fn v2_request(series: usize) -> v2_proto::Request {
    let mut symbols: Vec<String> = [
        "",
        "__name__",
        "weir_loadgen_series",
        "job",
        "bench",
        "series",
        "help",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let timeseries = (0..series)
        .map(|i| {
            symbols.push(i.to_string());
            v2_proto::TimeSeries {
                labels_refs: vec![1, 2, 3, 4, 5, symbols.len() as u32 - 1],
                samples: vec![v2_proto::Sample {
                    value: i as f64,
                    timestamp: 1_700_000_000_000,
                }],
                metadata: Some(v2_proto::Metadata {
                    r#type: 2,
                    help_ref: 6,
                    unit_ref: 0,
                }),
                ..Default::default()
            }
        })
        .collect();
    v2_proto::Request {
        symbols,
        timeseries,
    }
}

/// The admission API's `Allow` inside the server (the engine only, no gRPC): limit lookup,
/// entry lookup and one meter check, for each algorithm, under `weighted` and `divided`.
fn admission_allow(c: &mut Criterion) {
    let config = RuntimeConfig::parse(
        "overrides:\n  api:\n    limits:\n      \"GET /search\": {rate: 1e9, burst: 4000000000}\n      window: {algorithm: sliding_window, rate: 1e12, window: 1s}\n      leaky: {algorithm: leaky_bucket, rate: 1e12, burst: 4000000000}\n  api-divided:\n    rate_limit_strategy: divided\n    limits:\n      \"GET /search\": {rate: 1e9, burst: 4000000000}\n",
        Defaults::default(),
    )
    .unwrap();
    let limiter: Limiter<TenantSeries> = Limiter::with_clock(
        Arc::new(config),
        Duration::from_secs(3600),
        TenantSeries(Arc::new(Metrics::new())),
        EngineClock::real(),
    );
    let mut group = c.benchmark_group("admission_allow");
    for (name, tenant, key) in [
        ("token_bucket", "api", "GET /search"),
        ("token_bucket_divided", "api-divided", "GET /search"),
        ("sliding_window", "api", "window"),
        ("leaky_bucket", "api", "leaky"),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let answer =
                    now_or_never(limiter.allow(black_box(tenant), black_box(key), 1, None));
                black_box(answer.unwrap().decision.allowed)
            })
        });
    }
    // `AllowBatch` of 100 inside the server, per batch: one hot key, and three keys in turn.
    // 100 asks of tenant `api`, the i-th naming `key(i)`.
    let batch = |key: fn(usize) -> &'static str| -> Vec<Ask> {
        (0..100)
            .map(|i| Ask {
                tenant: "api",
                key: key(i),
                cost: 1,
                limit: None,
            })
            .collect()
    };
    let one_key = batch(|_| "GET /search");
    let three_keys = batch(|i| ["GET /search", "window", "leaky"][i % 3]);
    // A sliding window's run: its lock and its arithmetic, where the bucket's is one atomic.
    let one_window = batch(|_| "window");
    for (name, asks) in [
        ("batch_100_one_key", &one_key),
        ("batch_100_three_keys", &three_keys),
        ("batch_100_one_window", &one_window),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let answers = now_or_never(limiter.allow_batch(black_box(asks)));
                black_box(answers.len())
            })
        });
    }
    group.finish();
}

/// Polls a future once: the local strategies never wait, so `allow` is ready at once.
fn now_or_never<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut context) {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => panic!("a local decision waited"),
    }
}

/// OTLP metrics: an export of 2 000 gauge points (20 metrics of 100 points, 3 attributes
/// each, one resource with service attributes), counted as Mimir charges it: by the
/// zero-copy scan (`scan`), by the scan with Mimir's series checks as the push path runs it
/// (`scan+checks`: the scan's bounds pass it, nothing is translated), and after a full prost
/// decode (`decode+count`, the scan's reference); as protobuf, and gzip-compressed. And the
/// checks' cold path: the same export with one value over `max_label_value_length`
/// (`scan+checks+refusal`: decoded, translated, checked, cut and encoded again).
fn otlp(c: &mut Criterion) {
    use weir::otlp::proto::{common, metrics, resource, ExportMetricsServiceRequest};
    use weir::otlp::{Compression, OtlpFormat};
    let attribute = |key: &str, value: String| common::KeyValue {
        key: key.into(),
        value: Some(common::AnyValue {
            value: Some(common::any_value::Value::StringValue(value)),
        }),
    };
    let request = ExportMetricsServiceRequest {
        resource_metrics: vec![metrics::ResourceMetrics {
            resource: Some(resource::Resource {
                attributes: vec![
                    attribute("service.name", "bench".into()),
                    attribute("service.instance.id", "i-1".into()),
                    attribute("host.name", "h-1".into()),
                ],
                ..Default::default()
            }),
            scope_metrics: vec![metrics::ScopeMetrics {
                metrics: (0..20)
                    .map(|m| metrics::Metric {
                        name: format!("bench.metric.{m}"),
                        data: Some(metrics::metric::Data::Gauge(metrics::Gauge {
                            data_points: (0..100)
                                .map(|p| metrics::NumberDataPoint {
                                    attributes: vec![
                                        attribute("route", format!("/r/{p}")),
                                        attribute("method", "GET".into()),
                                        attribute("code", "200".into()),
                                    ],
                                    time_unix_nano: 1_700_000_000_000_000_000,
                                    value: Some(metrics::number_data_point::Value::AsDouble(
                                        p as f64,
                                    )),
                                    ..Default::default()
                                })
                                .collect(),
                        })),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let raw = prost::Message::encode_to_vec(&request);
    // A collector's batch: the same points from 100 pods, a resource each (each its own
    // `target_info`, of its own labels).
    let mut pods = request.clone();
    pods.resource_metrics = (0..100)
        .map(|pod| {
            let mut resource = request.resource_metrics[0].clone();
            resource.resource = Some(resource::Resource {
                attributes: vec![
                    attribute("service.name", "bench".into()),
                    attribute("service.instance.id", format!("pod-{pod}")),
                    attribute("k8s.pod.name", format!("pod-{pod}")),
                    attribute("k8s.namespace.name", "bench".into()),
                ],
                ..Default::default()
            });
            resource.scope_metrics[0].metrics.truncate(1);
            if let Some(metrics::metric::Data::Gauge(gauge)) =
                &mut resource.scope_metrics[0].metrics[0].data
            {
                gauge.data_points.truncate(20);
            }
            resource
        })
        .collect();
    let pods = prost::Message::encode_to_vec(&pods);
    let mut refused = request.clone();
    if let Some(metrics::metric::Data::Gauge(gauge)) =
        &mut refused.resource_metrics[0].scope_metrics[0].metrics[0].data
    {
        gauge.data_points[0].attributes[0] = attribute("route", "r".repeat(3000));
    }
    let refused = prost::Message::encode_to_vec(&refused);
    // One point in ten with an exemplar (a trace and a span), as an SDK sampling traces
    // records them: with the tenant's exemplars off, Mimir's default, they are cut.
    let mut traced = request.clone();
    for metric in &mut traced.resource_metrics[0].scope_metrics[0].metrics {
        if let Some(metrics::metric::Data::Gauge(gauge)) = &mut metric.data {
            for point in gauge.data_points.iter_mut().step_by(10) {
                point.exemplars = vec![metrics::Exemplar {
                    time_unix_nano: 1_700_000_000_000_000_000,
                    trace_id: vec![1; 16],
                    span_id: vec![2; 8],
                    value: Some(metrics::exemplar::Value::AsDouble(0.25)),
                    ..Default::default()
                }];
            }
        }
    }
    let traced = prost::Message::encode_to_vec(&traced);
    // The points' time, a second ago, for the checks.
    let validation = weir::remote_write::validate::Validation::new(
        runtime_config::ValidationLimits::default(),
        1_700_000_001_000,
    );
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut encoder, &raw).unwrap();
    let gzipped = encoder.finish().unwrap();
    let mut group = c.benchmark_group("otlp");
    group.throughput(Throughput::Elements(2000));
    group.bench_with_input(
        BenchmarkId::new("scan", "protobuf-100-resources"),
        &pods,
        |b, body| {
            b.iter(|| weir::otlp::decode(black_box(body), 100 << 20, OtlpFormat::PROTOBUF).unwrap())
        },
    );
    for (name, body, compression) in [
        ("protobuf", &raw, Compression::None),
        ("protobuf+gzip", &gzipped, Compression::Gzip),
    ] {
        let format = OtlpFormat {
            json: false,
            compression,
        };
        group.bench_with_input(BenchmarkId::new("scan", name), body, |b, body| {
            b.iter(|| weir::otlp::decode(black_box(body), 100 << 20, format).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("scan+checks", name), body, |b, body| {
            b.iter(|| {
                weir::otlp_checks::decode_validated(black_box(body), 100 << 20, format, &validation)
                    .unwrap()
            })
        });
        group.bench_with_input(BenchmarkId::new("decode+count", name), body, |b, body| {
            b.iter(|| weir::otlp::decode_full(black_box(body), 100 << 20, format).unwrap())
        });
    }
    // A tenant with `metric_relabel_configs` of one drop rule that drops nothing here: by the
    // metric's name (the usual rule: each name judged once), or by a point's label (every
    // point's series built for it). The export is forwarded as sent.
    let drop_by = |label: &str, regex: &str| {
        validation
            .clone()
            .relabelling(Some(weir::remote_write::relabel::Relabelling {
                rules: std::sync::Arc::new(
                    runtime_config::Relabel::new(vec![runtime_config::relabel::RuleConfig {
                        source_labels: Some(vec![label.into()]),
                        regex: Some(regex.into()),
                        action: Some("drop".into()),
                        ..Default::default()
                    }])
                    .unwrap(),
                ),
                tenant: std::sync::Arc::from("t"),
            }))
    };
    let by_name = drop_by("__name__", "go_.*");
    let by_label = drop_by("code", "500");
    for (name, body, validation) in [
        ("scan+checks+refusal", &refused, &validation),
        ("scan+checks+exemplars_cut", &traced, &validation),
        ("scan+relabel-drop-by-name+checks", &raw, &by_name),
        ("scan+relabel-drop-by-label+checks", &raw, &by_label),
    ] {
        group.bench_with_input(BenchmarkId::new(name, "protobuf"), body, |b, body| {
            b.iter(|| {
                weir::otlp_checks::decode_validated(
                    black_box(body),
                    100 << 20,
                    weir::otlp::OtlpFormat::PROTOBUF,
                    validation,
                )
                .unwrap()
            })
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    otlp,
    decision,
    decision_parts,
    admission_allow,
    scan,
    scan_v2
);
criterion_main!(benches);

use std::io::Write;

use prost::Message;

use super::proto::{common, metrics, resource, ExportMetricsServiceRequest};
use super::*;

/// [`super::count`] under Mimir's default translation.
fn count(request: &ExportMetricsServiceRequest) -> Result<WriteCounts, DecodeError> {
    super::count(request, &OtlpTranslation::default())
}

/// [`super::scan`] under Mimir's default translation.
fn scan(body: &[u8]) -> Result<WriteCounts, DecodeError> {
    super::scan(body, &OtlpTranslation::default())
}

/// [`super::metadata_metrics`] under Mimir's default translation.
fn metadata_metrics(request: &ExportMetricsServiceRequest) -> Vec<&Metric> {
    super::metadata_metrics(request, &OtlpTranslation::default())
}

const SAMPLE: &[u8] = include_bytes!("../../tests/otlp/sample.json");

fn protobuf() -> OtlpFormat {
    OtlpFormat {
        json: false,
        compression: Compression::None,
    }
}

fn json() -> OtlpFormat {
    OtlpFormat {
        json: true,
        compression: Compression::None,
    }
}

fn gzipped(json: bool) -> OtlpFormat {
    OtlpFormat {
        json,
        compression: Compression::Gzip,
    }
}

fn gzip(raw: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(raw).unwrap();
    encoder.finish().unwrap()
}

/// `raw` as one frame or member of `compression`, written with each codec's own crate, apart
/// from weir's [`compress`].
fn compressed_apart(raw: &[u8], compression: Compression) -> Vec<u8> {
    match compression {
        Compression::None => raw.to_vec(),
        Compression::Gzip => gzip(raw),
        Compression::Lz4 => {
            let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::new());
            encoder.write_all(raw).unwrap();
            encoder.finish().unwrap()
        }
        Compression::Zstd => zstd::encode_all(raw, 3).unwrap(),
    }
}

const COMPRESSED: [Compression; 3] = [Compression::Gzip, Compression::Lz4, Compression::Zstd];

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
    for compression in COMPRESSED {
        let format = OtlpFormat {
            json: true,
            compression,
        };
        sample_counts(decode(&compressed_apart(SAMPLE, compression), 1 << 20, format).unwrap());
    }
}

/// A tenant's translation settings: classic histograms as native ones, delta taken.
fn converting(nhcb: bool, delta: bool) -> OtlpTranslation {
    OtlpTranslation {
        otel_convert_histograms_to_nhcb: nhcb,
        otel_native_delta_ingestion: delta,
        ..OtlpTranslation::default()
    }
}

#[test]
fn with_custom_buckets_a_classic_histogram_point_is_one_histogram() {
    // `mimir_charge.py tests/otlp/sample.json --nhcb --exemplars`: the histogram's two points
    // (6 and 5 samples by default) are two histograms; its exemplar stays charged.
    let raw = json::decode(SAMPLE).unwrap().encode_to_vec();
    let request = json::decode(SAMPLE).unwrap();
    let nhcb = converting(true, false);
    for counts in [
        super::scan(&raw, &nhcb).unwrap(),
        super::count(&request, &nhcb).unwrap(),
    ] {
        let items = (
            counts.samples,
            counts.histograms,
            counts.exemplars,
            counts.metadata,
        );
        assert_eq!(items, (10, 3, 2, 7), "{counts:?}");
        assert_eq!(counts.cost(), 22);
    }
    // A histogram's buckets bound what the native one has, for the bucket limit's checks.
    let (_, bounds) = super::scan_bounded(&raw, &nhcb).unwrap();
    assert_eq!(bounds.buckets, 4, "the fixture's widest histogram point");
}

#[test]
fn delta_temporality_is_taken_when_the_tenant_ingests_it() {
    let histogram = |temporality: metrics::AggregationTemporality| metrics::Metric {
        name: "latency".into(),
        data: Some(metrics::metric::Data::Histogram(metrics::Histogram {
            data_points: vec![metrics::HistogramDataPoint {
                explicit_bounds: vec![1.0, 10.0],
                bucket_counts: vec![1, 2, 3],
                sum: Some(4.0),
                ..Default::default()
            }],
            aggregation_temporality: temporality as i32,
        })),
        ..Default::default()
    };
    let cumulative = metrics::Metric {
        data: Some(metrics::metric::Data::Sum(metrics::Sum {
            data_points: vec![Default::default()],
            aggregation_temporality: metrics::AggregationTemporality::Cumulative as i32,
            is_monotonic: true,
        })),
        ..delta_sum("d.one")
    };
    let export = request(
        &[],
        vec![
            delta_sum("d.one"),
            cumulative,
            histogram(metrics::AggregationTemporality::Delta),
            histogram(metrics::AggregationTemporality::Unspecified),
        ],
    );
    let raw = export.encode_to_vec();
    let counted = |settings: &OtlpTranslation| {
        let scanned = super::scan(&raw, settings);
        assert_eq!(scanned, super::count(&export, settings), "{settings:?}");
        let counts = scanned.unwrap();
        (counts.samples, counts.histograms, counts.metadata)
    };
    // By default only the cumulative sum is taken.
    assert_eq!(counted(&OtlpTranslation::default()), (1, 0, 1));
    // Taken, the delta sum's 3 points and the delta histogram's buckets, `+Inf`, `_count` and
    // `_sum`; the unspecified histogram still refused. Delta metrics' entries are of type
    // `unknown`, so `d_one` has two: unknown, counter, as the appender makes them.
    assert_eq!(counted(&converting(false, true)), (3 + 1 + 5, 0, 3));
    assert_eq!(counted(&converting(true, true)), (3 + 1, 1, 3));
    assert_eq!(
        super::metadata_metrics(&export, &converting(false, true)).len(),
        3
    );
    // What is refused is still named, and a request of only delta metrics is still refused
    // by default.
    let only_delta = request(&[], vec![delta_sum("d.one")]);
    assert!(super::count(&only_delta, &OtlpTranslation::default()).is_err());
    let taken = super::count(&only_delta, &converting(false, true)).unwrap();
    assert_eq!((taken.samples, taken.metadata), (3, 1));
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

/// Attributes with string values, by key.
type Strings<'s> = &'s [(&'s str, &'s str)];

/// An export of one resource per entry: its attributes and metrics.
fn resources(resources: &[(Strings, Vec<metrics::Metric>)]) -> ExportMetricsServiceRequest {
    ExportMetricsServiceRequest {
        resource_metrics: resources
            .iter()
            .map(|(attributes, metrics)| metrics::ResourceMetrics {
                resource: Some(resource::Resource {
                    attributes: attributes
                        .iter()
                        .map(|(key, value)| common::KeyValue {
                            key: key.to_string(),
                            value: Some(common::AnyValue {
                                value: Some(common::any_value::Value::StringValue(
                                    value.to_string(),
                                )),
                            }),
                        })
                        .collect(),
                    ..Default::default()
                }),
                scope_metrics: vec![metrics::ScopeMetrics {
                    metrics: metrics.clone(),
                    ..Default::default()
                }],
                ..Default::default()
            })
            .collect(),
    }
}

/// The samples and metadata entries of `request`, counted on a decode and scanned (the two
/// held to each other).
fn samples_and_entries(request: &ExportMetricsServiceRequest) -> (u64, u64) {
    let counts = count(request).unwrap();
    assert_eq!(scanned(&request.encode_to_vec()).unwrap(), counts);
    (counts.samples, counts.metadata)
}

#[test]
fn target_info_follows_mimir_rules() {
    let second = 1_000_000_000;
    let one = |attributes: &[(&str, &str)], metrics| {
        samples_and_entries(&resources(&[(attributes, metrics)]))
    };
    // No identifying attribute: no target_info.
    assert_eq!(one(&[("host.name", "h")], vec![gauge("g", 2, 0)]), (2, 1));
    // Only identifying attributes: none either.
    assert_eq!(
        one(&[("service.name", "s")], vec![gauge("g", 2, 0)]),
        (2, 1)
    );
    // Identity and another attribute, one timestamp: one sample and its metadata.
    let attributes = [("service.name", "s"), ("host.name", "h")];
    assert_eq!(one(&attributes, vec![gauge("g", 2, 0)]), (3, 2));
    // Points 10 minutes apart: samples every 150 s before the latest, plus the latest.
    let spread = vec![gauge("a", 1, 0), gauge("b", 1, 600 * second)];
    assert_eq!(one(&attributes, spread), (2 + 5, 3));
    // A resource with no points makes no `target_info`; its metric without points is one
    // Mimir's translator refuses ("empty data points"), so alone it is refused, and beside
    // another resource's point it adds nothing.
    let empty = resources(&[(&attributes, vec![gauge("g", 0, 0)])]);
    assert!(count(&empty).is_err());
    assert!(scanned(&empty.encode_to_vec()).is_err());
    let beside = resources(&[
        (&attributes, vec![gauge("g", 0, 0)]),
        (&[("host.name", "h")], vec![gauge("h", 1, 0)]),
    ]);
    assert_eq!(samples_and_entries(&beside), (1, 1));
    // The translator's `job` and `instance` only with a value: an empty `service.name` names
    // no `job`, so no `target_info`; with a namespace, even empty, `job` is `/name`.
    assert_eq!(
        one(
            &[("service.name", ""), ("host.name", "h")],
            vec![gauge("g", 1, 0)]
        ),
        (1, 1)
    );
    let namespaced = [
        ("service.namespace", ""),
        ("service.name", ""),
        ("host.name", "h"),
    ];
    assert_eq!(one(&namespaced, vec![gauge("g", 1, 0)]), (2, 2));
    // An attribute called `job` names the series too.
    assert_eq!(
        one(&[("job", "j"), ("host.name", "h")], vec![gauge("g", 1, 0)]),
        (2, 2)
    );
    // The first `service.name` is the one read (pdata's `Get`): here empty.
    let twice = [
        ("service.name", ""),
        ("service.name", "s"),
        ("host.name", "h"),
    ];
    assert_eq!(one(&twice, vec![gauge("g", 1, 0)]), (1, 1));
    // Points a fraction of a millisecond apart: the last sample falls in the first's
    // millisecond, and Mimir stamps it once. 150 s and half a millisecond apart: two.
    let close = vec![
        gauge("a", 1, 7 * second),
        gauge("b", 1, 7 * second + 500_000),
    ];
    assert_eq!(one(&attributes, close), (2 + 1, 3));
    let step = vec![gauge("a", 1, 0), gauge("b", 1, 150 * second + 500_000)];
    assert_eq!(one(&attributes, step), (2 + 2, 3));
}

/// A gauge whose points have these attribute keys (one point each, string values).
fn gauge_keyed(name: &str, keys: &[&str]) -> metrics::Metric {
    metrics::Metric {
        name: name.into(),
        data: Some(metrics::metric::Data::Gauge(metrics::Gauge {
            data_points: keys
                .iter()
                .map(|key| metrics::NumberDataPoint {
                    attributes: vec![common::KeyValue {
                        key: key.to_string(),
                        value: Some(common::AnyValue {
                            value: Some(common::any_value::Value::StringValue("v".into())),
                        }),
                    }],
                    time_unix_nano: 1_000_000,
                    ..Default::default()
                })
                .collect(),
        })),
        ..Default::default()
    }
}

/// `request` counted on a decode and scanned (held to each other) under `settings`: samples,
/// histograms, metadata entries and the metrics left out.
fn left_out(
    request: &ExportMetricsServiceRequest,
    settings: &OtlpTranslation,
) -> (u64, u64, u64, Vec<String>) {
    let (counts, left_out) = super::count_left_out(request, settings).unwrap();
    let (scanned, bounds) = super::scan_bounded(&request.encode_to_vec(), settings).unwrap();
    assert_eq!(scanned, counts);
    assert_eq!(bounds.left_out, left_out.len() as u64);
    (counts.samples, counts.histograms, counts.metadata, left_out)
}

#[test]
fn the_translator_stops_a_metric_at_a_point_it_cannot_translate() {
    let escaped = OtlpTranslation::default();
    let label = format!("metric \"g\": {}", rules::LABEL_NAME_INVALID);
    // Mimir's translator builds each point's label names; a key that makes none (empty, or
    // only `_` once escaped) is an error for the metric, which keeps the points before it.
    for bad in ["", "..", "__", "._.", "ü.ü"] {
        let request = resources(&[(&[], vec![gauge_keyed("g", &["a", bad, "b"])])]);
        assert_eq!(
            left_out(&request, &escaped),
            (1, 0, 1, vec![label.clone()]),
            "{bad:?}"
        );
    }
    // The first point: nothing of the metric, not even its metadata entry; another metric
    // goes on.
    let request = resources(&[(
        &[],
        vec![gauge_keyed("g", &["..", "a"]), gauge_keyed("h", &["a"])],
    )]);
    assert_eq!(left_out(&request, &escaped), (1, 0, 1, vec![label.clone()]));
    // A lone `_` (or `.`, `ü`) is `key_` when the tenant sanitizes (Mimir's default), nothing
    // otherwise; a leading digit gets `key_`.
    let request = resources(&[(&[], vec![gauge_keyed("g", &["_", ".", "ü", "1"])])]);
    assert_eq!(left_out(&request, &escaped), (4, 0, 1, vec![]));
    let unsanitized = OtlpTranslation {
        otel_label_name_underscore_sanitization: false,
        ..OtlpTranslation::default()
    };
    let request = resources(&[(&[], vec![gauge_keyed("g", &["1", "_"])])]);
    assert_eq!(
        left_out(&request, &unsanitized),
        (1, 0, 1, vec![label.clone()])
    );
    // Nothing else in the request: nothing translates, a 400 before any charge.
    let request = resources(&[(&[], vec![gauge_keyed("g", &["", "a"])])]);
    let refused = super::count_left_out(&request, &escaped).unwrap_err();
    assert!(
        matches!(&refused, DecodeError::Untranslated { left_out: 1, message } if *message == label),
        "{refused:?}"
    );
    assert_eq!(scan(&request.encode_to_vec()).unwrap_err(), refused);
    let collapsed = OtlpTranslation {
        otel_label_name_preserve_multiple_underscores: false,
        ..OtlpTranslation::default()
    };
    // Runs collapsed: `_._` and `__` are `_`, so `key_`; a reserved `____` keeps its ends.
    let request = resources(&[(&[], vec![gauge_keyed("g", &["_._", "__", "____"])])]);
    assert_eq!(
        left_out(&request, &collapsed),
        (2, 0, 1, vec![label.clone()])
    );
    // Names kept as sent are not built for a point: nothing is left out (an empty key is
    // refused by the checks instead, as an invalid label).
    let utf8 = OtlpTranslation {
        utf8_names: true,
        ..OtlpTranslation::default()
    };
    let request = resources(&[(&[], vec![gauge_keyed("g", &["a", "", "."])])]);
    assert_eq!(left_out(&request, &utf8), (3, 0, 1, vec![]));
    // An exponential histogram point of scale below -4 stops its metric the same way.
    let scales = |scales: &[i32]| metrics::Metric {
        name: "e".into(),
        data: Some(metrics::metric::Data::ExponentialHistogram(
            metrics::ExponentialHistogram {
                data_points: scales
                    .iter()
                    .map(|&scale| metrics::ExponentialHistogramDataPoint {
                        scale,
                        time_unix_nano: 1_000_000,
                        ..Default::default()
                    })
                    .collect(),
                aggregation_temporality: metrics::AggregationTemporality::Cumulative as i32,
            },
        )),
        ..Default::default()
    };
    let request = resources(&[(&[], vec![scales(&[0, -5, 0]), gauge_keyed("g", &["a"])])]);
    let scale = format!("metric \"e\": {}", rules::SCALE_BELOW_MINUS_4);
    assert_eq!(left_out(&request, &escaped), (1, 1, 2, vec![scale]));
    // What the checks and the rules see stops there too.
    let request = resources(&[(&[], vec![gauge_keyed("g", &["a", "", "b"])])]);
    let points: Vec<_> = translate::translate(&request, &escaped, &|_| false, &|_| true)
        .into_iter()
        .map(|t| t.place)
        .collect();
    assert_eq!(
        points,
        [translate::Place::Point {
            resource: 0,
            scope: 0,
            metric: 0,
            point: 0
        }]
    );
    // A resource attribute whose key makes no label name errors its `target_info` (its
    // labels are built before `job` is asked for); the points stay.
    let resource = [("service.name", "s"), ("..", "x")];
    let request = resources(&[(&resource, vec![gauge_keyed("g", &["a"])])]);
    let target_info = format!(
        "metric \"target_info\": {}",
        rules::TARGET_INFO_LABEL_NAME_INVALID
    );
    assert_eq!(left_out(&request, &escaped), (1, 0, 1, vec![target_info]));
    assert_eq!(left_out(&request, &utf8), (2, 0, 2, vec![]));
}

#[test]
fn resources_that_make_the_same_target_info_are_charged_its_samples_once() {
    let second = 1_000_000_000;
    let at = |time| vec![gauge("g", 1, time)];
    let service = [("service.name", "s"), ("host.name", "h")];
    // The same resource twice (as a batching collector sends it), at one time: one sample.
    assert_eq!(
        samples_and_entries(&resources(&[(&service, at(0)), (&service, at(0))])),
        (2 + 1, 2)
    );
    // At times a millisecond apart: two.
    let apart = resources(&[(&service, at(0)), (&service, at(second / 1000))]);
    assert_eq!(samples_and_entries(&apart), (2 + 2, 2));
    // Attributes in another order, a key that escapes alike, an empty value: the same labels.
    let alike = [("host_name", "h"), ("service.name", "s"), ("empty", "")];
    assert_eq!(
        samples_and_entries(&resources(&[(&service, at(0)), (&alike, at(0))])),
        (2 + 1, 2)
    );
    // `job` written two ways: `service.namespace`/`service.name`, and a `service.name` with a
    // slash in it.
    let namespaced = [
        ("service.namespace", "n"),
        ("service.name", "s"),
        ("host.name", "h"),
    ];
    let slashed = [("service.name", "n/s"), ("host.name", "h")];
    assert_eq!(
        samples_and_entries(&resources(&[(&namespaced, at(0)), (&slashed, at(0))])),
        (2 + 1, 2)
    );
    // Another host: another series, its own sample.
    let other = [("service.name", "s"), ("host.name", "h2")];
    assert_eq!(
        samples_and_entries(&resources(&[(&service, at(0)), (&other, at(0))])),
        (2 + 2, 2)
    );
    // Overlapping spans: 0–600 s stamps 0, 150, 300, 450, 600; 300–900 s adds 750 and 900.
    let spans = resources(&[
        (
            &service,
            vec![gauge("a", 1, 0), gauge("b", 1, 600 * second)],
        ),
        (
            &service,
            vec![gauge("a", 1, 300 * second), gauge("b", 1, 900 * second)],
        ),
    ]);
    assert_eq!(samples_and_entries(&spans), (4 + 5 + 2, 3));
    // What the translation hands the checks and the rules agrees: the second `target_info` of
    // the same labels carries only what it adds.
    let settings = OtlpTranslation::default();
    let charged = translate::target_info_charges(&spans, &settings);
    assert_eq!(charged, vec![Some((5, true)), Some((2, false))]);
    let translated: Vec<u64> = translate::translate(&spans, &settings, &|_| false, &|_| true)
        .into_iter()
        .filter(|t| matches!(t.place, translate::Place::TargetInfo { .. }))
        .map(|t| t.items)
        .collect();
    assert_eq!(translated, vec![5, 2]);
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
fn metadata_entries_are_made_as_mimir_appender_makes_them() {
    // One entry when a family (the metric's translated name) is first appended, and one more
    // each time a later metric of it brings another type, unit (as named) or help than its
    // last entry: Mimir's `MimirAppender.appendMetadata`.
    let with = |name: &str, unit: &str, help: &str| metrics::Metric {
        unit: unit.into(),
        description: help.into(),
        ..gauge(name, 1, 0)
    };
    let sum = |name: &str, is_monotonic: bool| metrics::Metric {
        name: name.into(),
        data: Some(metrics::metric::Data::Sum(metrics::Sum {
            data_points: vec![Default::default()],
            aggregation_temporality: metrics::AggregationTemporality::Cumulative as i32,
            is_monotonic,
        })),
        ..Default::default()
    };
    let cases: Vec<(&str, Vec<metrics::Metric>, u64)> = vec![
        // `a.b` is `a_b`; a run of `_` as sent is kept (`a__b`, and `a._b` is `a__b` too).
        (
            "escaped names",
            vec![
                gauge("a.b", 1, 0),
                gauge("a_b", 1, 0),
                gauge("a__b", 1, 0),
                gauge("a._b", 1, 0),
            ],
            2,
        ),
        // A leading digit gets a `_`: `1x` is `_1x`.
        (
            "leading digit",
            vec![gauge("1x", 1, 0), gauge("_1x", 1, 0)],
            1,
        ),
        (
            "help changes and changes back",
            vec![
                with("x", "", "one"),
                with("x", "", "two"),
                with("x", "", "one"),
            ],
            3,
        ),
        // Units compare as named: `s` and ` s ` are both `seconds`.
        (
            "same unit",
            vec![with("x", "s", ""), with("x", " s ", "")],
            1,
        ),
        (
            "other unit",
            vec![with("x", "s", ""), with("x", "ms", "")],
            2,
        ),
        // A non-monotonic sum is a gauge; a monotonic one a counter.
        (
            "gauge and updown sum",
            vec![gauge("y", 1, 0), sum("y", false)],
            1,
        ),
        (
            "gauge and counter",
            vec![gauge("y", 1, 0), sum("y", true)],
            2,
        ),
    ];
    for (case, metrics, entries) in cases {
        let request = request(&[], metrics);
        let counted = count(&request).unwrap();
        let scanned = scan(&request.encode_to_vec()).unwrap();
        assert_eq!(counted.metadata, entries, "{case}: count");
        assert_eq!(scanned.metadata, entries, "{case}: scan");
        assert_eq!(metadata_metrics(&request).len() as u64, entries, "{case}");
    }
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
fn json_values_in_the_mapping_s_forms_pass() {
    let body = br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"g","gauge":{"dataPoints":[{"asInt":"-12"},{"asInt":7},{"asDouble":"NaN"},{"asDouble":"-Infinity"},{"asDouble":"2.5"},{"asDouble":1e3}]}}]}]}]}"#;
    let counts = decode(body, 1 << 20, json()).unwrap();
    assert_eq!(counts.samples, 6);
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
        (
            &br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"g","gauge":{"dataPoints":[{"asInt":"x"}]}}]}]}]}"#[..],
            json(),
            "asInt \"x\" is not an integer",
        ),
        (
            &br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"g","sum":{"dataPoints":[{"asDouble":true}]}}]}]}]}"#[..],
            json(),
            "asDouble is not a number",
        ),
        // The attributes and exponential buckets the series checks read.
        (
            &br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"g","gauge":{"dataPoints":[{"attributes":[{"key":"k","value":{"stringValue":1}}]}]}}]}]}]}"#[..],
            json(),
            "stringValue is not a string",
        ),
        (
            &br#"{"resourceMetrics":[{"resource":{"attributes":[{"key":"k","value":{"boolValue":"yes"}}]}}]}"#[..],
            json(),
            "boolValue is not a boolean",
        ),
        (
            &br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"g","gauge":{"dataPoints":[{"attributes":[{"key":"k","value":{"intValue":"1.5"}}]}]}}]}]}]}"#[..],
            json(),
            "intValue \"1.5\" is not an integer",
        ),
        (
            &br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"e","exponentialHistogram":{"aggregationTemporality":2,"dataPoints":[{"positive":{"offset":0,"bucketCounts":["-1"]}}]}}]}]}]}"#[..],
            json(),
            "a bucket count \"-1\" is not an unsigned integer",
        ),
        (
            &br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"e","exponentialHistogram":{"aggregationTemporality":2,"dataPoints":[{"positive":{"offset":9999999999}}]}}]}]}]}"#[..],
            json(),
            "offset 9999999999 is out of range",
        ),
        // An exemplar's fields, which the decoder reads whole (its ids are hex in JSON).
        (
            br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"s","sum":{"dataPoints":[{"exemplars":[{"spanId":"zz"}]}]}}]}]}]}"#.as_slice(),
            json(),
            "spanId \"zz\" is not hex",
        ),
        (
            br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"s","sum":{"dataPoints":[{"exemplars":[{"traceId":"abc"}]}]}}]}]}]}"#.as_slice(),
            json(),
            "traceId \"abc\" is not hex",
        ),
        (
            br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"s","sum":{"dataPoints":[{"exemplars":[{"traceId":"\u00e90"}]}]}}]}]}]}"#.as_slice(),
            json(),
            "traceId \"é0\" is not hex",
        ),
        (
            br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"s","sum":{"dataPoints":[{"exemplars":[{"spanId":7}]}]}}]}]}]}"#.as_slice(),
            json(),
            "spanId is not a string",
        ),
        (
            br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"s","sum":{"dataPoints":[{"exemplars":[{"timeUnixNano":"soon"}]}]}}]}]}]}"#.as_slice(),
            json(),
            "not an unsigned integer",
        ),
        (
            br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"s","sum":{"dataPoints":[{"exemplars":[{"asDouble":"lots"}]}]}}]}]}]}"#.as_slice(),
            json(),
            "asDouble \"lots\" is not a number",
        ),
        (
            br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"s","sum":{"dataPoints":[{"exemplars":[{"asInt":1.5}]}]}}]}]}]}"#.as_slice(),
            json(),
            "asInt 1.5 is not an integer",
        ),
        (
            br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"s","sum":{"dataPoints":[{"exemplars":[{"filteredAttributes":[{"key":"k","value":{"stringValue":1}}]}]}]}}]}]}]}"#.as_slice(),
            json(),
            "stringValue is not a string",
        ),
    ] {
        let err = decode(body, 1 << 20, format).unwrap_err();
        assert!(err.to_string().contains(expected), "{err} for {body:?}");
    }
    for compression in COMPRESSED {
        let format = OtlpFormat {
            json: false,
            compression,
        };
        let name = compression.header().unwrap();
        let err = decode(b"not compressed", 1 << 20, format).unwrap_err();
        assert!(
            err.to_string().contains(&format!("invalid {name} body")),
            "{err}"
        );
        // A small body that inflates past the limit is refused as too large.
        let bomb = compressed_apart(&vec![0u8; 2 << 20], compression);
        assert!(bomb.len() < 1 << 20, "{name}: {}", bomb.len());
        let err = decode(&bomb, 1 << 20, format).unwrap_err();
        assert_eq!(
            err,
            DecodeError::TooLarge {
                size: None,
                limit: 1 << 20
            },
            "{name}"
        );
    }
}

/// A body of several gzip members, LZ4 frames or Zstandard frames is one export, as Go's
/// readers (Mimir's) read it: every one is charged and held to the size limit, and bytes after
/// the last are an error.
#[test]
fn every_member_or_frame_is_read_charged_and_held_to_the_limit() {
    let one = request(&[], vec![gauge("one", 1, 1)]).encode_to_vec();
    let fifty = request(&[], vec![gauge("fifty", 50, 1)]).encode_to_vec();
    let whole = [one.clone(), fifty.clone()].concat();
    for compression in COMPRESSED {
        let format = OtlpFormat {
            json: false,
            compression,
        };
        let name = compression.header().unwrap();
        let parts = [
            compressed_apart(&one, compression),
            compressed_apart(&fifty, compression),
        ]
        .concat();
        let counts = decode(&parts, 1 << 20, format).unwrap();
        assert_eq!(counts.samples, 51, "{name}: {counts:?}");
        assert_eq!(counts, decode(&whole, 1 << 20, protobuf()).unwrap());

        // Each part under the limit, the two together over it.
        let limit = whole.len() - 1;
        assert!(one.len() <= limit && fifty.len() <= limit);
        let err = decode(&parts, limit, format).unwrap_err();
        assert_eq!(err, DecodeError::TooLarge { size: None, limit }, "{name}");
        assert_eq!(
            err.to_string(),
            format!("decompressed body is over the limit of {limit} bytes")
        );

        for after in [&b"not it"[..], b"abcd", b"a"] {
            let trailing = [compressed_apart(&one, compression), after.to_vec()].concat();
            let err = decode(&trailing, 1 << 20, format).unwrap_err();
            assert!(
                err.to_string().contains(&format!("invalid {name} body")),
                "{name}, {after:?} after: {err}"
            );
        }
    }
}

/// What weir forwards after an edit is in the client's encoding, and reads back whole.
#[test]
fn an_edited_export_is_compressed_as_it_came() {
    let raw = request(&[], vec![gauge("fifty", 50, 1)]).encode_to_vec();
    for compression in COMPRESSED {
        let format = OtlpFormat {
            json: false,
            compression,
        };
        let forwarded = compress(raw.clone(), compression);
        assert_ne!(forwarded, raw);
        assert_eq!(inflate(&forwarded, 1 << 20, format).unwrap(), &raw[..]);
    }
    assert_eq!(compress(raw.clone(), Compression::None), raw);
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
        Ok(gzipped(false))
    );
    for (encoding, compression) in [
        ("lz4", Compression::Lz4),
        ("ZSTD", Compression::Zstd),
        ("identity", Compression::None),
    ] {
        assert_eq!(
            parse("application/json", Some(encoding)),
            Ok(OtlpFormat {
                json: true,
                compression
            })
        );
    }
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

// The scan against the full decode. `crate::fuzzing::otlp_scan` is the property: where prost
// decodes, the scan gives `count`'s answer (counts, or the same refusal word for word); where
// prost refuses, the scan refuses.

use proptest::prelude::*;

use metrics::metric::Data as MetricData;

/// The property, and the scan's own answer for the test to check by hand.
fn scanned(body: &[u8]) -> Result<WriteCounts, DecodeError> {
    crate::fuzzing::otlp_scan(body);
    scan(body)
}

#[test]
fn the_scan_counts_the_fixture_as_mimir_charges() {
    let raw = json::decode(SAMPLE).unwrap().encode_to_vec();
    sample_counts(scanned(&raw).unwrap());
    sample_counts(decode_full(&raw, 1 << 20, protobuf()).unwrap());
    for compression in COMPRESSED {
        let format = OtlpFormat {
            json: false,
            compression,
        };
        sample_counts(decode(&compressed_apart(&raw, compression), 1 << 20, format).unwrap());
    }
}

/// Hand-written protobuf, for what prost's encoder never writes: fields repeated, packed and
/// unpacked mixed, unknown fields and groups, out-of-range enums, nesting to the limit.
mod wire {
    use prost::encoding::{encode_key, encode_varint, WireType};

    pub fn message(tag: u32, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_key(tag, WireType::LengthDelimited, &mut out);
        encode_varint(body.len() as u64, &mut out);
        out.extend_from_slice(body);
        out
    }

    pub fn varint(tag: u32, value: u64) -> Vec<u8> {
        let mut out = Vec::new();
        encode_key(tag, WireType::Varint, &mut out);
        encode_varint(value, &mut out);
        out
    }

    pub fn fixed64(tag: u32, value: u64) -> Vec<u8> {
        let mut out = Vec::new();
        encode_key(tag, WireType::SixtyFourBit, &mut out);
        out.extend_from_slice(&value.to_le_bytes());
        out
    }

    pub fn key(tag: u32, wire_type: WireType) -> Vec<u8> {
        let mut out = Vec::new();
        encode_key(tag, wire_type, &mut out);
        out
    }

    /// A request of one resource (with `resource`'s fields, if any) and one scope holding
    /// `metrics` (each a `Metric` message's fields).
    pub fn request(resource: Option<&[u8]>, metrics: &[Vec<u8>]) -> Vec<u8> {
        let scope: Vec<u8> = metrics.iter().flat_map(|m| message(2, m)).collect();
        let mut resource_metrics = Vec::new();
        if let Some(resource) = resource {
            resource_metrics.extend(message(1, resource));
        }
        resource_metrics.extend(message(2, &scope));
        message(1, &resource_metrics)
    }

    /// A gauge `NumberDataPoint` at `time` with `extra` fields.
    pub fn gauge_point(time: u64, extra: &[u8]) -> Vec<u8> {
        let mut point = fixed64(3, time);
        point.extend_from_slice(extra);
        message(1, &point)
    }

    pub fn attribute(key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut kv = message(1, key);
        kv.extend(message(2, value));
        kv
    }

    pub fn cat(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }
}

fn counted(counts: WriteCounts) -> (u64, u64, u64, u64) {
    (
        counts.samples,
        counts.histograms,
        counts.exemplars,
        counts.metadata,
    )
}

#[test]
fn a_oneof_sent_twice_merges_and_a_new_variant_starts_afresh() {
    use wire::*;
    let name = message(1, b"g");
    let gauge = |points: usize| {
        let body: Vec<u8> = (0..points).flat_map(|_| gauge_point(5, &[])).collect();
        message(5, &body)
    };
    // Two gauges: prost merges their points.
    let twice = request(None, &[cat(&[&name, &gauge(1), &gauge(2)])]);
    assert_eq!(counted(scanned(&twice).unwrap()), (3, 0, 0, 1));
    // Gauge, sum, gauge: the sum replaced the first gauge, the last gauge replaced the sum.
    let sum = message(7, &cat(&[&gauge_point(5, &[]), &varint(2, 2)]));
    let switched = request(None, &[cat(&[&name, &gauge(2), &sum, &gauge(1)])]);
    assert_eq!(counted(scanned(&switched).unwrap()), (1, 0, 0, 1));
    // A sum's temporality in a second sum message still applies, and the last one wins.
    let points = message(7, &gauge_point(5, &[]));
    let cumulative = request(None, &[cat(&[&name, &points, &message(7, &varint(2, 2))])]);
    assert_eq!(counted(scanned(&cumulative).unwrap()), (1, 0, 0, 1));
    let both = cat(&[&varint(2, 2), &varint(2, 1)]);
    let delta = request(None, &[cat(&[&name, &points, &message(7, &both)])]);
    let err = scanned(&delta).unwrap_err();
    assert!(err.to_string().contains("cumulative"), "{err}");
    // An enum is the varint cut to 32 bits: 2^32 + 2 reads as cumulative.
    let wide = message(7, &cat(&[&gauge_point(5, &[]), &varint(2, (1 << 32) + 2)]));
    let wide = request(None, &[cat(&[&name, &wide])]);
    assert_eq!(counted(scanned(&wide).unwrap()), (1, 0, 0, 1));
}

#[test]
fn repeated_numbers_count_packed_or_not() {
    use prost::encoding::WireType;
    use wire::*;
    // Bounds: 3 packed and 2 unpacked; bucket counts: 4 unpacked and 2 packed; a sum.
    let packed = |tag: u32, values: usize| message(tag, &vec![0u8; 8 * values]);
    let point = cat(&[
        &fixed64(3, 5),
        &packed(7, 3),
        &fixed64(7, 0),
        &fixed64(7, 0),
        &fixed64(6, 1),
        &fixed64(6, 1),
        &fixed64(6, 1),
        &fixed64(6, 1),
        &packed(6, 2),
        &fixed64(5, 0),
    ]);
    let histogram = message(9, &cat(&[&message(1, &point), &varint(2, 2)]));
    let body = request(None, &[cat(&[&message(1, b"h"), &histogram])]);
    // min(5 bounds, 6 counts) + `+Inf` + `_count` + `_sum`.
    assert_eq!(counted(scanned(&body).unwrap()), (5 + 3, 0, 0, 1));
    // Packed doubles that are not a whole number of 8 bytes: both refuse.
    let ragged = cat(&[&fixed64(3, 5), &message(7, &[0u8; 12])]);
    let histogram = message(9, &cat(&[&message(1, &ragged), &varint(2, 2)]));
    let body = request(None, &[cat(&[&message(1, b"h"), &histogram])]);
    assert!(scanned(&body).is_err());
    // An exponential histogram's packed bucket counts that end inside a varint: both refuse.
    let buckets = message(8, &message(2, &[0x01, 0x80]));
    let point = cat(&[&fixed64(3, 5), &buckets]);
    let exponential = message(10, &cat(&[&message(1, &point), &varint(2, 2)]));
    let body = request(None, &[cat(&[&message(1, b"e"), &exponential])]);
    assert!(scanned(&body).is_err());
    // The same field, whole, passes; and a wrong wire type for a known field is refused.
    let buckets = message(8, &message(2, &[0x01, 0x80, 0x01]));
    let point = cat(&[&fixed64(3, 5), &buckets]);
    let exponential = message(10, &cat(&[&message(1, &point), &varint(2, 2)]));
    let body = request(None, &[cat(&[&message(1, b"e"), &exponential])]);
    assert_eq!(counted(scanned(&body).unwrap()), (0, 1, 0, 1));
    let point = cat(&[&varint(3, 5)]);
    let body = request(
        None,
        &[cat(&[&message(1, b"g"), &message(5, &message(1, &point))])],
    );
    assert!(scanned(&body).is_err());
    let point = cat(&[&fixed64(3, 5), &key(100, WireType::ThirtyTwoBit), &[0; 4]]);
    let body = request(
        None,
        &[cat(&[&message(1, b"g"), &message(5, &message(1, &point))])],
    );
    assert_eq!(counted(scanned(&body).unwrap()), (1, 0, 0, 1));
}

#[test]
fn an_exponential_scale_is_a_zigzag_of_32_bits() {
    use wire::*;
    let with_scale = |scale: u64| {
        let point = cat(&[&fixed64(3, 5), &varint(6, scale)]);
        let exponential = message(10, &cat(&[&message(1, &point), &varint(2, 2)]));
        request(None, &[cat(&[&message(1, b"e"), &exponential])])
    };
    // Zigzag 8 is 4, 9 is -5 (refused), 7 is -4; the high bits of a wide varint are cut.
    assert_eq!(counted(scanned(&with_scale(8)).unwrap()), (0, 1, 0, 1));
    assert_eq!(counted(scanned(&with_scale(7)).unwrap()), (0, 1, 0, 1));
    assert!(scanned(&with_scale(9)).is_err());
    assert!(scanned(&with_scale((1 << 32) + 9)).is_err());
    assert_eq!(
        counted(scanned(&with_scale((1 << 40) + 8)).unwrap()),
        (0, 1, 0, 1)
    );
}

#[test]
fn a_resource_sent_twice_merges_its_attributes() {
    use wire::*;
    let string = |text: &[u8]| message(1, text);
    let name = message(1, &attribute(b"service.name", &string(b"s")));
    let host = message(1, &attribute(b"host.name", &string(b"h")));
    let gauge = [cat(&[&message(1, b"g"), &message(5, &gauge_point(5, &[]))])];
    // One `resource` with both attributes, or two with one each: target_info either way.
    let mut resource_metrics = message(1, &name);
    resource_metrics.extend(message(1, &host));
    resource_metrics.extend(message(2, &message(2, &gauge[0])));
    let twice = message(1, &resource_metrics);
    assert_eq!(counted(scanned(&twice).unwrap()), (2, 0, 0, 2));
    let once = request(Some(&cat(&[&name, &host])), &gauge);
    assert_eq!(scanned(&once), scanned(&twice));
    // The HA tracker's first series, read a metric at a time, has the merged resource's
    // `job`, also when a `resource` comes after the metrics.
    let mut late = message(2, &message(2, &gauge[0]));
    late.extend(message(1, &name));
    for body in [twice.clone(), message(1, &late)] {
        let first = translate::first_series_encoded(&body, &Default::default()).unwrap();
        let decoded = ExportMetricsServiceRequest::decode(&body[..]).unwrap();
        assert_eq!(
            first,
            translate::first_series(&decoded, &Default::default())
        );
        assert!(first.unwrap().contains(&("job".into(), "s".into())));
    }
    // A key sent twice in one attribute: the last one counts. The resource has
    // `service.name` twice, which Mimir's translator counts as an attribute more than the
    // identifying ones: it makes a `target_info`, named by the first.
    let renamed = cat(&[&message(1, b"host.name"), &attribute(b"service.name", b"")]);
    let only_identity = request(Some(&cat(&[&name, &message(1, &renamed)])), &gauge);
    assert_eq!(counted(scanned(&only_identity).unwrap()), (2, 0, 0, 2));
}

#[test]
fn strings_must_be_utf8_and_bytes_need_not_be() {
    use wire::*;
    let point = |value: &[u8]| {
        let attribute = message(7, &attribute(b"k", value));
        cat(&[&message(1, b"g"), &message(5, &gauge_point(5, &attribute))])
    };
    let good = request(None, &[point(&message(1, "é".as_bytes()))]);
    assert_eq!(counted(scanned(&good).unwrap()), (1, 0, 0, 1));
    let bad = request(None, &[point(&message(1, b"\xff"))]);
    let err = scanned(&bad).unwrap_err();
    assert!(err
        .to_string()
        .starts_with("invalid OTLP metrics request: invalid protobuf: "));
    let bytes = request(None, &[point(&message(7, b"\xff"))]);
    assert_eq!(counted(scanned(&bytes).unwrap()), (1, 0, 0, 1));
    let bad_name = request(
        None,
        &[cat(&[
            &message(1, b"\xc3"),
            &message(5, &gauge_point(5, &[])),
        ])],
    );
    assert!(scanned(&bad_name).is_err());
}

#[test]
fn unknown_fields_and_groups_are_skipped_as_prost_skips_them() {
    use prost::encoding::WireType;
    use wire::*;
    let gauge = cat(&[&message(1, b"g"), &message(5, &gauge_point(5, &[]))]);
    let group = cat(&[
        &key(20, WireType::StartGroup),
        &varint(1, 7),
        &key(21, WireType::StartGroup),
        &key(21, WireType::EndGroup),
        &key(20, WireType::EndGroup),
    ]);
    let body = request(None, &[cat(&[&gauge, &group])]);
    assert_eq!(counted(scanned(&body).unwrap()), (1, 0, 0, 1));
    let mismatched = cat(&[&key(20, WireType::StartGroup), &key(21, WireType::EndGroup)]);
    assert!(scanned(&request(None, &[cat(&[&gauge, &mismatched])])).is_err());
    let lone_end = key(20, WireType::EndGroup);
    assert!(scanned(&request(None, &[cat(&[&gauge, &lone_end])])).is_err());
    // Reserved and unknown fields of every wire type, at the top level too.
    let mut body = request(None, &[cat(&[&gauge, &varint(4, 1), &fixed64(6, 1)])]);
    body.extend(message(9, b"anything"));
    assert_eq!(counted(scanned(&body).unwrap()), (1, 0, 0, 1));
}

/// An attribute value of `levels` nested arrays, holding `innermost` (an `AnyValue`'s fields).
fn nested_attribute(levels: usize, innermost: &[u8]) -> Vec<u8> {
    use wire::*;
    let mut value = innermost.to_vec();
    for _ in 0..levels {
        // AnyValue { array_value: ArrayValue { values: [value] } }
        value = message(5, &message(1, &value));
    }
    let attribute = message(7, &attribute(b"k", &value));
    request(
        None,
        &[cat(&[
            &message(1, b"g"),
            &message(5, &gauge_point(5, &attribute)),
        ])],
    )
}

#[test]
fn nesting_is_refused_exactly_where_prost_refuses_it() {
    use prost::encoding::WireType;
    // The deepest attribute value prost accepts, found by prost itself.
    let decodes = |levels: usize, innermost: &[u8]| {
        ExportMetricsServiceRequest::decode(&nested_attribute(levels, innermost)[..]).is_ok()
    };
    let string = wire::message(1, b"v");
    let deepest = (0..100)
        .take_while(|&n| decodes(n, &string))
        .last()
        .unwrap();
    assert!((30..50).contains(&deepest), "{deepest}");
    // An unknown field is skipped at its message's depth, which may be one too deep.
    let unknown = wire::cat(&[&string, &wire::key(9, WireType::Varint), &[1]]);
    let group = wire::cat(&[
        &wire::key(9, WireType::StartGroup),
        &wire::varint(1, 1),
        &wire::key(9, WireType::EndGroup),
    ]);
    let mut accepted = 0;
    for levels in deepest.saturating_sub(3)..deepest + 3 {
        for innermost in [&string, &unknown, &group, &wire::message(6, b"")] {
            let body = nested_attribute(levels, innermost);
            accepted += usize::from(scanned(&body).is_ok());
        }
    }
    // Both answers were seen, so the limit was crossed.
    assert!((1..24).contains(&accepted), "{accepted}");
    assert!(scanned(&nested_attribute(deepest, &string)).is_ok());
    assert!(scanned(&nested_attribute(deepest + 1, &string)).is_err());
}

#[test]
fn a_request_of_only_refused_metrics_is_refused_in_the_same_words() {
    use wire::*;
    let delta = message(7, &cat(&[&gauge_point(5, &[]), &varint(2, 1)]));
    let body = request(
        None,
        &[
            cat(&[&message(1, b"d.one"), &delta]),
            message(1, b"no data"),
            cat(&[&message(1, b"empty"), &message(5, b"")]),
        ],
    );
    let err = scanned(&body).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid OTLP metrics request: nothing in the request can be ingested: metric \
         \"d.one\": only cumulative temporality is ingested (delta too with otel_native_delta_ingestion; unspecified never); \
         metric \"no data\": the metric has no data; metric \"empty\": empty data points: the \
         metric has data but no data point"
    );
}

fn any_value() -> impl Strategy<Value = common::AnyValue> {
    use common::any_value::Value;
    let leaf = prop_oneof![
        "[a-zé]{0,4}".prop_map(Value::StringValue),
        any::<bool>().prop_map(Value::BoolValue),
        any::<i64>().prop_map(Value::IntValue),
        any::<f64>().prop_map(Value::DoubleValue),
        prop::collection::vec(any::<u8>(), 0..4).prop_map(Value::BytesValue),
    ]
    .prop_map(|value| common::AnyValue { value: Some(value) });
    leaf.prop_recursive(3, 12, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(|values| common::AnyValue {
                value: Some(common::any_value::Value::ArrayValue(common::ArrayValue {
                    values
                })),
            }),
            prop::collection::vec(("[a-z]{0,3}", inner), 0..3).prop_map(|pairs| {
                common::AnyValue {
                    value: Some(common::any_value::Value::KvlistValue(
                        common::KeyValueList {
                            values: pairs
                                .into_iter()
                                .map(|(key, value)| common::KeyValue {
                                    key,
                                    value: Some(value),
                                })
                                .collect(),
                        },
                    )),
                }
            }),
        ]
    })
}

fn attributes() -> impl Strategy<Value = Vec<common::KeyValue>> {
    let key = prop::sample::select(vec![
        "service.name",
        "service.namespace",
        "service.instance.id",
        "host.name",
        "k",
    ]);
    prop::collection::vec((key, prop::option::of(any_value())), 0..3).prop_map(|pairs| {
        pairs
            .into_iter()
            .map(|(key, value)| common::KeyValue {
                key: key.into(),
                value,
            })
            .collect()
    })
}

/// Times that share a timestamp, spread over minutes, or sit at the ends of the range.
fn time() -> impl Strategy<Value = u64> {
    const T: u64 = 1_700_000_000_000_000_000;
    prop::sample::select(vec![
        0,
        T,
        T + 1,
        T + 150_000_000_000,
        T + 601_000_000_000,
        u64::MAX,
    ])
}

fn exemplars() -> impl Strategy<Value = Vec<metrics::Exemplar>> {
    prop::collection::vec(
        (
            attributes(),
            time(),
            prop::collection::vec(any::<u8>(), 0..9),
        )
            .prop_map(
                |(filtered_attributes, time_unix_nano, span_id)| metrics::Exemplar {
                    filtered_attributes,
                    time_unix_nano,
                    span_id,
                    value: Some(metrics::exemplar::Value::AsInt(3)),
                    ..Default::default()
                },
            ),
        0..3,
    )
}

fn number_points() -> impl Strategy<Value = Vec<metrics::NumberDataPoint>> {
    prop::collection::vec(
        (attributes(), time(), exemplars(), any::<u32>()).prop_map(
            |(attributes, time_unix_nano, exemplars, flags)| metrics::NumberDataPoint {
                attributes,
                time_unix_nano,
                exemplars,
                flags,
                value: Some(metrics::number_data_point::Value::AsDouble(1.5)),
                ..Default::default()
            },
        ),
        0..4,
    )
}

/// Mostly cumulative, and the refused ones: unspecified, delta, out of the enum's range.
fn temporality() -> impl Strategy<Value = i32> {
    prop::sample::select(vec![2, 2, 2, 0, 1, 3, -2])
}

fn data() -> impl Strategy<Value = MetricData> {
    let histogram_point = (
        attributes(),
        time(),
        prop::collection::vec(any::<u64>(), 0..5),
        prop::collection::vec(any::<f64>(), 0..5),
        prop::option::of(any::<f64>()),
        exemplars(),
    )
        .prop_map(
            |(attributes, time_unix_nano, bucket_counts, explicit_bounds, sum, exemplars)| {
                metrics::HistogramDataPoint {
                    attributes,
                    time_unix_nano,
                    bucket_counts,
                    explicit_bounds,
                    sum,
                    exemplars,
                    ..Default::default()
                }
            },
        );
    let buckets = (any::<i32>(), prop::collection::vec(any::<u64>(), 0..4)).prop_map(
        |(offset, bucket_counts)| metrics::exponential_histogram_data_point::Buckets {
            offset,
            bucket_counts,
        },
    );
    let exponential_point = (
        attributes(),
        time(),
        -6i32..10,
        prop::option::of(buckets),
        exemplars(),
    )
        .prop_map(|(attributes, time_unix_nano, scale, positive, exemplars)| {
            metrics::ExponentialHistogramDataPoint {
                attributes,
                time_unix_nano,
                scale,
                positive,
                exemplars,
                ..Default::default()
            }
        });
    let summary_point =
        (attributes(), time(), 0usize..4).prop_map(|(attributes, time_unix_nano, quantiles)| {
            metrics::SummaryDataPoint {
                attributes,
                time_unix_nano,
                quantile_values: vec![Default::default(); quantiles],
                ..Default::default()
            }
        });
    prop_oneof![
        number_points().prop_map(|data_points| MetricData::Gauge(metrics::Gauge { data_points })),
        (number_points(), temporality(), any::<bool>()).prop_map(
            |(data_points, aggregation_temporality, is_monotonic)| MetricData::Sum(metrics::Sum {
                data_points,
                aggregation_temporality,
                is_monotonic,
            })
        ),
        (prop::collection::vec(histogram_point, 0..3), temporality()).prop_map(
            |(data_points, aggregation_temporality)| MetricData::Histogram(metrics::Histogram {
                data_points,
                aggregation_temporality,
            })
        ),
        (
            prop::collection::vec(exponential_point, 0..3),
            temporality()
        )
            .prop_map(|(data_points, aggregation_temporality)| {
                MetricData::ExponentialHistogram(metrics::ExponentialHistogram {
                    data_points,
                    aggregation_temporality,
                })
            }),
        prop::collection::vec(summary_point, 0..3)
            .prop_map(|data_points| MetricData::Summary(metrics::Summary { data_points })),
    ]
}

fn metric() -> impl Strategy<Value = metrics::Metric> {
    // Names that share a family (`a.b`, `a_b`), do not (`a__b`), collide with `target_info`,
    // or need escaping beyond ASCII.
    let name = prop::sample::select(vec![
        "a.b",
        "a_b",
        "a__b",
        "target.info",
        "é",
        "",
        "x:y",
        "_a_",
    ]);
    // Helps and units that make a family's entry again, or not (` s` is named `s` is).
    let help = prop::sample::select(vec!["d", "e"]);
    let unit = prop::sample::select(vec!["s", " s", "ms", ""]);
    (name, help, unit, prop::option::of(data()), attributes()).prop_map(
        |(name, help, unit, data, metadata)| metrics::Metric {
            name: name.into(),
            description: help.into(),
            unit: unit.into(),
            data,
            metadata,
        },
    )
}

fn request_strategy() -> impl Strategy<Value = ExportMetricsServiceRequest> {
    let scope = (
        prop::option::of(attributes()),
        prop::collection::vec(metric(), 0..4),
    )
        .prop_map(|(scope, metrics)| metrics::ScopeMetrics {
            scope: scope.map(|attributes| common::InstrumentationScope {
                name: "lib".into(),
                attributes,
                ..Default::default()
            }),
            metrics,
            schema_url: String::new(),
        });
    let resource = (
        prop::option::of(attributes()),
        prop::collection::vec(scope, 0..3),
    )
        .prop_map(|(attributes, scope_metrics)| metrics::ResourceMetrics {
            resource: attributes.map(|attributes| resource::Resource {
                attributes,
                ..Default::default()
            }),
            scope_metrics,
            schema_url: "https://opentelemetry.io/schemas/1.0".into(),
        });
    prop::collection::vec(resource, 0..3)
        .prop_map(|resource_metrics| ExportMetricsServiceRequest { resource_metrics })
}

/// Resources whose `target_info`s have the same labels or not, by hand: each attribute set
/// with the class of its `target_info`'s labels (`None`: it makes none).
const TARGET_INFO_CLASSES: [(Strings, Option<u8>); 8] = [
    (&[("service.name", "s"), ("host.name", "h")], Some(0)),
    (&[("host.name", "h"), ("service.name", "s")], Some(0)),
    (
        &[("service.name", "s"), ("host_name", "h"), ("x", "")],
        Some(0),
    ),
    // `job="s"` from an attribute of that name.
    (&[("job", "s"), ("host.name", "h")], Some(0)),
    (
        &[
            ("service.namespace", "n"),
            ("service.name", "s"),
            ("host.name", "h"),
        ],
        Some(1),
    ),
    (&[("service.name", "n/s"), ("host.name", "h")], Some(1)),
    (&[("service.name", "s"), ("host.name", "h2")], Some(2)),
    (&[("service.name", ""), ("host.name", "h")], None),
];

/// Mimir's `target_info` samples for resources of these label classes and point times, as
/// its translator stamps them (`addResourceTargetInfo`): every 150 s from the earliest point
/// while before the latest, then the latest, each skipped when its labels and millisecond
/// were stamped before (`seenTargetInfo`).
fn mimir_target_info_samples(resources: &[(Option<u8>, Vec<u64>)]) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let mut samples = 0;
    for (class, times) in resources {
        let (Some(class), Some(&earliest), Some(&latest)) =
            (class, times.iter().min(), times.iter().max())
        else {
            continue;
        };
        let mut time = earliest;
        while time < latest {
            samples += u64::from(seen.insert((*class, time / 1_000_000)));
            time += 150_000_000_000;
        }
        samples += u64::from(seen.insert((*class, latest / 1_000_000)));
    }
    samples
}

proptest! {
    /// Resources of the same `target_info` labels or not, at times a fraction of a
    /// millisecond and a step apart: charged Mimir's samples, on a decode and on the scan.
    #[test]
    fn target_info_samples_are_stamped_as_mimir_stamps_them(
        drawn in prop::collection::vec(
            (0..TARGET_INFO_CLASSES.len(), prop::collection::vec(
                prop::sample::select(vec![
                    0u64, 400_000, 1_000_000, 150_000_000_000, 150_000_300_000,
                    300_000_999_999, 450_000_000_000, 1_200_000_000_000,
                ]),
                0..4,
            )),
            0..5,
        )
    ) {
        let request = resources(&drawn
            .iter()
            .map(|(which, times)| {
                let metrics = times.iter().map(|&time| gauge("g", 1, time)).collect();
                (TARGET_INFO_CLASSES[*which].0, metrics)
            })
            .collect::<Vec<_>>());
        let points: u64 = drawn.iter().map(|(_, times)| times.len() as u64).sum();
        let classes: Vec<(Option<u8>, Vec<u64>)> = drawn
            .iter()
            .map(|(which, times)| (TARGET_INFO_CLASSES[*which].1, times.clone()))
            .collect();
        let (samples, _) = samples_and_entries(&request);
        prop_assert_eq!(samples, points + mimir_target_info_samples(&classes));
    }
}

proptest! {
    /// Every kind of metric, refused ones included: the scan of the encoded request gives
    /// what `count` of the request gives, refusals word for word.
    #[test]
    fn the_scan_counts_what_a_decode_counts(request in request_strategy()) {
        let body = request.encode_to_vec();
        prop_assert_eq!(scan(&body), count(&request));
        let full = decode_full(&body, usize::MAX, protobuf());
        prop_assert_eq!(decode(&body, usize::MAX, protobuf()), full);
    }

    /// Damaged requests (bytes changed, cut short, or spliced in): the scan and prost accept
    /// and refuse alike, and count alike what both accept.
    #[test]
    fn damaged_requests_are_refused_as_prost_refuses_them(
        request in request_strategy(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
        cut in prop::option::of(any::<prop::sample::Index>()),
        splice in prop::option::of(
            (any::<prop::sample::Index>(), prop::collection::vec(any::<u8>(), 1..6))
        ),
    ) {
        let mut body = request.encode_to_vec();
        if !body.is_empty() {
            for (index, byte) in flips {
                let i = index.index(body.len());
                body[i] = byte;
            }
            if let Some((index, bytes)) = splice {
                let i = index.index(body.len());
                body.splice(i..i, bytes);
            }
            if let Some(index) = cut {
                body.truncate(index.index(body.len()));
            }
        }
        crate::fuzzing::otlp_scan(&body);
    }

    /// The HA tracker's first series read a metric at a time is the decoded request's.
    #[test]
    fn the_first_series_on_the_wire_is_the_decoded_request_s(request in request_strategy()) {
        let body = request.encode_to_vec();
        prop_assert_eq!(
            translate::first_series_encoded(&body, &Default::default()).unwrap(),
            translate::first_series(&request, &Default::default())
        );
    }

    /// Exemplars cut on the wire are what clearing them in the decoded request cuts, and an
    /// export with none is left as it is.
    #[test]
    fn exemplars_cut_on_the_wire_are_those_a_decode_clears(request in request_strategy()) {
        let body = request.encode_to_vec();
        let mut cleared = request.clone();
        edit::clear_exemplars(&mut cleared);
        match edit::without_exemplars(&body).unwrap() {
            None => prop_assert_eq!(&cleared, &request),
            Some(cut) => {
                prop_assert_ne!(&cleared, &request);
                prop_assert!(cut.len() < body.len());
                prop_assert_eq!(ExportMetricsServiceRequest::decode(&cut[..]).unwrap(), cleared);
            }
        }
    }

    #[test]
    fn arbitrary_bytes_are_refused_as_prost_refuses_them(
        body in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        crate::fuzzing::otlp_scan(&body);
    }
}

/// Fields weir does not read stay as sent, byte for byte, beside a cut exemplar: an unknown
/// field of the point, of the request, and an exemplar field of a summary point (which has
/// none: its field 5 is its sum, so it is not touched).
#[test]
fn cutting_exemplars_on_the_wire_keeps_every_other_byte() {
    use prost::encoding::WireType;
    use wire::*;
    const T: u64 = 1_700_000_000_000_000_000;
    let exemplar = message(5, &fixed64(2, 7));
    let unknown = cat(&[&key(99, WireType::Varint), &[1]]);
    let sum = |extra: &[u8]| {
        let point = gauge_point(T, extra);
        cat(&[
            &message(1, b"requests"),
            &message(7, &cat(&[&point, &key(2, WireType::Varint), &[2]])),
        ])
    };
    let summary = cat(&[
        &message(1, b"latency"),
        &message(11, &message(1, &cat(&[&fixed64(3, T), &fixed64(5, 9)]))),
    ]);
    let sent = cat(&[
        &request(
            None,
            &[
                sum(&cat(&[&exemplar, &unknown, &exemplar])),
                summary.clone(),
            ],
        ),
        &unknown,
    ]);
    let expected = cat(&[&request(None, &[sum(&unknown), summary.clone()]), &unknown]);
    assert_eq!(edit::without_exemplars(&sent).unwrap(), Some(expected));
    // With none to cut, nothing is written.
    let none = cat(&[&request(None, &[sum(&unknown), summary]), &unknown]);
    assert_eq!(edit::without_exemplars(&none).unwrap(), None);
}

//! Mimir's series validation on remote-write 1.0, on a real weir process that forwards to a
//! receiver served by this test. A tenant with tight limits sends a request with two good
//! series and one of each kind of bad series:
//!
//! - the answer is 400 with the first refusal's message and Mimir's error id;
//! - the receiver gets the good series, and only them, in one request;
//! - each refused series' samples are counted under its reason in
//!   `weir_discarded_samples_total`, and are not charged;
//! - each bad series alone gets its own reason, and nothing is forwarded;
//! - a request with nothing to refuse reaches the receiver byte for byte as sent;
//! - `drop_labels` cuts its labels before the checks, and the receiver never sees them;
//! - `truncate` and `drop` rewrite a long label value with its hash, and accept the series;
//! - metadata with a help over `max_metadata_length` is cut to fit, with a name or unit over
//!   it (or no name) is refused, cut from the request and counted in
//!   `weir_discarded_metadata_total`;
//! - a native histogram over `max_native_histogram_buckets` reaches the receiver at a lower
//!   resolution, or refuses its series when it cannot be reduced or reduction is off;
//! - a sample repeating a timestamp of its series is dropped and counted
//!   (`sample_duplicate_timestamp`), the push accepted;
//! - a series with no label left (none sent, or each empty or dropped) is dropped silently,
//!   as Mimir drops it: 200, and with nothing else nothing is forwarded;
//! - exemplars: with `max_global_exemplars_per_user` at 0 (Mimir's default) none is charged or
//!   forwarded; with it set, the ones Mimir's checks drop never reach the receiver and are
//!   counted by reason in `weir_discarded_exemplars_total`, and the push is answered 200.

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use common::fleet::forwarding_to;
use common::receiver::Receiver;
use common::{decoded, series};
use weir::remote_write::prompb::{
    histogram, BucketSpan, Exemplar, Histogram, Label, MetricMetadata, TimeSeries, WriteRequest,
};

const OVERRIDES: &str = "overrides:\n  v:\n    ingestion_rate: 1000000\n    \
    ingestion_burst_size: 1000000\n    max_label_names_per_series: 5\n    \
    max_label_names_per_info_series: 7\n    \
    max_label_name_length: 20\n    max_label_value_length: 30\n    \
    creation_grace_period: 10m\n    past_grace_period: 1h\n    drop_labels: [replica]\n";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// `target_info` with `count` labels in all.
fn info_labels(count: usize) -> Vec<(&'static str, &'static str)> {
    let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
    std::iter::once(("__name__", "target_info"))
        .chain(names[..count - 1].iter().map(|name| (*name, "1")))
        .collect()
}

/// Each bad series with the reason it must be refused for.
fn bad_series(now: i64) -> Vec<(&'static str, TimeSeries)> {
    let long_name = "n".repeat(21);
    let long_value = "v".repeat(31);
    vec![
        (
            "max_label_names_per_info_series",
            series(&info_labels(8), &[now]),
        ),
        (
            "max_label_names_per_series",
            series(
                &[
                    ("__name__", "m"),
                    ("a", "1"),
                    ("b", "1"),
                    ("c", "1"),
                    ("d", "1"),
                    ("e", "1"),
                ],
                &[now],
            ),
        ),
        (
            "label_name_too_long",
            series(&[("__name__", "m"), (long_name.as_str(), "1")], &[now]),
        ),
        (
            "label_value_too_long",
            series(&[("__name__", "m"), ("a", long_value.as_str())], &[now]),
        ),
        (
            "label_invalid",
            series(&[("__name__", "m"), ("a-b", "1")], &[now]),
        ),
        ("missing_metric_name", series(&[("a", "1")], &[now])),
        ("metric_name_invalid", series(&[("__name__", "9m")], &[now])),
        (
            "duplicate_label_names",
            // Not adjacent: Mimir sorts the labels before its checks.
            series(
                &[("__name__", "m"), ("a", "1"), ("job", "x"), ("a", "2")],
                &[now],
            ),
        ),
        (
            "too_far_in_future",
            series(&[("__name__", "m")], &[now, now + 3_600_000]),
        ),
        (
            "too_far_in_past",
            series(&[("__name__", "m")], &[now - 7_200_000, now]),
        ),
    ]
}

async fn push(client: &reqwest::Client, base: &str, body: Vec<u8>) -> (u16, String) {
    let response = common::push_request(client, base, Some("v"), body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_series_are_refused_with_mimirs_reasons_and_the_rest_is_forwarded() {
    let receiver = Receiver::default();
    let upstream = receiver.serve().await;

    let (replica, _dir) = forwarding_to(upstream, OVERRIDES, 51, "validation", &[]).await;
    let base = format!("http://{}", replica.http);
    let client = reqwest::Client::new();
    let now = now_ms();

    // Nothing to refuse: the receiver gets the client's bytes.
    let good = WriteRequest {
        timeseries: vec![series(&[("__name__", "up"), ("job", "a")], &[now])],
        metadata: vec![],
    };
    let body = good.encode_snappy();
    let (status, text) = push(&client, &base, body.clone()).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        receiver.take_bodies(),
        vec![Bytes::from(body)],
        "forwarded as sent"
    );

    // drop_labels: the label goes before the checks (six labels with it, five without: the
    // limit), and the receiver never sees it.
    let labels = [
        ("__name__", "m"),
        ("a", "1"),
        ("b", "1"),
        ("c", "1"),
        ("d", "1"),
    ];
    let mut with_replica = labels.to_vec();
    with_replica.push(("replica", "r1"));
    let dropping = WriteRequest {
        timeseries: vec![series(&with_replica, &[now])],
        metadata: vec![],
    };
    let (status, text) = push(&client, &base, dropping.encode_snappy()).await;
    assert_eq!(status, 200, "{text}");
    let forwarded = receiver.take_bodies();
    assert_eq!(forwarded.len(), 1, "one forward");
    assert_eq!(
        decoded(&forwarded[0]).timeseries,
        vec![series(&labels, &[now])],
        "the series without `replica`"
    );

    // An info series has a label limit of its own: 7 labels pass where the series limit is 5.
    let info = WriteRequest {
        timeseries: vec![series(&info_labels(7), &[now])],
        metadata: vec![],
    };
    let body = info.encode_snappy();
    let (status, text) = push(&client, &base, body.clone()).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(receiver.take_bodies(), vec![Bytes::from(body)]);

    // A sample repeating a timestamp of its series goes, uncharged and counted, as in
    // Mimir; the push is accepted.
    let repeating = WriteRequest {
        timeseries: vec![series(&[("__name__", "rep")], &[now - 1, now, now - 1])],
        metadata: vec![],
    };
    let (status, text) = push(&client, &base, repeating.encode_snappy()).await;
    assert_eq!(status, 200, "{text}");
    let forwarded = receiver.take_bodies();
    assert_eq!(
        decoded(&forwarded[0]).timeseries,
        vec![series(&[("__name__", "rep")], &[now - 1, now])]
    );
    assert_eq!(
        common::metric_at(
            &client,
            &base,
            "weir_discarded_samples_total{reason=\"sample_duplicate_timestamp\",user=\"v\"}"
        )
        .await,
        Some(1.0)
    );

    // A series with no labels, or none left once the empty values and `drop_labels` go,
    // is dropped silently, as Mimir drops it: 200, not forwarded, not charged, not counted.
    let unlabelled = [
        series(&[], &[now]),
        series(&[("replica", "r1"), ("job", "")], &[now]),
    ];
    let mut timeseries = unlabelled.to_vec();
    timeseries.push(series(&[("__name__", "labelled")], &[now]));
    let (status, text) = push(
        &client,
        &base,
        WriteRequest {
            timeseries,
            metadata: vec![],
        }
        .encode_snappy(),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let forwarded = receiver.take_bodies();
    assert_eq!(
        decoded(&forwarded[0]).timeseries,
        vec![series(&[("__name__", "labelled")], &[now])]
    );
    let only = WriteRequest {
        timeseries: unlabelled.to_vec(),
        metadata: vec![],
    };
    let (status, text) = push(&client, &base, only.encode_snappy()).await;
    assert_eq!(status, 200, "{text}");
    assert!(receiver.take_bodies().is_empty(), "nothing to forward");

    // Two good series around one of each bad kind.
    // Out of name order, as vmagent sends its target labels: kept, and forwarded as sent.
    let first_good = series(&[("job", "a"), ("__name__", "ok")], &[now]);
    let last_good = series(&[("__name__", "ok_two")], &[now - 1_000, now - 500, now]);
    let bad = bad_series(now);
    let mut timeseries = vec![first_good.clone()];
    timeseries.extend(bad.iter().map(|(_, series)| series.clone()));
    timeseries.push(last_good.clone());
    let mixed = WriteRequest {
        timeseries,
        metadata: vec![],
    };
    let (status, text) = push(&client, &base, mixed.encode_snappy()).await;
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("err-weir-max-label-names-per-info-series")
            && text.contains("actual: 8, limit: 7"),
        "the first refusal's message: {text}"
    );
    let forwarded = receiver.take_bodies();
    assert_eq!(forwarded.len(), 1, "one forward");
    assert_eq!(
        decoded(&forwarded[0]).timeseries,
        vec![first_good, last_good],
        "exactly the good series"
    );
    // One a refused series, whatever its samples (the time cases carry two): Mimir's checks
    // count once, at the first that fails.
    for (reason, _) in &bad {
        let series = format!("weir_discarded_samples_total{{reason=\"{reason}\",user=\"v\"}}");
        assert_eq!(
            common::metric_at(&client, &base, &series).await,
            Some(1.0),
            "{series}"
        );
    }
    assert_eq!(
        common::metric_at(
            &client,
            &base,
            "weir_distributor_received_samples_total{user=\"v\"}"
        )
        .await,
        // The clean request, the relabelled one, the info series, the repeating one (2 of 3),
        // the labelled series beside the unlabelled ones, the good series here.
        Some(1.0 + 1.0 + 1.0 + 2.0 + 1.0 + 1.0 + 3.0),
        "only the good series' samples are admitted"
    );

    // Each bad series alone: its own reason, and nothing forwarded.
    for (reason, series) in bad {
        let alone = WriteRequest {
            timeseries: vec![series],
            metadata: vec![],
        };
        let (status, text) = push(&client, &base, alone.encode_snappy()).await;
        let id = format!("err-weir-{}", reason.replace('_', "-"));
        assert_eq!(status, 400, "{reason}: {text}");
        assert!(text.contains(&id), "{reason}: {text}");
        assert!(
            receiver.take_bodies().is_empty(),
            "{reason}: nothing forwarded"
        );
    }
}

/// Tenants whose checks rewrite or refuse with the other keys: `t` truncates and `d` drops a
/// label value over 80 bytes, `m` has `max_metadata_length: 10`, `h` reduces histograms over 3
/// buckets, `r` refuses them.
const REWRITES: &str = "overrides:\n  \
    t:\n    ingestion_rate: 1000000\n    ingestion_burst_size: 1000000\n    \
    max_label_value_length: 80\n    label_value_length_over_limit_strategy: truncate\n  \
    d:\n    ingestion_rate: 1000000\n    ingestion_burst_size: 1000000\n    \
    max_label_value_length: 80\n    label_value_length_over_limit_strategy: drop\n  \
    m:\n    ingestion_rate: 1000000\n    ingestion_burst_size: 1000000\n    \
    max_metadata_length: 10\n  \
    h:\n    ingestion_rate: 1000000\n    ingestion_burst_size: 1000000\n    \
    max_native_histogram_buckets: 3\n  \
    r:\n    ingestion_rate: 1000000\n    ingestion_burst_size: 1000000\n    \
    max_native_histogram_buckets: 3\n    reduce_native_histogram_over_max_buckets: false\n";

async fn push_as(
    client: &reqwest::Client,
    base: &str,
    tenant: &str,
    body: Vec<u8>,
) -> (u16, String) {
    let response = common::push_request(client, base, Some(tenant), body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

/// `(hash:<hex blake2b-256>)`, as Mimir writes it.
fn hash_of(value: &str) -> String {
    use blake2::Digest;
    let digest = blake2::Blake2b::<blake2::digest::consts::U32>::digest(value.as_bytes());
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("(hash:{hex})")
}

/// An integer native histogram at `schema` whose positive buckets 0.. hold `counts`.
fn histogram(schema: i32, counts: &[i64], timestamp: i64) -> Histogram {
    let mut previous = 0;
    Histogram {
        count: Some(histogram::Count::CountInt(counts.iter().sum::<i64>() as u64)),
        schema,
        timestamp,
        positive_spans: vec![BucketSpan {
            offset: 0,
            length: counts.len() as u32,
        }],
        positive_deltas: counts
            .iter()
            .map(|count| {
                let delta = count - previous;
                previous = *count;
                delta
            })
            .collect(),
        ..Histogram::default()
    }
}

fn metadata(name: &str, help: &str, unit: &str) -> MetricMetadata {
    MetricMetadata {
        r#type: 1,
        metric_family_name: name.to_string(),
        help: help.to_string(),
        unit: unit.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_values_histograms_and_metadata_are_rewritten_or_refused_as_mimir_does() {
    let receiver = Receiver::default();
    let upstream = receiver.serve().await;
    let (replica, _dir) = forwarding_to(upstream, REWRITES, 55, "validation-rewrites", &[]).await;
    let base = format!("http://{}", replica.http);
    let client = reqwest::Client::new();
    let now = now_ms();
    let metric = |series: &str| {
        let (client, base) = (client.clone(), base.clone());
        let series = series.to_string();
        async move { common::metric_at(&client, &base, &series).await }
    };

    // truncate: the first 80 - 71 bytes, then the whole value's hash; the series is accepted
    // and nothing is discarded.
    let long = "x".repeat(100);
    let request = WriteRequest {
        timeseries: vec![series(&[("__name__", "m"), ("a", long.as_str())], &[now])],
        metadata: vec![],
    };
    let (status, text) = push_as(&client, &base, "t", request.encode_snappy()).await;
    assert_eq!(status, 200, "{text}");
    let forwarded = receiver.take_bodies();
    assert_eq!(forwarded.len(), 1, "one forward");
    let truncated = format!("xxxxxxxxx{}", hash_of(&long));
    assert_eq!(truncated.len(), 80);
    assert_eq!(
        decoded(&forwarded[0]).timeseries,
        vec![series(
            &[("__name__", "m"), ("a", truncated.as_str())],
            &[now]
        )]
    );
    // A request with nothing over the limit still goes as sent.
    let short = WriteRequest {
        timeseries: vec![series(&[("__name__", "m"), ("a", "x")], &[now])],
        metadata: vec![],
    };
    let body = short.encode_snappy();
    let (status, _) = push_as(&client, &base, "t", body.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(
        receiver.take_bodies(),
        vec![Bytes::from(body)],
        "forwarded as sent"
    );

    // drop: the hash alone.
    let (status, text) = push_as(&client, &base, "d", request.encode_snappy()).await;
    assert_eq!(status, 200, "{text}");
    let forwarded = receiver.take_bodies();
    assert_eq!(
        decoded(&forwarded[0]).timeseries,
        vec![series(
            &[("__name__", "m"), ("a", hash_of(&long).as_str())],
            &[now]
        )]
    );
    for tenant in ["t", "d"] {
        assert_eq!(
            metric(&format!(
                "weir_discarded_samples_total{{reason=\"label_value_too_long\",user=\"{tenant}\"}}"
            ))
            .await,
            None,
            "{tenant}: nothing discarded"
        );
    }

    // Metadata: a help over 10 bytes is cut; a name or unit over 10 bytes, or no name,
    // refuses the entry, which is cut from the request and not charged. The answer is 400
    // with the first refusal.
    let good_series = series(&[("__name__", "up")], &[now]);
    let request = WriteRequest {
        timeseries: vec![good_series.clone()],
        metadata: vec![
            metadata("up", "short", ""),
            metadata("a_very_long_name", "h", ""),
            metadata("m2", "a help over ten bytes", "s"),
            metadata("m3", "h", "seconds_of_it"),
            metadata("", "h", ""),
        ],
    };
    let (status, text) = push_as(&client, &base, "m", request.encode_snappy()).await;
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("metric name: 'a_very_long_name' (err-weir-metric-name-too-long)"),
        "{text}"
    );
    let forwarded = receiver.take_bodies();
    assert_eq!(forwarded.len(), 1, "one forward");
    let sent = decoded(&forwarded[0]);
    assert_eq!(sent.timeseries, vec![good_series]);
    assert_eq!(
        sent.metadata,
        vec![
            metadata("up", "short", ""),
            metadata("m2", "a help ove", "s")
        ]
    );
    for (reason, count) in [
        ("metric_name_too_long", 1.0),
        ("unit_too_long", 1.0),
        ("missing_metric_name", 1.0),
    ] {
        let series = format!("weir_discarded_metadata_total{{reason=\"{reason}\",user=\"m\"}}");
        assert_eq!(metric(&series).await, Some(count), "{series}");
    }
    assert_eq!(
        metric("weir_distributor_received_metadata_total{user=\"m\"}").await,
        Some(2.0),
        "only the kept metadata is charged"
    );

    // A histogram over 3 buckets: buckets 0..=3 at schema 1 hold 1, 2, 3, 4. Schema 0 merges
    // them into 1, 5, 4 (three, not fewer than the limit); schema -1 into 1, 9.
    let with_histogram = |histogram: Histogram| WriteRequest {
        timeseries: vec![TimeSeries {
            histograms: vec![histogram],
            ..series(&[("__name__", "latency")], &[])
        }],
        metadata: vec![],
    };
    let (status, text) = push_as(
        &client,
        &base,
        "h",
        with_histogram(histogram(1, &[1, 2, 3, 4], now)).encode_snappy(),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let forwarded = receiver.take_bodies();
    assert_eq!(forwarded.len(), 1, "one forward");
    assert_eq!(
        decoded(&forwarded[0]).timeseries[0].histograms,
        vec![Histogram {
            count: Some(histogram::Count::CountInt(10)),
            ..histogram(-1, &[1, 9], now)
        }]
    );
    // At schema -4 it cannot be reduced: refused, with Mimir's not-reducible message.
    let (status, text) = push_as(
        &client,
        &base,
        "h",
        with_histogram(histogram(-4, &[1, 2, 3, 4], now)).encode_snappy(),
    )
    .await;
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("cannot reduce") && text.contains("err-weir-not-reducible-native-histogram"),
        "{text}"
    );
    assert!(receiver.take_bodies().is_empty(), "nothing forwarded");
    // Reduction off: refused.
    let (status, text) = push_as(
        &client,
        &base,
        "r",
        with_histogram(histogram(1, &[1, 2, 3, 4], now)).encode_snappy(),
    )
    .await;
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("buckets: 4, limit: 3 (err-weir-max-native-histogram-buckets)"),
        "{text}"
    );
    assert!(receiver.take_bodies().is_empty(), "nothing forwarded");
    for tenant in ["h", "r"] {
        let series = format!(
            "weir_discarded_samples_total{{reason=\"max_native_histogram_buckets\",user=\"{tenant}\"}}"
        );
        assert_eq!(metric(&series).await, Some(1.0), "{series}");
    }
    // A schema Mimir does not know (9: exponential ones are -4 to 8): refused, as a real Mimir
    // 3.0.3 refuses it (scripts/mimir-differential), the other series forwarded.
    let (status, text) = push_as(
        &client,
        &base,
        "r",
        WriteRequest {
            timeseries: vec![
                TimeSeries {
                    histograms: vec![histogram(9, &[1], now)],
                    ..series(&[("__name__", "latency")], &[])
                },
                series(&[("__name__", "up")], &[now]),
            ],
            metadata: vec![],
        }
        .encode_snappy(),
    )
    .await;
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("invalid schema: 9")
            && text.contains("err-weir-invalid-native-histogram-schema"),
        "{text}"
    );
    let forwarded = receiver.take_bodies();
    assert_eq!(
        decoded(&forwarded[0]).timeseries.len(),
        1,
        "the other series"
    );
    assert_eq!(
        metric(
            "weir_discarded_samples_total{reason=\"invalid_native_histogram_schema\",user=\"r\"}"
        )
        .await,
        Some(1.0)
    );
}

/// `e` keeps exemplars, at most 2 a series in a request; `o` has Mimir's default, exemplars off,
/// and an ingestion limit of 5 a second that 4 samples fit and 4 samples with 4 exemplars
/// would not.
const EXEMPLARS: &str = "overrides:\n  \
    e:\n    ingestion_rate: 1000000\n    ingestion_burst_size: 1000000\n    \
    max_global_exemplars_per_user: 1000\n    max_exemplars_per_series_per_request: 2\n  \
    o:\n    ingestion_rate: 5\n    ingestion_burst_size: 5\n";

fn exemplar(labels: &[(&str, &str)], timestamp: i64) -> Exemplar {
    Exemplar {
        labels: labels
            .iter()
            .map(|(name, value)| Label {
                name: name.to_string(),
                value: value.to_string(),
            })
            .collect(),
        value: 1.0,
        timestamp,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exemplars_are_dropped_uncharged_and_counted_as_mimir_does() {
    let receiver = Receiver::default();
    let upstream = receiver.serve().await;
    let (replica, _dir) = forwarding_to(upstream, EXEMPLARS, 56, "validation-exemplars", &[]).await;
    let base = format!("http://{}", replica.http);
    let client = reqwest::Client::new();
    let now = now_ms();
    let trace = [("trace_id", "abc")];

    // Exemplars off: 4 samples are charged, not their 4 exemplars (8 would be over the
    // burst of 5), and the receiver gets the series without them.
    let mut with_exemplars = series(&[("__name__", "up")], &[now - 3, now - 2, now - 1, now]);
    with_exemplars.exemplars = vec![exemplar(&trace, now); 4];
    let request = WriteRequest {
        timeseries: vec![with_exemplars.clone()],
        metadata: vec![],
    };
    let (status, text) = push_as(&client, &base, "o", request.encode_snappy()).await;
    assert_eq!(status, 200, "{text}");
    let forwarded = receiver.take_bodies();
    assert_eq!(forwarded.len(), 1, "one forward");
    assert_eq!(
        decoded(&forwarded[0]).timeseries,
        vec![series(
            &[("__name__", "up")],
            &[now - 3, now - 2, now - 1, now]
        )],
        "the series without its exemplars"
    );

    // Exemplars on: the bad ones and the third of a series (the cap goes first) go, the
    // push is accepted.
    let mut first = series(&[("__name__", "a")], &[now]);
    first.exemplars = vec![exemplar(&trace, now), exemplar(&[], now)];
    let mut second = series(&[("__name__", "b")], &[now]);
    second.exemplars = vec![
        exemplar(&trace, 0),
        exemplar(&trace, now),
        exemplar(&trace, now - 1),
    ];
    let request = WriteRequest {
        timeseries: vec![first.clone(), second.clone()],
        metadata: vec![],
    };
    let (status, text) = push_as(&client, &base, "e", request.encode_snappy()).await;
    assert_eq!(status, 200, "exemplars never refuse a push: {text}");
    let forwarded = receiver.take_bodies();
    assert_eq!(forwarded.len(), 1, "one forward");
    first.exemplars.truncate(1);
    second.exemplars = vec![exemplar(&trace, now)];
    assert_eq!(decoded(&forwarded[0]).timeseries, vec![first, second]);

    let metric = |series: String| {
        let (client, base) = (client.clone(), base.clone());
        async move { common::metric_at(&client, &base, &series).await }
    };
    for (user, exemplars) in [("o", 0.0), ("e", 2.0)] {
        let series = format!("weir_distributor_received_exemplars_total{{user=\"{user}\"}}");
        assert_eq!(metric(series.clone()).await, Some(exemplars), "{series}");
    }
    for reason in [
        "exemplar_labels_missing",
        "exemplar_timestamp_invalid",
        "too_many_exemplars_per_series_per_request",
    ] {
        let series = format!("weir_discarded_exemplars_total{{reason=\"{reason}\",user=\"e\"}}");
        assert_eq!(metric(series.clone()).await, Some(1.0), "{series}");
    }
    // Taken out because exemplars are off is not a drop, as in Mimir.
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let dropped: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("weir_discarded_exemplars_total{"))
        .collect();
    assert_eq!(dropped.len(), 3, "{dropped:?}");
    assert!(
        dropped.iter().all(|line| line.contains("user=\"e\"")),
        "{dropped:?}"
    );
}

/// `name_validation_scheme: utf8` takes dotted metric and label names that Mimir's default,
/// `legacy`, refuses: the same push is forwarded for one tenant and refused for the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn utf8_names_pass_under_the_utf8_scheme_and_are_refused_under_legacy() {
    let receiver = Receiver::default();
    let upstream = receiver.serve().await;
    let overrides = "overrides:\n  u:\n    name_validation_scheme: utf8\n";
    let (replica, _dir) = forwarding_to(upstream, overrides, 59, "validation-utf8", &[]).await;
    let base = format!("http://{}", replica.http);
    let client = reqwest::Client::new();
    let dotted = WriteRequest {
        timeseries: vec![series(
            &[
                ("__name__", "http.server.duration"),
                ("service.name", "api"),
            ],
            &[now_ms()],
        )],
        metadata: vec![],
    };
    let body = dotted.encode_snappy();
    let (status, text) = push_as(&client, &base, "u", body.clone()).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(receiver.take_bodies(), vec![Bytes::from(body.clone())]);
    let (status, text) = push_as(&client, &base, "legacy", body).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("metric-name-invalid"), "{text}");
    assert!(receiver.take_bodies().is_empty());
}

/// A label value that is not UTF-8 refuses only its series, as a real Mimir 3.0.3 refuses it
/// (`label_value_invalid`, scripts/mimir-differential): Mimir reads a body without checking
/// UTF-8. The other series are forwarded and charged; the push is answered 400 with Mimir's
/// message, the bad bytes shown as U+FFFD.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_value_that_is_not_utf8_refuses_only_its_series() {
    let receiver = Receiver::default();
    let upstream = receiver.serve().await;
    let (replica, _dir) = forwarding_to(upstream, OVERRIDES, 61, "validation-not-utf8", &[]).await;
    let base = format!("http://{}", replica.http);
    let client = reqwest::Client::new();
    let now = now_ms();
    let good = series(&[("__name__", "up"), ("job", "good")], &[now]);
    let request = WriteRequest {
        timeseries: vec![
            series(&[("__name__", "up"), ("job", "BAD")], &[now]),
            good.clone(),
        ],
        metadata: vec![],
    };
    // prost's `String` cannot hold it: the bytes are changed after encoding.
    let mut raw = prost::Message::encode_to_vec(&request);
    let at = raw.windows(3).position(|bytes| bytes == b"BAD").unwrap();
    raw[at + 1] = 0xff;
    let body = snap::raw::Encoder::new().compress_vec(&raw).unwrap();
    let (status, text) = push(&client, &base, body).await;
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains(
            "received a series with invalid value in label 'job': 'B\u{fffd}D' metric: 'up'"
        ) && text.contains("err-weir-label-value-invalid"),
        "{text}"
    );
    let forwarded = receiver.take_bodies();
    assert_eq!(forwarded.len(), 1, "one forward");
    assert_eq!(
        decoded(&forwarded[0]).timeseries,
        vec![good],
        "the good series alone"
    );
    for (series, value) in [
        (
            "weir_discarded_samples_total{reason=\"label_value_invalid\",user=\"v\"}",
            1.0,
        ),
        ("weir_distributor_received_samples_total{user=\"v\"}", 1.0),
    ] {
        assert_eq!(
            common::metric_at(&client, &base, series).await,
            Some(value),
            "{series}"
        );
    }
}

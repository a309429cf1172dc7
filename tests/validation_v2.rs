//! Mimir's series validation on remote-write 2.0, on a real weir process that forwards to a
//! receiver served by this test, as `tests/validation.rs` checks it on 1.0. A tenant with
//! tight limits sends 2.0 requests (labels as references into the request's symbols):
//!
//! - a request with nothing to refuse reaches the receiver byte for byte as sent, and the
//!   answer's `X-Prometheus-Remote-Write-*-Written` headers count all it carries;
//! - `drop_labels` cuts its label pairs from `labels_refs` before the checks, and the
//!   receiver never sees them (the symbols are forwarded as they were);
//! - two good series around one of each bad kind: 400 with the first refusal's message, the
//!   receiver gets the good series only, each refused series' samples are counted under its
//!   reason and not charged, and the `*-Written` headers count the good series only;
//! - each bad series alone gets its own reason, names the series from the symbols, and
//!   nothing is forwarded;
//! - under `truncate` and `drop`, a value over the limit reaches the receiver shortened, as a
//!   symbol appended once to the request's; a help text over `max_metadata_length` is cut
//!   the same way, and a unit over it cuts the series' metadata (the series stays, the entry
//!   is counted as discarded and not charged).

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use common::fleet::forwarding_to;
use common::receiver::Receiver;
use weir::remote_write::v2_proto::{Exemplar, Histogram, Metadata, Request, Sample, TimeSeries};

const V2: &str = "application/x-protobuf;proto=io.prometheus.write.v2.Request";

const OVERRIDES: &str = "overrides:\n  v:\n    ingestion_rate: 1000000\n    \
    ingestion_burst_size: 1000000\n    max_label_names_per_series: 5\n    \
    max_label_names_per_info_series: 7\n    \
    max_label_name_length: 20\n    max_label_value_length: 30\n    \
    creation_grace_period: 10m\n    past_grace_period: 1h\n    drop_labels: [replica]\n    \
    max_global_exemplars_per_user: 1000\n";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Builds 2.0 requests: each label name and value becomes (or reuses) a symbol.
struct Builder {
    symbols: Vec<String>,
}

impl Builder {
    fn new() -> Builder {
        Builder {
            symbols: vec![String::new()],
        }
    }

    fn symbol(&mut self, text: &str) -> u32 {
        match self.symbols.iter().position(|symbol| symbol == text) {
            Some(at) => at as u32,
            None => {
                self.symbols.push(text.to_string());
                self.symbols.len() as u32 - 1
            }
        }
    }

    fn series(&mut self, labels: &[(&str, &str)], timestamps: &[i64]) -> TimeSeries {
        TimeSeries {
            labels_refs: labels
                .iter()
                .flat_map(|(name, value)| [self.symbol(name), self.symbol(value)])
                .collect(),
            samples: timestamps
                .iter()
                .map(|timestamp| Sample {
                    value: 1.0,
                    timestamp: *timestamp,
                })
                .collect(),
            ..TimeSeries::default()
        }
    }

    fn request(&self, timeseries: Vec<TimeSeries>) -> Request {
        Request {
            symbols: self.symbols.clone(),
            timeseries,
        }
    }
}

/// Each bad series with the reason it must be refused for, and a piece of its name as the
/// message must show it.
fn bad_series(builder: &mut Builder, now: i64) -> Vec<(&'static str, &'static str, TimeSeries)> {
    let long_name = "n".repeat(21);
    let long_value = "v".repeat(31);
    vec![
        (
            "max_label_names_per_series",
            "m{a=\"1\", b=\"1\", c=\"1\", d=\"1\", e=\"1\"}",
            builder.series(
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
            "m{nnnnnnnnnnnnnnnnnnnnn=\"1\"}",
            builder.series(&[("__name__", "m"), (long_name.as_str(), "1")], &[now]),
        ),
        (
            "label_value_too_long",
            "m{a=\"vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv\"}",
            builder.series(&[("__name__", "m"), ("a", long_value.as_str())], &[now]),
        ),
        (
            "label_invalid",
            "m{a-b=\"1\"}",
            builder.series(&[("__name__", "m"), ("a-b", "1")], &[now]),
        ),
        (
            "missing_metric_name",
            "{a=\"1\"}",
            builder.series(&[("a", "1")], &[now]),
        ),
        (
            "metric_name_invalid",
            "9m{}",
            builder.series(&[("__name__", "9m")], &[now]),
        ),
        (
            "duplicate_label_names",
            // Not adjacent: Mimir sorts the labels before its checks, and names them sorted.
            "m{a=\"1\", a=\"2\", job=\"x\"}",
            builder.series(
                &[("__name__", "m"), ("a", "1"), ("job", "x"), ("a", "2")],
                &[now],
            ),
        ),
        (
            "too_far_in_future",
            "m{}",
            builder.series(&[("__name__", "m")], &[now, now + 3_600_000]),
        ),
        (
            "too_far_in_past",
            "m{}",
            builder.series(&[("__name__", "m")], &[now - 7_200_000, now]),
        ),
        // Over the info series' own limit (7), where 6 or 7 labels would pass.
        (
            "max_label_names_per_info_series",
            "target_info{a=\"1\", b=\"1\", c=\"1\", d=\"1\", e=\"1\", f=\"1\", g=\"1\"}",
            builder.series(
                &[
                    ("__name__", "target_info"),
                    ("a", "1"),
                    ("b", "1"),
                    ("c", "1"),
                    ("d", "1"),
                    ("e", "1"),
                    ("f", "1"),
                    ("g", "1"),
                ],
                &[now],
            ),
        ),
    ]
}

fn decoded(body: &[u8]) -> Request {
    let raw = snap::raw::Decoder::new().decompress_vec(body).unwrap();
    <Request as prost::Message>::decode(raw.as_slice()).unwrap()
}

struct Answer {
    status: u16,
    /// Samples, histograms and exemplars written, from the 2.0 headers.
    written: [u64; 3],
    text: String,
}

async fn push(client: &reqwest::Client, base: &str, request: &Request) -> Answer {
    push_as(client, base, "v", request).await
}

async fn push_as(client: &reqwest::Client, base: &str, tenant: &str, request: &Request) -> Answer {
    push_body(client, base, tenant, request.encode_snappy()).await
}

/// A 2.0 push of these compressed bytes.
async fn push_body(client: &reqwest::Client, base: &str, tenant: &str, body: Vec<u8>) -> Answer {
    let response = client
        .post(format!("{base}/api/v1/push"))
        .header("Content-Encoding", "snappy")
        .header("Content-Type", V2)
        .header("X-Prometheus-Remote-Write-Version", "2.0.0")
        .header("X-Scope-OrgID", tenant)
        .body(body)
        .send()
        .await
        .unwrap();
    let written = [
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
    });
    Answer {
        status: response.status().as_u16(),
        written,
        text: response.text().await.unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_2_0_series_are_refused_with_mimirs_reasons_and_the_rest_is_forwarded() {
    let receiver = Receiver::default();
    let upstream = receiver.serve().await;

    let (replica, _dir) = forwarding_to(upstream, OVERRIDES, 52, "validation-v2", &[]).await;
    let base = format!("http://{}", replica.http);
    let client = reqwest::Client::new();
    let now = now_ms();

    // Nothing to refuse: the receiver gets the client's bytes, and the answer counts all.
    let mut builder = Builder::new();
    let help = builder.symbol("help");
    let exemplar_labels = vec![builder.symbol("trace_id"), builder.symbol("abc")];
    let mut good_series = builder.series(&[("__name__", "up"), ("job", "a")], &[now - 1, now]);
    good_series.histograms = vec![Histogram {
        timestamp: now,
        ..Histogram::default()
    }];
    good_series.exemplars = vec![Exemplar {
        labels_refs: exemplar_labels,
        value: 1.0,
        timestamp: now,
    }];
    good_series.metadata = Some(Metadata {
        r#type: 1,
        help_ref: help,
        unit_ref: 0,
    });
    let good = builder.request(vec![good_series]);
    let answer = push(&client, &base, &good).await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    assert_eq!(answer.written, [2, 1, 1]);
    let (headers, forwarded) = receiver.one();
    assert_eq!(
        forwarded.as_ref(),
        good.encode_snappy().as_slice(),
        "forwarded as sent"
    );
    assert_eq!(headers["content-type"], V2);

    // drop_labels: the pair goes before the checks (six labels with it, five without: the
    // limit), and the receiver never sees it; the symbols stay as sent.
    let mut builder = Builder::new();
    let labels = [
        ("__name__", "m"),
        ("a", "1"),
        ("b", "1"),
        ("c", "1"),
        ("d", "1"),
    ];
    let mut with_replica = labels.to_vec();
    with_replica.push(("replica", "r1"));
    let series = builder.series(&with_replica, &[now]);
    let dropping = builder.request(vec![series]);
    let answer = push(&client, &base, &dropping).await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    assert_eq!(answer.written, [1, 0, 0]);
    let forwarded = decoded(&receiver.one().1);
    assert_eq!(forwarded.symbols, dropping.symbols, "the symbols as sent");
    assert_eq!(
        forwarded.timeseries,
        vec![builder.series(&labels, &[now])],
        "the series without `replica`"
    );

    // Two good series around one of each bad kind.
    let mut builder = Builder::new();
    let first_good = builder.series(&[("__name__", "ok"), ("job", "a")], &[now]);
    let mut last_good = builder.series(&[("__name__", "ok_two")], &[now - 1_000, now - 500, now]);
    last_good.histograms = vec![Histogram {
        timestamp: now,
        ..Histogram::default()
    }];
    // An info series has a label limit of its own: 7 labels pass where the series limit is 5.
    let info_good = builder.series(
        &[
            ("__name__", "target_info"),
            ("a", "1"),
            ("b", "1"),
            ("c", "1"),
            ("d", "1"),
            ("e", "1"),
            ("f", "1"),
        ],
        &[now],
    );
    let bad = bad_series(&mut builder, now);
    let mut timeseries = vec![first_good.clone()];
    timeseries.extend(bad.iter().map(|(_, _, series)| series.clone()));
    timeseries.push(last_good.clone());
    timeseries.push(info_good.clone());
    let mixed = builder.request(timeseries);
    let answer = push(&client, &base, &mixed).await;
    assert_eq!(answer.status, 400, "{}", answer.text);
    assert!(
        answer.text.contains("err-weir-max-label-names-per-series")
            && answer.text.contains("actual: 6, limit: 5"),
        "the first refusal's message: {}",
        answer.text
    );
    assert_eq!(
        answer.written,
        [1 + 3 + 1, 1, 0],
        "the good series were written, and the answer says so"
    );
    let forwarded = decoded(&receiver.one().1);
    assert_eq!(forwarded.symbols, mixed.symbols);
    assert_eq!(
        forwarded.timeseries,
        vec![first_good, last_good, info_good],
        "exactly the good series"
    );
    // One a refused series, whatever its samples, as Mimir counts it.
    for (reason, _, _) in &bad {
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
        // The clean request (2 samples, 1 histogram), the relabelled one (1), the good
        // series here (1 + 3 + 1 samples, 1 histogram).
        Some(3.0 + 1.0 + 6.0),
        "only the good series' samples are admitted"
    );

    // Each bad series alone: its own reason, the series named, and nothing forwarded.
    for (reason, named, series) in bad {
        let alone = builder.request(vec![series]);
        let answer = push(&client, &base, &alone).await;
        let id = format!("err-weir-{}", reason.replace('_', "-"));
        assert_eq!(answer.status, 400, "{reason}: {}", answer.text);
        assert!(answer.text.contains(&id), "{reason}: {}", answer.text);
        assert!(
            answer.text.contains(&format!("series: '{named}'")),
            "{reason}: the series named from the symbols: {}",
            answer.text
        );
        assert_eq!(answer.written, [0, 0, 0], "{reason}: nothing written");
        assert!(receiver.take().is_empty(), "{reason}: nothing forwarded");
    }
}

const REWRITES: &str = "overrides:\n  \
    t:\n    ingestion_rate: 1000000\n    ingestion_burst_size: 1000000\n    \
    max_label_value_length: 80\n    label_value_length_over_limit_strategy: truncate\n    \
    max_metadata_length: 10\n  \
    d:\n    ingestion_rate: 1000000\n    ingestion_burst_size: 1000000\n    \
    max_label_value_length: 80\n    label_value_length_over_limit_strategy: drop\n";

/// `(hash:<hex blake2b-256>)`, as Mimir writes it.
fn hash_of(value: &str) -> String {
    use blake2::Digest;
    let digest = blake2::Blake2b::<blake2::digest::consts::U32>::digest(value.as_bytes());
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("(hash:{hex})")
}

/// A series as the receiver reads it: its labels and its metadata (type, help, unit) through
/// the symbols.
type Resolved = (Vec<(String, String)>, Option<(i32, String, String)>);

fn resolved(request: &Request) -> Vec<Resolved> {
    let text = |reference: u32| request.symbols[reference as usize].clone();
    request
        .timeseries
        .iter()
        .map(|series| {
            let labels = series
                .labels_refs
                .chunks(2)
                .map(|pair| (text(pair[0]), text(pair[1])))
                .collect();
            let metadata = series.metadata.map(|metadata| {
                (
                    metadata.r#type,
                    text(metadata.help_ref),
                    text(metadata.unit_ref),
                )
            });
            (labels, metadata)
        })
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_values_and_metadata_are_rewritten_or_refused_on_2_0_as_mimir_does() {
    let receiver = Receiver::default();
    let upstream = receiver.serve().await;
    let (replica, _dir) =
        forwarding_to(upstream, REWRITES, 53, "validation-v2-rewrites", &[]).await;
    let base = format!("http://{}", replica.http);
    let client = reqwest::Client::new();
    let now = now_ms();
    let metric = |series: String| {
        let (client, base) = (client.clone(), base.clone());
        async move { common::metric_at(&client, &base, &series).await }
    };

    // truncate: the first 80 - 71 bytes, then the whole value's hash, as one new symbol
    // after the request's own, which both series point at; accepted, nothing discarded.
    let long = "x".repeat(100);
    let mut builder = Builder::new();
    let first = builder.series(&[("__name__", "m"), ("a", long.as_str())], &[now]);
    let second = builder.series(&[("__name__", "m2"), ("a", long.as_str())], &[now]);
    let request = builder.request(vec![first, second]);
    let answer = push_as(&client, &base, "t", &request).await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    assert_eq!(answer.written, [2, 0, 0]);
    let forwarded = decoded(&receiver.one().1);
    let truncated = format!("xxxxxxxxx{}", hash_of(&long));
    assert_eq!(truncated.len(), 80);
    let mut symbols = request.symbols.clone();
    symbols.push(truncated.clone());
    assert_eq!(
        forwarded.symbols, symbols,
        "the symbols as sent, and one more"
    );
    assert_eq!(
        resolved(&forwarded),
        vec![
            (labels(&[("__name__", "m"), ("a", &truncated)]), None),
            (labels(&[("__name__", "m2"), ("a", &truncated)]), None),
        ]
    );

    // A request with nothing over a limit goes as sent.
    let mut builder = Builder::new();
    let short = builder.series(&[("__name__", "m"), ("a", "x")], &[now]);
    let short = builder.request(vec![short]);
    let answer = push_as(&client, &base, "t", &short).await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    assert_eq!(
        receiver.one().1.as_ref(),
        short.encode_snappy().as_slice(),
        "forwarded as sent"
    );

    // drop: the hash alone.
    let answer = push_as(&client, &base, "d", &request).await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    let forwarded = decoded(&receiver.one().1);
    assert_eq!(
        resolved(&forwarded)[0],
        (labels(&[("__name__", "m"), ("a", &hash_of(&long))]), None)
    );
    for tenant in ["t", "d"] {
        let series = format!(
            "weir_discarded_samples_total{{reason=\"label_value_too_long\",user=\"{tenant}\"}}"
        );
        assert_eq!(metric(series).await, None, "{tenant}: nothing discarded");
    }

    // Metadata over 10 bytes: a help is cut to 10 and kept; a unit refuses the entry, the
    // series' metadata is cut and the series goes on. 400 with the refusal's message.
    let mut builder = Builder::new();
    let long_help = builder.symbol("a help over ten bytes");
    let long_unit = builder.symbol("seconds_of_it");
    let short_unit = builder.symbol("s");
    let mut helped = builder.series(&[("__name__", "up")], &[now]);
    helped.metadata = Some(Metadata {
        r#type: 1,
        help_ref: long_help,
        unit_ref: short_unit,
    });
    let mut united = builder.series(&[("__name__", "m3")], &[now]);
    united.metadata = Some(Metadata {
        r#type: 2,
        help_ref: 0,
        unit_ref: long_unit,
    });
    let request = builder.request(vec![helped, united]);
    let answer = push_as(&client, &base, "t", &request).await;
    assert_eq!(answer.status, 400, "{}", answer.text);
    assert!(
        answer
            .text
            .contains("unit: 'seconds_of_it' metric name: 'm3' (err-weir-unit-too-long)"),
        "{}",
        answer.text
    );
    assert_eq!(answer.written, [2, 0, 0], "both series were written");
    let forwarded = decoded(&receiver.one().1);
    assert_eq!(
        resolved(&forwarded),
        vec![
            (
                labels(&[("__name__", "up")]),
                Some((1, "a help ove".to_string(), "s".to_string()))
            ),
            (labels(&[("__name__", "m3")]), None),
        ]
    );
    assert_eq!(
        metric("weir_discarded_metadata_total{reason=\"unit_too_long\",user=\"t\"}".into()).await,
        Some(1.0)
    );
    assert_eq!(
        metric("weir_distributor_received_metadata_total{user=\"t\"}".into()).await,
        Some(1.0),
        "only the kept entry is charged"
    );
    assert_eq!(
        metric("weir_distributor_received_samples_total{user=\"t\"}".into()).await,
        Some(2.0 + 1.0 + 2.0),
        "every series' samples are charged"
    );
}

/// A symbol that is not UTF-8 refuses the series whose label value it is, and no other, as
/// a real Mimir 3.0.3 refuses it (`label_value_invalid`, scripts/mimir-differential): the
/// other series is forwarded and counted written, the push answered 400 with Mimir's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symbol_that_is_not_utf8_refuses_only_the_series_whose_value_it_is() {
    let receiver = Receiver::default();
    let upstream = receiver.serve().await;
    let (replica, _dir) = forwarding_to(upstream, OVERRIDES, 64, "validation-v2-utf8", &[]).await;
    let base = format!("http://{}", replica.http);
    let client = reqwest::Client::new();
    let now = now_ms();
    let mut builder = Builder::new();
    let bad = builder.series(&[("__name__", "up"), ("job", "BAD")], &[now]);
    let good = builder.series(&[("__name__", "up"), ("job", "good")], &[now]);
    let request = builder.request(vec![bad, good.clone()]);
    // prost's `String` cannot hold it: the bytes are changed after encoding.
    let mut raw = prost::Message::encode_to_vec(&request);
    let at = raw.windows(3).position(|bytes| bytes == b"BAD").unwrap();
    raw[at + 1] = 0xff;
    let body = snap::raw::Encoder::new().compress_vec(&raw).unwrap();
    let answer = push_body(&client, &base, "v", body).await;
    assert_eq!(answer.status, 400, "{}", answer.text);
    assert!(
        answer.text.contains(
            "received a series with invalid value in label 'job': 'B\u{fffd}D' metric: 'up'"
        ) && answer.text.contains("err-weir-label-value-invalid"),
        "{}",
        answer.text
    );
    assert_eq!(answer.written, [1, 0, 0]);
    let forwarded = receiver.take_bodies();
    assert_eq!(forwarded.len(), 1, "one forward");
    // The symbols stay as sent; made UTF-8 again here only so that prost decodes the rest.
    let mut raw = snap::raw::Decoder::new()
        .decompress_vec(&forwarded[0])
        .unwrap();
    let at = raw.windows(3).position(|bytes| bytes == b"B\xffD").unwrap();
    raw[at + 1] = b'A';
    let forwarded = <Request as prost::Message>::decode(raw.as_slice()).unwrap();
    assert_eq!(forwarded.timeseries, vec![good], "the good series alone");
    let series = "weir_discarded_samples_total{reason=\"label_value_invalid\",user=\"v\"}";
    assert_eq!(
        common::metric_at(&client, &base, series).await,
        Some(1.0),
        "{series}"
    );
}

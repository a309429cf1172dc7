//! Mimir's `metric_relabel_configs` on a real weir process that forwards to a receiver served
//! by this test, over real HTTP, remote-write 1.0 and 2.0:
//!
//! - a series a rule drops is not forwarded and not charged: a push of 3 kept series and 20
//!   dropped ones passes an ingestion burst of 5;
//! - a series a rule changes reaches the receiver with its new labels (`__meta_tenant_id` readable
//!   by the rules, never forwarded), the others as sent;
//! - the series checks see the labels the rules made: a rule that adds a label past
//!   `max_label_names_per_series` gets the series refused with Mimir's reason;
//! - a push whose every series a rule drops is answered 200 and nothing is forwarded;
//! - a tenant without rules, or with `metric_relabeling_enabled: false`, is forwarded as sent;
//! - a label value that is not UTF-8 is seen by the rules as text, as Mimir's rules see it.

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use common::fleet::forwarding_to;
use common::receiver::Receiver;
use common::{decoded, series};
use weir::remote_write::prompb::{TimeSeries, WriteRequest};
use weir::remote_write::v2_proto;

const OVERRIDES: &str = "\
overrides:
  r:
    ingestion_rate: 5
    ingestion_burst_size: 5
    max_label_names_per_series: 3
    metric_relabel_configs:
    - source_labels: [__name__]
      regex: go_.*
      action: drop
    - source_labels: [__meta_tenant_id]
      target_label: tenant
    - regex: pod
      action: labeldrop
  off:
    ingestion_rate: 5
    ingestion_burst_size: 5
    metric_relabeling_enabled: false
    metric_relabel_configs:
    - source_labels: [__name__]
      regex: go_.*
      action: drop
";

const V2: &str = "application/x-protobuf;proto=io.prometheus.write.v2.Request";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn push(client: &reqwest::Client, base: &str, tenant: &str, body: Vec<u8>) -> (u16, String) {
    let response = common::push_request(client, base, Some(tenant), body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_drop_and_change_series_before_they_are_checked_charged_and_forwarded() {
    let receiver = Receiver::default();
    let upstream = receiver.serve().await;
    let (replica, _dir) = forwarding_to(upstream, OVERRIDES, 58, "relabel", &[]).await;
    let base = format!("http://{}", replica.http);
    let client = reqwest::Client::new();
    let now = now_ms();

    // 20 series a rule drops and 3 it keeps, against a burst of 5: only the 3 are charged.
    let mut timeseries: Vec<TimeSeries> = (0..20)
        .map(|index| series(&[("__name__", "go_gc"), ("i", &index.to_string())], &[now]))
        .collect();
    timeseries.push(series(&[("__name__", "up"), ("pod", "p1")], &[now]));
    timeseries.push(series(&[("__name__", "up"), ("job", "a")], &[now]));
    timeseries.push(series(&[("__name__", "kept"), ("tenant", "r")], &[now]));
    let request = WriteRequest {
        timeseries,
        metadata: vec![],
    };
    let (status, text) = push(&client, &base, "r", request.encode_snappy()).await;
    assert_eq!(status, 200, "{text}");
    let forwarded = receiver.take_bodies();
    assert_eq!(forwarded.len(), 1, "one forward");
    assert_eq!(
        decoded(&forwarded[0]).timeseries,
        vec![
            series(&[("__name__", "up"), ("tenant", "r")], &[now]),
            series(&[("__name__", "up"), ("job", "a"), ("tenant", "r")], &[now]),
            series(&[("__name__", "kept"), ("tenant", "r")], &[now]),
        ],
        "go_gc dropped, pod cut, the tenant's ID written by the rule"
    );

    // The same 23 series for a tenant whose rules are off: all 23 are charged, over the
    // burst of 5, and nothing is forwarded.
    let (status, text) = push(&client, &base, "off", request.encode_snappy()).await;
    assert_eq!(status, 429, "{text}");
    assert!(receiver.take_bodies().is_empty());

    // The checks see the rules' labels: three sent, four after the rules (over the limit of 3).
    // Sleep out the bucket the first push used.
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    let over = WriteRequest {
        timeseries: vec![
            series(&[("__name__", "m"), ("a", "1"), ("b", "1")], &[now]),
            series(&[("__name__", "ok")], &[now]),
        ],
        metadata: vec![],
    };
    let (status, text) = push(&client, &base, "r", over.encode_snappy()).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("max-label-names-per-series"), "{text}");
    assert_eq!(
        decoded(&receiver.take_bodies()[0]).timeseries,
        vec![series(&[("__name__", "ok"), ("tenant", "r")], &[now])],
        "the good series goes on"
    );

    // Every series dropped: 200, nothing forwarded.
    let all_dropped = WriteRequest {
        timeseries: vec![series(&[("__name__", "go_threads")], &[now])],
        metadata: vec![],
    };
    let (status, text) = push(&client, &base, "r", all_dropped.encode_snappy()).await;
    assert_eq!(status, 200, "{text}");
    assert!(receiver.take_bodies().is_empty(), "nothing to forward");

    // A tenant with no rules: the client's bytes.
    let plain = WriteRequest {
        timeseries: vec![series(&[("__name__", "go_gc"), ("pod", "p")], &[now])],
        metadata: vec![],
    };
    let body = plain.encode_snappy();
    let (status, text) = push(&client, &base, "other", body.clone()).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(receiver.take_bodies(), vec![Bytes::from(body)]);

    // Remote-write 2.0: the same rules, through the symbols.
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    let symbols: Vec<String> = ["", "__name__", "go_gc", "up", "pod", "p1"]
        .map(String::from)
        .to_vec();
    let v2_series = |refs: Vec<u32>| v2_proto::TimeSeries {
        labels_refs: refs,
        samples: vec![v2_proto::Sample {
            value: 1.0,
            timestamp: now,
        }],
        ..Default::default()
    };
    let request = v2_proto::Request {
        symbols: symbols.clone(),
        timeseries: vec![v2_series(vec![1, 2]), v2_series(vec![1, 3, 4, 5])],
    };
    let response = client
        .post(format!("{base}/api/v1/push"))
        .header("Content-Encoding", "snappy")
        .header("Content-Type", V2)
        .header("X-Prometheus-Remote-Write-Version", "2.0.0")
        .header("X-Scope-OrgID", "r")
        .body(request.encode_snappy())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response.headers()["x-prometheus-remote-write-samples-written"],
        "1",
        "the dropped series is not written"
    );
    let forwarded = receiver.take_bodies();
    let raw = snap::raw::Decoder::new()
        .decompress_vec(&forwarded[0])
        .unwrap();
    let forwarded = <v2_proto::Request as prost::Message>::decode(raw.as_slice()).unwrap();
    assert_eq!(forwarded.timeseries.len(), 1);
    let labels: Vec<(&str, &str)> = forwarded.timeseries[0]
        .labels_refs
        .chunks_exact(2)
        .map(|pair| {
            (
                forwarded.symbols[pair[0] as usize].as_str(),
                forwarded.symbols[pair[1] as usize].as_str(),
            )
        })
        .collect();
    assert_eq!(labels, [("__name__", "up"), ("tenant", "r")]);

    // A label value that is not UTF-8: the rules see it as Mimir's do, as text. A rule may
    // drop its series, or drop the label and leave the series clean to be forwarded; a series
    // that still carries it is refused by the checks.
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    let not_utf8 = |timeseries: Vec<TimeSeries>| {
        let mut raw = prost::Message::encode_to_vec(&WriteRequest {
            timeseries,
            metadata: vec![],
        });
        while let Some(at) = raw.windows(3).position(|bytes| bytes == b"BAD") {
            raw[at + 1] = 0xff;
        }
        snap::raw::Encoder::new().compress_vec(&raw).unwrap()
    };
    let cleaned = not_utf8(vec![
        series(&[("__name__", "up"), ("pod", "BAD")], &[now]),
        series(&[("__name__", "go_gc"), ("z", "BAD")], &[now]),
    ]);
    let (status, text) = push(&client, &base, "r", cleaned).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        decoded(&receiver.take_bodies()[0]).timeseries,
        vec![series(&[("__name__", "up"), ("tenant", "r")], &[now])],
        "pod dropped with its bad bytes, go_gc dropped"
    );
    let carried = not_utf8(vec![series(&[("__name__", "up"), ("job", "BAD")], &[now])]);
    let (status, text) = push(&client, &base, "r", carried).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("label-value-invalid"), "{text}");
    assert!(receiver.take_bodies().is_empty(), "nothing left to forward");
}

//! The HA tracker on real weir processes (remote-write 1.0), forwarding to a receiver served
//! by this test, with Mimir's keys and short timeouts (update 1 s, no jitter, failover 3 s):
//!
//! - one replica: the first replica of a cluster is elected; the other's pushes are answered
//!   202, neither charged (the tenant's burst holds exactly one replica's pushes) nor
//!   forwarded, and counted as deduplicated; the elected replica's series reach the receiver
//!   without `__replica__`; a push without the HA labels passes byte for byte and counts as
//!   non-HA; a cluster beyond `ha_max_clusters` is refused 400 and counted; after the elected
//!   replica is silent for the failover timeout, the other is elected, and not before;
//! - remote-write 2.0 alike: the labels are read through the symbols, the non-elected
//!   replica's push is 202, the elected one's reaches the receiver without `__replica__`;
//! - `ha_tracker_sample_failover_timeout`: a backlog of old samples does not take over;
//! - three replicas gossiping: a replica that never saw the elected replica's push still
//!   deduplicates its pair, keeps doing so while the elected replica pushes only elsewhere
//!   (its last push travels in gossip), fails over when it stops, and the others follow.

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use common::decoded;
use common::fleet::{forwarding_to, free_gossip_addr, spawn, until_healthy, Replica};
use common::receiver::Receiver;
use weir::remote_write::prompb::{Label, Sample, TimeSeries, WriteRequest};
use weir::remote_write::v2_proto;

const TIMINGS: &str = "accept_ha_samples: true\n    ha_tracker_update_timeout: 1s\n    \
                       ha_tracker_update_timeout_jitter_max: 0s\n    \
                       ha_tracker_failover_timeout: 3s\n";
const FAILOVER: Duration = Duration::from_secs(3);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// `series` series of one sample each, from `replica` of `cluster` (no HA labels when
/// `None`).
fn pair_push(cluster: Option<&str>, replica: Option<&str>, series: usize) -> WriteRequest {
    let now = now_ms();
    let timeseries = (0..series)
        .map(|i| {
            let mut labels = vec![
                label("__name__", "up"),
                label("instance", &format!("host-{i}")),
            ];
            if let Some(cluster) = cluster {
                labels.push(label("cluster", cluster));
            }
            if let Some(replica) = replica {
                labels.push(label("__replica__", replica));
            }
            TimeSeries {
                labels,
                samples: vec![Sample {
                    value: 1.0,
                    timestamp: now,
                }],
                ..TimeSeries::default()
            }
        })
        .collect();
    WriteRequest {
        timeseries,
        metadata: vec![],
    }
}

fn label(name: &str, value: &str) -> Label {
    Label {
        name: name.into(),
        value: value.into(),
    }
}

async fn push(client: &reqwest::Client, replica: &Replica, body: &WriteRequest) -> (u16, String) {
    push_body(client, replica, body.encode_snappy()).await
}

/// A push of `body`, already compressed.
async fn push_body(client: &reqwest::Client, replica: &Replica, body: Vec<u8>) -> (u16, String) {
    let base = format!("http://{}", replica.http);
    let response = common::push_request(client, &base, Some("ha"), body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

/// `request` encoded and compressed with each `from` in its bytes made `to` (of one length),
/// `times` of them: how a label that is not UTF-8, which prost's `String` cannot hold, is sent.
fn with_bytes(request: &WriteRequest, from: &[u8], to: &[u8], times: usize) -> Vec<u8> {
    assert!(from.len() == to.len() && from != to);
    let mut raw = prost::Message::encode_to_vec(request);
    let mut found = 0;
    while let Some(at) = raw.windows(from.len()).position(|bytes| bytes == from) {
        raw[at..at + from.len()].copy_from_slice(to);
        found += 1;
    }
    assert_eq!(found, times, "{from:?} in the request");
    snap::raw::Encoder::new().compress_vec(&raw).unwrap()
}

/// Cluster `c1`'s deduplicated samples for tenant `ha`.
const DEDUPED_C1: &str = r#"weir_distributor_deduped_samples_total{cluster="c1",user="ha"}"#;

async fn metric(client: &reqwest::Client, replica: &Replica, series: &str) -> f64 {
    common::metric_at(client, &format!("http://{}", replica.http), series)
        .await
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ha_pair_is_charged_and_forwarded_once() {
    let receiver = Receiver::default();
    let upstream = receiver.serve().await;
    let overrides = format!(
        "overrides:\n  ha:\n    ingestion_rate: 100\n    ingestion_burst_size: 100\n    \
         ha_max_clusters: 2\n    {TIMINGS}"
    );
    let (weir, _dir) = forwarding_to(upstream, &overrides, 70, "ha-one", &[]).await;
    let client = reqwest::Client::new();

    // a is first: elected. Its series reach the receiver without __replica__.
    let (status, text) = push(&client, &weir, &pair_push(Some("c1"), Some("a"), 60)).await;
    assert_eq!(status, 200, "{text}");
    let forwarded = receiver.take_bodies();
    assert_eq!(forwarded.len(), 1);
    let series = decoded(&forwarded[0]).timeseries;
    assert_eq!(series.len(), 60);
    let labels: Vec<Vec<Label>> = series.iter().map(|s| s.labels.clone()).collect();
    let expected: Vec<Vec<Label>> = pair_push(Some("c1"), None, 60)
        .timeseries
        .into_iter()
        .map(|s| s.labels)
        .collect();
    assert_eq!(labels, expected, "cluster kept, __replica__ removed");

    // b: 202 with Mimir's message, nothing forwarded, nothing charged.
    let (status, text) = push(&client, &weir, &pair_push(Some("c1"), Some("b"), 60)).await;
    assert_eq!(status, 202, "{text}");
    assert_eq!(
        text.trim(),
        "replicas did not match, rejecting sample: replica=b, elected=a"
    );
    assert!(
        receiver.take_bodies().is_empty(),
        "b's push is not forwarded"
    );
    // The burst (100) holds a's 60 and 40 more only if b's 60 were not charged.
    let (status, text) = push(&client, &weir, &pair_push(Some("c1"), Some("a"), 40)).await;
    assert_eq!(status, 200, "b's push was charged: {text}");
    assert_eq!(receiver.take_bodies().len(), 1);
    assert_eq!(metric(&client, &weir, DEDUPED_C1).await, 60.0);

    // b again, a label value in it not UTF-8: Mimir reads the body all the same and answers
    // 202 before its checks; the deduplicated count takes its 3 samples.
    let body = with_bytes(
        &pair_push(Some("c1"), Some("b"), 3),
        b"host-1",
        b"host\xff1",
        1,
    );
    let (status, text) = push_body(&client, &weir, body).await;
    assert_eq!(status, 202, "{text}");
    assert!(receiver.take_bodies().is_empty());
    assert_eq!(metric(&client, &weir, DEDUPED_C1).await, 63.0);

    // A replica named in bytes that are not UTF-8 is another replica, deduplicated as Mimir's
    // tracker takes it (202), not a push without HA labels.
    // The value `b` (field 2, one byte) of each series' `__replica__`.
    let body = with_bytes(
        &pair_push(Some("c1"), Some("b"), 2),
        b"\x12\x01b",
        b"\x12\x01\xff",
        2,
    );
    let (status, text) = push_body(&client, &weir, body).await;
    assert_eq!(
        (status, text.trim()),
        (
            202,
            "replicas did not match, rejecting sample: replica=\u{fffd}, elected=a"
        )
    );
    assert!(receiver.take_bodies().is_empty());

    // Without both labels: not HA, forwarded byte for byte, counted as non-HA.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let plain = pair_push(Some("c1"), None, 10);
    let (status, text) = push(&client, &weir, &plain).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        receiver.take_bodies(),
        vec![Bytes::from(plain.encode_snappy())]
    );
    assert_eq!(
        metric(
            &client,
            &weir,
            r#"weir_distributor_non_ha_samples_received_total{user="ha"}"#
        )
        .await,
        10.0
    );

    // A second cluster is tracked; a third is over ha_max_clusters: 400, counted.
    let (status, text) = push(&client, &weir, &pair_push(Some("c2"), Some("a"), 5)).await;
    assert_eq!(status, 200, "{text}");
    let (status, text) = push(&client, &weir, &pair_push(Some("c3"), Some("a"), 5)).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("err-weir-too-many-ha-clusters"), "{text}");
    assert!(text.contains("(limit: 2)"), "{text}");
    assert_eq!(
        metric(
            &client,
            &weir,
            r#"weir_discarded_samples_total{reason="too_many_ha_clusters",user="ha"}"#
        )
        .await,
        5.0
    );
    receiver.take_bodies();

    // Failover: a stops; b is refused until a has been silent for 3 s, then elected (a's last
    // push is timed once answered, a little after weir saw it).
    let (status, _) = push(&client, &weir, &pair_push(Some("c1"), Some("a"), 1)).await;
    assert_eq!(status, 200);
    let a_last = Instant::now();
    let switched = loop {
        let (status, text) = push(&client, &weir, &pair_push(Some("c1"), Some("b"), 1)).await;
        match status {
            202 => assert!(a_last.elapsed() < FAILOVER + Duration::from_secs(1)),
            200 => break a_last.elapsed(),
            other => panic!("{other}: {text}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        switched >= FAILOVER - Duration::from_millis(100)
            && switched < FAILOVER + Duration::from_millis(500),
        "b elected {switched:?} after a's last push"
    );
    let (status, text) = push(&client, &weir, &pair_push(Some("c1"), Some("a"), 1)).await;
    assert_eq!(
        (status, text.trim()),
        (
            202,
            "replicas did not match, rejecting sample: replica=a, elected=b"
        )
    );
    assert_eq!(
        metric(
            &client,
            &weir,
            r#"weir_ha_tracker_elected_replica_changes_total{cluster="c1",user="ha"}"#
        )
        .await,
        2.0,
        "elected a, then b"
    );
}

/// A remote-write 2.0 push of one series from `replica` of `cluster`.
fn pair_push_v2(cluster: &str, replica: &str) -> v2_proto::Request {
    v2_proto::Request {
        symbols: [
            "",
            "__name__",
            "up",
            "cluster",
            cluster,
            "__replica__",
            replica,
            "job",
            "j",
        ]
        .iter()
        .map(|symbol| symbol.to_string())
        .collect(),
        timeseries: vec![v2_proto::TimeSeries {
            labels_refs: vec![1, 2, 3, 4, 5, 6, 7, 8],
            samples: vec![v2_proto::Sample {
                value: 1.0,
                timestamp: now_ms(),
            }],
            ..Default::default()
        }],
    }
}

async fn push_v2(
    client: &reqwest::Client,
    replica: &Replica,
    body: &v2_proto::Request,
) -> (u16, String) {
    let response = client
        .post(format!("http://{}/api/v1/push", replica.http))
        .header("Content-Encoding", "snappy")
        .header(
            "Content-Type",
            "application/x-protobuf;proto=io.prometheus.write.v2.Request",
        )
        .header("X-Prometheus-Remote-Write-Version", "2.0.0")
        .header("X-Scope-OrgID", "ha")
        .body(body.encode_snappy())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_write_2_0_pairs_are_deduplicated_too() {
    let receiver = Receiver::default();
    let upstream = receiver.serve().await;
    let overrides = format!("overrides:\n  ha:\n    ingestion_rate: 100000\n    {TIMINGS}");
    let (weir, _dir) = forwarding_to(upstream, &overrides, 74, "ha-v2", &[]).await;
    let client = reqwest::Client::new();

    let (status, text) = push_v2(&client, &weir, &pair_push_v2("c1", "a")).await;
    assert_eq!(status, 200, "{text}");
    let forwarded = receiver.take_bodies();
    assert_eq!(forwarded.len(), 1);
    let raw = snap::raw::Decoder::new()
        .decompress_vec(&forwarded[0])
        .unwrap();
    let request = <v2_proto::Request as prost::Message>::decode(raw.as_slice()).unwrap();
    let labels: Vec<(&str, &str)> = request.timeseries[0]
        .labels_refs
        .chunks(2)
        .map(|pair| {
            (
                request.symbols[pair[0] as usize].as_str(),
                request.symbols[pair[1] as usize].as_str(),
            )
        })
        .collect();
    assert_eq!(
        labels,
        [("__name__", "up"), ("cluster", "c1"), ("job", "j")],
        "__replica__ removed, the rest kept"
    );

    let (status, text) = push_v2(&client, &weir, &pair_push_v2("c1", "b")).await;
    assert_eq!(
        (status, text.trim()),
        (
            202,
            "replicas did not match, rejecting sample: replica=b, elected=a"
        )
    );
    assert!(
        receiver.take_bodies().is_empty(),
        "b's push is not forwarded"
    );
    // 1.0 and 2.0 pushes share the election.
    let (status, _) = push(&client, &weir, &pair_push(Some("c1"), Some("b"), 1)).await;
    assert_eq!(status, 202);
}

/// A tenant's HA series go with what they count, as Mimir's do: a cluster's (deduplicated
/// samples, elected-replica changes) when the tracker forgets its election, here because the
/// tenant stops deduplicating; the tenant's non-HA samples when its limiter state is dropped
/// after `--tenant-idle-timeout`. Otherwise every tenant and cluster ever seen would stay on
/// `/metrics` for the life of the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_series_go_with_the_election_and_the_tenant() {
    let receiver = Receiver::default();
    let upstream = receiver.serve().await;
    let limits =
        "overrides:\n  ha:\n    ingestion_rate: 100000\n    ingestion_burst_size: 100000\n";
    let flags = [
        "--tenant-idle-timeout",
        "2s",
        "--runtime-config-period",
        "200ms",
    ];
    let (weir, dir) = forwarding_to(
        upstream,
        &format!("{limits}    {TIMINGS}"),
        75,
        "ha-forget",
        &flags,
    )
    .await;
    let client = reqwest::Client::new();
    let changes = r#"weir_ha_tracker_elected_replica_changes_total{cluster="c1",user="ha"}"#;
    let non_ha = r#"weir_distributor_non_ha_samples_received_total{user="ha"}"#;
    let listed = |series: &'static str| {
        let client = client.clone();
        let base = format!("http://{}", weir.http);
        async move { common::metric_at(&client, &base, series).await }
    };

    assert_eq!(
        push(&client, &weir, &pair_push(Some("c1"), Some("a"), 3))
            .await
            .0,
        200
    );
    assert_eq!(
        push(&client, &weir, &pair_push(Some("c1"), Some("b"), 5))
            .await
            .0,
        202
    );
    assert_eq!(
        push(&client, &weir, &pair_push(Some("c1"), None, 7))
            .await
            .0,
        200
    );
    assert_eq!(listed(DEDUPED_C1).await, Some(5.0));
    assert_eq!(listed(changes).await, Some(1.0));
    assert_eq!(listed(non_ha).await, Some(7.0));

    // The tenant stops deduplicating: its election is forgotten, and the cluster's series
    // with it.
    std::fs::write(dir.path().join("overrides.yaml"), limits).unwrap();
    common::wait_until(
        "the cluster's series leave /metrics",
        Duration::from_secs(10),
        || async { listed(DEDUPED_C1).await.is_none() && listed(changes).await.is_none() },
    )
    .await;
    // Idle for 2 s: the tenant's state is dropped, and its series with it.
    common::wait_until(
        "the tenant's series leave /metrics",
        Duration::from_secs(10),
        || async { listed(non_ha).await.is_none() },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_agrees_on_one_replica_and_fails_over_together() {
    let receiver = Receiver::default();
    let upstream = receiver.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let overrides = dir.path().join("overrides.yaml");
    std::fs::write(
        &overrides,
        format!("overrides:\n  ha:\n    ingestion_rate: 100000\n    {TIMINGS}"),
    )
    .unwrap();
    let upstream_url = format!("http://{upstream}/api/v1/write");
    let args = [
        "--runtime-config",
        overrides.to_str().unwrap(),
        "--upstream",
        &upstream_url,
        "--gossip-interval",
        "200ms",
    ];
    let gossip: Vec<_> = (71..74)
        .map(|ip| free_gossip_addr([127, 0, 0, ip]))
        .collect();
    let fleet: Vec<Replica> = gossip
        .iter()
        .map(|addr| spawn(*addr, &gossip, "ha-fleet", &args))
        .collect();
    until_healthy(
        &fleet.iter().collect::<Vec<_>>(),
        3,
        Duration::from_secs(20),
    )
    .await;
    let client = reqwest::Client::new();

    // a is elected at the first replica; the others learn it from gossip, not from a push.
    let (status, text) = push(&client, &fleet[0], &pair_push(Some("c1"), Some("a"), 1)).await;
    assert_eq!(status, 200, "{text}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    for replica in &fleet[1..] {
        let (status, text) = push(&client, replica, &pair_push(Some("c1"), Some("b"), 1)).await;
        assert_eq!(
            (status, text.trim()),
            (
                202,
                "replicas did not match, rejecting sample: replica=b, elected=a"
            )
        );
    }

    // a pushes only to the first replica for twice the failover timeout; b only to the
    // second, which never hears a itself, and still never elects b: a's pushes travel.
    let started = Instant::now();
    let mut a_last = started;
    while started.elapsed() < FAILOVER * 2 {
        let (status, _) = push(&client, &fleet[0], &pair_push(Some("c1"), Some("a"), 1)).await;
        assert_eq!(status, 200);
        a_last = Instant::now();
        let (status, text) = push(&client, &fleet[1], &pair_push(Some("c1"), Some("b"), 1)).await;
        assert_eq!(status, 202, "b elected while a pushes elsewhere: {text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // a stops: the second replica elects b once a's last push is 3 s old as far as it knows
    // (its news is at most the update timeout, 1 s, and a gossip round behind).
    let switched = loop {
        let (status, text) = push(&client, &fleet[1], &pair_push(Some("c1"), Some("b"), 1)).await;
        match status {
            202 => assert!(
                a_last.elapsed() < FAILOVER + Duration::from_secs(3),
                "{text}"
            ),
            200 => break a_last.elapsed(),
            other => panic!("{other}: {text}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        switched >= FAILOVER - Duration::from_millis(1500),
        "b elected after {switched:?}"
    );
    // The others follow the later term: a is now deduplicated everywhere.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for replica in [&fleet[0], &fleet[2]] {
        let (status, text) = push(&client, replica, &pair_push(Some("c1"), Some("a"), 1)).await;
        assert_eq!(
            (status, text.trim()),
            (
                202,
                "replicas did not match, rejecting sample: replica=a, elected=b"
            )
        );
    }
    println!(
        "ha-fleet: b elected {switched:?} after a's last push (failover timeout {FAILOVER:?})"
    );
}

/// `ha_tracker_sample_failover_timeout`, as Mimir applies it: once the elected replica is
/// silent past the failover timeout, the other replica takes over only with a push whose
/// earliest sample is that much later than the elected replica's last push; its backlog of
/// older samples is still deduplicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_does_not_take_over_before_the_sample_failover_timeout() {
    let receiver = Receiver::default();
    let upstream = receiver.serve().await;
    let overrides = format!(
        "overrides:\n  ha:\n    ingestion_rate: 100000\n    {TIMINGS}    \
         ha_tracker_sample_failover_timeout: 3s\n"
    );
    let (weir, _dir) = forwarding_to(upstream, &overrides, 63, "ha-sample", &[]).await;
    let client = reqwest::Client::new();

    let last_of_a = now_ms();
    let (status, text) = push(&client, &weir, &pair_push(Some("c1"), Some("a"), 1)).await;
    assert_eq!(status, 200, "{text}");
    tokio::time::sleep(FAILOVER + Duration::from_millis(500)).await;

    // a has been silent past the failover timeout, but b's samples are from 1 s after a's
    // last push: its backlog, under the sample failover timeout of 3 s.
    let mut backlog = pair_push(Some("c1"), Some("b"), 2);
    backlog.timeseries[1].samples[0].timestamp = last_of_a + 1_000;
    let (status, text) = push(&client, &weir, &backlog).await;
    assert_eq!(
        (status, text.trim()),
        (
            202,
            "replicas did not match, rejecting sample: replica=b, elected=a"
        )
    );
    // Its current samples (3.5 s after a's last push) take over.
    let (status, text) = push(&client, &weir, &pair_push(Some("c1"), Some("b"), 2)).await;
    assert_eq!(status, 200, "{text}");
    let (status, _) = push(&client, &weir, &pair_push(Some("c1"), Some("a"), 1)).await;
    assert_eq!(status, 202, "b is elected now");
    assert_eq!(
        receiver.take_bodies().len(),
        2,
        "a's first push and b's last"
    );
}

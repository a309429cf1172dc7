//! Runtime overrides reloading and instance limits, over real HTTP against a real weir.

mod common;

use std::time::{Duration, Instant};

use common::{Options, RawRequest, Weir};

const PERIOD: Duration = Duration::from_millis(200);

async fn reloading(overrides: &str) -> Weir {
    Weir::start(Options {
        overrides: overrides.into(),
        manual_clock: true,
        configure: Box::new(|config| config.runtime_config_period = PERIOD),
    })
    .await
}

async fn runtime_config_diff(weir: &Weir) -> String {
    let url = weir.url("/runtime_config?mode=diff");
    weir.client
        .get(url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

const SLOW: &str = "overrides:\n  t:\n    ingestion_rate: 10\n    ingestion_burst_size: 10\n";
const FAST: &str = "overrides:\n  t:\n    ingestion_rate: 1000\n    ingestion_burst_size: 1000\n";

#[tokio::test]
async fn edited_overrides_take_effect_within_one_period_and_bad_edits_are_harmless() {
    let weir = reloading(SLOW).await;
    let reload_ok = "weir_runtime_config_last_reload_successful";
    assert_eq!(weir.status("t", 10).await, 200);
    assert_eq!(weir.status("t", 1).await, 429);

    // Raise the limit: in force within one period (plus scheduling slack).
    let written = Instant::now();
    std::fs::write(&weir.overrides, FAST).unwrap();
    assert!(
        weir.eventually(PERIOD * 3, || async {
            runtime_config_diff(&weir).await.contains("1000")
        })
        .await,
        "new limit not in force after {:?}",
        written.elapsed()
    );
    // No fresh burst on reload: the bucket was empty and stays so until time passes…
    assert_eq!(weir.status("t", 1).await, 429);
    // …then it refills at the new rate (1000/s → 100 in 100 ms; the old rate gave 1).
    weir.advance(Duration::from_millis(100));
    assert_eq!(weir.status("t", 100).await, 200);

    // A bad edit: the last good config stays and the metric drops to 0.
    let good_hash = format!(
        "weir_runtime_config_hash{{sha256=\"{}\"}}",
        sha256_hex(FAST.as_bytes())
    );
    assert_eq!(weir.metric(&good_hash).await, Some(1.0));
    std::fs::write(&weir.overrides, "overrides:\n  t:\n    ingestion_rat: 5\n").unwrap();
    assert!(
        weir.eventually(PERIOD * 3, || async {
            weir.metric(reload_ok).await == Some(0.0)
        })
        .await
    );
    weir.advance(Duration::from_millis(100));
    assert_eq!(
        weir.status("t", 100).await,
        200,
        "the old limit is still in force"
    );
    assert_eq!(
        weir.metric(&good_hash).await,
        Some(1.0),
        "the hash names what is in force"
    );

    // Not even YAML, or two documents: the same. The metric already reads 0 from the last
    // bad edit, so each is preceded by the good file again: the metric going back to 1 and
    // then to 0 shows that this very file was read and refused.
    for bad in ["overrides: [", "overrides: {}\n---\noverrides: {}\n"] {
        std::fs::write(&weir.overrides, FAST).unwrap();
        assert!(
            weir.eventually(PERIOD * 3, || async {
                weir.metric(reload_ok).await == Some(1.0)
            })
            .await,
            "the good file was not reloaded"
        );
        std::fs::write(&weir.overrides, bad).unwrap();
        assert!(
            weir.eventually(PERIOD * 3, || async {
                weir.metric(reload_ok).await == Some(0.0)
            })
            .await,
            "{bad:?} was not refused"
        );
        assert!(runtime_config_diff(&weir).await.contains("1000"));
        assert_eq!(
            weir.metric(&good_hash).await,
            Some(1.0),
            "{bad:?}: the hash names what is in force"
        );
    }

    // Fixed: back to 1, new config in force.
    std::fs::write(&weir.overrides, SLOW).unwrap();
    assert!(
        weir.eventually(PERIOD * 3, || async {
            weir.metric(reload_ok).await == Some(1.0)
        })
        .await
    );
    assert!(runtime_config_diff(&weir)
        .await
        .contains("ingestion_rate: 10.0"));
    weir.stop().await.unwrap();
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// An operator's Mimir runtime config, unchanged: weir's keys apply, Mimir's other keys load.
const MIMIR_FILE: &str = r#"
overrides:
  tenant-a:
    ingestion_rate: 350000
    ingestion_burst_size: 3500000
    max_global_series_per_user: 3000000
    max_global_series_per_metric: 0
    max_label_names_per_series: 40
    compactor_blocks_retention_period: 1y
    ruler_max_rules_per_rule_group: 50
    max_fetched_chunks_per_query: 4000000
    out_of_order_time_window: 10m
    accept_ha_samples: true
    ha_cluster_label: cluster
  tenant-b:
    max_global_series_per_user: 10
multi_kv_config:
  mirror_enabled: false
  primary: consul
ingester_limits:
  max_ingestion_rate: 20000
  max_series: 1500000
  max_tenants: 1000
distributor_limits:
  max_ingestion_rate: 1000000
  max_inflight_push_requests: 5000
"#;

#[tokio::test]
async fn a_mimir_runtime_config_loads_unchanged() {
    let weir = Weir::with_overrides(MIMIR_FILE).await;
    let diff = runtime_config_diff(&weir).await;
    assert_eq!(
        diff,
        "overrides:\n  tenant-a:\n    ingestion_rate: 350000.0\n    ingestion_burst_size: 3500000\n    \
         max_label_names_per_series: 40\n    accept_ha_samples: true\n\
         distributor_limits:\n  max_inflight_push_requests: 5000\n  max_ingestion_rate: 1000000.0\n",
        "every key in force for the tenant (its series checks and HA tracker too), none of \
         another component's"
    );
    assert_eq!(
        weir.metric("weir_distributor_instance_limits{limit=\"max_inflight_push_requests\"}")
            .await,
        Some(5000.0)
    );
    assert_eq!(weir.status("tenant-a", 100).await, 200);
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn inflight_request_cap_is_hit_by_concurrent_slow_requests() {
    let weir = Weir::with_overrides("distributor_limits:\n  max_inflight_push_requests: 2\n").await;
    // Two requests that send headers and then stall mid-body hold both slots.
    let mut slow = Vec::new();
    for _ in 0..2 {
        slow.push(RawRequest::start_push(weir.addr, "t", 100).await);
    }
    let inflight = "weir_distributor_inflight_push_requests";
    assert!(
        weir.eventually(Duration::from_secs(2), || async {
            weir.metric(inflight).await == Some(2.0)
        })
        .await
    );

    let refused = weir.push("t", 1).await;
    assert_eq!(refused.status(), 429);
    // A slot frees in milliseconds: no Retry-After (the client's own short backoff rules).
    assert!(!refused.headers().contains_key("retry-after"));
    let body = refused.text().await.unwrap();
    assert!(
        body.contains("allowed number of in-flight push requests, 2"),
        "{body}"
    );
    assert!(
        body.contains("err-weir-distributor-max-inflight-push-requests"),
        "{body}"
    );
    assert!(
        body.contains("distributor_limits.max_inflight_push_requests"),
        "{body}"
    );
    assert_eq!(
        weir.metric("weir_distributor_instance_rejected_requests_total{reason=\"distributor_max_inflight_push_requests\"}").await,
        Some(1.0)
    );

    // The slow requests finish (their bodies are garbage: 400) and free their slots.
    for mut request in slow {
        request.send(&[b'x'; 100]).await;
        assert!(request.response().await.starts_with("HTTP/1.1 400"));
    }
    assert_eq!(weir.metric(inflight).await, Some(0.0));
    assert_eq!(weir.status("t", 1).await, 200);
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn inflight_bytes_cap_counts_content_length_before_the_body() {
    let weir =
        Weir::with_overrides("distributor_limits:\n  max_inflight_push_requests_bytes: 1500\n")
            .await;
    let mut held = RawRequest::start_push(weir.addr, "t", 1000).await;
    let bytes = "weir_distributor_inflight_push_requests_bytes";
    assert!(
        weir.eventually(Duration::from_secs(2), || async {
            weir.metric(bytes).await == Some(1000.0)
        })
        .await
    );

    let big = RawRequest::start_push(weir.addr, "t", 600).await;
    let answer = big.response().await;
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(
        answer.contains("err-weir-distributor-max-inflight-push-requests-bytes"),
        "{answer}"
    );
    assert_eq!(weir.status("t", 2).await, 200, "a small request still fits");

    held.send(&[b'x'; 1000]).await;
    assert!(held.response().await.starts_with("HTTP/1.1 400"));
    assert_eq!(weir.metric(bytes).await, Some(0.0));
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn instance_ingestion_rate_cap_uses_the_ewma() {
    let weir = Weir::with_overrides("distributor_limits:\n  max_ingestion_rate: 100\n").await;
    assert_eq!(weir.status("t", 1000).await, 200);
    // The EWMA folds in the last second on each 1 s tick.
    let rate = "weir_distributor_ingestion_rate_samples_per_second";
    assert!(
        weir.eventually(Duration::from_secs(3), || async {
            weir.metric(rate).await >= Some(100.0)
        })
        .await
    );
    let refused = weir.push("t", 1).await;
    assert_eq!(refused.status(), 429);
    assert!(refused
        .text()
        .await
        .unwrap()
        .contains("ingestion rate limit of 100 samples/s"));
    weir.stop().await.unwrap();
}

//! The dashboard and the alerts against real data: two real weir replicas forwarding to a
//! real Prometheus (its remote-write receiver), which also scrapes both every second. After
//! some pushes (admitted and refused), every query of every panel of
//! `operations/dashboard.json` must return data, every alert expression of
//! `operations/alerts.yml` must evaluate, and `promtool check rules` must pass.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::fleet::{free_gossip_addr, spawn, until_healthy};
use common::processes::free_tcp;
use weir::remote_write::prompb::WriteRequest;

const OPERATIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/operations");

fn require(tool: &str) -> PathBuf {
    ["/usr/bin", "/usr/local/bin"]
        .iter()
        .map(|dir| Path::new(dir).join(tool))
        .find(|path| path.exists())
        .unwrap_or_else(|| panic!("`{tool}` is not installed: run ./scripts/test"))
}

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every `expr` in the dashboard, with Grafana's variables set as "All" would set them.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(Path::new(OPERATIONS).join("dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$tenant", ".*")
                .replace("$__rate_interval", "1m");
            queries.push((panel["title"].as_str().unwrap().to_string(), expr));
        }
    }
    assert!(queries.len() >= 11, "{queries:?}");
    queries
}

/// Every alert's `expr` from the rules file (a flat read of the YAML).
fn alert_expressions() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(Path::new(OPERATIONS).join("alerts.yml")).unwrap();
    let rules: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let mut alerts = Vec::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            alerts.push((
                rule["alert"].as_str().unwrap().to_string(),
                rule["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    assert!(alerts.len() >= 5, "{alerts:?}");
    alerts
}

async fn query(prometheus: &str, expr: &str) -> serde_json::Value {
    reqwest::Client::new()
        .get(format!("{prometheus}/api/v1/query"))
        .query(&[("query", expr)])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[test]
fn the_alert_rules_pass_promtool() {
    let output = Command::new(require("promtool"))
        .args(["check", "rules"])
        .arg(Path::new(OPERATIONS).join("alerts.yml"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_returns_data_from_real_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let prometheus_addr = free_tcp();
    let overrides = dir.path().join("overrides.yaml");
    std::fs::write(
        &overrides,
        "overrides:\n  dash: {ingestion_rate: 2000, ingestion_burst_size: 2000}\n",
    )
    .unwrap();
    let upstream = format!("http://{prometheus_addr}/api/v1/write");
    let gossip: Vec<SocketAddr> = (0..2).map(|_| free_gossip_addr([127, 0, 0, 1])).collect();
    let cluster = format!("dashboard-{}", std::process::id());
    let replicas: Vec<_> = gossip
        .iter()
        .map(|addr| {
            spawn(
                *addr,
                &gossip,
                &cluster,
                &[
                    "--upstream",
                    &upstream,
                    "--runtime-config",
                    overrides.to_str().unwrap(),
                ],
            )
        })
        .collect();
    until_healthy(
        &replicas.iter().collect::<Vec<_>>(),
        2,
        Duration::from_secs(20),
    )
    .await;

    let targets: Vec<String> = replicas.iter().map(|r| format!("'{}'", r.http)).collect();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global: {{scrape_interval: 1s}}\nscrape_configs:\n  - job_name: weir\n    \
             static_configs: [{{targets: [{}]}}]\n",
            targets.join(", ")
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let _prometheus = Process(
        Command::new(require("prometheus"))
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={prometheus_addr}"))
            .arg("--web.enable-remote-write-receiver")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let prometheus = format!("http://{prometheus_addr}");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !client
        .get(format!("{prometheus}/-/ready"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(Instant::now() < deadline, "Prometheus did not start");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Six seconds of pushes to both replicas, over the tenant's limit: some admitted and
    // forwarded, some refused.
    let started = Instant::now();
    let mut seed = 0;
    while started.elapsed() < Duration::from_secs(6) {
        for replica in &replicas {
            seed += 1;
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64;
            let body = WriteRequest::synthetic(200, seed, now_ms).encode_snappy();
            let _ = client
                .post(format!("http://{}/api/v1/push", replica.http))
                .header("X-Scope-OrgID", "dash")
                .header("Content-Encoding", "snappy")
                .header("Content-Type", "application/x-protobuf")
                .body(body)
                .send()
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Until every query has data (a scrape or two after the last push), or 30 s.
    let queries = dashboard_queries();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut empty = Vec::new();
        for (panel, expr) in &queries {
            let answer = query(&prometheus, expr).await;
            assert_eq!(answer["status"], "success", "{panel}: {expr}: {answer}");
            if answer["data"]["result"]
                .as_array()
                .is_none_or(Vec::is_empty)
            {
                empty.push(format!("{panel}: {expr}"));
            }
        }
        if empty.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "queries with no data after 30 s: {empty:#?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for (alert, expr) in alert_expressions() {
        let answer = query(&prometheus, &expr).await;
        assert_eq!(answer["status"], "success", "{alert}: {expr}: {answer}");
    }
    // The panels that show a tenant's fleet-wide limit read the 2 000 items/s configured,
    // not a sum over the two replicas (each of which enforces the whole of it, `weighted`).
    for legend in ["{{user}} configured", "{{user}} fleet"] {
        let expr = dashboard_target(legend).replace("$tenant", "dash");
        let answer = query(&prometheus, &expr).await;
        let series = answer["data"]["result"].as_array().unwrap();
        assert_eq!(series.len(), 1, "{legend}: {expr}: {answer}");
        assert_eq!(series[0]["value"][1], "2000", "{legend}: {expr}: {answer}");
    }
}

/// The dashboard's query drawn with this legend (there is one).
fn dashboard_target(legend: &str) -> String {
    let text = std::fs::read_to_string(Path::new(OPERATIONS).join("dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| panel["targets"].as_array().unwrap())
        .filter(|target| target["legendFormat"] == legend)
        .map(|target| target["expr"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(exprs.len(), 1, "{legend}: {exprs:?}");
    exprs.into_iter().next().unwrap()
}

//! End to end with programs nobody here wrote:
//!
//! Prometheus A (scrapes itself, remote-writes with `X-Scope-OrgID`) → nginx (round robin) →
//! three weir replicas in one ring → Prometheus B (`--web.enable-remote-write-receiver`).
//!
//! The configs are the shipped examples in `examples/e2e/`, with their fixed addresses
//! replaced by free ones. `./scripts/test` installs `prometheus` and `nginx` when missing.
//!
//! And exemplars, with Prometheus on both ends: A scrapes an OpenMetrics target whose counter
//! carries an exemplar and sends exemplars for two tenants, one with exemplars on and one with
//! Mimir's default (off); B stores what it receives. The tenant with them on has its exemplars
//! in B; the other has its samples there and no exemplar.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::fleet::{free_gossip_addr, spawn, until_healthy, Replica};
use common::processes::{free_tcp, DumpLogsOnFailure, Process};

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/e2e");

fn require(tool: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"] {
        let path = Path::new(dir).join(tool);
        if path.exists() {
            return path;
        }
    }
    panic!("`{tool}` is not installed: run ./scripts/test, which installs it");
}

fn example(name: &str, replacements: &[(&str, String)]) -> String {
    let mut text = std::fs::read_to_string(Path::new(EXAMPLES).join(name)).unwrap();
    for (from, to) in replacements {
        assert!(text.contains(from), "{name} no longer mentions {from}");
        text = text.replace(from, to);
    }
    text
}

fn start_prometheus(
    dir: &Path,
    name: &str,
    config: &str,
    addr: SocketAddr,
    extra: &[&str],
) -> Process {
    let config_path = dir.join(format!("{name}.yml"));
    std::fs::write(&config_path, config).unwrap();
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let child = Command::new(require("prometheus"))
        .arg(format!("--config.file={}", config_path.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join(name).display()))
        .arg(format!("--web.listen-address={addr}"))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Process(child)
}

async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The sum of every series of `name` in a /metrics page (labels ignored unless given).
async fn metric(base: &str, name: &str) -> f64 {
    let Ok(response) = reqwest::get(format!("{base}/metrics")).await else {
        return 0.0;
    };
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            // `name` alone matches every series of the family; with labels, only that one.
            let matches = series == name
                || (series.starts_with(name) && series[name.len()..].starts_with('{'));
            matches.then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}

async fn fleet_metric(replicas: &[Replica], name: &str) -> f64 {
    let mut total = 0.0;
    for replica in replicas {
        total += metric(&format!("http://{}", replica.http), name).await;
    }
    total
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// The result vector of an instant query, or empty.
async fn query(prometheus: SocketAddr, promql: &str) -> Vec<serde_json::Value> {
    let url = format!("http://{prometheus}/api/v1/query");
    let Ok(response) = reqwest::Client::new()
        .get(url)
        .query(&[("query", promql)])
        .send()
        .await
    else {
        return Vec::new();
    };
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    body["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn now_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_through_nginx_and_weir_into_prometheus() {
    let dir = tempfile::tempdir().unwrap();
    let _logs = DumpLogsOnFailure {
        dir: dir.path().to_path_buf(),
        files: &["a.log", "b.log", "nginx.stderr", "nginx/error.log"],
        lines: 15,
    };
    let (a_addr, b_addr, nginx_addr) = (free_tcp(), free_tcp(), free_tcp());

    // Prometheus B, the backend.
    let b_config = example("prometheus-b.yml", &[]);
    let b_flags = ["--web.enable-remote-write-receiver"];
    let mut backend = Some(start_prometheus(
        dir.path(),
        "b",
        &b_config,
        b_addr,
        &b_flags,
    ));

    // Three weir replicas in one ring, forwarding to B, with the example overrides.
    let overrides = dir.path().join("overrides.yaml");
    let generous = example("overrides.yaml", &[]);
    std::fs::write(&overrides, &generous).unwrap();
    let upstream = format!("http://{b_addr}/api/v1/write");
    let weir_flags = [
        "--runtime-config",
        overrides.to_str().unwrap(),
        "--runtime-config-period",
        "1s",
        "--upstream",
        &upstream,
    ];
    let gossip: Vec<SocketAddr> = (14..=16)
        .map(|i| free_gossip_addr([127, 0, 0, i]))
        .collect();
    let replicas: Vec<Replica> = gossip
        .iter()
        .map(|addr| spawn(*addr, &gossip, "e2e", &weir_flags))
        .collect();
    until_healthy(
        &replicas.iter().collect::<Vec<_>>(),
        3,
        Duration::from_secs(15),
    )
    .await;

    // nginx, round robin over the replicas.
    let nginx_dir = dir.path().join("nginx");
    std::fs::create_dir_all(&nginx_dir).unwrap();
    let nginx_config = example(
        "nginx.conf",
        &[
            ("127.0.0.1:9009", nginx_addr.to_string()),
            ("127.0.0.1:8081", replicas[0].http.to_string()),
            ("127.0.0.1:8082", replicas[1].http.to_string()),
            ("127.0.0.1:8083", replicas[2].http.to_string()),
        ],
    );
    let nginx_config = if nix_is_root() {
        format!("user root;\n{nginx_config}")
    } else {
        nginx_config
    };
    std::fs::write(nginx_dir.join("nginx.conf"), nginx_config).unwrap();
    let _nginx = Process(
        Command::new(require("nginx"))
            .arg("-p")
            .arg(&nginx_dir)
            .arg("-c")
            .arg(nginx_dir.join("nginx.conf"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("nginx.stderr")).unwrap())
            .spawn()
            .unwrap(),
    );

    // Prometheus A, the client, pushing through nginx.
    let a_config = example(
        "prometheus-a.yml",
        &[
            ("127.0.0.1:9090", a_addr.to_string()),
            ("127.0.0.1:9009", nginx_addr.to_string()),
        ],
    );
    let _client = start_prometheus(dir.path(), "a", &a_config, a_addr, &[]);
    let a = format!("http://{a_addr}");

    // 1. What A scrapes is queryable in B.
    eventually("A's series in B", Duration::from_secs(90), || async {
        !query(b_addr, "up{job=\"prometheus-a\"}").await.is_empty()
    })
    .await;
    // 2. The tenant's limit far below A's send rate: 429s, A retries, B holds what was admitted.
    std::fs::write(
        &overrides,
        "overrides:\n  e2e:\n    ingestion_rate: 20\n    ingestion_burst_size: 1000\n",
    )
    .unwrap();
    eventually("weir answering 429", Duration::from_secs(30), || async {
        fleet_metric(
            &replicas,
            "weir_discarded_samples_total{reason=\"rate_limited\",user=\"e2e\"}",
        )
        .await
            > 0.0
    })
    .await;
    eventually(
        "A retrying refused samples",
        Duration::from_secs(30),
        || async {
            metric(&a, "prometheus_remote_storage_samples_retried_total").await
                + metric(&a, "prometheus_remote_storage_samples_failed_total").await
                > 0.0
        },
    )
    .await;
    // B catches up with what weir admitted (the pushes weir is forwarding land).
    eventually(
        "B holding nine tenths of what weir admitted",
        Duration::from_secs(30),
        || async {
            let admitted = fleet_metric(&replicas, "weir_distributor_received_samples_total").await;
            let in_b = metric(
                &format!("http://{b_addr}"),
                "prometheus_tsdb_head_samples_appended_total",
            )
            .await;
            in_b >= 0.9 * admitted
        },
    )
    .await;
    // Read weir, then B, then weir again: weir counts a push as admitted before it forwards
    // it, so B can never be ahead of the second reading.
    let admitted_before = fleet_metric(&replicas, "weir_distributor_received_samples_total").await;
    let in_b = metric(
        &format!("http://{b_addr}"),
        "prometheus_tsdb_head_samples_appended_total",
    )
    .await;
    let admitted_after = fleet_metric(&replicas, "weir_distributor_received_samples_total").await;
    eprintln!("admitted by weir {admitted_before}..{admitted_after}, appended by B {in_b}");
    assert!(in_b <= admitted_after, "B holds more than weir admitted");
    assert!(
        in_b >= 0.9 * admitted_before,
        "B holds much less than weir admitted"
    );

    let per_replica: Vec<f64> = {
        let mut counts = Vec::new();
        for replica in &replicas {
            counts.push(
                metric(
                    &format!("http://{}", replica.http),
                    "weir_distributor_requests_in_total",
                )
                .await,
            );
        }
        counts
    };
    assert!(
        per_replica.iter().filter(|n| **n > 0.0).count() >= 2,
        "nginx spreads over replicas: {per_replica:?}"
    );

    // 3. B stopped: weir answers 5xx, A retries; B back: the series continue.
    std::fs::write(&overrides, &generous).unwrap();
    let generous_in_force = format!(
        "weir_runtime_config_hash{{sha256=\"{}\"}}",
        sha256_hex(generous.as_bytes())
    );
    eventually(
        "every replica to reload the generous overrides",
        Duration::from_secs(10),
        || async { fleet_metric(&replicas, &generous_in_force).await == replicas.len() as f64 },
    )
    .await;
    let retried_before = metric(&a, "prometheus_remote_storage_samples_retried_total").await;
    drop(backend.take()); // SIGKILL: the backend vanishes
    eventually(
        "weir answering 5xx for an unreachable backend",
        Duration::from_secs(30),
        || async {
            fleet_metric(
                &replicas,
                "weir_upstream_requests_total{status_class=\"error\"}",
            )
            .await
                > 0.0
        },
    )
    .await;
    eventually(
        "A retrying while B is down",
        Duration::from_secs(30),
        || async {
            metric(&a, "prometheus_remote_storage_samples_retried_total").await > retried_before
        },
    )
    .await;
    let restarted = now_seconds();
    backend = Some(start_prometheus(
        dir.path(),
        "b",
        &b_config,
        b_addr,
        &b_flags,
    ));
    eventually(
        "A's series continuing in B after its restart",
        Duration::from_secs(90),
        || async {
            query(b_addr, "timestamp(up{job=\"prometheus-a\"})")
                .await
                .iter()
                .filter_map(|sample| sample["value"][1].as_str()?.parse::<f64>().ok())
                .any(|timestamp| timestamp > restarted)
        },
    )
    .await;
    drop(backend);
}

fn nix_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim() == "0")
        .unwrap_or(false)
}

/// An OpenMetrics target: one counter with a trace exemplar, as an instrumented service
/// exposes it.
async fn exemplar_target() -> SocketAddr {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(|| async {
            (
                [(
                    "content-type",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )],
                "# TYPE checkout_requests counter\n\
                 checkout_requests_total{path=\"/pay\"} 7 # {trace_id=\"4bf92f3577b34da6\"} 1.0\n\
                 # EOF\n",
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// The exemplars B holds for `selector`, over the last hour.
async fn exemplars(prometheus: SocketAddr, selector: &str) -> Vec<serde_json::Value> {
    let end = now_seconds();
    let Ok(response) = reqwest::Client::new()
        .get(format!("http://{prometheus}/api/v1/query_exemplars"))
        .query(&[
            ("query", selector.to_string()),
            ("start", format!("{}", end - 3600.0)),
            ("end", format!("{end}")),
        ])
        .send()
        .await
    else {
        return Vec::new();
    };
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    body["data"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|series| series["exemplars"].as_array().cloned().unwrap_or_default())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_exemplars_reach_the_receiver_only_for_a_tenant_that_has_them_on() {
    let dir = tempfile::tempdir().unwrap();
    let _logs = DumpLogsOnFailure {
        dir: dir.path().to_path_buf(),
        files: &["a.log", "b.log"],
        lines: 15,
    };
    let (a_addr, b_addr) = (free_tcp(), free_tcp());
    let exemplar_flags = [
        "--web.enable-remote-write-receiver",
        "--enable-feature=exemplar-storage",
    ];
    let _backend = start_prometheus(
        dir.path(),
        "b",
        &example("prometheus-b.yml", &[]),
        b_addr,
        &exemplar_flags,
    );

    // Two weirs, one a tenant (`--no-auth-tenant`: Debian's Prometheus sends no headers,
    // prometheus/prometheus#13030): `keep` keeps exemplars, `plain` has Mimir's default.
    let overrides = dir.path().join("overrides.yaml");
    std::fs::write(
        &overrides,
        "overrides:\n  keep:\n    max_global_exemplars_per_user: 100000\n  plain: {}\n",
    )
    .unwrap();
    let upstream = format!("http://{b_addr}/api/v1/write");
    let weir = |tenant: &str, ip: u8| {
        spawn(
            free_gossip_addr([127, 0, 0, ip]),
            &[],
            &format!("e2e-exemplars-{tenant}"),
            &[
                "--runtime-config",
                overrides.to_str().unwrap(),
                "--upstream",
                &upstream,
                "--no-auth-tenant",
                tenant,
            ],
        )
    };
    let (keep, plain) = (weir("keep", 17), weir("plain", 18));
    until_healthy(&[&keep], 1, Duration::from_secs(15)).await;
    until_healthy(&[&plain], 1, Duration::from_secs(15)).await;

    // Prometheus A scrapes the target every second and sends exemplars to both, marking the
    // tenant with a label so B, which has no tenants, tells them apart.
    let target = exemplar_target().await;
    let remote_write = |replica: &Replica, tenant: &str| {
        format!(
            "  - url: http://{}/api/v1/push\n    send_exemplars: true\n    \
             queue_config:\n      batch_send_deadline: 1s\n    write_relabel_configs:\n      \
             - target_label: tenant\n        replacement: {tenant}\n",
            replica.http
        )
    };
    let a_config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: checkout\n    \
         static_configs:\n      - targets: ['{target}']\nremote_write:\n{}{}",
        remote_write(&keep, "keep"),
        remote_write(&plain, "plain")
    );
    let _client = start_prometheus(dir.path(), "a", &a_config, a_addr, &exemplar_flags[1..]);
    let a = format!("http://{a_addr}");

    eventually(
        "the exemplars of tenant `keep` in B",
        Duration::from_secs(90),
        || async {
            exemplars(b_addr, "checkout_requests_total{tenant=\"keep\"}")
                .await
                .iter()
                .any(|exemplar| exemplar["labels"]["trace_id"] == "4bf92f3577b34da6")
        },
    )
    .await;
    // A sent the other tenant's exemplars too, and B has its samples, not its exemplars.
    eventually(
        "tenant `plain`'s samples in B",
        Duration::from_secs(30),
        || async {
            !query(b_addr, "checkout_requests_total{tenant=\"plain\"}")
                .await
                .is_empty()
        },
    )
    .await;
    let sent = metric(&a, "prometheus_remote_storage_exemplars_total").await;
    assert!(sent >= 2.0, "A sent exemplars for both tenants: {sent}");
    assert_eq!(
        exemplars(b_addr, "checkout_requests_total{tenant=\"plain\"}").await,
        Vec::<serde_json::Value>::new(),
        "no exemplar of a tenant with them off reaches B"
    );
    let (keep, plain) = (
        format!("http://{}", keep.http),
        format!("http://{}", plain.http),
    );
    let received = "weir_distributor_received_exemplars_total";
    assert_eq!(metric(&plain, received).await, 0.0);
    assert!(metric(&keep, received).await >= 1.0);
    assert!(
        metric(&plain, "weir_distributor_received_samples_total").await >= 1.0,
        "the samples of `plain` were charged"
    );
    assert_eq!(
        metric(&keep, "weir_discarded_exemplars_total").await,
        0.0,
        "Prometheus' exemplars pass Mimir's checks"
    );
}

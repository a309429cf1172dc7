//! A real Prometheus HA pair through nginx to three weir replicas, forwarding to a real
//! backend Prometheus (issue 22).
//!
//! Two Prometheus 2.42 servers (agent mode) scrape the same synthetic target of 1 800 series
//! every second, with external labels `cluster: c1` and `__replica__: a` or `b`, and
//! remote-write through nginx (round robin) to three weir replicas in one ring. The tenant
//! deduplicates (`accept_ha_samples: true`; update timeout 2 s, jitter 1 s, failover 5 s) and
//! its limit is L = 2 000 samples/s with B = L: each server alone sends about 0.9 L, the pair
//! 1.8 L. weir forwards to a backend Prometheus (`--web.enable-remote-write-receiver`).
//!
//! - **one copy**: the backend holds each of the 1 800 series once, with `cluster` and
//!   without `__replica__`;
//! - **refused** ≤ 1 % of the tenant's pushes, and **delivered** (samples weir admitted ÷
//!   samples the elected server scraped, after a drain) ≥ 99 %;
//! - **failover**: the elected server is SIGKILLed; the other is elected within the failover
//!   timeout + 2 s of the kill, and the backend's samples of a series have no gap longer than
//!   that.
//!
//! Under `CI` a missing program fails the test; elsewhere the test is skipped with a message.
//! `./scripts/test` installs `prometheus` and `nginx`.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::fleet::{free_gossip_addr, spawn, until_healthy, Replica};
use common::processes::{
    free_tcp, metrics_page, nginx_in_front, real_client_config, require, spawn_logged, sum,
    DumpLogsOnFailure, Target,
};

/// The tenant nginx names (see tests/real_clients/nginx.conf).
const TENANT: &str = "real-clients";
/// The tenant's ingestion rate and burst, samples/s.
const LIMIT: u64 = 2_000;
const SERIES: usize = 1_800;
const FAILOVER: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prometheus_ha_pair_is_stored_once_and_fails_over() {
    let (Some(prometheus), Some(nginx)) = (require("prometheus"), require("nginx")) else {
        return;
    };
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let _logs = DumpLogsOnFailure {
        dir: dir.path().to_path_buf(),
        files: &[
            "a.log",
            "b.log",
            "backend.log",
            "nginx.stderr",
            "nginx/error.log",
        ],
        lines: 10,
    };

    // The backend.
    let backend_addr = free_tcp();
    let _backend = spawn_logged(
        Command::new(&prometheus)
            .arg(format!(
                "--config.file={}/backend.yml",
                common::processes::REAL_CLIENT_CONFIGS
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("backend").display()
            ))
            .arg(format!("--web.listen-address={backend_addr}"))
            .arg("--web.enable-remote-write-receiver"),
        &dir.path().join("backend.log"),
    );
    let backend = format!("http://{backend_addr}");
    common::wait_until("the backend is ready", Duration::from_secs(30), || async {
        reqwest::get(format!("{backend}/-/ready"))
            .await
            .is_ok_and(|response| response.status().is_success())
    })
    .await;

    // Three weir replicas forwarding to it.
    let overrides = dir.path().join("overrides.yaml");
    std::fs::write(
        &overrides,
        format!(
            "overrides:\n  {TENANT}:\n    ingestion_rate: {LIMIT}\n    \
             ingestion_burst_size: {LIMIT}\n    accept_ha_samples: true\n    \
             ha_tracker_update_timeout: 2s\n    ha_tracker_update_timeout_jitter_max: 1s\n    \
             ha_tracker_failover_timeout: {}s\n",
            FAILOVER.as_secs()
        ),
    )
    .unwrap();
    let upstream = format!("{backend}/api/v1/write");
    let args = [
        "--runtime-config",
        overrides.to_str().unwrap(),
        "--upstream",
        &upstream,
    ];
    let gossip: Vec<SocketAddr> = (80..83)
        .map(|ip| free_gossip_addr([127, 0, 0, ip]))
        .collect();
    let fleet: Vec<Replica> = gossip
        .iter()
        .map(|addr| spawn(*addr, &gossip, "ha-pair", &args))
        .collect();
    until_healthy(
        &fleet.iter().collect::<Vec<_>>(),
        3,
        Duration::from_secs(20),
    )
    .await;

    // nginx in front, and the target.
    let target = Target::serve(SERIES).await;
    let (nginx_addr, _, _nginx) = nginx_in_front(
        &nginx,
        dir.path(),
        [fleet[0].http, fleet[1].http, fleet[2].http],
    );

    // The pair.
    let mut servers = Vec::new();
    for replica in ["a", "b"] {
        let config = real_client_config(
            "prometheus-ha.yml",
            &[
                ("127.0.0.1:9100", target.addr.to_string()),
                ("127.0.0.1:9009", nginx_addr.to_string()),
                ("REPLICA", replica.to_string()),
            ],
        );
        let path = dir.path().join(format!("{replica}.yml"));
        std::fs::write(&path, config).unwrap();
        let addr = free_tcp();
        let process = spawn_logged(
            Command::new(&prometheus)
                .arg("--enable-feature=agent")
                .arg(format!("--config.file={}", path.display()))
                .arg(format!(
                    "--storage.agent.path={}",
                    dir.path().join(format!("agent-{replica}")).display()
                ))
                .arg(format!("--web.listen-address={addr}")),
            &dir.path().join(format!("{replica}.log")),
        );
        servers.push((replica, format!("http://{addr}"), Some(process)));
    }

    // Steady state: wait for the first admission, run 25 s, then quiet the target and let
    // the elected server drain.
    common::wait_until("weir admits the pair", Duration::from_secs(30), || async {
        admitted(&fleet).await > 0.0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(25)).await;
    target.quiet();
    let elected = elected(&fleet[0]).await.expect("an elected replica");
    let elected_base = servers
        .iter()
        .find(|(replica, _, _)| *replica == elected)
        .map(|(_, base, _)| base.clone())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let (admitted_total, scraped) = loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let admitted_total = admitted(&fleet).await;
        let page = metrics_page(&elected_base).await;
        let scraped = sum(&page, "prometheus_agent_samples_appended_total", &[]);
        if admitted_total >= scraped - 50.0 || Instant::now() > deadline {
            break (admitted_total, scraped);
        }
    };
    let (mut pushes, mut refused, mut deduped) = (0.0, 0.0, 0.0);
    for replica in &fleet {
        let page = metrics_page(&format!("http://{}", replica.http)).await;
        let tenant = [("user", TENANT)];
        pushes += sum(&page, "weir_distributor_requests_in_total", &tenant);
        refused += sum(&page, "weir_discarded_requests_total", &tenant);
        deduped += sum(&page, "weir_distributor_deduped_samples_total", &tenant);
    }
    let delivered = admitted_total / scraped.max(1.0);
    let refused_share = refused / pushes.max(1.0);
    // The target is quiet: the series are stale now, so the last minute is asked.
    let one_copy = query(&backend, "count(last_over_time(synthetic[1m]))").await;
    let with_cluster = query(
        &backend,
        "count(last_over_time(synthetic{cluster=\"c1\"}[1m]))",
    )
    .await;
    let with_replica = query(&backend, "count(last_over_time({__replica__!=\"\"}[5m]))").await;

    // Failover: back to full scraping, then the elected server is killed.
    target.loud();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let loud_at_ms = unix_ms();
    let killed = Instant::now();
    let server = servers
        .iter_mut()
        .find(|(replica, _, _)| *replica == elected)
        .unwrap();
    let mut process = server.2.take().unwrap();
    process.0.kill().unwrap();
    let _ = process.0.wait();
    let other = if elected == "a" { "b" } else { "a" };
    let mut failed_over = None;
    while killed.elapsed() < FAILOVER + Duration::from_secs(10) {
        if elected_everywhere(&fleet, other).await {
            failed_over = Some(killed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    let gap = longest_gap(&backend, loud_at_ms).await;

    println!(
        "ha-pair: series={SERIES} offered_per_server={:.2}L elected={elected} delivered={delivered:.4} \
         refused={refused_share:.4} pushes={pushes} admitted={admitted_total} scraped={scraped} \
         deduped={deduped} backend_series={one_copy:?} with_cluster={with_cluster:?} \
         with_replica={with_replica:?} failover_after_kill={failed_over:?} longest_gap={gap:.1}s \
         wall={:.0}s",
        (SERIES + 5) as f64 / LIMIT as f64,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(one_copy, Some(SERIES as f64), "one copy of each series");
    assert_eq!(with_cluster, Some(SERIES as f64), "with the cluster label");
    assert_eq!(with_replica, None, "no series keeps __replica__");
    assert!(
        deduped > 0.0,
        "the other server's samples were deduplicated"
    );
    assert!(
        refused_share <= 0.01,
        "refused {refused_share:.4} of pushes"
    );
    assert!(delivered >= 0.99, "delivered {delivered:.4}");
    let failed_over = failed_over.expect("the other server was never elected");
    assert!(
        failed_over <= FAILOVER + Duration::from_secs(2),
        "failed over {failed_over:?} after the kill"
    );
    assert!(
        gap <= (FAILOVER + Duration::from_secs(2)).as_secs_f64(),
        "the backend has a gap of {gap:.1} s"
    );
}

/// Samples weir admitted for the tenant, over the fleet.
async fn admitted(fleet: &[Replica]) -> f64 {
    let mut total = 0.0;
    for replica in fleet {
        let page = metrics_page(&format!("http://{}", replica.http)).await;
        total += sum(
            &page,
            "weir_distributor_received_samples_total",
            &[("user", TENANT)],
        );
    }
    total
}

/// The elected replica of cluster `c1` as `replica` holds it.
async fn elected(replica: &Replica) -> Option<String> {
    let url = format!("http://{}/distributor/ha_tracker", replica.http);
    let elections: serde_json::Value = reqwest::get(url).await.ok()?.json().await.ok()?;
    elections
        .as_array()?
        .iter()
        .find(|election| election["tenant"] == TENANT && election["cluster"] == "c1")
        .and_then(|election| election["replica"].as_str().map(str::to_string))
}

async fn elected_everywhere(fleet: &[Replica], replica: &str) -> bool {
    for member in fleet {
        if elected(member).await.as_deref() != Some(replica) {
            return false;
        }
    }
    true
}

/// A PromQL instant query's single value, `None` for an empty result.
async fn query(backend: &str, promql: &str) -> Option<f64> {
    let response: serde_json::Value = reqwest::Client::new()
        .get(format!("{backend}/api/v1/query"))
        .query(&[("query", promql)])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let result = response["data"]["result"].as_array()?;
    result.first()?["value"][1].as_str()?.parse().ok()
}

/// The longest time between two samples of one series in the backend, from `since_ms` on.
async fn longest_gap(backend: &str, since_ms: i64) -> f64 {
    let response: serde_json::Value = reqwest::Client::new()
        .get(format!("{backend}/api/v1/query"))
        .query(&[("query", "synthetic{i=\"0\"}[5m]")])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let values = response["data"]["result"][0]["values"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let times: Vec<f64> = values
        .iter()
        .filter_map(|pair| pair[0].as_f64())
        .filter(|time| *time * 1000.0 >= since_ms as f64)
        .collect();
    assert!(
        times.len() > 5,
        "the backend has too few samples: {values:?}"
    );
    times
        .windows(2)
        .map(|pair| pair[1] - pair[0])
        .fold(0.0, f64::max)
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

//! "No name can poison the ring": three real `weir` processes gossiping on 127.0.0.x. Tenant
//! IDs the push path refuses, and keys over the bound, are refused at every door of one replica
//! (push, OTLP, the JSON twin, gRPC, Envoy's RLS). Before, the admission API admitted a tenant
//! like `my team`, whose space broke the usage report, and the peers then ignored that
//! replica's reports for every tenant. Then valid names with the characters that used to break
//! the report (free-form admission keys with spaces, newlines, `/`, `%`, braces) reach the
//! peers: each tenant's limit still holds fleet-wide, and no report or entry is refused.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::fleet::{free_gossip_addr, spawn, until_healthy, Replica};
use serde_json::{json, Value};
use tonic::Code;
use weir::grpc::proto::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use weir::grpc::proto::envoy::service::ratelimit::v3::{
    rate_limit_service_client::RateLimitServiceClient, RateLimitRequest,
};
use weir::grpc::proto::weir::admission::v1 as api;
use weir::grpc::proto::weir::admission::v1::admission_client::AdmissionClient;
use weir::remote_write::prompb::WriteRequest;

/// The push tenant: 100 samples of burst, refilled at 1 a second, so what one replica admits
/// is what the others must refuse. Admission keys: 20 of burst, 1 a second.
const OVERRIDES: &str = r#"
admission:
  default_limit: {rate: 1, burst: 20}
envoy_domains:
  - domain: edge
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 5}
  - domain: hostile
    tenant: "my team"
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 5}
overrides:
  t:
    ingestion_rate: 1
    ingestion_burst_size: 100
"#;

const BURST: u64 = 20;

/// A valid tenant with Mimir's punctuation, and a free-form key with what broke the old
/// report: spaces, a newline, `/`, `%`, braces, a non-ASCII character.
const TENANT: &str = "team_a.(1)*'!";
const KEY: &str = "GET /a b\nc%20{x}/é";

/// Tenant IDs the push path refuses (Mimir's rules).
fn hostile_tenants() -> Vec<String> {
    vec![
        "my team".into(),
        "a/b".into(),
        "a}b".into(),
        "a\nb".into(),
        "x".repeat(300),
        ".".into(),
        "é".into(),
    ]
}

fn long_key() -> String {
    "k".repeat(5000)
}

async fn fleet(dir: &std::path::Path) -> Vec<Replica> {
    let path = dir.join("overrides.yaml");
    std::fs::write(&path, OVERRIDES).unwrap();
    let gossip: Vec<SocketAddr> = (170..173)
        .map(|i| free_gossip_addr([127, 0, 0, i]))
        .collect();
    let cluster = format!("hostile-{}", std::process::id());
    let args = [
        "--runtime-config",
        path.to_str().unwrap(),
        "--gossip-interval",
        "100ms",
        "--rate-limit-strategy",
        "weighted",
        // What each replica was charged is read from refusals at once: a held push would
        // wait out the refill and pass (tests/http_api.rs covers holding).
        "--max-admission-delay",
        "0s",
    ];
    let replicas: Vec<_> = gossip
        .iter()
        .map(|addr| spawn(*addr, &gossip, &cluster, &args))
        .collect();
    until_healthy(
        &replicas.iter().collect::<Vec<_>>(),
        3,
        Duration::from_secs(20),
    )
    .await;
    replicas
}

async fn grpc(replica: &Replica) -> AdmissionClient<tonic::transport::Channel> {
    AdmissionClient::connect(format!("http://{}", replica.grpc))
        .await
        .unwrap()
}

fn allow(tenant: &str, key: &str) -> api::AllowRequest {
    api::AllowRequest {
        tenant: tenant.into(),
        key: key.into(),
        cost: 1,
        limit: None,
    }
}

async fn post_json(
    client: &reqwest::Client,
    replica: &Replica,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let response = client
        .post(format!("http://{}{path}", replica.http))
        .json(&body)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

fn push_body(series: usize) -> Vec<u8> {
    WriteRequest::synthetic(series, 1, 1).encode_snappy()
}

async fn push(
    client: &reqwest::Client,
    replica: &Replica,
    path: &str,
    tenant: &str,
    series: usize,
) -> u16 {
    client
        .post(format!("http://{}{path}", replica.http))
        .header("Content-Encoding", "snappy")
        .header("Content-Type", "application/x-protobuf")
        .header("X-Prometheus-Remote-Write-Version", "0.1.0")
        .header(
            "X-Scope-OrgID",
            reqwest::header::HeaderValue::from_bytes(tenant.as_bytes()).unwrap(),
        )
        .body(push_body(series))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Every door of `replica` refuses every hostile name with 400 or INVALID_ARGUMENT and a
/// message saying what is wrong.
async fn every_door_refuses(client: &reqwest::Client, replica: &Replica) {
    let mut grpc = grpc(replica).await;
    let mut names: Vec<(String, String, &str)> = hostile_tenants()
        .into_iter()
        .map(|tenant| (tenant, "k".to_string(), "BAD_TENANT"))
        .collect();
    names.push((TENANT.into(), long_key(), "KEY_TOO_LONG"));
    for (tenant, key, reason) in &names {
        let shown = &tenant[..tenant.len().min(20)];
        let (status, body) = post_json(
            client,
            replica,
            "/api/v1/allow",
            json!({"tenant": tenant, "key": key}),
        )
        .await;
        assert_eq!(
            (status, body["reason"].as_str()),
            (400, Some(*reason)),
            "allow {shown:?}: {body}"
        );
        assert_eq!(body["code"], "InvalidArgument");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.contains("tenant ID") || message.contains("key is too long"),
            "{message}"
        );
        let (status, body) = post_json(
            client,
            replica,
            "/api/v1/allow_batch",
            json!({"requests": [{"tenant": tenant, "key": key}, {"tenant": TENANT, "key": "fine"}]}),
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(
            body["results"][0]["error"]["reason"], *reason,
            "batch {shown:?}: {body}"
        );
        assert_eq!(
            body["results"][1]["allowed"], true,
            "the good one in the batch: {body}"
        );
        let (status, body) = post_json(
            client,
            replica,
            "/api/v1/acquire",
            json!({"tenant": tenant, "key": key}),
        )
        .await;
        assert_eq!(
            (status, body["reason"].as_str()),
            (400, Some(*reason)),
            "acquire {shown:?}: {body}"
        );

        let error = grpc.allow(allow(tenant, key)).await.unwrap_err();
        assert_eq!(
            error.code(),
            Code::InvalidArgument,
            "Allow {shown:?}: {error:?}"
        );
        let batch = grpc
            .allow_batch(api::AllowBatchRequest {
                requests: vec![allow(tenant, key), allow(TENANT, "fine")],
            })
            .await
            .unwrap()
            .into_inner();
        use api::allow_batch_response::result::Result as Item;
        match &batch.results[0].result {
            Some(Item::Error(error)) => {
                assert_eq!(error.code, Code::InvalidArgument as i32);
                assert_eq!(error.reason, *reason);
            }
            other => panic!("AllowBatch {shown:?}: {other:?}"),
        }
        assert!(matches!(&batch.results[1].result, Some(Item::Response(r)) if r.allowed));
        let error = grpc
            .acquire(api::AcquireRequest {
                tenant: tenant.clone(),
                key: key.clone(),
                limit: None,
                ttl: None,
            })
            .await
            .unwrap_err();
        assert_eq!(
            error.code(),
            Code::InvalidArgument,
            "Acquire {shown:?}: {error:?}"
        );
    }
    for tenant in hostile_tenants() {
        for path in ["/api/v1/push", "/otlp/v1/metrics"] {
            // A newline cannot be sent in a header at all: the client refuses it.
            if tenant.contains('\n') {
                continue;
            }
            assert_eq!(
                push(client, replica, path, &tenant, 1).await,
                400,
                "{path} {tenant:?}"
            );
        }
    }

    // Lease ids longer than any weir issues.
    let lease = "S".repeat(5000);
    for path in ["/api/v1/release", "/api/v1/renew"] {
        let (status, body) = post_json(client, replica, path, json!({"lease_id": lease})).await;
        assert_eq!(
            (status, body["reason"].as_str()),
            (400, Some("LEASE_ID_TOO_LONG")),
            "{path}: {body}"
        );
    }
    let error = grpc
        .release(api::ReleaseRequest {
            lease_id: lease.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    let error = grpc
        .renew(api::RenewRequest {
            lease_id: lease,
            ttl: None,
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);

    // Envoy: the domain's tenant, and the key a descriptor value makes.
    let mut rls = RateLimitServiceClient::connect(format!("http://{}", replica.grpc))
        .await
        .unwrap();
    let request = |domain: &str, path: String| RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "path".into(),
                value: path,
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    let error = rls
        .should_rate_limit(request("hostile", "/x".into()))
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");
    assert!(
        error
            .message()
            .contains("tenant ID contains unsupported character ' '"),
        "{error:?}"
    );
    let error = rls
        .should_rate_limit(request("edge", "/".repeat(5000)))
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");
    assert!(error.message().contains("key is too long"), "{error:?}");
    let fine = rls
        .should_rate_limit(request("edge", "/a b\n{c}".into()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(fine.overall_code, 1, "OK: {fine:?}");
}

/// Allows `count` requests for (TENANT, KEY) on `replica`; returns how many were allowed.
async fn allowed(replica: &Replica, count: u64) -> u64 {
    let mut grpc = grpc(replica).await;
    let mut allowed = 0;
    for _ in 0..count {
        allowed += grpc
            .allow(allow(TENANT, KEY))
            .await
            .unwrap()
            .into_inner()
            .allowed as u64;
    }
    allowed
}

/// What `replica` has been told the peers admitted of push tenant `t`, in samples.
async fn items_by_peers(replica: &Replica) -> u64 {
    let ring = replica.ring().await.unwrap_or_default();
    ring["tenants"]
        .as_array()
        .and_then(|tenants| tenants.iter().find(|t| t["tenant"] == "t"))
        .and_then(|t| t["admitted_items_by_peers"].as_u64())
        .unwrap_or(0)
}

async fn refused_usage(client: &reqwest::Client, replica: &Replica) -> f64 {
    let base = format!("http://{}", replica.http);
    let mut total = common::metric_at(client, &base, "weir_ring_rejected_usage_reports_total")
        .await
        .expect("the metric is exported");
    for reason in ["fields", "name", "count", "level", "too_many"] {
        let series = format!("weir_ring_skipped_usage_entries_total{{reason=\"{reason}\"}}");
        total += common::metric_at(client, &base, &series)
            .await
            .unwrap_or_else(|| panic!("{series} is pre-created"));
    }
    total
}

#[tokio::test]
async fn no_name_can_poison_the_ring() {
    let dir = tempfile::tempdir().unwrap();
    let replicas = fleet(dir.path()).await;
    let client = reqwest::Client::new();

    every_door_refuses(&client, &replicas[0]).await;

    // The peers start tracking the key and the push tenant (one each, counted below).
    let started = Instant::now();
    let mut admitted = 0;
    for replica in &replicas[1..] {
        admitted += allowed(replica, 1).await;
        assert_eq!(push(&client, replica, "/api/v1/push", "t", 1).await, 200);
    }
    // Replica 1: the rest of the key's burst, and 90 of the push tenant's 100.
    admitted += allowed(&replicas[0], BURST).await;
    assert_eq!(
        push(&client, &replicas[0], "/api/v1/push", "t", 90).await,
        200
    );

    // The peers hear of it: their reports carry the key (and the rest) intact.
    let deadline = Instant::now() + Duration::from_secs(10);
    for replica in &replicas[1..] {
        while items_by_peers(replica).await < 91 {
            assert!(
                Instant::now() < deadline,
                "a peer never heard of replica 0's admissions: {:?}",
                replica.ring().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // The key's limit holds fleet-wide: what replica 0 spent, replica 1 does not get again.
    admitted += allowed(&replicas[1], BURST).await;
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!("key admitted fleet-wide: {admitted} in {elapsed:.1} s (burst {BURST}, 1/s)");
    // The burst, the two the peers admitted first (replica 0 may not have heard of them yet
    // when it spent its burst), what 1/s refilled, and one for rounding. A fleet whose peers
    // lose the key's entries admits about twice the burst.
    assert!(
        admitted as f64 <= (BURST + 2) as f64 + elapsed + 1.0,
        "{admitted} admitted in {elapsed:.1} s: the peers did not charge replica 0's admissions"
    );
    // And the push tenant's: 92 of 100 spent, 10 more are over it on another replica.
    assert_eq!(
        push(&client, &replicas[2], "/api/v1/push", "t", 10).await,
        429
    );

    for (i, replica) in replicas.iter().enumerate() {
        assert_eq!(
            refused_usage(&client, replica).await,
            0.0,
            "replica {i} refused a usage report or entry"
        );
    }
}

/// Resident memory of a process, in KiB, from `/proc/PID/status`.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// A flood of distinct admission keys for one tenant: the first
/// `--admission-max-keys-per-tenant` are kept, the rest refused with RESOURCE_EXHAUSTED (429 on
/// the JSON door) and not kept, so memory stays flat; another tenant is unaffected.
#[tokio::test]
async fn a_flood_of_distinct_keys_is_capped_per_tenant() {
    const CAP: usize = 100;
    const FLOOD: usize = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("overrides.yaml");
    std::fs::write(&path, OVERRIDES).unwrap();
    let gossip = free_gossip_addr([127, 0, 0, 174]);
    let cap = CAP.to_string();
    let replica = spawn(
        gossip,
        &[gossip],
        &format!("flood-{}", std::process::id()),
        &[
            "--runtime-config",
            path.to_str().unwrap(),
            "--admission-max-keys-per-tenant",
            &cap,
        ],
    );
    until_healthy(&[&replica], 1, Duration::from_secs(20)).await;
    let mut client = grpc(&replica).await;
    // Warm: the tenant's first keys, and the allocator's arenas for the calls.
    for i in 0..CAP {
        let answer = client.allow(allow("flooder", &format!("k{i}"))).await;
        assert!(answer.is_ok(), "key {i} of {CAP}: {answer:?}");
    }
    let before = rss_kib(replica.child.id());
    let mut refused = 0;
    for i in CAP..FLOOD {
        // Each key of 1 000 bytes (the most is 1 024): kept, 9 900 of them would take over
        // 9 MiB in key bytes alone, far above the allocator's steps of about 2 MiB.
        let key = format!("{i:0>1000}");
        match client.allow(allow("flooder", &key)).await {
            Err(status) if status.code() == Code::ResourceExhausted => {
                assert!(status.message().contains("admission keys"), "{status:?}");
                refused += 1;
            }
            other => panic!("key {i} past the cap: {other:?}"),
        }
    }
    let grown = rss_kib(replica.child.id()).saturating_sub(before);
    eprintln!("{refused} new keys refused past a cap of {CAP}; resident memory grew {grown} KiB");
    assert_eq!(refused, FLOOD - CAP);
    // Kept, the 9 900 keys would take over 9 MiB; refused, they take nothing. The bound
    // leaves room for one step of the allocator (a run read 2 148 KiB, others 0).
    assert!(
        grown < 4096,
        "resident memory grew {grown} KiB over the flood"
    );
    // A key the tenant has is still answered, another tenant's new key too, and the JSON
    // door names the reason with 429.
    assert!(client.allow(allow("flooder", "k0")).await.is_ok());
    assert!(client.allow(allow("other", "new")).await.is_ok());
    let (status, body) = post_json(
        &reqwest::Client::new(),
        &replica,
        "/api/v1/allow",
        json!({"tenant": "flooder", "key": "one more", "cost": 1}),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["reason"], "TOO_MANY_KEYS", "{body}");
}

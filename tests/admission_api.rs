//! The admission API on a real server: every RPC from the checked-in `.proto` called by a
//! client in another language (Python, generated at test time by grpcio-tools), Envoy's
//! rate-limit service called the same way, each algorithm and error over gRPC from Rust, the
//! HTTP/JSON twin, slots returning after their holder is SIGKILLed, and the push path's
//! per-tenant in-flight cap.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Options, RawRequest, Weir};
use serde_json::{json, Value};
use tonic::transport::Channel;
use tonic::Code;
use weir::grpc::proto::weir::admission::v1 as api;
use weir::grpc::proto::weir::admission::v1::admission_client::AdmissionClient;

/// What `tests/python/admission_client.py` expects.
const OVERRIDES: &str = r#"
envoy_domains:
  - domain: edge
    descriptors:
      - key: remote_address
        rate_limit: {unit: second, requests_per_unit: 2}
overrides:
  a:
    limits:
      "GET /s": {rate: 3, burst: 3}
      slots: {max_concurrent: 50}
      window: {algorithm: sliding_window, rate: 10, window: 1s}
      leaky: {algorithm: leaky_bucket, rate: 10, burst: 5}
      pushes: {max_concurrent: 2}
  b:
    allow_client_limits: true
  p:
    max_inflight_push_requests: 2
"#;

async fn client(weir: &Weir) -> AdmissionClient<Channel> {
    AdmissionClient::connect(format!("http://{}", weir.grpc))
        .await
        .unwrap()
}

fn allow(tenant: &str, key: &str, cost: u64) -> api::AllowRequest {
    api::AllowRequest {
        tenant: tenant.into(),
        key: key.into(),
        cost,
        limit: None,
    }
}

fn acquire(key: &str, ttl: Duration) -> api::AcquireRequest {
    api::AcquireRequest {
        tenant: "a".into(),
        key: key.into(),
        limit: None,
        ttl: Some(ttl.try_into().unwrap()),
    }
}

/// The reason in a status's google.rpc.ErrorInfo detail.
fn reason(status: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    status
        .get_details_error_info()
        .map(|info| info.reason)
        .unwrap_or_default()
}

fn python() -> Command {
    let ok = Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    assert!(
        ok,
        "python3 with grpcio and grpcio-tools is needed (scripts/test installs them: \
         pip install grpcio grpcio-tools)"
    );
    let mut command = Command::new("python3");
    command.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/admission_client.py"
    ));
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_client_calls_every_rpc_and_envoys_protocol() {
    let weir = Weir::with_overrides(OVERRIDES).await;
    let output = tokio::task::spawn_blocking({
        let address = weir.grpc.to_string();
        move || python().arg(address).output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "the Python client failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "ok");
}

#[tokio::test]
async fn each_algorithm_answers_as_its_table_says() {
    let weir = Weir::with_overrides(OVERRIDES).await;
    let mut client = client(&weir).await;

    // Sliding window: rate × window = 10 in the first window, then refused until it slides.
    let mut allowed = 0;
    let mut refused = None;
    for _ in 0..12 {
        let answer = client
            .allow(allow("a", "window", 1))
            .await
            .unwrap()
            .into_inner();
        if answer.allowed {
            allowed += 1;
        } else {
            refused.get_or_insert(answer);
        }
    }
    assert_eq!(allowed, 10);
    let refused = refused.unwrap();
    let limit = refused.limit_in_force.unwrap();
    assert_eq!(limit.algorithm, api::Algorithm::SlidingWindow as i32);
    // Until the window has slid far enough: at most the window plus cost ÷ rate.
    let retry = Duration::try_from(refused.retry_after.unwrap()).unwrap();
    assert!(
        retry > Duration::ZERO && retry <= Duration::from_millis(1100),
        "{retry:?}"
    );

    // Leaky bucket: each request conforms after a growing delay (shaping), until the backlog
    // would pass its bound of 5.
    let mut delays = Vec::new();
    loop {
        let answer = client
            .allow(allow("a", "leaky", 1))
            .await
            .unwrap()
            .into_inner();
        if !answer.allowed {
            assert!(Duration::try_from(answer.retry_after.unwrap()).unwrap() > Duration::ZERO);
            break;
        }
        delays.push(Duration::try_from(answer.delay.unwrap_or_default()).unwrap());
        assert!(
            delays.len() <= 6,
            "the queue bound was not enforced: {delays:?}"
        );
    }
    assert!(delays.len() >= 5, "{delays:?}");
    assert_eq!(delays[0], Duration::ZERO);
    assert!(
        delays.windows(2).all(|pair| pair[1] > pair[0]),
        "delays must grow by 1/rate: {delays:?}"
    );
    let step = delays[2] - delays[1];
    assert!(
        step.abs_diff(Duration::from_millis(100)) < Duration::from_millis(20),
        "{step:?}"
    );

    // Token bucket: the burst, then the rate.
    let answers: Vec<bool> = {
        let mut answers = Vec::new();
        for _ in 0..4 {
            answers.push(
                client
                    .allow(allow("a", "GET /s", 1))
                    .await
                    .unwrap()
                    .into_inner()
                    .allowed,
            );
        }
        answers
    };
    assert_eq!(answers, [true, true, true, false]);

    // AllowBatch answers in order, the same as Allow.
    let batch = client
        .allow_batch(api::AllowBatchRequest {
            requests: vec![
                allow("a", "other", 1),
                allow("a", "other", 0),
                allow("", "x", 1),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    use api::allow_batch_response::result::Result as One;
    let reasons: Vec<String> = batch
        .results
        .iter()
        .map(|result| match result.result.as_ref().unwrap() {
            One::Response(answer) => format!("allowed={}", answer.allowed),
            One::Error(error) => error.reason.clone(),
        })
        .collect();
    assert_eq!(reasons, ["allowed=true", "BAD_COST", "MISSING_FIELD"]);
}

#[tokio::test]
async fn bad_requests_and_unknown_leases_get_clear_statuses() {
    let weir = Weir::with_overrides(OVERRIDES).await;
    let mut client = client(&weir).await;

    let err = client.allow(allow("a", "GET /s", 0)).await.unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "BAD_COST")
    );
    let err = client.allow(allow("a", "GET /s", 4)).await.unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::OutOfRange, "COST_OVER_LIMIT")
    );
    assert!(err.message().contains("burst"), "{}", err.message());
    let mut bad = allow("b", "k", 1);
    bad.limit = Some(api::LimitSpec {
        rate: f64::NAN,
        ..Default::default()
    });
    let err = client.allow(bad).await.unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "BAD_SPEC")
    );
    let mut bad = allow("b", "k", 1);
    bad.limit = Some(api::LimitSpec {
        algorithm: 9,
        rate: 1.0,
        ..Default::default()
    });
    let err = client.allow(bad).await.unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "BAD_SPEC")
    );

    // Leases: double release, an expired lease on Renew, a lease of another replica,
    // nonsense.
    let lease = client
        .acquire(acquire("slots", Duration::from_secs(10)))
        .await
        .unwrap()
        .into_inner();
    assert!(lease.granted);
    client
        .release(api::ReleaseRequest {
            lease_id: lease.lease_id.clone(),
        })
        .await
        .unwrap();
    let err = client
        .release(api::ReleaseRequest {
            lease_id: lease.lease_id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::NotFound, "UNKNOWN_LEASE")
    );

    let short = client
        .acquire(acquire("slots", Duration::from_millis(50)))
        .await
        .unwrap()
        .into_inner();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let err = client
        .renew(api::RenewRequest {
            lease_id: short.lease_id.clone(),
            ttl: Some(Duration::from_secs(5).try_into().unwrap()),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::NotFound, "UNKNOWN_LEASE")
    );

    // A negative ttl is refused, as the JSON twin refuses it, on Acquire and on Renew; it
    // is not taken for no ttl (the 30 s default).
    let negative = prost_types::Duration {
        seconds: -5,
        nanos: 0,
    };
    let mut request = acquire("slots", Duration::from_secs(1));
    request.ttl = Some(negative);
    let err = client.acquire(request).await.unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "BAD_TTL")
    );
    let err = client
        .renew(api::RenewRequest {
            lease_id: short.lease_id.clone(),
            ttl: Some(negative),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "BAD_TTL")
    );

    let foreign = format!("L{:032x}@some-other-replica", 7);
    let err = client
        .release(api::ReleaseRequest { lease_id: foreign })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::FailedPrecondition, "WRONG_REPLICA")
    );
    assert!(
        err.message().contains("some-other-replica"),
        "{}",
        err.message()
    );

    // A full key: granted=false with when to retry.
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            client
                .acquire(acquire("pushes", Duration::from_secs(2)))
                .await
                .unwrap()
                .into_inner(),
        );
    }
    assert!(held.iter().all(|lease| lease.granted));
    let full = client
        .acquire(acquire("pushes", Duration::from_secs(2)))
        .await
        .unwrap()
        .into_inner();
    assert!(!full.granted && full.lease_id.is_empty());
    assert_eq!((full.in_flight, full.limit), (2, 2));
    // The earliest deadline is 2 s away; holders usually finish sooner, so the hint is
    // shorter.
    let retry = Duration::try_from(full.retry_after.unwrap()).unwrap();
    assert_eq!(retry, engine::admission::ACQUIRE_RETRY_HINT);
}

#[tokio::test]
async fn strict_admission_refuses_unknown_tenants_and_keys() {
    let weir = Weir::with_overrides(&format!("admission:\n  strict: true\n{OVERRIDES}")).await;
    let mut client = client(&weir).await;
    let err = client
        .allow(allow("nobody", "GET /s", 1))
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::NotFound, "UNKNOWN_TENANT")
    );
    let err = client
        .allow(allow("a", "GET /unlisted", 1))
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::NotFound, "UNKNOWN_KEY")
    );
    assert!(
        client
            .allow(allow("a", "GET /s", 1))
            .await
            .unwrap()
            .into_inner()
            .allowed
    );
}

#[tokio::test]
async fn the_json_twin_maps_to_the_same_engine() {
    let weir = Weir::with_overrides(OVERRIDES).await;
    let post = |path: &str, body: Value| {
        let request = weir.client.post(weir.url(path)).json(&body);
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let mut answers = Vec::new();
    for _ in 0..4 {
        let (status, body) = post("/api/v1/allow", json!({"tenant": "a", "key": "GET /s"})).await;
        assert_eq!(status, 200, "{body}");
        answers.push(body["allowed"].as_bool().unwrap());
    }
    assert_eq!(answers, [true, true, true, false]);

    let (status, body) = post(
        "/api/v1/allow",
        json!({"tenant": "a", "key": "k", "cost": -1}),
    )
    .await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (400, Some("BAD_COST")),
        "{body}"
    );
    for missing in [json!({"key": "k"}), json!({"tenant": "", "key": "k"})] {
        let (status, body) = post("/api/v1/allow", missing).await;
        assert_eq!(
            (status, body["reason"].as_str()),
            (400, Some("MISSING_FIELD")),
            "{body}"
        );
    }
    let (status, body) = post("/api/v1/allow", json!({"tenant": "a", "cots": 1})).await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (400, Some("BAD_JSON")),
        "{body}"
    );
    let (status, body) = post(
        "/api/v1/allow",
        json!({"tenant": "b", "key": "k", "limit": {"algorithm": "fastest", "rate": 1}}),
    )
    .await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (400, Some("BAD_JSON")),
        "{body}"
    );
    // An array is not an object: serde would read it by position (["b", "k"] as a tenant and
    // a key), so it is refused, at the top, in a batch, and as a limit.
    for (path, bad) in [
        ("/api/v1/allow", json!(["b", "k"])),
        ("/api/v1/allow_batch", json!({"requests": [["b", "k"]]})),
        (
            "/api/v1/allow",
            json!({"tenant": "b", "key": "k", "limit": ["token_bucket", 5.0]}),
        ),
        ("/api/v1/acquire", json!(["b", "k", 1.0])),
        ("/api/v1/release", json!(["L1@x"])),
    ] {
        let (status, body) = post(path, bad).await;
        assert_eq!(
            (status, body["reason"].as_str()),
            (400, Some("BAD_JSON")),
            "{path}: {body}"
        );
        assert!(
            body["message"]
                .as_str()
                .is_some_and(|message| message.contains("expected a JSON object")),
            "{path}: {body}"
        );
    }
    // Over axum's 2 MB limit the body is too large, not bad JSON: 413.
    let padding = "x".repeat(3 << 20);
    let (status, body) = post(
        "/api/v1/allow",
        json!({"tenant": "a", "key": "k", "padding": padding}),
    )
    .await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (413, Some("BODY_TOO_LARGE")),
        "{body}"
    );

    let (status, lease) = post(
        "/api/v1/acquire",
        json!({"tenant": "a", "key": "slots", "ttl": 5}),
    )
    .await;
    assert_eq!(status, 200, "{lease}");
    assert_eq!(
        (lease["granted"].as_bool(), lease["limit"].as_u64()),
        (Some(true), Some(50))
    );
    let id = lease["lease_id"].as_str().unwrap();
    let (status, _) = post("/api/v1/renew", json!({"lease_id": id, "ttl": 10})).await;
    assert_eq!(status, 200);
    // No lease id is a missing field, as on gRPC, not bad JSON.
    for path in ["/api/v1/release", "/api/v1/renew"] {
        let (status, body) = post(path, json!({})).await;
        assert_eq!(
            (status, body["reason"].as_str()),
            (400, Some("MISSING_FIELD")),
            "{path}: {body}"
        );
    }
    // A TTL no duration holds is refused, saying so (it once said "must be ≥ 0").
    for ttl in [1e308, -1.0] {
        let (status, body) = post("/api/v1/renew", json!({"lease_id": id, "ttl": ttl})).await;
        assert_eq!(
            (status, body["reason"].as_str()),
            (400, Some("BAD_TTL")),
            "{body}"
        );
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains(&format!("got {ttl}")),
            "{body}"
        );
    }
    let (status, _) = post("/api/v1/release", json!({"lease_id": id})).await;
    assert_eq!(status, 200);
    let (status, body) = post("/api/v1/release", json!({"lease_id": id})).await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (404, Some("UNKNOWN_LEASE")),
        "{body}"
    );
    let (status, body) = post("/api/v1/acquire", json!({"tenant": "a", "key": "GET /s"})).await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (409, Some("NOT_CONCURRENT")),
        "{body}"
    );

    let (status, body) = post(
        "/api/v1/allow_batch",
        json!({"requests": [{"tenant": "a", "key": "x"}, {"tenant": "a", "key": "x", "cost": 0}]}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["results"][0]["allowed"], true, "{body}");
    assert_eq!(body["results"][1]["error"]["reason"], "BAD_COST", "{body}");
}

/// A Python process that holds `n` leases of tenant a's `slots` with `ttl`, until killed.
fn holder(grpc: &str, n: usize, ttl_seconds: u64) -> Child {
    use std::io::{BufRead, BufReader};
    let mut child = python()
        .args([grpc, "holder", &n.to_string(), &ttl_seconds.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(
        line.trim(),
        format!("held {n}"),
        "the holder could not take its leases"
    );
    child
}

/// SIGKILLs the holder, then measures how long until all `max` slots can be taken again.
async fn slots_return_after_sigkill(weir: &Weir, ttl: Duration, max: usize) -> Duration {
    let mut child = tokio::task::spawn_blocking({
        let grpc = weir.grpc.to_string();
        move || holder(&grpc, 50, ttl.as_secs())
    })
    .await
    .unwrap();
    let mut client = client(weir).await;
    let full = client
        .acquire(acquire("slots", Duration::from_secs(30)))
        .await
        .unwrap()
        .into_inner();
    assert!(!full.granted, "50 held of 50: the 51st must wait");
    child.kill().unwrap(); // SIGKILL: nothing is released.
    child.wait().unwrap();
    let killed = Instant::now();
    let mut granted = 0;
    while granted < max {
        assert!(
            killed.elapsed() < ttl + Duration::from_secs(3),
            "only {granted} of {max} slots came back"
        );
        let answer = client
            .acquire(acquire("slots", Duration::from_secs(30)))
            .await
            .unwrap()
            .into_inner();
        if answer.granted {
            granted += 1;
        } else {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    killed.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_holders_slots_return_within_ttl_plus_one_second() {
    let weir = Weir::with_overrides(OVERRIDES).await;
    let ttl = Duration::from_secs(2);
    let back = slots_return_after_sigkill(&weir, ttl, 50).await;
    eprintln!("local leases: all 50 slots back {back:?} after SIGKILL (TTL {ttl:?})");
    assert!(back <= ttl + Duration::from_secs(1), "{back:?}");
}

#[path = "../redis-store/tests/redis_server.rs"]
mod redis_server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_shared_a_sigkilled_holders_leases_expire_in_redis() {
    let redis = redis_server::RedisServer::start();
    let url = redis.url();
    let weir = Weir::start(Options {
        overrides: OVERRIDES.replace(
            "  a:\n",
            "  a:\n    rate_limit_strategy: shared\n    on_store_failure: closed\n",
        ),
        configure: Box::new(move |config| config.store_url = vec![url]),
        ..Options::default()
    })
    .await;
    let ttl = Duration::from_secs(2);
    let back = slots_return_after_sigkill(&weir, ttl, 50).await;
    eprintln!("leases in Redis: all 50 slots back {back:?} after SIGKILL (TTL {ttl:?})");
    assert!(back <= ttl + Duration::from_secs(1), "{back:?}");
    // The leases are in Redis, a sorted set scored by deadline.
    let held: u64 = redis.cli(&["ZCARD", "weir:{a}:k:slots:c"]).parse().unwrap();
    assert_eq!(held, 50);
}

#[tokio::test]
async fn a_tenants_pushes_in_flight_are_capped_before_the_body_is_read() {
    let weir = Weir::with_overrides(OVERRIDES).await;
    // Two pushes whose bodies never finish hold both of tenant p's slots.
    let body = weir::remote_write::prompb::WriteRequest::synthetic(1, 1, 1).encode_snappy();
    let mut stuck = Vec::new();
    for _ in 0..2 {
        let mut request = RawRequest::start_push(weir.addr, "p", body.len()).await;
        request.send(&body[..1]).await;
        stuck.push(request);
    }
    // Both have taken their slots before the probe: each connection is served by its own
    // worker, and a probe that ran before a stuck push's handler would take the slot itself
    // (the stuck push then refused, and the probes passing forever).
    let seen = weir
        .eventually(Duration::from_secs(5), || async {
            weir.metric(r#"weir_distributor_requests_in_total{user="p"}"#)
                .await
                == Some(2.0)
        })
        .await;
    assert!(seen, "the two stuck pushes never reached the push path");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waited = weir
        .eventually(Duration::from_secs(5), || async {
            weir.status("p", 1).await == 429
        })
        .await;
    assert!(waited, "a third push was admitted while two were in flight");
    let series =
        r#"weir_discarded_requests_total{reason="too_many_inflight_push_requests",user="p"}"#;
    let before = weir.metric(series).await.unwrap();
    let refused = weir.push("p", 1).await;
    assert_eq!(refused.status(), 429);
    // A slot frees in milliseconds: no Retry-After, so the client's own short backoff rules.
    assert!(!refused.headers().contains_key("retry-after"));
    let text = refused.text().await.unwrap();
    assert!(text.contains("max_inflight_push_requests"), "{text}");
    assert!(text.contains("limit of 2"), "{text}");
    assert_eq!(weir.metric(series).await, Some(before + 1.0));
    // Other tenants are not affected; a finished push gives its slot back.
    assert_eq!(weir.status("other", 1).await, 200);
    drop(stuck);
    let freed = weir
        .eventually(Duration::from_secs(5), || async {
            weir.status("p", 1).await == 200
        })
        .await;
    assert!(freed, "the slots of the abandoned pushes never came back");
}

//! The push API over real HTTP against a real weir: every status code, its body and headers,
//! and exact token-bucket sequences under a hand-driven clock.

mod common;

use std::time::Duration;

use common::{Options, Weir};
use weir::rejection::RetryAfterMode;
use weir::remote_write::prompb::WriteRequest;

const LIMITED: &str = "overrides:
  t:
    ingestion_rate: 10
    ingestion_burst_size: 30
    request_rate: 2
    request_burst_size: 3
";

async fn limited() -> Weir {
    Weir::start(Options {
        overrides: LIMITED.into(),
        manual_clock: true,
        ..Options::default()
    })
    .await
}

#[tokio::test]
async fn valid_push_is_admitted_and_counted() {
    let weir = Weir::with_overrides("").await;
    let response = weir.push("tenant-1", 20).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        weir.metric("weir_distributor_received_samples_total{user=\"tenant-1\"}")
            .await,
        Some(20.0)
    );
    assert_eq!(
        weir.metric("weir_distributor_received_requests_total{user=\"tenant-1\"}")
            .await,
        Some(1.0)
    );
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn tenant_errors() {
    let weir = Weir::with_overrides("").await;
    let body = || WriteRequest::synthetic(1, 1, 1).encode_snappy();

    // An empty header is no header, as in dskit (Mimir's): 401.
    for tenant in [None, Some("")] {
        let missing = weir.push_body(tenant, body()).await;
        assert_eq!(missing.status(), 401, "{tenant:?}");
        assert_eq!(
            missing.text().await.unwrap(),
            "no tenant ID: set the X-Scope-OrgID header\n"
        );
    }

    for (tenant, expected) in [
        (".", "tenant ID is '.' or '..'"),
        ("..", "tenant ID is '.' or '..'"),
        ("a/b", "unsupported character '/'"),
        ("a|b", "unsupported character '|'"),
        (&"x".repeat(151), "too long: 151 bytes, max 150"),
    ] {
        let response = weir.push_body(Some(tenant), body()).await;
        assert_eq!(response.status(), 400, "{tenant:?}");
        let text = response.text().await.unwrap();
        assert!(text.contains(expected), "{tenant:?}: {text}");
    }
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn single_tenant_mode_maps_requests_without_a_header() {
    let weir = Weir::start(Options {
        configure: Box::new(|config| config.no_auth_tenant = Some("anonymous".into())),
        ..Options::default()
    })
    .await;
    let response = weir
        .push_body(None, WriteRequest::synthetic(3, 1, 1).encode_snappy())
        .await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        weir.metric("weir_distributor_received_samples_total{user=\"anonymous\"}")
            .await,
        Some(3.0)
    );
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn malformed_bodies_get_400_with_the_reason() {
    let weir = Weir::with_overrides("").await;
    let valid_snappy_of = |raw: &[u8]| snap::raw::Encoder::new().compress_vec(raw).unwrap();
    for (body, expected) in [
        (b"not snappy at all".to_vec(), "invalid snappy block"),
        (Vec::new(), "invalid snappy block"),
        (
            valid_snappy_of(b"\x0a\x05\x0a"),
            "claims 5 bytes but only 1 remain",
        ),
        (
            valid_snappy_of(b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"),
            "invalid protobuf",
        ),
    ] {
        let response = weir.push_body(Some("t"), body.clone()).await;
        assert_eq!(response.status(), 400, "{body:?}");
        let text = response.text().await.unwrap();
        assert!(text.contains(expected), "{body:?}: {text}");
    }
    assert_eq!(
        weir.metric("weir_discarded_requests_total{reason=\"invalid_request_body\",user=\"t\"}")
            .await,
        Some(4.0)
    );
    // An empty but valid WriteRequest is fine: nothing to count, nothing to refuse; so is a
    // series with no labels, which Mimir drops silently.
    for body in [b"".as_slice(), b"\x0a\x00"] {
        let response = weir.push_body(Some("t"), valid_snappy_of(body)).await;
        assert_eq!(response.status(), 200, "{body:?}");
    }
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn oversized_bodies_get_413() {
    let weir = Weir::start(Options {
        configure: Box::new(|config| config.max_request_body_size = 10_000),
        ..Options::default()
    })
    .await;

    // Declared too large by Content-Length.
    let response = weir.push_body(Some("t"), vec![0; 10_001]).await;
    assert_eq!(response.status(), 413);
    assert!(response
        .text()
        .await
        .unwrap()
        .contains("over the limit of 10000 bytes"));

    // Small on the wire, too large once decompressed (a zip bomb in miniature).
    let bomb = snap::raw::Encoder::new()
        .compress_vec(&[0u8; 100_000])
        .unwrap();
    assert!(bomb.len() < 10_000);
    let response = weir.push_body(Some("t"), bomb).await;
    assert_eq!(response.status(), 413);
    assert!(response
        .text()
        .await
        .unwrap()
        .contains("decompressed body is 100000 bytes"));

    // Chunked, with no Content-Length: cut off while reading.
    let mut chunked = common::RawRequest::connect(weir.addr).await;
    chunked
        .send(b"POST /api/v1/push HTTP/1.1\r\nHost: weir\r\nX-Scope-OrgID: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await;
    for _ in 0..2 {
        chunked
            .send(format!("1770\r\n{}\r\n", "a".repeat(6000)).as_bytes())
            .await;
    }
    chunked.send(b"0\r\n\r\n").await;
    assert!(chunked.response().await.starts_with("HTTP/1.1 413"));
    assert_eq!(
        weir.metric("weir_discarded_requests_total{reason=\"request_body_too_large\",user=\"t\"}")
            .await,
        Some(3.0)
    );
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn request_rate_429_names_the_fleet_limit_with_headers() {
    let weir = limited().await;
    for _ in 0..3 {
        assert_eq!(weir.status("t", 1).await, 200);
    }
    let response = weir.push("t", 1).await;
    assert_eq!(response.status(), 429);
    let headers = response.headers().clone();
    // The next token is half a second away: no Retry-After (the client's own backoff is
    // nearer the truth than a whole second), and t rounds down to 0.
    assert!(!headers.contains_key("retry-after"), "{headers:?}");
    assert_eq!(
        headers["ratelimit-policy"],
        "\"tenant-request-rate\";q=2;w=1"
    );
    assert_eq!(headers["ratelimit"], "\"tenant-request-rate\";r=0;t=0");
    assert_eq!(headers["content-type"], "text/plain; charset=utf-8");
    let body = response.text().await.unwrap();
    assert!(
        body.contains("set to 2 requests/s across all replicas"),
        "{body}"
    );
    assert!(body.contains("burst of 3"), "{body}");
    assert!(body.contains("err-weir-tenant-max-request-rate"), "{body}");
    assert!(
        body.contains("request_rate and request_burst_size"),
        "{body}"
    );
    assert_eq!(
        weir.metric("weir_discarded_requests_total{reason=\"rate_limited\",user=\"t\"}")
            .await,
        Some(1.0)
    );
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn retry_after_grows_with_retry_attempt_in_backoff_mode() {
    let weir = Weir::start(Options {
        overrides: LIMITED.into(),
        manual_clock: true,
        configure: Box::new(|config| config.retry_after = RetryAfterMode::Backoff),
    })
    .await;
    for _ in 0..3 {
        weir.push("t", 1).await;
    }
    let response = weir
        .client
        .post(weir.url("/api/v1/push"))
        .header("X-Scope-OrgID", "t")
        .header("Retry-Attempt", "4")
        .body(WriteRequest::synthetic(1, 1, 1).encode_snappy())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (24..=72).contains(&retry_after),
        "6 × 2³ ± 50 %: {retry_after}"
    );
    weir.stop().await.unwrap();
}

/// Every refusal's Retry-After against a token bucket written here (100/s, burst 300) and fed
/// the same schedule: a wait under a second has no header; a longer one is answered with at
/// least the wait and at most 1.25 s more. Time moves in steps of 10 ms (one token), so the
/// model's arithmetic is exact.
#[tokio::test]
async fn truthful_retry_after_matches_a_bucket_fed_the_same_schedule() {
    let weir = Weir::start(Options {
        overrides: "overrides:\n  sched:\n    ingestion_rate: 100\n    ingestion_burst_size: 300\n    request_rate: 0\n".into(),
        manual_clock: true,
        ..Options::default()
    })
    .await;
    let (rate, burst) = (100u64, 300u64);
    let mut tokens = burst;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |bound: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % bound
    };
    let (mut refused, mut with_header) = (0, 0);
    for step in 0..200 {
        let ticks = next(60); // 0 to 590 ms
        weir.advance(Duration::from_millis(ticks * 10));
        tokens = (tokens + ticks * rate / 100).min(burst);
        let cost = 1 + next(burst);
        let response = weir.push("sched", cost as usize).await;
        if cost <= tokens {
            assert_eq!(response.status(), 200, "step {step}: {cost} of {tokens}");
            tokens -= cost;
            continue;
        }
        assert_eq!(response.status(), 429, "step {step}: {cost} of {tokens}");
        refused += 1;
        let wait = (cost - tokens) as f64 / rate as f64;
        let header = response.headers().get("retry-after");
        let t: f64 = response.headers()["ratelimit"]
            .to_str()
            .unwrap()
            .rsplit_once("t=")
            .unwrap()
            .1
            .parse()
            .unwrap();
        match header {
            None => {
                assert!(
                    wait < 1.0,
                    "step {step}: no Retry-After for a wait of {wait} s"
                );
                assert_eq!(t, 0.0);
            }
            Some(value) => {
                with_header += 1;
                let seconds: f64 = value.to_str().unwrap().parse().unwrap();
                assert!(
                    wait >= 1.0 && seconds >= wait && seconds <= wait + 1.25,
                    "step {step}: Retry-After {seconds} for a wait of {wait} s"
                );
                assert_eq!(t, seconds, "RateLimit's t agrees with Retry-After");
            }
        }
    }
    assert!(
        refused > 20 && with_header > 5,
        "{refused} refused, {with_header} with a header"
    );
    weir.stop().await.unwrap();
}

/// With the default --max-admission-delay (1 s), a push that would pass within it is held and
/// admitted; one that would wait longer is refused at once, with the wait in Retry-After.
#[tokio::test]
async fn a_push_that_would_pass_within_the_delay_is_held_not_refused() {
    let weir = Weir::start(Options {
        overrides: "overrides:\n  h:\n    ingestion_rate: 100\n    ingestion_burst_size: 200\n    request_rate: 0\n".into(),
        configure: Box::new(|config| config.max_admission_delay = Duration::from_secs(1)),
        ..Options::default()
    })
    .await;
    assert_eq!(weir.status("h", 200).await, 200);
    let started = std::time::Instant::now();
    assert_eq!(weir.status("h", 50).await, 200);
    let held = started.elapsed();
    assert!(
        held >= Duration::from_millis(400) && held < Duration::from_secs(1),
        "held {held:?} for 50 tokens at 100/s"
    );
    assert_eq!(
        weir.metric("weir_distributor_admission_delay_seconds_count")
            .await,
        Some(1.0)
    );
    let started = std::time::Instant::now();
    let response = weir.push("h", 200).await;
    assert_eq!(response.status(), 429);
    assert!(
        started.elapsed() < Duration::from_millis(200),
        "refused at once"
    );
    let seconds: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (2..=3).contains(&seconds),
        "about 2 s to refill 200 at 100/s: {seconds}"
    );
    weir.stop().await.unwrap();
}

/// A push held for its request token and then for its ingestion tokens waits no longer than
/// --max-admission-delay in all: the second hold has what the first left of it.
#[tokio::test]
async fn a_push_held_twice_waits_no_longer_than_the_delay_in_all() {
    let weir = Weir::start(Options {
        overrides: "overrides:\n  d:\n    request_rate: 1\n    request_burst_size: 1\n    \
                    ingestion_rate: 50\n    ingestion_burst_size: 100\n"
            .into(),
        configure: Box::new(|config| config.max_admission_delay = Duration::from_millis(1500)),
        ..Options::default()
    })
    .await;
    assert_eq!(weir.status("d", 100).await, 200);
    // About 1 s for a request token (held), then 2 s from the start for 100 samples at 50/s:
    // past the delay, so refused when the second wait is known, not held to 2 s.
    let started = std::time::Instant::now();
    let response = weir.push("d", 100).await;
    let answered = started.elapsed();
    assert_eq!(response.status(), 429);
    assert!(
        answered >= Duration::from_millis(800) && answered < Duration::from_millis(1400),
        "held for the request token, then refused: {answered:?}"
    );
    assert_eq!(
        response.headers()["ratelimit-policy"],
        "\"tenant-ingestion-rate\";q=50;w=1"
    );
    weir.stop().await.unwrap();
}

/// One tenant over its limit cannot fill the replica with held pushes: it holds at most a
/// tenth of the in-flight cap (here 1 of 4), the rest of its pushes are answered at once,
/// and another tenant's push still finds room.
#[tokio::test]
async fn one_tenant_s_held_pushes_leave_room_for_the_others() {
    let weir = Weir::start(Options {
        overrides:
            "overrides:\n  noisy:\n    ingestion_rate: 10\n    ingestion_burst_size: 10\n    \
                    request_rate: 0\ndistributor_limits:\n  max_inflight_push_requests: 4\n"
                .into(),
        configure: Box::new(|config| config.max_admission_delay = Duration::from_secs(5)),
        ..Options::default()
    })
    .await;
    assert_eq!(weir.status("noisy", 10).await, 200);
    // Each of these needs 1 s more of the refill: without the bound, four would be held and
    // fill the in-flight cap.
    let weir = std::sync::Arc::new(weir);
    let mut pushes = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let weir = std::sync::Arc::clone(&weir);
        pushes.spawn(async move {
            let started = std::time::Instant::now();
            let status = weir.push("noisy", 10).await.status();
            (status, started.elapsed())
        });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let victim = weir.push("victim", 1).await.status();
    let noisy = pushes.join_all().await;
    assert_eq!(
        victim, 200,
        "another tenant's push is not refused: {noisy:?}"
    );
    let held: Vec<_> = noisy.iter().filter(|(status, _)| *status == 200).collect();
    let refused: Vec<_> = noisy.iter().filter(|(status, _)| *status == 429).collect();
    assert_eq!(held.len() + refused.len(), 6, "{noisy:?}");
    assert_eq!(
        held.len(),
        1,
        "one held (a tenth of 4, at least one): {noisy:?}"
    );
    assert!(
        refused
            .iter()
            .all(|(_, took)| *took < Duration::from_millis(500)),
        "the rest answered at once: {noisy:?}"
    );
    let weir = std::sync::Arc::into_inner(weir).expect("every push answered");
    weir.stop().await.unwrap();
}

/// A push with nothing in it is answered before the ingestion limit, as Mimir answers it:
/// 200 even for a tenant whose limit is 0, which refuses any sample.
#[tokio::test]
async fn an_empty_push_is_answered_before_the_ingestion_limit() {
    let weir = Weir::with_overrides("overrides:\n  blocked:\n    ingestion_rate: 0\n").await;
    let empty = WriteRequest::default().encode_snappy();
    assert_eq!(weir.push_body(Some("blocked"), empty).await.status(), 200);
    assert_eq!(weir.status("blocked", 1).await, 429);
    weir.stop().await.unwrap();
}

/// Ingestion bucket: 10 samples/s, burst 30. Request bucket: 2/s, burst 3.
#[tokio::test]
async fn exact_token_sequence_over_http() {
    let weir = limited().await;
    assert_eq!(weir.status("t", 20).await, 200); // 10 samples left
    assert_eq!(weir.status("t", 10).await, 200); // 0 left
    weir.advance(Duration::from_millis(500)); // +1 request token, +5 samples
    let response = weir.push("t", 6).await;
    assert_eq!(response.status(), 429);
    assert_eq!(
        response.headers()["ratelimit"],
        "\"tenant-ingestion-rate\";r=5;t=0"
    );
    let body = response.text().await.unwrap();
    assert!(
        body.contains("set to 10 items/s with a maximum allowed burst of 30"),
        "{body}"
    );
    assert!(
        body.contains("err-weir-tenant-max-ingestion-rate"),
        "{body}"
    );
    assert_eq!(weir.status("t", 5).await, 200); // exactly what refilled
                                                // Request tokens: 3 at start, 4 requests so far, +1 after 500 ms → the bucket is empty.
    assert_eq!(weir.status("t", 0).await, 429);
    weir.advance(Duration::from_millis(500));
    assert_eq!(
        weir.status("t", 5).await,
        200,
        "1 request token and 5 samples refilled"
    );
    assert_eq!(weir.status("t", 0).await, 429, "no request token left");
    // Mimir's reasons: `rate_limited` for the request rate; a push refused for its samples is
    // weir's `ingestion_rate_limited` (Mimir counts only its samples).
    for (reason, refused) in [("rate_limited", 2.0), ("ingestion_rate_limited", 1.0)] {
        let series = format!("weir_discarded_requests_total{{reason=\"{reason}\",user=\"t\"}}");
        assert_eq!(weir.metric(&series).await, Some(refused), "{reason}");
    }
    assert_eq!(
        weir.metric("weir_discarded_samples_total{reason=\"rate_limited\",user=\"t\"}")
            .await,
        Some(6.0)
    );
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn request_larger_than_burst_gets_its_own_message() {
    let weir = limited().await;
    let response = weir.push("t", 31).await;
    assert_eq!(response.status(), 429);
    let body = response.text().await.unwrap();
    assert!(
        body.contains("carries 31 items, more than the tenant's ingestion burst size of 30"),
        "{body}"
    );
    assert!(body.contains("can never pass"), "{body}");
    assert!(
        body.contains("err-weir-tenant-max-ingestion-burst-size"),
        "{body}"
    );
    // It cost nothing: the whole burst is still there.
    assert_eq!(weir.status("t", 30).await, 200);
    assert_eq!(
        weir.metric("weir_discarded_samples_total{reason=\"ingestion_burst_exceeded\",user=\"t\"}")
            .await,
        Some(31.0)
    );
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn other_routes_and_methods() {
    let weir = Weir::with_overrides(LIMITED).await;
    let get = |path: &str| weir.client.get(weir.url(path)).send();
    assert_eq!(get("/api/v1/push").await.unwrap().status(), 405);
    assert_eq!(get("/nope").await.unwrap().status(), 404);
    assert_eq!(get("/health").await.unwrap().status(), 200);
    assert_eq!(get("/ready").await.unwrap().status(), 200);
    let diff = get("/runtime_config?mode=diff")
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        diff,
        "overrides:\n  t:\n    ingestion_rate: 10.0\n    ingestion_burst_size: 30\n    \
         request_rate: 2.0\n    request_burst_size: 3\ndistributor_limits: {}\n"
    );
    let full = get("/runtime_config").await.unwrap().text().await.unwrap();
    assert!(
        full.starts_with("defaults:\n  ingestion_rate: 10000.0"),
        "{full}"
    );
    assert_eq!(
        get("/runtime_config?mode=bogus").await.unwrap().status(),
        400
    );
    weir.stop().await.unwrap();
}

#[tokio::test]
async fn tenant_cap_refuses_new_tenants_with_429() {
    let weir = Weir::start(Options {
        configure: Box::new(|config| config.max_tenants = 1),
        ..Options::default()
    })
    .await;
    assert_eq!(weir.status("first", 1).await, 200);
    let refused = weir.push("second", 1).await;
    assert_eq!(refused.status(), 429);
    let body = refused.text().await.unwrap();
    assert!(
        body.contains("the number of tenants it tracks, 1"),
        "{body}"
    );
    assert!(body.contains("--max-tenants"), "{body}");
    assert_eq!(weir.status("first", 1).await, 200);
    assert_eq!(
        weir.metric(
            "weir_distributor_instance_rejected_requests_total{reason=\"distributor_max_tenants\"}"
        )
        .await,
        Some(1.0)
    );
    weir.stop().await.unwrap();
}

/// `/metrics` is gzip-compressed for a scraper that accepts it (Prometheus does), and the
/// decompressed text is the same exposition; without the header, or with `gzip;q=0`, it is
/// plain text.
#[tokio::test]
async fn metrics_are_gzipped_when_the_scraper_accepts_it() {
    use std::io::Read;
    let weir = Weir::with_overrides("").await;
    for tenant in ["a", "b", "c"] {
        assert_eq!(weir.status(tenant, 5).await, 200);
    }
    let client = reqwest::Client::new();
    let fetch = |accept: Option<&'static str>| {
        let mut request = client.get(weir.url("/metrics"));
        if let Some(accept) = accept {
            request = request.header("Accept-Encoding", accept);
        }
        request.send()
    };

    let plain = fetch(None).await.unwrap();
    assert!(plain.headers().get("content-encoding").is_none());
    let plain = plain.text().await.unwrap();

    let zipped = fetch(Some("deflate, gzip;q=1.0, *;q=0.5")).await.unwrap();
    assert_eq!(zipped.headers()["content-encoding"], "gzip");
    let bytes = zipped.bytes().await.unwrap();
    let mut text = String::new();
    flate2::read::GzDecoder::new(&bytes[..])
        .read_to_string(&mut text)
        .unwrap();
    assert!(bytes.len() < text.len());
    // The process families move between two scrapes; the tenant families do not.
    let tenants = |text: &str| {
        let start = text
            .find("# HELP weir_distributor_requests_in_total")
            .unwrap();
        text[start..].to_string()
    };
    assert_eq!(tenants(&text), tenants(&plain));
    assert!(text.contains("weir_distributor_received_samples_total{user=\"b\"} 5\n"));

    let refused = fetch(Some("gzip;q=0")).await.unwrap();
    assert!(refused.headers().get("content-encoding").is_none());
}

/// A large `/runtime_config` is written off the async workers and sent in chunks: what
/// arrives is the whole page, every tenant once with its value, whatever the chunk bounds.
#[tokio::test]
async fn a_large_runtime_config_page_arrives_whole() {
    let tenants = 3_000;
    let mut file = String::from("overrides:\n");
    for i in 0..tenants {
        file.push_str(&format!("  t{i}:\n    ingestion_rate: {}\n", 1_000 + i));
    }
    let weir = Weir::with_overrides(&file).await;
    for path in ["/runtime_config?mode=diff", "/runtime_config"] {
        let page = weir
            .client
            .get(weir.url(path))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            page.len() > 3 * weir::metrics::SCRAPE_CHUNK_BYTES,
            "{path}: several chunks"
        );
        let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(&page).unwrap();
        let overrides = yaml["overrides"].as_mapping().unwrap();
        assert_eq!(overrides.len(), tenants, "{path}");
        for i in 0..tenants {
            assert_eq!(
                overrides[format!("t{i}").as_str()]["ingestion_rate"].as_f64(),
                Some((1_000 + i) as f64),
                "{path}: t{i}"
            );
        }
        assert!(
            yaml["distributor_limits"].is_mapping(),
            "{path}: the page ends"
        );
    }
    weir.stop().await.unwrap();
}

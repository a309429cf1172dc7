//! Mimir's `ingestion_artificial_delay` on a real weir process forwarding to a receiver served
//! by this test, over real HTTP:
//!
//! - a push to a delayed tenant is answered no sooner than its delay, less a tenth (Mimir's
//!   jitter), and a success says how long it waited in `Server-Timing: artificial_delay;dur=`;
//! - a refused push to it waits too, without the header, as Mimir's does;
//! - a tenant without a delay, or with 0, is answered at once, without the header;
//! - OTLP exports wait as remote-write pushes do;
//! - a waiting push holds no in-flight slot: with the replica's in-flight cap at 1, a push
//!   started while another waits is admitted.

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::fleet::forwarding_to;
use common::receiver::Receiver;
use common::series;
use weir::remote_write::prompb::WriteRequest;

const DELAY: Duration = Duration::from_millis(400);

const OVERRIDES: &str = "\
distributor_limits:
  max_inflight_push_requests: 1
overrides:
  slow:
    ingestion_artificial_delay: 400ms
  zero:
    ingestion_artificial_delay: 0s
  slower:
    ingestion_artificial_delay: 2s
";

fn body() -> Vec<u8> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    WriteRequest {
        timeseries: vec![series(&[("__name__", "up"), ("job", "a")], &[now])],
        metadata: vec![],
    }
    .encode_snappy()
}

/// The answer's status, its `Server-Timing` header, and how long it took.
async fn timed(request: reqwest::RequestBuilder) -> (u16, Option<String>, Duration) {
    let started = Instant::now();
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let timing = response
        .headers()
        .get("server-timing")
        .map(|value| value.to_str().unwrap().to_string());
    response.bytes().await.unwrap();
    (status, timing, started.elapsed())
}

/// The milliseconds a `Server-Timing: artificial_delay;dur=…` header says were waited.
fn waited(timing: &str) -> f64 {
    timing
        .strip_prefix("artificial_delay;dur=")
        .unwrap_or_else(|| panic!("{timing}"))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_tenant_is_answered_after_its_delay_without_holding_capacity() {
    let receiver = Receiver::default();
    let upstream = receiver.serve().await;
    let (replica, _dir) = forwarding_to(upstream, OVERRIDES, 62, "delay", &[]).await;
    let base = format!("http://{}", replica.http);
    let client = reqwest::Client::new();
    let push =
        |tenant: &str, body: Vec<u8>| common::push_request(&client, &base, Some(tenant), body);
    let floor = DELAY.mul_f64(0.9);

    // A success: no sooner than the delay less a tenth, and it says what it waited.
    let (status, timing, took) = timed(push("slow", body())).await;
    assert_eq!(status, 200);
    assert!(took >= floor, "answered after {took:?}");
    let timing = timing.expect("a delayed success says what it waited");
    let ms = waited(&timing);
    assert!(
        ms > 0.0 && ms <= DELAY.as_secs_f64() * 1100.0 && ms <= took.as_secs_f64() * 1000.0,
        "{timing} in {took:?}"
    );
    assert_eq!(receiver.take_bodies().len(), 1, "forwarded");

    // A refusal (a body that is not snappy) waits as long, and says nothing of it.
    let (status, timing, took) = timed(push("slow", b"not snappy".to_vec())).await;
    assert_eq!(status, 400);
    assert!(took >= floor, "refused after {took:?}");
    assert_eq!(timing, None);

    // No delay, or 0: no header (and no wait to speak of).
    for tenant in ["fast", "zero"] {
        let (status, timing, _) = timed(push(tenant, body())).await;
        assert_eq!(status, 200, "{tenant}");
        assert_eq!(timing, None, "{tenant}");
    }
    receiver.take_bodies();

    // OTLP: an empty export, answered 200 after the delay.
    let otlp = client
        .post(format!("{base}/otlp/v1/metrics"))
        .header("Content-Type", "application/x-protobuf")
        .header("X-Scope-OrgID", "slow")
        .body(Vec::new());
    let (status, timing, took) = timed(otlp).await;
    assert_eq!(status, 200);
    assert!(took >= floor, "OTLP answered after {took:?}");
    assert!(timing.is_some_and(|timing| waited(&timing) > 0.0));
    receiver.take_bodies();

    // In-flight cap 1. A push waiting out its delay holds no slot: while the first waits,
    // the replica counts nothing in flight, and a second push is admitted. (Holding the
    // slot while waiting would count it, and refuse the second.)
    let first = tokio::spawn(timed(push("slower", body())));
    let inflight = "weir_distributor_inflight_push_requests";
    common::wait_until(
        "the first push forwarded, and waiting",
        Duration::from_millis(1_500),
        || async {
            common::metric_at(&client, &base, inflight).await == Some(0.0)
                && receiver.take_bodies().len() == 1
        },
    )
    .await;
    assert!(!first.is_finished(), "the first push is still waiting");
    let (status, _, _) = timed(push("fast", body())).await;
    assert_eq!(status, 200, "a waiting push held the in-flight slot");
    let (status, _, took) = first.await.unwrap();
    assert_eq!(status, 200);
    assert!(took >= Duration::from_millis(1_800));
    assert_eq!(receiver.take_bodies().len(), 1, "the second push forwarded");
}

/// A refusal's `Retry-After` counts from when the answer is sent, after the delay: a push
/// refused for a request rate of one per 10 s, 3 s after the one that passed, would pass in
/// about 7 s when refused, and in about 4 s when its answer leaves 3 s later.
#[tokio::test]
async fn a_delayed_refusal_tells_the_truth_about_when_to_come_back() {
    let weir = common::Weir::with_overrides(
        "overrides:\n  slow:\n    request_rate: 0.1\n    request_burst_size: 1\n    \
         ingestion_artificial_delay: 3s\n",
    )
    .await;
    let base = weir.url("");
    let push = || common::push_request(&weir.client, &base, Some("slow"), body());
    let (status, _, _) = timed(push()).await;
    assert_eq!(status, 200);
    let started = Instant::now();
    let response = push().send().await.unwrap();
    assert_eq!(response.status(), 429);
    assert!(
        started.elapsed() >= Duration::from_millis(2_700),
        "the refusal waited too"
    );
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (3..=5).contains(&retry_after),
        "Retry-After {retry_after}: about 4 s were left when the answer was sent"
    );
    weir.stop().await.unwrap();
}

//! A push whose forward wrote nothing is not charged (issue: "charge what reaches the
//! backend"), measured on real processes: a weir process forwards to a receiver served by this
//! test, which fails (503) for a while and then recovers, while a sender offers twice the
//! tenant's limit throughout. Under each strategy (`shared` on a real `redis-server` started
//! here), the test checks:
//!
//! - **No throttling after the outage.** The pushes refused during it were given back, so the
//!   bucket is full when the receiver returns: in the 2 s after, the receiver gets what the
//!   sender offers (4 000 samples: a full bucket of 3 000 plus 2 s of refill covers it). Had
//!   the failed forwards been charged, the bucket would be empty and the receiver would get
//!   the refill only, about 2 000.
//! - **Never more than the limit.** Since the receiver returned, and over the whole run, it
//!   gets at most B + L·t (+ one push, and 0.2 s of slack since the return); after the outage
//!   the sender is over the limit long enough to be refused. (`shared` once kept refunded
//!   tokens in its lease, beside a full store bucket, and broke this by 4 pushes.)
//! - weir counts the given-back pushes (`weir_distributor_refunded_requests_total`).

mod common;

#[path = "../redis-store/tests/redis_server.rs"]
mod redis_server;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use common::fleet::forwarding_to;
use weir::remote_write::prompb::WriteRequest;

/// The tenant's limit: L samples/s, burst B.
const LIMIT: u64 = 1_000;
const BURST: u64 = 3_000;
/// Each push carries this many samples; the sender sends one every 50 ms (2 L).
const PUSH: u64 = 100;
const EVERY: Duration = Duration::from_millis(50);

const BEFORE: Duration = Duration::from_secs(4);
const OUTAGE: Duration = Duration::from_secs(20);
const AFTER: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_gives_back_what_a_failed_forward_took() {
    outage("weighted", 41, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn divided_gives_back_what_a_failed_forward_took() {
    outage("divided", 42, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_gives_back_what_a_failed_forward_took() {
    let redis = redis_server::RedisServer::start();
    outage("shared", 43, &["--store-url", &redis.url()]).await;
}

/// What the receiver got: (when, samples) per push it accepted.
#[derive(Clone, Default)]
struct Receiver {
    failing: Arc<AtomicBool>,
    accepted: Arc<Mutex<Vec<(Instant, u64)>>>,
    refused: Arc<AtomicU64>,
}

async fn receive(State(receiver): State<Receiver>, body: axum::body::Bytes) -> StatusCode {
    if receiver.failing.load(Ordering::SeqCst) {
        receiver.refused.fetch_add(1, Ordering::Relaxed);
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let samples = snap::raw::Decoder::new()
        .decompress_vec(&body)
        .ok()
        .and_then(|raw| <WriteRequest as prost::Message>::decode(raw.as_slice()).ok())
        .map_or(0, |request| request.counts().samples);
    receiver
        .accepted
        .lock()
        .unwrap()
        .push((Instant::now(), samples));
    StatusCode::NO_CONTENT
}

impl Receiver {
    /// Samples accepted in [from, to).
    fn samples_between(&self, from: Instant, to: Instant) -> u64 {
        self.accepted
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| *at >= from && *at < to)
            .map(|(_, samples)| samples)
            .sum()
    }
}

async fn outage(strategy: &str, ip: u8, extra: &[&str]) {
    let receiver = Receiver::default();
    let app = Router::new()
        .route("/api/v1/write", post(receive))
        .with_state(receiver.clone());
    let upstream = common::serve_on_loopback(app).await;

    let overrides = format!(
        "overrides:\n  t:\n    ingestion_rate: {LIMIT}\n    ingestion_burst_size: {BURST}\n    \
         rate_limit_strategy: {strategy}\n"
    );
    let (replica, _dir) = forwarding_to(
        upstream,
        &overrides,
        ip,
        &format!("refunds-{strategy}"),
        extra,
    )
    .await;
    let base = format!("http://{}", replica.http);

    // The sender: a push every 50 ms, each on its own task, for the whole run.
    let client = reqwest::Client::new();
    let body = WriteRequest::synthetic(PUSH as usize, 1, 1).encode_snappy();
    let start = Instant::now();
    let total = BEFORE + OUTAGE + AFTER;
    let statuses = Arc::new(Mutex::new(Vec::new()));
    let mut sends = Vec::new();
    let mut tick = tokio::time::interval(EVERY);
    let mut outage_started = None;
    let mut outage_ended = None;
    while start.elapsed() < total {
        tick.tick().await;
        let elapsed = start.elapsed();
        if outage_started.is_none() && elapsed >= BEFORE {
            receiver.failing.store(true, Ordering::SeqCst);
            outage_started = Some(Instant::now());
        }
        if outage_ended.is_none() && elapsed >= BEFORE + OUTAGE {
            receiver.failing.store(false, Ordering::SeqCst);
            outage_ended = Some(Instant::now());
        }
        let (client, body, base, statuses) = (
            client.clone(),
            body.clone(),
            base.clone(),
            Arc::clone(&statuses),
        );
        sends.push(tokio::spawn(async move {
            let status = common::push_request(&client, &base, Some("t"), body)
                .send()
                .await
                .map(|response| response.status().as_u16())
                .unwrap_or(0);
            statuses.lock().unwrap().push(status);
        }));
    }
    let sent_for = start.elapsed();
    for send in sends {
        send.await.unwrap();
    }
    let ended = outage_ended.unwrap();

    let statuses = statuses.lock().unwrap().clone();
    let count = |status: u16| statuses.iter().filter(|s| **s == status).count();
    let refunded = common::metric_at(&client, &base, "weir_distributor_refunded_requests_total")
        .await
        .unwrap_or(0.0);
    let after = receiver.samples_between(ended, ended + Duration::from_secs(2));
    let everything = receiver.samples_between(start, Instant::now());
    // Held pushes are answered up to --max-admission-delay (3 s) after they were sent.
    let bound = BURST as f64 + LIMIT as f64 * (sent_for.as_secs_f64() + 3.0) + PUSH as f64;
    // Since the receiver returned: a full bucket and the refill, no more (+ one push, and
    // 0.2 s of refill for the scheduler: the test's clock is not weir's).
    let since_return = receiver.samples_between(ended, Instant::now());
    let return_bound =
        BURST as f64 + LIMIT as f64 * ((Instant::now() - ended).as_secs_f64() + 0.2) + PUSH as f64;
    let figures = format!(
        "strategy={strategy} pushes={} ok={} bad_gateway={} too_many={} other={} \
         receiver_refused={} refunded={refunded} samples_in_2s_after={after} \
         samples_since_return={since_return} return_bound={return_bound:.0} \
         samples_total={everything} bound={bound:.0}",
        statuses.len(),
        count(200),
        count(502),
        count(429),
        statuses.len() - count(200) - count(502) - count(429),
        receiver.refused.load(Ordering::Relaxed),
    );
    println!("refunds: {figures}");

    assert!(
        count(502) > 0 && refunded >= count(502) as f64,
        "every push refused by the receiver is given back: {figures}"
    );
    assert!(
        after >= 3_600,
        "in the 2 s after the receiver returned it got {after} samples of the 4 000 offered: \
         the failed forwards were charged ({figures})"
    );
    assert!(
        count(429) > 0,
        "the sender offers 2 L for 8 s after the outage: some pushes must be refused ({figures})"
    );
    assert!(
        since_return as f64 <= return_bound,
        "since it returned the receiver got more than B + L·t: {figures}"
    );
    assert!(
        everything as f64 <= bound,
        "the receiver got more than B + L·t: {figures}"
    );
    drop(replica);
}

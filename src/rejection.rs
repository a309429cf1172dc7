//! Why a push was refused, and the one place where each reason becomes a status code, headers
//! and a body.
//!
//! Rate-limit answers follow Mimir: 429 and a body that names the limit **as configured for the
//! whole fleet**, the burst, a stable error id and the override to raise. They also carry the
//! IETF `RateLimit-Policy` / `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers).
//!
//! `Retry-After` tells the truth by default ([`RetryAfterMode::Truthful`]): the whole seconds
//! until the bucket will hold the request's cost, or no header when that is under a second
//! (the client's own short backoff is then closer to the truth than any whole second). A
//! sender that honours a longer answer idles its queue and comes back with a backlog, which
//! is refused again: see DESIGN.md, "The loop is closed". Mimir's jittered exponential backoff
//! on the client's `Retry-Attempt` stays available ([`RetryAfterMode::Backoff`]).

use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use rand::Rng;

use crate::counts::{DecodeError, UnsupportedMedia};
use crate::metrics::{DiscardReason, InstanceLimit};
use crate::tenant::TenantError;
use engine::{LimitKind, Rejection, RejectionCause};

#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("{}", instance_message(*.limit, *.value))]
    Instance { limit: InstanceLimit, value: f64 },
    #[error("{0}")]
    Tenant(#[from] TenantError),
    /// Tenant authentication refused the request (`--tenant-auth`): 401, 403, 400 or 429.
    #[error("{0}")]
    Auth(#[from] crate::auth::Denied),
    #[error("{}", rate_limit_message(.0))]
    RateLimited(Rejection),
    #[error("request body is over the limit of {limit} bytes (--max-request-body-size)")]
    BodyTooLarge { limit: usize },
    #[error("{}", decode_message(.0))]
    Decode(#[from] DecodeError),
    #[error("could not read the request body: {0}")]
    ReadBody(String),
    #[error("the request body did not arrive within {timeout:?} (--body-read-timeout)")]
    BodyTimeout { timeout: std::time::Duration },
    #[error("{0}")]
    Upstream(#[from] crate::upstream::ForwardError),
    #[error("{0}")]
    UnsupportedMedia(#[from] UnsupportedMedia),
    /// Series validation refused some series (their samples are counted under their reasons);
    /// the rest was admitted and forwarded. The message is the first refusal's.
    #[error("{0}")]
    InvalidSeries(String),
    /// From an HA replica that is not the elected one of its cluster: accepted (202), not
    /// charged, not forwarded. Mimir's message.
    #[error("replicas did not match, rejecting sample: replica={replica}, elected={elected}")]
    HaDeduplicated { replica: String, elected: String },
    #[error(
        "the write request has been rejected because the maximum number of high-availability \
         (HA) clusters has been reached for this tenant (limit: {limit}) \
         (err-weir-too-many-ha-clusters). To adjust it, raise ha_max_clusters in the tenant's \
         runtime overrides."
    )]
    TooManyHaClusters { limit: u32 },
    #[error(
        "the write request has been rejected because the tenant has {in_flight} push requests \
         in flight across the fleet, at its limit of {limit} \
         (err-weir-tenant-max-inflight-push-requests). To adjust it, raise \
         max_inflight_push_requests in the tenant's runtime overrides, or send fewer pushes \
         at once."
    )]
    TenantInflight { limit: u64, in_flight: u64 },
    #[error(
        "the tenant's in-flight push limit could not be checked: the shared store is \
         unavailable and the tenant's on_store_failure policy is closed \
         (err-weir-store-unavailable)"
    )]
    InflightUnavailable,
}

impl PushError {
    pub fn status(&self) -> StatusCode {
        match self {
            PushError::RateLimited(rejection)
                if rejection.cause == RejectionCause::StoreUnavailable =>
            {
                StatusCode::SERVICE_UNAVAILABLE
            }
            PushError::Instance { .. }
            | PushError::RateLimited(_)
            | PushError::TenantInflight { .. } => StatusCode::TOO_MANY_REQUESTS,
            PushError::InflightUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            PushError::Tenant(TenantError::Missing) => StatusCode::UNAUTHORIZED,
            PushError::Auth(denied) => denied.status(),
            PushError::Tenant(_)
            | PushError::ReadBody(_)
            | PushError::InvalidSeries(_)
            | PushError::TooManyHaClusters { .. } => StatusCode::BAD_REQUEST,
            PushError::HaDeduplicated { .. } => StatusCode::ACCEPTED,
            PushError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            PushError::BodyTooLarge { .. } | PushError::Decode(DecodeError::TooLarge { .. }) => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            PushError::Decode(_) => StatusCode::BAD_REQUEST,
            PushError::Upstream(err) => err.status(),
            PushError::UnsupportedMedia(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        }
    }

    /// The `reason` this error is counted under in `weir_discarded_*{user}`, when the tenant
    /// is known.
    pub fn discard_reason(&self) -> Option<DiscardReason> {
        match self {
            PushError::RateLimited(rejection)
                if rejection.cause == RejectionCause::StoreUnavailable =>
            {
                None
            }
            PushError::RateLimited(rejection) => Some(match (rejection.kind, rejection.cause) {
                (LimitKind::Request, _) => DiscardReason::RequestRateLimited,
                (LimitKind::Ingestion, RejectionCause::LargerThanBurst) => {
                    DiscardReason::IngestionBurstExceeded
                }
                (LimitKind::Ingestion, _) => DiscardReason::RateLimited,
            }),
            PushError::BodyTooLarge { .. } | PushError::Decode(DecodeError::TooLarge { .. }) => {
                Some(DiscardReason::RequestBodyTooLarge)
            }
            PushError::Decode(_) | PushError::ReadBody(_) | PushError::BodyTimeout { .. } => {
                Some(DiscardReason::InvalidRequestBody)
            }
            PushError::TenantInflight { .. } => Some(DiscardReason::TooManyInflightPushRequests),
            PushError::TooManyHaClusters { .. } => Some(DiscardReason::TooManyHaClusters),
            PushError::InflightUnavailable
            | PushError::Instance { .. }
            | PushError::Tenant(_)
            | PushError::Auth(_)
            | PushError::Upstream(_)
            | PushError::UnsupportedMedia(_)
            | PushError::InvalidSeries(_)
            | PushError::HaDeduplicated { .. } => None,
        }
    }

    /// This refusal as it stands `waited` after it was decided (a tenant's artificial delay
    /// held its answer): the time until the request would pass is that much shorter.
    pub fn waited(self, waited: Duration) -> PushError {
        match self {
            PushError::RateLimited(mut rejection) => {
                if let RejectionCause::RateLimited { wait } = &mut rejection.cause {
                    *wait = wait.saturating_sub(waited);
                }
                PushError::RateLimited(rejection)
            }
            other => other,
        }
    }

    /// `Retry-After` in whole seconds for this refusal, or `None` for no header.
    /// `request_headers` supplies `Retry-Attempt` for Mimir's backoff.
    pub fn retry_after(
        &self,
        request_headers: &HeaderMap,
        policy: &RetryAfter,
        rng: &mut impl Rng,
    ) -> Option<u64> {
        let status = self.status();
        if status != StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
            return None;
        }
        let backoff = |rng: &mut _| {
            let attempt = request_headers
                .get("retry-attempt")
                .and_then(|value| value.to_str().ok());
            Some(policy.backoff.retry_after_seconds(attempt, rng))
        };
        if policy.mode == RetryAfterMode::Backoff {
            return backoff(rng);
        }
        match self {
            PushError::RateLimited(rejection) => match rejection.cause {
                RejectionCause::RateLimited { wait } => truthful_seconds(wait, rng),
                // Nothing short will help: the request is larger than the burst, or the limit
                // is 0. Mimir's backoff keeps such a sender from hammering.
                RejectionCause::LargerThanBurst | RejectionCause::Blocked => backoff(rng),
                // The breaker probes the store about once a second.
                RejectionCause::StoreUnavailable => Some(1),
            },
            PushError::InflightUnavailable => Some(1),
            PushError::Auth(crate::auth::Denied::Throttled { retry_after }) => {
                Some(retry_after.as_secs_f64().ceil().max(1.0) as u64)
            }
            // The receiver said when to come back: passed on as it said it.
            PushError::Upstream(err) => err.retry_after(),
            // A slot frees in milliseconds, and the upstream's own recovery, when it does not
            // say, is unknown: no header, so the client uses its own backoff (Prometheus:
            // 30 ms doubling, by default), which is nearer the truth than any whole second.
            _ => None,
        }
    }

    /// The full answer. `request_headers` supplies `Retry-Attempt` for Mimir's backoff.
    pub fn into_response_with(self, request_headers: &HeaderMap, policy: &RetryAfter) -> Response {
        let retry_after = self.retry_after(request_headers, policy, &mut rand::rng());
        let status = self.status();
        let mut response = (status, format!("{self}\n")).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if let Some(seconds) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"weir\", Basic realm=\"weir\""),
            );
        }
        // The limit's state is known unless the store could not be asked.
        if let PushError::RateLimited(rejection @ Rejection { cause, .. }) = &self {
            if *cause == RejectionCause::StoreUnavailable {
                return response;
            }
            let (policy, state) = ratelimit_fields(rejection, retry_after);
            if let (Ok(policy), Ok(state)) = (
                HeaderValue::from_str(&policy),
                HeaderValue::from_str(&state),
            ) {
                headers.insert("ratelimit-policy", policy);
                headers.insert("ratelimit", state);
            }
        }
        response
    }
}

impl From<crate::instance::InstanceRejection> for PushError {
    fn from(rejection: crate::instance::InstanceRejection) -> Self {
        PushError::Instance {
            limit: rejection.limit,
            value: rejection.value,
        }
    }
}

/// How refusals set `Retry-After` (`--retry-after`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RetryAfterMode {
    /// The time until the request could pass, in whole seconds (at least 1, with up to a
    /// quarter second of jitter); no header when that is under a second, or for in-flight
    /// and upstream failures, whose wait is unknown and usually short.
    #[default]
    Truthful,
    /// Mimir's jittered exponential backoff on `Retry-Attempt`, for every 429 and 5xx.
    Backoff,
}

/// The `Retry-After` policy: the mode, and Mimir's backoff for the cases that use it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RetryAfter {
    pub mode: RetryAfterMode,
    pub backoff: RetryBackoff,
}

/// The jitter added to a truthful `Retry-After` before rounding up: a tenth of the wait, at
/// most this. So the answer is at most 1.25 s past the truth, and senders refused together do
/// not all come back in the same second.
const MAX_TRUTHFUL_JITTER: f64 = 0.25;

/// `Retry-After` for a wait of `wait`: whole seconds, rounded up after a little jitter, or
/// `None` under a second.
pub fn truthful_seconds(wait: Duration, rng: &mut impl Rng) -> Option<u64> {
    let wait = wait.as_secs_f64();
    if wait < 1.0 {
        return None;
    }
    let jitter = rng.random_range(0.0..=(wait * 0.1).min(MAX_TRUTHFUL_JITTER));
    Some((wait + jitter).ceil() as u64)
}

/// Mimir's Retry-After backoff: `min × 2^(attempt−1)` seconds, ±50 % jitter, clamped to
/// `[min, max]`. `attempt` is the client's `Retry-Attempt` header (1 when absent or invalid).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryBackoff {
    pub min: Duration,
    pub max: Duration,
}

impl RetryBackoff {
    pub fn retry_after_seconds(&self, attempt: Option<&str>, rng: &mut impl Rng) -> u64 {
        let attempt = attempt
            .and_then(|value| value.trim().parse::<i64>().ok())
            .filter(|&attempt| attempt >= 1)
            .unwrap_or(1);
        let (min, max) = (self.min.as_secs_f64(), self.max.as_secs_f64());
        // 2^62 already exceeds any sane max; capping the exponent keeps the maths finite.
        let mut delay = (min * 2f64.powi((attempt - 1).min(62) as i32)).min(max);
        let jitter = (delay * 0.5) as i64;
        if jitter > 0 {
            delay += rng.random_range(-jitter..=jitter) as f64;
        }
        delay.clamp(min, max) as u64
    }
}

impl Default for RetryBackoff {
    fn default() -> Self {
        RetryBackoff {
            min: Duration::from_secs(6),
            max: Duration::from_secs(96),
        }
    }
}

/// `RateLimit-Policy` and `RateLimit` for a tenant rejection: `q` is the fleet-wide quota per
/// window `w` (seconds, widened until `q` is a whole number ≥ 1 for slow rates), `r` the
/// tokens left in the bucket the request was checked against (fewer than the request
/// needed; 0 for a request larger than the burst, which is refused without reading the
/// bucket), `t` seconds until the request could pass: the `Retry-After` sent when there is
/// one, whatever the cause, so a client reading either waits the same; else the wait rounded
/// down (0 under a second); for a request larger than the burst, until the bucket is full (it
/// still will not pass).
fn ratelimit_fields(rejection: &Rejection, retry_after: Option<u64>) -> (String, String) {
    let name = match rejection.kind {
        LimitKind::Request => "tenant-request-rate",
        LimitKind::Ingestion => "tenant-ingestion-rate",
    };
    let window = if rejection.limit >= 1.0 || rejection.limit <= 0.0 {
        1.0
    } else {
        (1.0 / rejection.limit).ceil()
    };
    let quota = (rejection.limit * window).round().max(0.0) as u64;
    let until = retry_after.unwrap_or(match rejection.cause {
        RejectionCause::RateLimited { wait } => wait.as_secs_f64().floor() as u64,
        RejectionCause::LargerThanBurst if rejection.local_limit > 0.0 => {
            (rejection.burst as f64 / rejection.local_limit).ceil() as u64
        }
        RejectionCause::LargerThanBurst
        | RejectionCause::Blocked
        | RejectionCause::StoreUnavailable => 0,
    });
    (
        format!("\"{name}\";q={quota};w={window}"),
        format!("\"{name}\";r={};t={until}", rejection.remaining),
    )
}

fn rate_limit_message(rejection: &Rejection) -> String {
    let Rejection {
        limit, burst, cost, ..
    } = *rejection;
    match (rejection.kind, rejection.cause) {
        (_, RejectionCause::StoreUnavailable) => format!(
            "the request has been refused because the tenant's {} limit is enforced by the \
             shared store, which did not answer in time, and the tenant's on_store_failure \
             policy is closed: nothing is admitted that the store did not grant \
             (err-weir-store-unavailable). Retry later.",
            match rejection.kind {
                LimitKind::Request => "request rate",
                LimitKind::Ingestion => "ingestion rate",
            }
        ),
        (LimitKind::Request, _) => format!(
            "the request has been rejected because the tenant exceeded the request rate limit, \
             set to {limit} requests/s across all replicas with a maximum allowed burst of \
             {burst} (err-weir-tenant-max-request-rate). To adjust the related per-tenant \
             limits, set request_rate and request_burst_size in the tenant's runtime overrides, \
             or contact your service administrator."
        ),
        (LimitKind::Ingestion, RejectionCause::LargerThanBurst) => format!(
            "the request has been rejected because it carries {cost} items, more than the \
             tenant's ingestion burst size of {burst}: it can never pass, however long it waits. \
             This limit is applied on the total number of samples, histograms, exemplars and \
             metadata in one request (err-weir-tenant-max-ingestion-burst-size). Send smaller \
             requests (Prometheus: queue_config.max_samples_per_send), or raise \
             ingestion_burst_size in the tenant's runtime overrides."
        ),
        (LimitKind::Ingestion, RejectionCause::Blocked) => "the request has been rejected \
             because the tenant's ingestion rate limit is 0: all ingestion is refused \
             (err-weir-tenant-max-ingestion-rate). To adjust the related per-tenant limit, \
             set ingestion_rate in the tenant's runtime overrides, or contact your service \
             administrator."
            .to_string(),
        (LimitKind::Ingestion, RejectionCause::RateLimited { .. }) => format!(
            "the request has been rejected because the tenant exceeded the ingestion rate \
             limit, set to {limit} items/s with a maximum allowed burst of {burst}. This limit \
             is applied on the total number of samples, histograms, exemplars and metadata \
             received across all replicas (err-weir-tenant-max-ingestion-rate). To adjust the \
             related per-tenant limits, set ingestion_rate and ingestion_burst_size in the \
             tenant's runtime overrides, or contact your service administrator."
        ),
    }
}

fn instance_message(limit: InstanceLimit, value: f64) -> String {
    let what = match limit {
        InstanceLimit::MaxInflightPushRequests => {
            format!("the allowed number of in-flight push requests, {value}")
        }
        InstanceLimit::MaxInflightPushRequestsBytes => {
            format!("the allowed total size of in-flight push requests, {value} bytes")
        }
        InstanceLimit::MaxIngestionRate => {
            format!("its ingestion rate limit of {value} samples/s")
        }
        InstanceLimit::MaxTenants => {
            format!("the number of tenants it tracks, {value}, and this tenant is new to it")
        }
    };
    format!(
        "the write request has been rejected because this replica exceeded {what} \
         (err-weir-distributor-{}). This limit is per replica, for all tenants together. To \
         adjust it, set {}, or contact your service administrator.",
        limit.key().replace('_', "-"),
        limit.setting(),
    )
}

fn decode_message(err: &DecodeError) -> String {
    match err {
        DecodeError::TooLarge { .. } => format!("{err} (--max-request-body-size)"),
        // Already says "invalid OTLP metrics request": an OTLP export is not remote-write.
        DecodeError::Otlp(_) | DecodeError::Untranslated { .. } => err.to_string(),
        _ => format!("invalid remote-write request: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn backoff_doubles_with_jitter_and_clamps() {
        let backoff = RetryBackoff::default();
        let mut rng = StdRng::seed_from_u64(7);
        for (attempt, low, high) in [
            (None, 6, 9),
            (Some("1"), 6, 9),
            (Some("junk"), 6, 9),
            (Some("0"), 6, 9),
            (Some("2"), 6, 18),
            (Some("3"), 12, 36),
            (Some("5"), 48, 96),
            (Some("9999999999"), 48, 96),
        ] {
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..500 {
                let seconds = backoff.retry_after_seconds(attempt, &mut rng);
                assert!((low..=high).contains(&seconds), "{attempt:?}: {seconds}");
                seen.insert(seconds);
            }
            assert!(seen.len() > 1, "{attempt:?}: jitter must vary the answer");
        }
    }

    #[test]
    fn truthful_retry_after_is_the_wait_rounded_up_with_a_little_jitter() {
        let mut rng = StdRng::seed_from_u64(7);
        for millis in [0, 1, 500, 999] {
            let wait = Duration::from_millis(millis);
            assert_eq!(truthful_seconds(wait, &mut rng), None, "{wait:?}");
        }
        for (millis, low, high) in [
            (1_000, 1, 2),
            (1_200, 2, 2),
            (2_900, 3, 4),
            (6_000, 6, 7),
            (59_500, 60, 60),
        ] {
            let wait = Duration::from_millis(millis);
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..500 {
                let seconds = truthful_seconds(wait, &mut rng).unwrap();
                assert!((low..=high).contains(&seconds), "{wait:?}: {seconds}");
                // Never before the truth, never more than 1.25 s after it.
                assert!(seconds as f64 >= wait.as_secs_f64());
                assert!(seconds as f64 <= wait.as_secs_f64() + 1.25);
                seen.insert(seconds);
            }
            if millis == 2_900 {
                assert!(seen.len() > 1, "{wait:?}: jitter must vary the answer");
            }
        }
    }

    #[test]
    fn each_refusal_gets_the_header_its_mode_says() {
        let headers = HeaderMap::new();
        let mut rng = StdRng::seed_from_u64(7);
        let truthful = RetryAfter::default();
        let backoff = RetryAfter {
            mode: RetryAfterMode::Backoff,
            ..RetryAfter::default()
        };
        let rate_limited = |millis| {
            PushError::RateLimited(Rejection {
                kind: LimitKind::Ingestion,
                cause: RejectionCause::RateLimited {
                    wait: Duration::from_millis(millis),
                },
                limit: 100.0,
                burst: 100,
                local_limit: 100.0,
                cost: 10,
                remaining: 0,
            })
        };
        let inflight = || PushError::TenantInflight {
            limit: 3,
            in_flight: 3,
        };
        let mut answer = |err: PushError, policy| err.retry_after(&headers, policy, &mut rng);
        assert_eq!(answer(rate_limited(300), &truthful), None);
        assert_eq!(answer(rate_limited(2_500), &truthful), Some(3));
        assert_eq!(answer(inflight(), &truthful), None);
        assert!((6..=9).contains(&answer(rate_limited(300), &backoff).unwrap()));
        assert!((6..=9).contains(&answer(inflight(), &backoff).unwrap()));
        assert_eq!(answer(PushError::InflightUnavailable, &truthful), Some(1));
        // Not a refusal to retry: no header in either mode.
        let bad = || PushError::BodyTooLarge { limit: 1 };
        assert_eq!(answer(bad(), &truthful), None);
        assert_eq!(answer(bad(), &backoff), None);
    }

    #[test]
    fn ratelimit_fields_for_fast_and_slow_rates() {
        let rejection = Rejection {
            kind: LimitKind::Ingestion,
            cause: RejectionCause::RateLimited {
                wait: Duration::from_millis(1500),
            },
            limit: 10_000.0,
            burst: 200_000,
            local_limit: 5_000.0,
            cost: 10,
            remaining: 7,
        };
        assert_eq!(
            ratelimit_fields(&rejection, Some(2)),
            (
                "\"tenant-ingestion-rate\";q=10000;w=1".to_string(),
                "\"tenant-ingestion-rate\";r=7;t=2".to_string()
            )
        );
        assert_eq!(
            ratelimit_fields(&rejection, None).1,
            "\"tenant-ingestion-rate\";r=7;t=1"
        );
        let slow = Rejection {
            kind: LimitKind::Request,
            limit: 0.25,
            ..rejection
        };
        assert_eq!(
            ratelimit_fields(&slow, None).0,
            "\"tenant-request-rate\";q=1;w=4"
        );
        // A request that can never pass, or a limit of 0, is told Mimir's backoff: `t` says
        // the same, not the time the bucket takes to fill.
        for cause in [RejectionCause::LargerThanBurst, RejectionCause::Blocked] {
            let never = Rejection { cause, ..rejection };
            assert_eq!(
                ratelimit_fields(&never, Some(6)).1,
                "\"tenant-ingestion-rate\";r=7;t=6",
                "{cause:?}"
            );
        }
        let too_large = Rejection {
            cause: RejectionCause::LargerThanBurst,
            ..rejection
        };
        assert_eq!(
            ratelimit_fields(&too_large, None).1,
            "\"tenant-ingestion-rate\";r=7;t=40",
            "no Retry-After: until the bucket is full"
        );
    }
}

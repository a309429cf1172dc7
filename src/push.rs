//! `POST /api/v1/push` (and `POST /otlp/v1/metrics`): the admission path, one function, in a
//! fixed order.
//!
//! The order puts the cheapest refusals first, so load that will be refused costs as little
//! as possible: instance limits need only headers; the tenant and its request rate need only
//! headers too; only then is the body read, decompressed and scanned, and only a decoded body
//! can be charged to the ingestion rate.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, request::Parts, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::auth::{Allowed, Door, Peer, Source};
use crate::counts::{DecodeError, Decoded, Forward, UnsupportedMedia, OTLP_PARSE_ERROR};
use crate::format::{self, Format};
use crate::ha::{HaCheck, HaOutcome};
use crate::metrics::InstanceLimit;
use crate::otlp::OtlpFormat;
use crate::rejection::PushError;
use crate::remote_write::relabel::Relabelling;
use crate::remote_write::validate::Validation;
use crate::remote_write::Written;
use crate::state::AppState;
use crate::tenant::{self, TENANT_HEADER};
use engine::LimitKind;

/// Bodies larger than this are decoded on the blocking pool, so one huge request does not
/// stall the other requests on its worker thread.
const INLINE_DECODE_BYTES: usize = 512 << 10;

pub async fn push(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let headers = request.headers();
    let format = Format::from_headers(
        headers.get(header::CONTENT_TYPE).map(|v| v.as_bytes()),
        headers.get(header::CONTENT_ENCODING).map(|v| v.as_bytes()),
    );
    handle(state, request, format, None).await
}

/// `POST /otlp/v1/metrics`: the same path for an OTLP/HTTP metrics export, counted as Mimir
/// charges it ([`crate::otlp`]) and answered as OTLP/HTTP asks (200 with an empty
/// `ExportMetricsServiceResponse`; errors as a `google.rpc.Status`, in the request's encoding,
/// or protobuf, OTLP's default, when the request's is not one weir reads).
pub async fn push_otlp(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let headers = request.headers();
    let format = OtlpFormat::from_headers(
        headers.get(header::CONTENT_TYPE).map(|v| v.as_bytes()),
        headers.get(header::CONTENT_ENCODING).map(|v| v.as_bytes()),
    );
    let answer = format
        .as_ref()
        .ok()
        .copied()
        .unwrap_or(OtlpFormat::PROTOBUF);
    handle(state, request, format.map(Format::Otlp), Some(answer)).await
}

/// The push path's answer. `otlp`: the encoding of OTLP/HTTP answers, for the OTLP route.
async fn handle(
    state: Arc<AppState>,
    request: Request,
    format: Result<Format, UnsupportedMedia>,
    otlp: Option<OtlpFormat>,
) -> Response {
    if let Some(refused) = crate::http_serve::unsupported_transfer_coding(request.headers()) {
        return refused;
    }
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let mut body = Some(body);
    // What a refusal reports written: nothing, but for validation's partial answer.
    let mut refused_written = Written::default();
    // The tenant's `ingestion_artificial_delay`, once the tenant is known.
    let mut delay = None;
    let door = if otlp.is_some() {
        Door::Otlp
    } else {
        Door::Push
    };
    let admitted = admit(
        &state,
        door,
        &parts,
        &mut body,
        &format,
        &mut refused_written,
        &mut delay,
    )
    .await;
    // Refused before its body was read. The body is still read to its end (up to the size
    // limit and the timeout) and thrown away, so a client still sending sees the answer
    // instead of a reset connection, and the connection carries its next request. A body
    // that could never fit is not waited for: the connection closes after the answer.
    let close = admitted.is_err()
        && body.take().is_some_and(|unread| {
            let limit = state.config.max_request_body_size;
            let too_long = parts
                .headers
                .get(header::CONTENT_LENGTH)
                .and_then(|value| value.to_str().ok()?.parse::<u64>().ok())
                .is_some_and(|length| length > limit);
            if !too_long {
                tokio::spawn(drain(
                    unread,
                    limit as usize,
                    state.config.body_read_timeout,
                ));
            }
            too_long
        });
    // Mimir's `ingestion_artificial_delay`: the answer, whatever it is, waits until the push
    // has taken the tenant's delay, give or take a tenth. The push's in-flight slots are
    // free by now: a delayed tenant holds a connection, not the replica's capacity. The
    // answer is written after the wait, so a refusal's `Retry-After` counts from when it is
    // sent.
    let waited = match delay {
        Some(target) => {
            let wait = delay_left(target, started.elapsed(), &mut rand::rng());
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            Some(wait)
        }
        None => None,
    };
    let (mut response, written) = match admitted {
        Ok(written) => {
            let mut response = match otlp {
                Some(otlp) => (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, otlp.content_type())],
                    otlp.success_body(),
                )
                    .into_response(),
                None => StatusCode::OK.into_response(),
            };
            // A delayed success says how long it waited, as Mimir's does.
            if let Some(wait) = waited {
                response
                    .headers_mut()
                    .insert("server-timing", server_timing(wait));
            }
            (response, written)
        }
        Err(err) => {
            let err = match waited {
                Some(wait) => err.waited(wait),
                None => err,
            };
            if err.status().is_server_error() || err.status() == StatusCode::BAD_REQUEST {
                tracing::debug!(%err, "push refused");
            }
            // The message again, as an OTLP Status, only on the OTLP route.
            let otlp_message = otlp.map(|otlp| (otlp, otlp_code(&err), err.to_string()));
            let mut response = err.into_response_with(&parts.headers, &state.retry_after);
            if let Some((otlp, code, message)) = otlp_message {
                otlp_error(&mut response, otlp, code, &message);
            }
            if close {
                response.headers_mut().insert(
                    header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
            }
            (response, refused_written)
        }
    };
    // Remote-write 2.0 receivers say what they wrote, on success and on refusal alike, also
    // when the refusal is the body's encoding (415): the content type names 2.0.
    // The content type is read again only for a refused format, not on every push.
    let v2 = format == Ok(Format::V2)
        || (format.is_err()
            && otlp.is_none()
            && Format::from_headers(
                parts
                    .headers
                    .get(header::CONTENT_TYPE)
                    .map(|v| v.as_bytes()),
                None,
            ) == Ok(Format::V2));
    if v2 {
        written.insert_into(response.headers_mut());
    }
    state
        .metrics
        .push_duration
        .with_label_values(&[response.status().as_str()])
        .observe(started.elapsed().as_secs_f64());
    response
}

/// The `code` of an OTLP client's `google.rpc.Status` for `err`, as Mimir writes it: the HTTP
/// status for a body it could not read or translate (its parser's errors, and the
/// `otlp parse error` of an export translated in part, which it raises as HTTP errors), else
/// the gRPC code of the status (OTLP clients act on the HTTP status only).
fn otlp_code(err: &PushError) -> i32 {
    let status = err.status().as_u16();
    match err {
        PushError::Decode(_)
        | PushError::BodyTooLarge { .. }
        | PushError::ReadBody(_)
        | PushError::BodyTimeout { .. }
        | PushError::UnsupportedMedia(_) => i32::from(status),
        PushError::InvalidSeries(message) if message.starts_with(OTLP_PARSE_ERROR) => {
            i32::from(status)
        }
        _ => crate::otlp::grpc_code(status),
    }
}

/// An OTLP client's error body: a `google.rpc.Status` of `code` in the request's encoding, in
/// place of the plain-text message (the headers, `Retry-After` among them, stay).
fn otlp_error(response: &mut Response, format: OtlpFormat, code: i32, message: &str) {
    *response.body_mut() = Body::from(format.status_body(code, message));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static(format.content_type()),
    );
    response.headers_mut().remove(header::CONTENT_LENGTH);
}

async fn admit(
    state: &Arc<AppState>,
    door: Door,
    parts: &Parts,
    body: &mut Option<Body>,
    format: &Result<Format, UnsupportedMedia>,
    refused_written: &mut Written,
    delay: &mut Option<Duration>,
) -> Result<Written, PushError> {
    let content_length = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());

    // 1. Instance limits, before anything else: they protect this process, and need only
    //    the headers, so an overloaded replica sheds load without reading bodies. The guard
    //    keeps the request counted in flight until the answer is ready.
    let mut inflight = state.instance.start(content_length)?;

    // 2. Tenant, authenticated (--tenant-auth): every later limit is per tenant, so the
    //    proof comes before any of them, and a request refused here (401, 403) costs the
    //    tenant it named nothing. It needs only headers and the connection's certificate.
    let named = parts
        .headers
        .get(TENANT_HEADER)
        .map(|value| value.as_bytes())
        .filter(|value| !value.is_empty());
    let source = Source {
        peer: parts.extensions.get::<Peer>(),
        authorization: parts
            .headers
            .get(header::AUTHORIZATION)
            .map(|value| value.as_bytes()),
    };
    let tenant_name = match state.auth.authorize(door, source, named)? {
        Allowed::AsNamed => std::borrow::Cow::Borrowed(tenant::resolve(
            named,
            state.config.no_auth_tenant.as_deref(),
        )?),
        // The request named none, and its credential covers exactly this one.
        Allowed::Tenant(only) => std::borrow::Cow::Owned(only),
    };
    let tenant_name: &str = &tenant_name;
    let runtime_config = state.limiter.runtime_config();
    *delay = runtime_config.artificial_delay(tenant_name);
    let tenant = state.limiter.tenant(tenant_name).map_err(|too_many| {
        let limit = too_many.max_tenants as f64;
        state.instance.reject(InstanceLimit::MaxTenants, limit)
    })?;
    tenant.data.requests_in.inc();
    let discard = |err: PushError, items: u64| {
        if let Some(reason) = err.discard_reason() {
            tenant.data.discard(reason, items);
        }
        err
    };

    // 3. The body's format, from its headers: a message weir cannot count is refused (415)
    //    before it costs a request token, and never passed uncharged.
    let format = format.clone()?;

    // 4. Tenant pushes in flight (`max_inflight_push_requests`), fleet-wide under the
    //    tenant's strategy, before the body is read: a tenant's slow or stuck pushes cannot
    //    pile up. The slot is held until the answer is ready.
    let _slot = PushSlot::take(state, tenant_name)
        .await
        .map_err(|err| discard(err, 0))?;

    // 5. Tenant request rate: one token per request, still before the body is read, so a
    //    tenant over its request rate costs no decompression. Here and at 7, a push that
    //    would pass within --max-admission-delay is held until then instead of refused.
    let hold_until = tokio::time::Instant::now() + state.config.max_admission_delay;
    let request_taken = admit_held(state, &tenant, LimitKind::Request, 1, hold_until)
        .await
        .map_err(|rejection| discard(PushError::RateLimited(rejection), 0))?;

    // 6. Body: read up to the size limit, decompress, scan as its format. Bad input is the
    //    client's fault (4xx), never a panic.
    let max_size = state.config.max_request_body_size as usize;
    let unread = body.take().expect("the body is read once, here");
    let body = read_body(
        unread,
        content_length,
        max_size,
        state.config.body_read_timeout,
    )
    .await
    .map_err(|err| discard(err, 0))?;
    if !inflight.has_bytes() {
        // Without a Content-Length the bytes could only be counted once read.
        inflight.add_bytes(body.len() as u64)?;
    }
    // `Bytes` clones share the buffer: the scan and the forward see the same bytes. Series
    // validation (remote-write 1.0) runs in the same scan: a refused series is not charged,
    // and the rest goes on, in a body without it (see step 8).
    let ha = runtime_config
        .ha_limits(tenant_name)
        .map(|settings| HaCheck {
            tracker: Arc::clone(&state.ha),
            tenant: Arc::from(tenant_name),
            settings,
        });
    let validation = Validation::new(runtime_config.validation_limits(tenant_name), unix_millis())
        .dropping(runtime_config.drop_labels(tenant_name))
        .deduplicating(ha)
        .translating(
            matches!(format, Format::Otlp(_))
                .then(|| runtime_config.otlp_translation(tenant_name))
                .flatten(),
        )
        .relabelling(
            runtime_config
                .relabel(tenant_name)
                .map(|rules| Relabelling {
                    rules,
                    tenant: Arc::from(tenant_name),
                }),
        );
    drop(runtime_config);
    let Decoded {
        counts,
        forward,
        refused,
        dropped_exemplars,
        repeated_timestamps,
        unlabelled: _,
        untranslated,
        ha,
    } = decode(body.clone(), max_size, format, validation)
        .await
        .map_err(|err| {
            // The metrics of an OTLP export Mimir's translator takes none of are counted as
            // its translation's discards, as Mimir counts them.
            if let DecodeError::Untranslated { left_out, .. } = err {
                tenant.data.count_untranslated(left_out);
            }
            discard(PushError::Decode(err), 0)
        })?;
    // Mimir counts the metrics its translation leaves out as it translates, before its HA
    // tracker and its checks.
    tenant.data.count_untranslated(untranslated);
    // The HA tracker's word comes first, as in Mimir's distributor: a push from a replica
    // that is not elected is answered 202 and costs nothing, its request token included.
    let samples = counts.samples + counts.histograms;
    match ha {
        HaOutcome::Off => {}
        HaOutcome::NotHa => state
            .metrics
            .ha_non_ha_samples
            .with_label_values(&[tenant_name])
            .inc_by(samples),
        HaOutcome::Accepted { change, .. } => {
            if let Some(change) = change {
                log_ha_change(state, &change, "elected by a push");
            }
        }
        HaOutcome::Deduplicated {
            cluster,
            replica,
            elected,
        } => {
            state.limiter.refund(&tenant, request_taken);
            state
                .metrics
                .ha_deduped_samples
                .with_label_values(&[tenant_name, cluster.as_str()])
                .inc_by(samples);
            return Err(PushError::HaDeduplicated { replica, elected });
        }
        HaOutcome::TooManyClusters { limit } => {
            return Err(discard(PushError::TooManyHaClusters { limit }, samples));
        }
    }
    if let Some(refused) = &refused {
        tenant.data.discard_series(&refused.samples);
    }
    tenant
        .data
        .count_drops(&dropped_exemplars, repeated_timestamps);
    // Nothing valid left, or nothing sent (no sample, histogram or metadata entry): nothing
    // to charge or forward. Refused series answer 400 with the first refusal; series with no
    // labels, the only other cut, go silently, and the push is answered as written, as
    // Mimir's distributor answers it, before its ingestion limit (so a tenant whose limit is
    // 0 is not refused an empty push).
    let nothing = counts.samples + counts.histograms + counts.metadata == 0;
    let body = match forward {
        Forward::Unchanged if !nothing => body,
        Forward::Rewritten(rewritten) if !nothing => rewritten,
        _ => {
            return match refused {
                Some(refused) => Err(PushError::InvalidSeries(refused.first)),
                None => Ok(Written::of(&counts)),
            };
        }
    };

    // 7. Tenant ingestion rate: the cost is every item the request carries.
    let cost = counts.cost();
    let ingestion_taken = admit_held(state, &tenant, LimitKind::Ingestion, cost, hold_until)
        .await
        .map_err(|rejection| {
            let err = PushError::RateLimited(rejection);
            if let Some(reason) = err.discard_reason() {
                tenant.data.discard_items(reason, &counts);
            }
            err
        })?;

    // 8. Admitted: forward the client's bytes unchanged, or in sink mode just acknowledge.
    //    The in-flight guard is still held: the upstream wait counts.
    state.instance.record_admitted(cost);
    let written = match &state.upstream {
        // The receiver's own account of what it wrote, when it gives one, is the truth.
        Some(upstream) => match forward_counted(
            upstream,
            state,
            tenant_name,
            format,
            body,
            &tenant.data,
            &counts,
        )
        .await
        {
            Ok(written) => written.unwrap_or_else(|| Written::of(&counts)),
            Err(err) => {
                // 9. Nothing reached the backend: the tokens go back, so the client's retry
                //    is charged once, and an outage of the backend does not use up the
                //    tenant's limit.
                if err.wrote_nothing() {
                    state.limiter.refund(&tenant, request_taken);
                    state.limiter.refund(&tenant, ingestion_taken);
                    state.metrics.refunded_requests.inc();
                } else {
                    tenant.data.count_received(&counts);
                }
                return Err(err.into());
            }
        },
        None => {
            state.metrics.sink_requests.inc();
            Written::of(&counts)
        }
    };
    tenant.data.count_received(&counts);
    drop(inflight);
    // Mimir's partial answer: the valid series were written, and the client hears 400 with
    // the first refusal, so it does not send the refused ones again; a 2.0 client hears
    // in the `*-Written` headers what was written, as Mimir answers.
    if let Some(refused) = refused {
        *refused_written = written;
        return Err(PushError::InvalidSeries(refused.first));
    }
    Ok(written)
}

/// Forwards a push. A client that hangs up while the receiver has not answered drops this
/// future: the push may have been written, and its tokens stay charged, so it is counted
/// received, as one whose forward failed after writing is.
async fn forward_counted(
    upstream: &crate::upstream::Upstream,
    state: &AppState,
    tenant_name: &str,
    format: Format,
    body: bytes::Bytes,
    tenant: &crate::metrics::TenantMetrics,
    counts: &crate::counts::WriteCounts,
) -> Result<Option<Written>, crate::upstream::ForwardError> {
    let hung_up = CountOnDrop(Some((tenant, counts)));
    let forwarded = upstream
        .forward(tenant_name, format, body, &state.metrics)
        .await;
    hung_up.disarm();
    forwarded
}

/// Counts a push received when dropped armed: its client hung up while it was forwarded.
struct CountOnDrop<'a>(
    Option<(
        &'a crate::metrics::TenantMetrics,
        &'a crate::counts::WriteCounts,
    )>,
);

impl CountOnDrop<'_> {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CountOnDrop<'_> {
    fn drop(&mut self) {
        if let Some((tenant, counts)) = self.0.take() {
            tenant.count_received(counts);
        }
    }
}

/// What is left of a tenant's artificial delay `target` after the push took `elapsed`, give
/// or take a tenth at random (Mimir's `DurationWithJitter(left, 0.10)`); zero once the push
/// took the whole delay.
fn delay_left(target: Duration, elapsed: Duration, rng: &mut impl rand::Rng) -> Duration {
    let left = target.saturating_sub(elapsed);
    let variance = left.as_nanos() as u64 / 10;
    if variance == 0 {
        return left;
    }
    let nanos = left.as_nanos() as u64 - variance + rng.random_range(0..2 * variance);
    Duration::from_nanos(nanos)
}

/// Mimir's `Server-Timing` on a delayed success: `artificial_delay;dur=` the wait in
/// milliseconds (0 when the push took the whole delay by itself).
fn server_timing(wait: Duration) -> axum::http::HeaderValue {
    let millis = wait.as_nanos() as f64 / 1e6;
    axum::http::HeaderValue::try_from(format!("artificial_delay;dur={millis}"))
        .expect("a number is a valid header value")
}

/// The wall clock in Unix milliseconds, which sample timestamps are checked against.
pub(crate) fn unix_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64)
}

/// Logs and counts a change of an HA cluster's elected replica.
pub(crate) fn log_ha_change(state: &AppState, change: &crate::ha::Change, how: &str) {
    state
        .metrics
        .ha_elected_replica_changes
        .with_label_values(&[change.tenant.as_str(), change.cluster.as_str()])
        .inc();
    tracing::info!(
        tenant = %change.tenant,
        cluster = %change.cluster,
        from = change.from.as_deref().unwrap_or("(none)"),
        to = %change.to,
        "HA elected replica changed ({how})"
    );
}

/// Takes `cost` tokens of the tenant's `kind` limit. A push that would pass by `deadline`
/// (`--max-admission-delay` from its first check, so its two holds together wait no longer)
/// is held until then instead of refused. Under `weighted` its tokens are reserved at once
/// (the fleet view queues reservations in order of arrival, at most the delay's refill
/// ahead), and it waits for them; under the other strategies it sleeps the wait and is
/// checked again, as often as the wait still ends by the deadline. So a refusal always means
/// a wait past the deadline, which its `Retry-After` states. A tenant with its share of
/// held pushes here already ([`crate::instance::InstanceLimiter::max_held_per_tenant`]) holds no more: its
/// push is answered at once, as Mimir answers every one.
async fn admit_held(
    state: &AppState,
    tenant: &engine::Tenant<<crate::metrics::TenantSeries as engine::TenantHooks>::Data>,
    kind: LimitKind,
    cost: u64,
    deadline: tokio::time::Instant,
) -> Result<engine::Taken, engine::Rejection> {
    let started = tokio::time::Instant::now();
    let mut hold: Option<Held> = None;
    let may_hold = |hold: &Option<Held>| {
        hold.is_some()
            || tenant.data.held.load(Ordering::Relaxed) < state.instance.max_held_per_tenant()
    };
    loop {
        let left = if may_hold(&hold) {
            deadline.saturating_duration_since(tokio::time::Instant::now())
        } else {
            Duration::ZERO
        };
        let rejection = match state.limiter.admit_within(tenant, kind, cost, left).await {
            Ok(admitted) => {
                if !admitted.wait.is_zero() {
                    hold.get_or_insert_with(|| Held::new(&tenant.data));
                    tokio::time::sleep(admitted.wait).await;
                }
                if hold.is_some() {
                    state
                        .metrics
                        .admission_delay
                        .observe(started.elapsed().as_secs_f64());
                }
                return Ok(admitted.taken);
            }
            Err(rejection) => rejection,
        };
        let engine::RejectionCause::RateLimited { wait } = rejection.cause else {
            return Err(rejection);
        };
        let wait = wait.max(MIN_RECHECK);
        if tokio::time::Instant::now() + wait > deadline || !may_hold(&hold) {
            return Err(rejection);
        }
        hold.get_or_insert_with(|| Held::new(&tenant.data));
        tokio::time::sleep(wait).await;
    }
}

/// One of a tenant's pushes held now, counted in [`crate::metrics::TenantMetrics::held`]
/// until dropped, however the hold ends (the client may hang up while it waits).
struct Held<'a>(&'a crate::metrics::TenantMetrics);

impl<'a> Held<'a> {
    fn new(tenant: &'a crate::metrics::TenantMetrics) -> Self {
        tenant.held.fetch_add(1, Ordering::Relaxed);
        Held(tenant)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The shortest sleep of a held push before its next check.
const MIN_RECHECK: Duration = Duration::from_millis(1);

/// One of a tenant's pushes in flight; given back when dropped, however the push ends.
struct PushSlot {
    state: Arc<AppState>,
    lease: String,
}

impl PushSlot {
    /// `None` when the tenant has no `max_inflight_push_requests`.
    async fn take(state: &Arc<AppState>, tenant: &str) -> Result<Option<PushSlot>, PushError> {
        let max = state
            .limiter
            .runtime_config()
            .tenant_limits(tenant)
            .max_inflight_push_requests;
        if max == 0 {
            return Ok(None);
        }
        // The lease outlives any push (its body read and its upstream wait) unless the
        // replica dies; under `shared` it then frees itself.
        let ttl = state.config.upstream_timeout + PUSH_SLOT_MARGIN;
        let acquired = state
            .limiter
            .acquire_push(tenant, max, ttl)
            .await
            .map_err(|_| PushError::InflightUnavailable)?;
        match acquired.lease_id {
            Some(lease) if acquired.granted => Ok(Some(PushSlot {
                state: Arc::clone(state),
                lease,
            })),
            _ => Err(PushError::TenantInflight {
                limit: max,
                in_flight: acquired.in_flight,
            }),
        }
    }
}

impl Drop for PushSlot {
    fn drop(&mut self) {
        if self.lease.starts_with('L') {
            let _ = self.state.limiter.release_local(&self.lease);
        } else {
            // In the store: released by a task, as a drop cannot wait.
            let state = Arc::clone(&self.state);
            let lease = std::mem::take(&mut self.lease);
            tokio::spawn(async move {
                if let Err(err) = state.limiter.release(&lease).await {
                    tracing::debug!(%err, "a push slot was not released; it expires at its TTL");
                }
            });
        }
    }
}

/// How long a push slot's lease outlives the upstream timeout.
const PUSH_SLOT_MARGIN: Duration = Duration::from_secs(30);

async fn read_body(
    body: Body,
    content_length: Option<u64>,
    max_size: usize,
    timeout: Duration,
) -> Result<Bytes, PushError> {
    if content_length.is_some_and(|length| length > max_size as u64) {
        return Err(PushError::BodyTooLarge { limit: max_size });
    }
    let read = Limited::new(body, max_size).collect();
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(err)) if err.downcast_ref::<LengthLimitError>().is_some() => {
            Err(PushError::BodyTooLarge { limit: max_size })
        }
        Ok(Err(err)) => Err(PushError::ReadBody(err.to_string())),
        Err(_) => Err(PushError::BodyTimeout { timeout }),
    }
}

/// Reads and discards a refused push's body, up to `limit` bytes and `timeout`. A body that
/// ends in time leaves the connection fit for the next request; otherwise dropping it closes
/// the connection.
async fn drain(mut body: Body, limit: usize, timeout: Duration) {
    let read = async {
        let mut seen = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |data| data.len());
            if seen > limit {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(timeout, read).await;
}

async fn decode(
    body: Bytes,
    max_size: usize,
    format: Format,
    validation: Validation,
) -> Result<Decoded, DecodeError> {
    if body.len() <= INLINE_DECODE_BYTES {
        return format::decode_validated(&body, max_size, format, &validation);
    }
    tokio::task::spawn_blocking(move || {
        format::decode_validated(&body, max_size, format, &validation)
    })
    .await
    .unwrap_or_else(|join_error| {
        Err(DecodeError::Protobuf(format!(
            "decoding failed: {join_error}"
        )))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_is_what_the_push_left_of_it_give_or_take_a_tenth() {
        let mut rng = rand::rng();
        let second = Duration::from_secs(1);
        let mut seen = (Duration::MAX, Duration::ZERO);
        for _ in 0..1000 {
            let wait = delay_left(second, Duration::from_millis(200), &mut rng);
            assert!(
                (Duration::from_millis(720)..Duration::from_millis(880)).contains(&wait),
                "{wait:?}"
            );
            seen = (seen.0.min(wait), seen.1.max(wait));
        }
        // The jitter spreads both ways, not only one.
        assert!(seen.0 < Duration::from_millis(780) && seen.1 > Duration::from_millis(820));
        // A push that took the whole delay, or longer, waits no more.
        assert_eq!(delay_left(second, second, &mut rng), Duration::ZERO);
        assert_eq!(delay_left(second, 2 * second, &mut rng), Duration::ZERO);
        // Too short to spread: as it is.
        assert_eq!(
            delay_left(Duration::from_nanos(9), Duration::ZERO, &mut rng),
            Duration::from_nanos(9)
        );
    }

    #[test]
    fn server_timing_reads_as_mimirs() {
        assert_eq!(server_timing(Duration::ZERO), "artificial_delay;dur=0");
        assert_eq!(
            server_timing(Duration::from_micros(1500)),
            "artificial_delay;dur=1.5"
        );
        assert_eq!(
            server_timing(Duration::from_millis(250)),
            "artificial_delay;dur=250"
        );
    }
}

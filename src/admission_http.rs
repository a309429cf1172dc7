//! The admission API's HTTP/JSON twin, for callers without gRPC: `POST /api/v1/allow`,
//! `/api/v1/allow_batch`, `/api/v1/acquire`, `/api/v1/release`, `/api/v1/renew`. The same
//! engine calls as the gRPC service; durations are in seconds (floats). Errors answer with the
//! HTTP status of the gRPC code and `{"code", "reason", "message"}`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use engine::{AdmissionError, Allowed};
use runtime_config::{Algorithm, LimitSpec};
use serde::{Deserialize, Serialize};
use tonic::Code;

use crate::admission_common::{
    allow_checked, authorized_tenant, check_lease_id, check_names, code_and_reason, source_name,
    BatchTenants, CheckedAsk, NameError, DEFAULT_LEASE_TTL,
};
use crate::auth::{Denied, Door, Peer, Source};
use crate::state::AppState;

/// Who is calling: the connection's peer and the `Authorization` header, for tenant
/// authentication.
pub struct Caller {
    peer: Option<Peer>,
    authorization: Option<axum::http::HeaderValue>,
}

impl Caller {
    fn source(&self) -> Source<'_> {
        Source {
            peer: self.peer.as_ref(),
            authorization: self.authorization.as_ref().map(|value| value.as_bytes()),
        }
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Caller {
            peer: parts.extensions.get::<Peer>().cloned(),
            authorization: parts
                .headers
                .get(axum::http::header::AUTHORIZATION)
                .cloned(),
        })
    }
}

/// A JSON object read as `T`, and nothing else: serde reads a struct from an array too, by
/// position, so `["t", "k"]` was a tenant and a key, and `["k", "t"]` swapped them in
/// silence. An array (or any other value) is `BAD_JSON`, "expected a JSON object".
#[derive(Debug)]
pub struct Object<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct OnlyMaps<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for OnlyMaps<T> {
            type Value = T;
            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        deserializer
            .deserialize_map(OnlyMaps(std::marker::PhantomData))
            .map(Object)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSpec {
    #[serde(default)]
    algorithm: Option<Algorithm>,
    #[serde(default)]
    rate: f64,
    #[serde(default)]
    burst: u64,
    /// Seconds.
    #[serde(default)]
    window: Option<f64>,
    #[serde(default)]
    max_concurrent: u64,
}

impl JsonSpec {
    fn spec(&self) -> Result<LimitSpec, ApiError> {
        let window = match self.window {
            None => Duration::from_secs(1),
            Some(seconds) => Duration::try_from_secs_f64(seconds).map_err(|_| {
                ApiError::new(
                    Code::InvalidArgument,
                    "BAD_SPEC",
                    format!("window must be a number of seconds ≥ 0 that fits, got {seconds}"),
                )
            })?,
        };
        Ok(LimitSpec {
            algorithm: self.algorithm.unwrap_or_default(),
            rate: self.rate,
            burst: self.burst,
            window,
            max_concurrent: self.max_concurrent,
        })
    }
}

#[derive(Debug, Serialize)]
struct SpecOut {
    algorithm: &'static str,
    rate: f64,
    burst: u64,
    window: f64,
    max_concurrent: u64,
}

impl From<LimitSpec> for SpecOut {
    fn from(spec: LimitSpec) -> Self {
        SpecOut {
            algorithm: spec.algorithm.as_str(),
            rate: spec.rate,
            burst: spec.burst,
            window: spec.window.as_secs_f64(),
            max_concurrent: spec.max_concurrent,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowBody {
    /// Missing is as empty: `MISSING_FIELD`, as the docs say.
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    key: String,
    /// Signed, so a negative cost gets BAD_COST rather than a JSON error.
    #[serde(default = "one")]
    cost: i64,
    #[serde(default)]
    limit: Option<Object<JsonSpec>>,
}

fn one() -> i64 {
    1
}

#[derive(Debug, Serialize)]
struct AllowOut {
    allowed: bool,
    remaining: u64,
    retry_after: f64,
    reset_after: f64,
    delay: f64,
    limit_in_force: SpecOut,
    limit_source: &'static str,
}

/// An error answer: the HTTP status of the gRPC code, and `{"code", "reason", "message"}`.
#[derive(Debug, Serialize)]
pub struct ApiError {
    #[serde(serialize_with = "code_name")]
    code: Code,
    reason: &'static str,
    message: String,
    /// `Retry-After`, in whole seconds, for a throttled caller: a header, not in the body.
    #[serde(skip)]
    retry_after: Option<u64>,
}

fn code_name<S: serde::Serializer>(code: &Code, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format!("{code:?}"))
}

impl ApiError {
    fn new(code: Code, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            retry_after: None,
        }
    }

    fn status(&self) -> StatusCode {
        if self.reason == BODY_TOO_LARGE {
            return StatusCode::PAYLOAD_TOO_LARGE;
        }
        match self.code {
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
            Code::FailedPrecondition => StatusCode::CONFLICT,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<AdmissionError> for ApiError {
    fn from(err: AdmissionError) -> Self {
        let (code, reason) = code_and_reason(&err);
        ApiError::new(code, reason, err.to_string())
    }
}

impl From<NameError> for ApiError {
    fn from(err: NameError) -> Self {
        ApiError::new(Code::InvalidArgument, err.reason(), err.to_string())
    }
}

impl From<Denied> for ApiError {
    fn from(denied: Denied) -> Self {
        let mut err = ApiError::new(denied.grpc_code(), denied.api_reason(), denied.to_string());
        if let Denied::Throttled { retry_after } = denied {
            // As the push path says it (`PushError::retry_after`).
            err.retry_after = Some(retry_after.as_secs_f64().ceil().max(1.0) as u64);
        }
        err
    }
}

/// The reason of a body over axum's limit (2 MB): 413, not a JSON error.
const BODY_TOO_LARGE: &str = "BODY_TOO_LARGE";

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let reason = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            BODY_TOO_LARGE
        } else {
            "BAD_JSON"
        };
        ApiError::new(Code::InvalidArgument, reason, rejection.body_text())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let retry_after = self.retry_after;
        let mut response = (status, Json(self)).into_response();
        if let Some(seconds) = retry_after {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(seconds),
            );
        }
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer realm=\"weir\", Basic realm=\"weir\""),
            );
        }
        response
    }
}

async fn allow_one(
    state: &AppState,
    caller: &Caller,
    body: &AllowBody,
) -> Result<AllowOut, ApiError> {
    // Authenticated first: a refused call costs the tenant it names nothing.
    let tenant = authorized_tenant(
        &state.auth,
        Door::AdmissionHttp,
        caller.source(),
        &body.tenant,
    )?;
    check_names(&tenant, &body.key)?;
    let (cost, client) = cost_and_limit(body)?;
    let answer = state
        .limiter
        .allow(&tenant, &body.key, cost, client)
        .await?;
    Ok(allow_out(answer))
}

/// The cost and the caller's limit of an ask, checked.
fn cost_and_limit(body: &AllowBody) -> Result<(u64, Option<LimitSpec>), ApiError> {
    let cost = u64::try_from(body.cost).map_err(|_| {
        ApiError::new(
            Code::InvalidArgument,
            "BAD_COST",
            format!("cost must be at least 1, got {}", body.cost),
        )
    })?;
    Ok((
        cost,
        body.limit
            .as_ref()
            .map(|Object(spec)| spec.spec())
            .transpose()?,
    ))
}

fn allow_out(answer: Allowed) -> AllowOut {
    AllowOut {
        allowed: answer.decision.allowed,
        remaining: answer.decision.remaining,
        retry_after: answer.decision.retry_after.as_secs_f64(),
        reset_after: answer.decision.reset_after.as_secs_f64(),
        delay: answer.decision.delay.as_secs_f64(),
        limit_in_force: answer.limit.into(),
        limit_source: source_name(answer.source),
    }
}

/// The answer of a handler: JSON, or an [`ApiError`].
fn answer<T: Serialize>(result: Result<T, ApiError>) -> Response {
    match result {
        Ok(value) => Json(value).into_response(),
        Err(err) => err.into_response(),
    }
}

pub async fn allow(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    body: Result<Json<Object<AllowBody>>, JsonRejection>,
) -> Response {
    answer(match body {
        Ok(Json(Object(body))) => allow_one(&state, &caller, &body).await,
        Err(rejection) => Err(rejection.into()),
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowBatchBody {
    requests: Vec<Object<AllowBody>>,
}

/// One answer or error per request, in order.
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
enum BatchItem {
    Error(ApiError),
    #[serde(untagged)]
    Answer(AllowOut),
}

pub async fn allow_batch(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    body: Result<Json<Object<AllowBatchBody>>, JsonRejection>,
) -> Response {
    let body = match body {
        Ok(Json(Object(body))) => body,
        Err(rejection) => return ApiError::from(rejection).into_response(),
    };
    // Each item checked as `allow` checks it, authentication first; then the engine decides
    // the asks that passed in one batch.
    let mut tenants = BatchTenants::default();
    let checked = (body.requests.iter().map(|Object(one)| one))
        .map(|one| {
            let source = caller.source();
            let tenant = tenants.check::<ApiError>(
                &state.auth,
                Door::AdmissionHttp,
                source,
                &one.tenant,
                &one.key,
            )?;
            let (cost, limit) = cost_and_limit(one)?;
            Ok(CheckedAsk {
                tenant,
                key: &one.key,
                cost,
                limit,
            })
        })
        .collect();
    let results = allow_checked(&state.limiter, checked, |answer| {
        match answer.and_then(|answer| answer.map_err(ApiError::from)) {
            Ok(answer) => BatchItem::Answer(allow_out(answer)),
            Err(err) => BatchItem::Error(err),
        }
    })
    .await;
    Json(serde_json::json!({ "results": results })).into_response()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    /// Missing is as empty: `MISSING_FIELD`.
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    limit: Option<Object<JsonSpec>>,
    /// Seconds.
    #[serde(default)]
    ttl: Option<f64>,
}

fn ttl(seconds: Option<f64>) -> Result<Duration, ApiError> {
    match seconds {
        None => Ok(DEFAULT_LEASE_TTL),
        Some(seconds) => Duration::try_from_secs_f64(seconds).map_err(|_| {
            ApiError::new(
                Code::InvalidArgument,
                "BAD_TTL",
                format!(
                    "ttl must be a number of seconds ≥ 0 that fits, got {seconds} (a slot's \
                     ttl is held between 0.001 and 86400)"
                ),
            )
        }),
    }
}

async fn acquire_one(
    state: &AppState,
    caller: &Caller,
    body: AcquireBody,
) -> Result<serde_json::Value, ApiError> {
    let tenant = authorized_tenant(
        &state.auth,
        Door::AdmissionHttp,
        caller.source(),
        &body.tenant,
    )?;
    check_names(&tenant, &body.key)?;
    let client = body
        .limit
        .as_ref()
        .map(|Object(spec)| spec.spec())
        .transpose()?;
    let acquisition = state
        .limiter
        .acquire(&tenant, &body.key, client, ttl(body.ttl)?)
        .await?;
    Ok(serde_json::json!({
        "granted": acquisition.granted,
        "lease_id": acquisition.lease_id,
        "in_flight": acquisition.in_flight,
        "limit": acquisition.limit.max_concurrent,
        "retry_after": acquisition.retry_after.as_secs_f64(),
    }))
}

pub async fn acquire(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    body: Result<Json<Object<AcquireBody>>, JsonRejection>,
) -> Response {
    answer(match body {
        Ok(Json(Object(body))) => acquire_one(&state, &caller, body).await,
        Err(rejection) => Err(rejection.into()),
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseBody {
    /// Missing is as empty: `MISSING_FIELD`, as on gRPC.
    #[serde(default)]
    lease_id: String,
    /// Renew only, seconds.
    #[serde(default)]
    ttl: Option<f64>,
}

pub async fn release(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    body: Result<Json<Object<LeaseBody>>, JsonRejection>,
) -> Response {
    // A lease ID names no tenant the caller must hold; the caller must still be known.
    if let Err(denied) = state
        .auth
        .authenticate(Door::AdmissionHttp, caller.source())
    {
        return ApiError::from(denied).into_response();
    }
    answer(match body {
        Ok(Json(Object(body))) => match check_lease_id(&body.lease_id) {
            Ok(()) => state
                .limiter
                .release(&body.lease_id)
                .await
                .map(|()| serde_json::json!({}))
                .map_err(ApiError::from),
            Err(err) => Err(err.into()),
        },
        Err(rejection) => Err(rejection.into()),
    })
}

pub async fn renew(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    body: Result<Json<Object<LeaseBody>>, JsonRejection>,
) -> Response {
    let renew = async {
        state
            .auth
            .authenticate(Door::AdmissionHttp, caller.source())?;
        let Json(Object(body)) = body?;
        check_lease_id(&body.lease_id)?;
        state.limiter.renew(&body.lease_id, ttl(body.ttl)?).await?;
        Ok(serde_json::json!({}))
    };
    answer(renew.await)
}

//! The tower layer over the client: a closure maps each request to the (tenant, key, cost)
//! it is limited by (or to nothing); a refusal is answered here, as weir answers its own:
//! 429 with `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers) and a
//! `Retry-After` in whole seconds rounded up (none under a second). A gRPC request (tonic)
//! gets `RESOURCE_EXHAUSTED` instead, as trailers-only. The client lives in an `Arc`, so
//! every clone of the service (axum clones it per request) shares one set of budgets.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response, StatusCode};

use crate::{Client, Decision};

/// What a request is limited by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub tenant: String,
    pub key: String,
    pub cost: u64,
}

impl Target {
    /// Cost 1; see [`Target::cost`].
    pub fn new(tenant: impl Into<String>, key: impl Into<String>) -> Target {
        Target {
            tenant: tenant.into(),
            key: key.into(),
            cost: 1,
        }
    }

    pub fn cost(mut self, cost: u64) -> Target {
        self.cost = cost.max(1);
        self
    }
}

/// `RateLimitLayer::new(client, |request| Some(Target::new(tenant, key)))`.
pub struct RateLimitLayer<F> {
    client: Client,
    classify: Arc<F>,
}

impl<F> Clone for RateLimitLayer<F> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            client: self.client.clone(),
            classify: Arc::clone(&self.classify),
        }
    }
}

impl<F> RateLimitLayer<F> {
    pub fn new(client: Client, classify: F) -> Self {
        RateLimitLayer {
            client,
            classify: Arc::new(classify),
        }
    }
}

impl<S, F> tower_layer::Layer<S> for RateLimitLayer<F> {
    type Service = RateLimit<S, F>;

    fn layer(&self, inner: S) -> RateLimit<S, F> {
        RateLimit {
            inner,
            client: self.client.clone(),
            classify: Arc::clone(&self.classify),
        }
    }
}

/// The service the layer wraps around yours.
pub struct RateLimit<S, F> {
    inner: S,
    client: Client,
    classify: Arc<F>,
}

impl<S: Clone, F> Clone for RateLimit<S, F> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            client: self.client.clone(),
            classify: Arc::clone(&self.classify),
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, F, RequestBody, ResponseBody> tower_service::Service<Request<RequestBody>>
    for RateLimit<S, F>
where
    S: tower_service::Service<Request<RequestBody>, Response = Response<ResponseBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    F: Fn(&Request<RequestBody>) -> Option<Target> + Send + Sync + 'static,
    RequestBody: Send + 'static,
    ResponseBody: Default + Send + 'static,
{
    type Response = Response<ResponseBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<ResponseBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<RequestBody>) -> Self::Future {
        // The clone that was driven to ready serves this request (tower's usual swap).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let Some(target) = (self.classify)(&request) else {
            return Box::pin(inner.call(request));
        };
        let client = self.client.clone();
        Box::pin(async move {
            let decision = client.check(&target.tenant, &target.key, target.cost).await;
            if decision.allowed {
                return inner.call(request).await;
            }
            let grpc = request
                .headers()
                .get(http::header::CONTENT_TYPE)
                .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"));
            Ok(refusal(&decision, &target, grpc))
        })
    }
}

/// The answer to a refused request.
pub(crate) fn refusal<B: Default>(decision: &Decision, target: &Target, grpc: bool) -> Response<B> {
    let mut response = Response::new(B::default());
    if !grpc {
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    }
    let headers = response.headers_mut();
    let retry_after = retry_after_seconds(decision);
    if grpc {
        // Trailers-only: HTTP 200 with the status in the headers, as gRPC expects.
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        headers.insert("grpc-status", HeaderValue::from_static("8"));
        if let Ok(message) = HeaderValue::from_str(&format!(
            "rate limited: {} {}",
            target.tenant.escape_default(),
            target.key.escape_default()
        )) {
            headers.insert("grpc-message", message);
        }
    }
    if let Some(seconds) = retry_after {
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    let (policy, state) = ratelimit_fields(decision, retry_after);
    if let (Ok(policy), Ok(state)) = (
        HeaderValue::from_str(&policy),
        HeaderValue::from_str(&state),
    ) {
        headers.insert("ratelimit-policy", policy);
        headers.insert("ratelimit", state);
    }
    response
}

/// Whole seconds, rounded up; none under a second (weir's rule: a client told "1" for a
/// wait of 10 ms would idle for nothing).
fn retry_after_seconds(decision: &Decision) -> Option<u64> {
    let wait = decision.retry_after.as_secs_f64();
    (wait >= 1.0).then(|| wait.ceil() as u64)
}

/// `RateLimit-Policy: "weir";q=<quota>;w=<window>` and `RateLimit: "weir";r=<left>;t=<s>`,
/// as weir's refusals write them: the window widened until the quota is a whole number for
/// slow rates.
fn ratelimit_fields(decision: &Decision, retry_after: Option<u64>) -> (String, String) {
    let rate = decision.limit.rate;
    let window = if rate >= 1.0 || rate <= 0.0 {
        1.0
    } else {
        (1.0 / rate).ceil()
    };
    let quota = (rate * window).round().max(0.0) as u64;
    let until = retry_after.unwrap_or_else(|| decision.retry_after.as_secs_f64().floor() as u64);
    (
        format!("\"weir\";q={quota};w={window}"),
        format!("\"weir\";r={};t={until}", decision.remaining),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limit, Source};
    use std::time::Duration;

    fn refused(retry_after: Duration, rate: f64) -> Decision {
        Decision::refused(Limit { rate, burst: 10 }, retry_after, 2, Source::Lease)
    }

    #[test]
    fn a_refusal_is_429_with_weir_s_headers() {
        let target = Target::new("t", "k");
        let response: Response<String> =
            refusal(&refused(Duration::from_millis(1500), 100.0), &target, false);
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        let header = |name: &str| response.headers()[name].to_str().unwrap().to_string();
        assert_eq!(header("retry-after"), "2");
        assert_eq!(header("ratelimit-policy"), "\"weir\";q=100;w=1");
        assert_eq!(header("ratelimit"), "\"weir\";r=2;t=2");
        let quick: Response<String> =
            refusal(&refused(Duration::from_millis(10), 0.25), &target, false);
        assert!(quick.headers().get("retry-after").is_none());
        assert_eq!(quick.headers()["ratelimit-policy"], "\"weir\";q=1;w=4");
        assert_eq!(quick.headers()["ratelimit"], "\"weir\";r=2;t=0");
    }

    #[test]
    fn a_grpc_refusal_is_resource_exhausted() {
        let response: Response<String> =
            refusal(&refused(Duration::ZERO, 1.0), &Target::new("t", "k"), true);
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["grpc-status"], "8");
    }
}

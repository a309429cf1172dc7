//! The admission API over gRPC (`weir.admission.v1.Admission`) and Envoy's rate-limit service
//! (`envoy.service.ratelimit.v3.RateLimitService`), on `--grpc-addr`. Both are thin: each call
//! becomes one engine call, and its answer is turned back. No limit logic lives here.

use std::sync::Arc;
use std::time::Duration;

use engine::{AdmissionError, Allowed};
use runtime_config::{Algorithm, LimitSpec};
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::admission_common::{
    allow_checked, authorized_tenant, check_lease_id, check_names, code_and_reason, source_name,
    BatchTenants, CheckedAsk, NameError, DEFAULT_LEASE_TTL,
};
use crate::auth::{Denied, Door, Peer, Source};
use crate::state::AppState;

/// The generated types, in their packages' module tree (prost's cross-references need it).
pub mod proto {
    pub mod weir {
        pub mod admission {
            pub mod v1 {
                include!(concat!(env!("OUT_DIR"), "/weir.admission.v1.rs"));
            }
        }
    }
    pub mod envoy {
        pub mod config {
            pub mod core {
                pub mod v3 {
                    include!(concat!(env!("OUT_DIR"), "/envoy.config.core.v3.rs"));
                }
            }
        }
        pub mod extensions {
            pub mod common {
                pub mod ratelimit {
                    pub mod v3 {
                        include!(concat!(
                            env!("OUT_DIR"),
                            "/envoy.extensions.common.ratelimit.v3.rs"
                        ));
                    }
                }
            }
        }
        pub mod r#type {
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/envoy.r#type.v3.rs"));
            }
        }
        pub mod service {
            pub mod ratelimit {
                pub mod v3 {
                    include!(concat!(env!("OUT_DIR"), "/envoy.service.ratelimit.v3.rs"));
                }
            }
        }
    }
}

use proto::envoy::service::ratelimit::v3 as rls;
use proto::weir::admission::v1 as api;

impl From<NameError> for Status {
    fn from(err: NameError) -> Status {
        Status::with_error_details(
            Code::InvalidArgument,
            err.to_string(),
            ErrorDetails::with_error_info(err.reason(), "weir", no_metadata()),
        )
    }
}

impl From<Denied> for Status {
    fn from(denied: Denied) -> Status {
        Status::with_error_details(
            denied.grpc_code(),
            denied.to_string(),
            ErrorDetails::with_error_info(denied.api_reason(), "weir", no_metadata()),
        )
    }
}

/// Who is calling: the connection's peer (put in each request by the listener, see
/// [`incoming`]) and the `authorization` metadata (`Bearer <token>` or `Basic …`).
fn source<T>(request: &Request<T>) -> Source<'_> {
    Source {
        peer: request.extensions().get::<Peer>(),
        authorization: request
            .metadata()
            .get("authorization")
            .map(|value| value.as_bytes()),
    }
}

/// A gRPC status with a `google.rpc.ErrorInfo` detail naming the reason.
fn status(err: AdmissionError) -> Status {
    let (code, reason) = code_and_reason(&err);
    let mut metadata = std::collections::HashMap::new();
    if let AdmissionError::WrongReplica { owner, .. } = &err {
        metadata.insert("owner".to_string(), owner.clone());
    }
    Status::with_error_details(
        code,
        err.to_string(),
        ErrorDetails::with_error_info(reason, "weir", metadata),
    )
}

fn no_metadata() -> std::collections::HashMap<String, String> {
    std::collections::HashMap::new()
}

fn duration(value: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: value.as_secs() as i64,
        nanos: value.subsec_nanos() as i32,
    }
}

/// A request's `ttl`: `default` when it sends none; a negative one is `BAD_TTL`, as the JSON
/// twin answers it (before, it was taken for no `ttl`).
fn ttl_of(value: Option<&prost_types::Duration>, default: Duration) -> Result<Duration, BadTtl> {
    let Some(value) = value else {
        return Ok(default);
    };
    from_duration(Some(value)).ok_or(BadTtl(*value))
}

/// A negative `ttl`, as sent.
struct BadTtl(prost_types::Duration);

impl From<BadTtl> for Status {
    fn from(BadTtl(ttl): BadTtl) -> Status {
        Status::with_error_details(
            Code::InvalidArgument,
            format!(
                "ttl must be ≥ 0, got {} s and {} ns (a slot's ttl is held between 0.001 and \
                 86400)",
                ttl.seconds, ttl.nanos
            ),
            ErrorDetails::with_error_info("BAD_TTL", "weir", no_metadata()),
        )
    }
}

fn from_duration(value: Option<&prost_types::Duration>) -> Option<Duration> {
    let value = value?;
    (value.seconds >= 0 && value.nanos >= 0)
        .then(|| Duration::new(value.seconds as u64, value.nanos as u32))
}

/// A client's spec; an unknown algorithm or a negative window is a BAD_SPEC.
pub fn spec_from_proto(spec: &api::LimitSpec) -> Result<LimitSpec, AdmissionError> {
    let algorithm = match api::Algorithm::try_from(spec.algorithm) {
        Ok(api::Algorithm::Unspecified | api::Algorithm::TokenBucket) => Algorithm::TokenBucket,
        Ok(api::Algorithm::SlidingWindow) => Algorithm::SlidingWindow,
        Ok(api::Algorithm::LeakyBucket) => Algorithm::LeakyBucket,
        Err(_) => {
            return Err(AdmissionError::BadSpec(format!(
                "unknown algorithm {}",
                spec.algorithm
            )))
        }
    };
    let window = match spec.window.as_ref() {
        None => Duration::from_secs(1),
        Some(window) => from_duration(Some(window))
            .ok_or_else(|| AdmissionError::BadSpec("window must not be negative".into()))?,
    };
    Ok(LimitSpec {
        algorithm,
        rate: spec.rate,
        burst: spec.burst,
        window,
        max_concurrent: spec.max_concurrent,
    })
}

pub fn spec_to_proto(spec: &LimitSpec) -> api::LimitSpec {
    api::LimitSpec {
        algorithm: match spec.algorithm {
            Algorithm::TokenBucket => api::Algorithm::TokenBucket,
            Algorithm::SlidingWindow => api::Algorithm::SlidingWindow,
            Algorithm::LeakyBucket => api::Algorithm::LeakyBucket,
        } as i32,
        rate: spec.rate,
        burst: spec.burst,
        window: Some(duration(spec.window)),
        max_concurrent: spec.max_concurrent,
    }
}

fn allow_response(answer: Allowed) -> api::AllowResponse {
    api::AllowResponse {
        allowed: answer.decision.allowed,
        remaining: answer.decision.remaining,
        retry_after: Some(duration(answer.decision.retry_after)),
        reset_after: Some(duration(answer.decision.reset_after)),
        limit_in_force: Some(spec_to_proto(&answer.limit)),
        delay: Some(duration(answer.decision.delay)),
        limit_source: source_name(answer.source).to_string(),
    }
}

pub struct AdmissionService {
    pub state: Arc<AppState>,
}

/// A batch item's error, as the batch answers it.
fn batch_error(status: Status) -> api::BatchError {
    api::BatchError {
        code: status.code() as i32,
        message: status.message().to_string(),
        reason: status
            .get_error_details()
            .error_info()
            .map(|info| info.reason.clone())
            .unwrap_or_default(),
    }
}

impl AdmissionService {
    /// An `AllowBatch` item's tenant, authenticated first (a refused item costs the tenant it
    /// names nothing), and the caller's limit, if it sent one.
    fn check_item<'a>(
        &self,
        tenants: &mut BatchTenants<'a>,
        caller: Source<'_>,
        one: &'a api::AllowRequest,
    ) -> Result<CheckedAsk<'a>, api::BatchError> {
        let tenant = tenants
            .check::<Status>(
                &self.state.auth,
                Door::AdmissionGrpc,
                caller,
                &one.tenant,
                &one.key,
            )
            .map_err(batch_error)?;
        let client = one.limit.as_ref().map(spec_from_proto).transpose();
        Ok(CheckedAsk {
            tenant,
            key: &one.key,
            cost: one.cost,
            limit: client.map_err(|err| batch_error(status(err)))?,
        })
    }

    async fn allow_one(
        &self,
        source: Source<'_>,
        request: &api::AllowRequest,
    ) -> Result<api::AllowResponse, Status> {
        // Authenticated first: a refused call costs the tenant it names nothing.
        let tenant = authorized_tenant(
            &self.state.auth,
            Door::AdmissionGrpc,
            source,
            &request.tenant,
        )?;
        check_names(&tenant, &request.key)?;
        let client = request
            .limit
            .as_ref()
            .map(spec_from_proto)
            .transpose()
            .map_err(status)?;
        self.state
            .limiter
            .allow(&tenant, &request.key, request.cost, client)
            .await
            .map(allow_response)
            .map_err(status)
    }
}

#[tonic::async_trait]
impl api::admission_server::Admission for AdmissionService {
    async fn allow(
        &self,
        request: Request<api::AllowRequest>,
    ) -> Result<Response<api::AllowResponse>, Status> {
        self.allow_one(source(&request), request.get_ref())
            .await
            .map(Response::new)
    }

    async fn allow_batch(
        &self,
        request: Request<api::AllowBatchRequest>,
    ) -> Result<Response<api::AllowBatchResponse>, Status> {
        use api::allow_batch_response::{result, Result as Item};
        // One caller for the whole batch: looking the `authorization` metadata up again for
        // each item cost 2 % of the server's CPU on batches of 100.
        let caller = source(&request);
        let requests = &request.get_ref().requests;
        let mut tenants = BatchTenants::default();
        let checked = (requests.iter())
            .map(|one| self.check_item(&mut tenants, caller, one))
            .collect();
        let results = allow_checked(&self.state.limiter, checked, |answer| {
            let result = match answer {
                Ok(Ok(answer)) => result::Result::Response(allow_response(answer)),
                Ok(Err(err)) => result::Result::Error(batch_error(status(err))),
                Err(err) => result::Result::Error(err),
            };
            Item {
                result: Some(result),
            }
        })
        .await;
        Ok(Response::new(api::AllowBatchResponse { results }))
    }

    async fn acquire(
        &self,
        request: Request<api::AcquireRequest>,
    ) -> Result<Response<api::AcquireResponse>, Status> {
        let caller = source(&request);
        let request = request.get_ref();
        let tenant = authorized_tenant(
            &self.state.auth,
            Door::AdmissionGrpc,
            caller,
            &request.tenant,
        )?;
        check_names(&tenant, &request.key)?;
        let ttl = ttl_of(request.ttl.as_ref(), DEFAULT_LEASE_TTL)?;
        let client = request
            .limit
            .as_ref()
            .map(spec_from_proto)
            .transpose()
            .map_err(status)?;
        let acquisition = self
            .state
            .limiter
            .acquire(&tenant, &request.key, client, ttl)
            .await
            .map_err(status)?;
        Ok(Response::new(api::AcquireResponse {
            granted: acquisition.granted,
            lease_id: acquisition.lease_id.unwrap_or_default(),
            in_flight: acquisition.in_flight,
            limit: acquisition.limit.max_concurrent,
            retry_after: Some(duration(acquisition.retry_after)),
        }))
    }

    async fn release(
        &self,
        request: Request<api::ReleaseRequest>,
    ) -> Result<Response<api::ReleaseResponse>, Status> {
        // A lease ID names no tenant the caller must hold; the caller must still be known.
        self.state
            .auth
            .authenticate(Door::AdmissionGrpc, source(&request))?;
        check_lease_id(&request.get_ref().lease_id)?;
        self.state
            .limiter
            .release(&request.get_ref().lease_id)
            .await
            .map_err(status)?;
        Ok(Response::new(api::ReleaseResponse {}))
    }

    async fn renew(
        &self,
        request: Request<api::RenewRequest>,
    ) -> Result<Response<api::RenewResponse>, Status> {
        self.state
            .auth
            .authenticate(Door::AdmissionGrpc, source(&request))?;
        let request = request.get_ref();
        check_lease_id(&request.lease_id)?;
        let ttl = ttl_of(request.ttl.as_ref(), DEFAULT_LEASE_TTL)?;
        self.state
            .limiter
            .renew(&request.lease_id, ttl)
            .await
            .map_err(status)?;
        Ok(Response::new(api::RenewResponse {}))
    }

    async fn lease(
        &self,
        request: Request<api::LeaseRequest>,
    ) -> Result<Response<api::LeaseResponse>, Status> {
        /// A token lease's lifetime when the client names none: long enough to ride out a
        /// few missed refills, short enough that a dead client's tokens come back soon.
        const DEFAULT_TOKEN_LEASE_TTL: Duration = Duration::from_secs(5);
        let caller = source(&request);
        let request = request.get_ref();
        let tenant = authorized_tenant(
            &self.state.auth,
            Door::AdmissionGrpc,
            caller,
            &request.tenant,
        )?;
        check_names(&tenant, &request.key)?;
        let previous = if request.previous_lease_id.is_empty() {
            None
        } else {
            check_lease_id(&request.previous_lease_id)?;
            Some((request.previous_lease_id.as_str(), request.spent))
        };
        let ttl = ttl_of(request.ttl.as_ref(), DEFAULT_TOKEN_LEASE_TTL)?;
        let lent = self
            .state
            .limiter
            .lease(
                &tenant,
                &request.key,
                request.want,
                ttl,
                previous,
                request.give_back,
            )
            .await
            .map_err(status)?;
        Ok(Response::new(api::LeaseResponse {
            granted: lent.granted,
            outstanding: lent.outstanding,
            lease_id: lent.lease_id,
            ttl: Some(duration(ttl)),
            limit_in_force: Some(spec_to_proto(&lent.limit)),
            retry_after: Some(duration(lent.retry_after)),
            limit_source: source_name(lent.source).to_string(),
        }))
    }
}

/// Envoy's rate-limit service: each descriptor is matched against `envoy_domains` and
/// decided as an admission key of the domain's tenant.
pub struct RateLimitService {
    pub state: Arc<AppState>,
}

#[tonic::async_trait]
impl rls::rate_limit_service_server::RateLimitService for RateLimitService {
    async fn should_rate_limit(
        &self,
        request: Request<rls::RateLimitRequest>,
    ) -> Result<Response<rls::RateLimitResponse>, Status> {
        use rls::rate_limit_response::{
            rate_limit::Unit, Code as RlsCode, DescriptorStatus, RateLimit,
        };
        // The caller is the proxy (Envoy), not the end user: it must be known before it
        // learns which domains exist, and its credential must cover the domain's tenant.
        let caller = source(&request);
        self.state.auth.authenticate(Door::Rls, caller)?;
        let request = request.get_ref();
        let config = self.state.limiter.runtime_config();
        let Some(domain) = config
            .envoy_domains
            .iter()
            .find(|domain| domain.domain == request.domain)
        else {
            return Err(Status::with_error_details(
                Code::NotFound,
                format!("no envoy_domains entry for domain {:?}", request.domain),
                ErrorDetails::with_error_info("UNKNOWN_DOMAIN", "weir", no_metadata()),
            ));
        };
        // The domain's tenant comes from the config, not the request, but it names the tenant
        // in gossip and store keys like any other: the push path's rules apply.
        crate::tenant::validate(domain.tenant()).map_err(NameError::Tenant)?;
        self.state
            .auth
            .authorize(Door::Rls, caller, Some(domain.tenant().as_bytes()))?;
        let mut overall = RlsCode::Ok;
        let mut statuses = Vec::with_capacity(request.descriptors.len());
        for descriptor in &request.descriptors {
            let entries: Vec<(&str, &str)> = descriptor
                .entries
                .iter()
                .map(|entry| (entry.key.as_str(), entry.value.as_str()))
                .collect();
            let hits = descriptor
                .hits_addend
                .unwrap_or(request.hits_addend.max(1) as u64)
                .max(1);
            // A limit sent with the descriptor applies where the tenant allows client limits.
            let client = descriptor.limit.as_ref().and_then(|limit| {
                runtime_config::envoy::Unit::from_envoy_code(limit.unit).map(|unit| {
                    runtime_config::envoy::EnvoyRateLimit {
                        unit,
                        requests_per_unit: limit.requests_per_unit,
                    }
                    .spec()
                })
            });
            let Some(matched) = domain.matches(&entries) else {
                statuses.push(DescriptorStatus {
                    code: RlsCode::Ok as i32,
                    ..DescriptorStatus::default()
                });
                continue;
            };
            let key = format!("envoy:{}:{}", domain.domain, matched.key);
            // Descriptor values come from the proxied request (a path, an address).
            check_names(domain.tenant(), &key)?;
            let operator = matched.limit.spec();
            let spec = match client {
                Some(client)
                    if config
                        .admission
                        .tenants
                        .get(domain.tenant())
                        .is_some_and(|t| t.allow_client_limits) =>
                {
                    client
                }
                _ => operator,
            };
            let answer = self
                .state
                .limiter
                .allow_with_limit(domain.tenant(), &key, hits, spec)
                .await;
            let current_limit = Some(RateLimit {
                name: matched.key.clone(),
                requests_per_unit: matched.limit.requests_per_unit,
                unit: Unit::try_from(matched.limit.unit.envoy_code()).unwrap_or(Unit::Unknown)
                    as i32,
            });
            let answer = match answer {
                Ok(answer) => answer,
                // A limit that a descriptor can never meet (hits over the limit) is over it,
                // for as long as a window: what Envoy puts in its X-RateLimit headers.
                Err(AdmissionError::BadCost(_)) => {
                    overall = RlsCode::OverLimit;
                    statuses.push(DescriptorStatus {
                        code: RlsCode::OverLimit as i32,
                        current_limit,
                        limit_remaining: 0,
                        duration_until_reset: Some(duration(spec.window)),
                        quota: None,
                    });
                    continue;
                }
                Err(err) => return Err(status(err)),
            };
            let code = if answer.decision.allowed {
                RlsCode::Ok
            } else {
                overall = RlsCode::OverLimit;
                RlsCode::OverLimit
            };
            statuses.push(DescriptorStatus {
                code: code as i32,
                current_limit,
                limit_remaining: answer.decision.remaining.min(u32::MAX as u64) as u32,
                duration_until_reset: Some(duration(answer.decision.reset_after)),
                quota: None,
            });
        }
        Ok(Response::new(rls::RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            ..rls::RateLimitResponse::default()
        }))
    }
}

/// One gRPC connection, plain or TLS, carrying its [`Peer`] as tonic's connect info, so each
/// request's extensions hold the caller's address and verified client certificate.
pub struct Connection {
    stream: Stream,
    peer: Peer,
}

enum Stream {
    Plain(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>),
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.peer.clone()
    }
}

impl tokio::io::AsyncRead for Connection {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(stream) => std::pin::Pin::new(stream).poll_read(cx, buf),
            Stream::Tls(stream) => std::pin::Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for Connection {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match &mut self.get_mut().stream {
            Stream::Plain(stream) => std::pin::Pin::new(stream).poll_write(cx, buf),
            Stream::Tls(stream) => std::pin::Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    // Vectored writes passed through: without them h2 sends a frame's header and a payload
    // over 1 KiB (an AllowBatch answer) in two writes where one writev does.
    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match &mut self.get_mut().stream {
            Stream::Plain(stream) => std::pin::Pin::new(stream).poll_write_vectored(cx, bufs),
            Stream::Tls(stream) => {
                std::pin::Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs)
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Plain(stream) => stream.is_write_vectored(),
            Stream::Tls(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(stream) => std::pin::Pin::new(stream).poll_flush(cx),
            Stream::Tls(stream) => std::pin::Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(stream) => std::pin::Pin::new(stream).poll_shutdown(cx),
            Stream::Tls(stream) => std::pin::Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The gRPC listener's connections. With `tls` each handshake runs in a task of its own,
/// within `handshake_timeout`, so a slow client holds up no other; a failed one is dropped.
/// Accepting stops when the server drops the stream.
pub fn incoming(
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handshake_timeout: Duration,
) -> tokio_stream::wrappers::ReceiverStream<Result<Connection, std::io::Error>> {
    let (connection_tx, connection_rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = connection_tx.closed() => return,
            };
            let (stream, remote) = match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::warn!(%err, "accepting a gRPC connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let connection_tx = connection_tx.clone();
            let Some(tls) = tls.clone() else {
                let connection = Connection {
                    stream: Stream::Plain(stream),
                    peer: Peer::with_certificates(Some(remote), None),
                };
                if connection_tx.send(Ok(connection)).await.is_err() {
                    return;
                }
                continue;
            };
            tokio::spawn(async move {
                match tokio::time::timeout(handshake_timeout, tls.accept(stream)).await {
                    Ok(Ok(stream)) => {
                        // Verified in the handshake (--grpc-tls-client-ca-file).
                        let peer = Peer::with_certificates(
                            Some(remote),
                            stream.get_ref().1.peer_certificates(),
                        );
                        let connection = Connection {
                            stream: Stream::Tls(Box::new(stream)),
                            peer,
                        };
                        let _ = connection_tx.send(Ok(connection)).await;
                    }
                    Ok(Err(err)) => tracing::debug!(%remote, %err, "gRPC TLS handshake failed"),
                    Err(_) => tracing::debug!(%remote, "no gRPC TLS handshake in time"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(connection_rx)
}

//! Tenant authentication: who may spend a tenant's limits. One decision, [`Authenticator::authorize`],
//! that every door calls before any tenant limit is touched: remote-write and OTLP pushes,
//! the admission API's JSON twin and gRPC service, and Envoy's rate-limit service.
//!
//! `--tenant-auth` chooses the proof:
//! - `header`: none; the tenant is whatever the request names (a trusted proxy in front
//!   authenticates). The default, with a loud warning at start-up.
//! - `tokens`: `Authorization: Bearer <token>` or `Basic <user:password>`, looked up in
//!   `--auth-credentials-file`.
//! - `mtls`: the verified client certificate's names (subject CN, DNS/URI/email SANs), looked
//!   up in the same file.
//!
//! The file holds only SHA-256 digests of secrets. A weir credential is a machine's
//! (Prometheus, an agent, a proxy), generated (`openssl rand -hex 32`: 256 bits), not a
//! person's password; a slow password hash (argon2) protects guessable secrets, and costs
//! tens of milliseconds a check, which would cap a core at a few dozen pushes a second. For
//! high-entropy secrets one SHA-256 is as safe (no preimage search can find 256 bits) and
//! costs well under a microsecond, so nothing needs caching. A presented token's digest is
//! looked up in a hash map: its timing can only tell about the digest, never the token.
//! Basic passwords are compared digest to digest in constant time.
//!
//! Repeated failures from one source (an IP address; an IPv6 /64) are limited in
//! [`FailureTable`]: past its burst, the source is answered 429 before any lookup, whatever it
//! presents, until its failures leak away. Secrets are never logged, nor put in metrics.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::metrics::Metrics;
use crate::tenant::TENANT_HEADER;

/// How a request proves which tenants it may use (`--tenant-auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// No proof: the request names its tenant (a trusted proxy in front authenticates).
    Header,
    /// A bearer token or basic-auth user from --auth-credentials-file.
    Tokens,
    /// The verified client certificate (--http-tls-client-ca-file), mapped in
    /// --auth-credentials-file.
    Mtls,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Header => "header",
            Mode::Tokens => "tokens",
            Mode::Mtls => "mtls",
        }
    }
}

/// Where a request came in, for the failure metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    Push,
    Otlp,
    AdmissionHttp,
    AdmissionGrpc,
    Rls,
}

impl Door {
    pub const ALL: [Door; 5] = [
        Door::Push,
        Door::Otlp,
        Door::AdmissionHttp,
        Door::AdmissionGrpc,
        Door::Rls,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Door::Push => "push",
            Door::Otlp => "otlp",
            Door::AdmissionHttp => "admission_http",
            Door::AdmissionGrpc => "admission_grpc",
            Door::Rls => "rls",
        }
    }
}

/// Why a request was not let in. Messages never repeat what the client presented.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("no credentials: {0}")]
    Missing(&'static str),
    #[error("the Authorization header is not `Bearer <token>` or `Basic <base64 user:password>`")]
    Malformed,
    #[error("unknown credentials")]
    Unknown,
    #[error("these credentials may not use this tenant")]
    Forbidden,
    #[error(
        "these credentials may use several tenants: name one (a push: the {TENANT_HEADER} \
         header; the admission API: the request's tenant field)"
    )]
    Ambiguous,
    #[error("too many failed authentications from this address; retry in {}s", retry_after.as_secs().max(1))]
    Throttled { retry_after: Duration },
}

impl Denied {
    pub const REASONS: [&'static str; 6] = [
        "missing",
        "malformed",
        "unknown",
        "forbidden",
        "ambiguous",
        "throttled",
    ];

    /// The `reason` label of `weir_auth_failures_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Denied::Missing(_) => "missing",
            Denied::Malformed => "malformed",
            Denied::Unknown => "unknown",
            Denied::Forbidden => "forbidden",
            Denied::Ambiguous => "ambiguous",
            Denied::Throttled { .. } => "throttled",
        }
    }

    /// 401 for no or bad proof, 403 for a proof that does not cover the tenant, 400 when the
    /// tenant must be named, 429 for a throttled source.
    pub fn status(&self) -> axum::http::StatusCode {
        use axum::http::StatusCode;
        match self {
            Denied::Missing(_) | Denied::Malformed | Denied::Unknown => StatusCode::UNAUTHORIZED,
            Denied::Forbidden => StatusCode::FORBIDDEN,
            Denied::Ambiguous => StatusCode::BAD_REQUEST,
            Denied::Throttled { .. } => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// The gRPC code of the same answer.
    pub fn grpc_code(&self) -> tonic::Code {
        match self {
            Denied::Missing(_) | Denied::Malformed | Denied::Unknown => {
                tonic::Code::Unauthenticated
            }
            Denied::Forbidden => tonic::Code::PermissionDenied,
            Denied::Ambiguous => tonic::Code::InvalidArgument,
            Denied::Throttled { .. } => tonic::Code::ResourceExhausted,
        }
    }

    /// The `google.rpc.ErrorInfo` / JSON reason.
    pub fn api_reason(&self) -> &'static str {
        match self {
            Denied::Missing(_) | Denied::Malformed | Denied::Unknown => "UNAUTHENTICATED",
            Denied::Forbidden => "TENANT_FORBIDDEN",
            Denied::Ambiguous => "TENANT_AMBIGUOUS",
            Denied::Throttled { .. } => "AUTH_THROTTLED",
        }
    }

    /// Whether this refusal spends from the source's failure budget: a missing, bad or
    /// misused credential does; naming no tenant, or being throttled already, does not.
    fn counts_as_failure(&self) -> bool {
        matches!(
            self,
            Denied::Missing(_) | Denied::Malformed | Denied::Unknown | Denied::Forbidden
        )
    }
}

/// The connection a request came on: its peer address and, over mutual TLS, the names of its
/// verified client certificate. Put in each request's extensions by the listeners.
#[derive(Debug, Clone, Default)]
pub struct Peer {
    pub addr: Option<SocketAddr>,
    /// Subject CNs, then DNS, URI and email SANs, in the certificate's order.
    pub certificate: Option<Arc<[String]>>,
}

impl Peer {
    /// The peer of a TLS connection: `certificates` is what rustls verified (the end entity
    /// first), `None` without a client certificate.
    pub fn with_certificates(
        addr: Option<SocketAddr>,
        certificates: Option<&[rustls::pki_types::CertificateDer<'_>]>,
    ) -> Peer {
        let certificate = certificates
            .and_then(|chain| chain.first())
            .map(|end_entity| certificate_names(end_entity.as_ref()).into());
        Peer { addr, certificate }
    }
}

/// The names a client certificate can be mapped by: its subject's common names, then its DNS,
/// URI and email subject alternative names. A certificate that does not parse has none (it
/// was verified by rustls already; this only reads names out of it).
pub fn certificate_names(der: &[u8]) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, certificate)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let mut names: Vec<String> = certificate
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_string))
        .collect();
    if let Ok(Some(san)) = certificate.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(name)
                | GeneralName::URI(name)
                | GeneralName::RFC822Name(name) => names.push(name.to_string()),
                _ => {}
            }
        }
    }
    names.truncate(MAX_CERTIFICATE_NAMES);
    names
}

/// A certificate's names looked at, at most: a certificate with thousands of SANs costs no
/// more than this many lookups a request.
const MAX_CERTIFICATE_NAMES: usize = 64;

/// Which tenants a credential may use.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tenants {
    Any,
    Listed(Vec<String>),
}

/// One credential's grant.
#[derive(Debug)]
struct Grant {
    /// The entry's name, for logs: never the secret.
    name: String,
    tenants: Tenants,
}

/// `--auth-credentials-file`, as written. Each entry has exactly one proof: `bearer_sha256`,
/// `basic_user` with `basic_password_sha256`, or `certificate`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CredentialsFile {
    #[serde(default)]
    credentials: Vec<CredentialEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CredentialEntry {
    /// What logs call this credential (unique; letters, digits, `.`, `_`, `-`, `@`, `:`).
    name: String,
    /// Hex SHA-256 of a bearer token: `printf %s "$TOKEN" | sha256sum`.
    #[serde(default)]
    bearer_sha256: Option<String>,
    /// A basic-auth user name.
    #[serde(default)]
    basic_user: Option<String>,
    /// Hex SHA-256 of that user's password (a generated secret, like a token).
    #[serde(default)]
    basic_password_sha256: Option<String>,
    /// A client certificate's subject CN, or one of its DNS, URI or email SANs.
    #[serde(default)]
    certificate: Option<String>,
    /// The tenants this credential may use.
    #[serde(default)]
    tenants: Vec<String>,
    /// Any tenant (a trusted gateway's credential); then `tenants` must be empty.
    #[serde(default)]
    any_tenant: bool,
}

/// The credentials in force, indexed for lookup.
#[derive(Debug, Default)]
pub struct Credentials {
    bearer: HashMap<[u8; 32], Arc<Grant>>,
    basic: HashMap<String, ([u8; 32], Arc<Grant>)>,
    certificate: HashMap<String, Arc<Grant>>,
    /// Hex SHA-256 of the file's bytes.
    sha256: String,
}

/// Longest credentials file read: a file this size holds tens of thousands of entries.
const MAX_FILE_BYTES: u64 = 16 << 20;

impl Credentials {
    /// Parses and checks a credentials file. Errors name the entry, never a secret.
    pub fn parse(text: &str) -> Result<Credentials, String> {
        if runtime_config::config::too_deeply_nested(text) {
            return Err("not a credentials file: `[`/`{` nested too deep".to_string());
        }
        let file: CredentialsFile = serde_yaml_ng::from_str(text)
            .map_err(|err| format!("not a credentials file: {err}"))?;
        let mut credentials = Credentials {
            sha256: hex(&Sha256::digest(text.as_bytes())),
            ..Credentials::default()
        };
        let mut names = std::collections::HashSet::new();
        for (index, entry) in file.credentials.into_iter().enumerate() {
            let place = format!("credential {} ({:?})", index + 1, entry.name);
            let name_ok = |c: char| c.is_ascii_alphanumeric() || "._-@:".contains(c);
            if entry.name.is_empty() || entry.name.len() > 128 || !entry.name.chars().all(name_ok) {
                return Err(format!(
                    "credential {}: name must be 1 to 128 letters, digits, `.`, `_`, `-`, `@` \
                     or `:`",
                    index + 1
                ));
            }
            if !names.insert(entry.name.clone()) {
                return Err(format!("{place}: the name is used twice"));
            }
            let tenants = match (entry.any_tenant, entry.tenants.is_empty()) {
                (true, true) => Tenants::Any,
                (true, false) => return Err(format!("{place}: any_tenant with a tenants list")),
                (false, true) => return Err(format!("{place}: no tenants (or any_tenant: true)")),
                (false, false) => {
                    for tenant in &entry.tenants {
                        crate::tenant::validate(tenant)
                            .map_err(|err| format!("{place}: tenant {tenant:?}: {err}"))?;
                    }
                    Tenants::Listed(entry.tenants)
                }
            };
            let grant = Arc::new(Grant {
                name: entry.name,
                tenants,
            });
            match (
                entry.bearer_sha256,
                entry.basic_user,
                entry.basic_password_sha256,
                entry.certificate,
            ) {
                (Some(digest), None, None, None) => {
                    let digest = parse_digest(&digest).map_err(|err| format!("{place}: {err}"))?;
                    if credentials.bearer.insert(digest, grant).is_some() {
                        return Err(format!("{place}: the same bearer token is listed twice"));
                    }
                }
                (None, Some(user), Some(digest), None) => {
                    if user.is_empty() || user.contains(':') || user.chars().any(char::is_control) {
                        return Err(format!(
                            "{place}: basic_user must be non-empty, without `:` or control \
                             characters"
                        ));
                    }
                    let digest = parse_digest(&digest).map_err(|err| format!("{place}: {err}"))?;
                    if credentials.basic.insert(user, (digest, grant)).is_some() {
                        return Err(format!("{place}: the basic_user is listed twice"));
                    }
                }
                (None, None, None, Some(identity)) => {
                    if identity.is_empty() {
                        return Err(format!("{place}: certificate must not be empty"));
                    }
                    if credentials.certificate.insert(identity, grant).is_some() {
                        return Err(format!("{place}: the certificate name is listed twice"));
                    }
                }
                _ => {
                    return Err(format!(
                        "{place}: give exactly one of bearer_sha256, basic_user with \
                         basic_password_sha256, or certificate"
                    ))
                }
            }
        }
        Ok(credentials)
    }

    /// Entries in force.
    pub fn len(&self) -> usize {
        self.bearer.len() + self.basic.len() + self.certificate.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn parse_digest(text: &str) -> Result<[u8; 32], String> {
    let text = text.trim();
    let bytes = text.as_bytes();
    if bytes.len() != 64 || !bytes.iter().all(u8::is_ascii_hexdigit) {
        return Err("a digest must be 64 hex digits (sha256sum's output)".to_string());
    }
    let mut digest = [0u8; 32];
    for (index, pair) in bytes.chunks(2).enumerate() {
        let pair = std::str::from_utf8(pair).map_err(|_| "not hex".to_string())?;
        digest[index] = u8::from_str_radix(pair, 16).map_err(|_| "not hex".to_string())?;
    }
    Ok(digest)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// What a request presents in its `Authorization` header.
#[derive(Debug, PartialEq, Eq)]
pub enum Presented {
    Bearer(Vec<u8>),
    Basic { user: String, password: Vec<u8> },
}

/// Longest `Authorization` value looked at; longer is malformed.
const MAX_AUTHORIZATION_BYTES: usize = 8192;

/// Reads an `Authorization` value: `Bearer <token>` or `Basic <base64 of user:password>`,
/// the scheme in any case (RFC 9110). `None` for no header; `Err` for anything else.
pub fn parse_authorization(value: Option<&[u8]>) -> Result<Option<Presented>, Denied> {
    let Some(value) = value else {
        return Ok(None);
    };
    if value.len() > MAX_AUTHORIZATION_BYTES {
        return Err(Denied::Malformed);
    }
    let text = std::str::from_utf8(value).map_err(|_| Denied::Malformed)?;
    let (scheme, rest) = text.trim().split_once(' ').ok_or(Denied::Malformed)?;
    let rest = rest.trim();
    if rest.is_empty() {
        return Err(Denied::Malformed);
    }
    if scheme.eq_ignore_ascii_case("bearer") {
        Ok(Some(Presented::Bearer(rest.as_bytes().to_vec())))
    } else if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(rest)
            .map_err(|_| Denied::Malformed)?;
        let colon = decoded
            .iter()
            .position(|&byte| byte == b':')
            .ok_or(Denied::Malformed)?;
        let user = String::from_utf8(decoded[..colon].to_vec()).map_err(|_| Denied::Malformed)?;
        Ok(Some(Presented::Basic {
            user,
            password: decoded[colon + 1..].to_vec(),
        }))
    } else {
        Err(Denied::Malformed)
    }
}

/// The failure budget of each source: `burst` failures at once, refilled at `rate` per second.
#[derive(Debug, Clone, Copy)]
pub struct FailureLimits {
    pub rate: f64,
    pub burst: f64,
}

/// Recent authentication failures by source, bounded. Each source is a leaky bucket of
/// failures; a source whose bucket is full is refused before its credentials are looked at.
/// When [`MAX_SOURCES`] sources are tracked, emptied buckets are dropped (at most once a
/// second); if none is, new sources share one overflow bucket, so a flood from many addresses
/// costs no more memory, and is throttled together.
///
/// A `std::sync::Mutex`: nothing waits while it is held, and only failures take it.
pub struct FailureTable {
    limits: FailureLimits,
    inner: Mutex<FailureState>,
}

/// Most sources tracked at once.
pub const MAX_SOURCES: usize = 10_000;

struct FailureState {
    buckets: HashMap<IpAddr, Bucket>,
    last_sweep: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Failures not yet leaked away, as of `at`.
    level: f64,
    at: Instant,
}

impl Bucket {
    fn level_at(&self, now: Instant, rate: f64) -> f64 {
        let leaked = now.saturating_duration_since(self.at).as_secs_f64() * rate;
        (self.level - leaked).max(0.0)
    }
}

/// The bucket all sources share once the table is full.
const OVERFLOW: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);

/// A source: an IPv4 address, or an IPv6 /64 (one host usually holds a whole /64).
fn source_of(addr: Option<SocketAddr>) -> IpAddr {
    match addr.map(|addr| addr.ip()) {
        Some(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let segments = v6.segments();
                IpAddr::V6(Ipv6Addr::new(
                    segments[0],
                    segments[1],
                    segments[2],
                    segments[3],
                    0,
                    0,
                    0,
                    0,
                ))
            }
        },
        Some(v4) => v4,
        None => OVERFLOW,
    }
}

impl FailureTable {
    pub fn new(limits: FailureLimits) -> FailureTable {
        FailureTable {
            limits,
            inner: Mutex::new(FailureState {
                buckets: HashMap::new(),
                last_sweep: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FailureState> {
        self.inner.lock().unwrap_or_else(|err| err.into_inner())
    }

    /// `Some(wait)` when `source` has no failure left to spend: how long until it has one.
    pub fn throttled(&self, source: IpAddr, now: Instant) -> Option<Duration> {
        let state = self.lock();
        let bucket = state.buckets.get(&source).or_else(|| {
            state
                .buckets
                .get(&OVERFLOW)
                .filter(|_| self.is_full(&state))
        })?;
        let level = bucket.level_at(now, self.limits.rate);
        let over = level + 1.0 - self.limits.burst;
        (over > 0.0).then(|| Duration::from_secs_f64(over / self.limits.rate.max(1e-9)))
    }

    fn is_full(&self, state: &FailureState) -> bool {
        state.buckets.len() >= MAX_SOURCES
    }

    /// Counts one failure from `source`.
    pub fn record(&self, source: IpAddr, now: Instant) {
        let rate = self.limits.rate;
        let mut state = self.lock();
        let mut key = source;
        if !state.buckets.contains_key(&source) && self.is_full(&state) {
            let swept_lately = state
                .last_sweep
                .is_some_and(|last| now.saturating_duration_since(last) < Duration::from_secs(1));
            if !swept_lately {
                state.last_sweep = Some(now);
                state
                    .buckets
                    .retain(|&ip, bucket| ip == OVERFLOW || bucket.level_at(now, rate) > 0.0);
            }
            if self.is_full(&state) {
                key = OVERFLOW;
            }
        }
        let bucket = state.buckets.entry(key).or_insert(Bucket {
            level: 0.0,
            at: now,
        });
        let level = bucket.level_at(now, rate);
        *bucket = Bucket {
            level: (level + 1.0).min(self.limits.burst),
            at: now,
        };
    }

    /// Sources tracked now.
    pub fn len(&self) -> usize {
        self.lock().buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a request brings to be authenticated.
#[derive(Debug, Clone, Copy, Default)]
pub struct Source<'a> {
    pub peer: Option<&'a Peer>,
    /// The `Authorization` header (HTTP) or metadata value (gRPC).
    pub authorization: Option<&'a [u8]>,
}

/// The answer of [`Authenticator::authorize`] that let a request in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allowed {
    /// Use the tenant the request named (always so under `header`).
    AsNamed,
    /// The request named none; its credential covers exactly this one.
    Tenant(String),
}

/// The reload metrics and failure counters.
struct AuthMetrics {
    failures: prometheus::IntCounterVec,
    reloads: prometheus::IntCounterVec,
    last_reload_successful: prometheus::IntGauge,
    credentials: prometheus::IntGauge,
    sources: prometheus::IntGauge,
}

/// The one place requests are authenticated. Lives in the shared `AppState`.
pub struct Authenticator {
    mode: Mode,
    file: Option<PathBuf>,
    credentials: ArcSwap<Credentials>,
    /// Hash of the bytes last looked at, good or bad: an unchanged file is not re-parsed, and
    /// a bad one is logged once.
    last_seen: Mutex<Option<String>>,
    failures: FailureTable,
    metrics: AuthMetrics,
}

impl Authenticator {
    /// Under `tokens` and `mtls`, reads `file`: a missing or bad file is an error (fatal at
    /// start-up).
    pub fn new(
        mode: Mode,
        file: Option<&Path>,
        limits: FailureLimits,
        metrics: &Metrics,
    ) -> anyhow::Result<Authenticator> {
        let metrics = AuthMetrics {
            failures: metrics.auth_failures.clone(),
            reloads: metrics.auth_credentials_reloads.clone(),
            last_reload_successful: metrics.auth_credentials_last_reload_successful.clone(),
            credentials: metrics.auth_credentials.clone(),
            sources: metrics.auth_failure_sources.clone(),
        };
        for door in Door::ALL {
            for reason in Denied::REASONS {
                metrics.failures.with_label_values(&[door.as_str(), reason]);
            }
        }
        let credentials = match (mode, file) {
            (Mode::Header, _) => Credentials::default(),
            (_, None) => anyhow::bail!(
                "--tenant-auth {} needs --auth-credentials-file",
                mode.as_str()
            ),
            (_, Some(path)) => read_credentials(path).map_err(|err| {
                anyhow::anyhow!("--auth-credentials-file {}: {err}", path.display())
            })?,
        };
        if mode != Mode::Header {
            metrics.last_reload_successful.set(1);
            metrics.reloads.with_label_values(&["ok"]).inc();
        }
        metrics.credentials.set(credentials.len() as i64);
        let last_seen = Mutex::new(Some(credentials.sha256.clone()));
        Ok(Authenticator {
            mode,
            file: if mode == Mode::Header {
                None
            } else {
                file.map(Path::to_path_buf)
            },
            credentials: ArcSwap::from_pointee(credentials),
            last_seen,
            failures: FailureTable::new(limits),
            metrics,
        })
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Entries in force.
    pub fn credentials(&self) -> usize {
        self.credentials.load().len()
    }

    /// Re-reads the credentials file if its content changed; a bad file is logged (once) and
    /// the last good credentials stay in force.
    pub fn reload_if_changed(&self) {
        let Some(path) = &self.file else {
            return;
        };
        let bytes = match read_limited(path, MAX_FILE_BYTES) {
            Ok(bytes) => bytes,
            Err(err) => {
                self.failed(path, &format!("read error: {err}"), &err);
                return;
            }
        };
        let sha256 = hex(&Sha256::digest(&bytes));
        {
            let mut last = self.last_seen.lock().unwrap_or_else(|e| e.into_inner());
            if last.as_deref() == Some(sha256.as_str()) {
                return;
            }
            *last = Some(sha256.clone());
        }
        let parsed = String::from_utf8(bytes)
            .map_err(|_| "not UTF-8".to_string())
            .and_then(|text| Credentials::parse(&text));
        match parsed {
            Ok(credentials) => {
                let count = credentials.len();
                self.credentials.store(Arc::new(credentials));
                self.metrics.reloads.with_label_values(&["ok"]).inc();
                self.metrics.last_reload_successful.set(1);
                self.metrics.credentials.set(count as i64);
                tracing::info!(path = %path.display(), credentials = count, %sha256, "credentials reloaded");
            }
            Err(err) => {
                self.metrics.reloads.with_label_values(&["error"]).inc();
                self.metrics.last_reload_successful.set(0);
                tracing::error!(path = %path.display(), %err, "the credentials file is invalid; the last good credentials stay in force");
            }
        }
    }

    fn failed(&self, path: &Path, marker: &str, err: &impl std::fmt::Display) {
        let mut last = self.last_seen.lock().unwrap_or_else(|e| e.into_inner());
        if last.as_deref() != Some(marker) {
            *last = Some(marker.to_string());
            self.metrics.reloads.with_label_values(&["error"]).inc();
            tracing::error!(path = %path.display(), %err, "cannot read the credentials file; the last good credentials stay in force");
        }
        self.metrics.last_reload_successful.set(0);
    }

    /// Whether `source` may use the tenant `named` (the raw `X-Scope-OrgID` or request field;
    /// `None` or empty when the request names none). Runs before any tenant limit, so a
    /// refused request costs its tenant nothing. Counted by door and reason.
    pub fn authorize(
        &self,
        door: Door,
        source: Source<'_>,
        named: Option<&[u8]>,
    ) -> Result<Allowed, Denied> {
        self.authorize_item(door, source, named, &mut false)
    }

    /// [`Authenticator::authorize`] with the clock as an input.
    pub fn authorize_at(
        &self,
        door: Door,
        source: Source<'_>,
        named: Option<&[u8]>,
        now: Instant,
    ) -> Result<Allowed, Denied> {
        self.authorize_item_at(door, source, named, &mut false, now)
    }

    /// [`Authenticator::authorize`] for one item of a batch. The batch is one request, so
    /// its items spend at most one failure of the source's budget between them: `spent` says
    /// whether one has. (Otherwise a batch of 21 items naming another tenant would lock its
    /// source out of every door at once.)
    pub fn authorize_item(
        &self,
        door: Door,
        source: Source<'_>,
        named: Option<&[u8]>,
        spent: &mut bool,
    ) -> Result<Allowed, Denied> {
        // Header mode checks nothing, so it needs no clock: a clock read is 3 % of a batch.
        if self.mode == Mode::Header {
            return Ok(Allowed::AsNamed);
        }
        self.authorize_item_at(door, source, named, spent, Instant::now())
    }

    /// [`Authenticator::authorize_item`] with the clock as an input.
    pub fn authorize_item_at(
        &self,
        door: Door,
        source: Source<'_>,
        named: Option<&[u8]>,
        spent: &mut bool,
        now: Instant,
    ) -> Result<Allowed, Denied> {
        if self.mode == Mode::Header {
            return Ok(Allowed::AsNamed);
        }
        self.checked(door, source, now, spent, |grant| {
            tenant_of(grant, named.filter(|named| !named.is_empty()))
        })
    }

    /// Whether `source` carries valid credentials, for any tenant: for calls that name no
    /// tenant (a lease given back), and before a lookup that should not answer strangers.
    pub fn authenticate(&self, door: Door, source: Source<'_>) -> Result<(), Denied> {
        if self.mode == Mode::Header {
            return Ok(());
        }
        self.checked(door, source, Instant::now(), &mut false, |_| Ok(()))
    }

    /// The throttle, the credential, then `then` with its grant; refusals counted, and a
    /// failure spent from the source's budget unless `spent` (then set).
    fn checked<T>(
        &self,
        door: Door,
        source: Source<'_>,
        now: Instant,
        spent: &mut bool,
        then: impl FnOnce(&Grant) -> Result<T, Denied>,
    ) -> Result<T, Denied> {
        let from = source_of(source.peer.and_then(|peer| peer.addr));
        let decided = match self.failures.throttled(from, now) {
            Some(retry_after) => Err(Denied::Throttled { retry_after }),
            None => self.grant(source).and_then(|grant| then(&grant)),
        };
        if let Err(denied) = &decided {
            self.metrics
                .failures
                .with_label_values(&[door.as_str(), denied.reason()])
                .inc();
            if denied.counts_as_failure() && !std::mem::replace(spent, true) {
                self.failures.record(from, now);
                self.metrics.sources.set(self.failures.len() as i64);
            }
            tracing::debug!(door = door.as_str(), reason = denied.reason(), source = %from, "authentication refused");
        }
        decided
    }

    /// The grant of the credential `source` presents.
    fn grant(&self, source: Source<'_>) -> Result<Arc<Grant>, Denied> {
        let credentials = self.credentials.load();
        let grant = match self.mode {
            Mode::Header => {
                return Ok(Arc::new(Grant {
                    name: String::new(),
                    tenants: Tenants::Any,
                }))
            }
            Mode::Tokens => match parse_authorization(source.authorization)? {
                None => {
                    return Err(Denied::Missing(
                        "send Authorization: Bearer <token> or Basic",
                    ))
                }
                Some(Presented::Bearer(token)) => {
                    let digest: [u8; 32] = Sha256::digest(&token).into();
                    Arc::clone(credentials.bearer.get(&digest).ok_or(Denied::Unknown)?)
                }
                Some(Presented::Basic { user, password }) => {
                    let (digest, grant) = credentials.basic.get(&user).ok_or(Denied::Unknown)?;
                    let presented: [u8; 32] = Sha256::digest(&password).into();
                    if !bool::from(presented.ct_eq(digest)) {
                        return Err(Denied::Unknown);
                    }
                    Arc::clone(grant)
                }
            },
            Mode::Mtls => {
                let names = source
                    .peer
                    .and_then(|peer| peer.certificate.as_ref())
                    .ok_or(Denied::Missing("present a client certificate (mutual TLS)"))?;
                let grant = names
                    .iter()
                    .find_map(|name| credentials.certificate.get(name))
                    .ok_or(Denied::Unknown)?;
                Arc::clone(grant)
            }
        };
        Ok(grant)
    }
}

/// Whether `grant` covers the tenant `named`, or the one tenant to use when none is named.
fn tenant_of(grant: &Grant, named: Option<&[u8]>) -> Result<Allowed, Denied> {
    match (named, &grant.tenants) {
        (Some(_), Tenants::Any) => Ok(Allowed::AsNamed),
        (Some(named), Tenants::Listed(tenants)) => {
            if tenants.iter().any(|tenant| tenant.as_bytes() == named) {
                Ok(Allowed::AsNamed)
            } else {
                tracing::debug!(credential = %grant.name, "credential used for a tenant it does not cover");
                Err(Denied::Forbidden)
            }
        }
        (None, Tenants::Listed(tenants)) if tenants.len() == 1 => {
            Ok(Allowed::Tenant(tenants[0].clone()))
        }
        (None, _) => Err(Denied::Ambiguous),
    }
}

/// A secrets file's bytes, refused past `max` (a file that size is not what was meant).
pub(crate) fn read_limited(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(max + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::other(format!("larger than {max} bytes")));
    }
    Ok(bytes)
}

fn read_credentials(path: &Path) -> Result<Credentials, String> {
    let bytes = read_limited(path, MAX_FILE_BYTES).map_err(|err| err.to_string())?;
    let text = String::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?;
    Credentials::parse(&text)
}

/// Hex SHA-256 of a secret, as the credentials file holds it (for tests and tools).
pub fn secret_digest(secret: &str) -> String {
    hex(&Sha256::digest(secret.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN_A: &str = "token-a-0123456789abcdef0123456789";
    const TOKEN_AB: &str = "token-ab-0123456789abcdef012345678";
    const TOKEN_ANY: &str = "token-any-0123456789abcdef01234567";

    fn file() -> String {
        format!(
            "credentials:\n\
             - name: a\n  bearer_sha256: {}\n  tenants: [team-a]\n\
             - name: ab\n  bearer_sha256: {}\n  tenants: [team-a, team-b]\n\
             - name: gateway\n  bearer_sha256: {}\n  any_tenant: true\n\
             - name: agent\n  basic_user: agent\n  basic_password_sha256: {}\n  tenants: [team-b]\n\
             - name: envoy\n  certificate: envoy.weir.test\n  tenants: [team-c]\n",
            secret_digest(TOKEN_A),
            secret_digest(TOKEN_AB),
            secret_digest(TOKEN_ANY),
            secret_digest("agent-password-0123456789"),
        )
    }

    fn authenticator(mode: Mode) -> (Authenticator, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials.yaml");
        std::fs::write(&path, file()).unwrap();
        let metrics = Metrics::new();
        let limits = FailureLimits {
            rate: 1.0,
            burst: 5.0,
        };
        (
            Authenticator::new(mode, Some(&path), limits, &metrics).unwrap(),
            dir,
        )
    }

    fn bearer(token: &str) -> Vec<u8> {
        format!("Bearer {token}").into_bytes()
    }

    #[test]
    fn tokens_answer_401_403_and_fill_in_a_single_tenant() {
        let (auth, _dir) = authenticator(Mode::Tokens);
        let peer = Peer {
            addr: Some("10.0.0.1:5000".parse().unwrap()),
            certificate: None,
        };
        let now = Instant::now();
        let check = |authorization: Option<&[u8]>, named: Option<&str>| {
            auth.authorize_at(
                Door::Push,
                Source {
                    peer: Some(&peer),
                    authorization,
                },
                named.map(str::as_bytes),
                now,
            )
        };
        let a = bearer(TOKEN_A);
        let ab = bearer(TOKEN_AB);
        let any = bearer(TOKEN_ANY);
        let basic = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("agent:agent-password-0123456789")
        );
        let wrong_basic = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("agent:guess")
        );
        assert_eq!(check(Some(&a), Some("team-a")), Ok(Allowed::AsNamed));
        assert_eq!(check(Some(&a), None), Ok(Allowed::Tenant("team-a".into())));
        assert_eq!(
            check(Some(&a), Some("")),
            Ok(Allowed::Tenant("team-a".into()))
        );
        assert_eq!(check(Some(&a), Some("team-b")), Err(Denied::Forbidden));
        assert_eq!(check(Some(&ab), Some("team-b")), Ok(Allowed::AsNamed));
        assert_eq!(check(Some(&ab), None), Err(Denied::Ambiguous));
        assert_eq!(check(Some(&any), Some("whoever")), Ok(Allowed::AsNamed));
        assert_eq!(check(Some(&any), None), Err(Denied::Ambiguous));
        assert_eq!(
            check(Some(basic.as_bytes()), None),
            Ok(Allowed::Tenant("team-b".into()))
        );
        assert_eq!(
            check(Some(wrong_basic.as_bytes()), None),
            Err(Denied::Unknown)
        );
        assert!(matches!(
            check(None, Some("team-a")),
            Err(Denied::Missing(_))
        ));
    }

    #[test]
    fn a_batch_spends_one_failure_however_many_items_it_refuses() {
        let (auth, _dir) = authenticator(Mode::Tokens);
        let peer = Peer {
            addr: Some("10.0.0.11:1".parse().unwrap()),
            certificate: None,
        };
        let a = bearer(TOKEN_A);
        let source = Source {
            peer: Some(&peer),
            authorization: Some(&a),
        };
        let start = Instant::now();
        // An item of a batch naming another tenant: refused as forbidden, and not throttled
        // while the budget of 5 lasts (each batch spends one failure).
        let other = |spent: &mut bool| {
            let item =
                auth.authorize_item_at(Door::AdmissionGrpc, source, Some(b"team-b"), spent, start);
            assert_eq!(item, Err(Denied::Forbidden));
        };
        // Two batches of 10 such items; the caller's own tenant still passes after them.
        for _ in 0..2 {
            let mut spent = false;
            (0..10).for_each(|_| other(&mut spent));
            assert!(spent);
        }
        let own = auth.authorize_at(Door::Push, source, Some(b"team-a"), start);
        assert_eq!(own, Ok(Allowed::AsNamed));
        // Five batches spend the budget of five, as five requests would.
        for _ in 0..3 {
            other(&mut false);
        }
        let own = auth.authorize_at(Door::Push, source, Some(b"team-a"), start);
        assert!(matches!(own, Err(Denied::Throttled { .. })), "{own:?}");
    }

    #[test]
    fn a_flooding_source_is_throttled_and_others_are_not() {
        let (auth, _dir) = authenticator(Mode::Tokens);
        let bad = Peer {
            addr: Some("10.0.0.9:1".parse().unwrap()),
            certificate: None,
        };
        let good = Peer {
            addr: Some("10.0.0.10:1".parse().unwrap()),
            certificate: None,
        };
        let start = Instant::now();
        let wrong = bearer("not-a-token");
        for _ in 0..5 {
            let denied = auth.authorize_at(
                Door::Push,
                Source {
                    peer: Some(&bad),
                    authorization: Some(&wrong),
                },
                None,
                start,
            );
            assert_eq!(denied, Err(Denied::Unknown));
        }
        // Over the burst: refused before the lookup, even with a good token.
        let a = bearer(TOKEN_A);
        let throttled = auth.authorize_at(
            Door::Push,
            Source {
                peer: Some(&bad),
                authorization: Some(&a),
            },
            None,
            start,
        );
        assert!(
            matches!(throttled, Err(Denied::Throttled { .. })),
            "{throttled:?}"
        );
        // Another source is not.
        let other = auth.authorize_at(
            Door::Push,
            Source {
                peer: Some(&good),
                authorization: Some(&a),
            },
            None,
            start,
        );
        assert_eq!(other, Ok(Allowed::Tenant("team-a".into())));
        // One second later one failure has leaked away.
        let later = auth.authorize_at(
            Door::Push,
            Source {
                peer: Some(&bad),
                authorization: Some(&a),
            },
            None,
            start + Duration::from_millis(1100),
        );
        assert_eq!(later, Ok(Allowed::Tenant("team-a".into())));
    }

    #[test]
    fn the_failure_table_stays_bounded() {
        let table = FailureTable::new(FailureLimits {
            rate: 0.001,
            burst: 2.0,
        });
        let now = Instant::now();
        for index in 0..(MAX_SOURCES as u32 + 500) {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + index));
            table.record(ip, now);
        }
        assert!(table.len() <= MAX_SOURCES + 1, "{}", table.len());
        // The overflow bucket throttles sources the table has no room for.
        table.record(IpAddr::V4([192, 0, 2, 1].into()), now);
        assert!(table
            .throttled(IpAddr::V4([192, 0, 2, 2].into()), now)
            .is_some());
        // IPv6 sources are counted by /64.
        assert_eq!(
            source_of(Some("[2001:db8::1]:1".parse().unwrap())),
            source_of(Some("[2001:db8::ffff]:2".parse().unwrap()))
        );
    }

    #[test]
    fn mtls_maps_certificate_names() {
        let (auth, _dir) = authenticator(Mode::Mtls);
        let names: Arc<[String]> = vec!["other".to_string(), "envoy.weir.test".to_string()].into();
        let peer = Peer {
            addr: None,
            certificate: Some(names),
        };
        let source = Source {
            peer: Some(&peer),
            authorization: Some(b"Bearer whatever"),
        };
        assert_eq!(
            auth.authorize(Door::Rls, source, Some(b"team-c")),
            Ok(Allowed::AsNamed)
        );
        assert_eq!(
            auth.authorize(Door::Rls, source, Some(b"team-a")),
            Err(Denied::Forbidden)
        );
        let without = Peer::default();
        assert!(matches!(
            auth.authorize(
                Door::Rls,
                Source {
                    peer: Some(&without),
                    authorization: None
                },
                Some(b"team-c")
            ),
            Err(Denied::Missing(_))
        ));
        let cert = rcgen::generate_simple_self_signed(vec!["envoy.weir.test".to_string()]).unwrap();
        let names = certificate_names(cert.cert.der());
        assert!(names.contains(&"envoy.weir.test".to_string()), "{names:?}");
    }

    #[test]
    fn authorization_headers_parse_or_are_malformed() {
        assert_eq!(parse_authorization(None), Ok(None));
        assert_eq!(
            parse_authorization(Some(b"bearer abc")),
            Ok(Some(Presented::Bearer(b"abc".to_vec())))
        );
        for bad in [
            &b"abc"[..],
            b"Bearer ",
            b"Digest abc",
            b"Basic !!!",
            b"Basic YWJj",
            b"\xff\xfe",
        ] {
            assert_eq!(
                parse_authorization(Some(bad)),
                Err(Denied::Malformed),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse_authorization(Some(&vec![b'a'; 10_000])),
            Err(Denied::Malformed)
        );
    }

    #[test]
    fn bad_files_are_refused_by_entry_without_secrets() {
        let digest = secret_digest("x");
        for (text, expected) in [
            ("credentials: 3\n", "not a credentials file"),
            (
                "credentials:\n- name: a\n  tenants: [t]\n",
                "exactly one of",
            ),
            (
                &format!("credentials:\n- name: a\n  bearer_sha256: {digest}\n")[..],
                "no tenants",
            ),
            (
                "credentials:\n- name: a\n  bearer_sha256: abc\n  tenants: [t]\n",
                "64 hex digits",
            ),
            (
                &format!("credentials:\n- name: a\n  bearer_sha256: {digest}\n  tenants: [a/b]\n")
                    [..],
                "tenant \"a/b\"",
            ),
            (
                &format!(
                    "credentials:\n- name: a\n  bearer_sha256: {digest}\n  tenants: [t]\n\
                     - name: b\n  bearer_sha256: {digest}\n  tenants: [u]\n"
                )[..],
                "listed twice",
            ),
            ("credentials:\n- name: a\n  tokn: x\n", "unknown field"),
        ] {
            let err = Credentials::parse(text).unwrap_err();
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }

    #[test]
    fn reload_keeps_the_last_good_file() {
        let (auth, dir) = authenticator(Mode::Tokens);
        let path = dir.path().join("credentials.yaml");
        assert_eq!(auth.credentials(), 5);
        std::fs::write(&path, "credentials: [").unwrap();
        auth.reload_if_changed();
        assert_eq!(auth.credentials(), 5, "the last good file stays");
        assert_eq!(auth.metrics.last_reload_successful.get(), 0);
        std::fs::write(
            &path,
            format!(
                "credentials:\n- name: a\n  bearer_sha256: {}\n  tenants: [team-z]\n",
                secret_digest(TOKEN_A)
            ),
        )
        .unwrap();
        auth.reload_if_changed();
        assert_eq!(auth.credentials(), 1);
        assert_eq!(auth.metrics.last_reload_successful.get(), 1);
        let a = bearer(TOKEN_A);
        assert_eq!(
            auth.authorize(
                Door::Push,
                Source {
                    peer: None,
                    authorization: Some(&a)
                },
                None
            ),
            Ok(Allowed::Tenant("team-z".into()))
        );
    }
}

//! Start-up configuration: every setting is a clap flag, a `WEIR_…` environment variable and
//! a key of an optional YAML file given with `--config` (the flag's long name with `_`).
//! Precedence: flag, then environment, then file, then the built-in default.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use runtime_config::{RateLimitStrategy, StoreFailurePolicy};

use crate::rejection::RetryAfterMode;

mod settings;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

// `--help` groups the flags under these headings, in the order each first appears below.
const LISTENERS: &str = "Listeners";
const TLS: &str = "TLS";
const AUTH: &str = "Tenant authentication (who may spend a tenant's limits)";
const UPSTREAM: &str = "Upstream (where admitted pushes go)";
const OVERRIDES: &str = "Runtime overrides";
const LOGGING: &str = "Logging";
const RING: &str = "Ring (gossip)";
const LIMITS: &str = "Tenant limits (defaults for every tenant) and refusals";
const STORE: &str = "Shared store (the `shared` strategy)";
const CELLS: &str = "Cells (several rings, each enforcing a slice of each tenant's limit)";
const INSTANCE: &str = "Instance limits (this replica, all tenants together)";
const HTTP: &str = "HTTP requests";
const SHUTDOWN: &str = "Shutdown";

/// weir: a Mimir-style remote-write distributor and distributed rate limiter.
#[derive(Debug, Clone, Parser)]
#[command(name = "weir", version, about)]
pub struct Config {
    /// YAML file with any of these settings; keys are the long flag names with `_` for `-`.
    #[arg(long, env = "WEIR_CONFIG")]
    pub config: Option<PathBuf>,

    /// Address for HTTP: push, readiness and, without --admin-addr, the operator's pages
    /// (metrics, ring, runtime config).
    #[arg(help_heading = LISTENERS, long, env = "WEIR_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub http_addr: SocketAddr,

    /// Serve HTTPS on --http-addr with this PEM certificate chain (and --http-tls-key-file):
    /// TLS 1.2 and 1.3, HTTP/2 and HTTP/1.1 by ALPN. Re-read when it changes (checked every
    /// --runtime-config-period), so a renewed certificate needs no restart. Without it, HTTP.
    #[arg(help_heading = TLS, long, env = "WEIR_HTTP_TLS_CERT_FILE", requires = "http_tls_key_file")]
    pub http_tls_cert_file: Option<PathBuf>,

    /// PEM private key of --http-tls-cert-file.
    #[arg(help_heading = TLS, long, env = "WEIR_HTTP_TLS_KEY_FILE", requires = "http_tls_cert_file")]
    pub http_tls_key_file: Option<PathBuf>,

    /// PEM CA certificates that sign client certificates: HTTPS then asks each client for
    /// one and verifies it against these (a client without one still connects; under
    /// `--tenant-auth mtls` its requests get 401). Re-read when it changes.
    #[arg(help_heading = TLS, long, env = "WEIR_HTTP_TLS_CLIENT_CA_FILE", requires = "http_tls_cert_file")]
    pub http_tls_client_ca_file: Option<PathBuf>,

    /// Serve the gRPC listener (--grpc-addr) over TLS with this PEM certificate chain (and
    /// --grpc-tls-key-file); HTTP/2 by ALPN. Re-read when it changes. Without it, plaintext
    /// HTTP/2.
    #[arg(help_heading = TLS, long, env = "WEIR_GRPC_TLS_CERT_FILE", requires = "grpc_tls_key_file")]
    pub grpc_tls_cert_file: Option<PathBuf>,

    /// PEM private key of --grpc-tls-cert-file.
    #[arg(help_heading = TLS, long, env = "WEIR_GRPC_TLS_KEY_FILE", requires = "grpc_tls_cert_file")]
    pub grpc_tls_key_file: Option<PathBuf>,

    /// PEM CA certificates that sign gRPC clients' certificates (optional client
    /// verification, as --http-tls-client-ca-file). Re-read when it changes.
    #[arg(help_heading = TLS, long, env = "WEIR_GRPC_TLS_CLIENT_CA_FILE", requires = "grpc_tls_cert_file")]
    pub grpc_tls_client_ca_file: Option<PathBuf>,

    /// How a request proves which tenant it may use, on every door (push, OTLP, the
    /// admission API over JSON and gRPC, Envoy's RLS): `header` (none: any client can claim
    /// any tenant; for a trusted, authenticating proxy in front), `tokens` (`Authorization:
    /// Bearer` or `Basic`, from --auth-credentials-file) or `mtls` (the verified client
    /// certificate's CN or SAN, mapped in --auth-credentials-file).
    #[arg(help_heading = AUTH, long, env = "WEIR_TENANT_AUTH", value_enum, default_value_t = crate::auth::Mode::Header)]
    pub tenant_auth: crate::auth::Mode,

    /// YAML file mapping credentials (SHA-256 digests of bearer tokens and basic-auth
    /// passwords, or client-certificate names) to the tenants each may use. Re-read when its
    /// content changes (checked every --runtime-config-period); a bad file keeps the last
    /// good one in force. Required by `--tenant-auth tokens|mtls`.
    #[arg(help_heading = AUTH, long, env = "WEIR_AUTH_CREDENTIALS_FILE")]
    pub auth_credentials_file: Option<PathBuf>,

    /// Authentication failures one source (an IP address, an IPv6 /64) may have in a row
    /// before it is answered 429, whatever it presents, until they leak away.
    #[arg(help_heading = AUTH, long, env = "WEIR_AUTH_FAILURE_BURST", default_value_t = 20)]
    pub auth_failure_burst: u32,

    /// How many of a source's failures leak away per second.
    #[arg(help_heading = AUTH, long, env = "WEIR_AUTH_FAILURE_RATE", default_value_t = 1.0)]
    pub auth_failure_rate: f64,

    /// Serve the operator's pages (`/metrics`, `/ring`, `/runtime_config`,
    /// `/distributor/ha_tracker`) on this address only; --http-addr then answers 404 for them.
    /// `/ready` and `/health` are served on both. Plain HTTP, or HTTPS with the
    /// --http-tls-cert-file certificate when that is set. Without it, the pages are on
    /// --http-addr (with a warning at start-up). Port 0 picks a free port.
    #[arg(help_heading = LISTENERS, long, env = "WEIR_ADMIN_ADDR")]
    pub admin_addr: Option<SocketAddr>,

    /// File holding a bearer token that the operator's pages require (`Authorization: Bearer
    /// <token>`: 401 without it, 403 for another), on whichever listener serves them. Re-read
    /// when its content changes (checked every --runtime-config-period); a bad file keeps the
    /// last good token in force. Surrounding whitespace is ignored. `/ready` and `/health`
    /// stay open.
    #[arg(help_heading = LISTENERS, long, env = "WEIR_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,

    /// gRPC listen address of the admission API (`weir.admission.v1.Admission`) and Envoy's
    /// rate-limit service; port 0 picks a free port. Advertised in the ring.
    #[arg(help_heading = LISTENERS, long, env = "WEIR_GRPC_ADDR", default_value = "127.0.0.1:9095")]
    pub grpc_addr: SocketAddr,

    /// Remote-write receiver to forward admitted pushes to (e.g.
    /// `http://prometheus:9090/api/v1/write`). Without it, weir runs in sink mode: admitted
    /// pushes are counted and acknowledged, then dropped.
    #[arg(help_heading = UPSTREAM, long, env = "WEIR_UPSTREAM")]
    pub upstream: Option<String>,

    /// Where admitted OTLP exports (`POST /otlp/v1/metrics`) go. Default: the --upstream
    /// host's OTLP path (Mimir's `/api/v1/push` → `/otlp/v1/metrics`; Prometheus'
    /// `/api/v1/write` → `/api/v1/otlp/v1/metrics`).
    #[arg(help_heading = UPSTREAM, long, env = "WEIR_UPSTREAM_OTLP", requires = "upstream")]
    pub upstream_otlp: Option<String>,

    /// Longest wait for the upstream's answer; the client hears 504 after it.
    #[arg(help_heading = UPSTREAM, long, env = "WEIR_UPSTREAM_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub upstream_timeout: Duration,

    /// PEM CA certificates trusted for an `https://` --upstream, besides the public roots.
    /// Re-read when it changes (checked every --runtime-config-period).
    #[arg(help_heading = TLS, long, env = "WEIR_UPSTREAM_TLS_CA_FILE")]
    pub upstream_tls_ca_file: Option<PathBuf>,

    /// PEM client certificate chain presented to the upstream (mutual TLS), with
    /// --upstream-tls-key-file. Re-read when it changes.
    #[arg(
        help_heading = TLS,
        long,
        env = "WEIR_UPSTREAM_TLS_CERT_FILE",
        requires = "upstream_tls_key_file"
    )]
    pub upstream_tls_cert_file: Option<PathBuf>,

    /// PEM private key of --upstream-tls-cert-file.
    #[arg(
        help_heading = TLS,
        long,
        env = "WEIR_UPSTREAM_TLS_KEY_FILE",
        requires = "upstream_tls_cert_file"
    )]
    pub upstream_tls_key_file: Option<PathBuf>,

    /// The header that carries the tenant to the upstream.
    #[arg(
        help_heading = UPSTREAM,
        long,
        env = "WEIR_UPSTREAM_TENANT_HEADER",
        default_value = "X-Scope-OrgID"
    )]
    pub upstream_tenant_header: String,

    /// Runtime overrides file (per-tenant limits, instance limits, admission limits),
    /// reloaded periodically. Without it, weir runs on built-in defaults (the flags below) and
    /// says so; a file that is named and missing is fatal.
    #[arg(help_heading = OVERRIDES, long, env = "WEIR_RUNTIME_CONFIG")]
    pub runtime_config: Option<PathBuf>,

    /// How often the runtime overrides file is checked for changes.
    #[arg(help_heading = OVERRIDES, long, env = "WEIR_RUNTIME_CONFIG_PERIOD", default_value = "5s", value_parser = humantime::parse_duration)]
    pub runtime_config_period: Duration,

    /// Log format.
    #[arg(help_heading = LOGGING, long, env = "WEIR_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Log filter, in `tracing` EnvFilter syntax (e.g. `info`, `weir=debug`).
    #[arg(help_heading = LOGGING, long, env = "WEIR_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// This replica's name in the ring [default: <hostname>-<random>, unique per process
    /// start].
    #[arg(
        help_heading = RING,
        long,
        env = "WEIR_NODE_ID",
        default_value = "",
        hide_default_value = true
    )]
    pub node_id: String,

    /// UDP address for gossip; port 0 picks a free port.
    #[arg(help_heading = RING, long, env = "WEIR_GOSSIP_ADDR", default_value = "127.0.0.1:7946")]
    pub gossip_addr: SocketAddr,

    /// Address peers send gossip to (default: --gossip-addr). Required when --gossip-addr
    /// binds every interface (0.0.0.0).
    #[arg(help_heading = RING, long, env = "WEIR_GOSSIP_ADVERTISE_ADDR")]
    pub gossip_advertise_addr: Option<SocketAddr>,

    /// Seeds to join through, `host:port` of other replicas' gossip, comma-separated. A host
    /// name may resolve to many addresses (a Kubernetes headless Service:
    /// `weir-gossip.weir.svc:7946`); every address is a seed, and names are resolved again
    /// every --join-refresh-interval.
    #[arg(help_heading = RING, long, env = "WEIR_JOIN", value_delimiter = ',')]
    pub join: Vec<String>,

    /// How often the --join host names are resolved again, so replicas that came up since
    /// (a scaled Deployment, a healed partition) become seeds.
    #[arg(help_heading = RING, long, env = "WEIR_JOIN_REFRESH_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub join_refresh_interval: Duration,

    /// Replicas gossip only with replicas of the same cluster id.
    #[arg(help_heading = RING, long, env = "WEIR_CLUSTER_ID", default_value = "weir")]
    pub cluster_id: String,

    /// Time between gossip rounds.
    #[arg(help_heading = RING, long, env = "WEIR_GOSSIP_INTERVAL", default_value = "200ms", value_parser = humantime::parse_duration)]
    pub gossip_interval: Duration,

    /// Failure detector: a peer is dead once its heartbeat is this many mean intervals late.
    #[arg(help_heading = RING, long, env = "WEIR_RING_PHI_THRESHOLD", default_value_t = 12.0)]
    pub ring_phi_threshold: f64,

    /// How long a dead peer is remembered before it is forgotten.
    #[arg(help_heading = RING, long, env = "WEIR_RING_DEAD_NODE_GRACE_PERIOD", default_value = "1m", value_parser = humantime::parse_duration)]
    pub ring_dead_node_grace_period: Duration,

    /// Shared secrets that encrypt and authenticate every gossip datagram (XChaCha20-Poly1305,
    /// keys derived by HKDF), comma-separated: the first seals, any opens. Rotate with three rolling restarts: `old,new` (all
    /// accept new), then `new,old` (all sign with new), then `new`. Each at least 16 bytes.
    /// Without one, gossip is unauthenticated.
    #[arg(
        help_heading = RING,
        long,
        env = "WEIR_GOSSIP_SECRET",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub gossip_secret: Vec<String>,

    /// A file of gossip secrets, one per line (the first signs); blank lines and `#` comments
    /// are skipped. Keeps the secret out of the process list.
    #[arg(
        help_heading = RING,
        long,
        env = "WEIR_GOSSIP_SECRET_FILE",
        conflicts_with = "gossip_secret"
    )]
    pub gossip_secret_file: Option<PathBuf>,

    /// Most live members counted, this replica included; more are ignored (logged once and
    /// shown in `weir_ring_ignored_members`), so gossip cannot divide every limit by thousands.
    #[arg(help_heading = RING, long, env = "WEIR_RING_MAX_MEMBERS", default_value_t = 1000)]
    pub ring_max_members: usize,

    /// /ready waits for the seeds to be seen, or this long (the first replica has no peers).
    #[arg(help_heading = RING, long, env = "WEIR_RING_JOIN_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub ring_join_timeout: Duration,

    /// Default per-tenant ingestion rate, fleet-wide, in items/s (an item is a sample, a
    /// histogram, an exemplar or a metadata entry). 0 rejects all ingestion.
    #[arg(help_heading = LIMITS, long, env = "WEIR_INGESTION_RATE", default_value_t = 10_000.0)]
    pub ingestion_rate: f64,

    /// Default per-tenant ingestion burst size: the bucket's capacity, in items (samples +
    /// histograms + exemplars + metadata). A push with more items can never pass.
    #[arg(help_heading = LIMITS, long, env = "WEIR_INGESTION_BURST_SIZE", default_value_t = 200_000)]
    pub ingestion_burst_size: u64,

    /// Default per-tenant push request rate, fleet-wide, in requests/s. 0 means unlimited.
    #[arg(help_heading = LIMITS, long, env = "WEIR_REQUEST_RATE", default_value_t = 0.0)]
    pub request_rate: f64,

    /// Default per-tenant request burst size; must be ≥ 1 when the request rate is > 0.
    #[arg(help_heading = LIMITS, long, env = "WEIR_REQUEST_BURST_SIZE", default_value_t = 0)]
    pub request_burst_size: u64,

    /// Default strategy for turning a fleet-wide limit into a local one: `weighted` (every
    /// replica keeps a view of one fleet bucket over gossip), `divided` (rate ÷ healthy
    /// replicas, Mimir's) or `shared` (an authoritative bucket in Redis; needs --store-url).
    #[arg(help_heading = LIMITS, long, env = "WEIR_RATE_LIMIT_STRATEGY", default_value = "weighted", value_parser = parse_strategy)]
    pub rate_limit_strategy: RateLimitStrategy,

    /// Default for `shared` tenants while the store is down or slow: `open` (fall back to
    /// `weighted`) or `closed` (refuse with 503).
    #[arg(help_heading = STORE, long, env = "WEIR_ON_STORE_FAILURE", default_value = "open", value_parser = parse_policy)]
    pub on_store_failure: StoreFailurePolicy,

    /// The shared store for `shared` tenants: `redis://` or `rediss://` URLs, comma-separated;
    /// several (or one cluster node) mean a Redis Cluster. Not needed otherwise.
    #[arg(help_heading = STORE, long, env = "WEIR_STORE_URL", value_delimiter = ',')]
    pub store_url: Vec<String>,

    /// Longest wait for one store call; past it the call counts as failed and the tenant's
    /// failure policy decides.
    #[arg(help_heading = STORE, long, env = "WEIR_STORE_TIMEOUT", default_value = "50ms", value_parser = humantime::parse_duration)]
    pub store_timeout: Duration,

    /// Longest wait to connect to the store (at start-up, and on each reconnect).
    #[arg(help_heading = STORE, long, env = "WEIR_STORE_CONNECT_TIMEOUT", default_value = "1s", value_parser = humantime::parse_duration)]
    pub store_connect_timeout: Duration,

    /// A lease covers this replica's demand for a tenant over this long.
    #[arg(help_heading = STORE, long, env = "WEIR_STORE_LEASE_WINDOW", default_value = "250ms", value_parser = humantime::parse_duration)]
    pub store_lease_window: Duration,

    /// Leased tokens unspent after this long go back to the store.
    #[arg(help_heading = STORE, long, env = "WEIR_STORE_LEASE_TTL", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub store_lease_ttl: Duration,

    /// Most store calls per second for one tenant's limit from this replica; past it, the
    /// tenant's leases grow instead of its calls multiplying.
    #[arg(help_heading = STORE, long, env = "WEIR_STORE_CALLS_PER_TENANT", default_value_t = 50.0)]
    pub store_calls_per_tenant: f64,

    /// The store's circuit breaker opens after this many failed calls in a row.
    #[arg(help_heading = STORE, long, env = "WEIR_STORE_BREAKER_FAILURES", default_value_t = 5)]
    pub store_breaker_failures: u32,

    /// How long the breaker stays open before one call probes the store.
    #[arg(help_heading = STORE, long, env = "WEIR_STORE_BREAKER_OPEN_FOR", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub store_breaker_open_for: Duration,

    /// This replica's cell: a ring of its own (the cell name joins --cluster-id), enforcing
    /// the cell's slice of each tenant's limits, reconciled by demand through the store
    /// (--store-url) every --cell-sync-interval. Letters, digits, `.`, `_`, `-`. Without it,
    /// no cells: each tenant's limit is the ring's. `shared` tenants keep one global bucket.
    #[arg(help_heading = CELLS, long, env = "WEIR_CELL")]
    pub cell: Option<String>,

    /// How often each replica of a cell reports its tenants' demand and spend to the store
    /// and gets its cell's slices back.
    #[arg(help_heading = CELLS, long, env = "WEIR_CELL_SYNC_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub cell_sync_interval: Duration,

    /// How long a slice holds without a new answer from the store; then the static fallback
    /// (--cell-fallback-floor). Also how long the store keeps a silent cell's demand.
    #[arg(help_heading = CELLS, long, env = "WEIR_CELL_SLICE_TTL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub cell_slice_ttl: Duration,

    /// Every cell gets at least this fraction of the even share (L ÷ cells) of each tenant,
    /// so a cell that starts receiving a tenant admits at once; idle cells hold at most this
    /// fraction of L in all.
    #[arg(help_heading = CELLS, long, env = "WEIR_CELL_FLOOR", default_value_t = 0.05)]
    pub cell_floor: f64,

    /// The static fallback, as a fraction of each tenant's L and B, for a cell that has not
    /// heard from the store for --cell-slice-ttl (or never has). Default: 1 ÷ the cell count
    /// the store last reported (before any answer: the whole limit).
    #[arg(help_heading = CELLS, long, env = "WEIR_CELL_FALLBACK_FLOOR")]
    pub cell_fallback_floor: Option<f64>,

    /// Push requests handled at once by this replica; 0 = off.
    #[arg(help_heading = INSTANCE, long, env = "WEIR_MAX_INFLIGHT_PUSH_REQUESTS", default_value_t = 2000)]
    pub max_inflight_push_requests: u64,

    /// Sum of Content-Length of the push requests handled at once by this replica; 0 = off.
    #[arg(
        help_heading = INSTANCE,
        long,
        env = "WEIR_MAX_INFLIGHT_PUSH_REQUESTS_BYTES",
        default_value_t = 0
    )]
    pub max_inflight_push_requests_bytes: u64,

    /// Items/s (samples + histograms + exemplars + metadata) this replica admits, as an EWMA
    /// over 1 s ticks; 0 = off.
    #[arg(help_heading = INSTANCE, long, env = "WEIR_MAX_INGESTION_RATE", default_value_t = 0.0)]
    pub max_ingestion_rate: f64,

    /// Most tenants this replica tracks at once; beyond it, new tenants get 429 until idle
    /// ones are evicted. Bounds memory (about 1.5 KiB per active tenant, its metric series
    /// included). 0 = off.
    #[arg(help_heading = INSTANCE, long, env = "WEIR_MAX_TENANTS", default_value_t = 100_000)]
    pub max_tenants: usize,

    /// Most admission-API keys one tenant may have on this replica at once (callers name
    /// keys, so this bounds the memory a flood of distinct keys can take); a call for a new
    /// key past it is refused with RESOURCE_EXHAUSTED (429) until idle keys are evicted.
    /// 0 = off.
    #[arg(help_heading = INSTANCE, long, env = "WEIR_ADMISSION_MAX_KEYS_PER_TENANT", default_value_t = 10_000)]
    pub admission_max_keys_per_tenant: usize,

    /// Largest push body, in bytes, compressed and decompressed alike (Mimir's default, 100 MiB).
    #[arg(help_heading = HTTP, long, env = "WEIR_MAX_REQUEST_BODY_SIZE", default_value_t = 100 << 20)]
    pub max_request_body_size: u64,

    /// A client has this long to send a request's headers; an idle keep-alive connection is
    /// closed after it too (slowloris protection).
    #[arg(help_heading = HTTP, long, env = "WEIR_HTTP_HEADER_READ_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub http_header_read_timeout: Duration,

    /// The most a request's headers may take, in bytes (at least 8 KiB).
    #[arg(help_heading = HTTP, long, env = "WEIR_HTTP_MAX_HEADER_BYTES", default_value_t = 1 << 20)]
    pub http_max_header_bytes: usize,

    /// HTTP connections open at once; past it a new connection is closed at once. 0 = no cap.
    #[arg(help_heading = HTTP, long, env = "WEIR_HTTP_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub http_max_connections: usize,

    /// HTTP/2: requests (streams) one connection may have in flight at once; more wait in the
    /// client. At least 1.
    #[arg(help_heading = HTTP, long, env = "WEIR_HTTP2_MAX_CONCURRENT_STREAMS", default_value_t = 256)]
    pub http2_max_concurrent_streams: u32,

    /// Threads serving HTTP connections, each with its own runtime; a new connection goes to
    /// the one with the fewest open. 0 = one per core.
    #[arg(help_heading = HTTP, long, env = "WEIR_HTTP_WORKERS", default_value_t = 0)]
    pub http_workers: usize,

    /// Pin each HTTP worker to a core of its own: `auto` pins when the process was given its
    /// cores (it may use only some of the machine's CPUs, as many as there are workers), `on`
    /// always (a machine of its own), `off` never. Pinned, a request and its forward stay on
    /// the core whose caches hold them.
    #[arg(help_heading = HTTP, long, env = "WEIR_HTTP_PIN_WORKERS", value_enum, default_value_t = crate::affinity::PinWorkers::Auto)]
    pub http_pin_workers: crate::affinity::PinWorkers,

    /// Longest time to receive a push body: reading it to admit it, or draining it after a
    /// refusal so the client sees the answer. A slower body is cut off (408, or the
    /// connection closed after the refusal).
    #[arg(help_heading = HTTP, long, env = "WEIR_BODY_READ_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub body_read_timeout: Duration,

    /// Single-tenant mode: requests without an X-Scope-OrgID header belong to this tenant.
    /// Off by default (such requests get 401).
    #[arg(help_heading = HTTP, long, env = "WEIR_NO_AUTH_TENANT")]
    pub no_auth_tenant: Option<String>,

    /// How a refusal sets Retry-After: `truthful`, the whole seconds until the request could
    /// pass (no header under a second, or for in-flight caps); or `backoff`, Mimir's
    /// jittered exponential backoff on every 429 and 5xx (the two flags below).
    #[arg(help_heading = LIMITS, long, env = "WEIR_RETRY_AFTER", value_enum, default_value_t = RetryAfterMode::Truthful)]
    pub retry_after: RetryAfterMode,

    /// A push whose tenant limit would let it pass within this long is held until then and
    /// admitted, instead of refused (as nginx's limit_req with `delay`); 0 refuses at once.
    /// Keep it well under the senders' timeouts (Prometheus 30s, vmagent 1m).
    #[arg(help_heading = LIMITS, long, env = "WEIR_MAX_ADMISSION_DELAY", default_value = "3s", value_parser = humantime::parse_duration)]
    pub max_admission_delay: Duration,

    /// `--retry-after backoff`: smallest Retry-After (≥ 1s).
    #[arg(help_heading = LIMITS, long, env = "WEIR_RETRY_AFTER_MIN_BACKOFF", default_value = "6s", value_parser = humantime::parse_duration)]
    pub retry_after_min_backoff: Duration,

    /// `--retry-after backoff`: largest Retry-After.
    #[arg(help_heading = LIMITS, long, env = "WEIR_RETRY_AFTER_MAX_BACKOFF", default_value = "96s", value_parser = humantime::parse_duration)]
    pub retry_after_max_backoff: Duration,

    /// A tenant's limiter state and metric series are dropped after this long without
    /// requests (and never before its buckets would be full again).
    #[arg(help_heading = LIMITS, long, env = "WEIR_TENANT_IDLE_TIMEOUT", default_value = "10m", value_parser = humantime::parse_duration)]
    pub tenant_idle_timeout: Duration,

    /// On SIGTERM, how long /ready answers 503 while still serving, so the balancer can
    /// stop sending before connections are refused.
    #[arg(help_heading = SHUTDOWN, long, env = "WEIR_SHUTDOWN_DELAY", default_value = "0s", value_parser = humantime::parse_duration)]
    pub shutdown_delay: Duration,

    /// On SIGTERM, how long in-flight requests may take to finish before the process exits.
    #[arg(help_heading = SHUTDOWN, long, env = "WEIR_SHUTDOWN_DRAIN_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_drain_timeout: Duration,
}

fn default_node_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "weir".to_string());
    format!("{host}-{:08x}", rand::random::<u32>())
}

fn parse_strategy(value: &str) -> Result<RateLimitStrategy, String> {
    serde_yaml_ng::from_str(value)
        .map_err(|_| format!("unknown strategy {value:?}; expected: weighted, divided or shared"))
}

fn parse_policy(value: &str) -> Result<StoreFailurePolicy, String> {
    serde_yaml_ng::from_str(value)
        .map_err(|_| format!("unknown store failure policy {value:?}; expected: open or closed"))
}

impl Config {
    /// Parses flags and environment, then fills in what neither set from `--config`.
    pub fn load_from<I, T>(args: I) -> anyhow::Result<Config>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let mut args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let command = Config::command();
        let matches = command.clone().try_get_matches_from(&args)?;
        if let Some(path) = matches.get_one::<PathBuf>("config") {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --config {}", path.display()))?;
            let file: Option<BTreeMap<String, serde_yaml_ng::Value>> =
                serde_yaml_ng::from_str(&text)
                    .with_context(|| format!("invalid YAML in --config {}", path.display()))?;
            for (key, value) in file.unwrap_or_default() {
                let Some(arg) = command
                    .get_arguments()
                    .find(|arg| arg.get_id() == key.as_str() && key != "config")
                else {
                    bail!("unknown key `{key}` in --config {}", path.display());
                };
                if matches!(
                    matches.value_source(&key),
                    Some(ValueSource::CommandLine | ValueSource::EnvVariable)
                ) {
                    continue;
                }
                let value = match value {
                    serde_yaml_ng::Value::String(text) => text,
                    serde_yaml_ng::Value::Number(number) => number.to_string(),
                    serde_yaml_ng::Value::Bool(flag) => flag.to_string(),
                    other => bail!(
                        "key `{key}` in --config {}: expected a scalar, got {other:?}",
                        path.display()
                    ),
                };
                let long = arg.get_long().expect("every setting has a long flag");
                args.push(format!("--{long}={value}").into());
            }
        }
        let mut config = Config::from_arg_matches(&Config::command().try_get_matches_from(&args)?)?;
        if config.node_id.is_empty() {
            config.node_id = default_node_id();
        }
        config.validate()
    }

    fn validate(self) -> anyhow::Result<Config> {
        self.defaults()
            .validate()
            .map_err(|message| anyhow::anyhow!("default limits: {message}"))?;
        if self.retry_after_min_backoff < Duration::from_secs(1) {
            bail!("--retry-after-min-backoff must be at least 1s");
        }
        if self.retry_after_max_backoff < self.retry_after_min_backoff {
            bail!("--retry-after-max-backoff must be at least --retry-after-min-backoff");
        }
        if self.http2_max_concurrent_streams == 0 {
            bail!("--http2-max-concurrent-streams must be at least 1");
        }
        // A seed's name may resolve later (discovery), but one without a port never will.
        for seed in self.join.iter().filter(|seed| !seed.is_empty()) {
            let valid = seed
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !valid {
                bail!(
                    "--join {seed:?}: expected host:port, e.g. weir-gossip.weir.svc.cluster.local:7946"
                );
            }
        }
        if let Err(err) = tracing_subscriber::EnvFilter::try_new(&self.log_level) {
            bail!("--log-level {:?}: {err}", self.log_level);
        }
        if self.http_max_header_bytes < 8192 {
            // hyper's HTTP/1.1 read buffer takes no less, so a smaller cap would not hold.
            bail!("--http-max-header-bytes must be at least 8192 (8 KiB)");
        }
        if self.http_header_read_timeout.is_zero() {
            bail!("--http-header-read-timeout must be > 0");
        }
        if self.body_read_timeout.is_zero() {
            bail!("--body-read-timeout must be > 0");
        }
        if self.max_request_body_size == 0 {
            bail!("--max-request-body-size must be > 0");
        }
        if self.runtime_config_period.is_zero() {
            bail!("--runtime-config-period must be > 0");
        }
        if self.upstream_timeout.is_zero() {
            bail!("--upstream-timeout must be > 0");
        }
        if self.gossip_interval < Duration::from_millis(10) {
            bail!("--gossip-interval must be at least 10ms");
        }
        if !(self.ring_phi_threshold.is_finite() && self.ring_phi_threshold > 0.0) {
            bail!("--ring-phi-threshold must be > 0");
        }
        if self.node_id.is_empty() || self.cluster_id.is_empty() {
            bail!("--node-id and --cluster-id must not be empty");
        }
        if self.store_timeout.is_zero() || self.store_lease_window.is_zero() {
            bail!("--store-timeout and --store-lease-window must be > 0");
        }
        if self.store_lease_ttl < self.store_lease_window {
            bail!("--store-lease-ttl must be at least --store-lease-window");
        }
        if !(self.store_calls_per_tenant.is_finite() && self.store_calls_per_tenant > 0.0) {
            bail!("--store-calls-per-tenant must be > 0");
        }
        if self.rate_limit_strategy == RateLimitStrategy::Shared && self.store_url.is_empty() {
            bail!(
                "--rate-limit-strategy shared needs a store: set --store-url (redis://host:6379)"
            );
        }
        if let Some(cell) = &self.cell {
            let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
            if cell.is_empty() || cell.len() > 64 || !cell.chars().all(valid) {
                bail!("--cell {cell:?}: 1 to 64 letters, digits, `.`, `_` or `-`");
            }
            if self.store_url.is_empty() {
                bail!("--cell needs the store its cells reconcile through: set --store-url");
            }
        }
        if self.cell_sync_interval < Duration::from_millis(10) {
            bail!("--cell-sync-interval must be at least 10ms");
        }
        if self.cell_slice_ttl < self.cell_sync_interval * 3 {
            bail!("--cell-slice-ttl must be at least 3 × --cell-sync-interval");
        }
        if !(0.0..=1.0).contains(&self.cell_floor) {
            bail!("--cell-floor must be between 0 and 1");
        }
        if let Some(fallback) = self.cell_fallback_floor {
            if !(fallback > 0.0 && fallback <= 1.0) {
                bail!("--cell-fallback-floor must be > 0 and at most 1");
            }
        }
        if let Some(admin) = self.admin_addr {
            if admin == self.http_addr && admin.port() != 0 {
                bail!("--admin-addr must differ from --http-addr ({admin})");
            }
        }
        use crate::auth::Mode;
        match self.tenant_auth {
            Mode::Header => {
                if self.auth_credentials_file.is_some() {
                    bail!("--auth-credentials-file needs --tenant-auth tokens or mtls");
                }
            }
            mode => {
                if self.auth_credentials_file.is_none() {
                    bail!(
                        "--tenant-auth {} needs --auth-credentials-file",
                        mode.as_str()
                    );
                }
                if self.no_auth_tenant.is_some() {
                    bail!(
                        "--no-auth-tenant lets requests in without credentials: it cannot go \
                         with --tenant-auth {}",
                        mode.as_str()
                    );
                }
            }
        }
        if self.tenant_auth == Mode::Mtls
            && self.http_tls_client_ca_file.is_none()
            && self.grpc_tls_client_ca_file.is_none()
        {
            bail!(
                "--tenant-auth mtls needs verified client certificates: set \
                 --http-tls-client-ca-file (HTTPS) and/or --grpc-tls-client-ca-file (gRPC)"
            );
        }
        if self.auth_failure_burst == 0 {
            bail!("--auth-failure-burst must be at least 1");
        }
        if !(self.auth_failure_rate.is_finite() && self.auth_failure_rate > 0.0) {
            bail!("--auth-failure-rate must be > 0");
        }
        if let Some(tenant) = &self.no_auth_tenant {
            crate::tenant::validate(tenant)
                .with_context(|| format!("--no-auth-tenant {tenant:?}"))?;
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_flag_then_env_then_file_then_default() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("weir.yaml");
        std::fs::write(
            &file,
            "ingestion_rate: 5\nrequest_rate: 2\nrequest_burst_size: 4\nruntime_config_period: 1s\nno_auth_tenant: solo\n",
        )
        .unwrap();
        let config = Config::load_from([
            "weir",
            "--config",
            file.to_str().unwrap(),
            "--ingestion-rate",
            "7",
        ])
        .unwrap();
        assert_eq!(config.ingestion_rate, 7.0, "the flag wins over the file");
        assert_eq!(config.request_rate, 2.0, "the file wins over the default");
        assert_eq!(config.request_burst_size, 4);
        assert_eq!(config.runtime_config_period, Duration::from_secs(1));
        assert_eq!(config.no_auth_tenant.as_deref(), Some("solo"));
        assert_eq!(config.ingestion_burst_size, 200_000, "the default stays");
    }

    #[test]
    fn help_groups_every_flag_under_a_heading() {
        let mut command = Config::command();
        command.build();
        let mut ungrouped: Vec<String> = command
            .get_arguments()
            .filter(|arg| arg.get_help_heading().is_none())
            .map(|arg| arg.get_id().to_string())
            .collect();
        ungrouped.sort();
        assert_eq!(ungrouped, ["config", "help", "version"]);
        let help = command.render_help().to_string();
        for heading in [
            LISTENERS, TLS, AUTH, UPSTREAM, OVERRIDES, LOGGING, RING, LIMITS, STORE, CELLS,
            INSTANCE, HTTP, SHUTDOWN,
        ] {
            assert!(
                help.contains(&format!("{heading}:")),
                "{heading} missing:\n{help}"
            );
        }
        let help_of = |id: &str| {
            let arg = command.get_arguments().find(|arg| arg.get_id() == id);
            arg.and_then(|arg| arg.get_long_help().or(arg.get_help()))
                .map(|help| help.to_string())
                .unwrap_or_default()
        };
        // The burst is counted in items, as the README and the 429 bodies say.
        for id in [
            "ingestion_rate",
            "ingestion_burst_size",
            "max_ingestion_rate",
        ] {
            assert!(
                help_of(id).to_lowercase().contains("items"),
                "{id}: {}",
                help_of(id)
            );
        }
    }

    #[test]
    fn bad_settings_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let typo = dir.path().join("typo.yaml");
        std::fs::write(&typo, "ingestion_rat: 5\n").unwrap();
        for (args, expected) in [
            (
                vec!["--config", typo.to_str().unwrap()],
                "unknown key `ingestion_rat`",
            ),
            (vec!["--request-rate", "5"], "request_burst_size is 0"),
            (vec!["--retry-after-min-backoff", "500ms"], "at least 1s"),
            (vec!["--http-max-header-bytes", "10"], "at least 8192"),
            (vec!["--log-level", "weir=bogus"], "--log-level"),
            (vec!["--join", "nohost:notaport"], "expected host:port"),
            (
                vec!["--join", "127.0.0.1:7946,weir-gossip"],
                "\"weir-gossip\"",
            ),
            (vec!["--no-auth-tenant", "a/b"], "--no-auth-tenant"),
            (vec!["--rate-limit-strategy", "magic"], "unknown strategy"),
            (vec!["--ingestion-rate=-3"], "ingestion_rate"),
            (vec!["--cell", "a"], "--cell needs"),
            (
                vec!["--cell", "a b", "--store-url", "redis://x"],
                "--cell \"a b\"",
            ),
            (vec!["--cell-slice-ttl", "2s"], "at least 3 ×"),
            (
                vec!["--tenant-auth", "tokens"],
                "needs --auth-credentials-file",
            ),
            (vec!["--tenant-auth", "magic"], "invalid value"),
            (
                vec!["--tenant-auth", "mtls", "--auth-credentials-file", "c.yaml"],
                "needs verified client certificates",
            ),
            (
                vec![
                    "--tenant-auth",
                    "tokens",
                    "--auth-credentials-file",
                    "c.yaml",
                    "--no-auth-tenant",
                    "solo",
                ],
                "cannot go with --tenant-auth tokens",
            ),
            (
                vec!["--auth-credentials-file", "c.yaml"],
                "needs --tenant-auth",
            ),
            (vec!["--auth-failure-rate", "0"], "--auth-failure-rate"),
            (vec!["--cell-fallback-floor", "0"], "--cell-fallback-floor"),
            (
                vec![
                    "--http-addr",
                    "127.0.0.1:9000",
                    "--admin-addr",
                    "127.0.0.1:9000",
                ],
                "--admin-addr must differ",
            ),
        ] {
            let err =
                Config::load_from(std::iter::once("weir").chain(args.iter().copied())).unwrap_err();
            assert!(format!("{err:#}").contains(expected), "{args:?}: {err:#}");
        }
    }
}

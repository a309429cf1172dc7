//! weir: a Mimir-style distributor for Prometheus remote-write (1.0 and 2.0) and OTLP/HTTP
//! metrics, and a distributed rate limiter.
//!
//! # Layout
//! - [`config`]: every setting as a clap flag, a `WEIR_…` env var and a `--config` YAML key.
//! - [`server`]: `run(config, listener, shutdown)`: the HTTP routes, the background tasks
//!   (config reload, EWMA tick, idle-tenant eviction) and graceful shutdown.
//! - [`admin`]: the operator's pages kept from clients: the `--admin-token-file` bearer check
//!   (the `--admin-addr` listener itself is wired in `server`).
//! - [`auth`]: tenant authentication (`--tenant-auth header|tokens|mtls`): the credentials
//!   file, the one check every door calls before any tenant limit, and the failure throttle.
//! - [`state`]: `AppState`, what every handler shares (config, limiter, metrics, upstream,
//!   store, the runtime config and membership in force), built by `server`.
//! - [`http_serve`]: the HTTP listener with its bounds (header timeout, header size,
//!   connections).
//! - [`affinity`]: pinning the HTTP workers to cores (`--http-pin-workers`).
//! - [`push`]: the push path (remote-write and OTLP), in order: instance limits → tenant →
//!   format → tenant pushes in flight → request rate → decode → ingestion rate → forward (or
//!   sink).
//! - [`instance`]: per-process limits (in-flight requests and bytes, ingestion-rate EWMA).
//! - [`upstream`]: forwarding admitted pushes, bytes unchanged, to a remote-write receiver
//!   (OTLP exports to its OTLP path).
//! - [`tenant`]: tenant IDs from `X-Scope-OrgID`, with Mimir's validation.
//! - [`format`]: which decoder reads a push (remote-write 1.0, 2.0 or OTLP), from its headers,
//!   and the one `decode` that dispatches to it. Above the decoders.
//! - [`remote_write`]: snappy + zero-copy protobuf scans of remote-write 1.0 and 2.0 bodies.
//! - [`otlp`]: OTLP/HTTP metrics bodies (protobuf or JSON, gzip), counted as Mimir charges them.
//! - [`counts`]: what every decoder reports (`WriteCounts`, `DecodeError`, `UnsupportedMedia`).
//!   Below the decoders.
//! - [`rejection`]: typed errors and their one mapping to status codes, headers and bodies.
//! - [`metrics`]: every metric family, defined in one place.
//! - [`ring_page`]: `GET /ring`, members and effective limits, HTML or JSON.
//! - [`grpc`]: the admission API (`weir.admission.v1.Admission`) and Envoy's rate-limit
//!   service on `--grpc-addr`; [`admission_http`] is its HTTP/JSON twin. Thin adapters.
//! - [`admission_common`]: what both admission doors share (name checks, lease TTL, error
//!   codes and reasons), below them both.
//! - [`fuzzing`]: the properties the fuzz targets (`fuzz/`) check, replayed in `cargo test`.
//! - [`tls`]: optional TLS for the HTTP listener and the upstream client, with certificate
//!   reload.
//! - [`store`]: the shared store's edge: Redis (the `redis-store` crate), connected in the
//!   background so a store that is down never keeps weir from starting.
//! - [`cells`]: the cell sync (`--cell`): reports each tenant's demand and spend to the store
//!   every interval and puts the cell's slices, answered by the store's script, in force; a
//!   background task that no request waits on.
//!
//! The limit engine (limit maths, buckets, fleet views, the tenant map) is the `engine`
//! crate's business (`engine/`); membership and gossip are the `ring` crate's (`ring/`).
//!
//! The runtime overrides file is the `runtime-config` crate's business.

pub mod admin;
pub mod admission_common;
pub mod admission_http;
pub mod affinity;
pub mod auth;
pub mod cells;
pub mod config;
pub mod counts;
pub mod format;
pub mod fuzzing;
pub mod grpc;
pub mod ha;
pub mod http_serve;
pub mod instance;
pub mod metrics;
pub mod otlp;
pub mod otlp_checks;
pub mod otlp_relabel;
pub mod push;
pub mod rejection;
pub mod remote_write;
pub mod ring_page;
pub mod server;
pub mod state;
pub mod store;
pub mod tenant;
pub mod tls;
pub mod upstream;

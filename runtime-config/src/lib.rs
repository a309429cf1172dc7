//! Strict YAML runtime overrides for weir, reloaded periodically with last-good retention.
//!
//! # Layout
//! - [`limits`]: the limit types (`TenantLimits`, `InstanceLimits`), their defaults and rules.
//! - [`admission`]: limits for the admission API, per tenant and key, and how the one in force
//!   is chosen.
//! - [`envoy`]: limits for Envoy's rate-limit service protocol, by domain and descriptor.
//! - [`config`]: parsing one file into a [`RuntimeConfig`]: strict keys, Mimir compatibility,
//!   inheritance from defaults, and rendering (`/runtime_config`, `?mode=diff`).
//! - [`reload`]: the periodic reloader. It re-parses only when the content hash changes,
//!   keeps the last good config on error, and publishes through a `watch` channel.
//! - [`relabel`]: Mimir's `metric_relabel_configs`, Prometheus' relabelling rules, checked and
//!   applied to one series' labels.
//! - [`tenant`]: Mimir's tenant-ID rule, shared by the overrides file and weir's push path.
//! - [`ha`]: Mimir's HA-tracker keys per tenant (deduplicating Prometheus HA pairs).
//! - [`otlp`]: Mimir's OTLP translation keys per tenant that change the labels of the series
//!   an export becomes (promoted resource attributes, identifying attributes kept).
//! - [`validation`]: Mimir's series validation limits per tenant, with Mimir's defaults.
//! - `scalars`: counts and booleans as Mimir's YAML reader takes them (`1e6`, `yes`).
//! - `mimir_keys`: Mimir's keys weir accepts without enforcing them, each with the component
//!   it belongs to or why weir does not enforce it yet ([`MimirKeys`] lists a file's).
//!
//! The example file used by weir's default run is `overrides.yaml` beside this crate.

pub mod admission;
pub mod config;
pub mod envoy;
pub mod ha;
pub mod limits;
mod mimir_keys;
pub mod otlp;
pub mod relabel;
pub mod reload;
mod scalars;
pub mod tenant;
pub mod validation;

pub use admission::{AdmissionConfig, Algorithm, LimitSource, LimitSpec, Unresolved};
pub use config::{ConfigError, MimirKeys, RenderMode, RuntimeConfig};
pub use ha::HaLimits;
pub use limits::{Defaults, InstanceLimits, RateLimitStrategy, StoreFailurePolicy, TenantLimits};
pub use otlp::{OtlpTranslation, TranslationStrategy};
pub use relabel::Relabel;
pub use reload::{ReloadMetrics, Reloader};
pub use validation::ValidationLimits;

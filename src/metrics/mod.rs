//! Every metric family weir exports, defined in one place and shaped after Mimir's
//! (`cortex_distributor_*`, `cortex_discarded_*`).
//!
//! Cardinality: families labelled `user` have one series per *active* tenant (per reason
//! where labelled so). A tenant's series live in its limiter state and go when that state is
//! evicted after `--tenant-idle-timeout`, so random tenant IDs cannot grow them without bound.
//!
//! The per-tenant series are not `prometheus` crate series: those cost about 6.8 KB per
//! tenant (a label map, a hash and a `Desc` per series). They are plain atomics in
//! [`TenantMetrics`], kept with the tenant's limiter state, and written straight into the
//! text exposition at scrape time ([`Metrics::render`]), under the same names and labels.

mod hooks;
mod reasons;
mod registry;
mod tenant;

pub use hooks::{StoreSeries, TenantSeries};
pub use reasons::{DiscardReason, InstanceLimit};
pub use registry::{Metrics, SCRAPE_CHUNK_BYTES};
pub use tenant::{Counter, TenantMetrics, TenantRates, TenantSource};

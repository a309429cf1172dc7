//! The state every request handler shares, in a room of its own: `server` builds it and the
//! handlers (`push`, `grpc`, `admission_http`, `ring_page`) read it, and none of them imports
//! another to get it.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use engine::Limiter;
use ring::Membership;
use runtime_config::RuntimeConfig;
use tokio::sync::watch;

use crate::config::Config;
use crate::instance::InstanceLimiter;
use crate::metrics::{Metrics, TenantSeries};
use crate::rejection::RetryAfter;
use crate::store::ConnectingStore;
use crate::upstream::Upstream;

/// What every request handler shares. Lives in one `Arc`: cloning the router never copies
/// limiter state.
pub struct AppState {
    pub config: Config,
    pub limiter: Limiter<TenantSeries>,
    pub instance: Arc<InstanceLimiter>,
    pub metrics: Arc<Metrics>,
    pub retry_after: RetryAfter,
    /// Where admitted pushes go; `None` is sink mode.
    pub upstream: Option<Upstream>,
    /// The shared store for `shared` tenants, when `--store-url` is set.
    pub store: Option<Arc<ConnectingStore>>,
    pub(crate) runtime_config: watch::Receiver<Arc<RuntimeConfig>>,
    pub(crate) membership: watch::Receiver<Arc<Membership>>,
    /// Set when shutdown begins: `/ready` answers 503 from then on.
    pub(crate) draining: AtomicBool,
    /// The HA tracker: the elected replica of each tenant's HA clusters.
    pub ha: Arc<crate::ha::HaTracker>,
    /// Tenant authentication (`--tenant-auth`): every door asks it before any tenant limit.
    pub auth: crate::auth::Authenticator,
    /// Where the admission API's gRPC service listens.
    pub grpc_addr: std::net::SocketAddr,
}

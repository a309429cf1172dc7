//! The per-tenant limit engine: one governor bucket per (tenant, limit kind), sized by the
//! limit maths from the config in force and the membership.
//!
//! The decision path — tenant lookup, bucket check — is lock-free and allocation-free in
//! steady state: tenants live in a papaya map (lock-free reads), a tenant's buckets sit behind
//! an `ArcSwap`, and governor's GCRA state is one atomic. When the config or the membership
//! changes, a generation number moves on and each tenant rebuilds its buckets lazily, on its
//! next request, carrying its tokens over (see [`bucket`]).

pub mod bucket;
pub mod clock;
pub mod demand;
pub mod maths;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};
use governor::clock::Clock;
use runtime_config::{RateLimitStrategy, RuntimeConfig, TenantLimits};

use crate::metrics::{Metrics, TenantMetrics};
use bucket::{nanos_between, Bucket, Outcome};
pub use clock::EngineClock;
use demand::{DemandMeter, OwnDemand};
use maths::{local_limits, LocalLimit, LocalLimits, TenantDemand};
use ring::PeerDemand;

/// How often the server calls [`Limiter::tick`].
pub const COARSE_CLOCK_TICK: Duration = Duration::from_secs(1);

/// Which of a tenant's limits a check is against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// One token per push request, checked before the body is read.
    Request,
    /// One token per sample, histogram, exemplar and metadata entry.
    Ingestion,
}

/// Why a check failed, with the fleet-wide numbers the 429 names.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rejection {
    pub kind: LimitKind,
    pub cause: RejectionCause,
    /// The tenant's fleet-wide rate for this limit, as configured.
    pub limit: f64,
    /// The tenant's burst for this limit, as configured.
    pub burst: u64,
    /// This replica's share of `limit`.
    pub local_limit: f64,
    /// What the request asked for.
    pub cost: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RejectionCause {
    /// Over the rate; the cost could pass after `wait`.
    RateLimited { wait: Duration },
    /// The cost exceeds the burst: it can never pass.
    LargerThanBurst,
    /// The limit is 0: nothing passes.
    Blocked,
}

/// The inputs of the limit maths, replaced as a whole when any of them changes.
pub struct Inputs {
    pub config: Arc<RuntimeConfig>,
    pub healthy_replicas: usize,
    pub peer_demand: Arc<PeerDemand>,
    generation: u64,
}

impl Inputs {
    /// A tenant's limits and local limits under these inputs and its own recent demand.
    fn local(&self, name: &str, own: OwnDemand) -> (TenantLimits, LocalLimits) {
        let limits = *self.config.tenant_limits(name);
        let (peer_requests, peer_items) = self.peer_demand.get(name);
        let demand = TenantDemand {
            own_requests: own.requests_per_second,
            own_items: own.items_per_second,
            peer_requests,
            peer_items,
            largest_request: own.largest_request,
            settled: own.settled,
        };
        (
            limits,
            local_limits(&limits, self.healthy_replicas, &demand),
        )
    }
}

/// One tenant's state on this replica.
pub struct Tenant<C: Clock = EngineClock> {
    buckets: ArcSwap<TenantBuckets<C>>,
    /// Serializes rebuilds only; the decision path never takes it.
    rebuild: Mutex<()>,
    /// Nanoseconds since the limiter's start at the last request.
    last_seen: AtomicU64,
    demand: DemandMeter,
    pub metrics: TenantMetrics,
}

struct TenantBuckets<C: Clock> {
    /// The `Inputs` generation these buckets were checked against.
    generation: AtomicU64,
    limits: TenantLimits,
    local: LocalLimits,
    request: Option<Bucket<C>>,
    ingestion: Option<Bucket<C>>,
}

impl LocalLimit {
    /// The rate as a gauge shows it: +Inf when unlimited, 0 when everything is refused.
    pub fn per_second(&self) -> f64 {
        match self {
            LocalLimit::Unlimited => f64::INFINITY,
            LocalLimit::Deny => 0.0,
            LocalLimit::Limited(rate) => rate.per_second,
        }
    }
}

impl<C: Clock> Tenant<C> {
    fn publish_local(&self, local: &LocalLimits) {
        self.metrics
            .local_request_rate
            .set(local.request.per_second());
        self.metrics
            .local_ingestion_rate
            .set(local.ingestion.per_second());
    }
}

/// A tenant's limits as this replica enforces them, for `/ring`.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantView {
    pub tenant: String,
    pub limits: TenantLimits,
    pub local: LocalLimits,
    pub demand: OwnDemand,
    /// (requests/s, items/s) the peers report for this tenant.
    pub peer_demand: (f64, f64),
}

/// A tenant's recent demand on this replica, for the ring.
#[derive(Debug, Clone, PartialEq)]
pub struct DemandReport {
    pub tenant: String,
    pub demand: OwnDemand,
}

impl<C: Clock + Clone> TenantBuckets<C> {
    fn new(limits: TenantLimits, local: LocalLimits, generation: u64, clock: &C) -> Self {
        let fresh = |limit: LocalLimit| match limit {
            LocalLimit::Limited(rate) => Some(Bucket::new(rate, clock)),
            LocalLimit::Unlimited | LocalLimit::Deny => None,
        };
        TenantBuckets {
            generation: AtomicU64::new(generation),
            limits,
            request: fresh(local.request),
            ingestion: fresh(local.ingestion),
            local,
        }
    }

    /// Buckets for new limits, carrying tokens over from these.
    fn rebuilt(
        &self,
        limits: TenantLimits,
        local: LocalLimits,
        generation: u64,
        clock: &C,
    ) -> Self {
        let carry = |old: &Option<Bucket<C>>, limit: LocalLimit| match (old, limit) {
            (_, LocalLimit::Unlimited | LocalLimit::Deny) => None,
            (Some(old), LocalLimit::Limited(rate)) => Some(old.carry_over(rate)),
            (None, LocalLimit::Limited(rate)) => Some(Bucket::new(rate, clock)),
        };
        TenantBuckets {
            generation: AtomicU64::new(generation),
            limits,
            request: carry(&self.request, local.request),
            ingestion: carry(&self.ingestion, local.ingestion),
            local,
        }
    }

    /// Seconds until every bucket would be full again if idle.
    fn refill_seconds(&self) -> f64 {
        self.local
            .request
            .refill_seconds()
            .max(self.local.ingestion.refill_seconds())
    }
}

pub struct Limiter<C: Clock = EngineClock> {
    tenants: papaya::HashMap<Box<str>, Arc<Tenant<C>>, foldhash::fast::RandomState>,
    inputs: ArcSwap<Inputs>,
    /// `inputs.generation`, readable with one atomic load on the decision path.
    generation: AtomicU64,
    /// Serializes writers of `inputs` so generations are unique.
    inputs_writer: Mutex<()>,
    /// Nanoseconds since `start`, refreshed by [`Limiter::tick`]: a coarse clock for
    /// `last_seen`, so marking a tenant active costs no clock read.
    coarse_now: AtomicU64,
    clock: C,
    start: C::Instant,
    idle_timeout: Duration,
    /// Most tenants tracked at once; 0 = no cap.
    max_tenants: usize,
    metrics: Arc<Metrics>,
}

/// A new tenant was refused because the replica already tracks `max_tenants`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyTenants {
    pub max_tenants: usize,
}

impl<C: Clock + Clone> Limiter<C> {
    pub fn with_clock(
        config: Arc<RuntimeConfig>,
        idle_timeout: Duration,
        metrics: Arc<Metrics>,
        clock: C,
    ) -> Self {
        Limiter {
            // Blocking resize: with incremental resizing, lookups walk the old and new tables
            // until the copy finishes, which `decision_parts/tenant_lookup` measured at 4×.
            // foldhash: a fraction of SipHash's cost, seeded per process.
            tenants: papaya::HashMap::builder()
                .resize_mode(papaya::ResizeMode::Blocking)
                .hasher(foldhash::fast::RandomState::default())
                .build(),
            inputs: ArcSwap::from_pointee(Inputs {
                config,
                healthy_replicas: 1,
                peer_demand: Arc::default(),
                generation: 0,
            }),
            generation: AtomicU64::new(0),
            inputs_writer: Mutex::new(()),
            coarse_now: AtomicU64::new(0),
            start: clock.now(),
            clock,
            idle_timeout,
            max_tenants: 0,
            metrics,
        }
    }

    /// Caps how many tenants are tracked at once: beyond it, new tenants are refused until
    /// idle ones are evicted. Bounds memory against floods of random tenant IDs.
    pub fn with_max_tenants(mut self, max_tenants: usize) -> Self {
        self.max_tenants = max_tenants;
        self
    }

    /// The tenant's state, created on first sight (unless the replica tracks too many
    /// tenants already). Marks the tenant as active now.
    pub fn tenant(&self, name: &str) -> Result<Arc<Tenant<C>>, TooManyTenants> {
        let now = self.coarse_now.load(Ordering::Relaxed);
        let tenants = self.tenants.pin();
        let tenant = match tenants.get(name) {
            Some(tenant) => tenant,
            None => {
                if self.max_tenants > 0 && tenants.len() >= self.max_tenants {
                    return Err(TooManyTenants {
                        max_tenants: self.max_tenants,
                    });
                }
                let tenant = tenants.get_or_insert_with(name.into(), || {
                    let inputs = self.inputs.load();
                    let (limits, local) = inputs.local(name, OwnDemand::default());
                    let buckets = TenantBuckets::new(limits, local, inputs.generation, &self.clock);
                    let tenant = Tenant {
                        rebuild: Mutex::new(()),
                        last_seen: AtomicU64::new(now),
                        demand: DemandMeter::default(),
                        metrics: self.metrics.tenant(name),
                        buckets: ArcSwap::from_pointee(buckets),
                    };
                    tenant.publish_local(&tenant.buckets.load().local);
                    Arc::new(tenant)
                });
                // Counted here and on eviction only: the map's length is not free.
                self.metrics.tracked_tenants.set(tenants.len() as i64);
                tenant
            }
        };
        // Write only when the coarse clock moved: no cache-line ping-pong between cores
        // serving the same tenant.
        if tenant.last_seen.load(Ordering::Relaxed) != now {
            tenant.last_seen.store(now, Ordering::Relaxed);
        }
        Ok(Arc::clone(tenant))
    }

    /// Takes `cost` tokens of the tenant's `kind` limit, or says why not.
    pub fn check(
        &self,
        name: &str,
        tenant: &Tenant<C>,
        kind: LimitKind,
        cost: u64,
    ) -> Result<(), Rejection> {
        // Demand counts what is offered, refused or not: it is what `weighted` shares by.
        match kind {
            LimitKind::Request => tenant.demand.offer_request(),
            LimitKind::Ingestion => tenant.demand.offer_items(cost),
        }
        let buckets = self.current(name, tenant);
        match self.check_buckets(&buckets, kind, cost) {
            // Under `weighted` the local ingestion burst is a share of the configured one, at
            // least the largest recent request. A request larger than any recent one but not
            // than the configured burst must not be told it can never pass: grow the local
            // burst to it (tokens carry over, so this admits nothing extra) and check again.
            Err(rejection)
                if rejection.cause == RejectionCause::LargerThanBurst
                    && kind == LimitKind::Ingestion
                    && cost <= buckets.limits.ingestion_burst_size =>
            {
                drop(buckets);
                let widened = self.rebuild(name, tenant, cost);
                self.check_buckets(&widened, kind, cost)
            }
            result => result,
        }
    }

    fn check_buckets(
        &self,
        buckets: &TenantBuckets<C>,
        kind: LimitKind,
        cost: u64,
    ) -> Result<(), Rejection> {
        let (local, bucket, limit, burst) = match kind {
            LimitKind::Request => (
                buckets.local.request,
                &buckets.request,
                buckets.limits.request_rate,
                buckets.limits.request_burst_size,
            ),
            LimitKind::Ingestion => (
                buckets.local.ingestion,
                &buckets.ingestion,
                buckets.limits.ingestion_rate,
                buckets.limits.ingestion_burst_size,
            ),
        };
        let rejection = |cause, local_limit| Rejection {
            kind,
            cause,
            limit,
            burst,
            local_limit,
            cost,
        };
        match (local, bucket) {
            (LocalLimit::Unlimited, _) => Ok(()),
            (LocalLimit::Deny, _) => Err(rejection(RejectionCause::Blocked, 0.0)),
            (LocalLimit::Limited(rate), Some(bucket)) => match bucket.check(cost) {
                Outcome::Allowed => Ok(()),
                Outcome::Denied { wait } => Err(rejection(
                    RejectionCause::RateLimited { wait },
                    rate.per_second,
                )),
                Outcome::TooLarge => {
                    Err(rejection(RejectionCause::LargerThanBurst, rate.per_second))
                }
            },
            (LocalLimit::Limited(_), None) => unreachable!("a limited limit always has a bucket"),
        }
    }

    /// The tenant's buckets for the current inputs, rebuilt first if the inputs moved on.
    fn current(&self, name: &str, tenant: &Tenant<C>) -> Guard<Arc<TenantBuckets<C>>> {
        let generation = self.generation.load(Ordering::Acquire);
        let buckets = tenant.buckets.load();
        if buckets.generation.load(Ordering::Acquire) == generation {
            return buckets;
        }
        drop(buckets);
        self.rebuild(name, tenant, 0)
    }

    /// Rebuilds the tenant's buckets if the inputs moved on (and the limits moved by more
    /// than 1 %), or if the local ingestion burst must grow to `largest_request`.
    fn rebuild(
        &self,
        name: &str,
        tenant: &Tenant<C>,
        largest_request: u64,
    ) -> Guard<Arc<TenantBuckets<C>>> {
        let _rebuilding = tenant.rebuild.lock().unwrap_or_else(|e| e.into_inner());
        let inputs = self.inputs.load();
        let buckets = tenant.buckets.load();
        let burst_fits = match buckets.local.ingestion {
            LocalLimit::Limited(rate) => rate.burst >= largest_request,
            LocalLimit::Unlimited | LocalLimit::Deny => true,
        };
        if buckets.generation.load(Ordering::Acquire) == inputs.generation && burst_fits {
            return buckets; // another request rebuilt them while this one waited
        }
        let mut own = tenant.demand.current();
        own.largest_request = own.largest_request.max(largest_request);
        let (limits, local) = inputs.local(name, own);
        if limits == buckets.limits && local.close_to(&buckets.local) && burst_fits {
            buckets
                .generation
                .store(inputs.generation, Ordering::Release);
            return buckets;
        }
        let rebuilt = buckets.rebuilt(limits, local, inputs.generation, &self.clock);
        tenant.publish_local(&rebuilt.local);
        tenant.buckets.store(Arc::new(rebuilt));
        tenant.buckets.load()
    }

    /// Puts a new config in force; tenants pick it up on their next request.
    pub fn set_config(&self, config: Arc<RuntimeConfig>) {
        self.update_inputs(|inputs| {
            (
                config,
                inputs.healthy_replicas,
                Arc::clone(&inputs.peer_demand),
            )
        });
    }

    /// Tells the limiter how many healthy replicas share each tenant's limit.
    pub fn set_healthy_replicas(&self, healthy_replicas: usize) {
        self.set_membership(
            healthy_replicas,
            Arc::clone(&self.inputs.load().peer_demand),
        );
    }

    /// Tells the limiter the healthy count and the peers' demand (for `weighted`).
    pub fn set_membership(&self, healthy_replicas: usize, peer_demand: Arc<PeerDemand>) {
        self.update_inputs(|inputs| (Arc::clone(&inputs.config), healthy_replicas, peer_demand));
    }

    fn update_inputs(
        &self,
        next: impl FnOnce(&Inputs) -> (Arc<RuntimeConfig>, usize, Arc<PeerDemand>),
    ) {
        let _writer = self.inputs_writer.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.inputs.load_full();
        let (config, healthy_replicas, peer_demand) = next(&current);
        let generation = current.generation + 1;
        self.inputs.store(Arc::new(Inputs {
            config,
            healthy_replicas,
            peer_demand,
            generation,
        }));
        self.generation.store(generation, Ordering::Release);
    }

    /// Moves every tenant's demand window on by one slot (call every
    /// [`demand::DEMAND_SLOT`]) and returns the tenants with recent demand, for the ring.
    /// Tenants re-derive their local limits on their next request.
    pub fn tick_demand(&self) -> Vec<DemandReport> {
        let reports = self
            .tenants
            .pin()
            .iter()
            .filter_map(|(name, tenant)| {
                let demand = tenant.demand.tick();
                // Only `weighted` shares depend on a tenant's own demand: mark just those
                // buckets stale (no generation matches u64::MAX), so they are re-derived on
                // the tenant's next request and every other tenant keeps its fast path.
                let buckets = tenant.buckets.load();
                if buckets.limits.rate_limit_strategy == RateLimitStrategy::Weighted {
                    buckets.generation.store(u64::MAX, Ordering::Release);
                }
                let active = demand.requests_per_second > 0.0 || demand.items_per_second > 0.0;
                active.then(|| DemandReport {
                    tenant: name.to_string(),
                    demand,
                })
            })
            .collect();
        reports
    }

    /// Drops tenants idle for longer than the idle timeout *and* long enough for their
    /// buckets to be full again, so eviction never changes a decision. Their metric series
    /// go with them. Returns how many were dropped.
    pub fn evict_idle(&self) -> usize {
        let now = self.tick();
        let tenants = self.tenants.pin();
        let before = tenants.len();
        tenants.retain(|name, tenant| {
            let idle =
                Duration::from_nanos(now.saturating_sub(tenant.last_seen.load(Ordering::Relaxed)));
            let refill = Duration::from_secs_f64(tenant.buckets.load().refill_seconds().min(1e9));
            // One tick of slack: `last_seen` is read from the coarse clock.
            let keep = idle <= self.idle_timeout.max(refill) + COARSE_CLOCK_TICK;
            if !keep {
                // Series first: a request racing this finds the old entry, never a new one
                // whose series were just removed.
                self.metrics.remove_tenant(name);
            }
            keep
        });
        let after = tenants.len();
        self.metrics.tracked_tenants.set(after as i64);
        before.saturating_sub(after)
    }

    /// Every tracked tenant's limits under the current inputs, sorted by tenant.
    pub fn tenant_views(&self) -> Vec<TenantView> {
        let inputs = self.inputs.load();
        let mut views: Vec<TenantView> = self
            .tenants
            .pin()
            .iter()
            .map(|(name, tenant)| {
                let demand = tenant.demand.current();
                let (limits, local) = inputs.local(name, demand);
                TenantView {
                    tenant: name.to_string(),
                    limits,
                    local,
                    demand,
                    peer_demand: inputs.peer_demand.get(name),
                }
            })
            .collect();
        views.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        views
    }

    pub fn tracked_tenants(&self) -> usize {
        self.tenants.len()
    }

    /// Refreshes the coarse clock; call every [`COARSE_CLOCK_TICK`]. Returns its new value.
    pub fn tick(&self) -> u64 {
        let now = nanos_between(self.start, self.clock.now());
        self.coarse_now.store(now, Ordering::Relaxed);
        now
    }
}

#[cfg(test)]
mod tests;

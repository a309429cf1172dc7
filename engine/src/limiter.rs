//! The per-tenant limit engine: one bucket per (tenant, limit kind), shaped by the limit maths
//! from the config in force and the membership.
//!
//! The decision path — tenant lookup, one bucket check — is lock-free and allocation-free in
//! steady state: tenants live in a papaya map (lock-free reads), a tenant's buckets sit behind
//! an `ArcSwap`, and a bucket is one atomic. A new config or healthy count is put in force at
//! once, for every tracked tenant, carrying each bucket's tokens over (no fresh burst, and
//! idle tenants too); a generation number catches a tenant created while that happens.
//!
//! Under `weighted`, a tenant's buckets are views of fleet-wide buckets ([`crate::fleet`]):
//! this replica's admissions are counted for gossip ([`Limiter::usage_reports`]), and the
//! peers' counts are charged as they arrive ([`Limiter::apply_peer_usage`]).
//!
//! Why one file of about a thousand lines: it is the push front-end, one map of tenants and
//! the four things done to it (decide, put new inputs in force, gossip, evict). Each of those
//! reads and writes the same per-tenant atomics, and the orderings between them (a tenant
//! created while inputs change, a report charged while a decision runs) are easiest to check
//! side by side. The pure maths is below it (`maths`, `fleet`, `bucket`), the failure policy
//! in `strategy`, and the admission front-end in `admission`; `Limiter`'s admission methods
//! only delegate.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};
use governor::clock::Clock;
use once_cell::race::OnceBox;
use runtime_config::{LimitSpec, RuntimeConfig, TenantLimits};

use crate::admission::{Acquisition, AdmissionError, Allowed, Ask, Entries, Keys, Lent};
use crate::bucket::Bucket;
use crate::cells::CellShares;
use crate::clock::EngineClock;
use crate::core::{Core, Inputs, NextInputs};
use crate::fleet::FleetBucket;
use crate::maths::{settling_budget, shard_rate, LocalLimit, LocalLimits};
use crate::shared::{self, Lease, Shared, SharedOutcome, SharedRequest};
use crate::store::BucketKey;
use crate::strategy::{on_store_failure, Kept};
use crate::types::{
    Admitted, LimitKind, Outcome, Rate, Rejection, RejectionCause, Taken, TakenFrom,
};
pub use crate::types::{PeerTotals, PeerUsage};

/// How long (nanoseconds) a refusal marks a tenant as contended on this replica.
const CONTENTION_MEMORY: u64 = 1_000_000_000;

/// How often the embedding service calls [`Limiter::tick`].
pub const COARSE_CLOCK_TICK: Duration = Duration::from_secs(1);

/// What the engine tells its embedder about tenants (metrics, mostly). All methods but
/// `create` have empty defaults.
pub trait TenantHooks: Send + Sync + 'static {
    /// Per-tenant data the embedder keeps with the tenant, dropped with it.
    type Data: Send + Sync + 'static;
    fn create(&self, tenant: &str) -> Self::Data;
    /// The tenant's state was dropped after its idle timeout.
    fn evicted(&self, _tenant: &str) {}
    /// The number of tracked tenants changed.
    fn tracked(&self, _tenants: usize) {}
}

/// Hooks that do nothing, for embedders without metrics and for tests.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoHooks;

impl TenantHooks for NoHooks {
    type Data = ();
    fn create(&self, _tenant: &str) {}
}

/// This replica's own admissions of one tenant under `weighted`, for gossip.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageReport {
    /// A tenant, or an admission key's entry name (`tenant/key`).
    pub tenant: String,
    /// Cumulative admitted requests and items since this replica started tracking the tenant.
    pub requests: u64,
    pub items: u64,
    /// This replica's view of the fleet buckets, when not full (new replicas start from it).
    pub requests_level: Option<f64>,
    pub items_level: Option<f64>,
    /// Admission keys: leases held on this replica now.
    pub in_flight: u64,
}

/// A tenant's demand and spend on this replica, cumulative, for the cell sync: per
/// [`LimitKind`] (requests, items), with its limits as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct CellUsage {
    pub tenant: String,
    pub limits: TenantLimits,
    /// Offered (admitted and refused): requests, items.
    pub offered: [u64; 2],
    /// Admitted (less what was refunded): requests, items.
    pub spent: [u64; 2],
}

/// One tenant's state on this replica.
pub struct Tenant<D, C: Clock = EngineClock> {
    name: Box<str>,
    state: ArcSwap<TenantState<C>>,
    /// Serializes rebuilds only; the decision path never takes it.
    rebuild: Mutex<()>,
    /// Coarse nanoseconds since the limiter's start at the last request.
    last_seen: AtomicU64,
    /// Per [`LimitKind::index`].
    usage: [KindUsage; 2],
    /// When (engine nanoseconds) the tenant started settling, for the limiter's `settling`
    /// time after (see [`settling_budget`]); [`NEVER_SETTLED`] for one the peers already
    /// reported.
    settling_from: u64,
    /// The usage report round this tenant was last listed in (0: never; see
    /// [`Limiter::mark_listed`]).
    listed_at: AtomicU64,
    /// Its admitted counts moved since it was last listed: it is queued in the limiter's
    /// `news` (set by the decision that moved them, cleared when it is listed).
    news: AtomicBool,
    /// `shared`: the leases, per [`LimitKind::index`], made on first use.
    leases: [OnceBox<Lease>; 2],
    /// In a cell: what the cell sync reports, per [`LimitKind::index`], made on first use.
    cell: OnceBox<[CellCounts; 2]>,
    pub data: D,
}

impl<D, C: Clock> Tenant<D, C> {
    /// Whether this replica admitted anything of it (under `weighted` or `shared`): what a
    /// usage report has to say of it.
    fn has_admitted(&self) -> bool {
        self.usage
            .iter()
            .any(|usage| usage.admitted.load(Ordering::Relaxed) > 0)
    }
}

/// [`Tenant::settling_from`] of a tenant that does not settle.
const NEVER_SETTLED: u64 = u64::MAX;

/// The usage reports' rotation: every tenant in the order it was least recently listed, as
/// of when the turn began, listed a message's worth at a time. A turn is made again by one
/// walk of every tenant when it runs out, not every round.
struct Rotation<T> {
    queue: VecDeque<Weak<T>>,
    /// The first report round of this turn: a tenant listed since (in turn, or for news) is
    /// done with it.
    started: u64,
}

impl<D, C: Clock> Rotation<Tenant<D, C>> {
    /// A new turn: every tenant with something admitted here, least recently listed first
    /// (then by where it lives), as of report round `started`.
    fn begin<'g>(&mut self, tenants: impl Iterator<Item = &'g Arc<Tenant<D, C>>>, started: u64)
    where
        D: 'g,
        C: 'g,
    {
        let mut turn: Vec<_> = tenants
            .filter(|tenant| tenant.has_admitted())
            .map(|tenant| {
                let listed_at = tenant.listed_at.load(Ordering::Relaxed);
                (
                    listed_at,
                    Arc::as_ptr(tenant) as usize,
                    Arc::downgrade(tenant),
                )
            })
            .collect();
        turn.sort_unstable_by_key(|(listed_at, at, _)| (*listed_at, *at));
        self.queue = turn.into_iter().map(|(_, _, tenant)| tenant).collect();
        self.started = started;
    }

    /// Whether a tenant of the turn still waits for it: still tracked, with something to
    /// report, and not listed since the turn began.
    fn waiting(&self, tenant: &Tenant<D, C>) -> bool {
        tenant.has_admitted() && tenant.listed_at.load(Ordering::Relaxed) < self.started
    }

    /// The next `wanted` tenants of the turn still waiting, leaving out those `queued` for
    /// news (by address).
    fn next(&self, wanted: usize, queued: &foldhash::HashSet<usize>) -> Vec<Arc<Tenant<D, C>>> {
        self.queue
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|tenant| {
                self.waiting(tenant) && !queued.contains(&(Arc::as_ptr(tenant) as usize))
            })
            .take(wanted)
            .collect()
    }

    /// Drops the head of the turn that no longer waits (listed, evicted).
    fn advance(&mut self) {
        while let Some(head) = self.queue.front() {
            match head.upgrade() {
                Some(tenant) if self.waiting(&tenant) => return,
                _ => {
                    self.queue.pop_front();
                }
            }
        }
    }
}

impl<T> Default for Rotation<T> {
    fn default() -> Self {
        Rotation {
            queue: VecDeque::new(),
            started: 0,
        }
    }
}

/// In a cell, every strategy but `shared`: offered and admitted here, cumulative (the cell
/// sync's demand and spend). Apart from [`KindUsage`] because most replicas are in no cell:
/// an idle tenant's state is what a replica holds most of.
#[derive(Default)]
struct CellCounts {
    offered: AtomicU64,
    spent: AtomicU64,
}

#[derive(Default)]
struct KindUsage {
    /// Admitted here under `weighted`, cumulative: what gossip carries.
    admitted: AtomicU64,
    /// `admitted` as last handed to gossip.
    published: AtomicU64,
    /// The peers' cumulative total already charged to the view.
    peers_applied: AtomicU64,
    /// The peers' cumulative refunds already credited to the view.
    peers_refunded: AtomicU64,
    /// `admitted` when the peers' admissions were last charged to the view: what this replica
    /// took since is ordered after them ([`FleetBucket::charge_peers`]).
    admitted_at_peers: AtomicU64,
    /// Spent from the settling budget.
    settling_spent: AtomicU64,
    /// When this replica last refused one (engine nanoseconds + 1; 0: never).
    refused_at: AtomicU64,
}

/// A tenant's buckets under one generation of inputs.
struct TenantState<C: Clock> {
    generation: AtomicU64,
    limits: TenantLimits,
    local: LocalLimits,
    /// Per [`LimitKind::index`].
    buckets: [KindBucket<C>; 2],
}

/// A push limit under its tenant's strategy: a governor bucket (`divided`) or a view of the
/// fleet-wide bucket (`weighted`, `shared`). The governor bucket is boxed: it is 168 bytes
/// where the view is 40, and the enum is as large as its largest variant, so inline it would
/// make every `weighted` tenant (the default) pay for it twice.
type KindBucket<C> = Kept<Box<Bucket<C>>, FleetBucket>;

/// A tenant's limits as this replica enforces them, for status pages.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantView {
    pub tenant: String,
    pub limits: TenantLimits,
    pub local: LocalLimits,
    /// Under `weighted`: this replica's view of the fleet buckets (requests, items).
    pub fleet_level: (Option<f64>, Option<f64>),
    /// Under `weighted`: admitted here and on the peers, cumulative (requests, items).
    pub admitted_here: (u64, u64),
    pub admitted_by_peers: (u64, u64),
    pub settling: bool,
}

/// A new tenant was refused because the replica already tracks `max_tenants`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyTenants {
    pub max_tenants: usize,
}

type TenantMap<D, C> = papaya::HashMap<Box<str>, Arc<Tenant<D, C>>, foldhash::fast::RandomState>;
type PeerMap = papaya::HashMap<Arc<str>, PeerTotals, foldhash::fast::RandomState>;

pub struct Limiter<H: TenantHooks = NoHooks, C: Clock = EngineClock> {
    tenants: TenantMap<H::Data, C>,
    /// The clock, the inputs in force, the ring place and the store, shared with the
    /// admission front-end.
    core: Core<C>,
    /// The peers' usage of each tenant as last applied, for tenants new to this replica:
    /// updated in place, a tenant at a time, as the ring hands on what moved.
    peers: PeerMap,
    /// Tenants whose admitted counts moved since they were last listed in a usage report,
    /// each queued once by the decision that raised its `news` flag: a round lists them
    /// without a walk of every tenant.
    news: Mutex<Vec<Box<str>>>,
    /// Every tenant in turn, for the reports' rotation of the rest.
    rotation: Mutex<Rotation<Tenant<H::Data, C>>>,
    /// Usage report rounds so far ([`Limiter::mark_listed`]).
    listing_round: AtomicU64,
    /// When `peers` was applied (engine nanoseconds), to refill the levels it reports.
    peers_at: AtomicU64,
    /// When a report was last applied just after this process stalled (engine nanoseconds;
    /// 0: never).
    silence_heard: AtomicU64,
    idle_timeout: Duration,
    /// Most tenants tracked at once; 0 = no cap.
    max_tenants: usize,
    /// How long a tenant new to the whole fleet is held to the even share.
    settling: Duration,
    /// The admission API's keys and leases; its `count_for_cells` says for the tenants too
    /// whether this replica is in a cell.
    admission: Entries,
    hooks: H,
}

impl<H: TenantHooks, C: Clock + Clone> Limiter<H, C> {
    pub fn with_clock(
        config: Arc<RuntimeConfig>,
        idle_timeout: Duration,
        hooks: H,
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
            core: Core::new(config, clock),
            peers: papaya::HashMap::builder()
                .hasher(foldhash::fast::RandomState::default())
                .build(),
            news: Mutex::new(Vec::new()),
            rotation: Mutex::new(Rotation::default()),
            listing_round: AtomicU64::new(0),
            peers_at: AtomicU64::new(0),
            silence_heard: AtomicU64::new(0),
            idle_timeout,
            max_tenants: 0,
            settling: Duration::from_secs(1),
            admission: Default::default(),
            hooks,
        }
    }

    /// This replica's name (in the ring), which replica-local lease ids carry.
    pub fn with_node_id(mut self, node_id: impl Into<String>) -> Self {
        self.core.node_id = node_id.into();
        self
    }

    /// The runtime config in force.
    pub fn runtime_config(&self) -> Arc<RuntimeConfig> {
        self.core.config()
    }

    /// The admission front-end, over this replica's keys.
    fn keys(&self) -> Keys<'_, C> {
        Keys::new(&self.core, &self.admission)
    }

    /// The admission API: decides `cost` for `tenant`'s `key` under the limit in force (see
    /// [`runtime_config::AdmissionConfig::resolve`]). May wait on the shared store, never
    /// longer than its timeout.
    pub async fn allow(
        &self,
        tenant: &str,
        key: &str,
        cost: u64,
        client: Option<LimitSpec>,
    ) -> Result<Allowed, AdmissionError> {
        self.keys().allow(tenant, key, cost, client).await
    }

    /// [`Limiter::allow`] for each ask, in order: one answer each. Cheaper than one call an
    /// ask: the keys already known here are decided under one guard at one reading of the
    /// clock.
    pub async fn allow_batch(&self, asks: &[Ask<'_>]) -> Vec<Result<Allowed, AdmissionError>> {
        self.keys().allow_batch(asks).await
    }

    /// Decides `cost` for `tenant`'s `key` under a limit the caller resolved itself (Envoy's
    /// descriptors, from `envoy_domains`), under the tenant's strategy.
    pub async fn allow_with_limit(
        &self,
        tenant: &str,
        key: &str,
        cost: u64,
        spec: LimitSpec,
    ) -> Result<Allowed, AdmissionError> {
        self.keys().allow_with_limit(tenant, key, cost, spec).await
    }

    /// Takes one in-flight slot of `tenant`'s `key` for `ttl`.
    pub async fn acquire(
        &self,
        tenant: &str,
        key: &str,
        client: Option<LimitSpec>,
        ttl: Duration,
    ) -> Result<Acquisition, AdmissionError> {
        self.keys().acquire(tenant, key, client, ttl).await
    }

    /// Takes one of `tenant`'s `max` pushes in flight, fleet-wide under the tenant's strategy
    /// (`max_inflight_push_requests`), for at most `ttl`. Release it with
    /// [`Limiter::release_local`] (a `L…` lease) or [`Limiter::release`].
    pub async fn acquire_push(
        &self,
        tenant: &str,
        max: u64,
        ttl: Duration,
    ) -> Result<Acquisition, AdmissionError> {
        self.keys().acquire_push(tenant, max, ttl).await
    }

    /// Gives a slot back.
    pub async fn release(&self, lease_id: &str) -> Result<(), AdmissionError> {
        self.keys().release(lease_id).await
    }

    /// Moves a held lease's deadline to `ttl` from now.
    pub async fn renew(&self, lease_id: &str, ttl: Duration) -> Result<(), AdmissionError> {
        self.keys().renew(lease_id, ttl).await
    }

    /// Releases a replica-local (`L…`) lease without waiting: for guards that release on drop.
    pub fn release_local(&self, lease_id: &str) -> Result<(), AdmissionError> {
        self.keys().release_local(lease_id)
    }

    /// The `Lease` RPC: lends up to `want` tokens of `tenant`'s `key` to an embedded client
    /// for `ttl`; what it does not report spent goes back to the meter then (see
    /// [`crate::admission`]).
    pub async fn lease(
        &self,
        tenant: &str,
        key: &str,
        want: u64,
        ttl: Duration,
        previous: Option<(&str, u64)>,
        give_back_tokens: u64,
    ) -> Result<Lent, AdmissionError> {
        self.keys()
            .lease(tenant, key, want, ttl, previous, give_back_tokens)
            .await
    }

    /// Frees replica-local leases past their deadline (their holders crashed or forgot), and
    /// gives back the unspent tokens of token leases past theirs. Returns how many.
    pub fn expire_leases(&self) -> usize {
        self.keys().expire_leases()
    }

    /// Returns once a lease of either kind is held on this replica: at once if one is, else
    /// when the next is lent. The sweep that runs [`Self::expire_leases`] waits on this
    /// between leases, so a replica without them is not woken for nothing.
    pub async fn until_leases_held(&self) {
        self.admission.until_leases_held().await
    }

    /// The store behind `shared` tenants. Without one, a `shared` tenant's decisions follow
    /// its failure policy, as if the store were down.
    pub fn with_shared(mut self, shared: Arc<Shared>) -> Self {
        self.core.shared = Some(shared);
        self
    }

    pub fn shared(&self) -> Option<&Arc<Shared>> {
        self.core.shared()
    }

    /// Probes the shared store while its breaker is not closed ([`Shared::probe_while_open`]),
    /// for good; returns at once without a store.
    pub async fn probe_store(&self) {
        if let Some(shared) = self.core.shared() {
            shared.probe_while_open(|| self.now()).await;
        }
    }

    /// Caps how many tenants are tracked at once: beyond it, new tenants are refused until
    /// idle ones are evicted. Bounds memory against floods of random tenant IDs.
    pub fn with_max_tenants(mut self, max_tenants: usize) -> Self {
        self.max_tenants = max_tenants;
        self
    }

    /// Most admission keys one tenant may have on this replica at once; 0 = no cap. A call
    /// for a new key past it is refused ([`AdmissionError::TooManyKeys`]).
    pub fn with_max_admission_keys_per_tenant(mut self, max: usize) -> Self {
        self.admission.max_keys_per_tenant = max;
        self
    }

    /// This replica is in a cell: count each tenant's demand and spend for the cell sync
    /// ([`Limiter::cell_usage`]). Outside cells nothing is counted.
    pub fn with_cells(mut self) -> Self {
        self.admission.count_for_cells = true;
        self
    }

    /// How long a tenant that no peer has reported yet is held to the even share under
    /// `weighted`: long enough for the peers' first reports of it to arrive.
    pub fn with_settling(mut self, settling: Duration) -> Self {
        self.settling = settling;
        self
    }

    fn now(&self) -> u64 {
        self.core.now_nanos()
    }

    /// The tenant's state, created on first sight (unless the replica tracks too many
    /// tenants already). Marks the tenant as active now.
    pub fn tenant(&self, name: &str) -> Result<Arc<Tenant<H::Data, C>>, TooManyTenants> {
        let coarse = self.core.coarse_nanos();
        let tenants = self.tenants.pin();
        let tenant = match tenants.get(name) {
            Some(tenant) => tenant,
            None => {
                if self.max_tenants > 0 && tenants.len() >= self.max_tenants {
                    return Err(TooManyTenants {
                        max_tenants: self.max_tenants,
                    });
                }
                let tenant = tenants.get_or_insert_with(name.into(), || self.new_tenant(name));
                // Counted here and on eviction only: the map's length is not free.
                self.hooks.tracked(tenants.len());
                tenant
            }
        };
        crate::core::touch(&tenant.last_seen, coarse);
        Ok(Arc::clone(tenant))
    }

    fn new_tenant(&self, name: &str) -> Arc<Tenant<H::Data, C>> {
        let now = self.now();
        let inputs = self.core.inputs.load();
        let (limits, local) = inputs.limits(name);
        // A tenant the peers already report is known to the fleet: start from what they
        // report (their admissions so far are not charged again, and the view starts at the
        // lowest level a peer has, refilled since). One nobody reports is new to the fleet:
        // it settles.
        let reported = self.peers.pin().get(name).copied();
        let since_report = now.saturating_sub(self.peers_at.load(Ordering::Acquire));
        let fresh = |kind: LimitKind, limit: LocalLimit| match limit {
            LocalLimit::Unlimited | LocalLimit::Deny => Kept::None,
            LocalLimit::Divided(rate) => {
                Kept::Divided(Box::new(Bucket::new(rate, self.core.clock())))
            }
            LocalLimit::Fleet(rate) | LocalLimit::Shared(rate) => {
                let level = reported
                    .and_then(|totals| totals.level(kind))
                    .map_or(f64::INFINITY, |level| {
                        level + rate.per_second * since_report as f64 / 1e9
                    });
                let view = FleetBucket::with_level(rate, level, now);
                match limit {
                    LocalLimit::Shared(_) => Kept::Shared(view),
                    _ => Kept::Weighted(view),
                }
            }
        };
        let state = TenantState {
            generation: AtomicU64::new(inputs.generation),
            buckets: [
                fresh(LimitKind::Request, local.request),
                fresh(LimitKind::Ingestion, local.ingestion),
            ],
            limits,
            local,
        };
        let tenant = Tenant {
            name: name.into(),
            state: ArcSwap::from_pointee(state),
            rebuild: Mutex::new(()),
            last_seen: AtomicU64::new(self.core.coarse_nanos()),
            usage: Default::default(),
            settling_from: if reported.is_some() {
                NEVER_SETTLED
            } else {
                now
            },
            listed_at: AtomicU64::new(0),
            news: AtomicBool::new(false),
            leases: [OnceBox::new(), OnceBox::new()],
            cell: OnceBox::new(),
            data: self.hooks.create(name),
        };
        if let Some(totals) = reported {
            for kind in [LimitKind::Request, LimitKind::Ingestion] {
                let usage = &tenant.usage[kind.index()];
                usage
                    .peers_applied
                    .store(totals.total(kind), Ordering::Relaxed);
                usage
                    .peers_refunded
                    .store(totals.refunded(kind), Ordering::Relaxed);
            }
        }
        Arc::new(tenant)
    }

    /// Takes `cost` tokens of the tenant's `kind` limit, or says why not.
    pub fn check(
        &self,
        tenant: &Tenant<H::Data, C>,
        kind: LimitKind,
        cost: u64,
    ) -> Result<(), Rejection> {
        self.check_within(tenant, kind, cost, Duration::ZERO)
            .map(|_| ())
    }

    /// As [`Limiter::check`], and under `weighted` also takes tokens that will be there
    /// within `max_delay`: a reservation, which the caller honours by waiting the returned
    /// delay before it proceeds. Other strategies answer at once (a zero delay).
    pub fn check_within(
        &self,
        tenant: &Tenant<H::Data, C>,
        kind: LimitKind,
        cost: u64,
        max_delay: Duration,
    ) -> Result<Duration, Rejection> {
        self.check_taking(tenant, kind, cost, max_delay)
            .map(|admitted| admitted.wait)
    }

    /// [`Limiter::check_within`], saying what was taken and from where.
    fn check_taking(
        &self,
        tenant: &Tenant<H::Data, C>,
        kind: LimitKind,
        cost: u64,
        max_delay: Duration,
    ) -> Result<Admitted, Rejection> {
        let max_delay = max_delay.as_nanos().min(u64::MAX as u128) as u64;
        let state = self.current(tenant);
        let rejection = rejection_for(&state, kind, cost);
        let local = match kind {
            LimitKind::Request => state.local.request,
            LimitKind::Ingestion => state.local.ingestion,
        };
        let at_once = |from| Admitted::at_once(kind, cost, from);
        let decided = match &state.buckets[kind.index()] {
            Kept::None if local == LocalLimit::Unlimited => Ok(at_once(TakenFrom::Nothing)),
            Kept::None => Err(rejection(RejectionCause::Blocked, 0)),
            Kept::Divided(bucket) => outcome_to_result(bucket.check(cost), rejection)
                .map(|_| at_once(TakenFrom::Divided)),
            Kept::Weighted(fleet) => match self.check_fleet(tenant, kind, fleet, cost, max_delay) {
                Ok(wait) => Ok(Admitted {
                    wait,
                    taken: Taken::new(kind, cost, TakenFrom::View),
                }),
                Err(outcome) => {
                    outcome_to_result(outcome, &rejection).map(|_| at_once(TakenFrom::View))
                }
            },
            // The synchronous path cannot wait on the store: it decides as the failure
            // policy would. The push path and the admission API use [`Limiter::admit`].
            Kept::Shared(fleet) => on_store_failure(
                state.limits.on_store_failure,
                None,
                || self.fleet_now(tenant, kind, fleet, cost, &rejection),
                || Err(rejection(RejectionCause::StoreUnavailable, 0)),
                Result::is_ok,
            )
            .map(|_| at_once(TakenFrom::View)),
        };
        // `shared` keeps one global bucket in the store: no cell slices it.
        if self.admission.count_for_cells && !state.buckets[kind.index()].is_shared() {
            let counts = &tenant.cell.get_or_init(Default::default)[kind.index()];
            counts.offered.fetch_add(cost, Ordering::Relaxed);
            if decided.is_ok() {
                counts.spent.fetch_add(cost, Ordering::Relaxed);
            }
        }
        decided
    }

    /// Takes `cost` tokens of the tenant's `kind` limit, or says why not: like
    /// [`Limiter::check`], and for `shared` tenants it may wait on the store (never longer
    /// than the store timeout).
    pub async fn admit(
        &self,
        tenant: &Tenant<H::Data, C>,
        kind: LimitKind,
        cost: u64,
    ) -> Result<(), Rejection> {
        self.admit_within(tenant, kind, cost, Duration::ZERO)
            .await
            .map(|_| ())
    }

    /// As [`Limiter::admit`], with [`Limiter::check_within`]'s reservations under `weighted`:
    /// says how long the caller must wait before it proceeds, and what it took (for
    /// [`Limiter::refund`]).
    pub async fn admit_within(
        &self,
        tenant: &Tenant<H::Data, C>,
        kind: LimitKind,
        cost: u64,
        max_delay: Duration,
    ) -> Result<Admitted, Rejection> {
        let state = self.current(tenant);
        if !matches!(state.buckets[kind.index()], Kept::Shared(_)) {
            drop(state);
            return self.check_taking(tenant, kind, cost, max_delay);
        }
        let at_once = |from| Admitted::at_once(kind, cost, from);
        // Owned: the state is held across the store call.
        let state = Guard::into_inner(state);
        let Kept::Shared(fleet) = &state.buckets[kind.index()] else {
            unreachable!("checked above")
        };
        let rejection = rejection_for(&state, kind, cost);
        let policy = state.limits.on_store_failure;
        let outcome = match &self.core.shared {
            Some(shared) => {
                let shards = state.limits.store_shards.max(1);
                let lease = tenant.leases[kind.index()]
                    .get_or_init(|| Box::new(Lease::new(&shared.config, shards, self.now())));
                let request = SharedRequest {
                    tenant: &tenant.name,
                    kind,
                    key: None,
                    cost,
                    shard_rate: shard_rate(fleet.rate(), shards),
                    shards,
                    replicas: self.core.healthy_replicas(),
                };
                shared::decide(shared, lease, request, || self.now()).await
            }
            None => SharedOutcome::StoreFailed,
        };
        let usage = &tenant.usage[kind.index()];
        match outcome {
            SharedOutcome::Admitted => {
                // Kept current for the day the store fails, and for the peers' views.
                fleet.charge(cost, self.now());
                usage.admitted.fetch_add(cost, Ordering::SeqCst);
                self.note_news(tenant);
                Ok(at_once(TakenFrom::Lease))
            }
            SharedOutcome::Refused(outcome) => {
                outcome_to_result(outcome, rejection).map(|_| at_once(TakenFrom::Lease))
            }
            SharedOutcome::StoreFailed => on_store_failure(
                policy,
                self.core.shared().map(|shared| &**shared),
                || self.fleet_now(tenant, kind, fleet, cost, &rejection),
                || Err(rejection(RejectionCause::StoreUnavailable, 0)),
                Result::is_ok,
            )
            .map(|_| at_once(TakenFrom::View)),
        }
    }

    /// Says that `tenant`'s admitted counts moved, for the next usage report: one load of a
    /// flag on the decision path, and the first time in a round its name queued. Sequentially
    /// consistent, as the count's change before it and the listing's clear and re-read
    /// ([`Limiter::mark_listed`]): one of the two sees the other, so no change goes unlisted.
    /// (On x86 these are the instructions the relaxed ones were.)
    fn note_news(&self, tenant: &Tenant<H::Data, C>) {
        if !tenant.news.load(Ordering::SeqCst) && !tenant.news.swap(true, Ordering::SeqCst) {
            self.news
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(tenant.name.clone());
        }
    }

    /// Runs `f` on the queue of tenants with news, taken out of its lock meanwhile so that the
    /// decisions queueing more do not wait on its lookups; what they queued meanwhile goes
    /// after it.
    fn with_news<R>(&self, f: impl FnOnce(&mut Vec<Box<str>>) -> R) -> R {
        let lock = || self.news.lock().unwrap_or_else(|e| e.into_inner());
        let mut news = std::mem::take(&mut *lock());
        let result = f(&mut news);
        let mut queue = lock();
        news.append(&mut queue);
        *queue = news;
        result
    }

    /// Gives back what an admission took, when the work it paid for did not happen (a
    /// forward that failed): the tokens return to the meter they came from, so the client's
    /// retry is charged once. Under `weighted` and `shared` the replica's admitted count,
    /// which gossip carries, goes down too, so the peers' views do not charge the tokens
    /// (they charge only what a count adds beyond the highest they have seen). If the
    /// tenant's strategy changed in between, the tokens lapse.
    pub fn refund(&self, tenant: &Tenant<H::Data, C>, taken: Taken) {
        if taken.cost == 0 {
            return;
        }
        let state = self.current(tenant);
        let usage = &tenant.usage[taken.kind.index()];
        if let Some(counts) = tenant.cell.get() {
            let _ = counts[taken.kind.index()].spent.fetch_update(
                Ordering::AcqRel,
                Ordering::Acquire,
                |spent| Some(spent.saturating_sub(taken.cost)),
            );
        }
        let uncount = |fleet: &FleetBucket| {
            fleet.refund(taken.cost);
            let _ = usage
                .admitted
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |admitted| {
                    Some(admitted.saturating_sub(taken.cost))
                });
            // The peers credit a count that falls: news too.
            self.note_news(tenant);
        };
        match (taken.from, &state.buckets[taken.kind.index()]) {
            (TakenFrom::Divided, Kept::Divided(bucket)) => bucket.refund(taken.cost),
            (TakenFrom::View, Kept::Weighted(fleet) | Kept::Shared(fleet)) => {
                uncount(fleet);
                if self.now() < self.settling_until(tenant) {
                    let _ = usage.settling_spent.fetch_update(
                        Ordering::AcqRel,
                        Ordering::Acquire,
                        |spent| Some(spent.saturating_sub(taken.cost)),
                    );
                }
            }
            (TakenFrom::Lease, Kept::Shared(fleet)) => {
                uncount(fleet);
                if let Some(lease) = tenant.leases[taken.kind.index()].get() {
                    lease.refund(taken.cost);
                }
            }
            _ => {}
        }
    }

    /// Gives leased tokens back to the store: expired ones and what demand no longer needs,
    /// or all of them (`all`, on shutdown; and for tenants no longer `shared`).
    pub async fn return_leases(&self, all: bool) {
        let Some(shared) = &self.core.shared else {
            return;
        };
        let tenants: Vec<Arc<Tenant<H::Data, C>>> = self
            .tenants
            .pin()
            .values()
            .filter(|tenant| tenant.leases.iter().any(|lease| lease.get().is_some()))
            .cloned()
            .collect();
        for tenant in tenants {
            let state = tenant.state.load_full();
            for kind in [LimitKind::Request, LimitKind::Ingestion] {
                let Some(lease) = tenant.leases[kind.index()].get() else {
                    continue;
                };
                let still_shared = matches!(state.buckets[kind.index()], Kept::Shared(_));
                let Some(rate) = state.buckets[kind.index()].view().map(FleetBucket::rate) else {
                    // No longer a bucket with a shape to return into: the tokens lapse.
                    lease.surplus(&shared.config, true, self.now());
                    continue;
                };
                let shards = state.limits.store_shards.max(1);
                let key = BucketKey::push(&tenant.name, kind, lease.home_shard(shards), shards);
                shared::give_back(
                    shared,
                    lease,
                    key,
                    shard_rate(rate, shards),
                    all || !still_shared,
                    || self.now(),
                )
                .await;
            }
        }
    }

    /// The fleet view decides at once (no reservation ahead): `shared`'s open fallback.
    fn fleet_now(
        &self,
        tenant: &Tenant<H::Data, C>,
        kind: LimitKind,
        fleet: &FleetBucket,
        cost: u64,
        rejection: &impl Fn(RejectionCause, u64) -> Rejection,
    ) -> Result<(), Rejection> {
        match self.check_fleet(tenant, kind, fleet, cost, 0) {
            Ok(_) => Ok(()),
            Err(outcome) => outcome_to_result(outcome, rejection),
        }
    }

    /// `weighted`: the fleet view decides; while the tenant settles, its even share too.
    /// Tokens that will be there within `max_delay` nanoseconds are reserved: the answer is
    /// how long to wait for them.
    fn check_fleet(
        &self,
        tenant: &Tenant<H::Data, C>,
        kind: LimitKind,
        fleet: &FleetBucket,
        cost: u64,
        max_delay: u64,
    ) -> Result<Duration, Outcome> {
        let now = self.now();
        // Tokens ahead are promised only by a view that has heard from its peers within the
        // last second. A replica that was stopped, cut off or is new would otherwise reserve
        // up to the delay's refill on top of the burst its stale view shows, before gossip
        // tells it what the others spent (a SIGSTOPped replica resumed at 1.37 L where the
        // bound is 1.28). Without it the caller waits and checks again instead. Nor for a
        // second after a silence (see `apply_peer_usage`): a resumed replica reserved the
        // backlog its sockets held 3 s ahead as soon as the first peer's report came, and the
        // peers, which do not charge what a returning peer counts on its return (it may have
        // admitted it while cut off), admitted as before while it refused its fresh pushes
        // for 8 s to pay for it. Checked again instead, the backlog takes what the refill
        // gives, as the peers' pushes do.
        let heard = now.saturating_sub(self.peers_at.load(Ordering::Acquire)) < CONTENTION_MEMORY
            && !self.back_from_silence(now);
        let max_delay = if self.core.healthy_replicas() > 1 && !heard {
            0
        } else {
            max_delay
        };
        let usage = &tenant.usage[kind.index()];
        let settling = now < self.settling_until(tenant);
        let mut settling_wait = Duration::ZERO;
        if settling {
            let rate = fleet.rate();
            let healthy = self.core.healthy_replicas();
            let elapsed = Duration::from_nanos(now - tenant.settling_from);
            let budget = settling_budget(rate, healthy, elapsed);
            // What the share will have grown to when the wait allowed is over.
            let ahead = settling_budget(rate, healthy, elapsed + Duration::from_nanos(max_delay));
            let reserved =
                usage
                    .settling_spent
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |spent| {
                        // One request always fits, so a share smaller than a request never
                        // refuses it outright.
                        (spent == 0 || (spent + cost) as f64 <= ahead).then_some(spent + cost)
                    });
            let share_wait = |spent: u64| {
                let missing = (spent + cost) as f64 - budget;
                let wait = missing * healthy.max(1) as f64 / rate.per_second;
                Duration::from_secs_f64(wait.clamp(0.0, 1e9))
            };
            match reserved {
                // The first request fits at once, however large (see above).
                Ok(0) => {}
                Ok(spent) => settling_wait = share_wait(spent),
                Err(spent) => {
                    if cost > rate.burst {
                        return Err(Outcome::TooLarge);
                    }
                    // The share stops counting once the tenant has settled, and the fleet view
                    // alone decides: the request may pass then, not when the share would
                    // have grown to it (for L = 10, B = 100 on two replicas, 15 s where the
                    // fleet view needed 2). The fleet view may need longer: the later.
                    let settled_in =
                        Duration::from_nanos(self.settling_until(tenant).saturating_sub(now));
                    return Err(Outcome::Denied {
                        wait: share_wait(spent).min(settled_in).max(fleet.wait(cost, now)),
                        available: (budget - spent as f64).max(0.0) as u64,
                    });
                }
            }
        }
        // While the tenant is contended here (refused within the last second), leave in the
        // bucket what the peers have likely admitted since their last report, so replicas do
        // not all spend the same refill before they hear of each other. Under the limit
        // nothing is held back: the fleet has room, and holding back would refuse requests
        // that one bucket would admit.
        let refused_at = usage.refused_at.load(Ordering::Relaxed);
        let contended = refused_at != 0 && now.saturating_sub(refused_at) < CONTENTION_MEMORY;
        let unreported = now.saturating_sub(self.peers_at.load(Ordering::Acquire))
            + self.core.backdate_nanos.load(Ordering::Relaxed);
        // No report for a second: the peers have admitted nothing since (they publish every
        // change), and a stale rate must not hold tokens back.
        let reserve = if contended && unreported < CONTENTION_MEMORY {
            // The peers' part of the refill since their last report is taken as the limit's
            // rate times (N − 1) ÷ N: the same on every replica, not the rate the peers were
            // measured at. Held back by a measured rate, the replica admitting most saw its
            // peers' rates lowest, held back least, took the refill first and so admitted more:
            // a tenant spread evenly over three replicas at 3 L was admitted 0.18, 0.34 and
            // 0.49 L by them. Held back alike, each replica takes the refill as its requests
            // come, in proportion to its share of the tenant's traffic.
            let rate = fleet.rate();
            let healthy = self.core.healthy_replicas().max(1) as f64;
            let peers_rate = rate.per_second * (healthy - 1.0) / healthy;
            // Never so much that this request could not pass even from a full bucket: a
            // request near the burst (vmagent's blocks of 10 000 rows against B = 10 000)
            // would otherwise wait for a level above the burst, which never comes.
            let burst = rate.burst;
            (peers_rate * unreported as f64 / 1e9)
                .min(burst as f64 / 2.0)
                .min(burst.saturating_sub(cost) as f64)
        } else {
            0.0
        };
        // The two waits run together, and the answer is the later: the fleet view may
        // promise as far ahead as any request's (a reservation it could not make in the delay
        // left after the share's wait was refused, then slept and checked again, and the
        // pushes of a new tenant's first burst were admitted out of their order).
        match fleet.reserve_within(cost, reserve, max_delay, now) {
            Ok(wait) => {
                usage.admitted.fetch_add(cost, Ordering::SeqCst);
                self.note_news(tenant);
                if !wait.is_zero() {
                    // Waiting for the refill: others are after it too.
                    usage.refused_at.store(now + 1, Ordering::Relaxed);
                }
                Ok(wait.max(settling_wait))
            }
            Err(outcome) => {
                usage.refused_at.store(now + 1, Ordering::Relaxed);
                if settling {
                    usage.settling_spent.fetch_sub(cost, Ordering::AcqRel);
                }
                Err(outcome)
            }
        }
    }

    /// Whether a report was applied just after this process stalled, within the last second.
    fn back_from_silence(&self, now: u64) -> bool {
        let heard = self.silence_heard.load(Ordering::Relaxed);
        heard != 0 && now.saturating_sub(heard) < CONTENTION_MEMORY
    }

    /// Until then (engine nanoseconds) the tenant is settling: see [`settling_budget`].
    fn settling_until(&self, tenant: &Tenant<H::Data, C>) -> u64 {
        match tenant.settling_from {
            NEVER_SETTLED => 0,
            from => from.saturating_add(self.settling.as_nanos() as u64),
        }
    }

    /// The tenant's buckets for the current inputs, rebuilt first if the inputs moved on
    /// (only for a tenant created while new inputs were being put in force).
    fn current(&self, tenant: &Tenant<H::Data, C>) -> Guard<Arc<TenantState<C>>> {
        let generation = self.core.generation();
        let state = tenant.state.load();
        if state.generation.load(Ordering::Acquire) == generation {
            return state;
        }
        drop(state);
        self.rebuild(tenant);
        tenant.state.load()
    }

    /// Rebuilds the tenant's buckets for the current inputs, carrying tokens over.
    fn rebuild(&self, tenant: &Tenant<H::Data, C>) {
        let _rebuilding = tenant.rebuild.lock().unwrap_or_else(|e| e.into_inner());
        let inputs = self.core.inputs.load();
        let state = tenant.state.load();
        if state.generation.load(Ordering::Acquire) == inputs.generation {
            return; // another thread rebuilt it while this one waited
        }
        let (limits, local) = inputs.limits(&tenant.name);
        if limits == state.limits && local == state.local {
            state.generation.store(inputs.generation, Ordering::Release);
            return;
        }
        let now = self.now();
        let carry = |old: &KindBucket<C>, limit: LocalLimit| {
            let view = |rate: Rate| match old {
                Kept::None => FleetBucket::full(rate, now),
                Kept::Divided(old) => FleetBucket::with_level(rate, old.drain_available(), now),
                Kept::Weighted(old) | Kept::Shared(old) => old.reshaped(rate, now),
            };
            match (old, limit) {
                (_, LocalLimit::Unlimited | LocalLimit::Deny) => Kept::None,
                (_, LocalLimit::Fleet(rate)) => Kept::Weighted(view(rate)),
                (_, LocalLimit::Shared(rate)) => Kept::Shared(view(rate)),
                (Kept::None, LocalLimit::Divided(rate)) => {
                    Kept::Divided(Box::new(Bucket::new(rate, self.core.clock())))
                }
                (Kept::Divided(old), LocalLimit::Divided(rate)) => {
                    Kept::Divided(Box::new(old.carry_over(rate)))
                }
                (Kept::Weighted(old) | Kept::Shared(old), LocalLimit::Divided(rate)) => {
                    Kept::Divided(Box::new(Bucket::with_tokens(
                        rate,
                        old.level(now),
                        self.core.clock(),
                    )))
                }
            }
        };
        let rebuilt = TenantState {
            generation: AtomicU64::new(inputs.generation),
            buckets: [
                carry(&state.buckets[0], local.request),
                carry(&state.buckets[1], local.ingestion),
            ],
            limits,
            local,
        };
        tenant.state.store(Arc::new(rebuilt));
    }

    /// Puts a new config in force, for every tracked tenant at once.
    pub fn set_config(&self, config: Arc<RuntimeConfig>) {
        self.update_inputs(|inputs| NextInputs {
            config,
            ..inputs.next()
        });
    }

    /// Tells the limiter how many healthy replicas share each tenant's limit.
    pub fn set_healthy_replicas(&self, healthy_replicas: usize) {
        let healthy_replicas = healthy_replicas.max(1);
        if self.core.inputs.load().healthy_replicas == healthy_replicas {
            return;
        }
        self.update_inputs(|inputs| NextInputs {
            healthy_replicas,
            ..inputs.next()
        });
    }

    /// Puts this cell's slices of the tenants' limits in force, for every tracked tenant at
    /// once (see [`crate::cells`]). A replica outside any cell never calls it.
    pub fn set_cell_shares(&self, cells: Arc<CellShares>) {
        self.update_inputs(|inputs| NextInputs {
            cells,
            ..inputs.next()
        });
    }

    /// The slices in force.
    pub fn cell_shares(&self) -> Arc<CellShares> {
        Arc::clone(&self.core.inputs.load().cells)
    }

    /// Tells the limiter its place (0-based) among the healthy replicas in the ring's order:
    /// which share of a fleet-wide in-flight cap it holds.
    pub fn set_rank(&self, rank: usize) {
        self.core.set_rank(rank);
    }

    /// Tells the limiter where the ring places it: `rank` of `healthy` replicas, whether it
    /// has joined, and how long leases granted elsewhere may still run (`horizons`). The
    /// healthy count divides the limits; the rank picks this replica's share of each in-flight
    /// cap, which grows only once the leases it was carved from may have ended (see
    /// [`crate::maths::SlotHolds`]).
    pub fn set_ring_place(
        &self,
        healthy: usize,
        rank: usize,
        joined: bool,
        horizons: crate::maths::LeaseHorizons,
    ) {
        self.set_healthy_replicas(healthy);
        self.core.set_rank(rank);
        self.core.move_slots(healthy, rank, joined, horizons);
    }

    /// How much longer this replica's longest-running in-flight lease of an admission key may
    /// be held (push slots left out): for the ring to tell the peers.
    pub fn lease_horizon(&self) -> Duration {
        self.keys().lease_horizon()
    }

    fn update_inputs(&self, next: impl FnOnce(&Inputs) -> NextInputs) {
        self.core.update_inputs(next);
        // In force from now, for idle tenants too: their tokens accrue under the new limits
        // from this moment.
        for tenant in self.tenants.pin().values() {
            self.rebuild(tenant);
        }
    }

    /// Charges the peers' admissions, as gossip reports them, to the tenants' fleet views.
    /// `changes`: the tenants and admission keys whose totals moved since the last call, with
    /// their totals now (the others are as they were; [`Limiter::forget_peer_usage`] takes
    /// them out). `backdate`: about how long ago the reported admissions happened. `stalled_since`: set
    /// by the ring for a second after this process did not run for a while (SIGSTOP, a paused
    /// VM), how long ago that began.
    pub fn apply_peer_usage(
        &self,
        changes: Arc<PeerUsage>,
        backdate: Duration,
        stalled_since: Option<Duration>,
    ) {
        let now = self.now();
        // The reports that reach a replica just after it did not run carry what the peers
        // admitted over all of that time: charged from when it began, the refill over it
        // counts, as it did for them. Charged as of now, they put the view in a debt as deep
        // as the stall was long, and a resumed replica held or refused a tenant under its
        // limit for seconds after. Each peer's first report after it may come in a round of
        // its own, with the backlog of pushes its sockets held admitted in between: all of
        // them are put before what this replica took since its last charge before the stall
        // (`over_silence`). Only the ring can say that this process stalled: a fleet with
        // nothing to report is quiet as long, and the peers' first report after a quiet time
        // is of what they admitted just now (dated from the start of the quiet time, a burst
        // after it was admitted whole by every replica).
        let over_silence = stalled_since.is_some();
        if over_silence {
            self.silence_heard.store(now, Ordering::Relaxed);
        }
        let silence = stalled_since.map_or(0, |since| since.as_nanos() as u64);
        let back = (backdate.as_nanos() as u64).max(silence);
        let at = now.saturating_sub(back);
        let tenants = self.tenants.pin();
        let peers = self.peers.pin();
        let mut keys_moved = false;
        for (name, totals) in changes.iter() {
            if name.contains('/') {
                keys_moved = true;
                continue;
            }
            peers.insert(Arc::clone(name), *totals);
            let Some(tenant) = tenants.get(&**name) else {
                continue;
            };
            let state = tenant.state.load();
            for kind in [LimitKind::Request, LimitKind::Ingestion] {
                let total = totals.total(kind);
                let kind_usage = &tenant.usage[kind.index()];
                let applied = kind_usage.peers_applied.fetch_max(total, Ordering::AcqRel);
                let spent = total.saturating_sub(applied);
                let refunded = totals.refunded(kind);
                let credited = kind_usage
                    .peers_refunded
                    .fetch_max(refunded, Ordering::AcqRel);
                let credit = refunded.saturating_sub(credited);
                let Some(fleet) = state.buckets[kind.index()].view() else {
                    continue;
                };
                if spent > 0 {
                    // Read before the charge: an admission counted after it is ordered after
                    // the peers' next charge too, which is the cautious side. Over a silence
                    // the takes here since the last charge stay after the next one too.
                    let admitted = kind_usage.admitted.load(Ordering::Acquire);
                    let before = match over_silence {
                        true => kind_usage.admitted_at_peers.load(Ordering::Acquire),
                        false => kind_usage
                            .admitted_at_peers
                            .swap(admitted, Ordering::AcqRel),
                    };
                    fleet.charge_peers(spent, at, admitted.saturating_sub(before), over_silence);
                }
                if credit > 0 {
                    fleet.refund_peers(credit, over_silence);
                }
            }
        }
        // Admission keys are applied whole each time (their peers' rate decays between
        // reports).
        let keys = self.keys();
        let key_usage = match keys_moved {
            true => keys.merge_peer_usage(changes.iter().filter(|(name, _)| name.contains('/'))),
            false => keys.peer_usage(),
        };
        for (name, totals) in key_usage.iter() {
            keys.apply_admission_usage(name, totals, at, now, over_silence);
        }
        self.peers_at.store(now, Ordering::Release);
        self.core
            .backdate_nanos
            .store(backdate.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Takes out tenants and admission keys no peer has listed for the ring's forget time: a
    /// tenant new here later is new to the fleet again.
    pub fn forget_peer_usage(&self, names: &[Arc<str>]) {
        if names.is_empty() {
            return;
        }
        let peers = self.peers.pin();
        for name in names.iter().filter(|name| !name.contains('/')) {
            peers.remove(&**name);
        }
        self.keys()
            .forget_peer_usage(names.iter().filter(|name| name.contains('/')));
    }

    /// Every tracked tenant's demand and spend here, cumulative, with its configured limits:
    /// what the cell sync reports (empty unless [`Limiter::with_cells`]). Tenants under
    /// `shared`, and those offered nothing, are left out.
    pub fn cell_usage(&self) -> Vec<CellUsage> {
        if !self.admission.count_for_cells {
            return Vec::new();
        }
        self.tenants
            .pin()
            .iter()
            .filter_map(|(name, tenant)| {
                let counts = tenant.cell.get()?;
                let count = |field: fn(&CellCounts) -> &AtomicU64| {
                    [0, 1].map(|kind| field(&counts[kind]).load(Ordering::Relaxed))
                };
                let offered = count(|c| &c.offered);
                if offered == [0, 0] {
                    return None;
                }
                Some(CellUsage {
                    tenant: name.to_string(),
                    limits: tenant.state.load().limits,
                    offered,
                    spent: count(|c| &c.spent),
                })
            })
            .collect()
    }

    /// Every admission key's demand and spend here (its in-flight cap's too, which is how a
    /// tenant's `max_inflight_push_requests` is sliced): what the cell sync reports besides
    /// the tenants (empty unless [`Limiter::with_cells`]). Reading resets the slots wanted.
    pub fn key_cell_usage(&self) -> Vec<crate::admission::KeyUsage> {
        if !self.admission.count_for_cells {
            return Vec::new();
        }
        self.keys().key_cell_usage()
    }

    /// This replica's admissions under `weighted`, for gossip, most urgent first: tenants with
    /// unpublished admissions (largest first), then the rest, least recently listed first, so
    /// that with more tenants than one message holds every tenant is still listed in turn.
    /// Call [`Limiter::mark_listed`] with the ones that were sent.
    pub fn usage_reports(&self) -> Vec<UsageReport> {
        self.usage_reports_first(usize::MAX)
    }

    /// The first `most` of [`Limiter::usage_reports`]: what one message can hold. Ranked are
    /// the tenants with news (queued by the decisions that made it) and the next `most` of the
    /// rotation, not every tenant: a replica that walked its 20 000 idle tenants twice a
    /// gossip round to rank them paid 3 % of a core for it (100 000: 13 %). The rotation is
    /// the tenants least recently listed, so the head is the same.
    pub fn usage_reports_first(&self, most: usize) -> Vec<UsageReport> {
        /// A tenant or an admission key, ranked before its report is written out.
        enum Candidate<T> {
            Tenant(Arc<T>),
            Key(crate::admission::KeyReport),
        }
        let now = self.now();
        let tenants = self.tenants.pin();
        // (news, when last listed, where it lives, what); `None` for a tenant with nothing
        // admitted here.
        let rank = |tenant: Arc<Tenant<H::Data, C>>| {
            let [request, ingestion] = &tenant.usage;
            let requests = request.admitted.load(Ordering::Relaxed);
            let items = ingestion.admitted.load(Ordering::Relaxed);
            if requests == 0 && items == 0 {
                return None;
            }
            // A refund can take a count below what was published.
            let unpublished = requests.saturating_sub(request.published.load(Ordering::Relaxed))
                + items.saturating_sub(ingestion.published.load(Ordering::Relaxed));
            let listed_at = tenant.listed_at.load(Ordering::Relaxed);
            let at = Arc::as_ptr(&tenant) as usize;
            Some((unpublished, listed_at, at, Candidate::Tenant(tenant)))
        };
        let mut ranked = Vec::new();
        let mut queued = foldhash::HashSet::default();
        self.with_news(|news| {
            for name in news.iter() {
                if let Some(tenant) = tenants.get(&**name) {
                    if queued.insert(Arc::as_ptr(tenant) as usize) {
                        ranked.extend(rank(Arc::clone(tenant)));
                    }
                }
            }
        });
        let wanted = most.saturating_sub(ranked.len());
        if wanted > 0 {
            let round = self.listing_round.load(Ordering::Relaxed);
            let mut rotation = self.rotation.lock().unwrap_or_else(|e| e.into_inner());
            let mut next = rotation.next(wanted, &queued);
            if next.len() < wanted {
                // The turn ran out: a new one, every tenant least recently listed first.
                rotation.begin(tenants.values(), round + 1);
                next = rotation.next(wanted, &queued);
            }
            ranked.extend(next.into_iter().filter_map(rank));
        }
        // Admission keys: their admitted cost as items, and the leases held here; a key
        // whose holders changed counts as news.
        ranked.extend(
            self.keys()
                .admission_reports()
                .into_iter()
                .map(|key| (key.news, 0, key.at(), Candidate::Key(key))),
        );
        // Most news first, then least recently listed (the tenants listed in one round tie),
        // then by where each lives: one order, so the first `most` are the head of the whole
        // list. (By name, the ties' string compares cost a sixth of the ranking.)
        let order = |a: &(u64, u64, usize, _), b: &(u64, u64, usize, _)| {
            b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2))
        };
        if ranked.len() > most {
            ranked.select_nth_unstable_by(most, order);
            ranked.truncate(most);
        }
        ranked.sort_unstable_by(order);
        let level = |bucket: &KindBucket<C>| {
            let fleet = bucket.view()?;
            Some(fleet.level(now)).filter(|level| *level < fleet.rate().burst as f64)
        };
        ranked
            .into_iter()
            .map(|(_, _, _, candidate)| match candidate {
                Candidate::Tenant(tenant) => {
                    let state = tenant.state.load();
                    let [request, ingestion] = &tenant.usage;
                    UsageReport {
                        tenant: tenant.name.to_string(),
                        requests: request.admitted.load(Ordering::SeqCst),
                        items: ingestion.admitted.load(Ordering::SeqCst),
                        requests_level: level(&state.buckets[0]),
                        items_level: level(&state.buckets[1]),
                        in_flight: 0,
                    }
                }
                Candidate::Key(key) => UsageReport {
                    tenant: key.name(),
                    requests: 0,
                    items: key.admitted,
                    requests_level: None,
                    items_level: None,
                    in_flight: key.in_flight,
                },
            })
            .collect()
    }

    /// Records that these reports — (tenant, requests, items, in flight) — were sent, as one
    /// round: a tenant listed is done with its turn, and with its news unless its counts moved
    /// again since they were read.
    pub fn mark_listed<'a>(&self, sent: impl IntoIterator<Item = (&'a str, u64, u64, u64)>) {
        let round = self.listing_round.fetch_add(1, Ordering::Relaxed) + 1;
        let tenants = self.tenants.pin();
        let mut listed = false;
        for (name, requests, items, in_flight) in sent {
            if name.contains('/') {
                self.keys().mark_admission_listed(name, items, in_flight);
                continue;
            }
            if let Some(tenant) = tenants.get(name) {
                tenant.usage[0]
                    .published
                    .fetch_max(requests, Ordering::Relaxed);
                tenant.usage[1]
                    .published
                    .fetch_max(items, Ordering::Relaxed);
                tenant.listed_at.store(round, Ordering::Relaxed);
                listed = true;
            }
        }
        if !listed {
            return;
        }
        self.with_news(|news| {
            news.retain(|name| {
                let Some(tenant) = tenants.get(&**name) else {
                    return false; // evicted
                };
                if tenant.listed_at.load(Ordering::Relaxed) != round {
                    return true; // did not fit this round's message
                }
                tenant.news.store(false, Ordering::SeqCst);
                // Admitted after its report was read: still news (see `note_news`).
                let moved = tenant.usage.iter().any(|usage| {
                    usage.admitted.load(Ordering::SeqCst) != usage.published.load(Ordering::Relaxed)
                });
                if moved {
                    tenant.news.store(true, Ordering::SeqCst);
                }
                moved
            })
        });
        self.rotation
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .advance();
    }

    /// Drops tenants idle for longer than the idle timeout *and* long enough for their
    /// buckets to be full again, so eviction never changes a decision (and admission keys
    /// idle as long that hold no lease). Returns how many tenants were dropped.
    pub fn evict_idle(&self) -> usize {
        self.keys().evict_admission(self.idle_timeout);
        let coarse = self.tick();
        let now = self.now();
        let tenants = self.tenants.pin();
        let before = tenants.len();
        tenants.retain(|name, tenant| {
            let idle = Duration::from_nanos(
                coarse.saturating_sub(tenant.last_seen.load(Ordering::Relaxed)),
            );
            let state = tenant.state.load();
            let refill = Duration::from_secs_f64(state.local.refill_seconds().min(1e9));
            // A fleet view in debt (peers spent more) is not full whatever the idle time, and
            // leased tokens go back to the store before the tenant goes.
            let full = state.buckets.iter().all(|bucket| match bucket.view() {
                Some(fleet) => fleet.level(now) >= fleet.rate().burst as f64,
                None => true,
            }) && tenant
                .leases
                .iter()
                .all(|lease| lease.get().is_none_or(|lease| lease.tokens() == 0));
            // One tick of slack: `last_seen` is read from the coarse clock.
            let keep = !full || idle <= self.idle_timeout.max(refill) + COARSE_CLOCK_TICK;
            if !keep {
                self.hooks.evicted(name);
            }
            keep
        });
        let after = tenants.len();
        self.hooks.tracked(after);
        if after < before {
            // Their news goes with them: a replica alone lists nothing, so nothing else
            // would take the names of the tenants it stops tracking.
            self.with_news(|news| news.retain(|name| tenants.contains_key(&**name)));
        }
        before.saturating_sub(after)
    }

    /// Every tracked tenant's limits as this replica enforces them, sorted by tenant.
    pub fn tenant_views(&self) -> Vec<TenantView> {
        let now = self.now();
        let peers = self.peers.pin();
        let mut views: Vec<TenantView> = self
            .tenants
            .pin()
            .iter()
            .map(|(name, tenant)| {
                let state = tenant.state.load();
                let level = |bucket: &KindBucket<C>| bucket.view().map(|fleet| fleet.level(now));
                let totals = peers.get(&**name).copied().unwrap_or_default();
                TenantView {
                    tenant: name.to_string(),
                    limits: state.limits,
                    local: state.local,
                    fleet_level: (level(&state.buckets[0]), level(&state.buckets[1])),
                    admitted_here: (
                        tenant.usage[0].admitted.load(Ordering::Relaxed),
                        tenant.usage[1].admitted.load(Ordering::Relaxed),
                    ),
                    admitted_by_peers: (totals.requests, totals.items),
                    settling: now < self.settling_until(tenant),
                }
            })
            .collect();
        views.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        views
    }

    /// Visits every tracked tenant's name and embedder data (in no particular order), without
    /// allocating: what a metrics scrape walks.
    pub fn for_each_tenant(&self, mut visit: impl FnMut(&str, &H::Data)) {
        for (name, tenant) in self.tenants.pin().iter() {
            visit(name, &tenant.data);
        }
    }

    /// [`Limiter::for_each_tenant`] with each tenant's limits, as configured and as this
    /// replica enforces them: a read of its state too, so only for what shows them.
    pub fn for_each_tenant_limits(
        &self,
        mut visit: impl FnMut(&str, &H::Data, &TenantLimits, &LocalLimits),
    ) {
        for (name, tenant) in self.tenants.pin().iter() {
            let state = tenant.state.load();
            visit(name, &tenant.data, &state.limits, &state.local);
        }
    }

    pub fn tracked_tenants(&self) -> usize {
        self.tenants.len()
    }

    /// Refreshes the coarse clock; call every [`COARSE_CLOCK_TICK`]. Returns its new value.
    pub fn tick(&self) -> u64 {
        self.core.tick()
    }
}

/// The refusal of `cost` against the tenant's `kind` limit, for a cause and what remains.
fn rejection_for<C: Clock>(
    state: &TenantState<C>,
    kind: LimitKind,
    cost: u64,
) -> impl Fn(RejectionCause, u64) -> Rejection {
    let (local, limit, burst) = match kind {
        LimitKind::Request => (
            state.local.request,
            state.limits.request_rate,
            state.limits.request_burst_size,
        ),
        LimitKind::Ingestion => (
            state.local.ingestion,
            state.limits.ingestion_rate,
            state.limits.ingestion_burst_size,
        ),
    };
    move |cause, remaining| Rejection {
        kind,
        cause,
        limit,
        burst,
        local_limit: local.per_second(),
        cost,
        remaining,
    }
}

fn outcome_to_result(
    outcome: Outcome,
    rejection: impl Fn(RejectionCause, u64) -> Rejection,
) -> Result<(), Rejection> {
    match outcome {
        Outcome::Allowed => Ok(()),
        Outcome::Denied { wait, available } => {
            Err(rejection(RejectionCause::RateLimited { wait }, available))
        }
        Outcome::TooLarge => Err(rejection(RejectionCause::LargerThanBurst, 0)),
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

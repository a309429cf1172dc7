//! `shared`: the authoritative bucket lives in a [`Store`]; each replica **leases** tokens from
//! it and admits locally from the lease, so the store sees one call per lease, not one per
//! request.
//!
//! - **Lease size**: the replica's recent demand for the tenant over `lease_window` (250 ms by
//!   default), at least the request at hand; with the tenant's store-call quota, the window
//!   widens to `1 ÷ quota`, so a busy tenant's leases grow instead of its calls multiplying.
//! - **A short bucket**: while the store's bucket is short, a replica takes nothing less than
//!   the fleet's refill over one window, and after a refusal waits until the store says that
//!   much is there, stretched at random up to N times so the replicas do not all come back
//!   at once. At the limit that keeps calls under 1 % of admitted requests.
//! - **Renewal**: the request that finds the lease short makes the one call (single flight:
//!   others wait for it, bounded by the store timeout, then spend what it brought).
//! - **Expiry**: leased tokens unspent after `lease_ttl` are given back, as is what exceeds
//!   twice the current lease size when demand falls, and everything on shutdown. The store
//!   caps a bucket at its burst, so a return can never overfill it.
//! - **Bound**: every token admitted was taken from the store, and is spent within
//!   `lease_ttl` of being taken; so over any span t the fleet admits at most B + L·(t +
//!   lease_ttl). A replica that crashes holding a lease loses those tokens: the fleet admits
//!   less, never more.
//! - **Store failure**: every call has a timeout; a [`Breaker`] stops calls to a sick store.
//!   Then `on_store_failure: open` decides against the tenant's fleet view (`weighted`, kept
//!   current all along), and `closed` refuses with `StoreUnavailable`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runtime_config::StoreFailurePolicy;

use crate::breaker::{Breaker, BreakerConfig, BreakerState, Permit};
use crate::fleet::FleetBucket;
use crate::store::{BucketKey, Grant, Store, StoreError};
use crate::types::{LimitKind, Outcome, Rate};

/// How leases behave; flags of the embedding service.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SharedConfig {
    /// Every store call gives up after this long.
    pub store_timeout: Duration,
    /// A lease covers the replica's demand over this long.
    pub lease_window: Duration,
    /// Leased tokens unspent after this long go back to the store.
    pub lease_ttl: Duration,
    /// Most store calls per second for one tenant (per limit) from this replica.
    pub calls_per_tenant: f64,
    pub breaker: BreakerConfig,
    /// Spreads replicas over a tenant's sub-buckets (`store_shards`).
    pub replica_seed: u64,
}

impl SharedConfig {
    /// The span a lease covers: the lease window, widened so one tenant's calls stay within
    /// its quota.
    pub fn window(&self) -> Duration {
        self.lease_window.max(Duration::from_secs_f64(
            1.0 / self.calls_per_tenant.max(0.1),
        ))
    }
}

impl Default for SharedConfig {
    fn default() -> Self {
        SharedConfig {
            store_timeout: Duration::from_millis(50),
            lease_window: Duration::from_millis(250),
            lease_ttl: Duration::from_millis(500),
            calls_per_tenant: 50.0,
            breaker: BreakerConfig::default(),
            replica_seed: 0,
        }
    }
}

/// What the engine reports about the store, for metrics.
pub trait StoreObserver: Send + Sync + 'static {
    /// One call: `op` is `take` or `give_back`; `outcome` is `ok`, `error` or `timeout`.
    fn call(&self, _op: &'static str, _outcome: &'static str, _seconds: f64) {}
    fn leased(&self, _tokens: u64) {}
    fn returned(&self, _tokens: u64) {}
    fn breaker(&self, _state: BreakerState) {}
    /// A decision taken under a failure policy because the store could not answer.
    fn policy_decision(&self, _policy: StoreFailurePolicy, _admitted: bool) {}
}

/// An observer that records nothing.
pub struct Unobserved;
impl StoreObserver for Unobserved {}

/// The store, its breaker and the lease settings, shared by every tenant.
pub struct Shared {
    pub store: Arc<dyn Store>,
    pub breaker: Breaker,
    pub config: SharedConfig,
    pub observer: Box<dyn StoreObserver>,
    /// Told when the breaker leaves closed, for [`Shared::probe_while_open`].
    opened: tokio::sync::Notify,
    /// When (engine nanoseconds) the store was last called.
    last_call: AtomicU64,
}

/// How often [`Shared::probe_while_open`] asks the breaker whether it may probe.
const PROBE_EVERY: Duration = Duration::from_millis(250);

/// A store that no call has reached for this long is pinged while the breaker is closed.
const IDLE_PING: Duration = Duration::from_secs(1);

impl Shared {
    pub fn new(
        store: Arc<dyn Store>,
        config: SharedConfig,
        observer: Box<dyn StoreObserver>,
    ) -> Self {
        Shared {
            store,
            breaker: Breaker::new(config.breaker),
            config,
            observer,
            opened: tokio::sync::Notify::new(),
            last_call: AtomicU64::new(0),
        }
    }

    /// Probes the store with a `PING` whenever the breaker lets one out, for as long as it
    /// is not closed, so that it closes, and its gauge says so, when the store is back, with
    /// no traffic to make the probe. While it is closed, pings a store that no call has
    /// reached for [`IDLE_PING`], so that an outage with no `shared` traffic opens the breaker
    /// (its gauge and alert), as `/ready` already tells, before a push has to find it out.
    /// Runs for good.
    pub async fn probe_while_open(&self, now: impl Fn() -> u64) {
        loop {
            if self.breaker.state() == BreakerState::Closed {
                let _ = tokio::time::timeout(IDLE_PING, self.opened.notified()).await;
                let idle = now().saturating_sub(self.last_call.load(Ordering::Relaxed));
                if self.breaker.state() == BreakerState::Closed
                    && idle >= IDLE_PING.as_nanos() as u64
                {
                    let _ = self.call("ping", &now, self.store.ping()).await;
                }
                continue;
            }
            if self.permit(now()) == Permit::Probe {
                // The outcome goes to the breaker; nothing else needs it.
                let _ = self.call("ping", &now, self.store.ping()).await;
            }
            tokio::time::sleep(PROBE_EVERY).await;
        }
    }

    /// One store call, bounded by the timeout and fed to the breaker and the observer.
    pub(crate) async fn call<T>(
        &self,
        op: &'static str,
        now: impl Fn() -> u64,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        self.last_call.store(now(), Ordering::Relaxed);
        let result = match tokio::time::timeout(self.config.store_timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(self.config.store_timeout)),
        };
        let outcome = match &result {
            Ok(_) => "ok",
            Err(StoreError::Timeout(_)) => "timeout",
            Err(StoreError::Failed(_)) => "error",
        };
        self.observer
            .call(op, outcome, started.elapsed().as_secs_f64());
        let before = self.breaker.state();
        self.breaker.record(now(), result.is_ok());
        let after = self.breaker.state();
        if before != after {
            tracing::warn!(from = ?before, to = ?after, "shared store circuit breaker");
            self.observer.breaker(after);
            if before == BreakerState::Closed {
                self.opened.notify_one();
            }
        }
        result
    }

    /// Whether a call may go out now; reports a breaker that just went half-open.
    pub(crate) fn permit(&self, now: u64) -> Permit {
        let before = self.breaker.state();
        let permit = self.breaker.permit(now);
        if self.breaker.state() != before {
            self.observer.breaker(self.breaker.state());
        }
        permit
    }
}

/// One tenant's lease for one limit on this replica.
pub struct Lease {
    /// Tokens leased and not yet spent.
    tokens: AtomicU64,
    /// Tokens given back for work that did not happen, for the store ([`Lease::refund`]).
    refunded: AtomicU64,
    /// Engine nanoseconds after which the tokens held are not spent but given back.
    expires_at: AtomicU64,
    /// After the store said the bucket is empty: no call before this (engine nanoseconds).
    not_before: AtomicU64,
    /// Items offered here (admitted or not), for sizing leases.
    offered: AtomicU64,
    /// At the last renewal: offered, and when (engine nanoseconds); and the demand estimate
    /// (items/s, f64 bits).
    sized_offered: AtomicU64,
    sized_at: AtomicU64,
    demand: AtomicU64,
    /// The sub-bucket this replica draws from first.
    shard: AtomicU32,
    /// The tenant's store-call quota (calls per second).
    calls: FleetBucket,
    /// Single flight: the request holding it makes the call.
    renewing: tokio::sync::Mutex<()>,
}

/// The outcome of a shared decision.
pub(crate) enum SharedOutcome {
    Admitted,
    Refused(Outcome),
    /// The store could not answer: the tenant's failure policy decides.
    StoreFailed,
}

impl Lease {
    pub(crate) fn new(config: &SharedConfig, shards: u32, now: u64) -> Lease {
        let calls = Rate {
            per_second: config.calls_per_tenant.max(0.1),
            burst: config.calls_per_tenant.ceil().max(1.0) as u64,
        };
        Lease {
            tokens: AtomicU64::new(0),
            refunded: AtomicU64::new(0),
            expires_at: AtomicU64::new(0),
            not_before: AtomicU64::new(0),
            offered: AtomicU64::new(0),
            sized_offered: AtomicU64::new(0),
            sized_at: AtomicU64::new(now),
            demand: AtomicU64::new(0f64.to_bits()),
            shard: AtomicU32::new((config.replica_seed % shards.max(1) as u64) as u32),
            calls: FleetBucket::full(calls, now),
            renewing: tokio::sync::Mutex::new(()),
        }
    }

    /// Takes `cost` from the lease if it holds that many unexpired tokens.
    fn try_take(&self, cost: u64, now: u64) -> bool {
        if now > self.expires_at.load(Ordering::Acquire) {
            return false;
        }
        self.tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tokens| {
                tokens.checked_sub(cost)
            })
            .is_ok()
    }

    /// Gives back tokens taken for work that did not happen. They go back to the store with
    /// the next surplus ([`Lease::surplus`], every lease window), not into the lease: the
    /// store's bucket is capped at its burst, and tokens kept here would not be (a lease
    /// whose every take was refunded through a 10 s upstream outage came out of it beside a
    /// full store bucket, and the fleet admitted 4 pushes over B + L·t).
    pub(crate) fn refund(&self, cost: u64) {
        self.refunded.fetch_add(cost, Ordering::AcqRel);
    }

    /// The sub-bucket this replica draws from now.
    pub(crate) fn home_shard(&self, shards: u32) -> u32 {
        self.shard.load(Ordering::Relaxed) % shards.max(1)
    }

    /// Tokens held now, for status pages.
    pub fn tokens(&self) -> u64 {
        self.tokens.load(Ordering::Relaxed)
    }

    /// The tokens to give back now: all if `all` or expired, else what exceeds twice the
    /// current lease size (demand fell).
    pub(crate) fn surplus(&self, config: &SharedConfig, all: bool, now: u64) -> u64 {
        let refunded = self.refunded.swap(0, Ordering::AcqRel);
        let expired = now > self.expires_at.load(Ordering::Acquire);
        if all || expired {
            return refunded + self.tokens.swap(0, Ordering::AcqRel);
        }
        let keep = 2 * self.lease_size(config, 0, u64::MAX, now);
        refunded
            + self
                .tokens
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tokens| {
                    (tokens > keep).then_some(keep)
                })
                .map_or(0, |before| before - keep)
    }

    /// The lease to ask for: demand over the lease window (widened by the call quota), at
    /// least `cost`, at most `cap`. Demand is measured over at least 50 ms at a time and
    /// smoothed over a quarter second.
    fn lease_size(&self, config: &SharedConfig, cost: u64, cap: u64, now: u64) -> u64 {
        let demand = self.demand(now, false);
        ((demand * config.window().as_secs_f64()).ceil() as u64)
            .max(cost)
            .min(cap.max(cost))
    }

    /// The demand estimate (items/s); with `record`, a measurement window of 50 ms or more
    /// is folded in and a new one starts.
    fn demand(&self, now: u64, record: bool) -> f64 {
        let previous = f64::from_bits(self.demand.load(Ordering::Relaxed));
        let since = now.saturating_sub(self.sized_at.load(Ordering::Relaxed)) as f64 / 1e9;
        if since < 0.05 {
            return previous;
        }
        let offered = self.offered.load(Ordering::Relaxed);
        let recent =
            offered.saturating_sub(self.sized_offered.load(Ordering::Relaxed)) as f64 / since;
        // Smoothed over a quarter second: quick to follow, steady between leases.
        let demand = previous + (recent - previous) * (since / 0.25).min(1.0);
        if record {
            self.sized_offered.store(offered, Ordering::Relaxed);
            self.sized_at.store(now, Ordering::Relaxed);
            self.demand.store(demand.to_bits(), Ordering::Relaxed);
        }
        demand
    }
}

/// Everything a shared decision needs about the tenant and limit.
pub(crate) struct SharedRequest<'a> {
    pub tenant: &'a str,
    pub kind: LimitKind,
    /// An admission API key, instead of a push limit.
    pub key: Option<&'a str>,
    pub cost: u64,
    /// The rate of one sub-bucket: the tenant's limit ÷ `shards`.
    pub shard_rate: Rate,
    pub shards: u32,
    /// Healthy replicas, which may be waiting on the same bucket.
    pub replicas: usize,
}

/// Decides one shared request: from the lease if it can, else with one store call (or two,
/// with sub-buckets: the next one when the first is empty).
pub(crate) async fn decide(
    shared: &Shared,
    lease: &Lease,
    request: SharedRequest<'_>,
    now: impl Fn() -> u64 + Copy,
) -> SharedOutcome {
    let cost = request.cost;
    lease.offered.fetch_add(cost, Ordering::Relaxed);
    if cost > request.shard_rate.burst {
        return SharedOutcome::Refused(Outcome::TooLarge);
    }
    if lease.try_take(cost, now()) {
        return SharedOutcome::Admitted;
    }
    if let Some(refused) = refused_for_now(lease, now()) {
        return refused;
    }
    if shared.permit(now()) == Permit::Refused {
        return SharedOutcome::StoreFailed;
    }
    // Single flight, bounded: a slow call in progress means a slow store.
    let Ok(_renewing) =
        tokio::time::timeout(shared.config.store_timeout, lease.renewing.lock()).await
    else {
        return SharedOutcome::StoreFailed;
    };
    if lease.try_take(cost, now()) {
        return SharedOutcome::Admitted;
    }
    if let Some(refused) = refused_for_now(lease, now()) {
        return refused;
    }
    let attempts = request.shards.min(2);
    let mut last = None;
    for _ in 0..attempts {
        // The tenant's own quota of store calls: past it, nothing waits on the store.
        if let Outcome::Denied { wait, .. } = lease.calls.check(1, now()) {
            return SharedOutcome::Refused(Outcome::Denied { wait, available: 0 });
        }
        let at = now();
        let want = lease.lease_size(&shared.config, cost, request.shard_rate.burst, at);
        // While the bucket is short, take nothing less than the fleet's refill over one lease
        // window (or all that is asked): calling for every token that trickles in would cost
        // a call per request at the limit. The store then says when that much is there.
        let chunk = (request.shard_rate.per_second * shared.config.window().as_secs_f64()) as u64;
        let min = chunk.clamp(cost, want);
        let shard = lease.shard.load(Ordering::Relaxed) % request.shards.max(1);
        let key = BucketKey {
            tenant: request.tenant,
            kind: request.kind,
            shard,
            shards: request.shards.max(1),
            key: request.key,
        };
        let grant: Grant = match shared
            .call(
                "take",
                now,
                shared.store.take(key, request.shard_rate, want, min),
            )
            .await
        {
            Ok(grant) => grant,
            Err(err) => {
                tracing::debug!(%err, tenant = request.tenant, "shared store take failed");
                return SharedOutcome::StoreFailed;
            }
        };
        if grant.granted >= cost {
            shared.observer.leased(grant.granted);
            lease.demand(at, true);
            lease
                .tokens
                .fetch_add(grant.granted - cost, Ordering::AcqRel);
            lease.expires_at.store(
                at + shared.config.lease_ttl.as_nanos() as u64,
                Ordering::Release,
            );
            return SharedOutcome::Admitted;
        }
        // This sub-bucket is empty: the next one, if there are several.
        lease.shard.fetch_add(1, Ordering::Relaxed);
        last = Some(grant);
    }
    let grant = last.expect("at least one attempt");
    // No call until the store says tokens could be there (at most a second), stretched at
    // random up to N times: the other replicas were told the same, and if all came back at
    // once, all but one would find the bucket short again and call for nothing.
    let spread = 1.0
        + unit_random(now() ^ shared.config.replica_seed) * (request.replicas.max(1) - 1) as f64;
    let wait = grant.wait.mul_f64(spread).min(Duration::from_secs(1));
    lease
        .not_before
        .store(now() + wait.as_nanos() as u64, Ordering::Release);
    SharedOutcome::Refused(Outcome::Denied {
        wait: grant.wait,
        available: grant.remaining.max(0.0) as u64,
    })
}

/// A number in [0, 1) from `seed` (splitmix64): cheap and good enough to spread replicas.
fn unit_random(seed: u64) -> f64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

fn refused_for_now(lease: &Lease, now: u64) -> Option<SharedOutcome> {
    let not_before = lease.not_before.load(Ordering::Acquire);
    (now < not_before).then(|| {
        SharedOutcome::Refused(Outcome::Denied {
            wait: Duration::from_nanos(not_before - now),
            available: 0,
        })
    })
}

/// Gives a lease's surplus back to the store (see [`Lease::surplus`]).
pub(crate) async fn give_back(
    shared: &Shared,
    lease: &Lease,
    key: BucketKey<'_>,
    rate: Rate,
    all: bool,
    now: impl Fn() -> u64 + Copy,
) {
    let surplus = lease.surplus(&shared.config, all, now());
    if surplus == 0 {
        return;
    }
    match shared
        .call("give_back", now, shared.store.give_back(key, rate, surplus))
        .await
    {
        Ok(()) => shared.observer.returned(surplus),
        Err(err) => {
            tracing::debug!(%err, tenant = key.tenant, surplus, "giving a lease back failed; the tokens are lost (the fleet admits less, never more)")
        }
    }
}

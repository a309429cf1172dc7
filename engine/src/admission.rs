//! The admission API's engine: "may this proceed?" for any tenant and key, under the tenant's
//! strategy, with the algorithm its limit names; and fleet-wide in-flight caps with leases.
//!
//! - **Rates.** `divided`: a meter at rate ÷ N. `weighted`: a fleet-wide meter, charged with
//!   the peers' admissions as gossip reports them (the same usage key as the push limits).
//!   `shared`: the token bucket through leases from the store, sliding windows and leaky
//!   buckets by one atomic script per decision.
//! - **In flight.** `divided` and `weighted`: a fixed share per replica by its rank in the
//!   ring ([`crate::maths::slot_share`]), the shares summing to max. `shared`: a sorted set of
//!   leases in the store, scored by deadline. Every lease has a TTL: a holder that crashes frees its slot then.
//!   A lease id names where the lease lives: `L<id>@<node>` on a replica, `S<id>/<name>` in
//!   the store (any replica can release it).
//!
//! Keys are percent-encoded into entry names, `tenant/key`, so they travel safely in gossip
//! and store keys (tenant IDs hold no `/`: every door and the overrides file refuse one).
//!
//! Why one file of about nine hundred lines: it is the admission front-end, one map of
//! entries and what is done to them (decide under each algorithm and strategy, take and give
//! back in-flight slots, gossip, evict), over the same per-entry atomics; the meters are in
//! `algorithms`, the leases in `shared`, the failure policy in `strategy`.
//!
//! This front-end keeps its own entries and reads the clock, the inputs in force and the
//! store through [`crate::core::Core`]; it imports nothing of the push front-end.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use governor::clock::Clock;
use runtime_config::{Algorithm, LimitSource, LimitSpec, RateLimitStrategy, Unresolved};

use crate::algorithms::{Decision, Meter, TooLarge};
use crate::core::Core;
use crate::maths::slot_share;
use crate::shared::{self, Lease, SharedOutcome, SharedRequest};
use crate::store::{KeyName, StoredMeter};
use crate::strategy::{on_store_failure, Kept};
use crate::types::{LimitKind, Outcome, Rate};

/// Why an admission call cannot be answered with a decision. Each maps to a gRPC status.
#[derive(Debug, Clone, PartialEq)]
pub enum AdmissionError {
    /// Strict policy: the tenant has no overrides (NOT_FOUND).
    UnknownTenant(String),
    /// Strict policy: the tenant has no limit for the key (NOT_FOUND).
    UnknownKey(String, String),
    /// No limit applies and no default is configured (NOT_FOUND).
    NoLimit(String, String),
    /// The limit spec sent is invalid (INVALID_ARGUMENT).
    BadSpec(String),
    /// Cost 0 or more than the limit can ever allow at once (INVALID_ARGUMENT / OUT_OF_RANGE).
    BadCost(String),
    /// The key has no `max_concurrent` (FAILED_PRECONDITION).
    NotConcurrent(String),
    /// Unknown, released or expired lease (NOT_FOUND).
    UnknownLease(String),
    /// A replica-local lease sent to another replica (FAILED_PRECONDITION, naming the owner).
    WrongReplica { lease: String, owner: String },
    /// The tenant already has this replica's most keys (RESOURCE_EXHAUSTED); an idle key is
    /// evicted after the idle timeout, freeing its place.
    TooManyKeys { tenant: String, max: usize },
    /// `shared`, the store could not answer, and the tenant's policy is closed (UNAVAILABLE).
    StoreUnavailable,
}

impl std::fmt::Display for AdmissionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdmissionError::UnknownTenant(tenant) => {
                write!(f, "unknown tenant {tenant:?} (admission is strict)")
            }
            AdmissionError::UnknownKey(tenant, key) => write!(
                f,
                "tenant {tenant:?} has no limit for key {key:?} (admission is strict)"
            ),
            AdmissionError::NoLimit(tenant, key) => write!(
                f,
                "no limit applies to tenant {tenant:?} key {key:?}: none is configured for the \
                 key, and there is no admission.default_limit"
            ),
            AdmissionError::BadSpec(reason) => write!(f, "invalid limit spec: {reason}"),
            AdmissionError::BadCost(reason) => write!(f, "{reason}"),
            AdmissionError::NotConcurrent(key) => write!(
                f,
                "key {key:?} has no max_concurrent: set one in its limit to use Acquire"
            ),
            AdmissionError::UnknownLease(lease) => {
                write!(
                    f,
                    "unknown lease {lease:?}: never granted, released, or expired"
                )
            }
            AdmissionError::WrongReplica { lease, owner } => write!(
                f,
                "lease {lease:?} is held by replica {owner:?}: release or renew it there"
            ),
            AdmissionError::TooManyKeys { tenant, max } => write!(
                f,
                "tenant {tenant:?} already has {max} admission keys on this replica \
                 (--admission-max-keys-per-tenant); a new key is admitted once an idle one is \
                 evicted"
            ),
            AdmissionError::StoreUnavailable => write!(
                f,
                "the shared store did not answer in time and the tenant's on_store_failure \
                 policy is closed (err-weir-store-unavailable)"
            ),
        }
    }
}

impl std::error::Error for AdmissionError {}

/// The answer to `Allow`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Allowed {
    pub decision: Decision,
    pub limit: LimitSpec,
    pub source: LimitSource,
}

/// One question of a batch ([`crate::Limiter::allow_batch`]): what `allow` takes.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub tenant: &'a str,
    pub key: &'a str,
    pub cost: u64,
    /// The caller's own limit, if it sent one.
    pub limit: Option<LimitSpec>,
}

/// The answer to `Acquire`.
#[derive(Debug, Clone, PartialEq)]
pub struct Acquisition {
    pub granted: bool,
    pub lease_id: Option<String>,
    /// Held fleet-wide (as this replica knows it) after this call.
    pub in_flight: u64,
    pub limit: LimitSpec,
    pub retry_after: Duration,
}

/// The answer to `Lease`: tokens lent to an embedded client to spend locally.
#[derive(Debug, Clone, PartialEq)]
pub struct Lent {
    /// Taken from the key's meter by this call.
    pub granted: u64,
    /// What the client may hold after this call: what it carried over, plus `granted`.
    pub outstanding: u64,
    /// Pass it with the next `Lease` (to carry the rest over) or to give the rest back.
    pub lease_id: String,
    pub limit: LimitSpec,
    pub source: LimitSource,
    /// Granted less than wanted: how long until the rest could pass.
    pub retry_after: Duration,
}

/// Tokens lent to a client, not yet reported spent: they go back to the key's meter when the
/// client gives them back or the deadline passes (a client that died).
struct TokenLease {
    entry: Arc<Entry>,
    outstanding: u64,
    deadline: u64,
}

/// The entries by name, under a guard.
type EntryMap<'g> = papaya::HashMapRef<
    'g,
    Box<str>,
    Arc<Entry>,
    foldhash::fast::RandomState,
    papaya::LocalGuard<'g>,
>;

/// The admission entries of one replica.
#[derive(Default)]
pub(crate) struct Entries {
    map: papaya::HashMap<Box<str>, Arc<Entry>, foldhash::fast::RandomState>,
    /// Replica-local leases: id → (entry name, deadline in engine nanoseconds).
    leases: Mutex<HashMap<u128, (Arc<str>, u64)>>,
    /// Token leases (`Lease`): id → what is lent. Replica-local, like `L…` leases.
    token_leases: Mutex<HashMap<u128, TokenLease>>,
    /// Told each time a lease of either kind is lent, so the sweep sleeps while none is held.
    lent: tokio::sync::Notify,
    /// What the peers last reported, under `weighted`: a new entry starts from their totals,
    /// so it is not charged at once with everything they admitted before it existed here.
    peers: ArcSwap<crate::types::PeerUsage>,
    /// Most keys a tenant may have here at once (the push key aside); 0 = no cap. Keys come
    /// from callers, so without a cap one caller could fill the memory with distinct keys.
    pub(crate) max_keys_per_tenant: usize,
    /// Keys per tenant in `map` (the push key aside), kept only under a cap. Changed on the
    /// slow path alone: when an entry is made or evicted.
    keys_per_tenant: Mutex<HashMap<Box<str>, usize>>,
    /// This replica is in a cell: count each key's and each tenant's demand for the cell
    /// sync. Outside cells the counts are not kept: on a hot key one is one more cache line
    /// the cores pass around.
    pub(crate) count_for_cells: bool,
}

impl Entries {
    /// Returns once a lease of either kind is held here: at once if one is, else when the
    /// next is lent.
    pub(crate) async fn until_leases_held(&self) {
        loop {
            let held = !self
                .leases
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
                || !self
                    .token_leases
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .is_empty();
            if held {
                return;
            }
            // A lease lent since the check left a permit: this returns at once.
            self.lent.notified().await;
        }
    }

    /// Takes a place for a new key of `tenant`, unless it has the most already.
    fn reserve_key(&self, tenant: &str) -> Result<(), AdmissionError> {
        let mut counts = self.keys_per_tenant.lock().expect("not poisoned");
        let count = counts.entry(tenant.into()).or_default();
        if *count >= self.max_keys_per_tenant {
            return Err(AdmissionError::TooManyKeys {
                tenant: tenant.to_string(),
                max: self.max_keys_per_tenant,
            });
        }
        *count += 1;
        Ok(())
    }

    /// Counts a key of `tenant` made (`made`) or given back (`!made`).
    fn count_key(&self, tenant: &str, made: bool) {
        let mut counts = self.keys_per_tenant.lock().expect("not poisoned");
        if made {
            *counts.entry(tenant.into()).or_default() += 1;
        } else if let Some(count) = counts.get_mut(tenant) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(tenant);
            }
        }
    }
}

pub(crate) struct Entry {
    tenant: Box<str>,
    /// Percent-encoded key.
    key: Box<str>,
    state: ArcSwap<EntryState>,
    /// Admitted here (cost), cumulative: what gossip carries under `weighted`.
    pub(crate) admitted: AtomicU64,
    pub(crate) published: AtomicU64,
    pub(crate) peers_applied: AtomicU64,
    /// The peers' refunds (tokens they lent and got back) already credited.
    pub(crate) peers_refunded: AtomicU64,
    /// `admitted` when the peers' admissions were last charged: what this replica took since
    /// is ordered after them ([`Meter::charge_peers`]).
    admitted_at_peers: AtomicU64,
    /// Leases held on this replica, and what the peers report they hold.
    pub(crate) in_flight: AtomicU64,
    /// The holders this replica last told the peers of (what they count it for).
    pub(crate) published_in_flight: AtomicU64,
    pub(crate) peers_in_flight: AtomicU64,
    /// When the peers last reported (engine nanoseconds), and their admissions per second.
    peers_at: AtomicU64,
    peers_rate: AtomicU64,
    /// How many times this replica has published the key (a round counter for the slot
    /// shares under `weighted`).
    publishes: AtomicU64,
    pub(crate) last_seen: AtomicU64,
    /// `shared` token bucket: the lease.
    lease: std::sync::OnceLock<Lease>,
    /// For the cell sync: cost offered here (admitted or not), cumulative; the most slots
    /// wanted here at once (held, and the refusals since the last grant) since it last read
    /// them; and those refusals. Not counted under `shared`, which cells do not slice.
    cell_offered: AtomicU64,
    cell_wanted: AtomicU64,
    cell_refused: AtomicU64,
}

/// An admission key's demand and spend on this replica, for the cell sync.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyUsage {
    pub tenant: String,
    /// Percent-encoded.
    pub key: String,
    /// As configured: the limit this cell enforces a slice of.
    pub limit: LimitSpec,
    /// Offered (admitted and refused) cost, cumulative.
    pub offered: u64,
    /// Admitted cost, cumulative.
    pub spent: u64,
    /// The most slots wanted at once since the last call (held, or refused).
    pub wanted: u64,
}

struct EntryState {
    /// The key's limit as configured (fleet-wide): what answers name.
    spec: LimitSpec,
    /// What this replica's meter and slots enforce of it: `spec`, or the cell's slice of it.
    enforced: LimitSpec,
    /// Where `spec` came from; a client's spec is never reused without the client sending it.
    source: LimitSource,
    healthy: usize,
    policy: runtime_config::StoreFailurePolicy,
    /// The key's meter under the tenant's strategy.
    meter: Kept<Meter, Meter>,
    /// The limiter's inputs (config, healthy count) this state was checked against: while
    /// they are unchanged, a decision skips resolving the limit.
    generation: AtomicU64,
}

/// How often the caller should run [`crate::Limiter::expire_leases`] while leases are held
/// (weir: a task every this long, asleep on [`crate::Limiter::until_leases_held`] otherwise).
pub const LEASE_SWEEP: Duration = Duration::from_millis(100);

/// A concurrency slot's TTL as asked, held between 1 ms and a day: a holder that dies frees
/// its slot within a day whatever it asked for.
fn slot_ttl(ttl: Duration) -> Duration {
    ttl.clamp(Duration::from_millis(1), Duration::from_secs(24 * 3600))
}

/// How long a token lease lives here: its TTL, less two sweeps (at most a tenth of the TTL),
/// so that a crashed client's tokens are back on the meter within the TTL it asked for, not
/// a sweep after. The client stops spending at nine tenths of the TTL, counted from before
/// it asked, so never past this.
fn token_lease_life(ttl: Duration) -> Duration {
    ttl - (2 * LEASE_SWEEP).min(ttl / 10)
}

/// A cost larger than the cell's slice of a burst (but within the configured burst) is told to
/// retry after this: about one cell sync, when the slice follows the cell's demand.
const SLICE_TOO_SMALL_RETRY: Duration = Duration::from_secs(1);

/// A refused `Acquire` is told to retry after the earliest held lease's deadline or this,
/// whichever is sooner: holders usually release long before their deadline (and under
/// `weighted` the caps move every gossip round).
pub const ACQUIRE_RETRY_HINT: Duration = Duration::from_millis(100);

/// The entry key of a tenant's pushes in flight. Percent-encoding never yields `%p`, so no
/// API key can name it.
const PUSH_KEY: &str = "%push";

/// Whether an entry name (`tenant/key`, [`entry_name`]) is a tenant's pushes in flight.
fn is_push_slot(name: &str) -> bool {
    name.strip_suffix(PUSH_KEY)
        .is_some_and(|tenant| tenant.ends_with('/'))
}

/// Percent-encodes a key for entry names, gossip and store keys: letters, digits and `-_.~`
/// stay; everything else (spaces, `/`, braces, newlines) becomes `%XX`.
pub fn encode_key(key: &str) -> String {
    let mut encoded = String::with_capacity(key.len());
    encode_key_into(key, &mut encoded);
    encoded
}

fn encode_key_into(key: &str, encoded: &mut String) {
    let plain = |byte: u8| byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte);
    if key.bytes().all(plain) {
        encoded.push_str(key);
        return;
    }
    for byte in key.bytes() {
        if plain(byte) {
            encoded.push(byte as char);
        } else {
            // As `%{byte:02X}` would write it, without the formatter's cost a byte.
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            encoded.push('%');
            encoded.push(HEX[usize::from(byte >> 4)] as char);
            encoded.push(HEX[usize::from(byte & 0xF)] as char);
        }
    }
}

thread_local! {
    /// The entry name of the current lookup, built without allocating.
    static ENTRY_NAME: std::cell::RefCell<String> = std::cell::RefCell::new(String::with_capacity(128));
}

/// The answer to a decision made, its cost counted as admitted if it was (what gossip carries).
fn answer(
    entry: &Entry,
    cost: u64,
    decision: Decision,
    limit: LimitSpec,
    source: LimitSource,
) -> Allowed {
    let mut tally = Tally::default();
    let allowed = tallied_answer(&mut tally, cost, decision, limit, source);
    tally.count(entry);
    allowed
}

/// [`answer`], its cost added to `tally` instead of to the key's counter.
fn tallied_answer(
    tally: &mut Tally,
    cost: u64,
    decision: Decision,
    limit: LimitSpec,
    source: LimitSource,
) -> Allowed {
    if decision.allowed {
        tally.admitted += cost;
    }
    Allowed {
        decision,
        limit,
        source,
    }
}

/// What decisions on one key add to its counters (what gossip and the cell sync read), kept
/// aside so that a batch's run of asks on one key adds them once: each add is a write to a
/// line the other cores deciding the key also write.
#[derive(Default)]
struct Tally {
    /// Cost offered, admitted or not (counted only for the cell sync).
    offered: u64,
    admitted: u64,
}

impl Tally {
    fn count(self, entry: &Entry) {
        if self.offered > 0 {
            entry
                .cell_offered
                .fetch_add(self.offered, Ordering::Relaxed);
        }
        if self.admitted > 0 {
            entry.admitted.fetch_add(self.admitted, Ordering::Relaxed);
        }
    }
}

/// The answer to `cost` that needs no meter, if there is one: a cost of zero is invalid, and
/// a limit with no rate (only an in-flight cap) passes every rate question.
fn answered_unmetered(
    spec: LimitSpec,
    source: LimitSource,
    cost: u64,
) -> Option<Result<Allowed, AdmissionError>> {
    if cost == 0 {
        return Some(Err(AdmissionError::BadCost(
            "cost must be at least 1".into(),
        )));
    }
    (spec.rate == 0.0).then(|| {
        Ok(Allowed {
            decision: unmetered(),
            limit: spec,
            source,
        })
    })
}

/// A cost the limit can never allow at once: a bad request, not a refusal.
fn too_large(spec: &LimitSpec, cost: u64) -> AdmissionError {
    AdmissionError::BadCost(format!(
        "cost {cost} is more than the limit ever allows at once ({} {})",
        match spec.algorithm {
            Algorithm::SlidingWindow => spec.per_window().floor() as u64,
            _ => spec.burst,
        },
        match spec.algorithm {
            Algorithm::TokenBucket => "burst",
            Algorithm::SlidingWindow => "per window",
            Algorithm::LeakyBucket => "queue",
        }
    ))
}

/// The admission front-end: this replica's entries, read with the engine's [`Core`] (the
/// clock, the inputs in force, the ring place and the store).
pub(crate) struct Keys<'a, C: Clock> {
    core: &'a Core<C>,
    entries: &'a Entries,
}

impl<C: Clock> std::ops::Deref for Keys<'_, C> {
    type Target = Core<C>;

    fn deref(&self) -> &Core<C> {
        self.core
    }
}

impl<'a, C: Clock + Clone> Keys<'a, C> {
    pub(crate) fn new(core: &'a Core<C>, entries: &'a Entries) -> Self {
        Keys { core, entries }
    }

    fn admission(&self) -> &Entries {
        self.entries
    }

    /// Decides `cost` for `tenant`'s `key`, under the limit in force (see
    /// [`runtime_config::AdmissionConfig::resolve`]). May wait on the shared store, never
    /// longer than its timeout.
    pub(crate) async fn allow(
        &self,
        tenant: &str,
        key: &str,
        cost: u64,
        client: Option<LimitSpec>,
    ) -> Result<Allowed, AdmissionError> {
        if client.is_none() {
            // A key metered on this replica is decided under the map's guard: no reference
            // count is taken (on a hot key two cores would pass its cache lines back and
            // forth for them) and no future is built. A `shared` one may wait on the store.
            let known = self.with_known(tenant, key, |entry, state| {
                if state.meter.is_shared() {
                    Err((Arc::clone(entry), Arc::clone(state)))
                } else {
                    Ok(self.decide_at(
                        state.spec,
                        state.source,
                        entry,
                        state,
                        cost,
                        self.now_nanos(),
                    ))
                }
            });
            match known {
                Some(Ok(decided)) => return decided,
                Some(Err((entry, state))) => {
                    return self
                        .decide(state.spec, state.source, &entry, &state, cost)
                        .await
                }
                None => {}
            }
        }
        // Not known here (or under the caller's own limit): `with_known` has looked already.
        let (spec, source, entry, state) = self.resolve_entry(tenant, key, client)?;
        self.decide(spec, source, &entry, &state, cost).await
    }

    /// The hot path: hands `found` the entry `tenant/key` under the map's guard, marked used,
    /// if it is already checked against the inputs in force and its limit is not a caller's.
    /// The name is built in a reused buffer: no allocation, no limit resolution. `None`: the
    /// key is not there yet or is stale.
    fn with_known<R>(
        &self,
        tenant: &str,
        key: &str,
        found: impl FnOnce(&Arc<Entry>, &Arc<EntryState>) -> R,
    ) -> Option<R> {
        let generation = self.generation();
        ENTRY_NAME.with(|name| {
            let map = self.admission().map.pin();
            let (entry, state) =
                self.known(&map, &mut name.borrow_mut(), tenant, key, generation)?;
            Some(found(entry, &state))
        })
    }

    /// The entry `tenant/key` in `map`, marked used, if it is checked against the inputs of
    /// `generation` and its limit is not a caller's; `name` is the buffer its name is built
    /// in.
    fn known<'m>(
        &self,
        map: &'m EntryMap<'_>,
        name: &mut String,
        tenant: &str,
        key: &str,
        generation: u64,
    ) -> Option<(&'m Arc<Entry>, arc_swap::Guard<Arc<EntryState>>)> {
        name.clear();
        name.push_str(tenant);
        name.push('/');
        encode_key_into(key, name);
        let entry = map.get(name.as_str())?;
        let state = entry.state.load();
        let current = state.generation.load(Ordering::Acquire) == generation
            && state.source != LimitSource::Client;
        if !current {
            return None;
        }
        crate::core::touch(&entry.last_seen, self.coarse_nanos());
        Some((entry, state))
    }

    /// Decides each ask in order, each as [`Keys::allow`] would. The keys already known and
    /// metered on this replica, most of a busy caller's, are decided first, under one guard
    /// of the map and at one reading of the clock; the rest (new, stale, a caller's limit,
    /// `shared`) then, one at a time. An ask's answer never depends on another key's, and
    /// once an ask of a key is left for later, so are the key's asks after it: each key
    /// sees its asks in order.
    pub(crate) async fn allow_batch(
        &self,
        asks: &[Ask<'_>],
    ) -> Vec<Result<Allowed, AdmissionError>> {
        let mut answers = Vec::with_capacity(asks.len());
        let mut undecided = Vec::new();
        let generation = self.generation();
        let now = self.now_nanos();
        ENTRY_NAME.with(|name| {
            let name = &mut name.borrow_mut();
            let map = self.admission().map.pin();
            // The keys left for later; almost always none.
            let mut later: std::collections::HashSet<(&str, &str), foldhash::fast::RandomState> =
                Default::default();
            // The last key found, for the asks after it that name it again: a hot key's
            // batch looks it up once, and adds to its counters once.
            let mut found: Option<(_, &Arc<Entry>, _)> = None;
            let mut tally = Tally::default();
            let mut at = 0;
            while let Some(ask) = asks.get(at) {
                let key = (ask.tenant, ask.key);
                let left = !later.is_empty() && later.contains(&key);
                if ask.limit.is_none() && !left {
                    if !matches!(&found, Some((named, _, _)) if *named == key) {
                        if let Some((_, entry, _)) = &found {
                            std::mem::take(&mut tally).count(entry);
                        }
                        found = self
                            .known(&map, name, ask.tenant, ask.key, generation)
                            .filter(|(_, state)| !state.meter.is_shared())
                            .map(|(entry, state)| (key, entry, state));
                    }
                    if let Some((_, entry, state)) = &found {
                        // This ask and those right after it naming the same key, with no
                        // limit of their own: decided as a run.
                        let run = 1
                            + (asks[at + 1..].iter())
                                .take_while(|next| {
                                    (next.tenant, next.key) == key && next.limit.is_none()
                                })
                                .count();
                        let (spec, source) = (state.spec, state.source);
                        let run_asks = &asks[at..at + run];
                        self.decide_run(
                            &mut tally,
                            spec,
                            source,
                            entry,
                            state,
                            run_asks,
                            now,
                            &mut answers,
                        );
                        at += run;
                        continue;
                    }
                }
                if !left {
                    later.insert(key);
                }
                // A place, taken by the ask's answer below.
                undecided.push(answers.len());
                answers.push(Err(AdmissionError::StoreUnavailable));
                at += 1;
            }
            if let Some((_, entry, _)) = &found {
                tally.count(entry);
            }
        });
        for at in undecided {
            let ask = &asks[at];
            answers[at] = self.allow(ask.tenant, ask.key, ask.cost, ask.limit).await;
        }
        answers
    }

    /// Decides `cost` for `tenant`'s `key` under a limit the caller resolved itself (Envoy's
    /// descriptors, from `envoy_domains`), under the tenant's strategy.
    pub(crate) async fn allow_with_limit(
        &self,
        tenant: &str,
        key: &str,
        cost: u64,
        spec: LimitSpec,
    ) -> Result<Allowed, AdmissionError> {
        let spec = spec.resolved();
        spec.validate().map_err(AdmissionError::BadSpec)?;
        let generation = self.generation();
        let config = self.config();
        let (entry, state) = self.entry_named(
            tenant,
            &encode_key(key),
            spec,
            LimitSource::Key,
            &config,
            generation,
        )?;
        self.decide(spec, LimitSource::Key, &entry, &state, cost)
            .await
    }

    async fn decide(
        &self,
        spec: LimitSpec,
        source: LimitSource,
        entry: &Entry,
        state: &EntryState,
        cost: u64,
    ) -> Result<Allowed, AdmissionError> {
        if !state.meter.is_shared() || cost == 0 || spec.rate == 0.0 {
            return self.decide_at(spec, source, entry, state, cost, self.now_nanos());
        }
        let decision = self
            .allow_shared(entry, state, cost, self.now_nanos())
            .await?
            .ok_or_else(|| too_large(&spec, cost))?;
        Ok(answer(entry, cost, decision, spec, source))
    }

    /// [`Keys::decide`] at `now`, for every meter but `shared`'s, which never waits.
    fn decide_at(
        &self,
        spec: LimitSpec,
        source: LimitSource,
        entry: &Entry,
        state: &EntryState,
        cost: u64,
        now: u64,
    ) -> Result<Allowed, AdmissionError> {
        let mut tally = Tally::default();
        let decided = self.decide_tallied(&mut tally, spec, source, entry, state, cost, now);
        tally.count(entry);
        decided
    }

    /// [`Keys::decide_at`], what it adds to the key's counters added to `tally` instead.
    #[allow(clippy::too_many_arguments)]
    fn decide_tallied(
        &self,
        tally: &mut Tally,
        spec: LimitSpec,
        source: LimitSource,
        entry: &Entry,
        state: &EntryState,
        cost: u64,
        now: u64,
    ) -> Result<Allowed, AdmissionError> {
        if let Some(answered) = answered_unmetered(spec, source, cost) {
            return answered;
        }
        let decision = match &state.meter {
            Kept::Shared(_) => unreachable!("decided in `decide`"),
            Kept::Weighted(meter) => meter.check_reserving(cost, now, self.unreported(entry, now)),
            Kept::Divided(meter) => meter.check(cost, now),
            Kept::None => Ok(unmetered()),
        };
        self.settle(tally, spec, source, state, cost, decision)
    }

    /// [`Keys::decide_tallied`] for each of a run of asks on one key, in order, with nothing
    /// between them, into `answers`: a token bucket reads and writes its state once for the
    /// whole run (see [`Meter::check_run`]).
    #[allow(clippy::too_many_arguments)]
    fn decide_run(
        &self,
        tally: &mut Tally,
        spec: LimitSpec,
        source: LimitSource,
        entry: &Entry,
        state: &EntryState,
        asks: &[Ask<'_>],
        now: u64,
        answers: &mut Vec<Result<Allowed, AdmissionError>>,
    ) {
        // One ask is decided alone: a run's buffers cost more than they save.
        let metered = asks.len() > 1 && spec.rate != 0.0 && asks.iter().all(|ask| ask.cost > 0);
        let (meter, reserve) = match &state.meter {
            Kept::Weighted(meter) if metered => (meter, self.unreported(entry, now)),
            Kept::Divided(meter) if metered => (meter, 0.0),
            _ => {
                answers.extend(asks.iter().map(|ask| {
                    self.decide_tallied(tally, spec, source, entry, state, ask.cost, now)
                }));
                return;
            }
        };
        let mut decided = Vec::with_capacity(asks.len());
        meter.check_run(asks.iter().map(|ask| ask.cost), now, reserve, &mut decided);
        answers
            .extend((asks.iter().zip(decided)).map(|(ask, decision)| {
                self.settle(tally, spec, source, state, ask.cost, decision)
            }));
    }

    /// What a meter's `decision` on `cost` answers, what it adds to the key's counters added
    /// to `tally`.
    fn settle(
        &self,
        tally: &mut Tally,
        spec: LimitSpec,
        source: LimitSource,
        state: &EntryState,
        cost: u64,
        decision: Result<Decision, TooLarge>,
    ) -> Result<Allowed, AdmissionError> {
        // A cost the configured limit allows at once but this cell's slice does not is
        // refused, not invalid: the slice grows with the cell's demand.
        let configured_capacity = match spec.algorithm {
            Algorithm::SlidingWindow => spec.per_window().floor() as u64,
            _ => spec.burst,
        };
        let decision = decision.or_else(|TooLarge| {
            if state.enforced == spec || cost > configured_capacity {
                return Err(too_large(&spec, cost));
            }
            Ok(Decision {
                allowed: false,
                remaining: 0,
                retry_after: SLICE_TOO_SMALL_RETRY,
                reset_after: SLICE_TOO_SMALL_RETRY,
                delay: Duration::ZERO,
            })
        })?;
        if self.admission().count_for_cells {
            tally.offered += cost;
        }
        Ok(tallied_answer(tally, cost, decision, spec, source))
    }

    /// `shared`: `None` when the cost is too large.
    async fn allow_shared(
        &self,
        entry: &Entry,
        state: &EntryState,
        cost: u64,
        now: u64,
    ) -> Result<Option<Decision>, AdmissionError> {
        let Some(shared) = self.shared() else {
            return self.store_failed(state, cost, now).map(Some);
        };
        let spec = state.spec;
        match spec.algorithm {
            Algorithm::TokenBucket => {
                let rate = Rate {
                    per_second: spec.rate,
                    burst: spec.burst.max(1),
                };
                let lease = entry
                    .lease
                    .get_or_init(|| Lease::new(&shared.config, 1, now));
                let request = SharedRequest {
                    tenant: &entry.tenant,
                    kind: LimitKind::Request,
                    key: Some(&entry.key),
                    cost,
                    shard_rate: rate,
                    shards: 1,
                    replicas: self.healthy_replicas(),
                };
                match shared::decide(shared, lease, request, || self.now_nanos()).await {
                    SharedOutcome::Admitted => Ok(Some(Decision {
                        allowed: true,
                        remaining: lease.tokens(),
                        retry_after: Duration::ZERO,
                        reset_after: Duration::ZERO,
                        delay: Duration::ZERO,
                    })),
                    SharedOutcome::Refused(Outcome::TooLarge) => Ok(None),
                    SharedOutcome::Refused(Outcome::Denied { wait, available }) => {
                        Ok(Some(Decision {
                            allowed: false,
                            remaining: available,
                            retry_after: wait,
                            reset_after: wait,
                            delay: Duration::ZERO,
                        }))
                    }
                    SharedOutcome::Refused(Outcome::Allowed) => {
                        unreachable!("a refusal is never Allowed")
                    }
                    SharedOutcome::StoreFailed => self.store_failed(state, cost, now).map(Some),
                }
            }
            Algorithm::SlidingWindow | Algorithm::LeakyBucket => {
                let meter = match spec.algorithm {
                    Algorithm::SlidingWindow => StoredMeter::SlidingWindow {
                        limit: spec.per_window(),
                        window: spec.window,
                    },
                    _ => StoredMeter::LeakyBucket {
                        rate: spec.rate,
                        capacity: spec.burst.max(1),
                    },
                };
                let key = KeyName {
                    tenant: &entry.tenant,
                    key: &entry.key,
                };
                if shared.permit(now) == crate::breaker::Permit::Refused {
                    return self.store_failed(state, cost, now).map(Some);
                }
                match shared
                    .call(
                        "meter",
                        || self.now_nanos(),
                        shared.store.meter(key, meter, cost),
                    )
                    .await
                {
                    Ok(decision) => Ok(Some(decision)),
                    Err(_) => self.store_failed(state, cost, now).map(Some),
                }
            }
        }
    }

    /// The store could not answer: `open` decides against the local fleet meter, `closed`
    /// refuses.
    fn store_failed(
        &self,
        state: &EntryState,
        cost: u64,
        now: u64,
    ) -> Result<Decision, AdmissionError> {
        on_store_failure(
            state.policy,
            self.shared().map(|shared| &**shared),
            || match state.meter.meter() {
                Some(meter) => meter
                    .check(cost, now)
                    .map_err(|_| AdmissionError::BadCost(format!("cost {cost} is too large"))),
                None => Ok(unmetered()),
            },
            || Err(AdmissionError::StoreUnavailable),
            |result| matches!(result, Ok(Decision { allowed: true, .. })),
        )
    }

    /// Takes one in-flight slot of `tenant`'s `key` for `ttl`.
    pub(crate) async fn acquire(
        &self,
        tenant: &str,
        key: &str,
        client: Option<LimitSpec>,
        ttl: Duration,
    ) -> Result<Acquisition, AdmissionError> {
        let (spec, _, entry, state) = self.entry(tenant, key, client)?;
        if spec.max_concurrent == 0 {
            return Err(AdmissionError::NotConcurrent(key.to_string()));
        }
        self.take_slot(&entry, &state, spec, ttl).await
    }

    /// Takes one of `tenant`'s `max` pushes in flight, fleet-wide under the tenant's strategy
    /// (`max_inflight_push_requests`), for at most `ttl`. Release it with
    /// [`Limiter::release_local`] (a `L…` lease) or [`Limiter::release`].
    pub(crate) async fn acquire_push(
        &self,
        tenant: &str,
        max: u64,
        ttl: Duration,
    ) -> Result<Acquisition, AdmissionError> {
        let spec = LimitSpec {
            algorithm: Algorithm::TokenBucket,
            rate: 0.0,
            burst: 0,
            window: Duration::from_secs(1),
            max_concurrent: max,
        };
        let generation = self.generation();
        let config = self.config();
        let (entry, state) = self.entry_named(
            tenant,
            PUSH_KEY,
            spec,
            LimitSource::Key,
            &config,
            generation,
        )?;
        self.take_slot(&entry, &state, spec, ttl).await
    }

    async fn take_slot(
        &self,
        entry: &Arc<Entry>,
        state: &EntryState,
        spec: LimitSpec,
        ttl: Duration,
    ) -> Result<Acquisition, AdmissionError> {
        let ttl = slot_ttl(ttl);
        let id: u128 = rand_id();
        let name: Arc<str> = entry_name(&entry.tenant, &entry.key).into();
        if state.meter.is_shared() {
            let lease = format!("S{id:032x}/{name}");
            let store_key = KeyName {
                tenant: &entry.tenant,
                key: &entry.key,
            };
            let now = self.now_nanos();
            let shared = self.shared().map(|shared| &**shared);
            if let Some(shared) =
                shared.filter(|shared| shared.permit(now) != crate::breaker::Permit::Refused)
            {
                let acquired = shared
                    .call(
                        "acquire",
                        || self.now_nanos(),
                        shared
                            .store
                            .acquire(store_key, &lease, spec.max_concurrent, ttl),
                    )
                    .await;
                if let Ok(acquired) = acquired {
                    return Ok(Acquisition {
                        granted: acquired.granted,
                        lease_id: acquired.granted.then_some(lease),
                        in_flight: acquired.in_flight,
                        limit: spec,
                        retry_after: acquired.retry_after.min(ACQUIRE_RETRY_HINT),
                    });
                }
            }
            return on_store_failure(
                state.policy,
                shared,
                || Ok(self.take_local_slot(entry, state, spec, ttl, id, name)),
                || Err(AdmissionError::StoreUnavailable),
                |result| matches!(result, Ok(Acquisition { granted: true, .. })),
            );
        }
        Ok(self.take_local_slot(entry, state, spec, ttl, id, name))
    }

    /// A slot of this replica's share of the cap.
    fn take_local_slot(
        &self,
        entry: &Entry,
        state: &EntryState,
        spec: LimitSpec,
        ttl: Duration,
        id: u128,
        name: Arc<str>,
    ) -> Acquisition {
        // Gossip cannot hold a fleet-wide count of short holds: shares of the published
        // counts, which the peers see a round late, let 50-57 pushes in flight for a cap of
        // 30 with holds of 0.3-0.5 s. So outside the store every replica holds a fixed share,
        // and the shares sum to the cap exactly; `shared` follows skewed traffic exactly.
        //
        // A share grows only once the leases granted under the old shares may have ended
        // (`SlotHolds`): a dead replica's holders are still at work. Not for pushes: a push in
        // flight ends with its replica, and one that joins must take pushes at once.
        let max = state.enforced.max_concurrent;
        let mut cap = slot_share(max, state.healthy, self.rank());
        if &*entry.key != PUSH_KEY {
            if let Some(held) = self.held_slot_cap(max, self.now_nanos()) {
                cap = cap.min(held);
            }
        }
        let taken = entry
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < cap).then_some(held + 1)
            });
        // What this replica wanted in flight at once: what it holds, and the requests refused
        // since it last granted one (refusals in a row stand for requests waiting at once; a
        // client that retries one request counts once per retry, so this errs high).
        let wanted = match taken {
            Ok(held) => {
                entry.cell_refused.store(0, Ordering::Relaxed);
                held + 1
            }
            Err(held) => held + entry.cell_refused.fetch_add(1, Ordering::Relaxed) + 1,
        };
        entry.cell_wanted.fetch_max(wanted, Ordering::Relaxed);
        let peers = entry.peers_in_flight.load(Ordering::Relaxed);
        match taken {
            Ok(held) => {
                let deadline = self.now_nanos() + ttl.as_nanos() as u64;
                self.admission()
                    .leases
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id, (name, deadline));
                self.admission().lent.notify_one();
                Acquisition {
                    granted: true,
                    lease_id: Some(format!("L{id:032x}@{}", self.node_id())),
                    in_flight: (held + 1).saturating_add(peers),
                    limit: spec,
                    retry_after: Duration::ZERO,
                }
            }
            Err(held) => Acquisition {
                granted: false,
                lease_id: None,
                in_flight: held.saturating_add(peers),
                limit: spec,
                retry_after: self
                    .earliest_deadline(&name)
                    .map_or(ACQUIRE_RETRY_HINT, |until| until.min(ACQUIRE_RETRY_HINT)),
            },
        }
    }

    fn earliest_deadline(&self, name: &str) -> Option<Duration> {
        let now = self.now_nanos();
        let leases = self
            .admission()
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        leases
            .values()
            .filter(|(entry, _)| &**entry == name)
            .map(|(_, deadline)| Duration::from_nanos(deadline.saturating_sub(now)))
            .min()
    }

    /// Gives a slot back.
    pub(crate) async fn release(&self, lease_id: &str) -> Result<(), AdmissionError> {
        self.finish(lease_id, None).await
    }

    /// Moves a held lease's deadline to `ttl` from now (within the bounds of
    /// [`slot_ttl`], as when it was taken).
    pub(crate) async fn renew(&self, lease_id: &str, ttl: Duration) -> Result<(), AdmissionError> {
        self.finish(lease_id, Some(slot_ttl(ttl))).await
    }

    async fn finish(&self, lease_id: &str, renew: Option<Duration>) -> Result<(), AdmissionError> {
        let unknown = || AdmissionError::UnknownLease(lease_id.to_string());
        if let Some(rest) = lease_id.strip_prefix('S') {
            let (_, name) = rest.split_once('/').ok_or_else(unknown)?;
            let (tenant, key) = name.split_once('/').ok_or_else(unknown)?;
            let store_key = KeyName { tenant, key };
            let shared = self.shared().ok_or(AdmissionError::StoreUnavailable)?;
            let outcome = match renew {
                None => {
                    shared
                        .call(
                            "release",
                            || self.now_nanos(),
                            shared.store.release(store_key, lease_id),
                        )
                        .await
                }
                Some(ttl) => {
                    shared
                        .call(
                            "renew",
                            || self.now_nanos(),
                            shared.store.renew(store_key, lease_id, ttl),
                        )
                        .await
                }
            };
            return match outcome {
                Ok(true) => Ok(()),
                Ok(false) => Err(unknown()),
                Err(_) => Err(AdmissionError::StoreUnavailable),
            };
        }
        self.finish_local(lease_id, renew)
    }

    /// Releases a replica-local (`L…`) lease without waiting: for guards that release on drop.
    pub(crate) fn release_local(&self, lease_id: &str) -> Result<(), AdmissionError> {
        self.finish_local(lease_id, None)
    }

    fn finish_local(&self, lease_id: &str, renew: Option<Duration>) -> Result<(), AdmissionError> {
        let unknown = || AdmissionError::UnknownLease(lease_id.to_string());
        let rest = lease_id.strip_prefix('L').ok_or_else(unknown)?;
        let (id, owner) = rest.split_once('@').ok_or_else(unknown)?;
        if owner != self.node_id() {
            return Err(AdmissionError::WrongReplica {
                lease: lease_id.to_string(),
                owner: owner.to_string(),
            });
        }
        let id = u128::from_str_radix(id, 16).map_err(|_| unknown())?;
        let now = self.now_nanos();
        let mut leases = self
            .admission()
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match (leases.get_mut(&id), renew) {
            (Some((_, deadline)), _) if *deadline <= now => {
                // Expired: the sweep frees it; the holder learns it is gone.
                Err(unknown())
            }
            (Some((_, deadline)), Some(ttl)) => {
                *deadline = now + ttl.as_nanos() as u64;
                Ok(())
            }
            (Some(_), None) => {
                let (name, _) = leases.remove(&id).expect("present");
                drop(leases);
                if let Some(entry) = self.admission().map.pin().get(&*name) {
                    entry.in_flight.fetch_sub(1, Ordering::AcqRel);
                }
                Ok(())
            }
            (None, _) => Err(unknown()),
        }
    }

    /// How much longer the longest-running replica-local lease of a key (not a push's) may be
    /// held: what the ring tells the peers, so the share this replica holds is not granted
    /// again elsewhere while its holders may be at work after it dies or leaves (see
    /// [`crate::maths::SlotHolds`]). A push slot ends with its replica, and is left out.
    pub(crate) fn lease_horizon(&self) -> Duration {
        let now = self.now_nanos();
        let latest = self
            .admission()
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|(name, _)| !is_push_slot(name))
            .map(|(_, deadline)| *deadline)
            .max()
            .unwrap_or(0);
        Duration::from_nanos(latest.saturating_sub(now))
    }

    /// Frees replica-local leases past their deadline (their holders crashed or forgot).
    /// Returns how many.
    pub(crate) fn expire_leases(&self) -> usize {
        let now = self.now_nanos();
        let mut expired = Vec::new();
        self.admission()
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, (name, deadline)| {
                let keep = *deadline > now;
                if !keep {
                    expired.push(Arc::clone(name));
                }
                keep
            });
        let map = self.admission().map.pin();
        for name in &expired {
            if let Some(entry) = map.get(&**name) {
                entry.in_flight.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let mut lapsed = Vec::new();
        self.admission()
            .token_leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, lease| {
                let keep = lease.deadline > now;
                if !keep {
                    lapsed.push((Arc::clone(&lease.entry), lease.outstanding));
                }
                keep
            });
        for (entry, outstanding) in &lapsed {
            give_back(entry, *outstanding);
        }
        expired.len() + lapsed.len()
    }

    /// `Lease`: takes up to `want` tokens of `tenant`'s `key` at once, under the tenant's
    /// strategy, to be spent by an embedded client until `ttl` passes. `previous` is the
    /// client's last lease here and how much of it it spent: the rest carries over into the
    /// new lease, less `give_back_tokens`, which go back to the meter now.
    /// A previous lease that is unknown here (expired, or lent by another replica) carries
    /// nothing; its replica gives its rest back at its deadline.
    pub(crate) async fn lease(
        &self,
        tenant: &str,
        key: &str,
        want: u64,
        ttl: Duration,
        previous: Option<(&str, u64)>,
        give_back_tokens: u64,
    ) -> Result<Lent, AdmissionError> {
        let (spec, source, entry, state) = self.entry(tenant, key, None)?;
        let mut carried = 0;
        if let Some((lease_id, spent)) = previous {
            if let Some(id) = self.local_id(lease_id, 'T') {
                let mut leases = self
                    .admission()
                    .token_leases
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                // Only a lease of this very tenant and key: an id is not a credential.
                let ours = leases.get(&id).is_some_and(|old| {
                    old.entry.tenant == entry.tenant && old.entry.key == entry.key
                });
                if let Some(old) = ours.then(|| leases.remove(&id)).flatten() {
                    carried = old.outstanding.saturating_sub(spent);
                }
            }
        }
        // What the client no longer needs goes back to the meter now.
        let returned = carried.min(give_back_tokens);
        give_back(&entry, returned);
        carried -= returned;
        let id = rand_id();
        let lease_id = format!("T{id:032x}@{}", self.node_id());
        // The most one decision can take (more is a BadCost), less what is carried over.
        let most = match (spec.rate == 0.0, spec.algorithm) {
            (true, _) => want,
            (false, Algorithm::SlidingWindow) => spec.per_window().floor() as u64,
            (false, _) => spec.burst.max(1),
        };
        let take = want.min(most.saturating_sub(carried));
        let (mut granted, mut retry_after) = (0, Duration::ZERO);
        if take > 0 {
            let first = self.decide(spec, source, &entry, &state, take).await?;
            if first.decision.allowed {
                granted = take;
            } else {
                retry_after = first.decision.retry_after;
                // Take what is there now rather than nothing.
                let there = first.decision.remaining.min(take);
                if there > 0 {
                    let second = self.decide(spec, source, &entry, &state, there).await?;
                    if second.decision.allowed {
                        granted = there;
                    }
                }
            }
        }
        let outstanding = carried + granted;
        if outstanding > 0 {
            self.admission()
                .token_leases
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(
                    id,
                    TokenLease {
                        entry: Arc::clone(&entry),
                        outstanding,
                        deadline: self.now_nanos() + token_lease_life(ttl).as_nanos() as u64,
                    },
                );
            self.admission().lent.notify_one();
        }
        Ok(Lent {
            granted,
            outstanding,
            lease_id,
            limit: spec,
            source,
            retry_after,
        })
    }

    /// The id of a replica-local lease of `kind` (`L`, `T`) lent by this replica.
    fn local_id(&self, lease_id: &str, kind: char) -> Option<u128> {
        let (id, owner) = lease_id.strip_prefix(kind)?.split_once('@')?;
        (owner == self.node_id())
            .then(|| u128::from_str_radix(id, 16).ok())
            .flatten()
    }

    /// The entry for `tenant`'s `key` under the limit in force, rebuilt if the limit, the
    /// strategy or the healthy count changed.
    #[allow(clippy::type_complexity)]
    fn entry(
        &self,
        tenant: &str,
        key: &str,
        client: Option<LimitSpec>,
    ) -> Result<(LimitSpec, LimitSource, Arc<Entry>, Arc<EntryState>), AdmissionError> {
        if client.is_none() {
            let found = self.with_known(tenant, key, |entry, state| {
                (
                    state.spec,
                    state.source,
                    Arc::clone(entry),
                    Arc::clone(state),
                )
            });
            if let Some(found) = found {
                return Ok(found);
            }
        }
        self.resolve_entry(tenant, key, client)
    }

    /// [`Keys::entry`] for a key not known here, stale, or under the caller's own limit: its
    /// limit resolved from the inputs in force, its entry made or brought up to date.
    fn resolve_entry(
        &self,
        tenant: &str,
        key: &str,
        client: Option<LimitSpec>,
    ) -> Result<(LimitSpec, LimitSource, Arc<Entry>, Arc<EntryState>), AdmissionError> {
        let generation = self.generation();
        if let Some(client) = client {
            client
                .resolved()
                .validate()
                .map_err(AdmissionError::BadSpec)?;
        }
        let config = self.config();
        let (spec, source) = config.admission.resolve(tenant, key, client).map_err(
            |unresolved| match unresolved {
                Unresolved::UnknownTenant => AdmissionError::UnknownTenant(tenant.to_string()),
                Unresolved::UnknownKey => {
                    AdmissionError::UnknownKey(tenant.to_string(), key.to_string())
                }
                Unresolved::NoLimit => AdmissionError::NoLimit(tenant.to_string(), key.to_string()),
            },
        )?;
        let (entry, state) =
            self.entry_named(tenant, &encode_key(key), spec, source, &config, generation)?;
        Ok((spec, source, entry, state))
    }

    /// The entry named `tenant/encoded`, under `spec`.
    /// `generation`: the limiter's, read before `config` was.
    fn entry_named(
        &self,
        tenant: &str,
        encoded: &str,
        spec: LimitSpec,
        source: LimitSource,
        config: &runtime_config::RuntimeConfig,
        generation: u64,
    ) -> Result<(Arc<Entry>, Arc<EntryState>), AdmissionError> {
        let limits = config.tenant_limits(tenant);
        let strategy = limits.rate_limit_strategy;
        let healthy = self.healthy_replicas();
        let name = entry_name(tenant, encoded);
        let enforced = self.inputs.load().cells.apply_key(&name, &spec, strategy);
        let now = self.now_nanos();
        // (Read on this slow path only: the hot path finds its entry by name first.)
        let (peers_before, peers_refunded_before) = self
            .admission()
            .peers
            .load()
            .get(name.as_str())
            .map_or((0, 0), |totals| (totals.items, totals.items_refunded));
        let map = self.admission().map.pin();
        let capped = self.admission().max_keys_per_tenant > 0 && encoded != PUSH_KEY;
        let reserved = capped && map.get(name.as_str()).is_none();
        if reserved {
            self.admission().reserve_key(tenant)?;
        }
        let mut made = None;
        let entry = map.get_or_insert_with(name.into_boxed_str(), || {
            let entry = Arc::new(Entry {
                tenant: tenant.into(),
                key: encoded.into(),
                state: ArcSwap::from_pointee(EntryState {
                    spec,
                    enforced,
                    source,
                    healthy,
                    policy: limits.on_store_failure,
                    meter: Kept::of(
                        strategy,
                        Meter::new(&enforced, share(strategy, healthy), now),
                    ),
                    generation: AtomicU64::new(generation),
                }),
                admitted: AtomicU64::new(0),
                published: AtomicU64::new(0),
                peers_applied: AtomicU64::new(peers_before),
                peers_refunded: AtomicU64::new(peers_refunded_before),
                admitted_at_peers: AtomicU64::new(0),
                in_flight: AtomicU64::new(0),
                published_in_flight: AtomicU64::new(0),
                peers_in_flight: AtomicU64::new(0),
                peers_at: AtomicU64::new(0),
                peers_rate: AtomicU64::new(0),
                publishes: AtomicU64::new(0),
                last_seen: AtomicU64::new(now),
                lease: std::sync::OnceLock::new(),
                cell_offered: AtomicU64::new(0),
                cell_wanted: AtomicU64::new(0),
                cell_refused: AtomicU64::new(0),
            });
            made = Some(Arc::clone(&entry));
            entry
        });
        // Another call may have made the same key, or an eviction removed it, between the
        // look and the insert: the count follows what happened.
        let inserted = made.is_some_and(|made| Arc::ptr_eq(&made, entry));
        if capped && reserved != inserted {
            self.admission().count_key(tenant, inserted);
        }
        entry.last_seen.store(now, Ordering::Relaxed);
        let mut state = entry.state.load_full();
        if state.spec != spec
            || state.enforced != enforced
            || state.source != source
            || state.meter.strategy() != Some(strategy)
            || state.healthy != healthy
            || state.policy != limits.on_store_failure
        {
            let next = Arc::new(EntryState {
                spec,
                enforced,
                source,
                healthy,
                policy: limits.on_store_failure,
                meter: Kept::of(
                    strategy,
                    match state.meter.meter() {
                        Some(old) => carry(old, &enforced, share(strategy, healthy), now),
                        None => Meter::new(&enforced, share(strategy, healthy), now),
                    },
                ),
                generation: AtomicU64::new(generation),
            });
            entry.state.store(Arc::clone(&next));
            state = next;
        } else {
            state.generation.store(generation, Ordering::Release);
        }
        Ok((Arc::clone(entry), state))
    }

    /// What the peers last reported of admission keys, for entries created later.
    pub(crate) fn peer_usage(&self) -> Arc<crate::types::PeerUsage> {
        self.admission().peers.load_full()
    }

    /// Takes in the keys whose peers' totals moved; returns the keys' usage now.
    pub(crate) fn merge_peer_usage<'u>(
        &self,
        moved: impl Iterator<Item = (&'u Arc<str>, &'u crate::types::PeerTotals)>,
    ) -> Arc<crate::types::PeerUsage> {
        let mut usage = (*self.peer_usage()).clone();
        usage.extend(moved.map(|(name, totals)| (Arc::clone(name), *totals)));
        let usage = Arc::new(usage);
        self.admission().peers.store(Arc::clone(&usage));
        usage
    }

    /// Takes out keys no peer has listed for the ring's forget time.
    pub(crate) fn forget_peer_usage<'u>(&self, names: impl Iterator<Item = &'u Arc<str>>) {
        let current = self.peer_usage();
        let known: Vec<_> = names.filter(|name| current.contains_key(*name)).collect();
        if known.is_empty() {
            return;
        }
        let mut usage = (*current).clone();
        for name in known {
            usage.remove(name);
        }
        self.admission().peers.store(Arc::new(usage));
    }

    /// Charges the peers' admissions of admission keys (under `weighted`), and records what
    /// they hold in flight.
    pub(crate) fn apply_admission_usage(
        &self,
        name: &str,
        totals: &crate::types::PeerTotals,
        at: u64,
        now: u64,
        over_silence: bool,
    ) {
        let map = self.admission().map.pin();
        let Some(entry) = map.get(name) else {
            return;
        };
        entry
            .peers_in_flight
            .store(totals.in_flight, Ordering::Relaxed);
        let applied = entry
            .peers_applied
            .fetch_max(totals.items, Ordering::AcqRel);
        let spent = totals.items.saturating_sub(applied);
        let credited = entry
            .peers_refunded
            .fetch_max(totals.items_refunded, Ordering::AcqRel);
        let credit = totals.items_refunded.saturating_sub(credited);
        let state = entry.state.load();
        if let Kept::Weighted(meter) = &state.meter {
            if spent > 0 {
                let admitted = entry.admitted.load(Ordering::Acquire);
                let before = match over_silence {
                    true => entry.admitted_at_peers.load(Ordering::Acquire),
                    false => entry.admitted_at_peers.swap(admitted, Ordering::AcqRel),
                };
                let here = admitted.saturating_sub(before);
                meter.charge_peers(spent, at, now, here, over_silence);
            }
            // Tokens the peers lent and got back (their meters credited them).
            if let (true, Meter::TokenBucket(bucket)) = (credit > 0, meter) {
                bucket.refund_peers(credit, over_silence);
            }
        }
        // The peers' admission rate, smoothed over about a second, for the sliding window's
        // reserve.
        let last = entry.peers_at.swap(now, Ordering::AcqRel);
        if last > 0 && now > last {
            let seconds = (now - last) as f64 / 1e9;
            let rate = f64::from_bits(entry.peers_rate.load(Ordering::Relaxed));
            let weight = seconds.min(1.0);
            let rate = rate + (spent as f64 / seconds - rate) * weight;
            entry.peers_rate.store(rate.to_bits(), Ordering::Relaxed);
        }
    }

    /// Under `weighted`, what the peers have probably admitted of this key and not reported
    /// yet: their recent rate × how long since their last report (plus the report's own age).
    /// Nothing once reports are more than a second old (the peers are idle or gone).
    fn unreported(&self, entry: &Entry, now: u64) -> f64 {
        let at = entry.peers_at.load(Ordering::Acquire);
        let age = now.saturating_sub(at);
        if at == 0 || age > 1_000_000_000 {
            return 0.0;
        }
        let rate = f64::from_bits(entry.peers_rate.load(Ordering::Relaxed));
        rate * (age + self.backdate()) as f64 / 1e9
    }

    /// Admission entries for the usage key, each with what it admitted, what it holds and
    /// its news; a name is written out only for the reports sent ([`KeyReport::name`]).
    pub(crate) fn admission_reports(&self) -> Vec<KeyReport> {
        self.admission()
            .map
            .pin()
            .iter()
            .filter_map(|(_, entry)| {
                let admitted = entry.admitted.load(Ordering::Relaxed);
                let in_flight = entry.in_flight.load(Ordering::Relaxed);
                let published_in_flight = entry.published_in_flight.load(Ordering::Relaxed);
                // A key whose last holder left is listed once more, so the peers see 0.
                (admitted > 0 || in_flight > 0 || published_in_flight > 0).then(|| {
                    let unpublished = admitted - entry.published.load(Ordering::Relaxed)
                        + in_flight.abs_diff(published_in_flight);
                    KeyReport {
                        entry: Arc::clone(entry),
                        admitted,
                        in_flight,
                        news: unpublished + in_flight,
                    }
                })
            })
            .collect()
    }

    /// Every entry's demand and spend here, for the cell sync: those offered something or
    /// asked for a slot; not `shared` ones. Reading resets the slots wanted.
    pub(crate) fn key_cell_usage(&self) -> Vec<KeyUsage> {
        self.admission()
            .map
            .pin()
            .iter()
            .filter_map(|(_, entry)| {
                let state = entry.state.load();
                if state.meter.is_shared() {
                    return None;
                }
                let offered = entry.cell_offered.load(Ordering::Relaxed);
                let wanted = entry.cell_wanted.swap(0, Ordering::Relaxed);
                let in_flight = entry.in_flight.load(Ordering::Relaxed);
                (offered > 0 || wanted > 0 || in_flight > 0).then(|| KeyUsage {
                    tenant: entry.tenant.to_string(),
                    key: entry.key.to_string(),
                    limit: state.spec,
                    offered,
                    spent: entry.admitted.load(Ordering::Relaxed),
                    wanted: wanted.max(in_flight),
                })
            })
            .collect()
    }

    pub(crate) fn mark_admission_listed(&self, name: &str, admitted: u64, in_flight: u64) {
        if let Some(entry) = self.admission().map.pin().get(name) {
            entry.published.fetch_max(admitted, Ordering::Relaxed);
            entry
                .published_in_flight
                .store(in_flight, Ordering::Relaxed);
            entry.publishes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Drops entries unused for the idle timeout that hold no lease and are full again.
    pub(crate) fn evict_admission(&self, idle: Duration) {
        let now = self.now_nanos();
        let counted = self.admission().max_keys_per_tenant > 0;
        self.admission().map.pin().retain(|_, entry| {
            let used = now.saturating_sub(entry.last_seen.load(Ordering::Relaxed))
                <= idle.as_nanos() as u64;
            let kept = used || entry.in_flight.load(Ordering::Relaxed) > 0;
            if !kept && counted && &*entry.key != PUSH_KEY {
                self.admission().count_key(&entry.tenant, false);
            }
            kept
        });
    }
}

/// The answer where nothing meters the rate: allowed, with no end to what remains.
/// Gives lent tokens back to the key's meter they came from: the token bucket's level rises
/// and the replica's admitted count (what gossip carries) goes down, as a push refund does.
/// A sliding window's or a leaky bucket's tokens lapse: their meters cannot be credited.
fn give_back(entry: &Entry, tokens: u64) {
    if tokens == 0 {
        return;
    }
    let state = entry.state.load();
    match &state.meter {
        Kept::Divided(Meter::TokenBucket(bucket)) | Kept::Weighted(Meter::TokenBucket(bucket)) => {
            bucket.refund(tokens)
        }
        Kept::Shared(_) if state.spec.algorithm == Algorithm::TokenBucket => {
            if let Some(lease) = entry.lease.get() {
                lease.refund(tokens);
            }
        }
        _ => return,
    }
    let _ = entry
        .admitted
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |admitted| {
            Some(admitted.saturating_sub(tokens))
        });
}

fn unmetered() -> Decision {
    Decision {
        allowed: true,
        remaining: u64::MAX,
        retry_after: Duration::ZERO,
        reset_after: Duration::ZERO,
        delay: Duration::ZERO,
    }
}

fn share(strategy: RateLimitStrategy, healthy: usize) -> f64 {
    match strategy {
        RateLimitStrategy::Divided => 1.0 / healthy.max(1) as f64,
        RateLimitStrategy::Weighted | RateLimitStrategy::Shared => 1.0,
    }
}

/// A meter for a new spec, keeping the token bucket's tokens (no fresh burst on a reload).
fn carry(old: &Meter, spec: &LimitSpec, share: f64, now: u64) -> Meter {
    match (old, Meter::new(spec, share, now)) {
        (Meter::TokenBucket(old), Meter::TokenBucket(new)) => {
            Meter::TokenBucket(old.reshaped(new.rate(), now))
        }
        (_, new) => new,
    }
}

/// An admission entry for the usage key ([`Keys::admission_reports`]).
pub(crate) struct KeyReport {
    entry: Arc<Entry>,
    pub(crate) admitted: u64,
    pub(crate) in_flight: u64,
    /// Unpublished admissions, and the holders (a key with holders is news each round).
    pub(crate) news: u64,
}

impl KeyReport {
    /// The entry's name, as the usage key carries it.
    pub(crate) fn name(&self) -> String {
        entry_name(&self.entry.tenant, &self.entry.key)
    }

    /// Where the entry lives: ties among keys broken the same way every time.
    pub(crate) fn at(&self) -> usize {
        Arc::as_ptr(&self.entry) as usize
    }
}

/// An entry's name is its subject's name in the cells' slices.
fn entry_name(tenant: &str, encoded_key: &str) -> String {
    crate::cells::key_subject(tenant, encoded_key)
}

fn rand_id() -> u128 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut id = 0u128;
    for _ in 0..2 {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        id = (id << 64) | hasher.finish() as u128;
    }
    id
}

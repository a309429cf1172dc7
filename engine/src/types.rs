//! The engine's vocabulary: the words every layer above uses, with no behaviour of their own
//! beyond naming. Nothing here imports another module of the engine.

use std::collections::HashMap;
use std::time::Duration;

/// A token bucket's shape: refill rate and capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub per_second: f64,
    pub burst: u64,
}

/// The outcome of one check against a bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    Allowed,
    /// Not now: `wait` until the cost could pass; `available` whole tokens are there now.
    Denied {
        wait: Duration,
        available: u64,
    },
    /// The cost is larger than the bucket's capacity: it can never pass.
    TooLarge,
}

/// Which of a tenant's limits a check is against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LimitKind {
    /// One token per push request, checked before the body is read.
    Request,
    /// One token per sample, histogram, exemplar and metadata entry.
    Ingestion,
}

impl LimitKind {
    pub(crate) fn index(self) -> usize {
        match self {
            LimitKind::Request => 0,
            LimitKind::Ingestion => 1,
        }
    }
}

/// Why a check failed, with the fleet-wide numbers the refusal names.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rejection {
    pub kind: LimitKind,
    pub cause: RejectionCause,
    /// The tenant's fleet-wide rate for this limit, as configured.
    pub limit: f64,
    /// The tenant's burst for this limit, as configured.
    pub burst: u64,
    /// The rate this replica enforces (the fleet rate under `weighted`).
    pub local_limit: f64,
    /// What the request asked for.
    pub cost: u64,
    /// Whole tokens left in the bucket this request was checked against.
    pub remaining: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RejectionCause {
    /// Over the rate; the cost could pass after `wait`.
    RateLimited { wait: Duration },
    /// The cost exceeds the burst: it can never pass.
    LargerThanBurst,
    /// The limit is 0: nothing passes.
    Blocked,
    /// `shared` with `on_store_failure: closed`: the store could not answer in time.
    StoreUnavailable,
}

/// What an admission took, and from which meter, so that it can be given back
/// ([`crate::Limiter::refund`]) when the work it paid for did not happen: a push whose
/// forward failed is charged once, on the retry that succeeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    pub kind: LimitKind,
    pub cost: u64,
    pub(crate) from: TakenFrom,
}

/// The meter an admission took its tokens from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TakenFrom {
    /// Unlimited: nothing was taken.
    Nothing,
    /// `divided`: the replica's governor bucket.
    Divided,
    /// `weighted` (or `shared`'s open fallback): the replica's view of the fleet bucket.
    View,
    /// `shared`: the lease of store tokens (and the view kept beside it).
    Lease,
}

impl Taken {
    pub(crate) fn new(kind: LimitKind, cost: u64, from: TakenFrom) -> Taken {
        Taken { kind, cost, from }
    }
}

/// An admission: how long the caller must wait before it proceeds (a reservation under
/// `weighted`), and what it took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Admitted {
    pub wait: Duration,
    pub taken: Taken,
}

impl Admitted {
    /// An admission that needs no wait.
    pub(crate) fn at_once(kind: LimitKind, cost: u64, from: TakenFrom) -> Admitted {
        Admitted {
            wait: Duration::ZERO,
            taken: Taken::new(kind, cost, from),
        }
    }
}

/// The peers' admissions for one tenant under `weighted`: cumulative counts summed over
/// peers (monotonic: a peer that restarts or forgets the tenant adds from zero again), and
/// the lowest bucket level a peer reported, refilled to the moment the snapshot was taken.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PeerTotals {
    pub requests: u64,
    pub items: u64,
    pub requests_level: Option<f64>,
    pub items_level: Option<f64>,
    /// Admission keys: leases the peers hold now (a sum of their latest reports).
    pub in_flight: u64,
    /// What the peers gave back of what they counted (refunds, returned lent tokens),
    /// cumulative and monotonic like the counts: the views credit it.
    pub requests_refunded: u64,
    pub items_refunded: u64,
}

impl PeerTotals {
    pub(crate) fn total(&self, kind: LimitKind) -> u64 {
        match kind {
            LimitKind::Request => self.requests,
            LimitKind::Ingestion => self.items,
        }
    }

    pub(crate) fn refunded(&self, kind: LimitKind) -> u64 {
        match kind {
            LimitKind::Request => self.requests_refunded,
            LimitKind::Ingestion => self.items_refunded,
        }
    }

    pub(crate) fn level(&self, kind: LimitKind) -> Option<f64> {
        match kind {
            LimitKind::Request => self.requests_level,
            LimitKind::Ingestion => self.items_level,
        }
    }
}

/// All tenants' [`PeerTotals`], as gossip last reported them.
/// By tenant (or admission key's entry name); names shared with the ring's view, so handing
/// one over copies none.
pub type PeerUsage = HashMap<std::sync::Arc<str>, PeerTotals, foldhash::fast::RandomState>;

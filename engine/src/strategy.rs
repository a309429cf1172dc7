//! The strategy seam's rule for a store that cannot answer. A `shared` limit is decided by
//! the store; when the store does not answer in time, its breaker is open, or no store is
//! configured, the limit's `on_store_failure` policy decides instead: `open` falls back to the
//! replica's own view (the `weighted` fleet view, or the replica's share of an in-flight cap),
//! `closed` refuses. Both front-ends (push limits and admission keys) come here, and the
//! policy and its metric are known nowhere else.

use runtime_config::StoreFailurePolicy;

use crate::shared::Shared;

/// Decides by `policy` for a store that failed: `open()` or `closed()`, and tells the store's
/// observer which, and whether the answer admits (`admitted`).
pub(crate) fn on_store_failure<T>(
    policy: StoreFailurePolicy,
    shared: Option<&Shared>,
    open: impl FnOnce() -> T,
    closed: impl FnOnce() -> T,
    admitted: impl FnOnce(&T) -> bool,
) -> T {
    let result = match policy {
        StoreFailurePolicy::Open => open(),
        StoreFailurePolicy::Closed => closed(),
    };
    if let Some(shared) = shared {
        shared.observer.policy_decision(policy, admitted(&result));
    }
    result
}

/// One limit as this replica keeps it, by its tenant's strategy: what a decision runs
/// against. Both front-ends keep their limits in it: a push limit as a governor bucket or a
/// view of the fleet bucket, an admission key as a meter. Which strategy decides is a match
/// on this one type, and an enum keeps the hot path free of virtual calls.
pub(crate) enum Kept<D, F> {
    /// No meter: the limit is unlimited or blocks everything (the caller knows which).
    None,
    /// `divided`: this replica's slice of the limit, alone.
    Divided(D),
    /// `weighted`: this replica's view of the fleet-wide limit, charged with what the peers
    /// report over gossip.
    Weighted(F),
    /// `shared`: the store decides; the view is kept current (own admissions, the peers' over
    /// gossip) for `on_store_failure: open`.
    Shared(F),
}

impl<D, F> Kept<D, F> {
    /// The view of the fleet-wide limit, under `weighted` and `shared`.
    pub(crate) fn view(&self) -> Option<&F> {
        match self {
            Kept::Weighted(view) | Kept::Shared(view) => Some(view),
            Kept::None | Kept::Divided(_) => None,
        }
    }

    pub(crate) fn is_shared(&self) -> bool {
        matches!(self, Kept::Shared(_))
    }

    /// The strategy, when there is a meter.
    pub(crate) fn strategy(&self) -> Option<runtime_config::RateLimitStrategy> {
        use runtime_config::RateLimitStrategy;
        match self {
            Kept::None => None,
            Kept::Divided(_) => Some(RateLimitStrategy::Divided),
            Kept::Weighted(_) => Some(RateLimitStrategy::Weighted),
            Kept::Shared(_) => Some(RateLimitStrategy::Shared),
        }
    }
}

impl<M> Kept<M, M> {
    /// Keeps `meter` under `strategy` (an admission key: one meter type for every strategy).
    pub(crate) fn of(strategy: runtime_config::RateLimitStrategy, meter: M) -> Self {
        match strategy {
            runtime_config::RateLimitStrategy::Divided => Kept::Divided(meter),
            runtime_config::RateLimitStrategy::Weighted => Kept::Weighted(meter),
            runtime_config::RateLimitStrategy::Shared => Kept::Shared(meter),
        }
    }

    /// The meter, whatever the strategy.
    pub(crate) fn meter(&self) -> Option<&M> {
        match self {
            Kept::Divided(meter) | Kept::Weighted(meter) | Kept::Shared(meter) => Some(meter),
            Kept::None => None,
        }
    }
}

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

//! One (tenant, key)'s local budget: the tokens leased from the fleet, spent by
//! [`Budget::decide`] with atomics only, and the fallback meter that the `open` failure
//! policy uses while the fleet is away. Time is an input (nanoseconds since the client
//! started), so every rule here is tested without sleeping.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::plan::RollState;
use crate::{Decision, FailurePolicy, Limit, Source};

/// A key's budget. The hot path touches only the atomics; `roll` is the background task's,
/// and no asynchronous operation runs while it is held.
pub(crate) struct Budget {
    pub(crate) tenant: Box<str>,
    pub(crate) key: Box<str>,
    /// Leased tokens left to spend here.
    pub(crate) tokens: AtomicU64,
    /// The lease may be spent until then (0: never leased).
    pub(crate) valid_until: AtomicU64,
    /// Cost asked for, allowed or not, cumulative: the demand the next lease is sized by.
    pub(crate) demand: AtomicU64,
    /// When a decision last asked (for idleness).
    pub(crate) last_used: AtomicU64,
    /// Below this many tokens a decision asks the task for a refill early.
    pub(crate) low_water: AtomicU64,
    /// Granted less than wanted: how long the fleet said until more (nanoseconds).
    pub(crate) retry_hint: AtomicU64,
    /// The limit in force, as the fleet last said (`f64` bits; burst).
    rate_bits: AtomicU64,
    burst: AtomicU64,
    /// A decision found the budget short and asked for a refill.
    pub(crate) wanted: AtomicBool,
    /// A roll is under way (the task's single flight per key).
    pub(crate) rolling: AtomicBool,
    /// Dropped from the client's keys (see [`Budget::forgettable`]): a handle that still
    /// holds it looks the pair up again.
    pub(crate) forgotten: AtomicBool,
    pub(crate) fallback: Fallback,
    pub(crate) roll: Mutex<RollState>,
}

/// What a decision found, beyond the answer: whether to wake the refill task.
pub(crate) struct Decided {
    pub(crate) decision: Decision,
    pub(crate) wake: bool,
}

impl Budget {
    pub(crate) fn new(tenant: &str, key: &str, now: u64) -> Budget {
        Budget {
            tenant: tenant.into(),
            key: key.into(),
            tokens: AtomicU64::new(0),
            valid_until: AtomicU64::new(0),
            demand: AtomicU64::new(0),
            last_used: AtomicU64::new(now),
            low_water: AtomicU64::new(1),
            retry_hint: AtomicU64::new(0),
            rate_bits: AtomicU64::new(0f64.to_bits()),
            burst: AtomicU64::new(0),
            wanted: AtomicBool::new(false),
            rolling: AtomicBool::new(false),
            forgotten: AtomicBool::new(false),
            fallback: Fallback::default(),
            roll: Mutex::new(RollState::new(now)),
        }
    }

    pub(crate) fn limit(&self) -> Limit {
        Limit {
            rate: f64::from_bits(self.rate_bits.load(Ordering::Relaxed)),
            burst: self.burst.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn set_limit(&self, limit: Limit) {
        self.rate_bits
            .store(limit.rate.to_bits(), Ordering::Relaxed);
        self.burst.store(limit.burst, Ordering::Relaxed);
    }

    /// Has the fleet ever answered for this key?
    pub(crate) fn leased(&self) -> bool {
        self.valid_until.load(Ordering::Acquire) != 0
    }

    /// Holds nothing the fleet or a caller could miss, and has not been asked for
    /// `forget_after` nanoseconds: no lease and no tokens (an idle key gives them back after
    /// 30 s), no roll under way, and a full fallback meter, so a budget made afresh would
    /// decide the same. The client then drops it, so keys that come and go do not pile up.
    pub(crate) fn forgettable(&self, now: u64, forget_after: u64) -> bool {
        !self.rolling.load(Ordering::Acquire)
            && self.valid_until.load(Ordering::Acquire) == 0
            && self.tokens.load(Ordering::Acquire) == 0
            && self.fallback.full(now)
            && now.saturating_sub(self.last_used.load(Ordering::Relaxed)) >= forget_after
    }

    /// Decides `cost` now. In order: the lease's tokens (the fleet granted them, so they are
    /// spent even while the fleet is away); then, with no lease yet or the fleet away, the
    /// failure policy; else a refusal until the next refill.
    pub(crate) fn decide(
        &self,
        cost: u64,
        now: u64,
        fleet_down: bool,
        policy: FailurePolicy,
    ) -> Decided {
        self.demand.fetch_add(cost, Ordering::Relaxed);
        self.last_used.store(now, Ordering::Relaxed);
        let limit = self.limit();
        let valid_until = self.valid_until.load(Ordering::Acquire);
        if now < valid_until {
            if let Ok(before) =
                self.tokens
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tokens| {
                        tokens.checked_sub(cost)
                    })
            {
                let remaining = before - cost;
                let wake = remaining < self.low_water.load(Ordering::Relaxed)
                    && !self.wanted.swap(true, Ordering::AcqRel);
                return Decided {
                    decision: Decision {
                        allowed: true,
                        remaining,
                        retry_after: Duration::ZERO,
                        reset_after: reset_after(limit, remaining),
                        limit,
                        source: Source::Lease,
                    },
                    wake,
                };
            }
        }
        let wake = !self.wanted.swap(true, Ordering::AcqRel);
        if valid_until == 0 || fleet_down {
            let source = match (valid_until == 0 && !fleet_down, policy) {
                (true, _) => Source::Cold,
                (false, FailurePolicy::Open) => Source::FailOpen,
                (false, FailurePolicy::Closed) => Source::FailClosed,
            };
            let decision = match policy {
                FailurePolicy::Open => self.fallback.check(cost, now, limit, source),
                FailurePolicy::Closed => Decision::refused(limit, Duration::ZERO, 0, source),
            };
            return Decided { decision, wake };
        }
        // Out of tokens (or the lease lapsed): the fleet has said what it can give.
        let hint = Duration::from_nanos(self.retry_hint.load(Ordering::Relaxed));
        let refill = if limit.rate > 0.0 {
            Duration::from_secs_f64(cost as f64 / limit.rate)
        } else {
            Duration::ZERO
        };
        let tokens = if now < valid_until {
            self.tokens.load(Ordering::Relaxed)
        } else {
            0
        };
        Decided {
            decision: Decision::refused(limit, hint.max(refill), tokens, Source::Lease),
            wake,
        }
    }
}

/// Until a bucket of `limit` holding `remaining` is full again.
fn reset_after(limit: Limit, remaining: u64) -> Duration {
    if limit.rate > 0.0 && limit.burst > remaining {
        Duration::from_secs_f64((limit.burst - remaining) as f64 / limit.rate)
    } else {
        Duration::ZERO
    }
}

/// The `open` policy's meter while the fleet is away: a token bucket (GCRA, one atomic) at
/// the limit last in force, so a client alone never goes past it. With no limit known (the
/// fleet never answered) everything passes.
#[derive(Default)]
pub(crate) struct Fallback {
    /// The theoretical arrival time of the next request, in nanoseconds.
    tat: AtomicU64,
}

impl Fallback {
    /// Holds its whole burst at `now`, whatever the limit.
    fn full(&self, now: u64) -> bool {
        self.tat.load(Ordering::Acquire) <= now
    }

    pub(crate) fn check(&self, cost: u64, now: u64, limit: Limit, source: Source) -> Decision {
        if limit.rate <= 0.0 || limit.burst == 0 {
            return Decision {
                allowed: true,
                remaining: u64::MAX,
                retry_after: Duration::ZERO,
                reset_after: Duration::ZERO,
                limit,
                source,
            };
        }
        let period = 1e9 / limit.rate;
        let increment = (cost as f64 * period) as u64;
        let tolerance = (limit.burst as f64 * period) as u64;
        let result = self
            .tat
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                let next = tat.max(now) + increment;
                (next <= now + tolerance).then_some(next)
            });
        match result {
            Ok(tat) => {
                let next = tat.max(now) + increment;
                let remaining = ((now + tolerance - next) as f64 / period) as u64;
                Decision {
                    allowed: true,
                    remaining,
                    retry_after: Duration::ZERO,
                    reset_after: Duration::from_nanos(next - now),
                    limit,
                    source,
                }
            }
            Err(tat) => {
                let wait = (tat.max(now) + increment).saturating_sub(now + tolerance);
                let remaining =
                    ((now + tolerance).saturating_sub(tat.max(now)) as f64 / period).floor() as u64;
                Decision::refused(limit, Duration::from_nanos(wait), remaining, source)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    fn leased(tokens: u64, valid_until: u64) -> Budget {
        let budget = Budget::new("t", "k", 0);
        budget.tokens.store(tokens, Ordering::Relaxed);
        budget.valid_until.store(valid_until, Ordering::Relaxed);
        budget.set_limit(Limit {
            rate: 10.0,
            burst: 10,
        });
        budget
    }

    #[test]
    fn only_an_empty_unleased_idle_budget_is_forgettable() {
        let forget_after = 60 * SECOND;
        let idle = Budget::new("t", "k", 0);
        assert!(
            !idle.forgettable(forget_after - 1, forget_after),
            "not idle long enough"
        );
        assert!(idle.forgettable(forget_after, forget_after));

        let used = Budget::new("t", "k", 0);
        used.decide(1, 10 * SECOND, false, FailurePolicy::Open);
        assert!(
            !used.forgettable(forget_after, forget_after),
            "used at 10 s"
        );
        assert!(used.forgettable(forget_after + 10 * SECOND, forget_after));

        let holding = leased(3, 5 * SECOND);
        assert!(
            !holding.forgettable(10 * forget_after, forget_after),
            "a lease"
        );
        holding.valid_until.store(0, Ordering::Relaxed);
        assert!(
            !holding.forgettable(10 * forget_after, forget_after),
            "tokens"
        );
        holding.tokens.store(0, Ordering::Relaxed);
        assert!(holding.forgettable(10 * forget_after, forget_after));
        holding.rolling.store(true, Ordering::Relaxed);
        assert!(
            !holding.forgettable(10 * forget_after, forget_after),
            "a roll"
        );

        // The fallback meter spent, an hour of refill: kept until it is full again.
        let metered = Budget::new("t", "k", 0);
        let slow = Limit {
            rate: 1.0,
            burst: 3600,
        };
        metered.fallback.check(3600, 0, slow, Source::FailOpen);
        assert!(!metered.forgettable(forget_after, forget_after));
        assert!(metered.forgettable(3600 * SECOND, forget_after));
    }

    #[test]
    fn spends_the_lease_then_refuses_with_the_refill_time() {
        let budget = leased(3, 5 * SECOND);
        budget.low_water.store(0, Ordering::Relaxed);
        for left in [2, 1, 0] {
            let decided = budget.decide(1, SECOND, false, FailurePolicy::Closed);
            assert!(decided.decision.allowed);
            assert_eq!(decided.decision.remaining, left);
            assert_eq!(decided.decision.source, Source::Lease);
        }
        let refused = budget.decide(2, SECOND, false, FailurePolicy::Open);
        assert!(!refused.decision.allowed, "the fleet is up: no policy");
        assert_eq!(refused.decision.retry_after, Duration::from_millis(200));
        assert!(refused.wake);
        assert!(
            !budget.decide(1, SECOND, false, FailurePolicy::Open).wake,
            "one wake until the task takes it"
        );
        assert_eq!(budget.demand.load(Ordering::Relaxed), 6);
    }

    #[test]
    fn a_lapsed_lease_is_not_spent() {
        let budget = leased(100, 5 * SECOND);
        assert!(
            !budget
                .decide(1, 5 * SECOND, false, FailurePolicy::Open)
                .decision
                .allowed
        );
        assert_eq!(budget.tokens.load(Ordering::Relaxed), 100);
    }

    #[test]
    fn wakes_below_the_low_water_mark_once() {
        let budget = leased(10, 5 * SECOND);
        budget.low_water.store(8, Ordering::Relaxed);
        assert!(!budget.decide(1, 0, false, FailurePolicy::Open).wake);
        assert!(budget.decide(2, 0, false, FailurePolicy::Open).wake);
        assert!(!budget.decide(1, 0, false, FailurePolicy::Open).wake);
    }

    #[test]
    fn the_policy_applies_cold_and_with_the_fleet_away_after_the_lease() {
        let cold = Budget::new("t", "k", 0);
        let open = cold.decide(1, 0, false, FailurePolicy::Open).decision;
        assert!(open.allowed && open.source == Source::Cold);
        let closed = cold.decide(1, 0, false, FailurePolicy::Closed).decision;
        assert!(!closed.allowed && closed.source == Source::Cold);
        // Leased tokens are spent while the fleet is away; then the policy.
        let budget = leased(1, 5 * SECOND);
        let spent = budget.decide(1, 0, true, FailurePolicy::Closed).decision;
        assert_eq!(spent.source, Source::Lease);
        let closed = budget.decide(1, 0, true, FailurePolicy::Closed).decision;
        assert!(!closed.allowed && closed.source == Source::FailClosed);
        let open = budget.decide(1, 0, true, FailurePolicy::Open).decision;
        assert!(open.allowed && open.source == Source::FailOpen);
    }

    #[test]
    fn fail_open_keeps_to_the_last_known_limit() {
        let budget = leased(0, SECOND);
        let mut allowed = 0;
        // 10 a second, burst 10: over 2 s at 1 000 asks a second, 10 + 20 pass.
        for millis in 0..2000u64 {
            let now = 2 * SECOND + millis * 1_000_000;
            if budget
                .decide(1, now, true, FailurePolicy::Open)
                .decision
                .allowed
            {
                allowed += 1;
            }
        }
        assert!((29..=31).contains(&allowed), "{allowed}");
    }
}

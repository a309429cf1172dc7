//! One token bucket: a governor GCRA limiter with its shape, and a fair hand-over when the
//! shape changes.
//!
//! governor quotas are immutable, so a new limit means a new limiter. A fresh limiter starts
//! full, which would hand out a whole burst on every reload or membership change. Instead the
//! tokens left in the old bucket carry over (capped at the new burst): the tenant keeps what it
//! had, no more.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use governor::clock::{Clock, Reference};
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use crate::types::{Outcome, Rate};

pub struct Bucket<C: Clock> {
    limiter: RateLimiter<NotKeyed, InMemoryState, C, NoOpMiddleware<C::Instant>>,
    rate: Rate,
    clock: C,
    /// Tokens given back ([`Bucket::refund`]): governor cannot take tokens back, so they are
    /// kept beside it and spent when governor has too few.
    credit: AtomicU64,
    /// Until then (nanoseconds after `origin`) the credit is good: a bucket fills from empty
    /// in burst ÷ rate, after which a token given back would have overflowed.
    credit_until: AtomicU64,
    origin: C::Instant,
}

impl<C: Clock + Clone> Bucket<C> {
    /// A full bucket of the given shape.
    pub fn new(rate: Rate, clock: &C) -> Self {
        Bucket {
            limiter: RateLimiter::direct_with_clock(quota(rate), clock.clone()),
            rate,
            clock: clock.clone(),
            credit: AtomicU64::new(0),
            credit_until: AtomicU64::new(0),
            origin: clock.now(),
        }
    }

    /// A bucket of the given shape holding `tokens` (capped at its burst; below 1, empty).
    pub fn with_tokens(rate: Rate, tokens: f64, clock: &C) -> Self {
        let next = Bucket::new(rate, clock);
        let burst = capacity(rate.burst);
        let held = (tokens.max(0.0).floor() as u64).min(burst as u64);
        if let Some(deficit) = NonZeroU32::new(burst - held as u32) {
            let _ = next.limiter.check_n(deficit);
        }
        next
    }

    /// A bucket of the new shape holding the tokens this one holds now, capped at the new
    /// burst. This bucket is drained in the process, so call it only when replacing it.
    pub fn carry_over(&self, rate: Rate) -> Self {
        Bucket::with_tokens(rate, self.drain_available(), &self.clock)
    }

    /// Takes `cost` tokens if they are there.
    pub fn check(&self, cost: u64) -> Outcome {
        if cost == 0 {
            return Outcome::Allowed;
        }
        if cost > u64::from(capacity(self.rate.burst)) {
            return Outcome::TooLarge;
        }
        let cost = NonZeroU32::new(cost as u32).expect("1 ≤ cost ≤ u32::MAX");
        match self.limiter.check_n(cost) {
            Ok(Ok(())) => Outcome::Allowed,
            Ok(Err(_)) if self.spend_credit(u64::from(cost.get())) => Outcome::Allowed,
            Ok(Err(not_until)) => {
                let wait = not_until.wait_time_from(self.clock.now());
                // The wait is the time the missing tokens take to arrive.
                let missing = (wait.as_secs_f64() * self.rate.per_second).ceil();
                Outcome::Denied {
                    wait,
                    available: (cost.get() as f64 - missing).max(0.0) as u64,
                }
            }
            Err(_) => Outcome::TooLarge,
        }
    }

    /// Gives back `cost` tokens taken by [`Bucket::check`] for work that did not happen. They
    /// are spent when governor's bucket has too few, within the time the bucket takes to
    /// fill (after that they would have overflowed), and never more than a burst of them.
    pub fn refund(&self, cost: u64) {
        let now = nanos_between(self.origin, self.clock.now());
        let fill = (self.rate.burst as f64 / self.rate.per_second * 1e9).min(u64::MAX as f64);
        let until = self
            .credit_until
            .swap(now.saturating_add(fill as u64), Ordering::AcqRel);
        let burst = self.rate.burst;
        let _ = self
            .credit
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |credit| {
                // Credit from an earlier refund that has lapsed is gone.
                let credit = if until < now { 0 } else { credit };
                Some((credit + cost).min(burst))
            });
    }

    /// Takes `cost` from the credit if it is good and holds that many.
    fn spend_credit(&self, cost: u64) -> bool {
        if self.credit.load(Ordering::Acquire) < cost {
            return false;
        }
        let now = nanos_between(self.origin, self.clock.now());
        if now > self.credit_until.load(Ordering::Acquire) {
            self.credit.store(0, Ordering::Release);
            return false;
        }
        self.credit
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |credit| {
                credit.checked_sub(cost)
            })
            .is_ok()
    }

    /// How many tokens the bucket holds, found by asking for a full burst: if that passes the
    /// bucket was full; if not, the wait tells how far from full it is. Either way the probe
    /// consumes tokens: call it only when replacing the bucket.
    pub fn drain_available(&self) -> f64 {
        let burst = NonZeroU32::new(capacity(self.rate.burst)).expect("burst ≥ 1");
        match self.limiter.check_n(burst) {
            Ok(Ok(())) => f64::from(burst.get()),
            Ok(Err(not_until)) => {
                let missing =
                    not_until.wait_time_from(self.clock.now()).as_secs_f64() * self.rate.per_second;
                (f64::from(burst.get()) - missing).max(0.0)
            }
            Err(_) => 0.0,
        }
    }
}

/// governor holds the burst in a u32; larger configured bursts are capped there.
fn capacity(burst: u64) -> u32 {
    burst.clamp(1, u32::MAX as u64) as u32
}

fn quota(rate: Rate) -> Quota {
    // One token per `period`; governor counts in nanoseconds, so rates above 1e9/s saturate.
    let nanos = (1e9 / rate.per_second).round().clamp(1.0, u64::MAX as f64) as u64;
    Quota::with_period(Duration::from_nanos(nanos))
        .expect("period ≥ 1 ns")
        .allow_burst(NonZeroU32::new(capacity(rate.burst)).expect("burst ≥ 1"))
}

/// Nanoseconds between two clock readings (0 if `later` is earlier).
pub fn nanos_between<I: Reference>(earlier: I, later: I) -> u64 {
    later.duration_since(earlier).as_u64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use governor::clock::FakeRelativeClock;

    fn denied(wait_ms: u64, available: u64) -> Outcome {
        Outcome::Denied {
            wait: Duration::from_millis(wait_ms),
            available,
        }
    }

    fn bucket(per_second: f64, burst: u64) -> (Bucket<FakeRelativeClock>, FakeRelativeClock) {
        let clock = FakeRelativeClock::default();
        (Bucket::new(Rate { per_second, burst }, &clock), clock)
    }

    #[test]
    fn exact_sequence_burst_then_refill() {
        // 10 tokens/s, burst 3: three pass at once, the fourth waits 100 ms.
        let (bucket, clock) = bucket(10.0, 3);
        assert_eq!(bucket.check(1), Outcome::Allowed);
        assert_eq!(bucket.check(1), Outcome::Allowed);
        assert_eq!(bucket.check(1), Outcome::Allowed);
        assert_eq!(bucket.check(1), denied(100, 0));
        clock.advance(Duration::from_millis(50));
        assert_eq!(bucket.check(1), denied(50, 0));
        clock.advance(Duration::from_millis(50));
        assert_eq!(bucket.check(1), Outcome::Allowed);
        assert!(matches!(bucket.check(1), Outcome::Denied { .. }));
        // After 300 ms the bucket is full again, and never fuller.
        clock.advance(Duration::from_secs(10));
        assert_eq!(bucket.check(3), Outcome::Allowed);
        assert!(matches!(bucket.check(1), Outcome::Denied { .. }));
    }

    #[test]
    fn a_refund_is_spent_once_and_lapses_when_the_bucket_would_be_full() {
        // 10 tokens/s, burst 5: empty after five.
        let (bucket, clock) = bucket(10.0, 5);
        assert_eq!(bucket.check(5), Outcome::Allowed);
        assert!(matches!(bucket.check(3), Outcome::Denied { .. }));
        // Three given back: a check of three passes once, not twice.
        bucket.refund(3);
        assert_eq!(bucket.check(3), Outcome::Allowed);
        assert!(matches!(bucket.check(1), Outcome::Denied { .. }));
        // Never more than a burst of credit.
        bucket.refund(4);
        bucket.refund(4);
        assert_eq!(bucket.check(5), Outcome::Allowed);
        assert!(matches!(bucket.check(1), Outcome::Denied { .. }));
        // Given back, then unused for longer than the bucket takes to fill (0.5 s): the
        // bucket is full, and holds no more than its burst.
        bucket.refund(5);
        clock.advance(Duration::from_millis(600));
        assert_eq!(bucket.check(5), Outcome::Allowed);
        assert!(matches!(bucket.check(1), Outcome::Denied { .. }));
    }

    #[test]
    fn cost_above_burst_is_too_large_and_costs_nothing() {
        let (bucket, _clock) = bucket(10.0, 5);
        assert_eq!(bucket.check(6), Outcome::TooLarge);
        assert_eq!(bucket.check(u64::MAX), Outcome::TooLarge);
        assert_eq!(bucket.check(5), Outcome::Allowed);
    }

    #[test]
    fn zero_cost_always_passes() {
        let (bucket, _clock) = bucket(10.0, 1);
        assert_eq!(bucket.check(1), Outcome::Allowed);
        assert_eq!(bucket.check(0), Outcome::Allowed);
    }

    #[test]
    fn multi_token_wait_is_exact() {
        let (bucket, _clock) = bucket(1000.0, 100);
        assert_eq!(bucket.check(100), Outcome::Allowed);
        assert_eq!(bucket.check(50), denied(50, 0));
        // …and a refusal says how many tokens really are there.
        let (bucket, clock) = super::tests::bucket(1000.0, 100);
        assert_eq!(bucket.check(100), Outcome::Allowed);
        clock.advance(Duration::from_millis(30));
        assert_eq!(bucket.check(50), denied(20, 30));
    }

    #[test]
    fn carry_over_keeps_tokens_not_a_fresh_burst() {
        let (old, clock) = bucket(100.0, 100);
        assert_eq!(old.check(70), Outcome::Allowed); // 30 left
        let new = old.carry_over(Rate {
            per_second: 200.0,
            burst: 100,
        });
        assert_eq!(new.check(30), Outcome::Allowed);
        assert!(matches!(new.check(1), Outcome::Denied { .. }));
        // and it refills at the new rate: 200/s → 20 tokens in 100 ms
        clock.advance(Duration::from_millis(100));
        assert_eq!(new.check(20), Outcome::Allowed);
        assert!(matches!(new.check(1), Outcome::Denied { .. }));
    }

    #[test]
    fn carry_over_caps_at_the_new_burst() {
        let (old, _clock) = bucket(100.0, 100);
        let new = old.carry_over(Rate {
            per_second: 100.0,
            burst: 10,
        });
        assert_eq!(new.check(10), Outcome::Allowed);
        assert!(matches!(new.check(1), Outcome::Denied { .. }));
    }

    #[test]
    fn carry_over_of_an_empty_bucket_is_empty() {
        let (old, _clock) = bucket(100.0, 100);
        assert_eq!(old.check(100), Outcome::Allowed);
        let new = old.carry_over(Rate {
            per_second: 1000.0,
            burst: 1000,
        });
        assert!(matches!(new.check(1), Outcome::Denied { .. }));
    }
}

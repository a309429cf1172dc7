//! The admission API's three algorithms, each a meter with the clock passed in
//! (nanoseconds on the engine clock): it decides, and it can be charged with what was spent
//! elsewhere (the peers' admissions under `weighted`), so all three can be fleet-wide.
//!
//! | algorithm | state | guarantee |
//! | --- | --- | --- |
//! | token bucket | one atomic (GCRA, [`FleetBucket`]) | over any span t, at most `burst + rate·t` |
//! | sliding window | previous and current window counts | per fixed window, at most `rate × window`; over any sliding span of one window, at most twice that (when the previous window's traffic all came at its very end); exactly the limit for uniform traffic |
//! | leaky bucket | one atomic (the time the backlog clears) | admitted cost over any span t at most `burst + rate·t`; each admitted request is told how long to wait so that what leaves is at most `rate` |

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use runtime_config::{Algorithm, LimitSpec};

use crate::fleet::FleetBucket;
use crate::types::{Outcome, Rate};

/// What a meter says about one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    pub allowed: bool,
    /// Left after this request (allowed) or now (refused), in cost units.
    pub remaining: u64,
    /// Refused: how long until this cost could pass.
    pub retry_after: Duration,
    /// How long until the meter is back to its fullest (token bucket, leaky bucket) or its
    /// current window closes (sliding window).
    pub reset_after: Duration,
    /// Leaky bucket: wait this long before proceeding, so that what leaves keeps the rate.
    pub delay: Duration,
}

/// The cost is larger than the limit can ever allow at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLarge;

/// One key's meter.
#[derive(Debug)]
pub enum Meter {
    TokenBucket(FleetBucket),
    SlidingWindow(SlidingWindow),
    LeakyBucket(LeakyBucket),
}

impl Meter {
    /// A fresh meter for `spec`, enforcing `share` of its rate (1 ÷ N under `divided`, 1 for a
    /// fleet-wide view).
    pub fn new(spec: &LimitSpec, share: f64, now: u64) -> Meter {
        let rate = (spec.rate * share).max(f64::MIN_POSITIVE);
        match spec.algorithm {
            Algorithm::TokenBucket => Meter::TokenBucket(FleetBucket::full(
                Rate {
                    per_second: rate,
                    burst: spec.burst.max(1),
                },
                now,
            )),
            Algorithm::SlidingWindow => Meter::SlidingWindow(SlidingWindow::new(
                spec.per_window() * share,
                spec.window,
                now,
            )),
            Algorithm::LeakyBucket => {
                Meter::LeakyBucket(LeakyBucket::new(rate, spec.burst.max(1), now))
            }
        }
    }

    pub fn check(&self, cost: u64, now: u64) -> Result<Decision, TooLarge> {
        self.check_reserving(cost, now, 0.0)
    }

    /// [`Meter::check`], counting `reserve` more as already admitted in a sliding window (the
    /// peers' admissions not yet reported, under `weighted`). The buckets carry debt for late
    /// reports instead, so they ignore it.
    pub fn check_reserving(&self, cost: u64, now: u64, reserve: f64) -> Result<Decision, TooLarge> {
        match self {
            Meter::TokenBucket(bucket) => token_bucket(bucket, cost, now),
            Meter::SlidingWindow(window) => window.check_reserving(cost, now, reserve),
            Meter::LeakyBucket(bucket) => bucket.check(cost, now),
        }
    }

    /// Decides `costs` in order at `now`, each as [`Meter::check_reserving`] would, with
    /// nothing between them, into `decided`. A token bucket reads and writes its state once
    /// for the whole run; the other meters decide one cost at a time.
    pub fn check_run(
        &self,
        costs: impl Iterator<Item = u64> + Clone,
        now: u64,
        reserve: f64,
        decided: &mut Vec<Result<Decision, TooLarge>>,
    ) {
        match self {
            Meter::TokenBucket(bucket) => bucket.check_run(costs, now, decided, |outcome, at| {
                token_decision(bucket, outcome, at, now)
            }),
            _ => decided.extend(costs.map(|cost| self.check_reserving(cost, now, reserve))),
        }
    }

    /// Charges what the peers admitted at `at` (≤ `now`); a token bucket and a leaky bucket
    /// put it before the `here` units this meter took since their last charge
    /// ([`FleetBucket::charge_peers`]). A sliding window counts by when already.
    pub fn charge_peers(&self, cost: u64, at: u64, now: u64, here: u64, over_silence: bool) {
        match self {
            Meter::TokenBucket(bucket) => bucket.charge_peers(cost, at, here, over_silence),
            Meter::LeakyBucket(bucket) => bucket.charge_peers(cost, at, here, over_silence),
            Meter::SlidingWindow(window) => window.charge(cost, at, now),
        }
    }

    /// Charges what was admitted elsewhere at `at` (≤ `now`).
    pub fn charge(&self, cost: u64, at: u64, now: u64) {
        match self {
            Meter::TokenBucket(bucket) => bucket.charge(cost, at),
            Meter::SlidingWindow(window) => window.charge(cost, at, now),
            Meter::LeakyBucket(bucket) => bucket.charge(cost, at),
        }
    }
}

fn token_bucket(bucket: &FleetBucket, cost: u64, now: u64) -> Result<Decision, TooLarge> {
    let outcome = bucket.check(cost, now);
    token_decision(bucket, outcome, bucket.full_at(), now)
}

/// A token bucket's answer to one cost: `outcome`, the bucket full at `full_at` after it.
fn token_decision(
    bucket: &FleetBucket,
    outcome: Outcome,
    full_at: u64,
    now: u64,
) -> Result<Decision, TooLarge> {
    let (level, full_in) = bucket.level_and_full_in_at(full_at, now);
    match outcome {
        Outcome::Allowed => Ok(Decision {
            allowed: true,
            remaining: level.max(0.0) as u64,
            retry_after: Duration::ZERO,
            reset_after: full_in,
            delay: Duration::ZERO,
        }),
        Outcome::Denied { wait, available } => Ok(Decision {
            allowed: false,
            remaining: available,
            retry_after: wait,
            reset_after: full_in,
            delay: Duration::ZERO,
        }),
        Outcome::TooLarge => Err(TooLarge),
    }
}

/// The sliding-window counter: the previous fixed window's count, weighted by the part of it
/// the last `window` still overlaps, plus the current window's. The lock is a
/// `std::sync::Mutex`: it is held for a few arithmetic operations, never across an await.
#[derive(Debug)]
pub struct SlidingWindow {
    limit: f64,
    window: u64,
    state: Mutex<WindowState>,
}

#[derive(Debug, Clone, Copy)]
struct WindowState {
    start: u64,
    previous: f64,
    current: f64,
}

impl SlidingWindow {
    pub fn new(limit: f64, window: Duration, now: u64) -> SlidingWindow {
        SlidingWindow {
            limit,
            window: (window.as_nanos() as u64).max(1),
            state: Mutex::new(WindowState {
                start: now,
                previous: 0.0,
                current: 0.0,
            }),
        }
    }

    fn advance(&self, state: &mut WindowState, now: u64) {
        if now < state.start + self.window {
            return;
        }
        let windows = (now - state.start) / self.window;
        state.previous = if windows == 1 { state.current } else { 0.0 };
        state.current = 0.0;
        state.start += windows * self.window;
    }

    fn estimate(&self, state: &WindowState, now: u64) -> f64 {
        let elapsed = now.saturating_sub(state.start) as f64 / self.window as f64;
        state.previous * (1.0 - elapsed).max(0.0) + state.current
    }

    pub fn check(&self, cost: u64, now: u64) -> Result<Decision, TooLarge> {
        self.check_reserving(cost, now, 0.0)
    }

    /// [`SlidingWindow::check`] with `reserve` counted as admitted in the current window.
    pub fn check_reserving(&self, cost: u64, now: u64, reserve: f64) -> Result<Decision, TooLarge> {
        if cost as f64 > self.limit {
            return Err(TooLarge);
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.advance(&mut state, now);
        let estimate = self.estimate(&state, now) + reserve.max(0.0);
        let reset_after = Duration::from_nanos(state.start + self.window - now);
        if estimate + cost as f64 <= self.limit {
            state.current += cost as f64;
            return Ok(Decision {
                allowed: true,
                remaining: (self.limit - estimate - cost as f64).max(0.0) as u64,
                retry_after: Duration::ZERO,
                reset_after,
                delay: Duration::ZERO,
            });
        }
        Ok(Decision {
            allowed: false,
            remaining: (self.limit - estimate).max(0.0) as u64,
            retry_after: self.retry_after(&state, cost as f64, now),
            reset_after,
            delay: Duration::ZERO,
        })
    }

    /// When the estimate will have decayed enough for `cost` to pass (if nothing else does).
    fn retry_after(&self, state: &WindowState, cost: f64, now: u64) -> Duration {
        let window = self.window as f64;
        // Within this window, the previous window's weight decays.
        let room = self.limit - state.current - cost;
        if room >= 0.0 && state.previous > 0.0 {
            let at = state.start as f64 + window * (1.0 - room / state.previous);
            return Duration::from_nanos((at - now as f64).max(0.0) as u64);
        }
        // Else this window's count must decay in the next one.
        let next = (state.start + self.window) as f64;
        let at = if state.current > 0.0 {
            next + window * (1.0 - (self.limit - cost) / state.current).max(0.0)
        } else {
            next
        };
        Duration::from_nanos((at - now as f64).max(0.0) as u64)
    }

    pub fn charge(&self, cost: u64, at: u64, now: u64) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.advance(&mut state, now.max(at));
        if at >= state.start {
            state.current += cost as f64;
        } else if at + self.window >= state.start {
            state.previous += cost as f64;
        }
    }
}

/// The leaky bucket as a meter with a bounded queue: `clears_at` is when everything admitted
/// so far will have drained at `rate`. A request is admitted if the backlog, itself
/// included, stays within `capacity`; it should proceed after the backlog ahead of it drains.
#[derive(Debug)]
pub struct LeakyBucket {
    clears_at: AtomicU64,
    /// `clears_at` just after the peers' last charge: where this meter's own admissions since
    /// started from (see [`LeakyBucket::charge_peers`]).
    peers_charged: AtomicU64,
    /// Nanoseconds per cost unit.
    period: f64,
    capacity: u64,
}

impl LeakyBucket {
    pub fn new(rate: f64, capacity: u64, now: u64) -> LeakyBucket {
        LeakyBucket {
            clears_at: AtomicU64::new(now),
            peers_charged: AtomicU64::new(now),
            period: 1e9 / rate,
            capacity,
        }
    }

    pub fn check(&self, cost: u64, now: u64) -> Result<Decision, TooLarge> {
        if cost > self.capacity {
            return Err(TooLarge);
        }
        let bound = self.capacity as f64 * self.period;
        let work = cost as f64 * self.period;
        let mut clears_at = self.clears_at.load(Ordering::Acquire);
        loop {
            let start = clears_at.max(now);
            let finish = start as f64 + work;
            let backlog = finish - now as f64;
            if backlog > bound + 0.5 {
                let queued = (clears_at.saturating_sub(now)) as f64;
                return Ok(Decision {
                    allowed: false,
                    remaining: ((bound - queued) / self.period).max(0.0) as u64,
                    retry_after: Duration::from_nanos((backlog - bound) as u64),
                    reset_after: Duration::from_nanos(clears_at.saturating_sub(now)),
                    delay: Duration::ZERO,
                });
            }
            match self.clears_at.compare_exchange_weak(
                clears_at,
                finish as u64,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Ok(Decision {
                        allowed: true,
                        remaining: ((bound - backlog) / self.period).max(0.0) as u64,
                        retry_after: Duration::ZERO,
                        reset_after: Duration::from_nanos(finish as u64 - now),
                        delay: Duration::from_nanos(start - now),
                    })
                }
                Err(current) => clears_at = current,
            }
        }
    }

    pub fn charge(&self, cost: u64, at: u64) {
        let work = (cost as f64 * self.period) as u64;
        let _ = self
            .clears_at
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |clears_at| {
                Some(clears_at.max(at).saturating_add(work))
            });
    }

    /// Charges `cost` the peers admitted at `at` before the `here` this meter admitted itself
    /// since their last charge, as a token bucket's view does
    /// ([`FleetBucket::charge_peers`]): `clears_at` moves as a token bucket's `full_at` does
    /// (`max(state, now) + work`), so the same fold holds. Stacked on a backlog admitted here
    /// after `at`, the peers' charge lost the drain in between.
    pub fn charge_peers(&self, cost: u64, at: u64, here: u64, over_silence: bool) {
        if cost == 0 {
            return;
        }
        crate::fleet::charge_in_order(
            &self.clears_at,
            &self.peers_charged,
            (cost as f64 * self.period) as u64,
            at,
            (here as f64 * self.period) as u64,
            over_silence,
        );
    }

    /// When everything admitted so far will have drained (engine ns).
    pub fn clears_at(&self) -> u64 {
        self.clears_at.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;
    const SECOND: u64 = 1_000_000_000;

    impl crate::fleet::PeerOrdered for LeakyBucket {
        fn take(&self, cost: u64, now: u64) {
            assert!(self.check(cost, now).unwrap().allowed);
        }
        fn charge_peers(&self, cost: u64, at: u64, here: u64) {
            LeakyBucket::charge_peers(self, cost, at, here, false);
        }
        fn stack(&self, cost: u64, at: u64) {
            self.charge(cost, at);
        }
        fn state(&self) -> u64 {
            self.clears_at()
        }
    }

    fn spec(algorithm: Algorithm, rate: f64, burst: u64) -> LimitSpec {
        LimitSpec {
            algorithm,
            burst,
            ..LimitSpec::rate(rate)
        }
    }

    #[test]
    fn sliding_window_weights_the_previous_window() {
        let meter = Meter::new(&spec(Algorithm::SlidingWindow, 10.0, 0), 1.0, 0);
        for _ in 0..10 {
            assert!(meter.check(1, 500 * MS).unwrap().allowed);
        }
        let refused = meter.check(1, 900 * MS).unwrap();
        assert!(!refused.allowed);
        assert_eq!(refused.reset_after, Duration::from_millis(100));
        // 250 ms into the next window 75 % of the previous 10 still count: 2 more fit.
        assert!(meter.check(2, SECOND + 250 * MS).unwrap().allowed);
        let refused = meter.check(1, SECOND + 250 * MS).unwrap();
        assert!(!refused.allowed);
        // 7.5 + 2 = 9.5 counted: one more needs the previous window's weight to fall by
        // half a request, 50 ms.
        assert_eq!(refused.retry_after, Duration::from_millis(50));
        assert!(meter.check(1, SECOND + 300 * MS).unwrap().allowed);
        assert_eq!(meter.check(11, 5 * SECOND), Err(TooLarge));
    }

    #[test]
    fn leaky_bucket_delays_then_refuses_past_its_queue() {
        // 10/s, a queue of 5: five pass at once with growing delays, the sixth is refused.
        let meter = Meter::new(&spec(Algorithm::LeakyBucket, 10.0, 5), 1.0, 0);
        let delays: Vec<u64> = (0..5)
            .map(|_| meter.check(1, 0).unwrap())
            .map(|d| {
                assert!(d.allowed);
                d.delay.as_millis() as u64
            })
            .collect();
        assert_eq!(delays, [0, 100, 200, 300, 400]);
        let refused = meter.check(1, 0).unwrap();
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after, Duration::from_millis(100));
        assert!(meter.check(1, 100 * MS).unwrap().allowed);
    }

    #[test]
    fn charges_count_like_own_admissions() {
        for algorithm in [
            Algorithm::TokenBucket,
            Algorithm::SlidingWindow,
            Algorithm::LeakyBucket,
        ] {
            let meter = Meter::new(&spec(algorithm, 10.0, 10), 1.0, 0);
            meter.charge(10, 0, 10 * MS);
            assert!(
                !meter.check(1, 10 * MS).unwrap().allowed,
                "{algorithm:?}: a peer spent it all"
            );
        }
    }

    proptest! {
        /// Sliding window: per fixed window, never more than the limit.
        #[test]
        fn sliding_window_holds_each_fixed_window(
            steps in prop::collection::vec((0u64..300, 1u64..4), 1..300)
        ) {
            let meter = SlidingWindow::new(20.0, Duration::from_secs(1), 0);
            let mut now = 0;
            let mut per_window = std::collections::HashMap::<u64, u64>::new();
            for (gap_ms, cost) in steps {
                now += gap_ms * MS;
                if meter.check(cost, now).unwrap().allowed {
                    *per_window.entry(now / SECOND).or_default() += cost;
                }
            }
            prop_assert!(per_window.values().all(|admitted| *admitted <= 20));
        }

        /// Leaky bucket: admitted cost over [0, t] at most capacity + rate·t, and every delay
        /// within the queue bound.
        #[test]
        fn leaky_bucket_holds_its_bound(
            steps in prop::collection::vec((0u64..200, 1u64..5), 1..300)
        ) {
            let meter = LeakyBucket::new(50.0, 10, 0);
            let (mut now, mut admitted) = (0u64, 0u64);
            for (gap_ms, cost) in steps {
                now += gap_ms * MS;
                let decision = meter.check(cost, now).unwrap();
                if decision.allowed {
                    admitted += cost;
                    prop_assert!(decision.delay <= Duration::from_millis(200));
                }
                prop_assert!(admitted as f64 <= 10.0 + 50.0 * now as f64 / 1e9 + 1e-6);
            }
        }

        /// A leaky bucket puts the peers' charges before what it admitted itself since their
        /// last one, as a token bucket's view does (the same three claims, the same oracle: a
        /// fold of `max(clears_at, when) + work` over the events sorted by time).
        #[test]
        fn a_leaky_bucket_orders_the_peers_charges_before_its_own(
            events in prop::collection::vec((any::<bool>(), 1u64..400, 0u64..2_000, 0u64..3_000), 1..60),
        ) {
            // A unit is 1 ms to drain, and the queue never refuses: the arithmetic is exact.
            let meter = LeakyBucket::new(1000.0, u64::MAX / 2, 0);
            let stacked = LeakyBucket::new(1000.0, u64::MAX / 2, 0);
            crate::fleet::peer_charges_keep_their_order(&events, &meter, &stacked)?;
        }
    }
}

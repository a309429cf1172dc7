//! One replica's view of a tenant's **fleet-wide** token bucket, for `weighted`.
//!
//! Every replica keeps a view of the same bucket (rate L, capacity B). Its own admissions come
//! out of the view at once; the peers' admissions arrive over gossip as cumulative counts and
//! are charged when they arrive, back-dated to about when they happened. A charge is never
//! refused: the view may go below zero (debt), and admissions wait until the refill has paid
//! it back. So, whatever the balancer does, the fleet admits at most `B + L·t` over any span
//! `t`, plus what peers admitted but have not reported yet (one gossip delay's worth), and
//! that excess is paid back as soon as it is reported.
//!
//! The state is one atomic: the generic cell rate algorithm's "theoretical arrival time",
//! here `full_at`, the instant (nanoseconds on the engine clock) when the bucket would be full
//! again. The level at `now` is `burst − max(0, full_at − now) ÷ period`; a level below zero
//! is debt.
//!
//! governor (used for `divided`) implements the same algorithm, but it cannot charge tokens
//! spent elsewhere without checking them, read the level, or hold debt; those three are what
//! a fleet view needs, so this one is written out here (about forty lines), with property
//! tests beside it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::types::{Outcome, Rate};

/// A lock-free view of a fleet-wide bucket. Time is passed in (nanoseconds on the engine's
/// clock), so the maths is tested without sleeping.
#[derive(Debug)]
pub struct FleetBucket {
    full_at: AtomicU64,
    /// `full_at` just after the peers' last charge or refund: where this view's own
    /// admissions since started from (see [`FleetBucket::charge_peers`]).
    peers_charged: AtomicU64,
    /// Nanoseconds per token.
    period: f64,
    rate: Rate,
}

impl FleetBucket {
    /// A bucket holding `level` tokens at `now` (capped at the burst; negative is debt).
    pub fn with_level(rate: Rate, level: f64, now: u64) -> Self {
        let bucket = FleetBucket {
            full_at: AtomicU64::new(0),
            peers_charged: AtomicU64::new(0),
            period: 1e9 / rate.per_second,
            rate,
        };
        let full_at = bucket.full_at_for(level, now);
        bucket.full_at.store(full_at, Ordering::Relaxed);
        bucket.peers_charged.store(full_at, Ordering::Relaxed);
        bucket
    }

    /// A full bucket.
    pub fn full(rate: Rate, now: u64) -> Self {
        FleetBucket::with_level(rate, f64::INFINITY, now)
    }

    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// When the bucket is full again (nanoseconds on the engine clock): its whole state.
    pub fn full_at(&self) -> u64 {
        self.full_at.load(Ordering::Acquire)
    }

    fn full_at_for(&self, level: f64, now: u64) -> u64 {
        let missing = (self.rate.burst as f64 - level.min(self.rate.burst as f64)).max(0.0);
        now.saturating_add(nanos(missing * self.period))
    }

    /// Tokens in the bucket at `now`: at most the burst, below zero in debt.
    pub fn level(&self, now: u64) -> f64 {
        let full_at = self.full_at.load(Ordering::Acquire);
        self.rate.burst as f64 - full_at.saturating_sub(now) as f64 / self.period
    }

    /// The level at `now` of this bucket were it full at `full_at` (see
    /// [`FleetBucket::level`]), and how long from `now` until it is full: the time its
    /// missing tokens take to arrive, read off the state without dividing.
    pub fn level_and_full_in_at(&self, full_at: u64, now: u64) -> (f64, Duration) {
        let ahead = full_at.saturating_sub(now);
        (
            self.rate.burst as f64 - ahead as f64 / self.period,
            Duration::from_nanos(ahead),
        )
    }

    /// Takes `cost` tokens if the bucket holds them at `now`.
    pub fn check(&self, cost: u64, now: u64) -> Outcome {
        self.check_leaving(cost, 0.0, now)
    }

    /// Takes `cost` tokens if the bucket holds them at `now` with `reserve` tokens to spare
    /// (what the peers have likely spent but not reported yet).
    pub fn check_leaving(&self, cost: u64, reserve: f64, now: u64) -> Outcome {
        match self.reserve_within(cost, reserve, 0, now) {
            Ok(_) => Outcome::Allowed,
            Err(outcome) => outcome,
        }
    }

    /// As [`FleetBucket::check_leaving`], and also takes `cost` tokens that will be there
    /// within `max_delay` nanoseconds: a reservation. Returns how long the caller must wait
    /// before the tokens it took are there (zero if they are now); refuses, with the wait,
    /// what would take longer. Reservations queue in order of arrival, and the bucket is
    /// never promised more than `max_delay` of refill ahead.
    pub fn reserve_within(
        &self,
        cost: u64,
        reserve: f64,
        max_delay: u64,
        now: u64,
    ) -> Result<Duration, Outcome> {
        let tolerance = (self.rate.burst as f64 - reserve.max(0.0)) * self.period;
        let mut full_at = self.full_at.load(Ordering::Acquire);
        loop {
            let (next, ahead) = self.take(full_at, cost, tolerance, max_delay, now)?;
            match self.full_at.compare_exchange_weak(
                full_at,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                // The common case, tokens there now, needs no rounding.
                Ok(_) if ahead <= tolerance => return Ok(Duration::ZERO),
                Ok(_) => return Ok(Duration::from_nanos(nanos(ahead - tolerance))),
                Err(current) => full_at = current,
            }
        }
    }

    /// Where taking `cost` tokens at `now` moves a bucket full at `full_at`, and how far ahead
    /// of `now` that is; the refusal if it is further than `tolerance` (the burst's worth,
    /// less what is kept in reserve) and `max_delay`, or if the cost is more than a burst.
    fn take(
        &self,
        full_at: u64,
        cost: u64,
        tolerance: f64,
        max_delay: u64,
        now: u64,
    ) -> Result<(u64, f64), Outcome> {
        if cost > self.rate.burst {
            return Err(Outcome::TooLarge);
        }
        let next = full_at
            .max(now)
            .saturating_add(nanos(cost as f64 * self.period));
        let ahead = (next - now) as f64;
        if ahead > tolerance + max_delay as f64 + 0.5 {
            let level = self.rate.burst as f64 - full_at.saturating_sub(now) as f64 / self.period;
            return Err(Outcome::Denied {
                wait: Duration::from_nanos(nanos(ahead - tolerance)),
                available: level.max(0.0).floor() as u64,
            });
        }
        Ok((next, ahead))
    }

    /// Decides `costs` in order at `now`, each as [`FleetBucket::check`] would, one after
    /// another with nothing between them: the state is read once and written once, where a
    /// check a cost writes it a cost (a line the other cores deciding the key write too).
    /// `decided` gets, for each cost, `answer` of its outcome and of when the bucket is full
    /// after it.
    pub fn check_run<T>(
        &self,
        costs: impl Iterator<Item = u64> + Clone,
        now: u64,
        decided: &mut Vec<T>,
        answer: impl Fn(Outcome, u64) -> T,
    ) {
        let tolerance = self.rate.burst as f64 * self.period;
        let before = decided.len();
        let mut start = self.full_at.load(Ordering::Acquire);
        loop {
            decided.truncate(before);
            let mut full_at = start;
            for cost in costs.clone() {
                let outcome = match self.take(full_at, cost, tolerance, 0, now) {
                    Ok((next, _)) => {
                        full_at = next;
                        Outcome::Allowed
                    }
                    Err(refused) => refused,
                };
                decided.push(answer(outcome, full_at));
            }
            if full_at == start {
                // Nothing taken: the run saw one state, and leaves it as it was.
                return;
            }
            match self
                .full_at
                .compare_exchange(start, full_at, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                // Another core decided in between: the run is decided again on its state.
                Err(current) => start = current,
            }
        }
    }

    /// How long until the bucket holds `cost` tokens, from `now` (zero if it does now).
    pub fn wait(&self, cost: u64, now: u64) -> Duration {
        let missing = cost as f64 - self.level(now);
        Duration::from_nanos(nanos(missing.max(0.0) * self.period))
    }

    /// Charges `cost` tokens spent elsewhere at `at` (which may be in the past): no check,
    /// the level may go below zero. The refill between `at` and now still counts, so a
    /// late report of an admission costs what the admission cost when it happened.
    pub fn charge(&self, cost: u64, at: u64) {
        if cost == 0 {
            return;
        }
        let charge = nanos(cost as f64 * self.period);
        let _ = self
            .full_at
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |full_at| {
                Some(full_at.max(at).saturating_add(charge))
            });
    }

    /// Charges `cost` tokens the peers spent at `at`, as [`FleetBucket::charge`] does, but in
    /// their place in time: before the `here` tokens (admissions, less refunds) this view
    /// took itself since the peers' last charge, when those came later.
    ///
    /// The state is one instant, so a charge lands after whatever moved it: charged at `at`
    /// onto a state this view's own admissions have pushed past `at`, it stacks on them, and
    /// the refill between `at` and those admissions, which their order would have used, is
    /// lost. A replica stopped for 8 s, its view full, admitted the backlog of pushes its
    /// sockets held on resume, and then heard of its peers' 8 s of admissions: charged after
    /// the backlog, they put the view in a debt of 4.8 s of the limit, and the replica
    /// refused the tenant, at 0.9 L, for 8 s.
    ///
    /// Taking `c` at `t` moves the state `F` to `max(F, t) + c`. Folded over a run of
    /// takes in time order from `F₀`, that is the largest of `F₀ + Σc` and each take's
    /// `tₖ + (its cost and all after it)`. With the peers' charge put first among this view's
    /// takes since their last one (`F₀` = the state just after that one, `X` = those takes):
    /// `max(F, max(F₀, at) + c + X)`, where `F` is the state now. That is exact when `at`
    /// comes before those takes, and never less than the true order otherwise (each term of
    /// the true fold is at most one of it); so is `max(F, at) + c`, the old charge. The view
    /// takes the smaller: never less than the fleet spent, and no more than before.
    ///
    /// `over_silence`: the charge is what the peers admitted while this replica did not hear
    /// from them, dated from when that began, and every take here since the peers' last
    /// charge came after it. The next such charge is put before those takes too, so the mark
    /// they start from moves by the charge alone: a resumed replica that admitted its backlog
    /// between two peers' first reports had the second stacked on it otherwise.
    pub fn charge_peers(&self, cost: u64, at: u64, here: u64, over_silence: bool) {
        if cost == 0 {
            return;
        }
        charge_in_order(
            &self.full_at,
            &self.peers_charged,
            nanos(cost as f64 * self.period),
            at,
            nanos(here as f64 * self.period),
            over_silence,
        );
    }

    /// Credits `cost` tokens the peers took and gave back ([`FleetBucket::refund`]), and
    /// marks where this view's own admissions start from, as [`FleetBucket::charge_peers`].
    pub fn refund_peers(&self, cost: u64, over_silence: bool) {
        let charge = nanos(cost as f64 * self.period);
        let refunded = self
            .full_at
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |full_at| {
                Some(full_at.saturating_sub(charge))
            })
            .map_or(0, |full_at| full_at.saturating_sub(charge));
        let mark = match over_silence {
            true => self
                .peers_charged
                .load(Ordering::Acquire)
                .saturating_sub(charge),
            false => refunded,
        };
        self.peers_charged.store(mark, Ordering::Release);
    }

    /// Gives back `cost` tokens taken by [`FleetBucket::check`] for a request that was then
    /// refused by another check, so it costs nothing.
    pub fn refund(&self, cost: u64) {
        let charge = nanos(cost as f64 * self.period);
        let _ = self
            .full_at
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |full_at| {
                Some(full_at.saturating_sub(charge))
            });
    }

    /// This bucket's tokens (or debt) in a bucket of another shape: capped at the new burst,
    /// refilling at the new rate from `now`.
    pub fn reshaped(&self, rate: Rate, now: u64) -> FleetBucket {
        FleetBucket::with_level(rate, self.level(now), now)
    }
}

/// The peers' `charge` (ns of the state) at `at`, put before the `here` (ns) this state took
/// itself since their last charge, which left it at `mark`: the smaller of stacking it on the
/// state and the in-order fold ([`FleetBucket::charge_peers`] has the argument). The state
/// and the mark are a max-plus clock each: a token bucket's `full_at`, a leaky bucket's
/// `clears_at`.
pub(crate) fn charge_in_order(
    state: &AtomicU64,
    mark: &AtomicU64,
    charge: u64,
    at: u64,
    here: u64,
    over_silence: bool,
) {
    let from = mark.load(Ordering::Acquire);
    if over_silence {
        mark.store(from.max(at).saturating_add(charge), Ordering::Release);
    }
    let mut charged = 0;
    let _ = state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |now_at| {
        let stacked = now_at.max(at).saturating_add(charge);
        let in_order = now_at.max(from.max(at).saturating_add(charge).saturating_add(here));
        charged = stacked.min(in_order);
        Some(charged)
    });
    if !over_silence {
        mark.store(charged, Ordering::Release);
    }
}

fn nanos(value: f64) -> u64 {
    value.round().clamp(0.0, u64::MAX as f64) as u64
}

/// A max-plus clock the peers' charges are put in order on ([`charge_in_order`]): a token
/// bucket's view, a leaky bucket. Its state moves by `max(state, when) + cost` ms.
#[cfg(test)]
pub(crate) trait PeerOrdered {
    /// This replica's own admission of `cost` at `now`.
    fn take(&self, cost: u64, now: u64);
    /// The peers' `cost` at `at`, put before the `here` taken since their last charge.
    fn charge_peers(&self, cost: u64, at: u64, here: u64);
    /// The peers' `cost` at `at`, stacked on the state as it is (the old charge).
    fn stack(&self, cost: u64, at: u64);
    fn state(&self) -> u64;
}

#[cfg(test)]
impl PeerOrdered for FleetBucket {
    fn take(&self, cost: u64, now: u64) {
        self.charge(cost, now);
    }
    fn charge_peers(&self, cost: u64, at: u64, here: u64) {
        FleetBucket::charge_peers(self, cost, at, here, false);
    }
    fn stack(&self, cost: u64, at: u64) {
        self.charge(cost, at);
    }
    fn state(&self) -> u64 {
        self.full_at()
    }
}

/// The peers' charges, put in their place in time before `view`'s own takes: never less
/// than taking everything in the order it happened (so the view never under-charges what the
/// fleet spent), never more than stacking each charge on the state as it arrives (`stacked`),
/// and exactly the order it happened when each charge came before the takes since the last.
/// `events`: (a peers' charge?, cost in ms, gap in ms, how far back the charge is dated in
/// ms). Both clocks start equal, at a state the oracle reads from `stacked`.
#[cfg(test)]
pub(crate) fn peer_charges_keep_their_order(
    events: &[(bool, u64, u64, u64)],
    view: &impl PeerOrdered,
    stacked: &impl PeerOrdered,
) -> Result<(), proptest::test_runner::TestCaseError> {
    use proptest::{prop_assert, prop_assert_eq};
    const MS: u64 = 1_000_000;
    let start = stacked.state();
    // Everything taken, as (happened at, cost), to fold in the order it happened.
    let mut happened: Vec<(u64, u64)> = Vec::new();
    let (mut now, mut here, mut run) = (1_000 * MS, 0, 0);
    let mut exact = true;
    let truth = |happened: &[(u64, u64)]| {
        let mut ordered = happened.to_vec();
        ordered.sort_by_key(|&(when, _)| when);
        ordered
            .iter()
            .fold(start, |state, &(when, cost)| state.max(when) + cost * MS)
    };
    for &(peers, cost, gap_ms, back_ms) in events {
        now += gap_ms * MS;
        if peers {
            let at = now.saturating_sub(back_ms * MS);
            // Exact when the charge comes after all before the takes since the last one, and
            // before those takes (and the state was exact before it).
            let (before, since) = happened.split_at(happened.len() - run);
            exact &= before.iter().all(|&(when, _)| when <= at)
                && since.iter().all(|&(when, _)| when >= at);
            view.charge_peers(cost, at, here);
            stacked.stack(cost, at);
            happened.push((at, cost));
            (here, run) = (0, 0);
            if exact {
                prop_assert_eq!(view.state(), truth(&happened));
            }
        } else {
            view.take(cost, now);
            stacked.take(cost, now);
            happened.push((now, cost));
            here += cost;
            run += 1;
        }
        let truth = truth(&happened);
        prop_assert!(view.state() >= truth, "{} < {truth}", view.state());
        prop_assert!(view.state() <= stacked.state());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECOND: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    fn rate(per_second: f64, burst: u64) -> Rate {
        Rate { per_second, burst }
    }

    #[test]
    fn burst_then_rate() {
        let bucket = FleetBucket::full(rate(10.0, 3), 0);
        for _ in 0..3 {
            assert_eq!(bucket.check(1, 0), Outcome::Allowed);
        }
        assert_eq!(
            bucket.check(1, 0),
            Outcome::Denied {
                wait: Duration::from_millis(100),
                available: 0
            }
        );
        assert_eq!(bucket.check(1, 100 * MS), Outcome::Allowed);
        assert_eq!(bucket.level(100 * MS), 0.0);
        // Never fuller than the burst.
        assert_eq!(bucket.level(100 * SECOND), 3.0);
        assert_eq!(bucket.check(4, 100 * SECOND), Outcome::TooLarge);
    }

    #[test]
    fn a_refusal_reports_the_tokens_really_there() {
        let bucket = FleetBucket::full(rate(1000.0, 1000), 0);
        assert_eq!(bucket.check(600, 0), Outcome::Allowed);
        assert_eq!(
            bucket.check(500, 0),
            Outcome::Denied {
                wait: Duration::from_millis(100),
                available: 400
            }
        );
    }

    #[test]
    fn charges_make_debt_that_admissions_wait_out() {
        let bucket = FleetBucket::full(rate(100.0, 100), 0);
        bucket.charge(300, 0); // peers spent three bursts
        assert_eq!(bucket.level(0), -200.0);
        assert!(matches!(bucket.check(1, SECOND), Outcome::Denied { .. }));
        assert_eq!(bucket.level(2 * SECOND), 0.0);
        assert_eq!(bucket.check(1, 2 * SECOND + 10 * MS), Outcome::Allowed);
    }

    #[test]
    fn a_late_charge_counts_the_refill_since_it_happened() {
        // Full at 0; a peer spent 100 at 0; heard of at 1 s. The refill between counts.
        let bucket = FleetBucket::full(rate(100.0, 100), 0);
        bucket.charge(100, 0);
        assert_eq!(bucket.level(SECOND), 100.0);
        // The same charge applied as if it happened now is the cautious reading.
        let late = FleetBucket::full(rate(100.0, 100), 0);
        late.charge(100, SECOND);
        assert_eq!(late.level(SECOND), 0.0);
    }

    #[test]
    fn refund_gives_tokens_back() {
        let bucket = FleetBucket::full(rate(10.0, 10), 0);
        assert_eq!(bucket.check(10, 0), Outcome::Allowed);
        bucket.refund(4);
        assert_eq!(bucket.level(0), 4.0);
    }

    #[test]
    fn reshaping_keeps_tokens_and_debt_not_a_fresh_burst() {
        let bucket = FleetBucket::full(rate(10.0, 10), 0);
        assert_eq!(bucket.check(10, 0), Outcome::Allowed);
        let bigger = bucket.reshaped(rate(100.0, 200), 0);
        assert_eq!(bigger.level(0), 0.0);
        assert_eq!(bigger.level(SECOND), 100.0);
        let indebted = FleetBucket::with_level(rate(10.0, 10), -5.0, 0);
        assert_eq!(indebted.reshaped(rate(20.0, 5), 0).level(0), -5.0);
        assert_eq!(
            bucket
                .reshaped(rate(10.0, 2), 10 * SECOND)
                .level(10 * SECOND),
            2.0
        );
    }

    proptest! {
        /// The sum bound. Replicas admit against their own views; each replica's admissions
        /// reach the others after a delay. Over any span t the fleet admits at most B + L·t
        /// plus the most that was ever admitted but not yet reported (one delay's worth): the
        /// excess is bounded by what can be in flight, never by the time elapsed.
        #[test]
        fn fleet_admits_at_most_one_burst_plus_the_rate_plus_what_is_unreported(
            replicas in 2usize..6,
            events in prop::collection::vec((0usize..6, 1u64..300, 0u64..50), 1..300),
            delay_ms in 0u64..400,
        ) {
            let limit = rate(1000.0, 1000);
            let views: Vec<FleetBucket> = (0..replicas).map(|_| FleetBucket::full(limit, 0)).collect();
            // (delivered at, to, cost, happened at)
            let mut in_flight: Vec<(u64, usize, u64, u64)> = Vec::new();
            let mut now = 0;
            let mut admitted = 0u64;
            let mut peak_unreported = 0u64;
            for (who, cost, gap_ms) in events {
                now += gap_ms * MS;
                let who = who % replicas;
                in_flight.retain(|&(at, to, cost, happened)| {
                    if at <= now { views[to].charge(cost, happened); false } else { true }
                });
                if views[who].check(cost, now) == Outcome::Allowed {
                    admitted += cost;
                    for to in (0..replicas).filter(|&to| to != who) {
                        in_flight.push((now + delay_ms * MS, to, cost, now));
                    }
                }
                // What the admitting replica had not heard of when it admitted.
                let unreported: u64 = in_flight.iter().filter(|f| f.1 == who).map(|f| f.2).sum();
                peak_unreported = peak_unreported.max(unreported);
                let bound = limit.burst as f64 + limit.per_second * now as f64 / 1e9;
                prop_assert!(
                    admitted as f64 <= bound + peak_unreported as f64 + 1.0,
                    "admitted {admitted} > {bound} + {peak_unreported} unreported"
                );
            }
            // Once everything is reported, the excess is debt: no view holds more than the
            // bucket would after the admissions.
            for (_, to, cost, happened) in in_flight.drain(..) { views[to].charge(cost, happened); }
            let excess = admitted as f64 - (limit.burst as f64 + limit.per_second * now as f64 / 1e9);
            if excess > 0.0 {
                for view in &views { prop_assert!(view.level(now) <= 1.0); }
            }
        }

        /// The peers' charges, put in their place in time before this view's own takes:
        /// never less than taking everything in the order it happened (so the view never
        /// under-charges what the fleet spent), never more than stacking each charge on the
        /// state as it arrives (the old charge), and exactly the order it happened when each
        /// charge came before the takes since the last.
        #[test]
        fn peer_charges_are_ordered_before_later_takes_here(
            events in prop::collection::vec((any::<bool>(), 1u64..400, 0u64..2_000, 0u64..3_000), 1..60),
        ) {
            let limit = rate(1000.0, 1000); // a token is 1 ms: the arithmetic is exact
            let (view, stacked) = (FleetBucket::full(limit, 0), FleetBucket::full(limit, 0));
            peer_charges_keep_their_order(&events, &view, &stacked)?;
        }

        /// After a silence, every report is dated from when it began, before all the view
        /// took since its last charge before it (`over_silence`): however the reports and the
        /// takes interleave on arrival, the view ends where the true order leaves it, the
        /// peers' admissions first.
        #[test]
        fn charges_over_a_silence_all_go_before_the_takes_since(
            start_level in -500i64..1000,
            silence_ms in 0u64..10_000,
            events in prop::collection::vec((any::<bool>(), 1u64..400, 0u64..300), 1..40),
        ) {
            let limit = rate(1000.0, 1000); // a token is 1 ms: the arithmetic is exact
            let view = FleetBucket::with_level(limit, start_level as f64, 0);
            let began = 0;
            let mut now = silence_ms * MS;
            let (mut peers, mut takes) = (0u64, Vec::new());
            let mut here = 0;
            for (from_peers, cost, gap_ms) in events {
                now += gap_ms * MS;
                if from_peers {
                    view.charge_peers(cost, began, here, true);
                    peers += cost;
                } else {
                    view.charge(cost, now);
                    takes.push((now, cost));
                    here += cost;
                }
            }
            let after_peers = FleetBucket::with_level(limit, start_level as f64, 0).full_at().max(began)
                + peers * MS;
            let truth = takes
                .iter()
                .fold(after_peers, |full_at, &(when, cost)| full_at.max(when) + cost * MS);
            prop_assert_eq!(view.full_at(), truth);
        }

        /// Alone, a view is an exact token bucket: whatever the order of checks, it admits at
        /// most B + L·t over t.
        #[test]
        fn one_view_is_an_exact_bucket(
            checks in prop::collection::vec((1u64..500, 0u64..100), 1..400),
        ) {
            let limit = rate(2000.0, 1000);
            let bucket = FleetBucket::full(limit, 0);
            let (mut now, mut admitted) = (0u64, 0u64);
            for (cost, gap_ms) in checks {
                now += gap_ms * MS;
                match bucket.check(cost, now) {
                    Outcome::Allowed => admitted += cost,
                    Outcome::Denied { available, .. } => prop_assert!(available < cost),
                    Outcome::TooLarge => unreachable!(),
                }
                prop_assert!(admitted as f64 <= 1000.0 + 2000.0 * now as f64 / 1e9 + 1e-6);
                prop_assert!(bucket.level(now) >= -1e-6);
            }
        }

        /// A run decides each cost as a check would, one after another: the same outcomes,
        /// and the bucket left in the same state, from any level (debt included).
        #[test]
        fn a_run_decides_as_checks_one_after_another(
            level in -50.0f64..100.0,
            costs in prop::collection::vec(0u64..40, 1..60),
            now_ms in 0u64..2000,
        ) {
            let limit = rate(40.0, 30);
            let (run, one_by_one) = (
                FleetBucket::with_level(limit, level, 0),
                FleetBucket::with_level(limit, level, 0),
            );
            let now = now_ms * MS;
            let mut decided = Vec::new();
            run.check_run(costs.iter().copied(), now, &mut decided, |outcome, full_at| (outcome, full_at));
            prop_assert_eq!(decided.len(), costs.len());
            for (&cost, &(outcome, full_at)) in costs.iter().zip(&decided) {
                prop_assert_eq!(outcome, one_by_one.check(cost, now));
                prop_assert_eq!(full_at, one_by_one.full_at());
            }
            prop_assert_eq!(run.full_at(), one_by_one.full_at());
        }
    }

    /// Runs on several threads at once, the clock standing still: each token is taken once,
    /// whoever's run loses a race is decided again on the winner's state, and every token
    /// there is taken.
    #[test]
    fn runs_racing_on_one_bucket_take_each_token_once() {
        let bucket = std::sync::Arc::new(FleetBucket::full(rate(1.0, 10_000), 0));
        let allowed: u64 = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let bucket = &bucket;
                    scope.spawn(move || {
                        let mut allowed = 0;
                        let mut decided = Vec::new();
                        for _ in 0..200 {
                            decided.clear();
                            bucket.check_run(
                                std::iter::repeat_n(1, 20),
                                SECOND,
                                &mut decided,
                                |outcome, _| outcome,
                            );
                            allowed += decided
                                .iter()
                                .filter(|outcome| **outcome == Outcome::Allowed)
                                .count() as u64;
                        }
                        allowed
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|thread| thread.join().unwrap())
                .sum()
        });
        // 16 000 asked of a full bucket of 10 000.
        assert_eq!(allowed, 10_000);
        assert!(bucket.level(SECOND) < 1.0);
    }
}

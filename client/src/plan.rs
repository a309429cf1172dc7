//! When to roll a key's lease and for how much: pure functions of the key's demand, its
//! tokens and the clock (nanoseconds), kept apart from the task that makes the calls.
//!
//! The lease is sized by demand: `target` = the recent rate × the lease window. A roll asks
//! for what tops the budget up to `target`, and gives back what is above twice `target`
//! (demand fell). A key rolls when its budget is below half the target, when a decision
//! found it short, when half the lease's TTL has passed, and at least every sync interval
//! (reporting spend and learning the limit in force). A key the fleet could not fully serve
//! (over its limit) waits before asking again, so the calls per decision stay small.

use std::time::Duration;

/// The knobs, in nanoseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub(crate) lease_window: u64,
    pub(crate) sync_interval: u64,
    /// The least time between two rolls of a key the fleet could not fully serve.
    pub(crate) starved_interval: u64,
    /// The least time between two rolls of any key.
    pub(crate) min_interval: u64,
    pub(crate) ttl: u64,
    /// A key without demand for this long gives its tokens back and goes cold.
    pub(crate) idle: u64,
    /// A cold key not asked for this long is dropped (see `Budget::forgettable`).
    pub(crate) forget: u64,
    /// After a failed call, the key waits this long.
    pub(crate) retry: u64,
}

impl Settings {
    pub(crate) fn new(
        lease_window: Duration,
        sync_interval: Duration,
        ttl: Duration,
        forget: Duration,
    ) -> Self {
        let nanos = |duration: Duration| duration.as_nanos() as u64;
        Settings {
            lease_window: nanos(lease_window),
            sync_interval: nanos(sync_interval),
            starved_interval: nanos(Duration::from_millis(100)),
            min_interval: nanos(Duration::from_millis(5)),
            ttl: nanos(ttl),
            idle: nanos(Duration::from_secs(30)),
            forget: nanos(forget),
            retry: nanos(Duration::from_millis(50)),
        }
    }
}

/// One roll: tokens wanted beyond the budget, and tokens given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Roll {
    pub(crate) want: u64,
    pub(crate) give_back: u64,
    /// The key has been idle: give everything back and go cold.
    pub(crate) retire: bool,
}

/// The task's memory of a key's lease.
#[derive(Debug, Clone)]
pub(crate) struct RollState {
    /// The lease on the fleet (empty before the first grant).
    pub(crate) lease_id: String,
    /// What the fleet holds the lease to be, as of the last roll's report.
    pub(crate) outstanding: u64,
    pub(crate) last_roll: u64,
    pub(crate) next_after: u64,
    /// Demand, cost per second, smoothed.
    pub(crate) rate: f64,
    sample_at: u64,
    sample_demand: u64,
    /// The demand counter at the last roll (for idleness).
    demand_at_roll: u64,
    last_demand_change: u64,
}

/// Rate samples shorter than this are noise.
const SAMPLE: u64 = 100_000_000;

impl RollState {
    pub(crate) fn new(now: u64) -> RollState {
        RollState {
            lease_id: String::new(),
            outstanding: 0,
            last_roll: now,
            next_after: 0,
            rate: 0.0,
            sample_at: now,
            sample_demand: 0,
            demand_at_roll: 0,
            last_demand_change: now,
        }
    }

    /// Takes in the key's demand counter: a new rate sample every 100 ms, smoothed by half.
    pub(crate) fn observe(&mut self, demand: u64, now: u64) {
        if demand != self.demand_at_roll {
            self.demand_at_roll = demand;
            self.last_demand_change = now;
        }
        let elapsed = now.saturating_sub(self.sample_at);
        if elapsed < SAMPLE {
            return;
        }
        let rate = (demand - self.sample_demand) as f64 * 1e9 / elapsed as f64;
        self.rate = if self.sample_demand == 0 && self.rate == 0.0 {
            rate
        } else {
            0.5 * rate + 0.5 * self.rate
        };
        self.sample_at = now;
        self.sample_demand = demand;
    }

    /// The budget to hold: the recent rate over one lease window, at least 1, at most the
    /// burst when it is known.
    pub(crate) fn target(&self, settings: &Settings, burst: u64) -> u64 {
        let target = (self.rate * settings.lease_window as f64 / 1e9)
            .ceil()
            .max(1.0) as u64;
        if burst > 0 {
            target.min(burst)
        } else {
            target
        }
    }

    /// The roll due now, if any.
    pub(crate) fn plan(
        &self,
        tokens: u64,
        valid_until: u64,
        wanted: bool,
        burst: u64,
        now: u64,
        settings: &Settings,
    ) -> Option<Roll> {
        if now < self.next_after {
            return None;
        }
        if valid_until == 0 {
            // Cold: the first lease. The fleet caps the ask at what the limit allows at once;
            // what demand does not need goes back at the next rolls.
            return wanted.then_some(Roll {
                want: u64::MAX >> 2,
                give_back: 0,
                retire: false,
            });
        }
        if now.saturating_sub(self.last_demand_change) >= settings.idle {
            return Some(Roll {
                want: 0,
                give_back: u64::MAX,
                retire: true,
            });
        }
        let target = self.target(settings, burst);
        let lapsing = valid_until.saturating_sub(now) < settings.ttl / 2;
        let due = wanted
            || tokens < target.div_ceil(2)
            || lapsing
            || now.saturating_sub(self.last_roll) >= settings.sync_interval;
        due.then(|| Roll {
            want: target.saturating_sub(tokens),
            give_back: tokens.saturating_sub(2 * target),
            retire: false,
        })
    }

    /// After an answer: a key the fleet could not fully serve waits before asking again,
    /// but no longer than half the time its limit takes to refill the burst (`fill`): the
    /// fleet's bucket must not fill and overflow between two asks, or the key gets less
    /// than its limit.
    pub(crate) fn answered(
        &mut self,
        lease_id: String,
        outstanding: u64,
        starved: bool,
        fill: Duration,
        now: u64,
        settings: &Settings,
    ) {
        self.lease_id = lease_id;
        self.outstanding = outstanding;
        self.last_roll = now;
        self.next_after = now
            + if starved {
                settings
                    .starved_interval
                    .min(fill.as_nanos() as u64 / 2)
                    .max(settings.min_interval)
            } else {
                settings.min_interval
            };
    }

    pub(crate) fn failed(&mut self, now: u64, settings: &Settings) {
        self.next_after = now + settings.retry;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn settings() -> Settings {
        Settings::new(
            Duration::from_millis(500),
            Duration::from_secs(1),
            Duration::from_secs(5),
            Duration::from_secs(300),
        )
    }

    #[test]
    fn the_target_follows_demand_and_the_burst() {
        let settings = settings();
        let mut state = RollState::new(0);
        state.observe(0, 0);
        state.observe(100, 100 * MS); // 1 000 a second
        assert_eq!(state.target(&settings, 0), 500);
        assert_eq!(state.target(&settings, 300), 300);
        state.observe(100, 200 * MS); // nothing for 100 ms: half of it
        assert_eq!(state.target(&settings, 0), 250);
    }

    #[test]
    fn cold_keys_roll_only_when_asked_for() {
        let state = RollState::new(0);
        assert_eq!(state.plan(0, 0, false, 0, MS, &settings()), None);
        let first = state.plan(0, 0, true, 0, MS, &settings()).unwrap();
        assert!(first.want > 1 << 40 && first.give_back == 0);
    }

    #[test]
    fn rolls_when_low_lapsing_or_due_and_gives_back_the_excess() {
        let settings = settings();
        let mut state = RollState::new(0);
        state.observe(0, 0);
        state.observe(100, 100 * MS); // target 500
        let valid = 5_000 * MS;
        state.answered("T1".into(), 400, false, Duration::ZERO, 100 * MS, &settings);
        assert_eq!(state.plan(400, valid, false, 0, 200 * MS, &settings), None);
        let low = state
            .plan(200, valid, false, 0, 200 * MS, &settings)
            .unwrap();
        assert_eq!((low.want, low.give_back), (300, 0));
        let asked = state
            .plan(400, valid, true, 0, 200 * MS, &settings)
            .unwrap();
        assert_eq!(asked.want, 100);
        let sync = state.plan(400, valid, false, 0, 1_100 * MS, &settings);
        assert!(sync.is_some(), "the sync interval");
        let lapsing = state.plan(400, valid, false, 0, 2_600 * MS, &settings);
        assert!(lapsing.is_some());
        let excess = state
            .plan(1_200, valid, true, 0, 200 * MS, &settings)
            .unwrap();
        assert_eq!((excess.want, excess.give_back), (0, 200));
    }

    #[test]
    fn a_starved_key_waits_and_an_idle_one_retires() {
        let settings = settings();
        let mut state = RollState::new(0);
        state.observe(5, 0);
        state.answered("T1".into(), 0, true, Duration::from_secs(2), 0, &settings);
        assert_eq!(state.next_after, 100 * MS, "the starved interval at most");
        state.answered(
            "T1".into(),
            0,
            true,
            Duration::from_millis(60),
            0,
            &settings,
        );
        assert_eq!(state.next_after, 30 * MS, "before the fleet's burst fills");
        state.answered("T1".into(), 0, true, Duration::ZERO, 0, &settings);
        assert_eq!(state.next_after, 5 * MS, "the least interval");
        state.answered("T1".into(), 0, true, Duration::from_secs(1), 0, &settings);
        assert_eq!(state.plan(0, u64::MAX, true, 0, 99 * MS, &settings), None);
        let idle = state
            .plan(3, u64::MAX, false, 0, 30_000 * MS, &settings)
            .unwrap();
        assert!(idle.retire && idle.give_back == u64::MAX);
    }
}

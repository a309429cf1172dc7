//! A circuit breaker for the shared store: a small state machine with time as an input, so
//! every transition is tested without sleeping.
//!
//! - **Closed**: calls go through. It opens after `consecutive_failures` failures in a row, or
//!   when at least `min_calls` calls in the last `window` failed at `failure_ratio` or more.
//! - **Open**: nothing waits on the store until `open_for` has passed.
//! - **Half-open**: one call at a time probes; a success closes the breaker, a failure opens
//!   it again for twice as long (up to `max_open_for`).
//!
//! The lock is a `std::sync::Mutex`, not a Tokio one: it is held for a few comparisons and
//! never across an `.await`.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerConfig {
    pub consecutive_failures: u32,
    pub failure_ratio: f64,
    pub min_calls: u32,
    pub window: Duration,
    pub open_for: Duration,
    pub max_open_for: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            consecutive_failures: 5,
            failure_ratio: 0.5,
            min_calls: 20,
            window: Duration::from_secs(10),
            open_for: Duration::from_millis(500),
            // Probing at least once a second keeps recovery within about a second of the
            // store's return; one probe a second per replica costs the store nothing.
            max_open_for: Duration::from_secs(1),
        }
    }
}

/// The breaker's state as a gauge shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed = 0,
    HalfOpen = 1,
    Open = 2,
}

/// Whether a call may go to the store now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Go ahead.
    Call,
    /// Go ahead: this call is the half-open probe.
    Probe,
    /// Do not wait on the store.
    Refused,
}

#[derive(Debug)]
enum State {
    Closed {
        consecutive: u32,
        window_start: u64,
        calls: u32,
        failures: u32,
    },
    Open {
        until: u64,
        open_for: Duration,
    },
    HalfOpen {
        probing: bool,
        open_for: Duration,
    },
}

#[derive(Debug)]
pub struct Breaker {
    config: BreakerConfig,
    state: Mutex<State>,
    /// [`BreakerState`] as a number, readable without the lock.
    gauge: AtomicU8,
}

impl Breaker {
    pub fn new(config: BreakerConfig) -> Self {
        Breaker {
            config,
            state: Mutex::new(State::Closed {
                consecutive: 0,
                window_start: 0,
                calls: 0,
                failures: 0,
            }),
            gauge: AtomicU8::new(BreakerState::Closed as u8),
        }
    }

    pub fn state(&self) -> BreakerState {
        match self.gauge.load(Ordering::Relaxed) {
            0 => BreakerState::Closed,
            1 => BreakerState::HalfOpen,
            _ => BreakerState::Open,
        }
    }

    /// Whether a call may go out at `now` (nanoseconds).
    pub fn permit(&self, now: u64) -> Permit {
        // The common case, closed, needs no lock.
        if self.state() == BreakerState::Closed {
            return Permit::Call;
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match &mut *state {
            State::Closed { .. } => Permit::Call,
            State::Open { until, open_for } if now >= *until => {
                let open_for = *open_for;
                self.set(
                    &mut state,
                    State::HalfOpen {
                        probing: true,
                        open_for,
                    },
                );
                Permit::Probe
            }
            State::Open { .. } => Permit::Refused,
            State::HalfOpen { probing, .. } if !*probing => {
                *probing = true;
                Permit::Probe
            }
            State::HalfOpen { .. } => Permit::Refused,
        }
    }

    /// Records a call's outcome at `now` (a timeout is a failure).
    pub fn record(&self, now: u64, success: bool) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let config = self.config;
        match &mut *state {
            State::Closed {
                consecutive,
                window_start,
                calls,
                failures,
            } => {
                if now.saturating_sub(*window_start) > config.window.as_nanos() as u64 {
                    (*window_start, *calls, *failures) = (now, 0, 0);
                }
                *calls += 1;
                if success {
                    *consecutive = 0;
                    return;
                }
                *consecutive += 1;
                *failures += 1;
                let ratio = *failures as f64 / *calls as f64;
                if *consecutive >= config.consecutive_failures
                    || (*calls >= config.min_calls && ratio >= config.failure_ratio)
                {
                    self.open(&mut state, now, config.open_for);
                }
            }
            State::HalfOpen { open_for, .. } => {
                if success {
                    self.set(
                        &mut state,
                        State::Closed {
                            consecutive: 0,
                            window_start: now,
                            calls: 0,
                            failures: 0,
                        },
                    );
                } else {
                    let open_for = (*open_for * 2).min(config.max_open_for);
                    self.open(&mut state, now, open_for);
                }
            }
            // A call that went out before the breaker opened: its outcome changes nothing.
            State::Open { .. } => {}
        }
    }

    fn open(&self, state: &mut State, now: u64, open_for: Duration) {
        self.set(
            state,
            State::Open {
                until: now + open_for.as_nanos() as u64,
                open_for,
            },
        );
    }

    fn set(&self, state: &mut State, next: State) {
        let gauge = match next {
            State::Closed { .. } => BreakerState::Closed,
            State::HalfOpen { .. } => BreakerState::HalfOpen,
            State::Open { .. } => BreakerState::Open,
        };
        *state = next;
        self.gauge.store(gauge as u8, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn breaker() -> Breaker {
        Breaker::new(BreakerConfig {
            consecutive_failures: 3,
            failure_ratio: 0.5,
            min_calls: 10,
            window: Duration::from_secs(10),
            open_for: Duration::from_millis(100),
            max_open_for: Duration::from_millis(400),
        })
    }

    #[test]
    fn opens_after_consecutive_failures_and_refuses_until_it_may_probe() {
        let breaker = breaker();
        breaker.record(0, false);
        breaker.record(MS, false);
        assert_eq!(breaker.permit(MS), Permit::Call);
        breaker.record(2 * MS, false);
        assert_eq!(breaker.state(), BreakerState::Open);
        assert_eq!(breaker.permit(50 * MS), Permit::Refused);
        // After open_for, one probe; others keep off the store while it is out.
        assert_eq!(breaker.permit(102 * MS), Permit::Probe);
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        assert_eq!(breaker.permit(103 * MS), Permit::Refused);
        breaker.record(110 * MS, true);
        assert_eq!(breaker.state(), BreakerState::Closed);
        assert_eq!(breaker.permit(111 * MS), Permit::Call);
    }

    #[test]
    fn a_failed_probe_opens_it_for_longer_up_to_the_cap() {
        let breaker = breaker();
        for i in 0..3 {
            breaker.record(i * MS, false);
        }
        let mut now = 2 * MS;
        let mut open_for = 100 * MS;
        for _ in 0..4 {
            now += open_for;
            assert_eq!(breaker.permit(now), Permit::Probe);
            breaker.record(now, false);
            open_for = (open_for * 2).min(400 * MS);
            assert_eq!(breaker.permit(now + open_for - MS), Permit::Refused);
        }
        assert_eq!(breaker.permit(now + 400 * MS), Permit::Probe);
    }

    #[test]
    fn opens_on_a_failure_ratio_without_a_streak() {
        let breaker = breaker();
        for i in 0..10 {
            breaker.record(i * MS, i % 2 == 0); // every other call fails: never 3 in a row
        }
        assert_eq!(breaker.state(), BreakerState::Open);
        // The ratio is over a window: old failures age out.
        let breaker = self::breaker();
        for i in 0..9 {
            breaker.record(i * MS, i % 2 == 0);
        }
        breaker.record(20_000 * MS, false);
        assert_eq!(breaker.state(), BreakerState::Closed);
    }

    #[test]
    fn successes_reset_the_streak() {
        let breaker = breaker();
        for i in 0..20 {
            breaker.record(i * MS, i % 3 == 2);
        }
        assert_eq!(
            breaker.state(),
            BreakerState::Open,
            "ratio 2/3 over 20 calls"
        );
        let breaker = self::breaker();
        breaker.record(0, false);
        breaker.record(MS, false);
        breaker.record(2 * MS, true);
        breaker.record(3 * MS, false);
        assert_eq!(breaker.state(), BreakerState::Closed);
    }
}

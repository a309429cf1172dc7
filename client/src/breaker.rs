//! The fleet's circuit breaker: a small state machine with time as an input. After
//! `threshold` failed calls in a row it opens: no calls for `cool_down`, and decisions that
//! need the fleet follow the failure policy. Then one probe; its success closes it.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: u64,
    },
    /// One probe is out; its answer decides.
    HalfOpen,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Breaker {
    state: State,
    threshold: u32,
    cool_down: u64,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cool_down: Duration) -> Breaker {
        Breaker {
            state: State::Closed { failures: 0 },
            threshold: threshold.max(1),
            cool_down: cool_down.as_nanos() as u64,
        }
    }

    /// May a call go to the fleet now? Past the cool-down, the first caller is the probe.
    pub(crate) fn permit(&mut self, now: u64) -> bool {
        match self.state {
            State::Closed { .. } => true,
            State::Open { until } if now >= until => {
                self.state = State::HalfOpen;
                true
            }
            State::Open { .. } | State::HalfOpen => false,
        }
    }

    pub(crate) fn record(&mut self, ok: bool, now: u64) {
        self.state = match (self.state, ok) {
            (_, true) => State::Closed { failures: 0 },
            (State::Closed { failures }, false) if failures + 1 < self.threshold => State::Closed {
                failures: failures + 1,
            },
            (_, false) => State::Open {
                until: now + self.cool_down,
            },
        };
    }

    /// Is the fleet taken to be away (decisions that need it follow the policy)?
    pub(crate) fn is_open(&self) -> bool {
        !matches!(self.state, State::Closed { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn opens_after_the_threshold_probes_after_the_cool_down_and_closes_on_success() {
        let mut breaker = Breaker::new(3, Duration::from_millis(500));
        breaker.record(false, 0);
        breaker.record(false, MS);
        assert!(!breaker.is_open() && breaker.permit(MS));
        breaker.record(true, 2 * MS);
        breaker.record(false, 3 * MS);
        breaker.record(false, 4 * MS);
        assert!(!breaker.is_open(), "a success resets the count");
        breaker.record(false, 5 * MS);
        assert!(breaker.is_open());
        assert!(!breaker.permit(504 * MS), "cooling down");
        assert!(breaker.permit(505 * MS), "the probe");
        assert!(!breaker.permit(505 * MS), "one probe at a time");
        breaker.record(false, 506 * MS);
        assert!(!breaker.permit(1005 * MS), "a failed probe opens it again");
        assert!(breaker.permit(1006 * MS));
        breaker.record(true, 1007 * MS);
        assert!(!breaker.is_open() && breaker.permit(1007 * MS));
    }
}

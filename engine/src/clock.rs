//! The limiter's clock: the real monotonic clock in production, a manually advanced one in
//! tests, behind one concrete type so the server need not be generic over its clock.

use governor::clock::{Clock, FakeRelativeClock, QuantaClock, QuantaInstant, Reference};
use governor::nanos::Nanos;

#[derive(Debug, Clone)]
pub enum EngineClock {
    /// quanta's TSC-backed monotonic clock, counted from `start`.
    Real {
        clock: QuantaClock,
        start: QuantaInstant,
    },
    /// Time moves only when a test advances it.
    Manual(FakeRelativeClock),
}

impl EngineClock {
    pub fn real() -> Self {
        let clock = QuantaClock::default();
        let start = clock.now();
        EngineClock::Real { clock, start }
    }
}

impl Default for EngineClock {
    fn default() -> Self {
        EngineClock::real()
    }
}

impl Clock for EngineClock {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        match self {
            EngineClock::Real { clock, start } => clock.now().duration_since(*start),
            EngineClock::Manual(clock) => clock.now(),
        }
    }
}

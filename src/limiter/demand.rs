//! A tenant's recent demand on this replica: what was offered (refused included) per second,
//! over a sliding window of [`DEMAND_SLOTS`] × [`DEMAND_SLOT`]. The decision path only adds to
//! atomic counters; the ticker folds them into the window.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// How often the window moves on (and demand is published to the ring).
pub const DEMAND_SLOT: Duration = Duration::from_millis(250);
/// Slots in the window: demand is averaged over `DEMAND_SLOTS × DEMAND_SLOT` = 1 s, short
/// enough to follow a balancer that moves a tenant within a couple of seconds.
pub const DEMAND_SLOTS: usize = 4;

/// Slots after a tenant is first seen here before its demand counts as settled: a full
/// window, plus two slots for peers' reports to arrive over gossip. Until then `weighted`
/// gives it no more than the even share, so replicas that each see a new tenant's first
/// requests do not each take the whole limit before they hear of one another.
pub const SETTLING_SLOTS: u32 = DEMAND_SLOTS as u32 + 2;

/// One slot: requests, items, largest request (items).
type Slot = (u64, u64, u64);

#[derive(Default)]
pub struct DemandMeter {
    pending_requests: AtomicU64,
    pending_items: AtomicU64,
    pending_largest: AtomicU64,
    /// Only the ticker touches the window, so this lock is never contended.
    window: Mutex<([Slot; DEMAND_SLOTS], usize)>,
    /// f64 bits of the windowed rates, and the largest request in the window.
    requests_per_second: AtomicU64,
    items_per_second: AtomicU64,
    largest: AtomicU64,
    /// Ticks since the meter was created, saturating at `SETTLING_SLOTS`.
    age: std::sync::atomic::AtomicU32,
}

/// A tenant's demand on this replica over the last window.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OwnDemand {
    pub requests_per_second: f64,
    pub items_per_second: f64,
    pub largest_request: u64,
    /// Whether a full window and a round of gossip have passed since the tenant was first
    /// seen here.
    pub settled: bool,
}

impl DemandMeter {
    pub fn offer_request(&self) {
        self.pending_requests.fetch_add(1, Ordering::Relaxed);
    }

    pub fn offer_items(&self, items: u64) {
        self.pending_items.fetch_add(items, Ordering::Relaxed);
        if items > self.pending_largest.load(Ordering::Relaxed) {
            self.pending_largest.fetch_max(items, Ordering::Relaxed);
        }
    }

    /// Moves the window on by one slot; returns the demand over the window.
    pub fn tick(&self) -> OwnDemand {
        let slot = (
            self.pending_requests.swap(0, Ordering::Relaxed),
            self.pending_items.swap(0, Ordering::Relaxed),
            self.pending_largest.swap(0, Ordering::Relaxed),
        );
        let mut window = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let (slots, next) = &mut *window;
        slots[*next] = slot;
        *next = (*next + 1) % DEMAND_SLOTS;
        let seconds = (DEMAND_SLOT * DEMAND_SLOTS as u32).as_secs_f64();
        let age = self.age.load(Ordering::Relaxed);
        if age < SETTLING_SLOTS {
            self.age.store(age + 1, Ordering::Relaxed);
        }
        let demand = OwnDemand {
            requests_per_second: slots.iter().map(|s| s.0).sum::<u64>() as f64 / seconds,
            items_per_second: slots.iter().map(|s| s.1).sum::<u64>() as f64 / seconds,
            largest_request: slots.iter().map(|s| s.2).max().unwrap_or(0),
            settled: age + 1 >= SETTLING_SLOTS,
        };
        self.requests_per_second
            .store(demand.requests_per_second.to_bits(), Ordering::Relaxed);
        self.items_per_second
            .store(demand.items_per_second.to_bits(), Ordering::Relaxed);
        self.largest
            .store(demand.largest_request, Ordering::Relaxed);
        demand
    }

    /// The demand as of the last tick.
    pub fn current(&self) -> OwnDemand {
        OwnDemand {
            requests_per_second: f64::from_bits(self.requests_per_second.load(Ordering::Relaxed)),
            items_per_second: f64::from_bits(self.items_per_second.load(Ordering::Relaxed)),
            largest_request: self.largest.load(Ordering::Relaxed),
            settled: self.age.load(Ordering::Relaxed) >= SETTLING_SLOTS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_averages_over_one_second_and_forgets() {
        let meter = DemandMeter::default();
        for _ in 0..10 {
            meter.offer_request();
            meter.offer_items(100);
        }
        meter.offer_items(5000);
        let demand = meter.tick();
        assert_eq!(demand.requests_per_second, 10.0);
        assert_eq!(demand.items_per_second, 6000.0);
        assert_eq!(demand.largest_request, 5000);
        for _ in 1..DEMAND_SLOTS {
            assert_eq!(meter.tick().items_per_second, 6000.0);
        }
        assert_eq!(
            meter.tick(),
            OwnDemand::default(),
            "a full window later it is gone"
        );
        assert_eq!(meter.current(), OwnDemand::default());
    }
}

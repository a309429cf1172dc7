//! The shared store behind `shared`: the small interface the engine talks to, the bucket
//! algorithm the store runs atomically (as a pure function, so the Lua twin in the Redis store
//! is tested against it), and an in-memory store for tests and single-process use.
//!
//! The engine never knows which store it runs against (Kuadrant/limitador's habit): Redis and
//! memory are two implementations of [`Store`].

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use governor::clock::Clock;

use crate::algorithms::{Decision, LeakyBucket, SlidingWindow};
use crate::bucket::nanos_between;
use crate::types::{LimitKind, Rate};

/// Which bucket: a tenant's request or ingestion limit, and (with `store_shards`) which of
/// its `shards` sub-buckets; or, for the admission API, one of the tenant's keys. How a store
/// names it is the store's business (the Redis store's names and hash tags are in
/// `weir-redis-store`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BucketKey<'a> {
    pub tenant: &'a str,
    pub kind: LimitKind,
    /// Which sub-bucket, `0..shards`.
    pub shard: u32,
    pub shards: u32,
    /// An admission API key (percent-encoded: no spaces or braces), instead of a push limit.
    pub key: Option<&'a str>,
}

impl<'a> BucketKey<'a> {
    /// A push limit's bucket: sub-bucket `shard` of `shards`.
    pub fn push(tenant: &'a str, kind: LimitKind, shard: u32, shards: u32) -> BucketKey<'a> {
        BucketKey {
            tenant,
            kind,
            shard,
            shards: shards.max(1),
            key: None,
        }
    }
}

/// One of a tenant's admission API keys in the store (the key percent-encoded), for its
/// sliding window, leaky bucket or in-flight leases; the operation says which.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyName<'a> {
    pub tenant: &'a str,
    pub key: &'a str,
}

/// A per-key meter the store runs atomically (the admission API under `shared`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StoredMeter {
    SlidingWindow { limit: f64, window: Duration },
    LeakyBucket { rate: f64, capacity: u64 },
}

/// What an `acquire` got.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Acquired {
    pub granted: bool,
    /// Leases held after this call.
    pub in_flight: u64,
    /// Refused: until the earliest lease's deadline.
    pub retry_after: Duration,
}

/// What a take got.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grant {
    /// Tokens taken: between `min` and `want`, or 0.
    pub granted: u64,
    /// Tokens left in the bucket afterwards.
    pub remaining: f64,
    /// When nothing was granted: how long until `min` tokens are there.
    pub wait: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub enum StoreError {
    /// No answer within the store timeout.
    Timeout(Duration),
    /// The store answered with an error, or could not be reached.
    Failed(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Timeout(timeout) => write!(f, "no answer within {timeout:?}"),
            StoreError::Failed(reason) => write!(f, "{reason}"),
        }
    }
}

impl std::error::Error for StoreError {}

pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The shared, authoritative buckets. Every operation is atomic in the store and reads the
/// store's own clock, never the caller's.
pub trait Store: Send + Sync + 'static {
    /// Refills the bucket to now, then takes between `min` and `want` tokens if at least
    /// `min` are there (as many as are there, up to `want`), else nothing.
    fn take<'a>(
        &'a self,
        key: BucketKey<'a>,
        rate: Rate,
        want: u64,
        min: u64,
    ) -> StoreFuture<'a, Grant>;

    /// Puts unspent tokens back (capped at the burst).
    fn give_back<'a>(&'a self, key: BucketKey<'a>, rate: Rate, tokens: u64) -> StoreFuture<'a, ()>;

    /// Checks and counts `cost` on a sliding window or leaky bucket at `key`.
    fn meter<'a>(
        &'a self,
        key: KeyName<'a>,
        meter: StoredMeter,
        cost: u64,
    ) -> StoreFuture<'a, Decision>;

    /// Takes an in-flight slot under `lease` until `ttl` from now, if fewer than `max` are
    /// held (expired ones do not count).
    fn acquire<'a>(
        &'a self,
        key: KeyName<'a>,
        lease: &'a str,
        max: u64,
        ttl: Duration,
    ) -> StoreFuture<'a, Acquired>;

    /// Gives a slot back; false if the lease was unknown, released or expired.
    fn release<'a>(&'a self, key: KeyName<'a>, lease: &'a str) -> StoreFuture<'a, bool>;

    /// Moves a held lease's deadline to `ttl` from now; false if unknown or expired.
    fn renew<'a>(
        &'a self,
        key: KeyName<'a>,
        lease: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, bool>;

    /// Whether the store answers at all: the breaker's probe when no other call makes one.
    fn ping(&self) -> StoreFuture<'_, ()>;
}

/// A bucket as the store keeps it: tokens, and when they were last refilled (microseconds on
/// the store's clock).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoredBucket {
    pub tokens: f64,
    pub at_micros: u64,
}

/// The algorithm the store runs atomically: refill for the time elapsed (never negative:
/// a store clock that steps back refills nothing), cap at the burst, take. A missing bucket
/// is full. Returns the new state and the grant. `take.lua` is its twin.
pub fn take(
    bucket: Option<StoredBucket>,
    now_micros: u64,
    rate: Rate,
    want: u64,
    min: u64,
) -> (StoredBucket, Grant) {
    let burst = rate.burst as f64;
    let mut tokens = refilled(bucket, now_micros, rate);
    let mut granted = 0;
    let mut wait = Duration::ZERO;
    if tokens >= min as f64 {
        granted = want.min(tokens.floor() as u64).max(min);
        tokens -= granted as f64;
    } else {
        wait = Duration::from_secs_f64(((min as f64 - tokens) / rate.per_second).max(0.0));
    }
    let state = StoredBucket {
        tokens: tokens.min(burst),
        at_micros: now_micros,
    };
    (
        state,
        Grant {
            granted,
            remaining: state.tokens,
            wait,
        },
    )
}

/// Tokens given back are added after the refill, capped at the burst: returning can never
/// make a bucket fuller than full.
pub fn give_back(
    bucket: Option<StoredBucket>,
    now_micros: u64,
    rate: Rate,
    tokens: u64,
) -> StoredBucket {
    StoredBucket {
        tokens: (refilled(bucket, now_micros, rate) + tokens as f64).min(rate.burst as f64),
        at_micros: now_micros,
    }
}

fn refilled(bucket: Option<StoredBucket>, now_micros: u64, rate: Rate) -> f64 {
    let burst = rate.burst as f64;
    match bucket {
        None => burst,
        Some(bucket) => {
            let elapsed = now_micros.saturating_sub(bucket.at_micros) as f64 / 1e6;
            (bucket.tokens + elapsed * rate.per_second).min(burst)
        }
    }
}

/// Buckets in this process's memory, on the engine clock: the store for tests, and the
/// reference the Redis store is checked against.
pub struct MemoryStore<C: Clock> {
    clock: C,
    start: C::Instant,
    buckets: Mutex<HashMap<String, StoredBucket>>,
    windows: Mutex<HashMap<String, SlidingWindow>>,
    leaky: Mutex<HashMap<String, LeakyBucket>>,
    /// Per key: lease → deadline (engine nanoseconds).
    leases: Mutex<HashMap<String, HashMap<String, u64>>>,
}

impl<C: Clock> MemoryStore<C> {
    pub fn new(clock: C) -> Self {
        MemoryStore {
            start: clock.now(),
            clock,
            buckets: Mutex::new(HashMap::new()),
            windows: Mutex::new(HashMap::new()),
            leaky: Mutex::new(HashMap::new()),
            leases: Mutex::new(HashMap::new()),
        }
    }

    fn now_micros(&self) -> u64 {
        nanos_between(self.start, self.clock.now()) / 1000
    }

    /// The tokens in a bucket now, for tests.
    pub fn tokens(&self, key: BucketKey<'_>, rate: Rate) -> f64 {
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        refilled(
            buckets.get(&memory_name(&key)).copied(),
            self.now_micros(),
            rate,
        )
    }
}

/// The in-memory store's name for a bucket or key: any unique text does.
fn memory_name(key: &impl std::fmt::Debug) -> String {
    format!("{key:?}")
}

impl<C: Clock + Send + Sync + 'static> Store for MemoryStore<C>
where
    C::Instant: Send + Sync,
{
    fn take<'a>(
        &'a self,
        key: BucketKey<'a>,
        rate: Rate,
        want: u64,
        min: u64,
    ) -> StoreFuture<'a, Grant> {
        let now = self.now_micros();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let name = memory_name(&key);
        let (state, grant) = take(buckets.get(&name).copied(), now, rate, want, min);
        buckets.insert(name, state);
        Box::pin(std::future::ready(Ok(grant)))
    }

    fn give_back<'a>(&'a self, key: BucketKey<'a>, rate: Rate, tokens: u64) -> StoreFuture<'a, ()> {
        let now = self.now_micros();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let name = memory_name(&key);
        let state = give_back(buckets.get(&name).copied(), now, rate, tokens);
        buckets.insert(name, state);
        Box::pin(std::future::ready(Ok(())))
    }

    fn meter<'a>(
        &'a self,
        key: KeyName<'a>,
        meter: StoredMeter,
        cost: u64,
    ) -> StoreFuture<'a, Decision> {
        let now = self.now_micros() * 1000;
        let decision = match meter {
            StoredMeter::SlidingWindow { limit, window } => {
                let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
                let meter = windows
                    .entry(memory_name(&key))
                    .or_insert_with(|| SlidingWindow::new(limit, window, now));
                meter.check(cost, now)
            }
            StoredMeter::LeakyBucket { rate, capacity } => {
                let mut leaky = self.leaky.lock().unwrap_or_else(|e| e.into_inner());
                let meter = leaky
                    .entry(memory_name(&key))
                    .or_insert_with(|| LeakyBucket::new(rate, capacity, now));
                meter.check(cost, now)
            }
        };
        Box::pin(std::future::ready(decision.map_err(|_| {
            StoreError::Failed(format!("cost {cost} is over the meter's limit"))
        })))
    }

    fn acquire<'a>(
        &'a self,
        key: KeyName<'a>,
        lease: &'a str,
        max: u64,
        ttl: Duration,
    ) -> StoreFuture<'a, Acquired> {
        let now = self.now_micros() * 1000;
        let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        let held = leases.entry(memory_name(&key)).or_default();
        held.retain(|_, deadline| *deadline > now);
        let acquired = if (held.len() as u64) < max {
            held.insert(lease.to_string(), now + ttl.as_nanos() as u64);
            Acquired {
                granted: true,
                in_flight: held.len() as u64,
                retry_after: Duration::ZERO,
            }
        } else {
            let earliest = held.values().min().copied().unwrap_or(now);
            Acquired {
                granted: false,
                in_flight: held.len() as u64,
                retry_after: Duration::from_nanos(earliest.saturating_sub(now)),
            }
        };
        Box::pin(std::future::ready(Ok(acquired)))
    }

    fn release<'a>(&'a self, key: KeyName<'a>, lease: &'a str) -> StoreFuture<'a, bool> {
        let now = self.now_micros() * 1000;
        let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        let held = leases.entry(memory_name(&key)).or_default();
        held.retain(|_, deadline| *deadline > now);
        Box::pin(std::future::ready(Ok(held.remove(lease).is_some())))
    }

    fn renew<'a>(
        &'a self,
        key: KeyName<'a>,
        lease: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        let now = self.now_micros() * 1000;
        let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        let held = leases.entry(memory_name(&key)).or_default();
        held.retain(|_, deadline| *deadline > now);
        let renewed = match held.get_mut(lease) {
            Some(deadline) => {
                *deadline = now + ttl.as_nanos() as u64;
                true
            }
            None => false,
        };
        Box::pin(std::future::ready(Ok(renewed)))
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(std::future::ready(Ok(())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    const RATE: Rate = Rate {
        per_second: 100.0,
        burst: 50,
    };

    #[test]
    fn a_missing_bucket_is_full_and_grants_what_is_there_up_to_want() {
        let (state, grant) = take(None, 0, RATE, 30, 1);
        assert_eq!((grant.granted, state.tokens), (30, 20.0));
        let (state, grant) = take(Some(state), 0, RATE, 30, 1);
        assert_eq!((grant.granted, state.tokens), (20, 0.0));
        let (_, grant) = take(Some(state), 0, RATE, 30, 5);
        assert_eq!(grant.granted, 0);
        assert_eq!(grant.wait, Duration::from_millis(50));
    }

    #[test]
    fn the_minimum_is_all_or_nothing() {
        let full = StoredBucket {
            tokens: 10.0,
            at_micros: 0,
        };
        assert_eq!(take(Some(full), 0, RATE, 40, 11).1.granted, 0);
        assert_eq!(take(Some(full), 0, RATE, 40, 10).1.granted, 10);
    }

    #[test]
    fn a_clock_stepping_back_refills_nothing() {
        let bucket = StoredBucket {
            tokens: 0.0,
            at_micros: 5_000_000,
        };
        let (state, grant) = take(Some(bucket), 1_000_000, RATE, 10, 1);
        assert_eq!(grant.granted, 0);
        assert_eq!(state.tokens, 0.0);
    }

    #[test]
    fn giving_back_never_overfills() {
        let bucket = StoredBucket {
            tokens: 45.0,
            at_micros: 0,
        };
        assert_eq!(give_back(Some(bucket), 0, RATE, 30).tokens, 50.0);
        assert_eq!(give_back(None, 0, RATE, 30).tokens, 50.0);
    }

    proptest! {
        /// Over any sequence of takes and returns, what was taken and kept is at most one
        /// burst plus the rate over the time elapsed.
        #[test]
        fn takes_never_exceed_one_burst_plus_the_rate(
            steps in prop::collection::vec((0u64..200_000, 1u64..80, 0u64..80, any::<bool>()), 1..200)
        ) {
            let mut bucket = None;
            let (mut now, mut kept) = (0u64, 0i64);
            for (gap, want, min, give) in steps {
                now += gap;
                if give && kept > 0 {
                    let back = (kept as u64).min(want);
                    bucket = Some(give_back(bucket, now, RATE, back));
                    kept -= back as i64;
                } else {
                    let (state, grant) = take(bucket, now, RATE, want, min.min(want));
                    prop_assert!(grant.granted == 0 || grant.granted >= min.min(want));
                    prop_assert!(grant.granted <= want.max(min));
                    bucket = Some(state);
                    kept += grant.granted as i64;
                }
                prop_assert!(kept as f64 <= 50.0 + 100.0 * now as f64 / 1e6 + 1e-6);
                prop_assert!(bucket.unwrap().tokens >= -1e-9);
            }
        }
    }
}

//! The limit maths: how a tenant's fleet-wide limits become what this replica enforces. Pure
//! functions of (tenant limits, healthy count), so the invariants are stated as property tests.

use std::time::Duration;

use runtime_config::{RateLimitStrategy, TenantLimits};

/// A token bucket's shape: refill rate and capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub per_second: f64,
    pub burst: u64,
}

/// The outcome of one check against a bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    Allowed,
    /// Not now: `wait` until the cost could pass; `available` whole tokens are there now.
    Denied {
        wait: Duration,
        available: u64,
    },
    /// The cost is larger than the bucket's capacity: it can never pass.
    TooLarge,
}

/// This replica's share of a fleet-wide cap of `max` slots held at once, split over
/// `replicas` by the replica's `rank` among them (its place in the ring's order): ⌊max ÷ N⌋,
/// and one more for the first `max mod N` ranks, so the shares sum to `max` exactly. With
/// fewer slots than replicas, the replicas ranked past `max` hold none.
pub fn slot_share(max: u64, replicas: usize, rank: usize) -> u64 {
    let replicas = replicas.max(1) as u64;
    let rank = rank as u64 % replicas;
    max / replicas + u64::from(rank < max % replicas)
}

/// What one replica enforces for one limit of one tenant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LocalLimit {
    /// No bucket: everything passes (`request_rate: 0`).
    Unlimited,
    /// Nothing passes (`ingestion_rate: 0`).
    Deny,
    /// `divided`: a bucket of this shape on this replica alone.
    Divided(Rate),
    /// `weighted`: this replica's view of the fleet-wide bucket, which has this shape.
    Fleet(Rate),
    /// `shared`: the fleet-wide bucket in the store, which has this shape (split over
    /// `store_shards` sub-buckets there).
    Shared(Rate),
}

impl LocalLimit {
    /// The rate a gauge shows: +Inf when unlimited, 0 when everything is refused. Under
    /// `weighted` every replica may spend the whole fleet rate (its peers' spending is charged
    /// to its view as gossip reports it).
    pub fn per_second(&self) -> f64 {
        match self {
            LocalLimit::Unlimited => f64::INFINITY,
            LocalLimit::Deny => 0.0,
            LocalLimit::Divided(rate) | LocalLimit::Fleet(rate) | LocalLimit::Shared(rate) => {
                rate.per_second
            }
        }
    }

    /// Seconds an idle bucket takes to refill completely; after that, dropping its state
    /// changes no decision.
    pub fn refill_seconds(&self) -> f64 {
        match self {
            LocalLimit::Divided(rate) | LocalLimit::Fleet(rate) | LocalLimit::Shared(rate) => {
                rate.burst as f64 / rate.per_second
            }
            LocalLimit::Unlimited | LocalLimit::Deny => 0.0,
        }
    }
}

/// One tenant's local limits on this replica.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LocalLimits {
    pub request: LocalLimit,
    pub ingestion: LocalLimit,
}

/// The local limits for a tenant, given the healthy count.
///
/// `divided` (Mimir's): the rate is divided by the healthy count, the burst is not, so the
/// fleet-wide start-up burst is N × burst. A count of 0 cannot happen (a replica counts
/// itself) and is treated as 1, so the local limit never exceeds the fleet-wide one.
///
/// `weighted`: the fleet-wide limit itself: each replica keeps a view of one fleet bucket
/// (see [`crate::fleet`]).
pub fn local_limits(limits: &TenantLimits, healthy_replicas: usize) -> LocalLimits {
    let shape = |rate: f64, burst: u64| match limits.rate_limit_strategy {
        RateLimitStrategy::Divided => LocalLimit::Divided(Rate {
            per_second: rate / healthy_replicas.max(1) as f64,
            burst,
        }),
        RateLimitStrategy::Weighted => LocalLimit::Fleet(Rate {
            per_second: rate,
            burst,
        }),
        RateLimitStrategy::Shared => LocalLimit::Shared(Rate {
            per_second: rate,
            burst,
        }),
    };
    LocalLimits {
        request: if limits.request_rate == 0.0 {
            LocalLimit::Unlimited
        } else {
            shape(limits.request_rate, limits.request_burst_size)
        },
        ingestion: if limits.ingestion_rate == 0.0 {
            LocalLimit::Deny
        } else {
            shape(limits.ingestion_rate, limits.ingestion_burst_size)
        },
    }
}

/// While a tenant is new to the whole fleet, no replica can know yet what the others admit, so
/// under `weighted` each may spend at most the even share of one fleet burst plus the rate:
/// `(B + L·t) ÷ N` after `t` seconds. The shares of N replicas sum to exactly `B + L·t`.
/// At least one request always fits, so a request up to the burst is never refused for being
/// larger than a share.
pub fn settling_budget(rate: Rate, healthy_replicas: usize, elapsed: Duration) -> f64 {
    (rate.burst as f64 + rate.per_second * elapsed.as_secs_f64()) / healthy_replicas.max(1) as f64
}

/// One of `shards` sub-buckets of a shared bucket: the rate and burst divided (the burst
/// rounded up, so the sub-buckets together hold at least the configured burst).
pub fn shard_rate(rate: Rate, shards: u32) -> Rate {
    let shards = shards.max(1);
    Rate {
        per_second: rate.per_second / shards as f64,
        burst: rate.burst.div_ceil(shards as u64).max(1),
    }
}

impl LocalLimits {
    /// Seconds until every bucket would be full again if idle.
    pub fn refill_seconds(&self) -> f64 {
        self.request
            .refill_seconds()
            .max(self.ingestion.refill_seconds())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limits(ingestion_rate: f64, request_rate: f64, strategy: RateLimitStrategy) -> TenantLimits {
        TenantLimits {
            ingestion_rate,
            ingestion_burst_size: 1000,
            request_rate,
            request_burst_size: 10,
            rate_limit_strategy: strategy,
            ..TenantLimits::default()
        }
    }

    #[test]
    fn single_replica_enforces_the_fleet_limit() {
        let local = local_limits(&limits(500.0, 0.0, RateLimitStrategy::Divided), 1);
        assert_eq!(
            local.ingestion,
            LocalLimit::Divided(Rate {
                per_second: 500.0,
                burst: 1000
            })
        );
        assert_eq!(local.request, LocalLimit::Unlimited);
    }

    #[test]
    fn zero_replicas_is_treated_as_one_and_zero_ingestion_denies() {
        let divided = limits(500.0, 5.0, RateLimitStrategy::Divided);
        assert_eq!(local_limits(&divided, 0), local_limits(&divided, 1));
        let blocked = limits(0.0, 0.0, RateLimitStrategy::Weighted);
        assert_eq!(local_limits(&blocked, 3).ingestion, LocalLimit::Deny);
    }

    #[test]
    fn weighted_enforces_the_fleet_bucket_everywhere() {
        let local = local_limits(&limits(900.0, 9.0, RateLimitStrategy::Weighted), 3);
        assert_eq!(
            local.ingestion,
            LocalLimit::Fleet(Rate {
                per_second: 900.0,
                burst: 1000
            })
        );
        assert_eq!(local.request.per_second(), 9.0);
    }

    #[test]
    fn slot_shares_by_rank() {
        let shares = |max, n| {
            (0..n)
                .map(|rank| slot_share(max, n, rank))
                .collect::<Vec<_>>()
        };
        assert_eq!(shares(30, 3), [10, 10, 10]);
        assert_eq!(shares(10, 3), [4, 3, 3]);
        assert_eq!(shares(2, 3), [1, 1, 0]);
        assert_eq!(shares(7, 1), [7]);
        // A rank past the healthy count (the ring is changing) still gets a share.
        assert_eq!(slot_share(10, 3, 4), 3);
        assert_eq!(slot_share(10, 0, 0), 10);
    }

    proptest! {
        /// Slot shares over N replicas sum to the cap exactly, and differ by at most one.
        #[test]
        fn slot_shares_sum_to_the_cap(max in 0u64..1_000_000, n in 1usize..500) {
            let shares: Vec<u64> = (0..n).map(|rank| slot_share(max, n, rank)).collect();
            prop_assert_eq!(shares.iter().sum::<u64>(), max);
            let (low, high) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
            prop_assert!(high - low <= 1);
        }

        /// Divided: the local rates over N replicas sum to the fleet rate; the burst is whole.
        #[test]
        fn divided_shares_sum_to_the_fleet_limit(rate in 0.001f64..1e9, n in 1usize..1000) {
            let local = local_limits(&limits(rate, rate, RateLimitStrategy::Divided), n);
            for limit in [local.ingestion, local.request] {
                let LocalLimit::Divided(local_rate) = limit else { panic!("divided") };
                let sum = local_rate.per_second * n as f64;
                prop_assert!((sum - rate).abs() <= rate * 1e-9);
                prop_assert!(local_rate.per_second <= rate);
            }
        }

        /// Settling shares over N replicas sum to exactly one fleet burst plus the rate, at
        /// every moment: a new tenant's first seconds stay within one burst however its
        /// traffic is spread.
        #[test]
        fn settling_shares_sum_to_one_burst_plus_the_rate(
            per_second in 0.001f64..1e7, burst in 1u64..10_000_000, n in 1usize..200, ms in 0u64..10_000,
        ) {
            let rate = Rate { per_second, burst };
            let elapsed = Duration::from_millis(ms);
            let sum = settling_budget(rate, n, elapsed) * n as f64;
            let whole = burst as f64 + per_second * elapsed.as_secs_f64();
            prop_assert!((sum - whole).abs() <= whole * 1e-9);
        }
    }
}

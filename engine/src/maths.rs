//! The limit maths: how a tenant's fleet-wide limits become what this replica enforces. Pure
//! functions of (tenant limits, healthy count), so the invariants are stated as property tests.

use std::time::Duration;

use runtime_config::{RateLimitStrategy, TenantLimits};

pub use crate::types::{Outcome, Rate};

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
        ingestion: match shape(limits.ingestion_rate, limits.ingestion_burst_size) {
            _ if limits.ingestion_rate == 0.0 => LocalLimit::Deny,
            // Mimir's distributor with a burst factor: the factor times its share of the rate.
            LocalLimit::Divided(rate) if limits.ingestion_burst_factor > 0.0 => {
                LocalLimit::Divided(Rate {
                    burst: (limits.ingestion_burst_factor * rate.per_second).ceil() as u64,
                    ..rate
                })
            }
            local => local,
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

    /// Cases worked by hand, including ones that do not divide evenly.
    #[test]
    fn divided_and_settling_by_hand() {
        let divided = |rate, n| local_limits(&limits(rate, 0.0, RateLimitStrategy::Divided), n);
        assert_eq!(divided(900.0, 3).ingestion.per_second(), 300.0);
        assert_eq!(divided(1000.0, 8).ingestion.per_second(), 125.0);
        assert_eq!(divided(10.0, 4).ingestion.per_second(), 2.5);
        // 10/3 = 3.333…, to the nearest f64.
        assert_eq!(divided(10.0, 3).ingestion.per_second(), 3.3333333333333335);
        assert_eq!(divided(1.0, 1000).ingestion.per_second(), 0.001);

        let rate = Rate {
            per_second: 100.0,
            burst: 300,
        };
        let settling = |n, ms| settling_budget(rate, n, Duration::from_millis(ms));
        // (300 + 100·0) / 3, (300 + 100·1.5) / 3, (300 + 100·0.25) / 1 and / 4.
        assert_eq!(settling(3, 0), 100.0);
        assert_eq!(settling(3, 1500), 150.0);
        assert_eq!(settling(1, 250), 325.0);
        assert_eq!(settling(4, 250), 81.25);
        // A healthy count of 0 (cannot happen) counts as 1.
        assert_eq!(settling(0, 1000), 400.0);
    }

    #[test]
    fn divided_burst_with_a_factor_is_the_factor_times_the_share_as_in_mimir() {
        // Mimir's own case (`TestGlobalRateStrategyWithBurstFactor`): a rate of 1000, a factor
        // of 3 and two distributors give each a rate of 500 and a burst of 1500.
        let factored = TenantLimits {
            ingestion_burst_factor: 3.0,
            ..limits(1000.0, 0.0, RateLimitStrategy::Divided)
        };
        assert_eq!(
            local_limits(&factored, 2).ingestion,
            LocalLimit::Divided(Rate {
                per_second: 500.0,
                burst: 1500
            })
        );
        // Without the factor the burst stays whole; under `weighted` it is the fleet's own.
        assert_eq!(
            local_limits(&limits(1000.0, 0.0, RateLimitStrategy::Divided), 2).ingestion,
            LocalLimit::Divided(Rate {
                per_second: 500.0,
                burst: 1000
            })
        );
        let weighted = TenantLimits {
            rate_limit_strategy: RateLimitStrategy::Weighted,
            ..factored
        };
        assert_eq!(
            local_limits(&weighted, 2).ingestion,
            LocalLimit::Fleet(Rate {
                per_second: 1000.0,
                burst: 1000
            })
        );
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

        /// Divided: each replica's rate is the fleet rate over N, the burst is whole. The
        /// oracle builds the fleet rate from the answer (a share in 1/1024ths, times N, all
        /// exact in an f64), so it never divides, let alone with the code's own division.
        #[test]
        fn divided_rate_is_the_fleet_rate_over_the_healthy_count(
            share_1024ths in 1u64..1 << 40, n in 1usize..1000,
        ) {
            let expected = share_1024ths as f64 / 1024.0;
            let fleet = (share_1024ths * n as u64) as f64 / 1024.0;
            let local = local_limits(&limits(fleet, fleet, RateLimitStrategy::Divided), n);
            prop_assert_eq!(
                local.ingestion,
                LocalLimit::Divided(Rate { per_second: expected, burst: 1000 })
            );
            prop_assert_eq!(
                local.request,
                LocalLimit::Divided(Rate { per_second: expected, burst: 10 })
            );
        }

        /// Divided, any whole fleet rate: the share lies between the integer quotient and
        /// the next integer (integer arithmetic, not a float division, is the oracle).
        #[test]
        fn divided_rate_lies_between_the_integer_quotients(
            fleet in 1u64..1_000_000_000, n in 1usize..1000,
        ) {
            let local = local_limits(&limits(fleet as f64, 0.0, RateLimitStrategy::Divided), n);
            let per_second = local.ingestion.per_second();
            let (quotient, remainder) = (fleet / n as u64, fleet % n as u64);
            if remainder == 0 {
                prop_assert_eq!(per_second, quotient as f64);
            } else {
                prop_assert!(
                    (quotient as f64) < per_second && per_second < (quotient + 1) as f64,
                    "{} / {} gave {}", fleet, n, per_second
                );
            }
        }

        /// Settling: each of N replicas may spend (B + L·t) ÷ N. The oracle picks each
        /// replica's share of the burst and of the rate first and builds B and L from them
        /// (rates in 1/1024ths, t in eighths of a second: every value exact), so the expected
        /// budget is known without dividing.
        #[test]
        fn settling_budget_is_an_even_share_of_one_burst_plus_the_rate(
            burst_share in 0u64..1_000_000, rate_share_1024ths in 1u64..1_000_000,
            n in 1usize..200, eighths in 0u64..800,
        ) {
            let rate = Rate {
                per_second: (rate_share_1024ths * n as u64) as f64 / 1024.0,
                burst: burst_share * n as u64,
            };
            let elapsed = Duration::from_millis(125 * eighths);
            let budget = settling_budget(rate, n, elapsed);
            // In 1/8192ths: the burst share, plus the rate share (1/1024ths) times t (1/8ths).
            let expected_8192ths = burst_share * 8192 + rate_share_1024ths * eighths;
            prop_assert_eq!(budget, expected_8192ths as f64 / 8192.0);
        }
    }
}

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

/// How long leases granted elsewhere in the fleet may still be held, as the ring reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LeaseHorizons {
    /// The longest a live peer says its leases (or a departed peer's it guards) may run: what
    /// a replica that joins waits out before it grants.
    pub peers: Duration,
    /// The longest a peer that died or left lately said its leases may run: what a share it
    /// freed waits out before it is granted again.
    pub departed: Duration,
}

/// The shares of fleet-wide in-flight caps this replica held before the ring last changed,
/// each binding until the leases granted under it may have ended. A lease is held by a client,
/// not by the replica that granted it: when a replica dies or leaves, its holders are still at
/// work until their deadlines, and a replica that joins finds its peers holding up to their
/// old, larger shares. So a share shrinks at once and grows only after the leases that share
/// was carved from may have ended; until then a replica grants the smallest share it held
/// since. A probe before this (2026-12-06) held 13 slots for a cap of 10 after `kill -9` of a
/// replica holding 3.
///
/// Pure: the ring's changes and the clock come in as arguments.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SlotHolds {
    /// Where this replica stands now: (healthy replicas, rank), once the ring has said.
    place: Option<(usize, usize)>,
    /// Earlier shares still binding (see [`Hold`]).
    holds: Vec<Hold>,
    joined: bool,
}

/// A share that binds until `until` (engine ns).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Hold {
    /// The place whose share binds; `None` grants nothing (a replica that has just joined).
    place: Option<(usize, usize)>,
    until: u64,
    /// Whether the peers' leases (`true`: a replica that joined) or the departed peers' bound
    /// it; a shorter horizon of that kind said later ends it sooner.
    on_joining: bool,
}

/// More holds than this (a ring flapping faster than leases end) fold into one that grants
/// nothing until the last of them ends: never more than any of them granted.
const MOST_HOLDS: usize = 32;

impl SlotHolds {
    /// The ring says this replica is `rank` of `replicas`, `joined` or not, with `horizons`.
    /// Before it has joined a replica grants nothing (it cannot know what its peers hold); on
    /// joining, nothing until the peers' leases may have ended; on each move, its old share
    /// binds until the departed peers' leases may have ended. A shorter horizon said later
    /// ends a hold sooner (the holders released, or their leases lapsed).
    pub fn moved(
        &mut self,
        replicas: usize,
        rank: usize,
        joined: bool,
        horizons: LeaseHorizons,
        now: u64,
    ) {
        let place = Some((replicas.max(1), rank));
        if !joined {
            self.place = place;
            return;
        }
        let after = |horizon: Duration| now.saturating_add(horizon.as_nanos() as u64);
        let (on_peers, on_departed) = (after(horizons.peers), after(horizons.departed));
        if !self.joined {
            self.joined = true;
            self.holds.push(Hold {
                place: None,
                until: on_peers,
                on_joining: true,
            });
        } else if self.place != place {
            self.holds.push(Hold {
                place: self.place,
                until: on_departed,
                on_joining: false,
            });
        }
        self.place = place;
        for hold in &mut self.holds {
            hold.until = hold.until.min(if hold.on_joining {
                on_peers
            } else {
                on_departed
            });
        }
        self.holds.retain(|hold| hold.until > now);
        if self.holds.len() > MOST_HOLDS {
            let until = self.binding_until();
            self.holds = vec![Hold {
                place: None,
                until,
                on_joining: false,
            }];
        }
    }

    /// The share of a cap of `max` this replica may grant at `now`: its share where it stands,
    /// and no more than any earlier share still binding. `None` until the ring has said
    /// anything (a limiter outside a fleet: the caller's own count applies).
    pub fn cap(&self, max: u64, now: u64) -> Option<u64> {
        let (replicas, rank) = self.place?;
        if !self.joined {
            return Some(0);
        }
        let share = |place: Option<(usize, usize)>| {
            place.map_or(0, |(replicas, rank)| slot_share(max, replicas, rank))
        };
        Some(
            self.holds
                .iter()
                .filter(|hold| hold.until > now)
                .map(|hold| share(hold.place))
                .fold(slot_share(max, replicas, rank), u64::min),
        )
    }

    /// Until when (engine ns) an earlier share may still bind: 0 when none does, and the
    /// largest value before this replica has joined.
    pub fn binding_until(&self) -> u64 {
        if self.place.is_some() && !self.joined {
            return u64::MAX;
        }
        self.holds.iter().map(|hold| hold.until).max().unwrap_or(0)
    }
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

    /// A replica of three holding 4 of 10 (rank 0) when the third dies: it grants no more
    /// than 4 until the dead one's leases may have ended, then 5. A replica that joins grants
    /// nothing until its peers' leases may have ended.
    #[test]
    fn a_share_grows_only_after_the_horizon() {
        let second = 1_000_000_000;
        let seconds = |peers: u64, departed: u64| LeaseHorizons {
            peers: Duration::from_secs(peers),
            departed: Duration::from_secs(departed),
        };
        let mut holds = SlotHolds::default();
        assert_eq!(holds.cap(10, 0), None, "no ring: no bound of its own");
        holds.moved(1, 0, false, seconds(0, 0), 0);
        assert_eq!(holds.cap(10, 0), Some(0), "not joined: nothing");
        assert_eq!(holds.binding_until(), u64::MAX);
        holds.moved(3, 0, true, seconds(5, 60), second);
        assert_eq!(holds.cap(10, second), Some(0), "just joined: nothing");
        assert_eq!(
            holds.cap(10, 6 * second),
            Some(4),
            "the peers' horizon only"
        );
        // The peers' own leases do not hold a share back; a departed peer's do.
        holds.moved(2, 0, true, seconds(60, 10), 7 * second);
        assert_eq!(holds.cap(10, 7 * second), Some(4), "the old share binds");
        assert_eq!(holds.cap(10, 17 * second - 1), Some(4));
        assert_eq!(holds.cap(10, 17 * second), Some(5), "then it grows");
        assert_eq!(holds.binding_until(), 17 * second);
        // A shrinking move takes effect at once.
        holds.moved(4, 3, true, seconds(60, 10), 20 * second);
        assert_eq!(holds.cap(10, 20 * second), Some(2));
        holds.moved(2, 1, true, seconds(60, 10), 21 * second);
        assert_eq!(holds.cap(10, 22 * second), Some(2), "the old share binds");
        // The departed peer's leases are done: the hold ends.
        holds.moved(2, 1, true, seconds(60, 0), 23 * second);
        assert_eq!(holds.cap(10, 23 * second), Some(5));
        // A joiner's hold ends when its peers release.
        let mut joiner = SlotHolds::default();
        joiner.moved(3, 2, true, seconds(60, 0), 0);
        assert_eq!(joiner.cap(10, second), Some(0));
        joiner.moved(3, 2, true, seconds(0, 0), 2 * second);
        assert_eq!(joiner.cap(10, 2 * second), Some(3));
        // A fleet with no lease anywhere has horizons of 0: nothing binds.
        let mut quiet = SlotHolds::default();
        quiet.moved(3, 1, true, seconds(0, 0), 0);
        quiet.moved(2, 1, true, seconds(0, 0), 1);
        assert_eq!(quiet.cap(10, 1), Some(5));
        assert_eq!(quiet.binding_until(), 0);
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

        /// Whatever the ring does, a replica never grants more than a share it held while a
        /// lease granted under it may still run (the departed peers' horizon said at each move
        /// after it), nor anything while its peers' leases from before it joined may (their
        /// horizon), nor more than its share now. The oracle keeps every place with the time
        /// its leases may run until and takes the minimum of those still binding;
        /// `slot_share` is the only shared piece.
        #[test]
        fn a_share_never_exceeds_one_held_within_the_horizon(
            moves in proptest::collection::vec(
                (1usize..6, 0usize..6, 0u64..50, 0u64..50, 1u64..20), 1..60,
            ),
            max in 0u64..40,
        ) {
            let mut holds = SlotHolds::default();
            // (place, until) of each place, u64::MAX while it is current.
            let mut history: Vec<((usize, usize), u64)> = Vec::new();
            let mut joining_until: Option<u64> = None;
            let mut now = 0;
            for (replicas, rank, peers, departed, step) in moves {
                now += step;
                let horizons = LeaseHorizons {
                    peers: Duration::from_nanos(peers),
                    departed: Duration::from_nanos(departed),
                };
                holds.moved(replicas, rank, true, horizons, now);
                let joining = joining_until.get_or_insert(now + peers);
                *joining = (*joining).min(now + peers);
                for held in history.iter_mut() {
                    held.1 = held.1.min(now + departed);
                }
                if history.last().map(|held| held.0) != Some((replicas, rank)) {
                    history.push(((replicas, rank), u64::MAX));
                }
                for probe in [now, now + 1, now + departed / 2, now + peers / 2, now + 50] {
                    let cap = holds.cap(max, probe).unwrap();
                    if joining_until.is_some_and(|until| until > probe) {
                        prop_assert_eq!(cap, 0);
                    }
                    for ((replicas, rank), until) in &history {
                        if *until > probe {
                            prop_assert!(cap <= slot_share(max, *replicas, *rank));
                        }
                    }
                }
            }
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

//! The limit maths: how a tenant's fleet-wide limits become this replica's local limits.
//! A pure function of (tenant limits, membership), so the ring can feed it and tests can
//! state its invariants.

use runtime_config::{RateLimitStrategy, TenantLimits};

/// A token bucket's shape: refill rate and capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub per_second: f64,
    pub burst: u64,
}

/// What one replica enforces for one limit of one tenant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LocalLimit {
    /// No bucket: everything passes (`request_rate: 0`).
    Unlimited,
    /// Nothing passes (`ingestion_rate: 0`).
    Deny,
    Limited(Rate),
}

impl LocalLimit {
    /// Seconds an idle bucket takes to refill completely; after that, dropping its state
    /// changes no decision.
    pub fn refill_seconds(&self) -> f64 {
        match self {
            LocalLimit::Limited(rate) => rate.burst as f64 / rate.per_second,
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

/// `weighted`'s ε: the local limits of all replicas sum to at most (1 + ε) × the fleet limit.
/// It is spent on the per-replica floor (ε ÷ N of the limit each), which lets a replica admit
/// a tenant's first requests before gossip has told it about them.
pub const WEIGHTED_EPSILON: f64 = 0.05;

/// A tenant's recent demand (offered per second, refused included), here and on the peers.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TenantDemand {
    pub own_requests: f64,
    pub own_items: f64,
    /// Sum over live, `ACTIVE`, recently heard peers.
    pub peer_requests: f64,
    pub peer_items: f64,
    /// The largest single request (in items) seen here recently: the burst never drops below
    /// it, so a large request can still pass where it lands.
    pub largest_request: u64,
    /// Whether this replica's view of the demand has settled (see `demand::SETTLING_SLOTS`);
    /// until then the share is at most the even one.
    pub settled: bool,
}

/// This replica's share of a tenant's limit under `weighted`: own demand ÷ fleet demand, at
/// least ε ÷ N. With no demand known anywhere, the even share 1 ÷ N.
pub fn weighted_share(own: f64, peers: f64, healthy_replicas: usize) -> f64 {
    let replicas = healthy_replicas.max(1) as f64;
    let floor = WEIGHTED_EPSILON / replicas;
    let own = own.max(0.0);
    let total = own + peers.max(0.0);
    if total.is_nan() || total <= 0.0 || total.is_infinite() {
        return 1.0 / replicas;
    }
    (own / total).clamp(floor, 1.0)
}

/// The local limits for a tenant, given the membership and (for `weighted`) its demand.
///
/// `divided` (Mimir's): the rate is divided by the healthy count, the burst is not, so the
/// fleet-wide start-up burst is N × burst. A count of 0 cannot happen (a replica counts
/// itself) and is treated as 1, so the local limit never exceeds the fleet-wide one.
///
/// `weighted`: rate and burst are multiplied by this replica's share of the tenant's demand
/// ([`weighted_share`]), so the fleet-wide rate and burst stay within (1 + ε) of the limit
/// however the balancer spreads the tenant. The ingestion burst never drops below the
/// largest recent request (capped at the configured burst), so that request can pass.
pub fn local_limits(
    limits: &TenantLimits,
    healthy_replicas: usize,
    demand: &TenantDemand,
) -> LocalLimits {
    let (request_share, ingestion_share, burst_floor) = match limits.rate_limit_strategy {
        RateLimitStrategy::Divided => {
            let share = 1.0 / healthy_replicas.max(1) as f64;
            (share, share, None)
        }
        RateLimitStrategy::Weighted => {
            let even = 1.0 / healthy_replicas.max(1) as f64;
            let settle = |share: f64| {
                if demand.settled {
                    share
                } else {
                    share.min(even)
                }
            };
            (
                settle(weighted_share(
                    demand.own_requests,
                    demand.peer_requests,
                    healthy_replicas,
                )),
                settle(weighted_share(
                    demand.own_items,
                    demand.peer_items,
                    healthy_replicas,
                )),
                Some(demand.largest_request),
            )
        }
    };
    let burst = |configured: u64, share: f64, floor: u64| match burst_floor {
        None => configured,
        Some(_) => ((configured as f64 * share).ceil() as u64)
            .max(floor)
            .clamp(1, configured.max(1)),
    };
    LocalLimits {
        request: if limits.request_rate == 0.0 {
            LocalLimit::Unlimited
        } else {
            LocalLimit::Limited(Rate {
                per_second: limits.request_rate * request_share,
                burst: burst(limits.request_burst_size, request_share, 1),
            })
        },
        ingestion: if limits.ingestion_rate == 0.0 {
            LocalLimit::Deny
        } else {
            LocalLimit::Limited(Rate {
                per_second: limits.ingestion_rate * ingestion_share,
                burst: burst(
                    limits.ingestion_burst_size,
                    ingestion_share,
                    burst_floor.unwrap_or(0),
                ),
            })
        },
    }
}

impl LocalLimits {
    /// Whether `other` is within 1 % of these limits: demand moves a little all the time, and
    /// rebuilding a bucket for every wobble would cost allocations for nothing.
    pub fn close_to(&self, other: &LocalLimits) -> bool {
        fn close(a: &LocalLimit, b: &LocalLimit) -> bool {
            match (a, b) {
                (LocalLimit::Limited(a), LocalLimit::Limited(b)) => {
                    let near = |x: f64, y: f64| (x - y).abs() <= 0.01 * x.abs().max(y.abs());
                    near(a.per_second, b.per_second) && near(a.burst as f64, b.burst as f64)
                }
                (a, b) => a == b,
            }
        }
        close(&self.request, &other.request) && close(&self.ingestion, &other.ingestion)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NONE: TenantDemand = TenantDemand {
        own_requests: 0.0,
        own_items: 0.0,
        peer_requests: 0.0,
        peer_items: 0.0,
        largest_request: 0,
        settled: true,
    };

    fn limits(ingestion_rate: f64, request_rate: f64) -> TenantLimits {
        TenantLimits {
            ingestion_rate,
            ingestion_burst_size: 1000,
            request_rate,
            request_burst_size: 10,
            ..TenantLimits::default()
        }
    }

    #[test]
    fn single_replica_enforces_the_fleet_limit() {
        let local = local_limits(&limits(500.0, 0.0), 1, &NONE);
        assert_eq!(
            local.ingestion,
            LocalLimit::Limited(Rate {
                per_second: 500.0,
                burst: 1000
            })
        );
        assert_eq!(local.request, LocalLimit::Unlimited);
    }

    #[test]
    fn zero_replicas_is_treated_as_one() {
        assert_eq!(
            local_limits(&limits(500.0, 5.0), 0, &NONE),
            local_limits(&limits(500.0, 5.0), 1, &NONE)
        );
    }

    #[test]
    fn zero_ingestion_rate_denies() {
        assert_eq!(
            local_limits(&limits(0.0, 0.0), 3, &NONE).ingestion,
            LocalLimit::Deny
        );
    }

    proptest! {
        /// Divided: the local rates over N replicas sum to the fleet rate; the burst is whole.
        #[test]
        fn divided_shares_sum_to_the_fleet_limit(rate in 0.001f64..1e9, n in 1usize..1000) {
            let local = local_limits(&limits(rate, rate), n, &NONE);
            for limit in [local.ingestion, local.request] {
                let LocalLimit::Limited(local_rate) = limit else { panic!("limited") };
                let sum = local_rate.per_second * n as f64;
                prop_assert!((sum - rate).abs() <= rate * 1e-9);
                prop_assert!(local_rate.per_second <= rate);
            }
        }

        /// A limit changing while N changes: the new local rate depends only on the new inputs.
        #[test]
        fn limit_and_membership_changing_together(
            a in 1.0f64..1e6, b in 1.0f64..1e6, n in 1usize..50, m in 1usize..50
        ) {
            let before = local_limits(&limits(a, 0.0), n, &NONE);
            let after = local_limits(&limits(b, 0.0), m, &NONE);
            prop_assert_eq!(after, local_limits(&limits(b, 0.0), m, &NONE));
            if a == b && n == m { prop_assert_eq!(before, after); }
            let LocalLimit::Limited(rate) = after.ingestion else { panic!("limited") };
            prop_assert!((rate.per_second - b / m as f64).abs() < 1e-6);
        }
    }
}

#[cfg(test)]
mod weighted_tests {
    use super::*;
    use proptest::prelude::*;

    fn weighted(rate: f64, burst: u64) -> TenantLimits {
        TenantLimits {
            ingestion_rate: rate,
            ingestion_burst_size: burst,
            rate_limit_strategy: RateLimitStrategy::Weighted,
            ..TenantLimits::default()
        }
    }

    fn shares(demands: &[f64]) -> Vec<f64> {
        let total: f64 = demands.iter().sum();
        demands
            .iter()
            .map(|own| weighted_share(*own, total - own, demands.len()))
            .collect()
    }

    fn demand(own: f64, peers: f64, largest: u64) -> TenantDemand {
        TenantDemand {
            own_items: own,
            peer_items: peers,
            largest_request: largest,
            settled: true,
            ..TenantDemand::default()
        }
    }

    #[test]
    fn an_unsettled_tenant_gets_at_most_the_even_share() {
        let unsettled = TenantDemand {
            settled: false,
            ..demand(30_000.0, 0.0, 100)
        };
        let local = local_limits(&weighted(9_000.0, 9_000), 3, &unsettled);
        assert_eq!(
            local.ingestion,
            LocalLimit::Limited(Rate {
                per_second: 3_000.0,
                burst: 3_000
            })
        );
        let settled = local_limits(&weighted(9_000.0, 9_000), 3, &demand(30_000.0, 0.0, 100));
        assert_eq!(
            settled.ingestion,
            LocalLimit::Limited(Rate {
                per_second: 9_000.0,
                burst: 9_000
            })
        );
    }

    #[test]
    fn all_traffic_on_one_replica_gets_the_whole_limit() {
        assert_eq!(shares(&[30_000.0, 0.0, 0.0])[0], 1.0);
        let local = local_limits(&weighted(10_000.0, 10_000), 3, &demand(30_000.0, 0.0, 100));
        assert_eq!(
            local.ingestion,
            LocalLimit::Limited(Rate {
                per_second: 10_000.0,
                burst: 10_000
            })
        );
    }

    #[test]
    fn skewed_split_gets_proportional_shares() {
        let shares = shares(&[7.0, 2.0, 1.0]);
        assert!((shares[0] - 0.7).abs() < 1e-12 && (shares[1] - 0.2).abs() < 1e-12);
        assert!((shares[2] - 0.1).abs() < 1e-12);
    }

    #[test]
    fn idle_replicas_keep_a_floor_and_unknown_demand_splits_evenly() {
        let shares = shares(&[100.0, 0.0, 0.0]);
        assert_eq!(shares[1], WEIGHTED_EPSILON / 3.0);
        assert_eq!(weighted_share(0.0, 0.0, 4), 0.25);
    }

    #[test]
    fn burst_is_weighted_too_but_never_below_the_largest_request() {
        let local = local_limits(&weighted(10_000.0, 200_000), 3, &demand(1.0, 9.0, 100));
        assert_eq!(
            local.ingestion,
            LocalLimit::Limited(Rate {
                per_second: 1_000.0,
                burst: 20_000
            })
        );
        let local = local_limits(&weighted(10_000.0, 200_000), 3, &demand(1.0, 9.0, 50_000));
        assert_eq!(
            local.ingestion,
            LocalLimit::Limited(Rate {
                per_second: 1_000.0,
                burst: 50_000
            })
        );
        // …but never above the configured burst: a larger request can never pass anywhere.
        let local = local_limits(&weighted(10_000.0, 200_000), 3, &demand(1.0, 9.0, 900_000));
        assert_eq!(
            local.ingestion,
            LocalLimit::Limited(Rate {
                per_second: 1_000.0,
                burst: 200_000
            })
        );
    }

    #[test]
    fn a_peer_that_leaves_hands_its_share_back() {
        // Peers are summed over live ACTIVE peers only (the ring's rule); once one leaves,
        // its demand is no longer in the sum.
        let before = weighted_share(10.0, 20.0, 3);
        let after = weighted_share(10.0, 10.0, 2);
        assert!(after > before);
        assert_eq!(weighted_share(10.0, 0.0, 1), 1.0);
    }

    proptest! {
        /// With consistent views, the shares sum to at most 1 + ε, so the fleet admits at most
        /// (1 + ε) × the limit, and every share is at least the floor.
        #[test]
        fn shares_sum_to_at_most_one_plus_epsilon(demands in prop::collection::vec(0.0f64..1e6, 1..50)) {
            let shares = shares(&demands);
            let sum: f64 = shares.iter().sum();
            prop_assert!(sum <= 1.0 + WEIGHTED_EPSILON + 1e-9, "sum {sum}");
            let floor = WEIGHTED_EPSILON / demands.len() as f64;
            prop_assert!(shares.iter().all(|s| *s >= floor - 1e-15 && *s <= 1.0));
        }

        /// More own demand never means a smaller share; more peer demand never a larger one.
        #[test]
        fn shares_respond_monotonically(own in 0.0f64..1e6, more in 0.0f64..1e6, peers in 0.0f64..1e6, n in 1usize..20) {
            prop_assume!(own + peers > 0.0);
            prop_assert!(weighted_share(own + more, peers, n) >= weighted_share(own, peers, n));
            prop_assert!(weighted_share(own, peers + more, n) <= weighted_share(own, peers, n));
        }

        /// The local limits of all replicas sum to at most (1 + ε) × the fleet limit, rate and
        /// burst alike (bursts may add the largest request per replica on top, by design).
        #[test]
        fn local_limits_sum_within_epsilon(demands in prop::collection::vec(0.0f64..1e6, 1..20)) {
            let limits = weighted(10_000.0, 200_000);
            let total: f64 = demands.iter().sum();
            let mut rate_sum = 0.0;
            let mut burst_sum = 0u64;
            for own in &demands {
                let local = local_limits(&limits, demands.len(), &demand(*own, total - own, 0));
                let LocalLimit::Limited(rate) = local.ingestion else { panic!("limited") };
                rate_sum += rate.per_second;
                burst_sum += rate.burst;
            }
            prop_assert!(rate_sum <= 10_000.0 * (1.0 + WEIGHTED_EPSILON) + 1e-6);
            // Each burst is rounded up to a whole item.
            prop_assert!(burst_sum as f64 <= 200_000.0 * (1.0 + WEIGHTED_EPSILON) + demands.len() as f64);
        }
    }
}

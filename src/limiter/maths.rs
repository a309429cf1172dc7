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

/// The local limits for a tenant, given how many healthy replicas share its traffic.
///
/// `divided` (Mimir's): the rate is divided by the healthy count, the burst is not, so the
/// fleet-wide start-up burst is N × burst. A count of 0 cannot happen (a replica counts
/// itself) and is treated as 1, so the local limit never exceeds the fleet-wide one.
pub fn local_limits(limits: &TenantLimits, healthy_replicas: usize) -> LocalLimits {
    let share = match limits.rate_limit_strategy {
        RateLimitStrategy::Divided => 1.0 / healthy_replicas.max(1) as f64,
    };
    LocalLimits {
        request: if limits.request_rate == 0.0 {
            LocalLimit::Unlimited
        } else {
            LocalLimit::Limited(Rate {
                per_second: limits.request_rate * share,
                burst: limits.request_burst_size,
            })
        },
        ingestion: if limits.ingestion_rate == 0.0 {
            LocalLimit::Deny
        } else {
            LocalLimit::Limited(Rate {
                per_second: limits.ingestion_rate * share,
                burst: limits.ingestion_burst_size,
            })
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
        let local = local_limits(&limits(500.0, 0.0), 1);
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
            local_limits(&limits(500.0, 5.0), 0),
            local_limits(&limits(500.0, 5.0), 1)
        );
    }

    #[test]
    fn zero_ingestion_rate_denies() {
        assert_eq!(
            local_limits(&limits(0.0, 0.0), 3).ingestion,
            LocalLimit::Deny
        );
    }

    proptest! {
        /// Divided: the local rates over N replicas sum to the fleet rate; the burst is whole.
        #[test]
        fn divided_shares_sum_to_the_fleet_limit(rate in 0.001f64..1e9, n in 1usize..1000) {
            let local = local_limits(&limits(rate, rate), n);
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
            let before = local_limits(&limits(a, 0.0), n);
            let after = local_limits(&limits(b, 0.0), m);
            prop_assert_eq!(after, local_limits(&limits(b, 0.0), m));
            if a == b && n == m { prop_assert_eq!(before, after); }
            let LocalLimit::Limited(rate) = after.ingestion else { panic!("limited") };
            prop_assert!((rate.per_second - b / m as f64).abs() < 1e-6);
        }
    }
}

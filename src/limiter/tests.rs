use std::sync::Arc;
use std::time::Duration;

use governor::clock::FakeRelativeClock;
use runtime_config::{Defaults, RuntimeConfig};

use super::*;

fn config(yaml: &str) -> Arc<RuntimeConfig> {
    Arc::new(RuntimeConfig::parse(yaml, Defaults::default()).unwrap())
}

fn limiter(yaml: &str) -> (Limiter<FakeRelativeClock>, FakeRelativeClock) {
    let clock = FakeRelativeClock::default();
    let limiter = Limiter::with_clock(
        config(yaml),
        Duration::from_secs(60),
        Arc::new(Metrics::new()),
        clock.clone(),
    );
    (limiter, clock)
}

/// `divided`, so the bucket shapes below follow from the healthy count alone.
const TEN_PER_SECOND: &str = "overrides:\n  t:\n    ingestion_rate: 10\n    ingestion_burst_size: 10\n    rate_limit_strategy: divided\n";

fn check(limiter: &Limiter<FakeRelativeClock>, name: &str, cost: u64) -> Result<(), Rejection> {
    let tenant = limiter.tenant(name).unwrap();
    limiter.check(name, &tenant, LimitKind::Ingestion, cost)
}

#[test]
fn rejection_names_fleet_limit_and_wait() {
    let (limiter, _clock) = limiter(TEN_PER_SECOND);
    assert_eq!(check(&limiter, "t", 10), Ok(()));
    let rejection = check(&limiter, "t", 2).unwrap_err();
    assert_eq!(
        rejection,
        Rejection {
            kind: LimitKind::Ingestion,
            cause: RejectionCause::RateLimited {
                wait: Duration::from_millis(200)
            },
            limit: 10.0,
            burst: 10,
            local_limit: 10.0,
            cost: 2,
        }
    );
    assert_eq!(
        check(&limiter, "t", 11).unwrap_err().cause,
        RejectionCause::LargerThanBurst
    );
}

#[test]
fn request_rate_zero_is_unlimited_and_ingestion_rate_zero_blocks() {
    let (limiter, _clock) = limiter("overrides:\n  blocked:\n    ingestion_rate: 0\n");
    let tenant = limiter.tenant("any").unwrap();
    for _ in 0..10_000 {
        assert_eq!(limiter.check("any", &tenant, LimitKind::Request, 1), Ok(()));
    }
    assert_eq!(
        check(&limiter, "blocked", 1).unwrap_err().cause,
        RejectionCause::Blocked
    );
}

#[test]
fn reload_applies_the_new_limit_without_a_fresh_burst() {
    let (limiter, clock) = limiter(TEN_PER_SECOND);
    assert_eq!(check(&limiter, "t", 10), Ok(())); // bucket empty
                                                  // Raise the limit: a naive rebuild would hand out a full burst of 100 now.
    limiter.set_config(config(
        "overrides:\n  t:\n    ingestion_rate: 100\n    ingestion_burst_size: 100\n",
    ));
    assert!(check(&limiter, "t", 1).is_err(), "no fresh burst on reload");
    // The new rate is in force: 100/s refills 10 tokens in 100 ms.
    clock.advance(Duration::from_millis(100));
    assert_eq!(check(&limiter, "t", 10), Ok(()));
    assert!(check(&limiter, "t", 1).is_err());
}

#[test]
fn lowering_the_limit_caps_held_tokens_at_the_new_burst() {
    let (limiter, _clock) = limiter(TEN_PER_SECOND);
    check(&limiter, "t", 1).unwrap(); // create state; 9 left
    limiter.set_config(config(
        "overrides:\n  t:\n    ingestion_rate: 10\n    ingestion_burst_size: 4\n",
    ));
    assert_eq!(check(&limiter, "t", 4), Ok(()));
    assert!(check(&limiter, "t", 1).is_err());
}

#[test]
fn unchanged_limits_survive_an_unrelated_reload_exactly() {
    let (limiter, _clock) = limiter(TEN_PER_SECOND);
    check(&limiter, "t", 7).unwrap();
    limiter.set_config(config(&format!(
        "{TEN_PER_SECOND}  other:\n    ingestion_rate: 5\n"
    )));
    assert_eq!(check(&limiter, "t", 3), Ok(()));
    assert!(check(&limiter, "t", 1).is_err());
}

#[test]
fn healthy_replicas_divide_the_rate_not_the_burst() {
    let (limiter, clock) = limiter(TEN_PER_SECOND);
    limiter.set_healthy_replicas(2);
    assert_eq!(check(&limiter, "t", 10), Ok(())); // burst not divided
    let rejection = check(&limiter, "t", 1).unwrap_err();
    assert_eq!(rejection.local_limit, 5.0);
    assert_eq!(
        rejection.limit, 10.0,
        "the fleet-wide limit is what a 429 names"
    );
    clock.advance(Duration::from_millis(200)); // 5/s → one token per 200 ms
    assert_eq!(check(&limiter, "t", 1), Ok(()));
    assert!(check(&limiter, "t", 1).is_err());
}

#[test]
fn idle_tenants_are_evicted_only_once_their_buckets_are_full() {
    // Burst 1000 at 10/s takes 100 s to refill, longer than the 60 s idle timeout.
    let (limiter, clock) =
        limiter("overrides:\n  slow:\n    ingestion_rate: 10\n    ingestion_burst_size: 1000\n");
    check(&limiter, "slow", 1000).unwrap();
    check(&limiter, "fast", 1).unwrap();
    assert_eq!(limiter.tracked_tenants(), 2);
    clock.advance(Duration::from_secs(62));
    assert_eq!(
        limiter.evict_idle(),
        1,
        "fast is idle and full; slow is still refilling"
    );
    assert!(
        check(&limiter, "slow", 1000).is_err(),
        "slow kept its state"
    );
    clock.advance(Duration::from_secs(102));
    assert_eq!(limiter.evict_idle(), 1);
    assert_eq!(limiter.tracked_tenants(), 0);
}

#[test]
fn random_tenant_ids_do_not_grow_memory_or_metrics_without_bound() {
    let (limiter, clock) = limiter("");
    for round in 0..5 {
        for i in 0..2_000 {
            check(&limiter, &format!("random-{round}-{i}"), 1).unwrap();
        }
        clock.advance(Duration::from_secs(62));
        limiter.evict_idle();
        assert_eq!(limiter.tracked_tenants(), 0);
    }
    let families = limiter.metrics.registry.gather();
    let per_tenant_series: usize = families
        .iter()
        .filter(|family| {
            family.name().starts_with("weir_discarded") || family.name().contains("received")
        })
        .map(|family| family.get_metric().len())
        .sum();
    assert_eq!(per_tenant_series, 0);
}

#[test]
fn tenant_cap_refuses_only_new_tenants_until_idle_ones_go() {
    let (limiter, clock) = limiter("");
    let limiter = limiter.with_max_tenants(2);
    assert!(limiter.tenant("a").is_ok());
    assert!(limiter.tenant("b").is_ok());
    assert_eq!(
        limiter.tenant("c").err(),
        Some(TooManyTenants { max_tenants: 2 })
    );
    assert!(limiter.tenant("a").is_ok(), "known tenants keep working");
    clock.advance(Duration::from_secs(62));
    limiter.evict_idle();
    assert!(limiter.tenant("c").is_ok());
}

#[test]
fn membership_change_carries_tokens_over() {
    let (limiter, clock) = limiter(TEN_PER_SECOND);
    limiter.set_healthy_replicas(3);
    assert_eq!(check(&limiter, "t", 6), Ok(())); // 4 tokens left, refilling at 10/3 per s
    limiter.set_healthy_replicas(2); // a peer left: 5/s from now, same tokens
    assert_eq!(check(&limiter, "t", 4), Ok(()));
    assert!(
        check(&limiter, "t", 1).is_err(),
        "no fresh burst when the count changes"
    );
    clock.advance(Duration::from_millis(200));
    assert_eq!(check(&limiter, "t", 1), Ok(()));
    assert!(check(&limiter, "t", 1).is_err());
}

#[test]
fn weighted_grows_the_local_burst_for_a_request_larger_than_any_recent_one() {
    let (limiter, _clock) = limiter(
        "overrides:\n  w:\n    ingestion_rate: 100\n    ingestion_burst_size: 1000\n    rate_limit_strategy: weighted\n",
    );
    // Three replicas, no demand known yet: the even share, so a local burst of 334.
    limiter.set_healthy_replicas(3);
    // 500 is more than the local burst but within the configured one: the burst grows to 500,
    // the 334 tokens held carry over, and the request waits for the rest instead of being
    // told it can never pass.
    let rejection = check(&limiter, "w", 500).unwrap_err();
    assert!(
        matches!(rejection.cause, RejectionCause::RateLimited { .. }),
        "not 'can never pass': {rejection:?}"
    );
    // Beyond the configured burst it truly can never pass.
    assert_eq!(
        check(&limiter, "w", 1001).unwrap_err().cause,
        RejectionCause::LargerThanBurst
    );
}

#[test]
fn only_tenants_with_recent_demand_are_reported_to_the_ring() {
    let (limiter, _clock) = limiter("");
    check(&limiter, "busy", 10).unwrap();
    let reports = limiter.tick_demand();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].tenant, "busy");
    assert_eq!(reports[0].demand.items_per_second, 10.0);
    // Idle for longer than the window (and settled by then): no longer reported.
    for _ in 0..demand::SETTLING_SLOTS {
        limiter.tick_demand();
    }
    assert!(limiter.tick_demand().is_empty());
}

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::FakeRelativeClock;
use runtime_config::{Defaults, RuntimeConfig};

use super::*;

fn config(yaml: &str) -> Arc<RuntimeConfig> {
    Arc::new(RuntimeConfig::parse(yaml, Defaults::default()).unwrap())
}

/// Counts what the engine tells its embedder.
#[derive(Default)]
struct Counting {
    live: Arc<AtomicUsize>,
}

impl TenantHooks for Counting {
    type Data = ();
    fn create(&self, _tenant: &str) {
        self.live.fetch_add(1, Ordering::Relaxed);
    }
    fn evicted(&self, _tenant: &str) {
        self.live.fetch_sub(1, Ordering::Relaxed);
    }
}

type TestLimiter = Limiter<Counting, FakeRelativeClock>;

fn limiter(yaml: &str) -> (TestLimiter, FakeRelativeClock) {
    let clock = FakeRelativeClock::default();
    let limiter = Limiter::with_clock(
        config(yaml),
        Duration::from_secs(60),
        Counting::default(),
        clock.clone(),
    );
    (limiter, clock)
}

/// `divided`, so the bucket shapes below follow from the healthy count alone.
const TEN_PER_SECOND: &str = "overrides:\n  t:\n    ingestion_rate: 10\n    ingestion_burst_size: 10\n    rate_limit_strategy: divided\n";

const WEIGHTED: &str = "overrides:\n  w:\n    ingestion_rate: 100\n    ingestion_burst_size: 100\n    rate_limit_strategy: weighted\n";

fn check(limiter: &TestLimiter, name: &str, cost: u64) -> Result<(), Rejection> {
    let tenant = limiter.tenant(name).unwrap();
    limiter.check(&tenant, LimitKind::Ingestion, cost)
}

fn peers(tenant: &str, items: u64, items_level: Option<f64>) -> Arc<PeerUsage> {
    Arc::new(PeerUsage::from_iter([(
        tenant.into(),
        PeerTotals {
            items,
            items_level,
            ..PeerTotals::default()
        },
    )]))
}

#[test]
fn rejection_names_fleet_limit_wait_and_what_remains() {
    let (limiter, _clock) = limiter(TEN_PER_SECOND);
    assert_eq!(check(&limiter, "t", 7), Ok(()));
    let rejection = check(&limiter, "t", 5).unwrap_err();
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
            cost: 5,
            remaining: 3,
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
        assert_eq!(limiter.check(&tenant, LimitKind::Request, 1), Ok(()));
    }
    assert_eq!(
        check(&limiter, "blocked", 1).unwrap_err().cause,
        RejectionCause::Blocked
    );
}

#[test]
fn reload_applies_the_new_limit_without_a_fresh_burst() {
    for strategy in ["divided", "weighted"] {
        let (limiter, clock) = limiter(&TEN_PER_SECOND.replace("divided", strategy));
        assert_eq!(check(&limiter, "t", 10), Ok(())); // bucket empty
                                                      // Raise the limit: a naive rebuild would hand out a full burst of 100 now.
        limiter.set_config(config(&format!(
            "overrides:\n  t:\n    ingestion_rate: 100\n    ingestion_burst_size: 100\n    rate_limit_strategy: {strategy}\n"
        )));
        assert!(
            check(&limiter, "t", 1).is_err(),
            "{strategy}: no fresh burst"
        );
        // The new rate is in force: 100/s refills 10 tokens in 100 ms.
        clock.advance(Duration::from_millis(100));
        assert_eq!(check(&limiter, "t", 10), Ok(()), "{strategy}");
        assert!(check(&limiter, "t", 1).is_err(), "{strategy}");
    }
}

/// The reproduction: burst 10 000 at 10 000/s, drained; the burst raised to 20 000;
/// 4 s later a request of 15 000 must pass. Limits are in force from the moment they are
/// loaded, for an idle tenant too, not from its next request.
#[test]
fn a_limit_change_is_in_force_from_when_it_is_loaded() {
    for strategy in ["divided", "weighted"] {
        let yaml = |burst: u64| {
            format!(
                "overrides:\n  t:\n    ingestion_rate: 10000\n    ingestion_burst_size: {burst}\n    rate_limit_strategy: {strategy}\n"
            )
        };
        let (limiter, clock) = limiter(&yaml(10_000));
        assert_eq!(check(&limiter, "t", 10_000), Ok(()));
        limiter.set_config(config(&yaml(20_000)));
        clock.advance(Duration::from_secs(4));
        assert_eq!(check(&limiter, "t", 15_000), Ok(()), "{strategy}");
        // And no fresh burst: 5 000 left of the 20 000 that accrued.
        let rejection = check(&limiter, "t", 6_000).unwrap_err();
        assert_eq!(
            rejection.remaining, 5_000,
            "{strategy}: r= is what is really left"
        );
    }
}

#[test]
fn lowering_the_limit_caps_held_tokens_at_the_new_burst() {
    let (limiter, _clock) = limiter(TEN_PER_SECOND);
    check(&limiter, "t", 1).unwrap(); // create state; 9 left
    limiter.set_config(config(
        "overrides:\n  t:\n    ingestion_rate: 10\n    ingestion_burst_size: 4\n    rate_limit_strategy: divided\n",
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
fn switching_strategy_carries_tokens_over() {
    let (limiter, _clock) = limiter(TEN_PER_SECOND);
    check(&limiter, "t", 6).unwrap(); // 4 left
    limiter.set_config(config(&TEN_PER_SECOND.replace("divided", "weighted")));
    assert_eq!(check(&limiter, "t", 4), Ok(()));
    assert!(check(&limiter, "t", 1).is_err());
    limiter.set_config(config(TEN_PER_SECOND));
    assert!(
        check(&limiter, "t", 1).is_err(),
        "still empty under divided"
    );
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
fn weighted_alone_is_the_fleet_bucket() {
    let (limiter, clock) = limiter(WEIGHTED);
    assert_eq!(check(&limiter, "w", 100), Ok(()));
    assert!(check(&limiter, "w", 1).is_err());
    clock.advance(Duration::from_millis(500));
    assert_eq!(check(&limiter, "w", 50), Ok(()));
    assert_eq!(
        check(&limiter, "w", 101).unwrap_err().cause,
        RejectionCause::LargerThanBurst
    );
}

/// A refund puts the tokens back in the meter they came from, once; under `weighted` the
/// count gossip carries goes down with it, and a peer that saw the higher count charges
/// nothing for the tokens given back.
#[tokio::test]
async fn a_refund_gives_the_tokens_back_to_their_meter() {
    // weighted: 100 taken, 60 given back: 60 pass again, not 61.
    let (weighted, _clock) = limiter(WEIGHTED);
    let tenant = weighted.tenant("w").unwrap();
    let taken = weighted
        .admit_within(&tenant, LimitKind::Ingestion, 100, Duration::ZERO)
        .await
        .unwrap()
        .taken;
    assert_eq!(weighted.usage_reports()[0].items, 100);
    weighted.refund(&tenant, Taken { cost: 60, ..taken });
    assert_eq!(weighted.usage_reports()[0].items, 40);
    assert_eq!(check(&weighted, "w", 60), Ok(()));
    assert!(check(&weighted, "w", 1).is_err());

    // A peer that applied the count of 100 charges only what goes beyond it: the 40 still
    // counted and the 60 spent again make 100, nothing new.
    let (peer, _peer_clock) = limiter(WEIGHTED);
    peer.tenant("w").unwrap();
    peer.apply_peer_usage(peers("w", 0, None), Duration::ZERO, None);
    peer.apply_peer_usage(peers("w", 100, None), Duration::ZERO, None);
    peer.apply_peer_usage(
        peers("w", weighted.usage_reports()[0].items, None),
        Duration::ZERO,
        None,
    );
    assert_eq!(peer.tenant_views()[0].fleet_level.1, Some(0.0));

    // divided: the governor bucket cannot take tokens back; the credit beside it is spent
    // once.
    let (divided, _clock) = limiter(TEN_PER_SECOND);
    let tenant = divided.tenant("t").unwrap();
    let taken = divided
        .admit_within(&tenant, LimitKind::Ingestion, 10, Duration::ZERO)
        .await
        .unwrap()
        .taken;
    assert!(check(&divided, "t", 1).is_err());
    divided.refund(&tenant, taken);
    assert_eq!(check(&divided, "t", 10), Ok(()));
    assert!(check(&divided, "t", 1).is_err());
}

#[test]
fn peer_admissions_are_charged_and_the_view_waits_out_the_debt() {
    let (limiter, clock) = limiter(WEIGHTED);
    limiter.set_healthy_replicas(3);
    // The peers have served this tenant: it is known to the fleet, so it does not settle.
    limiter.apply_peer_usage(peers("w", 0, None), Duration::ZERO, None);
    assert_eq!(check(&limiter, "w", 60), Ok(()));
    // The peers report 150 more: the view owes 110.
    limiter.apply_peer_usage(peers("w", 150, None), Duration::ZERO, None);
    clock.advance(Duration::from_secs(1)); // +100
    assert!(check(&limiter, "w", 1).is_err(), "still 10 in debt");
    clock.advance(Duration::from_millis(200));
    assert_eq!(check(&limiter, "w", 10), Ok(()));
    // A report already applied is not charged twice; an older (smaller) one changes nothing.
    limiter.apply_peer_usage(peers("w", 150, None), Duration::ZERO, None);
    limiter.apply_peer_usage(peers("w", 100, None), Duration::ZERO, None);
    assert_eq!(limiter.tenant_views()[0].fleet_level.1, Some(0.0));
}

/// While a tenant is contended, the view leaves what the peers have likely spent unreported;
/// never so much that a request as large as the burst could not pass from a full bucket
/// (vmagent sends blocks of 10 000 rows, as large as a burst of 10 000).
#[test]
fn a_request_of_the_whole_burst_passes_from_a_full_bucket_while_contended() {
    let (limiter, clock) = limiter(WEIGHTED);
    limiter.set_healthy_replicas(3);
    limiter.apply_peer_usage(peers("w", 0, None), Duration::ZERO, None);
    assert_eq!(check(&limiter, "w", 1), Ok(()));
    clock.advance(Duration::from_millis(500));
    // The peers spend 50 in half a second: a rate of about 100/s.
    limiter.apply_peer_usage(peers("w", 50, None), Duration::ZERO, None);
    assert!(check(&limiter, "w", 100).is_err(), "50 left: contended now");
    clock.advance(Duration::from_millis(600)); // full again
    limiter.apply_peer_usage(peers("w", 50, None), Duration::ZERO, None);
    clock.advance(Duration::from_millis(100));
    assert_eq!(limiter.tenant_views()[0].fleet_level.1, Some(100.0), "full");
    assert_eq!(check(&limiter, "w", 100), Ok(()));
}

#[test]
fn a_backdated_report_counts_the_refill_since() {
    let (limiter, clock) = limiter(WEIGHTED);
    limiter.apply_peer_usage(peers("w", 0, None), Duration::ZERO, None);
    check(&limiter, "w", 1).unwrap();
    clock.advance(Duration::from_secs(2));
    // 100 spent by a peer about a second ago: the bucket has refilled since.
    limiter.apply_peer_usage(peers("w", 100, None), Duration::from_secs(1), None);
    assert_eq!(limiter.tenant_views()[0].fleet_level.1, Some(100.0));
}

/// A replica stopped for 8 s hears on its return what its peers admitted meanwhile, 0.6 L a
/// second under the limit: charged over the silence, with its refill, the view is full, not
/// in a debt of 4.8 s of the limit that refused the tenant for seconds after.
#[test]
fn a_report_after_a_silence_is_charged_over_it() {
    let (limiter, clock) = limiter(WEIGHTED);
    limiter.set_healthy_replicas(3);
    limiter.apply_peer_usage(peers("w", 0, None), Duration::ZERO, None);
    check(&limiter, "w", 1).unwrap();
    clock.advance(Duration::from_secs(8));
    limiter.apply_peer_usage(
        peers("w", 480, None),
        Duration::from_millis(150),
        Some(Duration::from_secs(8)),
    );
    assert_eq!(limiter.tenant_views()[0].fleet_level.1, Some(100.0));
    assert_eq!(check(&limiter, "w", 100), Ok(()));
    // Over the limit while this replica was away (1.5 L for 8 s, their views' debt and all):
    // the view starts empty, as the fleet's bucket is.
    clock.advance(Duration::from_secs(8));
    limiter.apply_peer_usage(
        peers("w", 480 + 1_200, None),
        Duration::from_millis(150),
        Some(Duration::from_secs(8)),
    );
    let level = limiter.tenant_views()[0].fleet_level.1.unwrap();
    assert!(level <= 0.0, "{level}");
}

/// A quiet fleet is not a stalled replica: a tenant idle for 5 s, then a peer admits a burst
/// and reports it. That report is of now, not of the quiet time, and is charged whole: dated
/// from the start of the quiet time, every replica admitted its own burst on top.
#[test]
fn a_report_after_a_quiet_time_is_charged_as_of_now() {
    let (limiter, clock) = limiter(WEIGHTED);
    limiter.set_healthy_replicas(3);
    limiter.apply_peer_usage(peers("w", 0, None), Duration::ZERO, None);
    check(&limiter, "w", 1).unwrap();
    clock.advance(Duration::from_secs(5));
    limiter.apply_peer_usage(peers("w", 100, None), Duration::from_millis(150), None);
    let level = limiter.tenant_views()[0].fleet_level.1.unwrap();
    assert!(level <= 15.0, "{level}");
    assert!(check(&limiter, "w", 50).is_err(), "the peer took the burst");
}

/// The same replica, its sockets holding a backlog of pushes that it admits on resume between
/// two peers' first reports: the peers' 8 s are charged before the backlog, when they
/// happened, the second report's too (it came within a second of the first). The
/// fleet's bucket, full when the replica stopped (0.6 L spent of L), is then emptied by the
/// backlog, not 4.8 s of the limit in debt, and the tenant's next pushes, 0.9 L in all,
/// pass as the refill comes. Charged after the backlog, they were refused for 8 s.
#[test]
fn a_backlog_admitted_on_resume_is_ordered_after_the_silence() {
    let (limiter, clock) = limiter(WEIGHTED);
    limiter.set_healthy_replicas(3);
    limiter.apply_peer_usage(peers("w", 0, None), Duration::ZERO, None);
    check(&limiter, "w", 1).unwrap();
    clock.advance(Duration::from_secs(8));
    // One peer's report comes first, the backlog is admitted, then the other peer's report.
    limiter.apply_peer_usage(
        peers("w", 240, None),
        Duration::from_millis(150),
        Some(Duration::from_secs(8)),
    );
    assert_eq!(
        check(&limiter, "w", 100),
        Ok(()),
        "the backlog, from a full view"
    );
    clock.advance(Duration::from_millis(50));
    limiter.apply_peer_usage(
        peers("w", 480, None),
        Duration::from_millis(150),
        Some(Duration::from_millis(8_050)),
    );
    let level = limiter.tenant_views()[0].fleet_level.1.unwrap();
    assert!((0.0..=5.0).contains(&level), "{level}");
    // The other order: the backlog first, then a report of a little, then the rest. The
    // little one must not take the backlog into the mark the rest is put before.
    let (other, clock2) = self::limiter(WEIGHTED);
    other.set_healthy_replicas(3);
    other.apply_peer_usage(peers("w", 0, None), Duration::ZERO, None);
    check(&other, "w", 1).unwrap();
    clock2.advance(Duration::from_secs(8));
    assert_eq!(check(&other, "w", 100), Ok(()));
    other.apply_peer_usage(
        peers("w", 10, None),
        Duration::from_millis(150),
        Some(Duration::from_secs(8)),
    );
    clock2.advance(Duration::from_millis(50));
    other.apply_peer_usage(
        peers("w", 480, None),
        Duration::from_millis(150),
        Some(Duration::from_millis(8_050)),
    );
    let level = other.tenant_views()[0].fleet_level.1.unwrap();
    assert!((0.0..=10.0).contains(&level), "{level}");
    // The peers go on at 0.6 L, this replica at 0.3 L: each of its pushes passes.
    for second in 1..=3 {
        for _ in 0..10 {
            clock.advance(Duration::from_millis(100));
            assert_eq!(check(&limiter, "w", 3), Ok(()), "second {second}");
        }
        limiter.apply_peer_usage(peers("w", 480 + 60 * second, None), Duration::ZERO, None);
    }
}

/// For a second after the first report that ends a silence, the view promises nothing ahead:
/// a resumed replica's backlog is checked again as the refill comes, not reserved 3 s ahead
/// of the peers, which do not charge what a returning peer counts on its return.
#[test]
fn nothing_is_reserved_ahead_for_a_second_after_a_silence() {
    let (limiter, clock) = limiter(WEIGHTED);
    limiter.set_healthy_replicas(3);
    limiter.apply_peer_usage(peers("w", 0, None), Duration::ZERO, None);
    let tenant = limiter.tenant("w").unwrap();
    let within =
        |cost| limiter.check_within(&tenant, LimitKind::Ingestion, cost, Duration::from_secs(3));
    assert_eq!(within(100), Ok(Duration::ZERO));
    assert!(
        within(50).unwrap() > Duration::ZERO,
        "heard: reserved ahead"
    );
    clock.advance(Duration::from_secs(8));
    limiter.apply_peer_usage(
        peers("w", 0, None),
        Duration::ZERO,
        Some(Duration::from_secs(8)),
    );
    assert_eq!(within(100), Ok(Duration::ZERO), "the view refilled");
    assert!(
        within(50).is_err(),
        "just back: checked again, not reserved"
    );
    for _ in 0..2 {
        clock.advance(Duration::from_millis(600));
        limiter.apply_peer_usage(peers("w", 0, None), Duration::ZERO, None);
    }
    assert_eq!(within(100), Ok(Duration::ZERO));
    let wait = within(50).unwrap();
    assert!(
        wait > Duration::ZERO,
        "back a second: reserved ahead ({wait:?})"
    );
}

/// A held push reserves from the settling share too, and waits for it; but the first request
/// of a tenant new to the fleet fits at once, however much larger than the share it is.
#[test]
fn settling_reservations_wait_for_the_share_and_the_first_request_waits_for_nothing() {
    let (limiter, _clock) = limiter(WEIGHTED);
    limiter.set_healthy_replicas(4);
    let tenant = limiter.tenant("w").unwrap();
    let within =
        |cost| limiter.check_within(&tenant, LimitKind::Ingestion, cost, Duration::from_secs(3));
    // 90 against a share of 25: the first request fits, and is not told to wait 2.6 s.
    assert_eq!(within(90), Ok(Duration::ZERO));
    // The next one waits until the share has grown to 100 at 25/s: 3 s, the most allowed.
    let wait = within(10).unwrap();
    assert!(
        (Duration::from_millis(2_999)..=Duration::from_millis(3_000)).contains(&wait),
        "{wait:?}"
    );
    // And one more does not fit the share within 3 s: refused, and told to come back when the
    // tenant has settled (1 s), when the fleet view alone decides, not when the share would
    // have grown to it.
    assert!(matches!(
        within(1).unwrap_err().cause,
        RejectionCause::RateLimited { wait } if wait == Duration::from_secs(1)
    ));
}

/// A refusal while the tenant settles says when it can pass: once settled, by the fleet view,
/// not when the share would have grown to it. L = 10, B = 100 on two replicas: the share is
/// 50, and 60 more after 60 would wait 14 s for it, where the fleet view needs 2.
#[test]
fn a_refusal_while_settling_waits_for_the_fleet_view_not_the_share() {
    let (limiter, clock) =
        limiter("overrides:\n  w:\n    ingestion_rate: 10\n    ingestion_burst_size: 100\n");
    limiter.set_healthy_replicas(2);
    assert_eq!(check(&limiter, "w", 60), Ok(()));
    let RejectionCause::RateLimited { wait } = check(&limiter, "w", 60).unwrap_err().cause else {
        panic!("rate limited");
    };
    assert_eq!(wait, Duration::from_secs(2), "40 left, 20 more at 10/s");
    clock.advance(wait);
    assert_eq!(check(&limiter, "w", 60), Ok(()), "not early");
}

/// The pushes of a new tenant's first burst, held, are admitted in their order: each reserves
/// the fleet view's tokens as far ahead as the delay, whatever its share's wait.
#[test]
fn a_new_tenant_s_held_burst_is_reserved_in_order() {
    let (limiter, clock) =
        limiter("overrides:\n  w:\n    ingestion_rate: 1\n    ingestion_burst_size: 1\n");
    let tenant = limiter.tenant("w").unwrap();
    let within =
        |cost| limiter.check_within(&tenant, LimitKind::Ingestion, cost, Duration::from_secs(3));
    let mut waits = Vec::new();
    for _ in 0..4 {
        waits.push(within(1).expect("within 3 s"));
        clock.advance(Duration::from_millis(100));
    }
    let expected: Vec<Duration> = [0, 900, 1_800, 2_700]
        .into_iter()
        .map(Duration::from_millis)
        .collect();
    assert_eq!(waits, expected);
    assert!(within(1).is_err(), "3.6 s away: refused");
}

#[test]
fn a_tenant_new_to_the_fleet_settles_at_the_even_share() {
    let (limiter, clock) = limiter(WEIGHTED);
    limiter.set_healthy_replicas(4);
    // Nobody reports it: for the settling time this replica spends at most 100 ÷ 4, plus
    // a quarter of the refill, though the fleet view holds 100.
    assert_eq!(check(&limiter, "w", 20), Ok(()));
    assert_eq!(check(&limiter, "w", 5), Ok(()));
    let rejection = check(&limiter, "w", 5).unwrap_err();
    assert!(matches!(
        rejection.cause,
        RejectionCause::RateLimited { .. }
    ));
    assert!(limiter.tenant_views()[0].settling);
    clock.advance(Duration::from_millis(200)); // + 100 × 0.2 ÷ 4 = 5
    assert_eq!(check(&limiter, "w", 5), Ok(()));
    // Once settled, the fleet view alone decides: 100 − 30 + 20 = 90 left.
    clock.advance(Duration::from_secs(1));
    assert_eq!(check(&limiter, "w", 70), Ok(()));
    assert!(!limiter.tenant_views()[0].settling);
}

#[test]
fn one_request_always_fits_the_settling_share() {
    let (limiter, _clock) = limiter(WEIGHTED);
    limiter.set_healthy_replicas(10);
    // A share of 10, a request of 80: it passes, as the first request.
    assert_eq!(check(&limiter, "w", 80), Ok(()));
    assert!(check(&limiter, "w", 1).is_err());
}

#[test]
fn a_tenant_the_peers_report_starts_from_their_view_without_settling() {
    let (limiter, clock) = limiter(WEIGHTED);
    limiter.set_healthy_replicas(3);
    // A peer's view of the fleet bucket is at 20, and its admissions so far (5 000) are
    // history: they are not charged again.
    limiter.apply_peer_usage(peers("w", 5_000, Some(20.0)), Duration::ZERO, None);
    clock.advance(Duration::from_millis(100)); // +10 since the report
    assert_eq!(check(&limiter, "w", 30), Ok(()));
    assert!(check(&limiter, "w", 1).is_err());
    assert!(!limiter.tenant_views()[0].settling);
}

#[test]
fn usage_reports_list_unpublished_admissions_first_and_rotate_the_rest() {
    let (limiter, clock) = limiter(
        "overrides:\n  a:\n    rate_limit_strategy: weighted\n  b:\n    rate_limit_strategy: weighted\n  d:\n    rate_limit_strategy: divided\n",
    );
    check(&limiter, "a", 10).unwrap();
    check(&limiter, "b", 500).unwrap();
    check(&limiter, "d", 7).unwrap(); // divided: nothing to report
    let reports = limiter.usage_reports();
    let names: Vec<&str> = reports.iter().map(|r| r.tenant.as_str()).collect();
    assert_eq!(names, ["b", "a"]);
    assert_eq!(
        (reports[0].items, reports[0].items_level),
        (500, Some(199_500.0))
    );
    // Only b fitted in the message.
    limiter.mark_listed(
        reports[..1]
            .iter()
            .map(|r| (r.tenant.as_str(), r.requests, r.items, r.in_flight)),
    );
    clock.advance(Duration::from_secs(1));
    limiter.tick();
    let names: Vec<String> = limiter
        .usage_reports()
        .into_iter()
        .map(|r| r.tenant)
        .collect();
    assert_eq!(names, ["a", "b"], "a has news; b is listed again, in turn");
    let all = limiter.usage_reports();
    limiter.mark_listed(
        all.iter()
            .map(|r| (r.tenant.as_str(), r.requests, r.items, r.in_flight)),
    );
    check(&limiter, "b", 1).unwrap();
    let names: Vec<String> = limiter
        .usage_reports()
        .into_iter()
        .map(|r| r.tenant)
        .collect();
    assert_eq!(names, ["b", "a"]);
}

/// The first `k` reports are the first `k` of all of them, whatever `k`: the bounded list
/// ranks every tenant before it writes out the few it sends.
#[test]
fn the_first_reports_are_the_head_of_all_of_them() {
    let (limiter, clock) = limiter("");
    for i in 0..40u64 {
        check(&limiter, &format!("t{i:02}"), 1 + i % 7).unwrap();
    }
    // Some listed already, some later: ranks by news, then by when last listed.
    let all = limiter.usage_reports();
    limiter.mark_listed(
        all[..15]
            .iter()
            .map(|r| (r.tenant.as_str(), r.requests, r.items, r.in_flight)),
    );
    clock.advance(Duration::from_secs(1));
    limiter.tick();
    for i in (0..40u64).step_by(3) {
        check(&limiter, &format!("t{i:02}"), 2).unwrap();
    }
    let all = limiter.usage_reports();
    assert_eq!(all.len(), 40);
    let names = |reports: &[UsageReport]| -> Vec<String> {
        reports.iter().map(|r| r.tenant.clone()).collect()
    };
    for k in [0, 1, 5, 14, 39, 40, 100] {
        let first = limiter.usage_reports_first(k);
        assert_eq!(names(&first), names(&all[..k.min(40)]), "k = {k}");
        assert_eq!(first, all[..k.min(40)], "k = {k}");
    }
}

/// With more tenants than a message holds, a round lists the tenants with news first and
/// the rest in turn, a message's worth at a time: every tenant once a turn, none twice, none
/// left out, whatever news comes between.
#[test]
fn every_tenant_is_listed_in_turn_a_message_at_a_time() {
    let (limiter, _clock) = limiter("");
    for i in 0..100u64 {
        check(&limiter, &format!("t{i:03}"), 1).unwrap();
    }
    let mark = |reports: &[UsageReport]| {
        limiter.mark_listed(
            reports
                .iter()
                .map(|r| (r.tenant.as_str(), r.requests, r.items, r.in_flight)),
        )
    };
    let all = limiter.usage_reports();
    assert_eq!(all.len(), 100);
    mark(&all);
    for turn in 0..3 {
        let mut listed = std::collections::BTreeMap::<String, usize>::new();
        for round in 0..15 {
            // News in the middle of the turn: listed first, and ahead of its turn.
            let busy = format!("t{:03}", 7 * round + turn);
            if round % 4 == 1 {
                check(&limiter, &busy, 1).unwrap();
            }
            let reports = limiter.usage_reports_first(7);
            if round % 4 == 1 {
                assert_eq!(
                    reports[0].tenant, busy,
                    "news first (turn {turn}, round {round})"
                );
            }
            for report in &reports {
                *listed.entry(report.tenant.clone()).or_default() += 1;
            }
            mark(&reports);
        }
        assert_eq!(listed.len(), 100, "every tenant in turn {turn}");
        assert!(
            listed.values().all(|&times| times <= 2),
            "none listed more than once a turn, but for its news: {listed:?}"
        );
    }
}

/// A tenant admitted again between the reading of its report and the listing is still news:
/// its next count goes out in the next round, not a turn later.
#[test]
fn an_admission_after_the_report_was_read_is_news_again() {
    let (limiter, _clock) = limiter("");
    for i in 0..20u64 {
        check(&limiter, &format!("idle{i:02}"), 1).unwrap();
    }
    let all = limiter.usage_reports();
    limiter.mark_listed(
        all.iter()
            .map(|r| (r.tenant.as_str(), r.requests, r.items, r.in_flight)),
    );
    check(&limiter, "busy", 10).unwrap();
    let reports = limiter.usage_reports_first(3);
    assert_eq!(reports[0].tenant, "busy");
    check(&limiter, "busy", 5).unwrap(); // after the report was read
    limiter.mark_listed(
        reports
            .iter()
            .map(|r| (r.tenant.as_str(), r.requests, r.items, r.in_flight)),
    );
    let next = limiter.usage_reports_first(1);
    assert_eq!((next[0].tenant.as_str(), next[0].items), ("busy", 15));
}

#[test]
fn idle_tenants_are_evicted_only_once_their_buckets_are_full() {
    // Burst 1000 at 10/s takes 100 s to refill, longer than the 60 s idle timeout.
    let (limiter, clock) = limiter(
        "overrides:\n  slow:\n    ingestion_rate: 10\n    ingestion_burst_size: 1000\n    rate_limit_strategy: divided\n",
    );
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

/// A replica alone lists nothing, so the news of the tenants it stopped tracking goes with
/// them: with churn, the queue holds the tenants tracked, not every tenant ever seen.
#[test]
fn the_news_of_an_evicted_tenant_goes_with_it() {
    let (limiter, clock) = limiter("");
    for i in 0..50 {
        check(&limiter, &format!("t{i}"), 1).unwrap();
        assert_eq!(limiter.news.lock().unwrap().len(), 1);
        clock.advance(Duration::from_secs(62));
        assert_eq!(limiter.evict_idle(), 1);
    }
    assert!(limiter.news.lock().unwrap().is_empty());
}

#[test]
fn a_fleet_view_in_debt_is_not_evicted() {
    let (limiter, clock) = limiter(WEIGHTED);
    limiter.apply_peer_usage(peers("w", 0, None), Duration::ZERO, None);
    check(&limiter, "w", 1).unwrap();
    limiter.apply_peer_usage(peers("w", 100 * 100, None), Duration::ZERO, None); // 99 s of debt
    clock.advance(Duration::from_secs(62));
    assert_eq!(limiter.evict_idle(), 0);
    clock.advance(Duration::from_secs(40));
    assert_eq!(limiter.evict_idle(), 1);
}

#[test]
fn random_tenant_ids_do_not_grow_memory_without_bound() {
    let (limiter, clock) = limiter("");
    for round in 0..5 {
        for i in 0..2_000 {
            check(&limiter, &format!("random-{round}-{i}"), 1).unwrap();
        }
        clock.advance(Duration::from_secs(62));
        limiter.evict_idle();
        assert_eq!(limiter.tracked_tenants(), 0);
        assert_eq!(limiter.hooks.live.load(Ordering::Relaxed), 0);
    }
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

mod shared_tests {
    use super::*;
    use crate::algorithms::Decision;
    use crate::breaker::BreakerState;
    use crate::shared::{Shared, SharedConfig, StoreObserver};
    use crate::store::{
        Acquired, BucketKey, Grant, KeyName, MemoryStore, Store, StoreError, StoreFuture,
        StoredMeter,
    };
    use std::sync::atomic::AtomicU64;

    const SHARED: &str = "overrides:\n  s:\n    ingestion_rate: 1000\n    ingestion_burst_size: 1000\n    rate_limit_strategy: shared\n  closed:\n    ingestion_rate: 1000\n    ingestion_burst_size: 1000\n    rate_limit_strategy: shared\n    on_store_failure: closed\n";

    /// Counts store calls; fails every call while `down` is set.
    struct Flaky<S> {
        inner: S,
        calls: AtomicU64,
        down: std::sync::atomic::AtomicBool,
    }

    impl<S: Store> Store for Flaky<S> {
        fn take<'a>(
            &'a self,
            key: BucketKey<'a>,
            rate: Rate,
            want: u64,
            min: u64,
        ) -> StoreFuture<'a, Grant> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.down.load(Ordering::Relaxed) {
                return Box::pin(std::future::ready(Err(StoreError::Failed("down".into()))));
            }
            self.inner.take(key, rate, want, min)
        }
        fn give_back<'a>(
            &'a self,
            key: BucketKey<'a>,
            rate: Rate,
            tokens: u64,
        ) -> StoreFuture<'a, ()> {
            self.inner.give_back(key, rate, tokens)
        }
        fn meter<'a>(
            &'a self,
            key: KeyName<'a>,
            meter: StoredMeter,
            cost: u64,
        ) -> StoreFuture<'a, Decision> {
            self.inner.meter(key, meter, cost)
        }
        fn acquire<'a>(
            &'a self,
            key: KeyName<'a>,
            lease: &'a str,
            max: u64,
            ttl: Duration,
        ) -> StoreFuture<'a, Acquired> {
            self.inner.acquire(key, lease, max, ttl)
        }
        fn release<'a>(&'a self, key: KeyName<'a>, lease: &'a str) -> StoreFuture<'a, bool> {
            self.inner.release(key, lease)
        }
        fn renew<'a>(
            &'a self,
            key: KeyName<'a>,
            lease: &'a str,
            ttl: Duration,
        ) -> StoreFuture<'a, bool> {
            self.inner.renew(key, lease, ttl)
        }
        fn ping(&self) -> StoreFuture<'_, ()> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.down.load(Ordering::Relaxed) {
                return Box::pin(std::future::ready(Err(StoreError::Failed("down".into()))));
            }
            self.inner.ping()
        }
    }

    #[derive(Default)]
    struct Recorded {
        leased: AtomicU64,
        returned: AtomicU64,
    }
    struct Recorder(Arc<Recorded>);
    impl StoreObserver for Recorder {
        fn leased(&self, tokens: u64) {
            self.0.leased.fetch_add(tokens, Ordering::Relaxed);
        }
        fn returned(&self, tokens: u64) {
            self.0.returned.fetch_add(tokens, Ordering::Relaxed);
        }
    }

    type Store_ = Flaky<MemoryStore<FakeRelativeClock>>;

    fn replica(
        store: Arc<Store_>,
        clock: &FakeRelativeClock,
        recorded: Arc<Recorded>,
    ) -> TestLimiter {
        let shared = Shared::new(
            store as Arc<dyn Store>,
            SharedConfig {
                calls_per_tenant: 1000.0,
                ..SharedConfig::default()
            },
            Box::new(Recorder(recorded)),
        );
        Limiter::with_clock(
            config(SHARED),
            Duration::from_secs(60),
            Counting::default(),
            clock.clone(),
        )
        .with_shared(Arc::new(shared))
    }

    fn store(clock: &FakeRelativeClock) -> Arc<Store_> {
        Arc::new(Flaky {
            inner: MemoryStore::new(clock.clone()),
            calls: AtomicU64::new(0),
            down: Default::default(),
        })
    }

    async fn admit(limiter: &TestLimiter, name: &str, cost: u64) -> Result<(), Rejection> {
        let tenant = limiter.tenant(name).unwrap();
        limiter.admit(&tenant, LimitKind::Ingestion, cost).await
    }

    #[tokio::test]
    async fn leases_serve_most_decisions_without_the_store() {
        let clock = FakeRelativeClock::default();
        let store = store(&clock);
        let limiter = replica(Arc::clone(&store), &clock, Arc::default());
        let mut admitted = 0;
        // 400 items/s offered for 5 s, in requests of 1: 2 000 decisions.
        for _ in 0..2_000 {
            clock.advance(Duration::from_micros(2_500));
            if admit(&limiter, "s", 1).await.is_ok() {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 2_000, "under the limit, nothing refused");
        let calls = store.calls.load(Ordering::Relaxed);
        assert!(calls <= 80, "{calls} store calls for 2 000 decisions");
    }

    /// Three replicas over one store, 3 000 items/s offered against a limit of 1 000/s with
    /// a burst of 1 000: the fleet admits at most B + L·(t + lease TTL).
    #[tokio::test]
    async fn replicas_sharing_a_store_never_admit_more_than_the_limit() {
        let clock = FakeRelativeClock::default();
        let store = store(&clock);
        let replicas: Vec<TestLimiter> = (0..3)
            .map(|_| replica(Arc::clone(&store), &clock, Arc::default()))
            .collect();
        let mut admitted = 0u64;
        let seconds = 10;
        for step in 0..(seconds * 3_000) {
            clock.advance(Duration::from_micros(1_000_000 / 3_000));
            if admit(&replicas[step % 3], "s", 1).await.is_ok() {
                admitted += 1;
            }
        }
        let bound = 1_000.0 + 1_000.0 * (seconds as f64 + 0.5);
        assert!(admitted as f64 <= bound, "{admitted} > {bound}");
        assert!(
            admitted as f64 >= 0.95 * (1_000.0 + 1_000.0 * seconds as f64),
            "{admitted}"
        );
    }

    #[tokio::test]
    async fn store_failure_follows_each_tenant_s_policy() {
        let clock = FakeRelativeClock::default();
        let store = store(&clock);
        let limiter = replica(Arc::clone(&store), &clock, Arc::default());
        store.down.store(true, Ordering::Relaxed);
        // open: the fleet view decides (the tenant is new to the fleet: it settles first).
        clock.advance(Duration::from_secs(2));
        assert_eq!(admit(&limiter, "s", 10).await, Ok(()));
        // closed: refused, saying the store is unavailable.
        assert_eq!(
            admit(&limiter, "closed", 10).await.unwrap_err().cause,
            RejectionCause::StoreUnavailable
        );
        // After five failures the breaker is open: no more calls.
        for _ in 0..10 {
            let _ = admit(&limiter, "closed", 1).await;
        }
        let calls = store.calls.load(Ordering::Relaxed);
        for _ in 0..100 {
            let _ = admit(&limiter, "closed", 1).await;
        }
        assert_eq!(
            store.calls.load(Ordering::Relaxed),
            calls,
            "nothing waits on a sick store"
        );
        // The store comes back; after the open period a probe closes the breaker.
        store.down.store(false, Ordering::Relaxed);
        clock.advance(Duration::from_secs(1));
        assert_eq!(admit(&limiter, "closed", 1).await, Ok(()));
    }

    /// With no `shared` traffic to make a probe, the replica probes the store itself while
    /// the breaker is open, so the breaker (and its gauge, and the alert on it) closes when the
    /// store is back, and only then.
    #[tokio::test(start_paused = true)]
    async fn with_no_traffic_the_breaker_closes_when_the_store_is_back() {
        let clock = FakeRelativeClock::default();
        let store = store(&clock);
        let limiter = replica(Arc::clone(&store), &clock, Arc::default());
        let breaker = || limiter.shared().unwrap().breaker.state();
        store.down.store(true, Ordering::Relaxed);
        for _ in 0..10 {
            let _ = admit(&limiter, "closed", 1).await;
        }
        assert_eq!(breaker(), BreakerState::Open);
        // Still down: the probes fail and it stays open.
        clock.advance(Duration::from_secs(2));
        let calls = store.calls.load(Ordering::Relaxed);
        let _ = tokio::time::timeout(Duration::from_secs(1), limiter.probe_store()).await;
        assert!(
            store.calls.load(Ordering::Relaxed) > calls,
            "a probe went out"
        );
        assert_ne!(breaker(), BreakerState::Closed);
        // Back: the next probe closes it, with no admission asked.
        store.down.store(false, Ordering::Relaxed);
        clock.advance(Duration::from_secs(2));
        let _ = tokio::time::timeout(Duration::from_secs(1), limiter.probe_store()).await;
        assert_eq!(breaker(), BreakerState::Closed);
        // Closed, and the store called within the last second: it waits, no more calls.
        let calls = store.calls.load(Ordering::Relaxed);
        let _ = tokio::time::timeout(Duration::from_secs(5), limiter.probe_store()).await;
        assert_eq!(store.calls.load(Ordering::Relaxed), calls);
    }

    /// With no `shared` traffic at all, a store that goes down opens the breaker (its gauge
    /// and alert) from the replica's own pings, as `/ready` tells, and no push finds it out.
    #[tokio::test(start_paused = true)]
    async fn with_no_traffic_a_store_going_down_opens_the_breaker() {
        let clock = FakeRelativeClock::default();
        let store = store(&clock);
        let limiter = replica(Arc::clone(&store), &clock, Arc::default());
        let breaker = || limiter.shared().unwrap().breaker.state();
        store.down.store(true, Ordering::Relaxed);
        assert_eq!(breaker(), BreakerState::Closed);
        for _ in 0..10 {
            clock.advance(Duration::from_secs(1));
            let _ = tokio::time::timeout(Duration::from_millis(1_100), limiter.probe_store()).await;
        }
        assert_ne!(breaker(), BreakerState::Closed, "opened by its pings");
        assert!(store.calls.load(Ordering::Relaxed) >= 5);
    }

    #[tokio::test]
    async fn unspent_leases_go_back_and_crashed_ones_are_lost_not_doubled() {
        let clock = FakeRelativeClock::default();
        let store = store(&clock);
        let recorded = Arc::new(Recorded::default());
        let limiter = replica(Arc::clone(&store), &clock, Arc::clone(&recorded));
        // Demand of 1 000/s for a second: leases of ~100.
        for _ in 0..100 {
            clock.advance(Duration::from_millis(10));
            admit(&limiter, "s", 10).await.unwrap();
        }
        let leased = recorded.leased.load(Ordering::Relaxed);
        assert!(leased >= 1_000, "{leased}");
        limiter.return_leases(true).await;
        let returned = recorded.returned.load(Ordering::Relaxed);
        assert_eq!(leased - returned, 1_000, "everything not spent went back");
        let key = BucketKey {
            tenant: "s",
            kind: LimitKind::Ingestion,
            shard: 0,
            shards: 1,
            key: None,
        };
        let rate = Rate {
            per_second: 1000.0,
            burst: 1000,
        };
        assert!(store.inner.tokens(key, rate) <= 1000.0);
    }

    #[tokio::test]
    async fn a_request_larger_than_a_sub_bucket_can_never_pass() {
        let clock = FakeRelativeClock::default();
        let store = store(&clock);
        let shared = Shared::new(
            Arc::clone(&store) as Arc<dyn Store>,
            SharedConfig::default(),
            Box::new(crate::shared::Unobserved),
        );
        let limiter = Limiter::with_clock(
            config("overrides:\n  h:\n    ingestion_rate: 900\n    ingestion_burst_size: 900\n    rate_limit_strategy: shared\n    store_shards: 3\n"),
            Duration::from_secs(60),
            Counting::default(),
            clock.clone(),
        )
        .with_shared(Arc::new(shared));
        assert_eq!(admit(&limiter, "h", 300).await, Ok(()));
        assert_eq!(
            admit(&limiter, "h", 301).await.unwrap_err().cause,
            RejectionCause::LargerThanBurst
        );
    }
}

mod admission_tests {
    use super::*;
    use crate::admission::{AdmissionError, Ask};
    use runtime_config::LimitSource;

    const ADMISSION: &str = "admission:\n  default_limit: {rate: 5}\noverrides:\n  a:\n    allow_client_limits: true\n    limits:\n      \"GET /s\": {algorithm: sliding_window, rate: 10, window: 1s}\n      \"POST /u\": {max_concurrent: 2}\n      wide: {max_concurrent: 30}\n      odd: {max_concurrent: 31}\n      slow: {algorithm: leaky_bucket, rate: 10, burst: 3}\n  strict-free:\n    limits:\n      k: {rate: 1}\n  d:\n    rate_limit_strategy: divided\n    limits:\n      c: {max_concurrent: 10}\n";

    #[tokio::test]
    async fn allow_follows_the_key_s_algorithm_and_the_default_otherwise() {
        let (limiter, clock) = limiter(ADMISSION);
        for _ in 0..10 {
            assert!(
                limiter
                    .allow("a", "GET /s", 1, None)
                    .await
                    .unwrap()
                    .decision
                    .allowed
            );
        }
        let answer = limiter.allow("a", "GET /s", 1, None).await.unwrap();
        assert!(!answer.decision.allowed);
        assert_eq!(answer.source, LimitSource::Key);
        // Unknown keys get the default (token bucket, 5/s, burst 5).
        for _ in 0..5 {
            assert!(
                limiter
                    .allow("a", "other", 1, None)
                    .await
                    .unwrap()
                    .decision
                    .allowed
            );
        }
        let refused = limiter.allow("a", "other", 1, None).await.unwrap();
        assert!(!refused.decision.allowed);
        assert_eq!(refused.decision.retry_after, Duration::from_millis(200));
        // Leaky bucket: delays, then refusal past its queue.
        let delays: Vec<Duration> = futures_delays(&limiter, "slow", 3).await;
        assert_eq!(delays[2], Duration::from_millis(200));
        assert!(
            !limiter
                .allow("a", "slow", 1, None)
                .await
                .unwrap()
                .decision
                .allowed
        );
        clock.advance(Duration::from_secs(1));
        assert!(
            limiter
                .allow("a", "other", 5, None)
                .await
                .unwrap()
                .decision
                .allowed
        );
    }

    #[tokio::test]
    async fn a_batch_answers_as_one_call_an_ask_would() {
        // The same asks, as one batch to one limiter and one call at a time to another, on
        // clocks that move alike: new keys first (the batch's second pass), then the same
        // keys known (its first pass), each time with errors, a caller's limit and keys
        // asked again and again within the batch. What the two then tell the peers and the
        // cell sync (admitted and offered cost a key) is the same too.
        let (batched, batched_clock) = limiter(ADMISSION);
        let (single, single_clock) = limiter(ADMISSION);
        let (batched, single) = (batched.with_cells(), single.with_cells());
        let counters = |limiter: &TestLimiter| {
            let mut usage = limiter.usage_reports();
            usage.sort_by(|a, b| a.tenant.cmp(&b.tenant));
            let mut cells = limiter.key_cell_usage();
            cells.sort_by(|a, b| (&a.tenant, &a.key).cmp(&(&b.tenant, &b.key)));
            format!("{usage:?} {cells:?}")
        };
        let generous = runtime_config::LimitSpec::rate(1e6);
        let mut asks = vec![
            Ask {
                tenant: "a",
                key: "GET /s",
                cost: 1,
                limit: None,
            };
            12
        ];
        for (tenant, key, cost, limit) in [
            ("a", "other", 2, None),
            ("a", "other", 0, None),
            ("a", "other", 6, None),
            ("a", "client-key", 3, Some(generous)),
            ("a", "slow", 1, None),
            ("a", "slow", 1, None),
            ("a", "slow", 1, None),
            ("a", "slow", 1, None),
            ("d", "c", 1, None),
            // `divided`: the default limit's token bucket, run past its burst
            ("d", "tb", 2, None),
            ("d", "tb", 1, None),
            ("d", "tb", 1, None),
            ("d", "tb", 3, None),
            ("d", "tb", 1, None),
            ("strict-free", "k", 1, None),
            ("strict-free", "k", 1, None),
            // the same key name, another tenant's key
            ("a", "k", 1, None),
            ("a", "other", 2, None),
            ("a", "other", 2, None),
        ] {
            asks.push(Ask {
                tenant,
                key,
                cost,
                limit,
            });
        }
        for round in 0..3 {
            let answers = batched.allow_batch(&asks).await;
            let mut expected = Vec::new();
            for ask in &asks {
                expected.push(single.allow(ask.tenant, ask.key, ask.cost, ask.limit).await);
            }
            assert_eq!(
                format!("{answers:?}"),
                format!("{expected:?}"),
                "round {round}"
            );
            let allowed = answers
                .iter()
                .filter(|answer| matches!(answer, Ok(a) if a.decision.allowed))
                .count();
            assert!(
                allowed > 0 && allowed < asks.len(),
                "round {round}: {allowed}"
            );
            assert_eq!(counters(&batched), counters(&single), "round {round}");
            batched_clock.advance(Duration::from_millis(300));
            single_clock.advance(Duration::from_millis(300));
        }
    }

    #[tokio::test]
    async fn a_batch_keeps_a_key_s_asks_in_order_when_one_is_left_for_later() {
        // strict-free's k holds one token. An ask with the caller's own limit (not allowed
        // there, so k's limit applies: the same meter) is left for the batch's second pass;
        // the plain ask after it must not take the token first.
        let generous = runtime_config::LimitSpec::rate(1e6);
        let asks = [
            Ask {
                tenant: "strict-free",
                key: "k",
                cost: 1,
                limit: Some(generous),
            },
            Ask {
                tenant: "strict-free",
                key: "k",
                cost: 1,
                limit: None,
            },
        ];
        let (batched, clock) = limiter(ADMISSION);
        batched.allow("strict-free", "k", 1, None).await.unwrap();
        clock.advance(Duration::from_secs(1));
        let answers = batched.allow_batch(&asks).await;
        let allowed: Vec<bool> = answers
            .iter()
            .map(|answer| answer.as_ref().unwrap().decision.allowed)
            .collect();
        assert_eq!(allowed, [true, false]);
    }

    async fn futures_delays(limiter: &TestLimiter, key: &str, n: usize) -> Vec<Duration> {
        let mut delays = Vec::new();
        for _ in 0..n {
            delays.push(
                limiter
                    .allow("a", key, 1, None)
                    .await
                    .unwrap()
                    .decision
                    .delay,
            );
        }
        delays
    }

    #[tokio::test]
    async fn client_limits_apply_only_where_the_operator_allows() {
        let (limiter, _clock) = limiter(ADMISSION);
        let generous = runtime_config::LimitSpec::rate(1e6);
        let answer = limiter
            .allow("a", "client-key", 1000, Some(generous))
            .await
            .unwrap();
        assert_eq!(answer.source, LimitSource::Client);
        assert!(answer.decision.allowed);
        // strict-free does not allow client limits: the default applies, and says so.
        let answer = limiter
            .allow("strict-free", "client-key", 1, Some(generous))
            .await
            .unwrap();
        assert_eq!(answer.source, LimitSource::Default);
        assert_eq!(answer.limit.rate, 5.0);
        // A bad spec, a zero cost and a cost over the burst are errors, not decisions.
        let bad = runtime_config::LimitSpec {
            rate: -1.0,
            ..generous
        };
        assert!(matches!(
            limiter.allow("a", "x", 1, Some(bad)).await,
            Err(AdmissionError::BadSpec(_))
        ));
        assert!(matches!(
            limiter.allow("a", "x", 0, None).await,
            Err(AdmissionError::BadCost(_))
        ));
        assert!(matches!(
            limiter.allow("a", "x", 6, None).await,
            Err(AdmissionError::BadCost(_))
        ));
    }

    #[tokio::test]
    async fn strict_admission_names_unknown_tenants_and_keys() {
        let (limiter, _clock) = limiter(
            &format!("{ADMISSION}admission:\n  strict: true\n")
                .replace("admission:\n  default_limit: {rate: 5}\n", ""),
        );
        assert!(matches!(
            limiter.allow("nobody", "k", 1, None).await,
            Err(AdmissionError::UnknownTenant(_))
        ));
        assert!(matches!(
            limiter.allow("a", "unknown", 1, None).await,
            Err(AdmissionError::UnknownKey(..))
        ));
    }

    #[tokio::test]
    async fn a_tenant_s_keys_are_capped_per_replica_until_idle_ones_are_evicted() {
        let (limiter, clock) = limiter(ADMISSION);
        let limiter = limiter.with_max_admission_keys_per_tenant(3);
        for key in ["k1", "k2", "k3"] {
            assert!(limiter.allow("a", key, 1, None).await.is_ok());
        }
        assert!(
            limiter.allow("a", "k1", 1, None).await.is_ok(),
            "a key it has is no new key"
        );
        assert_eq!(
            limiter.allow("a", "k4", 1, None).await.unwrap_err(),
            AdmissionError::TooManyKeys {
                tenant: "a".into(),
                max: 3
            }
        );
        assert!(
            limiter.allow("d", "k4", 1, None).await.is_ok(),
            "another tenant has its own places"
        );
        // The push path's in-flight key is not the tenant's to spend.
        assert!(limiter
            .acquire_push("a", 5, Duration::from_secs(5))
            .await
            .is_ok());
        // k1..k3 idle past the timeout: evicted, their places free (and only theirs).
        clock.advance(Duration::from_secs(61));
        limiter.evict_idle();
        for key in ["k5", "k6", "k7"] {
            assert!(limiter.allow("a", key, 1, None).await.is_ok(), "{key}");
        }
        assert!(matches!(
            limiter.allow("a", "k8", 1, None).await,
            Err(AdmissionError::TooManyKeys { .. })
        ));
    }

    #[tokio::test]
    async fn leases_cap_what_is_in_flight_and_expire() {
        let (limiter, clock) = limiter(ADMISSION);
        let limiter = limiter.with_node_id("me");
        let ttl = Duration::from_secs(5);
        let first = limiter.acquire("a", "POST /u", None, ttl).await.unwrap();
        let second = limiter.acquire("a", "POST /u", None, ttl).await.unwrap();
        assert!(first.granted && second.granted);
        let third = limiter.acquire("a", "POST /u", None, ttl).await.unwrap();
        assert!(!third.granted);
        assert_eq!(third.in_flight, 2);
        assert!(third.retry_after <= ttl);
        let lease = first.lease_id.unwrap();
        limiter.release(&lease).await.unwrap();
        assert!(
            matches!(
                limiter.release(&lease).await,
                Err(AdmissionError::UnknownLease(_))
            ),
            "a double release is refused"
        );
        assert!(
            limiter
                .acquire("a", "POST /u", None, ttl)
                .await
                .unwrap()
                .granted
        );
        // A holder that never comes back: its slot frees at the TTL.
        clock.advance(Duration::from_secs(6));
        let second = second.lease_id.unwrap();
        assert!(
            matches!(
                limiter.renew(&second, ttl).await,
                Err(AdmissionError::UnknownLease(_))
            ),
            "an expired lease cannot be renewed"
        );
        assert_eq!(limiter.expire_leases(), 2);
        assert!(
            limiter
                .acquire("a", "POST /u", None, ttl)
                .await
                .unwrap()
                .granted
        );
        // A lease another replica granted is named as such; a key without max_concurrent
        // cannot be acquired.
        assert!(matches!(
            limiter.release("L0000@elsewhere").await,
            Err(AdmissionError::WrongReplica { .. })
        ));
        assert!(matches!(
            limiter.acquire("a", "GET /s", None, ttl).await,
            Err(AdmissionError::NotConcurrent(_))
        ));
    }

    #[tokio::test]
    async fn divided_shares_the_in_flight_cap_and_weighted_counts_the_peers() {
        let (limiter, _clock) = limiter(ADMISSION);
        limiter.set_healthy_replicas(3);
        let ttl = Duration::from_secs(5);
        let granted = futures_acquire(&limiter, "d", "c", 10, ttl).await;
        assert_eq!(granted, 4, "⌈10 ÷ 3⌉");
        // weighted: the peers hold one of two.
        limiter.apply_peer_usage(
            Arc::new(PeerUsage::from_iter([(
                "a/POST%20%2Fu".into(),
                PeerTotals {
                    in_flight: 1,
                    ..PeerTotals::default()
                },
            )])),
            Duration::ZERO,
            None,
        );
        // (the entry must exist for the peers' count to land)
        let _ = limiter.acquire("a", "POST /u", None, ttl).await;
        limiter.apply_peer_usage(
            Arc::new(PeerUsage::from_iter([(
                "a/POST%20%2Fu".into(),
                PeerTotals {
                    in_flight: 1,
                    ..PeerTotals::default()
                },
            )])),
            Duration::ZERO,
            None,
        );
        assert!(
            !limiter
                .acquire("a", "POST /u", None, ttl)
                .await
                .unwrap()
                .granted
        );
    }

    /// Outside the store, each replica holds a fixed share of the cap by its rank, whatever
    /// the peers report: the shares sum to max however fast holders come and go.
    #[tokio::test]
    async fn weighted_holds_a_fixed_share_of_the_slots_by_rank() {
        let (limiter, _clock) = limiter(ADMISSION);
        limiter.set_healthy_replicas(3);
        let ttl = Duration::from_secs(5);
        // 30 over 3: 10 here, whoever else holds what.
        assert_eq!(futures_acquire(&limiter, "a", "wide", 30, ttl).await, 10);
        let peers = |held: u64| {
            Arc::new(PeerUsage::from_iter([(
                "a/wide".into(),
                PeerTotals {
                    in_flight: held,
                    ..PeerTotals::default()
                },
            )]))
        };
        // Idle peers lend nothing: their share is theirs the moment their traffic comes.
        limiter.apply_peer_usage(peers(0), Duration::ZERO, None);
        assert_eq!(futures_acquire(&limiter, "a", "wide", 30, ttl).await, 0);
        // 31 over 3 by rank: 11, 10, 10.
        let (first, _clock) = super::limiter(ADMISSION);
        first.set_healthy_replicas(3);
        assert_eq!(futures_acquire(&first, "a", "odd", 40, ttl).await, 11);
        let (third, _clock) = super::limiter(ADMISSION);
        third.set_healthy_replicas(3);
        third.set_rank(2);
        assert_eq!(futures_acquire(&third, "a", "odd", 40, ttl).await, 10);
    }

    async fn futures_acquire(
        limiter: &TestLimiter,
        tenant: &str,
        key: &str,
        tries: usize,
        ttl: Duration,
    ) -> usize {
        let mut granted = 0;
        for _ in 0..tries {
            if limiter
                .acquire(tenant, key, None, ttl)
                .await
                .unwrap()
                .granted
            {
                granted += 1;
            }
        }
        granted
    }

    /// `Lease`: a batch taken at once (capped at the burst), the rest carried over, given
    /// back on request, and given back at the deadline when the client never returns.
    #[tokio::test]
    async fn token_leases_take_carry_give_back_and_lapse() {
        let yaml = "overrides:\n  l:\n    limits:\n      k: {rate: 10, burst: 100}\n";
        let (limiter, clock) = limiter(yaml);
        let ttl = Duration::from_secs(5);
        let lent = limiter.lease("l", "k", 1000, ttl, None, 0).await.unwrap();
        assert_eq!(
            (lent.granted, lent.outstanding),
            (100, 100),
            "capped at the burst"
        );
        let refused = limiter.allow("l", "k", 1, None).await.unwrap();
        assert!(!refused.decision.allowed, "the fleet saw the spend");
        // 40 spent, 20 given back: 40 carried over; the bucket holds the 20.
        let rolled = limiter
            .lease("l", "k", 0, ttl, Some((&lent.lease_id, 40)), 20)
            .await
            .unwrap();
        assert_eq!((rolled.granted, rolled.outstanding), (0, 40));
        assert!(
            limiter
                .allow("l", "k", 20, None)
                .await
                .unwrap()
                .decision
                .allowed
        );
        assert!(
            !limiter
                .allow("l", "k", 1, None)
                .await
                .unwrap()
                .decision
                .allowed
        );
        // An unknown previous lease carries nothing.
        let fresh = limiter
            .lease("l", "k", 0, ttl, Some(("T00@elsewhere", 0)), 0)
            .await
            .unwrap();
        assert_eq!(fresh.outstanding, 0);
        // The holder dies: its 40 come back at the deadline, not before.
        clock.advance(Duration::from_secs(4));
        assert_eq!(limiter.expire_leases(), 0);
        clock.advance(Duration::from_millis(1100));
        assert_eq!(limiter.expire_leases(), 1);
        // 5.1 s of refill (51) capped at 100, plus nothing: the 40 are back in the bucket.
        assert!(
            limiter
                .allow("l", "k", 91, None)
                .await
                .unwrap()
                .decision
                .allowed
        );
    }
}

/// Cells: a slice put in force reshapes a tracked tenant at once (the refusal still names the
/// fleet-wide limit), demand and spend are counted for the cell sync, and `shared` is never
/// sliced nor counted.
#[test]
fn a_cell_slice_is_the_tenant_limit_inside_the_cell() {
    use crate::cells::{CellShares, Share, TenantShare};
    let yaml = "overrides:\n  w:\n    ingestion_rate: 100\n    ingestion_burst_size: 100\n    rate_limit_strategy: weighted\n  d:\n    ingestion_rate: 100\n    ingestion_burst_size: 100\n    rate_limit_strategy: divided\n  s:\n    ingestion_rate: 100\n    ingestion_burst_size: 100\n    rate_limit_strategy: shared\n";
    let (limiter, clock) = limiter(yaml);
    let limiter = limiter.with_cells();
    assert_eq!(check(&limiter, "w", 10), Ok(()));
    // Past the settling of a tenant new to the fleet.
    clock.advance(Duration::from_secs(2));
    let quarter = TenantShare {
        request: Share::WHOLE,
        ingestion: Share::even(0.25),
    };
    let mut shares = CellShares {
        default: TenantShare::even(0.5),
        ..CellShares::default()
    };
    shares.tenants.insert("w".into(), quarter);
    limiter.set_cell_shares(Arc::new(shares));
    // w: a view of a bucket of 25/s and 25, carried over (full: 25 left).
    assert_eq!(check(&limiter, "w", 25), Ok(()));
    let refused = check(&limiter, "w", 1).unwrap_err();
    assert_eq!(
        (refused.limit, refused.burst),
        (100.0, 100),
        "as configured"
    );
    assert_eq!(refused.local_limit, 25.0, "as enforced in the cell");
    assert_eq!(
        check(&limiter, "w", 26).unwrap_err().cause,
        RejectionCause::LargerThanBurst
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(check(&limiter, "w", 25), Ok(()));
    // d: the default share, half: 50/s and a burst of 50 on one replica.
    assert_eq!(check(&limiter, "d", 50), Ok(()));
    assert!(check(&limiter, "d", 1).is_err());
    // s: one global bucket, untouched (no store here: its open policy decides on the view).
    assert_eq!(check(&limiter, "s", 100), Ok(()));
    let mut usage = limiter.cell_usage();
    usage.sort_by(|a, b| a.tenant.cmp(&b.tenant));
    let counted: Vec<(&str, [u64; 2], [u64; 2])> = usage
        .iter()
        .map(|u| (u.tenant.as_str(), u.offered, u.spent))
        .collect();
    assert_eq!(
        counted,
        vec![("d", [0, 51], [0, 50]), ("w", [0, 87], [0, 60])]
    );
    // Outside cells nothing is counted.
    let (plain, _) = self::limiter(yaml);
    assert_eq!(check(&plain, "w", 10), Ok(()));
    assert!(plain.cell_usage().is_empty());
}

/// Cells: an admission key's rate and in-flight cap are its cell's slice, and so is a tenant's
/// `max_inflight_push_requests` (its push key's cap); what is offered and wanted is counted for
/// the cell sync; a cost the configured burst allows but the slice does not is refused, not
/// invalid.
#[tokio::test]
async fn a_cell_slice_is_an_admission_key_limit_and_the_push_cap_inside_the_cell() {
    use crate::cells::{key_subject, CellShares, Share, TenantShare};
    let yaml = "overrides:\n  a:\n    max_inflight_push_requests: 30\n    limits:\n      rated: {rate: 100, burst: 100}\n      held: {max_concurrent: 30}\n";
    let (limiter, _clock) = limiter(yaml);
    let limiter = limiter.with_cells();
    let subject = |key: &str| key_subject("a", &crate::encode_key(key));
    let mut shares = CellShares {
        default: TenantShare::even(0.5),
        cells: 3,
        ..CellShares::default()
    };
    let key_share = |rate: f64, in_flight: f64| TenantShare {
        request: Share {
            rate,
            burst: rate.max(1.0 / 3.0),
        },
        ingestion: Share::even(in_flight),
    };
    shares.tenants.insert(subject("rated"), key_share(0.2, 1.0));
    shares.tenants.insert(subject("held"), key_share(1.0, 0.1));
    limiter.set_cell_shares(Arc::new(shares));

    // rated: 20/s, and a burst of 100 × max(0.2, 1/3) = 34.
    let mut allowed = 0;
    for _ in 0..40 {
        let answer = limiter.allow("a", "rated", 1, None).await.unwrap();
        allowed += u64::from(answer.decision.allowed);
        assert_eq!(
            answer.limit.rate, 100.0,
            "answers name the limit as configured"
        );
    }
    assert_eq!(allowed, 34);
    // A cost within the configured burst but over the slice's: refused, retry in a second.
    let big = limiter.allow("a", "rated", 50, None).await.unwrap();
    assert!(!big.decision.allowed);
    assert_eq!(big.decision.retry_after, Duration::from_secs(1));
    assert!(matches!(
        limiter.allow("a", "rated", 101, None).await,
        Err(AdmissionError::BadCost(_))
    ));

    // held: 30 × 0.1 = 3 slots in this cell.
    let ttl = Duration::from_secs(60);
    let mut granted = 0;
    for _ in 0..5 {
        granted += u64::from(
            limiter
                .acquire("a", "held", None, ttl)
                .await
                .unwrap()
                .granted,
        );
    }
    assert_eq!(granted, 3);
    // The push cap: the default share, half of 30.
    let mut pushes = 0;
    for _ in 0..20 {
        pushes += u64::from(limiter.acquire_push("a", 30, ttl).await.unwrap().granted);
    }
    assert_eq!(pushes, 15);

    let mut usage = limiter.key_cell_usage();
    usage.sort_by(|a, b| a.key.cmp(&b.key));
    let counted: Vec<(&str, u64, u64, u64)> = usage
        .iter()
        .map(|u| (u.key.as_str(), u.offered, u.spent, u.wanted))
        .collect();
    let push_key = usage
        .iter()
        .find(|u| u.limit.max_concurrent == 30 && u.key != "held");
    let push_key = push_key.expect("the push key is reported").key.clone();
    let mut expected = vec![
        ("held", 0, 0, 5),
        ("rated", 40 + 50, 34, 0),
        (push_key.as_str(), 0, 0, 20),
    ];
    expected.sort_by(|a, b| a.0.cmp(b.0));
    assert_eq!(counted, expected);
    // The slots wanted were read: now only what is held counts.
    let held: Vec<u64> = limiter.key_cell_usage().iter().map(|u| u.wanted).collect();
    assert_eq!(held.iter().sum::<u64>(), 3 + 15);
    // Outside cells nothing is counted.
    let (plain, _) = self::limiter(yaml);
    assert!(
        plain
            .allow("a", "rated", 1, None)
            .await
            .unwrap()
            .decision
            .allowed
    );
    assert!(plain.key_cell_usage().is_empty());
}

/// Under `weighted`, an admission key's view is charged what the peers admitted, and credited
/// what they gave back (tokens lent and returned); a key new to this replica starts from the
/// peers' totals, not charged at once with everything they admitted before it existed here.
#[tokio::test]
async fn peers_refunds_are_credited_and_a_new_key_starts_from_their_totals() {
    let yaml = "overrides:\n  a:\n    limits:\n      k: {rate: 1, burst: 100}\n      late: {rate: 1, burst: 100}\n";
    let (limiter, _clock) = limiter(yaml);
    limiter.set_healthy_replicas(3);
    let remaining = |answer: Allowed| answer.decision.remaining;
    let peers = |items: u64, items_refunded: u64| {
        Arc::new(PeerUsage::from_iter([
            (
                "a/k".into(),
                PeerTotals {
                    items,
                    items_refunded,
                    ..PeerTotals::default()
                },
            ),
            (
                "a/late".into(),
                PeerTotals {
                    items: 5_000,
                    ..PeerTotals::default()
                },
            ),
        ]))
    };
    assert_eq!(
        remaining(limiter.allow("a", "k", 1, None).await.unwrap()),
        99
    );
    limiter.apply_peer_usage(peers(50, 0), Duration::ZERO, None);
    assert_eq!(
        remaining(limiter.allow("a", "k", 1, None).await.unwrap()),
        48
    );
    // 30 of those 50 given back by the peers, and the same report seen twice.
    limiter.apply_peer_usage(peers(50, 30), Duration::ZERO, None);
    limiter.apply_peer_usage(peers(50, 30), Duration::ZERO, None);
    assert_eq!(
        remaining(limiter.allow("a", "k", 1, None).await.unwrap()),
        77
    );
    // `late` appears here after the peers admitted 5 000 of it: full, not 50 s in debt.
    assert_eq!(
        remaining(limiter.allow("a", "late", 1, None).await.unwrap()),
        99
    );
    limiter.apply_peer_usage(peers(50, 30), Duration::ZERO, None);
    assert_eq!(
        remaining(limiter.allow("a", "late", 1, None).await.unwrap()),
        98
    );
}

/// A key's token bucket orders the peers' charges before its own takes since their last, as a
/// tenant's view does (`a_backlog_admitted_on_resume_is_ordered_after_the_silence`): after
/// 8 s stopped, the calls queued meanwhile empty the view, and the peers' 8 s under the
/// limit, reported after them, leave it empty, not 4.8 s in debt.
#[tokio::test]
async fn a_key_orders_the_peers_charges_before_its_own_backlog() {
    let yaml = "overrides:\n  a:\n    limits:\n      k: {rate: 10, burst: 100}\n";
    let (limiter, clock) = limiter(yaml);
    limiter.set_healthy_replicas(3);
    let peers = |items: u64| {
        Arc::new(PeerUsage::from_iter([(
            "a/k".into(),
            PeerTotals {
                items,
                ..PeerTotals::default()
            },
        )]))
    };
    limiter.apply_peer_usage(peers(0), Duration::ZERO, None);
    assert!(
        limiter
            .allow("a", "k", 1, None)
            .await
            .unwrap()
            .decision
            .allowed
    );
    clock.advance(Duration::from_secs(8));
    let backlog = limiter.allow("a", "k", 100, None).await.unwrap();
    assert!(backlog.decision.allowed, "the backlog, from a full view");
    limiter.apply_peer_usage(
        peers(48),
        Duration::from_millis(150),
        Some(Duration::from_secs(8)),
    );
    clock.advance(Duration::from_millis(200));
    let next = limiter.allow("a", "k", 1, None).await.unwrap().decision;
    assert!(next.allowed, "waited {:?}", next.retry_after);
}

/// A key's name in gossip and in the store: bytes outside `[A-Za-z0-9-_.~]` as `%XX`, upper
/// case, one escape a byte of UTF-8 (peers of another build must read the same names).
#[test]
fn a_key_name_escapes_each_byte_outside_the_plain_set() {
    assert_eq!(crate::encode_key("GET /search"), "GET%20%2Fsearch");
    assert_eq!(
        crate::encode_key("GET /a b\nc%20{x}/é"),
        "GET%20%2Fa%20b%0Ac%2520%7Bx%7D%2F%C3%A9"
    );
    assert_eq!(crate::encode_key("plain-key_1.~"), "plain-key_1.~");
}

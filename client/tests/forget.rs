//! Keys that come and go do not pile up: a (tenant, key) not asked for `forget_after`, holding
//! nothing, leaves the client (`weir_client_keys` falls back); a key a `KeyHandle` holds stays
//! and goes on deciding; a forgotten key asked for again is made afresh.
//!
//! The fleet here is a port nothing listens on: a real refused connection, not a mock. No key
//! ever gets a lease, so every key holds nothing from its first decision, and the test does not
//! wait out the 30 s a leased key takes to give its lease back. That a key holding a lease,
//! tokens, a spent fallback meter or a roll under way is kept is `Budget::forgettable`'s unit
//! test.

use std::time::{Duration, Instant};

use weir_client::{Client, FailurePolicy};

fn keys(registry: &prometheus::Registry) -> f64 {
    registry
        .gather()
        .iter()
        .find(|family| family.name() == "weir_client_keys")
        .map(|family| family.get_metric()[0].get_gauge().get_value())
        .unwrap()
}

async fn until_keys(registry: &prometheus::Registry, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while keys(registry) != want {
        assert!(
            Instant::now() < deadline,
            "weir_client_keys is {} after 10 s, want {want}",
            keys(registry)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_not_asked_for_are_forgotten_and_made_afresh() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let registry = prometheus::Registry::new();
    let client = Client::builder(endpoint)
        .registry(&registry)
        .failure_policy(FailurePolicy::Open)
        .timeout(Duration::from_millis(100))
        .forget_after(Duration::from_millis(500))
        .build()
        .unwrap();

    for user in 0..1_000 {
        let decision = client.try_acquire("t", &format!("user-{user}"), 1);
        assert!(decision.allowed, "open, and no limit ever learnt");
    }
    let held = client.key("t", "held");
    assert!(held.try_acquire(1).allowed);
    assert_eq!(keys(&registry), 1_001.0);

    until_keys(&registry, 1.0).await;
    assert!(held.try_acquire(1).allowed, "the held key still decides");
    assert!(client.try_acquire("t", "user-7", 1).allowed);
    assert_eq!(keys(&registry), 2.0, "user-7 made afresh");

    drop(held);
    until_keys(&registry, 0.0).await;
}

//! The ring with real `weir` processes gossiping on 127.0.0.x: convergence, crash detection,
//! graceful leave, join, and cluster isolation. Timings are the targets, measured from
//! the event to the moment every peer's `/ring` shows the new count.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::fleet::{free_gossip_addr, spawn, until_healthy, Replica};

#[tokio::test]
async fn converge_crash_join_and_leave() {
    let addrs: Vec<SocketAddr> = (2..=4).map(|i| free_gossip_addr([127, 0, 0, i])).collect();
    let mut replicas: Vec<Replica> = addrs
        .iter()
        .map(|addr| spawn(*addr, &addrs, "scenario", &[]))
        .collect();

    // Three replicas converge to 3.
    let took = until_healthy(
        &replicas.iter().collect::<Vec<_>>(),
        3,
        Duration::from_secs(10),
    )
    .await;
    eprintln!("3 replicas converged in {took:?}");
    for replica in &replicas {
        assert_eq!(replica.ready().await, Some(200));
    }

    // SIGKILL one that has been up at least 2 s: the others drop it within 3 s.
    let victim = replicas.pop().unwrap();
    let up = victim.started.elapsed();
    if up < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_secs(2) - up).await;
    }
    victim.signal("-KILL");
    let killed = Instant::now();
    let survivors: Vec<&Replica> = replicas.iter().collect();
    until_healthy(&survivors, 2, Duration::from_secs(10)).await;
    let detected = killed.elapsed();
    eprintln!("SIGKILL detected by all survivors in {detected:?}");
    assert!(
        detected <= Duration::from_secs(3),
        "crash detection took {detected:?}"
    );
    drop(victim);

    // A fourth replica joins through one seed; it is not ready before it counts its peers,
    // and the peers count it within 2 s.
    let fourth = spawn(
        free_gossip_addr([127, 0, 0, 5]),
        &[addrs[0]],
        "scenario",
        &["--ring-join-timeout", "30s"],
    );
    let everyone = [&replicas[0], &replicas[1], &fourth];
    until_healthy(&everyone, 3, Duration::from_secs(10)).await;
    let since_start = fourth.started.elapsed();
    eprintln!("the new replica was counted by all within {since_start:?} of its start");
    assert!(
        since_start <= Duration::from_secs(2),
        "join took {since_start:?}"
    );
    assert_eq!(fourth.ready().await, Some(200));
    let members = replicas[0].ring().await.unwrap()["members"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(members, 3, "the killed replica is not listed");

    // SIGTERM one: it announces LEAVING and the others re-divide within 1 s.
    let leaver = replicas.pop().unwrap();
    leaver.signal("-TERM");
    let terminated = Instant::now();
    until_healthy(&[&replicas[0], &fourth], 2, Duration::from_secs(5)).await;
    let left = terminated.elapsed();
    eprintln!("graceful leave seen by all in {left:?}");
    assert!(left <= Duration::from_secs(1), "leave took {left:?}");
    drop(leaver);
}

/// A replica stopped (SIGSTOP) long enough for its failure detector to give up on its peers
/// never reads itself alone on resume: chitchat reads the peers dead until the next gossip
/// round, and in that moment the replica would admit its sockets' backlog as a lone replica.
#[tokio::test]
async fn a_stopped_replica_does_not_read_itself_alone_on_resume() {
    let addrs: Vec<SocketAddr> = (2..=4).map(|i| free_gossip_addr([127, 0, 0, i])).collect();
    let replicas: Vec<Replica> = addrs
        .iter()
        .map(|addr| spawn(*addr, &addrs, "stopped", &[]))
        .collect();
    until_healthy(
        &replicas.iter().collect::<Vec<_>>(),
        3,
        Duration::from_secs(10),
    )
    .await;
    let stopped = &replicas[0];
    let changes = || async {
        let url = format!("http://{}/metrics", stopped.http);
        let text = reqwest::get(url).await.unwrap().text().await.unwrap();
        text.lines()
            .find_map(|line| line.strip_prefix("weir_ring_healthy_replicas_changes_total "))
            .map(|value| value.parse::<f64>().unwrap())
            .unwrap()
    };
    let before = changes().await;
    stopped.signal("-STOP");
    // The peers give it up within 3 s (see above); so does its detector give up on them.
    tokio::time::sleep(Duration::from_secs(6)).await;
    stopped.signal("-CONT");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(stopped.healthy().await, Some(3));
    assert_eq!(
        changes().await,
        before,
        "the resumed replica's healthy count moved (it read its peers dead on resume)"
    );
    // And it said so with its usage report, so the peers charge what it admits on resuming
    // rather than forgiving it as a partitioned peer's (the publisher runs once a peer is
    // live, which it is here).
    for peer in &replicas[1..] {
        let ring = peer.ring().await.unwrap();
        let member = ring["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|member| member["gossip_addr"] == addrs[0].to_string())
            .cloned()
            .unwrap_or_default();
        assert_eq!(member["stalls"], 1, "{member}");
    }
}

#[tokio::test]
async fn replica_is_not_ready_until_it_has_seen_its_seeds() {
    let seed_addr = free_gossip_addr([127, 0, 0, 6]);
    // The seed's port, held by the test until the seed starts: the late replica's gossip
    // arriving there shows it has tried its seed, so its answer to /ready is then worth
    // checking.
    let seed_port = tokio::net::UdpSocket::bind(seed_addr).await.unwrap();
    let late_gossip = free_gossip_addr([127, 0, 0, 7]);
    let late = spawn(
        late_gossip,
        &[seed_addr],
        "readiness",
        &["--ring-join-timeout", "60s"],
    );
    let mut datagram = [0u8; 65536];
    let (_, from) =
        tokio::time::timeout(Duration::from_secs(10), seed_port.recv_from(&mut datagram))
            .await
            .expect("the late replica never gossiped to its seed")
            .unwrap();
    assert_eq!(from, late_gossip);
    drop(seed_port);
    assert_eq!(late.ready().await, Some(503), "its seed is not up yet");
    let seed = spawn(
        seed_addr,
        &[seed_addr],
        "readiness",
        &["--ring-join-timeout", "60s"],
    );
    until_healthy(&[&seed, &late], 2, Duration::from_secs(10)).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    while late.ready().await != Some(200) {
        assert!(Instant::now() < deadline, "not ready after seeing its seed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The seed lists only itself, so it was ready at once.
    assert_eq!(seed.ready().await, Some(200));
}

#[tokio::test]
async fn clusters_with_different_ids_never_merge() {
    let alpha: Vec<SocketAddr> = (8..=9).map(|i| free_gossip_addr([127, 0, 0, i])).collect();
    let beta_addr = free_gossip_addr([127, 0, 0, 10]);
    // Each side lists the other's replicas as seeds too: only the cluster id keeps them apart.
    let all: Vec<SocketAddr> = alpha.iter().copied().chain([beta_addr]).collect();
    let fast_join = ["--ring-join-timeout", "1s"];
    let alpha_replicas: Vec<Replica> = alpha
        .iter()
        .map(|addr| spawn(*addr, &all, "alpha", &fast_join))
        .collect();
    let beta = spawn(beta_addr, &all, "beta", &fast_join);

    until_healthy(
        &alpha_replicas.iter().collect::<Vec<_>>(),
        2,
        Duration::from_secs(10),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await; // many gossip rounds
    for replica in &alpha_replicas {
        let ring = replica.ring().await.unwrap();
        assert_eq!(ring["healthy"], 2);
        assert_eq!(ring["members"].as_array().unwrap().len(), 2, "{ring}");
    }
    let ring = beta.ring().await.unwrap();
    assert_eq!(ring["healthy"], 1);
    assert_eq!(ring["members"].as_array().unwrap().len(), 1, "{ring}");
    assert_eq!(
        beta.ready().await,
        Some(200),
        "ready after the join timeout"
    );
}

/// With `--gossip-secret`, every datagram is authenticated: replicas with the key form a ring;
/// a rogue weir with another key, or with none (plain chitchat), is never counted, though it
/// gossips at them; and a replica mid-rotation (`new,old`) is counted by one still on
/// `old,new`.
#[tokio::test]
async fn gossip_without_the_secret_is_not_heard() {
    let addrs: Vec<SocketAddr> = (180..=184)
        .map(|i| free_gossip_addr([127, 0, 0, i]))
        .collect();
    let old = "old-gossip-secret-0123456789";
    let new = "new-gossip-secret-0123456789";
    let fast_join = ["--ring-join-timeout", "1s"];
    let with = |secrets: String| {
        let mut args = vec!["--gossip-secret".to_string(), secrets];
        args.extend(fast_join.iter().map(ToString::to_string));
        args
    };
    fn args(list: &[String]) -> Vec<&str> {
        list.iter().map(String::as_str).collect()
    }
    let keyed: Vec<Replica> = addrs[..2]
        .iter()
        .map(|addr| spawn(*addr, &addrs, "secret", &args(&with(old.into()))))
        .collect();
    // Rogues list the keyed replicas as seeds and gossip at them.
    let stranger = spawn(
        addrs[2],
        &addrs,
        "secret",
        &args(&with(format!("{new}-other"))),
    );
    let plain = spawn(addrs[3], &addrs, "secret", &fast_join);
    until_healthy(
        &keyed.iter().collect::<Vec<_>>(),
        2,
        Duration::from_secs(10),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await; // many gossip rounds
    for replica in &keyed {
        let ring = replica.ring().await.unwrap();
        assert_eq!(ring["healthy"], 2, "{ring}");
        assert_eq!(ring["members"].as_array().unwrap().len(), 2, "{ring}");
    }
    for rogue in [&stranger, &plain] {
        let ring = rogue.ring().await.unwrap();
        assert_eq!(ring["healthy"], 1, "a rogue heard the keyed ring: {ring}");
    }
    let rejected = async |replica: &Replica| -> f64 {
        let base = format!("http://{}", replica.http);
        common::metric_at(
            &reqwest::Client::new(),
            &base,
            "weir_ring_rejected_gossip_total{reason=\"key\"}",
        )
        .await
        .unwrap_or(0.0)
    };
    assert!(rejected(&keyed[0]).await + rejected(&keyed[1]).await > 0.0);

    // Rotation: a replica that signs with `new` and still accepts `old` joins the ring once
    // the others accept `new` too (`old,new`), the middle step of a rolling rotation.
    drop(keyed);
    let rotating: Vec<Replica> = [
        (addrs[0], format!("{old},{new}")),
        (addrs[4], format!("{new},{old}")),
    ]
    .into_iter()
    .map(|(addr, secrets)| {
        spawn(
            addr,
            &[addrs[0], addrs[4]],
            "rotation",
            &args(&with(secrets)),
        )
    })
    .collect();
    until_healthy(
        &rotating.iter().collect::<Vec<_>>(),
        2,
        Duration::from_secs(10),
    )
    .await;
}

//! The gossip edge: joins the chitchat cluster, publishes this replica's state, and turns
//! what gossip reports into a [`Membership`] on a watch channel.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use chitchat::transport::UdpTransport;
use chitchat::{
    spawn_chitchat, ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig,
    ProtocolVersion,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::ha::{HaEntry, HA_KEY};
use crate::membership::{
    Member, MemberState, Membership, KEY_GRPC_ADDR, KEY_HTTP_ADDR, KEY_LEASE_HORIZON, KEY_STALLS,
    KEY_STATE, KEY_VERSION,
};
use crate::usage::{self, PeerKey, UsageAggregate, UsageEntry, USAGE_KEY};

/// How this replica joins the ring.
#[derive(Debug, Clone)]
pub struct RingConfig {
    /// Unique per process start.
    pub node_id: String,
    /// Replicas with another cluster id ignore this one, and it them.
    pub cluster_id: String,
    /// UDP address to bind for gossip; port 0 picks a free port.
    pub listen_addr: SocketAddr,
    /// Address peers send gossip to; defaults to `listen_addr`.
    pub advertise_addr: Option<SocketAddr>,
    /// `host:port` of replicas to contact first; a host name may resolve to many addresses.
    pub seeds: Vec<String>,
    /// How often seed host names are resolved again.
    pub seeds_refresh_interval: Duration,
    pub gossip_interval: Duration,
    /// The failure detector declares a peer dead once the time since its last heartbeat
    /// exceeds this many mean heartbeat intervals.
    pub phi_threshold: f64,
    /// How long a dead peer is remembered before it is forgotten.
    pub dead_node_grace_period: Duration,
    /// The first replica has no peers to see: after this long it stops waiting for seeds.
    pub join_timeout: Duration,
    /// Published for operators and tools (`/ring`).
    pub http_addr: String,
    /// Published for peers and tools: the admission API's gRPC address.
    pub grpc_addr: Option<String>,
    pub version: String,
    /// Most live members counted (this replica included); more are ignored, so thousands of
    /// fake members cannot divide every limit by thousands.
    pub max_members: usize,
    /// Encrypt every gossip datagram with these keys; `None`: plain, unauthenticated gossip.
    pub gossip_keys: Option<crate::GossipKeys>,
    /// A tenant a peer has not listed in its usage for this long is forgotten: set it past
    /// how long the replicas keep an idle tenant (see [`UsageAggregate`]).
    pub usage_forget_after: Duration,
}

/// A joined replica. Dropping it without [`Ring::shutdown`] stops gossip abruptly, as a crash
/// would.
pub struct Ring {
    handle: ChitchatHandle,
    horizon: Arc<Horizon>,
    /// How many stalls of this process the usage publisher has noticed (see `KEY_STALLS`).
    stalls: AtomicU64,
    membership_rx: watch::Receiver<Arc<Membership>>,
    observer: JoinHandle<()>,
    gossip_interval: Duration,
    self_addr: SocketAddr,
}

impl Ring {
    pub async fn join(config: RingConfig) -> anyhow::Result<Ring> {
        let listen_addr = if config.listen_addr.port() == 0 {
            // chitchat needs its address before it binds: find a free port first.
            std::net::UdpSocket::bind(config.listen_addr)
                .and_then(|socket| socket.local_addr())
                .with_context(|| {
                    format!(
                        "cannot bind gossip address {} (a second replica on one host needs its \
                         own --gossip-addr, e.g. --gossip-addr 127.0.0.1:0)",
                        config.listen_addr
                    )
                })?
        } else {
            config.listen_addr
        };
        let advertise_addr = config.advertise_addr.unwrap_or(listen_addr);
        if advertise_addr.ip().is_unspecified() {
            bail!(
                "gossip address {listen_addr} binds every interface; set --gossip-advertise-addr \
                 to the address peers should use"
            );
        }
        let generation = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        let chitchat_config = ChitchatConfig {
            chitchat_id: ChitchatId::new(config.node_id.clone(), generation, advertise_addr),
            cluster_id: config.cluster_id.clone(),
            gossip_interval: config.gossip_interval,
            listen_addr,
            seed_nodes: config.seeds.clone(),
            dns_refresh_interval: config.seeds_refresh_interval,
            failure_detector_config: FailureDetectorConfig {
                phi_threshold: config.phi_threshold,
                // chitchat's default prior (5 s) makes a young peer take tens of seconds to be
                // declared dead; the gossip interval is the honest prior.
                initial_interval: config.gossip_interval,
                dead_node_grace_period: config.dead_node_grace_period,
                ..FailureDetectorConfig::default()
            },
            marked_for_deletion_grace_period: config.dead_node_grace_period,
            catchup_callback: None,
            extra_liveness_predicate: None,
            protocol_version: ProtocolVersion::V0,
        };
        let initial = vec![
            (
                KEY_STATE.to_string(),
                MemberState::Active.as_str().to_string(),
            ),
            (KEY_HTTP_ADDR.to_string(), config.http_addr.clone()),
            (
                KEY_GRPC_ADDR.to_string(),
                config.grpc_addr.clone().unwrap_or_default(),
            ),
            (KEY_VERSION.to_string(), config.version.clone()),
        ];
        let mut rejected_gossip = None;
        let started = match &config.gossip_keys {
            Some(keys) => {
                tracing::info!(
                    "gossip is encrypted (XChaCha20-Poly1305, replay window {:?}); replicas of \
                     an older weir, whose gossip is only signed (HMAC), cannot read it nor it \
                     theirs",
                    crate::auth::DEFAULT_REPLAY_WINDOW
                );
                let transport = crate::auth::EncryptedUdp::new(keys.clone());
                rejected_gossip = Some(transport.rejected());
                spawn_chitchat(chitchat_config, initial, &transport).await
            }
            None => {
                tracing::warn!(
                    "gossip is neither authenticated nor encrypted: any host that reaches the \
                     gossip port can join the ring, and read every replica and tenant name in \
                     it (set --gossip-secret or --gossip-secret-file)"
                );
                spawn_chitchat(chitchat_config, initial, &UdpTransport).await
            }
        };
        let handle = started.with_context(|| {
            format!(
                "cannot start gossip on {listen_addr} (a second replica on one host needs \
                     its own --gossip-addr, e.g. --gossip-addr 127.0.0.1:0)"
            )
        })?;

        let mut seeds = Vec::new();
        for seed in &config.seeds {
            match tokio::net::lookup_host(seed.as_str()).await {
                Ok(addrs) => seeds.extend(addrs),
                Err(err) => tracing::warn!(%seed, %err, "cannot resolve seed; not waiting for it"),
            }
        }
        // A replica with no seeds but itself has nobody to wait for: it is joined from the
        // start, not from the observer's first round (a /ready in between answered 503).
        let first = Membership {
            joined: seeds.iter().all(|seed| *seed == advertise_addr),
            ..Membership::alone()
        };
        let (membership_tx, membership_rx) = watch::channel(Arc::new(first));
        let horizon = Arc::new(Horizon::default());
        let observer = tokio::spawn(observe(
            handle.chitchat(),
            membership_tx,
            Observation {
                horizon: Arc::clone(&horizon),
                max_members: config.max_members,
                rejected_gossip,
                period: config.gossip_interval / 2,
                seeds,
                self_addr: advertise_addr,
                join_timeout: config.join_timeout,
                usage_forget_after: config.usage_forget_after,
            },
        ));
        tracing::info!(
            node_id = %config.node_id, cluster_id = %config.cluster_id, gossip = %advertise_addr,
            seeds = ?config.seeds, "joined the ring"
        );
        Ok(Ring {
            handle,
            horizon,
            stalls: AtomicU64::new(0),
            membership_rx,
            observer,
            gossip_interval: config.gossip_interval,
            self_addr: advertise_addr,
        })
    }

    /// The membership as this replica sees it, refreshed every half gossip interval; a
    /// receiver's `changed` fires only when there is news ([`Membership::same_news`]).
    pub fn membership(&self) -> watch::Receiver<Arc<Membership>> {
        self.membership_rx.clone()
    }

    pub fn gossip_addr(&self) -> SocketAddr {
        self.self_addr
    }

    /// Announces `LEAVING` and waits long enough for it to gossip out, so peers re-divide
    /// before this replica stops serving.
    pub async fn leave(&self) {
        self.handle
            .with_chitchat(|chitchat| {
                chitchat
                    .self_node_state()
                    .set(KEY_STATE, MemberState::Leaving.as_str())
            })
            .await;
        tokio::time::sleep(self.gossip_interval * 3).await;
    }

    /// Publishes this replica's per-tenant usage (for `weighted`), in the order given, as
    /// many entries as fit the cap; returns how many were published. See [`usage`].
    /// `stalled`: the publisher did not run for a while (see [`Ring::stall_after`]): the
    /// count of stalls goes up with this report, in the same change, so a peer that reads
    /// the report reads the count with it, and charges what this replica admitted since it
    /// resumed rather than forgiving it as a partitioned peer's ([`KEY_STALLS`]).
    pub async fn publish_usage(&self, entries: &[UsageEntry], stalled: bool) -> usize {
        let (value, listed) = usage::encode(entries, self.usage_cap());
        let stalls = match stalled {
            true => self.stalls.fetch_add(1, Ordering::Relaxed) + 1,
            false => 0,
        };
        self.handle
            .with_chitchat(|chitchat| {
                let node = chitchat.self_node_state();
                if stalled {
                    node.set(KEY_STALLS, stalls.to_string());
                }
                node.set(USAGE_KEY, &value);
            })
            .await;
        listed
    }

    /// A gap this long between two rounds of a task that runs every half gossip round means
    /// the process did not run (SIGSTOP, a paused VM, a starved host): ten rounds, at least a
    /// second.
    pub fn stall_after(&self) -> Duration {
        (self.gossip_interval * 5).max(Duration::from_secs(1))
    }

    /// The most entries [`Ring::publish_usage`] can publish now: its cap over the shortest
    /// line an entry makes. More need not be written out.
    pub fn usage_entries_max(&self) -> usize {
        self.usage_cap() / usage::SHORTEST_LINE
    }

    /// The usage key's size cap. Every replica's key travels in the same datagrams: the more
    /// replicas, the smaller each key, so one round still carries every replica's news.
    fn usage_cap(&self) -> usize {
        let healthy = self.membership_rx.borrow().healthy.max(1);
        (MAX_USAGE_BYTES_ALL / healthy).clamp(MIN_USAGE_BYTES, MAX_USAGE_BYTES)
    }

    /// Publishes the HA elections this replica has seen traffic for, in the order given, as
    /// many as fit the cap; returns how many were published. Publishing the same list again
    /// sends nothing new. See [`crate::ha`].
    pub async fn publish_ha(&self, entries: &[HaEntry]) -> usize {
        let (value, listed) = crate::ha::encode(entries, MAX_HA_BYTES);
        self.handle
            .with_chitchat(|chitchat| {
                let node = chitchat.self_node_state();
                if node.get(HA_KEY) != Some(value.as_str()) {
                    node.set(HA_KEY, &value);
                }
            })
            .await;
        listed
    }

    /// Publishes how much longer this replica's longest-running in-flight lease may be held
    /// (see [`Membership::slot_horizon`]), rounded up to whole seconds. A longer one is
    /// published at once; a shorter one only once it is under half of what was published,
    /// so a fleet holding leases does not rewrite the key every second.
    pub async fn publish_lease_horizon(&self, horizon: Duration) {
        let ms = horizon.as_millis().div_ceil(1000) as u64 * 1000;
        let published = self.horizon.own_ms.load(Ordering::Relaxed);
        if ms > published || ms * 2 < published {
            self.horizon.own_ms.store(ms, Ordering::Relaxed);
            self.handle
                .with_chitchat(|chitchat| self.horizon.publish(chitchat))
                .await;
        }
    }

    /// Stops gossip. Peers see this replica's heartbeat stop and drop it.
    pub async fn shutdown(&self) {
        self.observer.abort();
        let stopped = self.handle.termination_watcher();
        if let Err(err) = self.handle.initiate_shutdown() {
            tracing::warn!(%err, "gossip did not stop cleanly");
            return;
        }
        if let Err(err) = stopped.await {
            tracing::warn!(%err, "gossip did not stop cleanly");
        }
    }
}

/// The usage keys of all replicas together stay under this (a UDP datagram is 65 507 bytes).
const MAX_USAGE_BYTES_ALL: usize = 48 * 1024;
const MAX_USAGE_BYTES: usize = 24 * 1024;
const MIN_USAGE_BYTES: usize = 4 * 1024;
/// A replica's HA elections stay under this: about 200 HA clusters of short names.
const MAX_HA_BYTES: usize = 12 * 1024;

/// How often a replica with no live peer observes gossip without being told of a change.
const ALONE_PERIOD: Duration = Duration::from_secs(1);

/// What this replica publishes as its lease horizon: the longer of its own leases' (set by
/// [`Ring::publish_lease_horizon`]) and the departed peers' it still guards (set by the
/// observer), so a replica that joins later learns of both.
#[derive(Default)]
struct Horizon {
    own_ms: AtomicU64,
    departed_ms: AtomicU64,
}

impl Horizon {
    /// Writes the key if its value changed; called under chitchat's lock, so the last writer
    /// writes the latest of both values.
    fn publish(&self, chitchat: &mut chitchat::Chitchat) {
        let ms = self
            .own_ms
            .load(Ordering::Relaxed)
            .max(self.departed_ms.load(Ordering::Relaxed));
        let value = ms.to_string();
        let node = chitchat.self_node_state();
        if node.get(KEY_LEASE_HORIZON).unwrap_or("0") != value {
            node.set(KEY_LEASE_HORIZON, &value);
        }
    }
}

/// The peers that stopped counting as healthy (dead, gone, leaving) while they said their
/// leases could run on: each with its horizon, guarded until it has passed. Pure, with the
/// clock passed in.
#[derive(Debug, Default)]
struct Departed {
    /// The healthy peers of the last observation, with their published horizons.
    healthy: HashMap<PeerKey, Duration>,
    /// (until, horizon) of each departed peer still guarded.
    guarded: Vec<(Instant, Duration)>,
}

impl Departed {
    /// Folds in this observation's members; returns the longest horizon guarded now (a
    /// departed peer's whole horizon while it is guarded, so the value does not move every
    /// observation).
    fn observe(&mut self, members: &[Member], now: Instant) -> Duration {
        let healthy: HashMap<PeerKey, Duration> = members
            .iter()
            .filter(|member| !member.is_self && member.state == MemberState::Active)
            .map(|member| {
                (
                    (member.node_id.clone(), member.generation),
                    member.lease_horizon,
                )
            })
            .collect();
        for (key, horizon) in &self.healthy {
            if !horizon.is_zero() && !healthy.contains_key(key) {
                self.guarded.push((now + *horizon, *horizon));
            }
        }
        self.healthy = healthy;
        self.guarded.retain(|(until, _)| *until > now);
        self.guarded
            .iter()
            .map(|(_, horizon)| *horizon)
            .max()
            .unwrap_or_default()
    }
}

struct Observation {
    horizon: Arc<Horizon>,
    max_members: usize,
    rejected_gossip: Option<Arc<crate::auth::RejectedGossip>>,
    period: Duration,
    seeds: Vec<SocketAddr>,
    self_addr: SocketAddr,
    join_timeout: Duration,
    usage_forget_after: Duration,
}

impl Observation {
    /// How long a gap between two observations means this process was stalled, and how long
    /// after one the peers it saw before are kept: ten observations, at least a second.
    fn stall_after(&self) -> Duration {
        (self.period * 10).max(Duration::from_secs(1))
    }
}

/// `members` as chitchat reads them now, with the peers of the membership before (`before`)
/// that it no longer lists put back as they were. Just after this process was stalled,
/// chitchat's failure detector reads every peer dead for want of a heartbeat it could not
/// receive. A replica resumed after 8 s read one healthy replica, itself, for a millisecond:
/// it admitted the pushes its sockets had queued as if alone, reserving ahead as a lone
/// replica may, and a tenant at 0.9 L was refused there for 8 s while the debt was paid.
fn carry_over(mut members: Vec<Member>, before: &[Member]) -> Vec<Member> {
    for member in before.iter().filter(|member| !member.is_self) {
        let listed = members
            .iter()
            .any(|m| m.node_id == member.node_id && m.generation == member.generation);
        if !listed {
            members.push(member.clone());
        }
    }
    members
}

/// Reads the live nodes from chitchat every `period` and publishes the membership. Polling,
/// not chitchat's own watcher, because that one fires only on key changes, and "last heard"
/// needs every heartbeat. Alone (joined, no live peer), there is no heartbeat to follow: it
/// waits for that watcher instead, so a lone replica is not woken ten times a second.
async fn observe(
    chitchat: Arc<tokio::sync::Mutex<chitchat::Chitchat>>,
    membership_tx: watch::Sender<Arc<Membership>>,
    observation: Observation,
) {
    let started = Instant::now();
    let mut heard: HashMap<ChitchatId, (u64, Instant)> = HashMap::new();
    // The version of each peer's usage key last folded into the aggregate.
    let mut usage_versions: HashMap<PeerKey, u64> = HashMap::new();
    // Each peer's HA elections, with the version of its key they were read from.
    let mut ha_lists: HashMap<PeerKey, (u64, Vec<HaEntry>)> = HashMap::new();
    let mut peer_ha = Arc::new(Vec::new());
    let mut skipped_ha = 0u64;
    let mut aggregate = UsageAggregate::new(observation.usage_forget_after);
    let usage_feed = Arc::new(crate::usage::UsageFeed::default());
    let mut usage_round = 0u64;
    let mut rejected: HashMap<PeerKey, u64> = HashMap::new();
    let mut rejected_total = 0u64;
    let mut skipped_total = [0u64; usage::EntryError::ALL.len()];
    let mut skipped_warned: std::collections::HashSet<PeerKey> = Default::default();
    let mut warned_members = false;
    let mut joined = false;
    let mut ticker = tokio::time::interval(observation.period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut live_changes = chitchat.lock().await.live_nodes_watcher();
    let mut alone = false;
    let mut last_round = Instant::now();
    let mut stalled_until: Option<Instant> = None;
    let mut stalled_from = Instant::now();
    let mut departed = Departed::default();
    loop {
        let waited_alone = alone;
        if alone {
            // No peer's heartbeat to follow: wake when chitchat's live set changes (a peer
            // joined through this replica, or this replica's own keys changed), or after
            // `ALONE_PERIOD` for the gossip counters and the forgetting.
            if let Ok(Err(_)) = tokio::time::timeout(ALONE_PERIOD, live_changes.changed()).await {
                ticker.tick().await; // chitchat stopped: poll as before
            }
        } else {
            ticker.tick().await;
        }
        let now = Instant::now();
        // This process did not run for a while (SIGSTOP, a paused VM, a starved host): chitchat
        // has not heard from the peers for as long, and reads them dead until the next gossip
        // round revives them. Until then they keep their place (see `carry_over`).
        if !waited_alone && now.duration_since(last_round) > observation.stall_after() {
            stalled_until = Some(now + observation.stall_after());
            stalled_from = last_round;
        }
        last_round = now;
        let mut ha_changed = false;
        let members: Vec<Member> = {
            let chitchat = chitchat.lock().await;
            let self_id = chitchat.self_chitchat_id().clone();
            chitchat
                .live_nodes()
                .filter_map(|id| {
                    let state = chitchat.node_state(id)?;
                    let heartbeat: u64 = state.heartbeat().into();
                    let entry = heard.entry(id.clone()).or_insert((heartbeat, now));
                    if entry.0 != heartbeat {
                        *entry = (heartbeat, now);
                    }
                    let is_self = *id == self_id;
                    // Set with the usage report, so read with it (see `KEY_STALLS`).
                    let stalls: u64 = state
                        .get(KEY_STALLS)
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                    if let Some(versioned) = state.get_versioned(USAGE_KEY).filter(|_| !is_self) {
                        let key = (id.node_id.to_string(), id.generation_id);
                        if usage_versions.get(&key) != Some(&versioned.version) {
                            usage_versions.insert(key.clone(), versioned.version);
                            match usage::decode(&versioned.value) {
                                Ok(report) => {
                                    aggregate.note_stalls(&key, stalls);
                                    aggregate.observe(&key, &report.entries, now);
                                    // Untrusted input: a bad entry is skipped alone, counted,
                                    // and said once per peer; the rest of the report counts.
                                    for (total, skipped) in skipped_total.iter_mut().zip(report.skipped) {
                                        *total += skipped;
                                    }
                                    if let Some((line, reason)) = report.first_skipped {
                                        if skipped_warned.insert(key) {
                                            tracing::warn!(peer = %id.node_id, line, skipped = report.skipped_total(), "skipped an unreadable entry in a usage report from a peer (the rest of it is used): {reason}");
                                        }
                                    }
                                }
                                Err(err) => {
                                    // A whole report refused: ignored, and said once per peer.
                                    rejected_total += 1;
                                    let count = rejected.entry(key).or_default();
                                    if *count == 0 {
                                        tracing::warn!(peer = %id.node_id, "ignoring a usage report: {err}");
                                    }
                                    *count += 1;
                                }
                            }
                        }
                    }
                    if let Some(versioned) = state.get_versioned(HA_KEY).filter(|_| !is_self) {
                        let key = (id.node_id.to_string(), id.generation_id);
                        if ha_lists.get(&key).map(|(version, _)| *version) != Some(versioned.version) {
                            let entries = match crate::ha::decode(&versioned.value) {
                                Ok((entries, skipped)) => {
                                    skipped_ha += skipped;
                                    entries
                                }
                                Err(err) => {
                                    if !ha_lists.contains_key(&key) {
                                        tracing::warn!(peer = %id.node_id, "ignoring HA elections: {err}");
                                    }
                                    skipped_ha += 1;
                                    Vec::new()
                                }
                            };
                            ha_lists.insert(key, (versioned.version, entries));
                            ha_changed = true;
                        }
                    }
                    Some(Member {
                        node_id: id.node_id.to_string(),
                        generation: id.generation_id,
                        gossip_addr: id.gossip_advertise_addr,
                        http_addr: state.get(KEY_HTTP_ADDR).map(str::to_string),
                        grpc_addr: state
                            .get(KEY_GRPC_ADDR)
                            .filter(|addr| !addr.is_empty())
                            .map(str::to_string),
                        version: state.get(KEY_VERSION).map(str::to_string),
                        state: MemberState::parse(state.get(KEY_STATE)),
                        is_self,
                        last_heard: if is_self {
                            Duration::ZERO
                        } else {
                            now.duration_since(entry.1)
                        },
                        lease_horizon: state
                            .get(KEY_LEASE_HORIZON)
                            .and_then(|ms| ms.parse().ok())
                            .map(Duration::from_millis)
                            .unwrap_or_default(),
                        stalls,
                    })
                })
                .collect()
        };
        let members = match stalled_until {
            Some(until) if now < until => carry_over(members, &membership_tx.borrow().members),
            _ => {
                stalled_until = None;
                members
            }
        };
        heard.retain(|id, _| {
            members
                .iter()
                .any(|m| m.node_id == *id.node_id && m.generation == id.generation_id)
        });
        let live = |(node_id, generation): &PeerKey| {
            members
                .iter()
                .any(|m| m.node_id == *node_id && m.generation == *generation)
        };
        usage_versions.retain(|key, _| live(key));
        let peers_with_ha = ha_lists.len();
        ha_lists.retain(|key, _| live(key));
        if ha_changed || ha_lists.len() != peers_with_ha {
            peer_ha = Arc::new(
                ha_lists
                    .values()
                    .flat_map(|(_, entries)| entries.iter().cloned())
                    .collect(),
            );
        }
        rejected.retain(|key, _| live(key));
        skipped_warned.retain(|key| live(key));
        aggregate.retain_peers(live, now);
        // What moved in the peers' usage: the tenants their reports touched, and those a
        // departure, a stale level or forgetting did.
        let mut usage = aggregate.changes(now);
        // A bound on what gossip can make this replica believe: this replica and the first
        // peers by node id count; the rest are ignored, and said once.
        let mut members = members;
        let mut ignored = 0;
        if members.len() > observation.max_members.max(1) {
            members.sort_by(|a, b| (!a.is_self, &a.node_id).cmp(&(!b.is_self, &b.node_id)));
            ignored = members.len() - observation.max_members.max(1);
            members.truncate(observation.max_members.max(1));
            if !warned_members {
                tracing::warn!(
                    ignored,
                    max = observation.max_members,
                    "more live members than --ring-max-members: the rest are ignored"
                );
                warned_members = true;
            }
        }
        // A departed peer's leases are still out: guarded here, published for replicas that
        // join later, and part of the horizon the shares keep to.
        let departed_horizon = departed.observe(&members, now);
        let departed_ms = departed_horizon.as_millis() as u64;
        if observation
            .horizon
            .departed_ms
            .swap(departed_ms, Ordering::Relaxed)
            != departed_ms
        {
            observation.horizon.publish(&mut *chitchat.lock().await);
        }
        let peers_horizon = members
            .iter()
            .filter(|member| !member.is_self)
            .map(|member| member.lease_horizon)
            .max()
            .unwrap_or_default();
        let mut membership = Membership::from_members(members, joined);
        membership.peers_lease_horizon = peers_horizon;
        membership.departed_lease_horizon = departed_horizon;
        membership.ignored_members = ignored;
        membership.rejected_usage_reports = rejected_total;
        membership.skipped_usage_entries = skipped_total;
        membership.rejected_gossip = observation
            .rejected_gossip
            .as_ref()
            .map_or_else(Default::default, |rejected| rejected.snapshot());
        membership.peer_ha = Arc::clone(&peer_ha);
        membership.skipped_ha_entries = skipped_ha;
        membership.stalled_since = stalled_until.map(|_| now.duration_since(stalled_from));
        if !usage.is_empty() {
            usage.stalled_since = membership.stalled_since;
            usage_feed.push(usage);
            usage_round += 1;
        }
        membership.peer_usage = Arc::clone(&usage_feed);
        membership.usage_round = usage_round;
        membership.peer_usage_tenants = aggregate.tenants();
        if !joined
            && (started.elapsed() >= observation.join_timeout
                || membership.has_seen(&observation.seeds, observation.self_addr))
        {
            joined = true;
            membership.joined = true;
            tracing::info!(healthy = membership.healthy, "ring joined: peers seen");
        }
        alone = joined && !membership.has_live_peer();
        // Every observation replaces what readers borrow (a member's `last_heard` moves each
        // time), but wakes those waiting for a change only when there is news: alone or in a
        // quiet fleet, the appliers sleep between gossip events.
        membership_tx.send_if_modified(|current| {
            let news = !current.same_news(&membership);
            *current = Arc::new(membership);
            news
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, generation: u64, state: MemberState, horizon_s: u64) -> Member {
        Member {
            node_id: id.into(),
            generation,
            gossip_addr: SocketAddr::from(([127, 0, 0, 1], 1)),
            http_addr: None,
            grpc_addr: None,
            version: None,
            state,
            is_self: false,
            last_heard: Duration::ZERO,
            lease_horizon: Duration::from_secs(horizon_s),
            stalls: 0,
        }
    }

    /// A peer that dies, leaves, or comes back as a new incarnation is guarded for the horizon
    /// it last published; one that held no lease is not guarded at all.
    #[test]
    fn a_departed_peer_is_guarded_for_its_last_horizon() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut departed = Departed::default();
        let fleet = [
            member("a", 1, MemberState::Active, 30),
            member("b", 1, MemberState::Active, 0),
            member("c", 1, MemberState::Active, 5),
        ];
        assert_eq!(departed.observe(&fleet, at(0)), Duration::ZERO);
        // a dies, b (no lease) dies: only a is guarded, for 30 s.
        assert_eq!(
            departed.observe(&fleet[2..], at(1)),
            Duration::from_secs(30)
        );
        assert_eq!(
            departed.observe(&fleet[2..], at(30)),
            Duration::from_secs(30)
        );
        assert_eq!(departed.observe(&fleet[2..], at(31)), Duration::ZERO);
        // c leaves (still live, LEAVING): guarded for its 5 s.
        let leaving = [member("c", 1, MemberState::Leaving, 5)];
        assert_eq!(departed.observe(&leaving, at(32)), Duration::from_secs(5));
        // c restarts under its id: the old incarnation stays guarded.
        let restarted = [member("c", 2, MemberState::Active, 0)];
        assert_eq!(departed.observe(&restarted, at(33)), Duration::from_secs(5));
        assert_eq!(departed.observe(&restarted, at(37)), Duration::ZERO);
    }
}

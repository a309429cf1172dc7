//! What consumers see: the live members, their states, and the healthy count. Computed by a
//! pure function from what gossip reports, so the rules are tested without sockets.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;

/// Keys each replica publishes about itself.
pub const KEY_STATE: &str = "state";
pub const KEY_HTTP_ADDR: &str = "http_addr";
pub const KEY_GRPC_ADDR: &str = "grpc_addr";
pub const KEY_VERSION: &str = "version";
/// How long (whole ms) the replica's longest-running in-flight lease may still be held, or a
/// departed peer's it still guards (see [`Membership::slot_horizon`]).
pub const KEY_LEASE_HORIZON: &str = "lease_horizon_ms";
/// How many times the replica noticed it had not run for a while (SIGSTOP, a paused VM), set
/// in the same change as the usage report after each: a peer that comes back with a higher
/// count was stalled, not cut off, and what its report adds since it left was admitted after
/// it resumed, so it is charged (see [`crate::usage::UsageAggregate::note_stalls`]).
pub const KEY_STALLS: &str = "stalls";

/// A replica's lifecycle state, as it announces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MemberState {
    /// Serving; counted in the healthy count.
    Active,
    /// Shutting down; peers stop counting it at once.
    Leaving,
    /// Announced something this version does not know (a newer peer); not counted.
    Unknown,
}

impl MemberState {
    pub fn as_str(self) -> &'static str {
        match self {
            MemberState::Active => "ACTIVE",
            MemberState::Leaving => "LEAVING",
            MemberState::Unknown => "UNKNOWN",
        }
    }

    pub fn parse(text: Option<&str>) -> MemberState {
        match text {
            Some("ACTIVE") => MemberState::Active,
            Some("LEAVING") => MemberState::Leaving,
            _ => MemberState::Unknown,
        }
    }
}

/// One live member, as gossip reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Member {
    pub node_id: String,
    /// Start time of this incarnation (Unix ms); a restarted replica is a new incarnation.
    pub generation: u64,
    pub gossip_addr: SocketAddr,
    pub http_addr: Option<String>,
    /// The admission API's gRPC address, when the replica serves it.
    pub grpc_addr: Option<String>,
    pub version: Option<String>,
    pub state: MemberState,
    pub is_self: bool,
    /// Time since this replica last saw the member's heartbeat move (0 for itself).
    #[serde(serialize_with = "seconds")]
    pub last_heard: Duration,
    /// How long a lease the member granted (or a departed peer's it knows of) may still be
    /// held, as it last published; 0 when it holds none or does not say.
    #[serde(serialize_with = "seconds")]
    pub lease_horizon: Duration,
    /// How many stalls of its own process the member has reported ([`KEY_STALLS`]).
    pub stalls: u64,
}

fn seconds<S: serde::Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(duration.as_secs_f64())
}

/// The membership as one replica sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Membership {
    /// Live members, this replica included, ordered by node id.
    pub members: Vec<Member>,
    /// Live `ACTIVE` members, this replica included. Never below 1: a replica always counts
    /// itself, even while leaving, so a limit is never divided by 0.
    pub healthy: usize,
    /// Whether this replica has seen its seeds (or waited out the join timeout).
    pub joined: bool,
    /// What the peers have admitted per tenant, for the `weighted` strategy: each round's
    /// changes, queued for the consumer to take (a watch keeps only the latest membership).
    #[serde(skip)]
    pub peer_usage: std::sync::Arc<crate::usage::UsageFeed>,
    /// How many batches of changes the ring has queued in `peer_usage` since start: moves
    /// when there is one to take.
    #[serde(skip)]
    pub usage_round: u64,
    /// How many tenants (and admission keys) the peers' usage holds.
    #[serde(skip)]
    pub peer_usage_tenants: usize,
    /// Peer usage reports ignored whole since start (a format this version does not read),
    /// cumulative.
    pub rejected_usage_reports: u64,
    /// Entries skipped in peer usage reports whose other entries were used, per reason
    /// (indexed as [`crate::usage::EntryError::ALL`]), cumulative.
    pub skipped_usage_entries: [u64; crate::usage::EntryError::ALL.len()],
    /// Live members beyond `max_members`, ignored (not counted, not listed).
    pub ignored_members: usize,
    /// Gossip datagrams dropped since start, per reason (indexed as
    /// [`crate::auth::Rejection::ALL`]): no key opened them, too old, replayed, ….
    pub rejected_gossip: [u64; crate::auth::Rejection::ALL.len()],
    /// The HA elections the live peers publish (see [`crate::ha`]), all peers together. A new
    /// `Arc` only when a peer's list changed.
    #[serde(skip)]
    pub peer_ha: std::sync::Arc<Vec<crate::HaEntry>>,
    /// Peer HA entries (or whole lists) that could not be read, cumulative.
    pub skipped_ha_entries: u64,
    /// For a second after this process did not run for a while (SIGSTOP, a paused VM): how
    /// long ago that began. The peers' reports of that second carry what they admitted over
    /// it, and are charged from then.
    pub stalled_since: Option<std::time::Duration>,
    /// The longest a live peer says a lease it granted (or a departed peer's it guards) may
    /// still be held: what this replica waits out on joining before it grants a slot of a
    /// fleet-wide in-flight cap (leases are held by clients, not replicas).
    #[serde(serialize_with = "seconds")]
    pub peers_lease_horizon: Duration,
    /// The longest a peer that died or left lately said its leases may still be held, while
    /// that time runs: a share it freed is not granted again before then.
    #[serde(serialize_with = "seconds")]
    pub departed_lease_horizon: Duration,
}

impl Membership {
    /// This replica's place (0-based) among the healthy replicas in node-id order, itself
    /// counted even while leaving: which share of a fleet-wide in-flight cap it holds.
    pub fn rank(&self) -> usize {
        let Some(me) = self.members.iter().find(|member| member.is_self) else {
            return 0;
        };
        healthy_ids(&self.members)
            .iter()
            .position(|id| *id == me.node_id)
            .unwrap_or(0)
    }

    /// A replica alone: what a consumer sees before gossip reports anything.
    pub fn alone() -> Self {
        Membership {
            members: Vec::new(),
            healthy: 1,
            joined: false,
            peer_usage: Default::default(),
            usage_round: 0,
            peer_usage_tenants: 0,
            rejected_usage_reports: 0,
            skipped_usage_entries: Default::default(),
            ignored_members: 0,
            rejected_gossip: Default::default(),
            peer_ha: Default::default(),
            skipped_ha_entries: 0,
            stalled_since: None,
            peers_lease_horizon: Duration::ZERO,
            departed_lease_horizon: Duration::ZERO,
        }
    }

    /// Builds the membership from the live members gossip reports.
    pub fn from_members(mut members: Vec<Member>, joined: bool) -> Self {
        members.sort_by(|a, b| (&a.node_id, a.generation).cmp(&(&b.node_id, b.generation)));
        let with_self = members.iter().any(|member| member.is_self);
        let healthy = healthy_ids(&members).len() + usize::from(!with_self);
        Membership {
            healthy,
            members,
            joined,
            peer_usage: Default::default(),
            usage_round: 0,
            peer_usage_tenants: 0,
            rejected_usage_reports: 0,
            skipped_usage_entries: Default::default(),
            ignored_members: 0,
            rejected_gossip: Default::default(),
            peer_ha: Default::default(),
            skipped_ha_entries: 0,
            stalled_since: None,
            peers_lease_horizon: Duration::ZERO,
            departed_lease_horizon: Duration::ZERO,
        }
    }

    /// Counts per state, for the `weir_ring_members{state}` gauge.
    pub fn count_by_state(&self) -> BTreeMap<&'static str, usize> {
        let mut counts: BTreeMap<&'static str, usize> = [
            MemberState::Active,
            MemberState::Leaving,
            MemberState::Unknown,
        ]
        .into_iter()
        .map(|state| (state.as_str(), 0))
        .collect();
        for member in &self.members {
            *counts.entry(member.state.as_str()).or_default() += 1;
        }
        counts
    }

    /// Whether a live member other than this replica is listed.
    pub fn has_live_peer(&self) -> bool {
        self.members.iter().any(|member| !member.is_self)
    }

    /// Whether `other` tells a consumer nothing this does not: the same members in the same
    /// states, the same counts, the same peer reports (the same `Arc`s). Only the members'
    /// `last_heard` may differ: it moves every observation, and nothing acts on it.
    pub fn same_news(&self, other: &Membership) -> bool {
        let same_member = |a: &Member, b: &Member| {
            (
                &a.node_id,
                a.generation,
                a.gossip_addr,
                &a.http_addr,
                &a.grpc_addr,
                &a.version,
                a.state,
                a.is_self,
                a.lease_horizon,
                a.stalls,
            ) == (
                &b.node_id,
                b.generation,
                b.gossip_addr,
                &b.http_addr,
                &b.grpc_addr,
                &b.version,
                b.state,
                b.is_self,
                b.lease_horizon,
                b.stalls,
            )
        };
        self.members.len() == other.members.len()
            && self
                .members
                .iter()
                .zip(&other.members)
                .all(|(a, b)| same_member(a, b))
            && self.healthy == other.healthy
            && self.joined == other.joined
            && self.usage_round == other.usage_round
            && self.rejected_usage_reports == other.rejected_usage_reports
            && self.skipped_usage_entries == other.skipped_usage_entries
            && self.ignored_members == other.ignored_members
            && self.rejected_gossip == other.rejected_gossip
            && std::sync::Arc::ptr_eq(&self.peer_ha, &other.peer_ha)
            && self.skipped_ha_entries == other.skipped_ha_entries
            && self.peers_lease_horizon == other.peers_lease_horizon
            && self.departed_lease_horizon == other.departed_lease_horizon
    }

    /// Whether every address in `seeds` (other than `self_addr`) belongs to a live member.
    pub fn has_seen(&self, seeds: &[SocketAddr], self_addr: SocketAddr) -> bool {
        seeds
            .iter()
            .filter(|seed| **seed != self_addr)
            .all(|seed| self.members.iter().any(|m| m.gossip_addr == *seed))
    }
}

/// The healthy replicas' node ids, in order, each once (`members` sorted by node id): active
/// members and this replica, even while it leaves. A node restarted under its id counts once
/// while gossip still reports its old incarnation; it counted twice, and a fleet of three
/// read four for about 0.6 s after a quick restart.
fn healthy_ids(members: &[Member]) -> Vec<&str> {
    let mut ids: Vec<&str> = members
        .iter()
        .filter(|member| member.state == MemberState::Active || member.is_self)
        .map(|member| member.node_id.as_str())
        .collect();
    ids.dedup();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, port: u16, state: MemberState, is_self: bool) -> Member {
        Member {
            node_id: id.into(),
            generation: 1,
            gossip_addr: SocketAddr::from(([127, 0, 0, 1], port)),
            http_addr: None,
            grpc_addr: None,
            version: None,
            state,
            is_self,
            last_heard: Duration::ZERO,
            lease_horizon: Duration::ZERO,
            stalls: 0,
        }
    }

    #[test]
    fn news_is_anything_but_the_time_since_a_member_was_heard() {
        let members = || {
            vec![
                member("a", 1, MemberState::Active, true),
                member("b", 2, MemberState::Active, false),
            ]
        };
        let before = Membership::from_members(members(), true);
        let mut later = before.clone();
        later.members[1].last_heard = Duration::from_millis(300);
        assert!(later.same_news(&before));

        let mut leaving = later.clone();
        leaving.members[1].state = MemberState::Leaving;
        assert!(!leaving.same_news(&before));
        let restarted = {
            let mut m = members();
            m[1].generation = 2;
            Membership::from_members(m, true)
        };
        assert!(!restarted.same_news(&before));
        let mut gone = before.clone();
        gone.members.pop();
        assert!(!gone.same_news(&before));
        let mut reported = later.clone();
        reported.usage_round += 1; // a batch of changes to take
        assert!(!reported.same_news(&before));
        let mut ha = later.clone();
        ha.peer_ha = Default::default();
        assert!(!ha.same_news(&before));
        let mut rejected = later.clone();
        rejected.rejected_gossip[0] += 1;
        assert!(!rejected.same_news(&before));
        let mut not_joined = later;
        not_joined.joined = false;
        assert!(!not_joined.same_news(&before));
    }

    /// A replica restarted under its node id while gossip still reports its old incarnation
    /// counts once, in the count and in the ranks; so does this replica's own old one.
    #[test]
    fn a_node_restarted_under_its_id_counts_once() {
        let membership = Membership::from_members(
            vec![
                member("b", 1, MemberState::Active, false),
                member("b", 2, MemberState::Active, false),
                member("a", 1, MemberState::Active, true),
                member("c", 1, MemberState::Active, false),
                member("a", 0, MemberState::Active, false),
            ],
            true,
        );
        assert_eq!(membership.healthy, 3);
        assert_eq!(membership.rank(), 0);
        let from_c = Membership::from_members(
            vec![
                member("b", 1, MemberState::Active, false),
                member("b", 2, MemberState::Active, false),
                member("a", 1, MemberState::Active, false),
                member("c", 1, MemberState::Active, true),
            ],
            true,
        );
        assert_eq!((from_c.healthy, from_c.rank()), (3, 2));
    }

    #[test]
    fn healthy_counts_active_peers_and_always_self() {
        let membership = Membership::from_members(
            vec![
                member("c", 3, MemberState::Active, false),
                member("a", 1, MemberState::Active, true),
                member("b", 2, MemberState::Leaving, false),
                member("d", 4, MemberState::Unknown, false),
            ],
            true,
        );
        assert_eq!(membership.healthy, 2);
        assert_eq!(
            membership
                .members
                .iter()
                .map(|m| m.node_id.as_str())
                .collect::<Vec<_>>(),
            ["a", "b", "c", "d"]
        );
        assert_eq!(membership.count_by_state()["LEAVING"], 1);
    }

    #[test]
    fn rank_is_the_place_among_the_healthy_in_node_order() {
        let ranks = |self_id: &str, self_state| {
            let members = ["a", "b", "c", "d"]
                .iter()
                .zip([
                    MemberState::Active,
                    MemberState::Leaving,
                    MemberState::Active,
                    MemberState::Active,
                ])
                .enumerate()
                .map(|(port, (id, state))| {
                    let is_self = *id == self_id;
                    let state = if is_self { self_state } else { state };
                    member(id, port as u16, state, is_self)
                })
                .collect();
            let membership = Membership::from_members(members, true);
            (membership.rank(), membership.healthy)
        };
        // b is leaving: the healthy are a, c, d.
        assert_eq!(ranks("a", MemberState::Active), (0, 3));
        assert_eq!(ranks("c", MemberState::Active), (1, 3));
        assert_eq!(ranks("d", MemberState::Active), (2, 3));
        // A leaving replica counts itself, in its place.
        assert_eq!(ranks("b", MemberState::Leaving), (1, 4));
        assert_eq!(Membership::alone().rank(), 0);
    }

    #[test]
    fn a_leaving_self_still_counts_itself() {
        let membership =
            Membership::from_members(vec![member("a", 1, MemberState::Leaving, true)], true);
        assert_eq!(membership.healthy, 1);
        assert_eq!(Membership::from_members(Vec::new(), false).healthy, 1);
        assert_eq!(Membership::alone().healthy, 1);
    }

    #[test]
    fn seeds_seen() {
        let membership = Membership::from_members(
            vec![
                member("a", 1, MemberState::Active, true),
                member("b", 2, MemberState::Active, false),
            ],
            false,
        );
        let addr = |port| SocketAddr::from(([127, 0, 0, 1], port));
        assert!(membership.has_seen(&[addr(1), addr(2)], addr(1)));
        assert!(!membership.has_seen(&[addr(2), addr(3)], addr(1)));
        assert!(membership.has_seen(&[], addr(1)));
    }

    #[test]
    fn state_round_trip() {
        for state in [MemberState::Active, MemberState::Leaving] {
            assert_eq!(MemberState::parse(Some(state.as_str())), state);
        }
        assert_eq!(MemberState::parse(Some("JOINING")), MemberState::Unknown);
        assert_eq!(MemberState::parse(None), MemberState::Unknown);
    }
}

//! Per-tenant usage over gossip, for `weighted`: what each replica has admitted.
//!
//! Each replica publishes one key, `usage`: per tenant, its **cumulative** admitted requests
//! and items (a grow-only counter per replica), and its view of the tenant's fleet buckets
//! when they are not full. Cumulative counts make the key safe to read at any version: a
//! reader that misses versions, or a tenant that is left out of one message, loses nothing,
//! because the next count it sees includes everything before. So the value can be capped
//! (one UDP datagram holds every node's changed keys): the replica lists the tenants with the
//! most unpublished admissions first and the others in turn.
//!
//! Format, one line per entry, fields separated by one space (names hold neither: tenant
//! IDs, or admission keys as `tenant/percent-encoded key`): `2` then
//! `<name> <requests> <items> <requests level> <items level> <in flight>`, a level being an
//! integer number of tokens or `-` for a full bucket, and `in flight` the leases this
//! replica holds now for an admission key (a gauge, not a count).
//!
//! [`UsageAggregate`] turns the peers' reports into monotonic per-tenant totals: the sum of
//! every increase each peer incarnation reported. A peer that restarts, or that dropped a
//! tenant and started it again, counts up from zero again; nothing it reported is taken back.

use std::collections::HashMap;
use std::fmt::Write;
use std::time::{Duration, Instant};

pub const USAGE_KEY: &str = "usage";
const FORMAT: &str = "2";
/// Largest level accepted from a peer, in tokens: a bucket larger than this is not real.
const MAX_LEVEL: f64 = 1e15;
/// Largest count accepted from a peer: no real counter of requests or items reaches 2^53
/// (a million a second for 285 years), so a larger one is a forgery or a fault.
const MAX_COUNT: u64 = 1 << 53;
/// Most entries accepted in one peer message.
const MAX_ENTRIES: usize = 100_000;
/// A level report older than this is not used to start a tenant new to this replica.
const LEVEL_MAX_AGE: Duration = Duration::from_secs(2);
/// A tenant no peer has reported for this long is forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// One tenant's usage on one replica.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageEntry {
    pub tenant: String,
    pub requests: u64,
    pub items: u64,
    pub requests_level: Option<f64>,
    pub items_level: Option<f64>,
    pub in_flight: u64,
}

/// Encodes entries in order until the next would take the value past `max_bytes`; returns
/// the value and how many entries it holds.
pub fn encode(entries: &[UsageEntry], max_bytes: usize) -> (String, usize) {
    let mut value = String::from(FORMAT);
    let mut line = String::new();
    let mut listed = 0;
    for entry in entries {
        line.clear();
        let level = |level: Option<f64>| match level {
            Some(level) if level.is_finite() => format!("{}", level.round() as i64),
            _ => "-".to_string(),
        };
        let _ = write!(
            line,
            "\n{} {} {} {} {} {}",
            entry.tenant,
            entry.requests,
            entry.items,
            level(entry.requests_level),
            level(entry.items_level),
            entry.in_flight
        );
        if value.len() + line.len() > max_bytes {
            break;
        }
        value.push_str(&line);
        listed += 1;
    }
    (value, listed)
}

/// Decodes a peer's value; `None` if it is not in a format this version knows, or carries
/// values no honest replica would send. Peer data is untrusted.
pub fn decode(value: &str) -> Option<Vec<UsageEntry>> {
    let mut lines = value.split('\n');
    if lines.next()? != FORMAT {
        return None;
    }
    let mut entries = Vec::new();
    for line in lines {
        if entries.len() >= MAX_ENTRIES {
            return None;
        }
        let mut fields = line.split(' ');
        let tenant = fields.next().filter(|tenant| !tenant.is_empty())?;
        let count = |field: &str| field.parse::<u64>().ok().filter(|&n| n <= MAX_COUNT);
        let requests = count(fields.next()?)?;
        let items = count(fields.next()?)?;
        let level = |field: &str| -> Option<Option<f64>> {
            if field == "-" {
                return Some(None);
            }
            let level: f64 = field.parse::<i64>().ok()? as f64;
            (level.abs() <= MAX_LEVEL).then_some(Some(level))
        };
        let requests_level = level(fields.next()?)?;
        let items_level = level(fields.next()?)?;
        let in_flight = count(fields.next()?)?;
        if fields.next().is_some() {
            return None;
        }
        entries.push(UsageEntry {
            tenant: tenant.to_string(),
            requests,
            items,
            requests_level,
            items_level,
            in_flight,
        });
    }
    Some(entries)
}

/// What the peers report of one tenant, summed over peers (see [`UsageAggregate`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TenantUsage {
    pub requests: u64,
    pub items: u64,
    /// The lowest level a peer reported within the last two seconds, if any.
    pub requests_level: Option<f64>,
    pub items_level: Option<f64>,
    /// Admission keys: leases the live peers hold now (the sum of their latest reports).
    pub in_flight: u64,
}

/// All tenants' [`TenantUsage`], as last aggregated.
pub type PeerUsage = HashMap<String, TenantUsage>;

/// A peer incarnation: node id and generation.
pub type PeerKey = (String, u64);

#[derive(Debug, Default)]
struct TenantState {
    totals: (u64, u64),
    last_reported: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
struct PeerEntry {
    counts: (u64, u64),
    levels: (Option<f64>, Option<f64>),
    in_flight: u64,
    at: Instant,
    /// Kept from before the peer went away: its next count is a new base, not an increase.
    away: bool,
}

/// Folds the peers' reports into monotonic per-tenant totals. Pure but for the instants it
/// is given, so it is tested without sockets.
///
/// A peer that stops being live and comes back (a partition healed, a paused process
/// resumed) is not charged for what it admitted while away. Those admissions are in the
/// past: charging them on its return put every view into a debt as deep as the partition was
/// long, and the tenant was refused everything for that long after the heal (measured:
/// nothing admitted for 15 s after a 20 s split). So a split fleet over-admits while split,
/// each side keeping a whole limit as Mimir's replicas would, and not after.
#[derive(Debug, Default)]
pub struct UsageAggregate {
    peers: HashMap<PeerKey, HashMap<String, PeerEntry>>,
    /// Peers no longer live: since when, and their last counts, kept for their return.
    departed: HashMap<PeerKey, (Instant, HashMap<String, PeerEntry>)>,
    tenants: HashMap<String, TenantState>,
}

impl UsageAggregate {
    /// Takes in one report from `peer`, received at `now`.
    pub fn observe(&mut self, peer: &PeerKey, entries: &[UsageEntry], now: Instant) {
        if !self.peers.contains_key(peer) {
            if let Some((_, entries)) = self.departed.remove(peer) {
                self.peers.insert(peer.clone(), entries);
            }
        }
        let known = self.peers.entry(peer.clone()).or_default();
        for entry in entries {
            let counts = (entry.requests, entry.items);
            let previous = known.get(&entry.tenant);
            let away = previous.is_some_and(|e| e.away);
            let previous = previous.map(|e| e.counts);
            // A count lower than the last one is a restarted counter: all of it is new. What
            // a returning peer counted while away is not.
            let increase = |now: u64, before: Option<u64>| match before {
                _ if away => 0,
                Some(before) if now >= before => now - before,
                _ => now,
            };
            let state = self.tenants.entry(entry.tenant.clone()).or_default();
            state.totals.0 = state
                .totals
                .0
                .saturating_add(increase(counts.0, previous.map(|p| p.0)));
            state.totals.1 = state
                .totals
                .1
                .saturating_add(increase(counts.1, previous.map(|p| p.1)));
            state.last_reported = Some(now);
            known.insert(
                entry.tenant.clone(),
                PeerEntry {
                    counts,
                    levels: (entry.requests_level, entry.items_level),
                    in_flight: entry.in_flight,
                    at: now,
                    away: false,
                },
            );
        }
    }

    /// Sets aside peer incarnations that are no longer live (what they reported stays
    /// counted; their last counts wait an hour for their return), and forgets tenants nobody
    /// has reported for an hour.
    pub fn retain_peers(&mut self, live: impl Fn(&PeerKey) -> bool, now: Instant) {
        let gone: Vec<PeerKey> = self.peers.keys().filter(|p| !live(p)).cloned().collect();
        for peer in gone {
            if let Some(mut entries) = self.peers.remove(&peer) {
                entries.values_mut().for_each(|entry| entry.away = true);
                self.departed.insert(peer, (now, entries));
            }
        }
        self.departed
            .retain(|_, (since, _)| now.duration_since(*since) < FORGET_AFTER);
        self.tenants.retain(|_, state| {
            state
                .last_reported
                .is_some_and(|at| now.duration_since(at) < FORGET_AFTER)
        });
        for entries in self.peers.values_mut() {
            entries.retain(|_, entry| now.duration_since(entry.at) < FORGET_AFTER);
        }
    }

    /// The totals per tenant, with the lowest recent level each peer reported.
    pub fn snapshot(&self, now: Instant) -> PeerUsage {
        let mut usage: PeerUsage = self
            .tenants
            .iter()
            .map(|(tenant, state)| {
                (
                    tenant.clone(),
                    TenantUsage {
                        requests: state.totals.0,
                        items: state.totals.1,
                        ..TenantUsage::default()
                    },
                )
            })
            .collect();
        let lowest = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        for entries in self.peers.values() {
            for (tenant, entry) in entries {
                if let Some(total) = usage.get_mut(tenant) {
                    total.in_flight = total.in_flight.saturating_add(entry.in_flight);
                }
                if now.duration_since(entry.at) > LEVEL_MAX_AGE {
                    continue;
                }
                if let Some(total) = usage.get_mut(tenant) {
                    total.requests_level = lowest(total.requests_level, entry.levels.0);
                    total.items_level = lowest(total.items_level, entry.levels.1);
                }
            }
        }
        usage
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(tenant: &str, requests: u64, items: u64, items_level: Option<f64>) -> UsageEntry {
        UsageEntry {
            tenant: tenant.into(),
            requests,
            items,
            requests_level: None,
            items_level,
            in_flight: 0,
        }
    }

    fn peer(id: &str, generation: u64) -> PeerKey {
        (id.to_string(), generation)
    }

    #[test]
    fn round_trip() {
        let entries = vec![entry("a", 3, 12_345, Some(-17.4)), entry("b", 0, 7, None)];
        let (value, listed) = encode(&entries, 1024);
        assert_eq!(value, "2\na 3 12345 - -17 0\nb 0 7 - - 0");
        assert_eq!(listed, 2);
        let decoded = decode(&value).unwrap();
        assert_eq!(decoded[0].items_level, Some(-17.0));
        assert_eq!(decoded[1], entries[1]);
        assert_eq!(decode("2").unwrap(), vec![]);
    }

    #[test]
    fn the_cap_keeps_the_first_entries() {
        let entries: Vec<UsageEntry> = (0..1000)
            .map(|i| entry(&format!("tenant-{i:04}"), i, i * 100, None))
            .collect();
        let (value, listed) = encode(&entries, 4096);
        assert!(value.len() <= 4096);
        assert!(listed > 100 && listed < 1000);
        let decoded = decode(&value).unwrap();
        assert_eq!(decoded.len(), listed);
        assert_eq!(decoded[0].tenant, "tenant-0000");
    }

    #[test]
    fn garbage_is_refused() {
        for bad in [
            "",
            "1 0 0 0",
            "2\na 1",
            "2\na -1 2 - - 0",
            "2\na 1 2 x - 0",
            "2\na 1 2 - - 0 extra",
            "2\na 1 2 - -",
            "2\n 1 2 - - 0",
            "2\na 1 2 - 1e300 0",
            "2\na 1 2 - 99999999999999999 0",
            "2\na 1 2 - - -3",
            "2\na NaN 2 - - 0",
            "2\na 18446744073709551615 2 - - 0",
            "2\na 1 9007199254740993 - - 0",
            "2\na 1 2 - - 18446744073709551615",
        ] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn totals_add_increases_and_survive_missed_versions() {
        let now = Instant::now();
        let mut aggregate = UsageAggregate::default();
        aggregate.observe(&peer("a", 1), &[entry("t", 1, 100, None)], now);
        // Versions in between were missed: the cumulative count still covers them.
        aggregate.observe(&peer("a", 1), &[entry("t", 5, 900, Some(3.0))], now);
        aggregate.observe(&peer("b", 1), &[entry("t", 1, 50, Some(40.0))], now);
        // a leaves t out of a message: nothing changes.
        aggregate.observe(&peer("a", 1), &[], now);
        let usage = aggregate.snapshot(now);
        assert_eq!(usage["t"].items, 950);
        assert_eq!(usage["t"].requests, 6);
        assert_eq!(
            usage["t"].items_level,
            Some(3.0),
            "the lowest level reported"
        );
    }

    #[test]
    fn restarts_count_from_zero_and_departures_take_nothing_back() {
        let now = Instant::now();
        let mut aggregate = UsageAggregate::default();
        aggregate.observe(&peer("a", 1), &[entry("t", 0, 500, None)], now);
        // The peer dropped the tenant and started it again: 30 new.
        aggregate.observe(&peer("a", 1), &[entry("t", 0, 30, None)], now);
        // A new incarnation of the peer: its counts are new.
        aggregate.observe(&peer("a", 2), &[entry("t", 0, 20, None)], now);
        aggregate.retain_peers(|p| p.1 == 2, now);
        assert_eq!(aggregate.snapshot(now)["t"].items, 550);
        // Levels go stale; tenants nobody reports for an hour are forgotten.
        let later = now + Duration::from_secs(3);
        assert_eq!(aggregate.snapshot(later)["t"].items_level, None);
        aggregate.retain_peers(|_| true, now + FORGET_AFTER);
        assert!(aggregate.snapshot(now + FORGET_AFTER).is_empty());
    }

    #[test]
    fn a_returning_peer_is_not_charged_for_what_it_admitted_away() {
        let now = Instant::now();
        let mut aggregate = UsageAggregate::default();
        aggregate.observe(&peer("a", 1), &[entry("t", 2, 100, None)], now);
        // Partitioned away: not live here, and admitting on its side.
        aggregate.retain_peers(|_| false, now);
        assert_eq!(
            aggregate.snapshot(now)["t"].items,
            100,
            "nothing taken back"
        );
        // Back: its count is the new base; what it admits from then on counts.
        aggregate.observe(&peer("a", 1), &[entry("t", 9, 20_100, None)], now);
        assert_eq!(aggregate.snapshot(now)["t"].items, 100);
        aggregate.observe(&peer("a", 1), &[entry("t", 10, 20_150, None)], now);
        let usage = aggregate.snapshot(now);
        assert_eq!((usage["t"].requests, usage["t"].items), (3, 150));
        // A peer away for longer than an hour is a stranger again.
        aggregate.retain_peers(|_| false, now);
        aggregate.retain_peers(|_| false, now + FORGET_AFTER);
        aggregate.observe(
            &peer("a", 1),
            &[entry("u", 0, 70, None)],
            now + FORGET_AFTER,
        );
        assert_eq!(aggregate.snapshot(now + FORGET_AFTER)["u"].items, 70);
    }

    proptest! {
        /// Whatever subset of versions a reader sees, once it sees the last one the totals are
        /// exact.
        #[test]
        fn any_subset_of_versions_gives_the_exact_total(
            increments in prop::collection::vec(0u64..1000, 1..50),
            seen in prop::collection::vec(any::<bool>(), 50),
        ) {
            let now = Instant::now();
            let mut aggregate = UsageAggregate::default();
            let mut cumulative = 0;
            for (i, increment) in increments.iter().enumerate() {
                cumulative += increment;
                if seen[i] || i == increments.len() - 1 {
                    aggregate.observe(&peer("a", 1), &[entry("t", 0, cumulative, None)], now);
                }
            }
            prop_assert_eq!(aggregate.snapshot(now)["t"].items, cumulative);
        }

        #[test]
        fn decode_never_panics(value in "\\PC*") {
            let _ = decode(&value);
        }
    }
}

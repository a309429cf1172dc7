//! Per-tenant demand over gossip, for the `weighted` strategy.
//!
//! Each replica publishes one key, `demand`, holding its largest tenants' recent demand
//! (requests/s and items/s, four significant digits) and a remainder for the rest: their
//! count and summed demand. The value is capped at [`MAX_DEMAND_BYTES`] so it always fits in
//! one chitchat delta (UDP, 65 507 bytes): with 10 000 active tenants a replica lists the top
//! ~1 500 (by ID length) and folds the others into the remainder. A tenant a peer does not
//! list is assumed to have that peer's mean unlisted demand (never more than its smallest
//! listed one). One key, rewritten each publish, keeps chitchat's per-node state and
//! tombstones constant however many tenants come and go.
//!
//! Format, one line per entry, fields separated by one space (tenant IDs hold neither):
//! `1 <unlisted count> <unlisted requests/s> <unlisted items/s>` then `<tenant> <requests/s> <items/s>`.

use std::collections::HashMap;
use std::fmt::Write;
use std::time::Duration;

use crate::membership::{Member, MemberState, PeerDemand};

pub const DEMAND_KEY: &str = "demand";
/// Largest encoded value: half a UDP datagram, leaving room for the other keys and framing.
pub const MAX_DEMAND_BYTES: usize = 32 * 1024;

/// One tenant's demand on this replica.
#[derive(Debug, Clone, PartialEq)]
pub struct DemandEntry {
    pub tenant: String,
    pub requests: f64,
    pub items: f64,
}

/// A peer's published demand.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DecodedDemand {
    pub listed: HashMap<String, (f64, f64)>,
    /// Assumed demand of each tenant the peer did not list.
    pub unlisted: (f64, f64),
}

/// Encodes the largest entries (by items, then requests) that fit in [`MAX_DEMAND_BYTES`];
/// the rest go into the remainder.
pub fn encode(mut entries: Vec<DemandEntry>) -> String {
    entries.sort_by(|a, b| {
        (b.items, b.requests)
            .partial_cmp(&(a.items, a.requests))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let mut body = String::new();
    let mut listed = 0;
    const HEADER_ROOM: usize = 64;
    for entry in &entries {
        let line = format!(
            "\n{} {} {}",
            entry.tenant,
            short(entry.requests),
            short(entry.items)
        );
        if body.len() + line.len() + HEADER_ROOM > MAX_DEMAND_BYTES {
            break;
        }
        body.push_str(&line);
        listed += 1;
    }
    let rest = &entries[listed..];
    let mut value = String::with_capacity(body.len() + HEADER_ROOM);
    let _ = write!(
        value,
        "1 {} {} {}",
        rest.len(),
        short(rest.iter().map(|e| e.requests).sum()),
        short(rest.iter().map(|e| e.items).sum())
    );
    value.push_str(&body);
    value
}

/// Decodes a peer's value; `None` if it is not in a format this version knows.
pub fn decode(value: &str) -> Option<DecodedDemand> {
    let mut lines = value.lines();
    let mut header = lines.next()?.split(' ');
    if header.next()? != "1" {
        return None;
    }
    let unlisted_count: f64 = header.next()?.parse().ok()?;
    let unlisted_requests: f64 = header.next()?.parse().ok()?;
    let unlisted_items: f64 = header.next()?.parse().ok()?;
    let mut listed = HashMap::new();
    let (mut smallest_requests, mut smallest_items) = (f64::INFINITY, f64::INFINITY);
    for line in lines {
        let mut fields = line.split(' ');
        let tenant = fields.next()?;
        let requests: f64 = fields.next()?.parse().ok()?;
        let items: f64 = fields.next()?.parse().ok()?;
        if !(requests >= 0.0 && items >= 0.0 && requests.is_finite() && items.is_finite()) {
            return None;
        }
        smallest_requests = smallest_requests.min(requests);
        smallest_items = smallest_items.min(items);
        listed.insert(tenant.to_string(), (requests, items));
    }
    let unlisted = if unlisted_count >= 1.0 {
        (
            (unlisted_requests / unlisted_count).min(smallest_requests),
            (unlisted_items / unlisted_count).min(smallest_items),
        )
    } else {
        (0.0, 0.0)
    };
    Some(DecodedDemand { listed, unlisted })
}

/// Sums the demand of the peers that count: live, `ACTIVE`, not this replica, and heard from
/// within `max_age` (older reports are aged out: the peer may be gone and not yet detected).
/// `report` gives a member's decoded report, if it published one.
pub fn aggregate<'a>(
    members: &[Member],
    report: impl Fn(&Member) -> Option<&'a DecodedDemand>,
    max_age: Duration,
) -> PeerDemand {
    let counted: Vec<&DecodedDemand> = members
        .iter()
        .filter(|m| !m.is_self && m.state == MemberState::Active && m.last_heard <= max_age)
        .filter_map(report)
        .collect();
    let unlisted = counted.iter().fold((0.0, 0.0), |sum, demand| {
        (sum.0 + demand.unlisted.0, sum.1 + demand.unlisted.1)
    });
    let mut tenants: HashMap<String, (f64, f64)> = HashMap::new();
    for demand in &counted {
        for (tenant, (requests, items)) in &demand.listed {
            let total = tenants.entry(tenant.clone()).or_insert(unlisted);
            // Replace this peer's assumed share with what it listed.
            total.0 += requests - demand.unlisted.0;
            total.1 += items - demand.unlisted.1;
        }
    }
    PeerDemand { tenants, unlisted }
}

/// Four significant digits: enough for shares to within 0.05 %, short on the wire.
fn short(value: f64) -> String {
    if value == 0.0 || !value.is_finite() {
        return "0".to_string();
    }
    let digits = 3 - value.abs().log10().floor() as i32;
    if digits >= 0 {
        format!("{value:.prec$}", prec = digits as usize)
    } else {
        let scale = 10f64.powi(-digits);
        format!("{}", (value / scale).round() * scale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn entry(tenant: &str, requests: f64, items: f64) -> DemandEntry {
        DemandEntry {
            tenant: tenant.into(),
            requests,
            items,
        }
    }

    fn member(id: &str, state: MemberState, last_heard: Duration) -> Member {
        Member {
            node_id: id.into(),
            generation: 1,
            gossip_addr: SocketAddr::from(([127, 0, 0, 1], 1)),
            http_addr: None,
            version: None,
            state,
            is_self: false,
            last_heard,
        }
    }

    #[test]
    fn round_trip_with_four_significant_digits() {
        let value = encode(vec![entry("a", 3.0, 12_345.6), entry("b", 0.25, 0.0)]);
        assert_eq!(value, "1 0 0 0\na 3.000 12350\nb 0.2500 0");
        let decoded = decode(&value).unwrap();
        assert_eq!(decoded.listed["a"], (3.0, 12_350.0));
        assert_eq!(decoded.listed["b"], (0.25, 0.0));
        assert_eq!(decoded.unlisted, (0.0, 0.0));
    }

    #[test]
    fn ten_thousand_tenants_fit_in_one_datagram() {
        let entries: Vec<DemandEntry> = (0..10_000)
            .map(|i| {
                entry(
                    &format!("tenant-{i:05}-of-a-typical-length"),
                    10.0,
                    1000.0 + i as f64,
                )
            })
            .collect();
        let value = encode(entries);
        assert!(value.len() <= MAX_DEMAND_BYTES, "{}", value.len());
        let decoded = decode(&value).unwrap();
        let listed = decoded.listed.len();
        assert!(listed > 500, "only {listed} listed");
        // The largest tenants are listed; the rest are in the remainder.
        assert!(decoded
            .listed
            .contains_key("tenant-09999-of-a-typical-length"));
        assert!(!decoded
            .listed
            .contains_key("tenant-00000-of-a-typical-length"));
        let header: Vec<&str> = value.lines().next().unwrap().split(' ').collect();
        assert_eq!(header[1], (10_000 - listed).to_string());
        // An unlisted tenant is assumed at the mean of the rest, not above the smallest listed.
        assert!(
            decoded.unlisted.1
                <= decoded
                    .listed
                    .values()
                    .map(|v| v.1)
                    .fold(f64::INFINITY, f64::min)
        );
        assert!(decoded.unlisted.1 > 1000.0);
    }

    #[test]
    fn garbage_is_refused() {
        for bad in [
            "",
            "2 0 0 0",
            "1 x 0 0",
            "1 0 0 0\na 1",
            "1 0 0 0\na -1 2",
            "1 0 0 0\na NaN 2",
        ] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn only_fresh_active_peers_count() {
        let members = vec![
            member("fresh", MemberState::Active, Duration::from_millis(100)),
            member("stale", MemberState::Active, Duration::from_secs(5)),
            member("leaving", MemberState::Leaving, Duration::ZERO),
            Member {
                is_self: true,
                ..member("me", MemberState::Active, Duration::ZERO)
            },
        ];
        let report = decode("1 0 0 0\nt 1 100").unwrap();
        let demands: HashMap<(String, u64), DecodedDemand> = ["fresh", "stale", "leaving", "me"]
            .into_iter()
            .map(|id| ((id.to_string(), 1), report.clone()))
            .collect();
        let total = aggregate(
            &members,
            |m| demands.get(&(m.node_id.clone(), 1)),
            Duration::from_secs(1),
        );
        assert_eq!(
            total.get("t"),
            (1.0, 100.0),
            "only the fresh ACTIVE peer counts"
        );
        assert_eq!(total.get("other"), (0.0, 0.0));
    }

    #[test]
    fn unlisted_tenants_take_each_peers_estimate() {
        let members = vec![
            member("a", MemberState::Active, Duration::ZERO),
            member("b", MemberState::Active, Duration::ZERO),
        ];
        let demands: HashMap<(String, u64), DecodedDemand> = [
            (
                ("a".to_string(), 1),
                decode("1 10 10 100\nbig 5 5000").unwrap(),
            ),
            (("b".to_string(), 1), decode("1 0 0 0\nsmall 1 20").unwrap()),
        ]
        .into_iter()
        .collect();
        let total = aggregate(
            &members,
            |m| demands.get(&(m.node_id.clone(), 1)),
            Duration::from_secs(1),
        );
        assert_eq!(total.get("big"), (5.0, 5000.0)); // b does not list it, b has no remainder
        assert_eq!(total.get("small"), (2.0, 30.0)); // b's 20 + a's mean unlisted 10
        assert_eq!(total.get("unknown"), (1.0, 10.0));
    }

    #[test]
    fn short_numbers() {
        assert_eq!(short(0.0), "0");
        assert_eq!(short(1.0), "1.000");
        assert_eq!(short(33_333.33), "33330");
        assert_eq!(short(0.012345), "0.01235");
        assert_eq!(short(f64::NAN), "0");
    }
}

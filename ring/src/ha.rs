//! The HA tracker's gossip: each replica publishes, under one key, the HA elections it has
//! seen traffic for (tenant, cluster, elected replica, the election's term and instant, and
//! when this replica last received the elected replica's push). Peers merge them (the rule is
//! in weir's `src/ha.rs`); this module is only the wire format and its bounds.
//!
//! The format is text, one entry per line after a version line:
//! `tenant \t cluster \t replica \t term \t elected_at_ms \t received_at_ms`, with `%`, tab and
//! newline escaped in the names (label values may hold anything).

/// The chitchat key of a replica's HA elections.
pub const HA_KEY: &str = "ha";

const VERSION_LINE: &str = "ha1";

/// One election, as a replica saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaEntry {
    pub tenant: String,
    pub cluster: String,
    pub replica: String,
    /// 1 for a cluster's first election, one more at each failover.
    pub term: u64,
    /// When the election was made (Unix milliseconds).
    pub elected_at_ms: i64,
    /// When the publishing replica last received a push from the elected replica.
    pub received_at_ms: i64,
}

/// Encodes `entries`, in the order given, as many as fit in `max_bytes`; returns the value and
/// how many entries it holds.
pub fn encode(entries: &[HaEntry], max_bytes: usize) -> (String, usize) {
    let mut value = String::from(VERSION_LINE);
    let mut listed = 0;
    for entry in entries {
        let line = format!(
            "\n{}\t{}\t{}\t{}\t{}\t{}",
            escape(&entry.tenant),
            escape(&entry.cluster),
            escape(&entry.replica),
            entry.term,
            entry.elected_at_ms,
            entry.received_at_ms
        );
        if value.len() + line.len() > max_bytes {
            break;
        }
        value.push_str(&line);
        listed += 1;
    }
    (value, listed)
}

/// Decodes a peer's value. Untrusted input: an unreadable line is skipped and counted; a value
/// of another version is refused whole (`Err` with the first line).
pub fn decode(value: &str) -> Result<(Vec<HaEntry>, u64), String> {
    let mut lines = value.split('\n');
    let version = lines.next().unwrap_or_default();
    if version != VERSION_LINE {
        return Err(format!(
            "unknown HA gossip format {:?} (this replica reads {VERSION_LINE:?})",
            version.chars().take(16).collect::<String>()
        ));
    }
    let mut entries = Vec::new();
    let mut skipped = 0;
    for line in lines {
        match entry(line) {
            Some(entry) => entries.push(entry),
            None => skipped += 1,
        }
    }
    Ok((entries, skipped))
}

fn entry(line: &str) -> Option<HaEntry> {
    let mut fields = line.split('\t');
    let mut name = || unescape(fields.next()?).filter(|name| !name.is_empty());
    let (tenant, cluster, replica) = (name()?, name()?, name()?);
    let term = fields.next()?.parse().ok()?;
    let elected_at_ms = fields.next()?.parse().ok()?;
    let received_at_ms = fields.next()?.parse().ok()?;
    if fields.next().is_some() || term == 0 {
        return None;
    }
    Some(HaEntry {
        tenant,
        cluster,
        replica,
        term,
        elected_at_ms,
        received_at_ms,
    })
}

fn escape(name: &str) -> String {
    if !name.contains(['%', '\t', '\n']) {
        return name.to_string();
    }
    name.replace('%', "%25")
        .replace('\t', "%09")
        .replace('\n', "%0A")
}

fn unescape(field: &str) -> Option<String> {
    if !field.contains('%') {
        return Some(field.to_string());
    }
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 3)?;
        out.push(match code {
            "25" => '%',
            "09" => '\t',
            "0A" => '\n',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tenant: &str, cluster: &str, replica: &str) -> HaEntry {
        HaEntry {
            tenant: tenant.into(),
            cluster: cluster.into(),
            replica: replica.into(),
            term: 3,
            elected_at_ms: 1_700_000_000_000,
            received_at_ms: 1_700_000_015_000,
        }
    }

    #[test]
    fn round_trips_any_label_value_and_keeps_to_the_cap() {
        let entries = vec![
            entry("t", "c1", "a"),
            entry("t", "odd\tname\n%09", "b%"),
            entry("u", "c", "r"),
        ];
        let (value, listed) = encode(&entries, 10_000);
        assert_eq!(listed, 3);
        assert_eq!(decode(&value).unwrap(), (entries.clone(), 0));
        let (value, listed) = encode(&entries, 60);
        assert_eq!(listed, 1);
        assert!(value.len() <= 60);
        assert_eq!(decode(&value).unwrap().0, entries[..1]);
    }

    #[test]
    fn bad_lines_are_skipped_and_other_versions_refused() {
        let value =
            "ha1\nt\tc\ta\t1\t5\t6\nbroken\nt\tc\ta\t0\t5\t6\nt\tc\t\t1\t5\t6\nt\tc%zz\ta\t1\t5\t6";
        let (entries, skipped) = decode(value).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(skipped, 4);
        assert!(decode("ha2\nt\tc\ta\t1\t5\t6").is_err());
        assert!(decode("").is_err());
    }
}

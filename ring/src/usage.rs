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
//! Format, one line per entry, fields separated by one space: a format line, then
//! `<name> <requests> <items> <requests level> <items level> <in flight>`, a level being an
//! integer number of tokens or `-` for a full bucket, and `in flight` the leases this
//! replica holds now for an admission key (a gauge, not a count). A name is a tenant ID or an
//! admission key as `tenant/percent-encoded key`.
//!
//! - Format `3` percent-encodes the name's `%`, space, and control bytes (newline among
//!   them), so any string is carried, the empty one included.
//! - Format `2` writes the name as it is, so it holds no space or newline.
//!
//! A writer uses `2` whenever every name fits it (tenant IDs and encoded admission keys
//! always do), so a replica of an older version, which reads only `2`, still reads this one's
//! reports during a rolling upgrade; a reader takes both. An entry a reader cannot use is
//! skipped alone and counted ([`Report::skipped`]); only an unknown format line refuses the
//! whole report.
//!
//! [`UsageAggregate`] turns the peers' reports into monotonic per-tenant totals: the sum of
//! every increase each peer incarnation reported. A peer that restarts, or that dropped a
//! tenant and started it again, counts up from zero again; nothing it reported is taken back.
//! A count that falls a little is what the peer gave back (refunds), summed apart for the
//! views to credit.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const USAGE_KEY: &str = "usage";
/// Names percent-encoded: any string.
const FORMAT: &str = "3";
/// Names as they are: no space or newline, not empty. The only format versions before
/// 0.1's percent-encoded names read.
const FORMAT_PLAIN: &str = "2";
/// Largest level accepted from a peer, in tokens: a bucket larger than this is not real.
const MAX_LEVEL: f64 = 1e15;
/// Largest count accepted from a peer: no real counter of requests or items reaches 2^53
/// (a million a second for 285 years), so a larger one is a forgery or a fault.
const MAX_COUNT: u64 = 1 << 53;
/// Most entries read from one peer message; the rest are skipped.
const MAX_ENTRIES: usize = 100_000;
/// A level report older than this is not used to start a tenant new to this replica.
const LEVEL_MAX_AGE: Duration = Duration::from_secs(2);
/// A departed peer's last counts are kept this long for its return (a peer comes back under
/// the same incarnation after a partition or a false death; forgotten, its counts would be
/// taken in again whole).
const FORGET_AFTER: Duration = Duration::from_secs(3600);
/// How often the tenants a peer stopped listing are looked for: a walk of every tenant, and
/// forgetting is a matter of minutes, so not every round.
const FORGET_EVERY: Duration = Duration::from_secs(1);

/// The aggregate's maps, by tenant: a fast hash (foldhash) for keys peers send, as the
/// limiter's own maps use; a round hashes every tenant a few times. Names are shared
/// (`Arc<str>`), so a snapshot of every tenant copies no name.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

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

/// Whether format 2 holds `name` as it is (an old reader also refuses an empty name).
fn plain(name: &str) -> bool {
    !name.is_empty() && !name.bytes().any(escaped)
}

/// The bytes format 3 percent-encodes: `%` itself, space, and ASCII control bytes.
fn escaped(byte: u8) -> bool {
    byte == b'%' || byte <= b' ' || byte == 0x7f
}

fn encode_name(name: &str, line: &mut String) {
    for c in name.chars() {
        // A multi-byte character's bytes are all ≥ 0x80: none is escaped.
        if c.is_ascii() && escaped(c as u8) {
            let _ = write!(line, "%{:02X}", c as u8);
        } else {
            line.push(c);
        }
    }
}

/// The shortest line an entry makes: a newline, a name of one character, and five fields of
/// one character each after a space.
pub const SHORTEST_LINE: usize = 12;

/// Encodes entries in order until the next would take the value past `max_bytes`; returns
/// the value and how many entries it holds.
pub fn encode(entries: &[UsageEntry], max_bytes: usize) -> (String, usize) {
    let escape = !entries.iter().all(|entry| plain(&entry.tenant));
    let mut value = String::from(if escape { FORMAT } else { FORMAT_PLAIN });
    let mut line = String::new();
    let mut listed = 0;
    for entry in entries {
        line.clear();
        let level = |level: Option<f64>| match level {
            Some(level) if level.is_finite() => format!("{}", level.round() as i64),
            _ => "-".to_string(),
        };
        line.push('\n');
        if escape {
            encode_name(&entry.tenant, &mut line);
        } else {
            line.push_str(&entry.tenant);
        }
        let _ = write!(
            line,
            " {} {} {} {} {}",
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

/// Why one entry of a report was skipped. Every reason is a bound on untrusted peer data or
/// a malformed line; none says anything about the other entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryError {
    /// Not six space-separated fields.
    Fields,
    /// The name is not valid percent-encoding of UTF-8 (format 3), or is empty (format 2).
    Name,
    /// A count that is not a whole number from 0 to 2^53.
    Count,
    /// A level that is neither `-` nor an integer within ±10^15.
    Level,
    /// Past the first 100 000 entries of one report.
    TooMany,
}

impl EntryError {
    pub const ALL: [EntryError; 5] = [
        EntryError::Fields,
        EntryError::Name,
        EntryError::Count,
        EntryError::Level,
        EntryError::TooMany,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryError::Fields => "fields",
            EntryError::Name => "name",
            EntryError::Count => "count",
            EntryError::Level => "level",
            EntryError::TooMany => "too_many",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for EntryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EntryError::Fields => "not six space-separated fields",
            EntryError::Name => "the name is empty or not percent-encoded UTF-8",
            EntryError::Count => "a count that is not a whole number from 0 to 2^53",
            EntryError::Level => "a level that is neither '-' nor an integer within ±10^15",
            EntryError::TooMany => "more than 100 000 entries in one report",
        })
    }
}

/// A whole report refused: its format line is not one this version reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownFormat(pub String);

impl std::fmt::Display for UnknownFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Peer data: quoted, and at most 16 characters of it.
        let shown: String = self.0.chars().take(16).collect();
        write!(
            f,
            "format line {shown:?} is not one this version reads ({FORMAT_PLAIN} or {FORMAT}): \
             a peer of another version, or not a weir usage report"
        )
    }
}

/// A decoded report: the entries that could be read, and what was skipped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    pub entries: Vec<UsageEntry>,
    /// Entries skipped, per reason, indexed as [`EntryError::ALL`].
    pub skipped: [u64; EntryError::ALL.len()],
    /// The first skipped entry: its line (1 for the first entry) and why.
    pub first_skipped: Option<(usize, EntryError)>,
}

impl Report {
    pub fn skipped_total(&self) -> u64 {
        self.skipped.iter().sum()
    }
}

/// Decodes a peer's value. Peer data is untrusted: an entry that is malformed or carries
/// values no honest replica would send is skipped alone; only an unknown format refuses the
/// whole value.
pub fn decode(value: &str) -> Result<Report, UnknownFormat> {
    let mut lines = value.split('\n');
    let format = lines.next().unwrap_or_default();
    let escaped = match format {
        FORMAT => true,
        FORMAT_PLAIN => false,
        other => return Err(UnknownFormat(other.to_string())),
    };
    let mut report = Report::default();
    for (i, line) in lines.enumerate() {
        let entry = if report.entries.len() >= MAX_ENTRIES {
            Err(EntryError::TooMany)
        } else {
            decode_entry(line, escaped)
        };
        match entry {
            Ok(entry) => report.entries.push(entry),
            Err(err) => {
                report.skipped[err.index()] += 1;
                report.first_skipped.get_or_insert((i + 1, err));
            }
        }
    }
    Ok(report)
}

fn decode_entry(line: &str, escaped: bool) -> Result<UsageEntry, EntryError> {
    let fields: Vec<&str> = line.splitn(7, ' ').collect();
    let [name, requests, items, requests_level, items_level, in_flight] = fields[..] else {
        return Err(EntryError::Fields);
    };
    let tenant = if escaped {
        decode_name(name).ok_or(EntryError::Name)?
    } else if name.is_empty() {
        return Err(EntryError::Name);
    } else {
        name.to_string()
    };
    let count = |field: &str| {
        field
            .parse::<u64>()
            .ok()
            .filter(|&n| n <= MAX_COUNT)
            .ok_or(EntryError::Count)
    };
    let level = |field: &str| -> Result<Option<f64>, EntryError> {
        if field == "-" {
            return Ok(None);
        }
        let level = field.parse::<i64>().map_err(|_| EntryError::Level)? as f64;
        (level.abs() <= MAX_LEVEL)
            .then_some(Some(level))
            .ok_or(EntryError::Level)
    };
    Ok(UsageEntry {
        tenant,
        requests: count(requests)?,
        items: count(items)?,
        requests_level: level(requests_level)?,
        items_level: level(items_level)?,
        in_flight: count(in_flight)?,
    })
}

/// Undoes [`encode_name`]; `None` for a `%` not followed by two hex digits, or bytes that are
/// not UTF-8. Other bytes are taken as they are, escaped or not.
fn decode_name(name: &str) -> Option<String> {
    if !name.contains('%') {
        return Some(name.to_string());
    }
    let mut bytes = Vec::with_capacity(name.len());
    let mut rest = name.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        if byte == b'%' {
            let hex = tail
                .get(..2)
                .filter(|hex| hex.iter().all(u8::is_ascii_hexdigit))?;
            bytes.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(byte);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
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
    /// What the peers gave back of what they had counted (refunded pushes, lent tokens
    /// returned), cumulative: their views credit it, as the peers' own meters did.
    pub requests_refunded: u64,
    pub items_refunded: u64,
}

/// All tenants' [`TenantUsage`], as last aggregated.
pub type PeerUsage = Map<Arc<str>, TenantUsage>;

/// What moved in the peers' usage over one observation of the ring
/// ([`UsageAggregate::changes`]): a consumer that applies every batch in order holds the
/// whole view, and pays for the tenants that moved, not for every tenant each round.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageChanges {
    /// Tenants (and admission keys) whose usage moved, with their usage now.
    pub changed: Vec<(Arc<str>, TenantUsage)>,
    /// Tenants no live peer has listed for the forget time: no longer in the view.
    pub forgotten: Vec<Arc<str>>,
    /// The membership's `stalled_since` of the round that made the batch: its reports carry
    /// what the peers admitted while this process did not run.
    pub stalled_since: Option<Duration>,
}

impl UsageChanges {
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.forgotten.is_empty()
    }

    /// Brings a whole view up to date with this batch.
    pub fn apply_to(&self, view: &mut PeerUsage) {
        for (tenant, usage) in &self.changed {
            view.insert(Arc::clone(tenant), *usage);
        }
        for tenant in &self.forgotten {
            view.remove(tenant);
        }
    }
}

/// Most batches a [`UsageFeed`] queues before it folds them into one.
const FEED_MAX_BATCHES: usize = 64;

/// The peers' usage as it changes, handed from the ring's observer to its consumer (the
/// limiter). Each round's batch waits here until taken: the membership channel keeps only
/// the latest membership, and a consumer that wakes once for two rounds must see both
/// batches. A consumer that does not take them holds at most one batch per tenant's
/// latest usage.
#[derive(Debug, Default)]
pub struct UsageFeed {
    batches: Mutex<VecDeque<UsageChanges>>,
}

impl UsageFeed {
    pub fn push(&self, batch: UsageChanges) {
        let mut batches = self.batches.lock().unwrap_or_else(|e| e.into_inner());
        batches.push_back(batch);
        if batches.len() > FEED_MAX_BATCHES {
            let folded = fold(batches.drain(..));
            batches.push_back(folded);
        }
    }

    /// Every batch not taken yet, oldest first.
    pub fn take(&self) -> Vec<UsageChanges> {
        let mut batches = self.batches.lock().unwrap_or_else(|e| e.into_inner());
        batches.drain(..).collect()
    }
}

/// One feed is the same feed: its batches are for whoever takes them first.
impl PartialEq for UsageFeed {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

/// Batches folded into one that leaves a consumer where applying each in turn would: each
/// tenant's last word (its usage, or forgotten), and the last stall said.
fn fold(batches: impl Iterator<Item = UsageChanges>) -> UsageChanges {
    let mut last: Map<Arc<str>, Option<TenantUsage>> = Map::default();
    let mut stalled_since = None;
    for batch in batches {
        for (tenant, usage) in batch.changed {
            last.insert(tenant, Some(usage));
        }
        for tenant in batch.forgotten {
            last.insert(tenant, None);
        }
        stalled_since = batch.stalled_since.or(stalled_since);
    }
    let mut folded = UsageChanges {
        stalled_since,
        ..UsageChanges::default()
    };
    for (tenant, usage) in last {
        match usage {
            Some(usage) => folded.changed.push((tenant, usage)),
            None => folded.forgotten.push(tenant),
        }
    }
    folded
}

/// A peer incarnation: node id and generation.
pub type PeerKey = (String, u64);

#[derive(Debug, Default)]
struct TenantState {
    totals: (u64, u64),
    refunded: (u64, u64),
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

/// How a peer's cumulative count moved since its last report: (new admissions, given back).
/// A count is net of what the peer gave back (a push refunded after its forward failed,
/// tokens lent and returned), so it may fall a little: that is a refund, credited, never new
/// admissions. A count that falls below half of what it was is a restarted counter (the peer
/// forgot the tenant when it went idle, and counts again from zero): all of it is new. A
/// returning peer's count is a new base: what it counted while away is not charged.
/// *Departure:* this once took every fall for a restart, so a refund of 1 % re-charged the
/// peer's whole count to every view (measured: debts of 20–30 s of the limit after a run of
/// leases, whose unspent tokens go back).
fn change(now: u64, before: Option<u64>, away: bool) -> (u64, u64) {
    match before {
        _ if away => (0, 0),
        Some(before) if now >= before => (now - before, 0),
        Some(before) if now.saturating_mul(2) >= before => (0, before - now),
        _ => (now, 0),
    }
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
#[derive(Debug)]
pub struct UsageAggregate {
    peers: HashMap<PeerKey, Map<Arc<str>, PeerEntry>>,
    /// Peers no longer live: since when, and their last counts, kept for their return.
    departed: HashMap<PeerKey, (Instant, Map<Arc<str>, PeerEntry>)>,
    /// Each peer's count of its own stalls, as last read ([`UsageAggregate::note_stalls`]).
    stalls: HashMap<PeerKey, u64>,
    tenants: Map<Arc<str>, TenantState>,
    /// Each tenant's usage as last handed on ([`UsageAggregate::changes`]).
    view: PeerUsage,
    /// Tenants whose usage may have moved since it was last handed on.
    dirty: HashSet<Arc<str>, foldhash::fast::RandomState>,
    /// When a reported level goes stale, by tenant, in the order reported.
    levels_stale: VecDeque<(Instant, Arc<str>)>,
    /// When tenants were last looked for to forget ([`FORGET_EVERY`]).
    forgot_at: Option<Instant>,
    /// A tenant a live peer has not listed for this long is forgotten (of that peer; of all,
    /// once none has). Longer than the peers keep an idle tenant, so that by then the peer
    /// has dropped it and starts it again from zero: a tenant forgotten while the peer still
    /// had it would have its whole count taken in again when next listed.
    forget_after: Duration,
}

impl Default for UsageAggregate {
    fn default() -> Self {
        UsageAggregate::new(FORGET_AFTER)
    }
}

impl UsageAggregate {
    pub fn new(forget_after: Duration) -> Self {
        UsageAggregate {
            peers: HashMap::new(),
            departed: HashMap::new(),
            stalls: HashMap::new(),
            tenants: Map::default(),
            view: PeerUsage::default(),
            dirty: HashSet::default(),
            levels_stale: VecDeque::new(),
            forgot_at: None,
            forget_after,
        }
    }

    /// Takes in one report from `peer`, received at `now`.
    pub fn observe(&mut self, peer: &PeerKey, entries: &[UsageEntry], now: Instant) {
        self.restore(peer);
        let known = self.peers.entry(peer.clone()).or_default();
        for entry in entries {
            let counts = (entry.requests, entry.items);
            // The rotation relists idle tenants as they were: heard again, nothing moved (no
            // level to refresh either), so two lookups and no recomputation.
            if let Some(known_entry) = known.get_mut(entry.tenant.as_str()) {
                let unchanged = !known_entry.away
                    && known_entry.counts == counts
                    && known_entry.in_flight == entry.in_flight
                    && known_entry.levels == (None, None)
                    && entry.requests_level.is_none()
                    && entry.items_level.is_none();
                if let (true, Some(state)) =
                    (unchanged, self.tenants.get_mut(entry.tenant.as_str()))
                {
                    known_entry.at = now;
                    state.last_reported = Some(now);
                    continue;
                }
            }
            let previous = known.get(entry.tenant.as_str());
            let away = previous.is_some_and(|e| e.away);
            let previous = previous.map(|e| e.counts);
            let name = match self.tenants.get_key_value(entry.tenant.as_str()) {
                Some((name, _)) => Arc::clone(name),
                None => Arc::from(entry.tenant.as_str()),
            };
            let state = self.tenants.entry(Arc::clone(&name)).or_default();
            let (requests, requests_refunded) = change(counts.0, previous.map(|p| p.0), away);
            let (items, items_refunded) = change(counts.1, previous.map(|p| p.1), away);
            state.totals.0 = state.totals.0.saturating_add(requests);
            state.totals.1 = state.totals.1.saturating_add(items);
            state.refunded.0 = state.refunded.0.saturating_add(requests_refunded);
            state.refunded.1 = state.refunded.1.saturating_add(items_refunded);
            state.last_reported = Some(now);
            if entry.requests_level.is_some() || entry.items_level.is_some() {
                self.levels_stale
                    .push_back((now + LEVEL_MAX_AGE, Arc::clone(&name)));
            }
            self.dirty.insert(Arc::clone(&name));
            known.insert(
                name,
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

    /// `peer`'s count of its own stalls, as its state says with the report about to be
    /// observed. A higher count than before says it is back from a stall (SIGSTOP, a paused
    /// VM), not from a partition: it admitted nothing while away, and what its report adds it
    /// admitted since it resumed, from the backlog its sockets held. That is charged, not
    /// forgiven as a partitioned peer's is: forgiven, the fleet went 0.5–0.7 s of the limit
    /// over after each resume (`scripts/stop-resume`, 2026-12-06).
    pub fn note_stalls(&mut self, peer: &PeerKey, stalls: u64) {
        let before = self.stalls.insert(peer.clone(), stalls);
        if before.is_some_and(|before| stalls > before) {
            self.back_from_stall(peer);
        }
    }

    fn back_from_stall(&mut self, peer: &PeerKey) {
        self.restore(peer);
        if let Some(entries) = self.peers.get_mut(peer) {
            entries.values_mut().for_each(|entry| entry.away = false);
        }
    }

    /// A departed `peer` live again: its last entries count again (what it holds in flight,
    /// its levels).
    fn restore(&mut self, peer: &PeerKey) {
        if self.peers.contains_key(peer) {
            return;
        }
        if let Some((_, entries)) = self.departed.remove(peer) {
            self.dirty.extend(entries.keys().cloned());
            self.peers.insert(peer.clone(), entries);
        }
    }

    /// Sets aside peer incarnations that are no longer live (what they reported stays
    /// counted; their last counts wait an hour for their return), and forgets tenants a peer
    /// has not listed for `forget_after` (looked for at most once per [`FORGET_EVERY`]).
    pub fn retain_peers(&mut self, live: impl Fn(&PeerKey) -> bool, now: Instant) {
        let gone: Vec<PeerKey> = self.peers.keys().filter(|p| !live(p)).cloned().collect();
        for peer in gone {
            if let Some(mut entries) = self.peers.remove(&peer) {
                self.dirty.extend(entries.keys().cloned());
                entries.values_mut().for_each(|entry| entry.away = true);
                self.departed.insert(peer, (now, entries));
            }
        }
        self.departed
            .retain(|_, (since, _)| now.duration_since(*since) < FORGET_AFTER);
        let (peers, departed) = (&self.peers, &self.departed);
        self.stalls
            .retain(|peer, _| peers.contains_key(peer) || departed.contains_key(peer));
        if self
            .forgot_at
            .is_some_and(|at| now.saturating_duration_since(at) < FORGET_EVERY)
        {
            return;
        }
        self.forgot_at = Some(now);
        let forget_after = self.forget_after;
        let dirty = &mut self.dirty;
        self.tenants.retain(|tenant, state| {
            let keep = state
                .last_reported
                .is_some_and(|at| now.duration_since(at) < forget_after);
            if !keep {
                dirty.insert(Arc::clone(tenant));
            }
            keep
        });
        for entries in self.peers.values_mut() {
            entries.retain(|tenant, entry| {
                let keep = now.duration_since(entry.at) < forget_after;
                if !keep {
                    dirty.insert(Arc::clone(tenant));
                }
                keep
            });
        }
    }

    /// What moved in the view since the last call: the tenants a report, a peer's departure
    /// or return, a stale level or forgetting touched, each recomputed as of `now` and handed
    /// on when it differs from what was handed on before. The cost is the tenants touched,
    /// not every tenant: a ring of two with 20 000 idle tenants rebuilt and applied the whole
    /// view every round, about 1.2 ms of CPU a second per 1 000 tenants on each side.
    pub fn changes(&mut self, now: Instant) -> UsageChanges {
        while let Some((stale_at, _)) = self.levels_stale.front() {
            if *stale_at >= now {
                break;
            }
            if let Some((_, tenant)) = self.levels_stale.pop_front() {
                self.dirty.insert(tenant);
            }
        }
        let mut changes = UsageChanges::default();
        for tenant in std::mem::take(&mut self.dirty) {
            match self.tenant_usage(&tenant, now) {
                Some(usage) => {
                    if self.view.get(&tenant) != Some(&usage) {
                        self.view.insert(Arc::clone(&tenant), usage);
                        changes.changed.push((tenant, usage));
                    }
                }
                None => {
                    if self.view.remove(&tenant).is_some() {
                        changes.forgotten.push(tenant);
                    }
                }
            }
        }
        changes
    }

    /// How many tenants the view holds.
    pub fn tenants(&self) -> usize {
        self.view.len()
    }

    /// One tenant's usage as of `now`: its totals, what the live peers hold in flight, and
    /// the lowest level a live peer reported within [`LEVEL_MAX_AGE`]. `None` once forgotten.
    fn tenant_usage(&self, tenant: &str, now: Instant) -> Option<TenantUsage> {
        let state = self.tenants.get(tenant)?;
        let mut usage = TenantUsage {
            requests: state.totals.0,
            items: state.totals.1,
            requests_refunded: state.refunded.0,
            items_refunded: state.refunded.1,
            ..TenantUsage::default()
        };
        let lowest = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        for entry in self
            .peers
            .values()
            .filter_map(|entries| entries.get(tenant))
        {
            usage.in_flight = usage.in_flight.saturating_add(entry.in_flight);
            if now.saturating_duration_since(entry.at) > LEVEL_MAX_AGE {
                continue;
            }
            usage.requests_level = lowest(usage.requests_level, entry.levels.0);
            usage.items_level = lowest(usage.items_level, entry.levels.1);
        }
        Some(usage)
    }

    /// The whole view as of `now`, after [`UsageAggregate::changes`] (which it takes).
    pub fn snapshot(&mut self, now: Instant) -> PeerUsage {
        self.changes(now);
        self.view.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn no_entry_is_shorter_than_the_shortest_line() {
        let entry = UsageEntry {
            tenant: "a".into(),
            requests: 0,
            items: 0,
            requests_level: None,
            items_level: Some(1.0),
            in_flight: 0,
        };
        let (empty, _) = encode(&[], usize::MAX);
        let (one, listed) = encode(&[entry], usize::MAX);
        assert_eq!(listed, 1);
        assert_eq!(one.len() - empty.len(), SHORTEST_LINE);
    }

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
        let decoded = decode(&value).unwrap().entries;
        assert_eq!(decoded[0].items_level, Some(-17.0));
        assert_eq!(decoded[1], entries[1]);
        assert_eq!(decode("2").unwrap(), Report::default());
        assert_eq!(decode("3").unwrap(), Report::default());
    }

    #[test]
    fn a_name_format_2_cannot_hold_switches_the_report_to_format_3() {
        let entries = vec![
            entry("t/GET%20%2Fs", 1, 2, None),
            entry("my team", 3, 4, None),
            entry("", 5, 6, None),
            entry("line\nbreak\r\t%zz é", 7, 8, None),
        ];
        let (value, listed) = encode(&entries, 1024);
        assert_eq!(listed, 4);
        assert_eq!(
            value,
            "3\nt/GET%2520%252Fs 1 2 - - 0\nmy%20team 3 4 - - 0\n 5 6 - - 0\n\
             line%0Abreak%0D%09%25zz%20é 7 8 - - 0"
        );
        assert_eq!(decode(&value).unwrap().entries, entries);
        // Format 2 as an older replica writes it still reads, `%` and all.
        let old = decode("2\nt/GET%20%2Fs 1 2 - - 0").unwrap();
        assert_eq!(old.entries[0].tenant, "t/GET%20%2Fs");
    }

    #[test]
    fn the_cap_keeps_the_first_entries() {
        let entries: Vec<UsageEntry> = (0..1000)
            .map(|i| entry(&format!("tenant-{i:04}"), i, i * 100, None))
            .collect();
        let (value, listed) = encode(&entries, 4096);
        assert!(value.len() <= 4096);
        assert!(listed > 100 && listed < 1000);
        let decoded = decode(&value).unwrap().entries;
        assert_eq!(decoded.len(), listed);
        assert_eq!(decoded[0].tenant, "tenant-0000");
    }

    #[test]
    fn an_unknown_format_refuses_the_whole_report() {
        for bad in [
            "",
            "1 0 0 0",
            "4\na 1 2 - - 0",
            "2 \na 1 2 - - 0",
            "a 1 2 - - 0",
        ] {
            assert!(decode(bad).is_err(), "{bad:?}");
        }
        let message = decode("9\nx").unwrap_err().to_string();
        assert!(
            message.contains("\"9\"") && message.contains("2 or 3"),
            "{message}"
        );
    }

    #[test]
    fn a_bad_entry_is_skipped_alone_and_counted() {
        use EntryError::*;
        for (bad, reason) in [
            ("a 1", Fields),
            ("a 1 2 - -", Fields),
            ("a 1 2 - - 0 extra", Fields),
            ("my team 1 2 - - 0", Fields),
            (" 1 2 - - 0", Name),
            ("a -1 2 - - 0", Count),
            ("a NaN 2 - - 0", Count),
            ("a 18446744073709551615 2 - - 0", Count),
            ("a 1 9007199254740993 - - 0", Count),
            ("a 1 2 - - -3", Count),
            ("a 1 2 - - 18446744073709551615", Count),
            ("a 1 2 x - 0", Level),
            ("a 1 2 - 1e300 0", Level),
            ("a 1 2 - 99999999999999999 0", Level),
        ] {
            let value = format!("2\ngood 1 1 - - 0\n{bad}\nalso-good 2 2 - - 0");
            let report = decode(&value).unwrap();
            let names: Vec<&str> = report.entries.iter().map(|e| e.tenant.as_str()).collect();
            assert_eq!(names, ["good", "also-good"], "{bad:?}");
            assert_eq!(report.first_skipped, Some((2, reason)), "{bad:?}");
            assert_eq!(report.skipped_total(), 1);
            assert_eq!(report.skipped[reason.index()], 1);
        }
        for (bad, reason) in [
            ("a%2 1 2 - - 0", Name),
            ("a%g0 1 2 - - 0", Name),
            ("a%+1 1 2 - - 0", Name),
            ("%FF 1 2 - - 0", Name),
            ("a b 1 2 - - 0", Fields),
        ] {
            let report = decode(&format!("3\n{bad}\nok 1 1 - - 0")).unwrap();
            assert_eq!(report.entries.len(), 1, "{bad:?}");
            assert_eq!(report.first_skipped, Some((1, reason)), "{bad:?}");
        }
    }

    #[test]
    fn entries_past_the_bound_are_skipped() {
        let mut value = String::from("2");
        for _ in 0..MAX_ENTRIES + 3 {
            value.push_str("\nt 1 1 - - 0");
        }
        let report = decode(&value).unwrap();
        assert_eq!(report.entries.len(), MAX_ENTRIES);
        assert_eq!(report.skipped[EntryError::TooMany.index()], 3);
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

    /// The view holds the tenants listed within `forget_after`: one a live peer stopped
    /// listing is forgotten then, while another it keeps listing stays; a departed peer's
    /// counts wait the hour for its return either way.
    /// Forgetting walks every tenant, so it is looked for once a second, not every round: a
    /// tenant due is forgotten within a second of its time.
    #[test]
    fn tenants_are_looked_for_to_forget_once_a_second() {
        let now = Instant::now();
        let forget = Duration::from_secs(60);
        let mut aggregate = UsageAggregate::new(forget);
        aggregate.observe(&peer("a", 1), &[entry("idle", 0, 10, None)], now);
        let live = |p: &PeerKey| p.0 == "a";
        aggregate.retain_peers(live, now + forget - Duration::from_millis(500));
        aggregate.retain_peers(live, now + forget);
        assert_eq!(
            aggregate.snapshot(now + forget).len(),
            1,
            "looked 0.5 s ago"
        );
        aggregate.retain_peers(live, now + forget + Duration::from_millis(500));
        assert!(aggregate.snapshot(now + forget).is_empty());
    }

    #[test]
    fn tenants_a_peer_stopped_listing_are_forgotten_after_forget_after() {
        let now = Instant::now();
        let forget = Duration::from_secs(360);
        let mut aggregate = UsageAggregate::new(forget);
        let a = peer("a", 1);
        aggregate.observe(
            &a,
            &[entry("idle", 0, 10, None), entry("busy", 0, 10, None)],
            now,
        );
        aggregate.observe(&peer("b", 1), &[entry("gone", 0, 7, None)], now);
        aggregate.retain_peers(|p| p.0 == "a", now);
        let later = now + forget - Duration::from_secs(1);
        aggregate.observe(&a, &[entry("busy", 0, 40, None)], later);
        aggregate.retain_peers(|p| p.0 == "a", later);
        assert_eq!(aggregate.snapshot(later).len(), 3, "nothing forgotten yet");
        let past = now + forget;
        aggregate.retain_peers(|p| p.0 == "a", past);
        let view = aggregate.snapshot(past);
        assert_eq!(view.keys().map(|k| &**k).collect::<Vec<_>>(), ["busy"]);
        assert_eq!(view["busy"].items, 40);
        // "idle" comes back at the peer, started again from zero: counted from zero, not
        // as a fall from 10.
        aggregate.observe(&a, &[entry("idle", 0, 3, None)], past);
        assert_eq!(aggregate.snapshot(past)["idle"].items, 3);
        assert_eq!(aggregate.snapshot(past)["idle"].items_refunded, 0);
        // The departed peer's entries are still kept for its return (the hour): what it
        // admitted while away is not charged, and what it admits after is.
        aggregate.observe(&peer("b", 1), &[entry("gone", 0, 9, None)], past);
        assert_eq!(aggregate.snapshot(past)["gone"].items, 0);
        aggregate.observe(&peer("b", 1), &[entry("gone", 0, 12, None)], past);
        assert_eq!(aggregate.snapshot(past)["gone"].items, 3);
    }

    /// A count that falls a little is a refund: credited apart, never charged again; the
    /// admissions after it count from the lower count. A fall below half is a restart.
    #[test]
    fn a_small_fall_is_a_refund_and_a_large_one_a_restart() {
        let now = Instant::now();
        let mut aggregate = UsageAggregate::default();
        aggregate.observe(&peer("a", 1), &[entry("t", 10, 5_000, None)], now);
        // 400 items and 1 request given back.
        aggregate.observe(&peer("a", 1), &[entry("t", 9, 4_600, None)], now);
        let usage = aggregate.snapshot(now);
        assert_eq!((usage["t"].requests, usage["t"].items), (10, 5_000));
        assert_eq!(
            (usage["t"].requests_refunded, usage["t"].items_refunded),
            (1, 400)
        );
        // 100 new admissions after the refund.
        aggregate.observe(&peer("a", 1), &[entry("t", 10, 4_700, None)], now);
        let usage = aggregate.snapshot(now);
        assert_eq!((usage["t"].requests, usage["t"].items), (11, 5_100));
        assert_eq!(usage["t"].items_refunded, 400);
        // Forgotten and counted again from zero: 30 new.
        aggregate.observe(&peer("a", 1), &[entry("t", 1, 30, None)], now);
        let usage = aggregate.snapshot(now);
        assert_eq!((usage["t"].requests, usage["t"].items), (12, 5_130));
        assert_eq!(usage["t"].items_refunded, 400);
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

    /// A peer back from a stall of its own (its count of stalls went up with its report) ran
    /// nothing while away: what its report adds it admitted since it resumed, and that is
    /// charged. One back with the same count was cut off, and is forgiven as before.
    #[test]
    fn a_peer_back_from_a_stall_is_charged_for_what_it_admitted_since() {
        let now = Instant::now();
        let mut aggregate = UsageAggregate::default();
        for name in ["a", "b"] {
            aggregate.note_stalls(&peer(name, 1), 0);
            aggregate.observe(&peer(name, 1), &[entry("t", 2, 100, None)], now);
        }
        aggregate.retain_peers(|_| false, now);
        // a was stalled; b was cut off.
        aggregate.note_stalls(&peer("a", 1), 1);
        aggregate.observe(&peer("a", 1), &[entry("t", 3, 600, None)], now);
        assert_eq!(
            aggregate.snapshot(now)["t"].items,
            700,
            "the backlog is charged"
        );
        aggregate.note_stalls(&peer("b", 1), 0);
        aggregate.observe(&peer("b", 1), &[entry("t", 3, 900, None)], now);
        assert_eq!(
            aggregate.snapshot(now)["t"].items,
            700,
            "the partition is forgiven"
        );
        aggregate.observe(&peer("b", 1), &[entry("t", 3, 950, None)], now);
        assert_eq!(aggregate.snapshot(now)["t"].items, 750);
    }

    /// The whole view computed afresh from the aggregate's state, as every round did before
    /// the changes were handed on alone: the oracle for [`UsageAggregate::changes`].
    fn full_view(aggregate: &UsageAggregate, now: Instant) -> PeerUsage {
        let mut usage: PeerUsage = aggregate
            .tenants
            .iter()
            .map(|(tenant, state)| {
                let usage = TenantUsage {
                    requests: state.totals.0,
                    items: state.totals.1,
                    requests_refunded: state.refunded.0,
                    items_refunded: state.refunded.1,
                    ..TenantUsage::default()
                };
                (Arc::clone(tenant), usage)
            })
            .collect();
        for entries in aggregate.peers.values() {
            for (tenant, entry) in entries {
                // A returning peer's entry of a tenant forgotten meanwhile counts nowhere.
                let Some(total) = usage.get_mut(tenant) else {
                    continue;
                };
                total.in_flight += entry.in_flight;
                if now.duration_since(entry.at) <= LEVEL_MAX_AGE {
                    for (level, reported) in [
                        (&mut total.requests_level, entry.levels.0),
                        (&mut total.items_level, entry.levels.1),
                    ] {
                        *level = match (*level, reported) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        };
                    }
                }
            }
        }
        usage
    }

    #[derive(Debug, Clone)]
    enum Step {
        Report {
            peer: usize,
            entries: Vec<(usize, u64, u64, Option<f64>, u64)>,
        },
        /// The peer's last report again, as a rotation relists idle tenants.
        Relist(usize),
        Live(u8),
        Stall(usize),
        HandOn,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..4usize, prop::collection::vec(
                (0..6usize, 0u64..50, 0u64..5_000, prop::option::of(-10.0f64..100.0), 0u64..4),
                0..5,
            ))
                .prop_map(|(peer, entries)| Step::Report { peer, entries }),
            2 => (0..4usize).prop_map(Step::Relist),
            1 => any::<u8>().prop_map(Step::Live),
            1 => (0..4usize).prop_map(Step::Stall),
            2 => Just(Step::HandOn),
        ]
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

        /// A consumer that applies every batch of changes in turn holds the view computed
        /// afresh, whatever reports, departures, returns, stalls, stale levels and forgetting
        /// came between the batches.
        #[test]
        fn the_changes_handed_on_add_up_to_the_whole_view(
            steps in prop::collection::vec((step(), 0u64..1_500), 1..60),
        ) {
            let start = Instant::now();
            let mut now = start;
            let mut aggregate = UsageAggregate::new(Duration::from_secs(6));
            let mut consumer = PeerUsage::default();
            let mut stalls = [0u64; 4];
            let mut last: [Vec<UsageEntry>; 4] = Default::default();
            let peer = |i: usize| ((i % 2).to_string(), 1 + (i / 2) as u64);
            for (step, advance) in steps {
                now += Duration::from_millis(advance);
                match step {
                    Step::Report { peer: i, entries } => {
                        let entries: Vec<UsageEntry> = entries
                            .into_iter()
                            .map(|(tenant, requests, items, level, in_flight)| UsageEntry {
                                tenant: format!("t{tenant}"),
                                requests,
                                items,
                                requests_level: level.map(f64::round),
                                items_level: level.filter(|_| requests % 3 != 0),
                                in_flight,
                            })
                            .collect();
                        aggregate.note_stalls(&peer(i), stalls[i]);
                        aggregate.observe(&peer(i), &entries, now);
                        last[i] = entries;
                    }
                    Step::Relist(i) => {
                        aggregate.note_stalls(&peer(i), stalls[i]);
                        aggregate.observe(&peer(i), &last[i], now);
                    }
                    Step::Live(mask) => {
                        let live = |key: &PeerKey| {
                            (0..4).any(|i| peer(i) == *key && mask & (1 << i) != 0)
                        };
                        aggregate.retain_peers(live, now);
                    }
                    Step::Stall(i) => stalls[i] += 1,
                    Step::HandOn => {
                        aggregate.changes(now).apply_to(&mut consumer);
                        prop_assert_eq!(&consumer, &full_view(&aggregate, now));
                    }
                }
            }
            aggregate.changes(now).apply_to(&mut consumer);
            prop_assert_eq!(&consumer, &full_view(&aggregate, now));
        }

        /// Folded batches leave a consumer where the batches one by one do.
        #[test]
        fn a_folded_feed_is_the_batches_in_turn(
            batches in prop::collection::vec(
                (
                    prop::collection::vec((0..5usize, 0u64..100), 0..4),
                    prop::collection::vec(0..5usize, 0..3),
                ),
                0..12,
            ),
        ) {
            let batches: Vec<UsageChanges> = batches
                .into_iter()
                .map(|(changed, forgotten)| UsageChanges {
                    changed: changed
                        .into_iter()
                        .map(|(t, items)| {
                            (Arc::from(format!("t{t}")), TenantUsage { items, ..TenantUsage::default() })
                        })
                        .collect(),
                    forgotten: forgotten.into_iter().map(|t| Arc::from(format!("t{t}"))).collect(),
                    stalled_since: None,
                })
                .collect();
            let mut in_turn = PeerUsage::default();
            for batch in &batches {
                batch.apply_to(&mut in_turn);
            }
            let mut folded = PeerUsage::default();
            fold(batches.into_iter()).apply_to(&mut folded);
            prop_assert_eq!(folded, in_turn);
        }

        #[test]
        fn decode_never_panics(value in "\\PC*") {
            let _ = decode(&value);
        }

        /// Any name round-trips: spaces, newlines, `/`, `%`, control characters, any
        /// Unicode, the empty string; and the numbers with it.
        #[test]
        fn any_name_round_trips(
            names in prop::collection::vec(
                prop_oneof![
                    any::<String>(),
                    "[ \n\r\t%/{}a-z0-9é\u{0}\u{7f}\u{2028}]{0,12}",
                    Just(String::new()),
                ],
                1..8,
            ),
            requests in 0u64..=MAX_COUNT,
            level in prop::option::of(-1e15f64..1e15),
            in_flight in 0u64..1000,
        ) {
            let entries: Vec<UsageEntry> = names
                .iter()
                .map(|name| UsageEntry {
                    tenant: name.clone(),
                    requests,
                    items: requests / 2,
                    requests_level: level.map(f64::round),
                    items_level: None,
                    in_flight,
                })
                .collect();
            let (value, listed) = encode(&entries, usize::MAX);
            prop_assert_eq!(listed, entries.len());
            let report = decode(&value).unwrap();
            prop_assert_eq!(report.skipped_total(), 0);
            prop_assert_eq!(report.entries, entries);
        }
    }
}

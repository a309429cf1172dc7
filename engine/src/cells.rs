//! Cells: several rings, each enforcing a slice of a tenant's global limit. This module is the
//! pure part, with time passed in:
//!
//! - [`allocate`] and [`reconcile`]: how a tenant's global rate is split among cells by
//!   demand. `reconcile` is the pure twin of the Redis script `cell_slice.lua`, which every
//!   replica of every cell runs when it reports (no election: any process may die).
//! - [`CellShares`]: the slices in force on one replica, as fractions of each tenant's
//!   configured limits; the limiter applies them where a tenant's limits enter the engine
//!   ([`CellShares::apply`]), and nowhere else.
//! - [`CellSync`]: what a replica keeps between rounds: the last answer per tenant, its age,
//!   the cell count last seen, and so which share is in force when the store is away (the
//!   last slice for the slice TTL, then the static fallback).
//!
//! # The allocation
//! Each live cell claims `max(demand, floor)`, the floor being `floor_fraction × L ÷ cells`.
//! The rate `L` is water-filled over the claims (max-min fair: no cell gets more than it
//! claims while another gets less than its claim and less than the level), and what is left
//! when every claim is met goes to the cells in proportion to their claims. So the slices sum
//! to `L` exactly, each is at least the floor, a cell that wants less than its fair share gets
//! all it wants, and the idle cells together hold at most `floor_fraction × L`.
//! *Departure:* slicing in proportion to demand alone starves a small cell whenever a large
//! one is far over the limit (a cell offering 0.3 L beside one offering 10 L would get 3 % of
//! L); water-filling gives it its 0.3 L.
//!
//! Burst: a cell's share of `B` is its share of `L`, but at least `1 ÷ cells`, so a cell that
//! starts receiving a tenant can admit a request of up to `B ÷ cells` at once. The bursts in
//! force sum to less than `2 B`.
//!
//! # Subjects
//! What is sliced is a *subject* with two limits: a tenant's push limits (request rate,
//! ingestion rate), or one admission key of a tenant (its rate, and its in-flight cap
//! `max_concurrent`); a tenant's `max_inflight_push_requests` is the in-flight cap of its push
//! key. An in-flight cap is counted in whole slots: its demand is the most this cell wanted
//! in flight at once, each live cell's floor is at least one slot when the cap has one for
//! every cell ([`SubjectLimits::units`]), and a cell holds ⌊cap × share⌋ slots, so the cells'
//! slots sum to the cap at most.

use std::collections::HashMap;

use runtime_config::{LimitSpec, RateLimitStrategy, TenantLimits};

/// A share of one limit: fractions of the configured rate and burst, each in (0, 1].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Share {
    pub rate: f64,
    pub burst: f64,
}

impl Share {
    /// The whole limit: what a replica outside any cell enforces.
    pub const WHOLE: Share = Share {
        rate: 1.0,
        burst: 1.0,
    };

    /// The same fraction of the rate and the burst.
    pub fn even(fraction: f64) -> Share {
        Share {
            rate: fraction,
            burst: fraction,
        }
    }

    /// Whether two shares differ by more than `relative` of the larger one (either part).
    pub fn differs(&self, other: &Share, relative: f64) -> bool {
        let apart = |a: f64, b: f64| (a - b).abs() > relative * a.abs().max(b.abs());
        apart(self.rate, other.rate) || apart(self.burst, other.burst)
    }
}

/// One subject's shares in a cell, per limit: a tenant's request and ingestion limits, or an
/// admission key's rate (`request`) and in-flight cap (`ingestion`), in that order (see
/// [`TenantShare::key_rate`], [`TenantShare::key_in_flight`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TenantShare {
    pub request: Share,
    pub ingestion: Share,
}

impl TenantShare {
    pub const WHOLE: TenantShare = TenantShare {
        request: Share::WHOLE,
        ingestion: Share::WHOLE,
    };

    pub fn even(fraction: f64) -> TenantShare {
        TenantShare {
            request: Share::even(fraction),
            ingestion: Share::even(fraction),
        }
    }

    fn differs(&self, other: &TenantShare, relative: f64) -> bool {
        self.request.differs(&other.request, relative)
            || self.ingestion.differs(&other.ingestion, relative)
    }

    /// An admission key's share of its rate.
    pub fn key_rate(&self) -> Share {
        self.request
    }

    /// An admission key's share of its in-flight cap.
    pub fn key_in_flight(&self) -> Share {
        self.ingestion
    }
}

/// A subject's two limits as the reconciler slices them, and the smallest claim of each that
/// counts (an in-flight cap is counted in whole slots: 1; a rate: 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SubjectLimits {
    /// Each limit (≤ 0: not sliced).
    pub limits: [f64; 2],
    pub units: [f64; 2],
}

impl From<[f64; 2]> for SubjectLimits {
    /// Two rates.
    fn from(limits: [f64; 2]) -> Self {
        SubjectLimits {
            limits,
            units: [0.0; 2],
        }
    }
}

impl SubjectLimits {
    /// An admission key: its rate, and its in-flight cap in whole slots.
    pub fn key(rate: f64, max_concurrent: u64) -> SubjectLimits {
        SubjectLimits {
            limits: [rate, max_concurrent as f64],
            units: [0.0, 1.0],
        }
    }
}

/// What a cell report is about, as the store names it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CellSubject<'a> {
    /// A tenant's push limits.
    Tenant(&'a str),
    /// An admission key of a tenant (the key percent-encoded).
    Key(crate::store::KeyName<'a>),
}

/// The name under which a replica keeps an admission key's share: `tenant/encoded key`, the
/// admission entry's name (tenant IDs hold no `/`, so it never names a tenant).
pub fn key_subject(tenant: &str, encoded_key: &str) -> String {
    format!("{tenant}/{encoded_key}")
}

/// The slices in force on one replica: a share per subject the store has answered for (by
/// tenant, or `tenant/key` for an admission key: [`key_subject`]), and a default for every
/// other. Outside any cell there are none, and limits pass through.
#[derive(Debug, Clone, PartialEq)]
pub struct CellShares {
    pub default: TenantShare,
    pub tenants: HashMap<String, TenantShare>,
    /// The cells counted (0 outside cells, or before the store first answered): a cap with at
    /// least one slot per cell gives each cell at least one.
    pub cells: u32,
}

impl Default for CellShares {
    fn default() -> Self {
        CellShares {
            default: TenantShare::WHOLE,
            tenants: HashMap::new(),
            cells: 0,
        }
    }
}

/// The smallest fraction of a rate a slice keeps: a rate of 0 would mean "refuse all".
const MIN_RATE_SHARE: f64 = 1e-6;

impl CellShares {
    /// The tenant's limits as its cell enforces them: its configured limits with the cell's
    /// share of each rate and burst. `shared` tenants keep their one global bucket in the
    /// store (the hard-limit mode), and `0` rates keep their meaning (refuse all, unlimited).
    pub fn apply(&self, tenant: &str, limits: &TenantLimits) -> TenantLimits {
        if limits.rate_limit_strategy == RateLimitStrategy::Shared {
            return *limits;
        }
        let share = self.tenants.get(tenant).unwrap_or(&self.default);
        if *share == TenantShare::WHOLE {
            return *limits;
        }
        let slice = |rate: f64, burst: u64, share: &Share| {
            if rate <= 0.0 {
                return (rate, burst);
            }
            let rate = rate * share.rate.clamp(MIN_RATE_SHARE, 1.0);
            let burst = ((burst as f64) * share.burst.clamp(0.0, 1.0)).ceil() as u64;
            (rate, burst.max(1))
        };
        let mut sliced = *limits;
        (sliced.ingestion_rate, sliced.ingestion_burst_size) = slice(
            limits.ingestion_rate,
            limits.ingestion_burst_size,
            &share.ingestion,
        );
        (sliced.request_rate, sliced.request_burst_size) = slice(
            limits.request_rate,
            limits.request_burst_size,
            &share.request,
        );
        sliced
    }

    /// An admission key's limit as its cell enforces it (`subject`: [`key_subject`]): the
    /// cell's share of its rate and burst, and of its in-flight cap in whole slots. Its
    /// `max_concurrent` may be 0 here, meaning no slot in this cell: the caller checks the
    /// configured cap for "no cap". `shared` keys keep their one global meter and lease set
    /// in the store.
    pub fn apply_key(
        &self,
        subject: &str,
        spec: &LimitSpec,
        strategy: RateLimitStrategy,
    ) -> LimitSpec {
        if strategy == RateLimitStrategy::Shared {
            return *spec;
        }
        let share = self.tenants.get(subject).unwrap_or(&self.default);
        if *share == TenantShare::WHOLE {
            return *spec;
        }
        let mut sliced = *spec;
        let rate = share.key_rate();
        if spec.rate > 0.0 {
            sliced.rate = spec.rate * rate.rate.clamp(MIN_RATE_SHARE, 1.0);
            if spec.burst > 0 {
                sliced.burst =
                    (((spec.burst as f64) * rate.burst.clamp(0.0, 1.0)).ceil() as u64).max(1);
            }
        }
        sliced.max_concurrent = self.slots(spec.max_concurrent, share.key_in_flight());
        sliced
    }

    /// This cell's whole slots of an in-flight cap `max` (0: no cap, kept): ⌊max × share⌋,
    /// at least one when the cap has one for every cell (the reconciler's floor gives each
    /// live cell one then).
    fn slots(&self, max: u64, share: Share) -> u64 {
        if max == 0 {
            return 0;
        }
        // A share of exactly k ÷ max must give k, not k − 1, after float rounding.
        let slots = ((max as f64) * share.rate.clamp(0.0, 1.0) + 1e-6).floor() as u64;
        let one_each = self.cells > 0 && max >= u64::from(self.cells);
        slots.max(u64::from(one_each)).min(max)
    }

    /// Whether `other` would change some tenant's limits by more than `relative` (so a
    /// replica does not rebuild every tenant for noise in the demand).
    pub fn differs(&self, other: &CellShares, relative: f64) -> bool {
        self.default != other.default
            || self.cells != other.cells
            || self.tenants.len() != other.tenants.len()
            || self.tenants.iter().any(|(tenant, share)| {
                other
                    .tenants
                    .get(tenant)
                    .is_none_or(|theirs| share.differs(theirs, relative))
            })
    }
}

/// Splits `limit` among cells that claim `claims` (each ≥ 0): water-filling, then what is
/// left in proportion to the claims (evenly if every claim is 0). The result sums to `limit`.
/// `cell_slice.lua` does the same steps in the same order.
pub fn allocate(limit: f64, claims: &[f64]) -> Vec<f64> {
    let n = claims.len();
    if n == 0 {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..n).collect();
    // Ties keep their index order, so the script (which sorts the same way) agrees.
    order.sort_by(|&a, &b| claims[a].total_cmp(&claims[b]).then(a.cmp(&b)));
    let mut slices = vec![0.0; n];
    let mut remaining = limit;
    let mut left = n;
    for &i in &order {
        let level = remaining / left as f64;
        let slice = claims[i].min(level);
        slices[i] = slice;
        remaining -= slice;
        left -= 1;
    }
    if remaining > 0.0 {
        let total: f64 = claims.iter().sum();
        for (slice, claim) in slices.iter_mut().zip(claims) {
            *slice += if total > 0.0 {
                remaining * claim / total
            } else {
                remaining / n as f64
            };
        }
    }
    slices
}

/// What one replica stores about one tenant in the reconciler's hash (per cell and replica):
/// when it last reported (store microseconds) and the demand it saw, per limit, in units per
/// second; and what it admitted in total (spend), for operators.
#[derive(Debug, Clone, PartialEq)]
pub struct CellReport {
    pub cell: String,
    pub replica: String,
    pub at_micros: u64,
    /// Offered per second since the replica's previous report: requests, items.
    pub demand: [f64; 2],
    /// Admitted since the replica started, cumulative: requests, items.
    pub spent: [u64; 2],
    /// The rate shares the reconciler last answered this replica: what it has in force.
    /// Recorded by [`reconcile`]; what a caller sends is ignored.
    pub answered: [f64; 2],
}

/// How the reconciler runs: the same for every call of one replica.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReconcileParams {
    /// A replica's report counts as fresh for this long (a few sync intervals).
    pub fresh_micros: u64,
    /// A cell none of whose reports is fresh keeps its last claim this long (the slice TTL),
    /// since it may still be enforcing its last slice; older reports are deleted.
    pub hold_micros: u64,
    /// Live cells as the registry counts them (the caller's last heartbeat answer).
    pub live_cells: u32,
    /// The floor as a fraction of the even share `L ÷ cells`.
    pub floor_fraction: f64,
}

/// The reconciler's answer for the calling cell.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reconciled {
    /// This cell's share of the request and ingestion limits.
    pub share: TenantShare,
    /// The cells counted (the live count, or more if more have reported this tenant).
    pub cells: u32,
}

/// The reconciler, as `cell_slice.lua` runs it atomically: records `report` at `now_micros`
/// (replacing the replica's previous one), drops reports older than the hold, and returns the
/// reports to store and the caller's cell's share of `limits` (see [`cell_shares`]).
///
/// A limit counted in units (an in-flight cap) is a bound at every moment, not on average:
/// the caller's share of it is at most what the other cells leave, each holding the largest
/// share its replicas were last answered (a live cell that has not reported holds the
/// floor). Each answer respects those in force, so the slots in force never sum past the cap,
/// whatever order the cells report in; a share given up reaches another cell when it has been
/// answered less, one round later.
pub fn reconcile(
    stored: Vec<CellReport>,
    mut report: CellReport,
    now_micros: u64,
    limits: impl Into<SubjectLimits>,
    params: ReconcileParams,
) -> (Vec<CellReport>, Reconciled) {
    let limits = limits.into();
    report.at_micros = now_micros;
    let mut kept: Vec<CellReport> = stored
        .into_iter()
        .filter(|old| {
            !(old.cell == report.cell && old.replica == report.replica)
                && now_micros.saturating_sub(old.at_micros) <= params.hold_micros
        })
        .collect();
    kept.push(report.clone());
    let (shares, cells) = cell_shares(&kept, now_micros, limits, params);
    let mut share = shares
        .into_iter()
        .find(|(cell, _)| *cell == report.cell)
        .map(|(_, share)| share)
        .expect("the caller's report was just added");
    let mut parts = [&mut share.request, &mut share.ingestion];
    for (kind, part) in parts.iter_mut().enumerate() {
        let limit = limits.limits[kind];
        if limit <= 0.0 || limits.units[kind] <= 0.0 {
            continue;
        }
        let mut others: Vec<(&str, f64)> = Vec::new();
        for other in kept.iter().filter(|other| other.cell != report.cell) {
            match others.iter_mut().find(|(cell, _)| *cell == other.cell) {
                Some((_, held)) => *held = held.max(other.answered[kind]),
                None => others.push((&other.cell, other.answered[kind])),
            }
        }
        let reporting = others.len() + 1;
        let unreported = (cells as usize).saturating_sub(reporting) as f64;
        let in_force: f64 = others.iter().map(|(_, held)| held).sum::<f64>()
            + unreported * floor(params.floor_fraction, limit, cells, limits.units[kind]) / limit;
        part.rate = part.rate.min((1.0 - in_force).max(0.0));
        part.burst = part.burst.min(part.rate.max(1.0 / f64::from(cells.max(1))));
    }
    let answered = [share.request.rate, share.ingestion.rate];
    if let Some(mine) = kept.last_mut() {
        mine.answered = answered;
    }
    (kept, Reconciled { share, cells })
}

/// A live cell's floor claim of `limit` among `cells`: `floor_fraction` of the even share,
/// but at least one unit when the even share holds one.
fn floor(floor_fraction: f64, limit: f64, cells: u32, unit: f64) -> f64 {
    let even = limit / f64::from(cells.max(1));
    let floor = floor_fraction * even;
    if even >= unit {
        floor.max(unit)
    } else {
        floor
    }
}

/// Every reporting cell's share of `limits` (a limit ≤ 0 is not sliced: share 1), by cell
/// name, and the cells counted. A cell's demand is the sum of its fresh reports; a cell with
/// none fresh keeps the sum of its held ones. The cells counted are the live ones, or more if
/// more have reported; those that have not reported the subject claim the floor, which is
/// `floor_fraction × L ÷ cells` but at least a limit's unit when L holds one per cell. Reports
/// older than the hold must already be gone.
pub fn cell_shares(
    reports: &[CellReport],
    now_micros: u64,
    limits: impl Into<SubjectLimits>,
    params: ReconcileParams,
) -> (Vec<(String, TenantShare)>, u32) {
    let SubjectLimits { limits, units } = limits.into();
    // Per cell, sorted by name (as the script sorts): fresh sums, held sums, any fresh.
    let mut cells: Vec<(&str, [f64; 2], [f64; 2], bool)> = Vec::new();
    for entry in reports {
        let index = match cells.iter().position(|(cell, ..)| *cell == entry.cell) {
            Some(index) => index,
            None => {
                cells.push((&entry.cell, [0.0; 2], [0.0; 2], false));
                cells.len() - 1
            }
        };
        let cell = &mut cells[index];
        let fresh = now_micros.saturating_sub(entry.at_micros) <= params.fresh_micros;
        for kind in 0..2 {
            cell.2[kind] += entry.demand[kind];
            if fresh {
                cell.1[kind] += entry.demand[kind];
            }
        }
        cell.3 |= fresh;
    }
    cells.sort_by(|a, b| a.0.cmp(b.0));
    let count = (params.live_cells as usize).max(cells.len()).max(1);
    let mut shares = vec![[Share::WHOLE; 2]; cells.len()];
    for kind in 0..2 {
        let limit = limits[kind];
        if limit <= 0.0 {
            continue;
        }
        let floor = floor(params.floor_fraction, limit, count as u32, units[kind]);
        // Cells that reported the tenant first (by name), then the live cells that have not,
        // each claiming the floor.
        let mut claims: Vec<f64> = cells
            .iter()
            .map(|(_, fresh, held, any_fresh)| {
                let demand = if *any_fresh { fresh[kind] } else { held[kind] };
                demand.max(floor)
            })
            .collect();
        claims.resize(count, floor);
        let slices = allocate(limit, &claims);
        for (share, slice) in shares.iter_mut().zip(slices) {
            let rate = (slice / limit).clamp(0.0, 1.0);
            share[kind] = Share {
                rate,
                burst: rate.max(1.0 / count as f64),
            };
        }
    }
    let shares = cells
        .iter()
        .zip(shares)
        .map(|((cell, ..), [request, ingestion])| {
            (cell.to_string(), TenantShare { request, ingestion })
        })
        .collect();
    (shares, count as u32)
}

/// How one replica's cell sync behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CellSyncConfig {
    /// How long a slice stays in force without a new answer (`--cell-slice-ttl`).
    pub slice_ttl_nanos: u64,
    /// The floor as a fraction of the even share (what a tenant new to the cell gets).
    pub floor_fraction: f64,
    /// The static fallback as a fraction of L and B (`--cell-fallback-floor`); `None`:
    /// `1 ÷ cells`, the cell count the store last reported.
    pub fallback: Option<f64>,
}

/// One replica's memory of the reconciler's answers, with time as an input: which share is
/// in force for each tenant.
#[derive(Debug, Clone)]
pub struct CellSync {
    config: CellSyncConfig,
    /// Per tenant: the last share the store gave and when (engine nanoseconds).
    answers: HashMap<String, (TenantShare, u64)>,
    /// When the store last answered a round.
    last_answer: Option<u64>,
    /// The live cell count the store last reported.
    cells: u32,
}

impl CellSync {
    pub fn new(config: CellSyncConfig) -> CellSync {
        CellSync {
            config,
            answers: HashMap::new(),
            last_answer: None,
            cells: 0,
        }
    }

    /// The store answered this round's heartbeat: `cells` are live.
    pub fn store_answered(&mut self, cells: u32, now: u64) {
        self.cells = cells.max(1);
        self.last_answer = Some(now);
    }

    /// The reconciler gave `tenant` this share.
    pub fn answered(&mut self, tenant: &str, reconciled: Reconciled, now: u64) {
        self.cells = self.cells.max(reconciled.cells);
        match self.answers.get_mut(tenant) {
            Some(answer) => *answer = (reconciled.share, now),
            None => {
                self.answers
                    .insert(tenant.to_string(), (reconciled.share, now));
            }
        }
    }

    /// The cell count the store last reported (0 before its first answer).
    pub fn cells(&self) -> u32 {
        self.cells
    }

    /// Whether the store answered within the slice TTL.
    pub fn store_in_reach(&self, now: u64) -> bool {
        self.last_answer
            .is_some_and(|at| now.saturating_sub(at) <= self.config.slice_ttl_nanos)
    }

    /// The static fallback: `--cell-fallback-floor` of L and B, or `1 ÷ cells` (the whole
    /// limit before the store has ever answered, as no cell count is known).
    pub fn fallback(&self) -> TenantShare {
        match self.config.fallback {
            Some(fraction) => TenantShare::even(fraction),
            None => TenantShare::even(1.0 / self.cells.max(1) as f64),
        }
    }

    /// The shares in force at `now`: each tenant's last answer while it is younger than the
    /// slice TTL; for every other tenant the floor while the store is in reach (the store
    /// keeps a floor for every live cell), else the static fallback. Forgets expired answers.
    pub fn shares(&mut self, now: u64) -> CellShares {
        let ttl = self.config.slice_ttl_nanos;
        self.answers
            .retain(|_, (_, at)| now.saturating_sub(*at) <= ttl);
        let default = if self.store_in_reach(now) {
            let even = 1.0 / self.cells.max(1) as f64;
            TenantShare::even(even).with_rate(even * self.config.floor_fraction)
        } else {
            self.fallback()
        };
        CellShares {
            default,
            cells: self.cells,
            tenants: self
                .answers
                .iter()
                .map(|(tenant, (share, _))| (tenant.clone(), *share))
                .collect(),
        }
    }
}

impl TenantShare {
    /// The same burst shares, with `rate` as both rate shares.
    fn with_rate(mut self, rate: f64) -> TenantShare {
        self.request.rate = rate;
        self.ingestion.rate = rate;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECOND: u64 = 1_000_000_000;

    fn params(live_cells: u32) -> ReconcileParams {
        ReconcileParams {
            fresh_micros: 3_000_000,
            hold_micros: 10_000_000,
            live_cells,
            floor_fraction: 0.05,
        }
    }

    fn report(cell: &str, replica: &str, at_micros: u64, items: f64) -> CellReport {
        CellReport {
            cell: cell.into(),
            replica: replica.into(),
            at_micros,
            demand: [0.0, items],
            spent: [0, 0],
            answered: [0.0; 2],
        }
    }

    /// Every cell's ingestion rate share once all of `reports` are recorded.
    fn shares_after(reports: &[CellReport], now: u64, live: u32) -> HashMap<String, f64> {
        let mut stored = Vec::new();
        for report in reports {
            stored = reconcile(stored, report.clone(), now, [0.0, 10_000.0], params(live)).0;
        }
        let (shares, _) = cell_shares(&stored, now, [0.0, 10_000.0], params(live));
        shares
            .into_iter()
            .map(|(cell, share)| (cell, share.ingestion.rate))
            .collect()
    }

    #[test]
    fn demand_80_20_0_gives_the_small_cell_all_it_wants() {
        // 1.5 L offered: 12 000 in a, 3 000 in b, nothing in c (live, never reported).
        let now = 100_000_000;
        let shares = shares_after(
            &[
                report("a", "a1", now, 6_000.0),
                report("a", "a2", now, 6_000.0),
                report("b", "b1", now, 1_500.0),
                report("b", "b2", now, 1_500.0),
            ],
            now,
            3,
        );
        let floor = 0.05 / 3.0;
        assert!((shares["b"] - 0.3).abs() < 1e-9, "{shares:?}");
        assert!(
            (shares["a"] - (1.0 - 0.3 - floor)).abs() < 1e-9,
            "{shares:?}"
        );
    }

    #[test]
    fn under_the_limit_the_spare_goes_by_claim() {
        let shares = allocate(100.0, &[10.0, 30.0, 0.0]);
        assert!((shares.iter().sum::<f64>() - 100.0).abs() < 1e-9);
        // Claims met (10, 30, 0), then 60 spare split 1:3:0.
        assert!((shares[0] - 25.0).abs() < 1e-9, "{shares:?}");
        assert!((shares[1] - 75.0).abs() < 1e-9, "{shares:?}");
        assert_eq!(allocate(90.0, &[0.0, 0.0, 0.0]), vec![30.0; 3]);
    }

    #[test]
    fn a_killed_replica_stops_counting_once_stale_and_a_silent_cell_is_held() {
        let mut stored = Vec::new();
        for entry in [
            report("a", "a1", 0, 5_000.0),
            report("a", "a2", 0, 5_000.0),
            report("b", "b1", 0, 5_000.0),
        ] {
            stored = reconcile(stored, entry, 0, [0.0, 10_000.0], params(2)).0;
        }
        // 4 s later: a1 died (stale), a2 took its traffic; b is silent (cut off): held.
        let now = 4_000_000;
        let (stored, a) = reconcile(
            stored,
            report("a", "a2", now, 10_000.0),
            now,
            [0.0, 10_000.0],
            params(2),
        );
        assert_eq!(stored.len(), 3, "a1's report is kept until the hold");
        // a claims 10 000 (a2 alone, not a1 + a2), b its held 5 000: half each.
        assert!((a.share.ingestion.rate - 0.5).abs() < 1e-9, "{a:?}");
        // Past the hold (10 s), b and a1 are deleted; a gets it all.
        let now = 11_000_000;
        let (stored, a) = reconcile(
            stored,
            report("a", "a2", now, 10_000.0),
            now,
            [0.0, 10_000.0],
            params(1),
        );
        assert_eq!(stored.len(), 1);
        assert!((a.share.ingestion.rate - 1.0).abs() < 1e-9, "{a:?}");
    }

    #[test]
    fn an_unlimited_request_rate_is_not_sliced_and_bursts_keep_an_even_floor() {
        let (_, answer) = reconcile(
            Vec::new(),
            report("c", "c1", 0, 0.0),
            0,
            [0.0, 10_000.0],
            params(4),
        );
        assert_eq!(answer.share.request, Share::WHOLE);
        assert!(
            (answer.share.ingestion.rate - 0.25).abs() < 1e-9,
            "{answer:?}"
        );
        assert_eq!(answer.cells, 4);
        let (_, answer) = reconcile(
            vec![report("a", "a1", 0, 1e9)],
            report("c", "c1", 0, 0.0),
            0,
            [0.0, 10_000.0],
            params(4),
        );
        assert!((answer.share.ingestion.rate - 0.05 / 4.0).abs() < 1e-9);
        assert_eq!(answer.share.ingestion.burst, 0.25);
    }

    #[test]
    fn apply_slices_rates_and_bursts_and_leaves_shared_alone() {
        let limits = TenantLimits {
            ingestion_rate: 10_000.0,
            ingestion_burst_size: 20_000,
            request_rate: 0.0,
            ..TenantLimits::default()
        };
        let mut shares = CellShares::default();
        assert_eq!(
            shares.apply("t", &limits),
            limits,
            "outside cells: no change"
        );
        shares.tenants.insert(
            "t".into(),
            TenantShare {
                request: Share::even(0.5),
                ingestion: Share {
                    rate: 0.25,
                    burst: 1.0 / 3.0,
                },
            },
        );
        let sliced = shares.apply("t", &limits);
        assert_eq!(sliced.ingestion_rate, 2_500.0);
        assert_eq!(sliced.ingestion_burst_size, 6_667);
        assert_eq!(sliced.request_rate, 0.0, "unlimited stays unlimited");
        let shared = TenantLimits {
            rate_limit_strategy: RateLimitStrategy::Shared,
            ..limits
        };
        assert_eq!(shares.apply("t", &shared), shared);
        shares.default = TenantShare::even(0.0);
        let floor = shares.apply("other", &limits);
        assert!(floor.ingestion_rate > 0.0, "a slice never refuses all");
        assert_eq!(floor.ingestion_burst_size, 1);
    }

    #[test]
    fn the_last_slice_holds_for_the_ttl_then_the_fallback() {
        let mut sync = CellSync::new(CellSyncConfig {
            slice_ttl_nanos: 10 * SECOND,
            floor_fraction: 0.05,
            fallback: None,
        });
        // Before any answer: the whole limit (no cell count known).
        assert_eq!(sync.shares(0).default, TenantShare::WHOLE);
        sync.store_answered(3, SECOND);
        let answer = Reconciled {
            share: TenantShare::even(0.7),
            cells: 3,
        };
        sync.answered("t", answer, SECOND);
        let shares = sync.shares(SECOND);
        assert_eq!(shares.tenants["t"], TenantShare::even(0.7));
        let floor = shares.default;
        assert!((floor.ingestion.rate - 0.05 / 3.0).abs() < 1e-12);
        assert!((floor.ingestion.burst - 1.0 / 3.0).abs() < 1e-12);
        // The store goes away: 10 s of the last slice, then L ÷ 3 for everyone.
        let shares = sync.shares(11 * SECOND);
        assert_eq!(shares.tenants["t"], TenantShare::even(0.7));
        assert_eq!(shares.default, floor);
        let shares = sync.shares(11 * SECOND + 1);
        assert!(shares.tenants.is_empty());
        assert_eq!(shares.default, TenantShare::even(1.0 / 3.0));
        // It returns: the floor again, then a fresh slice.
        sync.store_answered(3, 12 * SECOND);
        assert_eq!(sync.shares(12 * SECOND).default, floor);
        let mut configured = CellSync::new(CellSyncConfig {
            slice_ttl_nanos: SECOND,
            floor_fraction: 0.05,
            fallback: Some(0.25),
        });
        assert_eq!(configured.shares(0).default, TenantShare::even(0.25));
    }

    #[test]
    fn small_moves_do_not_count_as_changes() {
        let mut a = CellShares::default();
        a.tenants.insert("t".into(), TenantShare::even(0.5));
        let mut b = a.clone();
        b.tenants.insert("t".into(), TenantShare::even(0.504));
        assert!(!a.differs(&b, 0.01));
        b.tenants.insert("t".into(), TenantShare::even(0.6));
        assert!(a.differs(&b, 0.01));
        b.tenants.clear();
        assert!(a.differs(&b, 0.01));
    }

    proptest! {
        /// Slices sum to the limit, never exceed a claim while another claim is unmet, and
        /// give every cell at least min(claim, L ÷ n).
        #[test]
        fn allocation_is_max_min_fair_and_sums_to_the_limit(
            limit in 1.0f64..1e6,
            claims in prop::collection::vec(0.0f64..1e6, 1..40),
        ) {
            let slices = allocate(limit, &claims);
            let total: f64 = slices.iter().sum();
            prop_assert!((total - limit).abs() <= 1e-9 * limit.max(1.0), "{total} vs {limit}");
            let even = limit / claims.len() as f64;
            let unmet = claims.iter().zip(&slices).any(|(c, s)| s + 1e-9 * limit < *c);
            for (claim, slice) in claims.iter().zip(&slices) {
                prop_assert!(*slice + 1e-9 * limit >= claim.min(even));
                if unmet {
                    prop_assert!(*slice <= claim + 1e-9 * limit);
                }
            }
        }

        /// Whatever the reports, the cells' shares of a tenant's rate (from one state of
        /// the store) sum to at most 1, exactly 1 when every live cell has reported, each is
        /// at least the floor, and a cell's share grows with its demand.
        #[test]
        fn shares_sum_to_one_at_most_and_keep_the_floor(
            demands in prop::collection::vec((0usize..5, 0usize..3, 0.0f64..30_000.0, 0u64..10), 1..20),
            live in 0u32..8,
            floor_fraction in 0.0f64..0.5,
            grown in 0usize..5,
        ) {
            let params = ReconcileParams { floor_fraction, ..params(live) };
            let now = 12_000_000;
            let mut reports: Vec<CellReport> = Vec::new();
            for (cell, replica, demand, age) in &demands {
                reports.retain(|old| !(old.cell == format!("c{cell}") && old.replica == format!("r{replica}")));
                reports.push(CellReport {
                    cell: format!("c{cell}"),
                    replica: format!("r{replica}"),
                    at_micros: now - age * 1_000_000,
                    demand: [0.0, *demand],
                    spent: [0, 0],
                    answered: [0.0; 2],
                });
            }
            let (shares, counted) = cell_shares(&reports, now, [0.0, 10_000.0], params);
            let total: f64 = shares.iter().map(|(_, share)| share.ingestion.rate).sum();
            prop_assert!(total <= 1.0 + 1e-9, "{total}");
            if counted as usize == shares.len() {
                prop_assert!((total - 1.0).abs() <= 1e-9, "{total}");
            }
            for (_, share) in &shares {
                prop_assert!(share.ingestion.rate + 1e-12 >= floor_fraction / counted as f64);
                prop_assert!(share.ingestion.burst + 1e-12 >= 1.0 / counted as f64);
                prop_assert_eq!(share.request, Share::WHOLE);
            }
            // More demand in one cell (all its reports) never means a smaller share for it.
            let cell = format!("c{grown}");
            if let Some((_, before)) = shares.iter().find(|(name, _)| *name == cell) {
                let more: Vec<CellReport> = reports
                    .iter()
                    .cloned()
                    .map(|mut r| {
                        if r.cell == cell {
                            r.demand[1] += 5_000.0;
                        }
                        r
                    })
                    .collect();
                let (after, _) = cell_shares(&more, now, [0.0, 10_000.0], params);
                let after = after.iter().find(|(name, _)| *name == cell).unwrap().1;
                prop_assert!(after.ingestion.rate + 1e-9 >= before.ingestion.rate);
            }
        }

        /// An in-flight cap splits into whole slots: the cells' slots never sum past the cap;
        /// every live cell holds one when the cap has one for each; and a cell that wants no
        /// more than an even share gets every slot it wants.
        #[test]
        fn an_in_flight_cap_splits_into_whole_slots_within_the_cap(
            cap in 1u64..80,
            wanted in prop::collection::vec(0u64..50, 1..6),
            idle in 0u32..3,
            floor_fraction in 0.0f64..0.3,
        ) {
            let reports: Vec<CellReport> = wanted
                .iter()
                .enumerate()
                .map(|(cell, slots)| CellReport {
                    cell: format!("c{cell}"),
                    replica: "r".into(),
                    at_micros: 0,
                    demand: [0.0, *slots as f64],
                    spent: [0, 0],
                    answered: [0.0; 2],
                })
                .collect();
            let live = wanted.len() as u32 + idle;
            let params = ReconcileParams { live_cells: live, floor_fraction, ..params(live) };
            let (shares, counted) = cell_shares(&reports, 0, SubjectLimits::key(0.0, cap), params);
            prop_assert_eq!(counted, live);
            let spec = LimitSpec {
                algorithm: runtime_config::Algorithm::TokenBucket,
                rate: 0.0,
                burst: 0,
                window: std::time::Duration::from_secs(1),
                max_concurrent: cap,
            };
            let slots_of = |share: Option<TenantShare>| {
                let mut in_force = CellShares { default: TenantShare::even(floor_fraction / live as f64), cells: live, ..CellShares::default() };
                if let Some(share) = share {
                    in_force.tenants.insert("t/k".into(), share);
                }
                in_force.apply_key("t/k", &spec, RateLimitStrategy::Weighted).max_concurrent
            };
            let slots: Vec<u64> = shares.iter().map(|(_, share)| slots_of(Some(*share))).collect();
            // The idle cells hold the default (floor) share until they report.
            let total = slots.iter().sum::<u64>() + u64::from(idle) * slots_of(None);
            prop_assert!(total <= cap, "{slots:?} + {idle} idle of {cap}");
            let even = cap as f64 / live as f64;
            for (cell, got) in slots.iter().enumerate() {
                if cap >= u64::from(live) {
                    prop_assert!(*got >= 1, "{slots:?} of {cap}");
                }
                if (wanted[cell] as f64) <= even.floor() {
                    prop_assert!(*got >= wanted[cell], "{slots:?} for {wanted:?} of {cap}");
                }
            }
        }

        /// Whatever order replicas of cells report in, and however their demands move, the
        /// shares of an in-flight cap in force (each replica's last answer; an unreported live
        /// cell's floor) never sum past the cap.
        #[test]
        fn in_flight_shares_in_force_never_sum_past_the_cap(
            steps in prop::collection::vec((0usize..4, 0usize..2, 0u64..40), 1..30),
            cap in 1u64..60,
            live in 1u32..5,
            floor_fraction in 0.0f64..0.3,
        ) {
            let params = ReconcileParams { live_cells: live, floor_fraction, ..params(live) };
            let limits = SubjectLimits::key(0.0, cap);
            let mut stored: Vec<CellReport> = Vec::new();
            for (step, (cell, replica, slots)) in steps.into_iter().enumerate() {
                let entry = CellReport {
                    cell: format!("c{cell}"),
                    replica: format!("r{replica}"),
                    at_micros: 0,
                    demand: [0.0, slots as f64],
                    spent: [0, 0],
                    answered: [0.0; 2],
                };
                let (kept, reconciled) = reconcile(stored, entry, step as u64, limits, params);
                stored = kept;
                let mut held: HashMap<&str, f64> = HashMap::new();
                for report in &stored {
                    let share = held.entry(&report.cell).or_insert(0.0);
                    *share = share.max(report.answered[1]);
                }
                let cells = reconciled.cells;
                let unreported = cells.saturating_sub(held.len() as u32);
                let floor_share = floor(floor_fraction, cap as f64, cells, 1.0) / cap as f64;
                let total = held.values().sum::<f64>() + f64::from(unreported) * floor_share;
                prop_assert!(total <= 1.0 + 1e-9, "{total}: {held:?}, {unreported} unreported");
            }
        }
    }
}

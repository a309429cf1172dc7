//! weir-cells-sim: cells at 1×–1 000×, by deterministic simulation on the engine's own code.
//!
//! ```text
//! cargo run --release --bin weir-cells-sim            # every row (about a minute)
//! cargo run --release --bin weir-cells-sim -- --only "1000 × 50"
//! cargo run --release --bin weir-cells-sim -- --only "100 × 3" --explain --burst-seconds 2
//! ```
//!
//! Time is simulated (one `FakeRelativeClock` for everything, steps of 100 ms), and nothing
//! is random but the seeded placement of tenants. What runs is weir's:
//! - each cell's admission is an [`engine::Limiter`] with cells on (`with_cells`), checking
//!   every push against the tenant's slice (the bucket and limit maths, `CellShares::apply`);
//! - every sync interval each cell reports each tenant it was offered, as `src/cells.rs` does
//!   (the demand smoothed by half per round, a tenant gone quiet reported once more), to
//!   [`engine::cells::reconcile`], the pure twin of `cell_slice.lua`, over a per-tenant table
//!   standing in for the store's hash, and puts the answers in force through
//!   [`engine::CellSync`] (last slice for the TTL, then the fallback) exactly as the sync task
//!   does, changes under 1 % ignored;
//! - the cell registry (`cell_heartbeat.lua`): a cell is live while it heartbeated within the
//!   slice TTL.
//!
//! A cell's replicas are identical here (the balancer spreads each tenant evenly), so one
//! report per cell and tenant stands for its R replicas' reports, whose sum the script uses:
//! the slices are the same. Store operations, bytes and the script's work are counted for R.
//!
//! Gossip is not simulated packet by packet: a replica's usage key is encoded by
//! `ring::usage::encode` with the cap `ring::node` gives it at that ring size, and the bytes a
//! replica receives per gossip round are modelled as the peers' keys (what it must hear) plus
//! chitchat's digests (3 peers each way, each digest one line per member), at most what 6
//! datagrams carry. `scripts/ring-scale.py` measures the real cost on real processes; see
//! docs/cells.md for the comparison.
//!
//! Every tenant's burst is Mimir's default ratio, 20 s of its rate (`--burst-seconds`), and
//! its buckets start empty (a tenant long over its limit).
//!
//! Accuracy is judged as in the rest of the project: what a tenant's cells admit ÷ what one
//! ideal bucket of rate L and burst B admits of the same pushes (empty at 0 s too). Over a
//! window of t seconds each cell's bucket admits ∫ its rate + the tokens it held at the start
//! − those it holds at the end, so a tenant's cells admit at most ∫ Σ rates in force + Σ
//! tokens held at the start ≤ L·t + Σ B_c (L·t × (1 + 1 ÷ cells) once a cut cell falls back),
//! with Σ B_c < 2 B. Each row reports the worst tenant's admissions split that way: the rates
//! in force are what the slices bound; the tokens drawn are bursts its cells saved while their
//! slice exceeded their arrivals (a cell's burst is at least B ÷ cells), which one bucket would
//! not have saved: with B = 20 s of L and windows of 5–8 s they are most of the excess, and
//! they vanish with a small burst. `--explain` prints the ledgers of the tenants admitted
//! most. The scenario of every row: 10 000 tenants with Zipf sizes (limit L_r = 10^6 ÷ r items/s,
//! at least 100), one in four (and the top 10) offered 1.5 L, the others 0.6 L; a tenant is
//! offered in `min(cells, max(2, ⌈100 ÷ r^0.7⌉))` cells chosen at random (seed 1), its demand
//! Zipf over them. At 15 s every tenant's heaviest cell's demand moves to a cell that had
//! none (the shift); from 30 s to 50 s the cell holding the most over-limit demand is cut
//! from the store (the failure).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use engine::cells::{reconcile, CellReport, ReconcileParams};
use engine::{CellShares, CellSync, CellSyncConfig, LimitKind, Limiter, NoHooks, Tenant};
use governor::clock::FakeRelativeClock;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};
use runtime_config::{Defaults, RuntimeConfig};

#[derive(Parser)]
#[command(
    name = "weir-cells-sim",
    about = "Cells at 1×–1000×, simulated on weir's own engine"
)]
struct Args {
    /// Only the rows whose topology contains this (e.g. "1000 × 50").
    #[arg(long)]
    only: Option<String>,
    #[arg(long, default_value_t = 10_000)]
    tenants: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print, every simulated second, the over-limit tenants' admitted ÷ L and the cut cell's
    /// admitted (items/s).
    #[arg(long)]
    trace: bool,
    /// Each tenant's burst, in seconds of its rate (Mimir's default ratio is 20).
    #[arg(long, default_value_t = 20.0)]
    burst_seconds: f64,
    /// Print, for the tenants admitted most in the steady and fallback windows, where their
    /// admissions came from: the rates in force, the tokens drawn from their cells' buckets,
    /// and what one ideal bucket (L, B) admits of the same offered pushes.
    #[arg(long)]
    explain: bool,
}

/// One row of the table.
struct Topology {
    scale: &'static str,
    cells: usize,
    replicas: usize,
}

const TOPOLOGIES: [Topology; 9] = [
    Topology {
        scale: "1×",
        cells: 1,
        replicas: 3,
    },
    Topology {
        scale: "10×",
        cells: 1,
        replicas: 30,
    },
    Topology {
        scale: "10×",
        cells: 10,
        replicas: 3,
    },
    Topology {
        scale: "100×",
        cells: 1,
        replicas: 300,
    },
    Topology {
        scale: "100×",
        cells: 10,
        replicas: 30,
    },
    Topology {
        scale: "100×",
        cells: 100,
        replicas: 3,
    },
    Topology {
        scale: "1000×",
        cells: 100,
        replicas: 30,
    },
    Topology {
        scale: "1000×",
        cells: 1000,
        replicas: 3,
    },
    Topology {
        scale: "16 667×",
        cells: 1000,
        replicas: 50,
    },
];

/// weir's defaults: `--cell-sync-interval`, `--cell-slice-ttl`, `--cell-floor`,
/// `--gossip-interval`.
const INTERVAL: f64 = 1.0;
const TTL: f64 = 10.0;
const FLOOR: f64 = 0.05;
const GOSSIP_INTERVAL: f64 = 0.2;
/// As `src/cells.rs`: the smoothing of the demand, a report counts this many intervals.
const SMOOTHING: f64 = 0.5;
const FRESH_ROUNDS: f64 = 3.0;
const RELATIVE_CHANGE: f64 = 0.01;

/// A push carries L ÷ 60 items (a tenant of 10 000 items/s sends pushes of 166), so even the
/// smallest burst slice, B ÷ 1 000 cells, holds one.
const PUSHES_PER_LIMIT: f64 = 60.0;

const STEP: f64 = 0.1;
const SHIFT_AT: f64 = 15.0;
const CUT_FROM: f64 = 30.0;
const CUT_TO: f64 = 50.0;
const END: f64 = 60.0;

/// `ring::node`'s caps on a replica's usage key (see `publish_usage`).
const MAX_USAGE_BYTES_ALL: usize = 48 * 1024;
const MAX_USAGE_BYTES: usize = 24 * 1024;
const MIN_USAGE_BYTES: usize = 4 * 1024;
/// chitchat: peers per round, and the datagram.
const GOSSIP_FANOUT: usize = 3;
const DATAGRAM: usize = 65_507;
/// One member's line in a chitchat digest (node id of ~30 bytes, generation, heartbeat,
/// versions), calibrated on real processes by `scripts/ring-scale.py`.
const DIGEST_BYTES_PER_MEMBER: usize = 60;

struct TenantSpec {
    name: String,
    limit: f64,
    over: bool,
    demand: f64,
    burst: f64,
    push: u64,
}

/// A tenant in a cell: its fraction of the tenant's demand before and after the shift.
struct Pair {
    tenant: usize,
    cell: usize,
    before: f64,
    after: f64,
    credit: f64,
    handle: Option<Arc<Tenant<(), FakeRelativeClock>>>,
    /// The rate and burst this cell enforces for the tenant now (its slice).
    rate: f64,
    burst: f64,
    /// Admitted per step over the last second (a ring of 1 ÷ STEP slots).
    window: [u64; 10],
    window_sum: u64,
}

/// What a cell reported of a tenant (as `src/cells.rs`'s `Reported`).
struct Reported {
    offered: u64,
    demand: f64,
    busy: bool,
}

struct Cell {
    limiter: Limiter<NoHooks, FakeRelativeClock>,
    sync: CellSync,
    reported: HashMap<String, Reported>,
    last_heartbeat: f64,
}

fn placement(args: &Args, cells: usize) -> (Vec<TenantSpec>, Vec<Pair>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let mut tenants = Vec::with_capacity(args.tenants);
    let mut pairs = Vec::new();
    for rank in 1..=args.tenants {
        let limit = (1e6 / rank as f64).max(100.0).round();
        let over = rank <= 10 || rank % 4 == 0;
        tenants.push(TenantSpec {
            name: format!("tenant-{rank:05}"),
            limit,
            over,
            demand: limit * if over { 1.5 } else { 0.6 },
            burst: (limit * args.burst_seconds).max(1.0),
            push: ((limit / PUSHES_PER_LIMIT) as u64).max(1),
        });
        let spread = ((100.0 / (rank as f64).powf(0.7)).ceil() as usize)
            .max(2)
            .min(cells);
        let chosen = sample(&mut rng, cells, spread).into_vec();
        let weights: Vec<f64> = (1..=spread).map(|j| 1.0 / j as f64).collect();
        let total: f64 = weights.iter().sum();
        let mut fractions: Vec<(usize, f64, f64)> = chosen
            .iter()
            .zip(&weights)
            .map(|(&cell, w)| (cell, w / total, w / total))
            .collect();
        // The shift: the heaviest cell's demand moves to a cell that had none (or, when the
        // tenant is in every cell, to its lightest).
        if cells > 1 {
            let moved = fractions[0].1;
            fractions[0].2 = 0.0;
            if spread < cells {
                let target = loop {
                    let cell = rng.random_range(0..cells);
                    if !chosen.contains(&cell) {
                        break cell;
                    }
                };
                fractions.push((target, 0.0, moved));
            } else {
                fractions.last_mut().unwrap().2 += moved;
            }
        }
        for (cell, before, after) in fractions {
            pairs.push(Pair {
                tenant: rank - 1,
                cell,
                before,
                after,
                credit: 0.0,
                handle: None,
                rate: 0.0,
                burst: 0.0,
                window: [0; 10],
                window_sum: 0,
            });
        }
    }
    (tenants, pairs)
}

fn overrides(tenants: &[TenantSpec]) -> Arc<RuntimeConfig> {
    let mut yaml = String::from("overrides:\n");
    for tenant in tenants {
        yaml.push_str(&format!(
            "  {}:\n    ingestion_rate: {}\n    ingestion_burst_size: {}\n    request_rate: 0\n    rate_limit_strategy: weighted\n",
            tenant.name, tenant.limit, tenant.burst as u64
        ));
    }
    Arc::new(RuntimeConfig::parse(&yaml, Defaults::default()).expect("the overrides parse"))
}

/// The oracle of the shift: the water level at which `limit` is met by `demands` (each cell
/// gets min(demand, level)), by bisection, so it shares no code with `allocate`.
fn ideal(limit: f64, demands: &[f64]) -> Vec<f64> {
    if demands.iter().sum::<f64>() <= limit {
        return demands.to_vec();
    }
    let (mut low, mut high) = (0.0, limit);
    for _ in 0..100 {
        let level = (low + high) / 2.0;
        if demands.iter().map(|d| d.min(level)).sum::<f64>() > limit {
            high = level;
        } else {
            low = level;
        }
    }
    demands.iter().map(|d| d.min(low)).collect()
}

/// A RESP array of these arguments: its length in bytes.
fn resp_len(args: &[&str]) -> usize {
    let mut bytes = format!("*{}\r\n", args.len()).len();
    for arg in args {
        bytes += format!("${}\r\n", arg.len()).len() + arg.len() + 2;
    }
    bytes
}

#[derive(Default)]
struct Row {
    replicas: usize,
    tenants_per_replica: f64,
    store_ops: f64,
    store_bytes_per_cell: f64,
    hottest_fields: f64,
    registry_calls: f64,
    gossip_key_bytes: usize,
    gossip_listed: f64,
    gossip_bytes: f64,
    gossip_round_datagrams: f64,
    steady: f64,
    worst_tenant: (f64, f64),
    converge: Option<f64>,
    cut_held: f64,
    cut_fallback: f64,
    others_during: f64,
    over_peak: f64,
    worst_tenant_cut: f64,
    /// The tenant admitted most (÷ its ideal bucket), steady and after the cut's TTL: its
    /// rates in force and the tokens its cells' buckets gave up, each ÷ L × the window.
    worst_split: (f64, f64),
    worst_cut_split: (f64, f64),
    /// The highest ∫ Σ rates in force ÷ L × the window over the over-limit tenants: steady,
    /// after the cut's TTL.
    rates_max: (f64, f64),
    /// Tenants that admitted more than the burst-inclusive bound in either window: L·t
    /// (L·t × (1 + 1 ÷ cells) after the cut's TTL) plus the bursts in force at its start.
    over_bound: usize,
    /// `--explain`: the ledgers of the tenants admitted most, per window.
    explain: Vec<String>,
    wall: f64,
}

/// One tenant over one window: what its cells admitted and where it came from. For every
/// cell's bucket, admitted = ∫ rate + (tokens at the start − tokens at the end) − what
/// overflowed a full bucket, so over the cells: admitted ≤ ∫ Σ rates + Σ tokens held at the
/// start ≤ ∫ Σ rates + Σ bursts.
#[derive(Default, Clone)]
struct Ledger {
    admitted: f64,
    /// ∫ Σ over the tenant's cells of the rate in force (items).
    rates: f64,
    /// The highest Σ of the rates in force at any moment of the window, ÷ L.
    peak_rates: f64,
    tokens_start: f64,
    tokens_end: f64,
    /// Σ of the bursts in force at the start (the most the buckets could have held).
    bursts_start: f64,
    /// What one bucket of rate L and burst B, fed the same pushes from 0 s (empty, as the
    /// cells' buckets start), admits in the window.
    ideal: f64,
}

/// A window of the run in which each tenant's admissions are accounted.
struct Window {
    from: f64,
    to: f64,
    ledgers: Vec<Ledger>,
}

impl Window {
    fn new(from: f64, to: f64, tenants: usize) -> Window {
        Window {
            from,
            to,
            ledgers: vec![Ledger::default(); tenants],
        }
    }

    fn contains(&self, t: f64) -> bool {
        (self.from..self.to).contains(&t)
    }

    fn seconds(&self) -> f64 {
        self.to - self.from
    }
}

/// The tokens each of a cell's tenants holds now (a full bucket holds its burst).
fn tokens(cell: &Cell) -> HashMap<String, f64> {
    cell.limiter
        .usage_reports()
        .into_iter()
        .map(|report| (report.tenant, report.items_level.unwrap_or(f64::NAN)))
        .collect()
}

/// The rate and burst a cell enforces for `tenant` now.
fn slice(shares: &CellShares, tenant: &TenantSpec) -> (f64, f64) {
    let share = shares
        .tenants
        .get(&tenant.name)
        .unwrap_or(&shares.default)
        .ingestion;
    (
        tenant.limit * share.rate.clamp(1e-6, 1.0),
        (tenant.burst * share.burst.clamp(0.0, 1.0)).ceil().max(1.0),
    )
}

fn simulate(args: &Args, topology: &Topology) -> Row {
    let wall = Instant::now();
    let cells_on = topology.cells > 1;
    let (tenants, mut pairs) = placement(args, topology.cells);
    let config = overrides(&tenants);
    let clock = FakeRelativeClock::default();
    let sync_config = CellSyncConfig {
        slice_ttl_nanos: (TTL * 1e9) as u64,
        floor_fraction: FLOOR,
        fallback: None,
    };
    let mut cells: Vec<Cell> = (0..topology.cells)
        .map(|_| {
            let limiter = Limiter::with_clock(
                Arc::clone(&config),
                Duration::from_secs(3600),
                NoHooks,
                clock.clone(),
            );
            Cell {
                limiter: if cells_on {
                    limiter.with_cells()
                } else {
                    limiter
                },
                sync: CellSync::new(sync_config),
                reported: HashMap::new(),
                last_heartbeat: f64::NEG_INFINITY,
            }
        })
        .collect();
    let params = ReconcileParams {
        fresh_micros: (FRESH_ROUNDS * INTERVAL * 1e6) as u64,
        hold_micros: (TTL * 1e6) as u64,
        live_cells: 0,
        floor_fraction: FLOOR,
    };
    // The store: per tenant, its reports (the hash `weir:{tenant}:cells`).
    let mut store: HashMap<String, Vec<CellReport>> = HashMap::new();
    let index: HashMap<&str, usize> = tenants
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();

    // The failed cell: the one with the most over-limit demand after the shift.
    let mut over_demand = vec![0.0; topology.cells];
    for pair in &pairs {
        let tenant = &tenants[pair.tenant];
        if tenant.over {
            over_demand[pair.cell] += tenant.demand * pair.after;
        }
    }
    let cut_cell = (0..topology.cells)
        .max_by(|a, b| over_demand[*a].total_cmp(&over_demand[*b]))
        .unwrap();
    // The shift's oracle: each pair's ideal rate after it.
    let mut demands_after: Vec<Vec<(usize, f64)>> = vec![Vec::new(); tenants.len()];
    for (i, pair) in pairs.iter().enumerate() {
        let tenant = &tenants[pair.tenant];
        demands_after[pair.tenant].push((i, tenant.demand * pair.after));
    }
    let mut ideal_after = vec![0.0; pairs.len()];
    for (t, list) in demands_after.iter().enumerate() {
        let demands: Vec<f64> = list.iter().map(|(_, d)| *d).collect();
        for ((i, _), rate) in list.iter().zip(ideal(tenants[t].limit, &demands)) {
            ideal_after[*i] = rate;
        }
    }
    let new_pairs: Vec<usize> = (0..pairs.len())
        .filter(|&i| pairs[i].before == 0.0 && pairs[i].after > 0.0)
        .collect();
    let new_ideal: f64 = new_pairs.iter().map(|&i| ideal_after[i]).sum();
    let over_limit: f64 = tenants.iter().filter(|t| t.over).map(|t| t.limit).sum();

    let mut row = Row {
        replicas: topology.cells * topology.replicas,
        ..Row::default()
    };
    // Windows: steady [25, 30) (also "before the cut"), fallback [CUT_FROM + TTL + 2, CUT_TO)
    // (per tenant in `windows` below), held [CUT_FROM + 1, CUT_FROM + TTL).
    let (mut cut_before, mut cut_held, mut cut_fallback) = (0u64, 0u64, 0u64);
    let (mut others_before, mut others_during) = (0u64, 0u64);
    let mut over_peak: f64 = 0.0;
    let mut converged: Option<f64> = None;
    let (mut ops, mut bytes, mut fields, mut rounds) = (0.0, 0.0, 0.0, 0usize);
    let mut hottest: HashMap<usize, f64> = HashMap::new();
    // Buckets start empty, as for tenants long over their limits (a full 20 s burst in every
    // cell at once would take most of the run to drain). Cells a tenant is new to at the
    // shift start full, as in weir.
    for pair in pairs.iter_mut().filter(|p| p.before > 0.0) {
        let tenant = &tenants[pair.tenant];
        let cell = &cells[pair.cell];
        let handle = cell.limiter.tenant(&tenant.name).unwrap();
        let _ = cell
            .limiter
            .check(&handle, LimitKind::Ingestion, tenant.burst as u64);
        pair.handle = Some(handle);
    }
    let steps = (END / STEP).round() as usize;
    let per_second = (1.0 / STEP).round() as usize;
    let sync_every = (INTERVAL / STEP).round() as usize;
    // The ledgers of the steady and fallback windows, the slices each cell enforces, and one
    // ideal bucket per tenant (its tokens, empty at 0 s).
    let mut windows = [
        Window::new(25.0, 30.0, tenants.len()),
        Window::new(CUT_FROM + TTL + 2.0, CUT_TO, tenants.len()),
    ];
    let whole = CellShares::default();
    for pair in pairs.iter_mut() {
        (pair.rate, pair.burst) = slice(&whole, &tenants[pair.tenant]);
    }
    let mut rates_now: Vec<f64> = tenants.iter().map(|_| 0.0).collect();
    for pair in &pairs {
        rates_now[pair.tenant] += pair.rate;
    }
    let mut ideal_tokens = vec![0.0f64; tenants.len()];
    for step in 0..steps {
        let t = step as f64 * STEP;
        let shifted = t >= SHIFT_AT;
        let cut = cells_on && (CUT_FROM..CUT_TO).contains(&t);
        for (tokens, tenant) in ideal_tokens.iter_mut().zip(&tenants) {
            *tokens = (*tokens + tenant.limit * STEP).min(tenant.burst);
        }
        for window in windows.iter_mut() {
            let at_start = (t - window.from).abs() < STEP / 2.0;
            let at_end = (t - window.to).abs() < STEP / 2.0;
            if !(at_start || at_end) {
                continue;
            }
            let held: Vec<HashMap<String, f64>> = cells.iter().map(tokens).collect();
            for pair in &pairs {
                let tenant = &tenants[pair.tenant];
                let level = held[pair.cell].get(&tenant.name).map_or(pair.burst, |l| {
                    if l.is_nan() {
                        pair.burst
                    } else {
                        *l
                    }
                });
                let ledger = &mut window.ledgers[pair.tenant];
                if at_start {
                    ledger.tokens_start += level;
                    ledger.bursts_start += pair.burst;
                } else {
                    ledger.tokens_end += level;
                }
            }
        }
        for window in windows.iter_mut().filter(|w| w.contains(t)) {
            for (ledger, (rates, tenant)) in window
                .ledgers
                .iter_mut()
                .zip(rates_now.iter().zip(&tenants))
            {
                ledger.rates += rates * STEP;
                ledger.peak_rates = ledger.peak_rates.max(rates / tenant.limit);
            }
        }
        // The traffic of this step, checked by each cell's limiter.
        let slot = step % per_second;
        for pair in pairs.iter_mut() {
            let tenant = &tenants[pair.tenant];
            let fraction = if shifted { pair.after } else { pair.before };
            pair.credit += tenant.demand * fraction * STEP;
            let cell = &cells[pair.cell];
            let mut admitted = 0;
            let mut ideal = 0;
            while pair.credit >= tenant.push as f64 {
                pair.credit -= tenant.push as f64;
                let ideal_tokens = &mut ideal_tokens[pair.tenant];
                if *ideal_tokens >= tenant.push as f64 {
                    *ideal_tokens -= tenant.push as f64;
                    ideal += tenant.push;
                }
                let handle = pair
                    .handle
                    .get_or_insert_with(|| cell.limiter.tenant(&tenant.name).unwrap());
                if cell
                    .limiter
                    .check(handle, LimitKind::Ingestion, tenant.push)
                    .is_ok()
                {
                    admitted += tenant.push;
                }
            }
            pair.window_sum = pair.window_sum - pair.window[slot] + admitted;
            pair.window[slot] = admitted;
            for window in windows.iter_mut().filter(|w| w.contains(t)) {
                let ledger = &mut window.ledgers[pair.tenant];
                ledger.admitted += admitted as f64;
                ledger.ideal += ideal as f64;
            }
            if (25.0..30.0).contains(&t) {
                if pair.cell == cut_cell {
                    cut_before += admitted;
                } else {
                    others_before += admitted;
                }
            }
            if (CUT_FROM..CUT_TO).contains(&t) && pair.cell != cut_cell {
                others_during += admitted;
            }
            if pair.cell == cut_cell && (CUT_FROM + 1.0..CUT_FROM + TTL).contains(&t) {
                cut_held += admitted;
            }
            if (CUT_FROM + TTL + 2.0..CUT_TO).contains(&t) && pair.cell == cut_cell {
                cut_fallback += admitted;
            }
        }
        // Window figures, once a full second is in the windows.
        if step + 1 >= per_second {
            let end = t + STEP;
            if shifted && converged.is_none() && end >= SHIFT_AT + 1.0 {
                let admitted: u64 = new_pairs.iter().map(|&i| pairs[i].window_sum).sum();
                if admitted as f64 >= 0.9 * new_ideal {
                    converged = Some(end - SHIFT_AT);
                }
            }
            let whole_second = (step + 1) % per_second == 0;
            if (end > CUT_FROM + 1.0 && end <= CUT_TO + 5.0) || (args.trace && whole_second) {
                let admitted: u64 = pairs
                    .iter()
                    .filter(|p| tenants[p.tenant].over)
                    .map(|p| p.window_sum)
                    .sum();
                let global = admitted as f64 / over_limit;
                if end > CUT_FROM + 1.0 && end <= CUT_TO + 5.0 {
                    over_peak = over_peak.max(global);
                }
                if args.trace && whole_second {
                    let cut: u64 = pairs
                        .iter()
                        .filter(|p| p.cell == cut_cell)
                        .map(|p| p.window_sum)
                        .sum();
                    eprintln!(
                        "t {end:>4.1} s: over-limit admitted ÷ L {global:.3}, cut cell {cut}/s"
                    );
                }
            }
        }
        clock.advance(Duration::from_secs_f64(STEP));
        if !cells_on || (step + 1) % sync_every != 0 {
            continue;
        }
        // A sync round: every cell not cut heartbeats, then reports each due tenant.
        let now = t + STEP;
        let now_nanos = (now * 1e9) as u64;
        let now_micros = (now * 1e6) as u64;
        for (i, cell) in cells.iter_mut().enumerate() {
            if !(cut && i == cut_cell) {
                cell.last_heartbeat = now;
            }
        }
        let live = cells
            .iter()
            .filter(|c| now - c.last_heartbeat <= TTL)
            .count() as u32;
        let measuring = (20.0..30.0).contains(&now);
        for (i, cell) in cells.iter_mut().enumerate() {
            let name = format!("c{i}");
            let usage = cell.limiter.cell_usage();
            if cut && i == cut_cell {
                // Its calls fail; its memory of the store decides what holds.
                let shares = cell.sync.shares(now_nanos);
                if shares.differs(&cell.limiter.cell_shares(), RELATIVE_CHANGE) {
                    cell.limiter.set_cell_shares(Arc::new(shares));
                }
                continue;
            }
            cell.sync.store_answered(live, now_nanos);
            let heartbeat = resp_len(&[
                "EVALSHA",
                &"0".repeat(40),
                "1",
                "weir:cells",
                &name,
                "10000000",
            ]) + 4;
            if measuring {
                ops += topology.replicas as f64;
                bytes += (topology.replicas * heartbeat) as f64;
            }
            let mut seen = Vec::with_capacity(usage.len());
            for tenant_usage in usage {
                seen.push(tenant_usage.tenant.clone());
                // As `src/cells.rs`'s `reports_due`, for the items (requests are unlimited).
                let before = cell.reported.get(&tenant_usage.tenant);
                let delta = tenant_usage.offered[1] - before.map_or(0, |r| r.offered);
                let busy = delta != 0;
                if !(busy || before.is_some_and(|r| r.busy)) {
                    continue;
                }
                let measured = delta as f64 / INTERVAL;
                let demand = match before {
                    Some(before) if busy => before.demand + (measured - before.demand) * SMOOTHING,
                    _ => measured,
                };
                cell.reported.insert(
                    tenant_usage.tenant.clone(),
                    Reported {
                        offered: tenant_usage.offered[1],
                        demand,
                        busy,
                    },
                );
                let report = CellReport {
                    cell: name.clone(),
                    replica: "all".into(),
                    at_micros: 0,
                    demand: [0.0, demand],
                    spent: tenant_usage.spent,
                    answered: [0.0; 2],
                };
                let limits = [0.0, tenant_usage.limits.ingestion_rate];
                let stored = store.remove(&tenant_usage.tenant).unwrap_or_default();
                let (kept, reconciled) = reconcile(
                    stored,
                    report,
                    now_micros,
                    limits,
                    ReconcileParams {
                        live_cells: live,
                        ..params
                    },
                );
                if measuring {
                    // R calls, each reading every replica's field of the tenant.
                    let read = (kept.len() * topology.replicas) as f64;
                    ops += topology.replicas as f64;
                    fields += topology.replicas as f64 * read;
                    let tenant = index[tenant_usage.tenant.as_str()];
                    *hottest.entry(tenant).or_default() += topology.replicas as f64 * read;
                    let key = format!("weir:{{{}}}:cells", tenant_usage.tenant);
                    let demand = format!("{demand}");
                    let limit = format!("{}", limits[1]);
                    let spent = format!("{}", tenant_usage.spent[1] / topology.replicas as u64);
                    let request = resp_len(&[
                        "EVALSHA",
                        &"0".repeat(40),
                        "1",
                        &key,
                        &name,
                        "replica-00",
                        "3000000",
                        "10000000",
                        "1000",
                        "0.05",
                        "0",
                        &limit,
                        "0",
                        &demand,
                        "0",
                        &spent,
                    ]);
                    // Four `%.17g` floats and the count.
                    let reply = 4 + 4 * (5 + 19 + 2) + 7;
                    bytes += (topology.replicas * (request + reply)) as f64;
                }
                store.insert(tenant_usage.tenant.clone(), kept);
                cell.sync
                    .answered(&tenant_usage.tenant, reconciled, now_nanos);
            }
            let seen: std::collections::HashSet<String> = seen.into_iter().collect();
            cell.reported.retain(|tenant, _| seen.contains(tenant));
            let shares: CellShares = cell.sync.shares(now_nanos);
            if shares.differs(&cell.limiter.cell_shares(), RELATIVE_CHANGE) {
                cell.limiter.set_cell_shares(Arc::new(shares));
            }
        }
        if measuring {
            rounds += 1;
        }
        // The slices now in force, for the ledgers.
        let in_force: Vec<Arc<CellShares>> =
            cells.iter().map(|c| c.limiter.cell_shares()).collect();
        rates_now.iter_mut().for_each(|r| *r = 0.0);
        for pair in pairs.iter_mut() {
            (pair.rate, pair.burst) = slice(&in_force[pair.cell], &tenants[pair.tenant]);
            rates_now[pair.tenant] += pair.rate;
        }
    }
    let measured_seconds = rounds as f64 * INTERVAL;
    if cells_on && measured_seconds > 0.0 {
        row.store_ops = ops / measured_seconds;
        row.store_bytes_per_cell = bytes / measured_seconds / topology.cells as f64;
        row.hottest_fields = hottest.values().cloned().fold(0.0, f64::max) / measured_seconds;
        row.registry_calls = (topology.cells * topology.replicas) as f64 / INTERVAL;
        let _ = fields;
    }
    // Accuracy: over-limit tenants, admitted ÷ what one ideal bucket (L, B) admits of the same
    // pushes (the project's measure), all together and per tenant.
    let steady_seconds = 5.0;
    let over: Vec<usize> = (0..tenants.len()).filter(|&t| tenants[t].over).collect();
    let [steady_window, fallback_window] = &windows;
    let sum = |window: &Window, field: fn(&Ledger) -> f64| -> f64 {
        over.iter().map(|&t| field(&window.ledgers[t])).sum()
    };
    row.steady = sum(steady_window, |l| l.admitted) / sum(steady_window, |l| l.ideal);
    // Per tenant: (admitted ÷ ideal, rates in force ÷ L·t, tokens drawn ÷ L·t), the worst
    // tenant's, the best's, and the highest rates in force.
    let accounts = |window: &Window| {
        let seconds = window.seconds();
        let per = |t: usize| {
            let l = &window.ledgers[t];
            let lt = tenants[t].limit * seconds;
            (
                l.admitted / l.ideal.max(1.0),
                l.rates / lt,
                (l.tokens_start - l.tokens_end) / lt,
            )
        };
        let mut worst = (0.0, 0.0, 0.0);
        let mut best = f64::INFINITY;
        let mut rates: f64 = 0.0;
        for &t in &over {
            let account = per(t);
            if account.0 > worst.0 {
                worst = account;
            }
            best = best.min(account.0);
            rates = rates.max(account.1);
        }
        (worst, best, rates)
    };
    let (worst, best, rates_steady) = accounts(steady_window);
    row.worst_tenant = (best, worst.0);
    row.worst_split = (worst.1, worst.2);
    row.rates_max.0 = rates_steady;
    let over_bound = |window: &Window, rate_bound: f64| {
        over.iter()
            .filter(|&&t| {
                let l = &window.ledgers[t];
                l.admitted > rate_bound * tenants[t].limit * window.seconds() + l.bursts_start
            })
            .count()
    };
    row.over_bound = over_bound(steady_window, 1.0);
    row.converge = converged;
    if cells_on {
        let held_seconds = TTL - 1.0;
        let before = cut_before as f64 / steady_seconds;
        row.cut_held = cut_held as f64 / held_seconds / before;
        row.cut_fallback = cut_fallback as f64 / fallback_window.seconds() / before;
        row.others_during =
            (others_during as f64 / (CUT_TO - CUT_FROM)) / (others_before as f64 / steady_seconds);
        row.over_peak = over_peak;
        let (worst, _, rates_cut) = accounts(fallback_window);
        row.worst_tenant_cut = worst.0;
        row.worst_cut_split = (worst.1, worst.2);
        row.rates_max.1 = rates_cut;
        row.over_bound += over_bound(fallback_window, 1.0 + 1.0 / topology.cells as f64);
    }
    if args.explain {
        row.explain = explain(&windows, &tenants, &pairs);
    }
    // Gossip: the usage key of a replica of cell 0 (a typical one), at this ring size.
    let cell = &cells[0];
    let entries: Vec<ring::UsageEntry> = cell
        .limiter
        .usage_reports()
        .into_iter()
        .map(|report| ring::UsageEntry {
            tenant: report.tenant,
            requests: report.requests / topology.replicas as u64,
            items: report.items / topology.replicas as u64,
            requests_level: report.requests_level,
            items_level: report.items_level,
            in_flight: report.in_flight,
        })
        .collect();
    let ring_size = topology.replicas;
    let cap = (MAX_USAGE_BYTES_ALL / ring_size).clamp(MIN_USAGE_BYTES, MAX_USAGE_BYTES);
    let (value, listed) = ring::usage::encode(&entries, cap);
    row.tenants_per_replica = entries.len() as f64;
    row.gossip_key_bytes = value.len();
    row.gossip_listed = if entries.is_empty() {
        1.0
    } else {
        listed as f64 / entries.len() as f64
    };
    // Per round: the peers' keys (what this replica must hear) and 6 digests (3 peers each
    // way), at most 6 datagrams.
    let news = (ring_size - 1) * value.len();
    let digests = 2 * GOSSIP_FANOUT * ring_size * DIGEST_BYTES_PER_MEMBER;
    let per_round = (news + digests).min(2 * GOSSIP_FANOUT * DATAGRAM);
    row.gossip_round_datagrams = (news + digests) as f64 / (2 * GOSSIP_FANOUT * DATAGRAM) as f64;
    row.gossip_bytes = per_round as f64 / GOSSIP_INTERVAL;
    row.wall = wall.elapsed().as_secs_f64();
    row
}

/// The ledgers of the over-limit tenants admitted most in each window, all ÷ L × seconds.
fn explain(windows: &[Window], tenants: &[TenantSpec], pairs: &[Pair]) -> Vec<String> {
    let mut lines = Vec::new();
    for (name, window) in ["steady", "fallback"].iter().zip(windows) {
        let seconds = window.seconds();
        let over: Vec<usize> = (0..tenants.len()).filter(|&t| tenants[t].over).collect();
        let per = |t: usize, value: f64| value / (tenants[t].limit * seconds);
        let worst_rates = over
            .iter()
            .map(|&t| per(t, window.ledgers[t].rates))
            .fold(0.0, f64::max);
        let worst_peak = over
            .iter()
            .map(|&t| window.ledgers[t].peak_rates)
            .fold(0.0, f64::max);
        let above = |limit: f64| {
            over.iter()
                .filter(|&&t| per(t, window.ledgers[t].admitted) > limit)
                .count()
        };
        let above_bound = over
            .iter()
            .filter(|&&t| {
                let l = &window.ledgers[t];
                l.admitted > tenants[t].limit * seconds + l.bursts_start
            })
            .count();
        lines.push(format!(
            "  {name} [{}, {}) s, {} over-limit tenants: admitted > 1.05 L: {}, > 1.10 L: {}, \
             > L·W + Σ bursts: {above_bound}; worst ∫ Σ rates in force ÷ L·W {worst_rates:.3}, \
             highest Σ rates in force at any moment ÷ L {worst_peak:.3}",
            window.from,
            window.to,
            over.len(),
            above(1.05),
            above(1.10),
        ));
        lines.push(
            "    tenant | L/s | B ÷ L s | cells | admitted | ideal bucket | ∫ Σ rates | tokens \
             drawn | overflowed | Σ bursts ÷ L s  (÷ L·W unless stated)"
                .to_string(),
        );
        let mut ranked = over.clone();
        ranked.sort_by(|&a, &b| {
            per(b, window.ledgers[b].admitted).total_cmp(&per(a, window.ledgers[a].admitted))
        });
        for &t in ranked.iter().take(6) {
            let l = &window.ledgers[t];
            let tenant = &tenants[t];
            let cells = pairs.iter().filter(|p| p.tenant == t).count();
            let drawn = l.tokens_start - l.tokens_end;
            let overflowed = l.rates + drawn - l.admitted;
            lines.push(format!(
                "    {} | {:.0} | {:.1} | {cells} | {:.3} | {:.3} | {:.3} | {:+.3} | {:.3} | {:.1}",
                tenant.name,
                tenant.limit,
                tenant.burst / tenant.limit,
                per(t, l.admitted),
                per(t, l.ideal),
                per(t, l.rates),
                per(t, drawn),
                per(t, overflowed),
                l.bursts_start / tenant.limit,
            ));
        }
    }
    lines
}

fn si(value: f64) -> String {
    match value {
        v if v >= 1e9 => format!("{:.1} G", v / 1e9),
        v if v >= 1e6 => format!("{:.1} M", v / 1e6),
        v if v >= 1e3 => format!("{:.1} k", v / 1e3),
        v => format!("{v:.0}"),
    }
}

fn main() {
    let args = Args::parse();
    println!(
        "weir-cells-sim: {} tenants, sync {INTERVAL} s, slice TTL {TTL} s, floor {FLOOR}, gossip \
         {GOSSIP_INTERVAL} s; shift at {SHIFT_AT} s, one cell cut from {CUT_FROM} s to {CUT_TO} s",
        args.tenants
    );
    println!(
        "| scale | topology | replicas | tenants/replica | store ops/s | store B/s per cell | \
         hottest tenant: fields read/s | registry calls/s | gossip key B (listed) | gossip B/s \
         per replica (rounds of news) | admitted ÷ ideal bucket (worst–best tenant) | worst \
         tenant ÷ L·t: rates in force + tokens drawn | converge after shift | cut cell: held, \
         fallback | others during cut | peak global ÷ L (worst tenant ÷ ideal: rates + tokens) | \
         highest rates in force ÷ L·t: steady, cut | tenants over L·t + ΣB_c | wall |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for topology in &TOPOLOGIES {
        let name = if topology.cells == 1 {
            format!("1 ring × {}", topology.replicas)
        } else {
            format!("{} × {}", topology.cells, topology.replicas)
        };
        if args
            .only
            .as_ref()
            .is_some_and(|only| !name.contains(only.as_str()))
        {
            continue;
        }
        let row = simulate(&args, topology);
        let dash = || "—".to_string();
        let cells_on = topology.cells > 1;
        println!(
            "| {} | {name} | {} | {:.0} | {} | {} | {} | {} | {} ({:.0} %) | {} ({:.2}) | {:.3} ({:.2}–{:.2}) | {:.3} {:+.3} | {} | {} | {} | {} | {} | {} | {:.1} s |",
            topology.scale,
            row.replicas,
            row.tenants_per_replica,
            if cells_on { si(row.store_ops) } else { dash() },
            if cells_on { si(row.store_bytes_per_cell) } else { dash() },
            if cells_on { si(row.hottest_fields) } else { dash() },
            if cells_on { si(row.registry_calls) } else { dash() },
            si(row.gossip_key_bytes as f64),
            row.gossip_listed * 100.0,
            si(row.gossip_bytes),
            row.gossip_round_datagrams,
            row.steady,
            row.worst_tenant.0,
            row.worst_tenant.1,
            row.worst_split.0,
            row.worst_split.1,
            match (cells_on, row.converge) {
                (false, _) => dash(),
                (true, Some(seconds)) => format!("{seconds:.1} s"),
                (true, None) => "never".to_string(),
            },
            if cells_on {
                format!("{:.2}, {:.3}", row.cut_held, row.cut_fallback)
            } else {
                dash()
            },
            if cells_on { format!("{:.3}", row.others_during) } else { dash() },
            if cells_on {
                format!(
                    "{:.3} ({:.2}: {:.3} {:+.3})",
                    row.over_peak,
                    row.worst_tenant_cut,
                    row.worst_cut_split.0,
                    row.worst_cut_split.1
                )
            } else {
                dash()
            },
            if cells_on {
                format!(
                    "{:.3}, {:.3} (≤ 1, {:.3})",
                    row.rates_max.0,
                    row.rates_max.1,
                    1.0 + 1.0 / topology.cells as f64
                )
            } else {
                format!("{:.3}", row.rates_max.0)
            },
            row.over_bound,
            row.wall,
        );
        for line in &row.explain {
            println!("{line}");
        }
    }
}

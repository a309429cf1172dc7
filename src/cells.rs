//! The cell sync (`--cell`): every `--cell-sync-interval`, this replica reports each subject's
//! demand (offered per second since its last report; for an in-flight cap, the most slots
//! wanted at once) and spend (admitted, cumulative) to the store, and gets its cell's slice of
//! the subject's limits back. A subject is a tenant's push limits, or one admission key of a
//! tenant (its rate and in-flight cap; `max_inflight_push_requests` is its push key's cap). The store's own scripts
//! reconcile (`cell_heartbeat.lua`, then `cell_slice.lua` per tenant), so every replica of
//! every cell does this alone: no election, and the loss of any one process stops no slice.
//!
//! This is a background task. No request ever waits on it or on the store: a decision reads
//! the slices in force, which this task replaces as answers come. While the store does not
//! answer, the last slices hold for `--cell-slice-ttl`, then the static fallback applies
//! ([`engine::CellSync`] decides which, with time as an input).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use engine::cells::{
    key_subject, CellReport, CellSubject, ReconcileParams, Reconciled, SubjectLimits,
};
use engine::{CellSync, CellUsage, KeyName, KeyUsage};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::state::AppState;

/// How many fresh reports make a cell's demand current: a replica that missed this many
/// rounds (killed, cut off) no longer counts.
const FRESH_ROUNDS: u32 = 3;

/// Store calls in flight at once in one round (one per tenant).
const CALLS_IN_FLIGHT: usize = 32;

/// Slices that move less than this (relative) are not put in force: demand is noisy, and each
/// change rebuilds every tracked tenant's buckets.
const RELATIVE_CHANGE: f64 = 0.01;

/// Starts the sync when this replica is in a cell (`--cell`) with a store; `None` otherwise.
pub fn spawn(state: Arc<AppState>) -> Option<JoinHandle<()>> {
    let cell = state.config.cell.clone()?;
    state.store.as_ref()?;
    Some(tokio::spawn(run(state, cell)))
}

/// How much of a round's measured demand replaces the smoothed one: pushes arrive in lumps,
/// and a cell whose demand is under its fair share gets a slice equal to it, so noise in the
/// estimate becomes refusals. Half: the estimate follows a rise within 2–3 rounds.
const SMOOTHING: f64 = 0.5;

/// One subject as this replica measures it.
#[derive(Debug, Clone, PartialEq)]
struct Measured {
    /// The tenant, or `tenant/key` ([`key_subject`]): the name its share is kept under.
    name: String,
    tenant: String,
    /// An admission key (percent-encoded), or `None` for the tenant's push limits.
    key: Option<String>,
    limits: SubjectLimits,
    demand: [Counter; 2],
    spent: [u64; 2],
}

/// How a limit's demand is measured.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Counter {
    /// Offered, cumulative: the demand is its growth per second.
    Total(u64),
    /// Wanted at once (in-flight slots): the demand is the level itself.
    Level(u64),
}

impl Measured {
    fn tenant(usage: CellUsage) -> Measured {
        Measured {
            name: usage.tenant.clone(),
            tenant: usage.tenant,
            key: None,
            limits: [usage.limits.request_rate, usage.limits.ingestion_rate].into(),
            demand: usage.offered.map(Counter::Total),
            spent: usage.spent,
        }
    }

    fn key(usage: KeyUsage) -> Measured {
        Measured {
            name: key_subject(&usage.tenant, &usage.key),
            limits: SubjectLimits::key(usage.limit.rate, usage.limit.max_concurrent),
            demand: [Counter::Total(usage.offered), Counter::Level(usage.wanted)],
            spent: [usage.spent, 0],
            tenant: usage.tenant,
            key: Some(usage.key),
        }
    }

    fn subject(&self) -> CellSubject<'_> {
        match &self.key {
            None => CellSubject::Tenant(&self.tenant),
            Some(key) => CellSubject::Key(KeyName {
                tenant: &self.tenant,
                key,
            }),
        }
    }
}

/// What this replica last reported of one subject.
struct Reported {
    /// The totals reported (0 for a level).
    offered: [u64; 2],
    /// The demand reported (per second, smoothed).
    demand: [f64; 2],
    /// Whether that report said the tenant was offered something: a tenant that goes quiet
    /// is reported once more, with no demand, so its cell's claim drops at once.
    busy: bool,
}

async fn run(state: Arc<AppState>, cell: String) {
    let config = &state.config;
    let interval = config.cell_sync_interval;
    let params = ReconcileParams {
        fresh_micros: (interval * FRESH_ROUNDS).as_micros() as u64,
        hold_micros: config.cell_slice_ttl.as_micros() as u64,
        live_cells: 0,
        floor_fraction: config.cell_floor,
    };
    // A call that takes longer than half a round is given up (the round's answer is late).
    let call_timeout = interval / 2;
    let started = Instant::now();
    let now = move || started.elapsed().as_nanos().min(u64::MAX as u128) as u64;
    let mut sync = CellSync::new(config.cell_sync());
    let mut reported: HashMap<String, Reported> = HashMap::new();
    let mut last_round = Instant::now();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tracing::info!(
        %cell,
        ring = %config.ring_cluster_id(),
        ?interval,
        slice_ttl = ?config.cell_slice_ttl,
        "in a cell: tenants' limits are this cell's slices, reconciled through the store"
    );
    let mut logged_failure = false;
    loop {
        ticker.tick().await;
        let elapsed = last_round.elapsed().as_secs_f64().max(1e-3);
        last_round = Instant::now();
        let measured = state
            .limiter
            .cell_usage()
            .into_iter()
            .map(Measured::tenant)
            .chain(
                state
                    .limiter
                    .key_cell_usage()
                    .into_iter()
                    .map(Measured::key),
            )
            .collect();
        let reports = reports_due(measured, &mut reported, elapsed);
        let answered = match state.store.as_ref().and_then(|store| store.redis()) {
            Some(redis) => {
                round(
                    &redis,
                    &cell,
                    &config.node_id,
                    params,
                    call_timeout,
                    reports,
                )
                .await
            }
            None => Err("not connected to the store yet".to_string()),
        };
        let now = now();
        match answered {
            Ok((cells, slices)) => {
                sync.store_answered(cells, now);
                state.metrics.cell_slices.inc_by(slices.len() as u64);
                for (subject, reconciled) in slices {
                    sync.answered(&subject, reconciled, now);
                }
                state.metrics.cell_syncs.with_label_values(&["ok"]).inc();
                if logged_failure {
                    tracing::info!(%cell, cells, "the store answers the cell sync again");
                    logged_failure = false;
                }
            }
            Err(err) => {
                state
                    .metrics
                    .cell_syncs
                    .with_label_values(&["failed"])
                    .inc();
                if !logged_failure {
                    tracing::warn!(%cell, %err, slice_ttl = ?config.cell_slice_ttl, "cell sync failed: the last slices hold for the slice TTL, then the static fallback");
                    logged_failure = true;
                }
            }
        }
        let shares = sync.shares(now);
        if shares.differs(&state.limiter.cell_shares(), RELATIVE_CHANGE) {
            state.limiter.set_cell_shares(Arc::new(shares));
        }
    }
}

/// This round's reports: every subject offered something since the last round, and once
/// more (with no demand) each that was and no longer is. Demand is per second over `elapsed`
/// (a level as it is).
fn reports_due(
    usage: Vec<Measured>,
    reported: &mut HashMap<String, Reported>,
    elapsed: f64,
) -> Vec<(Measured, [f64; 2])> {
    let mut due = Vec::new();
    let mut seen = HashSet::with_capacity(usage.len());
    for subject in usage {
        seen.insert(subject.name.clone());
        let before = reported.get(&subject.name);
        // A subject evicted and tracked again counts from 0: nothing new until it passes.
        let totals = subject.demand.map(|counter| match counter {
            Counter::Total(total) => total,
            Counter::Level(_) => 0,
        });
        let measured = |kind: usize| match subject.demand[kind] {
            Counter::Total(total) => {
                total.saturating_sub(before.map_or(0, |r| r.offered[kind])) as f64 / elapsed
            }
            Counter::Level(level) => level as f64,
        };
        let measured = [measured(0), measured(1)];
        let busy = measured != [0.0, 0.0];
        if busy || before.is_some_and(|r| r.busy) {
            // A round with nothing offered drops the estimate to 0 at once, so a cell that
            // stops being offered a subject gives its claim up in one round.
            let smooth = |kind: usize| {
                let measured = measured[kind];
                match before {
                    Some(before) if busy => {
                        before.demand[kind] + (measured - before.demand[kind]) * SMOOTHING
                    }
                    _ => measured,
                }
            };
            let demand = [smooth(0), smooth(1)];
            reported.insert(
                subject.name.clone(),
                Reported {
                    offered: totals,
                    demand,
                    busy,
                },
            );
            due.push((subject, demand));
        }
    }
    // Subjects the limiter no longer tracks.
    reported.retain(|name, _| seen.contains(name));
    due
}

/// One round against the store: the heartbeat (how many cells are live), then each due
/// report, a few at a time. Fails only when the heartbeat does; a tenant whose call fails
/// keeps its last slice.
async fn round(
    redis: &Arc<redis_store::RedisStore>,
    cell: &str,
    replica: &str,
    mut params: ReconcileParams,
    call_timeout: Duration,
    reports: Vec<(Measured, [f64; 2])>,
) -> Result<(u32, Vec<(String, Reconciled)>), String> {
    let hold = Duration::from_micros(params.hold_micros);
    let cells = match tokio::time::timeout(call_timeout, redis.cell_heartbeat(cell, hold)).await {
        Ok(Ok(cells)) => cells,
        Ok(Err(err)) => return Err(err.to_string()),
        Err(_) => return Err(format!("no answer within {call_timeout:?}")),
    };
    params.live_cells = cells;
    let mut answers = Vec::with_capacity(reports.len());
    let mut calls = JoinSet::new();
    let mut reports = reports.into_iter();
    loop {
        while calls.len() < CALLS_IN_FLIGHT {
            let Some((subject, demand)) = reports.next() else {
                break;
            };
            let redis = Arc::clone(redis);
            let report = CellReport {
                cell: cell.to_string(),
                replica: replica.to_string(),
                at_micros: 0,
                demand,
                spent: subject.spent,
                answered: [0.0; 2],
            };
            calls.spawn(async move {
                let call = redis.cell_slice(subject.subject(), &report, subject.limits, params);
                let answer = tokio::time::timeout(call_timeout, call).await;
                (subject.name, answer)
            });
        }
        let Some(done) = calls.join_next().await else {
            break;
        };
        if let Ok((tenant, Ok(Ok(reconciled)))) = done {
            answers.push((tenant, reconciled));
        }
    }
    Ok((cells, answers))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(tenant: &str, offered: u64) -> Measured {
        Measured::tenant(CellUsage {
            tenant: tenant.into(),
            limits: runtime_config::TenantLimits::default(),
            offered: [0, offered],
            spent: [0, offered],
        })
    }

    #[test]
    fn busy_tenants_are_reported_and_a_quiet_one_once_more() {
        let mut reported = HashMap::new();
        let due = reports_due(vec![usage("a", 100), usage("b", 0)], &mut reported, 0.5);
        let names: Vec<(&str, f64)> = due.iter().map(|(u, d)| (u.name.as_str(), d[1])).collect();
        assert_eq!(names, vec![("a", 200.0)]);
        // Smoothed: half way from 200 to 400.
        let due = reports_due(vec![usage("a", 300)], &mut reported, 0.5);
        assert_eq!(due[0].1, [0.0, 300.0]);
        let due = reports_due(vec![usage("a", 100 + 200 + 200)], &mut reported, 0.5);
        assert_eq!(due[0].1, [0.0, 350.0]);
        // a goes quiet: reported once with no demand, then no more.
        let due = reports_due(vec![usage("a", 500)], &mut reported, 1.0);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].1, [0.0, 0.0]);
        assert!(reports_due(vec![usage("a", 500)], &mut reported, 1.0).is_empty());
        // Evicted, then tracked again from 0: counts from there.
        assert!(reports_due(vec![], &mut reported, 1.0).is_empty());
        let due = reports_due(vec![usage("a", 30)], &mut reported, 1.0);
        assert_eq!(due[0].1, [0.0, 30.0]);
    }

    /// An admission key is its own subject: its rate demand per second, its in-flight demand
    /// the slots wanted at once (a level, not a count), under `tenant/key`.
    #[test]
    fn a_key_reports_its_rate_and_the_slots_it_wanted() {
        let key = |offered: u64, wanted: u64| {
            Measured::key(KeyUsage {
                tenant: "t".into(),
                key: "k".into(),
                limit: runtime_config::LimitSpec {
                    algorithm: runtime_config::Algorithm::TokenBucket,
                    rate: 50.0,
                    burst: 50,
                    window: Duration::from_secs(1),
                    max_concurrent: 30,
                },
                offered,
                spent: offered,
                wanted,
            })
        };
        let mut reported = HashMap::new();
        let due = reports_due(vec![key(100, 12)], &mut reported, 2.0);
        assert_eq!(due[0].0.name, "t/k");
        assert_eq!(due[0].0.limits, SubjectLimits::key(50.0, 30));
        assert_eq!(due[0].1, [50.0, 12.0]);
        // Smoothed like a rate: half way to 4 slots; nothing more offered.
        let due = reports_due(vec![key(100, 4)], &mut reported, 1.0);
        assert_eq!(due[0].1, [25.0, 8.0]);
        // Nothing wanted nor offered: reported once more with no demand, then not at all.
        let due = reports_due(vec![key(100, 0)], &mut reported, 1.0);
        assert_eq!(due[0].1, [0.0, 0.0]);
        assert!(reports_due(vec![key(100, 0)], &mut reported, 1.0).is_empty());
    }
}

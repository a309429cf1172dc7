//! The refill task: the one place that calls the fleet for leases. Every tick (or at once
//! when a budget runs low) it asks each key's plan whether a roll is due and runs the due
//! rolls concurrently, one at a time per key. A roll reports what the lease spent, gives
//! back what demand no longer needs, takes a new batch, and learns the limit in force.
//!
//! The budget's tokens move only by the decisions' spending and by one signed add per
//! answered roll, (what the fleet says the lease holds) − (the budget when the roll was
//! sent), so spending that raced the call is never counted twice.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::budget::Budget;
use crate::plan::Roll;
use crate::proto;
use crate::{Inner, Limit};

/// How often the task looks at every key without being woken.
const TICK: Duration = Duration::from_millis(10);

pub(crate) async fn run(client: Weak<Inner>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Held for one tick at most: dropping the last `Client` ends the task.
        let Some(inner) = client.upgrade() else {
            return;
        };
        tokio::select! {
            _ = tick.tick() => {}
            _ = inner.refill.notified() => {}
        }
        if inner.stopped.load(Ordering::Acquire) {
            return;
        }
        visit(&inner);
    }
}

/// Starts every roll that is due.
fn visit(inner: &Arc<Inner>) {
    let now = inner.now();
    for budget in inner.budgets() {
        if budget.rolling.load(Ordering::Acquire) {
            continue;
        }
        // Held only by the keys and by this loop (no handle), and holding nothing.
        if Arc::strong_count(&budget) == 2 && budget.forgettable(now, inner.settings.forget) {
            inner.forget(&budget);
            continue;
        }
        let roll = {
            let mut state = budget.roll.lock().unwrap_or_else(|e| e.into_inner());
            state.observe(budget.demand.load(Ordering::Relaxed), now);
            let target = state.target(&inner.settings, budget.limit().burst);
            budget
                .low_water
                .store(target.div_ceil(2).max(1), Ordering::Relaxed);
            state.plan(
                budget.tokens.load(Ordering::Acquire),
                budget.valid_until.load(Ordering::Acquire),
                budget.wanted.load(Ordering::Acquire),
                budget.limit().burst,
                now,
                &inner.settings,
            )
        };
        let Some(roll) = roll else {
            continue;
        };
        let permitted = {
            let mut breaker = inner.breaker.lock().unwrap_or_else(|e| e.into_inner());
            breaker.permit(now)
        };
        if !permitted {
            continue;
        }
        budget.wanted.store(false, Ordering::Release);
        budget.rolling.store(true, Ordering::Release);
        let inner = Arc::clone(inner);
        tokio::spawn(async move {
            roll_one(&inner, &budget, roll).await;
            budget.rolling.store(false, Ordering::Release);
        });
    }
}

/// One call: report, give back, take. Failures feed the breaker; the budget keeps what it
/// has until its lease lapses.
async fn roll_one(inner: &Inner, budget: &Budget, roll: Roll) {
    // What is given back leaves the budget first, so no decision spends it meanwhile.
    let mut given_back = 0;
    if roll.give_back > 0 {
        let _ = budget
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tokens| {
                given_back = tokens.min(roll.give_back);
                Some(tokens - given_back)
            });
    }
    let at_send = budget.tokens.load(Ordering::Acquire);
    let (previous, outstanding) = {
        let state = budget.roll.lock().unwrap_or_else(|e| e.into_inner());
        (state.lease_id.clone(), state.outstanding)
    };
    let spent = outstanding.saturating_sub(at_send + given_back);
    let request = proto::LeaseRequest {
        tenant: budget.tenant.to_string(),
        key: budget.key.to_string(),
        want: roll.want,
        ttl: Some(duration(inner.lease_ttl)),
        previous_lease_id: previous,
        spent,
        give_back: given_back,
        client_id: inner.client_id.clone(),
    };
    let sent_at = inner.now();
    let started = Instant::now();
    let (replica, mut api) = inner.api();
    let answer = tokio::time::timeout(inner.timeout, api.lease(inner.request(request))).await;
    let ok = matches!(&answer, Ok(Ok(_)));
    inner
        .metrics
        .call("Lease", ok, started.elapsed().as_secs_f64());
    let now = inner.now();
    match answer {
        Ok(Ok(response)) => {
            fleet_answered(inner, true, now);
            let response = response.into_inner();
            let held = response.outstanding;
            let delta = i128::from(held) - i128::from(at_send);
            let _ = budget
                .tokens
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tokens| {
                    Some((i128::from(tokens) + delta).max(0) as u64)
                });
            let ttl = response
                .ttl
                .and_then(|ttl| Duration::try_from(ttl).ok())
                .unwrap_or(inner.lease_ttl);
            // Spend nothing past the fleet's deadline: it counts from when it answered, and
            // this one from before the request left.
            let valid_until = if roll.retire {
                0
            } else {
                (sent_at + (ttl.as_nanos() as u64) * 9 / 10).max(1)
            };
            budget.valid_until.store(valid_until, Ordering::Release);
            if let Some(limit) = response.limit_in_force.as_ref() {
                budget.set_limit(limit_of(limit));
            }
            let retry_after = response
                .retry_after
                .and_then(|retry| Duration::try_from(retry).ok())
                .unwrap_or_default();
            budget
                .retry_hint
                .store(retry_after.as_nanos() as u64, Ordering::Relaxed);
            inner.metrics.granted.inc_by(response.granted);
            inner.metrics.given_back.inc_by(given_back);
            let starved = response.granted < roll.want && !roll.retire;
            let limit = budget.limit();
            let fill = if limit.rate > 0.0 {
                Duration::from_secs_f64(limit.burst as f64 / limit.rate)
            } else {
                Duration::from_secs(1)
            };
            let mut state = budget.roll.lock().unwrap_or_else(|e| e.into_inner());
            state.answered(response.lease_id, held, starved, fill, now, &inner.settings);
            drop(state);
            inner.first_lease.notify_waiters();
        }
        Ok(Err(status)) if answered_by_the_fleet(status.code()) => {
            // The fleet answered, but not with a lease (an unknown tenant under strict
            // admission, a bad name): the key stays as it is and the policy decides.
            fleet_answered(inner, true, now);
            tracing::warn!(
                tenant = %budget.tenant, key = %budget.key, code = ?status.code(),
                message = status.message(), "weir refused to lease",
            );
            let mut state = budget.roll.lock().unwrap_or_else(|e| e.into_inner());
            state.failed(now, &inner.settings);
            state.next_after = now + inner.settings.sync_interval;
            drop(state);
            inner.first_lease.notify_waiters();
        }
        Ok(Err(_)) | Err(_) => {
            fleet_answered(inner, false, now);
            inner.failed_over(replica);
            let mut state = budget.roll.lock().unwrap_or_else(|e| e.into_inner());
            state.failed(now, &inner.settings);
            drop(state);
            // Woken waiters see the breaker, if it opened.
            inner.first_lease.notify_waiters();
        }
    }
}

/// The codes that mean the fleet is there and said no, rather than that it is away.
fn answered_by_the_fleet(code: tonic::Code) -> bool {
    use tonic::Code;
    matches!(
        code,
        Code::InvalidArgument
            | Code::NotFound
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unimplemented
    )
}

/// Feeds the breaker, and publishes whether the fleet is taken to be away.
pub(crate) fn fleet_answered(inner: &Inner, ok: bool, now: u64) {
    let mut breaker = inner.breaker.lock().unwrap_or_else(|e| e.into_inner());
    breaker.record(ok, now);
    let open = breaker.is_open();
    drop(breaker);
    inner.fleet_down.store(open, Ordering::Release);
    inner.metrics.breaker_open.set(i64::from(open));
}

/// May a call go to the fleet now (the breaker's permit)?
pub(crate) fn permitted(inner: &Inner) -> bool {
    let now = inner.now();
    inner
        .breaker
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .permit(now)
}

/// On shutdown: every lease's unspent tokens go back, one call per key, concurrently.
pub(crate) async fn give_everything_back(inner: &Arc<Inner>) {
    let mut calls = tokio::task::JoinSet::new();
    for budget in inner.budgets() {
        if !budget.leased() {
            continue;
        }
        let inner = Arc::clone(inner);
        calls.spawn(async move {
            let roll = Roll {
                want: 0,
                give_back: u64::MAX,
                retire: true,
            };
            roll_one(&inner, &budget, roll).await;
        });
    }
    while calls.join_next().await.is_some() {}
}

fn limit_of(spec: &proto::LimitSpec) -> Limit {
    let window = spec
        .window
        .and_then(|window| Duration::try_from(window).ok())
        .unwrap_or(Duration::from_secs(1));
    let burst = match proto::Algorithm::try_from(spec.algorithm) {
        Ok(proto::Algorithm::SlidingWindow) => (spec.rate * window.as_secs_f64()).floor() as u64,
        _ => spec.burst,
    };
    Limit {
        rate: spec.rate,
        burst,
    }
}

pub(crate) fn duration(value: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: value.as_secs() as i64,
        nanos: value.subsec_nanos() as i32,
    }
}

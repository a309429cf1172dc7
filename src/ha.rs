//! The HA tracker: one elected replica per (tenant, HA cluster), as Mimir's distributor keeps
//! it. Two Prometheus servers that scrape the same targets (an HA pair) both push, with the
//! same `cluster` label and their own `__replica__`; the tracker accepts the elected replica's
//! pushes and answers the other's with 202, uncharged and unforwarded. When the elected
//! replica has been silent for `ha_tracker_failover_timeout`, the next push of another
//! replica of the cluster elects it (and, with `ha_tracker_sample_failover_timeout`, only a
//! push whose samples are that much later than the elected replica's last push).
//!
//! The elections are shared through the ring's gossip, as Mimir's memberlist KV shares them
//! ([`ring::ha`]). Each replica publishes the elections it has seen traffic for, with when it
//! last received the elected replica's push, at most every `ha_tracker_update_timeout` (±
//! jitter) per cluster. Elections merge by one total order ([`wins`]): the higher term (one
//! more at each failover) wins; in a term, the earlier election, then the smaller replica
//! name. So every replica converges on one election, and a replica that joins late (its own
//! first election is term 1) cannot override the fleet's.
//!
//! In a partition each side keeps its own view: while the elected replica reaches both sides
//! nothing changes; if it reaches only one, the other side fails over after the timeout and
//! both replicas' samples are forwarded (duplicates, never a gap) until the partition heals and
//! the later term wins everywhere.
//!
//! Pure logic: the clock (Unix milliseconds, since the elections travel between hosts) and the
//! jitter are passed in.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::RwLock;

use ring::HaEntry;
use runtime_config::HaLimits;

/// Elections not heard of for this long are forgotten (Mimir deletes them after 30 minutes).
pub const FORGET_AFTER_MS: i64 = 30 * 60 * 1000;

/// What the tracker says about one push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HaVerdict {
    /// The push is from the elected replica (perhaps elected just now): accept it, without
    /// its replica label.
    Accept,
    /// Another replica of the cluster is elected: answer 202, charge and forward nothing.
    Deduplicate { elected: String },
    /// The tenant already has `ha_max_clusters` clusters: refuse (400).
    TooManyClusters { limit: u32 },
}

/// What the HA tracker said about a push, for the answer and the metrics.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum HaOutcome {
    /// The tenant does not deduplicate HA pairs.
    #[default]
    Off,
    /// The tenant deduplicates, but the first series lacks the cluster or the replica label:
    /// the push goes on as it is (Mimir's non-HA samples).
    NotHa,
    /// From the elected replica: the replica label is removed from every series. `change`:
    /// this push elected it.
    Accepted {
        cluster: String,
        replica_label: String,
        change: Option<Change>,
    },
    /// Another replica is elected: 202, nothing charged or forwarded.
    Deduplicated {
        cluster: String,
        replica: String,
        elected: String,
    },
    /// The tenant has `ha_max_clusters` clusters already: 400.
    TooManyClusters { limit: u32 },
}

/// A tenant's HA check for one push: the tracker, the tenant and its settings.
#[derive(Debug, Clone)]
pub struct HaCheck {
    pub tracker: std::sync::Arc<HaTracker>,
    pub tenant: std::sync::Arc<str>,
    pub settings: std::sync::Arc<HaLimits>,
}

impl HaCheck {
    /// The outcome for a push whose first series carries these values of the cluster and
    /// replica labels (Mimir looks at the first series only). `earliest`: the push's earliest
    /// sample ([`HaTracker::check`]'s `sample_ms`, which is `now_ms` at the latest), read only
    /// when a failover waits on `ha_tracker_sample_failover_timeout`.
    pub fn outcome(
        &self,
        cluster: Option<&str>,
        replica: Option<&str>,
        now_ms: i64,
        earliest: impl Fn() -> Option<i64>,
    ) -> HaOutcome {
        let (Some(cluster), Some(replica)) = (
            cluster.filter(|value| !value.is_empty()),
            replica.filter(|value| !value.is_empty()),
        ) else {
            return HaOutcome::NotHa;
        };
        let (verdict, changed) = self.tracker.check(
            &self.tenant,
            &self.settings,
            cluster,
            replica,
            now_ms,
            || earliest().map_or(now_ms, |earliest| earliest.min(now_ms)),
        );
        match verdict {
            HaVerdict::Accept => HaOutcome::Accepted {
                cluster: cluster.to_string(),
                replica_label: self.settings.ha_replica_label.clone(),
                change: changed,
            },
            HaVerdict::Deduplicate { elected } => HaOutcome::Deduplicated {
                cluster: cluster.to_string(),
                replica: replica.to_string(),
                elected,
            },
            HaVerdict::TooManyClusters { limit } => HaOutcome::TooManyClusters { limit },
        }
    }
}

/// One cluster's election as this replica holds it.
#[derive(Debug)]
struct Cluster {
    replica: String,
    term: u64,
    elected_at_ms: i64,
    /// The latest push of the elected replica any replica has published.
    received_at_ms: i64,
    /// The latest push of the elected replica this replica received (0: none yet).
    seen_ms: AtomicI64,
    /// What this replica last published as `received_at_ms` for this election (0: never).
    published_ms: i64,
    /// When this replica publishes again, given a newer push (its update timeout and jitter).
    next_publish_ms: i64,
}

impl Cluster {
    fn elect(replica: &str, term: u64, now_ms: i64) -> Cluster {
        Cluster {
            replica: replica.to_string(),
            term,
            elected_at_ms: now_ms,
            received_at_ms: now_ms,
            seen_ms: AtomicI64::new(now_ms),
            published_ms: 0,
            next_publish_ms: i64::MIN,
        }
    }

    /// When the elected replica was last heard of, here or anywhere.
    fn last_heard_ms(&self) -> i64 {
        self.received_at_ms
            .max(self.seen_ms.load(Ordering::Relaxed))
    }
}

/// Whether election `a` beats election `b` (both of one cluster): the higher term, then the
/// earlier election, then the smaller replica name. A total order, so every replica that has
/// seen the same elections holds the same one.
pub fn wins(a: (u64, i64, &str), b: (u64, i64, &str)) -> bool {
    let (a_term, a_at, a_replica) = a;
    let (b_term, b_at, b_replica) = b;
    a_term > b_term || (a_term == b_term && (a_at, a_replica) < (b_at, b_replica))
}

/// The elections of every tenant that deduplicates, by tenant and cluster.
#[derive(Debug, Default)]
pub struct HaTracker {
    tenants: RwLock<HashMap<String, HashMap<String, Cluster>>>,
    /// Told each time an election is made or learnt, so the publisher sleeps while there is
    /// none.
    elected: tokio::sync::Notify,
}

/// One election, as `GET /distributor/ha_tracker` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Elected {
    pub tenant: String,
    pub cluster: String,
    pub replica: String,
    pub term: u64,
    pub elected_at_ms: i64,
    /// The elected replica's latest push this replica knows of (its own, or a peer's news).
    pub last_heard_ms: i64,
}

/// An elected replica changed: for the log and `weir_ha_tracker_elected_replica_changes_total`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub tenant: String,
    pub cluster: String,
    pub from: Option<String>,
    pub to: String,
}

impl HaTracker {
    /// Checks one push of `replica` in `cluster` for `tenant`, at `now_ms`. `sample_ms`: the
    /// push's sample time (its earliest sample, `now_ms` at the latest), read only when a
    /// failover waits on `ha_tracker_sample_failover_timeout`. With the verdict, the election
    /// this push made, if it made one.
    pub fn check(
        &self,
        tenant: &str,
        settings: &HaLimits,
        cluster: &str,
        replica: &str,
        now_ms: i64,
        sample_ms: impl Fn() -> i64,
    ) -> (HaVerdict, Option<Change>) {
        let millis =
            |timeout: std::time::Duration| timeout.as_millis().min(i64::MAX as u128) as i64;
        let failover_ms = millis(settings.ha_tracker_failover_timeout);
        let sample_failover_ms = millis(settings.ha_tracker_sample_failover_timeout);
        // Mimir's rule: the elected replica silent for the failover timeout, and, with a
        // sample failover timeout, the push's samples that much later than its last push (so
        // a replica sending old samples, a backlog, does not take over with them).
        let silent =
            |elected: &Cluster| now_ms.saturating_sub(elected.last_heard_ms()) >= failover_ms;
        let late_enough = |elected: &Cluster, sample: i64| {
            sample.saturating_sub(elected.last_heard_ms()) >= sample_failover_ms
        };
        let mut failover_due = false;
        {
            let tenants = self.tenants.read().unwrap_or_else(|e| e.into_inner());
            let clusters = tenants.get(tenant);
            match clusters.and_then(|clusters| clusters.get(cluster)) {
                Some(elected) if elected.replica == replica => {
                    elected.seen_ms.fetch_max(now_ms, Ordering::Relaxed);
                    return (HaVerdict::Accept, None);
                }
                Some(elected) if !silent(elected) => {
                    let elected = elected.replica.clone();
                    return (HaVerdict::Deduplicate { elected }, None);
                }
                // Elected but silent past the failover timeout: elect this one, below.
                Some(_) => failover_due = true,
                None => {
                    let count = clusters.map_or(0, HashMap::len);
                    let limit = settings.ha_max_clusters;
                    if limit > 0 && count >= limit as usize {
                        return (HaVerdict::TooManyClusters { limit }, None);
                    }
                }
            }
        }
        // The push's sample time, read from its body outside the locks, once, and only when a
        // failover waits on it.
        let sample = (failover_due && sample_failover_ms > 0).then(&sample_ms);
        let may_fail_over = |elected: &Cluster| {
            silent(elected)
                && (sample_failover_ms == 0
                    || late_enough(elected, sample.unwrap_or_else(&sample_ms)))
        };
        // A new cluster, or a failover: under the write lock, checked again (another push
        // may have elected in between).
        let mut tenants = self.tenants.write().unwrap_or_else(|e| e.into_inner());
        let clusters = tenants.entry(tenant.to_string()).or_default();
        match clusters.get_mut(cluster) {
            Some(elected) if elected.replica == replica => {
                elected.seen_ms.fetch_max(now_ms, Ordering::Relaxed);
                (HaVerdict::Accept, None)
            }
            Some(elected) if !may_fail_over(elected) => {
                let elected = elected.replica.clone();
                (HaVerdict::Deduplicate { elected }, None)
            }
            Some(elected) => {
                let from =
                    std::mem::replace(elected, Cluster::elect(replica, elected.term + 1, now_ms));
                let change = Change {
                    tenant: tenant.to_string(),
                    cluster: cluster.to_string(),
                    from: Some(from.replica),
                    to: replica.to_string(),
                };
                (HaVerdict::Accept, Some(change))
            }
            None => {
                let limit = settings.ha_max_clusters;
                if limit > 0 && clusters.len() >= limit as usize {
                    return (HaVerdict::TooManyClusters { limit }, None);
                }
                clusters.insert(cluster.to_string(), Cluster::elect(replica, 1, now_ms));
                self.elected.notify_one();
                let change = Change {
                    tenant: tenant.to_string(),
                    cluster: cluster.to_string(),
                    from: None,
                    to: replica.to_string(),
                };
                (HaVerdict::Accept, Some(change))
            }
        }
    }

    /// Returns once this tracker holds an election: at once if it does, else when the next
    /// is made or learnt from a peer.
    pub async fn until_tracking(&self) {
        loop {
            let tracking = self
                .tenants
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .any(|clusters| !clusters.is_empty());
            if tracking {
                return;
            }
            // An election made since the check left a permit: this returns at once.
            self.elected.notified().await;
        }
    }

    /// Folds the peers' published elections in; returns the elected replicas that changed.
    pub fn merge(&self, entries: &[HaEntry]) -> Vec<Change> {
        let mut changes = Vec::new();
        if entries.is_empty() {
            return changes;
        }
        let mut tenants = self.tenants.write().unwrap_or_else(|e| e.into_inner());
        for entry in entries {
            let clusters = tenants.entry(entry.tenant.clone()).or_default();
            match clusters.get_mut(&entry.cluster) {
                Some(held)
                    if (held.term, held.elected_at_ms, held.replica.as_str())
                        == (entry.term, entry.elected_at_ms, entry.replica.as_str()) =>
                {
                    held.received_at_ms = held.received_at_ms.max(entry.received_at_ms);
                }
                Some(held)
                    if !wins(
                        (entry.term, entry.elected_at_ms, &entry.replica),
                        (held.term, held.elected_at_ms, &held.replica),
                    ) => {}
                held => {
                    let from = held.as_ref().map(|held| held.replica.clone());
                    let seen_ms = held
                        .as_ref()
                        .filter(|held| held.replica == entry.replica)
                        .map_or(0, |held| held.seen_ms.load(Ordering::Relaxed));
                    if from.as_deref() != Some(entry.replica.as_str()) {
                        changes.push(Change {
                            tenant: entry.tenant.clone(),
                            cluster: entry.cluster.clone(),
                            from,
                            to: entry.replica.clone(),
                        });
                    }
                    clusters.insert(
                        entry.cluster.clone(),
                        Cluster {
                            replica: entry.replica.clone(),
                            term: entry.term,
                            elected_at_ms: entry.elected_at_ms,
                            received_at_ms: entry.received_at_ms,
                            seen_ms: AtomicI64::new(seen_ms),
                            published_ms: 0,
                            next_publish_ms: i64::MIN,
                        },
                    );
                    self.elected.notify_one();
                }
            }
        }
        changes
    }

    /// What this replica publishes now: every election it has received the elected
    /// replica's push for, with the latest such push. An election's news is refreshed only
    /// once its update timeout (± `jitter`, a draw in [-1, 1) times the tenant's jitter max)
    /// has passed since this replica last published it, so the gossip key changes no more
    /// often than Mimir's KV is written. Elections silent for [`FORGET_AFTER_MS`] are
    /// forgotten. `settings` gives each tenant's HA settings (`None`: it no longer
    /// deduplicates, and its elections are forgotten). `forgotten` hears of each (tenant,
    /// cluster) forgotten, whose series go with it.
    pub fn to_publish(
        &self,
        now_ms: i64,
        settings: impl Fn(&str) -> Option<std::sync::Arc<HaLimits>>,
        mut jitter: impl FnMut() -> f64,
        mut forgotten: impl FnMut(&str, &str),
    ) -> Vec<HaEntry> {
        let mut tenants = self.tenants.write().unwrap_or_else(|e| e.into_inner());
        tenants.retain(|tenant, clusters| {
            let Some(settings) = settings(tenant) else {
                for cluster in clusters.keys() {
                    forgotten(tenant, cluster);
                }
                return false;
            };
            clusters.retain(|cluster, held| {
                let keep = now_ms.saturating_sub(held.last_heard_ms()) < FORGET_AFTER_MS;
                if !keep {
                    forgotten(tenant, cluster);
                }
                keep
            });
            for held in clusters.values_mut() {
                let seen = held.seen_ms.load(Ordering::Relaxed);
                if seen > held.published_ms && now_ms >= held.next_publish_ms {
                    held.published_ms = seen;
                    held.received_at_ms = held.received_at_ms.max(seen);
                    let timeout = settings.ha_tracker_update_timeout.as_secs_f64();
                    let spread = settings.ha_tracker_update_timeout_jitter_max.as_secs_f64();
                    let wait = (timeout + spread * jitter().clamp(-1.0, 1.0)).max(0.0);
                    held.next_publish_ms = now_ms.saturating_add((wait * 1000.0) as i64);
                }
            }
            !clusters.is_empty()
        });
        let mut entries: Vec<HaEntry> = tenants
            .iter()
            .flat_map(|(tenant, clusters)| {
                clusters
                    .iter()
                    .filter(|(_, held)| held.published_ms > 0)
                    .map(|(cluster, held)| HaEntry {
                        tenant: tenant.clone(),
                        cluster: cluster.clone(),
                        replica: held.replica.clone(),
                        term: held.term,
                        elected_at_ms: held.elected_at_ms,
                        received_at_ms: held.published_ms,
                    })
            })
            .collect();
        // The most recently heard first, so a cap on the key drops the stalest.
        entries.sort_by(|a, b| {
            b.received_at_ms
                .cmp(&a.received_at_ms)
                .then_with(|| (&a.tenant, &a.cluster).cmp(&(&b.tenant, &b.cluster)))
        });
        entries
    }

    /// Every election this replica holds, sorted by tenant and cluster (`GET
    /// /distributor/ha_tracker`, as Mimir's page of that name).
    pub fn elections(&self) -> Vec<Elected> {
        let tenants = self.tenants.read().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<Elected> = tenants
            .iter()
            .flat_map(|(tenant, clusters)| {
                clusters.iter().map(|(cluster, held)| Elected {
                    tenant: tenant.clone(),
                    cluster: cluster.clone(),
                    replica: held.replica.clone(),
                    term: held.term,
                    elected_at_ms: held.elected_at_ms,
                    last_heard_ms: held.last_heard_ms(),
                })
            })
            .collect();
        all.sort_by(|a, b| (&a.tenant, &a.cluster).cmp(&(&b.tenant, &b.cluster)));
        all
    }

    /// The elected replica of a cluster, if any.
    pub fn elected(&self, tenant: &str, cluster: &str) -> Option<String> {
        let tenants = self.tenants.read().unwrap_or_else(|e| e.into_inner());
        Some(tenants.get(tenant)?.get(cluster)?.replica.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn settings() -> HaLimits {
        HaLimits {
            accept_ha_samples: true,
            ha_max_clusters: 2,
            ..HaLimits::default()
        }
    }

    fn check(tracker: &HaTracker, cluster: &str, replica: &str, now: i64) -> HaVerdict {
        tracker
            .check("t", &settings(), cluster, replica, now, || now)
            .0
    }

    const S: i64 = 1000;

    #[test]
    fn the_first_replica_is_elected_and_the_other_deduplicated_until_failover() {
        let tracker = HaTracker::default();
        let t0 = 1_000_000 * S;
        assert_eq!(check(&tracker, "c", "a", t0), HaVerdict::Accept);
        let dedup = HaVerdict::Deduplicate {
            elected: "a".into(),
        };
        assert_eq!(check(&tracker, "c", "b", t0 + S), dedup);
        // a keeps pushing: b never takes over.
        for second in 2..100 {
            assert_eq!(
                check(&tracker, "c", "a", t0 + second * S),
                HaVerdict::Accept
            );
            assert_eq!(check(&tracker, "c", "b", t0 + second * S), dedup);
        }
        // a stops at t0 + 99 s; b takes over once a has been silent for 30 s, not before.
        assert_eq!(check(&tracker, "c", "b", t0 + 128 * S), dedup);
        let mut changes = Vec::new();
        let at = t0 + 129 * S;
        let (verdict, change) = tracker.check("t", &settings(), "c", "b", at, || at);
        changes.extend(change);
        assert_eq!(verdict, HaVerdict::Accept);
        assert_eq!(changes[0].from.as_deref(), Some("a"));
        assert_eq!(
            check(&tracker, "c", "a", t0 + 130 * S),
            HaVerdict::Deduplicate {
                elected: "b".into()
            }
        );
    }

    #[test]
    fn with_a_sample_failover_timeout_old_samples_do_not_take_over() {
        let sampled = HaLimits {
            ha_tracker_sample_failover_timeout: Duration::from_secs(60),
            ..settings()
        };
        let tracker = HaTracker::default();
        let t0 = 1_000_000 * S;
        let read = std::cell::Cell::new(0);
        let push = |replica: &str, now: i64, earliest: i64| {
            let sample = || {
                read.set(read.get() + 1);
                earliest
            };
            tracker.check("t", &sampled, "c", replica, now, sample).0
        };
        let dedup = HaVerdict::Deduplicate {
            elected: "a".into(),
        };
        assert_eq!(push("a", t0, t0), HaVerdict::Accept);
        // Within the failover timeout, the sample time is not even read.
        assert_eq!(push("b", t0 + 10 * S, t0), dedup);
        assert_eq!(read.get(), 0);
        // a silent for 40 s (past the 30 s failover timeout), but b's samples are its
        // backlog from 5 s after a's last push: under the 60 s sample timeout, no failover.
        assert_eq!(push("b", t0 + 40 * S, t0 + 5 * S), dedup);
        assert_eq!(push("b", t0 + 90 * S, t0 + 59 * S), dedup);
        assert_eq!(read.get(), 2);
        // Samples 60 s after a's last push: b takes over.
        assert_eq!(push("b", t0 + 95 * S, t0 + 60 * S), HaVerdict::Accept);
        assert_eq!(
            read.get(),
            3,
            "once a push, though checked again under the write lock"
        );
        assert_eq!(tracker.elected("t", "c").as_deref(), Some("b"));
        // Without the setting, the same backlog takes over after the failover timeout.
        let tracker = HaTracker::default();
        assert_eq!(check(&tracker, "c", "a", t0), HaVerdict::Accept);
        let (verdict, _) = tracker.check("t", &settings(), "c", "b", t0 + 40 * S, || t0);
        assert_eq!(verdict, HaVerdict::Accept);
    }

    #[test]
    fn a_tenant_has_at_most_ha_max_clusters() {
        let tracker = HaTracker::default();
        assert_eq!(check(&tracker, "c1", "a", S), HaVerdict::Accept);
        assert_eq!(check(&tracker, "c2", "a", S), HaVerdict::Accept);
        assert_eq!(
            check(&tracker, "c3", "a", S),
            HaVerdict::TooManyClusters { limit: 2 }
        );
        // Known clusters go on.
        assert_eq!(check(&tracker, "c1", "a", 2 * S), HaVerdict::Accept);
    }

    fn publish(tracker: &HaTracker, now: i64) -> Vec<HaEntry> {
        publish_forgetting(tracker, now, |_, _| panic!("nothing is forgotten here"))
    }

    fn publish_forgetting(
        tracker: &HaTracker,
        now: i64,
        forgotten: impl FnMut(&str, &str),
    ) -> Vec<HaEntry> {
        tracker.to_publish(now, |_| Some(Arc::new(settings())), || 0.0, forgotten)
    }

    /// The (tenant, cluster) pairs `publish` forgets at `now`, and what it publishes.
    fn forgotten_at(tracker: &HaTracker, now: i64) -> (Vec<(String, String)>, Vec<HaEntry>) {
        let mut forgotten = Vec::new();
        let entries = publish_forgetting(tracker, now, |tenant, cluster| {
            forgotten.push((tenant.to_string(), cluster.to_string()))
        });
        (forgotten, entries)
    }

    #[test]
    fn replicas_converge_on_one_election_and_a_late_one_cannot_override_it() {
        let (x, y, z) = (
            HaTracker::default(),
            HaTracker::default(),
            HaTracker::default(),
        );
        let t0 = 1_000_000 * S;
        // x and y elect different replicas before hearing of each other.
        assert_eq!(check(&x, "c", "a", t0), HaVerdict::Accept);
        assert_eq!(check(&y, "c", "b", t0 + 10), HaVerdict::Accept);
        let (from_x, from_y) = (publish(&x, t0 + 20), publish(&y, t0 + 20));
        assert!(x.merge(&from_y).is_empty(), "x's election is earlier");
        assert_eq!(y.merge(&from_x)[0].to, "a");
        assert_eq!(
            check(&y, "c", "b", t0 + S),
            HaVerdict::Deduplicate {
                elected: "a".into()
            }
        );
        // Much later z starts, elects b alone (term 1), then hears of the fleet's a.
        assert_eq!(check(&z, "c", "b", t0 + 60 * S), HaVerdict::Accept);
        for entry in publish(&z, t0 + 60 * S) {
            x.merge(&[entry]);
        }
        assert_eq!(x.elected("t", "c").as_deref(), Some("a"));
        z.merge(&publish(&x, t0 + 60 * S));
        assert_eq!(z.elected("t", "c").as_deref(), Some("a"));
    }

    #[test]
    fn a_failover_wins_everywhere_and_received_at_travels() {
        let (x, y) = (HaTracker::default(), HaTracker::default());
        let t0 = 1_000_000 * S;
        check(&x, "c", "a", t0);
        y.merge(&publish(&x, t0));
        // a pushes only through x, for 16 s; x publishes after its update timeout (15 s).
        for second in 1..=16 {
            check(&x, "c", "a", t0 + second * S);
        }
        let news = publish(&x, t0 + 16 * S);
        assert_eq!(news[0].received_at_ms, t0 + 16 * S);
        y.merge(&news);
        // So y does not fail over at t0 + 40 s (a was heard of at t0 + 16 s) ...
        assert_eq!(
            check(&y, "c", "b", t0 + 40 * S),
            HaVerdict::Deduplicate {
                elected: "a".into()
            }
        );
        // ... but does at t0 + 47 s, and x follows the higher term.
        assert_eq!(check(&y, "c", "b", t0 + 47 * S), HaVerdict::Accept);
        let changes = x.merge(&publish(&y, t0 + 47 * S));
        assert_eq!(changes[0].to, "b");
        assert_eq!(
            check(&x, "c", "a", t0 + 48 * S),
            HaVerdict::Deduplicate {
                elected: "b".into()
            }
        );
    }

    #[test]
    fn publishing_waits_for_the_update_timeout_and_forgets_the_silent() {
        let tracker = HaTracker::default();
        let t0 = 1_000_000 * S;
        check(&tracker, "c", "a", t0);
        assert_eq!(publish(&tracker, t0)[0].received_at_ms, t0);
        check(&tracker, "c", "a", t0 + 5 * S);
        assert_eq!(
            publish(&tracker, t0 + 5 * S)[0].received_at_ms,
            t0,
            "within 15 s"
        );
        assert_eq!(publish(&tracker, t0 + 15 * S)[0].received_at_ms, t0 + 5 * S);
        let (forgotten, entries) = forgotten_at(&tracker, t0 + 5 * S + FORGET_AFTER_MS);
        assert!(entries.is_empty());
        assert_eq!(forgotten, [("t".to_string(), "c".to_string())]);
        assert_eq!(tracker.elected("t", "c"), None);
        // A tenant that stops deduplicating is forgotten at once, every cluster of it.
        check(&tracker, "c", "a", t0);
        check(&tracker, "d", "a", t0);
        let mut forgotten = Vec::new();
        let entries = tracker.to_publish(
            t0,
            |_| None,
            || 0.0,
            |tenant, cluster| forgotten.push(format!("{tenant}/{cluster}")),
        );
        assert!(entries.is_empty());
        forgotten.sort();
        assert_eq!(forgotten, ["t/c", "t/d"]);
        assert_eq!(tracker.elected("t", "c"), None);
    }
}

//! Per-process limits for all tenants together: in-flight requests, in-flight bytes and the
//! ingestion-rate EWMA. All are checked from headers alone, before the body is read, so an
//! overloaded replica sheds load cheaply.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use runtime_config::InstanceLimits;

use crate::metrics::{InstanceLimit, Metrics};

/// An exponentially weighted moving average of a per-second rate, as Mimir computes the
/// distributor ingestion rate: events are counted as they come, and [`Ewma::tick`] folds the
/// count into the average once per interval.
pub struct Ewma {
    alpha: f64,
    interval: Duration,
    pending: AtomicU64,
    /// f64 bits; written by the ticker only.
    rate: AtomicU64,
    initialized: AtomicBool,
}

impl Ewma {
    pub fn new(alpha: f64, interval: Duration) -> Self {
        Ewma {
            alpha,
            interval,
            pending: AtomicU64::new(0),
            rate: AtomicU64::new(0f64.to_bits()),
            initialized: AtomicBool::new(false),
        }
    }

    pub fn add(&self, count: u64) {
        self.pending.fetch_add(count, Ordering::Relaxed);
    }

    /// Folds the events since the last tick into the average. Call once per interval.
    pub fn tick(&self) {
        let instant = self.pending.swap(0, Ordering::Relaxed) as f64 / self.interval.as_secs_f64();
        let rate = if self.initialized.swap(true, Ordering::Relaxed) {
            let previous = f64::from_bits(self.rate.load(Ordering::Relaxed));
            previous + self.alpha * (instant - previous)
        } else {
            instant
        };
        self.rate.store(rate.to_bits(), Ordering::Relaxed);
    }

    pub fn rate(&self) -> f64 {
        f64::from_bits(self.rate.load(Ordering::Relaxed))
    }
}

/// Which instance limit a request broke, and its configured value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InstanceRejection {
    pub limit: InstanceLimit,
    pub value: f64,
}

/// The instance limits in force and the counters they are checked against.
pub struct InstanceLimiter {
    limits: ArcSwap<InstanceLimits>,
    inflight_requests: AtomicU64,
    inflight_bytes: AtomicU64,
    ingestion_rate: Ewma,
    /// [`InstanceLimiter::max_held_per_tenant`], kept beside the limits it follows so that
    /// the check on every push is one relaxed load.
    max_held_per_tenant: AtomicU64,
    metrics: Arc<Metrics>,
}

/// Holds a request's place in the in-flight counts until dropped (when the response is sent).
pub struct InflightGuard {
    limiter: Arc<InstanceLimiter>,
    bytes: u64,
}

/// One tenant may hold this share (1 / `HELD_SHARE`) of the in-flight cap in held pushes.
const HELD_SHARE: u64 = 10;

/// [`InstanceLimiter::max_held_per_tenant`] under `limits`.
fn held_bound(limits: &InstanceLimits) -> u64 {
    match limits.max_inflight_push_requests {
        0 => u64::MAX,
        max => (max / HELD_SHARE).max(1),
    }
}

/// Mimir's EWMA weight for the ingestion rate, ticked every second.
pub const INGESTION_RATE_ALPHA: f64 = 0.2;
pub const INGESTION_RATE_TICK: Duration = Duration::from_secs(1);

impl InstanceLimiter {
    pub fn new(limits: InstanceLimits, metrics: Arc<Metrics>) -> Arc<Self> {
        metrics.set_instance_limits(&limits);
        Arc::new(InstanceLimiter {
            max_held_per_tenant: AtomicU64::new(held_bound(&limits)),
            limits: ArcSwap::from_pointee(limits),
            inflight_requests: AtomicU64::new(0),
            inflight_bytes: AtomicU64::new(0),
            ingestion_rate: Ewma::new(INGESTION_RATE_ALPHA, INGESTION_RATE_TICK),
            metrics,
        })
    }

    pub fn set_limits(&self, limits: InstanceLimits) {
        self.metrics.set_instance_limits(&limits);
        self.max_held_per_tenant
            .store(held_bound(&limits), Ordering::Relaxed);
        self.limits.store(Arc::new(limits));
    }

    /// Admits a request into the in-flight counts, or says which instance limit it breaks.
    /// `content_length` is the header's value; a body without one is counted once read,
    /// through [`InflightGuard::add_bytes`].
    pub fn start(
        self: &Arc<Self>,
        content_length: Option<u64>,
    ) -> Result<InflightGuard, InstanceRejection> {
        let limits = self.limits.load();
        // Count first, then compare: concurrent requests can never all squeeze under the cap.
        let requests = self.inflight_requests.fetch_add(1, Ordering::AcqRel) + 1;
        self.metrics.inflight_push_requests.inc();
        let mut guard = InflightGuard {
            limiter: Arc::clone(self),
            bytes: 0,
        };
        if limits.max_inflight_push_requests > 0 && requests > limits.max_inflight_push_requests {
            return Err(self.reject(
                InstanceLimit::MaxInflightPushRequests,
                limits.max_inflight_push_requests as f64,
            ));
        }
        if limits.max_ingestion_rate > 0.0
            && self.ingestion_rate.rate() >= limits.max_ingestion_rate
        {
            return Err(self.reject(InstanceLimit::MaxIngestionRate, limits.max_ingestion_rate));
        }
        guard.add_bytes(content_length.unwrap_or(0))?;
        Ok(guard)
    }

    /// Counts admitted samples into the ingestion-rate EWMA.
    pub fn record_admitted(&self, samples: u64) {
        self.ingestion_rate.add(samples);
    }

    /// Folds the last second into the ingestion-rate EWMA; called every [`INGESTION_RATE_TICK`].
    pub fn tick(&self) {
        self.ingestion_rate.tick();
        self.metrics.ingestion_rate.set(self.ingestion_rate.rate());
    }

    /// How many of one tenant's pushes may be held (`--max-admission-delay`) on this replica
    /// at once: a tenth of `max_inflight_push_requests`, at least one; no bound without that
    /// cap. A held push stays in flight, so without this one tenant over its limit could fill
    /// the replica with held pushes and have every other tenant's refused.
    pub fn max_held_per_tenant(&self) -> u64 {
        self.max_held_per_tenant.load(Ordering::Relaxed)
    }

    pub fn inflight_requests(&self) -> u64 {
        self.inflight_requests.load(Ordering::Acquire)
    }

    /// Counts a refusal for `limit` and describes it.
    pub fn reject(&self, limit: InstanceLimit, value: f64) -> InstanceRejection {
        self.metrics
            .instance_rejected_requests
            .with_label_values(&[limit.reason()])
            .inc();
        InstanceRejection { limit, value }
    }
}

impl InflightGuard {
    /// Adds body bytes to the in-flight total, failing if that breaks the bytes cap.
    pub fn add_bytes(&mut self, bytes: u64) -> Result<(), InstanceRejection> {
        if bytes == 0 {
            return Ok(());
        }
        let limiter = &self.limiter;
        let total = limiter.inflight_bytes.fetch_add(bytes, Ordering::AcqRel) + bytes;
        self.bytes += bytes;
        limiter
            .metrics
            .inflight_push_requests_bytes
            .add(bytes as i64);
        let cap = limiter.limits.load().max_inflight_push_requests_bytes;
        if cap > 0 && total > cap {
            return Err(limiter.reject(InstanceLimit::MaxInflightPushRequestsBytes, cap as f64));
        }
        Ok(())
    }

    pub fn has_bytes(&self) -> bool {
        self.bytes > 0
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let limiter = &self.limiter;
        limiter.inflight_requests.fetch_sub(1, Ordering::AcqRel);
        limiter.metrics.inflight_push_requests.dec();
        if self.bytes > 0 {
            limiter
                .inflight_bytes
                .fetch_sub(self.bytes, Ordering::AcqRel);
            limiter
                .metrics
                .inflight_push_requests_bytes
                .sub(self.bytes as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(limits: InstanceLimits) -> Arc<InstanceLimiter> {
        InstanceLimiter::new(limits, Arc::new(Metrics::new()))
    }

    #[test]
    fn ewma_matches_mimir() {
        let ewma = Ewma::new(0.2, Duration::from_secs(1));
        ewma.add(1000);
        ewma.tick();
        assert_eq!(ewma.rate(), 1000.0, "the first tick takes the instant rate");
        ewma.add(2000);
        ewma.tick();
        assert_eq!(ewma.rate(), 1200.0);
        ewma.tick();
        assert_eq!(ewma.rate(), 960.0);
    }

    #[test]
    fn inflight_requests_cap_and_release() {
        let limiter = limiter(InstanceLimits {
            max_inflight_push_requests: 2,
            ..InstanceLimits::default()
        });
        let first = limiter.start(None).unwrap();
        let _second = limiter.start(None).unwrap();
        assert_eq!(
            limiter.start(None).err().map(|r| r.limit),
            Some(InstanceLimit::MaxInflightPushRequests)
        );
        assert_eq!(
            limiter.inflight_requests(),
            2,
            "a rejected request leaves no trace"
        );
        drop(first);
        assert!(limiter.start(None).is_ok());
    }

    #[test]
    fn inflight_bytes_cap_counts_content_length_and_late_bytes() {
        let limiter = limiter(InstanceLimits {
            max_inflight_push_requests_bytes: 100,
            ..InstanceLimits::default()
        });
        let held = limiter.start(Some(60)).unwrap();
        assert_eq!(
            limiter.start(Some(41)).err().map(|r| r.limit),
            Some(InstanceLimit::MaxInflightPushRequestsBytes)
        );
        let mut chunked = limiter.start(None).unwrap();
        assert_eq!(
            chunked.add_bytes(41).map_err(|r| r.limit),
            Err(InstanceLimit::MaxInflightPushRequestsBytes)
        );
        drop(chunked);
        drop(held);
        assert!(limiter.start(Some(100)).is_ok());
        assert_eq!(limiter.inflight_bytes.load(Ordering::Acquire), 0);
    }

    #[test]
    fn ingestion_rate_cap() {
        let limiter = limiter(InstanceLimits {
            max_ingestion_rate: 500.0,
            ..InstanceLimits::default()
        });
        limiter.record_admitted(499);
        limiter.tick();
        assert!(limiter.start(None).is_ok());
        limiter.record_admitted(501);
        limiter.tick(); // 499 + 0.2 × (501 − 499) = 499.4
        assert!(limiter.start(None).is_ok());
        limiter.record_admitted(10_000);
        limiter.tick();
        assert_eq!(
            limiter.start(None).err().map(|r| r.limit),
            Some(InstanceLimit::MaxIngestionRate)
        );
    }

    #[test]
    fn held_bound_follows_the_inflight_cap_across_reloads() {
        let uncapped = InstanceLimits {
            max_inflight_push_requests: 0,
            ..InstanceLimits::default()
        };
        let limiter = limiter(uncapped);
        assert_eq!(limiter.max_held_per_tenant(), u64::MAX, "no cap, no bound");
        limiter.set_limits(InstanceLimits {
            max_inflight_push_requests: 45,
            ..InstanceLimits::default()
        });
        assert_eq!(limiter.max_held_per_tenant(), 4);
        limiter.set_limits(InstanceLimits {
            max_inflight_push_requests: 3,
            ..InstanceLimits::default()
        });
        assert_eq!(limiter.max_held_per_tenant(), 1, "at least one");
        limiter.set_limits(uncapped);
        assert_eq!(limiter.max_held_per_tenant(), u64::MAX);
    }
}

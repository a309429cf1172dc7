//! The limit types an overrides file sets, and the rules a value must meet.
//!
//! Names and meanings follow Grafana Mimir's, so an operator's overrides file and habits carry
//! over. Every rate is **fleet-wide**: how a replica turns it into a local decision is the
//! distributor's business, not this crate's.

use serde::{Deserialize, Serialize};

/// How a tenant's fleet-wide limit becomes a replica's local decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RateLimitStrategy {
    /// Mimir's: local rate = tenant rate ÷ healthy replicas. Burst is not divided.
    Divided,
    /// Every replica keeps a view of one fleet-wide bucket: its own admissions at once, the
    /// peers' as gossip reports them. Holds under any load-balancer skew and any traffic
    /// shape, with no per-request coordination; the default.
    #[default]
    Weighted,
    /// The authoritative bucket lives in the shared store (Redis); replicas lease tokens
    /// from it. A hard limit, for as long as the store answers (see `on_store_failure`).
    Shared,
}

impl RateLimitStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            RateLimitStrategy::Divided => "divided",
            RateLimitStrategy::Weighted => "weighted",
            RateLimitStrategy::Shared => "shared",
        }
    }
}

/// What a `shared` tenant's decisions do while the store cannot answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum StoreFailurePolicy {
    /// Fall back to `weighted` (the fleet view over gossip) for the outage: availability
    /// first, the limit held approximately.
    #[default]
    Open,
    /// Refuse with 503 and `Retry-After` (`err-weir-store-unavailable`): nothing is admitted
    /// that the store did not grant.
    Closed,
}

impl StoreFailurePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            StoreFailurePolicy::Open => "open",
            StoreFailurePolicy::Closed => "closed",
        }
    }
}

/// One tenant's limits, fully resolved (defaults with the tenant's override applied).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TenantLimits {
    /// Samples + histograms + exemplars + metadata per second, fleet-wide. `0` rejects all
    /// ingestion (Mimir would still let one initial burst through; weir does not).
    pub ingestion_rate: f64,
    /// Largest number of samples (etc.) the bucket holds. Must be ≥ 1 unless the rate is 0.
    /// A single request larger than this can never pass.
    pub ingestion_burst_size: u64,
    /// Mimir's `ingestion_burst_factor`; 0 is off. Above 0 the burst is ⌈factor × rate⌉
    /// (already in `ingestion_burst_size`), and under `divided` each replica's is ⌈factor ×
    /// its share of the rate⌉, as each Mimir distributor's is.
    pub ingestion_burst_factor: f64,
    /// Push requests per second, fleet-wide. `0` means unlimited (Mimir's meaning).
    pub request_rate: f64,
    /// Largest number of requests the request bucket holds. Must be ≥ 1 when
    /// `request_rate` > 0 (Mimir would reject every request; weir refuses the config).
    pub request_burst_size: u64,
    /// How the fleet-wide limit becomes a local one.
    pub rate_limit_strategy: RateLimitStrategy,
    /// `shared` only: what decisions do while the store is down or slow.
    pub on_store_failure: StoreFailurePolicy,
    /// `shared` only: the bucket is split into this many sub-buckets with their own hash
    /// tags, each holding limit ÷ K, so a hot tenant's load lands on several Redis masters.
    /// A single request may then be at most burst ÷ K.
    pub store_shards: u32,
    /// Push requests of this tenant in flight at once, fleet-wide (shared among the
    /// replicas like a rate, or held in the store under `shared`); 0: no cap.
    pub max_inflight_push_requests: u64,
}

impl Default for TenantLimits {
    fn default() -> Self {
        TenantLimits {
            ingestion_rate: 10_000.0,
            ingestion_burst_size: 200_000,
            ingestion_burst_factor: 0.0,
            request_rate: 0.0,
            request_burst_size: 0,
            rate_limit_strategy: RateLimitStrategy::Weighted,
            on_store_failure: StoreFailurePolicy::Open,
            store_shards: 1,
            max_inflight_push_requests: 0,
        }
    }
}

/// A tenant's entry under `overrides:`. Every key is optional: what is missing is inherited
/// from the defaults.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub(crate) struct TenantOverride {
    pub ingestion_rate: Option<f64>,
    #[serde(default, deserialize_with = "crate::scalars::count")]
    pub ingestion_burst_size: Option<u64>,
    /// Mimir's `ingestion_burst_factor`: when above 0, the burst is the rate times this,
    /// whatever `ingestion_burst_size` says.
    pub ingestion_burst_factor: Option<f64>,
    pub request_rate: Option<f64>,
    #[serde(default, deserialize_with = "crate::scalars::count")]
    pub request_burst_size: Option<u64>,
    pub rate_limit_strategy: Option<RateLimitStrategy>,
    pub on_store_failure: Option<StoreFailurePolicy>,
    #[serde(default, deserialize_with = "crate::scalars::count")]
    pub store_shards: Option<u32>,
    #[serde(default, deserialize_with = "crate::scalars::count")]
    pub max_inflight_push_requests: Option<u64>,
}

impl TenantOverride {
    pub(crate) fn apply(&self, defaults: &TenantLimits) -> TenantLimits {
        let ingestion_rate = self.ingestion_rate.unwrap_or(defaults.ingestion_rate);
        let ingestion_burst_factor = self
            .ingestion_burst_factor
            .unwrap_or(defaults.ingestion_burst_factor);
        let ingestion_burst_size = if ingestion_burst_factor > 0.0 {
            // Mimir's `ceil(factor × rate)`; a product past u64 saturates.
            (ingestion_burst_factor * ingestion_rate).ceil() as u64
        } else {
            self.ingestion_burst_size
                .unwrap_or(defaults.ingestion_burst_size)
        };
        TenantLimits {
            ingestion_rate,
            ingestion_burst_size,
            ingestion_burst_factor,
            request_rate: self.request_rate.unwrap_or(defaults.request_rate),
            request_burst_size: self
                .request_burst_size
                .unwrap_or(defaults.request_burst_size),
            rate_limit_strategy: self
                .rate_limit_strategy
                .unwrap_or(defaults.rate_limit_strategy),
            on_store_failure: self.on_store_failure.unwrap_or(defaults.on_store_failure),
            store_shards: self.store_shards.unwrap_or(defaults.store_shards),
            max_inflight_push_requests: self
                .max_inflight_push_requests
                .unwrap_or(defaults.max_inflight_push_requests),
        }
    }
}

impl TenantLimits {
    /// Checks the rules a resolved set of limits must meet; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        check_rate("ingestion_rate", self.ingestion_rate)?;
        if !(self.ingestion_burst_factor >= 0.0 && self.ingestion_burst_factor.is_finite()) {
            return Err(format!(
                "ingestion_burst_factor must be 0 (off) or more, got {}",
                self.ingestion_burst_factor
            ));
        }
        check_rate("request_rate", self.request_rate)?;
        check_refill(
            "ingestion_rate",
            self.ingestion_rate,
            self.ingestion_burst_size,
        )?;
        check_refill("request_rate", self.request_rate, self.request_burst_size)?;
        if self.ingestion_rate > 0.0 && self.ingestion_burst_size == 0 {
            return Err(format!(
                "ingestion_burst_size is 0 while ingestion_rate is {}: no sample could ever \
                 pass; set ingestion_burst_size to at least the largest request's sample count",
                self.ingestion_rate
            ));
        }
        if !(1..=64).contains(&self.store_shards) {
            return Err(format!(
                "store_shards must be between 1 and 64, got {}",
                self.store_shards
            ));
        }
        if self.request_rate > 0.0 && self.request_burst_size == 0 {
            return Err(format!(
                "request_burst_size is 0 while request_rate is {}: Mimir reads this as a burst \
                 without bound, so no limit at all, which is surely not meant; set \
                 request_burst_size ≥ 1, or request_rate: 0 for unlimited",
                self.request_rate
            ));
        }
        Ok(())
    }
}

/// Per-process limits for all tenants together (`distributor_limits:`). `0` disables each.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct InstanceLimits {
    /// Push requests being handled at once by this replica, from request start to response.
    pub max_inflight_push_requests: u64,
    /// Sum of `Content-Length` of the push requests being handled at once by this replica.
    pub max_inflight_push_requests_bytes: u64,
    /// Samples per second this replica admits, as an exponentially weighted moving average.
    pub max_ingestion_rate: f64,
}

impl Default for InstanceLimits {
    fn default() -> Self {
        InstanceLimits {
            max_inflight_push_requests: 2000,
            max_inflight_push_requests_bytes: 0,
            max_ingestion_rate: 0.0,
        }
    }
}

/// The `distributor_limits:` section; missing keys inherit the defaults.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InstanceOverride {
    #[serde(default, deserialize_with = "crate::scalars::count")]
    pub max_inflight_push_requests: Option<u64>,
    #[serde(default, deserialize_with = "crate::scalars::count")]
    pub max_inflight_push_requests_bytes: Option<u64>,
    pub max_ingestion_rate: Option<f64>,
}

impl InstanceOverride {
    pub(crate) fn apply(&self, defaults: &InstanceLimits) -> InstanceLimits {
        InstanceLimits {
            max_inflight_push_requests: self
                .max_inflight_push_requests
                .unwrap_or(defaults.max_inflight_push_requests),
            max_inflight_push_requests_bytes: self
                .max_inflight_push_requests_bytes
                .unwrap_or(defaults.max_inflight_push_requests_bytes),
            max_ingestion_rate: self
                .max_ingestion_rate
                .unwrap_or(defaults.max_ingestion_rate),
        }
    }
}

impl InstanceLimits {
    pub fn validate(&self) -> Result<(), String> {
        check_rate("max_ingestion_rate", self.max_ingestion_rate)
    }
}

fn check_rate(key: &str, value: f64) -> Result<(), String> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(format!("{key} must be a finite number ≥ 0, got {value}"))
    }
}

/// The longest a limit may take to refill its burst, in seconds (ten years). The buckets keep
/// time in nanoseconds in 64 bits, about 584 years; a limit slower than this is refused at
/// load rather than enforced wrongly (a rate of 1e-12 once let everything through).
pub const MAX_REFILL_SECONDS: f64 = 10.0 * 365.25 * 86_400.0;

/// A positive `rate` (key `key`) refills `burst` within [`MAX_REFILL_SECONDS`].
pub fn check_refill(key: &str, rate: f64, burst: u64) -> Result<(), String> {
    let tokens = burst.max(1) as f64;
    if rate > 0.0 && tokens / rate > MAX_REFILL_SECONDS {
        return Err(format!(
            "{key} {rate} takes {:.3e} s to refill its burst of {burst}, longer than the ten \
             years a limit may take: raise it to at least {:.3e}",
            tokens / rate,
            tokens / MAX_REFILL_SECONDS,
        ));
    }
    Ok(())
}

/// The defaults that every tenant inherits, from flags or the `--config` file.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Defaults {
    pub tenant: TenantLimits,
    pub instance: InstanceLimits,
}

impl Defaults {
    pub fn validate(&self) -> Result<(), String> {
        self.tenant.validate()?;
        self.instance.validate()
    }
}

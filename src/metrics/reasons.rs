//! The label values of the discard and instance-limit families: Mimir's reason names.

/// Why a tenant's request or samples were discarded (`reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscardReason {
    /// Tenant ingestion rate (Mimir's `rate_limited`).
    RateLimited,
    /// Tenant request rate.
    RequestRateLimited,
    /// One request carried more than the ingestion burst: it can never pass.
    IngestionBurstExceeded,
    /// The body was over `--max-request-body-size`, compressed or not.
    RequestBodyTooLarge,
    /// The body was not valid snappy or not a valid `WriteRequest`.
    InvalidRequestBody,
    /// The tenant had `max_inflight_push_requests` pushes in flight, fleet-wide.
    TooManyInflightPushRequests,
    /// The push named a new HA cluster beyond the tenant's `ha_max_clusters`.
    TooManyHaClusters,
}

impl DiscardReason {
    pub const ALL: [DiscardReason; 7] = [
        DiscardReason::RateLimited,
        DiscardReason::RequestRateLimited,
        DiscardReason::IngestionBurstExceeded,
        DiscardReason::RequestBodyTooLarge,
        DiscardReason::InvalidRequestBody,
        DiscardReason::TooManyInflightPushRequests,
        DiscardReason::TooManyHaClusters,
    ];

    /// The reasons decided once the body is decoded, so with a known sample count.
    pub const COUNTS_SAMPLES: [DiscardReason; 3] = [
        DiscardReason::RateLimited,
        DiscardReason::IngestionBurstExceeded,
        DiscardReason::TooManyHaClusters,
    ];

    /// The `reason` of `weir_discarded_requests_total`: Mimir's `rate_limited` there is the
    /// request rate's; a push refused for its samples, which Mimir leaves out of that family,
    /// is `ingestion_rate_limited`. Elsewhere, [`DiscardReason::as_str`].
    pub fn request_reason(self) -> &'static str {
        match self {
            DiscardReason::RateLimited => "ingestion_rate_limited",
            DiscardReason::RequestRateLimited => "rate_limited",
            other => other.as_str(),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DiscardReason::RateLimited => "rate_limited",
            DiscardReason::RequestRateLimited => "request_rate_limited",
            DiscardReason::IngestionBurstExceeded => "ingestion_burst_exceeded",
            DiscardReason::RequestBodyTooLarge => "request_body_too_large",
            DiscardReason::InvalidRequestBody => "invalid_request_body",
            DiscardReason::TooManyInflightPushRequests => "too_many_inflight_push_requests",
            DiscardReason::TooManyHaClusters => "too_many_ha_clusters",
        }
    }
}

/// Why this replica refused a request for all tenants (`reason` label); Mimir's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceLimit {
    MaxInflightPushRequests,
    MaxInflightPushRequestsBytes,
    MaxIngestionRate,
    /// Tenants with limiter state on this replica (`--max-tenants`); only new tenants are refused.
    MaxTenants,
}

impl InstanceLimit {
    pub const ALL: [InstanceLimit; 4] = [
        InstanceLimit::MaxInflightPushRequests,
        InstanceLimit::MaxInflightPushRequestsBytes,
        InstanceLimit::MaxIngestionRate,
        InstanceLimit::MaxTenants,
    ];

    /// The key in `distributor_limits:` and the `limit` label of `weir_distributor_instance_limits`.
    pub fn key(self) -> &'static str {
        match self {
            InstanceLimit::MaxInflightPushRequests => "max_inflight_push_requests",
            InstanceLimit::MaxInflightPushRequestsBytes => "max_inflight_push_requests_bytes",
            InstanceLimit::MaxIngestionRate => "max_ingestion_rate",
            InstanceLimit::MaxTenants => "max_tenants",
        }
    }

    /// Where an operator raises this limit.
    pub fn setting(self) -> String {
        match self {
            InstanceLimit::MaxTenants => "the --max-tenants flag".to_string(),
            _ => format!("distributor_limits.{} in the runtime overrides", self.key()),
        }
    }

    /// The `reason` label of `weir_distributor_instance_rejected_requests_total`.
    pub fn reason(self) -> &'static str {
        match self {
            InstanceLimit::MaxInflightPushRequests => "distributor_max_inflight_push_requests",
            InstanceLimit::MaxInflightPushRequestsBytes => {
                "distributor_max_inflight_push_requests_bytes"
            }
            InstanceLimit::MaxIngestionRate => "distributor_max_ingestion_rate",
            InstanceLimit::MaxTenants => "distributor_max_tenants",
        }
    }
}

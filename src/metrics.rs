//! Every metric family weir exports, defined in one place and shaped after Mimir's
//! (`cortex_distributor_*`, `cortex_discarded_*`).
//!
//! Cardinality: families labelled `user` have one series per *active* tenant (per reason
//! where labelled so). A tenant's series are removed when its limiter state is evicted after
//! `--tenant-idle-timeout`, so random tenant IDs cannot grow them without bound.

use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

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
}

impl DiscardReason {
    pub const ALL: [DiscardReason; 6] = [
        DiscardReason::RateLimited,
        DiscardReason::RequestRateLimited,
        DiscardReason::IngestionBurstExceeded,
        DiscardReason::RequestBodyTooLarge,
        DiscardReason::InvalidRequestBody,
        DiscardReason::TooManyInflightPushRequests,
    ];

    /// The reasons decided once the body is decoded, so with a known sample count.
    pub const COUNTS_SAMPLES: [DiscardReason; 2] = [
        DiscardReason::RateLimited,
        DiscardReason::IngestionBurstExceeded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DiscardReason::RateLimited => "rate_limited",
            DiscardReason::RequestRateLimited => "request_rate_limited",
            DiscardReason::IngestionBurstExceeded => "ingestion_burst_exceeded",
            DiscardReason::RequestBodyTooLarge => "request_body_too_large",
            DiscardReason::InvalidRequestBody => "invalid_request_body",
            DiscardReason::TooManyInflightPushRequests => "too_many_inflight_push_requests",
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

pub struct Metrics {
    pub registry: Registry,
    pub requests_in: IntCounterVec,
    pub received_requests: IntCounterVec,
    pub received_samples: IntCounterVec,
    pub received_exemplars: IntCounterVec,
    pub received_metadata: IntCounterVec,
    pub discarded_requests: IntCounterVec,
    pub discarded_samples: IntCounterVec,
    pub instance_rejected_requests: IntCounterVec,
    pub inflight_push_requests: IntGauge,
    pub inflight_push_requests_bytes: IntGauge,
    pub ingestion_rate: Gauge,
    pub instance_limits: GaugeVec,
    pub push_duration: HistogramVec,
    pub tracked_tenants: IntGauge,
    pub runtime_alive_tasks: IntGauge,
    pub sink_requests: IntCounter,
    pub local_limit: GaugeVec,
    pub upstream_requests: IntCounterVec,
    pub upstream_duration: Histogram,
    pub ring_members: IntGaugeVec,
    pub ring_healthy_replicas: IntGauge,
    pub ring_healthy_changes: IntCounter,
    pub ring_rejected_usage_reports: IntCounter,
    pub ring_ignored_members: IntGauge,
    pub ring_rejected_gossip: IntCounter,
    pub http_refused_connections: IntCounter,
    pub http_open_connections: IntGauge,
    pub store_calls: IntCounterVec,
    pub store_call_duration: HistogramVec,
    pub store_breaker_state: IntGauge,
    pub store_lease_tokens: Histogram,
    pub store_tokens_leased: IntCounter,
    pub store_tokens_returned: IntCounter,
    pub store_policy_decisions: IntCounterVec,
}

/// One tenant's series, looked up once when the tenant is first seen so the push path does
/// no label hashing.
pub struct TenantMetrics {
    pub requests_in: IntCounter,
    pub received_requests: IntCounter,
    pub received_samples: IntCounter,
    pub received_exemplars: IntCounter,
    pub received_metadata: IntCounter,
    /// This replica's share of the tenant's request and ingestion rates (+Inf: unlimited).
    pub local_request_rate: Gauge,
    pub local_ingestion_rate: Gauge,
    discarded_requests: [IntCounter; DiscardReason::ALL.len()],
    /// Only for the reasons decided after the body was decoded (see
    /// [`DiscardReason::COUNTS_SAMPLES`]); the others never know a sample count.
    discarded_samples: [IntCounter; DiscardReason::COUNTS_SAMPLES.len()],
}

impl TenantMetrics {
    pub fn discard(&self, reason: DiscardReason, samples: u64) {
        self.discarded_requests[reason as usize].inc();
        if let Some(index) = DiscardReason::COUNTS_SAMPLES
            .iter()
            .position(|r| *r == reason)
        {
            self.discarded_samples[index].inc_by(samples);
        }
    }
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let vec = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(vec.clone()))
        .expect("unique metric");
    vec
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let r = &registry;
        let user = &["user"];
        let reason_user = &["reason", "user"];
        let metrics = Metrics {
            requests_in: counter_vec(
                r,
                "weir_distributor_requests_in_total",
                "Push requests received per tenant, including rejected ones.",
                user,
            ),
            received_requests: counter_vec(
                r,
                "weir_distributor_received_requests_total",
                "Push requests admitted per tenant.",
                user,
            ),
            received_samples: counter_vec(
                r,
                "weir_distributor_received_samples_total",
                "Samples and histograms admitted per tenant.",
                user,
            ),
            received_exemplars: counter_vec(
                r,
                "weir_distributor_received_exemplars_total",
                "Exemplars admitted per tenant.",
                user,
            ),
            received_metadata: counter_vec(
                r,
                "weir_distributor_received_metadata_total",
                "Metadata entries admitted per tenant.",
                user,
            ),
            discarded_requests: counter_vec(
                r,
                "weir_discarded_requests_total",
                "Push requests discarded per tenant, by reason.",
                reason_user,
            ),
            discarded_samples: counter_vec(
                r,
                "weir_discarded_samples_total",
                "Samples, histograms, exemplars and metadata discarded per tenant, by reason.",
                reason_user,
            ),
            instance_rejected_requests: counter_vec(
                r,
                "weir_distributor_instance_rejected_requests_total",
                "Push requests rejected for hitting this replica's instance limits.",
                &["reason"],
            ),
            inflight_push_requests: IntGauge::new(
                "weir_distributor_inflight_push_requests",
                "Push requests being handled by this replica.",
            )
            .expect("valid"),
            inflight_push_requests_bytes: IntGauge::new(
                "weir_distributor_inflight_push_requests_bytes",
                "Sum of Content-Length of the push requests being handled.",
            )
            .expect("valid"),
            ingestion_rate: Gauge::new(
                "weir_distributor_ingestion_rate_samples_per_second",
                "Admitted samples per second on this replica (EWMA, 1 s ticks), as checked \
                 against max_ingestion_rate.",
            )
            .expect("valid"),
            instance_limits: GaugeVec::new(
                Opts::new(
                    "weir_distributor_instance_limits",
                    "Instance limits in force on this replica (0 = off).",
                ),
                &["limit"],
            )
            .expect("valid"),
            push_duration: HistogramVec::new(
                HistogramOpts::new(
                    "weir_distributor_push_duration_seconds",
                    "Time to handle a push request, from headers to response, by status code.",
                )
                .buckets(vec![
                    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                    0.5, 1.0, 2.5, 5.0, 10.0,
                ]),
                &["status_code"],
            )
            .expect("valid"),
            runtime_alive_tasks: IntGauge::new(
                "weir_runtime_alive_tasks",
                "Tasks alive in this replica's async runtime (as Go's go_goroutines): flat under \
                 steady load, or something leaks.",
            )
            .expect("valid"),
            tracked_tenants: IntGauge::new(
                "weir_limiter_tracked_tenants",
                "Tenants with limiter state on this replica.",
            )
            .expect("valid"),
            upstream_requests: counter_vec(
                r,
                "weir_upstream_requests_total",
                "Forwards to the upstream receiver, by outcome: 2xx, 4xx, 5xx, timeout, error.",
                &["status_class"],
            ),
            upstream_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "weir_upstream_request_duration_seconds",
                    "Time from sending a push upstream to its answer.",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0,
                ]),
            )
            .expect("valid"),
            local_limit: GaugeVec::new(
                Opts::new(
                    "weir_limiter_local_limit",
                    "This replica's share of a tenant's fleet-wide limit, per second \
                 (+Inf: unlimited), by limit (request_rate, ingestion_rate).",
                ),
                &["user", "limit"],
            )
            .expect("valid"),
            ring_members: IntGaugeVec::new(
                Opts::new(
                    "weir_ring_members",
                    "Live ring members as this replica sees them, by state.",
                ),
                &["state"],
            )
            .expect("valid"),
            ring_healthy_replicas: IntGauge::new(
                "weir_ring_healthy_replicas",
                "Live ACTIVE replicas including this one: what divided limits divide by.",
            )
            .expect("valid"),
            ring_healthy_changes: IntCounter::new(
                "weir_ring_healthy_replicas_changes_total",
                "Times the healthy count changed (a flapping detector shows here).",
            )
            .expect("valid"),
            ring_rejected_usage_reports: IntCounter::new(
                "weir_ring_rejected_usage_reports_total",
                "Peer usage reports ignored: unreadable, or with absurd values (untrusted input).",
            )
            .expect("valid"),
            http_open_connections: IntGauge::new(
                "weir_http_open_connections",
                "HTTP connections open now (each holds a file descriptor and a task).",
            )
            .expect("valid"),
            http_refused_connections: IntCounter::new(
                "weir_http_refused_connections_total",
                "HTTP connections closed at once because --http-max-connections were open.",
            )
            .expect("valid"),
            ring_rejected_gossip: IntCounter::new(
                "weir_ring_rejected_gossip_total",
                "Gossip datagrams dropped because no configured key authenticated them.",
            )
            .expect("valid"),
            ring_ignored_members: IntGauge::new(
                "weir_ring_ignored_members",
                "Live members beyond --ring-max-members, ignored.",
            )
            .expect("valid"),
            sink_requests: IntCounter::new(
                "weir_sink_requests_total",
                "Admitted push requests acknowledged without forwarding (sink mode).",
            )
            .expect("valid"),
            store_calls: counter_vec(
                r,
                "weir_store_calls_total",
                "Calls to the shared store by operation (take, give_back) and outcome (ok, \
                 error, timeout).",
                &["op", "outcome"],
            ),
            store_call_duration: HistogramVec::new(
                HistogramOpts::new(
                    "weir_store_call_duration_seconds",
                    "Time from a store call to its answer (or its timeout), by operation.",
                )
                .buckets(vec![
                    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                ]),
                &["op"],
            )
            .expect("valid"),
            store_breaker_state: IntGauge::new(
                "weir_store_breaker_state",
                "The shared store's circuit breaker: 0 closed, 1 half-open, 2 open.",
            )
            .expect("valid"),
            store_lease_tokens: Histogram::with_opts(
                HistogramOpts::new(
                    "weir_store_lease_tokens",
                    "Tokens granted per lease from the shared store.",
                )
                .buckets(prometheus::exponential_buckets(1.0, 4.0, 12).expect("valid")),
            )
            .expect("valid"),
            store_tokens_leased: IntCounter::new(
                "weir_store_tokens_leased_total",
                "Tokens leased from the shared store.",
            )
            .expect("valid"),
            store_tokens_returned: IntCounter::new(
                "weir_store_tokens_returned_total",
                "Unspent leased tokens given back to the shared store.",
            )
            .expect("valid"),
            store_policy_decisions: counter_vec(
                r,
                "weir_store_policy_decisions_total",
                "Decisions for shared tenants taken under their on_store_failure policy while \
                 the store could not answer, by policy (open, closed) and outcome (admitted, \
                 refused).",
                &["policy", "outcome"],
            ),
            registry,
        };
        for collector in [
            Box::new(metrics.inflight_push_requests.clone())
                as Box<dyn prometheus::core::Collector>,
            Box::new(metrics.inflight_push_requests_bytes.clone()),
            Box::new(metrics.ingestion_rate.clone()),
            Box::new(metrics.instance_limits.clone()),
            Box::new(metrics.push_duration.clone()),
            Box::new(metrics.tracked_tenants.clone()),
            Box::new(metrics.runtime_alive_tasks.clone()),
            Box::new(metrics.sink_requests.clone()),
            Box::new(metrics.local_limit.clone()),
            Box::new(metrics.upstream_duration.clone()),
            Box::new(metrics.ring_members.clone()),
            Box::new(metrics.ring_healthy_replicas.clone()),
            Box::new(metrics.ring_healthy_changes.clone()),
            Box::new(metrics.ring_rejected_usage_reports.clone()),
            Box::new(metrics.ring_ignored_members.clone()),
            Box::new(metrics.ring_rejected_gossip.clone()),
            Box::new(metrics.http_refused_connections.clone()),
            Box::new(metrics.http_open_connections.clone()),
            Box::new(metrics.store_call_duration.clone()),
            Box::new(metrics.store_breaker_state.clone()),
            Box::new(metrics.store_lease_tokens.clone()),
            Box::new(metrics.store_tokens_leased.clone()),
            Box::new(metrics.store_tokens_returned.clone()),
        ] {
            metrics.registry.register(collector).expect("unique metric");
        }
        // process_resident_memory_bytes, process_open_fds, process_threads, … (Linux only).
        #[cfg(target_os = "linux")]
        metrics
            .registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("unique metric");
        for limit in InstanceLimit::ALL {
            metrics
                .instance_rejected_requests
                .with_label_values(&[limit.reason()]);
        }
        metrics
    }

    /// The tenant's series, created (with every discard reason at 0) on first sight.
    pub fn tenant(&self, tenant: &str) -> TenantMetrics {
        let series = |vec: &IntCounterVec, reason: DiscardReason| {
            vec.with_label_values(&[reason.as_str(), tenant])
        };
        TenantMetrics {
            requests_in: self.requests_in.with_label_values(&[tenant]),
            received_requests: self.received_requests.with_label_values(&[tenant]),
            received_samples: self.received_samples.with_label_values(&[tenant]),
            received_exemplars: self.received_exemplars.with_label_values(&[tenant]),
            received_metadata: self.received_metadata.with_label_values(&[tenant]),
            local_request_rate: self
                .local_limit
                .with_label_values(&[tenant, "request_rate"]),
            local_ingestion_rate: self
                .local_limit
                .with_label_values(&[tenant, "ingestion_rate"]),
            discarded_requests: DiscardReason::ALL
                .map(|reason| series(&self.discarded_requests, reason)),
            discarded_samples: DiscardReason::COUNTS_SAMPLES
                .map(|reason| series(&self.discarded_samples, reason)),
        }
    }

    /// Drops an evicted tenant's series.
    pub fn remove_tenant(&self, tenant: &str) {
        for vec in [
            &self.requests_in,
            &self.received_requests,
            &self.received_samples,
            &self.received_exemplars,
            &self.received_metadata,
        ] {
            let _ = vec.remove_label_values(&[tenant]);
        }
        for limit in ["request_rate", "ingestion_rate"] {
            let _ = self.local_limit.remove_label_values(&[tenant, limit]);
        }
        for reason in DiscardReason::ALL {
            let _ = self
                .discarded_requests
                .remove_label_values(&[reason.as_str(), tenant]);
        }
        for reason in DiscardReason::COUNTS_SAMPLES {
            let _ = self
                .discarded_samples
                .remove_label_values(&[reason.as_str(), tenant]);
        }
    }

    pub fn set_instance_limits(&self, limits: &runtime_config::InstanceLimits) {
        let values = [
            limits.max_inflight_push_requests as f64,
            limits.max_inflight_push_requests_bytes as f64,
            limits.max_ingestion_rate,
        ];
        for (limit, value) in InstanceLimit::ALL.iter().zip(values) {
            self.instance_limits
                .with_label_values(&[limit.key()])
                .set(value);
        }
    }

    pub fn render(&self) -> String {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            self.runtime_alive_tasks
                .set(runtime.metrics().num_alive_tasks() as i64);
        }
        prometheus::TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|err| format!("# error encoding metrics: {err}\n"))
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The limit engine's hooks: a tenant's series live and die with its limiter state.
#[derive(Clone)]
pub struct TenantSeries(pub std::sync::Arc<Metrics>);

impl engine::TenantHooks for TenantSeries {
    type Data = TenantMetrics;

    fn create(&self, tenant: &str) -> TenantMetrics {
        self.0.tenant(tenant)
    }

    fn evicted(&self, tenant: &str) {
        self.0.remove_tenant(tenant);
    }

    fn local_limits(&self, series: &TenantMetrics, local: &engine::LocalLimits) {
        series.local_request_rate.set(local.request.per_second());
        series
            .local_ingestion_rate
            .set(local.ingestion.per_second());
    }

    fn tracked(&self, tenants: usize) {
        self.0.tracked_tenants.set(tenants as i64);
    }
}

/// The shared store's metrics, fed by the engine.
pub struct StoreSeries(pub std::sync::Arc<Metrics>);

impl engine::StoreObserver for StoreSeries {
    fn call(&self, op: &'static str, outcome: &'static str, seconds: f64) {
        self.0.store_calls.with_label_values(&[op, outcome]).inc();
        self.0
            .store_call_duration
            .with_label_values(&[op])
            .observe(seconds);
    }

    fn leased(&self, tokens: u64) {
        self.0.store_lease_tokens.observe(tokens as f64);
        self.0.store_tokens_leased.inc_by(tokens);
    }

    fn returned(&self, tokens: u64) {
        self.0.store_tokens_returned.inc_by(tokens);
    }

    fn breaker(&self, state: engine::breaker::BreakerState) {
        self.0.store_breaker_state.set(state as i64);
    }

    fn policy_decision(&self, policy: runtime_config::StoreFailurePolicy, admitted: bool) {
        let outcome = if admitted { "admitted" } else { "refused" };
        self.0
            .store_policy_decisions
            .with_label_values(&[policy.as_str(), outcome])
            .inc();
    }
}

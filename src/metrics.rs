//! Every metric family weir exports, defined in one place and shaped after Mimir's
//! (`cortex_distributor_*`, `cortex_discarded_*`).
//!
//! Cardinality: families labelled `user` have one series per *active* tenant (per reason
//! where labelled so). A tenant's series live in its limiter state and go when that state is
//! evicted after `--tenant-idle-timeout`, so random tenant IDs cannot grow them without bound.
//!
//! The per-tenant series are not `prometheus` crate series: those cost about 6.8 KB per
//! tenant (a label map, a hash and a `Desc` per series). They are plain atomics in
//! [`TenantMetrics`], kept with the tenant's limiter state, and written straight into the
//! text exposition at scrape time ([`Metrics::render`]), under the same names and labels.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

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
    pub instance_rejected_requests: IntCounterVec,
    pub inflight_push_requests: IntGauge,
    pub inflight_push_requests_bytes: IntGauge,
    pub ingestion_rate: Gauge,
    pub instance_limits: GaugeVec,
    pub push_duration: HistogramVec,
    pub admission_delay: Histogram,
    pub tracked_tenants: IntGauge,
    pub runtime_alive_tasks: IntGauge,
    pub sink_requests: IntCounter,
    pub upstream_requests: IntCounterVec,
    pub upstream_duration: Histogram,
    pub ring_members: IntGaugeVec,
    pub ring_healthy_replicas: IntGauge,
    pub ring_healthy_changes: IntCounter,
    pub ring_rejected_usage_reports: IntCounter,
    pub ring_skipped_usage_entries: IntCounterVec,
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

/// A per-tenant counter: one atomic, no labels of its own (the tenant and reason are where
/// it is kept).
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.inc_by(1);
    }

    pub fn inc_by(&self, by: u64) {
        self.0.fetch_add(by, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A per-tenant gauge: an `f64` in an atomic.
#[derive(Debug, Default)]
pub struct Gauge64(AtomicU64);

impl Gauge64 {
    pub fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::Relaxed);
    }

    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// One tenant's series: 15 atomics (120 bytes), kept with its limiter state.
#[derive(Debug, Default)]
pub struct TenantMetrics {
    pub requests_in: Counter,
    pub received_requests: Counter,
    pub received_samples: Counter,
    pub received_exemplars: Counter,
    pub received_metadata: Counter,
    /// This replica's share of the tenant's request and ingestion rates (+Inf: unlimited).
    pub local_request_rate: Gauge64,
    pub local_ingestion_rate: Gauge64,
    discarded_requests: [Counter; DiscardReason::ALL.len()],
    /// Only for the reasons decided after the body was decoded (see
    /// [`DiscardReason::COUNTS_SAMPLES`]); the others never know a sample count.
    discarded_samples: [Counter; DiscardReason::COUNTS_SAMPLES.len()],
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

    pub fn discarded_requests(&self, reason: DiscardReason) -> u64 {
        self.discarded_requests[reason as usize].get()
    }
}

/// Every tenant's series, visited by whoever keeps them (the limiter): the scrape walks them
/// once per family.
pub trait TenantSource {
    fn for_each_tenant(&self, visit: &mut dyn FnMut(&str, &TenantMetrics));
}

/// No tenants (a registry without a limiter, e.g. in tests of the other families).
impl TenantSource for () {
    fn for_each_tenant(&self, _visit: &mut dyn FnMut(&str, &TenantMetrics)) {}
}

impl TenantSource for engine::Limiter<TenantSeries> {
    fn for_each_tenant(&self, visit: &mut dyn FnMut(&str, &TenantMetrics)) {
        engine::Limiter::for_each_tenant(self, |name, data| visit(name, data));
    }
}

/// A per-tenant family: its name, help, type, and how to write its series for one tenant.
struct TenantFamily {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    write: fn(&mut String, &'static str, &str, &TenantMetrics),
}

const TENANT_FAMILIES: [TenantFamily; 8] = [
    TenantFamily {
        name: "weir_distributor_requests_in_total",
        help: "Push requests received per tenant, including rejected ones.",
        kind: "counter",
        write: |out, name, user, m| per_user(out, name, user, &m.requests_in),
    },
    TenantFamily {
        name: "weir_distributor_received_requests_total",
        help: "Push requests admitted per tenant.",
        kind: "counter",
        write: |out, name, user, m| per_user(out, name, user, &m.received_requests),
    },
    TenantFamily {
        name: "weir_distributor_received_samples_total",
        help: "Samples and histograms admitted per tenant.",
        kind: "counter",
        write: |out, name, user, m| per_user(out, name, user, &m.received_samples),
    },
    TenantFamily {
        name: "weir_distributor_received_exemplars_total",
        help: "Exemplars admitted per tenant.",
        kind: "counter",
        write: |out, name, user, m| per_user(out, name, user, &m.received_exemplars),
    },
    TenantFamily {
        name: "weir_distributor_received_metadata_total",
        help: "Metadata entries admitted per tenant.",
        kind: "counter",
        write: |out, name, user, m| per_user(out, name, user, &m.received_metadata),
    },
    TenantFamily {
        name: "weir_discarded_requests_total",
        help: "Push requests discarded per tenant, by reason.",
        kind: "counter",
        write: |out, name, user, m| {
            for (reason, counter) in DiscardReason::ALL.iter().zip(&m.discarded_requests) {
                let labels = [("reason", reason.as_str()), ("user", user)];
                sample(out, name, &labels, counter.get() as f64);
            }
        },
    },
    TenantFamily {
        name: "weir_discarded_samples_total",
        help: "Samples, histograms, exemplars and metadata discarded per tenant, by reason.",
        kind: "counter",
        write: |out, name, user, m| {
            for (reason, counter) in DiscardReason::COUNTS_SAMPLES
                .iter()
                .zip(&m.discarded_samples)
            {
                let labels = [("reason", reason.as_str()), ("user", user)];
                sample(out, name, &labels, counter.get() as f64);
            }
        },
    },
    TenantFamily {
        name: "weir_limiter_local_limit",
        help: "This replica's share of a tenant's fleet-wide limit, per second (+Inf: \
               unlimited), by limit (request_rate, ingestion_rate).",
        kind: "gauge",
        write: |out, name, user, m| {
            let limits = [
                ("request_rate", m.local_request_rate.get()),
                ("ingestion_rate", m.local_ingestion_rate.get()),
            ];
            for (limit, value) in limits {
                sample(out, name, &[("user", user), ("limit", limit)], value);
            }
        },
    },
];

/// A family with one series per tenant, labelled `user` only.
fn per_user(out: &mut String, name: &str, user: &str, counter: &Counter) {
    sample(out, name, &[("user", user)], counter.get() as f64);
}

/// One line of the text exposition format: `name{label="value",…} value`.
fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    out.push_str(name);
    out.push('{');
    for (i, (label, value)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(label);
        out.push_str("=\"");
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push_str("} ");
    if value.is_infinite() {
        out.push_str(if value > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{value}");
    }
    out.push('\n');
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
        let metrics = Metrics {
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
            admission_delay: Histogram::with_opts(
                HistogramOpts::new(
                    "weir_distributor_admission_delay_seconds",
                    "How long pushes that were held for their tenant's limit waited before \
                     they were admitted (--max-admission-delay).",
                )
                .buckets(vec![
                    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                ]),
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
                "Peer usage reports ignored whole: a format this version does not read.",
            )
            .expect("valid"),
            // reason: one of ring::usage::EntryError's five, pre-created.
            ring_skipped_usage_entries: counter_vec(
                r,
                "weir_ring_skipped_usage_entries_total",
                "Entries skipped in peer usage reports (malformed, or absurd values); the rest \
                 of each report is used.",
                &["reason"],
            ),
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
            Box::new(metrics.admission_delay.clone()),
            Box::new(metrics.tracked_tenants.clone()),
            Box::new(metrics.runtime_alive_tasks.clone()),
            Box::new(metrics.sink_requests.clone()),
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
        for reason in ring::usage::EntryError::ALL {
            metrics
                .ring_skipped_usage_entries
                .with_label_values(&[reason.as_str()]);
        }
        metrics
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

    /// The text exposition: the registry's families, then the per-tenant families written
    /// straight from `tenants`' atomics (each tenant's series together under one family
    /// header, every family once).
    pub fn render(&self, tenants: &dyn TenantSource) -> String {
        let mut out = String::new();
        self.render_chunks(tenants, &mut |chunk| {
            out.push_str(&chunk);
            true
        });
        out
    }

    /// [`Metrics::render`] in chunks of about [`SCRAPE_CHUNK_BYTES`], handed to `sink` as
    /// they fill, so a scrape of many tenants never holds the whole text (100 000 tenants:
    /// about 100 MB). Stops writing once `sink` says the reader is gone.
    pub fn render_chunks(&self, tenants: &dyn TenantSource, sink: &mut dyn FnMut(String) -> bool) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            self.runtime_alive_tasks
                .set(runtime.metrics().num_alive_tasks() as i64);
        }
        let mut out = prometheus::TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|err| format!("# error encoding metrics: {err}\n"));
        let mut open = true;
        let mut flush = |out: &mut String, open: &mut bool, at_least: usize| {
            if *open && out.len() >= at_least {
                *open = sink(std::mem::replace(
                    out,
                    String::with_capacity(SCRAPE_CHUNK_BYTES + 1024),
                ));
            }
        };
        for family in &TENANT_FAMILIES {
            let _ = writeln!(out, "# HELP {} {}", family.name, family.help);
            let _ = writeln!(out, "# TYPE {} {}", family.name, family.kind);
            tenants.for_each_tenant(&mut |user, metrics| {
                if open {
                    (family.write)(&mut out, family.name, user, metrics);
                    flush(&mut out, &mut open, SCRAPE_CHUNK_BYTES);
                }
            });
        }
        flush(&mut out, &mut open, 1);
    }
}

/// The size of the pieces a scrape is sent in.
pub const SCRAPE_CHUNK_BYTES: usize = 256 << 10;

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

    fn create(&self, _tenant: &str) -> TenantMetrics {
        TenantMetrics::default()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Tenants kept in a plain list, as the limiter's map would hand them out.
    struct Tenants(Vec<(String, TenantMetrics)>);

    impl TenantSource for Tenants {
        fn for_each_tenant(&self, visit: &mut dyn FnMut(&str, &TenantMetrics)) {
            for (name, metrics) in &self.0 {
                visit(name, metrics);
            }
        }
    }

    fn tenants(count: usize) -> Tenants {
        Tenants(
            (0..count)
                .map(|i| {
                    let metrics = TenantMetrics::default();
                    metrics.received_samples.inc_by(i as u64);
                    metrics.discard(DiscardReason::RateLimited, 7);
                    metrics.local_ingestion_rate.set(f64::INFINITY);
                    (format!("tenant-{i}"), metrics)
                })
                .collect(),
        )
    }

    #[test]
    fn tenant_families_are_written_once_each_with_every_tenant() {
        let text = Metrics::new().render(&tenants(3));
        for family in &TENANT_FAMILIES {
            assert_eq!(text.matches(&format!("# TYPE {} ", family.name)).count(), 1);
        }
        assert!(text.contains("weir_distributor_received_samples_total{user=\"tenant-2\"} 2\n"));
        assert!(text.contains(
            "weir_discarded_samples_total{reason=\"rate_limited\",user=\"tenant-1\"} 7\n"
        ));
        assert!(text.contains(
            "weir_limiter_local_limit{user=\"tenant-0\",limit=\"ingestion_rate\"} +Inf\n"
        ));
        assert_eq!(text.matches("user=\"tenant-1\"").count(), 15);
    }

    #[test]
    fn a_big_scrape_comes_in_chunks_and_stops_when_the_reader_goes() {
        let metrics = Metrics::new();
        let many = tenants(5_000);
        let mut chunks = Vec::new();
        metrics.render_chunks(&many, &mut |chunk| {
            chunks.push(chunk);
            true
        });
        assert!(chunks.len() > 10, "{} chunks", chunks.len());
        assert!(chunks
            .iter()
            .all(|chunk| chunk.len() < SCRAPE_CHUNK_BYTES + 1024));
        // The tenant families are the same however they are cut (the process families before
        // them move between two renders).
        let tenant_part = |text: &str| {
            let start = text
                .find("# HELP weir_distributor_requests_in_total")
                .unwrap();
            text[start..].to_string()
        };
        assert_eq!(
            tenant_part(&chunks.concat()),
            tenant_part(&metrics.render(&many))
        );

        let mut calls = 0;
        metrics.render_chunks(&many, &mut |_| {
            calls += 1;
            false
        });
        assert_eq!(calls, 1, "nothing more is written for a reader that left");
    }

    #[test]
    fn label_values_are_escaped() {
        let mut out = String::new();
        sample(&mut out, "m", &[("user", "a\"b\\c\nd")], 1.0);
        assert_eq!(out, "m{user=\"a\\\"b\\\\c\\nd\"} 1\n");
    }
}

//! Every metric family of the client, registered in the service's own registry under the
//! prefix it chose: `<prefix>_weir_client_…`. No tenant or key label: the cardinality is
//! fixed (decision × source, RPC × result).

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

use crate::Source;

pub(crate) struct Metrics {
    /// `[allowed, refused][source]`, resolved once so a decision is one atomic add.
    decisions: [[IntCounter; 4]; 2],
    calls: IntCounterVec,
    call_seconds: HistogramVec,
    pub(crate) granted: IntCounter,
    pub(crate) given_back: IntCounter,
    pub(crate) breaker_open: IntGauge,
    pub(crate) keys: IntGauge,
    pub(crate) held: IntGauge,
}

const SOURCES: [Source; 4] = [
    Source::Lease,
    Source::Cold,
    Source::FailOpen,
    Source::FailClosed,
];

impl Metrics {
    pub(crate) fn new(prefix: &str, registry: Option<&Registry>) -> prometheus::Result<Metrics> {
        let name = |name: &str| {
            if prefix.is_empty() {
                format!("weir_client_{name}")
            } else {
                format!("{prefix}_weir_client_{name}")
            }
        };
        let decisions = IntCounterVec::new(
            Opts::new(
                name("decisions_total"),
                "Decisions taken in this process, by outcome and by what decided them.",
            ),
            &["decision", "source"],
        )?;
        let calls = IntCounterVec::new(
            Opts::new(
                name("fleet_calls_total"),
                "Calls to the weir fleet, by RPC and result.",
            ),
            &["rpc", "result"],
        )?;
        let call_seconds = HistogramVec::new(
            HistogramOpts::new(
                name("fleet_call_duration_seconds"),
                "How long calls to the weir fleet took.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
            ]),
            &["rpc"],
        )?;
        let granted = IntCounter::new(
            name("tokens_granted_total"),
            "Tokens the fleet lent this process.",
        )?;
        let given_back = IntCounter::new(
            name("tokens_given_back_total"),
            "Unspent tokens this process gave back to the fleet.",
        )?;
        let breaker_open = IntGauge::new(
            name("breaker_open"),
            "1 while the fleet is taken to be away and the failure policy applies.",
        )?;
        let keys = IntGauge::new(name("keys"), "(tenant, key) pairs with a local budget.")?;
        let held = IntGauge::new(
            name("concurrency_guards"),
            "Concurrency guards held (acquire), fleet leases or not.",
        )?;
        if let Some(registry) = registry {
            registry.register(Box::new(decisions.clone()))?;
            registry.register(Box::new(calls.clone()))?;
            registry.register(Box::new(call_seconds.clone()))?;
            registry.register(Box::new(granted.clone()))?;
            registry.register(Box::new(given_back.clone()))?;
            registry.register(Box::new(breaker_open.clone()))?;
            registry.register(Box::new(keys.clone()))?;
            registry.register(Box::new(held.clone()))?;
        }
        let outcome = |decision: &str| {
            SOURCES.map(|source| decisions.with_label_values(&[decision, source.name()]))
        };
        Ok(Metrics {
            decisions: [outcome("allowed"), outcome("refused")],
            calls,
            call_seconds,
            granted,
            given_back,
            breaker_open,
            keys,
            held,
        })
    }

    #[inline]
    pub(crate) fn decided(&self, allowed: bool, source: Source) {
        self.decisions[usize::from(!allowed)][source as usize].inc();
    }

    pub(crate) fn call(&self, rpc: &str, ok: bool, seconds: f64) {
        self.calls
            .with_label_values(&[rpc, if ok { "ok" } else { "error" }])
            .inc();
        let histogram: Histogram = self.call_seconds.with_label_values(&[rpc]);
        histogram.observe(seconds);
    }
}

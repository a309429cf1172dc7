//! The limit engine's observers, fed into the registry: a tenant's series live and die with
//! its limiter state (which a scrape reads its limits from), and the store reports its calls,
//! leases and breaker.

use super::registry::Metrics;
use super::tenant::{TenantMetrics, TenantRates, TenantSource};

/// The limit engine's hooks: a tenant's series live and die with its limiter state.
#[derive(Clone)]
pub struct TenantSeries(pub std::sync::Arc<Metrics>);

impl engine::TenantHooks for TenantSeries {
    type Data = TenantMetrics;

    fn create(&self, _tenant: &str) -> TenantMetrics {
        TenantMetrics::default()
    }

    fn evicted(&self, tenant: &str) {
        self.0.forget_tenant(tenant);
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

/// The limiter keeps the tenants' series: the scrape walks them there.
impl TenantSource for engine::Limiter<TenantSeries> {
    fn for_each_tenant(
        &self,
        rates: bool,
        visit: &mut dyn FnMut(&str, &TenantMetrics, TenantRates),
    ) {
        if !rates {
            let rates = TenantRates::default();
            return engine::Limiter::for_each_tenant(self, |name, data| visit(name, data, rates));
        }
        engine::Limiter::for_each_tenant_limits(self, |name, data, configured, local| {
            // As configured: `request_rate: 0` is unlimited, `ingestion_rate: 0` refuses all.
            let request = if configured.request_rate == 0.0 {
                f64::INFINITY
            } else {
                configured.request_rate
            };
            let rates = TenantRates {
                request,
                ingestion: configured.ingestion_rate,
                local_request: local.request.per_second(),
                local_ingestion: local.ingestion.per_second(),
            };
            visit(name, data, rates)
        });
    }
}

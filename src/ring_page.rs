//! `GET /ring`: the members, the healthy count and each active tenant's effective limits.
//! HTML for people; JSON for machines (`Accept: application/json` or `?format=json`).

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use ring::Member;
use serde::{Deserialize, Serialize};

use engine::{LocalLimit, TenantView};

use crate::state::AppState;

#[derive(Deserialize)]
pub struct RingQuery {
    format: Option<String>,
}

#[derive(Serialize)]
struct RingStatus {
    node_id: String,
    cluster_id: String,
    /// Where this replica serves the admission API.
    grpc_addr: String,
    healthy: usize,
    joined: bool,
    /// Seconds a live peer says its in-flight leases may still run, and a peer that died or
    /// left lately said its would: how long this replica's shares of in-flight caps may be
    /// held back after the ring changed (see `engine::maths::SlotHolds`).
    peers_lease_horizon: f64,
    departed_lease_horizon: f64,
    members: Vec<Member>,
    tenants: Vec<TenantLimitsView>,
}

/// Rates are per second; `null` means unlimited (a `request_rate` of 0 in the overrides).
#[derive(Serialize)]
struct TenantLimitsView {
    tenant: String,
    strategy: &'static str,
    request_rate: Option<f64>,
    request_burst_size: u64,
    local_request_rate: Option<f64>,
    ingestion_rate: f64,
    ingestion_burst_size: u64,
    local_ingestion_rate: Option<f64>,
    /// `weighted`: this replica's view of the fleet buckets, in tokens (below 0: debt);
    /// `null` under `divided` or when unlimited.
    fleet_request_tokens: Option<f64>,
    fleet_ingestion_tokens: Option<f64>,
    /// `weighted`: requests and items admitted here, and by the peers as gossip reported
    /// them, since this replica started tracking the tenant.
    admitted_requests_here: u64,
    admitted_items_here: u64,
    admitted_requests_by_peers: u64,
    admitted_items_by_peers: u64,
    /// `weighted`: new to the fleet, held to the even share until the peers' reports arrive.
    settling: bool,
}

/// JSON has no infinity: an unlimited rate is `null`.
fn local_rate(limit: LocalLimit) -> Option<f64> {
    Some(limit.per_second()).filter(|rate| rate.is_finite())
}

impl From<TenantView> for TenantLimitsView {
    fn from(view: TenantView) -> Self {
        TenantLimitsView {
            strategy: view.limits.rate_limit_strategy.as_str(),
            // 0 is unlimited for the request rate (Mimir's meaning), unlike the ingestion
            // rate, where 0 refuses everything.
            request_rate: Some(view.limits.request_rate).filter(|&rate| rate > 0.0),
            request_burst_size: view.limits.request_burst_size,
            local_request_rate: local_rate(view.local.request),
            ingestion_rate: view.limits.ingestion_rate,
            ingestion_burst_size: view.limits.ingestion_burst_size,
            local_ingestion_rate: local_rate(view.local.ingestion),
            fleet_request_tokens: view.fleet_level.0,
            fleet_ingestion_tokens: view.fleet_level.1,
            admitted_requests_here: view.admitted_here.0,
            admitted_items_here: view.admitted_here.1,
            admitted_requests_by_peers: view.admitted_by_peers.0,
            admitted_items_by_peers: view.admitted_by_peers.1,
            settling: view.settling,
            tenant: view.tenant,
        }
    }
}

pub async fn ring(
    State(state): State<Arc<AppState>>,
    Query(query): Query<RingQuery>,
    headers: HeaderMap,
) -> Response {
    let wants_json = query.format.as_deref() == Some("json")
        || headers
            .get(header::ACCEPT)
            .and_then(|accept| accept.to_str().ok())
            .is_some_and(|accept| accept.contains("application/json"));
    // Every active tenant is a row: with 100 000 of them the page is 15 MB of HTML or 39 MB
    // of JSON and takes about 0.4 s to write, so it is written off the async workers, where
    // it would stall the pushes behind it.
    let page = tokio::task::spawn_blocking(move || {
        let membership = Arc::clone(&state.membership.borrow());
        let status = RingStatus {
            node_id: state.config.node_id.clone(),
            cluster_id: state.config.ring_cluster_id(),
            grpc_addr: state.grpc_addr.to_string(),
            healthy: membership.healthy,
            joined: membership.joined,
            peers_lease_horizon: membership.peers_lease_horizon.as_secs_f64(),
            departed_lease_horizon: membership.departed_lease_horizon.as_secs_f64(),
            members: membership.members.clone(),
            tenants: state
                .limiter
                .tenant_views()
                .into_iter()
                .map(Into::into)
                .collect(),
        };
        if wants_json {
            Json(status).into_response()
        } else {
            Html(render_html(&status)).into_response()
        }
    })
    .await;
    page.unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn render_html(status: &RingStatus) -> String {
    let mut page = String::new();
    let _ = write!(
        page,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>weir ring</title>\
         <style>body{{font-family:sans-serif}}td,th{{padding:2px 10px;text-align:left}}</style>\
         </head><body><h1>weir ring</h1><p>This replica: <b>{}</b> in cluster <b>{}</b>. \
         Healthy replicas: <b>{}</b>{}.</p><h2>Members</h2><table><tr><th>node</th>\
         <th>state</th><th>gossip</th><th>http</th><th>version</th><th>last heard</th></tr>",
        escape(&status.node_id),
        escape(&status.cluster_id),
        status.healthy,
        if status.joined {
            ""
        } else {
            " (still joining)"
        },
    );
    for member in &status.members {
        let _ = write!(
            page,
            "<tr><td>{}{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1} s ago</td></tr>",
            escape(&member.node_id),
            if member.is_self { " (this replica)" } else { "" },
            member.state.as_str(),
            member.gossip_addr,
            escape(member.http_addr.as_deref().unwrap_or("")),
            escape(member.version.as_deref().unwrap_or("")),
            member.last_heard.as_secs_f64(),
        );
    }
    page.push_str(
        "</table><h2>Active tenants</h2><table><tr><th>tenant</th><th>strategy</th>\
         <th>request rate (fleet / here)</th><th>request burst</th>\
         <th>ingestion rate (fleet / here)</th><th>ingestion burst</th>\
         <th>fleet ingestion tokens (this view)</th><th>items admitted here / by peers</th></tr>",
    );
    let rate = |rate: Option<f64>| rate.map_or("unlimited".to_string(), |r| format!("{r:.1}"));
    for tenant in &status.tenants {
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{} / {}</td><td>{}</td><td>{} / {}</td><td>{}</td><td>{}</td><td>{} / {}</td></tr>",
            escape(&tenant.tenant),
            tenant.strategy,
            tenant
                .request_rate
                .map_or("unlimited".to_string(), |rate| rate.to_string()),
            rate(tenant.local_request_rate),
            tenant.request_burst_size,
            tenant.ingestion_rate,
            rate(tenant.local_ingestion_rate),
            tenant.ingestion_burst_size,
            tenant.fleet_ingestion_tokens.map_or("-".to_string(), |tokens| {
                format!("{tokens:.0}{}", if tenant.settling { " (settling)" } else { "" })
            }),
            tenant.admitted_items_here,
            tenant.admitted_items_by_peers,
        );
    }
    page.push_str("</table></body></html>\n");
    page
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

#[cfg(test)]
mod tests {
    use engine::LocalLimits;
    use runtime_config::Defaults;

    use super::*;

    #[test]
    fn an_unlimited_request_rate_is_null_in_json() {
        let view = |request_rate| {
            let mut limits = Defaults::default().tenant;
            limits.request_rate = request_rate;
            limits.request_burst_size = 10;
            let view = TenantView {
                tenant: "t".into(),
                limits,
                local: LocalLimits {
                    request: LocalLimit::Unlimited,
                    ingestion: LocalLimit::Deny,
                },
                fleet_level: (None, None),
                admitted_here: (0, 0),
                admitted_by_peers: (0, 0),
                settling: false,
            };
            serde_json::to_value(TenantLimitsView::from(view)).unwrap()
        };
        let unlimited = view(0.0);
        assert_eq!(
            unlimited["request_rate"],
            serde_json::Value::Null,
            "{unlimited}"
        );
        assert_eq!(unlimited["local_request_rate"], serde_json::Value::Null);
        assert_eq!(view(5.0)["request_rate"], 5.0);
    }
}

//! `run(config, listener, shutdown)`: the HTTP routes, the background tasks, and graceful
//! shutdown. `main` and the integration tests call the same function.
//!
//! Two sets of routes: what clients need (pushes, the admission API's JSON twin) and the
//! operator's pages (metrics, ring, runtime config, HA tracker), which list every tenant and
//! its limits. With `--admin-addr` the pages are served only on that second listener; the
//! probes (`/ready`, `/health`) are on both, since balancers probe the public port.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use ring::{Membership, Ring};
use runtime_config::{ReloadMetrics, Reloader, RenderMode, RuntimeConfig};
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::admin::AdminToken;
use crate::config::Config;
use engine::{EngineClock, Limiter, Shared, COARSE_CLOCK_TICK};

use crate::instance::{InstanceLimiter, INGESTION_RATE_TICK};
use crate::metrics::{InstanceLimit, Metrics, StoreSeries, TenantSeries};
use crate::state::AppState;
use crate::store::ConnectingStore;
use crate::upstream::Upstream;

/// Runs one replica on `listener` until `shutdown` resolves, then drains and returns.
/// A bad runtime config at start-up is an error here, before anything is served.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    run_with_clock(config, listener, shutdown, EngineClock::real()).await
}

/// [`run`] with the limiter's clock supplied, so tests can move time by hand.
pub async fn run_with_clock(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    clock: EngineClock,
) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new());
    metrics.count_tasks_of(tokio::runtime::Handle::current());
    // A bad token file stops start-up before anything is bound; later it is reloaded like
    // the credentials file.
    let admin_token = config
        .admin_token_file
        .as_deref()
        .map(|path| AdminToken::from_file(path, &metrics))
        .transpose()?
        .map(Arc::new);
    // A bad credentials file stops start-up too; later it is reloaded like the overrides.
    let auth = crate::auth::Authenticator::new(
        config.tenant_auth,
        config.auth_credentials_file.as_deref(),
        config.auth_failure_limits(),
        &metrics,
    )?;
    let reload_metrics = ReloadMetrics::new(&metrics.registry).context("registering metrics")?;
    let has_store = !config.store_url.is_empty();
    let mut reloader = Reloader::new(
        config.runtime_config.clone(),
        config.defaults(),
        reload_metrics,
    )
    .with_check(move |config| {
        if config.uses_shared_store() && !has_store {
            Err(
                "a tenant uses rate_limit_strategy: shared, which needs the shared store: \
                     start weir with --store-url (redis://host:6379)"
                    .to_string(),
            )
        } else {
            Ok(())
        }
    });
    let first = reloader
        .load_first()
        .with_context(|| match &config.runtime_config {
            Some(path) => format!(
                "loading runtime config {} (a bad file at start-up is fatal)",
                path.display()
            ),
            None => "the built-in defaults are invalid".to_string(),
        })?;
    if config.runtime_config.is_none() {
        tracing::info!(
            "no --runtime-config: every tenant gets the built-in defaults (--ingestion-rate, \
             --request-rate, …); name an overrides file to set limits per tenant"
        );
    }
    let first = Arc::new(first);
    let (config_tx, config_rx) = watch::channel(Arc::clone(&first));

    let store = has_store.then(|| {
        ConnectingStore::start(redis_store::RedisConfig {
            urls: config.store_url.clone(),
            connect_timeout: config.store_connect_timeout,
            response_timeout: config.store_timeout,
        })
    });
    let mut limiter = Limiter::with_clock(
        Arc::clone(&first),
        config.tenant_idle_timeout,
        TenantSeries(Arc::clone(&metrics)),
        clock,
    )
    .with_max_tenants(config.max_tenants)
    .with_max_admission_keys_per_tenant(config.admission_max_keys_per_tenant)
    .with_settling(settling_time(config.gossip_interval))
    .with_node_id(config.node_id.clone());
    if config.cell.is_some() {
        limiter = limiter.with_cells();
    }
    if let Some(store) = &store {
        let shared = Shared::new(
            Arc::clone(store) as Arc<dyn engine::Store>,
            config.shared(),
            Box::new(StoreSeries(Arc::clone(&metrics))),
        );
        limiter = limiter.with_shared(Arc::new(shared));
    }
    let address = listener.local_addr()?;
    let grpc_listener = TcpListener::bind(config.grpc_addr).await.with_context(|| {
        format!(
            "cannot listen for gRPC on {} (a second replica on one host needs its own \
             --grpc-addr, e.g. --grpc-addr 127.0.0.1:0)",
            config.grpc_addr
        )
    })?;
    let grpc_addr = grpc_listener.local_addr()?;
    let admin_listener = match config.admin_addr {
        Some(admin_addr) => Some(TcpListener::bind(admin_addr).await.with_context(|| {
            format!(
                "cannot listen on --admin-addr {admin_addr} (a second replica on one host \
                 needs its own, e.g. --admin-addr 127.0.0.1:0)"
            )
        })?),
        None => None,
    };
    let ring = Arc::new(
        Ring::join(config.ring(address, grpc_addr, config.gossip_keys()?))
            .await
            .context("joining the ring")?,
    );
    let instance = InstanceLimiter::new(first.instance, Arc::clone(&metrics));
    metrics
        .instance_limits
        .with_label_values(&[InstanceLimit::MaxTenants.key()])
        .set(config.max_tenants as f64);
    let upstream = config
        .upstream
        .as_deref()
        .map(|url| {
            Upstream::new(
                url,
                config.upstream_otlp.as_deref(),
                config.upstream_timeout,
                &config.upstream_tenant_header,
                config.upstream_tls(),
                config.http_workers(),
            )
        })
        .transpose()?;
    let server_cert = match (&config.http_tls_cert_file, &config.http_tls_key_file) {
        (Some(cert), Some(key)) => Some(
            crate::tls::ServerCert::load(cert, key).context("--http-tls-cert-file/-key-file")?,
        ),
        _ => None,
    };
    let http_client_ca = config
        .http_tls_client_ca_file
        .as_deref()
        .map(crate::tls::ClientCa::load)
        .transpose()
        .context("--http-tls-client-ca-file")?;
    let tls = server_cert
        .as_ref()
        .map(|cert| cert.acceptor_with(http_client_ca.clone(), &[b"h2", b"http/1.1"]))
        .transpose()?;
    // gRPC over TLS: HTTP/2 only, with its own certificate and optional client CA.
    let grpc_cert = match (&config.grpc_tls_cert_file, &config.grpc_tls_key_file) {
        (Some(cert), Some(key)) => Some(
            crate::tls::ServerCert::load(cert, key).context("--grpc-tls-cert-file/-key-file")?,
        ),
        _ => None,
    };
    let grpc_client_ca = config
        .grpc_tls_client_ca_file
        .as_deref()
        .map(crate::tls::ClientCa::load)
        .transpose()
        .context("--grpc-tls-client-ca-file")?;
    let grpc_tls = grpc_cert
        .as_ref()
        .map(|cert| cert.acceptor_with(grpc_client_ca.clone(), &[b"h2"]))
        .transpose()?;
    let state = Arc::new(AppState {
        upstream,
        store,
        retry_after: config.retry_after_policy(),
        limiter,
        instance,
        metrics,
        runtime_config: config_rx.clone(),
        membership: ring.membership(),
        draining: AtomicBool::new(false),
        ha: Arc::new(crate::ha::HaTracker::default()),
        grpc_addr,
        auth,
        config,
    });

    let period = state.config.runtime_config_period;
    let (stop_tx, stop_rx) = watch::channel(());
    let mut tasks = vec![
        tokio::spawn(reloader.run(period, config_tx, stopped(stop_rx.clone()))),
        spawn_config_applier(Arc::clone(&state), config_rx),
        spawn_membership_applier(Arc::clone(&state), ring.membership()),
        spawn_every(INGESTION_RATE_TICK, {
            let state = Arc::clone(&state);
            move || state.instance.tick()
        }),
        spawn_usage_publisher(Arc::clone(&state), Arc::clone(&ring)),
        spawn_ha_publisher(Arc::clone(&state), Arc::clone(&ring)),
        spawn_lease_returner(Arc::clone(&state)),
        spawn_lease_sweep(Arc::clone(&state), Arc::clone(&ring)),
        // The breaker closes when the store is back, with no `shared` traffic to probe it.
        tokio::spawn({
            let state = Arc::clone(&state);
            async move { state.limiter.probe_store().await }
        }),
        spawn_every(COARSE_CLOCK_TICK, {
            let state = Arc::clone(&state);
            move || {
                state.limiter.tick();
            }
        }),
        // Certificates renewed on disk are picked up with the runtime config's rhythm.
        spawn_every(period, {
            let state = Arc::clone(&state);
            let admin_token = admin_token.clone();
            move || {
                for cert in [&server_cert, &grpc_cert].into_iter().flatten() {
                    cert.reload_if_changed();
                }
                for ca in [&http_client_ca, &grpc_client_ca].into_iter().flatten() {
                    ca.reload_if_changed();
                }
                // The credentials file and the admin token, re-read when their content
                // changes.
                state.auth.reload_if_changed();
                if let Some(token) = &admin_token {
                    token.reload_if_changed();
                }
                if let Some(upstream) = &state.upstream {
                    upstream.reload_tls_if_changed();
                }
            }
        }),
        spawn_every(eviction_period(state.config.tenant_idle_timeout), {
            let state = Arc::clone(&state);
            move || {
                let evicted = state.limiter.evict_idle();
                if evicted > 0 {
                    tracing::debug!(evicted, "evicted idle tenants");
                }
            }
        }),
    ];
    tasks.extend(crate::cells::spawn(Arc::clone(&state)));

    tracing::info!(
        %address,
        runtime_config = %state
            .config
            .runtime_config
            .as_ref()
            .map_or_else(|| "(built-in defaults)".to_string(), |path| path.display().to_string()),
        "weir listening"
    );
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!(
        "weir listening on {scheme}://{address} (push: POST {scheme}://{address}/api/v1/push)"
    );
    let grpc_scheme = if grpc_tls.is_some() {
        "TLS"
    } else {
        "plaintext"
    };
    println!(
        "weir gRPC on {grpc_addr} ({grpc_scheme}; weir.admission.v1.Admission, Envoy \
         RateLimitService)"
    );
    log_tenant_auth(&state);
    let token_note = if admin_token.is_some() {
        ", behind --admin-token-file"
    } else {
        ""
    };
    match &admin_listener {
        Some(admin) => println!(
            "weir admin on {scheme}://{} ({ADMIN_PAGES}{token_note})",
            admin.local_addr()?
        ),
        None if admin_token.is_some() => tracing::info!(
            "no --admin-addr: the operator's pages ({ADMIN_PAGES}) are on the public HTTP \
             port, behind --admin-token-file"
        ),
        None => tracing::warn!(
            "no --admin-addr: the operator's pages ({ADMIN_PAGES}), which list every tenant \
             and its limits, are on the public HTTP port {address} for anyone who reaches it; \
             set --admin-addr to serve them apart, or --admin-token-file to require a token"
        ),
    }
    match &state.upstream {
        Some(upstream) => tracing::info!(
            upstream = %upstream.url(),
            upstream_otlp = %upstream.otlp_url(),
            "forwarding admitted writes"
        ),
        None => tracing::warn!(
            "SINK MODE: no --upstream is configured; admitted writes are acknowledged and \
             counted, then dropped"
        ),
    }

    let (grpc_stop_tx, grpc_stop_rx) = oneshot::channel::<()>();
    let grpc = tokio::spawn(serve_grpc(
        Arc::clone(&state),
        grpc_listener,
        grpc_tls,
        grpc_stop_rx,
    ));
    // The admin listener serves through the drain (a scrape during shutdown still works)
    // and stops after the HTTP listener. One worker thread: it serves a few scrapers.
    let (admin_stop_tx, admin_stop_rx) = oneshot::channel::<()>();
    let admin = admin_listener.map(|listener| {
        tokio::spawn(crate::http_serve::serve(
            listener,
            admin_router(Arc::clone(&state), admin_token.clone()),
            crate::http_serve::HttpLimits {
                workers: 1,
                pin_workers: crate::affinity::PinWorkers::Off,
                ..state.config.http_limits()
            },
            tls.clone(),
            // Counted with the HTTP listener's connections.
            crate::http_serve::ConnectionCounters {
                refused: state.metrics.http_refused_connections.clone(),
                open: state.metrics.http_open_connections.clone(),
                on_worker: Some(count_tasks_on(&state)),
            },
            async move {
                let _ = admin_stop_rx.await;
            },
        ))
    });
    let pages = if admin.is_some() {
        AdminPages::Apart
    } else {
        AdminPages::Here(admin_token)
    };
    let (drain_tx, drain_rx) = oneshot::channel::<()>();
    let server = crate::http_serve::serve(
        listener,
        router(Arc::clone(&state), pages),
        state.config.http_limits(),
        tls,
        crate::http_serve::ConnectionCounters {
            refused: state.metrics.http_refused_connections.clone(),
            open: state.metrics.http_open_connections.clone(),
            on_worker: Some(count_tasks_on(&state)),
        },
        async move {
            let _ = drain_rx.await;
        },
    );
    tokio::pin!(server);

    tokio::select! {
        served = &mut server => {
            stop(tasks, stop_tx);
            let _ = grpc_stop_tx.send(());
            let _ = admin_stop_tx.send(());
            ring.shutdown().await;
            served.context("cannot start the HTTP worker threads")?;
            anyhow::bail!("the HTTP server stopped");
        }
        _ = shutdown => {}
    }

    // Graceful shutdown: say not-ready and LEAVING first, so the balancer and the peers
    // (which re-divide at once) notice while this replica still serves; then refuse new
    // connections and let in-flight requests finish.
    let shutdown_started = tokio::time::Instant::now();
    state.draining.store(true, Ordering::SeqCst);
    tracing::info!(delay = ?state.config.shutdown_delay, "shutting down: /ready now answers 503, leaving the ring");
    // The server is polled throughout: during the delay it still accepts new connections
    // (the balancer may not have noticed yet).
    let mut server_stopped = false;
    tokio::select! {
        _ = &mut server => server_stopped = true,
        () = async {
            ring.leave().await;
            tokio::time::sleep_until(shutdown_started + state.config.shutdown_delay).await;
        } => {}
    }
    let _ = drain_tx.send(());
    let drain_timeout = state.config.shutdown_drain_timeout;
    if !server_stopped
        && tokio::time::timeout(drain_timeout, &mut server)
            .await
            .is_err()
    {
        tracing::warn!(
            inflight = state.instance.inflight_requests(),
            ?drain_timeout,
            "drain timeout: exiting with requests still in flight"
        );
    }
    stop(tasks, stop_tx);
    let _ = grpc_stop_tx.send(());
    let _ = admin_stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), grpc).await;
    if let Some(admin) = admin {
        let _ = tokio::time::timeout(Duration::from_secs(5), admin).await;
    }
    // Unspent leases go back to the store, so the fleet keeps them.
    state.limiter.return_leases(true).await;
    ring.shutdown().await;
    tracing::info!("shut down cleanly");
    Ok(())
}

/// The operator's pages, as the start-up messages name them.
const ADMIN_PAGES: &str = "/metrics, /ring, /runtime_config, /distributor/ha_tracker";

/// Where the public HTTP listener stands on the operator's pages.
pub enum AdminPages {
    /// Served here (no `--admin-addr`), behind the token if one is given.
    Here(Option<Arc<AdminToken>>),
    /// Served on `--admin-addr`: here they answer 404.
    Apart,
}

/// The public HTTP listener's routes: what clients need, the probes, and the operator's pages
/// unless they are [`AdminPages::Apart`].
pub fn router(state: Arc<AppState>, pages: AdminPages) -> Router {
    // The admission API's JSON twin checks the transfer coding in a layer; the push routes,
    // the hot path, check it themselves without one.
    let admission = Router::new()
        .route("/api/v1/allow", post(crate::admission_http::allow))
        .route(
            "/api/v1/allow_batch",
            post(crate::admission_http::allow_batch),
        )
        .route("/api/v1/acquire", post(crate::admission_http::acquire))
        .route("/api/v1/release", post(crate::admission_http::release))
        .route("/api/v1/renew", post(crate::admission_http::renew))
        .route_layer(axum::middleware::from_fn(
            crate::http_serve::only_chunked_transfer_coding,
        ));
    let router = Router::new()
        .route("/api/v1/push", post(crate::push::push))
        .route("/otlp/v1/metrics", post(crate::push::push_otlp))
        .merge(admission)
        .merge(probe_routes());
    match pages {
        AdminPages::Here(token) => router.merge(admin_routes(token)),
        AdminPages::Apart => router,
    }
    .with_state(state)
}

/// The `--admin-addr` listener's routes: the operator's pages and the probes.
pub fn admin_router(state: Arc<AppState>, token: Option<Arc<AdminToken>>) -> Router {
    probe_routes().merge(admin_routes(token)).with_state(state)
}

/// Never behind the token: a kubelet or a balancer probes without one.
fn probe_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/ready", get(ready))
        .route("/health", get(|| async { "ok\n" }))
}

/// The pages that list every tenant and its limits. `route_layer`: the token guards these
/// routes only, so an unknown path is still 404 rather than 401.
fn admin_routes(token: Option<Arc<AdminToken>>) -> Router<Arc<AppState>> {
    let routes = Router::new()
        .route("/metrics", get(metrics))
        .route("/runtime_config", get(runtime_config))
        .route("/ring", get(crate::ring_page::ring))
        .route("/distributor/ha_tracker", get(ha_tracker));
    match token {
        Some(token) => routes.route_layer(axum::middleware::from_fn_with_state(
            token,
            crate::admin::require_token,
        )),
        None => routes,
    }
}

/// `GET /distributor/ha_tracker`: the HA elections this replica holds, as JSON (Mimir's page
/// of that name shows the same as HTML).
async fn ha_tracker(State(state): State<Arc<AppState>>) -> axum::Json<Vec<crate::ha::Elected>> {
    axum::Json(state.ha.elections())
}

async fn metrics(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    // With many tenants a scrape is big (100 000 tenants: 1.5 M series, about 100 MB and a
    // third of a second to render), so it is rendered off the async workers (a scrape must not
    // stall the pushes queued behind it; the soak saw client queues fill during scrapes) and
    // sent in chunks as it is written, so it never sits in memory whole; gzip-compressed
    // (fast level) when the scraper accepts it, as Prometheus does. A reader that stops
    // reading for SCRAPE_STALL is dropped.
    let gzip = headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|coding| {
            let mut parts = coding.split(';');
            let name = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.parse::<f64>().ok())
                    == Some(0.0)
            });
            name.eq_ignore_ascii_case("gzip") && !refused
        });
    let body = written_off_workers(move |send| {
        if !gzip {
            state
                .metrics
                .render_chunks(&state.limiter, &mut |chunk| send(chunk.into_bytes()));
            return;
        }
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut open = true;
        state.metrics.render_chunks(&state.limiter, &mut |chunk| {
            use std::io::Write;
            open = encoder.write_all(chunk.as_bytes()).is_ok()
                && send(std::mem::take(encoder.get_mut()));
            open
        });
        if open {
            if let Ok(rest) = encoder.finish() {
                send(rest);
            }
        }
    });
    let mut response = (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::VARY,
        axum::http::HeaderValue::from_static("accept-encoding"),
    );
    if gzip {
        headers.insert(
            header::CONTENT_ENCODING,
            axum::http::HeaderValue::from_static("gzip"),
        );
    }
    response
}

/// How long a scrape waits for its reader to take the next chunk.
const SCRAPE_STALL: Duration = Duration::from_secs(30);

/// A response body that `write` writes on the blocking pool, off the async workers, handing
/// each chunk to `send` as it is written: a large page never sits in memory whole and never
/// stalls the pushes behind it. `send` answers false once the reader is gone or has not
/// taken a chunk for [`SCRAPE_STALL`]; `write` then stops.
fn written_off_workers(
    write: impl FnOnce(&mut dyn FnMut(Vec<u8>) -> bool) + Send + 'static,
) -> axum::body::Body {
    let (mut sender, body) = http_body_util::channel::Channel::<bytes::Bytes>::new(2);
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        write(&mut |bytes: Vec<u8>| {
            if bytes.is_empty() {
                return true;
            }
            let send =
                tokio::time::timeout(SCRAPE_STALL, sender.send_data(bytes::Bytes::from(bytes)));
            matches!(runtime.block_on(send), Ok(Ok(())))
        });
    });
    axum::body::Body::new(body)
}

async fn ready(State(state): State<Arc<AppState>>) -> Response {
    // The runtime config was loaded before the server started; what remains is the ring. The
    // shared store is reported, not required: a replica serves every tenant that does not
    // need it, and `shared` tenants follow their failure policy while it is away.
    if state.draining.load(Ordering::SeqCst) {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response()
    } else if !state.membership.borrow().joined {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "joining the ring: seeds not seen yet\n",
        )
            .into_response()
    } else if let Some(store) = &state.store {
        let reachable = store.reachable(state.config.store_timeout).await;
        let store = if reachable {
            "reachable"
        } else {
            "unreachable"
        };
        (StatusCode::OK, format!("ready\nshared store: {store}\n")).into_response()
    } else {
        (StatusCode::OK, "ready\n").into_response()
    }
}

#[derive(Deserialize)]
struct RuntimeConfigQuery {
    mode: Option<String>,
}

async fn runtime_config(
    State(state): State<Arc<AppState>>,
    Query(query): Query<RuntimeConfigQuery>,
) -> Response {
    let mode = match query.mode.as_deref() {
        None | Some("") | Some("full") => RenderMode::Full,
        Some("diff") => RenderMode::Diff,
        Some(other) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("unknown mode {other:?}: use ?mode=diff or no mode\n"),
            )
                .into_response()
        }
    };
    // As a scrape of `/metrics`: with many tenants the page is large (100 000 overridden
    // tenants: 128 MB, seconds to write), so it is written off the async workers and sent in
    // chunks as it is written; the config in force is taken first, so a reload is not held up.
    let config = Arc::clone(&state.runtime_config.borrow());
    let body = written_off_workers(move |send| {
        let mut chunk = String::new();
        let mut open = true;
        config.render_pieces(mode, &mut |piece| {
            chunk.push_str(piece);
            if chunk.len() >= crate::metrics::SCRAPE_CHUNK_BYTES {
                open = send(std::mem::take(&mut chunk).into_bytes());
            }
            open
        });
        if open {
            send(chunk.into_bytes());
        }
    });
    ([(header::CONTENT_TYPE, "text/yaml; charset=utf-8")], body).into_response()
}

/// Puts each newly loaded runtime config in force.
fn spawn_config_applier(
    state: Arc<AppState>,
    mut config_rx: watch::Receiver<Arc<RuntimeConfig>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        while config_rx.changed().await.is_ok() {
            let config = Arc::clone(&config_rx.borrow_and_update());
            state.instance.set_limits(config.instance);
            state.limiter.set_config(config);
        }
    })
}

/// Feeds each membership change to the limiter and the metrics: the healthy count (which
/// `divided` divides by), and the peers' usage (which `weighted` charges to its fleet views).
fn spawn_membership_applier(
    state: Arc<AppState>,
    mut membership_rx: watch::Receiver<Arc<Membership>>,
) -> JoinHandle<()> {
    let backdate = usage_age(state.config.gossip_interval);
    tokio::spawn(async move {
        let mut healthy = 0;
        let mut usage_round = 0;
        let mut peer_ha = Arc::new(Vec::new());
        loop {
            let membership = Arc::clone(&membership_rx.borrow_and_update());
            let rejected = membership.rejected_usage_reports;
            let counted = state.metrics.ring_rejected_usage_reports.get();
            if rejected > counted {
                state
                    .metrics
                    .ring_rejected_usage_reports
                    .inc_by(rejected - counted);
            }
            for (reason, &skipped) in ring::usage::EntryError::ALL
                .iter()
                .zip(&membership.skipped_usage_entries)
            {
                let counter = state
                    .metrics
                    .ring_skipped_usage_entries
                    .with_label_values(&[reason.as_str()]);
                if skipped > counter.get() {
                    counter.inc_by(skipped - counter.get());
                }
            }
            state
                .metrics
                .ring_ignored_members
                .set(membership.ignored_members as i64);
            for (reason, &rejected) in ring::auth::Rejection::ALL
                .iter()
                .zip(&membership.rejected_gossip)
            {
                let counter = state
                    .metrics
                    .ring_rejected_gossip
                    .with_label_values(&[reason.as_str()]);
                if rejected > counter.get() {
                    counter.inc_by(rejected - counter.get());
                }
            }
            if membership.healthy != healthy {
                if healthy != 0 {
                    state.metrics.ring_healthy_changes.inc();
                    tracing::info!(
                        from = healthy,
                        to = membership.healthy,
                        "healthy replica count changed"
                    );
                }
                healthy = membership.healthy;
                state.metrics.ring_healthy_replicas.set(healthy as i64);
            }
            state.limiter.set_ring_place(
                membership.healthy,
                membership.rank(),
                membership.joined,
                engine::maths::LeaseHorizons {
                    peers: membership.peers_lease_horizon,
                    departed: membership.departed_lease_horizon,
                },
            );
            if !Arc::ptr_eq(&membership.peer_ha, &peer_ha) {
                peer_ha = Arc::clone(&membership.peer_ha);
                for change in state.ha.merge(&peer_ha) {
                    crate::push::log_ha_change(&state, &change, "learnt from gossip");
                }
            }
            if membership.usage_round != usage_round {
                usage_round = membership.usage_round;
                state
                    .metrics
                    .ring_peer_usage_tenants
                    .set(membership.peer_usage_tenants as i64);
                // Every batch since the last: the watch keeps only the latest membership.
                for batch in membership.peer_usage.take() {
                    let changes: engine::PeerUsage = batch
                        .changed
                        .iter()
                        .map(|(tenant, usage)| {
                            let totals = engine::PeerTotals {
                                requests: usage.requests,
                                items: usage.items,
                                requests_level: usage.requests_level,
                                items_level: usage.items_level,
                                in_flight: usage.in_flight,
                                requests_refunded: usage.requests_refunded,
                                items_refunded: usage.items_refunded,
                            };
                            (Arc::clone(tenant), totals)
                        })
                        .collect();
                    state.limiter.apply_peer_usage(
                        Arc::new(changes),
                        backdate,
                        batch.stalled_since,
                    );
                    state.limiter.forget_peer_usage(&batch.forgotten);
                }
            }
            for (member_state, count) in membership.count_by_state() {
                state
                    .metrics
                    .ring_members
                    .with_label_values(&[member_state])
                    .set(count as i64);
            }
            if membership_rx.changed().await.is_err() {
                return;
            }
        }
    })
}

/// Publishes this replica's admissions under `weighted` to the ring twice per gossip round,
/// so each round carries news at most half a round old. With no live peer to read them, it
/// sleeps until one joins: the counts are cumulative, so the first publication after tells
/// a new peer all it would have read.
fn spawn_usage_publisher(state: Arc<AppState>, ring: Arc<Ring>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(state.config.gossip_interval / 2);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut membership_rx = ring.membership();
        let mut last_round = std::time::Instant::now();
        // How many reports the last message held, when it could not hold them all.
        let mut fitted: Option<usize> = None;
        loop {
            ticker.tick().await;
            // This process did not run for a while: the peers may have counted it out, and
            // forgive what it counts on its return unless it says it was stalled.
            let mut stalled = last_round.elapsed() > ring.stall_after();
            while !membership_rx.borrow_and_update().has_live_peer() {
                stalled = false;
                if membership_rx.changed().await.is_err() {
                    return;
                }
            }
            // As many as the last message held and a quarter more, when it was full: the
            // most that could fit (every name as short as can be) is twice what does.
            let most = match fitted {
                Some(fitted) => (fitted + fitted / 4 + 16).min(ring.usage_entries_max()),
                None => ring.usage_entries_max(),
            };
            let reports: Vec<ring::UsageEntry> = state
                .limiter
                .usage_reports_first(most)
                .into_iter()
                .map(|report| ring::UsageEntry {
                    tenant: report.tenant,
                    requests: report.requests,
                    items: report.items,
                    requests_level: report.requests_level,
                    items_level: report.items_level,
                    in_flight: report.in_flight,
                })
                .collect();
            if stalled {
                tracing::info!(
                    "this process did not run for {:?}: its usage report says so, and the \
                     peers charge what it admits on its return",
                    last_round.elapsed()
                );
            }
            let listed = ring.publish_usage(&reports, stalled).await;
            fitted = (listed < reports.len()).then_some(listed);
            last_round = std::time::Instant::now();
            state.limiter.mark_listed(
                reports[..listed]
                    .iter()
                    .map(|r| (r.tenant.as_str(), r.requests, r.items, r.in_flight)),
            );
        }
    })
}

/// Publishes the HA elections this replica has seen traffic for, twice per gossip round
/// (an election's news changes at most once per its update timeout; see [`crate::ha`]).
/// With no election to publish or forget, it sleeps until one is made or learnt.
fn spawn_ha_publisher(state: Arc<AppState>, ring: Arc<Ring>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(state.config.gossip_interval / 2);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let config = state.limiter.runtime_config();
            let entries = state.ha.to_publish(
                crate::push::unix_millis(),
                |tenant| config.ha_limits(tenant),
                || rand::random_range(-1.0..1.0),
                |tenant, cluster| state.metrics.forget_ha_cluster(tenant, cluster),
            );
            drop(config);
            let listed = ring.publish_ha(&entries).await;
            if listed < entries.len() {
                tracing::warn!(
                    listed,
                    elections = entries.len(),
                    "more HA elections than the gossip key holds: the least recently heard \
                     are not published"
                );
            }
            if entries.is_empty() {
                state.ha.until_tracking().await;
            }
        }
    })
}

/// Every lease window: gives expired and surplus leased tokens back to the shared store.
fn spawn_lease_returner(state: Arc<AppState>) -> JoinHandle<()> {
    tokio::spawn(async move {
        if state.store.is_none() {
            return;
        }
        let mut ticker = tokio::time::interval(state.config.store_lease_window);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            state.limiter.return_leases(false).await;
        }
    })
}

/// While the admission API holds leases, frees those past their deadline every
/// [`engine::admission::LEASE_SWEEP`]; while it holds none, sleeps.
/// Each sweep also tells the ring how long the longest lease may still be held, so the
/// peers keep this replica's share unused that long if it dies or leaves.
fn spawn_lease_sweep(state: Arc<AppState>, ring: Arc<Ring>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            ring.publish_lease_horizon(state.limiter.lease_horizon())
                .await;
            state.limiter.until_leases_held().await;
            tokio::time::sleep(engine::admission::LEASE_SWEEP).await;
            state.limiter.expire_leases();
        }
    })
}

/// About how old a peer's admissions are when this replica applies them: half a publishing
/// period before they are published, half a gossip round in transit, a quarter round until
/// the observer reads them. Charged that far back, a report costs what the admissions cost
/// when they happened; the estimate errs short, which errs on the cautious side.
fn usage_age(gossip_interval: Duration) -> Duration {
    gossip_interval * 3 / 4
}

/// How long a tenant new to the whole fleet is held to the even share: long enough for every
/// peer to publish and gossip its first admissions of it.
fn settling_time(gossip_interval: Duration) -> Duration {
    (gossip_interval * 5).max(Duration::from_secs(1))
}

/// States at start-up how requests prove their tenant, and warns loudly when they do not.
fn log_tenant_auth(state: &AppState) {
    use crate::auth::Mode;
    match state.auth.mode() {
        Mode::Header => tracing::warn!(
            "TENANT AUTHENTICATION IS OFF (--tenant-auth header): any client that reaches \
             weir can claim any tenant in X-Scope-OrgID or an admission call, and spend (or \
             exhaust) that tenant's limits. Run it only behind a proxy that authenticates \
             clients and sets the tenant, or set --tenant-auth tokens or mtls"
        ),
        mode => {
            tracing::info!(
                tenant_auth = mode.as_str(),
                credentials = state.auth.credentials(),
                file = %state
                    .config
                    .auth_credentials_file
                    .as_deref()
                    .map_or_else(String::new, |path| path.display().to_string()),
                "tenant authentication on every door (push, OTLP, admission API, Envoy RLS)"
            );
            println!(
                "weir tenant authentication: {} ({} credentials)",
                mode.as_str(),
                state.auth.credentials()
            );
            if mode == Mode::Mtls && state.config.grpc_tls_client_ca_file.is_none() {
                tracing::warn!(
                    "--tenant-auth mtls without --grpc-tls-client-ca-file: every gRPC call \
                     (admission API, Envoy RLS) will be refused as unauthenticated"
                );
            }
            if mode == Mode::Mtls && state.config.http_tls_client_ca_file.is_none() {
                tracing::warn!(
                    "--tenant-auth mtls without --http-tls-client-ca-file: every HTTP push \
                     and admission call will be refused as unauthenticated"
                );
            }
        }
    }
}

/// The admission API and Envoy's rate-limit service, until `stop` fires.
async fn serve_grpc(
    state: Arc<AppState>,
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    stop: oneshot::Receiver<()>,
) {
    use crate::grpc::proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
    use crate::grpc::proto::weir::admission::v1::admission_server::AdmissionServer;
    // The same bounds as the HTTP listener where tonic has them: streams per connection,
    // keep-alive pings that drop dead peers, header size; a TLS handshake within the header
    // read timeout.
    let limits = state.config.http_limits();
    let incoming = crate::grpc::incoming(listener, tls, limits.header_read_timeout);
    let result = tonic::transport::Server::builder()
        .max_concurrent_streams(256)
        .http2_keepalive_interval(Some(limits.header_read_timeout))
        .http2_keepalive_timeout(Some(limits.header_read_timeout))
        .http2_max_header_list_size(limits.max_header_bytes.min(u32::MAX as usize) as u32)
        .add_service(AdmissionServer::new(crate::grpc::AdmissionService {
            state: Arc::clone(&state),
        }))
        .add_service(RateLimitServiceServer::new(crate::grpc::RateLimitService {
            state,
        }))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stop.await;
        })
        .await;
    if let Err(err) = result {
        tracing::error!(%err, "gRPC server failed");
    }
}

fn spawn_every(period: Duration, mut work: impl FnMut() + Send + 'static) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            work();
        }
    })
}

/// Sweep often enough that a tenant lingers at most ~25 % past its idle timeout.
fn eviction_period(idle_timeout: Duration) -> Duration {
    (idle_timeout / 4).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

async fn stopped(mut stop_rx: watch::Receiver<()>) {
    let _ = stop_rx.changed().await;
}

fn stop(tasks: Vec<JoinHandle<()>>, stop_tx: watch::Sender<()>) {
    let _ = stop_tx.send(());
    for task in tasks {
        task.abort();
    }
}

/// Counts the tasks on an HTTP worker's runtime in `weir_runtime_alive_tasks`.
fn count_tasks_on(state: &Arc<AppState>) -> Arc<dyn Fn(tokio::runtime::Handle) + Send + Sync> {
    let metrics = Arc::clone(&state.metrics);
    Arc::new(move |handle| metrics.count_tasks_of(handle))
}

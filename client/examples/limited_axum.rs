//! An axum service whose routes are limited by a weir fleet, decided in-process.
//!
//! ```sh
//! cargo run --release -- --runtime-config runtime-config/overrides.yaml   # a weir replica
//! cargo run -p weir-client --example limited_axum
//! curl -i localhost:3000/search -H 'X-Tenant: example-tenant'
//! ```
//!
//! `WEIR_GRPC` (default `http://127.0.0.1:9095`) names the replica, `LISTEN` (default
//! `127.0.0.1:3000`) the service's address.

use axum::extract::Request;
use axum::routing::get;
use axum::Router;
use weir_client::{Client, FailurePolicy, RateLimitLayer, Target};

#[tokio::main]
pub async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let weir = std::env::var("WEIR_GRPC").unwrap_or_else(|_| "http://127.0.0.1:9095".into());
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".into());

    // The limiter: a client of the fleet, and a layer that names each request's limit.
    let registry = prometheus::Registry::new();
    let client = Client::builder(weir)
        .prefix("example")
        .registry(&registry)
        .failure_policy(FailurePolicy::Open)
        .build()?;
    let limit = RateLimitLayer::new(client, |request: &Request| {
        let tenant = request.headers().get("x-tenant")?.to_str().ok()?;
        let route = format!("{} {}", request.method(), request.uri().path());
        Some(Target::new(tenant, route))
    });

    let app = Router::new()
        .route("/search", get(|| async { "results\n" }))
        .layer(limit)
        .route(
            "/metrics",
            get(move || async move {
                prometheus::TextEncoder::new()
                    .encode_to_string(&registry.gather())
                    .unwrap_or_default()
            }),
        );
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("limited_axum listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

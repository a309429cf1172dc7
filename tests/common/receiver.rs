//! A remote-write receiver a test serves on loopback: every request weir forwards to it is
//! kept, headers and body, for the test to read; each is answered 204 (a receiver that says
//! nothing of what it wrote).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;

#[derive(Clone, Default)]
pub struct Receiver {
    received: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
}

async fn receive(State(receiver): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    receiver.received.lock().unwrap().push((headers, body));
    StatusCode::NO_CONTENT
}

impl Receiver {
    /// Serves `POST /api/v1/write` (and `/api/v1/otlp/v1/metrics`, where weir forwards OTLP)
    /// on a free loopback port; returns the address.
    pub async fn serve(&self) -> SocketAddr {
        let app = Router::new()
            .route("/api/v1/write", post(receive))
            .route("/api/v1/otlp/v1/metrics", post(receive))
            .with_state(self.clone());
        super::serve_on_loopback(app).await
    }

    /// Every request received since the last look.
    pub fn take(&self) -> Vec<(HeaderMap, Bytes)> {
        std::mem::take(&mut *self.received.lock().unwrap())
    }

    /// The bodies of every request received since the last look.
    pub fn take_bodies(&self) -> Vec<Bytes> {
        self.take().into_iter().map(|(_, body)| body).collect()
    }

    /// The one request received since the last look.
    pub fn one(&self) -> (HeaderMap, Bytes) {
        let mut received = self.take();
        assert_eq!(received.len(), 1, "one forward");
        received.remove(0)
    }
}

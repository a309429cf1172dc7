//! The open-loop load of the cells tests (`tests/cells.rs`, `tests/cells_cut.rs`): per cell, a
//! demand in items/s sent as pushes of [`ITEMS_PER_PUSH`] items to that cell's replicas in
//! turn, every answer recorded (when it was sent, how long it took, 2xx or 429). Every figure
//! those tests state is computed here from the answers, never read from weir.
//!
//! Included by path (`#[path = "common/cells_load.rs"]`), not from `common/mod.rs`, so the
//! other tests do not compile it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weir::remote_write::prompb::WriteRequest;

use crate::common::fleet::Replica;

pub const ITEMS_PER_PUSH: usize = 100;

/// One push as the test saw it.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    pub cell: usize,
    /// Seconds since the load started.
    pub sent: f64,
    pub latency: Duration,
    pub admitted: bool,
    pub refused: bool,
}

/// An open-loop sender: per cell, a demand in items/s spread over that cell's targets.
pub struct Load {
    pub demand: Mutex<[f64; 3]>,
    pub targets: Mutex<[Vec<SocketAddr>; 3]>,
    pub records: Mutex<Vec<Record>>,
    started: Instant,
}

impl Load {
    pub fn start(targets: [Vec<SocketAddr>; 3]) -> Arc<Load> {
        let load = Arc::new(Load {
            demand: Mutex::new([0.0; 3]),
            targets: Mutex::new(targets),
            records: Mutex::new(Vec::new()),
            started: Instant::now(),
        });
        let driver = Arc::clone(&load);
        tokio::spawn(async move {
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap();
            let body = WriteRequest::synthetic(ITEMS_PER_PUSH, 1, 1).encode_snappy();
            let tick = Duration::from_millis(20);
            let mut ticker = tokio::time::interval(tick);
            let mut credit = [0.0f64; 3];
            let mut next = [0usize; 3];
            loop {
                ticker.tick().await;
                let demand = *driver.demand.lock().unwrap();
                for cell in 0..3 {
                    credit[cell] += demand[cell] * tick.as_secs_f64();
                    while credit[cell] >= ITEMS_PER_PUSH as f64 {
                        credit[cell] -= ITEMS_PER_PUSH as f64;
                        let targets = driver.targets.lock().unwrap()[cell].clone();
                        let target = targets[next[cell] % targets.len()];
                        next[cell] += 1;
                        let request = crate::common::push_request(
                            &client,
                            &format!("http://{target}"),
                            Some("t"),
                            body.clone(),
                        );
                        let load = Arc::clone(&driver);
                        tokio::spawn(async move {
                            let sent = Instant::now();
                            let status = request.send().await.map(|r| r.status().as_u16());
                            let record = Record {
                                cell,
                                sent: sent.duration_since(load.started).as_secs_f64(),
                                latency: sent.elapsed(),
                                admitted: matches!(status, Ok(200..=299)),
                                refused: matches!(status, Ok(429)),
                            };
                            load.records.lock().unwrap().push(record);
                        });
                    }
                }
            }
        });
        load
    }

    pub fn set(&self, demand: [f64; 3]) -> f64 {
        *self.demand.lock().unwrap() = demand;
        self.now()
    }

    pub fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Admitted items per second in `cells` for pushes sent in [from, to).
    pub fn admitted(&self, cells: &[usize], from: f64, to: f64) -> f64 {
        let records = self.records.lock().unwrap();
        let admitted = records
            .iter()
            .filter(|r| cells.contains(&r.cell) && r.sent >= from && r.sent < to && r.admitted)
            .count();
        (admitted * ITEMS_PER_PUSH) as f64 / (to - from)
    }

    /// Pushes sent in [from, to): how many, how many were neither admitted nor refused, and
    /// the slowest answer.
    pub fn answers(&self, from: f64, to: f64) -> (usize, usize, Duration) {
        let records = self.records.lock().unwrap();
        let window: Vec<&Record> = records
            .iter()
            .filter(|r| r.sent >= from && r.sent < to)
            .collect();
        let failed = window.iter().filter(|r| !r.admitted && !r.refused).count();
        let slowest = window.iter().map(|r| r.latency).max().unwrap_or_default();
        (window.len(), failed, slowest)
    }

    /// The 99th percentile of the answer times of `cell`'s pushes sent in [from, to), and how
    /// many pushes that is (a percentile of a handful means little).
    pub fn p99(&self, cell: usize, from: f64, to: f64) -> (Duration, usize) {
        let records = self.records.lock().unwrap();
        let mut latencies: Vec<Duration> = records
            .iter()
            .filter(|r| r.cell == cell && r.sent >= from && r.sent < to)
            .map(|r| r.latency)
            .collect();
        latencies.sort();
        let p99 = match latencies.len() {
            0 => Duration::ZERO,
            n => latencies[((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1],
        };
        (p99, latencies.len())
    }
}

/// Waits until the load's clock reads `at` seconds.
pub async fn until(load: &Load, at: f64) {
    let wait = at - load.now();
    if wait > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(wait)).await;
    }
}

/// A counter of `replica`'s `/metrics` (0 when absent).
pub async fn metric(replica: &Replica, series: &str) -> f64 {
    let client = reqwest::Client::new();
    crate::common::metric_at(&client, &format!("http://{}", replica.http), series)
        .await
        .unwrap_or(0.0)
}

/// Cell syncs the store answered.
pub const SYNCED: &str = "weir_cell_syncs_total{outcome=\"ok\"}";

/// Waits (at most 10 s) until every one of `replicas` has synced with the store once.
pub async fn until_synced(replicas: &[&Replica]) {
    crate::common::wait_until(
        "every replica synced with the store",
        Duration::from_secs(10),
        || async {
            for replica in replicas {
                if metric(replica, SYNCED).await < 1.0 {
                    return false;
                }
            }
            true
        },
    )
    .await;
}

//! Real remote-write clients at a tenant's limit (issue 18), measured end to end.
//!
//! Debian's Prometheus 2.42 (agent mode) or vmagent 1.79 scrapes a synthetic target served by
//! this process every second and remote-writes through nginx (round robin, `keepalive 16`) to
//! three weir replicas in one ring, on the default strategy, where the tenant has
//! `ingestion_rate: 10000` and `ingestion_burst_size: 10000`: B = L, the hard case, one
//! second's worth of burst. The configs are in `tests/real_clients/`.
//!
//! The figures come from weir's own per-tenant counters, summed over the replicas, and the
//! clients' own metrics; the client, the tenant and the fleet are fresh, so every counter
//! starts at zero:
//!
//! - **delivered**: samples weir admitted ÷ samples the client scraped. At 0.9 L the target
//!   goes quiet at the end of the run and the client gets up to 10 s (the lag bar) to drain.
//! - **refused**: refused pushes ÷ every push of the tenant.
//! - **lag**: Prometheus' newest scraped timestamp − its highest sent timestamp, at the end of
//!   the run. vmagent exports no sent timestamp; its lag is its backlog (scraped − admitted)
//!   in seconds of scraping.
//! - **admitted ÷ L**: weir's admitted rate over a window after a warm-up (at 2 L): its
//!   admitted count, read every 100 ms, between two instants at the same point of the
//!   client's rhythm of refusals and lumps (see `admitted_over_limit`; the line also prints
//!   the least-squares slope and the count between the window's ends).
//!
//! Targets: at 0.9 L, ≥ 99 % delivered, ≤ 1 % of pushes refused, lag ≤ 10 s; at 2 L, weir
//! admits 0.95–1.02 L while the client falls behind. Each test prints one `real-clients:` line
//! with its figures; `scripts/real-clients` runs the same for longer
//! (`WEIR_REAL_CLIENTS_SECONDS`, the measured window) and prints them as a table.
//!
//! `WEIR_REAL_CLIENTS_DUMP=<file>` writes the window's readings there ("seconds admitted", a
//! line each), to look at the lumps. `WEIR_BIN=<path>` runs another build of weir (a
//! before-and-after), and `WEIR_REAL_CLIENTS_VMAGENT_ROWS` sets vmagent's
//! `-remoteWrite.maxRowsPerBlock` (default 10 000, as vmagent's own: at 2 L every block is
//! then as large as the burst).
//!
//! Under `CI` a missing client program fails the test; elsewhere the test is skipped with a
//! message. `./scripts/test` installs `prometheus`, `victoria-metrics` (vmagent) and `nginx`.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::fleet::{free_gossip_addr, spawn_joining, until_healthy, Replica};
use common::processes::{
    free_tcp, metrics_page, nginx_in_front, read_metrics_page, real_client_config, require,
    spawn_logged, sum, DumpLogsOnFailure, Target,
};

/// The tenant's fleet-wide `ingestion_rate`, samples/s.
const LIMIT: f64 = 10_000.0;
/// Held by the scenario that runs (see [`Scenario::run`]).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How far into the window, and back from its end, [`Figures::admitted_over_limit`] looks for
/// its two instants: about one cycle of a client's refusals and lumps.
const EDGE: f64 = 10.0;

/// The replicas of the fleet under test.
const REPLICAS: u8 = 3;
/// weir's default `--max-admission-delay`, seconds, which the replicas run with.
const MAX_ADMISSION_DELAY: f64 = 3.0;

/// The tenant nginx names when the client sends none (Prometheus 2.42, see nginx.conf).
const TENANT: &str = "real-clients";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_at_0_9_l_delivers_everything() {
    under_the_limit(Client::Prometheus, 21).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_at_2_l_is_held_to_the_limit() {
    over_the_limit(Client::Prometheus, 24, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vmagent_at_0_9_l_delivers_everything() {
    under_the_limit(Client::Vmagent, 27).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vmagent_at_2_l_is_held_to_the_limit() {
    over_the_limit(Client::Vmagent, 30, 1).await;
}

/// A wide burst (B = 20 L) at 2 L: the burst lasts 20 s, so the warm-up is longer; for
/// `scripts/real-clients`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "longer than a minute; run by scripts/real-clients"]
async fn prometheus_at_2_l_with_a_wide_burst_is_held_to_the_limit() {
    over_the_limit(Client::Prometheus, 33, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "longer than a minute; run by scripts/real-clients"]
async fn vmagent_at_2_l_with_a_wide_burst_is_held_to_the_limit() {
    over_the_limit(Client::Vmagent, 36, 20).await;
}

/// 9 000 series a second: every sample scraped reaches weir, promptly, without refusals.
async fn under_the_limit(client: Client, first_ip: u8) {
    let scenario = Scenario {
        client,
        series: 9_000,
        burst_in_seconds: 1,
        warm_up: Duration::ZERO,
        window: window(30),
        drain: true,
        first_ip,
    };
    let Some(figures) = scenario.run().await else {
        return;
    };
    assert!(
        figures.scrapes_ok(),
        "the client did not scrape every second: {figures}"
    );
    assert!(
        figures.delivered() <= 1.001,
        "weir admitted more than the client scraped: the counts are wrong: {figures}"
    );
    assert!(
        figures.delivered() >= 0.99,
        "{client:?} at 0.9 L: {:.1} % of the samples scraped were delivered (want ≥ 99 %): {figures}",
        100.0 * figures.delivered()
    );
    assert!(
        figures.refused() <= 0.01,
        "{client:?} at 0.9 L: {:.1} % of pushes were refused (want ≤ 1 %): {figures}",
        100.0 * figures.refused()
    );
    assert!(
        figures.lag() <= 10.0,
        "{client:?} at 0.9 L: {:.1} s behind at the end (want ≤ 10 s): {figures}",
        figures.lag()
    );
}

/// 20 000 series a second: weir admits the limit, no less and no more; the client falls
/// behind, which is right.
async fn over_the_limit(client: Client, first_ip: u8, burst_in_seconds: u64) {
    // A burst wider than a second drains at what the client sends over L: 2 L − L = L for
    // a sender that keeps up its rate, but about half that for vmagent's 10 000-row blocks,
    // which wait 2–4 s after a refusal. After a warm-up sized for L (32.8 s at B = 20 L)
    // the rest of the burst was still there: vmagent read 1.023 L over a 30 s window
    // (2026-12-02), within a token bucket's rate × window + B but not the steady rate this
    // asserts. The warm-up outlasts the drain at L / 2.
    let warm_up = Duration::from_secs_f64(10.0 + 2.4 * (burst_in_seconds - 1) as f64);
    let scenario = Scenario {
        client,
        series: 20_000,
        burst_in_seconds,
        warm_up,
        window: window(60),
        drain: false,
        first_ip,
    };
    let Some(figures) = scenario.run().await else {
        return;
    };
    assert!(
        figures.scrapes_ok(),
        "the client did not scrape every second: {figures}"
    );
    let admitted = figures.admitted_over_limit();
    assert!(
        (0.95..=1.02).contains(&admitted),
        "{client:?} at 2 L (B = {burst_in_seconds} L): weir admitted {admitted:.3} L over the \
         window (want 0.95–1.02 L): {figures}"
    );
    // What docs/strategies.md says a lump can be: N × (B + L × --max-admission-delay).
    let bound = REPLICAS as f64 * (burst_in_seconds as f64 + MAX_ADMISSION_DELAY) * LIMIT;
    assert!(
        figures.largest_lump() <= bound,
        "{client:?} at 2 L (B = {burst_in_seconds} L): the fleet got {:.0} samples ahead of the \
         limit (want at most N × (B + L × delay) = {bound:.0}): {figures}",
        figures.largest_lump()
    );
}

/// The measured window: `default_seconds`, or `WEIR_REAL_CLIENTS_SECONDS` (scripts/real-clients).
fn window(default_seconds: u64) -> Duration {
    let seconds = std::env::var("WEIR_REAL_CLIENTS_SECONDS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default_seconds);
    Duration::from_secs(seconds)
}

#[derive(Clone, Copy, Debug)]
enum Client {
    Prometheus,
    Vmagent,
}

impl Client {
    /// The most samples one push carries: `max_samples_per_send` in prometheus.yml, or
    /// vmagent's `-remoteWrite.maxRowsPerBlock`.
    fn batch(self) -> u64 {
        match self {
            Client::Prometheus => 2_000,
            Client::Vmagent => std::env::var("WEIR_REAL_CLIENTS_VMAGENT_ROWS")
                .ok()
                .and_then(|value| value.parse().ok())
                .unwrap_or(10_000),
        }
    }

    fn program(self) -> &'static str {
        match self {
            Client::Prometheus => "prometheus",
            Client::Vmagent => "vmagent",
        }
    }
}

struct Scenario {
    client: Client,
    /// Series the target serves, one sample each per scrape (every second).
    series: usize,
    /// `ingestion_burst_size` in seconds of `LIMIT`.
    burst_in_seconds: u64,
    /// From weir's first admitted sample to the start of the window.
    warm_up: Duration,
    window: Duration,
    /// Quiet the target after the window and give the client up to 10 s to catch up.
    drain: bool,
    /// The replicas run on 127.0.0.{first_ip, +1, +2}.
    first_ip: u8,
}

/// The counters of one moment: weir's (summed over the fleet) and the client's.
#[derive(Clone, Copy, Debug, Default)]
struct Reading {
    at: Option<Instant>,
    /// Samples the client scraped (its own count: the target's series and the ones the
    /// client adds per scrape, `up` and the like, and staleness markers).
    scraped: f64,
    admitted: f64,
    pushes: f64,
    refused: f64,
    /// Prometheus only: newest scraped timestamp − highest sent timestamp, seconds.
    client_lag: Option<f64>,
}

/// What a scenario measured.
struct Figures {
    client: Client,
    series: usize,
    burst_in_seconds: u64,
    /// Scrapes the target served during the run, and the run's length.
    target_scrapes: u64,
    run: Duration,
    window_start: Reading,
    window_end: Reading,
    /// After the drain, when there was one.
    last: Reading,
    /// (seconds into the window, samples weir admitted), every 100 ms.
    admissions: Vec<(f64, f64)>,
    /// The Retry-After of each 429, as nginx passed it on (`None`: the 429 had none).
    retry_after: Vec<Option<u64>>,
    /// Pushes nginx sent to a second replica after an error with the first (which may have
    /// admitted it already).
    nginx_resent: usize,
    /// vmagent only: the waits before resending it logged.
    client_retry_delays: Vec<String>,
    /// weir's pages that could not be read on a try, or lacked the tenant's count: why, each.
    unread: Vec<String>,
}

impl Figures {
    fn delivered(&self) -> f64 {
        self.last.admitted / self.last.scraped.max(1.0)
    }

    fn refused(&self) -> f64 {
        self.last.refused / self.last.pushes.max(1.0)
    }

    /// Backlog in seconds of scraping, at the end of the window.
    fn backlog(&self) -> f64 {
        let end = &self.window_end;
        ((end.scraped - end.admitted) / self.series as f64).max(0.0)
    }

    /// The client's lag at the end of the window: its own for Prometheus, the backlog for
    /// vmagent.
    fn lag(&self) -> f64 {
        self.window_end.client_lag.unwrap_or_else(|| self.backlog())
    }

    /// The rate weir admitted over the window, ÷ L: the count between two instants at the same
    /// point of the sender's rhythm, ÷ L and the time between them.
    ///
    /// Over the limit, `weighted` admits in lumps. After each 429 the client waits the
    /// `Retry-After`, the views refill, and its backlog arrives on every replica at once: each
    /// full view admits a burst before it hears of the others (up to N × B, as N Mimir
    /// distributors would), then nothing while the views pay the debt back. The rate holds,
    /// but a count between two fixed instants gains or loses a lump at each end, and so does a
    /// least-squares slope, which weighs the ends most: Prometheus's rhythm (a lump about
    /// every 11 s) locks to the start of the run, so this test's window ended in or just
    /// after a lump in six runs of six, and its slope read 1.005–1.013 L (once, in CI, 1.023),
    /// where the count between the instants below read 1.000–1.010 (2026-12-04).
    ///
    /// The two instants are where the fleet was furthest behind the limit's line within the
    /// window's first and last [`EDGE`]: just before a lump, with the debt of the last one
    /// paid, the same point of two cycles. Both ends at the same point, a whole number of
    /// cycles lies between them, and a fleet that admits more than L over them reads more.
    fn admitted_over_limit(&self) -> f64 {
        let (start, end) = self.same_point_ends();
        (end.1 - start.1) / (end.0 - start.0).max(1e-9) / LIMIT
    }

    /// The readings [`Figures::admitted_over_limit`] measures between.
    fn same_point_ends(&self) -> ((f64, f64), (f64, f64)) {
        let Some(&(last, _)) = self.admissions.last() else {
            return ((0.0, 0.0), (0.0, 0.0));
        };
        let edge = EDGE.min(last / 3.0);
        let behind = |(t, admitted): &&(f64, f64)| admitted - LIMIT * t;
        let lowest = |range: &dyn Fn(f64) -> bool| {
            *self
                .admissions
                .iter()
                .filter(|(t, _)| range(*t))
                .min_by(|a, b| behind(a).total_cmp(&behind(b)))
                .unwrap()
        };
        (lowest(&|t| t <= edge), lowest(&|t| t >= last - edge))
    }

    /// The least-squares slope of weir's admitted count over the window, ÷ L, for comparison.
    fn slope_over_limit(&self) -> f64 {
        slope(&self.admissions) / LIMIT
    }

    /// The most the fleet admitted above the limit's line from the first instant of
    /// [`Figures::admitted_over_limit`]: its largest lump, in samples.
    fn largest_lump(&self) -> f64 {
        let (start, _) = self.same_point_ends();
        self.admissions
            .iter()
            .filter(|(t, _)| *t >= start.0)
            .map(|(t, admitted)| admitted - start.1 - LIMIT * (t - start.0))
            .fold(0.0, f64::max)
    }

    /// The count between the window's first and last readings, ÷ L and the window.
    fn counted_over_limit(&self) -> f64 {
        let (Some((t0, first)), Some((t1, last))) =
            (self.admissions.first(), self.admissions.last())
        else {
            return 0.0;
        };
        (last - first) / (t1 - t0).max(1e-9) / LIMIT
    }

    /// The target was scraped about once a second (a test of the set-up itself).
    fn scrapes_ok(&self) -> bool {
        self.target_scrapes as f64 >= 0.8 * self.run.as_secs_f64()
    }
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // "none×3,2×5": how many 429s said each Retry-After.
        let mut retry_after = std::collections::BTreeMap::<Option<u64>, usize>::new();
        for value in &self.retry_after {
            *retry_after.entry(*value).or_default() += 1;
        }
        let retry_after: Vec<String> = retry_after
            .iter()
            .map(|(value, count)| match value {
                Some(seconds) => format!("{seconds}s×{count}"),
                None => format!("none×{count}"),
            })
            .collect();
        let mut delays = self.client_retry_delays.clone();
        delays.sort_by(|a, b| {
            a.parse::<f64>()
                .ok()
                .partial_cmp(&b.parse::<f64>().ok())
                .unwrap()
        });
        delays.dedup();
        write!(
            f,
            "real-clients: client={} batch={} offered={:.2}L burst={}L window={:.0}s delivered={:.4} \
             refused={:.4} lag={:.1}s backlog={:.1}s admitted_over_L={:.3} between={:.1}s..{:.1}s slope_over_L={:.3} \
             counted_over_L={:.3} largest_lump={:.0} scraped={} \
             admitted={} pushes={} refused_pushes={} target_scrapes={} run={:.0}s \
             refusals_retry_after={} client_retry_delays={} nginx_resent={} unread_pages={}{}",
            self.client.program(),
            self.client.batch(),
            self.series as f64 / LIMIT,
            self.burst_in_seconds,
            self.window_end
                .at
                .unwrap()
                .duration_since(self.window_start.at.unwrap())
                .as_secs_f64(),
            self.delivered(),
            self.refused(),
            self.lag(),
            self.backlog(),
            self.admitted_over_limit(),
            self.same_point_ends().0 .0,
            self.same_point_ends().1 .0,
            self.slope_over_limit(),
            self.counted_over_limit(),
            self.largest_lump(),
            self.last.scraped,
            self.last.admitted,
            self.last.pushes,
            self.last.refused,
            self.target_scrapes,
            self.run.as_secs_f64(),
            if retry_after.is_empty() {
                "-".into()
            } else {
                retry_after.join(",")
            },
            if delays.is_empty() {
                "-".into()
            } else {
                delays.join(",")
            },
            self.nginx_resent,
            self.unread.len(),
            self.unread
                .first()
                .map(|why| format!(" first_unread={why:?}"))
                .unwrap_or_default(),
        )
    }
}

impl Scenario {
    /// Runs the scenario; `None` when a program is missing outside CI.
    async fn run(&self) -> Option<Figures> {
        let client_program = require(self.client.program())?;
        let nginx_program = require("nginx")?;
        // One scenario at a time: each measures a fleet in real time, and two fleets, two
        // clients and two nginx on a 2-core machine measure the machine (Prometheus at 2 L
        // read 1.021 L with a busy loop on one core beside it, 1.000 alone).
        let _serial = SERIAL.lock().await;
        let started = Instant::now();
        let dir = tempfile::tempdir().unwrap();
        let _logs = DumpLogsOnFailure {
            dir: dir.path().to_path_buf(),
            files: &["client.log", "nginx.stderr", "nginx/error.log"],
            lines: 10,
        };

        // Three replicas in one ring, on the default strategy, B = burst_in_seconds × L.
        let overrides = dir.path().join("overrides.yaml");
        std::fs::write(
            &overrides,
            format!(
                "overrides:\n  {TENANT}:\n    ingestion_rate: {LIMIT}\n    \
                 ingestion_burst_size: {}\n",
                LIMIT as u64 * self.burst_in_seconds
            ),
        )
        .unwrap();
        let weir_flags = ["--runtime-config", overrides.to_str().unwrap()];
        let gossip: Vec<SocketAddr> = (0..REPLICAS)
            .map(|i| free_gossip_addr([127, 0, 0, self.first_ip + i]))
            .collect();
        let cluster = format!("real-clients-{}", self.first_ip);
        let join = gossip
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let replicas: Vec<Replica> = gossip
            .iter()
            .map(|addr| {
                spawn_joining(
                    Command::new(weir_binary()),
                    *addr,
                    &join,
                    &cluster,
                    &weir_flags,
                )
            })
            .collect();
        until_healthy(
            &replicas.iter().collect::<Vec<_>>(),
            3,
            Duration::from_secs(20),
        )
        .await;

        let target = Target::serve(self.series).await;

        let (nginx_addr, nginx_dir, _nginx) = nginx_in_front(
            &nginx_program,
            dir.path(),
            [replicas[0].http, replicas[1].http, replicas[2].http],
        );

        let push_url = format!("http://{nginx_addr}/api/v1/push");
        let client_addr = free_tcp();
        let _client = match self.client {
            Client::Prometheus => {
                let path = dir.path().join("prometheus.yml");
                let text = real_client_config(
                    "prometheus.yml",
                    &[
                        ("127.0.0.1:9100", target.addr.to_string()),
                        ("127.0.0.1:9009", nginx_addr.to_string()),
                    ],
                );
                let batch = format!("max_samples_per_send: {}", self.client.batch());
                assert!(
                    text.contains(&batch),
                    "prometheus.yml no longer has {batch}"
                );
                std::fs::write(&path, text).unwrap();
                spawn_logged(
                    Command::new(client_program)
                        .arg("--enable-feature=agent")
                        .arg(format!("--config.file={}", path.display()))
                        .arg(format!(
                            "--storage.agent.path={}",
                            dir.path().join("agent").display()
                        ))
                        .arg(format!("--web.listen-address={client_addr}")),
                    &dir.path().join("client.log"),
                )
            }
            Client::Vmagent => {
                let path = dir.path().join("vmagent.yml");
                let text = real_client_config(
                    "vmagent.yml",
                    &[("127.0.0.1:9100", target.addr.to_string())],
                );
                std::fs::write(&path, text).unwrap();
                spawn_logged(
                    Command::new(client_program)
                        .arg(format!("-promscrape.config={}", path.display()))
                        .arg(format!("-remoteWrite.url={push_url}"))
                        .arg(format!("-remoteWrite.headers=X-Scope-OrgID:{TENANT}"))
                        .arg(format!(
                            "-remoteWrite.tmpDataPath={}",
                            dir.path().join("vmagent-queue").display()
                        ))
                        .arg(format!("-httpListenAddr={client_addr}"))
                        // No burst of staleness markers when the target goes quiet: the
                        // drain carries only what the run scraped.
                        .arg("-promscrape.noStaleMarkers")
                        .arg(format!(
                            "-remoteWrite.maxRowsPerBlock={}",
                            self.client.batch()
                        )),
                    &dir.path().join("client.log"),
                )
            }
        };
        let client_base = format!("http://{client_addr}");

        // The run starts with weir's first admitted sample (Prometheus first reads its fresh
        // WAL, which takes a few seconds).
        let mut unread = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        let run_start = loop {
            let reading = self.read(&client_base, &replicas, &mut unread).await;
            if reading.admitted > 0.0 {
                break reading;
            }
            assert!(
                Instant::now() < deadline,
                "nothing admitted within 30 s of starting {}: {reading:?}",
                self.client.program()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let scrapes_at_start = target.scrapes();
        tokio::time::sleep(self.warm_up).await;
        let window_start = self.read(&client_base, &replicas, &mut unread).await;
        let admissions = admissions_over(&replicas, self.window, &mut unread).await;
        if let Some(path) = std::env::var_os("WEIR_REAL_CLIENTS_DUMP") {
            let lines: Vec<String> = admissions
                .iter()
                .map(|(t, admitted)| format!("{t:.3} {admitted}\n"))
                .collect();
            std::fs::write(path, lines.concat()).unwrap();
        }
        let window_end = self.read(&client_base, &replicas, &mut unread).await;
        let target_scrapes = target.scrapes() - scrapes_at_start;
        let run = window_end.at.unwrap() - run_start.at.unwrap();

        let last = if self.drain {
            // Quiet: only what the client adds per scrape (and, once, staleness markers for
            // the vanished series) is scraped from now on. Wait until the client has caught
            // up, or 10 s. The counts must also hold still for a moment: vmagent counts a
            // block as pushed only once the push is answered, so a reading taken just after
            // weir admitted one shows it on weir's side only.
            target.quiet();
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut before = self.read(&client_base, &replicas, &mut unread).await;
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let reading = self.read(&client_base, &replicas, &mut unread).await;
                let still =
                    reading.admitted == before.admitted && reading.scraped == before.scraped;
                // A few samples (`up` and the like) wait for the next batch.
                let caught_up = reading.admitted >= reading.scraped - 100.0;
                if (still && caught_up) || Instant::now() > deadline {
                    break reading;
                }
                before = reading;
            }
        } else {
            window_end
        };

        let figures = Figures {
            client: self.client,
            series: self.series,
            burst_in_seconds: self.burst_in_seconds,
            target_scrapes,
            run,
            window_start,
            window_end,
            last,
            admissions,
            retry_after: retry_after_values(&nginx_dir.join("access.log")),
            nginx_resent: resent_pushes(&nginx_dir.join("access.log")),
            unread,
            client_retry_delays: client_retry_delays(&dir.path().join("client.log")),
        };
        println!("{figures}");
        eprintln!(
            "{} took {:.0} s of wall time",
            self.client.program(),
            started.elapsed().as_secs_f64()
        );
        Some(figures)
    }

    /// weir's counts and the client's, now. `unread` gathers the pages that could not be read
    /// on a first try (see [`fleet_pages`]).
    async fn read(
        &self,
        client_base: &str,
        replicas: &[Replica],
        unread: &mut Vec<String>,
    ) -> Reading {
        let tenant = [("user", TENANT)];
        let mut reading = Reading::default();
        let deadline = Instant::now() + Duration::from_secs(5);
        let pages = loop {
            if let Some(pages) = fleet_pages(replicas, unread).await {
                break pages;
            }
            assert!(
                Instant::now() < deadline,
                "weir's /metrics could not be read for 5 s: {unread:?}"
            );
        };
        for page in &pages {
            reading.admitted += sum(page, "weir_distributor_received_samples_total", &tenant);
            reading.pushes += sum(page, "weir_distributor_requests_in_total", &tenant);
            reading.refused += sum(page, "weir_discarded_requests_total", &tenant);
        }
        // The moment of weir's counts (the client's page follows).
        reading.at = Some(Instant::now());
        let page = metrics_page(client_base).await;
        match self.client {
            Client::Prometheus => {
                reading.scraped = sum(&page, "prometheus_agent_samples_appended_total", &[]);
                let newest = sum(
                    &page,
                    "prometheus_remote_storage_highest_timestamp_in_seconds",
                    &[],
                );
                let sent = sum(
                    &page,
                    "prometheus_remote_storage_queue_highest_sent_timestamp_seconds",
                    &[],
                );
                reading.client_lag = Some((newest - sent).max(0.0));
            }
            Client::Vmagent => {
                reading.scraped = sum(
                    &page,
                    "vmagent_remotewrite_global_rows_pushed_before_relabel_total",
                    &[],
                );
            }
        }
        reading
    }
}

/// weir's admitted count for the tenant, summed over the fleet, every 100 ms for `window`:
/// (seconds since the first reading, samples). A reading without every replica's count is
/// left out, and why is added to `unread`: summed without a replica, it would read a third
/// low, and [`Figures::admitted_over_limit`] picks the lowest readings near the window's ends
/// (a CI run read 0.621 L so, its slope 1.001 L).
async fn admissions_over(
    replicas: &[Replica],
    window: Duration,
    unread: &mut Vec<String>,
) -> Vec<(f64, f64)> {
    let start = Instant::now();
    let mut readings = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while start.elapsed() < window {
        tick.tick().await;
        let Some(pages) = fleet_pages(replicas, unread).await else {
            continue;
        };
        let counts: Vec<Option<f64>> = pages.iter().map(|page| admitted_on(page)).collect();
        if counts.iter().any(Option::is_none) {
            unread.push(format!("a page without the tenant's count: {counts:?}"));
            continue;
        }
        let admitted = counts.into_iter().flatten().sum();
        readings.push((start.elapsed().as_secs_f64(), admitted));
    }
    readings
}

/// The tenant's admitted samples on one replica's page, `None` when the page has no such
/// series (after the warm-up every replica has admitted some).
fn admitted_on(page: &str) -> Option<f64> {
    let needle = format!("weir_distributor_received_samples_total{{user=\"{TENANT}\"");
    page.lines().any(|line| line.starts_with(&needle)).then(|| {
        sum(
            page,
            "weir_distributor_received_samples_total",
            &[("user", TENANT)],
        )
    })
}

/// Every replica's `/metrics` page, each tried up to three times, 20 ms apart; `None` when
/// one could still not be read. Each failed try is added to `unread`.
async fn fleet_pages(replicas: &[Replica], unread: &mut Vec<String>) -> Option<Vec<String>> {
    let mut pages = Vec::with_capacity(replicas.len());
    for replica in replicas {
        let base = format!("http://{}", replica.http);
        let mut page = None;
        for _ in 0..3 {
            match read_metrics_page(&base).await {
                Ok(text) => {
                    page = Some(text);
                    break;
                }
                Err(err) => {
                    unread.push(err);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        pages.push(page?);
    }
    Some(pages)
}

/// The least-squares slope of `points`.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mean_t = points.iter().map(|(t, _)| t).sum::<f64>() / n;
    let mean_y = points.iter().map(|(_, y)| y).sum::<f64>() / n;
    let covariance: f64 = points
        .iter()
        .map(|(t, y)| (t - mean_t) * (y - mean_y))
        .sum();
    let variance: f64 = points.iter().map(|(t, _)| (t - mean_t).powi(2)).sum();
    covariance / variance
}

/// The weir under test: this build's, or `WEIR_BIN` (another build, for a before-and-after).
fn weir_binary() -> PathBuf {
    std::env::var_os("WEIR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_weir")))
}

/// The Retry-After of every 429 in nginx's access log
/// (`<status> retry_after=<value, or "-"> upstreams=<addresses>`).
fn retry_after_values(access_log: &Path) -> Vec<Option<u64>> {
    std::fs::read_to_string(access_log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.strip_prefix("429 retry_after="))
        .map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

/// Pushes nginx tried on more than one replica (`upstreams=a, b`).
fn resent_pushes(access_log: &Path) -> usize {
    std::fs::read_to_string(access_log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split_once("upstreams="))
        .filter(|(_, upstreams)| upstreams.contains(','))
        .count()
}

/// vmagent logs how long it waits before resending a refused block: "re-sending the block in
/// 2.000 seconds".
fn client_retry_delays(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let rest = line.split_once("re-sending the block in ")?.1;
            Some(rest.split_whitespace().next()?.to_string())
        })
        .collect()
}

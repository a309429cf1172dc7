//! The real `weir` binary as an operator runs it: embedded defaults, start-up errors, and
//! graceful shutdown on SIGTERM.

mod common;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::fleet::listening_addr;
use common::RawRequest;
use weir::remote_write::prompb::WriteRequest;

fn weir() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_weir"));
    command.current_dir(env!("CARGO_MANIFEST_DIR"));
    command
}

/// Starts the binary and reads the address it prints.
fn spawn(args: &[&str]) -> (Child, SocketAddr) {
    let mut child = weir()
        .args([
            "--http-addr",
            "127.0.0.1:0",
            "--gossip-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let address = listening_addr(&mut child);
    (child, address)
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits (without blocking the runtime) for the process to exit, at most `within`.
async fn wait_exit(mut child: Child, within: Duration) -> std::process::ExitStatus {
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "weir did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .unwrap()
}

/// Started anywhere, with no flags that name files: built-in defaults, sink mode, and it
/// says both.
#[tokio::test]
async fn embedded_defaults_run_in_sink_mode() {
    let elsewhere = tempfile::tempdir().unwrap();
    let mut output = weir()
        .current_dir(elsewhere.path())
        .args([
            "--http-addr",
            "127.0.0.1:0",
            "--gossip-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Up and ready (every start-up line said) before it is stopped.
    let mut stdout = std::io::BufReader::new(output.stdout.take().unwrap());
    let mut first_line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut first_line).unwrap();
    let addr = first_line
        .strip_prefix("weir listening on http://")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{first_line:?}"))
        .to_string();
    common::wait_until("/ready to answer 200", Duration::from_secs(10), || async {
        reqwest::get(format!("http://{addr}/ready"))
            .await
            .is_ok_and(|response| response.status() == 200)
    })
    .await;
    sigterm(&output);
    let output = output.wait_with_output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(addr.starts_with("127.0.0.1:"), "{first_line}");
    assert!(stderr.contains("SINK MODE"), "{stderr}");
    assert!(stderr.contains("no --runtime-config"), "{stderr}");
    assert!(stderr.contains("(built-in defaults)"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "colour codes in a piped log: {stderr:?}"
    );
}

#[test]
fn help_is_the_same_on_every_call() {
    let help = || weir().arg("--help").output().unwrap().stdout;
    let first = help();
    assert!(String::from_utf8_lossy(&first).contains("--node-id"));
    assert_eq!(first, help(), "a random default must not show in --help");
}

#[test]
fn bad_runtime_config_at_start_is_fatal_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("overrides.yaml");
    std::fs::write(&path, "overrides:\n  t:\n    ingestion_rat: 5\n").unwrap();
    let output = weir()
        .args([
            "--http-addr",
            "127.0.0.1:0",
            "--runtime-config",
            path.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("a bad file at start-up is fatal"),
        "{stderr}"
    );
    assert!(
        stderr.contains("unknown key `ingestion_rat` in overrides.t"),
        "{stderr}"
    );

    let output = weir()
        .args(["--runtime-config", "/nonexistent.yaml"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot read /nonexistent.yaml"), "{stderr}");
    // Said once: one line, the OS error once.
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert_eq!(stderr.matches("No such file").count(), 1, "{stderr}");
}

#[test]
fn bad_flags_exit_2_with_usage() {
    let output = weir().args(["--ingestion-rate", "lots"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--ingestion-rate"));
    let output = weir().args(["--request-rate", "5"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("request_burst_size is 0"));
}

/// SIGTERM: /ready turns 503 at once, the replica still accepts new connections for the
/// shutdown delay (the balancer has not noticed yet), the in-flight request finishes, then
/// new connections are refused and the process exits 0.
#[tokio::test]
async fn sigterm_drains_in_flight_requests_and_exits_zero() {
    let (child, addr) = spawn(&["--shutdown-delay", "1s", "--shutdown-drain-timeout", "5s"]);
    let client = reqwest::Client::new();
    let ready = |client: reqwest::Client| async move {
        client
            .get(format!("http://{addr}/ready"))
            .send()
            .await
            .map(|response| response.status().as_u16())
            .ok()
    };
    assert_eq!(ready(client.clone()).await, Some(200));

    let body = WriteRequest::synthetic(5, 1, 1).encode_snappy();
    let mut in_flight = RawRequest::start_push(addr, "t", body.len()).await;
    in_flight.send(&body[..1]).await; // stalls mid-body

    sigterm(&child);
    // Not ready while draining: well within the 1 s delay, so the checks below fall in it.
    common::wait_until(
        "/ready to answer 503 while draining",
        Duration::from_millis(500),
        || async { ready(client.clone()).await == Some(503) },
    )
    .await;
    // A new connection during the delay is served (a regression: the accept loop was not
    // polled while the replica left the ring and waited out the delay).
    assert_eq!(
        ready(reqwest::Client::new()).await,
        Some(503),
        "a new connection during the shutdown delay is answered"
    );
    let mut push = RawRequest::start_push(addr, "t", body.len()).await;
    push.send(&body).await;
    let answer = push.response().await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    in_flight.send(&body[1..]).await;
    let answer = in_flight.response().await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    let status = wait_exit(child, Duration::from_secs(10)).await;
    assert!(status.success(), "{status:?}");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "new connections are refused"
    );
}

/// A request that never finishes cannot hold shutdown hostage past the drain timeout.
#[tokio::test]
async fn drain_timeout_bounds_shutdown() {
    let (child, addr) = spawn(&["--shutdown-drain-timeout", "500ms"]);
    let mut stuck = RawRequest::start_push(addr, "t", 100).await;
    stuck.send(b"x").await;
    let client = reqwest::Client::new();
    common::wait_until(
        "the stuck push to be in flight",
        Duration::from_secs(5),
        || async {
            common::metric_at(
                &client,
                &format!("http://{addr}"),
                "weir_distributor_inflight_push_requests",
            )
            .await
                == Some(1.0)
        },
    )
    .await;
    let started = Instant::now();
    sigterm(&child);
    let status = wait_exit(child, Duration::from_secs(10)).await;
    assert!(status.success(), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// A task's `Cpus_allowed_list`, from its `/proc/…/status` file.
fn cpus_allowed(status: impl AsRef<std::path::Path>) -> String {
    std::fs::read_to_string(status)
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string()
}

/// The HTTP workers' allowed CPUs, by worker index, read from `/proc` (`Cpus_allowed_list`).
fn worker_cpus(pid: u32) -> Vec<(usize, String)> {
    let mut workers = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        let Some(index) = comm.trim().strip_prefix("weir-http-") else {
            continue;
        };
        workers.push((index.parse().unwrap(), cpus_allowed(task.join("status"))));
    }
    workers.sort();
    workers
}

/// `--http-pin-workers on` pins worker i to the i-th CPU the process may use (round robin),
/// and `off` leaves every worker the process's own set.
#[tokio::test]
async fn http_workers_are_pinned_one_to_a_core() {
    let own = cpus_allowed("/proc/self/status");
    let cpus = weir::affinity::allowed_cpus();
    assert!(!cpus.is_empty(), "sched_getaffinity read nothing");
    // Stopped when the test ends, passed or failed.
    let pinned =
        common::processes::Process(spawn(&["--http-workers", "3", "--http-pin-workers", "on"]).0);
    let free =
        common::processes::Process(spawn(&["--http-workers", "3", "--http-pin-workers", "off"]).0);
    let expected: Vec<(usize, String)> = (0..3)
        .map(|i| (i, cpus[i % cpus.len()].to_string()))
        .collect();
    let unpinned: Vec<(usize, String)> = (0..3).map(|i| (i, own.clone())).collect();
    // The workers start (and pin themselves) after the address is printed: wait a while for
    // the sets to settle, then compare.
    let (pinned_id, free_id) = (pinned.0.id(), free.0.id());
    let deadline = Instant::now() + Duration::from_secs(10);
    while (worker_cpus(pinned_id) != expected || worker_cpus(free_id) != unpinned)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(worker_cpus(pinned_id), expected);
    assert_eq!(worker_cpus(free_id), unpinned);
}

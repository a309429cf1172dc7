//! The chaos runs' short versions: `scripts/chaos --quick` against the binaries this test
//! build made. Real weir processes, each in its own network namespace with its gossip link
//! moved between bridges (a 2 | 2 partition, then healed), SIGSTOP/SIGCONT, SIGKILL and a
//! restart under the same node id, and a real HTTP upstream that is slow, answers 503, or
//! resets connections. Each run checks its own bounds and prints them; the script's exit
//! status is the verdict.
//!
//! Namespaces need root (and iproute2). Without them, under CI (`CI` set) the test fails with
//! the reason, since CI runs as root; elsewhere only the upstream run is made, and the test
//! says so on the terminal, past cargo's capture (`common::cannot_run_here`).

mod common;

use std::process::Command;

fn can_make_namespaces() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0");
    let ip = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .is_ok_and(|out| out.status.success());
    root && ip
}

#[test]
fn partition_stop_restart_and_upstream_faults_stay_within_their_bounds() {
    let mut runs = vec!["upstream"];
    if can_make_namespaces() {
        runs.splice(0..0, ["partition", "stop", "restart"]);
    } else {
        common::cannot_run_here(
            "chaos: the partition, stop and restart runs",
            "not root, or no `ip netns`",
        );
    }
    let chaos = |runs: &[&str]| {
        Command::new("python3")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/chaos"))
            .args(["--quick", "--no-build"])
            .args(runs)
            .env("WEIR_BIN", env!("CARGO_BIN_EXE_weir"))
            .env("WEIR_LOADGEN_BIN", env!("CARGO_BIN_EXE_weir-loadgen"))
            .status()
            .expect("python3 runs scripts/chaos")
            .success()
    };
    if chaos(&runs) {
        return;
    }
    // The quick runs' phases are seconds long on a 2-core machine that also runs the load
    // generator and four replicas: a bound met in every local run (partition's 2.1 L over a
    // split, its 16 healthy-count changes, stop's 1.28 L) was missed once in about ten CI
    // runs. One more try of every run, with its own table; both tables stay in the log.
    eprintln!(
        "scripts/chaos --quick {runs:?} missed a bound (the `missed:` lines above); once more"
    );
    assert!(
        chaos(&runs),
        "scripts/chaos --quick {runs:?} missed a bound twice: the `missed:` lines above say which"
    );
}

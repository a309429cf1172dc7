//! The container image (`Dockerfile`), built with podman and run: a push through it is
//! answered 200 and `/ready` is 200.
//!
//! No registry serves base images here, so `scripts/image-base` makes the runtime base from
//! Debian's packages and the build points the Dockerfile's `RUNTIME_IMAGE` at it. The image is
//! the Dockerfile's `prebuilt` target around this build's `weir` (stripped), so the test costs
//! seconds, not a compile: it proves the runtime stage (base, user, entry point, environment,
//! the overrides file, ports) with a real binary. The `build` stage, which compiles weir
//! inside `rust:1-bookworm`, needs that image from a registry and is not run here; see the
//! README. `WEIR_IMAGE_BINARY=target/release/weir` builds the image around a release binary
//! instead (the size the README gives).
//!
//! Needs root (podman's store and networking) and podman; `scripts/test` installs podman and
//! runc. Without them it fails under CI and is skipped elsewhere.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use weir::remote_write::prompb::WriteRequest;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// The base (glibc and libgcc_s) and what the Dockerfile adds beside the binary fit in this;
/// a base with a distribution in it (debian:bookworm-slim is 75 MB) does not.
const MOST_BESIDE_THE_BINARY: u64 = 8_000_000;

fn run(program: &str, args: &[&str]) -> Output {
    let output = Command::new(program)
        .args(args)
        .current_dir(ROOT)
        .output()
        .unwrap_or_else(|error| panic!("{program} runs: {error}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn stdout(output: Output) -> String {
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next().map(|uid| uid == "0"))
        .unwrap_or(false)
}

/// The container and the image are removed however the test ends.
struct Cleanup {
    podman: Vec<String>,
    container: String,
    image: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(&self.podman)
            .args(["rm", "--force", "--time", "2", &self.container])
            .output();
        let _ = Command::new("podman")
            .args(["rmi", "--force", &self.image])
            .output();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_image_builds_runs_as_non_root_and_takes_a_push() {
    if !is_root() {
        common::cannot_run_here("the container image test", "podman's store needs root");
        return;
    }
    for program in ["podman", "apt-get", "dpkg-deb", "objcopy"] {
        if common::processes::require(program).is_none() {
            return;
        }
    }

    // The base: cached in target/image/, so a rerun costs no download.
    let base = stdout(run(&format!("{ROOT}/scripts/image-base"), &[]));

    // The binary, stripped as the Dockerfile's build stage strips it, where the `prebuilt`
    // target takes it (.dockerignore lets only this file of target/ into the context).
    // Written beside and renamed, so a concurrent run never copies half a file.
    let binary: PathBuf = std::env::var_os("WEIR_IMAGE_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_weir")));
    let staged = Path::new(ROOT).join("target/image/weir");
    let partial = Path::new(ROOT).join(format!("target/image/weir.{}", std::process::id()));
    run(
        "objcopy",
        &[
            "--strip-all",
            binary.to_str().unwrap(),
            partial.to_str().unwrap(),
        ],
    );
    std::fs::rename(&partial, &staged).unwrap();
    let binary_size = std::fs::metadata(&staged).unwrap().len();

    let tag = format!("localhost/weir-image-test:{}", std::process::id());
    let container = format!("weir-image-test-{}", std::process::id());
    // crun refuses this machine's hybrid cgroups, and runc copes: use runc when it is there
    // (scripts/test installs it), podman's default runtime otherwise.
    let podman: Vec<String> = if Path::new("/usr/sbin/runc").exists() {
        vec!["--runtime".into(), "runc".into()]
    } else {
        Vec::new()
    };
    let _cleanup = Cleanup {
        podman: podman.clone(),
        container: container.clone(),
        image: tag.clone(),
    };
    run(
        "podman",
        &[
            "build",
            "--quiet",
            "--target",
            "prebuilt",
            "--build-arg",
            &format!("RUNTIME_IMAGE={base}"),
            "--tag",
            &tag,
            ".",
        ],
    );

    let size: u64 = stdout(run(
        "podman",
        &["image", "inspect", "--format", "{{.Size}}", &tag],
    ))
    .parse()
    .unwrap();
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "image {tag}: {size} bytes, of which the stripped binary {binary_size} (from {})",
        binary.display()
    );
    assert!(
        size <= binary_size + MOST_BESIDE_THE_BINARY,
        "the image is {size} bytes for a {binary_size}-byte binary: the runtime stage grew"
    );
    let config = stdout(run(
        "podman",
        &[
            "image",
            "inspect",
            "--format",
            "{{.Config.User}} {{json .Config.Entrypoint}}",
            &tag,
        ],
    ));
    assert_eq!(config, r#"10001:10001 ["/usr/local/bin/weir"]"#);

    // As a user runs it: the image's own environment (HTTP on 0.0.0.0:8080), its port
    // published on a free loopback port. The limits are lowered because this machine's
    // sandbox forbids the runtime to raise them (podman asks for more than the host's).
    let podman_run: Vec<&str> = podman
        .iter()
        .map(String::as_str)
        .chain([
            "run",
            "--detach",
            "--name",
            &container,
            "--ulimit",
            "nofile=4096:4096",
            "--ulimit",
            "nproc=4096:4096",
            "--publish",
            "127.0.0.1::8080",
            &tag,
        ])
        .collect();
    run("podman", &podman_run);
    let published = stdout(run("podman", &["port", &container, "8080/tcp"]));
    let base_url = format!("http://{published}");

    let client = reqwest::Client::new();
    common::wait_until("the container's /ready", Duration::from_secs(30), || {
        let request = client.get(format!("{base_url}/ready")).send();
        async move { request.await.is_ok_and(|response| response.status() == 200) }
    })
    .await;

    // It runs as the image's user, not root: read from the host's view of the process.
    let pid = stdout(run(
        "podman",
        &["inspect", "--format", "{{.State.Pid}}", &container],
    ));
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .unwrap();
    assert_eq!(
        uid.split_whitespace().collect::<Vec<_>>(),
        ["10001"; 4],
        "{status}"
    );

    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let body = WriteRequest::synthetic(10, 1, now_ms).encode_snappy();
    let response = common::push_request(&client, &base_url, Some("image-test"), body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{:?}", response.text().await);

    // It started on the overrides file the image carries, and counted the push.
    let logs = Command::new("podman")
        .args(["logs", &container])
        .output()
        .unwrap();
    let logs =
        String::from_utf8_lossy(&logs.stderr).to_string() + &String::from_utf8_lossy(&logs.stdout);
    assert!(
        logs.contains("runtime_config=/etc/weir/overrides.yaml"),
        "{logs}"
    );
    let metrics = client
        .get(format!("{base_url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("weir_") && line.contains("image-test")),
        "the push is not in /metrics:\n{metrics}"
    );
}

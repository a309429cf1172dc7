//! The operator's pages kept from clients, on real `weir` processes (127.0.0.110-113):
//! `--admin-addr` serves `/metrics`, `/ring`, `/runtime_config` and `/distributor/ha_tracker`
//! on a listener of its own and the public port answers 404 for them, while pushes and the
//! probes stay on the public port; without it, everything is on the public port, with a
//! warning; `--admin-token-file` answers 401 without the token, 403 with another, 200 with it,
//! never logs either, and is re-read live when the file changes.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::processes::Process;
use weir::remote_write::prompb::WriteRequest;

const ADMIN_PAGES: [&str; 5] = [
    "/metrics",
    "/ring",
    "/ring?format=json",
    "/runtime_config",
    "/distributor/ha_tracker",
];
const TOKEN: &str = "c2f1e0d9b8a7-admin-token-0123456789";

struct Weir {
    _process: Process,
    http: String,
    admin: Option<String>,
    log: PathBuf,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

/// Starts `weir` alone on 127.0.0.`ip` with `extra` flags and waits until it is ready. The
/// addresses are read from its first lines of stdout (the admin line is the third, when
/// `--admin-addr` is given); stderr goes to a log file.
async fn start(ip: u8, extra: &[&str]) -> Weir {
    start_with(ip, extra, reqwest::Client::new()).await
}

/// [`start`], spoken to with `client` (one that trusts the test's CA, for HTTPS).
async fn start_with(ip: u8, extra: &[&str], client: reqwest::Client) -> Weir {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("weir.log");
    let gossip = common::fleet::free_gossip_addr([127, 0, 0, ip]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["--http-addr", &format!("127.0.0.{ip}:0")])
        .args(["--grpc-addr", &format!("127.0.0.{ip}:0")])
        .args(["--gossip-addr", &gossip.to_string()])
        .args(["--cluster-id", &format!("admin-listener-{ip}")])
        .args(["--log-level", "debug"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    // The base URL (scheme and address) after `prefix`.
    let mut line = |prefix: &str| -> String {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let url = line
            .strip_prefix(prefix)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("expected {prefix:?}, got {line:?}"));
        let address = url.split_once("://").map_or(url, |(_, address)| address);
        let _: SocketAddr = address.parse().unwrap();
        url.to_string()
    };
    let http = line("weir listening on ");
    line("weir gRPC on ");
    let admin = extra
        .contains(&"--admin-addr")
        .then(|| line("weir admin on "));
    // Whatever weir prints later must not meet a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    let weir = Weir {
        _process: Process(child),
        http,
        admin,
        log,
        client,
        _dir: dir,
    };
    common::wait_until("weir is ready", Duration::from_secs(20), || async {
        weir.status(&weir.http, "/ready", None).await == 200
    })
    .await;
    weir
}

impl Weir {
    async fn get(&self, base: &str, path: &str, token: Option<&str>) -> reqwest::Response {
        let mut request = self.client.get(format!("{base}{path}"));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send().await.unwrap()
    }

    async fn status(&self, base: &str, path: &str, token: Option<&str>) -> u16 {
        self.get(base, path, token).await.status().as_u16()
    }

    async fn push(&self, base: &str, tenant: &str, series: usize) -> u16 {
        let body = WriteRequest::synthetic(series, 1, 1).encode_snappy();
        common::push_request(&self.client, base, Some(tenant), body)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }
}

#[tokio::test]
async fn with_admin_addr_the_pages_are_only_on_the_admin_listener() {
    let weir = start(110, &["--admin-addr", "127.0.0.110:0"]).await;
    let admin = weir.admin.as_deref().unwrap();
    assert_ne!(admin, weir.http);

    // Pushes, the admission API's JSON twin and the probes are on the public port.
    assert_eq!(weir.push(&weir.http, "tenant-a", 10).await, 200);
    for path in ["/ready", "/health"] {
        assert_eq!(weir.status(&weir.http, path, None).await, 200, "{path}");
        assert_eq!(weir.status(admin, path, None).await, 200, "{path}");
    }
    let allow = weir
        .client
        .post(format!("{}/api/v1/allow", weir.http))
        .json(&serde_json::json!({"tenant": "tenant-a", "key": "k", "cost": 1}))
        .send()
        .await
        .unwrap();
    assert_ne!(allow.status(), 404, "the admission API stays public");

    // The operator's pages: on the admin listener, 404 on the public port.
    for path in ADMIN_PAGES {
        assert_eq!(weir.status(&weir.http, path, None).await, 404, "{path}");
        assert_eq!(weir.status(admin, path, None).await, 200, "{path}");
    }
    // The admin listener serves the same replica: the push is counted there.
    let received = "weir_distributor_received_samples_total{user=\"tenant-a\"}";
    assert_eq!(
        common::metric_at(&weir.client, admin, received).await,
        Some(10.0)
    );
    // No token or credentials file: nothing failed to load, so no reload alert fires.
    for healthy in [
        "weir_admin_token_last_reload_successful",
        "weir_auth_credentials_last_reload_successful",
    ] {
        assert_eq!(
            common::metric_at(&weir.client, admin, healthy).await,
            Some(1.0),
            "{healthy}"
        );
    }
    let ring: serde_json::Value = weir
        .get(admin, "/ring?format=json", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(ring["healthy"], 1, "{ring}");
    // And it takes no pushes.
    assert_eq!(weir.push(admin, "tenant-a", 1).await, 404);
    assert!(!weir.log().contains("no --admin-addr"), "{}", weir.log());
}

#[tokio::test]
async fn without_admin_addr_everything_is_on_the_http_port_with_a_warning() {
    let weir = start(111, &[]).await;
    assert_eq!(weir.push(&weir.http, "tenant-b", 3).await, 200);
    for path in ADMIN_PAGES.iter().chain(&["/ready", "/health"]) {
        assert_eq!(weir.status(&weir.http, path, None).await, 200, "{path}");
    }
    let received = "weir_distributor_received_samples_total{user=\"tenant-b\"}";
    assert_eq!(
        common::metric_at(&weir.client, &weir.http, received).await,
        Some(3.0)
    );
    let log = weir.log();
    assert!(
        log.contains("WARN") && log.contains("no --admin-addr") && log.contains("public HTTP"),
        "{log}"
    );
}

/// 401 without a token (with `WWW-Authenticate: Bearer`), 403 with another, 200 with it, on
/// each page; the probes and pushes need none; neither token reaches the log.
async fn check_token(weir: &Weir, base: &str) {
    let wrong = "not-the-admin-token-but-long-enough";
    for path in ADMIN_PAGES {
        let refused = weir.get(base, path, None).await;
        assert_eq!(refused.status(), 401, "{path}");
        assert_eq!(
            refused.headers()["www-authenticate"],
            "Bearer realm=\"weir admin\""
        );
        assert_eq!(weir.status(base, path, Some(wrong)).await, 403, "{path}");
        assert_eq!(weir.status(base, path, Some(TOKEN)).await, 200, "{path}");
    }
    let basic = weir
        .client
        .get(format!("{base}/metrics"))
        .basic_auth("admin", Some(TOKEN))
        .send()
        .await
        .unwrap();
    assert_eq!(basic.status(), 401, "only a bearer token is taken");
    for path in ["/ready", "/health"] {
        assert_eq!(weir.status(base, path, None).await, 200, "{path}");
    }
    assert_eq!(weir.status(base, "/no-such-page", None).await, 404);
    assert_eq!(weir.push(&weir.http, "tenant-c", 2).await, 200);
    let log = weir.log();
    assert!(
        log.contains("admin page refused"),
        "the refusals are logged"
    );
    assert!(!log.contains(TOKEN) && !log.contains(wrong), "{log}");
}

#[tokio::test]
async fn the_admin_token_guards_the_pages_on_either_listener() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("admin-token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let token_file = token_file.to_str().unwrap();

    let apart = start(
        112,
        &[
            "--admin-addr",
            "127.0.0.112:0",
            "--admin-token-file",
            token_file,
        ],
    )
    .await;
    check_token(&apart, apart.admin.as_deref().unwrap()).await;
    for path in ADMIN_PAGES {
        let status = apart.status(&apart.http, path, Some(TOKEN)).await;
        assert_eq!(status, 404, "{path}: apart, even with the token");
    }
    drop(apart);

    let here = start(112, &["--admin-token-file", token_file]).await;
    check_token(&here, &here.http).await;
    let log = here.log();
    let note = log.lines().find(|line| line.contains("no --admin-addr"));
    assert!(
        note.is_some_and(|line| line.contains("INFO") && line.contains("behind --admin-token")),
        "a note, not the warning: {log}"
    );
}

/// A changed token file is in force at the next check (every `--runtime-config-period`, 1 s
/// here), with no restart: the new token opens the pages within a few seconds and the old one
/// is refused from then on. A bad file keeps the last good token; neither reaches the log.
#[tokio::test]
async fn a_changed_admin_token_file_is_in_force_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("admin-token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let weir = start(
        113,
        &[
            "--admin-addr",
            "127.0.0.113:0",
            "--admin-token-file",
            token_file.to_str().unwrap(),
            "--runtime-config-period",
            "1s",
        ],
    )
    .await;
    let admin = weir.admin.as_deref().unwrap();
    assert_eq!(weir.status(admin, "/metrics", Some(TOKEN)).await, 200);
    let reloads = |outcome: &str, token: &'static str| {
        let weir = &weir;
        let outcome = outcome.to_string();
        async move {
            let page = weir.get(admin, "/metrics", Some(token)).await;
            assert_eq!(page.status(), 200);
            common::processes::sum(
                &page.text().await.unwrap(),
                "weir_admin_token_reloads_total",
                &[("outcome", &outcome)],
            )
        }
    };
    assert_eq!(reloads("ok", TOKEN).await, 1.0, "the load at start-up");

    // Replaced as the kubelet replaces a Secret's file: a new file renamed over the old.
    const ROTATED: &str = "9e8d7c6b5a4f-rotated-admin-token-0123";
    let replace = |text: &str| {
        let next = dir.path().join("admin-token.next");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, &token_file).unwrap();
    };
    replace(&format!("{ROTATED}\n"));
    let changed = std::time::Instant::now();
    common::wait_until(
        "the rotated token to open the pages",
        Duration::from_secs(5),
        || async { weir.status(admin, "/metrics", Some(ROTATED)).await == 200 },
    )
    .await;
    let took = changed.elapsed();
    for path in ADMIN_PAGES {
        assert_eq!(weir.status(admin, path, Some(TOKEN)).await, 403, "{path}");
        assert_eq!(weir.status(admin, path, Some(ROTATED)).await, 200, "{path}");
    }
    assert_eq!(reloads("ok", ROTATED).await, 2.0);
    eprintln!("the rotated token was in force {took:?} after the file changed");

    // A bad file: counted, and the rotated token stays in force.
    replace("short\n");
    common::wait_until("the bad file seen", Duration::from_secs(5), || async {
        reloads("error", ROTATED).await == 1.0
    })
    .await;
    assert_eq!(weir.status(admin, "/metrics", Some(ROTATED)).await, 200);
    assert_eq!(weir.status(admin, "/metrics", Some(TOKEN)).await, 403);
    let page = weir.get(admin, "/metrics", Some(ROTATED)).await;
    let page = page.text().await.unwrap();
    assert_eq!(
        common::processes::sum(&page, "weir_admin_token_last_reload_successful", &[]),
        0.0
    );

    let log = weir.log();
    assert!(log.contains("admin token reloaded"), "{log}");
    assert!(
        log.contains("the last good admin token stays in force"),
        "{log}"
    );
    for secret in [TOKEN, ROTATED] {
        assert!(!log.contains(secret), "a token reached the log: {log}");
    }
}

#[test]
fn a_bad_token_file_stops_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("admin-token");
    for (text, expected) in [("short\n", "at least 16"), ("", "holds no token")] {
        std::fs::write(&token_file, text).unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_weir"))
            .args([
                "--http-addr",
                "127.0.0.110:0",
                "--grpc-addr",
                "127.0.0.110:0",
            ])
            .args(["--gossip-addr", "127.0.0.110:0"])
            .args(["--admin-token-file", token_file.to_str().unwrap()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{stderr}");
        assert!(stderr.contains("--admin-token-file"), "{stderr}");
        assert!(stderr.contains(expected), "{stderr}");
        assert!(output.stdout.is_empty(), "nothing was served");
    }
    let missing = dir.path().join("missing");
    let output = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["--admin-token-file", missing.to_str().unwrap()])
        .args([
            "--http-addr",
            "127.0.0.110:0",
            "--grpc-addr",
            "127.0.0.110:0",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot read --admin-token-file"));
}

/// With `--http-tls-cert-file`, the admin listener serves HTTPS with the same certificate.
#[tokio::test]
async fn the_admin_listener_speaks_https_when_the_http_listener_does() {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let dir = tempfile::tempdir().unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.111".to_string()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let (cert_file, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem().as_bytes()).unwrap())
        .build()
        .unwrap();

    let weir = start_with(
        111,
        &[
            "--admin-addr",
            "127.0.0.111:0",
            "--http-tls-cert-file",
            cert_file.to_str().unwrap(),
            "--http-tls-key-file",
            key_file.to_str().unwrap(),
        ],
        client,
    )
    .await;
    let admin = weir.admin.as_deref().unwrap();
    assert!(admin.starts_with("https://") && weir.http.starts_with("https://"));
    assert_eq!(weir.status(admin, "/metrics", None).await, 200);
    assert_eq!(weir.status(&weir.http, "/metrics", None).await, 404);
    assert_eq!(weir.push(&weir.http, "tenant-d", 1).await, 200);
}

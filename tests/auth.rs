//! Tenant authentication on real `weir` processes (127.0.0.120-127), with real clients: curl
//! and Python's http.client with tokens on every HTTP door, tonic's client on the gRPC doors
//! (the admission API and Envoy's RLS), Python's grpc over gRPC TLS with tokens, and client
//! certificates made by rcgen over HTTPS and gRPC TLS. Each door answers 401 without credentials, 403 with a credential for another
//! tenant (which is then not charged), 200 with its own; a flood of bad tokens from one
//! address is throttled (429) while another address is not; the credentials file is
//! reloaded live, and a bad one keeps the last good in force. No secret reaches the log.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::processes::{require, Process};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use weir::auth::secret_digest;
use weir::grpc::proto::envoy::service::ratelimit::v3 as rls;
use weir::grpc::proto::weir::admission::v1 as api;
use weir::remote_write::prompb::WriteRequest;

const TOKEN_A: &str = "tok-a-5f1c9e0b7a3d4e2f8c6b1a0d9e7f3c2b";
const TOKEN_AB: &str = "tok-ab-0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b";
const TOKEN_ENVOY: &str = "tok-envoy-a1b2c3d4e5f60718293a4b5c6d7e8f90";
const TOKEN_ROTATED: &str = "tok-rotated-99887766554433221100ffeeddccbbaa";
const BAD_TOKEN: &str = "tok-bad-deadbeefdeadbeefdeadbeefdeadbeef";
const AGENT_PASSWORD: &str = "agent-pw-7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a21";

const OVERRIDES: &str = r#"
envoy_domains:
  - domain: edge
    tenant: edge
    descriptors:
      - key: remote_address
        rate_limit: {unit: second, requests_per_unit: 100}
overrides:
  team-b:
    limits:
      k: {rate: 0.001, burst: 5}
"#;

fn credentials(bearer_a: &str) -> String {
    format!(
        "credentials:\n\
         - name: pusher-a\n  bearer_sha256: {}\n  tenants: [team-a]\n\
         - name: pusher-ab\n  bearer_sha256: {}\n  tenants: [team-a, team-b]\n\
         - name: envoy\n  bearer_sha256: {}\n  tenants: [edge]\n\
         - name: agent-c\n  basic_user: agent\n  basic_password_sha256: {}\n  tenants: [team-c]\n\
         - name: cert-a\n  certificate: pusher-a.weir.test\n  tenants: [team-a]\n",
        secret_digest(bearer_a),
        secret_digest(TOKEN_AB),
        secret_digest(TOKEN_ENVOY),
        secret_digest(AGENT_PASSWORD),
    )
}

struct Weir {
    _process: Process,
    /// `http://…` or `https://…`.
    http: String,
    grpc: String,
    log: PathBuf,
    dir: tempfile::TempDir,
}

/// Starts weir on 127.0.0.`ip` with the credentials file and overrides above, then `extra`.
fn start(ip: u8, dir: tempfile::TempDir, extra: &[&str]) -> Weir {
    let log = dir.path().join("weir.log");
    let overrides = dir.path().join("overrides.yaml");
    std::fs::write(&overrides, OVERRIDES).unwrap();
    let gossip = common::fleet::free_gossip_addr([127, 0, 0, ip]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["--http-addr", &format!("127.0.0.{ip}:0")])
        .args(["--grpc-addr", &format!("127.0.0.{ip}:0")])
        .args(["--gossip-addr", &gossip.to_string()])
        .args(["--cluster-id", &format!("auth-{ip}")])
        .args(["--runtime-config", overrides.to_str().unwrap()])
        .args(["--runtime-config-period", "100ms"])
        .args(["--auth-credentials-file"])
        .arg(dir.path().join("credentials.yaml"))
        .args(["--log-level", "debug"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = |prefix: &str| -> String {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        line.strip_prefix(prefix)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("expected {prefix:?}, got {line:?}"))
            .to_string()
    };
    let http = line("weir listening on ");
    let grpc = line("weir gRPC on ");
    let auth = line("weir tenant authentication: ");
    assert!(extra.contains(&auth.as_str()), "{auth}");
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    Weir {
        _process: Process(child),
        http,
        grpc,
        log,
        dir,
    }
}

/// Runs curl with `args`; the status and the whole answer (head and body).
fn curl(args: &[&str]) -> (u16, String) {
    let output = Command::new("curl")
        .args(["-sS", "-i", "--max-time", "10"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "curl {args:?}: no answer: {}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
    (status, text)
}

impl Weir {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }

    /// A remote-write push with curl from 127.0.0.`from`.
    fn push(&self, from: u8, tenant: Option<&str>, auth: &[&str], tls: &[&str]) -> (u16, String) {
        let body = self.path("push.bin");
        if !body.exists() {
            std::fs::write(&body, WriteRequest::synthetic(3, 1, 1).encode_snappy()).unwrap();
        }
        let url = format!("{}/api/v1/push", self.http);
        let data = format!("@{}", body.display());
        let from = format!("127.0.0.{from}");
        let tenant_header = tenant.map(|tenant| format!("X-Scope-OrgID: {tenant}"));
        let mut args = vec![
            "--interface",
            &from,
            "-H",
            "Content-Encoding: snappy",
            "-H",
            "Content-Type: application/x-protobuf",
            "--data-binary",
            &data,
        ];
        if let Some(header) = &tenant_header {
            args.extend(["-H", header]);
        }
        args.extend(auth);
        args.extend(tls);
        args.push(&url);
        curl(&args)
    }

    async fn metrics(&self) -> String {
        let (status, page) = curl(&[
            "-k",
            "--cacert",
            self.path("ca.pem").to_str().unwrap(),
            &format!("{}/metrics", self.http),
        ]);
        assert_eq!(status, 200);
        page
    }

    async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        common::processes::sum(&self.metrics().await, name, labels)
    }
}

fn bearer(token: &str) -> String {
    format!("Authorization: Bearer {token}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_on_every_door_with_curl_python_and_grpc() {
    if require("curl").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("credentials.yaml"), credentials(TOKEN_A)).unwrap();
    let weir = start(120, dir, &["--tenant-auth", "tokens"]);
    common::wait_until("weir is ready", Duration::from_secs(20), || async {
        curl(&[&format!("{}/ready", weir.http)]).0 == 200
    })
    .await;

    // Remote-write, from 127.0.0.122.
    let a = bearer(TOKEN_A);
    let (status, answer) = weir.push(122, Some("team-a"), &[], &[]);
    assert_eq!(status, 401, "{answer}");
    assert!(
        answer.to_lowercase().contains("www-authenticate: bearer"),
        "{answer}"
    );
    assert_eq!(
        weir.push(122, Some("team-a"), &["-H", &bearer(BAD_TOKEN)], &[])
            .0,
        401
    );
    assert_eq!(
        weir.push(122, Some("team-a"), &["-H", "Authorization: Digest x"], &[])
            .0,
        401
    );
    let (status, answer) = weir.push(122, Some("team-b"), &["-H", &a], &[]);
    assert_eq!(status, 403, "{answer}");
    assert_eq!(weir.push(122, Some("team-a"), &["-H", &a], &[]).0, 200);
    // No X-Scope-OrgID: the one tenant the credential covers.
    assert_eq!(weir.push(122, None, &["-H", &a], &[]).0, 200);
    let (status, answer) = weir.push(122, None, &["-H", &bearer(TOKEN_AB)], &[]);
    assert_eq!(
        status, 400,
        "a credential for two tenants must name one: {answer}"
    );
    // Basic auth (curl -u), its single tenant filled in.
    let user = format!("agent:{AGENT_PASSWORD}");
    assert_eq!(weir.push(122, None, &["-u", &user], &[]).0, 200);
    assert_eq!(weir.push(122, None, &["-u", "agent:guess"], &[]).0, 401);
    let metrics = weir.metrics().await;
    let received = |user: &str| {
        common::processes::sum(
            &metrics,
            "weir_distributor_requests_in_total",
            &[("user", user)],
        )
    };
    assert_eq!(received("team-a"), 2.0);
    assert_eq!(received("team-c"), 1.0);
    assert_eq!(
        received("team-b"),
        0.0,
        "a refused push must not touch team-b"
    );

    // OTLP: an empty export is a valid one.
    let otlp = format!("{}/otlp/v1/metrics", weir.http);
    let otlp_call = |auth: &[&str], tenant: &str| {
        let tenant = format!("X-Scope-OrgID: {tenant}");
        let mut args = vec![
            "--interface",
            "127.0.0.122",
            "-H",
            "Content-Type: application/x-protobuf",
            "-H",
            &tenant,
            "--data-binary",
            "",
        ];
        args.extend(auth);
        args.push(&otlp);
        curl(&args).0
    };
    assert_eq!(otlp_call(&[], "team-a"), 401);
    assert_eq!(otlp_call(&["-H", &a], "team-b"), 403);
    assert_eq!(otlp_call(&["-H", &a], "team-a"), 200);

    // The JSON admission API, with Python's http.client from 127.0.0.123.
    let script = r#"
import http.client, json, sys
host, port = sys.argv[1].split(":")
def call(path, body, token=None):
    c = http.client.HTTPConnection(host, int(port), timeout=10, source_address=("127.0.0.123", 0))
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = "Bearer " + token
    c.request("POST", path, json.dumps(body), headers)
    r = c.getresponse()
    out = {"status": r.status, "body": json.loads(r.read() or b"{}")}
    c.close()
    return out
a, ab = sys.argv[2], sys.argv[3]
results = {
    "none": call("/api/v1/allow", {"tenant": "team-b", "key": "k"}),
    "other": [call("/api/v1/allow", {"tenant": "team-b", "key": "k"}, a) for _ in range(3)],
    "acquire_other": call("/api/v1/acquire", {"tenant": "team-b", "key": "k"}, a),
    "own": call("/api/v1/allow", {"tenant": "team-b", "key": "k"}, ab),
    "filled": call("/api/v1/allow", {"tenant": "", "key": "x"}, a),
    "release_none": call("/api/v1/release", {"lease_id": "L1"}),
}
print(json.dumps(results))
"#;
    let address = weir.http.strip_prefix("http://").unwrap();
    let output = Command::new("python3")
        .args(["-c", script, address, TOKEN_A, TOKEN_AB])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(results["none"]["status"], 401, "{results}");
    assert_eq!(results["none"]["body"]["reason"], "UNAUTHENTICATED");
    for other in results["other"].as_array().unwrap() {
        assert_eq!(other["status"], 403, "{results}");
        assert_eq!(other["body"]["reason"], "TENANT_FORBIDDEN");
    }
    assert_eq!(results["acquire_other"]["status"], 403, "{results}");
    assert_eq!(results["own"]["status"], 200, "{results}");
    // team-b's bucket (burst 5) is whole: the refused calls took nothing from it.
    assert_eq!(results["own"]["body"]["remaining"], 4, "{results}");
    // The tenant filled in from the credential: team-a, under the default admission limit.
    assert_eq!(results["filled"]["status"], 200, "{results}");
    assert_eq!(results["filled"]["body"]["allowed"], true, "{results}");
    assert_eq!(results["release_none"]["status"], 401, "{results}");

    // The gRPC admission API and Envoy's RLS: credentials in the `authorization` metadata.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", weir.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut admission = api::admission_client::AdmissionClient::new(channel.clone());
    let with_token = |token: Option<&str>, tenant: &str| {
        let mut request = tonic::Request::new(api::AllowRequest {
            tenant: tenant.into(),
            key: "k".into(),
            cost: 1,
            ..Default::default()
        });
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        request
    };
    let code = |result: Result<tonic::Response<api::AllowResponse>, tonic::Status>| {
        result.map(|_| tonic::Code::Ok).unwrap_or_else(|s| s.code())
    };
    assert_eq!(
        code(admission.allow(with_token(None, "team-b")).await),
        tonic::Code::Unauthenticated
    );
    assert_eq!(
        code(admission.allow(with_token(Some(TOKEN_A), "team-b")).await),
        tonic::Code::PermissionDenied
    );
    let own = admission
        .allow(with_token(Some(TOKEN_AB), "team-b"))
        .await
        .unwrap();
    assert_eq!(
        own.get_ref().remaining,
        3,
        "only the one JSON call took from team-b"
    );
    // AllowBatch checks each item's tenant: one refused item is refused alone, and an item
    // naming the tenant the one before it named is held to the same rules.
    let items = ["team-a", "team-b", "team-a", "", "team-a"].map(|tenant| api::AllowRequest {
        tenant: tenant.into(),
        key: "k".into(),
        cost: 1,
        ..Default::default()
    });
    let mut items = items.to_vec();
    items[4].key = "k".repeat(1025);
    let mut batch = tonic::Request::new(api::AllowBatchRequest { requests: items });
    batch.metadata_mut().insert(
        "authorization",
        format!("Bearer {TOKEN_A}").parse().unwrap(),
    );
    let codes: Vec<i32> = (admission
        .allow_batch(batch)
        .await
        .unwrap()
        .into_inner()
        .results)
        .into_iter()
        .map(|item| match item.result {
            Some(api::allow_batch_response::result::Result::Response(_)) => 0,
            Some(api::allow_batch_response::result::Result::Error(err)) => err.code,
            None => -1,
        })
        .collect();
    assert_eq!(
        codes,
        [
            tonic::Code::Ok,
            tonic::Code::PermissionDenied,
            tonic::Code::Ok,
            tonic::Code::Ok,
            tonic::Code::InvalidArgument
        ]
        .map(|code| code as i32)
    );
    let mut envoy = rls::rate_limit_service_client::RateLimitServiceClient::new(channel);
    let should = |token: Option<&str>| {
        let mut request = tonic::Request::new(rls::RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![weir::grpc::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor {
                entries: vec![weir::grpc::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry {
                    key: "remote_address".into(),
                    value: "10.0.0.1".into(),
                }],
                ..Default::default()
            }],
            hits_addend: 1,
        });
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        request
    };
    let rls_code = |result: Result<tonic::Response<rls::RateLimitResponse>, tonic::Status>| {
        result.map(|_| tonic::Code::Ok).unwrap_or_else(|s| s.code())
    };
    assert_eq!(
        rls_code(envoy.should_rate_limit(should(None)).await),
        tonic::Code::Unauthenticated
    );
    assert_eq!(
        rls_code(envoy.should_rate_limit(should(Some(TOKEN_A))).await),
        tonic::Code::PermissionDenied
    );
    assert_eq!(
        rls_code(envoy.should_rate_limit(should(Some(TOKEN_ENVOY))).await),
        tonic::Code::Ok
    );

    // Failures counted by door and reason.
    for (door, reason, at_least) in [
        ("push", "missing", 1.0),
        ("push", "unknown", 2.0),
        ("push", "malformed", 1.0),
        ("push", "forbidden", 1.0),
        ("push", "ambiguous", 1.0),
        ("otlp", "forbidden", 1.0),
        ("admission_http", "forbidden", 4.0),
        ("admission_grpc", "missing", 1.0),
        ("rls", "forbidden", 1.0),
    ] {
        let counted = weir
            .metric(
                "weir_auth_failures_total",
                &[("door", door), ("reason", reason)],
            )
            .await;
        assert!(counted >= at_least, "{door} {reason}: {counted}");
    }

    // A flood of bad tokens from 127.0.0.121 is throttled after its burst (20), good token
    // or not; 127.0.0.122 is not.
    let bad = bearer(BAD_TOKEN);
    let statuses: Vec<u16> = (0..30)
        .map(|_| weir.push(121, Some("team-a"), &["-H", &bad], &[]).0)
        .collect();
    assert_eq!(
        statuses.iter().filter(|&&s| s == 401).count(),
        20,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&s| s == 429).count(),
        10,
        "{statuses:?}"
    );
    let (status, answer) = weir.push(121, Some("team-a"), &["-H", &a], &[]);
    assert_eq!(status, 429, "throttled whatever it presents: {answer}");
    assert!(answer.to_lowercase().contains("retry-after:"), "{answer}");
    // The JSON twin says when too, as the push path does.
    let allow = |from: &str, path: &str, body: &str| {
        curl(&[
            "--interface",
            from,
            "-H",
            &a,
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            body,
            &format!("{}{path}", weir.http),
        ])
    };
    let (status, answer) = allow(
        "127.0.0.121",
        "/api/v1/allow",
        r#"{"tenant":"team-a","key":"k"}"#,
    );
    assert_eq!(status, 429, "{answer}");
    assert!(answer.contains("AUTH_THROTTLED"), "{answer}");
    assert!(answer.to_lowercase().contains("retry-after:"), "{answer}");
    assert_eq!(weir.push(122, Some("team-a"), &["-H", &a], &[]).0, 200);
    // A batch is one request: 30 items naming another tenant spend one failure of the
    // source's 20 between them, so none is throttled and the caller's own pushes pass.
    let items = vec![r#"{"tenant":"team-b","key":"k"}"#; 30].join(",");
    let (status, answer) = allow(
        "127.0.0.123",
        "/api/v1/allow_batch",
        &format!(r#"{{"requests":[{items}]}}"#),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer.matches("TENANT_FORBIDDEN").count(), 30, "{answer}");
    assert!(!answer.contains("AUTH_THROTTLED"), "{answer}");
    assert_eq!(weir.push(123, Some("team-a"), &["-H", &a], &[]).0, 200);
    assert!(
        weir.metric("weir_auth_failures_total", &[("reason", "throttled")])
            .await
            >= 11.0
    );

    // Live reload: TOKEN_A is replaced by TOKEN_ROTATED.
    let ok_reloads = "weir_auth_credentials_reloads_total";
    let before = weir.metric(ok_reloads, &[("outcome", "ok")]).await;
    std::fs::write(weir.path("credentials.yaml"), credentials(TOKEN_ROTATED)).unwrap();
    common::wait_until(
        "the credentials reload",
        Duration::from_secs(10),
        || async { weir.metric(ok_reloads, &[("outcome", "ok")]).await > before },
    )
    .await;
    let rotated = bearer(TOKEN_ROTATED);
    assert_eq!(
        weir.push(124, Some("team-a"), &["-H", &rotated], &[]).0,
        200
    );
    assert_eq!(weir.push(124, Some("team-a"), &["-H", &a], &[]).0, 401);
    // A bad file: counted, and the last good credentials stay.
    let errors = weir
        .metric(
            "weir_auth_credentials_reloads_total",
            &[("outcome", "error")],
        )
        .await;
    std::fs::write(weir.path("credentials.yaml"), "credentials: [oops").unwrap();
    common::wait_until("the bad file seen", Duration::from_secs(10), || async {
        weir.metric(
            "weir_auth_credentials_reloads_total",
            &[("outcome", "error")],
        )
        .await
            > errors
    })
    .await;
    assert_eq!(
        weir.metric("weir_auth_credentials_last_reload_successful", &[])
            .await,
        0.0
    );
    assert_eq!(
        weir.push(124, Some("team-a"), &["-H", &rotated], &[]).0,
        200
    );

    let log = weir.log();
    assert!(log.contains("credentials reloaded"), "{log}");
    for secret in [TOKEN_A, TOKEN_AB, BAD_TOKEN, TOKEN_ROTATED, AGENT_PASSWORD] {
        assert!(!log.contains(secret), "a secret reached the log");
    }
}

/// A CA and the certificates it issues.
struct Authority {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Authority {
    fn new(name: &str) -> Authority {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Authority { cert, key }
    }

    /// A certificate named `sans` with subject CN `cn`, to `dir`/`name`.pem and -key.pem.
    fn issue(&self, dir: &Path, name: &str, cn: &str, sans: &[&str]) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(sans.iter().map(|san| san.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let paths = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}-key.pem")),
        );
        std::fs::write(&paths.0, cert.pem()).unwrap();
        std::fs::write(&paths.1, key.serialize_pem()).unwrap();
        paths
    }
}

/// A tonic channel over TLS to `address`, trusting `ca`, presenting `identity` if given.
async fn grpc_tls(
    address: &str,
    ca: &Authority,
    identity: Option<&(PathBuf, PathBuf)>,
) -> tonic::transport::Channel {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert.der().clone()).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                rustls::pki_types::CertificateDer::pem_file_iter(cert)
                    .unwrap()
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap(),
                rustls::pki_types::PrivateKeyDer::from_pem_file(key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let address = address.to_string();
    tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_uri| {
            let connector = connector.clone();
            let address = address.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(&address).await?;
                let ip: std::net::IpAddr = address.rsplit_once(':').unwrap().0.parse().unwrap();
                let name = rustls::pki_types::ServerName::IpAddress(ip.into());
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_with_rcgen_client_certificates_over_https_and_grpc() {
    if require("curl").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = Authority::new("weir test CA");
    let stranger = Authority::new("another CA");
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    std::fs::write(path("ca.pem"), ca.cert.pem()).unwrap();
    let (server_cert, server_key) = ca.issue(dir.path(), "server", "weir", &["127.0.0.125"]);
    let client_a = ca.issue(dir.path(), "client-a", "ignored", &["pusher-a.weir.test"]);
    let client_cn = ca.issue(dir.path(), "client-cn", "pusher-a.weir.test", &[]);
    let client_x = ca.issue(dir.path(), "client-x", "nobody.weir.test", &[]);
    let client_stranger = stranger.issue(dir.path(), "client-s", "pusher-a.weir.test", &[]);
    std::fs::write(path("credentials.yaml"), credentials(TOKEN_A)).unwrap();
    let (server_cert, server_key) = (
        server_cert.to_str().unwrap().to_string(),
        server_key.to_str().unwrap().to_string(),
    );
    let ca_file = path("ca.pem");
    let weir = start(
        125,
        dir,
        &[
            "--tenant-auth",
            "mtls",
            "--http-tls-cert-file",
            &server_cert,
            "--http-tls-key-file",
            &server_key,
            "--http-tls-client-ca-file",
            &ca_file,
            "--grpc-tls-cert-file",
            &server_cert,
            "--grpc-tls-key-file",
            &server_key,
            "--grpc-tls-client-ca-file",
            &ca_file,
        ],
    );
    assert!(weir.http.starts_with("https://"), "{}", weir.http);
    let trust = ["--cacert", ca_file.as_str()];
    common::wait_until("weir is ready", Duration::from_secs(20), || async {
        curl(&["--cacert", &ca_file, &format!("{}/ready", weir.http)]).0 == 200
    })
    .await;
    let with = |(cert, key): &(PathBuf, PathBuf)| {
        vec![
            "--cert".to_string(),
            cert.to_str().unwrap().to_string(),
            "--key".to_string(),
            key.to_str().unwrap().to_string(),
        ]
    };
    let push = |tenant: Option<&str>, identity: Option<&(PathBuf, PathBuf)>| {
        let identity = identity.map(with).unwrap_or_default();
        let mut tls: Vec<&str> = trust.to_vec();
        tls.extend(identity.iter().map(String::as_str));
        weir.push(126, tenant, &[], &tls).0
    };
    assert_eq!(push(Some("team-a"), None), 401, "no client certificate");
    assert_eq!(
        push(Some("team-a"), Some(&client_x)),
        401,
        "a name the file lacks"
    );
    assert_eq!(push(Some("team-b"), Some(&client_a)), 403);
    assert_eq!(push(Some("team-a"), Some(&client_a)), 200, "by SAN");
    assert_eq!(
        push(None, Some(&client_cn)),
        200,
        "by subject CN, tenant filled in"
    );
    // A certificate no trusted CA signed fails the handshake: curl gets no answer.
    let stranger_args = with(&client_stranger);
    let output = Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(trust)
        .args(&stranger_args)
        .arg(format!("{}/ready", weir.http))
        .output()
        .unwrap();
    assert!(
        !output.status.success(),
        "a stranger's certificate was accepted"
    );

    // gRPC over TLS, verified the same way.
    let request = |tenant: &str| api::AllowRequest {
        tenant: tenant.into(),
        key: "k".into(),
        cost: 1,
        ..Default::default()
    };
    let mut anonymous =
        api::admission_client::AdmissionClient::new(grpc_tls(&weir.grpc, &ca, None).await);
    let status = anonymous.allow(request("team-a")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    let mut pusher = api::admission_client::AdmissionClient::new(
        grpc_tls(&weir.grpc, &ca, Some(&client_a)).await,
    );
    let status = pusher.allow(request("team-b")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    let allowed = pusher.allow(request("team-a")).await.unwrap();
    assert!(allowed.get_ref().allowed);
}

/// Python's grpc package (grpcio) calls the gRPC admission API over TLS, the server's
/// certificate made by rcgen, trusted through `grpc.ssl_channel_credentials(root_certificates=…)`,
/// with tenant tokens in the `authorization` metadata (and as grpcio's
/// `access_token_call_credentials`). Plaintext and a client trusting another CA get no
/// answer; no token and a bad token are UNAUTHENTICATED, another tenant's PERMISSION_DENIED
/// and not charged; the tenant's own calls are allowed up to its burst, then refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpc_client_over_tls_with_tokens() {
    let python = Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .stderr(Stdio::null())
        .status();
    if !python.is_ok_and(|status| status.success()) {
        common::cannot_run_here(
            "the Python gRPC client over TLS",
            "python3 with grpcio and grpcio-tools is missing (./scripts/test installs them)",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = Authority::new("weir test CA");
    let stranger = Authority::new("another CA");
    let (cert, key) = ca.issue(dir.path(), "server", "weir", &["127.0.0.127"]);
    let (ca_file, other_ca_file) = (dir.path().join("ca.pem"), dir.path().join("other.pem"));
    std::fs::write(&ca_file, ca.cert.pem()).unwrap();
    std::fs::write(&other_ca_file, stranger.cert.pem()).unwrap();
    std::fs::write(dir.path().join("credentials.yaml"), credentials(TOKEN_A)).unwrap();
    let weir = start(
        127,
        dir,
        &[
            "--tenant-auth",
            "tokens",
            "--grpc-tls-cert-file",
            cert.to_str().unwrap(),
            "--grpc-tls-key-file",
            key.to_str().unwrap(),
        ],
    );
    common::wait_until("weir is ready", Duration::from_secs(20), || async {
        reqwest::get(format!("{}/ready", weir.http))
            .await
            .is_ok_and(|response| response.status() == 200)
    })
    .await;

    let output = tokio::task::spawn_blocking({
        let args = [
            weir.grpc.clone(),
            ca_file.to_str().unwrap().to_string(),
            other_ca_file.to_str().unwrap().to_string(),
            TOKEN_A.to_string(),
            TOKEN_AB.to_string(),
        ];
        move || {
            Command::new("python3")
                .arg(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/tests/python/admission_tls_client.py"
                ))
                .args(args)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "the Python client failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let results: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let code = |name: &str| {
        results[name]["code"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };

    assert_eq!(code("plaintext"), "UNAVAILABLE", "{results}");
    assert_eq!(code("untrusted_ca"), "UNAVAILABLE", "{results}");
    for name in ["no_token", "bad_token"] {
        assert_eq!(code(name), "UNAUTHENTICATED", "{name}: {results}");
        assert_eq!(results[name]["reason"], "UNAUTHENTICATED", "{results}");
    }
    for other in results["other_tenant"].as_array().unwrap() {
        assert_eq!(other["code"], "PERMISSION_DENIED", "{results}");
        assert_eq!(other["reason"], "TENANT_FORBIDDEN", "{results}");
    }
    assert_eq!(code("filled_in"), "OK", "{results}");
    assert_eq!(results["filled_in"]["allowed"], true, "{results}");
    // team-b's bucket (burst 5, refilling once in 1 000 s) is whole: the refused calls took
    // nothing from it. Five pass, the sixth is refused with a wait.
    let own = results["own"].as_array().unwrap();
    let allowed: Vec<bool> = own
        .iter()
        .map(|answer| {
            assert_eq!(answer["code"], "OK", "{results}");
            answer["allowed"].as_bool().unwrap()
        })
        .collect();
    assert_eq!(allowed, [true, true, true, true, true, false], "{results}");
    let remaining: Vec<u64> = own
        .iter()
        .map(|answer| answer["remaining"].as_u64().unwrap())
        .collect();
    assert_eq!(remaining, [4, 3, 2, 1, 0, 0], "{results}");
    assert!(
        own[5]["retry_after"].as_f64().unwrap() > 1.0,
        "the refusal says when: {results}"
    );

    // The refusals were counted as the gRPC door's, and no token reached the log.
    let page = reqwest::get(format!("{}/metrics", weir.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let failures = |reason: &str| {
        common::processes::sum(
            &page,
            "weir_auth_failures_total",
            &[("door", "admission_grpc"), ("reason", reason)],
        )
    };
    assert_eq!(failures("missing"), 1.0);
    assert_eq!(failures("unknown"), 1.0);
    assert_eq!(failures("forbidden"), 3.0);
    let log = weir.log();
    for secret in [TOKEN_A, TOKEN_AB] {
        assert!(!log.contains(secret), "a token reached the log");
    }
}

//! Optional TLS, with the real binary: HTTPS on the listener (pushes, metrics), a renewed
//! certificate served without a restart, a broken renewal that leaves the last good one in
//! force, a bad certificate refused at start-up, and forwarding to an HTTPS upstream (another
//! real weir) that only the given CA vouches for. Certificates are made per test with rcgen.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::fleet::listening_addr;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use weir::remote_write::prompb::WriteRequest;

/// A CA that issues a certificate for 127.0.0.1 and localhost.
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

    fn pem(&self) -> String {
        self.cert.pem()
    }

    /// Writes a fresh server certificate and key to `dir`/cert.pem and `dir`/key.pem, each
    /// replaced at once (written aside, then renamed), as a renewal tool would.
    fn issue(&self, dir: &Path) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let paths = (dir.join("cert.pem"), dir.join("key.pem"));
        write_atomically(&paths.1, &key.serialize_pem());
        write_atomically(&paths.0, &cert.pem());
        paths
    }
}

fn write_atomically(path: &Path, content: &str) {
    let aside = path.with_extension("new");
    std::fs::write(&aside, content).unwrap();
    std::fs::rename(&aside, path).unwrap();
}

fn weir(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_weir"));
    command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["--http-addr", "127.0.0.1:0"])
        .args(["--gossip-addr", "127.0.0.1:0"])
        .args(["--grpc-addr", "127.0.0.1:0"])
        .args(["--cluster-id", &format!("tls-{}", std::process::id())])
        .args(["--runtime-config-period", "100ms"])
        .args(args);
    command
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(args: &[&str]) -> (Running, SocketAddr) {
    spawn_logging_to(args, Stdio::null())
}

fn spawn_logging_to(args: &[&str], stderr: impl Into<Stdio>) -> (Running, SocketAddr) {
    let mut child = weir(args)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let addr = listening_addr(&mut child);
    (Running(child), addr)
}

fn https_server(dir: &Path, authority: &Authority) -> (Running, SocketAddr) {
    https_server_logging_to(dir, authority, Stdio::null())
}

/// As [`https_server`], its log (stderr) going to `log`.
fn https_server_logging_to(
    dir: &Path,
    authority: &Authority,
    log: impl Into<Stdio>,
) -> (Running, SocketAddr) {
    let (cert, key) = authority.issue(dir);
    spawn_logging_to(
        &[
            "--http-tls-cert-file",
            cert.to_str().unwrap(),
            "--http-tls-key-file",
            key.to_str().unwrap(),
        ],
        log,
    )
}

/// The DER of the first certificate in the PEM file at `path`.
fn certificate_in(path: &Path) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_file(path)
        .unwrap()
        .to_vec()
}

/// The leaf certificate (DER) that a new TLS handshake with `addr` is given, checked against
/// `ca` alone.
async fn served_certificate(addr: SocketAddr, ca: &str) -> Vec<u8> {
    use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = connector
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

/// A client that trusts only `ca`; each client opens its own connections.
fn client(ca: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
        .tls_built_in_root_certs(false)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

async fn push(client: &reqwest::Client, url: &str) -> reqwest::Result<reqwest::StatusCode> {
    let body = WriteRequest::synthetic(10, 1, 0).encode_snappy();
    let response = client
        .post(format!("{url}/api/v1/push"))
        .header("X-Scope-OrgID", "team-a")
        .header("Content-Encoding", "snappy")
        .header("Content-Type", "application/x-protobuf")
        .body(body)
        .send()
        .await?;
    Ok(response.status())
}

async fn metric(client: &reqwest::Client, url: &str, name: &str) -> f64 {
    common::metric_at(client, url, name)
        .await
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

#[tokio::test]
async fn https_serves_pushes_and_a_renewed_certificate_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("weir.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let first = Authority::new("first CA");
    let (_weir, addr) = https_server_logging_to(dir.path(), &first, log);
    let url = format!("https://{addr}");

    let status = push(&client(&first.pem()), &url).await.unwrap();
    assert!(status.is_success(), "{status}");
    assert_eq!(
        metric(&client(&first.pem()), &url, "weir_sink_requests_total").await,
        1.0
    );
    // Plain HTTP on the TLS port is not served.
    let plain = reqwest::Client::new()
        .get(format!("http://{addr}/metrics"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(
        plain.is_err() || !plain.unwrap().status().is_success(),
        "plain HTTP was served on the HTTPS port"
    );

    // Renewed by another CA: new connections get the new certificate, no restart.
    let second = Authority::new("second CA");
    let (renewed, _) = second.issue(dir.path());
    let renewed = certificate_in(&renewed);
    let deadline = Instant::now() + Duration::from_secs(10);
    while push(&client(&second.pem()), &url).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the renewed certificate was not served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        push(&client(&first.pem()), &url).await.is_err(),
        "the old certificate is still served"
    );
    assert!(
        served_certificate(addr, &second.pem()).await == renewed,
        "the certificate served is not the renewed one"
    );

    // A broken renewal: the last good certificate stays in force. A new refusal in the log
    // shows the broken file was read (the renewal above may have logged one already, if a
    // check fell between its key and its certificate); only then is what is served checked.
    let refusals = || {
        std::fs::read_to_string(&log_path)
            .unwrap()
            .matches("the new HTTPS certificate does not load")
            .count()
    };
    let refused_before = refusals();
    write_atomically(&dir.path().join("cert.pem"), "not a certificate\n");
    let deadline = Instant::now() + Duration::from_secs(10);
    while refusals() == refused_before {
        assert!(
            Instant::now() < deadline,
            "the broken certificate was not read: no new refusal in the log"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        served_certificate(addr, &second.pem()).await == renewed,
        "after a broken renewal, the certificate served is not the last good one"
    );
    let status = push(&client(&second.pem()), &url).await.unwrap();
    assert!(status.is_success(), "{status}");
}

/// Runs weir with `args`, which must stop it at start-up; returns what it said.
fn start_up_error(args: &[&str]) -> String {
    let output = weir(args).output().unwrap();
    assert!(!output.status.success(), "weir started with {args:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_bad_certificate_stops_start_up_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = Authority::new("CA").issue(dir.path());
    // A key that is not the certificate's.
    let other_key = dir.path().join("other-key.pem");
    std::fs::write(&other_key, KeyPair::generate().unwrap().serialize_pem()).unwrap();
    for (cert, key, expected) in [
        (cert.clone(), other_key.clone(), "do not make a key pair"),
        (dir.path().join("missing.pem"), key.clone(), "cannot read"),
        (key.clone(), key.clone(), "holds no certificate"),
    ] {
        let stderr = start_up_error(&[
            "--http-tls-cert-file",
            cert.to_str().unwrap(),
            "--http-tls-key-file",
            key.to_str().unwrap(),
        ]);
        assert!(
            stderr.contains("--http-tls-cert-file") && stderr.contains(expected),
            "{stderr}"
        );
    }
    // The same checks guard the upstream client's certificate.
    let stderr = start_up_error(&[
        "--upstream",
        "https://127.0.0.1:1/api/v1/push",
        "--upstream-tls-cert-file",
        cert.to_str().unwrap(),
        "--upstream-tls-key-file",
        other_key.to_str().unwrap(),
    ]);
    assert!(stderr.contains("do not make a key pair"), "{stderr}");
}

#[tokio::test]
async fn forwarding_to_an_https_upstream_trusts_the_given_ca() {
    let dir = tempfile::tempdir().unwrap();
    let authority = Authority::new("upstream CA");
    let (_upstream, upstream_addr) = https_server(dir.path(), &authority);
    let upstream_url = format!("https://{upstream_addr}/api/v1/push");
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, authority.pem()).unwrap();

    let (_front, front) = spawn(&[
        "--upstream",
        &upstream_url,
        "--upstream-tls-ca-file",
        ca_file.to_str().unwrap(),
    ]);
    let status = push(&reqwest::Client::new(), &format!("http://{front}"))
        .await
        .unwrap();
    assert!(status.is_success(), "{status}");
    let upstream = format!("https://{upstream_addr}");
    assert_eq!(
        metric(
            &client(&authority.pem()),
            &upstream,
            "weir_sink_requests_total"
        )
        .await,
        1.0
    );

    // Without the CA, the upstream is not trusted: 502, and nothing arrives.
    let (_untrusting, untrusting) = spawn(&["--upstream", &upstream_url]);
    let status = push(&reqwest::Client::new(), &format!("http://{untrusting}"))
        .await
        .unwrap();
    assert_eq!(status, reqwest::StatusCode::BAD_GATEWAY);
    assert_eq!(
        metric(
            &client(&authority.pem()),
            &upstream,
            "weir_sink_requests_total"
        )
        .await,
        1.0
    );
}

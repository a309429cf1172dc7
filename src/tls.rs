//! Optional TLS (rustls, ring): HTTPS on the HTTP listener, and a TLS upstream with its own
//! CAs and a client certificate. Certificate files are PEM and are re-read when they change
//! (checked every `--runtime-config-period`): a renewed certificate is served from the next
//! handshake on, with no restart and no dropped connection. A file that fails to load is
//! logged and the last good one stays in force, as with the runtime config.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::Context;
use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// When each file was last modified, and its length: a change in either means "re-read".
type Stamp = Vec<Option<(SystemTime, u64)>>;

fn stamp(paths: &[&Path]) -> Stamp {
    paths
        .iter()
        .map(|path| {
            let meta = std::fs::metadata(path).ok()?;
            Some((meta.modified().ok()?, meta.len()))
        })
        .collect()
}

/// Files whose content is in force, re-read when their stamp changes.
#[derive(Debug)]
struct Watched {
    paths: Vec<PathBuf>,
    stamp: Mutex<Stamp>,
}

impl Watched {
    fn new(paths: Vec<PathBuf>) -> Watched {
        let stamp = Mutex::new(stamp(
            &paths.iter().map(PathBuf::as_path).collect::<Vec<_>>(),
        ));
        Watched { paths, stamp }
    }

    /// Whether the files changed since the last call (or since `new`).
    fn changed(&self) -> bool {
        let now = stamp(&self.paths.iter().map(PathBuf::as_path).collect::<Vec<_>>());
        let mut last = self.stamp.lock().unwrap_or_else(|e| e.into_inner());
        if *last == now {
            return false;
        }
        *last = now;
        true
    }
}

fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{} is not a PEM certificate file", path.display()))?;
    anyhow::ensure!(!certs.is_empty(), "{} holds no certificate", path.display());
    Ok(certs)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate chain and its private key, checked to belong together.
fn load_key_pair(cert: &Path, key: &Path) -> anyhow::Result<CertifiedKey> {
    let chain = read_certs(cert)?;
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("{} is not a PEM private key", key.display()))?;
    let pair = CertifiedKey::from_der(chain, key, &provider())
        .with_context(|| format!("{} and its key do not make a key pair", cert.display()))?;
    Ok(pair)
}

/// The server's certificate, swapped in place when its files change.
#[derive(Debug)]
pub struct ServerCert {
    files: Watched,
    current: ArcSwap<CertifiedKey>,
}

impl ServerCert {
    pub fn load(cert: &Path, key: &Path) -> anyhow::Result<Arc<ServerCert>> {
        let files = Watched::new(vec![cert.to_path_buf(), key.to_path_buf()]);
        let pair = load_key_pair(cert, key)?;
        Ok(Arc::new(ServerCert {
            files,
            current: ArcSwap::from_pointee(pair),
        }))
    }

    /// Re-reads the files if they changed; on error the last good pair stays.
    pub fn reload_if_changed(&self) {
        if !self.files.changed() {
            return;
        }
        match load_key_pair(&self.files.paths[0], &self.files.paths[1]) {
            Ok(pair) => {
                self.current.store(Arc::new(pair));
                tracing::info!(cert = %self.files.paths[0].display(), "reloaded the HTTPS certificate");
            }
            Err(err) => tracing::error!(
                error = format!("{err:#}"),
                "the new HTTPS certificate does not load; still serving the last good one"
            ),
        }
    }

    /// The acceptor for the listener: TLS 1.2 and 1.3, HTTP/2 and HTTP/1.1 by ALPN.
    pub fn acceptor(self: &Arc<Self>) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
        self.acceptor_with(None, &[b"h2", b"http/1.1"])
    }

    /// The acceptor with these ALPN protocols, asking clients for a certificate that
    /// `client_ca` verifies when it is given (a client without one still connects: the
    /// doors decide what it may do, see [`crate::auth`]).
    pub fn acceptor_with(
        self: &Arc<Self>,
        client_ca: Option<Arc<ClientCa>>,
        alpn: &[&[u8]],
    ) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?;
        let builder = match client_ca {
            Some(client_ca) => {
                builder.with_client_cert_verifier(client_ca as Arc<dyn ClientCertVerifier>)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config =
            builder.with_cert_resolver(Arc::clone(self) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = alpn.iter().map(|protocol| protocol.to_vec()).collect();
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }
}

/// The CAs that verify client certificates (`--http-tls-client-ca-file`,
/// `--grpc-tls-client-ca-file`), swapped in place when the file changes. A client certificate
/// is optional: one that is presented must chain to these CAs or the handshake fails.
#[derive(Debug)]
pub struct ClientCa {
    files: Watched,
    current: ArcSwap<Arc<dyn ClientCertVerifier>>,
}

fn client_verifier(path: &Path) -> anyhow::Result<Arc<dyn ClientCertVerifier>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in read_certs(path)? {
        roots
            .add(cert)
            .with_context(|| format!("{} holds a certificate that is not a CA", path.display()))?;
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .allow_unauthenticated()
        .build()
        .with_context(|| format!("{} cannot verify client certificates", path.display()))
}

impl ClientCa {
    pub fn load(path: &Path) -> anyhow::Result<Arc<ClientCa>> {
        let files = Watched::new(vec![path.to_path_buf()]);
        let verifier = client_verifier(path)?;
        Ok(Arc::new(ClientCa {
            files,
            current: ArcSwap::from_pointee(verifier),
        }))
    }

    /// Re-reads the file if it changed; on error the last good CAs stay.
    pub fn reload_if_changed(&self) {
        if !self.files.changed() {
            return;
        }
        match client_verifier(&self.files.paths[0]) {
            Ok(verifier) => {
                self.current.store(Arc::new(verifier));
                tracing::info!(ca = %self.files.paths[0].display(), "reloaded the client CA");
            }
            Err(err) => tracing::error!(
                error = format!("{err:#}"),
                "the new client CA file does not load; still verifying with the last good one"
            ),
        }
    }
}

/// Every call goes to the verifier in force. No CA names are sent as hints (they could not be
/// borrowed across a swap); clients send the certificate they have.
impl ClientCertVerifier for ClientCa {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        self.current
            .load()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.current
            .load()
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.current
            .load()
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.current.load().supported_verify_schemes()
    }
}

impl ResolvesServerCert for ServerCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// What the upstream client trusts and presents.
#[derive(Debug, Clone, Default)]
pub struct ClientTls {
    /// CAs trusted besides the public roots.
    pub ca: Option<PathBuf>,
    /// A client certificate chain and key (mutual TLS).
    pub identity: Option<(PathBuf, PathBuf)>,
}

impl ClientTls {
    fn paths(&self) -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = self.ca.iter().cloned().collect();
        if let Some((cert, key)) = &self.identity {
            paths.extend([cert.clone(), key.clone()]);
        }
        paths
    }

    /// The upstream client's TLS: the public roots (Mozilla's, from `webpki-roots`) plus the
    /// CAs, and the identity if there is one. No ALPN: the connector sets it.
    pub fn client_config(&self) -> anyhow::Result<rustls::ClientConfig> {
        let mut roots =
            rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(ca) = &self.ca {
            for cert in read_certs(ca)? {
                roots.add(cert).with_context(|| {
                    format!("{} holds a certificate that is not a CA", ca.display())
                })?;
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let config = match &self.identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                // Checked as a pair first, for a clear message.
                load_key_pair(cert, key)?;
                let key_der = PrivateKeyDer::from_pem_file(key)
                    .with_context(|| format!("{} is not a PEM private key", key.display()))?;
                builder
                    .with_client_auth_cert(read_certs(cert)?, key_der)
                    .with_context(|| format!("{} cannot be a client certificate", cert.display()))?
            }
        };
        Ok(config)
    }

    /// A watch on the files, for [`ClientTls::client_config`] again when they change.
    pub fn watch(&self) -> ClientFiles {
        ClientFiles(Watched::new(self.paths()))
    }
}

/// The upstream client's TLS files, watched.
#[derive(Debug)]
pub struct ClientFiles(Watched);

impl ClientFiles {
    pub fn changed(&self) -> bool {
        !self.0.paths.is_empty() && self.0.changed()
    }
}

//! Authenticated gossip: every datagram carries an HMAC-SHA256 of its bytes under a shared
//! secret, and a datagram whose tag no configured key verifies is dropped before chitchat sees
//! it. A host without the key cannot join, cannot report usage, and cannot mark a replica
//! `LEAVING`: nothing it sends is read.
//!
//! Keys rotate without downtime, as memberlist's do: a replica sends with its first key and
//! accepts any of its keys. To rotate, roll out `old,new` (everyone still signs with `old`
//! and now also reads `new`), then `new,old` (everyone signs with `new`, still reads `old`),
//! then `new` alone. Each rolling restart only mixes neighbouring steps, which read each
//! other; going straight to `new,old` would leave replicas on `old` alone that cannot read
//! the restarted ones, and split the ring.
//!
//! The tag authenticates; it does not encrypt, and it does not stop a replay of a captured
//! datagram. Chitchat's state only moves forward (versions and heartbeats grow), so a replay
//! cannot roll it back.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context;
use async_trait::async_trait;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport};
use chitchat::ChitchatEnvelope;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

const TAG_LEN: usize = 32;
/// The largest UDP payload; chitchat leaves `TRANSPORT_RESERVED_LEN` of it for the tag.
const MAX_DATAGRAM: usize = 65_507;
const _: () = assert!(TAG_LEN <= chitchat::TRANSPORT_RESERVED_LEN);

/// The shared secrets: the first signs, any verifies.
#[derive(Clone)]
pub struct GossipKeys {
    keys: Vec<HmacSha256>,
}

impl std::fmt::Debug for GossipKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GossipKeys({} keys)", self.keys.len())
    }
}

impl GossipKeys {
    /// At least one secret, each at least 16 bytes (say, 32 random bytes, hex or base64).
    pub fn new<S: AsRef<[u8]>>(secrets: &[S]) -> anyhow::Result<GossipKeys> {
        anyhow::ensure!(!secrets.is_empty(), "a gossip secret is needed");
        let keys = secrets
            .iter()
            .map(|secret| {
                let secret = secret.as_ref();
                anyhow::ensure!(
                    secret.len() >= 16,
                    "a gossip secret must be at least 16 bytes (got {})",
                    secret.len()
                );
                Ok(HmacSha256::new_from_slice(secret).expect("HMAC takes any key length"))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(GossipKeys { keys })
    }

    /// `tag || payload`, the tag made with the first key.
    fn seal(&self, payload: &[u8], frame: &mut Vec<u8>) {
        let tag = self.keys[0]
            .clone()
            .chain_update(payload)
            .finalize()
            .into_bytes();
        frame.clear();
        frame.extend_from_slice(&tag);
        frame.extend_from_slice(payload);
    }

    /// The payload, if some key verifies the tag (in constant time).
    fn open<'a>(&self, frame: &'a [u8]) -> Option<&'a [u8]> {
        let (tag, payload) = frame.split_at_checked(TAG_LEN)?;
        self.keys
            .iter()
            .any(|key| key.clone().chain_update(payload).verify_slice(tag).is_ok())
            .then_some(payload)
    }
}

/// A chitchat transport over UDP whose every datagram is authenticated with [`GossipKeys`].
pub struct AuthenticatedUdp {
    keys: GossipKeys,
    rejected: Arc<AtomicU64>,
}

impl AuthenticatedUdp {
    pub fn new(keys: GossipKeys) -> Self {
        AuthenticatedUdp {
            keys,
            rejected: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Datagrams dropped so far because no key verified them.
    pub fn rejected(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.rejected)
    }
}

#[async_trait]
impl Transport for AuthenticatedUdp {
    async fn open(&self, listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let socket = tokio::net::UdpSocket::bind(listen_addr)
            .await
            .with_context(|| format!("failed to bind to {listen_addr}/UDP for gossip"))?;
        Ok(Box::new(AuthenticatedSocket {
            socket,
            keys: self.keys.clone(),
            rejected: Arc::clone(&self.rejected),
            payload: Vec::with_capacity(MAX_DATAGRAM),
            frame: Vec::with_capacity(MAX_DATAGRAM),
            received: vec![0; MAX_DATAGRAM].into_boxed_slice(),
            warned: false,
        }))
    }
}

struct AuthenticatedSocket {
    socket: tokio::net::UdpSocket,
    keys: GossipKeys,
    rejected: Arc<AtomicU64>,
    payload: Vec<u8>,
    frame: Vec<u8>,
    received: Box<[u8]>,
    warned: bool,
}

#[async_trait]
impl Socket for AuthenticatedSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.socket
            .local_addr()
            .context("failed to get UDP socket address")
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        self.payload.clear();
        envelope.serialize(&mut self.payload);
        self.keys.seal(&self.payload, &mut self.frame);
        let num_bytes_sent = self
            .socket
            .send_to(&self.frame, to)
            .await
            .with_context(|| format!("failed to send a gossip message to {to}"))?;
        Ok(SendOutcome { num_bytes_sent })
    }

    /// Cancel-safe: the only await is `recv_from`. Bad datagrams are dropped and the loop
    /// reads the next: an error here would stop gossip for good.
    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        loop {
            let (len, from_addr) = match self.socket.recv_from(&mut self.received).await {
                Ok(received) => received,
                Err(err) if transient(&err) => continue,
                Err(err) => return Err(err).context("gossip socket failed"),
            };
            let Some(mut payload) = self.keys.open(&self.received[..len]) else {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                if !self.warned {
                    tracing::warn!(%from_addr, "dropping gossip that no configured key authenticates (a host without the secret, or a key not rotated in yet); said once");
                    self.warned = true;
                }
                continue;
            };
            match ChitchatEnvelope::deserialize(&mut payload) {
                Ok(envelope) => {
                    return Ok(RecvOutcome {
                        from_addr,
                        envelope,
                        num_bytes_received: len,
                    })
                }
                Err(err) => {
                    tracing::warn!(%from_addr, %err, "authenticated gossip that does not decode")
                }
            }
        }
    }
}

fn transient(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::OutOfMemory
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::ConnectionRefused
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_opens_under_any_configured_key_and_no_other() {
        let old = GossipKeys::new(&["old-secret-0123456789"]).unwrap();
        let rotating =
            GossipKeys::new(&["new-secret-0123456789", "old-secret-0123456789"]).unwrap();
        let stranger = GossipKeys::new(&["another-secret-012345"]).unwrap();
        let mut frame = Vec::new();
        old.seal(b"hello", &mut frame);
        assert_eq!(rotating.open(&frame), Some(&b"hello"[..]));
        assert_eq!(stranger.open(&frame), None);
        rotating.seal(b"hi", &mut frame);
        assert_eq!(old.open(&frame), None, "old alone cannot read the new key");
        // Tampering, truncation and an unsigned datagram are refused.
        old.seal(b"hello", &mut frame);
        let last = frame.len() - 1;
        frame[last] ^= 1;
        assert_eq!(old.open(&frame), None);
        assert_eq!(old.open(&frame[..10]), None);
        assert_eq!(old.open(b""), None);
    }

    /// During each rolling restart of the documented rotation, replicas on the step before and
    /// the step after gossip together, both ways; skipping the first step splits the ring.
    #[test]
    fn rotation_old_new_then_new_old_then_new_never_splits_the_ring() {
        const OLD: &str = "old-secret-0123456789";
        const NEW: &str = "new-secret-0123456789";
        let keys = |secrets: &[&str]| GossipKeys::new(secrets).unwrap();
        let read_each_other = |a: &GossipKeys, b: &GossipKeys| {
            let mut frame = Vec::new();
            a.seal(b"ping", &mut frame);
            let b_reads_a = b.open(&frame).is_some();
            b.seal(b"pong", &mut frame);
            b_reads_a && a.open(&frame).is_some()
        };
        let steps = [
            keys(&[OLD]),
            keys(&[OLD, NEW]),
            keys(&[NEW, OLD]),
            keys(&[NEW]),
        ];
        for (step, pair) in steps.windows(2).enumerate() {
            assert!(read_each_other(&pair[0], &pair[1]), "restart {step} splits");
        }
        assert!(
            !read_each_other(&keys(&[OLD]), &keys(&[NEW, OLD])),
            "`new,old` straight after `old` would be safe, so the first step is not needed"
        );
    }

    #[test]
    fn short_or_missing_secrets_are_refused() {
        assert!(GossipKeys::new::<&str>(&[]).is_err());
        assert!(GossipKeys::new(&["short"]).is_err());
    }
}

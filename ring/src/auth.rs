//! Encrypted, replay-safe gossip: every datagram is sealed with XChaCha20-Poly1305 under a
//! key derived (HKDF-SHA256) from a shared secret, and a datagram that no configured key opens,
//! that is too old or too far ahead of this replica's clock, or whose nonce was already seen,
//! is dropped before chitchat sees it. A host without the key cannot join, cannot read who is
//! in the ring or which tenants they serve, cannot report usage, and cannot mark a replica
//! `LEAVING`: nothing it sends is read.
//!
//! # The frame
//! ```text
//! format (1 byte, 2) | nonce (24 random bytes) | ciphertext | Poly1305 tag (16)
//!                                                 └ sent_at (u64 BE, ms since the epoch) | chitchat envelope
//! ```
//! The format byte is authenticated as associated data. The 49 bytes of overhead fit the
//! `TRANSPORT_RESERVED_LEN` (64) that the patched chitchat leaves free in every datagram.
//! XChaCha's 192-bit nonces are drawn from the OS's CSPRNG per datagram: at that size random
//! nonces never collide in practice, so no counter has to survive restarts.
//!
//! # Keys and rotation
//! A replica seals with its first key and opens with any of them (it tries each in turn), as
//! memberlist does. To rotate, roll out `old,new` (everyone still seals with `old` and now also
//! reads `new`), then `new,old` (everyone seals with `new`, still reads `old`), then `new` alone.
//! Each rolling restart only mixes neighbouring steps, which read each other; going straight to
//! `new,old` would leave replicas on `old` alone that cannot read the restarted ones, and split
//! the ring. A secret is never a key itself: each is stretched by HKDF into the cipher key.
//!
//! # Replays
//! `sent_at` is inside the authenticated plaintext, so only a key holder can set it. A
//! [`ReplayGuard`] refuses a datagram sent more than its window ago (or as far ahead, for clock
//! skew), and one whose nonce it has already accepted within the window: its cache of nonces
//! is bounded, and when full it forgets the oldest and refuses anything as old as what it
//! forgot, so an exact replay is refused at any load. Inside the window chitchat's own rules
//! would make a replay harmless anyway (heartbeats and versions only grow; see the README).
//!
//! # Older replicas
//! weir before encrypted gossip put an HMAC-SHA256 tag in front of plaintext chitchat. The two
//! formats do not understand each other: a replica on one does not read the other's gossip, so
//! a rolling upgrade splits the ring until every replica runs the new version. Such a datagram
//! is recognised (its tag verifies under a configured secret) only to name the cause in the
//! log and the metrics; it is never accepted.

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use async_trait::async_trait;
use chacha20poly1305::aead::{AeadCore, AeadInPlace, KeyInit, OsRng};
use chacha20poly1305::{Key, Tag, XChaCha20Poly1305, XNonce};
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport};
use chitchat::ChitchatEnvelope;
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The first byte of every encrypted frame (the HMAC-only format had no such byte).
const FORMAT: u8 = 2;
const NONCE_LEN: usize = 24;
const TAG_LEN: usize = 16;
const SENT_AT_LEN: usize = 8;
/// What a frame adds to chitchat's envelope.
pub const OVERHEAD: usize = 1 + NONCE_LEN + SENT_AT_LEN + TAG_LEN;
const _: () = assert!(OVERHEAD <= chitchat::TRANSPORT_RESERVED_LEN);
/// The HMAC-only format's tag, in front of plaintext chitchat.
const LEGACY_TAG_LEN: usize = 32;
/// The largest UDP payload.
const MAX_DATAGRAM: usize = 65_507;

/// HKDF inputs: the salt names the protocol, the info the key's use, so a key derived here
/// never equals one derived from the same secret for anything else.
const KDF_SALT: &[u8] = b"weir gossip";
const KDF_INFO: &[u8] = b"weir gossip v2: XChaCha20-Poly1305 datagram key";

/// How far a datagram's `sent_at` may be behind (or ahead of) the receiver's clock.
pub const DEFAULT_REPLAY_WINDOW: Duration = Duration::from_secs(5);
/// Nonces remembered per socket: at ~50 datagrams/s received per replica, a 5 s window holds
/// a few hundred; 8 192 (about 300 KiB) leaves room for seeds and bursts.
pub const DEFAULT_NONCE_CACHE: usize = 8192;

/// Why a datagram was dropped: the `reason` label of `weir_ring_rejected_gossip_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Not an encrypted weir frame (too short, another format byte): a replica without a
    /// secret (plain chitchat), or noise.
    Format,
    /// An encrypted frame that no configured key opens (or altered in transit): a host with
    /// another secret, or a key not rotated in yet.
    Key,
    /// An HMAC-only frame under a configured secret: a replica of an older weir.
    OldVersion,
    /// Sent longer ago than the window, or as far ahead: a late replay, or clocks apart.
    Stale,
    /// A nonce already accepted within the window: an exact replay.
    Replay,
    /// Opened, but chitchat cannot decode it.
    Decode,
}

impl Rejection {
    pub const ALL: [Rejection; 6] = [
        Rejection::Format,
        Rejection::Key,
        Rejection::OldVersion,
        Rejection::Stale,
        Rejection::Replay,
        Rejection::Decode,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::Format => "format",
            Rejection::Key => "key",
            Rejection::OldVersion => "old_version",
            Rejection::Stale => "stale",
            Rejection::Replay => "replay",
            Rejection::Decode => "decode",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Datagrams dropped so far, per [`Rejection`] (indexed as [`Rejection::ALL`]).
#[derive(Debug, Default)]
pub struct RejectedGossip([AtomicU64; Rejection::ALL.len()]);

impl RejectedGossip {
    pub fn count(&self, reason: Rejection) {
        self.0[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> [u64; Rejection::ALL.len()] {
        std::array::from_fn(|index| self.0[index].load(Ordering::Relaxed))
    }
}

/// The shared secrets, as cipher keys: the first seals, any opens.
#[derive(Clone)]
pub struct GossipKeys {
    ciphers: Vec<XChaCha20Poly1305>,
    /// The same secrets as the HMAC-only format used them, to recognise an older replica.
    legacy: Vec<HmacSha256>,
    replay_window: Duration,
    nonce_cache: usize,
}

impl std::fmt::Debug for GossipKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GossipKeys({} keys)", self.ciphers.len())
    }
}

/// A frame opened: when it was sealed, and where its nonce and payload are.
#[derive(Debug)]
pub struct Opened<'a> {
    pub sent_at_ms: u64,
    pub nonce: [u8; NONCE_LEN],
    pub payload: &'a [u8],
}

impl GossipKeys {
    /// At least one secret, each at least 16 bytes (say, 32 random bytes, hex or base64).
    pub fn new<S: AsRef<[u8]>>(secrets: &[S]) -> anyhow::Result<GossipKeys> {
        anyhow::ensure!(!secrets.is_empty(), "a gossip secret is needed");
        let mut ciphers = Vec::with_capacity(secrets.len());
        let mut legacy = Vec::with_capacity(secrets.len());
        for secret in secrets {
            let secret = secret.as_ref();
            anyhow::ensure!(
                secret.len() >= 16,
                "a gossip secret must be at least 16 bytes (got {})",
                secret.len()
            );
            let mut key = Key::default();
            Hkdf::<Sha256>::new(Some(KDF_SALT), secret)
                .expand(KDF_INFO, &mut key)
                .expect("32 bytes is a valid HKDF-SHA256 output length");
            ciphers.push(XChaCha20Poly1305::new(&key));
            legacy.push(
                <HmacSha256 as Mac>::new_from_slice(secret).expect("HMAC takes any key length"),
            );
        }
        Ok(GossipKeys {
            ciphers,
            legacy,
            replay_window: DEFAULT_REPLAY_WINDOW,
            nonce_cache: DEFAULT_NONCE_CACHE,
        })
    }

    /// How old (or how far ahead) a datagram may be, and how many nonces are remembered.
    pub fn with_replay_window(mut self, window: Duration, nonce_cache: usize) -> Self {
        self.replay_window = window;
        self.nonce_cache = nonce_cache.max(1);
        self
    }

    /// A guard with this key set's window and cache size.
    pub fn replay_guard(&self) -> ReplayGuard {
        ReplayGuard::new(self.replay_window, self.nonce_cache)
    }

    /// Seals `payload`, sent at `sent_at_ms`, into `frame` with the first key and a fresh
    /// random nonce.
    pub fn seal(&self, payload: &[u8], sent_at_ms: u64, frame: &mut Vec<u8>) {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        self.seal_with_nonce(payload, sent_at_ms, &nonce, frame);
    }

    fn seal_with_nonce(
        &self,
        payload: &[u8],
        sent_at_ms: u64,
        nonce: &XNonce,
        frame: &mut Vec<u8>,
    ) {
        frame.clear();
        frame.push(FORMAT);
        frame.extend_from_slice(nonce);
        let body = frame.len();
        frame.extend_from_slice(&sent_at_ms.to_be_bytes());
        frame.extend_from_slice(payload);
        let tag = self.ciphers[0]
            .encrypt_in_place_detached(nonce, &[FORMAT], &mut frame[body..])
            .expect("a gossip datagram is far below XChaCha20's length limit");
        frame.extend_from_slice(&tag);
    }

    /// Opens `frame` into `plaintext` with the first key that authenticates it. The
    /// timestamp is not checked here: that is [`ReplayGuard::check`]'s job.
    pub fn open<'a>(
        &self,
        frame: &[u8],
        plaintext: &'a mut Vec<u8>,
    ) -> Result<Opened<'a>, Rejection> {
        let Some(opened) = self.decrypt(frame, plaintext) else {
            return Err(if self.is_legacy(frame) {
                Rejection::OldVersion
            } else if frame.len() < OVERHEAD || frame[0] != FORMAT {
                Rejection::Format
            } else {
                Rejection::Key
            });
        };
        Ok(opened)
    }

    fn decrypt<'a>(&self, frame: &[u8], plaintext: &'a mut Vec<u8>) -> Option<Opened<'a>> {
        if frame.len() < OVERHEAD || frame[0] != FORMAT {
            return None;
        }
        let nonce = XNonce::from_slice(&frame[1..1 + NONCE_LEN]);
        let (ciphertext, tag) =
            frame[1 + NONCE_LEN..].split_at(frame.len() - 1 - NONCE_LEN - TAG_LEN);
        let tag = Tag::from_slice(tag);
        // Each try starts from the ciphertext again: a failed try leaves the buffer as it was
        // (the tag is checked before anything is decrypted), but that is the crate's detail.
        let opened = self.ciphers.iter().any(|cipher| {
            plaintext.clear();
            plaintext.extend_from_slice(ciphertext);
            cipher
                .decrypt_in_place_detached(nonce, &[FORMAT], plaintext, tag)
                .is_ok()
        });
        if !opened {
            return None;
        }
        let (sent_at, payload) = plaintext.split_at(SENT_AT_LEN);
        Some(Opened {
            sent_at_ms: u64::from_be_bytes(sent_at.try_into().expect("8 bytes")),
            nonce: nonce.as_slice().try_into().expect("24 bytes"),
            payload,
        })
    }

    /// An HMAC-only frame (an older weir's) that a configured secret signed.
    fn is_legacy(&self, frame: &[u8]) -> bool {
        let Some((tag, payload)) = frame.split_at_checked(LEGACY_TAG_LEN) else {
            return false;
        };
        self.legacy
            .iter()
            .any(|key| key.clone().chain_update(payload).verify_slice(tag).is_ok())
    }
}

/// Refuses datagrams sent outside a window around now, and exact replays within it. Pure:
/// the clock is an argument, so tests step it.
///
/// Invariant: every nonce accepted with a `sent_at` above `floor_ms` is in `seen`. Nonces
/// leave `seen` oldest-accepted first, either once they fall out of the window or when the
/// cache is full; either way `floor_ms` rises to their `sent_at`, and nothing at or below
/// `floor_ms` is accepted again.
#[derive(Debug)]
pub struct ReplayGuard {
    window_ms: u64,
    capacity: usize,
    seen: HashSet<[u8; NONCE_LEN]>,
    order: VecDeque<(u64, [u8; NONCE_LEN])>,
    floor_ms: u64,
}

impl ReplayGuard {
    pub fn new(window: Duration, capacity: usize) -> Self {
        ReplayGuard {
            window_ms: window.as_millis().try_into().unwrap_or(u64::MAX),
            capacity: capacity.max(1),
            seen: HashSet::new(),
            order: VecDeque::new(),
            floor_ms: 0,
        }
    }

    /// Accepts (and remembers) a datagram sealed at `sent_at_ms` with `nonce`, received at
    /// `now_ms`, or says why not.
    pub fn check(
        &mut self,
        nonce: &[u8; NONCE_LEN],
        sent_at_ms: u64,
        now_ms: u64,
    ) -> Result<(), Rejection> {
        let oldest = now_ms.saturating_sub(self.window_ms);
        while let Some(&(sent_at, _)) = self.order.front() {
            if sent_at >= oldest {
                break;
            }
            self.forget_oldest();
        }
        if sent_at_ms < oldest
            || sent_at_ms > now_ms.saturating_add(self.window_ms)
            || sent_at_ms <= self.floor_ms
        {
            return Err(Rejection::Stale);
        }
        if !self.seen.insert(*nonce) {
            return Err(Rejection::Replay);
        }
        self.order.push_back((sent_at_ms, *nonce));
        if self.order.len() > self.capacity {
            self.forget_oldest();
        }
        Ok(())
    }

    fn forget_oldest(&mut self) {
        if let Some((sent_at, nonce)) = self.order.pop_front() {
            self.seen.remove(&nonce);
            self.floor_ms = self.floor_ms.max(sent_at);
        }
    }

    /// Nonces remembered now.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
        .try_into()
        .unwrap_or(u64::MAX)
}

/// A chitchat transport over UDP whose every datagram is encrypted with [`GossipKeys`] and
/// checked by a [`ReplayGuard`].
pub struct EncryptedUdp {
    keys: GossipKeys,
    rejected: Arc<RejectedGossip>,
}

impl EncryptedUdp {
    pub fn new(keys: GossipKeys) -> Self {
        EncryptedUdp {
            keys,
            rejected: Arc::default(),
        }
    }

    /// Datagrams dropped so far, by reason.
    pub fn rejected(&self) -> Arc<RejectedGossip> {
        Arc::clone(&self.rejected)
    }
}

#[async_trait]
impl Transport for EncryptedUdp {
    async fn open(&self, listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let socket = tokio::net::UdpSocket::bind(listen_addr)
            .await
            .with_context(|| format!("failed to bind to {listen_addr}/UDP for gossip"))?;
        Ok(Box::new(EncryptedSocket {
            socket,
            guard: self.keys.replay_guard(),
            keys: self.keys.clone(),
            rejected: Arc::clone(&self.rejected),
            payload: Vec::with_capacity(MAX_DATAGRAM),
            frame: Vec::with_capacity(MAX_DATAGRAM),
            received: vec![0; MAX_DATAGRAM].into_boxed_slice(),
            warned: [false; Rejection::ALL.len()],
        }))
    }
}

struct EncryptedSocket {
    socket: tokio::net::UdpSocket,
    keys: GossipKeys,
    guard: ReplayGuard,
    rejected: Arc<RejectedGossip>,
    /// Plaintext out (sending) and in (receiving); one buffer, as the two never overlap.
    payload: Vec<u8>,
    frame: Vec<u8>,
    received: Box<[u8]>,
    /// Each reason is said once per socket: a flood of bad datagrams is not a flood of logs.
    warned: [bool; Rejection::ALL.len()],
}

impl EncryptedSocket {
    fn reject(&mut self, reason: Rejection, from_addr: SocketAddr, detail: &str) {
        self.rejected.count(reason);
        if std::mem::replace(&mut self.warned[reason.index()], true) {
            return;
        }
        let why = match reason {
            Rejection::Format => "not encrypted weir gossip (a replica without --gossip-secret, or noise)",
            Rejection::Key => "no configured key opens it (a host with another secret, a key not rotated in yet, or altered in transit)",
            Rejection::OldVersion => "an older weir's gossip, signed with HMAC but not encrypted: old and new replicas do not understand each other, so the ring is split until every replica runs this version",
            Rejection::Stale => "sent outside the replay window (a replayed datagram, or clocks apart: keep them in sync with NTP)",
            Rejection::Replay => "its nonce was already seen (a replayed datagram)",
            Rejection::Decode => "it opens but chitchat cannot decode it",
        };
        tracing::warn!(%from_addr, reason = reason.as_str(), "dropping gossip: {why}{detail}; said once per reason");
    }
}

#[async_trait]
impl Socket for EncryptedSocket {
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
        self.keys.seal(&self.payload, now_ms(), &mut self.frame);
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
            let mut payload = std::mem::take(&mut self.payload);
            let outcome = match self.keys.open(&self.received[..len], &mut payload) {
                Err(reason) => Err((reason, String::new())),
                Ok(opened) => {
                    let now = now_ms();
                    match self.guard.check(&opened.nonce, opened.sent_at_ms, now) {
                        Err(Rejection::Stale) => Err((
                            Rejection::Stale,
                            format!(
                                " ({:+.1} s from this replica's clock)",
                                (opened.sent_at_ms as f64 - now as f64) / 1000.0
                            ),
                        )),
                        Err(reason) => Err((reason, String::new())),
                        Ok(()) => {
                            let mut bytes = opened.payload;
                            ChitchatEnvelope::deserialize(&mut bytes)
                                .map_err(|err| (Rejection::Decode, format!(" ({err})")))
                        }
                    }
                }
            };
            self.payload = payload;
            match outcome {
                Ok(envelope) => {
                    return Ok(RecvOutcome {
                        from_addr,
                        envelope,
                        num_bytes_received: len,
                    })
                }
                Err((reason, detail)) => self.reject(reason, from_addr, &detail),
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

/// For the fuzz target: opens and checks an arbitrary frame under a fixed key, as a socket
/// would. Property: never panics, and whatever opens re-seals to a frame that opens to the
/// same payload.
#[doc(hidden)]
pub fn fuzz_open(frame: &[u8]) {
    thread_local! {
        static KEYS: GossipKeys = GossipKeys::new(&["fuzz-gossip-secret-0123", "fuzz-gossip-secret-4567"]).expect("valid secrets");
    }
    KEYS.with(|keys| {
        let mut plaintext = Vec::new();
        let mut guard = keys.replay_guard();
        if let Ok(opened) = keys.open(frame, &mut plaintext) {
            let (sent_at, payload) = (opened.sent_at_ms, opened.payload.to_vec());
            let _ = guard.check(&opened.nonce, sent_at, sent_at);
            let mut again = Vec::new();
            keys.seal(&payload, sent_at, &mut again);
            let mut reopened = Vec::new();
            let reopened = keys
                .open(&again, &mut reopened)
                .expect("a sealed frame opens");
            assert_eq!(reopened.payload, payload);
            let _ = ChitchatEnvelope::deserialize(&mut &payload[..]);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "old-secret-0123456789";
    const NEW: &str = "new-secret-0123456789";
    const NOW: u64 = 1_700_000_000_000;

    fn keys(secrets: &[&str]) -> GossipKeys {
        GossipKeys::new(secrets).unwrap()
    }

    fn opens(keys: &GossipKeys, frame: &[u8]) -> Result<Vec<u8>, Rejection> {
        let mut plaintext = Vec::new();
        keys.open(frame, &mut plaintext)
            .map(|opened| opened.payload.to_vec())
    }

    #[test]
    fn a_frame_round_trips_and_hides_its_payload() {
        let keys = keys(&[OLD]);
        let payload = b"tenant-alpha node-7 usage";
        let mut frame = Vec::new();
        keys.seal(payload, NOW, &mut frame);
        assert_eq!(frame.len(), payload.len() + OVERHEAD);
        assert!(!frame
            .windows(5)
            .any(|window| window == b"alpha" || window == b"node-"));
        let mut plaintext = Vec::new();
        let opened = keys.open(&frame, &mut plaintext).unwrap();
        assert_eq!(opened.payload, payload);
        assert_eq!(opened.sent_at_ms, NOW);
        assert_eq!(opened.nonce[..], frame[1..1 + NONCE_LEN]);
        // Two seals of one payload differ: a fresh nonce each time.
        let mut again = Vec::new();
        keys.seal(payload, NOW, &mut again);
        assert_ne!(frame, again);
    }

    #[test]
    fn a_wrong_key_a_tampered_byte_or_a_short_frame_is_refused() {
        let mut frame = Vec::new();
        keys(&[OLD]).seal(b"hello", NOW, &mut frame);
        assert_eq!(
            opens(&keys(&["another-secret-012345"]), &frame),
            Err(Rejection::Key)
        );
        for index in 0..frame.len() {
            let mut tampered = frame.clone();
            tampered[index] ^= 0x01;
            let refused = opens(&keys(&[OLD]), &tampered);
            let expected = if index == 0 {
                Rejection::Format
            } else {
                Rejection::Key
            };
            assert_eq!(refused, Err(expected), "byte {index} flipped");
        }
        assert_eq!(
            opens(&keys(&[OLD]), &frame[..frame.len() - 1]),
            Err(Rejection::Key)
        );
        assert_eq!(
            opens(&keys(&[OLD]), &frame[..OVERHEAD - 1]),
            Err(Rejection::Format)
        );
        assert_eq!(opens(&keys(&[OLD]), b""), Err(Rejection::Format));
    }

    #[test]
    fn an_older_weirs_hmac_frame_is_named_and_refused() {
        let mut tag = <HmacSha256 as Mac>::new_from_slice(OLD.as_bytes()).unwrap();
        tag.update(b"plain chitchat");
        let mut legacy = tag.finalize().into_bytes().to_vec();
        legacy.extend_from_slice(b"plain chitchat");
        assert_eq!(
            opens(&keys(&[NEW, OLD]), &legacy),
            Err(Rejection::OldVersion)
        );
        assert_eq!(opens(&keys(&[NEW]), &legacy), Err(Rejection::Format));
    }

    /// During each rolling restart of the documented rotation, replicas on the step before and
    /// the step after gossip together, both ways; skipping the first step splits the ring.
    #[test]
    fn rotation_old_new_then_new_old_then_new_never_splits_the_ring() {
        let read_each_other = |a: &GossipKeys, b: &GossipKeys| {
            let mut frame = Vec::new();
            a.seal(b"ping", NOW, &mut frame);
            let b_reads_a = opens(b, &frame) == Ok(b"ping".to_vec());
            b.seal(b"pong", NOW, &mut frame);
            b_reads_a && opens(a, &frame) == Ok(b"pong".to_vec())
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
        // The old key still opens what it sealed while `new,old` is configured.
        let mut frame = Vec::new();
        keys(&[OLD]).seal(b"late", NOW, &mut frame);
        assert_eq!(opens(&keys(&[NEW, OLD]), &frame), Ok(b"late".to_vec()));
    }

    #[test]
    fn a_secret_is_not_the_key() {
        // Sealing with the raw secret (zero-padded to 32 bytes) does not make a frame the
        // configured key opens: the key is HKDF's output.
        let mut raw = Key::default();
        raw[..OLD.len()].copy_from_slice(OLD.as_bytes());
        let raw = GossipKeys {
            ciphers: vec![XChaCha20Poly1305::new(&raw)],
            ..keys(&[OLD])
        };
        let mut frame = Vec::new();
        raw.seal(b"x", NOW, &mut frame);
        assert_eq!(opens(&keys(&[OLD]), &frame), Err(Rejection::Key));
    }

    #[test]
    fn short_or_missing_secrets_are_refused() {
        assert!(GossipKeys::new::<&str>(&[]).is_err());
        assert!(GossipKeys::new(&["short"]).is_err());
    }

    #[test]
    fn an_old_or_far_future_datagram_is_stale() {
        let mut guard = ReplayGuard::new(Duration::from_secs(5), 16);
        assert_eq!(
            guard.check(&[1; 24], NOW - 5_001, NOW),
            Err(Rejection::Stale)
        );
        assert_eq!(
            guard.check(&[2; 24], NOW + 5_001, NOW),
            Err(Rejection::Stale)
        );
        assert_eq!(guard.check(&[3; 24], NOW - 5_000, NOW), Ok(()));
        assert_eq!(guard.check(&[4; 24], NOW + 5_000, NOW), Ok(()));
        // A datagram accepted now is stale once the window has passed.
        assert_eq!(guard.check(&[5; 24], NOW, NOW), Ok(()));
        assert_eq!(
            guard.check(&[5; 24], NOW, NOW + 5_001),
            Err(Rejection::Stale)
        );
    }

    #[test]
    fn an_exact_replay_within_the_window_is_refused() {
        let mut guard = ReplayGuard::new(Duration::from_secs(5), 16);
        assert_eq!(guard.check(&[7; 24], NOW, NOW), Ok(()));
        assert_eq!(guard.check(&[7; 24], NOW, NOW + 1), Err(Rejection::Replay));
        assert_eq!(
            guard.check(&[7; 24], NOW, NOW + 4_999),
            Err(Rejection::Replay)
        );
        assert_eq!(guard.check(&[8; 24], NOW, NOW + 4_999), Ok(()));
    }

    #[test]
    fn the_nonce_cache_is_bounded_and_what_it_forgets_stays_refused() {
        let mut guard = ReplayGuard::new(Duration::from_secs(5), 4);
        for i in 0..100u8 {
            assert_eq!(guard.check(&[i; 24], NOW + u64::from(i), NOW), Ok(()));
            assert!(guard.len() <= 4);
        }
        // Everything forgotten (0..96) is at or below the floor, so stale, not accepted.
        for i in 0..96u8 {
            assert_eq!(
                guard.check(&[i; 24], NOW + u64::from(i), NOW),
                Err(Rejection::Stale)
            );
        }
        for i in 96..100u8 {
            assert_eq!(
                guard.check(&[i; 24], NOW + u64::from(i), NOW),
                Err(Rejection::Replay)
            );
        }
        // Expiry by time empties it too.
        assert_eq!(guard.check(&[200; 24], NOW + 10_000, NOW + 10_000), Ok(()));
        assert_eq!(guard.len(), 1);
    }

    #[test]
    fn sealed_then_guarded_a_frame_is_accepted_once() {
        let keys = keys(&[OLD]);
        let mut guard = keys.replay_guard();
        let mut frame = Vec::new();
        keys.seal(b"digest", NOW, &mut frame);
        let accept = |guard: &mut ReplayGuard, now: u64| {
            let mut plaintext = Vec::new();
            let opened = keys.open(&frame, &mut plaintext)?;
            guard.check(&opened.nonce, opened.sent_at_ms, now)
        };
        assert_eq!(accept(&mut guard, NOW + 100), Ok(()));
        assert_eq!(accept(&mut guard, NOW + 200), Err(Rejection::Replay));
        assert_eq!(accept(&mut guard, NOW + 60_000), Err(Rejection::Stale));
    }

    #[test]
    fn fuzz_property_holds_for_a_sealed_frame_and_junk() {
        let keys = GossipKeys::new(&["fuzz-gossip-secret-4567"]).unwrap();
        let mut frame = Vec::new();
        keys.seal(b"not chitchat", NOW, &mut frame);
        fuzz_open(&frame);
        fuzz_open(b"junk");
        fuzz_open(&[FORMAT; 80]);
    }
}

//! weir's gossip membership: which replicas are alive, and how many share each tenant's
//! limit.
//!
//! # Layout
//! - [`membership`]: what consumers get: members with state and address, the healthy count
//!   (live `ACTIVE` members including self, never below 1). Pure, tested without sockets.
//! - [`usage`]: per-tenant usage over gossip for `weighted`: cumulative admitted counts per
//!   replica (a capped key, listed in turn), folded into monotonic per-tenant totals.
//! - [`ha`]: the HA tracker's elections over gossip (the wire format; the merge rule is weir's).
//! - [`auth`]: encrypted gossip: every datagram sealed with XChaCha20-Poly1305 under keys
//!   derived from shared secrets (with rotation), and refused when old or replayed.
//! - [`node`]: the edge over chitchat: join, publish state, observe peers, leave, shut down.
//!   Consumers read a `watch::Receiver<Arc<Membership>>`; the limit maths stays a pure
//!   function of (tenant limits, membership).
//!
//! `README.md` beside this crate says how the ring behaves at 10×, 100× and 1000× replicas.

pub mod auth;
pub mod ha;
pub mod membership;
pub mod node;
pub mod usage;

pub use auth::GossipKeys;
pub use ha::HaEntry;
pub use membership::{Member, MemberState, Membership};
pub use node::{Ring, RingConfig};
pub use usage::{PeerUsage, TenantUsage, UsageEntry};

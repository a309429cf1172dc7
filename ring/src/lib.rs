//! weir's gossip membership: which replicas are alive, and how many share each tenant's
//! limit.
//!
//! # Layout
//! - [`membership`]: what consumers get: members with state and address, the healthy count
//!   (live `ACTIVE` members including self, never below 1). Pure, tested without sockets.
//! - [`demand`]: per-tenant demand over gossip for `weighted`: a bounded encoding (top
//!   tenants plus a remainder) and the pure aggregation over fresh `ACTIVE` peers.
//! - [`node`]: the edge over chitchat: join, publish state, observe peers, leave, shut down.
//!   Consumers read a `watch::Receiver<Arc<Membership>>`; the limit maths stays a pure
//!   function of (tenant limits, membership).
//!
//! `README.md` beside this crate says how the ring behaves at 10×, 100× and 1000× replicas.

pub mod demand;
pub mod membership;
pub mod node;

pub use demand::DemandEntry;
pub use membership::{Member, MemberState, Membership, PeerDemand};
pub use node::{Ring, RingConfig};

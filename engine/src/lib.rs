//! weir's limit engine: per-tenant token buckets that enforce **fleet-wide** limits from
//! local decisions. No HTTP, no gossip transport: an embedding service feeds it the runtime
//! config, the healthy replica count and the peers' usage, and asks it "may this proceed?".
//!
//! # Layout
//! - [`types`]: the vocabulary (limit kinds, bucket shapes, outcomes, rejections), importing
//!   nothing of the engine.
//! - [`maths`]: pure limit maths: how a fleet-wide limit becomes what one replica enforces
//!   (`divided`, `weighted`), and the settling share of a tenant new to the fleet.
//! - [`bucket`]: a governor bucket with a fair hand-over of tokens when its shape changes
//!   (`divided`).
//! - [`fleet`]: one replica's view of a fleet-wide bucket (`weighted`): own admissions at once,
//!   the peers' as gossip reports them, debt allowed; the sum bound as a property test.
//! - [`limiter`]: the tenant map and the decision path; config, membership and peer usage
//!   put in force at once; usage reports for gossip; idle eviction.
//! - [`store`]: the shared store's interface (`Store`), the bucket algorithm it runs
//!   atomically (the pure twin of the Redis script), and an in-memory store.
//! - [`shared`]: `shared` tenants: leases from the store, single-flight renewal, returns.
//! - [`breaker`]: the store's circuit breaker, a state machine with time as an input.
//! - [`algorithms`]: token bucket, sliding window, leaky bucket: meters with the clock passed
//!   in, chargeable with what peers spent.
//! - [`admission`]: the admission API's engine: `allow`, `acquire`, `release`, `renew` for any
//!   tenant and key, under the tenant's strategy.
//! - [`clock`]: the real clock, or one a test moves by hand.
//! - [`cells`]: cells, several rings each enforcing a slice of a tenant's global limit: the
//!   reconciler's allocation (the pure twin of its Redis script), the shares in force, and a
//!   replica's memory of the store's answers with time as an input.
//! - `core`: what both front-ends share: the clock, the inputs in force under one
//!   generation, the ring rank, the store.
//! - `strategy`: the failure policy of `shared` limits (`on_store_failure`), in one place.
//!
//! Layers import only the ones below: `types` → `clock` → the pure maths and meters → `store`
//! → `shared` → `strategy` → `core` → the front-ends (`admission`, then `limiter`, which holds
//! the public [`Limiter`] API and the gossip of both). `scripts/check-cycles` fails CI on any
//! import cycle.

pub mod admission;
pub mod algorithms;
pub mod breaker;
pub mod bucket;
pub mod cells;
pub mod clock;
mod core;
pub mod fleet;
pub mod limiter;
pub mod maths;
pub mod shared;
pub mod store;
mod strategy;
pub mod types;

pub use admission::{encode_key, Acquisition, AdmissionError, Allowed, Ask, KeyUsage, Lent};
pub use algorithms::Decision;
pub use cells::{CellShares, CellSync, CellSyncConfig};
pub use clock::EngineClock;
pub use limiter::{
    CellUsage, Limiter, NoHooks, PeerTotals, PeerUsage, Tenant, TenantHooks, TenantView,
    TooManyTenants, UsageReport, COARSE_CLOCK_TICK,
};
pub use maths::{LocalLimit, LocalLimits};
pub use shared::{Shared, SharedConfig, StoreObserver};
pub use store::{BucketKey, Grant, KeyName, MemoryStore, Store, StoreError};
pub use types::{Admitted, LimitKind, Outcome, Rate, Rejection, RejectionCause, Taken};

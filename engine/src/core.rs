//! What every front-end of the engine shares: the clock, the inputs of the limit maths (the
//! runtime config, the healthy replica count and the cell's slices, replaced as a whole under
//! one generation number), this replica's place in the ring, and the store behind `shared`. The push
//! front-end ([`crate::limiter`]) and the admission front-end ([`crate::admission`]) each keep
//! their own registry and read these through one [`Core`].

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use governor::clock::Clock;
use runtime_config::{RuntimeConfig, TenantLimits};

use crate::bucket::nanos_between;
use crate::cells::CellShares;
use crate::clock::EngineClock;
use crate::maths::{local_limits, LeaseHorizons, LocalLimits, SlotHolds};
use crate::shared::Shared;

/// The inputs of the limit maths, replaced as a whole when any of them changes.
pub(crate) struct Inputs {
    pub(crate) config: Arc<RuntimeConfig>,
    pub(crate) healthy_replicas: usize,
    /// This cell's slices of each tenant's limits (none outside cells).
    pub(crate) cells: Arc<CellShares>,
    pub(crate) generation: u64,
}

impl Inputs {
    /// A push tenant's limits as configured (fleet-wide, what refusals name), and as this
    /// replica enforces them: the cell's slice, if any, under the tenant's strategy. The one
    /// place a tenant's limits enter the engine.
    pub(crate) fn limits(&self, tenant: &str) -> (TenantLimits, LocalLimits) {
        let configured = *self.config.tenant_limits(tenant);
        let enforced = self.cells.apply(tenant, &configured);
        (configured, local_limits(&enforced, self.healthy_replicas))
    }
}

/// What [`Core::update_inputs`] puts in force (the generation is added).
pub(crate) struct NextInputs {
    pub(crate) config: Arc<RuntimeConfig>,
    pub(crate) healthy_replicas: usize,
    pub(crate) cells: Arc<CellShares>,
}

impl Inputs {
    /// The current inputs, to change one of them.
    pub(crate) fn next(&self) -> NextInputs {
        NextInputs {
            config: Arc::clone(&self.config),
            healthy_replicas: self.healthy_replicas,
            cells: Arc::clone(&self.cells),
        }
    }
}

pub(crate) struct Core<C: Clock = EngineClock> {
    pub(crate) inputs: ArcSwap<Inputs>,
    /// `inputs.generation`, readable with one atomic load on the decision path.
    generation: AtomicU64,
    /// Serializes writers of `inputs` so generations are unique.
    inputs_writer: Mutex<()>,
    /// `inputs.healthy_replicas`, readable with one atomic load.
    healthy: AtomicUsize,
    /// This replica's place among the healthy replicas in the ring's order, for its share
    /// of fleet-wide in-flight caps.
    rank: AtomicUsize,
    /// The shares of in-flight caps held before the ring last changed, still binding (see
    /// [`SlotHolds`]); `slots_binding_until` says, in one load, whether any may bind now.
    slot_holds: Mutex<SlotHolds>,
    slots_binding_until: AtomicU64,
    /// Nanoseconds since `start`, refreshed by `tick`: a coarse clock for marking things
    /// used, so that costs no clock read.
    coarse_now: AtomicU64,
    clock: C,
    start: C::Instant,
    /// Nanoseconds the peers' usage is back-dated by.
    pub(crate) backdate_nanos: AtomicU64,
    /// The store behind `shared` limits, if one is configured.
    pub(crate) shared: Option<Arc<Shared>>,
    /// This replica's name, in lease ids.
    pub(crate) node_id: String,
}

impl<C: Clock> Core<C> {
    pub(crate) fn new(config: Arc<RuntimeConfig>, clock: C) -> Self {
        Core {
            inputs: ArcSwap::from_pointee(Inputs {
                config,
                healthy_replicas: 1,
                cells: Arc::default(),
                generation: 0,
            }),
            generation: AtomicU64::new(0),
            inputs_writer: Mutex::new(()),
            healthy: AtomicUsize::new(1),
            rank: AtomicUsize::new(0),
            slot_holds: Mutex::new(SlotHolds::default()),
            slots_binding_until: AtomicU64::new(0),
            coarse_now: AtomicU64::new(0),
            start: clock.now(),
            clock,
            backdate_nanos: AtomicU64::new(0),
            shared: None,
            node_id: "local".to_string(),
        }
    }

    /// Nanoseconds on the engine clock.
    pub(crate) fn now_nanos(&self) -> u64 {
        nanos_between(self.start, self.clock.now())
    }

    pub(crate) fn clock(&self) -> &C {
        &self.clock
    }

    /// Reads the clock and keeps it as the coarse clock; returns it.
    pub(crate) fn tick(&self) -> u64 {
        let now = self.now_nanos();
        self.coarse_now.store(now, Ordering::Relaxed);
        now
    }

    /// The clock as last ticked (about a second old at most): for marking things used.
    pub(crate) fn coarse_nanos(&self) -> u64 {
        self.coarse_now.load(Ordering::Relaxed)
    }

    pub(crate) fn config(&self) -> Arc<RuntimeConfig> {
        Arc::clone(&self.inputs.load().config)
    }

    /// The generation of the inputs (config, healthy count) in force.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub(crate) fn healthy_replicas(&self) -> usize {
        self.healthy.load(Ordering::Relaxed)
    }

    pub(crate) fn rank(&self) -> usize {
        self.rank.load(Ordering::Relaxed)
    }

    pub(crate) fn set_rank(&self, rank: usize) {
        self.rank.store(rank, Ordering::Relaxed);
    }

    /// The ring moved this replica (or said it again): see [`SlotHolds::moved`].
    pub(crate) fn move_slots(
        &self,
        replicas: usize,
        rank: usize,
        joined: bool,
        horizons: LeaseHorizons,
    ) {
        let now = self.now_nanos();
        let mut holds = self.slot_holds.lock().unwrap_or_else(|e| e.into_inner());
        holds.moved(replicas, rank, joined, horizons, now);
        self.slots_binding_until
            .store(holds.binding_until(), Ordering::Relaxed);
    }

    /// The most of an in-flight cap of `max` this replica may grant now when an earlier share
    /// still binds; `None` when none does (its share where it stands applies).
    pub(crate) fn held_slot_cap(&self, max: u64, now: u64) -> Option<u64> {
        if self.slots_binding_until.load(Ordering::Relaxed) <= now {
            return None;
        }
        let holds = self.slot_holds.lock().unwrap_or_else(|e| e.into_inner());
        holds.cap(max, now)
    }

    /// About how long ago a peer's reported admissions happened when its report arrives.
    pub(crate) fn backdate(&self) -> u64 {
        self.backdate_nanos.load(Ordering::Relaxed)
    }

    pub(crate) fn shared(&self) -> Option<&Arc<Shared>> {
        self.shared.as_ref()
    }

    pub(crate) fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Puts new inputs in force under the next generation; `next` gets the current ones.
    /// Returns once readers see them: the caller then rebuilds what it keeps.
    pub(crate) fn update_inputs(&self, next: impl FnOnce(&Inputs) -> NextInputs) {
        let _writer = self.inputs_writer.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.inputs.load_full();
        let NextInputs {
            config,
            healthy_replicas,
            cells,
        } = next(&current);
        let generation = current.generation + 1;
        self.inputs.store(Arc::new(Inputs {
            config,
            healthy_replicas,
            cells,
            generation,
        }));
        self.healthy.store(healthy_replicas, Ordering::Relaxed);
        self.generation.store(generation, Ordering::Release);
    }
}

/// Marks something used at `coarse`, a reading of the coarse clock (which moves once a
/// second): written only when it moved, so the decisions in between on a hot tenant or key
/// only read the cache line, and the cores serving it do not pass it back and forth.
pub(crate) fn touch(last_seen: &AtomicU64, coarse: u64) {
    if last_seen.load(Ordering::Relaxed) != coarse {
        last_seen.store(coarse, Ordering::Relaxed);
    }
}

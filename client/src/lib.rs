//! weir's embeddable client: "may this proceed?" answered inside the service, in nanoseconds,
//! from budgets leased from a weir fleet, which stays authoritative.
//!
//! ```no_run
//! # async fn example() -> Result<(), weir_client::Error> {
//! let registry = prometheus::Registry::new();
//! let client = weir_client::Client::builder("http://weir:9095")
//!     .prefix("myservice")
//!     .registry(&registry)
//!     .failure_policy(weir_client::FailurePolicy::Open)
//!     .timeout(std::time::Duration::from_millis(250))
//!     .build()?;
//! let decision = client.try_acquire("team-a", "GET /search", 1);
//! if !decision.allowed {
//!     // 429, Retry-After: decision.retry_after
//! }
//! # Ok(()) }
//! ```
//!
//! # Layout
//! - [`budget`](crate::budget): one (tenant, key)'s local budget: leased tokens spent with
//!   one atomic, and the `open` policy's fallback meter. Time is an input.
//! - [`plan`](crate::plan): when to roll a lease and for how much (pure: demand, tokens,
//!   clock).
//! - [`breaker`](crate::breaker): the fleet's circuit breaker, a state machine with time as
//!   an input.
//! - `fleet`: the background task, the one place that calls the fleet for leases: rolls
//!   leases as the plan says, reports spend, learns the limit in force, feeds the breaker.
//! - `concurrency`: [`Client::acquire`] and its [`Guard`] (Acquire, Renew, Release).
//! - `layer` (feature `tower`): [`RateLimitLayer`], the tower layer over the client.
//! - `metrics`: every metric family, in the service's registry under its prefix.
//!
//! Imports point down: `budget` and `plan` know nothing of IO; `fleet`, `concurrency` and
//! `layer` use them through [`Client`]. The design and its figures are in `docs/client.md`.

mod breaker;
mod budget;
mod concurrency;
mod fleet;
#[cfg(feature = "tower")]
mod layer;
mod metrics;
mod plan;

/// The admission API's generated client types (`weir.admission.v1`).
pub mod proto {
    tonic::include_proto!("weir.admission.v1");
}

use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use budget::Budget;

pub use concurrency::{Guard, Refused};
#[cfg(feature = "tower")]
pub use layer::{RateLimit, RateLimitLayer, Target};

/// What to do when the fleet cannot say: it is away (the breaker is open) or has not
/// answered yet for a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// Decide on a local meter at the limit last in force (everything passes while no limit
    /// is known). A service is never stopped by its limiter.
    #[default]
    Open,
    /// Refuse whatever the leased tokens do not cover.
    Closed,
}

/// What decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The leased budget (the fleet's answer, spent locally).
    Lease = 0,
    /// The key's first lease had not arrived: the failure policy decided.
    Cold = 1,
    /// The fleet is away; the `open` policy's local meter decided.
    FailOpen = 2,
    /// The fleet is away; the `closed` policy refused.
    FailClosed = 3,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Lease => "lease",
            Source::Cold => "cold",
            Source::FailOpen => "fail_open",
            Source::FailClosed => "fail_closed",
        }
    }
}

/// The limit in force as the fleet last said (0 and 0 before it has).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Limit {
    /// Per second, fleet-wide.
    pub rate: f64,
    /// The most at once.
    pub burst: u64,
}

/// A decision, with the fields of the admission API's `AllowResponse`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    pub allowed: bool,
    /// Left in the local budget after this request (allowed) or now (refused).
    pub remaining: u64,
    /// Refused: how long until this cost could pass.
    pub retry_after: Duration,
    /// Until the limit would be back to its fullest.
    pub reset_after: Duration,
    pub limit: Limit,
    pub source: Source,
}

impl Decision {
    pub(crate) fn refused(
        limit: Limit,
        retry_after: Duration,
        remaining: u64,
        source: Source,
    ) -> Decision {
        Decision {
            allowed: false,
            remaining,
            retry_after,
            reset_after: retry_after,
            limit,
            source,
        }
    }
}

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid weir endpoint {endpoint:?}: {source}")]
    Endpoint {
        endpoint: String,
        source: tonic::transport::Error,
    },
    #[error("registering the client's metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("the client needs a Tokio runtime to build in (its refill task runs there)")]
    NoRuntime,
    #[error("the bearer token is not a valid header value")]
    BadToken,
    #[error("no weir endpoint given")]
    NoEndpoint,
}

/// Builds a [`Client`]: `Client::builder(endpoint)…build()`.
pub struct Builder {
    endpoint: String,
    prefix: String,
    registry: Option<prometheus::Registry>,
    policy: FailurePolicy,
    timeout: Duration,
    lease_window: Duration,
    sync_interval: Duration,
    lease_ttl: Duration,
    concurrency_ttl: Duration,
    breaker_threshold: u32,
    breaker_cool_down: Duration,
    client_id: String,
    bearer_token: Option<String>,
    forget_after: Duration,
}

impl Builder {
    /// Metric names start `<prefix>_weir_client_`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The service's registry for the client's metrics (none registered without it).
    pub fn registry(mut self, registry: &prometheus::Registry) -> Self {
        self.registry = Some(registry.clone());
        self
    }

    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The longest any call to the fleet may take, and the longest [`Client::check`] waits
    /// for a key's first lease (default 250 ms). Decisions from a lease never wait.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How much demand a lease covers (default 500 ms): larger means fewer calls to the
    /// fleet and more tokens held here that other callers cannot use.
    pub fn lease_window(mut self, window: Duration) -> Self {
        self.lease_window = window;
        self
    }

    /// A key's lease is rolled (spend reported, the limit in force learnt) at least this
    /// often (default 1 s).
    pub fn sync_interval(mut self, interval: Duration) -> Self {
        self.sync_interval = interval;
        self
    }

    /// A lease's life on the fleet (default 5 s): if this process dies, what it held goes
    /// back to the fleet then.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// A concurrency slot's life between renewals (default 10 s; renewed every third).
    pub fn concurrency_ttl(mut self, ttl: Duration) -> Self {
        self.concurrency_ttl = ttl;
        self
    }

    /// The breaker opens after this many failed calls in a row (default 3) and probes after
    /// `cool_down` (default 500 ms).
    pub fn breaker(mut self, threshold: u32, cool_down: Duration) -> Self {
        self.breaker_threshold = threshold;
        self.breaker_cool_down = cool_down;
        self
    }

    /// Sent as `authorization: Bearer <token>` on every call, for a fleet started with
    /// `--tenant-auth tokens`.
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.bearer_token = Some(token.into());
        self
    }

    /// A (tenant, key) not asked for this long, holding nothing, is dropped (default
    /// 5 minutes; an idle key gives its lease back after 30 s): keys that come and go, per
    /// user or per address, do not pile up. A dropped key is made afresh when it is asked for
    /// again, and a [`KeyHandle`] to it looks it up again.
    pub fn forget_after(mut self, after: Duration) -> Self {
        self.forget_after = after;
        self
    }

    /// Names this process in the fleet's logs.
    pub fn client_id(mut self, id: impl Into<String>) -> Self {
        self.client_id = id.into();
        self
    }

    /// Connects lazily (the first lease connects) and starts the refill task on the current
    /// Tokio runtime.
    pub fn build(self) -> Result<Client, Error> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let replicas = self
            .endpoint
            .split(',')
            .map(str::trim)
            .filter(|endpoint| !endpoint.is_empty())
            .map(|endpoint| {
                let bad = |source| Error::Endpoint {
                    endpoint: endpoint.to_string(),
                    source,
                };
                let channel = tonic::transport::Endpoint::from_shared(endpoint.to_string())
                    .map_err(bad)?
                    .connect_timeout(self.timeout)
                    .timeout(self.timeout)
                    .tcp_nodelay(true)
                    .connect_lazy();
                Ok(proto::admission_client::AdmissionClient::new(channel))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        if replicas.is_empty() {
            return Err(Error::NoEndpoint);
        }
        // Services start on different replicas, so their leases spread over the fleet.
        let first = foldhash::fast::RandomState::default()
            .hash_one((std::process::id(), &self.client_id)) as usize
            % replicas.len();
        let authorization = self
            .bearer_token
            .as_ref()
            .map(|token| format!("Bearer {token}").parse())
            .transpose()
            .map_err(|_| Error::BadToken)?;
        let metrics = metrics::Metrics::new(&self.prefix, self.registry.as_ref())?;
        let inner = Arc::new(Inner {
            keys: papaya::HashMap::with_hasher(BuildHasherDefault::default()),
            collided: Mutex::new(Vec::new()),
            hasher: foldhash::fast::RandomState::default(),
            epoch: Instant::now(),
            fleet_down: AtomicBool::new(false),
            breaker: Mutex::new(breaker::Breaker::new(
                self.breaker_threshold,
                self.breaker_cool_down,
            )),
            refill: tokio::sync::Notify::new(),
            first_lease: tokio::sync::Notify::new(),
            stopped: AtomicBool::new(false),
            policy: self.policy,
            timeout: self.timeout,
            settings: plan::Settings::new(
                self.lease_window,
                self.sync_interval,
                self.lease_ttl,
                self.forget_after,
            ),
            lease_ttl: self.lease_ttl,
            concurrency_ttl: self.concurrency_ttl,
            client_id: self.client_id,
            authorization,
            replicas,
            current: AtomicUsize::new(first),
            metrics,
            runtime: runtime.clone(),
        });
        runtime.spawn(fleet::run(Arc::downgrade(&inner)));
        Ok(Client { inner })
    }
}

/// An identity hash: the map's keys are already hashes of (tenant, key).
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

pub(crate) struct Inner {
    /// (tenant, key) hashed → its budget. Lock-free reads (papaya); a budget is created
    /// once per pair, off the common path.
    keys: papaya::HashMap<u64, Arc<Budget>, BuildHasherDefault<Prehashed>>,
    /// Pairs whose hash another pair already holds (rare): looked up by name.
    collided: Mutex<Vec<Arc<Budget>>>,
    hasher: foldhash::fast::RandomState,
    epoch: Instant,
    pub(crate) fleet_down: AtomicBool,
    pub(crate) breaker: Mutex<breaker::Breaker>,
    /// Wakes the refill task early (a budget ran low).
    pub(crate) refill: tokio::sync::Notify,
    /// Every answered roll, for callers waiting on a key's first lease.
    pub(crate) first_lease: tokio::sync::Notify,
    pub(crate) stopped: AtomicBool,
    pub(crate) policy: FailurePolicy,
    pub(crate) timeout: Duration,
    pub(crate) settings: plan::Settings,
    pub(crate) lease_ttl: Duration,
    pub(crate) concurrency_ttl: Duration,
    pub(crate) client_id: String,
    authorization: Option<tonic::metadata::AsciiMetadataValue>,
    /// The fleet's replicas (one, or those the endpoint listed), and the one in use: every
    /// call goes to it until a call to it fails, then to the next.
    replicas: Vec<Api>,
    current: AtomicUsize,
    pub(crate) metrics: metrics::Metrics,
    pub(crate) runtime: tokio::runtime::Handle,
}

/// The generated client of one replica.
pub(crate) type Api = proto::admission_client::AdmissionClient<tonic::transport::Channel>;

impl Inner {
    /// The replica in use, and which it is (for [`Inner::failed_over`], and for calls that
    /// must go back to it: a replica-local lease's renewals and release).
    pub(crate) fn api(&self) -> (usize, Api) {
        let index = self.current.load(Ordering::Relaxed) % self.replicas.len();
        (index, self.replicas[index].clone())
    }

    /// Replica `index`'s client.
    pub(crate) fn replica(&self, index: usize) -> Api {
        self.replicas[index % self.replicas.len()].clone()
    }

    /// A call to replica `index` failed (not answered): later calls go to the next one. A
    /// lease it holds is not carried over; what it held lapses there at its TTL.
    pub(crate) fn failed_over(&self, index: usize) {
        if self.replicas.len() > 1 {
            let next = (index + 1) % self.replicas.len();
            let _ =
                self.current
                    .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// A call's request, with the credentials.
    pub(crate) fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(authorization) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", authorization.clone());
        }
        request
    }

    /// Nanoseconds since the client started: the clock every budget is read against.
    pub(crate) fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// The budget of (tenant, key), created on first use.
    fn budget(&self, tenant: &str, key: &str) -> Arc<Budget> {
        let hash = self.hasher.hash_one((tenant, key));
        let keys = self.keys.pin();
        if let Some(budget) = keys.get(&hash) {
            if &*budget.tenant == tenant && &*budget.key == key {
                return Arc::clone(budget);
            }
            return self.collided_budget(tenant, key);
        }
        let budget = keys.get_or_insert_with(hash, || {
            self.metrics.keys.inc();
            Arc::new(Budget::new(tenant, key, self.now()))
        });
        if &*budget.tenant == tenant && &*budget.key == key {
            Arc::clone(budget)
        } else {
            self.collided_budget(tenant, key)
        }
    }

    #[cold]
    fn collided_budget(&self, tenant: &str, key: &str) -> Arc<Budget> {
        let mut collided = self.collided.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(budget) = collided
            .iter()
            .find(|budget| &*budget.tenant == tenant && &*budget.key == key)
        {
            return Arc::clone(budget);
        }
        self.metrics.keys.inc();
        let budget = Arc::new(Budget::new(tenant, key, self.now()));
        collided.push(Arc::clone(&budget));
        budget
    }

    /// Drops `budget` from the keys, if it is still the pair's there, and marks it forgotten
    /// so a [`KeyHandle`] holding it looks the pair up again.
    pub(crate) fn forget(&self, budget: &Arc<Budget>) {
        let hash = self.hasher.hash_one((&*budget.tenant, &*budget.key));
        let removed = self
            .keys
            .pin()
            .remove_if(&hash, |_, held| Arc::ptr_eq(held, budget))
            .is_ok_and(|removed| removed.is_some());
        let removed = removed || {
            let mut collided = self.collided.lock().unwrap_or_else(|e| e.into_inner());
            let before = collided.len();
            collided.retain(|held| !Arc::ptr_eq(held, budget));
            collided.len() < before
        };
        if removed {
            budget.forgotten.store(true, Ordering::Release);
            self.metrics.keys.dec();
        }
    }

    /// Every budget, for the refill task.
    pub(crate) fn budgets(&self) -> Vec<Arc<Budget>> {
        let mut all: Vec<Arc<Budget>> = self.keys.pin().values().cloned().collect();
        all.extend(
            self.collided
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .cloned(),
        );
        all
    }

    fn decide(&self, budget: &Budget, cost: u64) -> Decision {
        if budget.forgotten.load(Ordering::Relaxed) {
            // Dropped while idle: the pair's budget now is the one in the keys, or a new one.
            return self.decide_afresh(budget, cost);
        }
        let decided = budget.decide(
            cost,
            self.now(),
            self.fleet_down.load(Ordering::Relaxed),
            self.policy,
        );
        if decided.wake {
            self.refill.notify_one();
        }
        self.metrics
            .decided(decided.decision.allowed, decided.decision.source);
        decided.decision
    }

    #[cold]
    fn decide_afresh(&self, forgotten: &Budget, cost: u64) -> Decision {
        let budget = self.budget(&forgotten.tenant, &forgotten.key);
        self.decide(&budget, cost)
    }
}

/// The client: cheap to clone (one `Arc`), shared by every clone of a service.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

/// A (tenant, key) looked up once: its decisions skip hashing and the map.
#[derive(Clone)]
pub struct KeyHandle {
    inner: Arc<Inner>,
    budget: Arc<Budget>,
}

impl KeyHandle {
    pub fn try_acquire(&self, cost: u64) -> Decision {
        self.inner.decide(&self.budget, cost)
    }
}

impl Client {
    /// `endpoint`: a weir replica's gRPC address, e.g. `http://weir:9095`, or several
    /// separated by commas (`http://weir-0:9095,http://weir-1:9095`). A lease is held by the
    /// replica that lent it, so the client uses one replica at a time (a different one in
    /// each process, to spread the leases) and moves to the next when a call to it fails; a
    /// balancer in front works too if it keeps a connection on one replica.
    pub fn builder(endpoint: impl Into<String>) -> Builder {
        Builder {
            endpoint: endpoint.into(),
            prefix: String::new(),
            registry: None,
            policy: FailurePolicy::Open,
            timeout: Duration::from_millis(250),
            lease_window: Duration::from_millis(500),
            sync_interval: Duration::from_secs(1),
            lease_ttl: Duration::from_secs(5),
            concurrency_ttl: Duration::from_secs(10),
            breaker_threshold: 3,
            breaker_cool_down: Duration::from_millis(500),
            client_id: String::new(),
            bearer_token: None,
            forget_after: Duration::from_secs(300),
        }
    }

    /// Which of the endpoints given to [`Client::builder`] the client is using (0-based).
    pub fn replica_in_use(&self) -> usize {
        self.inner.api().0
    }

    /// Decides `cost` for `tenant`'s `key` from the local budget: no network, no allocation
    /// once the pair has been seen. The first decision for a pair follows the failure policy
    /// and asks for its first lease ([`Client::check`] waits for it instead).
    pub fn try_acquire(&self, tenant: &str, key: &str, cost: u64) -> Decision {
        let hash = self.inner.hasher.hash_one((tenant, key));
        {
            let keys = self.inner.keys.pin();
            if let Some(budget) = keys.get(&hash) {
                if &*budget.tenant == tenant && &*budget.key == key {
                    return self.inner.decide(budget, cost);
                }
            }
        }
        let budget = self.inner.budget(tenant, key);
        self.inner.decide(&budget, cost)
    }

    /// As [`Client::try_acquire`], but a pair's first decision waits for its first lease, no
    /// longer than the timeout (then the failure policy decides).
    pub async fn check(&self, tenant: &str, key: &str, cost: u64) -> Decision {
        let budget = self.inner.budget(tenant, key);
        if !budget.leased() && !self.inner.fleet_down.load(Ordering::Relaxed) {
            budget.wanted.store(true, Ordering::Release);
            self.inner.refill.notify_one();
            let _ = tokio::time::timeout(self.inner.timeout, async {
                loop {
                    let answered = self.inner.first_lease.notified();
                    tokio::pin!(answered);
                    answered.as_mut().enable();
                    if budget.leased() || self.inner.fleet_down.load(Ordering::Relaxed) {
                        return;
                    }
                    answered.await;
                }
            })
            .await;
        }
        self.inner.decide(&budget, cost)
    }

    /// The pair's handle: its decisions skip the lookup.
    pub fn key(&self, tenant: &str, key: &str) -> KeyHandle {
        KeyHandle {
            inner: Arc::clone(&self.inner),
            budget: self.inner.budget(tenant, key),
        }
    }

    /// Gives the pair a budget of `tokens` valid for an hour, as if the fleet had lent it:
    /// for benchmarks and allocation tests of the local path, without a fleet.
    #[doc(hidden)]
    pub fn fill_for_bench(&self, tenant: &str, key: &str, tokens: u64) {
        let budget = self.inner.budget(tenant, key);
        budget.tokens.store(tokens, Ordering::Release);
        budget.valid_until.store(
            self.inner.now() + Duration::from_secs(3600).as_nanos() as u64,
            Ordering::Release,
        );
    }

    /// Is the fleet taken to be away (the breaker open)?
    pub fn fleet_down(&self) -> bool {
        self.inner.fleet_down.load(Ordering::Relaxed)
    }

    /// Gives every unspent token back to the fleet and stops the refill task. Decisions
    /// after it follow the failure policy.
    pub async fn shutdown(&self) {
        self.inner.stopped.store(true, Ordering::Release);
        self.inner.refill.notify_one();
        fleet::give_everything_back(&self.inner).await;
    }
}

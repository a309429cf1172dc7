//! weir's shared store on Redis or Redis Cluster: the engine's [`Store`] over two Lua scripts
//! (`scripts/take.lua`, `scripts/give_back.lua`) that refill, check and change a token bucket
//! in one atomic step on the store's own clock.
//!
//! Client: the `redis` crate (redis-rs). It is the maintained Rust client with both a
//! reconnecting multiplexed connection for a single node (`ConnectionManager`) and an async
//! cluster client that follows `MOVED` and `ASK` redirections and refreshes its slot map on
//! failover; and its `Script` type sends `EVALSHA` and, on `NOSCRIPT` (after a restart,
//! a failover, or `SCRIPT FLUSH`), loads the script and retries, so no call ever fails for a
//! missing script.
//!
//! Keys carry a hash tag (`weir:{tenant}:i`), so all of a tenant's keys share a slot and one
//! script can touch them; `store_shards` gives sub-buckets their own tags
//! (`weir:{tenant#k}:i`) so a hot tenant's load lands on several masters. The names are in
//! [`keys`]: the engine asks for buckets and keys by what they are, not by name.
//!
//! Cells use two more scripts, outside the [`Store`] trait (they are not buckets):
//! `cell_heartbeat.lua` (the registry of live cells) and `cell_slice.lua` (a replica's report
//! of a tenant's demand, answered with its cell's slice): [`RedisStore::cell_heartbeat`],
//! [`RedisStore::cell_slice`].

use std::sync::Arc;
use std::time::Duration;

use engine::cells::{
    CellReport, CellSubject, ReconcileParams, Reconciled, Share, SubjectLimits, TenantShare,
};
use engine::store::{
    Acquired, BucketKey, Grant, KeyName, Store, StoreError, StoreFuture, StoredMeter,
};
use engine::{Decision, Rate};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Client, Script};

pub mod keys;

/// Where the store is and how to talk to it.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// `redis://` or `rediss://` URLs: one node, or several seeds of a cluster. A single URL
    /// that points at a cluster node is detected (`INFO cluster`) and used as a seed.
    pub urls: Vec<String>,
    /// Bound on establishing a connection.
    pub connect_timeout: Duration,
    /// Bound on one command's answer inside the client (the engine also bounds each call).
    pub response_timeout: Duration,
}

#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The Redis store. Cheap to clone: connections are multiplexed and shared.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    scripts: Arc<Scripts>,
    cluster: bool,
}

/// The Lua scripts, each loaded once per server and called by `EVALSHA`.
struct Scripts {
    take: Script,
    give_back: Script,
    sliding_window: Script,
    leaky_bucket: Script,
    acquire: Script,
    release: Script,
    renew: Script,
    cell_heartbeat: Script,
    cell_slice: Script,
}

impl RedisStore {
    /// Connects, and says whether it found a single node or a cluster.
    pub async fn connect(config: &RedisConfig) -> Result<RedisStore, StoreError> {
        let failed =
            |what: &str, err: redis::RedisError| StoreError::Failed(format!("{what}: {err}"));
        anyhow_free_ensure(!config.urls.is_empty(), "--store-url is empty")?;
        let cluster = config.urls.len() > 1 || is_cluster(&config.urls[0], config).await?;
        let connection = if cluster {
            let client = ClusterClientBuilder::new(config.urls.clone())
                .connection_timeout(config.connect_timeout)
                .response_timeout(config.response_timeout)
                .retries(3)
                .build()
                .map_err(|err| failed("invalid cluster seeds", err))?;
            let connection =
                tokio::time::timeout(config.connect_timeout * 2, client.get_async_connection())
                    .await
                    .map_err(|_| StoreError::Timeout(config.connect_timeout * 2))?
                    .map_err(|err| failed("cannot connect to the Redis cluster", err))?;
            Connection::Cluster(connection)
        } else {
            let client = Client::open(config.urls[0].as_str())
                .map_err(|err| failed("invalid --store-url", err))?;
            let manager = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(config.connect_timeout))
                .set_response_timeout(Some(config.response_timeout))
                .set_number_of_retries(2);
            let connection = tokio::time::timeout(
                config.connect_timeout * 2,
                ConnectionManager::new_with_config(client, manager),
            )
            .await
            .map_err(|_| StoreError::Timeout(config.connect_timeout * 2))?
            .map_err(|err| failed("cannot connect to Redis", err))?;
            Connection::Single(connection)
        };
        Ok(RedisStore {
            connection,
            scripts: Arc::new(Scripts {
                take: Script::new(include_str!("../scripts/take.lua")),
                give_back: Script::new(include_str!("../scripts/give_back.lua")),
                sliding_window: Script::new(include_str!("../scripts/sliding_window.lua")),
                leaky_bucket: Script::new(include_str!("../scripts/leaky_bucket.lua")),
                acquire: Script::new(include_str!("../scripts/acquire.lua")),
                release: Script::new(include_str!("../scripts/release.lua")),
                renew: Script::new(include_str!("../scripts/renew.lua")),
                cell_heartbeat: Script::new(include_str!("../scripts/cell_heartbeat.lua")),
                cell_slice: Script::new(include_str!("../scripts/cell_slice.lua")),
            }),
            cluster,
        })
    }

    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// `PING`, for `/ready`.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let command = redis::cmd("PING");
        match self.connection.clone() {
            Connection::Single(mut connection) => {
                command.query_async::<String>(&mut connection).await
            }
            Connection::Cluster(mut connection) => {
                command.query_async::<String>(&mut connection).await
            }
        }
        .map(|_| ())
        .map_err(|err| StoreError::Failed(err.to_string()))
    }

    /// Cells: says `cell` is alive and returns how many cells are (those heard from within
    /// `hold`). `cell_heartbeat.lua`.
    pub async fn cell_heartbeat(&self, cell: &str, hold: Duration) -> Result<u32, StoreError> {
        let mut invocation = self.scripts.cell_heartbeat.prepare_invoke();
        invocation
            .key(keys::cells_registry())
            .arg(cell)
            .arg(hold.as_micros() as u64);
        self.invoke(invocation).await
    }

    /// Cells: records this replica's `report` of `subject` (its time is the store's) and
    /// returns its cell's share of `limits` (a tenant's request and ingestion rates, or an
    /// admission key's rate and in-flight cap). `cell_slice.lua`, whose pure twin is
    /// [`engine::cells::reconcile`].
    pub async fn cell_slice(
        &self,
        subject: CellSubject<'_>,
        report: &CellReport,
        limits: impl Into<SubjectLimits>,
        params: ReconcileParams,
    ) -> Result<Reconciled, StoreError> {
        let SubjectLimits { limits, units } = limits.into();
        let finite = |value: f64| {
            if value.is_finite() {
                value.max(0.0)
            } else {
                0.0
            }
        };
        let mut invocation = self.scripts.cell_slice.prepare_invoke();
        invocation
            .key(keys::cell_reports(subject))
            .arg(&report.cell)
            .arg(&report.replica)
            .arg(params.fresh_micros)
            .arg(params.hold_micros)
            .arg(params.live_cells)
            .arg(finite(params.floor_fraction).to_string())
            .arg(finite(limits[0]).to_string())
            .arg(finite(limits[1]).to_string())
            .arg(finite(report.demand[0]).to_string())
            .arg(finite(report.demand[1]).to_string())
            .arg(report.spent[0])
            .arg(report.spent[1])
            .arg(finite(units[0]).to_string())
            .arg(finite(units[1]).to_string());
        let (request_rate, request_burst, items_rate, items_burst, cells): (
            String,
            String,
            String,
            String,
            u32,
        ) = self.invoke(invocation).await?;
        let number = |text: &str| {
            text.parse::<f64>()
                .map_err(|_| StoreError::Failed(format!("cell_slice answered {text:?}")))
        };
        Ok(Reconciled {
            share: TenantShare {
                request: Share {
                    rate: number(&request_rate)?,
                    burst: number(&request_burst)?,
                },
                ingestion: Share {
                    rate: number(&items_rate)?,
                    burst: number(&items_burst)?,
                },
            },
            cells,
        })
    }

    async fn invoke<T: redis::FromRedisValue>(
        &self,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let result = match self.connection.clone() {
            Connection::Single(mut connection) => invocation.invoke_async(&mut connection).await,
            Connection::Cluster(mut connection) => invocation.invoke_async(&mut connection).await,
        };
        result.map_err(|err| StoreError::Failed(err.to_string()))
    }
}

fn anyhow_free_ensure(condition: bool, message: &str) -> Result<(), StoreError> {
    if condition {
        Ok(())
    } else {
        Err(StoreError::Failed(message.to_string()))
    }
}

/// Whether the node at `url` runs in cluster mode.
async fn is_cluster(url: &str, config: &RedisConfig) -> Result<bool, StoreError> {
    let client = Client::open(url)
        .map_err(|err| StoreError::Failed(format!("invalid --store-url: {err}")))?;
    let info: String = tokio::time::timeout(config.connect_timeout * 2, async {
        let mut connection = client.get_multiplexed_async_connection().await?;
        redis::cmd("INFO")
            .arg("cluster")
            .query_async::<String>(&mut connection)
            .await
    })
    .await
    .map_err(|_| StoreError::Timeout(config.connect_timeout * 2))?
    .map_err(|err| StoreError::Failed(format!("cannot reach {url}: {err}")))?;
    Ok(info.contains("cluster_enabled:1"))
}

impl Store for RedisStore {
    fn take<'a>(
        &'a self,
        key: BucketKey<'a>,
        rate: Rate,
        want: u64,
        min: u64,
    ) -> StoreFuture<'a, Grant> {
        Box::pin(async move {
            let mut invocation = self.scripts.take.prepare_invoke();
            invocation
                .key(keys::bucket(&key))
                .arg(rate.per_second)
                .arg(rate.burst)
                .arg(want)
                .arg(min);
            let (granted, remaining, wait): (u64, String, u64) = self.invoke(invocation).await?;
            Ok(Grant {
                granted,
                remaining: remaining.parse().unwrap_or(0.0),
                wait: Duration::from_micros(wait),
            })
        })
    }

    fn give_back<'a>(&'a self, key: BucketKey<'a>, rate: Rate, tokens: u64) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let mut invocation = self.scripts.give_back.prepare_invoke();
            invocation
                .key(keys::bucket(&key))
                .arg(rate.per_second)
                .arg(rate.burst)
                .arg(tokens);
            let _: String = self.invoke(invocation).await?;
            Ok(())
        })
    }

    fn meter<'a>(
        &'a self,
        key: KeyName<'a>,
        meter: StoredMeter,
        cost: u64,
    ) -> StoreFuture<'a, Decision> {
        Box::pin(async move {
            let mut invocation = match meter {
                StoredMeter::SlidingWindow { limit, window } => {
                    let mut invocation = self.scripts.sliding_window.prepare_invoke();
                    invocation
                        .key(keys::admission(&key, 'w'))
                        .arg(limit)
                        .arg(window.as_micros() as u64)
                        .arg(cost);
                    invocation
                }
                StoredMeter::LeakyBucket { rate, capacity } => {
                    let mut invocation = self.scripts.leaky_bucket.prepare_invoke();
                    invocation
                        .key(keys::admission(&key, 'l'))
                        .arg(rate)
                        .arg(capacity)
                        .arg(cost);
                    invocation
                }
            };
            let answer: Vec<u64> = self
                .invoke(std::mem::replace(
                    &mut invocation,
                    self.scripts.take.prepare_invoke(),
                ))
                .await?;
            let field = |i: usize| answer.get(i).copied().unwrap_or(0);
            Ok(Decision {
                allowed: field(0) == 1,
                remaining: field(1),
                retry_after: Duration::from_micros(field(2)),
                reset_after: Duration::from_micros(field(3)),
                delay: Duration::from_micros(field(4)),
            })
        })
    }

    fn acquire<'a>(
        &'a self,
        key: KeyName<'a>,
        lease: &'a str,
        max: u64,
        ttl: Duration,
    ) -> StoreFuture<'a, Acquired> {
        Box::pin(async move {
            let mut invocation = self.scripts.acquire.prepare_invoke();
            invocation
                .key(keys::admission(&key, 'c'))
                .arg(lease)
                .arg(max)
                .arg(ttl.as_millis() as u64);
            let (granted, in_flight, retry_after): (u64, u64, i64) =
                self.invoke(invocation).await?;
            Ok(Acquired {
                granted: granted == 1,
                in_flight,
                retry_after: Duration::from_micros(retry_after.max(0) as u64),
            })
        })
    }

    fn release<'a>(&'a self, key: KeyName<'a>, lease: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let mut invocation = self.scripts.release.prepare_invoke();
            invocation.key(keys::admission(&key, 'c')).arg(lease);
            let released: u64 = self.invoke(invocation).await?;
            Ok(released == 1)
        })
    }

    fn renew<'a>(
        &'a self,
        key: KeyName<'a>,
        lease: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let mut invocation = self.scripts.renew.prepare_invoke();
            invocation
                .key(keys::admission(&key, 'c'))
                .arg(lease)
                .arg(ttl.as_millis() as u64);
            let renewed: u64 = self.invoke(invocation).await?;
            Ok(renewed == 1)
        })
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        // The inherent `PING`, which `/ready` and the keep-alive also send.
        Box::pin(RedisStore::ping(self))
    }
}

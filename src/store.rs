//! The shared store's edge: connects to Redis in the background (a store that is down at
//! start-up must not keep weir from starting, nor crash-loop it), and until it is connected
//! answers every call with an error at once, so the breaker and each tenant's failure policy
//! decide instead of a wait.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use engine::store::{
    Acquired, BucketKey, Grant, KeyName, Store, StoreError, StoreFuture, StoredMeter,
};
use engine::{Decision, Rate};
use redis_store::{RedisConfig, RedisStore};

pub struct ConnectingStore {
    connected: ArcSwapOption<RedisStore>,
    config: RedisConfig,
}

impl ConnectingStore {
    /// Starts connecting in the background, retrying every second until it succeeds.
    pub fn start(config: RedisConfig) -> Arc<ConnectingStore> {
        let store = Arc::new(ConnectingStore {
            connected: ArcSwapOption::empty(),
            config,
        });
        let connecting = Arc::clone(&store);
        tokio::spawn(async move {
            let mut logged = false;
            loop {
                match RedisStore::connect(&connecting.config).await {
                    Ok(redis) => {
                        tracing::info!(
                            urls = ?connecting.config.urls,
                            cluster = redis.is_cluster(),
                            "connected to the shared store"
                        );
                        let redis = Arc::new(redis);
                        connecting.connected.store(Some(Arc::clone(&redis)));
                        keep_alive(redis).await;
                        return;
                    }
                    Err(err) => {
                        if !logged {
                            tracing::error!(%err, urls = ?connecting.config.urls, "cannot connect to the shared store; shared tenants follow their on_store_failure policy until it answers; retrying every second");
                            logged = true;
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
        store
    }

    /// The Redis store once connected: for the cells' sync, which calls its own scripts.
    pub fn redis(&self) -> Option<Arc<RedisStore>> {
        self.connected.load_full()
    }

    /// Whether the store answers a `PING` within `timeout`, for `/ready`.
    pub async fn reachable(&self, timeout: Duration) -> bool {
        let Some(redis) = self.connected.load_full() else {
            return false;
        };
        matches!(
            tokio::time::timeout(timeout, redis.ping()).await,
            Ok(Ok(()))
        )
    }
}

/// Pings the store four times a second, for good. A dropped connection is re-established by
/// the client only when a command fails on it; the pings make that happen within a quarter
/// second of the store coming back, rather than at the breaker's next probe, so a returning
/// store is used again within about a second.
async fn keep_alive(redis: Arc<RedisStore>) {
    let mut ticker = tokio::time::interval(KEEP_ALIVE);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let _ = tokio::time::timeout(KEEP_ALIVE, redis.ping()).await;
    }
}

const KEEP_ALIVE: Duration = Duration::from_millis(250);

fn not_connected() -> StoreError {
    StoreError::Failed("not connected to the shared store yet".to_string())
}

impl Store for ConnectingStore {
    fn take<'a>(
        &'a self,
        key: BucketKey<'a>,
        rate: Rate,
        want: u64,
        min: u64,
    ) -> StoreFuture<'a, Grant> {
        match self.connected.load_full() {
            Some(redis) => Box::pin(async move { redis.take(key, rate, want, min).await }),
            None => Box::pin(std::future::ready(Err(not_connected()))),
        }
    }

    fn give_back<'a>(&'a self, key: BucketKey<'a>, rate: Rate, tokens: u64) -> StoreFuture<'a, ()> {
        match self.connected.load_full() {
            Some(redis) => Box::pin(async move { redis.give_back(key, rate, tokens).await }),
            None => Box::pin(std::future::ready(Err(not_connected()))),
        }
    }

    fn meter<'a>(
        &'a self,
        key: KeyName<'a>,
        meter: StoredMeter,
        cost: u64,
    ) -> StoreFuture<'a, Decision> {
        match self.connected.load_full() {
            Some(redis) => Box::pin(async move { redis.meter(key, meter, cost).await }),
            None => Box::pin(std::future::ready(Err(not_connected()))),
        }
    }

    fn acquire<'a>(
        &'a self,
        key: KeyName<'a>,
        lease: &'a str,
        max: u64,
        ttl: Duration,
    ) -> StoreFuture<'a, Acquired> {
        match self.connected.load_full() {
            Some(redis) => Box::pin(async move { redis.acquire(key, lease, max, ttl).await }),
            None => Box::pin(std::future::ready(Err(not_connected()))),
        }
    }

    fn release<'a>(&'a self, key: KeyName<'a>, lease: &'a str) -> StoreFuture<'a, bool> {
        match self.connected.load_full() {
            Some(redis) => Box::pin(async move { redis.release(key, lease).await }),
            None => Box::pin(std::future::ready(Err(not_connected()))),
        }
    }

    fn renew<'a>(
        &'a self,
        key: KeyName<'a>,
        lease: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        match self.connected.load_full() {
            Some(redis) => Box::pin(async move { redis.renew(key, lease, ttl).await }),
            None => Box::pin(std::future::ready(Err(not_connected()))),
        }
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        match self.connected.load_full() {
            Some(redis) => Box::pin(async move { redis.ping().await }),
            None => Box::pin(std::future::ready(Err(not_connected()))),
        }
    }
}

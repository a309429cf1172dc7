//! `shared`: a decision through a lease against one `EVALSHA` per decision, on the same real
//! `redis-server` (started here on a free port; the bench is skipped without one).
//!
//! `cargo bench --bench shared_store`

use std::hint::black_box;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use engine::store::{BucketKey, Store};
use engine::{EngineClock, LimitKind, Limiter, NoHooks, Rate, Shared, SharedConfig};
use redis_store::{RedisConfig, RedisStore};
use runtime_config::{Defaults, RuntimeConfig};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> Option<(Server, u16)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    std::thread::sleep(Duration::from_millis(300));
    Some((Server(child), port))
}

fn shared_store(c: &mut Criterion) {
    let Some((_server, port)) = start_redis() else {
        eprintln!("shared_store: redis-server is not installed; skipped");
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = runtime
        .block_on(RedisStore::connect(&RedisConfig {
            urls: vec![format!("redis://127.0.0.1:{port}")],
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(2),
        }))
        .unwrap();
    let store = Arc::new(store);
    let config = RuntimeConfig::parse(
        "overrides:\n  t:\n    ingestion_rate: 1e9\n    ingestion_burst_size: 4000000000\n    rate_limit_strategy: shared\n",
        Defaults::default(),
    )
    .unwrap();
    let shared = Shared::new(
        Arc::clone(&store) as Arc<dyn Store>,
        SharedConfig::default(),
        Box::new(engine::shared::Unobserved),
    );
    let limiter = Limiter::with_clock(
        Arc::new(config),
        Duration::from_secs(600),
        NoHooks,
        EngineClock::real(),
    )
    .with_shared(Arc::new(shared));
    let tenant = limiter.tenant("t").unwrap();
    let mut group = c.benchmark_group("shared");
    group.bench_function("decision_through_a_lease", |b| {
        b.iter(|| {
            runtime.block_on(async {
                black_box(limiter.admit(&tenant, LimitKind::Ingestion, 100).await)
            })
        })
    });
    let rate = Rate {
        per_second: 1e9,
        burst: 4_000_000_000,
    };
    let key = BucketKey {
        tenant: "raw",
        kind: LimitKind::Ingestion,
        shard: 0,
        shards: 1,
        key: None,
    };
    group.bench_function("one_evalsha_per_decision", |b| {
        b.iter(|| runtime.block_on(async { black_box(store.take(key, rate, 100, 100).await) }))
    });
    group.finish();
}

criterion_group!(benches, shared_store);
criterion_main!(benches);

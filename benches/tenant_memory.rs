//! Bytes of heap per idle tenant (limiter state + its metric series), measured with a
//! counting allocator, and the time to create a tenant's state.
//!
//! `cargo bench --bench tenant_memory`

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use engine::{EngineClock, Limiter};
use runtime_config::{Defaults, RuntimeConfig};
use weir::metrics::{Metrics, TenantMetrics, TenantSeries};

struct LiveBytes;

static LIVE: AtomicI64 = AtomicI64::new(0);

unsafe impl GlobalAlloc for LiveBytes {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: LiveBytes = LiveBytes;

fn new_limiter(metrics: Arc<Metrics>) -> Limiter<TenantSeries> {
    let config = RuntimeConfig::parse("", Defaults::default()).unwrap();
    Limiter::with_clock(
        Arc::new(config),
        Duration::from_secs(3600),
        TenantSeries(metrics),
        EngineClock::real(),
    )
}

fn bytes_per_idle_tenant(c: &mut Criterion) {
    const TENANTS: usize = 100_000;
    let names: Vec<String> = (0..TENANTS).map(|i| format!("tenant-{i:08}")).collect();

    // Everything a tenant costs: its map entry, buckets and metric series (atomics kept
    // inline in its state, see `weir::metrics`).
    let metrics = Arc::new(Metrics::new());
    let limiter = new_limiter(Arc::clone(&metrics));
    let before = LIVE.load(Ordering::Relaxed);
    for name in &names {
        limiter.tenant(name).unwrap();
    }
    let total = (LIVE.load(Ordering::Relaxed) - before) as f64 / TENANTS as f64;

    // The scrape of all of them: its time and its size.
    let started = std::time::Instant::now();
    let scrape_bytes = metrics.render(&limiter).len();
    let scrape = started.elapsed();
    drop(limiter);
    drop(metrics);

    let metric_series = std::mem::size_of::<TenantMetrics>();
    eprintln!(
        "tenant_memory: {TENANTS} idle tenants: {total:.0} bytes each in all; \
         {metric_series} of them for the tenant's metric counters, {:.0} for limiter state; \
         one scrape: {:.0} ms, {:.1} MB of text",
        total - metric_series as f64,
        scrape.as_secs_f64() * 1e3,
        scrape_bytes as f64 / 1e6,
    );

    c.bench_function("tenant_memory/create_tenant", |b| {
        let metrics = Arc::new(Metrics::new());
        let limiter = new_limiter(metrics);
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            black_box(limiter.tenant(&format!("new-{i}")).unwrap());
        })
    });
}

criterion_group!(benches, bytes_per_idle_tenant);
criterion_main!(benches);

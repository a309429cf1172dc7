//! The decision path (tenant lookup + bucket checks) and the body scan allocate nothing in
//! steady state. Counted with a global allocator that tallies this thread's allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use engine::{EngineClock, LimitKind, Limiter};
use runtime_config::{Defaults, RuntimeConfig};
use weir::format::{self, Format};
use weir::metrics::{Metrics, TenantSeries};
use weir::remote_write::prompb::WriteRequest;

struct CountingAllocator;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

fn allocations_during(work: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.with(Cell::get);
    work();
    ALLOCATIONS.with(Cell::get) - before
}

#[test]
fn decisions_allocate_nothing_in_steady_state() {
    let config = RuntimeConfig::parse(
        "overrides:\n  open:\n    ingestion_rate: 1e9\n    ingestion_burst_size: 4000000000\n  limited:\n    ingestion_rate: 1\n    ingestion_burst_size: 1\n    request_rate: 1\n    request_burst_size: 1\n",
        Defaults::default(),
    )
    .unwrap();
    let limiter = Limiter::with_clock(
        Arc::new(config),
        Duration::from_secs(600),
        TenantSeries(Arc::new(Metrics::new())),
        EngineClock::real(),
    );
    let decide = |name: &str| {
        let tenant = limiter.tenant(name).unwrap();
        let request = limiter.check(&tenant, LimitKind::Request, 1);
        let ingestion = limiter.check(&tenant, LimitKind::Ingestion, 100);
        (request.is_ok(), ingestion.is_ok())
    };
    // Warm up: first sight of each tenant allocates its state, as does each thread's first
    // use of the epoch and hazard-pointer machinery.
    for _ in 0..10 {
        decide("open");
        decide("limited");
    }
    let mut admitted = 0;
    let allocations = allocations_during(|| {
        for _ in 0..10_000 {
            admitted += decide("open").1 as u32; // admitted path
            assert_eq!(decide("limited"), (false, false)); // rejected path
        }
    });
    assert_eq!(admitted, 10_000);
    assert_eq!(
        allocations, 0,
        "{allocations} allocations in 20 000 decisions"
    );

    // A membership or config change rebuilds buckets once, then the path is clean again.
    limiter.set_healthy_replicas(3);
    decide("open");
    assert_eq!(
        allocations_during(|| {
            decide("open");
        }),
        0
    );
}

#[test]
fn body_scan_allocates_nothing_in_steady_state() {
    let body = WriteRequest::synthetic(500, 7, 1).encode_snappy();
    format::decode(&body, 1 << 20, Format::V1).unwrap(); // sizes the reused buffer
    let allocations = allocations_during(|| {
        for _ in 0..100 {
            assert_eq!(
                format::decode(&body, 1 << 20, Format::V1).unwrap().samples,
                500
            );
        }
    });
    assert_eq!(allocations, 0);
}

#[test]
fn remote_write_2_0_scan_allocates_nothing_in_steady_state() {
    use weir::remote_write::v2_proto::{Metadata, Request, Sample, TimeSeries};
    let mut symbols: Vec<String> = ["", "__name__", "up", "instance"]
        .into_iter()
        .map(String::from)
        .collect();
    let mut timeseries = Vec::new();
    for i in 0..500 {
        symbols.push(format!("host-{i}"));
        timeseries.push(TimeSeries {
            labels_refs: vec![1, 2, 3, symbols.len() as u32 - 1],
            samples: vec![Sample::default()],
            metadata: Some(Metadata {
                r#type: 2,
                help_ref: 0,
                unit_ref: 0,
            }),
            ..TimeSeries::default()
        });
    }
    let body = Request {
        symbols,
        timeseries,
    }
    .encode_snappy();
    format::decode(&body, 1 << 20, Format::V2).unwrap(); // sizes the reused buffers
    let allocations = allocations_during(|| {
        for _ in 0..100 {
            let counts = format::decode(&body, 1 << 20, Format::V2).unwrap();
            assert_eq!((counts.samples, counts.metadata), (500, 1));
        }
    });
    assert_eq!(allocations, 0);
}

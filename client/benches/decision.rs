//! The decision inside the service: `try_acquire` on a key with a leased budget (the common
//! path: hash, lock-free map read, one atomic update, a counter), and through a `KeyHandle`
//! (no lookup). Target: under 200 ns. The fleet is a weir replica that is not there: the
//! budget is filled by hand (`for_bench`), so only the local path is measured.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use weir_client::Client;

fn decision(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let client = Client::builder("http://127.0.0.1:1").build().unwrap();
    // 1 000 keys, so the map is not a toy.
    for index in 0..1000 {
        client.fill_for_bench("tenant-a", &format!("GET /route/{index}"), u64::MAX / 2);
    }
    let mut group = c.benchmark_group("client");
    group.bench_function("try_acquire", |b| {
        b.iter(|| black_box(client.try_acquire("tenant-a", "GET /route/17", 1)))
    });
    let handle = client.key("tenant-a", "GET /route/17");
    group.bench_function("key_handle_try_acquire", |b| {
        b.iter(|| black_box(handle.try_acquire(1)))
    });
    group.finish();
}

criterion_group!(benches, decision);
criterion_main!(benches);

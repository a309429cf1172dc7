//! `try_acquire` allocates nothing once a pair has been seen: through the map (hash, lookup)
//! and through a `KeyHandle`, allowed and refused. Counted with a global allocator that
//! tallies this thread's allocations (the refill task runs on other threads).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use weir_client::{Client, FailurePolicy};

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
fn decisions_allocate_nothing_once_a_pair_is_known() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    // No fleet at this address: the budgets are filled by hand.
    let client = Client::builder("http://127.0.0.1:1")
        .failure_policy(FailurePolicy::Closed)
        .build()
        .unwrap();
    for index in 0..100 {
        client.fill_for_bench("t", &format!("key {index}"), 1_000);
    }
    client.fill_for_bench("t", "small", 3);
    let handle = client.key("t", "key 7");
    // Warm: the first decisions may grow thread-locals of the map's epoch reclamation.
    for _ in 0..10 {
        client.try_acquire("t", "key 5", 1);
        handle.try_acquire(1);
    }
    let mut allowed = 0;
    let count = allocations_during(|| {
        for _ in 0..500 {
            allowed += u64::from(client.try_acquire("t", "key 5", 1).allowed);
            allowed += u64::from(handle.try_acquire(1).allowed);
        }
        for _ in 0..10 {
            // Three allowed, then refusals.
            allowed += u64::from(client.try_acquire("t", "small", 1).allowed);
        }
    });
    assert_eq!(allowed, 1_003, "the decisions happened");
    assert_eq!(count, 0, "allocations on the decision path");
}

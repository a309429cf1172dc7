//! Fuzz target: `weir::fuzzing::otlp_scan` (see its documentation for the property).
/// An allocation over `weir::fuzzing::MAX_ALLOCATION` aborts: a crash to the fuzzer.
#[global_allocator]
static ALLOCATOR: weir::fuzzing::CappedAllocator = weir::fuzzing::CappedAllocator::new(true);

fn main() {
    afl::fuzz!(|data: &[u8]| {
        weir::fuzzing::otlp_scan(data);
    });
}

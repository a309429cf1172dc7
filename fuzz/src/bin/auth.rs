//! Fuzz target: `weir::fuzzing::auth`, tenant authentication's parsers (the `Authorization`
//! header and the credentials file; see the property).
/// An allocation over `weir::fuzzing::MAX_ALLOCATION` aborts: a crash to the fuzzer.
#[global_allocator]
static ALLOCATOR: weir::fuzzing::CappedAllocator = weir::fuzzing::CappedAllocator::new(true);

fn main() {
    afl::fuzz!(|data: &[u8]| {
        weir::fuzzing::auth(data);
    });
}

//! Fuzz target: `ring::auth::fuzz_open`, the encrypted gossip frame as a socket receives it
//! (see its documentation for the property). Hardly anything the fuzzer writes opens (it
//! would have to forge a Poly1305 tag), so this exercises the refusals: short frames, other
//! format bytes, wrong tags, an older weir's HMAC frames.
/// An allocation over `weir::fuzzing::MAX_ALLOCATION` aborts: a crash to the fuzzer.
#[global_allocator]
static ALLOCATOR: weir::fuzzing::CappedAllocator = weir::fuzzing::CappedAllocator::new(true);

fn main() {
    afl::fuzz!(|data: &[u8]| {
        ring::auth::fuzz_open(data);
    });
}

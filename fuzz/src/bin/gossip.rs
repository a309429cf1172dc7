//! Fuzz target: `weir::fuzzing::gossip` (see its documentation for the property).
fn main() {
    afl::fuzz!(|data: &[u8]| {
        weir::fuzzing::gossip(data);
    });
}

//! Fuzz target: `weir::fuzzing::tenant` (see its documentation for the property).
fn main() {
    afl::fuzz!(|data: &[u8]| {
        weir::fuzzing::tenant(data);
    });
}

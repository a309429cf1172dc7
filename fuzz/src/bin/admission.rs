//! Fuzz target: `weir::fuzzing::admission` (see its documentation for the property).
fn main() {
    afl::fuzz!(|data: &[u8]| {
        weir::fuzzing::admission(data);
    });
}

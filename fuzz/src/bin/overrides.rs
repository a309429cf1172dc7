//! Fuzz target: `weir::fuzzing::overrides` (see its documentation for the property).
fn main() {
    afl::fuzz!(|data: &[u8]| {
        weir::fuzzing::overrides(data);
    });
}

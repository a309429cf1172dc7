//! Fuzz target: `weir::fuzzing::snappy` (see its documentation for the property).
fn main() {
    afl::fuzz!(|data: &[u8]| {
        weir::fuzzing::snappy(data);
    });
}

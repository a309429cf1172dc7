//! Fuzz target: `weir::fuzzing::remote_write_v1` (see its documentation for the property).
fn main() {
    afl::fuzz!(|data: &[u8]| {
        weir::fuzzing::remote_write_v1(data);
    });
}

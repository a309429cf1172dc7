//! Fuzz target: `weir::fuzzing::remote_write_v2` (see its documentation for the property).
fn main() {
    afl::fuzz!(|data: &[u8]| {
        weir::fuzzing::remote_write_v2(data);
    });
}

//! Replays every committed fuzz input (`fuzz/corpus/<target>/`, the minimized queues of the
//! last `scripts/fuzz` run, and `fuzz/crashes/<target>/`, inputs that once failed and were
//! fixed) through the same property checks the fuzz targets run (`weir::fuzzing`).

use std::path::Path;

use weir::fuzzing::{CappedAllocator, MAX_ALLOCATION};

/// Keeps the largest allocation, checked after each input.
#[global_allocator]
static ALLOCATOR: CappedAllocator = CappedAllocator::new(false);

fn replay(target: &str, check: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut replayed = 0;
    for dir in [
        root.join("corpus").join(target),
        root.join("crashes").join(target),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_file() && !path.file_name().unwrap().to_string_lossy().starts_with('.') {
                let data = std::fs::read(&path).unwrap();
                let outcome = std::panic::catch_unwind(|| check(&data));
                assert!(
                    outcome.is_ok(),
                    "{target}: {} fails its property",
                    path.display()
                );
                // Tests run in parallel, so this is the largest of any input so far: a bound
                // for all of them.
                assert!(
                    ALLOCATOR.largest() <= MAX_ALLOCATION,
                    "{target}: an allocation of {} bytes by {} or an input before it",
                    ALLOCATOR.largest(),
                    path.display()
                );
                replayed += 1;
            }
        }
    }
    assert!(replayed > 0, "{target}: no committed corpus");
    eprintln!(
        "{target}: {replayed} inputs replayed; largest allocation so far {} bytes",
        ALLOCATOR.largest()
    );
}

#[test]
fn remote_write_v1() {
    replay("remote_write_v1", weir::fuzzing::remote_write_v1);
}

#[test]
fn remote_write_v2() {
    replay("remote_write_v2", weir::fuzzing::remote_write_v2);
}

#[test]
fn snappy() {
    replay("snappy", weir::fuzzing::snappy);
}

#[test]
fn overrides() {
    replay("overrides", weir::fuzzing::overrides);
}

#[test]
fn tenant() {
    replay("tenant", weir::fuzzing::tenant);
}

#[test]
fn gossip() {
    replay("gossip", weir::fuzzing::gossip);
}

#[test]
fn usage_report() {
    replay("usage_report", weir::fuzzing::usage_report);
}

#[test]
fn admission() {
    replay("admission", weir::fuzzing::admission);
}

#[test]
fn gossip_frame() {
    replay("gossip_frame", ring::auth::fuzz_open);
}

#[test]
fn auth() {
    replay("auth", weir::fuzzing::auth);
}

#[test]
fn otlp_scan() {
    replay("otlp_scan", weir::fuzzing::otlp_scan);
}

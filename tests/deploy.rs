//! The Kubernetes manifests (`deploy/kubernetes/`) pass `scripts/validate-manifests`: strict
//! schema validation against Kubernetes' own schemas (kubernetes-validate, offline), the
//! kustomization's file list, the Deployment's flags against this build's `weir --help`, and
//! the ConfigMap's overrides loaded by this build. A copy with a misspelt field must fail, so
//! the check is known to bite.

use std::path::Path;
use std::process::Command;

fn validate(dir: &Path) -> (bool, String) {
    let output = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/validate-manifests"
    ))
    .arg(dir)
    .env("WEIR_BIN", env!("CARGO_BIN_EXE_weir"))
    .output()
    .expect("scripts/validate-manifests runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[test]
fn the_manifests_are_valid_and_a_broken_copy_is_not() {
    let manifests = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes");
    let (ok, text) = validate(&manifests);
    assert!(ok, "{text}");
    assert!(text.contains("ok"), "{text}");

    let broken = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&manifests).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, broken.path().join(path.file_name().unwrap())).unwrap();
    }
    let deployment = broken.path().join("deployment.yaml");
    let text = std::fs::read_to_string(&deployment).unwrap();
    assert!(text.contains("readinessProbe:"));
    std::fs::write(
        &deployment,
        text.replace("readinessProbe:", "readinessProbes:"),
    )
    .unwrap();
    let (ok, text) = validate(broken.path());
    assert!(!ok, "a misspelt field must fail validation:\n{text}");
    assert!(text.contains("readinessProbes"), "{text}");
}

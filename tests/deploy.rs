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

fn manifest(name: &str) -> serde_yaml_ng::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/kubernetes")
        .join(name);
    serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// The Deployment authenticates tenants with tokens (`--tenant-auth=tokens`), from a
/// credentials file that is the key of the example Secret, mounted by directory (so an
/// edited Secret reaches weir, which reloads it) where `--auth-credentials-file` points. The
/// example Secret is not applied by kustomize; as it is, weir refuses it (placeholders, not
/// digests), and with real digests in their place it is a credentials file weir loads.
#[test]
fn the_deployment_authenticates_tenants_from_the_mounted_credentials_secret() {
    let deployment = manifest("deployment.yaml");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|arg| arg.as_str().unwrap())
        .collect();
    let flag = |name: &str| -> Vec<&str> {
        args.iter()
            .filter_map(|arg| arg.strip_prefix(&format!("{name}=")[..]))
            .collect()
    };
    assert_eq!(flag("--tenant-auth"), ["tokens"], "{args:?}");
    let file = flag("--auth-credentials-file");
    assert_eq!(file.len(), 1, "{args:?}");
    let file = Path::new(file[0]);
    let (dir, key) = (
        file.parent().unwrap().to_str().unwrap(),
        file.file_name().unwrap().to_str().unwrap(),
    );

    let secret = manifest("auth-credentials.example.yaml");
    assert_eq!(secret["kind"], "Secret");
    let secret_name = secret["metadata"]["name"].as_str().unwrap();
    let mount = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|mount| mount["mountPath"] == dir)
        .unwrap_or_else(|| panic!("no volume is mounted at {dir}"));
    assert!(
        mount.get("subPath").is_none(),
        "a subPath mount gets no Secret updates"
    );
    let volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|volume| volume["name"] == mount["name"])
        .unwrap();
    assert_eq!(
        volume["secret"]["secretName"], secret_name,
        "{dir} must be the Secret {secret_name}"
    );
    // Readable by the image's user through fsGroup, as the gossip Secret is (0440, which
    // Kubernetes' YAML 1.1 reads as octal).
    let gossip = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|volume| volume["name"] == "gossip-secret")
        .unwrap();
    assert_eq!(
        volume["secret"]["defaultMode"],
        gossip["secret"]["defaultMode"]
    );
    assert_eq!(pod["securityContext"]["fsGroup"], 10001);

    let kustomization = manifest("kustomization.yaml");
    let resources = kustomization["resources"].as_sequence().unwrap();
    assert!(resources.contains(&"deployment.yaml".into()));
    assert!(
        !resources.contains(&"auth-credentials.example.yaml".into()),
        "the example Secret must never be applied as it is"
    );

    let example = secret["stringData"][key]
        .as_str()
        .unwrap_or_else(|| panic!("the Secret has no key {key}"));
    let refused = weir::auth::Credentials::parse(example).unwrap_err();
    assert!(refused.contains("64 hex digits"), "{refused}");
    let placeholders: Vec<&str> = example
        .split_whitespace()
        .filter(|word| word.starts_with("PLACEHOLDER-"))
        .collect();
    assert_eq!(placeholders.len(), 3, "{example}");
    let mut real = example.to_string();
    for (index, placeholder) in placeholders.iter().enumerate() {
        let digest = weir::auth::secret_digest(&format!("token-{index}"));
        real = real.replace(placeholder, &digest);
    }
    let credentials = weir::auth::Credentials::parse(&real).unwrap();
    assert_eq!(credentials.len(), 3);
}

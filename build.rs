//! Generates Rust types for the protobuf contracts in `proto/` with prost and tonic, compiled
//! by protox (pure Rust): no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let messages = [
        "proto/prometheus/write/v2/types.proto",
        "proto/opentelemetry/proto/collector/metrics/v1/metrics_service.proto",
    ];
    let services = [
        "proto/weir/admission/v1/admission.proto",
        "proto/envoy/service/ratelimit/v3/rls.proto",
    ];
    println!("cargo:rerun-if-changed=proto");
    prost_build::Config::new().compile_fds(protox::compile(messages, ["proto"])?)?;
    tonic_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(protox::compile(services, ["proto"])?)?;
    Ok(())
}

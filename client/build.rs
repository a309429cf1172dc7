//! The admission API's client types, generated from the contract the server compiles
//! (`../proto/weir/admission/v1/admission.proto`) by protox: no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../proto/weir/admission/v1/admission.proto");
    tonic_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(protox::compile(
            ["weir/admission/v1/admission.proto"],
            ["../proto"],
        )?)?;
    Ok(())
}

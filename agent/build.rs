//! Generate the kas protobuf types and gRPC stubs (needs `protoc`, Debian
//! `protobuf-compiler`, which the README's commands install).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/kas.proto");
    println!("cargo:rerun-if-changed=proto/kubernetes_api.proto");
    println!("cargo:rerun-if-changed=proto/gitlab_access.proto");
    tonic_prost_build::configure().compile_protos(
        &[
            "proto/kas.proto",
            "proto/kubernetes_api.proto",
            "proto/gitlab_access.proto",
        ],
        &["proto"],
    )?;
    Ok(())
}

//! Generate the Topology Service's types, server and client stubs from podgate's
//! transcription of GitLab's schema (`proto/`, GitLab's paths and packages;
//! `scripts/check-topology-protos.sh` compares it with GitLab's descriptors), and
//! gRPC's health service. Also write the descriptor set protoc makes of them
//! (`OUT_DIR/topology.bin`), which a test compares with GitLab's descriptors' digests.
//! Needs `protoc` (Debian `protobuf-compiler`, which the README's commands install).

const PROTOS: &[&str] = &[
    "proto/proto/classify_service.proto",
    "proto/proto/cell_service.proto",
    "proto/proto/claims/v1/service.proto",
    "proto/grpc/health/v1/health.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .include_file("_includes.rs")
        .build_transport(false)
        // `ClassifyRequest` with GitLab's retired field 4 (`claim`), which
        // gitlab-shell still sends: `src/classify.rs`.
        .extern_path(
            ".gitlab.cells.topology_service.ClassifyRequest",
            "crate::classify::ClassifyRequest",
        )
        .file_descriptor_set_path(out.join("topology.bin"))
        .compile_protos(PROTOS, &["proto"])?;
    Ok(())
}

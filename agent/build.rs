//! Generate the protobuf types and gRPC stubs (needs `protoc`, Debian
//! `protobuf-compiler`, which the README's commands install): GitLab's agent wire
//! (`proto/gitlab/`, `proto/kubernetes_api.proto`, `proto/gitlab_access.proto`,
//! `proto/google/rpc/status.proto`) and podgate's own (`proto/kas.proto`), one
//! module per protobuf package (`_includes.rs`).

const PROTOS: &[&str] = &[
    "proto/kas.proto",
    "proto/kubernetes_api.proto",
    "proto/gitlab_access.proto",
    "proto/google/rpc/status.proto",
    "proto/gitlab/entity.proto",
    "proto/gitlab/prototool.proto",
    "proto/gitlab/grpctool.proto",
    "proto/gitlab/agentcfg.proto",
    "proto/gitlab/agent_configuration.proto",
    "proto/gitlab/agent_registrar.proto",
    "proto/gitlab/reverse_tunnel_info.proto",
    "proto/gitlab/reverse_tunnel.proto",
    "proto/gitlab/agent_tracker.proto",
    "proto/gitlab/agent_tracker_rpc.proto",
    "proto/gitlab/event.proto",
    "proto/gitlab/notifications.proto",
    "proto/gitlab/job_router.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .include_file("_includes.rs")
        // No `XClient::connect(url)` constructors: GitLab's `ReverseTunnel` has a
        // method of that name. Clients are built on a `Channel`.
        .build_transport(false)
        // Small per-stream buffers: see `src/codec.rs`.
        .codec_path("crate::codec::Small")
        .compile_protos(PROTOS, &["proto"])?;

    Ok(())
}

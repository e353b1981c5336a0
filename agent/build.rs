//! Generate the protobuf types and gRPC stubs (needs `protoc`, Debian
//! `protobuf-compiler`, which the README's commands install): GitLab's agent wire
//! (`proto/gitlab/`, `proto/kubernetes_api.proto`, `proto/gitlab_access.proto`,
//! `proto/google/rpc/status.proto`) and podgate's own (`proto/kas.proto`), one
//! module per protobuf package (`_includes.rs`); and, for the integration tests
//! only, the tests' own transcription of GitLab's protobufs
//! (`tests/gitlab_wire/proto/`, the same packages) into a separate module tree
//! (`gitlab_reference/gitlab_reference.rs`), which the crate itself never includes.

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

/// GitLab's protobufs as the tests transcribed them, GitLab's paths under
/// `tests/gitlab_wire/proto/` (`scripts/check-gitlab-protos.sh` compares them with
/// GitLab's files).
const GITLAB_REFERENCE_PROTOS: &[&str] = &[
    "tests/gitlab_wire/proto/google/rpc/status.proto",
    "tests/gitlab_wire/proto/pkg/entity/entity.proto",
    "tests/gitlab_wire/proto/pkg/event/event.proto",
    "tests/gitlab_wire/proto/pkg/agentcfg/agentcfg.proto",
    "tests/gitlab_wire/proto/internal/tool/prototool/prototool.proto",
    "tests/gitlab_wire/proto/internal/tool/grpctool/grpctool.proto",
    "tests/gitlab_wire/proto/internal/module/agent_configuration/rpc/rpc.proto",
    "tests/gitlab_wire/proto/internal/module/agent_registrar/rpc/rpc.proto",
    "tests/gitlab_wire/proto/internal/module/reverse_tunnel/info/info.proto",
    "tests/gitlab_wire/proto/internal/module/reverse_tunnel/rpc/rpc.proto",
    "tests/gitlab_wire/proto/internal/module/kubernetes_api/rpc/rpc.proto",
    "tests/gitlab_wire/proto/internal/module/gitlab_access/rpc/rpc.proto",
    "tests/gitlab_wire/proto/internal/module/agent_tracker/agent_tracker.proto",
    "tests/gitlab_wire/proto/internal/module/agent_tracker/rpc/rpc.proto",
    "tests/gitlab_wire/proto/internal/module/notifications/rpc/rpc.proto",
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

    // Only where the tests are (the product build of a trimmed tree needs none).
    if std::path::Path::new("tests/gitlab_wire/proto").is_dir() {
        println!("cargo:rerun-if-changed=tests/gitlab_wire/proto");
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("gitlab_reference");
        std::fs::create_dir_all(&out)?;
        tonic_prost_build::configure()
            .out_dir(&out)
            .include_file("gitlab_reference.rs")
            .build_transport(false)
            .compile_protos(GITLAB_REFERENCE_PROTOS, &["tests/gitlab_wire/proto"])?;
    }
    Ok(())
}

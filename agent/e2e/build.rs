//! Generate the tests' own transcription of GitLab's protobufs
//! (`tests/gitlab_wire/proto/`, GitLab's paths and packages) into a module tree of
//! its own (`OUT_DIR/gitlab_reference/gitlab_reference.rs`), apart from podgate's
//! (`podgate-agent`'s `build.rs`); only the integration test binary includes it.
//! Needs `protoc` (Debian `protobuf-compiler`, which the README's commands install).

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
    println!("cargo:rerun-if-changed=tests/gitlab_wire/proto");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("gitlab_reference");
    std::fs::create_dir_all(&out)?;
    tonic_prost_build::configure()
        .out_dir(&out)
        .include_file("gitlab_reference.rs")
        .build_transport(false)
        .compile_protos(GITLAB_REFERENCE_PROTOS, &["tests/gitlab_wire/proto"])?;
    Ok(())
}

//! GitLab's agent wire, tested from GitLab's side: the tests' own transcription of
//! GitLab 16.5's protobufs ([`proto`], from `proto/` beside this file, GitLab's
//! paths and packages), generated apart from podgate's (`agent/build.rs` writes them
//! to `OUT_DIR/gitlab_reference/`, which only this test binary includes), and
//! GitLab-shaped peers written from GitLab's Go source on those types only, sharing
//! no code with podgate's kas or agentk.
//!
//! - [`golden`]: every message podgate speaks encodes alike in both type trees; `Any`
//!   type URLs and gRPC method paths agree.
//! - [`agentk`]: a GitLab-shaped agentk (configuration, registration, reverse
//!   tunnels serving `KubernetesApi/MakeRequest`), over h2c or WebSocket, gzip on.
//! - [`kas`]: a GitLab-shaped kas (configuration, registration, tunnels by
//!   descriptor, a `MakeRequest` through a tunnel).
//! - [`rails`]: Rails' `AgentTracker/GetConnectedAgents` client and its JWT.
//! - [`grpctool`]: GitLab's HTTP-over-gRPC framing and token credentials, shared by
//!   the peers above; [`grpc2http`]: the agent's side of `MakeRequest` (HTTP and
//!   upgrades); [`peers`]: dialling kas as agentk does (h2c, WebSocket).
//! - `tests`, `rails_tests`: the GitLab-shaped peers against each other, and the
//!   Rails client against a kas stand-in that checks its JWT.
//! - `podgate_kubectl`: the installed kubectl through podgate's proxy and kas to the
//!   GitLab-shaped agentk (h2c and WebSocket). `podgate_e2e`: the GitLab-shaped
//!   agentk against podgate's kas (configuration, registration, Rails' listing
//!   through a second kas) and podgate's agentk against the GitLab-shaped kas.
//!
//! Source: GitLab's agent, github.com/pluralsh/kubernetes-agent at
//! `e02ad05f88598c93c414c52dd4a89e58a75adb4a` (GitLab 16.5, MIT licence);
//! `scripts/check-gitlab-protos.sh` compares the transcription with its files.

pub mod agentk;
mod fixtures;
mod golden;
pub mod grpc2http;
pub mod grpctool;
pub mod kas;
mod peers;
mod podgate_e2e;
mod podgate_kubectl;
pub mod rails;
mod rails_tests;
mod tests;

/// The tests' transcription of GitLab's protobufs, one module per package.
#[allow(
    dead_code,
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic
)]
pub mod proto {
    include!(concat!(
        env!("OUT_DIR"),
        "/gitlab_reference/gitlab_reference.rs"
    ));
}

/// The protobuf full name of a message, for `Any` type URLs.
pub trait FullName {
    /// `package.Message`.
    const FULL_NAME: &'static str;
}

impl FullName for proto::gitlab::agent::kubernetes_api::rpc::HeaderExtra {
    const FULL_NAME: &'static str = "gitlab.agent.kubernetes_api.rpc.HeaderExtra";
}

impl FullName for proto::gitlab::agent::event::GitPushEvent {
    const FULL_NAME: &'static str = "gitlab.agent.event.GitPushEvent";
}

impl FullName for proto::gitlab::agent::gitlab_access::rpc::HeaderExtra {
    const FULL_NAME: &'static str = "gitlab.agent.gitlab_access.rpc.HeaderExtra";
}

/// `msg` packed as Go's `anypb.New` packs it: `type.googleapis.com/` and the full
/// name (google.golang.org/protobuf `types/known/anypb`, `MarshalFrom`).
pub fn any<M: prost::Message + FullName>(msg: &M) -> prost_types::Any {
    prost_types::Any {
        type_url: format!("type.googleapis.com/{}", M::FULL_NAME),
        value: msg.encode_to_vec(),
    }
}

//! The protobuf types and gRPC stubs, one module per protobuf package
//! (`agent/proto/`):
//!
//! - GitLab's agent wire, under [`gitlab::agent`] (GitLab 16.5's packages, names and
//!   field numbers: `entity`, `prototool`, `grpctool`, `agentcfg`,
//!   `agent_configuration::rpc`, `agent_registrar::rpc`, `reverse_tunnel::{rpc,
//!   info}`, `kubernetes_api::rpc`, `gitlab_access::rpc`, `agent_tracker::{self,
//!   rpc}`, `notifications::rpc`, `event`), GitLab's Job Router
//!   (`job_router::rpc`, as gitlab-runner's `router/rpc/rpc.proto` declares it), and
//!   [`google::rpc::Status`];
//! - podgate's own, `podgate.kas.v1` (re-exported here): `KasApi`, `KasInternal`,
//!   and the agent services GitLab's wire replaces.
//!
//! [`kubernetes_api`] and [`gitlab_access`] name GitLab's two modules podgate's
//! code uses most.
#![allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]

include!(concat!(env!("OUT_DIR"), "/_includes.rs"));

pub use podgate::kas::v1::*;

/// `gitlab.agent.kubernetes_api.rpc`: `MakeRequest` and `WatchGraph` messages.
pub use gitlab::agent::kubernetes_api::rpc as kubernetes_api;

/// `gitlab.agent.gitlab_access.rpc`: `GitlabAccess.MakeRequest`, HTTP over a gRPC
/// stream (`grpctool.HttpRequest` / `HttpResponse`) with [`gitlab_access::HeaderExtra`]
/// packed in the header's `Any` (GitLab's
/// `internal/module/gitlab_access/rpc/rpc.proto`).
pub use gitlab::agent::gitlab_access::rpc as gitlab_access;

//! Generated from `agent/proto/kas.proto`: messages and the `KasApi` / `KasInternal`
//! clients and servers; and from `agent/proto/kubernetes_api.proto`: the
//! Kubernetes API proxy and Graph API messages ([`kubernetes_api`]); and from
//! `agent/proto/gitlab_access.proto`: modules' requests to GitLab through kas
//! ([`gitlab_access`]).
#![allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]

tonic::include_proto!("podgate.kas.v1");

/// `gitlab.agent.kubernetes_api.rpc`: `MakeRequest` and `WatchGraph` messages.
pub mod kubernetes_api {
    tonic::include_proto!("gitlab.agent.kubernetes_api.rpc");
}

/// `gitlab.agent.gitlab_access.rpc`: `GitlabAccess.MakeRequest`, HTTP over a gRPC
/// stream (GitLab's `internal/module/gitlab_access/rpc/rpc.proto`).
pub mod gitlab_access {
    tonic::include_proto!("gitlab.agent.gitlab_access.rpc");
}

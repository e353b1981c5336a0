//! Generated from `agent/proto/kas.proto`: messages and the `KasApi` / `KasInternal`
//! clients and servers; and from `agent/proto/kubernetes_api.proto`: the
//! Kubernetes API proxy and Graph API messages ([`kubernetes_api`]).
#![allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]

tonic::include_proto!("podgate.kas.v1");

/// `gitlab.agent.kubernetes_api.rpc`: `MakeRequest` and `WatchGraph` messages.
pub mod kubernetes_api {
    tonic::include_proto!("gitlab.agent.kubernetes_api.rpc");
}

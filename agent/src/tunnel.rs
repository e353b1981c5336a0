//! What kas and agentk agree on for GitLab's reverse tunnel
//! (`gitlab.agent.reverse_tunnel.rpc.ReverseTunnel/Connect`): the full method names
//! podgate's agentk serves, the `Descriptor` that advertises them, how a descriptor
//! is checked and asked whether it serves a method, and gRPC metadata as the
//! tunnel's `map<string, prototool.Values>`.
//!
//! GitLab's sources: the wire in `internal/module/reverse_tunnel/rpc/rpc.proto`
//! (<https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/reverse_tunnel/rpc/rpc.proto>),
//! the method lookup in `internal/module/reverse_tunnel/info/info.extra_methods.go`
//! (<https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/reverse_tunnel/info/info.extra_methods.go>),
//! metadata in `internal/tool/grpctool/tools.go` (`MetaToValuesMap`, `ValuesMapToMeta`,
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/tool/grpctool/tools.go>).

use std::collections::HashMap;

use thiserror::Error;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, KeyAndValueRef, MetadataMap};

use crate::proto::gitlab::agent::prototool::Values;
use crate::proto::gitlab::agent::reverse_tunnel::info::{AgentDescriptor, Method, Service};

/// GitLab's Kubernetes API module service (`MakeRequest`, and podgate's `WatchGraph`).
pub const KUBERNETES_API: &str = "gitlab.agent.kubernetes_api.rpc.KubernetesApi";
/// `KubernetesApi/MakeRequest`: a Kubernetes API request.
pub const MAKE_REQUEST: &str = "/gitlab.agent.kubernetes_api.rpc.KubernetesApi/MakeRequest";
/// `KubernetesApi/WatchGraph`: a Graph API watch (podgate's method of that service).
pub const WATCH_GRAPH: &str = "/gitlab.agent.kubernetes_api.rpc.KubernetesApi/WatchGraph";
/// podgate's pod listing service.
pub const AGENT_PODS: &str = "podgate.kas.v1.AgentPods";
/// `AgentPods/GetPods`: the cluster's pods.
pub const GET_PODS: &str = "/podgate.kas.v1.AgentPods/GetPods";
/// podgate's Workspaces traffic service.
pub const WORKSPACE_TRAFFIC: &str = "podgate.kas.v1.WorkspaceTraffic";
/// `WorkspaceTraffic/WorkspaceRequest`: one HTTP request for a workspace.
pub const WORKSPACE_REQUEST: &str = "/podgate.kas.v1.WorkspaceTraffic/WorkspaceRequest";

/// Request metadata on `Connect` naming the agentk connection a tunnel belongs to
/// (podgate's agentk sends it; GitLab's does not, and its tunnels serve calls for
/// any replica).
pub const CONNECTION_ID_KEY: &str = "podgate-connection-id";

/// A bad method name or descriptor. Not retryable: the sender must change it.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    /// A method name is not `/<service>/<method>`.
    #[error("method name {0:?} is not /<service>/<method>")]
    MethodName(String),
    /// A descriptor's service or method has an empty name.
    #[error("the agent descriptor names a service or method with an empty name")]
    EmptyName,
}

/// `/<service>/<method>` split into its two names.
pub fn split_method(full: &str) -> Result<(&str, &str), Error> {
    let bad = || Error::MethodName(full.to_owned());
    let rest = full.strip_prefix('/').ok_or_else(bad)?;
    let (service, method) = rest.split_once('/').ok_or_else(bad)?;
    if service.is_empty() || method.is_empty() || method.contains('/') {
        return Err(bad());
    }
    Ok((service, method))
}

/// A descriptor advertising the methods named (`/<service>/<method>` each).
pub fn descriptor(methods: &[&str]) -> Result<AgentDescriptor, Error> {
    let mut services: Vec<Service> = Vec::new();
    for full in methods {
        let (service, method) = split_method(full)?;
        let method = Method {
            name: method.to_owned(),
        };
        match services.iter_mut().find(|s| s.name == service) {
            Some(s) => s.methods.push(method),
            None => services.push(Service {
                name: service.to_owned(),
                methods: vec![method],
            }),
        }
    }
    Ok(AgentDescriptor { services })
}

/// Every method podgate's agentk serves.
pub const AGENTK_METHODS: &[&str] = &[MAKE_REQUEST, WATCH_GRAPH, GET_PODS, WORKSPACE_REQUEST];

/// The descriptor of [`AGENTK_METHODS`].
pub fn agentk_descriptor() -> AgentDescriptor {
    descriptor(AGENTK_METHODS).unwrap_or_default()
}

/// Checks a descriptor as GitLab's generated validation does (`info.proto`: every
/// service and method name non-empty).
pub fn validate_descriptor(d: &AgentDescriptor) -> Result<(), Error> {
    let empty = d
        .services
        .iter()
        .any(|s| s.name.is_empty() || s.methods.iter().any(|m| m.name.is_empty()));
    if empty { Err(Error::EmptyName) } else { Ok(()) }
}

/// Whether `d` advertises `/<service>/<method>` `full`: the first service of that
/// name decides, as GitLab's `SupportsServiceAndMethod` does.
pub fn supports(d: &AgentDescriptor, full: &str) -> bool {
    let Ok((service, method)) = split_method(full) else {
        return false;
    };
    d.services
        .iter()
        .find(|s| s.name == service)
        .is_some_and(|s| s.methods.iter().any(|m| m.name == method))
}

/// The tunnel's form of gRPC metadata: ASCII entries by key. Binary (`-bin`)
/// entries are left out: the protobuf field is a UTF-8 string.
pub fn meta_to_values(md: &MetadataMap) -> HashMap<String, Values> {
    let mut out: HashMap<String, Values> = HashMap::new();
    for kv in md.iter() {
        if let KeyAndValueRef::Ascii(k, v) = kv
            && let Ok(v) = v.to_str()
        {
            out.entry(k.as_str().to_owned())
                .or_default()
                .value
                .push(v.to_owned());
        }
    }
    out
}

/// gRPC metadata from the tunnel's form; entries that are not valid metadata
/// (a key gRPC reserves, bad characters) are left out.
pub fn values_to_meta(values: &HashMap<String, Values>) -> MetadataMap {
    let mut md = MetadataMap::new();
    for (k, vs) in values {
        let Ok(key) = k.parse::<AsciiMetadataKey>() else {
            continue;
        };
        if k.starts_with("grpc-") || k.starts_with(':') {
            continue;
        }
        for v in &vs.value {
            if let Ok(v) = v.parse::<AsciiMetadataValue>() {
                md.append(key.clone(), v);
            }
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_names_split_and_descriptors_answer() {
        assert_eq!(
            split_method(GET_PODS),
            Ok(("podgate.kas.v1.AgentPods", "GetPods"))
        );
        for bad in ["GetPods", "/svc", "//m", "/svc/", "/a/b/c"] {
            assert!(split_method(bad).is_err(), "{bad}");
        }
        let d = descriptor(&[MAKE_REQUEST, GET_PODS]).unwrap();
        assert_eq!(d.services.len(), 2);
        assert!(supports(&d, MAKE_REQUEST));
        assert!(supports(&d, GET_PODS));
        assert!(!supports(&d, WATCH_GRAPH));
        assert!(!supports(&d, "MakeRequest"));
        let full = agentk_descriptor();
        assert_eq!(full.services[0].name, KUBERNETES_API);
        assert_eq!(full.services[0].methods.len(), 2);
        assert!(AGENTK_METHODS.iter().all(|m| supports(&full, m)));
    }

    #[test]
    fn descriptors_with_empty_names_are_invalid() {
        assert_eq!(validate_descriptor(&agentk_descriptor()), Ok(()));
        let mut d = agentk_descriptor();
        d.services[1].methods[0].name.clear();
        assert_eq!(validate_descriptor(&d), Err(Error::EmptyName));
    }

    #[test]
    fn metadata_round_trips_through_values() {
        let mut md = MetadataMap::new();
        md.insert("x-a", "1".parse().unwrap());
        md.append("x-a", "2".parse().unwrap());
        md.insert_bin(
            "x-b-bin",
            tonic::metadata::MetadataValue::from_bytes(b"\xff"),
        );
        let values = meta_to_values(&md);
        assert_eq!(values["x-a"].value, ["1", "2"]);
        assert!(!values.contains_key("x-b-bin"));
        let mut with_reserved = values.clone();
        with_reserved.insert(
            "grpc-status".into(),
            Values {
                value: vec!["0".into()],
            },
        );
        let back = values_to_meta(&with_reserved);
        let a: Vec<_> = back.get_all("x-a").iter().collect();
        assert_eq!(a, ["1", "2"]);
        assert!(back.get("grpc-status").is_none());
    }
}

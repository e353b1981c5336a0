//! The NetworkPolicy and ResourceQuota Rails appends (`devfile_resource_appender.rb`'s
//! `append_network_policy` and `append_resource_quota`).

use serde_json::{Value, json};

use super::context::Context;
use super::{ANNOTATION_OWNING_INVENTORY, WORKSPACE_ID_KEY};

impl Context<'_> {
    /// `append_network_policy`: ingress from the workspaces proxy's pods, egress to
    /// kube-system DNS and the agent's CIDR rules; in a shared namespace only this
    /// workspace's pods are selected.
    pub(super) fn network_policy(&self) -> Value {
        let mut egress = vec![json!({
            "ports": [{"port": 53, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}],
            "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}],
        })];
        for rule in &self.agent.network_policy_egress {
            egress.push(json!({"to": [{"ipBlock": {"cidr": rule.allow, "except": rule.except}}]}));
        }
        let pod_selector = match self.labels.get(WORKSPACE_ID_KEY) {
            Some(id) => json!({"matchLabels": {WORKSPACE_ID_KEY: id}}),
            None => json!({}),
        };
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": self.metadata(&self.ws.name, &self.workspace_partial_annotations()),
            "spec": {
                "egress": egress,
                "ingress": [{"from": [{
                    "namespaceSelector": {"matchLabels": {
                        "kubernetes.io/metadata.name": self.agent.gitlab_workspaces_proxy_namespace,
                    }},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "gitlab-workspaces-proxy"}},
                }]}],
                "podSelector": pod_selector,
                "policyTypes": ["Ingress", "Egress"],
            },
        })
    }

    /// `append_resource_quota`: only with `max_resources_per_workspace` set and a
    /// namespace of its own. (Rails requires limits and requests of cpu and memory;
    /// a missing one is written as null here.)
    pub(super) fn resource_quota(&self) -> Option<Value> {
        let max = &self.agent.max_resources_per_workspace;
        let set = match max {
            Value::Object(m) => !m.is_empty(),
            Value::Null => false,
            _ => true,
        };
        if !set || !self.agent.shared_namespace.is_empty() {
            return None;
        }
        let at = |p: &str| max.pointer(p).cloned().unwrap_or(Value::Null);
        let owned = self.with(
            &self.common,
            ANNOTATION_OWNING_INVENTORY,
            &self.workspace_inventory,
        );
        Some(json!({
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": self.metadata(&self.ws.name, &owned),
            "spec": {"hard": {
                "limits.cpu": at("/limits/cpu"),
                "limits.memory": at("/limits/memory"),
                "requests.cpu": at("/requests/cpu"),
                "requests.memory": at("/requests/memory"),
            }},
        }))
    }
}

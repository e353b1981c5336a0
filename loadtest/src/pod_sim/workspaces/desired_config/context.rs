//! The values every object is built from (`config_values_extractor.rb`): the
//! labels and annotations each object carries, its metadata, and the two inventory
//! ConfigMaps (`devfile_resource_appender.rb`'s `append_inventory_configmap`).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::super::model::{Workspace, WorkspacesAgentConfig};
use super::max_resources_sha256;
use super::{
    ANNOTATION_HOST_TEMPLATE, ANNOTATION_INCLUDE_IN_PARTIAL, ANNOTATION_MAX_RESOURCES_SHA256,
    ANNOTATION_OWNING_INVENTORY, LABEL_AGENT_ID, LABEL_INVENTORY_ID, SECRETS_INVENTORY_SUFFIX,
    WORKSPACE_ID_KEY, WORKSPACE_INVENTORY_SUFFIX,
};

/// The values every object is built from (`config_values_extractor.rb`).
pub(super) struct Context<'a> {
    pub(super) ws: &'a Workspace,
    pub(super) agent: &'a WorkspacesAgentConfig,
    /// Agent labels + `agent.gitlab.com/id` (+ `workspaces.gitlab.com/id` in a
    /// shared namespace).
    pub(super) labels: BTreeMap<String, String>,
    /// Agent annotations + host template, workspace id, max-resources digest.
    pub(super) common: BTreeMap<String, String>,
    pub(super) workspace_inventory: String,
    pub(super) secrets_inventory: String,
}

impl<'a> Context<'a> {
    pub(super) fn new(ws: &'a Workspace, agent: &'a WorkspacesAgentConfig) -> Context<'a> {
        let mut labels = agent.labels.clone();
        labels.insert(LABEL_AGENT_ID.into(), ws.agent_id.to_string());
        if !agent.shared_namespace.is_empty() {
            labels.insert(WORKSPACE_ID_KEY.into(), ws.id.to_string());
        }
        let mut common = agent.annotations.clone();
        common.insert(
            ANNOTATION_HOST_TEMPLATE.into(),
            format!("{{{{.port}}}}-{}.{}", ws.name, agent.dns_zone),
        );
        common.insert(WORKSPACE_ID_KEY.into(), ws.id.to_string());
        common.insert(
            ANNOTATION_MAX_RESOURCES_SHA256.into(),
            max_resources_sha256(&agent.max_resources_per_workspace),
        );
        Context {
            ws,
            agent,
            labels,
            common,
            workspace_inventory: format!("{}{WORKSPACE_INVENTORY_SUFFIX}", ws.name),
            secrets_inventory: format!("{}{SECRETS_INVENTORY_SUFFIX}", ws.name),
        }
    }

    /// `base` plus one entry.
    pub(super) fn with(
        &self,
        base: &BTreeMap<String, String>,
        k: &str,
        v: &str,
    ) -> BTreeMap<String, String> {
        let mut m = base.clone();
        m.insert(k.into(), v.into());
        m
    }

    /// `workspace_inventory_annotations_for_partial_reconciliation`: the Deployment,
    /// Service, PVC, ServiceAccount and NetworkPolicy.
    pub(super) fn workspace_partial_annotations(&self) -> BTreeMap<String, String> {
        let owned = self.with(
            &self.common,
            ANNOTATION_OWNING_INVENTORY,
            &self.workspace_inventory,
        );
        self.with(&owned, ANNOTATION_INCLUDE_IN_PARTIAL, "true")
    }

    pub(super) fn metadata(&self, name: &str, annotations: &BTreeMap<String, String>) -> Value {
        json!({
            "name": name,
            "namespace": self.ws.namespace,
            "labels": self.labels,
            "annotations": annotations,
        })
    }

    /// The devfile gem's metadata: also `creationTimestamp: null`.
    pub(super) fn devfile_metadata(
        &self,
        name: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Value {
        let mut m = self.metadata(name, annotations);
        m["creationTimestamp"] = Value::Null;
        m
    }

    /// `append_inventory_configmap`.
    pub(super) fn inventory_config_map(
        &self,
        name: &str,
        annotations: BTreeMap<String, String>,
    ) -> Value {
        let mut labels = self.labels.clone();
        labels.insert(LABEL_INVENTORY_ID.into(), name.into());
        json!({
            "kind": "ConfigMap",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": self.ws.namespace,
                "labels": labels,
                "annotations": annotations,
            },
        })
    }
}

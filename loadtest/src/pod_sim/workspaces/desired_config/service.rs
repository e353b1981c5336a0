//! The Service and PVC the devfile gem makes of the processed devfile, and the
//! ServiceAccount Rails appends (`append_image_pull_secrets_service_account`).

use serde_json::{Value, json};

use super::DATA_VOLUME_NAME;
use super::context::Context;

impl Context<'_> {
    /// The Service over the main container's ports; selects the Deployment's pods
    /// by the same labels.
    pub(super) fn service(&self) -> Value {
        let ports: Vec<Value> = self
            .ports()
            .into_iter()
            .map(|(name, port)| json!({"name": name, "port": port, "targetPort": port}))
            .collect();
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self.devfile_metadata(&self.ws.name, &self.workspace_partial_annotations()),
            "spec": {"ports": ports, "selector": self.labels},
            "status": {"loadBalancer": {}},
        })
    }

    /// The persistent volume (`<name>-gl-workspace-data`, `spec.storage`).
    pub(super) fn pvc(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": self.devfile_metadata(
                &format!("{}-{DATA_VOLUME_NAME}", self.ws.name),
                &self.workspace_partial_annotations(),
            ),
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": self.ws.spec.storage}},
            },
            "status": {},
        })
    }

    /// `append_image_pull_secrets_service_account`.
    pub(super) fn service_account(&self) -> Value {
        let pull: Vec<Value> = self
            .agent
            .image_pull_secrets
            .iter()
            .map(|s| json!({"name": s.name}))
            .collect();
        json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": self.metadata(&self.ws.name, &self.workspace_partial_annotations()),
            "automountServiceAccountToken": false,
            "imagePullSecrets": pull,
        })
    }
}

//! [`Cluster`] for [`KubeCluster`]: the apply stream, and namespaces created,
//! deleted and looked up as agentk's reconciler does.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};

use super::super::ports::Cluster;
use super::{Error, KubeCluster, is_status, message};

impl Cluster for KubeCluster {
    async fn apply(&self, config_to_apply: String) -> Result<(), Vec<String>> {
        let errors = self.apply_stream(&config_to_apply).await;
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    async fn namespace_exists(&self, name: &str) -> Result<bool, String> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        api.get_opt(name)
            .await
            .map(|n| n.is_some())
            .map_err(|e| Error::Namespace(message(&e)).to_string())
    }

    async fn create_namespace(&self, name: &str) -> Result<(), String> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            ..Namespace::default()
        };
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 409) => Ok(()),
            Err(e) => Err(Error::Namespace(message(&e)).to_string()),
        }
    }

    async fn delete_namespace(&self, name: &str) -> Result<(), String> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            // Gone, or being terminated already (kube-apiserver answers 409 `The
            // system is ensuring all content is removed from this namespace.`).
            Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(()),
            Err(e) => Err(Error::Namespace(message(&e)).to_string()),
        }
    }
}

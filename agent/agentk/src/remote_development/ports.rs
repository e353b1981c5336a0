//! The reconciler's two neighbours, as traits: GitLab (reached through kas's
//! `GitlabAccess.MakeRequest`) and the cluster (server-side apply and namespaces).
//! The real implementations are [`super::rails::KasRails`] and
//! [`super::apply::KubeCluster`]; unit tests of the reconciler use small fakes, the
//! end-to-end tests the real ones.

use std::future::Future;

use bytes::Bytes;

/// GitLab's answer to one module request: status and body, unchanged.
#[derive(Clone, Debug)]
pub struct RailsAnswer {
    /// HTTP status GitLab answered with (agentk accepts only 201).
    pub status: u16,
    /// The body.
    pub body: Bytes,
}

/// GitLab's `remote_development` module API, as agentk reaches it.
pub trait Rails: Send + Sync + 'static {
    /// `POST /reconcile` with `body` (JSON): GitLab's status and body, or why no
    /// answer came (kas unreachable, the stream broke).
    fn reconcile(&self, body: Vec<u8>) -> impl Future<Output = Result<RailsAnswer, String>> + Send;
}

/// The cluster, as the reconciler changes it.
pub trait Cluster: Send + Sync + 'static {
    /// Apply a `config_to_apply` YAML stream (server-side apply, field manager
    /// `agentk`, forced; grouped by inventory ConfigMap; objects dropped from an
    /// inventory pruned). Every error, each as one message (`Err` is never empty).
    fn apply(
        &self,
        config_to_apply: String,
    ) -> impl Future<Output = Result<(), Vec<String>>> + Send;
    /// Whether namespace `name` exists (a terminating one exists).
    fn namespace_exists(&self, name: &str) -> impl Future<Output = Result<bool, String>> + Send;
    /// Create namespace `name`; one that exists already is fine.
    fn create_namespace(&self, name: &str) -> impl Future<Output = Result<(), String>> + Send;
    /// Delete namespace `name` (cascading); one that is gone or terminating is fine.
    fn delete_namespace(&self, name: &str) -> impl Future<Output = Result<(), String>> + Send;
}

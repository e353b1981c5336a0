//! One reconciler: a watch on the agent's Deployments, the trackers, and
//! [`Reconciler::run`], one cycle, as GitLab agentk's
//! `reconciler.go`, `k8s_informer.go` and `factory.go`
//! (`internal/module/remote_development/agent/`, gitlab-agent v16).
//!
//! A cycle: snapshot the applier errors; build the agent infos (Deployments whose
//! resourceVersion GitLab has not acknowledged, termination progress of tracked
//! workspaces, unreported applier errors); `POST /reconcile` (`full` on the
//! reconciler's first successful cycle, `partial` after); require 201; then per
//! workspace GitLab answered with: record its version, drop an error GitLab has now
//! seen, delete it (desired `Terminated`) or create its namespace and apply its
//! `config_to_apply` in the background, the apply's result going to the error
//! tracker under a new version.
//!
//! Not done (GitLab 2024–2025 agentk, known only from issue text): copying
//! `image_pull_secrets` into workspace namespaces, shared-namespace mode,
//! inventory-based termination.
//!
//! Layout: the cycle here; the Deployment watch and its sources in
//! `deployments.rs`; the background applies (queued behind
//! [`MAX_CONCURRENT_APPLIES`]) in `applies.rs`; unit tests in `reconciler/tests.rs`.

mod applies;
mod deployments;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use tokio::time::Instant;

pub use self::applies::{Applies, MAX_CONCURRENT_APPLIES};
pub use self::deployments::{DeploymentSource, Deployments, KubeDeployments};
use super::body::{
    self, ErrorDetails, ReconcileRequest, ReconcileResponse, Settings, TerminationProgress,
    UpdateType, WorkspaceAgentInfo, WorkspaceRailsInfo,
};
use super::ports::{Cluster, Rails};
use super::trackers::{
    ErrorTracker, OperationState, PersistedVersions, TerminationTracker, WorkspaceKey,
};
use crate::metrics::WorkspacesMetrics;

/// The label agentk selects its workspaces' Deployments by (`factory.go`).
pub const AGENT_ID_LABEL: &str = "agent.gitlab.com/id";

/// GitLab's `desired_state`/`actual_state` value for a deleted workspace.
const TERMINATED: &str = "Terminated";

/// Why a cycle failed. The worker logs it and carries on; the next tick asks again
/// (a failed full cycle is retried as full).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No answer from GitLab (kas unreachable, the stream broke).
    #[error("error making api request: {0}")]
    Request(String),
    /// GitLab answered with another status than 201 (the body is discarded).
    #[error("unexpected status code: {0}")]
    Status(u16),
    /// The 201 body is not a `ResponsePayload`.
    #[error(transparent)]
    Body(#[from] body::Error),
    /// The Deployment watch never became ready (`k8s_informer.go`'s words).
    #[error("failed to sync informer during init: {0}")]
    Sync(String),
}

/// What a successful cycle did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CycleReport {
    /// `full` or `partial`.
    pub update_type: UpdateType,
    /// Agent infos sent.
    pub sent: usize,
    /// Workspaces GitLab answered with.
    pub received: usize,
    /// GitLab's `settings`, if it sent them.
    pub settings: Option<Settings>,
}

/// One reconciler (a full cycle builds a new one): its Deployment watch, its
/// trackers, and whether its full cycle has succeeded yet.
pub struct Reconciler<R, C> {
    rails: Arc<R>,
    cluster: Arc<C>,
    deployments: Deployments,
    persisted: PersistedVersions,
    terminations: TerminationTracker,
    errors: ErrorTracker,
    /// The last version handed to the error tracker (monotonic per reconciler).
    version: u64,
    /// Set after the first successful cycle (`hasFullSyncRunBefore`): a failed full
    /// cycle is retried as full.
    full_done: bool,
    applies: Applies,
    metrics: WorkspacesMetrics,
}

impl<R: Rails, C: Cluster> Reconciler<R, C> {
    /// A reconciler over a ready Deployment store; applies run on `applies`.
    pub fn new(
        rails: Arc<R>,
        cluster: Arc<C>,
        deployments: Deployments,
        applies: Applies,
        metrics: WorkspacesMetrics,
    ) -> Reconciler<R, C> {
        Reconciler {
            rails,
            cluster,
            deployments,
            persisted: PersistedVersions::default(),
            terminations: TerminationTracker::default(),
            errors: ErrorTracker::default(),
            version: 0,
            full_done: false,
            applies,
            metrics,
        }
    }

    /// What the next cycle will send: `full` until a cycle succeeded.
    pub fn next_update_type(&self) -> UpdateType {
        if self.full_done {
            UpdateType::Partial
        } else {
            UpdateType::Full
        }
    }

    /// The versions GitLab acknowledged.
    pub fn persisted(&self) -> &PersistedVersions {
        &self.persisted
    }

    /// Workspaces being terminated.
    pub fn terminations(&self) -> &TerminationTracker {
        &self.terminations
    }

    /// The applier-error tracker.
    pub fn errors(&self) -> &ErrorTracker {
        &self.errors
    }

    /// The Deployment store this reconciler reports from.
    pub fn deployments(&self) -> &Deployments {
        &self.deployments
    }

    /// One cycle (`reconciler.go` `Run`). Applies started by it may still be running
    /// when it returns ([`ErrorTracker::wait_idle`] waits for them).
    pub async fn run(&mut self) -> Result<CycleReport, Error> {
        let started = Instant::now();
        let update_type = self.next_update_type();
        let result = self.cycle(update_type).await;
        self.metrics
            .cycle(update_type.as_str(), result.is_ok(), started.elapsed());
        result
    }

    async fn cycle(&mut self, update_type: UpdateType) -> Result<CycleReport, Error> {
        let snapshot = self.errors.snapshot();
        let infos = self.agent_infos(&snapshot);
        let sent = infos.len();
        let body = ReconcileRequest {
            update_type,
            workspace_agent_infos: infos,
        }
        .to_json();
        self.metrics.sent.inc_by(sent as u64);
        let answer = self.rails.reconcile(body).await.map_err(Error::Request)?;
        if answer.status != 201 {
            return Err(Error::Status(answer.status));
        }
        let response = ReconcileResponse::from_json(&answer.body)?;
        tracing::debug!(
            update_type = update_type.as_str(),
            sent,
            received = response.workspace_rails_infos.len(),
            bytes = answer.body.len(),
            "workspaces: reconciled with GitLab"
        );
        for info in &response.workspace_rails_infos {
            self.version += 1;
            self.apply_workspace(info, &snapshot, self.version).await;
        }
        self.full_done = true;
        Ok(CycleReport {
            update_type,
            sent,
            received: response.workspace_rails_infos.len(),
            settings: response.settings,
        })
    }

    /// Unacknowledged Deployments, termination progress, unreported errors;
    /// one info per workspace, ordered by name then namespace.
    fn agent_infos(
        &self,
        errors: &HashMap<WorkspaceKey, OperationState>,
    ) -> Vec<WorkspaceAgentInfo> {
        let deployments = self.deployments.state();
        let in_cluster: HashSet<&str> = deployments
            .iter()
            .filter_map(|d| d.metadata.name.as_deref())
            .collect();
        let mut infos: BTreeMap<WorkspaceKey, WorkspaceAgentInfo> = BTreeMap::new();
        for d in &deployments {
            let name = d.metadata.name.as_deref().unwrap_or_default();
            let namespace = d.metadata.namespace.as_deref().unwrap_or_default();
            let version = d.metadata.resource_version.as_deref().unwrap_or_default();
            if self.persisted.is_persisted(name, version) {
                continue;
            }
            infos.insert(
                WorkspaceKey::new(name, namespace),
                WorkspaceAgentInfo {
                    name: name.to_owned(),
                    namespace: namespace.to_owned(),
                    latest_k8s_deployment_info: serde_json::to_value(&**d).ok(),
                    ..Default::default()
                },
            );
        }
        for (key, tracked) in self.terminations.iter() {
            let exists = in_cluster.contains(key.name.as_str());
            if tracked == TerminationProgress::Terminated && exists {
                tracing::warn!(
                    workspace = %key.name,
                    namespace = %key.namespace,
                    "workspaces: Terminated in the tracker but its Deployment is in the cluster"
                );
            }
            let progress = if exists {
                TerminationProgress::Terminating
            } else {
                TerminationProgress::Terminated
            };
            entry(&mut infos, key).termination_progress = Some(progress);
        }
        for (key, state) in errors {
            // An apply still running has no result to report yet.
            if let Some(error) = &state.error {
                entry(&mut infos, key).error_details = Some(ErrorDetails::applier(error.clone()));
            }
        }
        infos.into_values().collect()
    }

    /// Apply the changes for one workspace GitLab answered with
    /// (`applyWorkspaceChanges`).
    async fn apply_workspace(
        &mut self,
        info: &WorkspaceRailsInfo,
        errors: &HashMap<WorkspaceKey, OperationState>,
        version: u64,
    ) {
        self.persisted
            .record(&info.name, &info.deployment_resource_version);
        let key = WorkspaceKey::new(&info.name, &info.namespace);
        // GitLab has answered the cycle that reported this error: drop it, unless a
        // newer operation replaced it meanwhile.
        if let Some(state) = errors.get(&key)
            && state.error.is_some()
        {
            self.errors.delete_if_version(&key, state.version);
        }
        let now: Result<(), String> = if info.desired_state == TERMINATED {
            self.terminate(info).await.map_err(|e| {
                format!(
                    "error when handling terminated state for workspace {}: {e}",
                    info.name
                )
            })
        } else {
            self.ensure_namespace(&info.namespace).await
        };
        let metrics = self.metrics.clone();
        match now {
            Err(e) => {
                metrics.apply_errors.inc();
                self.errors.watch(key, version, async { vec![e] }).await;
            }
            Ok(()) if info.desired_state == TERMINATED || info.config_to_apply.is_empty() => {
                self.errors.watch(key, version, async { vec![] }).await;
            }
            Ok(()) => {
                let cluster = self.cluster.clone();
                let config = info.config_to_apply.clone();
                let name = info.name.clone();
                let limit = self.applies.limit.clone();
                let apply = async move {
                    // Never closed: a permit always comes.
                    let _permit = limit.acquire_owned().await;
                    let errors = cluster.apply(config).await.err().unwrap_or_default();
                    if !errors.is_empty() {
                        metrics.apply_errors.inc();
                        tracing::warn!(workspace = %name, errors = ?errors, "workspaces: apply failed");
                    }
                    errors
                };
                self.applies.spawn(self.errors.watch(key, version, apply));
            }
        }
    }

    /// Desired `Terminated` (`handleDesiredStateIsTerminated`).
    async fn terminate(&mut self, info: &WorkspaceRailsInfo) -> Result<(), String> {
        let (name, namespace) = (&info.name, &info.namespace);
        if info.actual_state == TERMINATED {
            self.terminations.delete(name, namespace);
            self.persisted.delete(name);
            return Ok(());
        }
        let exists = self
            .cluster
            .namespace_exists(namespace)
            .await
            .map_err(|e| format!("failed to check if namespace exists: {e}"))?;
        if !exists {
            self.terminations
                .add(name, namespace, TerminationProgress::Terminated);
            return Ok(());
        }
        // Deleting a namespace already being deleted is fine: termination can span
        // several cycles, and a full cycle asks again.
        self.cluster
            .delete_namespace(namespace)
            .await
            .map_err(|e| format!("failed to terminate workspace by deleting namespace: {e}"))?;
        self.terminations
            .add(name, namespace, TerminationProgress::Terminating);
        Ok(())
    }

    async fn ensure_namespace(&self, namespace: &str) -> Result<(), String> {
        let exists = self
            .cluster
            .namespace_exists(namespace)
            .await
            .map_err(|e| format!("error when checking if namespace {namespace} exists: {e}"))?;
        if !exists {
            self.cluster
                .create_namespace(namespace)
                .await
                .map_err(|e| format!("error creating namespace {namespace}: {e}"))?;
        }
        Ok(())
    }
}

fn entry<'a>(
    infos: &'a mut BTreeMap<WorkspaceKey, WorkspaceAgentInfo>,
    key: &WorkspaceKey,
) -> &'a mut WorkspaceAgentInfo {
    infos
        .entry(key.clone())
        .or_insert_with(|| WorkspaceAgentInfo {
            name: key.name.clone(),
            namespace: key.namespace.clone(),
            ..Default::default()
        })
}

#[cfg(test)]
mod tests;

//! One reconcile request, start to end, as Rails' pipeline runs it
//! (`ee/lib/remote_development/workspace_operations/reconcile/main.rb` and the
//! steps it names, read in the `pavankalisetti009/gitlab` mirror of gitlab-org/gitlab,
//! <https://github.com/pavankalisetti009/gitlab>):
//!
//! 1. validate the parameters ([`super::validate`]; 400);
//! 2. extract `update_type` and convert the agent infos, keyed by name (a later
//!    info of the same name wins, as `index_by`), each with its actual state
//!    ([`super::states`]) and `latest_k8s_deployment_info.metadata.resourceVersion`
//!    (`input/params_to_infos_converter.rb`, `input/factory.rb`); an info without
//!    `name` or `namespace` makes Rails' `fetch` raise (500);
//! 3. update the agent's workspaces named by an info
//!    (`persistence/workspaces_from_agent_infos_updater.rb`): desired
//!    `RestartRequested` becomes `Running` once the actual state is `Stopped`; the
//!    actual state is stored; the resource version too when reported. Infos naming
//!    no workspace of the agent are orphans, only logged
//!    (`persistence/orphaned_workspaces_observer.rb`);
//! 4. the lifecycle rules on those workspaces, skipping desired `Terminated`, first
//!    match wins (`persistence/workspaces_lifecycle_manager.rb`): older than its
//!    `max_hours_before_termination` → `Terminated`; not `Stopped` and desired state
//!    older than the agent's `max_active_hours_before_stop` → `Stopped`; `Stopped`
//!    for more than `max_stopped_hours_before_termination` hours → `Terminated`;
//! 5. the workspaces to return, by id (`persistence/workspaces_to_be_returned_finder.rb`):
//!    full — every workspace of the agent not both desired and actual `Terminated`;
//!    partial — desired state changed since the last response (or never
//!    responded), named in this request, forced to include all resources, or
//!    (2025, gitlab-org/gitlab MR 185872) desired `Terminated` while actual is not;
//! 6. the response (`output/response_payload_builder.rb`): per workspace `name`,
//!    `namespace`, `desired_state`, `actual_state`, `deployment_resource_version`
//!    (null when none), `config_to_apply` ([`desired_config`] with the
//!    [`Inclusion`] Rails' rules choose, as a YAML stream) and `image_pull_secrets`;
//!    then `settings`;
//! 7. `responded_to_agent_at` of every returned workspace touched with one
//!    timestamp, and `force_include_all_resources` cleared
//!    (`persistence/workspaces_to_be_returned_updater.rb`).

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use serde_json::Value;
use thiserror::Error;

use super::desired_config::{self, Inclusion};
use super::model::{ActualState, DesiredState, ImagePullSecret, Workspace, WorkspacesAgentConfig};
use super::states;
use super::store::WorkspaceStore;
use super::validate;

/// Microseconds in an hour.
const HOUR: u64 = 3_600_000_000;

/// Why a reconcile request failed.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ReconcileError {
    /// The parameters fail the schema (400, Rails' message).
    #[error("{0}")]
    BadRequest(String),
    /// What would make Rails raise (500).
    #[error("{0}")]
    Internal(String),
}

/// The intervals Rails tells agentk to use (`settings`; defaults from
/// `ee/lib/remote_development/settings/default_settings.rb`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ReconcileSettings {
    /// Seconds between full reconciliations (3600).
    pub full_reconciliation_interval_seconds: u64,
    /// Seconds between partial reconciliations (10).
    pub partial_reconciliation_interval_seconds: u64,
}

impl Default for ReconcileSettings {
    fn default() -> Self {
        ReconcileSettings {
            full_reconciliation_interval_seconds: 3600,
            partial_reconciliation_interval_seconds: 10,
        }
    }
}

impl ReconcileSettings {
    /// Rails' settings checks: both positive, partial shorter than full. Names the
    /// bad field.
    pub fn validate(&self) -> Result<(), String> {
        if self.full_reconciliation_interval_seconds == 0 {
            return Err("full_reconciliation_interval_seconds: must be greater than 0".into());
        }
        if self.partial_reconciliation_interval_seconds == 0 {
            return Err("partial_reconciliation_interval_seconds: must be greater than 0".into());
        }
        if self.partial_reconciliation_interval_seconds >= self.full_reconciliation_interval_seconds
        {
            return Err(
                "partial_reconciliation_interval_seconds: must be less than full_reconciliation_interval_seconds"
                    .into(),
            );
        }
        Ok(())
    }
}

/// One element of `workspace_rails_infos`, fields in Rails' order.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RailsInfo {
    /// Workspace name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Desired state.
    pub desired_state: &'static str,
    /// Actual state.
    pub actual_state: &'static str,
    /// The Deployment resource version last reported (`null`: none).
    pub deployment_resource_version: Option<String>,
    /// The objects to apply, a YAML stream (`""`: none).
    pub config_to_apply: String,
    /// The agent's image pull Secrets.
    pub image_pull_secrets: Vec<ImagePullSecret>,
}

/// The 201 payload.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReconcileResponse {
    /// The workspaces returned.
    pub workspace_rails_infos: Vec<RailsInfo>,
    /// The intervals.
    pub settings: ReconcileSettings,
}

/// A request's `update_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateType {
    /// Every workspace of the agent.
    Full,
    /// Only what changed.
    Partial,
}

impl UpdateType {
    /// `"full"` or `"partial"`.
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateType::Full => "full",
            UpdateType::Partial => "partial",
        }
    }
}

/// What one reconcile did, beyond its payload (for logs and metrics).
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The payload.
    pub response: ReconcileResponse,
    /// The request's update type.
    pub update_type: UpdateType,
    /// Names reported that are no workspace of the agent.
    pub orphans: Vec<String>,
}

/// An agent info, converted (`RemoteDevelopment::…::Input::AgentInfo`).
struct AgentInfo {
    actual_state: ActualState,
    deployment_resource_version: Option<String>,
}

/// `update_type` of valid `params` (validation has checked it).
fn update_type(params: &Value) -> UpdateType {
    if params["update_type"] == "full" {
        UpdateType::Full
    } else {
        UpdateType::Partial
    }
}

/// Step 2: the agent infos keyed by name.
fn convert(params: &Value) -> Result<HashMap<String, AgentInfo>, ReconcileError> {
    let mut infos = HashMap::new();
    for (i, info) in params["workspace_agent_infos"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let fetch = |key: &str| {
            info.as_object().and_then(|o| o.get(key)).ok_or_else(|| {
                ReconcileError::Internal(format!(
                    "workspace_agent_infos[{i}]: key not found: :{key}"
                ))
            })
        };
        let name = fetch("name")?;
        fetch("namespace")?;
        let Some(name) = name.as_str() else {
            return Err(ReconcileError::Internal(format!(
                "workspace_agent_infos[{i}]: name is not a string"
            )));
        };
        let version = info
            .get("latest_k8s_deployment_info")
            .and_then(|d| d.get("metadata"))
            .and_then(|m| m.get("resourceVersion"))
            .and_then(|v| match v {
                Value::String(s) => Some(s.clone()),
                Value::Null => None,
                v => Some(v.to_string()),
            });
        let actual_state = states::actual_state(info);
        // `AgentInfosObserver`: abnormal infos (Unknown, Error) are logged apart.
        if matches!(actual_state, ActualState::Unknown | ActualState::Error) {
            tracing::info!(
                workspace = name,
                actual_state = actual_state.as_str(),
                error_type = info["error_details"]["error_type"].as_str().unwrap_or(""),
                error_message = info["error_details"]["error_message"]
                    .as_str()
                    .unwrap_or(""),
                "abnormal workspace agent info"
            );
        }
        infos.insert(
            name.to_owned(),
            AgentInfo {
                actual_state,
                deployment_resource_version: version,
            },
        );
    }
    Ok(infos)
}

/// Step 4 on one workspace at `now`: the first lifecycle rule that matches.
fn lifecycle(ws: &Workspace, config: &WorkspacesAgentConfig, now: u64) -> Option<DesiredState> {
    let hours = |h: u32| u64::from(h) * HOUR;
    if ws.desired_state == DesiredState::Terminated {
        return None;
    }
    if now > ws.created_at + hours(ws.spec.max_hours_before_termination) {
        return Some(DesiredState::Terminated);
    }
    if ws.desired_state != DesiredState::Stopped
        && now > ws.desired_state_updated_at + hours(config.max_active_hours_before_stop)
    {
        return Some(DesiredState::Stopped);
    }
    if ws.desired_state == DesiredState::Stopped
        && now.saturating_sub(ws.desired_state_updated_at)
            > hours(config.max_stopped_hours_before_termination)
    {
        return Some(DesiredState::Terminated);
    }
    None
}

/// A reconcile whose state changes are done: what is left is building the payload
/// ([`Plan::render`]), which needs no lock and may take a while for many
/// workspaces (so the HTTP layer runs it off the async workers).
#[derive(Clone, Debug)]
pub struct Plan {
    /// The workspaces to return as they were before `responded_to_agent_at` was
    /// touched, each with what its `config_to_apply` includes.
    pub returned: Vec<(Workspace, Inclusion)>,
    /// The agent's workspaces configuration.
    pub config: WorkspacesAgentConfig,
    /// The request's update type.
    pub update_type: UpdateType,
    /// Names reported that are no workspace of the agent.
    pub orphans: Vec<String>,
    /// The intervals to answer with.
    pub settings: ReconcileSettings,
}

/// Answer agent `agent_id`'s reconcile request `params` (the JSON body) with
/// `settings`: [`plan`], then [`Plan::render`].
pub fn reconcile(
    store: &WorkspaceStore,
    agent_id: i64,
    params: &Value,
    settings: ReconcileSettings,
) -> Result<Outcome, ReconcileError> {
    Ok(plan(store, agent_id, params, settings)?.render())
}

/// Steps 1–5 and 7 of a reconcile request: validate, update the store, choose
/// what to return and touch `responded_to_agent_at`.
pub fn plan(
    store: &WorkspaceStore,
    agent_id: i64,
    params: &Value,
    settings: ReconcileSettings,
) -> Result<Plan, ReconcileError> {
    validate::validate(params).map_err(ReconcileError::BadRequest)?;
    let update_type = update_type(params);
    let infos = convert(params)?;
    let full = update_type == UpdateType::Full;

    let (returned, config) = store.transaction(|txn| {
        let config = txn
            .agent_config(agent_id)
            .cloned()
            .unwrap_or(WorkspacesAgentConfig {
                agent_id,
                ..Default::default()
            });
        // 3. Update from the agent infos.
        let mut reported: Vec<u64> = infos
            .keys()
            .filter_map(|name| txn.id_by_name(agent_id, name))
            .collect();
        reported.sort_unstable();
        let reported_set: HashSet<u64> = reported.iter().copied().collect();
        let orphans: Vec<String> = infos
            .keys()
            .filter(|name| txn.id_by_name(agent_id, name).is_none())
            .cloned()
            .collect();
        for &id in &reported {
            let stamp = txn.stamp();
            let ws = txn.get_mut(id).expect("found by name");
            let info = &infos[&ws.name];
            if ws.desired_state == DesiredState::RestartRequested
                && info.actual_state == ActualState::Stopped
            {
                // Never Terminated here, so this cannot fail.
                let _ = ws.set_desired_state(DesiredState::Running, stamp);
            }
            ws.set_actual_state(info.actual_state, stamp);
            if let Some(v) = &info.deployment_resource_version {
                ws.deployment_resource_version = Some(v.clone());
            }
        }
        // 4. Lifecycle.
        let now = txn.now();
        for &id in &reported {
            let ws = txn.get(id).expect("found by name");
            if let Some(state) = lifecycle(ws, &config, now) {
                let stamp = txn.stamp();
                let ws = txn.get_mut(id).expect("found by name");
                let _ = ws.set_desired_state(state, stamp);
            }
        }
        // 5. The workspaces to return, by id.
        let returned: Vec<(Workspace, Inclusion)> = txn
            .agent_workspaces(agent_id)
            .filter(|ws| {
                if full {
                    ws.desired_state != DesiredState::Terminated
                        || ws.actual_state != ActualState::Terminated
                } else {
                    ws.desired_state_updated_since_response()
                        || reported_set.contains(&ws.id)
                        || ws.force_include_all_resources
                        || ws.terminating()
                }
            })
            .map(|ws| (ws.clone(), Inclusion::for_workspace(ws, full)))
            .collect();
        // 7. Responded, with one timestamp.
        let stamp = txn.stamp();
        for (ws, _) in &returned {
            let w = txn.get_mut(ws.id).expect("listed");
            w.responded_to_agent_at = Some(stamp);
            w.force_include_all_resources = false;
        }
        ((returned, orphans), config)
    });
    let (returned, orphans) = returned;
    if !orphans.is_empty() {
        tracing::debug!(agent_id, orphans = ?orphans, "reconcile: orphaned workspace agent infos");
    }
    Ok(Plan {
        returned,
        config,
        update_type,
        orphans,
        settings,
    })
}

impl Plan {
    /// Step 6: the payload, built from the workspaces as they were before step 7.
    pub fn render(self) -> Outcome {
        let config = &self.config;
        let workspace_rails_infos = self
            .returned
            .iter()
            .map(|(ws, inclusion)| RailsInfo {
                name: ws.name.clone(),
                namespace: ws.namespace.clone(),
                desired_state: ws.desired_state.as_str(),
                actual_state: ws.actual_state.as_str(),
                deployment_resource_version: ws.deployment_resource_version.clone(),
                config_to_apply: desired_config::yaml_stream(&desired_config::desired_config(
                    ws, config, *inclusion,
                )),
                image_pull_secrets: config.image_pull_secrets.clone(),
            })
            .collect();
        Outcome {
            response: ReconcileResponse {
                workspace_rails_infos,
                settings: self.settings,
            },
            update_type: self.update_type,
            orphans: self.orphans,
        }
    }
}

#[cfg(test)]
mod tests;

//! The data: desired and actual states (`ee/lib/remote_development/workspaces/states.rb`),
//! a workspace (the `workspaces` table's columns that matter here,
//! `ee/app/models/remote_development/workspace.rb`) and an agent's workspaces
//! configuration (the `workspaces_agent_configs` table,
//! `ee/app/models/remote_development/workspaces_agent_config.rb`).
//!
//! Times are Unix microseconds from the store's clock (`store::Clock`), so tests can
//! move it; the store keeps them strictly increasing, as database timestamps of
//! successive writes are, so "updated since the last response" is never a tie.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What the user wants (`desired_state`). `Terminated` is final.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DesiredState {
    /// Running.
    Running,
    /// Stop, then run again (becomes `Running` once `Stopped` is reported).
    RestartRequested,
    /// Stopped: scaled to 0, storage kept.
    Stopped,
    /// Deleted; final.
    Terminated,
}

/// What the cluster reports, as Rails computes it (`actual_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ActualState {
    /// Created, not acted on yet (the initial state).
    CreationRequested,
    /// Being made ready.
    Starting,
    /// Ready.
    Running,
    /// Scaling down.
    Stopping,
    /// Scaled down, storage kept.
    Stopped,
    /// Being deleted.
    Terminating,
    /// Deleted.
    Terminated,
    /// Applied but not becoming ready (e.g. a crashing container).
    Failed,
    /// Its objects could not be applied.
    Error,
    /// Not understood.
    Unknown,
}

impl DesiredState {
    /// Every desired state (`VALID_DESIRED_STATES`).
    pub const ALL: [DesiredState; 4] = [
        DesiredState::Running,
        DesiredState::RestartRequested,
        DesiredState::Stopped,
        DesiredState::Terminated,
    ];

    /// The state Rails names `name`.
    pub fn parse(name: &str) -> Option<DesiredState> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// The name Rails uses (`"Running"`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            DesiredState::Running => "Running",
            DesiredState::RestartRequested => "RestartRequested",
            DesiredState::Stopped => "Stopped",
            DesiredState::Terminated => "Terminated",
        }
    }
}

impl ActualState {
    /// Every actual state (`VALID_ACTUAL_STATES`).
    pub const ALL: [ActualState; 10] = [
        ActualState::CreationRequested,
        ActualState::Starting,
        ActualState::Running,
        ActualState::Stopping,
        ActualState::Stopped,
        ActualState::Terminating,
        ActualState::Terminated,
        ActualState::Failed,
        ActualState::Error,
        ActualState::Unknown,
    ];

    /// The name Rails uses (`"CreationRequested"`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ActualState::CreationRequested => "CreationRequested",
            ActualState::Starting => "Starting",
            ActualState::Running => "Running",
            ActualState::Stopping => "Stopping",
            ActualState::Stopped => "Stopped",
            ActualState::Terminating => "Terminating",
            ActualState::Terminated => "Terminated",
            ActualState::Failed => "Failed",
            ActualState::Error => "Error",
            ActualState::Unknown => "Unknown",
        }
    }
}

/// What a workspace runs (GitLab derives it from the project's devfile; here it is
/// given when the workspace is created).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkspaceSpec {
    /// The main container's image.
    pub image: String,
    /// The editor's port (GitLab's `WORKSPACE_EDITOR_PORT`, 60001).
    pub editor_port: u16,
    /// More container ports exposed through the Service (e.g. an app on 3000).
    pub ports: Vec<u32>,
    /// Environment variables (the `<name>-env-var` Secret).
    pub env: BTreeMap<String, String>,
    /// Files (path → content; the `<name>-file` Secret, mounted as
    /// `gl-workspace-variables`).
    pub files: BTreeMap<String, String>,
    /// The persistent volume's size (`"15Gi"`).
    pub storage: String,
    /// Hours until the lifecycle terminates it (`max_hours_before_termination`).
    pub max_hours_before_termination: u32,
}

impl Default for WorkspaceSpec {
    fn default() -> Self {
        WorkspaceSpec {
            image:
                "registry.gitlab.com/gitlab-org/gitlab-build-images/workspaces/ubuntu-24.04:latest"
                    .into(),
            editor_port: 60001,
            ports: Vec::new(),
            env: BTreeMap::new(),
            files: BTreeMap::new(),
            storage: "15Gi".into(),
            max_hours_before_termination: 24,
        }
    }
}

/// One workspace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Workspace {
    /// Id (ascending; the order Rails returns workspaces in).
    pub id: u64,
    /// `workspace-<agent id>-<user id>-<random>`.
    pub name: String,
    /// `gl-rd-ns-<agent id>-<user id>-<random>`, or the agent's shared namespace.
    pub namespace: String,
    /// The agent that runs it.
    pub agent_id: i64,
    /// Its owner.
    pub user_id: u64,
    /// What it runs.
    pub spec: WorkspaceSpec,
    /// `https://<editor port>-<name>.<dns zone>/?folder=%2Fprojects%2F<project>`.
    pub url: String,
    /// What the user wants.
    pub desired_state: DesiredState,
    /// When `desired_state` last changed (and at creation).
    pub desired_state_updated_at: u64,
    /// What the cluster last reported.
    pub actual_state: ActualState,
    /// When `actual_state` last changed (and at creation).
    pub actual_state_updated_at: u64,
    /// When GitLab last returned it to the agent (`None`: never).
    pub responded_to_agent_at: Option<u64>,
    /// The Deployment's `resourceVersion` last reported.
    pub deployment_resource_version: Option<String>,
    /// Send every object on the next reconcile, whatever its type.
    pub force_include_all_resources: bool,
    /// Created at.
    pub created_at: u64,
}

/// Rails' refusal to change a desired state that is `Terminated`
/// (`enforce_permanent_termination`, `ee/app/models/remote_development/workspace.rb`),
/// as `errors.full_messages` words it.
pub const TERMINATED_IS_FINAL: &str =
    "Desired state is 'Terminated', and cannot be updated. Create a new workspace instead.";

impl Workspace {
    /// Set `desired_state` at `now`, as `update!(desired_state:)` does: a change
    /// touches `desired_state_updated_at`; leaving `Terminated` is refused with
    /// [`TERMINATED_IS_FINAL`]. Whether it changed.
    pub fn set_desired_state(
        &mut self,
        state: DesiredState,
        now: u64,
    ) -> Result<bool, &'static str> {
        if state == self.desired_state {
            return Ok(false);
        }
        if self.desired_state == DesiredState::Terminated {
            return Err(TERMINATED_IS_FINAL);
        }
        self.desired_state = state;
        self.desired_state_updated_at = now;
        Ok(true)
    }

    /// Set `actual_state` at `now`: a change touches `actual_state_updated_at`
    /// (`touch_actual_state_updated_at`). Whether it changed.
    pub fn set_actual_state(&mut self, state: ActualState, now: u64) -> bool {
        if state == self.actual_state {
            return false;
        }
        self.actual_state = state;
        self.actual_state_updated_at = now;
        true
    }

    /// `desired_state_updated_more_recently_than_last_response_to_agent?` (true
    /// when never responded).
    pub fn desired_state_updated_since_response(&self) -> bool {
        self.responded_to_agent_at
            .is_none_or(|r| self.desired_state_updated_at > r)
    }

    /// `actual_state_updated_more_recently_than_last_response_to_agent?` (true when
    /// never responded).
    pub fn actual_state_updated_since_response(&self) -> bool {
        self.responded_to_agent_at
            .is_none_or(|r| self.actual_state_updated_at > r)
    }

    /// `desired_state_terminated_and_actual_state_not_terminated?`.
    pub fn terminating(&self) -> bool {
        self.desired_state == DesiredState::Terminated
            && self.actual_state != ActualState::Terminated
    }
}

/// An egress rule of the workspaces' NetworkPolicy (`network_policy.egress`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressRule {
    /// A CIDR allowed (`0.0.0.0/0`).
    pub allow: String,
    /// CIDRs excepted.
    #[serde(default)]
    pub except: Vec<String>,
}

/// An image pull Secret copied into workspace namespaces.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImagePullSecret {
    /// Its name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
}

/// An agent's workspaces configuration (from its `remote_development` config keys;
/// defaults from `ee/lib/remote_development/settings/default_settings.rb`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkspacesAgentConfig {
    /// The agent.
    pub agent_id: i64,
    /// `remote_development.enabled`.
    pub enabled: bool,
    /// `dns_zone`: workspace hosts are `<port>-<name>.<dns_zone>`.
    pub dns_zone: String,
    /// `network_policy.enabled` (true).
    pub network_policy_enabled: bool,
    /// `network_policy.egress` (0.0.0.0/0 except the RFC 1918 ranges).
    pub network_policy_egress: Vec<EgressRule>,
    /// `gitlab_workspaces_proxy.namespace` (`gitlab-workspaces`).
    pub gitlab_workspaces_proxy_namespace: String,
    /// Labels on every object.
    pub labels: BTreeMap<String, String>,
    /// Annotations on every object.
    pub annotations: BTreeMap<String, String>,
    /// `max_resources_per_workspace` (`{}`: no ResourceQuota).
    pub max_resources_per_workspace: Value,
    /// `default_resources_per_workspace_container` (`{}`).
    pub default_resources_per_workspace_container: Value,
    /// `image_pull_secrets`.
    pub image_pull_secrets: Vec<ImagePullSecret>,
    /// `shared_namespace` (`""`: one namespace per workspace).
    pub shared_namespace: String,
    /// `max_active_hours_before_stop` (36).
    pub max_active_hours_before_stop: u32,
    /// `max_stopped_hours_before_termination` (744).
    pub max_stopped_hours_before_termination: u32,
    /// `allow_privilege_escalation` (false).
    pub allow_privilege_escalation: bool,
    /// `use_kubernetes_user_namespaces` (false).
    pub use_kubernetes_user_namespaces: bool,
    /// `workspaces_quota` (-1: unlimited).
    pub workspaces_quota: i64,
    /// `workspaces_per_user_quota` (-1: unlimited).
    pub workspaces_per_user_quota: i64,
}

impl Default for WorkspacesAgentConfig {
    fn default() -> Self {
        WorkspacesAgentConfig {
            agent_id: 0,
            enabled: false,
            dns_zone: String::new(),
            network_policy_enabled: true,
            network_policy_egress: vec![EgressRule {
                allow: "0.0.0.0/0".into(),
                except: vec![
                    "10.0.0.0/8".into(),
                    "172.16.0.0/12".into(),
                    "192.168.0.0/16".into(),
                ],
            }],
            gitlab_workspaces_proxy_namespace: "gitlab-workspaces".into(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            max_resources_per_workspace: Value::Object(Default::default()),
            default_resources_per_workspace_container: Value::Object(Default::default()),
            image_pull_secrets: Vec::new(),
            shared_namespace: String::new(),
            max_active_hours_before_stop: 36,
            max_stopped_hours_before_termination: 744,
            allow_privilege_escalation: false,
            use_kubernetes_user_namespaces: false,
            workspaces_quota: -1,
            workspaces_per_user_quota: -1,
        }
    }
}

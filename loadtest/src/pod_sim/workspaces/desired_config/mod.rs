//! The Kubernetes objects GitLab sends a workspace's agent in `config_to_apply`
//! (gitlab-org/gitlab, `ee/lib/remote_development`), built as Rails builds them:
//!
//! - the objects and their order: `ee/lib/remote_development/workspace_operations/create/desired_config/`
//!   (`config_values_extractor.rb` for names, labels and annotations,
//!   `devfile_resource_modifier.rb` for what is done to the devfile gem's Deployment,
//!   `devfile_resource_appender.rb` for the inventories, ServiceAccount,
//!   NetworkPolicy, ResourceQuota and Secrets) — the 2025 successor of
//!   `ee/lib/remote_development/workspace_operations/reconcile/output/desired_config_generator.rb`
//!   and `devfile_parser.rb`, which build the same objects;
//! - the Deployment, Service and PVC the devfile gem (`Devfile::Parser.get_all`) makes
//!   of the processed devfile, in the shape of Rails' spec fixtures
//!   (`ee/spec/support/shared_contexts/remote_development/remote_development_shared_contexts.rb`:
//!   `workspace_deployment`, `workspace_service`, `workspace_pvc`). podgate has no
//!   devfile: the main container runs [`WorkspaceSpec::image`](super::WorkspaceSpec::image) and exposes
//!   [`WorkspaceSpec::ports`](super::WorkspaceSpec::ports) (devfile endpoints) plus the two endpoints Rails adds
//!   to every main container (`create/main_component_updater.rb`: `editor-server` on
//!   the editor port, `ssh-server` on 60022); the tools injector is the one init
//!   container (GitLab's project cloner is left out: a simulated workspace has no
//!   project to clone);
//! - which objects a response carries: `reconcile/output/response_payload_builder.rb`
//!   (whether to send a config, and whether all of it) and
//!   `reconcile/output/config_to_apply_builder.rb` (desired `Terminated`: the two
//!   inventory ConfigMaps only; partial: the objects annotated
//!   `workspaces.gitlab.com/include-in-partial-reconciliation`; the Deployment's
//!   replicas; the Secrets' data) — see [`Inclusion`];
//! - the YAML: each object deep-sorted by key (`Gitlab::Utils.deep_sort_hash`) and
//!   dumped with `YAML.dump`, the documents concatenated — see [`yaml_stream`].
//!
//! Agent settings the podgate model does not carry take Rails' defaults
//! (`ee/lib/remote_development/settings/default_settings.rb`):
//! `gitlab_workspaces_proxy_http_enabled` and `…_ssh_enabled` true (the NetworkPolicy
//! admits the workspaces proxy), `default_runtime_class` empty (no
//! `runtimeClassName`).
//!
//! Layout: this file (the names and constants, and [`desired_config`], the objects
//! in Rails' order); `context` (the labels, annotations and metadata every object
//! carries, and the inventory ConfigMaps); `deployment` (the Deployment and its pod
//! spec); `service` (the Service, PVC and ServiceAccount); `policy` (the
//! NetworkPolicy and ResourceQuota); `secrets` (the env-var and files Secrets);
//! [`Inclusion`] (which objects a response carries); [`yaml_stream`] (the YAML);
//! [`max_resources_sha256`] (the max-resources annotation's digest, with Ruby's
//! `inspect`); `tests`.

use serde_json::Value;

use super::model::{Workspace, WorkspacesAgentConfig};
use context::Context;

mod context;
mod deployment;
mod inclusion;
mod max_resources;
mod policy;
mod secrets;
mod service;
#[cfg(test)]
mod tests;
mod yaml;

pub use inclusion::Inclusion;
pub use max_resources::max_resources_sha256;
pub use yaml::{deep_sort, yaml_stream};

/// Suffix of the workspace inventory ConfigMap's name (`WORKSPACE_INVENTORY`).
pub const WORKSPACE_INVENTORY_SUFFIX: &str = "-workspace-inventory";
/// Suffix of the secrets inventory ConfigMap's name (`SECRETS_INVENTORY`).
pub const SECRETS_INVENTORY_SUFFIX: &str = "-secrets-inventory";
/// Suffix of the environment variables Secret's name (`ENV_VAR_SECRET_SUFFIX`).
pub const ENV_VAR_SECRET_SUFFIX: &str = "-env-var";
/// Suffix of the files Secret's name (`FILE_SECRET_SUFFIX`).
pub const FILE_SECRET_SUFFIX: &str = "-file";
/// The label agentk's Deployment informer selects on; on every object.
pub const LABEL_AGENT_ID: &str = "agent.gitlab.com/id";
/// The label that makes a ConfigMap a cli-utils inventory.
pub const LABEL_INVENTORY_ID: &str = "cli-utils.sigs.k8s.io/inventory-id";
/// The label (shared-namespace mode) and annotation carrying the workspace id.
pub const WORKSPACE_ID_KEY: &str = "workspaces.gitlab.com/id";
/// The annotation naming an object's inventory; on every object but the inventories.
pub const ANNOTATION_OWNING_INVENTORY: &str = "config.k8s.io/owning-inventory";
/// The annotation holding the workspace's host template (`{{.port}}-<name>.<dns zone>`).
pub const ANNOTATION_HOST_TEMPLATE: &str = "workspaces.gitlab.com/host-template";
/// The annotation that changes, restarting the workspace, when the agent's
/// `max_resources_per_workspace` changes.
pub const ANNOTATION_MAX_RESOURCES_SHA256: &str =
    "workspaces.gitlab.com/max-resources-per-workspace-sha256";
/// The annotation marking the objects a partial reconciliation carries
/// (`ANNOTATION_KEY_INCLUDE_IN_PARTIAL_RECONCILIATION`).
pub const ANNOTATION_INCLUDE_IN_PARTIAL: &str =
    "workspaces.gitlab.com/include-in-partial-reconciliation";
/// The SSH endpoint Rails adds to every main container (`WORKSPACE_SSH_PORT`).
pub const SSH_PORT: u32 = 60022;
/// The user workspace containers run as (`RUN_AS_USER`).
pub const RUN_AS_USER: u32 = 5001;
/// The file in the files Secret holding the last actual state GitLab computed
/// (`WORKSPACE_RECONCILED_ACTUAL_STATE_FILE_NAME`).
pub const RECONCILED_ACTUAL_STATE_FILE: &str = "gl_workspace_reconciled_actual_state.txt";

/// The projected volume of the files Secret (`VARIABLES_VOLUME_NAME`).
const VARIABLES_VOLUME_NAME: &str = "gl-workspace-variables";
/// Where it is mounted (`VARIABLES_VOLUME_PATH`).
const VARIABLES_VOLUME_PATH: &str = "/.workspace-data/variables/file";
/// Its mode, 0o774 (`VARIABLES_VOLUME_DEFAULT_MODE`).
const VARIABLES_VOLUME_DEFAULT_MODE: u32 = 0o774;
/// The persistent volume (`WORKSPACE_DATA_VOLUME_NAME`) and its mount path.
const DATA_VOLUME_NAME: &str = "gl-workspace-data";
/// Where the persistent volume is mounted (`WORKSPACE_DATA_VOLUME_PATH`).
const DATA_VOLUME_PATH: &str = "/projects";
/// The tools injector's image (`WORKSPACE_TOOLS_IMAGE`).
const TOOLS_IMAGE: &str =
    "registry.gitlab.com/gitlab-org/workspaces/gitlab-workspaces-tools:16.0.0";
/// The main container's name (the main component of GitLab's example devfiles).
const MAIN_CONTAINER: &str = "tooling-container";
/// The tools injector init container's name (component and apply command, as the
/// devfile gem names init containers).
const TOOLS_INJECTOR_CONTAINER: &str = "gl-tools-injector-gl-tools-injector-command-1";

/// The objects of `ws`'s `config_to_apply`, in Rails' order: workspace inventory,
/// Deployment, Service, PVC, ServiceAccount, NetworkPolicy (when
/// `network_policy_enabled`), secrets inventory, ResourceQuota (when
/// `max_resources_per_workspace` is set and the namespace is not shared), the
/// `<name>-env-var` and `<name>-file` Secrets — filtered by `inclusion`. Keys are
/// not sorted here; [`yaml_stream`] sorts them.
pub fn desired_config(
    ws: &Workspace,
    agent: &WorkspacesAgentConfig,
    inclusion: Inclusion,
) -> Vec<Value> {
    if inclusion == Inclusion::Nothing {
        return Vec::new();
    }
    let ctx = Context::new(ws, agent);
    let workspace_inventory = ctx.inventory_config_map(
        &ctx.workspace_inventory,
        ctx.with(&ctx.common, ANNOTATION_INCLUDE_IN_PARTIAL, "true"),
    );
    let secrets_inventory = ctx.inventory_config_map(&ctx.secrets_inventory, ctx.common.clone());
    if inclusion == Inclusion::InventoriesOnly {
        return vec![workspace_inventory, secrets_inventory];
    }
    let mut objects = vec![
        workspace_inventory,
        ctx.deployment(),
        ctx.service(),
        ctx.pvc(),
        ctx.service_account(),
    ];
    if agent.network_policy_enabled {
        objects.push(ctx.network_policy());
    }
    if inclusion == Inclusion::Partial {
        return objects;
    }
    objects.push(secrets_inventory);
    if let Some(quota) = ctx.resource_quota() {
        objects.push(quota);
    }
    let env = ws.spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    objects.push(ctx.secret(&format!("{}{ENV_VAR_SECRET_SUFFIX}", ws.name), env));
    let files = ws
        .spec
        .files
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain([(RECONCILED_ACTUAL_STATE_FILE, ws.actual_state.as_str())]);
    objects.push(ctx.secret(&format!("{}{FILE_SECRET_SUFFIX}", ws.name), files));
    objects
}

//! GitLab's side of Workspaces, as Rails' `ee/lib/remote_development` (gitlab-org/gitlab)
//! answers it: a workspace store per Pod with desired and actual states, the
//! `remote_development/reconcile` internal API agentk calls through kas, the Rails
//! state rules and the Kubernetes objects GitLab sends (`config_to_apply`). No I/O:
//! the HTTP endpoints are in `http/workspaces.rs`. Each module names the
//! Rails file it follows.
//!
//! Layout: [`model`] (states, workspaces, the agent's workspaces configuration),
//! [`states`] (actual state from an agent info, §6.2), [`validate`] (the reconcile
//! parameters' JSON schema), [`desired_config`] (the objects of `config_to_apply`,
//! as YAML), [`store`] (workspaces per agent: create, update, lifecycle),
//! [`reconcile`] (one reconcile request, start to end), [`agent_config`] (the
//! agent's `remote_development` configuration, from kas's `agent_configuration`).

pub mod agent_config;
pub mod desired_config;
pub mod model;
pub mod reconcile;
pub mod states;
pub mod store;
pub mod validate;

pub use model::{ActualState, DesiredState, Workspace, WorkspaceSpec, WorkspacesAgentConfig};

//! GitLab's answers about a proxy request's credentials, as GitLab's kas decodes
//! them (`internal/gitlab/api/authorize_proxy_user.go`, `get_allowed_agents.go`, and
//! the `ci_access` part of the agent configuration, `agentcfg`).

use serde::{Deserialize, Serialize};

/// `gapi.AuthorizeProxyUserResponse` (Rails'
/// `Clusters::Agents::AuthorizeProxyUserService` payload).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct AuthorizeProxyUserResponse {
    /// The agent.
    pub agent: AuthorizedAgent,
    /// The user.
    pub user: User,
    /// As whom the cluster sees the user.
    pub access_as: AccessAs,
}

/// `gapi.AuthorizedAgentForUser`.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct AuthorizedAgent {
    /// Agent id.
    pub id: i64,
    /// The agent's configuration project.
    pub config_project: IdOnly,
}

/// `{"id": N}`.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct IdOnly {
    /// The id.
    pub id: i64,
}

/// `gapi.User`.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct User {
    /// User id.
    pub id: i64,
    /// User name.
    pub username: String,
}

/// `gapi.AccessAsProxyAuthorization`: exactly one of `agent` and `user`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct AccessAs {
    /// Access as the agent (`{}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<serde_json::Value>,
    /// Access as the user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<UserAccess>,
}

/// `gapi.AccessAsUserAuthorization`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct UserAccess {
    /// Projects and the user's roles in them.
    #[serde(default)]
    pub projects: Vec<RoleAccess>,
    /// Groups and the user's roles in them.
    #[serde(default)]
    pub groups: Vec<RoleAccess>,
}

/// `gapi.ProjectAccessCF` / `GroupAccessCF`.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct RoleAccess {
    /// Project or group id.
    pub id: i64,
    /// Role names (`guest`, `reporter`, `developer`, …).
    #[serde(default)]
    pub roles: Vec<String>,
}

/// `gapi.AllowedAgentsForJob` (`GET /api/v4/job/allowed_agents`).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct AllowedAgentsForJob {
    /// Agents the job may use.
    #[serde(default)]
    pub allowed_agents: Vec<AllowedAgent>,
    /// The job.
    pub job: IdOnly,
    /// Its pipeline.
    pub pipeline: IdOnly,
    /// Its project.
    pub project: JobProject,
    /// The user it runs as.
    pub user: User,
    /// Its environment, if any.
    #[serde(default)]
    pub environment: Option<Environment>,
}

/// `gapi.AllowedAgent`.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct AllowedAgent {
    /// Agent id.
    pub id: i64,
    /// The agent's configuration project.
    pub config_project: IdOnly,
    /// The `ci_access` entry that authorises the job.
    #[serde(default)]
    pub configuration: Option<CiConfiguration>,
}

/// `gapi.Configuration`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct CiConfiguration {
    /// The namespace by default.
    #[serde(default)]
    pub default_namespace: String,
    /// As whom the job acts.
    #[serde(default)]
    pub access_as: Option<CiAccessAs>,
}

/// `agentcfg.CiAccessAsCF`: at most one of the three.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct CiAccessAs {
    /// As the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<serde_json::Value>,
    /// As a configured identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impersonate: Option<CiImpersonate>,
    /// As the CI job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci_job: Option<serde_json::Value>,
}

/// `agentcfg.CiAccessAsImpersonateCF`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct CiImpersonate {
    /// User name.
    pub username: String,
    /// Groups.
    #[serde(default)]
    pub groups: Vec<String>,
    /// UID.
    #[serde(default)]
    pub uid: String,
    /// Extra fields.
    #[serde(default)]
    pub extra: Vec<ExtraKeyVal>,
}

/// `agentcfg.ExtraKeyValCF`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ExtraKeyVal {
    /// Key.
    pub key: String,
    /// Values.
    #[serde(default)]
    pub val: Vec<String>,
}

/// `gapi.Project` of a job.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct JobProject {
    /// Project id.
    pub id: i64,
    /// The groups it is in.
    #[serde(default)]
    pub groups: Vec<IdOnly>,
}

/// `gapi.Environment`.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Environment {
    /// Slug.
    pub slug: String,
    /// Tier.
    pub tier: String,
}

/// The `authorize_proxy_user` request body (`gapi.AuthorizeProxyUserRequest`).
#[derive(Serialize)]
pub(super) struct AuthorizeProxyUserRequest<'a> {
    pub(super) agent_id: i64,
    pub(super) access_type: &'a str,
    pub(super) access_key: &'a str,
    pub(super) csrf_token: &'a str,
}

//! The agents registered in the Pod's project, with their `user_access` and
//! `ci_access` configuration (the agent's `config.yaml` keys, in the same shape).

use podgate_tokens::PodId;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::KubeAccess;

/// `{"id": "<full path>"}` in `user_access` / `ci_access`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PathRef {
    /// Project or group full path.
    pub id: String,
}

/// An agent's `user_access` (`agentcfg.UserAccessCF`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UserAccessConfig {
    /// `{"agent": {}}` or `{"user": {}}`.
    pub access_as: Option<serde_json::Map<String, Value>>,
    /// Projects whose members may use the agent.
    #[serde(default)]
    pub projects: Vec<PathRef>,
    /// Groups whose members may use the agent.
    #[serde(default)]
    pub groups: Vec<PathRef>,
}

/// One `ci_access` entry (`agentcfg.CiAccessProjectCF` / `CiAccessGroupCF`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CiAccessEntry {
    /// Project or group full path.
    pub id: String,
    /// The namespace by default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub default_namespace: String,
    /// `{"agent": {}}`, `{"ci_job": {}}` or `{"impersonate": {…}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_as: Option<Value>,
    /// Environments the entry is limited to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub environments: Vec<String>,
}

/// An agent's `ci_access` (`agentcfg.CiAccessCF`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CiAccessConfig {
    /// Projects whose jobs may use the agent.
    #[serde(default)]
    pub projects: Vec<CiAccessEntry>,
    /// Groups whose projects' jobs may use the agent.
    #[serde(default)]
    pub groups: Vec<CiAccessEntry>,
}

/// An agent registered in the Pod's project.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// Agent id (the one in its agentk token).
    pub id: i64,
    /// Agent name.
    #[serde(default)]
    pub name: String,
    /// `user_access` (none: no user may use the agent through the proxy).
    #[serde(default)]
    pub user_access: Option<UserAccessConfig>,
    /// `ci_access`.
    #[serde(default)]
    pub ci_access: Option<CiAccessConfig>,
}

impl AgentSpec {
    /// Agent `id` named `agent-<id>` with the defaults `podgate up` wants: members
    /// of the Pod's project use it as themselves (`user_access: {access_as: {user:
    /// {}}, projects: [<project>]}`), its jobs as the agent.
    pub fn with_user_access(id: i64, pod: PodId) -> AgentSpec {
        AgentSpec {
            id,
            name: format!("agent-{id}"),
            user_access: Some(UserAccessConfig {
                access_as: Some([("user".to_owned(), json!({}))].into_iter().collect()),
                projects: vec![PathRef {
                    id: super::super::repo::project_path(pod),
                }],
                groups: Vec::new(),
            }),
            ci_access: None,
        }
    }
}

impl KubeAccess {
    /// Whether agent `agent_id` is registered.
    pub fn has_agent(&self, agent_id: i64) -> bool {
        self.lock().agents.contains_key(&agent_id)
    }

    /// Register (or replace) an agent.
    pub fn put_agent(&self, agent: AgentSpec) {
        self.lock().agents.insert(agent.id, agent);
    }

    /// The agents.
    pub fn agents(&self) -> Vec<AgentSpec> {
        self.lock().agents.values().cloned().collect()
    }
}

//! What the Pod knows for the GitLab agent's Kubernetes API proxy: users (members of
//! the Pod's group, so of its project, at a role), their personal access tokens
//! (`glpat-`, routable to this Pod), browser sessions (the `_gitlab_kas` cookie and
//! its CSRF token), and agents with their `user_access` and `ci_access`
//! configuration (the agent's `config.yaml` keys, in the same shape). No I/O: the
//! rules of the two endpoints kas calls are here, answered as Rails answers them:
//!
//! - `POST /api/v4/internal/kubernetes/authorize_proxy_user`
//!   (`lib/api/internal/kubernetes.rb`, the user from
//!   `lib/api/helpers/kubernetes/agent_helpers.rb`, the verdict from
//!   `Clusters::Agents::AuthorizeProxyUserService` and its EE part for `access_as:
//!   user`);
//! - `GET /api/v4/job/allowed_agents` (`lib/api/ci/jobs.rb`): the agents whose
//!   `ci_access` names the job's project or group, plus every agent configured in
//!   the job's own project (GitLab authorizes an agent's configuration project
//!   implicitly).
//!
//! The Pod has one group (`group`, id 100) and one project (`group/project-<pod>`, id
//! `1000 + pod`), which holds every agent's configuration. User 1 `root` is the
//! group's owner and the user every job runs as.
//!
//! Agent tokens (what kas passes on in `Authorization: Bearer` for the agent's
//! module requests, `lib/api/helpers/kas_helpers.rb`'s `agent_token`): opaque tokens
//! registered for an agent ([`KubeAccess::add_agent_token`]), and JWT agent tokens
//! (`kind` `agent`, claim `a`) that the Pod's keys verify, routed to this Pod and
//! naming one of its agents.
//!
//! Layout: this file (the Pod's group, project and roles, and [`KubeAccess`]);
//! `users` (users, personal access tokens and browser sessions); `agents` (agents
//! and their `user_access` and `ci_access` configuration); `agent_tokens` (whose an
//! agent token is); `authorize` (the two endpoints' rules); `tests`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use podgate_tokens::{Classifier, KeySet, PodId};
use serde_json::{Value, json};

mod agent_tokens;
mod agents;
mod authorize;
#[cfg(test)]
mod tests;
mod users;

pub use agent_tokens::AgentTokenOwner;
pub use agents::{AgentSpec, CiAccessConfig, CiAccessEntry, PathRef, UserAccessConfig};
pub use users::{Pat, PatUser, SimUser};

/// The Pod's group path.
pub const GROUP_PATH: &str = "group";
/// The Pod's group id.
pub const GROUP_ID: u64 = 100;

/// The Pod's project id.
pub fn project_id(pod: PodId) -> u64 {
    1000 + pod.get()
}

/// GitLab's roles and their access levels (`Gitlab::Access.sym_options_with_owner`).
pub const ROLES: [(&str, u8); 6] = [
    ("guest", 10),
    ("planner", 15),
    ("reporter", 20),
    ("developer", 30),
    ("maintainer", 40),
    ("owner", 50),
];

/// The access level of role `name`.
pub fn access_level(name: &str) -> Option<u8> {
    ROLES.iter().find(|(r, _)| *r == name).map(|(_, l)| *l)
}

/// Every role at or below `level` (Rails' `roles(access_level)`).
pub fn roles(level: u8) -> Vec<&'static str> {
    ROLES
        .iter()
        .filter(|(_, l)| *l <= level)
        .map(|(r, _)| *r)
        .collect()
}

/// A refusal: the status and Rails' JSON body.
pub type Refusal = (u16, Value);

fn api_error(status: u16, message: &str) -> Refusal {
    (status, json!({ "message": message }))
}

#[derive(Default)]
struct Inner {
    users: BTreeMap<u64, SimUser>,
    pats: HashMap<String, Pat>,
    /// Public session id → (user, CSRF token).
    sessions: HashMap<String, (u64, String)>,
    agents: BTreeMap<i64, AgentSpec>,
    next_pat: u64,
    /// Opaque agent token → agent id.
    agent_tokens: HashMap<String, i64>,
}

/// Users, tokens, sessions and agents.
pub struct KubeAccess {
    pod: PodId,
    inner: Mutex<Inner>,
    /// Verifies JWT agent tokens.
    classifier: Classifier,
}

impl KubeAccess {
    /// Pod `pod`'s: user 1 `root` (owner), and `agents`.
    pub fn new(pod: PodId, agents: &[AgentSpec]) -> KubeAccess {
        let mut inner = Inner::default();
        inner.users.insert(
            1,
            SimUser {
                id: 1,
                username: "root".into(),
                access_level: 50,
            },
        );
        for a in agents {
            inner.agents.insert(a.id, a.clone());
        }
        KubeAccess {
            pod,
            inner: Mutex::new(inner),
            classifier: Classifier::with_keys(KeySet::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

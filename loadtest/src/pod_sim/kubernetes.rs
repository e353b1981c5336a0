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

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use podgate_tokens::PodId;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

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

/// A user.
#[derive(Clone, Debug, Serialize)]
pub struct SimUser {
    /// User id.
    pub id: u64,
    /// User name.
    pub username: String,
    /// Their access level in the Pod's group (and so its project); 0: not a member.
    pub access_level: u8,
}

/// A personal access token.
#[derive(Clone, Debug)]
pub struct Pat {
    /// Token id.
    pub id: u64,
    /// Its user.
    pub user_id: u64,
    /// Its scopes (`k8s_proxy`, `read_api`, …).
    pub scopes: Vec<String>,
    /// Revoked tokens authenticate nobody.
    pub revoked: bool,
}

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
                    id: super::repo::project_path(pod),
                }],
                groups: Vec::new(),
            }),
            ci_access: None,
        }
    }
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
}

/// Users, tokens, sessions and agents.
pub struct KubeAccess {
    pod: PodId,
    inner: Mutex<Inner>,
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
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Add a user with `role` in the Pod's group (`None`: not a member): their id.
    pub fn add_user(&self, username: &str, role: Option<&str>) -> Result<u64, String> {
        let level = match role {
            None => 0,
            Some(r) => access_level(r).ok_or_else(|| format!("role {r:?}: not a GitLab role"))?,
        };
        let mut inner = self.lock();
        if inner.users.values().any(|u| u.username == username) {
            return Err(format!("username {username:?} is taken"));
        }
        let id = inner.users.keys().next_back().copied().unwrap_or(0) + 1;
        inner.users.insert(
            id,
            SimUser {
                id,
                username: username.to_owned(),
                access_level: level,
            },
        );
        Ok(id)
    }

    /// The users.
    pub fn users(&self) -> Vec<SimUser> {
        self.lock().users.values().cloned().collect()
    }

    /// The user called `username`.
    pub fn user_by_name(&self, username: &str) -> Option<SimUser> {
        self.lock()
            .users
            .values()
            .find(|u| u.username == username)
            .cloned()
    }

    /// Record `token` (issued by the caller, routable here) for `user_id` with
    /// `scopes`: its id.
    pub fn add_pat(&self, token: String, user_id: u64, scopes: Vec<String>) -> Result<u64, String> {
        let mut inner = self.lock();
        if !inner.users.contains_key(&user_id) {
            return Err(format!("user {user_id}: no such user"));
        }
        inner.next_pat += 1;
        let id = inner.next_pat;
        inner.pats.insert(
            token,
            Pat {
                id,
                user_id,
                scopes,
                revoked: false,
            },
        );
        Ok(id)
    }

    /// Revoke personal access token `id`: whether there was one.
    pub fn revoke_pat(&self, id: u64) -> bool {
        let mut inner = self.lock();
        match inner.pats.values_mut().find(|p| p.id == id) {
            Some(p) => {
                p.revoked = true;
                true
            }
            None => false,
        }
    }

    /// Whether `token` is one of this Pod's personal access tokens.
    pub fn is_pat(&self, token: &str) -> bool {
        self.lock().pats.contains_key(token)
    }

    /// Open a browser session for `user_id`: the public session id (the
    /// `_gitlab_kas` cookie's value) and its CSRF token are the caller's random
    /// strings.
    pub fn add_session(&self, user_id: u64, session: String, csrf: String) -> Result<(), String> {
        let mut inner = self.lock();
        if !inner.users.contains_key(&user_id) {
            return Err(format!("user {user_id}: no such user"));
        }
        inner.sessions.insert(session, (user_id, csrf));
        Ok(())
    }

    /// Register (or replace) an agent.
    pub fn put_agent(&self, agent: AgentSpec) {
        self.lock().agents.insert(agent.id, agent);
    }

    /// The agents.
    pub fn agents(&self) -> Vec<AgentSpec> {
        self.lock().agents.values().cloned().collect()
    }

    fn project_json(&self) -> Value {
        let path = super::repo::project_path(self.pod);
        let name = path.rsplit('/').next().unwrap_or(&path).to_owned();
        // `API::Entities::ProjectIdentity`.
        json!({
            "id": project_id(self.pod),
            "description": "",
            "name": name,
            "name_with_namespace": format!("{GROUP_PATH} / {name}"),
            "path": name,
            "path_with_namespace": path,
            "created_at": "2024-01-01T00:00:00.000Z",
        })
    }

    /// The id of the project or group at `path`, and whether it is a group.
    fn resolve(&self, path: &str) -> Option<(u64, bool)> {
        if path == GROUP_PATH {
            Some((GROUP_ID, true))
        } else if path == super::repo::project_path(self.pod) {
            Some((project_id(self.pod), false))
        } else {
            None
        }
    }

    /// The user a `session_cookie` or `personal_access_token` authenticates
    /// (`retrieve_user_from_session_cookie` / `…_personal_access_token`).
    fn user_for(
        &self,
        inner: &Inner,
        access_type: &str,
        access_key: &str,
        csrf_token: Option<&str>,
    ) -> Result<SimUser, Refusal> {
        let user_id = match access_type {
            "session_cookie" => {
                let Some((user, csrf)) = inner.sessions.get(access_key) else {
                    return Err(api_error(401, "401 Unauthorized - Invalid session"));
                };
                if Some(csrf.as_str()) != csrf_token {
                    return Err(api_error(
                        401,
                        "401 Unauthorized - CSRF token does not match",
                    ));
                }
                *user
            }
            _ => {
                let Some(pat) = inner.pats.get(access_key) else {
                    // `access_token` is nil: no user, a 400.
                    return Err(api_error(
                        400,
                        "400 Bad request - Unable to get user from request data",
                    ));
                };
                if pat.revoked {
                    return Err((
                        401,
                        json!({"error": "invalid_token", "error_description": "Token was revoked. You have to re-authorize from the user."}),
                    ));
                }
                if !pat.scopes.iter().any(|s| s == "k8s_proxy") {
                    return Err((
                        403,
                        json!({"error": "insufficient_scope",
                               "error_description": "The request requires higher privileges than provided by the access token.",
                               "scope": "k8s_proxy"}),
                    ));
                }
                pat.user_id
            }
        };
        inner
            .users
            .get(&user_id)
            .cloned()
            .ok_or_else(|| api_error(401, "401 Unauthorized - Invalid user in session"))
    }

    /// `POST /api/v4/internal/kubernetes/authorize_proxy_user` once its parameters are
    /// checked: the JSON answer, or the refusal.
    pub fn authorize_proxy_user(
        &self,
        agent_id: i64,
        access_type: &str,
        access_key: &str,
        csrf_token: Option<&str>,
    ) -> Result<Value, Refusal> {
        let inner = self.lock();
        let user = self.user_for(&inner, access_type, access_key, csrf_token)?;
        let Some(agent) = inner.agents.get(&agent_id) else {
            return Err(api_error(404, "404 Not found"));
        };
        let forbidden = || api_error(403, "403 Forbidden");
        let Some(user_access) = &agent.user_access else {
            return Err(forbidden());
        };
        let Some(access_as) = user_access.access_as.as_ref().filter(|a| a.len() == 1) else {
            return Err(forbidden());
        };
        // `use_k8s_proxies`: Developer or more in the project or group listed.
        let level = user.access_level;
        let authorized = |refs: &[PathRef], want_group: bool| -> Vec<u64> {
            refs.iter()
                .filter_map(|r| self.resolve(&r.id))
                .filter(|(_, is_group)| *is_group == want_group)
                .filter(|_| level >= 30)
                .map(|(id, _)| id)
                .collect()
        };
        let projects = authorized(&user_access.projects, false);
        let groups = authorized(&user_access.groups, true);
        let base = json!({
            "agent": {"id": agent.id, "config_project": {"id": project_id(self.pod)}},
            "user": {"id": user.id, "username": user.username},
        });
        let access_as = if access_as.contains_key("agent") {
            if projects.is_empty() && groups.is_empty() {
                return Err(forbidden());
            }
            json!({"agent": {}})
        } else if access_as.contains_key("user") {
            if projects.is_empty() && groups.is_empty() {
                return Err(api_error(
                    403,
                    "You must be a member of `projects` or `groups` under the `user_access` keyword.",
                ));
            }
            let entries = |ids: Vec<u64>| -> Vec<Value> {
                ids.into_iter()
                    .map(|id| json!({"id": id, "roles": roles(level)}))
                    .collect()
            };
            json!({"user": {"projects": entries(projects), "groups": entries(groups)}})
        } else {
            return Err(forbidden());
        };
        let mut answer = base;
        answer["access_as"] = access_as;
        Ok(answer)
    }

    /// `GET /api/v4/job/allowed_agents` for running job `job_id` of pipeline 1, run
    /// by user 1.
    pub fn allowed_agents(&self, job_id: u64) -> Value {
        let inner = self.lock();
        let project_path = super::repo::project_path(self.pod);
        let mut allowed = Vec::new();
        for agent in inner.agents.values() {
            let ci = agent.ci_access.clone().unwrap_or_default();
            let entry = ci
                .projects
                .iter()
                .find(|e| e.id == project_path)
                .or_else(|| ci.groups.iter().find(|e| e.id == GROUP_PATH));
            // The agent's own project is authorized implicitly, as the agent.
            let configuration = match entry {
                Some(e) => {
                    let mut c = serde_json::Map::new();
                    if !e.default_namespace.is_empty() {
                        c.insert("default_namespace".into(), json!(e.default_namespace));
                    }
                    if let Some(a) = &e.access_as {
                        c.insert("access_as".into(), a.clone());
                    }
                    Value::Object(c)
                }
                None => json!({}),
            };
            allowed.push(json!({
                "id": agent.id,
                "config_project": self.project_json(),
                "configuration": configuration,
            }));
        }
        let root = inner.users.get(&1).cloned();
        let (user_id, username, level) = root.map_or((1, "root".into(), 50), |u| {
            (u.id, u.username, u.access_level)
        });
        json!({
            "allowed_agents": allowed,
            "job": {"id": job_id},
            "pipeline": {"id": 1},
            "project": {"id": project_id(self.pod), "groups": [{"id": GROUP_ID}]},
            "user": {"id": user_id, "username": username, "roles_in_project": roles(level)},
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> PodId {
        PodId::new(2).unwrap()
    }

    fn access() -> KubeAccess {
        let mut as_agent = AgentSpec::with_user_access(8, pod());
        as_agent.user_access.as_mut().unwrap().access_as =
            Some([("agent".to_owned(), json!({}))].into_iter().collect());
        as_agent.user_access.as_mut().unwrap().projects.clear();
        as_agent.user_access.as_mut().unwrap().groups = vec![PathRef { id: "group".into() }];
        let none = AgentSpec {
            id: 9,
            name: "no-user-access".into(),
            user_access: None,
            ci_access: Some(CiAccessConfig {
                projects: vec![CiAccessEntry {
                    id: "group/project-2".into(),
                    default_namespace: "ci".into(),
                    access_as: Some(json!({"ci_job": {}})),
                    environments: Vec::new(),
                }],
                groups: Vec::new(),
            }),
        };
        let a = KubeAccess::new(
            pod(),
            &[AgentSpec::with_user_access(7, pod()), as_agent, none],
        );
        a.add_pat("glpat-root".into(), 1, vec!["k8s_proxy".into()])
            .unwrap();
        a.add_pat("glpat-api".into(), 1, vec!["read_api".into()])
            .unwrap();
        let dev = a.add_user("dev", Some("developer")).unwrap();
        a.add_pat("glpat-dev".into(), dev, vec!["k8s_proxy".into()])
            .unwrap();
        let guest = a.add_user("guest", Some("reporter")).unwrap();
        a.add_pat("glpat-guest".into(), guest, vec!["k8s_proxy".into()])
            .unwrap();
        a.add_session(dev, "sess".into(), "csrf".into()).unwrap();
        a
    }

    #[test]
    fn user_access_as_user_lists_roles() {
        let a = access();
        let v = a
            .authorize_proxy_user(7, "personal_access_token", "glpat-dev", None)
            .unwrap();
        assert_eq!(v["agent"], json!({"id": 7, "config_project": {"id": 1002}}));
        assert_eq!(v["user"]["username"], "dev");
        assert_eq!(
            v["access_as"]["user"]["projects"],
            json!([{"id": 1002, "roles": ["guest", "planner", "reporter", "developer"]}])
        );
        assert_eq!(v["access_as"]["user"]["groups"], json!([]));
        let v = a
            .authorize_proxy_user(8, "session_cookie", "sess", Some("csrf"))
            .unwrap();
        assert_eq!(v["access_as"], json!({"agent": {}}));
    }

    #[test]
    fn refusals_as_rails_answers_them() {
        let a = access();
        let status = |r: Result<Value, Refusal>| r.unwrap_err().0;
        assert_eq!(
            status(a.authorize_proxy_user(7, "personal_access_token", "glpat-nope", None)),
            400
        );
        assert_eq!(
            status(a.authorize_proxy_user(7, "personal_access_token", "glpat-api", None)),
            403
        );
        assert_eq!(
            status(a.authorize_proxy_user(7, "personal_access_token", "glpat-guest", None)),
            403
        );
        assert_eq!(
            status(a.authorize_proxy_user(99, "personal_access_token", "glpat-dev", None)),
            404
        );
        assert_eq!(
            status(a.authorize_proxy_user(9, "personal_access_token", "glpat-dev", None)),
            403
        );
        assert_eq!(
            status(a.authorize_proxy_user(7, "session_cookie", "sess", Some("bad"))),
            401
        );
        assert_eq!(
            status(a.authorize_proxy_user(7, "session_cookie", "other", Some("csrf"))),
            401
        );
        assert!(a.revoke_pat(1));
        assert_eq!(
            status(a.authorize_proxy_user(7, "personal_access_token", "glpat-root", None)),
            401
        );
    }

    #[test]
    fn allowed_agents_lists_every_agent_of_the_project_with_its_ci_access() {
        let v = access().allowed_agents(5);
        let agents = v["allowed_agents"].as_array().unwrap();
        assert_eq!(agents.len(), 3);
        assert_eq!(agents[0]["configuration"], json!({}));
        assert_eq!(agents[0]["config_project"]["id"], 1002);
        assert_eq!(
            agents[2]["configuration"],
            json!({"default_namespace": "ci", "access_as": {"ci_job": {}}})
        );
        assert_eq!(v["job"], json!({"id": 5}));
        assert_eq!(v["project"], json!({"id": 1002, "groups": [{"id": 100}]}));
        assert_eq!(v["user"]["username"], "root");
    }
}

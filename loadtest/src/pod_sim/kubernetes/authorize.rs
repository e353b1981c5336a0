//! The rules of the two endpoints kas calls: `POST
//! /api/v4/internal/kubernetes/authorize_proxy_user` and `GET
//! /api/v4/job/allowed_agents`.

use serde_json::{Value, json};

use super::{
    GROUP_ID, GROUP_PATH, Inner, KubeAccess, PathRef, Refusal, SimUser, api_error, project_id,
    roles,
};

impl KubeAccess {
    fn project_json(&self) -> Value {
        let path = super::super::repo::project_path(self.pod);
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
        } else if path == super::super::repo::project_path(self.pod) {
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
        let project_path = super::super::repo::project_path(self.pod);
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

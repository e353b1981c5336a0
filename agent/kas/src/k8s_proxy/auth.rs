//! Who a proxy request acts as: GitLab's answers about its credentials, cached
//! ([`super::cache`]), turned into an agent id and an optional impersonation, as
//! GitLab's kas does (`authenticateAndImpersonateRequest`, `getAllowedAgentsForJob`,
//! `authorizeProxyUser`, `construct…ImpersonationConfig` in
//! `internal/module/kubernetes_api/server/proxy.go`; the calls in
//! `internal/gitlab/api/authorize_proxy_user.go` and `get_allowed_agents.go`):
//!
//! - `ci:` → `GET /api/v4/job/allowed_agents` with `Job-Token` (GitLab 401 / 403 /
//!   404 → 401 "Unauthorized: CI job token" / 403 "Forbidden: CI job token" / 404
//!   "Not found: agents for CI job token", else 500); the agent must be listed (else
//!   403 "Forbidden: agentId is not allowed"); impersonation from the agent's
//!   `ci_access` `access_as` (`agent` or none: none; `impersonate`: as configured;
//!   `ci_job`: `gitlab:ci_job:<job id>` with the job's groups and extra).
//! - `pat:` and the `_gitlab_kas` cookie → `POST
//!   /api/v4/internal/kubernetes/authorize_proxy_user` with `{agent_id, access_type,
//!   access_key, csrf_token}` (`access_type` `personal_access_token` or
//!   `session_cookie`) and kas's `Gitlab-Kas-Api-Request` JWT (GitLab 401 / 403 / 404
//!   → 401 "Unauthorized", else 500 "Failed to authorize user session"); `access_as`
//!   `agent` → no impersonation, `user` → `gitlab:user:<username>` with groups
//!   `gitlab:user`, `gitlab:project_role:<id>:<role>`, `gitlab:group_role:<id>:<role>`
//!   and extra `agent.gitlab.com/{id,username,access_type,config_project_id}`.
//!   (The 2023 kas left `pat:` unchecked, a TODO; GitLab later sent it through
//!   `authorize_proxy_user`, which podgate does.)
//!
//! Tokens are never logged: only their fingerprints.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::cache::{Cache, Source};
use super::creds::Credentials;
use super::status::ErrResp;
use crate::gitlab::GitlabClient;
use podgate_agent::proto::kubernetes_api::{ExtraValue, ImpersonationConfig};

/// Who a request acts as.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Identity {
    /// The agent it goes to.
    pub agent_id: i64,
    /// Set when the cluster is to see someone other than the agent.
    pub impersonation: Option<ImpersonationConfig>,
}

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
struct AuthorizeProxyUserRequest<'a> {
    agent_id: i64,
    access_type: &'a str,
    access_key: &'a str,
    csrf_token: &'a str,
}

/// GitLab's API, cached.
pub(super) struct Authenticator {
    gitlab: GitlabClient,
    timeout: Duration,
    allowed_agents: Cache<Arc<AllowedAgentsForJob>>,
    proxy_user: Cache<Arc<AuthorizeProxyUserResponse>>,
    lookups: prometheus::IntCounterVec,
}

/// A GitLab call that failed in a way that is not cached.
struct Failure(String);

impl Authenticator {
    /// GitLab at `gitlab_url`, the internal API's JWT signed with `secret`; answers
    /// cached `positive` / `negative`; each call at most `timeout`. `registry` gets
    /// the lookup counter.
    pub(super) fn new(
        gitlab_url: &str,
        secret: Vec<u8>,
        positive: Duration,
        negative: Duration,
        timeout: Duration,
        registry: &prometheus::Registry,
    ) -> Authenticator {
        let lookups = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "podgate_kas_k8s_proxy_gitlab_lookups_total",
                "Kubernetes API proxy credentials checked with GitLab, by API \
                 (authorize_proxy_user, allowed_agents) and source (cached, fetched, error)",
            ),
            &["api", "source"],
        )
        .expect("valid metric");
        let _ = registry.register(Box::new(lookups.clone()));
        Authenticator {
            gitlab: GitlabClient::new(gitlab_url, secret),
            timeout,
            allowed_agents: Cache::new(positive, negative),
            proxy_user: Cache::new(positive, negative),
            lookups,
        }
    }

    fn count(&self, api: &str, source: Result<Source, ()>) {
        let source = match source {
            Ok(Source::Cached) => "cached",
            Ok(Source::Fetched) => "fetched",
            Err(()) => "error",
        };
        self.lookups.with_label_values(&[api, source]).inc();
    }

    /// Who `creds` act as towards `agent_id`, or the error answer.
    pub(super) async fn identify(
        &self,
        agent_id: i64,
        creds: &Credentials,
    ) -> Result<Identity, ErrResp> {
        match creds {
            Credentials::CiJob { token } => {
                let job = self.allowed_agents(token).await?;
                let Some(agent) = job.allowed_agents.iter().find(|a| a.id == agent_id) else {
                    return Err(ErrResp::new(
                        StatusCode::FORBIDDEN,
                        "Forbidden: agentId is not allowed",
                    ));
                };
                Ok(Identity {
                    agent_id,
                    impersonation: job_impersonation(&job, agent),
                })
            }
            Credentials::Pat { token } => {
                let auth = self
                    .authorize_proxy_user(agent_id, "personal_access_token", token, "")
                    .await?;
                Ok(Identity {
                    agent_id,
                    impersonation: user_impersonation(&auth, "personal_access_token"),
                })
            }
            Credentials::SessionCookie { session, csrf } => {
                let auth = self
                    .authorize_proxy_user(agent_id, "session_cookie", session, csrf)
                    .await?;
                Ok(Identity {
                    agent_id,
                    impersonation: user_impersonation(&auth, "session_cookie"),
                })
            }
        }
    }

    async fn allowed_agents(&self, token: &str) -> Result<Arc<AllowedAgentsForJob>, ErrResp> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let fetch = || async {
            let answer = tokio::time::timeout(
                self.timeout,
                self.gitlab.request(
                    Method::GET,
                    "/api/v4/job/allowed_agents",
                    &[("Job-Token", token)],
                    None,
                    false,
                ),
            )
            .await
            .map_err(|_| Failure("timed out".into()))?
            .map_err(|e| Failure(e.to_string()))?;
            match answer.status.as_u16() {
                s @ (401 | 403 | 404) => Ok(Err(s)),
                200..=299 => serde_json::from_slice::<AllowedAgentsForJob>(&answer.body)
                    .map(|a| Ok(Arc::new(a)))
                    .map_err(|e| Failure(format!("allowed_agents body: {e}"))),
                s => Err(Failure(format!(
                    "HTTP status code: {s} for path /api/v4/job/allowed_agents"
                ))),
            }
        };
        match self.allowed_agents.get(key, fetch).await {
            Ok((answer, source)) => {
                self.count("allowed_agents", Ok(source));
                answer.map_err(|status| match status {
                    401 => ErrResp::new(StatusCode::UNAUTHORIZED, "Unauthorized: CI job token"),
                    403 => ErrResp::new(StatusCode::FORBIDDEN, "Forbidden: CI job token"),
                    _ => ErrResp::new(StatusCode::NOT_FOUND, "Not found: agents for CI job token"),
                })
            }
            Err(Failure(why)) => {
                self.count("allowed_agents", Err(()));
                tracing::warn!(
                    token = %podgate_tokens::fingerprint(token),
                    error = %why,
                    "k8s proxy: allowed_agents failed"
                );
                Err(ErrResp::with_cause(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Failed to get allowed agents for CI job token",
                    why,
                ))
            }
        }
    }

    async fn authorize_proxy_user(
        &self,
        agent_id: i64,
        access_type: &str,
        access_key: &str,
        csrf_token: &str,
    ) -> Result<Arc<AuthorizeProxyUserResponse>, ErrResp> {
        // Delimited, so ("ab", "c") and ("a", "bc") differ (kas's cache key does the same).
        let mut h = Sha256::new();
        h.update(agent_id.to_le_bytes());
        for part in [access_type, access_key, csrf_token] {
            h.update(part.as_bytes());
            h.update([11u8]);
        }
        let key: [u8; 32] = h.finalize().into();
        let fetch = || async {
            let body = serde_json::to_vec(&AuthorizeProxyUserRequest {
                agent_id,
                access_type,
                access_key,
                csrf_token,
            })
            .map_err(|e| Failure(e.to_string()))?;
            let answer = tokio::time::timeout(
                self.timeout,
                self.gitlab.request(
                    Method::POST,
                    "/api/v4/internal/kubernetes/authorize_proxy_user",
                    &[],
                    Some(body),
                    true,
                ),
            )
            .await
            .map_err(|_| Failure("timed out".into()))?
            .map_err(|e| Failure(e.to_string()))?;
            match answer.status.as_u16() {
                s @ (401 | 403 | 404) => Ok(Err(s)),
                200..=299 => serde_json::from_slice::<AuthorizeProxyUserResponse>(&answer.body)
                    .map_err(|e| Failure(format!("authorize_proxy_user body: {e}")))
                    .and_then(|a| {
                        // `access_as` is a required oneof.
                        if a.access_as.agent.is_some() != a.access_as.user.is_some() {
                            Ok(Ok(Arc::new(a)))
                        } else {
                            Err(Failure(
                                "authorize_proxy_user: access_as must be agent or user".into(),
                            ))
                        }
                    }),
                s => Err(Failure(format!(
                    "HTTP status code: {s} for path /api/v4/internal/kubernetes/authorize_proxy_user"
                ))),
            }
        };
        match self.proxy_user.get(key, fetch).await {
            Ok((answer, source)) => {
                self.count("authorize_proxy_user", Ok(source));
                answer.map_err(|_| ErrResp::new(StatusCode::UNAUTHORIZED, "Unauthorized"))
            }
            Err(Failure(why)) => {
                self.count("authorize_proxy_user", Err(()));
                tracing::warn!(
                    agent_id,
                    access_type,
                    key = %podgate_tokens::fingerprint(access_key),
                    error = %why,
                    "k8s proxy: authorize_proxy_user failed"
                );
                Err(ErrResp::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Failed to authorize user session",
                ))
            }
        }
    }
}

fn extra(key: &str, value: impl Into<String>) -> ExtraValue {
    ExtraValue {
        key: key.into(),
        values: vec![value.into()],
    }
}

/// `constructUserImpersonationConfig`, `impUserGroups`, `impUserExtra`.
pub(super) fn user_impersonation(
    auth: &AuthorizeProxyUserResponse,
    access_type: &str,
) -> Option<ImpersonationConfig> {
    let user = auth.access_as.user.as_ref()?;
    let mut groups = vec!["gitlab:user".to_owned()];
    for p in &user.projects {
        for role in &p.roles {
            groups.push(format!("gitlab:project_role:{}:{role}", p.id));
        }
    }
    for g in &user.groups {
        for role in &g.roles {
            groups.push(format!("gitlab:group_role:{}:{role}", g.id));
        }
    }
    Some(ImpersonationConfig {
        username: format!("gitlab:user:{}", auth.user.username),
        groups,
        uid: String::new(),
        extra: vec![
            extra("agent.gitlab.com/id", auth.agent.id.to_string()),
            extra("agent.gitlab.com/username", auth.user.username.clone()),
            extra("agent.gitlab.com/access_type", access_type),
            extra(
                "agent.gitlab.com/config_project_id",
                auth.agent.config_project.id.to_string(),
            ),
        ],
    })
}

/// `constructJobImpersonationConfig`, `impCiJobGroups`, `impCiJobExtra`.
pub(super) fn job_impersonation(
    job: &AllowedAgentsForJob,
    agent: &AllowedAgent,
) -> Option<ImpersonationConfig> {
    let access_as = agent.configuration.as_ref()?.access_as.as_ref()?;
    if let Some(i) = &access_as.impersonate {
        return Some(ImpersonationConfig {
            username: i.username.clone(),
            groups: i.groups.clone(),
            uid: i.uid.clone(),
            extra: i
                .extra
                .iter()
                .map(|kv| ExtraValue {
                    key: kv.key.clone(),
                    values: kv.val.clone(),
                })
                .collect(),
        });
    }
    access_as.ci_job.as_ref()?;
    let mut groups = vec!["gitlab:ci_job".to_owned()];
    for g in &job.project.groups {
        groups.push(format!("gitlab:group:{}", g.id));
        if let Some(env) = &job.environment {
            groups.push(format!("gitlab:group_env_tier:{}:{}", g.id, env.tier));
        }
    }
    groups.push(format!("gitlab:project:{}", job.project.id));
    if let Some(env) = &job.environment {
        groups.push(format!(
            "gitlab:project_env:{}:{}",
            job.project.id, env.slug
        ));
        groups.push(format!(
            "gitlab:project_env_tier:{}:{}",
            job.project.id, env.tier
        ));
    }
    let mut extras = vec![
        extra("agent.gitlab.com/id", agent.id.to_string()),
        extra(
            "agent.gitlab.com/config_project_id",
            agent.config_project.id.to_string(),
        ),
        extra("agent.gitlab.com/project_id", job.project.id.to_string()),
        extra(
            "agent.gitlab.com/ci_pipeline_id",
            job.pipeline.id.to_string(),
        ),
        extra("agent.gitlab.com/ci_job_id", job.job.id.to_string()),
        extra("agent.gitlab.com/username", job.user.username.clone()),
    ];
    if let Some(env) = &job.environment {
        extras.push(extra("agent.gitlab.com/environment_slug", env.slug.clone()));
        extras.push(extra("agent.gitlab.com/environment_tier", env.tier.clone()));
    }
    Some(ImpersonationConfig {
        username: format!("gitlab:ci_job:{}", job.job.id),
        groups,
        uid: String::new(),
        extra: extras,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_access_impersonates_with_roles_and_extra() {
        let auth: AuthorizeProxyUserResponse = serde_json::from_value(serde_json::json!({
            "agent": {"id": 3, "config_project": {"id": 1001}},
            "user": {"id": 1, "username": "root"},
            "access_as": {"user": {
                "projects": [{"id": 1001, "roles": ["guest", "developer"]}],
                "groups": [{"id": 100, "roles": ["owner"]}]
            }}
        }))
        .unwrap();
        let imp = user_impersonation(&auth, "personal_access_token").unwrap();
        assert_eq!(imp.username, "gitlab:user:root");
        assert_eq!(
            imp.groups,
            [
                "gitlab:user",
                "gitlab:project_role:1001:guest",
                "gitlab:project_role:1001:developer",
                "gitlab:group_role:100:owner"
            ]
        );
        let extra: Vec<(String, Vec<String>)> =
            imp.extra.into_iter().map(|e| (e.key, e.values)).collect();
        assert_eq!(
            extra,
            [
                ("agent.gitlab.com/id".into(), vec!["3".into()]),
                ("agent.gitlab.com/username".into(), vec!["root".into()]),
                (
                    "agent.gitlab.com/access_type".into(),
                    vec!["personal_access_token".into()]
                ),
                (
                    "agent.gitlab.com/config_project_id".into(),
                    vec!["1001".into()]
                ),
            ]
        );
        let agent: AuthorizeProxyUserResponse = serde_json::from_value(serde_json::json!({
            "agent": {"id": 3, "config_project": {"id": 1001}},
            "user": {"id": 1, "username": "root"},
            "access_as": {"agent": {}}
        }))
        .unwrap();
        assert!(user_impersonation(&agent, "session_cookie").is_none());
    }

    fn job(access_as: serde_json::Value, env: bool) -> AllowedAgentsForJob {
        let mut v = serde_json::json!({
            "allowed_agents": [{"id": 3, "config_project": {"id": 1001},
                                "configuration": {"access_as": access_as}}],
            "job": {"id": 77}, "pipeline": {"id": 7},
            "project": {"id": 1001, "groups": [{"id": 100}]},
            "user": {"id": 1, "username": "root", "roles_in_project": ["owner"]}
        });
        if env {
            v["environment"] = serde_json::json!({"slug": "prod", "tier": "production"});
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn ci_access_as_agent_ci_job_or_impersonate() {
        let j = job(serde_json::json!({"agent": {}}), false);
        assert!(job_impersonation(&j, &j.allowed_agents[0]).is_none());
        let j = job(serde_json::Value::Null, false);
        assert!(job_impersonation(&j, &j.allowed_agents[0]).is_none());

        let j = job(serde_json::json!({"ci_job": {}}), true);
        let imp = job_impersonation(&j, &j.allowed_agents[0]).unwrap();
        assert_eq!(imp.username, "gitlab:ci_job:77");
        assert_eq!(
            imp.groups,
            [
                "gitlab:ci_job",
                "gitlab:group:100",
                "gitlab:group_env_tier:100:production",
                "gitlab:project:1001",
                "gitlab:project_env:1001:prod",
                "gitlab:project_env_tier:1001:production"
            ]
        );
        let keys: Vec<&str> = imp.extra.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "agent.gitlab.com/id",
                "agent.gitlab.com/config_project_id",
                "agent.gitlab.com/project_id",
                "agent.gitlab.com/ci_pipeline_id",
                "agent.gitlab.com/ci_job_id",
                "agent.gitlab.com/username",
                "agent.gitlab.com/environment_slug",
                "agent.gitlab.com/environment_tier"
            ]
        );

        let j = job(
            serde_json::json!({"impersonate": {"username": "deployer", "groups": ["ops"],
                "uid": "u1", "extra": [{"key": "k", "val": ["a", "b"]}]}}),
            false,
        );
        let imp = job_impersonation(&j, &j.allowed_agents[0]).unwrap();
        assert_eq!(
            (imp.username.as_str(), imp.groups, imp.uid.as_str()),
            ("deployer", vec!["ops".to_owned()], "u1")
        );
        assert_eq!(imp.extra[0].values, ["a", "b"]);
    }
}

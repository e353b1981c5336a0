//! Who a proxy request acts as: GitLab's answers about its credentials (`gitlab_api`),
//! cached (`crate::answer_cache`), turned into an agent id and an optional impersonation, as
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
//!   `pat:` goes through `authorize_proxy_user` as in GitLab's kas today; the 2023
//!   kas the rest follows leaves it unchecked (a TODO there).
//!
//! The impersonation itself is built in `impersonation`. Tokens are never logged:
//! only their fingerprints.

mod gitlab_api;
mod impersonation;

pub use gitlab_api::{
    AccessAs, AllowedAgent, AllowedAgentsForJob, AuthorizeProxyUserResponse, AuthorizedAgent,
    CiAccessAs, CiConfiguration, CiImpersonate, Environment, ExtraKeyVal, IdOnly, JobProject,
    RoleAccess, User, UserAccess,
};

use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use serde::de::DeserializeOwned;
use sha2::{Digest as _, Sha256};

use self::gitlab_api::AuthorizeProxyUserRequest;
use self::impersonation::{job_impersonation, user_impersonation};
use super::creds::Credentials;
use super::status::ErrResp;
use crate::answer_cache::{Answer, AnswerCache, Source};
use crate::gitlab::GitlabClient;
use podgate_agent::proto::kubernetes_api::ImpersonationConfig;

/// Who a request acts as.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Identity {
    /// The agent it goes to.
    pub agent_id: i64,
    /// Set when the cluster is to see someone other than the agent.
    pub impersonation: Option<ImpersonationConfig>,
}

/// GitLab's API, cached.
pub(super) struct Authenticator {
    gitlab: GitlabClient,
    timeout: Duration,
    allowed_agents: AnswerCache<Arc<AllowedAgentsForJob>>,
    proxy_user: AnswerCache<Arc<AuthorizeProxyUserResponse>>,
    lookups: prometheus::IntCounterVec,
}

/// A GitLab call that failed in a way that is not cached.
struct Failure(String);

/// `GET /api/v4/job/allowed_agents`.
const ALLOWED_AGENTS: &str = "/api/v4/job/allowed_agents";
/// `POST /api/v4/internal/kubernetes/authorize_proxy_user`.
const AUTHORIZE_PROXY_USER: &str = "/api/v4/internal/kubernetes/authorize_proxy_user";

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
            allowed_agents: AnswerCache::new(positive, negative),
            proxy_user: AnswerCache::new(positive, negative),
            lookups,
        }
    }

    fn count(&self, api: &str, source: Result<Source, ()>) {
        let source = match source {
            // Another caller's call, waited for, counts as cached.
            Ok(Source::Cached | Source::Joined) => "cached",
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

    /// GitLab's answer to `method path`, within the timeout: a yes (the body as `T`),
    /// a cacheable no (401, 403, 404), or a [`Failure`].
    async fn ask<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
        internal: bool,
    ) -> Result<Answer<T>, Failure> {
        let answer = tokio::time::timeout(
            self.timeout,
            self.gitlab.request(method, path, headers, body, internal),
        )
        .await
        .map_err(|_| Failure("timed out".into()))?
        .map_err(|e| Failure(e.to_string()))?;
        match answer.status.as_u16() {
            s @ (401 | 403 | 404) => Ok(Err(s)),
            200..=299 => serde_json::from_slice::<T>(&answer.body)
                .map(Ok)
                .map_err(|e| {
                    let api = path.rsplit('/').next().unwrap_or(path);
                    Failure(format!("{api} body: {e}"))
                }),
            s => Err(Failure(format!("HTTP status code: {s} for path {path}"))),
        }
    }

    async fn allowed_agents(&self, token: &str) -> Result<Arc<AllowedAgentsForJob>, ErrResp> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let fetch = || async {
            self.ask::<AllowedAgentsForJob>(
                Method::GET,
                ALLOWED_AGENTS,
                &[("Job-Token", token)],
                None,
                false,
            )
            .await
            .map(|answer| answer.map(Arc::new))
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
            match self
                .ask::<AuthorizeProxyUserResponse>(
                    Method::POST,
                    AUTHORIZE_PROXY_USER,
                    &[],
                    Some(body),
                    true,
                )
                .await?
            {
                // `access_as` is a required oneof.
                Ok(a) if a.access_as.agent.is_some() == a.access_as.user.is_some() => Err(Failure(
                    "authorize_proxy_user: access_as must be agent or user".into(),
                )),
                answer => Ok(answer.map(Arc::new)),
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

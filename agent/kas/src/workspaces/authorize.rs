//! GitLab's two questions, cached (`crate::answer_cache`: concurrent lookups of one
//! key make one call): whose token it is (`GET /api/v4/user`), and whether that user
//! may reach the host (Rails' `agentw/authorize_user_access`). A refusal GitLab
//! gives is cached as a no; GitLab failing or not answering in time is not cached.

use http::{Method, StatusCode};
use serde_json::Value;
use sha2::Digest as _;

use super::refusal::Refusal;
use super::{WorkspacesServer, workspace_name};
use crate::gitlab::Answer;

/// Rails' authorize answer, when it is a yes.
#[derive(Clone, Debug)]
pub(super) struct Authorized {
    /// Rails' workspace id.
    pub(super) workspace_id: i64,
    /// The workspace port the host names.
    pub(super) port: u32,
}

impl WorkspacesServer {
    /// GitLab's answer to `GET path` within the configured timeout; a bad gateway
    /// naming the call (`what`) when GitLab fails or does not answer in time.
    async fn get(
        &self,
        what: &str,
        path: &str,
        headers: &[(&str, &str)],
        internal: bool,
    ) -> Result<Answer, Refusal> {
        tokio::time::timeout(
            self.config.timeout,
            self.gitlab
                .request(Method::GET, path, headers, None, internal),
        )
        .await
        .map_err(|_| Refusal::bad_gateway(format!("GitLab did not answer {what} in time")))?
        .map_err(|e| Refusal::bad_gateway(format!("GitLab: {e}")))
    }

    /// The user `token` authenticates, from GitLab's `GET /api/v4/user` (cached).
    pub(super) async fn user(&self, token: &str) -> Result<i64, Refusal> {
        let key: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        let fetch = || async {
            let bearer = format!("Bearer {token}");
            let answer = self
                .get(
                    "GET /api/v4/user",
                    "/api/v4/user",
                    &[("authorization", bearer.as_str())],
                    false,
                )
                .await?;
            let verdict = match answer.status.as_u16() {
                200 => match serde_json::from_slice::<Value>(&answer.body)
                    .ok()
                    .and_then(|v| v["id"].as_i64())
                {
                    Some(id) => Ok(id),
                    None => return Err(Refusal::bad_gateway("GitLab's user has no id")),
                },
                401 => Err(Refusal::unauthorized("invalid token")),
                403 => Err(Refusal::unauthorized(
                    "the token cannot read its user (scope api, read_api or read_user)",
                )),
                s => {
                    return Err(Refusal::bad_gateway(format!(
                        "GitLab answered GET /api/v4/user with {s}"
                    )));
                }
            };
            tracing::debug!(
                token = %podgate_tokens::fingerprint(token),
                ok = verdict.is_ok(),
                "workspaces: token looked up"
            );
            Ok(verdict)
        };
        self.users
            .get(key, fetch)
            .await
            .and_then(|(verdict, _)| verdict)
    }

    /// Rails' `authorize_user_access` for `user_id` on `host` (cached).
    pub(super) async fn authorize(&self, user_id: i64, host: &str) -> Result<Authorized, Refusal> {
        let key = (user_id, host.to_owned());
        let fetch = || async {
            let path = format!(
                "/api/v4/internal/agents/agentw/authorize_user_access?workspace_host={}&user_id={user_id}",
                query_escape(host)
            );
            let answer = self.get("authorize_user_access", &path, &[], true).await?;
            if answer.status != StatusCode::OK {
                return Err(Refusal::bad_gateway(format!(
                    "GitLab answered authorize_user_access with {}",
                    answer.status.as_u16()
                )));
            }
            let v: Value = serde_json::from_slice(&answer.body)
                .map_err(|_| Refusal::bad_gateway("GitLab's authorize_user_access is not JSON"))?;
            let name = workspace_name(host).unwrap_or_default();
            let verdict = match v["status"].as_str().unwrap_or("") {
                "AUTHORIZED" => {
                    let port = v["info"]["port"].as_str().and_then(|p| p.parse().ok());
                    let id = v["info"]["workspace_id"].as_i64();
                    match (port, id) {
                        (Some(port), Some(workspace_id)) => Ok(Authorized { workspace_id, port }),
                        _ => {
                            return Err(Refusal::bad_gateway(format!(
                                "GitLab authorized {host:?} without a usable port and workspace id"
                            )));
                        }
                    }
                }
                "INVALID_HOST" => Err(Refusal::new(
                    StatusCode::BAD_REQUEST,
                    "INVALID_HOST",
                    format!("{host:?} is not a workspace host (<port>-<workspace name>.<domain>)"),
                )
                .counted("invalid_host")),
                "WORKSPACE_NOT_FOUND" => Err(Refusal::new(
                    StatusCode::NOT_FOUND,
                    "WORKSPACE_NOT_FOUND",
                    format!("workspace {name} not found"),
                )
                .counted("workspace_not_found")),
                "PORT_NOT_FOUND" => Err(Refusal::new(
                    StatusCode::NOT_FOUND,
                    "PORT_NOT_FOUND",
                    format!("workspace {name} does not expose this port"),
                )
                .counted("port_not_found")),
                "NOT_AUTHORIZED" => Err(Refusal::new(
                    StatusCode::FORBIDDEN,
                    "NOT_AUTHORIZED",
                    format!("you may not access workspace {name}"),
                )
                .counted("not_authorized")),
                other => {
                    return Err(Refusal::bad_gateway(format!(
                        "GitLab's authorize_user_access status {other:?} is unknown"
                    )));
                }
            };
            Ok(verdict)
        };
        self.verdicts
            .get(key, fetch)
            .await
            .and_then(|(verdict, _)| verdict)
    }
}

/// A query value percent-encoded (unreserved characters kept, a space as `%20`).
pub(super) fn query_escape(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, crate::gitlab_access::url::COMPONENT).to_string()
}

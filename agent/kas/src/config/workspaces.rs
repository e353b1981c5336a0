//! `[workspaces]`: the type, its defaults and its checks.

use std::net::SocketAddr;

use serde::Deserialize;

use super::super::workspaces::WorkspacesConfig;
use super::{default_lookup_timeout, default_max_request_body, is_http_url, require_positive};

/// `[workspaces]`: kas's Workspaces HTTP server (GitLab's kascfg
/// `workspaces.listen.address`; chart port 8160), user traffic for workspaces.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspacesFile {
    /// `ip:port`.
    pub listen: String,
    /// GitLab's base URL for `/api/v4/user` and `agentw/authorize_user_access`
    /// (default: `[gitlab] url`).
    #[serde(default)]
    pub gitlab_url: Option<String>,
    /// How long a token's user and GitLab's yes to a host are cached.
    #[serde(default = "default_ws_user_ttl", with = "humantime_serde")]
    pub user_ttl: std::time::Duration,
    /// How long GitLab's no to a token is cached.
    #[serde(default = "default_ws_negative_ttl", with = "humantime_serde")]
    pub negative_ttl: std::time::Duration,
    /// How long one GitLab call may take.
    #[serde(default = "default_lookup_timeout", with = "humantime_serde")]
    pub timeout: std::time::Duration,
    /// Largest request body forwarded (bytes); 413 above.
    #[serde(default = "default_max_request_body")]
    pub max_request_body: usize,
}

fn default_ws_user_ttl() -> std::time::Duration {
    std::time::Duration::from_secs(30)
}

fn default_ws_negative_ttl() -> std::time::Duration {
    std::time::Duration::from_secs(5)
}

impl WorkspacesFile {
    /// Check every field (problems into `bad`) and build the runtime
    /// configuration; `gitlab_url` is the `[gitlab] url` default.
    pub(super) fn validate(
        &self,
        gitlab_url: Option<&str>,
        bad: &mut Vec<String>,
    ) -> Option<WorkspacesConfig> {
        let before = bad.len();
        let listen = self.listen.parse::<SocketAddr>().ok();
        if listen.is_none() {
            bad.push(format!(
                "workspaces.listen = {:?}: expected ip:port",
                self.listen
            ));
        }
        let url = match (&self.gitlab_url, gitlab_url) {
            (Some(u), _) => {
                if !is_http_url(u) {
                    bad.push(format!(
                        "workspaces.gitlab_url = {u:?}: must be http://host:port"
                    ));
                }
                u.clone()
            }
            (None, Some(u)) => u.to_owned(),
            (None, None) => {
                bad.push("workspaces.gitlab_url: required when [gitlab] is not set".into());
                String::new()
            }
        };
        require_positive(
            bad,
            [
                ("workspaces.user_ttl", self.user_ttl),
                ("workspaces.negative_ttl", self.negative_ttl),
                ("workspaces.timeout", self.timeout),
            ],
        );
        if self.max_request_body == 0 {
            bad.push("workspaces.max_request_body: must be positive".into());
        }
        match listen {
            Some(listen) if bad.len() == before => Some(WorkspacesConfig {
                listen,
                gitlab_url: url,
                user_ttl: self.user_ttl,
                negative_ttl: self.negative_ttl,
                timeout: self.timeout,
                max_request_body: self.max_request_body,
            }),
            _ => None,
        }
    }
}

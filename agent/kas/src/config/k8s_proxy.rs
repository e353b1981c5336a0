//! `[k8s_proxy]`: the type, its defaults and its checks.

use std::net::SocketAddr;

use serde::Deserialize;

use super::super::k8s_proxy::K8sProxyConfig;
use super::{default_lookup_timeout, default_max_request_body, require_positive};

/// `[k8s_proxy]`: the Kubernetes API proxy (`kubectl`, the Graph API). Defaults as
/// GitLab's kas (`internal/module/kubernetes_api/server/defaulting.go`): a yes from
/// GitLab cached 1 minute, a no 10 seconds.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct K8sProxyFile {
    /// `ip:port`.
    pub listen: String,
    /// The URL path prefix every request must start with (a `/` is appended when
    /// missing).
    #[serde(default = "default_url_prefix")]
    pub url_prefix: String,
    /// Origins (`scheme://host[:port]`) browsers may call from; a request with
    /// another `Origin` is refused (403).
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// GitLab's base URL for `authorize_proxy_user` and `job/allowed_agents`
    /// (default: `[agent_info] url`).
    #[serde(default)]
    pub gitlab_url: Option<String>,
    /// How long GitLab's yes is cached.
    #[serde(default = "default_proxy_positive_ttl", with = "humantime_serde")]
    pub positive_ttl: std::time::Duration,
    /// How long GitLab's no (401, 403, 404) is cached.
    #[serde(default = "default_proxy_negative_ttl", with = "humantime_serde")]
    pub negative_ttl: std::time::Duration,
    /// How long one GitLab call may take.
    #[serde(default = "default_lookup_timeout", with = "humantime_serde")]
    pub timeout: std::time::Duration,
    /// Largest request body forwarded (bytes); 413 above.
    #[serde(default = "default_max_request_body")]
    pub max_request_body: usize,
}

fn default_url_prefix() -> String {
    "/k8s-proxy/".into()
}

fn default_proxy_positive_ttl() -> std::time::Duration {
    std::time::Duration::from_secs(60)
}

fn default_proxy_negative_ttl() -> std::time::Duration {
    std::time::Duration::from_secs(10)
}

impl K8sProxyFile {
    /// Check every field (problems into `bad`, each naming its field) and build the
    /// runtime configuration; `agent_info_url` is the `gitlab_url` default (the
    /// `[agent_info]` URL, else `[gitlab] url`).
    pub(super) fn validate(
        &self,
        agent_info_url: Option<&str>,
        bad: &mut Vec<String>,
    ) -> Option<K8sProxyConfig> {
        let before = bad.len();
        let listen = match self.listen.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                bad.push(format!(
                    "k8s_proxy.listen = {:?}: expected ip:port",
                    self.listen
                ));
                None
            }
        };
        if !self.url_prefix.starts_with('/') {
            bad.push(format!(
                "k8s_proxy.url_prefix = {:?}: must start with /",
                self.url_prefix
            ));
        }
        let mut url_prefix = self.url_prefix.clone();
        if !url_prefix.ends_with('/') {
            url_prefix.push('/');
        }
        for (i, origin) in self.allowed_origins.iter().enumerate() {
            let rest = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"));
            if !rest.is_some_and(|r| !r.is_empty() && !r.contains('/')) {
                bad.push(format!(
                    "k8s_proxy.allowed_origins[{i}] = {origin:?}: an origin, scheme://host[:port] with no path"
                ));
            }
        }
        let gitlab_url = match (&self.gitlab_url, agent_info_url) {
            (Some(u), _) => {
                if !u.starts_with("http://") {
                    bad.push(format!(
                        "k8s_proxy.gitlab_url = {u:?}: must be http://host:port"
                    ));
                }
                u.clone()
            }
            (None, Some(u)) => u.to_owned(),
            (None, None) => {
                bad.push(
                    "k8s_proxy.gitlab_url: required (GitLab's internal API) when neither [agent_info] nor [gitlab] is set"
                        .into(),
                );
                String::new()
            }
        };
        require_positive(
            bad,
            [
                ("k8s_proxy.positive_ttl", self.positive_ttl),
                ("k8s_proxy.negative_ttl", self.negative_ttl),
                ("k8s_proxy.timeout", self.timeout),
            ],
        );
        if self.max_request_body == 0 {
            bad.push("k8s_proxy.max_request_body: must be positive".into());
        }
        match listen {
            Some(listen) if bad.len() == before => Some(K8sProxyConfig {
                listen,
                url_prefix,
                allowed_origins: self.allowed_origins.clone(),
                gitlab_url,
                positive_ttl: self.positive_ttl,
                negative_ttl: self.negative_ttl,
                timeout: self.timeout,
                max_request_body: self.max_request_body,
            }),
            _ => None,
        }
    }
}

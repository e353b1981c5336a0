//! The small sections: `[gitlab]`, `[agent_configuration]`, `[agent_info]`.

use std::path::PathBuf;

use serde::Deserialize;

use super::default_lookup_timeout;

/// `[gitlab]`: the Pod's GitLab, for its internal API (modules' requests, agent
/// configurations; the default of `[agent_info] url` and `[k8s_proxy] gitlab_url`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GitlabFile {
    /// GitLab's base URL (`http://host:port`).
    pub url: String,
    /// GitLab's URL as its users see it (`https://gitlab.example.com`): the
    /// `gitlab_external_url` of each agent configuration (GitLab's
    /// `gitlab.external_url`); default: none.
    #[serde(default)]
    pub external_url: Option<String>,
}

/// `[agent_configuration]`: agent configuration files, `<dir>/<agent id>.yaml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfigurationFile {
    /// The directory.
    pub dir: PathBuf,
    /// How often each configuration stream looks at its file (GitLab's kas polls
    /// the repository every 20 s by default).
    #[serde(default = "default_config_poll", with = "humantime_serde")]
    pub poll: std::time::Duration,
}

fn default_config_poll() -> std::time::Duration {
    std::time::Duration::from_secs(20)
}

/// `[agent_info]`: GitLab's internal API, asked about opaque agent tokens.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentInfoFile {
    /// GitLab's base URL (`http://host:port`; default: `[gitlab] url`).
    #[serde(default)]
    pub url: Option<String>,
    /// How long a yes is cached.
    #[serde(default = "default_positive_ttl", with = "humantime_serde")]
    pub positive_ttl: std::time::Duration,
    /// How long a no is cached.
    #[serde(default = "default_negative_ttl", with = "humantime_serde")]
    pub negative_ttl: std::time::Duration,
    /// How long one lookup may take.
    #[serde(default = "default_lookup_timeout", with = "humantime_serde")]
    pub timeout: std::time::Duration,
}

fn default_positive_ttl() -> std::time::Duration {
    std::time::Duration::from_secs(300)
}

fn default_negative_ttl() -> std::time::Duration {
    std::time::Duration::from_secs(60)
}

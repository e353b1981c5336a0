//! `kas.toml`: typed, defaulted, validated; every problem names its field.
//!
//! ```toml
//! agent_listen = "0.0.0.0:8150"        # agentk
//! external_listen = "0.0.0.0:8153"     # GitLab (KasApi)
//! internal_listen = "0.0.0.0:8155"     # other kas (KasInternal)
//! advertise_internal = "10.0.0.2:8155" # how other kas reach this one
//! external_secret_file = "/etc/kas/.gitlab_kas_secret"   # base64, >= 32 bytes
//! internal_secret_file = "/etc/kas/.kas_internal_secret" # base64, >= 32 bytes
//! issuer = "gitlab.example.com"       # optional: the only JWT issuer GitLab may use
//!                                      # (default: any, as GitLab's kas)
//! agent_keys = ["/etc/kas/agent-keys"] # verify agent JWTs
//! observability_listen = "0.0.0.0:8151" # /metrics, /healthz, /readyz ("off": none)
//! metrics_token_file = "/etc/kas/metrics-token" # /metrics wants `Bearer <token>`
//! max_wait = "60s"                     # longest a request waits for its agent
//! max_idle_tunnels_per_agent = 256      # idle reverse tunnels kept per agent
//! [gitlab]                             # optional: the Pod's GitLab (internal API)
//! url = "http://gitlab-webservice:8080" # modules' requests (GitlabAccess.MakeRequest),
//!                                      # agent configurations; [agent_info] and
//!                                      # [k8s_proxy] default to it
//! external_url = "https://gitlab.example.com" # optional: sent to agentk in its
//!                                      # configuration (gitlab_external_url)
//! [agent_configuration]                # optional: agent configuration files
//! dir = "/etc/kas/agents"              # <dir>/<agent id>.yaml, sent to agentk and
//!                                      # posted to GitLab on change
//! poll = "20s"                         # how often each stream looks at its file
//! [agent_info]                         # optional: opaque agent tokens, asked of GitLab
//! url = "http://gitlab-webservice:8080" # default: [gitlab] url
//! positive_ttl = "5m"
//! negative_ttl = "1m"
//! [k8s_proxy]                          # optional: the Kubernetes API proxy (/graph too)
//! listen = "0.0.0.0:8154"
//! url_prefix = "/k8s-proxy/"            # normalised to end with "/"
//! allowed_origins = ["https://gitlab.example.com"] # browsers' Origin (CORS)
//! gitlab_url = "http://gitlab-webservice:8080" # default: [agent_info] url, [gitlab] url
//! positive_ttl = "1m"                   # authorize_proxy_user / allowed_agents yes
//! negative_ttl = "10s"                  # their 401/403/404
//! timeout = "5s"                        # one GitLab call
//! max_request_body = 16777216           # bytes; 413 above
//! [workspaces]                         # optional: the Workspaces HTTP server
//! listen = "0.0.0.0:8160"               # https://<port>-<workspace>.<zone>/ traffic
//! gitlab_url = "http://gitlab-webservice:8080" # default: [gitlab] url
//! user_ttl = "30s"                      # a token's user, GitLab's yes to a host
//! negative_ttl = "5s"                   # GitLab's no to a token
//! timeout = "5s"                        # one GitLab call
//! max_request_body = 16777216           # bytes; 413 above
//! [job_router]                         # optional: GitLab's Job Router (GetJob) for runners
//! enabled = true                       # false: UNIMPLEMENTED, runners poll REST
//! runner_queue_redis = "redis://redis:6379" # the Cell's runner queue keys: hold
//!                                      # long polls here (none: ask Rails at once)
//! hold = "50s"                          # longest hold (ends 1 s before the deadline)
//! max_held = 50000                      # calls held at once; more go to Rails
//! max_held_per_runner = 4               # per runner token
//! [registry]
//! backend = { kind = "redis", url = "redis://127.0.0.1:6379" }
//! ```
//!
//! Layout: this module holds the file's top level ([`KasFileConfig`], its loading
//! and the shared checks); `validate.rs` checks it all and builds the runtime
//! [`KasConfig`]; `k8s_proxy.rs`, `workspaces.rs` and `job_router.rs` hold those sections (type,
//! defaults, checks); `sections.rs` the small ones (`[gitlab]`,
//! `[agent_configuration]`, `[agent_info]`); unit tests in `config/tests.rs`.

mod job_router;
mod k8s_proxy;
mod sections;
#[cfg(test)]
mod tests;
mod validate;
mod workspaces;

use std::path::{Path, PathBuf};
use std::time::Duration;

use podgate_registry::RegistryConfig;
use serde::Deserialize;

pub use self::job_router::JobRouterFile;
pub use self::k8s_proxy::K8sProxyFile;
pub use self::sections::{AgentConfigurationFile, AgentInfoFile, GitlabFile};
pub use self::workspaces::WorkspacesFile;
use super::KasConfig;

/// Configuration problems.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Invalid; every problem listed.
    #[error("invalid kas configuration in {origin}: {}", problems.join("; "))]
    Invalid {
        /// The file.
        origin: String,
        /// Each problem, naming its field.
        problems: Vec<String>,
    },
}

/// The file's contents.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KasFileConfig {
    /// agentk-facing listener.
    pub agent_listen: String,
    /// GitLab-facing listener.
    pub external_listen: String,
    /// kas-facing listener.
    pub internal_listen: String,
    /// How other kas instances reach this one (default: `internal_listen`).
    #[serde(default)]
    pub advertise_internal: Option<String>,
    /// The GitLab ↔ kas secret file (base64, ≥ 32 bytes).
    pub external_secret_file: PathBuf,
    /// The kas ↔ kas secret file (base64, ≥ 32 bytes).
    pub internal_secret_file: PathBuf,
    /// The only JWT issuer accepted on the external listener (Rails signs with its
    /// host name). Default: any issuer, as GitLab's kas, which checks only the
    /// audience (`gitlab-kas`) and the signature.
    #[serde(default)]
    pub issuer: Option<String>,
    /// Files or directories of keys verifying agent tokens.
    #[serde(default)]
    pub agent_keys: Vec<PathBuf>,
    /// The presence registry.
    #[serde(default)]
    pub registry: RegistryConfig,
    /// Longest a GitLab request waits for its agent to connect anywhere.
    #[serde(default = "default_max_wait", with = "humantime_serde")]
    pub max_wait: std::time::Duration,
    /// Idle reverse tunnels held per agent (all replicas together); more are refused.
    #[serde(default = "default_max_idle_tunnels")]
    pub max_idle_tunnels_per_agent: usize,
    /// The observability listener, `ip:port` or `"off"`.
    #[serde(default = "default_observability")]
    pub observability_listen: String,
    /// A file holding the bearer token `/metrics` requires (none: open, so keep the
    /// listener on a private address).
    #[serde(default)]
    pub metrics_token_file: Option<PathBuf>,
    /// GitLab's `agent_info` endpoint, for opaque agent tokens.
    #[serde(default)]
    pub agent_info: Option<AgentInfoFile>,
    /// The Kubernetes API proxy listener, if any.
    #[serde(default)]
    pub k8s_proxy: Option<K8sProxyFile>,
    /// The Pod's GitLab, if any.
    #[serde(default)]
    pub gitlab: Option<GitlabFile>,
    /// Agent configuration files, if any.
    #[serde(default)]
    pub agent_configuration: Option<AgentConfigurationFile>,
    /// The Workspaces HTTP server, if any.
    #[serde(default)]
    pub workspaces: Option<WorkspacesFile>,
    /// GitLab's Job Router, if any.
    #[serde(default)]
    pub job_router: Option<JobRouterFile>,
}

/// `http://host[:port][/path]` with a host.
fn is_http_url(u: &str) -> bool {
    u.strip_prefix("http://")
        .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'))
}

/// Each `(field, duration)` that is zero becomes a problem naming its field.
fn require_positive<const N: usize>(bad: &mut Vec<String>, durations: [(&str, Duration); N]) {
    for (field, d) in durations {
        if d.is_zero() {
            bad.push(format!("{field}: must be positive"));
        }
    }
}

fn default_observability() -> String {
    "127.0.0.1:8151".into()
}

fn default_lookup_timeout() -> std::time::Duration {
    std::time::Duration::from_secs(5)
}

fn default_max_idle_tunnels() -> usize {
    crate::DEFAULT_MAX_IDLE_TUNNELS_PER_AGENT
}

fn default_max_wait() -> std::time::Duration {
    std::time::Duration::from_secs(60)
}

fn default_max_request_body() -> usize {
    16 << 20
}

impl KasFileConfig {
    /// Read, parse and check `path`; secrets and keys are loaded.
    pub fn load(path: &Path) -> Result<(KasConfig, RegistryConfig), Error> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        })?;
        let file: KasFileConfig = toml::from_str(&text).map_err(|e| Error::Invalid {
            origin: origin.clone(),
            problems: vec![e.to_string()],
        })?;
        file.validate(&origin)
    }
}

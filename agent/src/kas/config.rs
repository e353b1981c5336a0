//! `kas.toml`: typed, defaulted, validated; every problem names its field.
//!
//! ```toml
//! agent_listen = "0.0.0.0:8150"        # agentk
//! external_listen = "0.0.0.0:8153"     # GitLab (KasApi)
//! internal_listen = "0.0.0.0:8155"     # other kas (KasInternal)
//! advertise_internal = "10.0.0.2:8155" # how other kas reach this one
//! external_secret_file = "/etc/kas/.gitlab_kas_secret"   # base64, >= 32 bytes
//! internal_secret_file = "/etc/kas/.kas_internal_secret" # base64, >= 32 bytes
//! issuer = "gitlab"
//! agent_keys = ["/etc/kas/agent-keys"] # verify agent JWTs
//! observability_listen = "0.0.0.0:8151" # /metrics, /healthz, /readyz ("off": none)
//! metrics_token_file = "/etc/kas/metrics-token" # /metrics wants `Bearer <token>`
//! max_wait = "60s"                     # longest a request waits for its agent
//! [agent_info]                         # optional: opaque agent tokens, asked of GitLab
//! url = "http://gitlab-webservice:8080"
//! positive_ttl = "5m"
//! negative_ttl = "1m"
//! [k8s_proxy]                          # optional: the Kubernetes API proxy (/graph too)
//! listen = "0.0.0.0:8154"
//! url_prefix = "/k8s-proxy/"            # normalised to end with "/"
//! allowed_origins = ["https://gitlab.example.com"] # browsers' Origin (CORS)
//! gitlab_url = "http://gitlab-webservice:8080" # default: [agent_info] url
//! positive_ttl = "1m"                   # authorize_proxy_user / allowed_agents yes
//! negative_ttl = "10s"                  # their 401/403/404
//! timeout = "5s"                        # one GitLab call
//! max_request_body = 16777216           # bytes; 413 above
//! [registry]
//! backend = { kind = "redis", url = "redis://127.0.0.1:6379" }
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use podgate_registry::RegistryConfig;
use podgate_tokens::KeySet;
use serde::Deserialize;

use super::KasConfig;
use super::agent_auth::AgentInfoConfig;
use super::k8s_proxy::K8sProxyConfig;
use crate::auth;

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

fn default_issuer() -> String {
    "gitlab".into()
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
    /// The JWT issuer GitLab uses.
    #[serde(default = "default_issuer")]
    pub issuer: String,
    /// Files or directories of keys verifying agent tokens.
    #[serde(default)]
    pub agent_keys: Vec<PathBuf>,
    /// The presence registry.
    #[serde(default)]
    pub registry: RegistryConfig,
    /// Longest a GitLab request waits for its agent to connect anywhere.
    #[serde(default = "default_max_wait", with = "humantime_serde")]
    pub max_wait: std::time::Duration,
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
}

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

fn default_max_request_body() -> usize {
    16 << 20
}

impl K8sProxyFile {
    /// Check every field (problems into `bad`, each naming its field) and build the
    /// runtime configuration; `agent_info_url` is the `gitlab_url` default.
    fn validate(
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
                    "k8s_proxy.gitlab_url: required (GitLab's internal API) when [agent_info] is not set"
                        .into(),
                );
                String::new()
            }
        };
        for (field, d) in [
            ("k8s_proxy.positive_ttl", self.positive_ttl),
            ("k8s_proxy.negative_ttl", self.negative_ttl),
            ("k8s_proxy.timeout", self.timeout),
        ] {
            if d.is_zero() {
                bad.push(format!("{field}: must be positive"));
            }
        }
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

/// `[agent_info]`: GitLab's internal API, asked about opaque agent tokens.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentInfoFile {
    /// GitLab's base URL (`http://host:port`).
    pub url: String,
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

fn default_observability() -> String {
    "127.0.0.1:8151".into()
}

fn default_positive_ttl() -> std::time::Duration {
    std::time::Duration::from_secs(300)
}

fn default_negative_ttl() -> std::time::Duration {
    std::time::Duration::from_secs(60)
}

fn default_lookup_timeout() -> std::time::Duration {
    std::time::Duration::from_secs(5)
}

fn default_max_wait() -> std::time::Duration {
    std::time::Duration::from_secs(60)
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

    /// Check every field (all problems at once) and build the runtime configuration.
    pub fn validate(&self, origin: &str) -> Result<(KasConfig, RegistryConfig), Error> {
        let mut bad = Vec::new();
        let mut addr = |field: &str, v: &str| match v.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                bad.push(format!("{field} = {v:?}: expected ip:port"));
                None
            }
        };
        let agent = addr("agent_listen", &self.agent_listen);
        let external = addr("external_listen", &self.external_listen);
        let internal = addr("internal_listen", &self.internal_listen);
        let observability = if self.observability_listen == "off" {
            Some(None)
        } else {
            addr("observability_listen", &self.observability_listen).map(Some)
        };
        let metrics_token = match &self.metrics_token_file {
            None => Some(None),
            Some(path) => match std::fs::read_to_string(path) {
                Ok(t) if !t.trim().is_empty() => Some(Some(t.trim().to_owned())),
                Ok(_) => {
                    bad.push(format!("metrics_token_file = {}: empty", path.display()));
                    None
                }
                Err(e) => {
                    bad.push(format!("metrics_token_file = {}: {e}", path.display()));
                    None
                }
            },
        };
        let mut secret = |field: &'static str, path: &Path| match std::fs::read_to_string(path) {
            Ok(text) => match auth::decode_secret(field, &text) {
                Ok(s) => Some(s),
                Err(e) => {
                    bad.push(format!("{field} = {}: {e}", path.display()));
                    None
                }
            },
            Err(e) => {
                bad.push(format!("{field} = {}: {e}", path.display()));
                None
            }
        };
        let ext_secret = secret("external_secret_file", &self.external_secret_file);
        let int_secret = secret("internal_secret_file", &self.internal_secret_file);
        if ext_secret.is_some() && ext_secret == int_secret {
            bad.push("internal_secret_file: must differ from external_secret_file".into());
        }
        if self.issuer.is_empty() {
            bad.push("issuer: must not be empty".into());
        }
        let keys = if self.agent_keys.is_empty() {
            Some(KeySet::new())
        } else {
            match KeySet::load_all(&self.agent_keys) {
                Ok(k) => Some(k),
                Err(e) => {
                    bad.push(format!("agent_keys: {e}"));
                    None
                }
            }
        };
        if self.max_wait.is_zero() {
            bad.push("max_wait: must be positive".into());
        }
        if let Some(info) = &self.agent_info {
            if !info.url.starts_with("http://") {
                bad.push(format!(
                    "agent_info.url = {:?}: must be http://host:port",
                    info.url
                ));
            }
            for (field, d) in [
                ("agent_info.positive_ttl", info.positive_ttl),
                ("agent_info.negative_ttl", info.negative_ttl),
                ("agent_info.timeout", info.timeout),
            ] {
                if d.is_zero() {
                    bad.push(format!("{field}: must be positive"));
                }
            }
        }
        let k8s_proxy = self
            .k8s_proxy
            .as_ref()
            .map(|p| p.validate(self.agent_info.as_ref().map(|i| i.url.as_str()), &mut bad));
        if let Err(podgate_registry::Error::Config { problems, .. }) = self.registry.validate() {
            bad.extend(problems.into_iter().map(|p| format!("registry.{p}")));
        }
        match (
            agent,
            external,
            internal,
            ext_secret,
            int_secret,
            keys,
            observability,
            metrics_token,
        ) {
            (
                Some(agent),
                Some(external),
                Some(internal),
                Some(es),
                Some(is),
                Some(keys),
                Some(observability),
                Some(metrics_token),
            ) if bad.is_empty() => {
                let agent_info = self.agent_info.as_ref().map(|i| AgentInfoConfig {
                    url: i.url.clone(),
                    secret: es.clone(),
                    positive_ttl: i.positive_ttl,
                    negative_ttl: i.negative_ttl,
                    timeout: i.timeout,
                });
                Ok((
                    KasConfig {
                        external_listen: external,
                        internal_listen: internal,
                        external_secret: es,
                        internal_secret: is,
                        issuer: self.issuer.clone(),
                        agent_listen: agent,
                        agent_keys: keys,
                        advertise_internal: self.advertise_internal.clone(),
                        max_wait: self.max_wait,
                        observability_listen: observability,
                        agent_info,
                        metrics_token,
                        k8s_proxy: k8s_proxy.flatten(),
                    },
                    self.registry.clone(),
                ))
            }
            _ => Err(Error::Invalid {
                origin: origin.to_owned(),
                problems: bad,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bad_field_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, "c2hvcnQ=").unwrap();
        let file: KasFileConfig = toml::from_str(&format!(
            r#"agent_listen = "nowhere"
               external_listen = "127.0.0.1:1"
               internal_listen = "127.0.0.1:x"
               external_secret_file = "{s}"
               internal_secret_file = "/does/not/exist"
               issuer = ""
               observability_listen = "everywhere"
               metrics_token_file = "/does/not/exist/either"
               max_wait = "0s"
               [agent_info]
               url = "gitlab.example.com"
               negative_ttl = "0s""#,
            s = short.display()
        ))
        .unwrap();
        let err = file.validate("kas.toml").unwrap_err().to_string();
        for field in [
            "kas.toml",
            "agent_listen",
            "internal_listen",
            "external_secret_file",
            "internal_secret_file",
            "issuer",
            "observability_listen",
            "metrics_token_file",
            "max_wait",
            "agent_info.url",
            "agent_info.negative_ttl",
        ] {
            assert!(err.contains(field), "{field}: {err}");
        }
        assert!(!err.contains("external_listen"), "{err}");
        assert!(!err.contains("positive_ttl"), "{err}");
    }

    fn with_secrets(dir: &Path, rest: &str) -> KasFileConfig {
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::fs::write(&a, "YWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWE=").unwrap();
        std::fs::write(&b, "YmJiYmJiYmJiYmJiYmJiYmJiYmJiYmJiYmJiYmJiYmI=").unwrap();
        toml::from_str(&format!(
            r#"agent_listen = "127.0.0.1:0"
               external_listen = "127.0.0.1:0"
               internal_listen = "127.0.0.1:0"
               external_secret_file = "{}"
               internal_secret_file = "{}"
               {rest}"#,
            a.display(),
            b.display()
        ))
        .unwrap()
    }

    #[test]
    fn k8s_proxy_defaults_and_normalisation() {
        let dir = tempfile::tempdir().unwrap();
        let file = with_secrets(
            dir.path(),
            r#"[agent_info]
               url = "http://gitlab:8080"
               [k8s_proxy]
               listen = "127.0.0.1:8154"
               url_prefix = "/-/kubernetes-agent/k8s-proxy"
               allowed_origins = ["https://gitlab.example.com"]"#,
        );
        let (config, _) = file.validate("kas.toml").unwrap();
        let p = config.k8s_proxy.unwrap();
        assert_eq!(p.url_prefix, "/-/kubernetes-agent/k8s-proxy/");
        assert_eq!(p.gitlab_url, "http://gitlab:8080");
        assert_eq!(p.positive_ttl, std::time::Duration::from_secs(60));
        assert_eq!(p.negative_ttl, std::time::Duration::from_secs(10));
        assert_eq!(p.max_request_body, 16 << 20);
        let default_prefix = with_secrets(
            dir.path(),
            "[k8s_proxy]\nlisten = \"127.0.0.1:0\"\ngitlab_url = \"http://g\"",
        );
        let (config, _) = default_prefix.validate("kas.toml").unwrap();
        assert_eq!(config.k8s_proxy.unwrap().url_prefix, "/k8s-proxy/");
    }

    #[test]
    fn k8s_proxy_bad_fields_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = with_secrets(
            dir.path(),
            r#"[k8s_proxy]
               listen = "nowhere"
               url_prefix = "k8s"
               allowed_origins = ["https://ok.example.com", "https://x.example.com/path"]
               negative_ttl = "0s"
               max_request_body = 0"#,
        );
        let err = file.validate("kas.toml").unwrap_err().to_string();
        for field in [
            "k8s_proxy.listen",
            "k8s_proxy.url_prefix",
            "k8s_proxy.allowed_origins[1]",
            "k8s_proxy.gitlab_url: required",
            "k8s_proxy.negative_ttl",
            "k8s_proxy.max_request_body",
        ] {
            assert!(err.contains(field), "{field}: {err}");
        }
        assert!(!err.contains("allowed_origins[0]"), "{err}");
    }
}

//! [`KasFileConfig::validate`]: every field checked, all problems at once, and the
//! runtime [`KasConfig`] built.

use std::net::SocketAddr;
use std::path::Path;

use podgate_registry::RegistryConfig;
use podgate_tokens::KeySet;

use super::super::KasConfig;
use super::super::agent_auth::AgentInfoConfig;
use super::super::agent_config::AgentConfigSource;
use super::{Error, KasFileConfig, is_http_url, require_positive};
use podgate_agent::auth;

impl KasFileConfig {
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
        if self.issuer.as_deref() == Some("") {
            bad.push("issuer: must not be empty (leave it out to accept any issuer)".into());
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
        if self.max_idle_tunnels_per_agent == 0 {
            bad.push("max_idle_tunnels_per_agent: must be at least 1".into());
        }
        let gitlab_url = self.gitlab.as_ref().map(|g| g.url.clone());
        if let Some(u) = &gitlab_url
            && !is_http_url(u)
        {
            bad.push(format!("gitlab.url = {u:?}: must be http://host:port"));
        }
        let agent_info_url = self
            .agent_info
            .as_ref()
            .and_then(|i| i.url.clone().or_else(|| gitlab_url.clone()));
        if let Some(info) = &self.agent_info {
            match &info.url {
                Some(u) if !is_http_url(u) => {
                    bad.push(format!("agent_info.url = {u:?}: must be http://host:port"));
                }
                None if gitlab_url.is_none() => {
                    bad.push("agent_info.url: required when [gitlab] is not set".into());
                }
                _ => {}
            }
            require_positive(
                &mut bad,
                [
                    ("agent_info.positive_ttl", info.positive_ttl),
                    ("agent_info.negative_ttl", info.negative_ttl),
                    ("agent_info.timeout", info.timeout),
                ],
            );
        }
        let k8s_proxy = self.k8s_proxy.as_ref().map(|p| {
            p.validate(
                agent_info_url.as_deref().or(gitlab_url.as_deref()),
                &mut bad,
            )
        });
        let workspaces = self
            .workspaces
            .as_ref()
            .and_then(|w| w.validate(gitlab_url.as_deref(), &mut bad));
        let job_router = self
            .job_router
            .as_ref()
            .map(|j| j.validate(gitlab_url.is_some(), &mut bad));
        let agent_config = self.agent_configuration.as_ref().map(|a| {
            if !a.dir.is_dir() {
                bad.push(format!(
                    "agent_configuration.dir = {}: not a directory",
                    a.dir.display()
                ));
            }
            if a.poll.is_zero() {
                bad.push("agent_configuration.poll: must be positive".into());
            }
            AgentConfigSource {
                dir: a.dir.clone(),
                poll: a.poll,
            }
        });
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
                    url: agent_info_url.clone().unwrap_or_default(),
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
                        issuer: self.issuer.clone().unwrap_or_default(),
                        agent_listen: agent,
                        agent_keys: keys,
                        advertise_internal: self.advertise_internal.clone(),
                        max_wait: self.max_wait,
                        max_idle_tunnels_per_agent: self.max_idle_tunnels_per_agent,
                        observability_listen: observability,
                        agent_info,
                        metrics_token,
                        k8s_proxy: k8s_proxy.flatten(),
                        gitlab_url,
                        gitlab_external_url: self
                            .gitlab
                            .as_ref()
                            .and_then(|g| g.external_url.clone()),
                        agent_config,
                        workspaces,
                        job_router,
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

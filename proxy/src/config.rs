//! `proxy.toml`: typed, defaulted, validated. Every problem names its field.
//!
//! ```toml
//! listen = "0.0.0.0:8080"
//! on_invalid = "reject"            # or "legacy" during migrations
//! keys = ["/etc/podgate/keys"]     # JWT verification keys (PEM, JWKS, HS256 files)
//! threads = 2
//! work_stealing = false            # true: idle threads take busy ones' tasks
//! grace_period_secs = 5           # in-flight requests' time after SIGTERM
//! admin_listen = "127.0.0.1:9191" # /metrics, /healthz, /readyz
//! edge_poll_hold_secs = 50         # jobs/request held at the edge (Pods with
//!                                  # runner_queue_redis); 0: never
//!
//! [health]                         # active checks (defaults shown)
//! path = "/-/readiness"
//! interval_ms = 2000
//! timeout_ms = 1000
//! rise = 2
//! fall = 3
//!
//! [upstreams]                      # names in the topology (defaults shown)
//! resolve_interval_ms = 30000     # re-resolved this often, off the request path
//! resolve_timeout_ms = 2000       # a name that fails keeps its last good addresses
//! max_connections_per_address = 1024 # requests in flight to one web address; 0: no bound
//! queue_timeout_ms = 2000         # past the bound, waited this long, then 503
//!
//! [console]                        # the web console on the admin listener
//! enabled = false                  # (podgate-console: its sources)
//!
//! [tls]                            # optional HTTPS listener (h1 + h2 by ALPN)
//! listen = "0.0.0.0:8443"
//! cert = "/etc/podgate/tls.crt"
//! key = "/etc/podgate/tls.key"
//!
//! [workspaces]                     # optional: workspace hosts to kas
//! host_suffix = ".workspaces.example.com" # `<port>-<workspace>` + this → the
//!                                  # Pod's `kas_workspaces` (rule `kas-workspaces`)
//!
//! [topology]                       # inline topology (or [registry] with Redis)
//! default_pod = 1
//! [[topology.pods]]
//! id = 1
//! name = "legacy"
//! web = ["10.0.0.1:8080"]
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use podgate_registry::{BackendConfig, RegistryConfig, TopologyFile};
use podgate_tokens::ClassifierConfig;
use serde::Deserialize;
use thiserror::Error;

use crate::decision::OnInvalid;
use crate::health::HealthConfig;
use crate::rules::{self, Rule, RuleSpec};
use crate::upstreams::UpstreamsConfig;
use podgate_console::ConsoleConfig;

/// Configuration and start-up errors. Not transient: fix the configuration.
#[derive(Debug, Error)]
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
    /// The configuration is invalid; every problem is listed.
    #[error("invalid proxy configuration in {origin}: {}", problems.join("; "))]
    Invalid {
        /// The file.
        origin: String,
        /// Each problem, naming its field.
        problems: Vec<String>,
    },
    /// Keys could not be loaded.
    #[error("loading JWT keys: {0}")]
    Keys(#[from] podgate_tokens::keys::Error),
    /// The registry could not be opened.
    #[error("opening the registry: {0}")]
    Registry(#[from] podgate_registry::Error),
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
fn default_threads() -> usize {
    2
}
fn default_grace() -> u64 {
    5
}
fn default_admin() -> String {
    "127.0.0.1:9191".into()
}
fn default_body_lookahead() -> usize {
    crate::body::DEFAULT_BODY_LOOKAHEAD
}
fn default_head_timeout() -> u64 {
    30_000
}
/// Largest `body_lookahead_bytes`: the look-ahead is held in memory per request.
pub const MAX_BODY_LOOKAHEAD: usize = 16 << 20;
fn default_read_buffer() -> usize {
    0
}
fn default_true() -> bool {
    true
}
fn default_edge_poll_hold() -> u64 {
    crate::edge_poll::DEFAULT_HOLD_SECS
}
/// Longest `edge_poll_hold_secs`: well within the runner's 10-minute response-header
/// timeout.
pub const MAX_EDGE_POLL_HOLD_SECS: u64 = 300;
fn default_upgrade_sock() -> PathBuf {
    "/tmp/podgate-upgrade.sock".into()
}

/// `[tls]`: an HTTPS listener beside the plaintext one (HTTP/1.1 and HTTP/2 by ALPN).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Address to listen on, `host:port`.
    pub listen: String,
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

/// `[workspaces]`: workspace hosts (`https://<port>-<workspace>.<zone>/`) go to
/// kas's Workspaces HTTP server ([`crate::rules::workspaces_rule`], placed before
/// every other rule).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspacesRouting {
    /// The domain every workspace host ends with, from its leading `.`
    /// (`.workspaces.example.com`: the agents' `remote_development.dns_zone`, or
    /// GitLab's `workspaces.host`).
    pub host_suffix: String,
}

/// The proxy's configuration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    /// Address to listen on, `host:port`.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// What to do with invalid tokens.
    #[serde(default)]
    pub on_invalid: OnInvalid,
    /// JWT verification key files or directories.
    #[serde(default)]
    pub keys: Vec<PathBuf>,
    /// Token classifier settings (leeway, audience, cache).
    #[serde(default)]
    pub classifier: ClassifierConfig,
    /// Where the topology lives when it is not inline (Redis).
    #[serde(default)]
    pub registry: RegistryConfig,
    /// An inline topology (used when `registry.backend` is memory).
    #[serde(default)]
    pub topology: Option<TopologyFile>,
    /// Replaces the built-in rules when set ([`ProxyConfig::rules`]).
    #[serde(default)]
    pub rules: Option<Vec<RuleSpec>>,
    /// Workspace hosts to kas (a rule before the others), if any.
    #[serde(default)]
    pub workspaces: Option<WorkspacesRouting>,
    /// Path rules: a request whose path names a top-level namespace or an
    /// organization goes to the Cell that claimed it, asked of this Topology
    /// Service ([`crate::claims`]). None: no path rules.
    #[serde(default)]
    pub topology_service: Option<crate::claims::TopologyServiceConfig>,
    /// Worker threads.
    #[serde(default = "default_threads")]
    pub threads: usize,
    /// How the worker threads share the work. `false` (the default): each thread
    /// runs its own event loop over the connections it is given at accept, one
    /// at random (pingora's no-steal runtime), as HAProxy's and NGINX's workers
    /// do. `true`: one work-stealing runtime, where an idle thread takes tasks
    /// from a busy one, at the price of synchronising threads on every wake-up:
    /// about a fifth more CPU per request on `scripts/bench-proxy.sh`.
    #[serde(default)]
    pub work_stealing: bool,
    /// On SIGTERM (and after an upgrade's handoff) the listener closes at once; requests
    /// in flight then get this many seconds to finish before the process exits.
    #[serde(default = "default_grace")]
    pub grace_period_secs: u64,
    /// The admin listener (`/metrics`, `/healthz`, `/readyz`); `"off"` disables it.
    #[serde(default = "default_admin")]
    pub admin_listen: String,
    /// Accept HTTP/2 without TLS (h2c) on `listen`: agentk's gRPC (default true).
    #[serde(default = "default_true")]
    pub h2c: bool,
    /// Bytes of read buffer per client connection, besides pingora's 4 KiB header
    /// buffer. pingora's default is 65536, held for as long as the connection lives
    /// (a long poll: minutes): 106 KiB per held poll against 41 KiB with 0, the
    /// default here, which reads straight into the header buffer.
    #[serde(default = "default_read_buffer")]
    pub read_buffer_bytes: usize,
    /// Most bytes of a body read before routing, when the token may be a body
    /// parameter: a JSON or form body larger than this is refused (413); a multipart
    /// body is searched this far for its token part (default 65536).
    #[serde(default = "default_body_lookahead")]
    pub body_lookahead_bytes: usize,
    /// Milliseconds an HTTP/1 request head may take from its first byte to its end,
    /// however steadily it trickles in; then the connection is closed (default 30000).
    #[serde(default = "default_head_timeout")]
    pub head_timeout_ms: u64,
    /// Serve runner and job requests on the plaintext listener with the HTTP/1 fast
    /// path ([`crate::fast`]), which routes exactly as pingora-proxy's service and
    /// hands it everything else (default true). `false`: every request through
    /// pingora-proxy.
    #[serde(default = "default_true")]
    pub fast_path: bool,
    /// An HTTPS listener.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Active health checks of upstreams.
    #[serde(default)]
    pub health: HealthConfig,
    /// Name resolution of the topology's upstreams.
    #[serde(default)]
    pub upstreams: UpstreamsConfig,
    /// The web console on the admin listener ([`podgate_console`]).
    #[serde(default)]
    pub console: ConsoleConfig,
    /// Seconds a `jobs/request` long poll is held at the edge, with no upstream
    /// connection, for Pods that set `runner_queue_redis` in the topology
    /// ([`crate::edge_poll`]): Workhorse's long-polling duration (default 50,
    /// GitLab.com's `apiCiLongPollingDuration`); at the end the proxy answers 204.
    /// 0: never held at the edge.
    #[serde(default = "default_edge_poll_hold")]
    pub edge_poll_hold_secs: u64,
    /// Unix socket through which a new binary (`podgate proxy --upgrade`) takes over
    /// the listening sockets of the running one (sent on SIGQUIT).
    #[serde(default = "default_upgrade_sock")]
    pub upgrade_sock: PathBuf,
}

impl ProxyConfig {
    /// Read and validate a file.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parse and validate TOML text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, Error> {
        let config: ProxyConfig = toml::from_str(text).map_err(|e| Error::Invalid {
            origin: origin.to_owned(),
            problems: vec![e.to_string()],
        })?;
        config.validate(origin)?;
        Ok(config)
    }

    /// Check every field; all problems at once.
    pub fn validate(&self, origin: &str) -> Result<(), Error> {
        let mut bad = Vec::new();
        if self.listen.parse::<SocketAddr>().is_err() {
            bad.push(format!("listen = {:?}: expected ip:port", self.listen));
        }
        if self.admin_listen != "off" && self.admin_listen.parse::<SocketAddr>().is_err() {
            bad.push(format!(
                "admin_listen = {:?}: expected ip:port or \"off\"",
                self.admin_listen
            ));
        }
        if let Some(tls) = &self.tls {
            if tls.listen.parse::<SocketAddr>().is_err() {
                bad.push(format!("tls.listen = {:?}: expected ip:port", tls.listen));
            }
            for (field, path) in [("tls.cert", &tls.cert), ("tls.key", &tls.key)] {
                if !path.is_file() {
                    bad.push(format!("{field} = {}: no such file", path.display()));
                }
            }
        }
        bad.extend(self.health.problems());
        bad.extend(self.upstreams.problems());
        bad.extend(self.console.problems());
        if self.console.enabled && self.admin_listen == "off" {
            bad.push("console.enabled: the console is served on the admin listener; admin_listen is \"off\"".into());
        }
        if self.body_lookahead_bytes < 1024 || self.body_lookahead_bytes > MAX_BODY_LOOKAHEAD {
            bad.push(format!(
                "body_lookahead_bytes = {}: between 1024 and {MAX_BODY_LOOKAHEAD}",
                self.body_lookahead_bytes
            ));
        }
        if self.head_timeout_ms == 0 {
            bad.push("head_timeout_ms: must be positive".into());
        }
        if self.edge_poll_hold_secs > MAX_EDGE_POLL_HOLD_SECS {
            bad.push(format!(
                "edge_poll_hold_secs = {}: at most {MAX_EDGE_POLL_HOLD_SECS} (0 disables edge holds)",
                self.edge_poll_hold_secs
            ));
        }
        if self.threads == 0 {
            bad.push("threads: at least 1".into());
        }
        if let Err(podgate_tokens::classifier::Error::Invalid(p)) = self.classifier.validate() {
            bad.extend(p.into_iter().map(|p| format!("classifier.{p}")));
        }
        if let Err(podgate_registry::Error::Config { problems, .. }) = self.registry.validate() {
            bad.extend(problems.into_iter().map(|p| format!("registry.{p}")));
        }
        match (&self.topology, &self.registry.backend) {
            (Some(_), BackendConfig::Redis { .. } | BackendConfig::RedisCluster { .. }) => bad.push(
                "topology: an inline [topology] and a Redis registry.backend both give the topology; keep one (the inline one would override what Redis holds)"
                    .into(),
            ),
            (Some(_), BackendConfig::Memory) if self.registry.topology_file.is_some() => bad.push(
                "topology: an inline [topology] and registry.topology_file both give the topology; keep one"
                    .into(),
            ),
            (Some(t), _) => {
                if let Err(podgate_registry::Error::Config { problems, .. }) = t.validate(origin) {
                    bad.extend(problems.into_iter().map(|p| format!("topology.{p}")));
                }
            }
            (None, BackendConfig::Memory) if self.registry.topology_file.is_none() => bad.push(
                "topology: give an inline [topology], registry.topology_file or a Redis registry"
                    .into(),
            ),
            _ => {}
        }
        if let Some(w) = &self.workspaces
            && (!w.host_suffix.starts_with('.')
                || w.host_suffix.len() < 2
                || w.host_suffix.contains(['/', ':', ' ']))
        {
            bad.push(format!(
                "workspaces.host_suffix = {:?}: a domain suffix starting with '.', such as \".workspaces.example.com\"",
                w.host_suffix
            ));
        }
        if let Some(ts) = &self.topology_service {
            bad.extend(ts.problems());
        }
        if let Err(problems) = self.build_rules() {
            bad.extend(problems);
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid {
                origin: origin.to_owned(),
                problems: bad,
            })
        }
    }
}

impl ProxyConfig {
    /// The rules requests are matched against, in order: `[[rules]]` when given,
    /// else the built-in table ([`rules::builtin`]); the Workspaces rule first when
    /// `[workspaces]` is set.
    pub fn rules(&self) -> Result<Vec<Rule>, Error> {
        self.build_rules().map_err(|problems| Error::Invalid {
            origin: "rules".into(),
            problems,
        })
    }

    fn build_rules(&self) -> Result<Vec<Rule>, Vec<String>> {
        let mut rules = match &self.rules {
            None => rules::builtin(),
            Some(specs) => {
                let (mut rules, mut bad) = (Vec::new(), Vec::new());
                for (i, spec) in specs.iter().enumerate() {
                    match spec.build(&format!("rules[{i}]")) {
                        Ok(rule) => rules.push(rule),
                        Err(problems) => bad.extend(problems),
                    }
                }
                if !bad.is_empty() {
                    return Err(bad);
                }
                rules
            }
        };
        if let Some(w) = &self.workspaces {
            rules.insert(0, rules::workspaces_rule(&w.host_suffix));
        }
        Ok(rules)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_console_needs_the_admin_listener_and_names_its_bad_fields() {
        let base = "[topology]\ndefault_pod = 1\n[[topology.pods]]\nid = 1\nname = \"x\"\nweb = [\"a:1\"]\n";
        let ok = ProxyConfig::parse(&format!("{base}[console]\nenabled = true\n"), "p").unwrap();
        assert!(ok.console.enabled);
        assert_eq!(ok.console.interval_ms, 1000);
        assert!(!ProxyConfig::parse(base, "p").unwrap().console.enabled);
        let err = ProxyConfig::parse(
            &format!(
                "admin_listen = \"off\"\n{base}[console]\nenabled = true\ninterval_ms = 0\n[[console.sources]]\nname = \"\"\nurl = \"x\"\n"
            ),
            "p",
        )
        .unwrap_err()
        .to_string();
        for field in [
            "console.enabled",
            "console.interval_ms",
            "console.sources[0].name",
            "console.sources[0].url",
        ] {
            assert!(err.contains(field), "{field}: {err}");
        }
    }

    #[test]
    fn workspaces_host_suffix_must_be_a_domain_suffix() {
        let base = "[topology]\ndefault_pod = 1\n[[topology.pods]]\nid = 1\nname = \"x\"\nweb = [\"a:1\"]\n";
        let ok = ProxyConfig::parse(
            &format!("{base}[workspaces]\nhost_suffix = \".workspaces.example.com\"\n"),
            "p",
        )
        .unwrap();
        assert_eq!(
            ok.workspaces.unwrap().host_suffix,
            ".workspaces.example.com"
        );
        let err = ProxyConfig::parse(
            &format!("{base}[workspaces]\nhost_suffix = \"workspaces.example.com\"\n"),
            "p",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("workspaces.host_suffix"), "{err}");
    }

    #[test]
    fn edge_poll_hold_defaults_to_gitlab_com_and_is_bounded() {
        let base = "[topology]\ndefault_pod = 1\n[[topology.pods]]\nid = 1\nname = \"x\"\nweb = [\"a:1\"]\n";
        assert_eq!(
            ProxyConfig::parse(base, "p").unwrap().edge_poll_hold_secs,
            50
        );
        let off = ProxyConfig::parse(&format!("edge_poll_hold_secs = 0\n{base}"), "p").unwrap();
        assert_eq!(off.edge_poll_hold_secs, 0);
        let err = ProxyConfig::parse(&format!("edge_poll_hold_secs = 301\n{base}"), "p")
            .unwrap_err()
            .to_string();
        assert!(err.contains("edge_poll_hold_secs = 301"), "{err}");
        // A Pod's runner queue Redis is checked with the topology.
        let err = ProxyConfig::parse(
            &format!("{base}runner_queue_redis = \"localhost:6379\"\n"),
            "p",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("topology.pods[0].runner_queue_redis"), "{err}");
    }

    #[test]
    fn every_bad_field_is_named() {
        let err = ProxyConfig::parse(
            r#"
            listen = "nowhere"
            threads = 0
            [classifier]
            leeway_secs = 99999
            [topology]
            default_pod = 7
            [[topology.pods]]
            id = 1
            name = "x"
            web = ["bad"]
            "#,
            "proxy.toml",
        )
        .unwrap_err()
        .to_string();
        for needle in [
            "proxy.toml",
            "listen",
            "threads",
            "classifier.leeway_secs",
            "topology.default_pod",
            "web[0]",
        ] {
            assert!(err.contains(needle), "{needle} missing: {err}");
        }
        let err = ProxyConfig::parse("listen = \"127.0.0.1:1\"", "p")
            .unwrap_err()
            .to_string();
        assert!(err.contains("topology"), "{err}");
        let err = ProxyConfig::parse("lsten = 1", "p")
            .unwrap_err()
            .to_string();
        assert!(err.contains("lsten"), "{err}");
    }
}

//! agentk: the agent that runs in a cluster and dials out to kas.
//!
//! - [`Agentk::start`] picks a random `pod_id`, registers it with kas
//!   (`AgentRegistrar/Register`, at once and then every 5 minutes, as GitLab's
//!   agentk does) and opens the configuration stream (GitLab's
//!   `AgentConfiguration/GetConfiguration` with `skip_register`, resumed from the
//!   last `commit_id`): while it is open, this replica is connected, and kas names
//!   it by its `pod_id` (the connection id of its tunnels). The stream ending (kas
//!   restarting, the network) means connecting again with back-off.
//! - For each connection, [`serve_tunnels`] keeps idle reverse tunnels at kas and
//!   answers the requests kas sends through them with [`KubeHandler`] (kube-rs).
//! - An observability listener serves `/metrics`, `/healthz` and `/readyz` (ready
//!   while connected to kas).
//! - Every configuration message (kas sends one when the agent's configuration is at
//!   a commit this replica does not have) becomes the latest [`AgentConfig`] in a watch
//!   ([`Agentk::config`]); modules build a [`ModuleClient`] for GitLab's module API
//!   from [`Agentk::module_client`] (the kas channel and the agent token).
//! - The Workspaces module ([`remote_development`]) follows that configuration:
//!   once it enables the module, replicas of the agent elect a leader with a Lease
//!   and the leader reconciles workspaces with GitLab ([`Agentk::shutdown`] gives
//!   the Lease up).
//!
//! kas is reached over h2c or WebSocket, with or without TLS
//! ([`podgate_agent::transport`]), directly or through the podgate proxy.
//!
//! Layout: configuration and status types here; [`Agentk`]'s start, accessors and
//! shutdown in `lifecycle.rs`; the connection loop (the configuration stream,
//! tunnels while connected, reconnect with back-off) in `connection.rs`;
//! registration in `register.rs`; the modules below for the rest.

pub mod gitlab_access;
pub mod handler;
pub mod k8s_api;
pub mod leader;
pub mod make_request;
pub mod metrics;
pub mod remote_development;
pub mod tunnels;
pub mod watch_graph;
pub mod workspace_traffic;

mod connection;
mod lifecycle;
mod register;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use podgate_agent::proto::gitlab::agent::agent_configuration::rpc::ConfigurationResponse;
use podgate_agent::proto::gitlab::agent::agentcfg;
use thiserror::Error;

pub use self::gitlab_access::{ModuleAnswer, ModuleClient, ModuleError};
pub use self::handler::KubeHandler;
pub use self::lifecycle::Agentk;
pub use self::metrics::AgentkMetrics;
pub use self::tunnels::{Call, Handler, Requests, Responses, TunnelPool, serve_tunnels, unary};

/// agentk errors (start-up).
#[derive(Debug, Error)]
pub enum Error {
    /// The configuration is unusable; every problem names its field.
    #[error("invalid agentk configuration: {}", .0.join("; "))]
    Invalid(Vec<String>),
    /// The kas URL is unusable.
    #[error(transparent)]
    Transport(#[from] podgate_agent::transport::Error),
    /// No Kubernetes configuration could be found or used.
    #[error("kubernetes configuration ({what}): {source}")]
    Kube {
        /// Where it came from: the kubeconfig's path, or what was inferred.
        what: String,
        /// Why it could not be used.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The observability listener could not bind.
    #[error("binding the observability listener {addr}: {source}")]
    Bind {
        /// Its address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// An agentk replica's configuration.
#[derive(Clone, Debug)]
pub struct AgentkConfig {
    /// kas's agent listener: `grpc://host:port` or `ws://host:port/path`.
    pub kas_url: String,
    /// The agent token.
    pub token: String,
    /// Where this replica runs (reported to kas; `POD_NAMESPACE` in a cluster).
    pub pod_namespace: String,
    /// This replica's pod (`POD_NAME` in a cluster).
    pub pod_name: String,
    /// Idle tunnels kept at kas (at least 2).
    pub idle_tunnels: usize,
    /// Most requests answered at once.
    pub max_busy_tunnels: usize,
    /// The observability listener, if any.
    pub observability_listen: Option<SocketAddr>,
    /// A kubeconfig file; `None`: in-cluster configuration, else `$KUBECONFIG` or
    /// `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// CA certificates (PEM) trusted for `grpcs://` and `wss://` kas URLs, instead of
    /// the system's.
    pub ca_file: Option<PathBuf>,
    /// Graph API watches: how long a watch may take to list before the client gets
    /// `INFORMER_SYNC_FAILED` (default 30 s, the figure of GitLab's example message,
    /// `docs/graph-api.md` §5).
    pub graph_sync_timeout: Duration,
}

impl AgentkConfig {
    /// Every problem at once, each naming its field.
    pub fn validate(&self) -> Result<(), Error> {
        let mut bad = Vec::new();
        if let Err(e) = podgate_agent::transport::kas_url_check(&self.kas_url) {
            bad.push(format!("kas: {e}"));
        }
        let token = self.token.trim();
        if token.is_empty() {
            bad.push("token: empty".into());
        } else if token.parse::<http::HeaderValue>().is_err() {
            bad.push("token: not usable in a header (control characters?)".into());
        }
        if self.idle_tunnels < 2 {
            bad.push(format!("idle_tunnels = {}: at least 2", self.idle_tunnels));
        }
        if let Some(ca) = &self.ca_file
            && !ca.is_file()
        {
            bad.push(format!("ca_file = {}: not a readable file", ca.display()));
        }
        if self.graph_sync_timeout.is_zero() {
            bad.push("graph_sync_timeout: must be more than 0".into());
        }
        if self.max_busy_tunnels < 1 {
            bad.push("max_busy_tunnels: at least 1".into());
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid(bad))
        }
    }
}

/// Where the replica stands, for `/readyz` and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// This replica's connection id (its `pod_id`), while connected.
    pub connection_id: Option<i64>,
    /// The agent kas took this replica for.
    pub agent_id: i64,
    /// Attempts to connect so far.
    pub attempts: u64,
    /// Why the last attempt failed, if it did.
    pub last_error: Option<tonic::Code>,
}

/// The agent's configuration, as the latest `GetConfiguration` message gave it
/// (GitLab's `agentcfg.AgentConfiguration` and its commit).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentConfig {
    /// The agent kas took this replica for.
    pub agent_id: i64,
    /// Its configuration project.
    pub project_id: i64,
    /// The configuration's commit: agentk resumes the stream from it.
    pub commit_id: String,
    /// The configuration.
    pub configuration: agentcfg::AgentConfiguration,
}

impl AgentConfig {
    /// The configuration a `ConfigurationResponse` carries (`None`: the message is
    /// invalid, as GitLab's agentk's validation finds it: no configuration or an
    /// empty commit id).
    pub fn from_response(m: ConfigurationResponse) -> Option<AgentConfig> {
        let configuration = m.configuration?;
        if m.commit_id.is_empty() {
            return None;
        }
        Some(AgentConfig {
            agent_id: configuration.agent_id,
            project_id: configuration.project_id,
            commit_id: m.commit_id,
            configuration,
        })
    }
}

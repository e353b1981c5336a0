//! kas: four listeners, each on its own address.
//!
//! - *agent*: GitLab's `AgentConfiguration/GetConfiguration` ([`configuration`]:
//!   the agent's configuration file, [`agent_config`], resumed by commit id) and
//!   `AgentRegistrar/Register` ([`presence`]: registered connections), reverse
//!   tunnels ([`tunnel`]) and modules' requests to GitLab ([`gitlab_access`]), over
//!   h2c or WebSocket ([`podgate_agent::transport`]); agents authenticated by
//!   [`agent_auth`]. Runners call GitLab's Job Router (`JobRouter/GetJob`) on the
//!   same listener ([`job_router`]: long polls held on the Cell's runner queue keys,
//!   jobs from the Cell's Rails).
//! - *external*: Rails' `AgentTracker` (GitLab's kas API, `tracker.rs`),
//!   `Notifications/GitPushEvent` ([`notifications`]) and the seed's `KasApi`, with
//!   GitLab's JWT ([`podgate_agent::auth`]); the rest of GitLab's kas API answers
//!   `Unimplemented` naming it ([`external`]).
//! - *internal*: `KasInternal` for other kas instances, with their own secret.
//! - *observability*: `/metrics` ([`metrics`]), `/healthz`, `/readyz`.
//! - optional: the Kubernetes API proxy ([`k8s_proxy`]) and the Workspaces HTTP
//!   server ([`workspaces`]: user traffic for workspaces, through the agent's
//!   tunnel as `WorkspaceRequest`).
//!
//! Connected agents are answered from the presence registry (`pod-registry`).
//! Calls to agents (`GetPods`, and the Kubernetes API proxy's `MakeRequest` and
//! `WatchGraph`) are routed by one loop ([`routing::AgentRouter`]):
//! through a reverse tunnel this kas holds, else through the internal endpoint of the
//! kas the registry names (re-routed if that kas lost the agent), else waiting until
//! the agent connects anywhere (woken by the registry's event, never polling) or
//! `max_wait` passes.
//!
//! Layout: [`Kas`]'s lifecycle (start, listeners, shutdown) in `lifecycle.rs`;
//! GitLab's `KasApi` in `api.rs`; `KasInternal` (calls routed here by other kas)
//! in `internal.rs`; the modules below for the rest.

pub mod agent_auth;
pub mod agent_config;
pub mod config;
pub mod configuration;
pub mod external;
pub mod gitlab;
pub mod gitlab_access;
pub mod job_router;
pub mod k8s_proxy;
pub mod metrics;
pub mod notifications;
pub mod presence;
pub mod routing;
pub mod tunnel;
pub mod workspaces;

mod answer_cache;
mod api;
mod http_server;
mod internal;
mod lifecycle;
mod tracker;

use std::net::SocketAddr;

use podgate_tokens::KeySet;
use thiserror::Error;

pub use self::lifecycle::Kas;
use podgate_agent::auth;

/// kas errors (start-up).
#[derive(Debug, Error)]
pub enum Error {
    /// A secret is unusable.
    #[error(transparent)]
    Auth(#[from] auth::Error),
    /// The presence registry refused.
    #[error("registry: {0}")]
    Registry(#[source] podgate_registry::Error),
    /// A listener could not bind.
    #[error("binding {what} {addr}: {source}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// Its address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// [`KasConfig::max_idle_tunnels_per_agent`] unless configured.
pub const DEFAULT_MAX_IDLE_TUNNELS_PER_AGENT: usize = 256;

/// A kas instance's configuration.
#[derive(Clone, Debug)]
pub struct KasConfig {
    /// GitLab-facing listener.
    pub external_listen: SocketAddr,
    /// kas-facing listener.
    pub internal_listen: SocketAddr,
    /// The GitLab ↔ kas shared secret (≥ 32 bytes).
    pub external_secret: Vec<u8>,
    /// The kas ↔ kas secret (≥ 32 bytes).
    pub internal_secret: Vec<u8>,
    /// The only issuer accepted in GitLab's tokens on the external listener; empty:
    /// any issuer, as GitLab's kas.
    pub issuer: String,
    /// agentk-facing listener.
    pub agent_listen: SocketAddr,
    /// Keys that verify agent tokens (JWT routable tokens).
    pub agent_keys: KeySet,
    /// The address other kas instances use to reach this one's internal listener
    /// (default: the internal listener's bound address).
    pub advertise_internal: Option<String>,
    /// Longest a GitLab request waits for its agent to connect anywhere.
    pub max_wait: std::time::Duration,
    /// Idle reverse tunnels held per agent, all its replicas together; more are
    /// refused (`ResourceExhausted`) until some are used.
    pub max_idle_tunnels_per_agent: usize,
    /// The observability listener (`/metrics`, `/healthz`, `/readyz`), if any.
    pub observability_listen: Option<SocketAddr>,
    /// GitLab's `agent_info` endpoint for opaque agent tokens, if any.
    pub agent_info: Option<agent_auth::AgentInfoConfig>,
    /// The bearer token `/metrics` requires, if any.
    pub metrics_token: Option<String>,
    /// The Kubernetes API proxy listener (`[k8s_proxy]`), if any.
    pub k8s_proxy: Option<k8s_proxy::K8sProxyConfig>,
    /// The base URL (`http://host:port`) of the Pod's GitLab (`[gitlab] url`):
    /// agentk modules' requests ([`gitlab_access`]) and agent configurations go
    /// there. Without it `MakeRequest` is `FailedPrecondition` and configurations
    /// are not posted.
    pub gitlab_url: Option<String>,
    /// GitLab's URL as its users see it (`[gitlab] external_url`): the
    /// `gitlab_external_url` of the configurations agents get (empty if `None`).
    pub gitlab_external_url: Option<String>,
    /// Agent configuration files (`[agent_configuration]`), if any.
    pub agent_config: Option<agent_config::AgentConfigSource>,
    /// The Workspaces HTTP server's listener (`[workspaces]`), if any.
    pub workspaces: Option<workspaces::WorkspacesConfig>,
    /// GitLab's Job Router (`[job_router]`); `None`: off, runners poll REST.
    pub job_router: Option<job_router::JobRouterConfig>,
}

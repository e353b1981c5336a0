//! Presence: which agentk replicas this kas holds, written to the presence registry
//! (`pod-registry`) as GitLab's kas writes its agent tracker
//! (<https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/agent_tracker/tracker.go>).
//! Rails' listings and kas's routing read it; a replica's connection id names it
//! in both (and in its reverse tunnels' hello).
//!
//! Two ways in, as in GitLab:
//! - **`AgentRegistrar/Register{agent_meta, pod_id}`** (this module's
//!   [`AgentRegistrar`] impl; GitLab's
//!   <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/agent_registrar/server/server.go>):
//!   registers connection `pod_id` of the token's agent. agentk calls it every
//!   5 minutes (`registerAttemptInterval` in `agent_registrar/agent/factory.go`);
//!   the registration lasts [`REGISTRATION_TTL`] from the last call, then it is
//!   removed. GitLab 16.5's kas instead keeps refreshing a registration in Redis
//!   for as long as it runs, so a replica that went away stays listed until that
//!   kas restarts; podgate lets the next `Register` be the refresh, which is what
//!   GitLab's TTL is for. The TTL is twice agentk's interval: one lost call does
//!   not drop a replica.
//! - **`GetConfiguration` without `skip_register`** ([`super::configuration`]): the
//!   stream registers a random connection id for as long as it is open, and
//!   unregisters it when it ends (`maybeRegisterAgent`/`maybeUnregisterAgent` in
//!   `agent_configuration/server/server.go`).
//!
//! Either registration is owned by this kas: the registry refreshes it until it is
//! removed, and removes it at shutdown. Removing it also drops the replica's idle
//! tunnels here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use podgate_agent::proto::gitlab::agent::agent_registrar::rpc::agent_registrar_server::AgentRegistrar;
use podgate_agent::proto::gitlab::agent::agent_registrar::rpc::{
    RegisterRequest, RegisterResponse,
};
use podgate_agent::proto::gitlab::agent::entity::AgentMeta;
use podgate_agent::task::AbortOnDrop;
use podgate_registry::{AgentConnection, KasAddress, KubernetesVersion, Registry};
use tonic::{Request, Response, Status};

use super::agent_auth::{AgentAuth, AgentIdentity};
use super::metrics::KasMetrics;
use super::tunnel::Tunnels;

/// How long a `Register` lasts without the next one.
pub const REGISTRATION_TTL: Duration = Duration::from_secs(10 * 60);

/// Why a registration was refused (answered to the caller as a gRPC status).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// kas is shutting down: the agent should connect elsewhere (retry).
    #[error("kas is shutting down")]
    Draining,
    /// The registry did not take it (retry).
    #[error("agent registry unavailable")]
    Registry(#[source] podgate_registry::Error),
    /// `pod_id` 0: podgate's routing reads connection id 0 as "any replica"
    /// (do not retry with the same id).
    #[error("pod_id must not be 0")]
    ZeroPodId,
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        match e {
            Error::Draining | Error::Registry(_) => Status::unavailable(e.to_string()),
            Error::ZeroPodId => Status::invalid_argument(e.to_string()),
        }
    }
}

/// This kas's registrations.
pub(crate) struct Presence {
    /// True once kas is shutting down: new agents are sent elsewhere.
    pub(crate) draining: tokio::sync::watch::Receiver<bool>,
    pub(crate) registry: Registry,
    pub(crate) auth: Arc<AgentAuth>,
    pub(crate) tunnels: Arc<Tunnels>,
    pub(crate) metrics: Arc<KasMetrics>,
    /// This kas's internal address: where other kas instances reach its agents.
    pub(crate) kas: KasAddress,
    /// How long a `Register` lasts ([`REGISTRATION_TTL`]).
    pub(crate) ttl: Duration,
    /// `Register`ed connections, by agent and pod id.
    pub(crate) expiring: Mutex<HashMap<(i64, i64), Expiring>>,
}

/// A `Register`ed connection and the timer that removes it.
pub(crate) struct Expiring {
    _registered: Registered,
    /// Which `Register` armed the timer.
    generation: u64,
    _timer: AbortOnDrop,
}

/// A registered connection; unregistered when dropped.
pub(crate) struct Registered {
    registry: Registry,
    tunnels: Arc<Tunnels>,
    metrics: Arc<KasMetrics>,
    agent_id: i64,
    connection_id: i64,
    /// False for a duplicate guard, dropped without unregistering.
    armed: bool,
}

impl Registered {
    /// Drop this guard without unregistering: another guard holds the same
    /// registration.
    fn duplicate(mut self) {
        self.armed = false;
        self.metrics.connected_agents.dec();
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (registry, agent, connection) =
            (self.registry.clone(), self.agent_id, self.connection_id);
        self.metrics.connected_agents.dec();
        self.tunnels.forget(agent, connection);
        tracing::info!(
            agent_id = agent,
            connection_id = connection,
            "agent disconnected"
        );
        let metrics = self.metrics.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = registry.unregister_agent(agent, connection).await {
                    metrics.registry_error("unregister_agent");
                    tracing::warn!(agent_id = agent, connection_id = connection, error = %e, "unregistering the agent failed; it expires");
                }
            });
        }
    }
}

/// A random connection id, never 0 (GitLab's `mathz.Int63`, minus 0, which
/// podgate's routing reads as "any").
pub(crate) fn random_connection_id() -> i64 {
    use rand::Rng as _;
    rand::thread_rng().gen_range(1..i64::MAX)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Presence {
    /// Register connection `connection_id` of `who` with `meta`. The registration
    /// lasts as long as the returned guard, and no longer than this kas.
    pub(crate) async fn register(
        &self,
        who: AgentIdentity,
        meta: AgentMeta,
        connection_id: i64,
    ) -> Result<Registered, Error> {
        if *self.draining.borrow() {
            return Err(Error::Draining);
        }
        let conn = AgentConnection {
            agent_id: who.agent_id,
            connection_id,
            project_id: who.project_id,
            version: meta.version,
            commit: meta.commit_id,
            pod_namespace: meta.pod_namespace,
            pod_name: meta.pod_name,
            kubernetes_version: meta.kubernetes_version.map(|v| KubernetesVersion {
                major: v.major,
                minor: v.minor,
                git_version: v.git_version,
                platform: v.platform,
            }),
            connected_at_ms: now_ms(),
            kas: self.kas.clone(),
        };
        self.registry.register_agent(conn).await.map_err(|e| {
            self.metrics.registry_error("register_agent");
            tracing::warn!(error = %e, "registering an agent failed");
            Error::Registry(e)
        })?;
        Ok(self.registered(who.agent_id, connection_id))
    }

    /// The guard of a registration the registry has.
    fn registered(&self, agent_id: i64, connection_id: i64) -> Registered {
        self.metrics.connected_agents.inc();
        Registered {
            registry: self.registry.clone(),
            tunnels: self.tunnels.clone(),
            metrics: self.metrics.clone(),
            agent_id,
            connection_id,
            armed: true,
        }
    }

    /// `Register`: register (or refresh) `pod_id` of `who` for [`Presence::ttl`].
    pub(crate) async fn register_for_ttl(
        self: &Arc<Self>,
        who: AgentIdentity,
        meta: AgentMeta,
        pod_id: i64,
    ) -> Result<(), Error> {
        if pod_id == 0 {
            return Err(Error::ZeroPodId);
        }
        let key = (who.agent_id, pod_id);
        // Written again every time: the registration's meta may have changed (a
        // new Kubernetes version, an upgraded agentk).
        let fresh = self.register(who.clone(), meta, pod_id).await?;
        let mut expiring = self.lock();
        let generation = expiring.get(&key).map_or(0, |e| e.generation + 1);
        let timer = AbortOnDrop::spawn(expire(
            Arc::downgrade(self),
            key,
            generation,
            tokio::time::Instant::now() + self.ttl,
        ));
        match expiring.get_mut(&key) {
            Some(e) => {
                tracing::debug!(
                    agent_id = who.agent_id,
                    pod_id,
                    "agent registration refreshed"
                );
                // Still registered: keep the old guard (dropping either armed
                // would unregister the connection just written).
                fresh.duplicate();
                e.generation = generation;
                e._timer = timer;
            }
            None => {
                tracing::info!(agent_id = who.agent_id, pod_id, "agent registered");
                expiring.insert(
                    key,
                    Expiring {
                        _registered: fresh,
                        generation,
                        _timer: timer,
                    },
                );
            }
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(i64, i64), Expiring>> {
        self.expiring.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// At `deadline`, remove registration `key` unless a later `Register` re-armed it.
async fn expire(
    presence: Weak<Presence>,
    key: (i64, i64),
    generation: u64,
    deadline: tokio::time::Instant,
) {
    tokio::time::sleep_until(deadline).await;
    let Some(presence) = presence.upgrade() else {
        return;
    };
    let gone = {
        let mut expiring = presence.lock();
        match expiring.get(&key) {
            Some(e) if e.generation == generation => expiring.remove(&key),
            _ => None,
        }
    };
    if let Some(gone) = gone {
        tracing::info!(
            agent_id = key.0,
            pod_id = key.1,
            "agent registration expired"
        );
        // Dropping the entry unregisters it; its timer is this task, which ends here.
        drop(gone);
    }
}

/// `gitlab.agent.agent_registrar.rpc.AgentRegistrar` on the agent listener.
pub(crate) struct Registrar(pub(crate) Arc<Presence>);

#[tonic::async_trait]
impl AgentRegistrar for Registrar {
    async fn register(
        &self,
        request: Request<RegisterRequest>,
    ) -> Result<Response<RegisterResponse>, Status> {
        let who = self.0.auth.authenticate(request.metadata()).await?;
        let req = request.into_inner();
        self.0
            .register_for_ttl(who, req.agent_meta.unwrap_or_default(), req.pod_id)
            .await?;
        Ok(Response::new(RegisterResponse {}))
    }
}

#[cfg(test)]
#[path = "presence_tests.rs"]
mod tests;

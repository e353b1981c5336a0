//! The agent listener's `GetConfiguration`: each open stream is one connected agentk
//! replica. It gets a random connection id, is registered in the presence registry
//! with its `ConnectedAgentInfo` (`agent/proto/kas.proto`), and is unregistered when the stream ends
//! (client gone, kas shutting down).
//!
//! The first message carries the agent's configuration file when kas has
//! `[agent_configuration]` ([`super::agent_config`]), and a new message follows
//! each change of it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use podgate_registry::{AgentConnection, KasAddress, Registry};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::agent_auth::AgentAuth;
use super::agent_config::AgentConfigs;
use super::metrics::KasMetrics;
use super::tunnel::Tunnels;
use podgate_agent::proto::agent_configuration_service_server::AgentConfigurationService;
use podgate_agent::proto::{AgentConfiguration, GetConfigurationRequest};

pub(crate) struct Presence {
    /// True once kas is shutting down: new agents are sent elsewhere.
    pub(crate) draining: tokio::sync::watch::Receiver<bool>,
    pub(crate) registry: Registry,
    pub(crate) auth: Arc<AgentAuth>,
    pub(crate) tunnels: Arc<Tunnels>,
    pub(crate) metrics: Arc<KasMetrics>,
    /// This kas's internal address: where other kas instances reach its agents.
    pub(crate) kas: KasAddress,
    /// Agent configuration files, if kas has them.
    pub(crate) configs: Option<Arc<AgentConfigs>>,
}

/// The configuration stream; unregisters its connection when dropped.
pub struct ConfigStream {
    rx: mpsc::Receiver<Result<AgentConfiguration, Status>>,
    guard: Registered,
}

struct Registered {
    registry: Registry,
    tunnels: Arc<Tunnels>,
    metrics: Arc<KasMetrics>,
    agent_id: i64,
    connection_id: i64,
}

impl Drop for Registered {
    fn drop(&mut self) {
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

impl Stream for ConfigStream {
    type Item = Result<AgentConfiguration, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let _ = &self.guard;
        self.rx.poll_recv(cx)
    }
}

fn random_connection_id() -> i64 {
    use rand::Rng as _;
    rand::thread_rng().gen_range(1..i64::MAX)
}

#[tonic::async_trait]
impl AgentConfigurationService for Presence {
    type GetConfigurationStream = ConfigStream;

    async fn get_configuration(
        &self,
        request: Request<GetConfigurationRequest>,
    ) -> Result<Response<ConfigStream>, Status> {
        if *self.draining.borrow() {
            return Err(Status::unavailable("kas is shutting down"));
        }
        let who = self.auth.authenticate(request.metadata()).await?;
        let meta = request.into_inner().agent_meta.unwrap_or_default();
        let connection_id = random_connection_id();
        let conn = AgentConnection {
            agent_id: who.agent_id,
            connection_id,
            project_id: who.project_id,
            version: meta.version,
            commit: meta.commit,
            pod_namespace: meta.pod_namespace,
            pod_name: meta.pod_name,
            connected_at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            kas: self.kas.clone(),
        };
        self.registry.register_agent(conn).await.map_err(|e| {
            self.metrics.registry_error("register_agent");
            tracing::warn!(error = %e, "registering an agent failed");
            Status::unavailable("agent registry unavailable")
        })?;
        tracing::info!(agent_id = who.agent_id, connection_id, "agent connected");
        self.metrics.connected_agents.inc();
        let (tx, rx) = mpsc::channel(4);
        let template = AgentConfiguration {
            agent_id: who.agent_id,
            project_id: who.project_id,
            connection_id,
            config_yaml: String::new(),
        };
        let guard = Registered {
            registry: self.registry.clone(),
            tunnels: self.tunnels.clone(),
            metrics: self.metrics.clone(),
            agent_id: who.agent_id,
            connection_id,
        };
        // Keep the sender alive as long as the stream: the stream stays open until the
        // client goes away (or kas stops).
        match &self.configs {
            Some(configs) => {
                let first = configs.first(who.agent_id).await;
                let _ = tx
                    .send(Ok(AgentConfiguration {
                        config_yaml: first.parsed.text.clone(),
                        ..template.clone()
                    }))
                    .await;
                tokio::spawn(configs.clone().watch(who.agent_id, first, template, tx));
            }
            None => {
                let _ = tx.send(Ok(template)).await;
                tokio::spawn(async move {
                    tx.closed().await;
                });
            }
        }
        Ok(Response::new(ConfigStream { rx, guard }))
    }
}

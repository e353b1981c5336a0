//! `KasApi`: GitLab's questions about connected agents, answered from the presence
//! registry, and `GetPods`, routed to the agent by [`AgentRouter`].

use std::sync::Arc;

use podgate_registry::{AgentConnection, Registry};
use tonic::{Request, Response, Status};

use super::metrics::KasMetrics;
use super::routing::AgentRouter;
use podgate_agent::proto::kas_api_server::KasApi;
use podgate_agent::proto::{
    ConnectedAgentInfo, ConnectedAgentsByIdRequest, ConnectedAgentsByIdResponse,
    ConnectedAgentsForProjectRequest, ConnectedAgentsForProjectResponse, GetPodsRequest,
    GetPodsResponse, KasAddress,
};

/// `ip:port` (or a host name) into a `KasAddress` (`agent/proto/kas.proto`).
fn kas_address(addr: &str) -> KasAddress {
    match addr.rsplit_once(':') {
        Some((ip, port)) => KasAddress {
            ip: ip.trim_matches(|c| c == '[' || c == ']').to_owned(),
            port: port.parse().unwrap_or(0),
        },
        None => KasAddress {
            ip: addr.to_owned(),
            port: 0,
        },
    }
}

fn info(c: AgentConnection) -> ConnectedAgentInfo {
    ConnectedAgentInfo {
        id: c.agent_id,
        connection_id: c.connection_id,
        version: c.version,
        commit: c.commit,
        pod_namespace: c.pod_namespace,
        pod_name: c.pod_name,
        connected_at_ms: i64::try_from(c.connected_at_ms).unwrap_or(i64::MAX),
        kas_address: Some(kas_address(&c.kas.0)),
        project_id: c.project_id,
    }
}

fn registry_error(metrics: &KasMetrics, op: &'static str, e: podgate_registry::Error) -> Status {
    metrics.registry_error(op);
    tracing::warn!(error = %e, op, "registry lookup failed");
    Status::unavailable("agent registry unavailable")
}

/// GitLab's `KasApi` service.
pub(super) struct Api {
    /// Where connected agents are looked up.
    pub(super) registry: Registry,
    /// Routes `GetPods` to the agent.
    pub(super) router: Arc<AgentRouter>,
    /// Counts registry errors.
    pub(super) metrics: Arc<KasMetrics>,
}

/// A `GetPods` answer from agentk, with the replica that answered.
pub(super) fn get_pods_response(
    connection_id: i64,
    payload: &[u8],
) -> Result<GetPodsResponse, Status> {
    use prost::Message as _;
    let mut resp = GetPodsResponse::decode(payload)
        .map_err(|_| Status::internal("agentk sent an undecodable GetPods response"))?;
    resp.connection_id = connection_id;
    Ok(resp)
}

#[tonic::async_trait]
impl KasApi for Api {
    async fn connected_agents_for_project(
        &self,
        request: Request<ConnectedAgentsForProjectRequest>,
    ) -> Result<Response<ConnectedAgentsForProjectResponse>, Status> {
        let project = request.into_inner().project_id;
        let agents = self
            .registry
            .connections_by_project(project)
            .await
            .map_err(|e| registry_error(&self.metrics, "connections_by_project", e))?;
        Ok(Response::new(ConnectedAgentsForProjectResponse {
            agents: agents.into_iter().map(info).collect(),
        }))
    }

    async fn connected_agents_by_id(
        &self,
        request: Request<ConnectedAgentsByIdRequest>,
    ) -> Result<Response<ConnectedAgentsByIdResponse>, Status> {
        let agent = request.into_inner().agent_id;
        let agents = self
            .registry
            .connections_by_agent(agent)
            .await
            .map_err(|e| registry_error(&self.metrics, "connections_by_agent", e))?;
        Ok(Response::new(ConnectedAgentsByIdResponse {
            agents: agents.into_iter().map(info).collect(),
        }))
    }

    /// Routed by [`AgentRouter`]: a local tunnel, else the kas the registry names,
    /// else wait for the agent to connect.
    async fn get_pods(
        &self,
        request: Request<GetPodsRequest>,
    ) -> Result<Response<GetPodsResponse>, Status> {
        use prost::Message as _;
        let req = request.into_inner();
        let routed = self
            .router
            .open(
                req.agent_id,
                req.connection_id,
                podgate_agent::tunnel::GET_PODS,
                req.encode_to_vec(),
            )
            .await?;
        let connection_id = routed.connection_id();
        let payload = routed.unary().await?;
        get_pods_response(connection_id, &payload).map(Response::new)
    }
}

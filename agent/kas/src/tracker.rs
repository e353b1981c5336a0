//! GitLab's `gitlab.agent.agent_tracker.rpc.AgentTracker` on the external listener:
//! Rails asks which agents are connected, by project or by agent, and every kas
//! answers from the shared presence registry, whichever kas holds the agent.
//!
//! As GitLab's kas answers it
//! (`internal/module/agent_tracker/server/server.go`,
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/agent_tracker/server/server.go>):
//! one `ConnectedAgentInfo{agent_meta, connected_at, connection_id, agent_id,
//! project_id}` per connected agentk replica; a registry that does not answer is
//! `Unavailable` (`GetConnectionsByProjectId() failed`); a request with neither id is
//! `InvalidArgument` (GitLab's `validate.required` on the `oneof`).

use std::sync::Arc;

use podgate_registry::{AgentConnection, Registry};
use tonic::{Request, Response, Status};

use super::metrics::KasMetrics;
use podgate_agent::proto::gitlab::agent::agent_tracker::ConnectedAgentInfo;
use podgate_agent::proto::gitlab::agent::agent_tracker::rpc::agent_tracker_server::AgentTracker;
use podgate_agent::proto::gitlab::agent::agent_tracker::rpc::get_connected_agents_request::Request as By;
use podgate_agent::proto::gitlab::agent::agent_tracker::rpc::{
    GetConnectedAgentsRequest, GetConnectedAgentsResponse,
};
use podgate_agent::proto::gitlab::agent::entity::{self, AgentMeta};

/// A registry connection as GitLab's `ConnectedAgentInfo`.
pub(crate) fn connected_agent_info(c: AgentConnection) -> ConnectedAgentInfo {
    let ms = i64::try_from(c.connected_at_ms).unwrap_or(i64::MAX);
    ConnectedAgentInfo {
        agent_meta: Some(AgentMeta {
            version: c.version,
            commit_id: c.commit,
            pod_namespace: c.pod_namespace,
            pod_name: c.pod_name,
            kubernetes_version: c.kubernetes_version.map(|v| entity::KubernetesVersion {
                major: v.major,
                minor: v.minor,
                git_version: v.git_version,
                platform: v.platform,
            }),
        }),
        connected_at: Some(prost_types::Timestamp {
            seconds: ms.div_euclid(1000),
            nanos: i32::try_from(ms.rem_euclid(1000) * 1_000_000).unwrap_or(0),
        }),
        connection_id: c.connection_id,
        agent_id: c.agent_id,
        project_id: c.project_id,
    }
}

/// GitLab's `AgentTracker` service.
pub(crate) struct Tracker {
    /// Where connected agents are looked up.
    pub(crate) registry: Registry,
    /// Counts registry errors.
    pub(crate) metrics: Arc<KasMetrics>,
}

#[tonic::async_trait]
impl AgentTracker for Tracker {
    async fn get_connected_agents(
        &self,
        request: Request<GetConnectedAgentsRequest>,
    ) -> Result<Response<GetConnectedAgentsResponse>, Status> {
        let (found, op, failed) = match request.into_inner().request {
            Some(By::ProjectId(id)) => (
                self.registry.connections_by_project(id).await,
                "connections_by_project",
                "GetConnectionsByProjectId() failed",
            ),
            Some(By::AgentId(id)) => (
                self.registry.connections_by_agent(id).await,
                "connections_by_agent",
                "GetConnectionsByAgentId() failed",
            ),
            None => {
                return Err(Status::invalid_argument(
                    "invalid GetConnectedAgentsRequest.Request: value is required",
                ));
            }
        };
        let agents = found.map_err(|e| {
            self.metrics.registry_error(op);
            tracing::warn!(error = %e, op, "registry lookup failed");
            Status::unavailable(failed)
        })?;
        Ok(Response::new(GetConnectedAgentsResponse {
            agents: agents.into_iter().map(connected_agent_info).collect(),
        }))
    }
}

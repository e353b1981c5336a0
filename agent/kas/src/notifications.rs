//! `gitlab.agent.notifications.rpc.Notifications/GitPushEvent` on the external
//! (Rails-facing) listener: Rails reports a push to a project, and the
//! configuration streams of that project's agents, on every kas, read their
//! configuration at once instead of at their next poll.
//!
//! As GitLab's kas does, the service publishes the event to every kas through the
//! registry (on Redis: `PUBLISH kas_events`, the event in a `google.protobuf.Any`),
//! and answers `UNAVAILABLE` when it cannot; `relay` hands the events every kas
//! hears to its configuration streams, whose project matches poke their poll
//! (`GitPushEvent` in
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/notifications/server/server.go>,
//! `publishEvent`/`subscribeToEvents` in
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/cmd/kas/kasapp/server_api.go>,
//! `OnGitPushEvent` in
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/agent_configuration/server/server.go>).
//!
//! podgate matches by `project.id` (its agent tokens name the project by id; GitLab
//! matches the path it got from `agent_info`). Pub/sub delivers at most once: a kas
//! whose subscription was down misses the event and its streams see the push at
//! their next poll, as with GitLab's.

use std::sync::Arc;

use podgate_agent::any;
use podgate_agent::proto::gitlab::agent::event::GitPushEvent;
use podgate_agent::proto::gitlab::agent::notifications::rpc::notifications_server::Notifications;
use podgate_agent::proto::gitlab::agent::notifications::rpc::{
    GitPushEventRequest, GitPushEventResponse,
};
use podgate_registry::Registry;
use prost::Message as _;
use tokio::sync::broadcast;
use tonic::{Request, Response, Status};

use super::agent_config::AgentConfigs;

/// The protobuf full name of the one event kas publishes.
const GIT_PUSH_EVENT: &str = "gitlab.agent.event.GitPushEvent";

/// The notifications service (authenticated by the external listener's
/// interceptor): publishes each push to every kas.
pub(crate) struct NotificationsService(pub(crate) Registry);

#[tonic::async_trait]
impl Notifications for NotificationsService {
    async fn git_push_event(
        &self,
        request: Request<GitPushEventRequest>,
    ) -> Result<Response<GitPushEventResponse>, Status> {
        // GitLab's validation: the event and its project are required.
        let event = request
            .into_inner()
            .event
            .filter(|e| e.project.is_some())
            .ok_or_else(|| Status::invalid_argument("event.project is required"))?;
        if let Some(p) = &event.project {
            tracing::debug!(project_id = p.id, full_path = %p.full_path, "git push event");
        }
        let payload = any::pack(GIT_PUSH_EVENT, &event).encode_to_vec();
        self.0.publish_kas_event(&payload).await.map_err(|e| {
            tracing::error!(error = %e, "Failed to publish received git push event");
            Status::unavailable(format!("Failed to publish received git push event: {e}"))
        })?;
        Ok(Response::new(GitPushEventResponse {}))
    }
}

/// Hands every `GitPushEvent` published to the kas instances (by any of them) to
/// this kas's configuration streams, until the registry is gone. An event that
/// cannot be read is logged and skipped, as GitLab's kas does.
pub(crate) async fn relay(mut events: broadcast::Receiver<Arc<[u8]>>, configs: Arc<AgentConfigs>) {
    loop {
        let payload = match events.recv().await {
            Ok(p) => p,
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(lost = n, "kas events arrived faster than they were read");
                continue;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let event = prost_types::Any::decode(&payload[..])
            .map_err(|e| e.to_string())
            .and_then(|a| {
                any::unpack::<GitPushEvent>(&a, GIT_PUSH_EVENT).map_err(|e| e.to_string())
            });
        match event {
            Ok(GitPushEvent {
                project: Some(project),
            }) => configs.pushed(project.id),
            Ok(_) => tracing::warn!("a git push event without a project"),
            Err(e) => tracing::warn!(error = %e, "a kas event that cannot be handled"),
        }
    }
}

//! `gitlab.agent.notifications.rpc.Notifications/GitPushEvent` on the external
//! (Rails-facing) listener: Rails reports a push to a project, and the
//! configuration streams of that project's agents read their configuration at
//! once instead of at their next poll. GitLab's kas publishes the event to every
//! kas through Redis and each configuration stream whose project matches pokes its
//! poll (<https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/notifications/server/server.go>,
//! and `OnGitPushEvent` in
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/agent_configuration/server/server.go>).
//!
//! podgate matches by `project.id` (its agent tokens name the project by id; GitLab
//! matches the path it got from `agent_info`), and pokes the streams of this kas:
//! streams on other kas instances see the change at their next poll.

use std::sync::Arc;

use podgate_agent::proto::gitlab::agent::notifications::rpc::notifications_server::Notifications;
use podgate_agent::proto::gitlab::agent::notifications::rpc::{
    GitPushEventRequest, GitPushEventResponse,
};
use tonic::{Request, Response, Status};

use super::agent_config::AgentConfigs;

/// The notifications service (authenticated by the external listener's
/// interceptor).
pub(crate) struct NotificationsService(pub(crate) Arc<AgentConfigs>);

#[tonic::async_trait]
impl Notifications for NotificationsService {
    async fn git_push_event(
        &self,
        request: Request<GitPushEventRequest>,
    ) -> Result<Response<GitPushEventResponse>, Status> {
        // GitLab's validation: the event and its project are required.
        let project = request
            .into_inner()
            .event
            .and_then(|e| e.project)
            .ok_or_else(|| Status::invalid_argument("event.project is required"))?;
        tracing::debug!(project_id = project.id, full_path = %project.full_path, "git push event");
        self.0.pushed(project.id);
        Ok(Response::new(GitPushEventResponse {}))
    }
}

//! The Rails-shaped client against a stand-in kas that checks Rails' JWT as GitLab's
//! kas does: `GetConnectedAgents` by project and by agent, `GitPushEvent`, and a
//! token signed with another secret refused.

use tokio::net::TcpListener;

use super::proto::gitlab::agent::agent_tracker::ConnectedAgentInfo;
use super::proto::gitlab::agent::agent_tracker::rpc::{
    GetConnectedAgentsRequest, GetConnectedAgentsResponse,
    agent_tracker_server::{AgentTracker, AgentTrackerServer},
    get_connected_agents_request::Request,
};
use super::proto::gitlab::agent::notifications::rpc::{
    GitPushEventRequest, GitPushEventResponse,
    notifications_server::{Notifications, NotificationsServer},
};
use super::rails::RailsClient;

const KAS_SECRET: &[u8] = b"kas-secret-32-bytes-long-enough!";

/// An `AgentTracker` that checks the JWT as GitLab's kas checks Rails'
/// (`cmd/kas/kasapp/app_api_server.go`: HS256 with the shared secret, audience
/// `gitlab-kas`, any issuer) and answers one agent for project 7 and agent 42.
struct Tracker;

#[tonic::async_trait]
impl AgentTracker for Tracker {
    async fn get_connected_agents(
        &self,
        req: tonic::Request<GetConnectedAgentsRequest>,
    ) -> Result<tonic::Response<GetConnectedAgentsResponse>, tonic::Status> {
        let value = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let token = value.strip_prefix("bearer ").ok_or_else(|| {
            tonic::Status::unauthenticated(format!("not a lowercase bearer: {value:.10}"))
        })?;
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
        validation.set_audience(&["gitlab-kas"]);
        let claims = jsonwebtoken::decode::<serde_json::Value>(
            token,
            &jsonwebtoken::DecodingKey::from_secret(KAS_SECRET),
            &validation,
        )
        .map_err(|e| tonic::Status::unauthenticated(e.to_string()))?
        .claims;
        assert_eq!(claims["iss"], "gitlab.example.com");
        assert_eq!(
            claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap(),
            60
        );
        assert_eq!(
            claims["iat"].as_u64().unwrap() - claims["nbf"].as_u64().unwrap(),
            5
        );
        assert_eq!(claims["jti"].as_str().unwrap().len(), 36);
        let agent = ConnectedAgentInfo {
            agent_id: 42,
            project_id: 7,
            connection_id: 5,
            ..Default::default()
        };
        let agents = match req.into_inner().request {
            Some(Request::ProjectId(7) | Request::AgentId(42)) => vec![agent],
            _ => vec![],
        };
        Ok(tonic::Response::new(GetConnectedAgentsResponse { agents }))
    }
}

/// Rails' `Notifications/GitPushEvent`, checked as [`Tracker`] checks.
struct Pushes(tokio::sync::mpsc::UnboundedSender<(i64, String)>);

#[tonic::async_trait]
impl Notifications for Pushes {
    async fn git_push_event(
        &self,
        req: tonic::Request<GitPushEventRequest>,
    ) -> Result<tonic::Response<GitPushEventResponse>, tonic::Status> {
        let value = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        assert!(value.starts_with("bearer "), "{value:.10}");
        let project = req
            .into_inner()
            .event
            .and_then(|e| e.project)
            .expect("a project");
        let _ = self.0.send((project.id, project.full_path));
        Ok(tonic::Response::new(GitPushEventResponse {}))
    }
}

#[tokio::test]
async fn rails_client_lists_agents_with_rails_jwt() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (pushes_tx, mut pushes) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AgentTrackerServer::new(Tracker))
            .add_service(NotificationsServer::new(Pushes(pushes_tx)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let rails =
        RailsClient::new(&addr.to_string(), KAS_SECRET, "gitlab.example.com").expect("client");
    let by_project = rails
        .connected_agents_by_project(7)
        .await
        .expect("by project");
    assert_eq!(
        by_project.iter().map(|a| a.agent_id).collect::<Vec<_>>(),
        [42]
    );
    let by_agent = rails.connected_agents_by_agent(42).await.expect("by agent");
    assert_eq!(
        by_agent.iter().map(|a| a.connection_id).collect::<Vec<_>>(),
        [5]
    );
    assert!(
        rails
            .connected_agents_by_agent(43)
            .await
            .expect("none")
            .is_empty()
    );
    rails
        .git_push_event(7, "group/agents")
        .await
        .expect("GitPushEvent");
    assert_eq!(pushes.recv().await, Some((7, "group/agents".to_owned())));
    // Signed with another secret, kas refuses it.
    let wrong = RailsClient::new(
        &addr.to_string(),
        b"another-secret-32-bytes-long-xx!",
        "gitlab.example.com",
    )
    .expect("client");
    let err = wrong
        .connected_agents_by_project(7)
        .await
        .expect_err("wrong secret");
    assert!(
        matches!(&err, super::rails::Error::Status(s) if s.code() == tonic::Code::Unauthenticated),
        "{err:?}"
    );
}

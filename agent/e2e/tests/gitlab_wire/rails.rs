//! A Rails-shaped kas client for the tests: `AgentTracker/GetConnectedAgents` (and
//! `Notifications/GitPushEvent`) called as GitLab's Rails calls them, on the tests'
//! own protobuf types.
//!
//! Rails' `lib/gitlab/kas/client.rb` (github.com/gitlabhq/gitlabhq) sends metadata
//! `authorization: bearer <JWT>` (lowercase scheme); the JWT is
//! `JSONWebToken::HMACToken` (`lib/json_web_token/hmac_token.rb`, `token.rb`): HS256,
//! header `typ: JWT`, claims `jti` (a UUID), `aud` `gitlab-kas`, `iss` the GitLab host
//! name (`Settings.gitlab.host`, no scheme), `iat` now, `nbf` now − 5 s, `exp` now +
//! 60 s, signed with the shared kas secret. Rails 16.5 asks by project id; the
//! request's oneof also takes an agent id.

use std::time::{SystemTime, UNIX_EPOCH};

use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

use super::proto::gitlab::agent::agent_tracker::ConnectedAgentInfo;
use super::proto::gitlab::agent::agent_tracker::rpc::{
    GetConnectedAgentsRequest, agent_tracker_client::AgentTrackerClient,
    get_connected_agents_request::Request,
};
use super::proto::gitlab::agent::event::{GitPushEvent, Project};
use super::proto::gitlab::agent::notifications::rpc::{
    GitPushEventRequest, notifications_client::NotificationsClient,
};

/// Why a Rails call failed. Not retried by the tests.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kas URL is not one tonic can dial.
    #[error("kas URL: {0}")]
    Url(#[from] tonic::transport::Error),
    /// Signing the JWT failed.
    #[error("signing the JWT: {0}")]
    Jwt(#[from] jsonwebtoken::errors::Error),
    /// kas answered an error.
    #[error("kas: {0}")]
    Status(#[from] tonic::Status),
}

/// Rails' kas client.
pub struct RailsClient {
    channel: Channel,
    secret: Vec<u8>,
    gitlab_host: String,
}

#[derive(serde::Serialize)]
struct Claims<'a> {
    jti: String,
    aud: &'a str,
    iss: &'a str,
    iat: u64,
    nbf: u64,
    exp: u64,
}

impl RailsClient {
    /// A client of kas's API listener at `address` (`host:port`), signing with the
    /// decoded kas `secret`, `iss` `gitlab_host`.
    pub fn new(address: &str, secret: &[u8], gitlab_host: &str) -> Result<Self, Error> {
        let channel = Channel::from_shared(format!("http://{address}")).map_err(|e| {
            Error::Status(tonic::Status::invalid_argument(format!(
                "kas address {address:?}: {e}"
            )))
        })?;
        Ok(Self {
            channel: channel.connect_lazy(),
            secret: secret.to_vec(),
            gitlab_host: gitlab_host.to_owned(),
        })
    }

    /// The JWT Rails signs for one call.
    pub fn token(&self) -> Result<String, Error> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        let claims = Claims {
            jti: uuid_v4(),
            aud: "gitlab-kas",
            iss: &self.gitlab_host,
            iat: now,
            nbf: now - 5,
            exp: now + 60,
        };
        let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        Ok(jsonwebtoken::encode(
            &header,
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(&self.secret),
        )?)
    }

    fn request<T>(&self, msg: T) -> Result<tonic::Request<T>, Error> {
        let mut req = tonic::Request::new(msg);
        let value: MetadataValue<_> = format!("bearer {}", self.token()?)
            .parse()
            .map_err(|_| tonic::Status::internal("a JWT is ASCII"))?;
        req.metadata_mut().insert("authorization", value);
        Ok(req)
    }

    /// The agents connected for a configuration project.
    pub async fn connected_agents_by_project(
        &self,
        project_id: i64,
    ) -> Result<Vec<ConnectedAgentInfo>, Error> {
        self.connected_agents(Request::ProjectId(project_id)).await
    }

    /// The Pods of one agent that are connected.
    pub async fn connected_agents_by_agent(
        &self,
        agent_id: i64,
    ) -> Result<Vec<ConnectedAgentInfo>, Error> {
        self.connected_agents(Request::AgentId(agent_id)).await
    }

    async fn connected_agents(&self, request: Request) -> Result<Vec<ConnectedAgentInfo>, Error> {
        let req = self.request(GetConnectedAgentsRequest {
            request: Some(request),
        })?;
        let resp = AgentTrackerClient::new(self.channel.clone())
            .get_connected_agents(req)
            .await?;
        Ok(resp.into_inner().agents)
    }

    /// `send_git_push_event(project:)`.
    pub async fn git_push_event(&self, id: i64, full_path: &str) -> Result<(), Error> {
        let event = GitPushEvent {
            project: Some(Project {
                id,
                full_path: full_path.to_owned(),
            }),
        };
        let req = self.request(GitPushEventRequest { event: Some(event) })?;
        NotificationsClient::new(self.channel.clone())
            .git_push_event(req)
            .await?;
        Ok(())
    }
}

/// `SecureRandom.uuid`: a random version 4 UUID.
fn uuid_v4() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

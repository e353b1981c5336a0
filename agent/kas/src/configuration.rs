//! `gitlab.agent.agent_configuration.rpc.AgentConfiguration/GetConfiguration` on the
//! agent listener, as GitLab's kas serves it
//! (<https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/agent_configuration/server/server.go>):
//!
//! - The request carries the `commit_id` of the configuration agentk has (`""` at
//!   first). kas reads the agent's configuration ([`super::agent_config`]) at once
//!   and then every poll, and when GitLab reports a push to the agent's project
//!   (`Notifications/GitPushEvent`, [`super::notifications`]); it sends a
//!   `ConfigurationResponse` only when the commit differs from the last one the
//!   agent has (the request's, then the last sent). A resumed stream whose commit
//!   is current gets nothing until the next change.
//! - The response's `AgentConfiguration` is the file's fields plus who the agent
//!   is: `agent_id`, `project_id` (from its token), `project_path` (GitLab's
//!   `agent_info` for an opaque `glagent-` token; empty for podgate's JWT agent
//!   tokens, which carry no path) and `gitlab_external_url` (`[gitlab]
//!   external_url`), as `sendConfigResponse` builds it; `user_access` stays with
//!   kas, as in GitLab.
//! - A file GitLab would refuse ends the stream with `FailedPrecondition` (`Config:
//!   …`); the agent keeps the configuration it has and retries.
//! - Without `skip_register` the stream is a registered connection with a random
//!   id while it is open ([`super::presence`]); agentks that call `Register` set it.
//! - Each accepted configuration is posted to GitLab (once per agent and commit).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use podgate_agent::proto::gitlab::agent::agent_configuration::rpc::agent_configuration_server::AgentConfiguration;
use podgate_agent::proto::gitlab::agent::agent_configuration::rpc::{
    ConfigurationRequest, ConfigurationResponse,
};
use podgate_agent::proto::gitlab::agent::agentcfg;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::agent_auth::AgentIdentity;
use super::agent_config::{AgentConfigs, Snapshot};
use super::presence::{Presence, Registered, random_connection_id};

/// The configuration service.
pub(crate) struct ConfigurationService {
    pub(crate) presence: Arc<Presence>,
    pub(crate) configs: Arc<AgentConfigs>,
    /// `gitlab_external_url` of every configuration sent.
    pub(crate) gitlab_external_url: String,
}

/// A configuration stream; unregisters its connection (if it registered one) when
/// dropped.
pub struct ConfigStream {
    /// Boxed: the channel allocates its first 32 slots when it is made, and every
    /// connected agent holds one for hours (a slot of the response itself would be
    /// over a kilobyte).
    rx: mpsc::Receiver<Box<Result<ConfigurationResponse, Status>>>,
    _registered: Option<Registered>,
}

impl Stream for ConfigStream {
    type Item = Result<ConfigurationResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|r| r.map(|b| *b))
    }
}

/// What the agent is sent for `snapshot` (`sendConfigResponse`).
pub(crate) fn response(
    who: &AgentIdentity,
    gitlab_external_url: &str,
    snapshot: &Snapshot,
) -> ConfigurationResponse {
    let file = snapshot.parsed.file.clone();
    ConfigurationResponse {
        configuration: Some(agentcfg::AgentConfiguration {
            gitops: file.gitops,
            observability: file.observability,
            agent_id: who.agent_id,
            project_id: who.project_id,
            ci_access: file.ci_access,
            container_scanning: file.container_scanning,
            project_path: who.project_path.to_string(),
            remote_development: file.remote_development,
            flux: file.flux,
            gitlab_external_url: gitlab_external_url.to_owned(),
        }),
        commit_id: snapshot.commit_id.clone(),
    }
}

#[tonic::async_trait]
impl AgentConfiguration for ConfigurationService {
    type GetConfigurationStream = ConfigStream;

    async fn get_configuration(
        &self,
        request: Request<ConfigurationRequest>,
    ) -> Result<Response<ConfigStream>, Status> {
        if *self.presence.draining.borrow() {
            return Err(Status::unavailable("kas is shutting down"));
        }
        let who = self.presence.auth.authenticate(request.metadata()).await?;
        let req = request.into_inner();
        let registered = if req.skip_register {
            None
        } else {
            let meta = req.agent_meta.clone().unwrap_or_default();
            let connection_id = random_connection_id();
            let registered = self
                .presence
                .register(who.clone(), meta, connection_id)
                .await?;
            tracing::info!(agent_id = who.agent_id, connection_id, "agent connected");
            Some(registered)
        };
        let (tx, rx) = mpsc::channel(4);
        // Subscribed before the first read, so a push in between is not missed.
        let pushes = self.configs.pushes();
        tokio::spawn(follow(
            self.configs.clone(),
            who,
            self.gitlab_external_url.clone(),
            req.commit_id,
            pushes,
            tx,
        ));
        Ok(Response::new(ConfigStream {
            rx,
            _registered: registered,
        }))
    }
}

/// Read the agent's configuration now, then at each poll and push, and send each
/// commit that differs from `last` on `tx`, until the stream ends.
async fn follow(
    configs: Arc<AgentConfigs>,
    who: AgentIdentity,
    gitlab_external_url: String,
    mut last: String,
    mut pushes: broadcast::Receiver<i64>,
    tx: mpsc::Sender<Box<Result<ConfigurationResponse, Status>>>,
) {
    let agent_id = who.agent_id;
    loop {
        match configs.read(agent_id).await {
            Ok(snapshot) if snapshot.commit_id != last => {
                tracing::info!(agent_id, commit_id = %snapshot.commit_id, "Config: new commit");
                configs.maybe_post(agent_id, &snapshot);
                let message = response(&who, &gitlab_external_url, &snapshot);
                if tx.send(Box::new(Ok(message))).await.is_err() {
                    return;
                }
                last = snapshot.commit_id;
            }
            Ok(snapshot) => {
                // Also retries a post that failed.
                configs.maybe_post(agent_id, &snapshot);
            }
            Err(e) if e.is_user_error() => {
                let _ = tx
                    .send(Box::new(Err(Status::failed_precondition(format!(
                        "Config: {e}"
                    )))))
                    .await;
                return;
            }
            // Logged by `read`; read again at the next poll.
            Err(_) => {}
        }
        let poll = async {
            match configs.poll() {
                Some(p) => tokio::time::sleep(p).await,
                None => std::future::pending().await,
            }
        };
        let pushed = async {
            loop {
                match pushes.recv().await {
                    Ok(project) if project == who.project_id => return,
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
                }
            }
        };
        tokio::select! {
            () = poll => {}
            () = pushed => {
                tracing::debug!(agent_id, "Config: push to the agent's project");
            }
            () = tx.closed() => return,
        }
    }
}

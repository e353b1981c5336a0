//! The connection loop: register (`AgentRegistrar/Register`, [`super::register`]),
//! open the configuration stream (GitLab's
//! `AgentConfiguration/GetConfiguration` with `skip_register` and the last
//! `commit_id`, as GitLab's agentk calls it:
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/agent_configuration/rpc/configuration_watcher.go>),
//! serve reverse tunnels while it is open, reconnect with jittered back-off.

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBuilder};
use tokio::sync::watch;
use tonic::transport::Channel;

use super::register::{Registrar, random_pod_id};
use super::{AgentConfig, AgentkConfig, Handler, Status, TunnelPool, serve_tunnels};
use podgate_agent::proto::gitlab::agent::agent_configuration::rpc::agent_configuration_client::AgentConfigurationClient;
use podgate_agent::proto::gitlab::agent::agent_configuration::rpc::{
    ConfigurationRequest, ConfigurationResponse,
};
use podgate_agent::proto::gitlab::agent::entity::{AgentMeta, KubernetesVersion};
use podgate_agent::task::AbortOnDrop;

/// Waits between connection attempts: a base doubling from 125 ms to 10 s, each
/// wait between 1× and 2× its base (jitter, so replicas that lost kas together do
/// not come back together): the first retry within 250 ms, none after more than
/// 20 s. A connection that opened starts the sequence again.
const RECONNECT: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(125))
    .with_max_delay(Duration::from_secs(10))
    .with_factor(2.0)
    .with_jitter()
    .without_max_times();

/// What [`run`] reports.
pub(super) struct Watches {
    /// The replica's status.
    pub(super) status: watch::Sender<Status>,
    /// The latest agent configuration.
    pub(super) config: watch::Sender<Option<AgentConfig>>,
}

impl Watches {
    /// Publish a configuration (only when it differs from the last).
    fn config(&self, new: AgentConfig) {
        self.config.send_if_modified(|c| {
            if c.as_ref() == Some(&new) {
                false
            } else {
                *c = Some(new);
                true
            }
        });
    }
}

/// Connect, serve tunnels while connected, reconnect with back-off; forever.
pub(super) async fn run<H: Handler>(
    channel: Channel,
    token: String,
    config: AgentkConfig,
    pool: TunnelPool,
    handler: Arc<H>,
    watches: Watches,
) {
    let status = &watches.status;
    let version_handler = handler.clone();
    let registrar = Registrar::new(
        channel.clone(),
        token.clone(),
        AgentMeta {
            version: env!("CARGO_PKG_VERSION").into(),
            commit_id: String::new(),
            pod_namespace: config.pod_namespace.clone(),
            pod_name: config.pod_name.clone(),
            // GitLab's agentk starts with an empty version (`agentkapp/app.go`) and
            // fills it in its registrar's own copy only.
            kubernetes_version: Some(KubernetesVersion::default()),
        },
        random_pod_id(),
        Arc::new(move || version_handler.kubernetes_version()),
    );
    let pod_id = registrar.pod_id;
    let mut delays = RECONNECT.build();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let last = watches.config.borrow().clone();
        match connect(&channel, &token, &registrar, last.as_ref()).await {
            Ok((first, mut stream)) => {
                pool.metrics.connect("ok");
                pool.metrics.connected.set(1);
                delays = RECONNECT.build();
                if let Some(first) = first {
                    watches.config(first);
                }
                let agent_id = watches.config.borrow().as_ref().map_or(0, |c| c.agent_id);
                tracing::info!(agent_id, pod_id, "connected to kas");
                let _ = status.send(Status {
                    connection_id: Some(pod_id),
                    agent_id,
                    attempts,
                    last_error: None,
                });
                // Aborted when this connection ends, and when agentk stops (this task
                // aborted mid-await drops the guards).
                let tunnels = AbortOnDrop::spawn(serve_tunnels(
                    channel.clone(),
                    token.clone(),
                    Some(pod_id),
                    pool.clone(),
                    handler.clone(),
                ));
                let registered = AbortOnDrop::spawn(registrar.clone().keep_registered());
                // Later messages carry new commits; the stream's end is this
                // connection's end.
                let ended = loop {
                    match stream.message().await {
                        Ok(Some(update)) => match AgentConfig::from_response(update) {
                            Some(update) => {
                                tracing::info!(
                                    agent_id = update.agent_id,
                                    commit_id = %update.commit_id,
                                    "agent configuration changed"
                                );
                                watches.config(update);
                            }
                            None => break "kas sent an invalid configuration".to_owned(),
                        },
                        Ok(None) => break "kas ended the stream".to_owned(),
                        Err(e) => break e.message().to_owned(),
                    }
                };
                drop((tunnels, registered));
                pool.metrics.connected.set(0);
                let _ = status.send(Status {
                    attempts,
                    ..Status::default()
                });
                tracing::warn!(reason = %ended, "disconnected from kas; reconnecting");
            }
            Err(e) => {
                let result = match e.code() {
                    tonic::Code::Unauthenticated => "unauthenticated",
                    tonic::Code::Unavailable => "unavailable",
                    _ => "error",
                };
                pool.metrics.connect(result);
                let _ = status.send(Status {
                    attempts,
                    last_error: Some(e.code()),
                    ..Status::default()
                });
                if e.code() == tonic::Code::Unauthenticated {
                    tracing::error!(
                        token = %podgate_tokens::fingerprint(&token),
                        "kas refused the agent token"
                    );
                } else {
                    tracing::warn!(code = ?e.code(), error = %e.message(), "cannot reach kas; retrying");
                }
            }
        }
        // Without a limit on attempts the sequence never ends.
        let wait = delays.next().unwrap_or(Duration::from_secs(20));
        tokio::time::sleep(wait).await;
    }
}

/// Register, then open the configuration stream from `last`'s commit. Without a
/// configuration yet, wait for the first (kas sends it at once: no commit is
/// current), so a connected replica knows its agent.
async fn connect(
    channel: &Channel,
    token: &str,
    registrar: &Registrar,
    last: Option<&AgentConfig>,
) -> Result<(Option<AgentConfig>, tonic::Streaming<ConfigurationResponse>), tonic::Status> {
    registrar.register().await?;
    let mut request = tonic::Request::new(ConfigurationRequest {
        commit_id: last.map(|c| c.commit_id.clone()).unwrap_or_default(),
        agent_meta: Some(registrar.meta.clone()),
        skip_register: true,
    });
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}")
            .parse()
            .map_err(|_| tonic::Status::internal("token is not a header value"))?,
    );
    let mut stream = podgate_agent::gzip_client!(AgentConfigurationClient::new(channel.clone()))
        .get_configuration(request)
        .await?
        .into_inner();
    if last.is_some() {
        return Ok((None, stream));
    }
    match stream.message().await? {
        Some(first) => match AgentConfig::from_response(first) {
            Some(first) => Ok((Some(first), stream)),
            None => Err(tonic::Status::internal(
                "kas sent an invalid configuration (no configuration or commit id)",
            )),
        },
        None => Err(tonic::Status::unavailable(
            "kas ended the configuration stream at once",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_waits_double_within_their_jitter_up_to_20_s() {
        for _ in 0..20 {
            let waits: Vec<Duration> = RECONNECT.build().take(12).collect();
            let mut base = Duration::from_millis(125);
            for wait in waits {
                assert!(
                    wait >= base && wait <= base * 2,
                    "{wait:?} for base {base:?}"
                );
                base = (base * 2).min(Duration::from_secs(10));
            }
        }
    }
}

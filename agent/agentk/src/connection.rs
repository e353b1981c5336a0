//! The connection loop: the configuration stream opened (`GetConfiguration`),
//! reverse tunnels served while it is open, reconnecting with jittered back-off.

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBuilder};
use tokio::sync::watch;
use tonic::transport::Channel;

use super::{AgentConfig, AgentkConfig, Handler, Status, TunnelPool, serve_tunnels};
use podgate_agent::proto::agent_configuration_service_client::AgentConfigurationServiceClient;
use podgate_agent::proto::{AgentMeta, GetConfigurationRequest};
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
    /// Publish a configuration message (only when it differs from the last).
    fn config(&self, message: podgate_agent::proto::AgentConfiguration) {
        let new = AgentConfig::from(message);
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
    let mut delays = RECONNECT.build();
    let mut attempts = 0;
    loop {
        attempts += 1;
        match connect(&channel, &token, &config).await {
            Ok((first, mut stream)) => {
                pool.metrics.connect("ok");
                pool.metrics.connected.set(1);
                delays = RECONNECT.build();
                tracing::info!(
                    agent_id = first.agent_id,
                    connection_id = first.connection_id,
                    "connected to kas"
                );
                let _ = status.send(Status {
                    connection_id: Some(first.connection_id),
                    agent_id: first.agent_id,
                    attempts,
                    last_error: None,
                });
                let connection_id = first.connection_id;
                watches.config(first);
                // Aborted when this connection ends, and when agentk stops (this task
                // aborted mid-await drops the guard).
                let tunnels = AbortOnDrop::spawn(serve_tunnels(
                    channel.clone(),
                    token.clone(),
                    Some(connection_id),
                    pool.clone(),
                    handler.clone(),
                ));
                // Later messages carry configuration changes; the stream's end is
                // this connection's end.
                let ended = loop {
                    match stream.message().await {
                        Ok(Some(update)) => {
                            tracing::info!(
                                agent_id = update.agent_id,
                                bytes = update.config_yaml.len(),
                                "agent configuration changed"
                            );
                            watches.config(update);
                        }
                        Ok(None) => break "kas ended the stream".to_owned(),
                        Err(e) => break e.message().to_owned(),
                    }
                };
                drop(tunnels);
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
                    tracing::warn!(error = %e.message(), "cannot reach kas; retrying");
                }
            }
        }
        // Without a limit on attempts the sequence never ends.
        let wait = delays.next().unwrap_or(Duration::from_secs(20));
        tokio::time::sleep(wait).await;
    }
}

async fn connect(
    channel: &Channel,
    token: &str,
    config: &AgentkConfig,
) -> Result<
    (
        podgate_agent::proto::AgentConfiguration,
        tonic::Streaming<podgate_agent::proto::AgentConfiguration>,
    ),
    tonic::Status,
> {
    let mut request = tonic::Request::new(GetConfigurationRequest {
        agent_meta: Some(AgentMeta {
            version: env!("CARGO_PKG_VERSION").into(),
            commit: String::new(),
            pod_namespace: config.pod_namespace.clone(),
            pod_name: config.pod_name.clone(),
        }),
    });
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}")
            .parse()
            .map_err(|_| tonic::Status::internal("token is not a header value"))?,
    );
    let mut stream = AgentConfigurationServiceClient::new(channel.clone())
        .get_configuration(request)
        .await?
        .into_inner();
    match stream.message().await? {
        Some(first) => Ok((first, stream)),
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

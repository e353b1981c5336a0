//! Registration: `gitlab.agent.agent_registrar.rpc.AgentRegistrar/Register{agent_meta,
//! pod_id}`, as GitLab's agentk calls it
//! (<https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/agent_registrar/agent/module.go>
//! and `factory.go` beside it): a random `pod_id` for the life of the process, a
//! call every 5 minutes, and after a failure retries with back-off from 10 s to
//! 5 minutes (jittered). kas keeps the registration for a while after each call and
//! drops it when the calls stop.
//!
//! podgate's kas holds a replica's tunnels only while the replica is registered
//! there, so agentk also registers at once on every (re)connection, before its
//! tunnels.

use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBuilder};
use podgate_agent::proto::gitlab::agent::agent_registrar::rpc::RegisterRequest;
use podgate_agent::proto::gitlab::agent::agent_registrar::rpc::agent_registrar_client::AgentRegistrarClient;
use podgate_agent::proto::gitlab::agent::entity::AgentMeta;
use tonic::transport::Channel;

/// Between two registrations (GitLab's `registerAttemptInterval`).
pub(super) const REGISTER_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// After a failed registration: 10 s doubling to 5 minutes, each wait between 1×
/// and 2× its base (GitLab's `registerInitBackoff`, `registerMaxBackoff`,
/// `registerBackoffFactor`, `registerJitter`).
const REGISTER_BACKOFF: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_secs(10))
    .with_max_delay(Duration::from_secs(5 * 60))
    .with_factor(2.0)
    .with_jitter()
    .without_max_times();

/// A random `pod_id`, never 0 (GitLab's `mathz.Int63`; podgate's kas refuses 0,
/// which its routing reads as "any replica").
pub(super) fn random_pod_id() -> i64 {
    use rand::Rng as _;
    rand::thread_rng().gen_range(1..i64::MAX)
}

/// What this replica registers as.
#[derive(Clone)]
pub(super) struct Registrar {
    pub(super) channel: Channel,
    pub(super) token: String,
    pub(super) meta: AgentMeta,
    pub(super) pod_id: i64,
}

impl Registrar {
    /// One `Register` call.
    pub(super) async fn register(&self) -> Result<(), tonic::Status> {
        let mut request = tonic::Request::new(RegisterRequest {
            agent_meta: Some(self.meta.clone()),
            pod_id: self.pod_id,
        });
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {}", self.token)
                .parse()
                .map_err(|_| tonic::Status::internal("token is not a header value"))?,
        );
        podgate_agent::gzip_client!(AgentRegistrarClient::new(self.channel.clone()))
            .register(request)
            .await
            .map(|_| ())
    }

    /// Register every [`REGISTER_INTERVAL`], retrying failures with back-off;
    /// forever (the caller aborts it).
    pub(super) async fn keep_registered(self) {
        loop {
            tokio::time::sleep(REGISTER_INTERVAL).await;
            let mut delays = REGISTER_BACKOFF.build();
            while let Err(e) = self.register().await {
                tracing::error!(error = %e.message(), "Failed to register agent pod. Please make sure the agent version matches the server version");
                let wait = delays.next().unwrap_or(Duration::from_secs(5 * 60));
                tokio::time::sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_registrations_back_off_from_10_s_to_5_minutes_with_jitter() {
        for _ in 0..20 {
            let mut base = Duration::from_secs(10);
            for wait in REGISTER_BACKOFF.build().take(8) {
                assert!(
                    wait >= base && wait <= base * 2,
                    "{wait:?} for base {base:?}"
                );
                base = (base * 2).min(Duration::from_secs(5 * 60));
            }
        }
        assert_ne!(random_pod_id(), 0);
    }
}

//! Registration: `gitlab.agent.agent_registrar.rpc.AgentRegistrar/Register{agent_meta,
//! pod_id}`, as GitLab's agentk calls it
//! (<https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/agent_registrar/agent/module.go>
//! and `factory.go` beside it): a random `pod_id` for the life of the process, a
//! call every 5 minutes, and after a failure retries with back-off from 10 s to
//! 5 minutes (jittered). kas keeps the registration for a while after each call and
//! drops it when the calls stop. Each periodic call first asks the cluster's
//! version (the API server's `/version`, within client-go discovery's 32 s) and
//! sends it in `agent_meta.kubernetes_version`, empty when it was never read, as
//! GitLab's does.
//!
//! podgate's kas holds a replica's tunnels only while the replica is registered
//! there, so agentk also registers at once on every (re)connection, before its
//! tunnels, with the version it read last (a cluster slow to answer delays no
//! connection); the periodic calls start right after, with a fresh version.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBuilder};
use futures_util::future::BoxFuture;
use podgate_agent::proto::gitlab::agent::agent_registrar::rpc::RegisterRequest;
use podgate_agent::proto::gitlab::agent::agent_registrar::rpc::agent_registrar_client::AgentRegistrarClient;
use podgate_agent::proto::gitlab::agent::entity::{AgentMeta, KubernetesVersion};
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

/// Reads the cluster's version ([`super::Handler::kubernetes_version`]).
pub(super) type KubernetesVersionSource =
    Arc<dyn Fn() -> BoxFuture<'static, Option<KubernetesVersion>> + Send + Sync>;

/// How long a read of the cluster's version may take (client-go's discovery
/// client's `defaultTimeout`).
const VERSION_TIMEOUT: Duration = Duration::from_secs(32);

/// What this replica registers as.
#[derive(Clone)]
pub(super) struct Registrar {
    pub(super) channel: Channel,
    pub(super) token: String,
    /// The replica's meta; each call sends it with the version read last.
    pub(super) meta: AgentMeta,
    pub(super) pod_id: i64,
    /// Reads the cluster's version.
    pub(super) kubernetes_version: KubernetesVersionSource,
    /// The version read last (shared by the clones).
    pub(super) last_version: Arc<Mutex<Option<KubernetesVersion>>>,
}

impl Registrar {
    /// A registrar for `meta` and `pod_id` that reads the version with `source`.
    pub(super) fn new(
        channel: Channel,
        token: String,
        meta: AgentMeta,
        pod_id: i64,
        source: KubernetesVersionSource,
    ) -> Registrar {
        Registrar {
            channel,
            token,
            meta,
            pod_id,
            kubernetes_version: source,
            last_version: Arc::default(),
        }
    }

    /// Read the cluster's version (within [`VERSION_TIMEOUT`]); kept for the next
    /// calls when it could be read.
    async fn read_version(&self) {
        match tokio::time::timeout(VERSION_TIMEOUT, (self.kubernetes_version)()).await {
            Ok(Some(v)) => {
                *self.last_version.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
            }
            Ok(None) => {}
            Err(_) => tracing::warn!("Failed to fetch Kubernetes version: timed out"),
        }
    }

    /// One `Register` call, with the version read last.
    pub(super) async fn register(&self) -> Result<(), tonic::Status> {
        let mut meta = self.meta.clone();
        meta.kubernetes_version = Some(
            self.last_version
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .unwrap_or_default(),
        );
        let mut request = tonic::Request::new(RegisterRequest {
            agent_meta: Some(meta),
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

    /// Read the version and register, now and every [`REGISTER_INTERVAL`],
    /// retrying failures with back-off; forever (the caller aborts it).
    pub(super) async fn keep_registered(self) {
        loop {
            self.read_version().await;
            let mut delays = REGISTER_BACKOFF.build();
            while let Err(e) = self.register().await {
                tracing::error!(error = %e.message(), "Failed to register agent pod. Please make sure the agent version matches the server version");
                let wait = delays.next().unwrap_or(Duration::from_secs(5 * 60));
                tokio::time::sleep(wait).await;
            }
            tokio::time::sleep(REGISTER_INTERVAL).await;
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

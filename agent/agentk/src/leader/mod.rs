//! Leader election among the agentk replicas of one agent, with a
//! `coordination.k8s.io/v1` Lease: only the holder runs the leader modules
//! (`remote_development`).
//!
//! This is client-go's `tools/leaderelection/leaderelection.go` with the Lease lock
//! of `tools/leaderelection/resourcelock/leaselock.go`, as GitLab's agentk runs it
//! (`cmd/agentk/agentkapp/leader_runner.go`, `leaseLeaderElector`; `app.go` names
//! the Lease `agent-<agent id>-lock` in the Pod's namespace, the identity is the
//! Pod's name; lease 15 s, renew deadline 10 s, retry 2 s; `ReleaseOnCancel`):
//!
//! - *try to acquire or renew*: a replica that believes it leads first replaces the
//!   Lease it last saw (its `resourceVersion` is the optimistic lock); otherwise,
//!   or when that fails, it reads the Lease (creating it when absent). A Lease held
//!   by another identity is left alone while it is valid: the holder's
//!   `leaseDurationSeconds` has not passed, on *this* replica's clock, since the
//!   record last changed (timestamps in the record are never compared with the local
//!   clock, so clock skew between replicas does not matter). An empty
//!   `holderIdentity` or an expired Lease is taken over (`leaseTransitions` + 1);
//! - *acquire*: try every retry period (jittered by up to 1.2 × the period, as
//!   `wait.JitterUntil`) until it succeeds;
//! - *renew*: every retry period; when no renewal succeeded within the renew
//!   deadline the replica stops leading and goes back to acquiring. A renewal that
//!   reads the Lease held by someone else stops leading at once (client-go would keep
//!   retrying until the deadline; leading on is never right then);
//! - *release* ([`Leader::release`], client-go's `ReleaseOnCancel`): the holder
//!   replaces the Lease with an empty `holderIdentity`, `leaseDurationSeconds: 1`
//!   and fresh times, so another replica takes it on its next try, without waiting
//!   for the lease duration. Dropping a [`Leader`] only stops renewing: the others
//!   take over once the lease duration has passed.
//!
//! Transitions are logged (`became leader`, `stopped leading`, `new leader
//! observed`) and published on [`Leader::is_leader`]. As in client-go, nothing
//! guarantees that only one replica acts as leader at every instant (no fencing):
//! a leader that cannot reach the API keeps believing it leads until its renew
//! deadline, shorter than the lease duration the others wait.
//!
//! Layout: the configuration and the [`Leader`] handle here; the election loop
//! (client-go's `LeaderElector` over the Lease) in `elector.rs`; unit tests in
//! `leader/tests.rs`.

mod elector;
#[cfg(test)]
mod tests;

use std::time::Duration;

use thiserror::Error;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use self::elector::Elector;

/// client-go's (and agentk's) lease duration.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// client-go's (and agentk's) renew deadline.
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// client-go's (and agentk's) retry period.
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);
/// client-go's `JitterFactor`: waits while acquiring are up to this many retry
/// periods longer.
pub const JITTER_FACTOR: f64 = 1.2;

/// Leader election errors.
#[derive(Debug, Error)]
pub enum Error {
    /// The configuration is unusable; every problem names its field.
    #[error("invalid leader election configuration: {}", .0.join("; "))]
    Invalid(Vec<String>),
}

/// Where the Lease is, who this replica is, and the timings.
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    /// The Lease's namespace (agentk: its Pod's namespace).
    pub namespace: String,
    /// The Lease's name (agentk: `agent-<agent id>-lock`, [`lease_name`]).
    pub lease_name: String,
    /// This replica's identity in `holderIdentity` (agentk: its Pod's name).
    pub identity: String,
    /// How long others wait, after the Lease last changed, before taking it over.
    /// Written to `leaseDurationSeconds` rounded up to whole seconds.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops leading.
    pub renew_deadline: Duration,
    /// Time between tries.
    pub retry_period: Duration,
}

/// The Lease agentk elects its leader with: `agent-<agent id>-lock` (GitLab's
/// `cmd/agentk/agentkapp/app.go`: replicas of one agent compete, agents do not).
pub fn lease_name(agent_id: i64) -> String {
    format!("agent-{agent_id}-lock")
}

impl LeaderConfig {
    /// agentk's election for `agent_id`: Lease [`lease_name`] in `namespace`, this
    /// replica named `identity`, client-go's default timings.
    pub fn for_agent(
        namespace: impl Into<String>,
        agent_id: i64,
        identity: impl Into<String>,
    ) -> LeaderConfig {
        LeaderConfig {
            namespace: namespace.into(),
            lease_name: lease_name(agent_id),
            identity: identity.into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
        }
    }

    /// Every problem at once, each naming its field (client-go's
    /// `NewLeaderElector` checks, plus non-empty names).
    pub fn validate(&self) -> Result<(), Error> {
        let mut bad = Vec::new();
        for (field, value) in [
            ("namespace", &self.namespace),
            ("lease_name", &self.lease_name),
            ("identity", &self.identity),
        ] {
            if value.trim().is_empty() {
                bad.push(format!("{field}: empty"));
            }
        }
        if self.retry_period.is_zero() {
            bad.push("retry_period: must be more than 0".into());
        }
        if self.renew_deadline.is_zero() {
            bad.push("renew_deadline: must be more than 0".into());
        }
        if self.lease_duration <= self.renew_deadline {
            bad.push(format!(
                "lease_duration = {:?}: must be more than renew_deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.renew_deadline <= self.retry_period.mul_f64(JITTER_FACTOR) {
            bad.push(format!(
                "renew_deadline = {:?}: must be more than retry_period × {JITTER_FACTOR} ({:?})",
                self.renew_deadline,
                self.retry_period.mul_f64(JITTER_FACTOR)
            ));
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid(bad))
        }
    }

    /// `namespace/name`, as client-go describes a lock.
    fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.lease_name)
    }

    /// `leaseDurationSeconds` written by this replica (at least 1).
    fn lease_seconds(&self) -> i32 {
        let secs = self.lease_duration.as_secs_f64().ceil();
        secs.clamp(1.0, f64::from(i32::MAX)) as i32
    }
}

/// A running election. [`Leader::release`] gives the Lease up; dropping stops
/// renewing it (and this replica stops leading at once).
pub struct Leader {
    is_leader: watch::Receiver<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Leader {
    /// Start electing in the background. An invalid `config` (see
    /// [`LeaderConfig::validate`]) is logged and the replica never leads.
    pub fn start(client: kube::Client, config: LeaderConfig) -> Leader {
        let (tx, rx) = watch::channel(false);
        let (stop_tx, stop_rx) = oneshot::channel();
        let task = match config.validate() {
            Ok(()) => {
                let elector = Elector::new(client, config);
                tokio::spawn(elector.run(tx, stop_rx))
            }
            Err(e) => {
                tracing::error!(error = %e, "leader election not started");
                tokio::spawn(async move {
                    let _keep = tx;
                    let _ = stop_rx.await;
                })
            }
        };
        Leader {
            is_leader: rx,
            stop: Some(stop_tx),
            task: Some(task),
        }
    }

    /// Whether this replica leads, now and as it changes.
    pub fn is_leader(&self) -> watch::Receiver<bool> {
        self.is_leader.clone()
    }

    /// Give the Lease up (holderIdentity cleared, as client-go's ReleaseOnCancel) and stop.
    /// [`Leader::is_leader`] turns `false` before the Lease is written.
    pub async fn release(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        // Dropping the stop sender ends the loop without releasing: the Lease
        // expires and another replica takes it after the lease duration.
        self.stop.take();
    }
}

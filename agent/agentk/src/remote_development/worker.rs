//! When cycles run: [`Worker`] schedules full and partial
//! cycles, [`supervise`] runs a worker only while this replica leads and the agent
//! configuration enables the module, and restarts it when that configuration
//! changes.
//!
//! As GitLab agentk's `worker.go` and `module.go`
//! (`internal/module/remote_development/agent/`, gitlab-agent v16), with the 2024
//! changes of gitlab-agent MR 1495 (intervals from GitLab's `settings`):
//!
//! - a full cycle runs at once, then every full interval; each one throws the old
//!   reconciler away (its Deployment watch and trackers) and builds a new one;
//! - a partial cycle runs every partial interval;
//! - both timers are re-armed after a full cycle ends, the partial one after a
//!   partial cycle ends (a slow cycle never causes back-to-back cycles);
//! - the intervals come from the last successful answer's `settings` (GitLab's
//!   defaults 3600 s / 10 s when the object, a field, or a positive value is
//!   missing), take effect from the next cycle, and are kept when a cycle fails;
//! - a failed cycle is logged and counted; the loop goes on. A failed full cycle
//!   leaves the reconciler un-synced, so the next tick sends `full` again.
//!
//! One difference: agentk's worker stops when building a reconciler fails (its
//! informer never synced); here the next tick tries again.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use podgate_agent::proto::gitlab::agent::agentcfg::{AgentConfiguration, RemoteDevelopmentCf};
use tokio::sync::watch;
use tokio::time::Instant;

use super::body::Settings;
use super::ports::{Cluster, Rails};
use super::reconciler::{Applies, DeploymentSource, Reconciler};
use crate::metrics::WorkspacesMetrics;

/// GitLab's default full interval (`default_settings.rb`:
/// `full_reconciliation_interval_seconds` 3600).
pub const DEFAULT_FULL_INTERVAL: Duration = Duration::from_secs(3600);
/// GitLab's default partial interval (`partial_reconciliation_interval_seconds` 10).
pub const DEFAULT_PARTIAL_INTERVAL: Duration = Duration::from_secs(10);
/// How long a new reconciler's Deployment watch may take to list before the cycle
/// counts as failed (the next tick tries again).
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(60);

/// The intervals between cycles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Intervals {
    /// Between full cycles.
    pub full: Duration,
    /// Between partial cycles.
    pub partial: Duration,
}

impl Default for Intervals {
    fn default() -> Self {
        Intervals {
            full: DEFAULT_FULL_INTERVAL,
            partial: DEFAULT_PARTIAL_INTERVAL,
        }
    }
}

impl Intervals {
    /// The intervals an answer's `settings` ask for, each missing (or zero) one at
    /// its default.
    pub fn from_settings(settings: Option<&Settings>) -> Intervals {
        let pick = |v: Option<u64>, default| match v {
            Some(s) if s > 0 => Duration::from_secs(s),
            _ => default,
        };
        let s = settings.copied().unwrap_or_default();
        Intervals {
            full: pick(
                s.full_reconciliation_interval_seconds,
                DEFAULT_FULL_INTERVAL,
            ),
            partial: pick(
                s.partial_reconciliation_interval_seconds,
                DEFAULT_PARTIAL_INTERVAL,
            ),
        }
    }
}

/// Full and partial cycles for one agent. Runs until dropped; dropping it stops the
/// Deployment watch and aborts applies still running.
pub struct Worker<R, C, D> {
    rails: Arc<R>,
    cluster: Arc<C>,
    source: D,
    metrics: WorkspacesMetrics,
    sync_timeout: Duration,
}

impl<R: Rails, C: Cluster, D: DeploymentSource> Worker<R, C, D> {
    /// A worker talking to `rails`, changing `cluster`, watching Deployments from
    /// `source`.
    pub fn new(rails: Arc<R>, cluster: Arc<C>, source: D, metrics: WorkspacesMetrics) -> Self {
        Worker {
            rails,
            cluster,
            source,
            metrics,
            sync_timeout: SYNC_TIMEOUT,
        }
    }

    /// Cycle forever (`worker.go` `Run`).
    pub async fn run(self) {
        let applies = Applies::default();
        let mut intervals = Intervals::default();
        let mut reconciler: Option<Reconciler<R, C>> = None;
        let start = Instant::now();
        let mut last_full = start;
        let mut next_full = start;
        let mut next_partial = start + intervals.partial;
        loop {
            let full = next_full <= next_partial;
            tokio::time::sleep_until(next_full.min(next_partial)).await;
            if full {
                tracing::info!("workspaces: starting a full reconciliation");
                // The old reconciler (its watch, its trackers) goes first.
                reconciler = None;
            } else {
                tracing::debug!("workspaces: starting a partial reconciliation");
            }
            if reconciler.is_none() {
                reconciler = self.new_reconciler(&applies).await;
            }
            if let Some(r) = reconciler.as_mut() {
                match r.run().await {
                    Ok(report) => {
                        let new = Intervals::from_settings(report.settings.as_ref());
                        if new != intervals {
                            tracing::info!(
                                full_seconds = new.full.as_secs(),
                                partial_seconds = new.partial.as_secs(),
                                "workspaces: reconciliation intervals from GitLab"
                            );
                            intervals = new;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(
                            error = %e,
                            "workspaces: {} reconciliation failed",
                            if full { "full" } else { "partial" }
                        );
                    }
                }
            }
            // Re-armed after the work, so a slow cycle is not followed at once by
            // another.
            let now = Instant::now();
            if full {
                last_full = now;
            }
            next_full = last_full + intervals.full;
            next_partial = now + intervals.partial;
        }
    }

    async fn new_reconciler(&self, applies: &Applies) -> Option<Reconciler<R, C>> {
        let started = Instant::now();
        let failed = |e: String| {
            tracing::warn!(error = %e, "workspaces: cannot watch Deployments");
            self.metrics.cycle("full", false, started.elapsed());
            None
        };
        match tokio::time::timeout(self.sync_timeout, self.source.deployments()).await {
            Ok(Ok(deployments)) => Some(Reconciler::new(
                self.rails.clone(),
                self.cluster.clone(),
                deployments,
                applies.clone(),
                self.metrics.clone(),
            )),
            Ok(Err(e)) => failed(e.to_string()),
            Err(_) => failed(format!(
                "failed to sync informer during init: no list within {:?}",
                self.sync_timeout
            )),
        }
    }
}

/// The agent configuration's `remote_development` section
/// (`agentcfg.RemoteDevelopmentCF`). Only `enabled` matters to agentk; the other
/// fields are GitLab's (it reads them from the same file).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RemoteDevelopmentConfig {
    /// `enabled`: the module does nothing unless `true`.
    pub enabled: bool,
    /// The whole section as kas sent it: a change of any field restarts the
    /// worker, as agentk's `ProtoWorkerHolder` restarts on any change of the
    /// section.
    pub section: Option<RemoteDevelopmentCf>,
}

impl RemoteDevelopmentConfig {
    /// The section of an agent configuration; none: disabled.
    pub fn from_configuration(c: &AgentConfiguration) -> RemoteDevelopmentConfig {
        RemoteDevelopmentConfig {
            enabled: c.remote_development.as_ref().is_some_and(|r| r.enabled),
            section: c.remote_development.clone(),
        }
    }
}

/// What the module runs with: the agent and its configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct ModuleConfig {
    /// The agent (from kas's configuration stream).
    pub agent_id: i64,
    /// Its `remote_development` section.
    pub remote_development: RemoteDevelopmentConfig,
}

/// Run `start(config)` while `leader` is true and `config` enables the module; stop
/// it (drop its future) when leadership is lost or the module is disabled, and
/// start it afresh when the configuration changes (`module.go` with agentk's
/// leader runner: the module is a leader module). Returns when either sender is
/// gone.
pub async fn supervise<F, W>(
    mut config: watch::Receiver<Option<ModuleConfig>>,
    mut leader: watch::Receiver<bool>,
    metrics: WorkspacesMetrics,
    mut start: F,
) where
    F: FnMut(&ModuleConfig) -> W,
    W: Future<Output = ()>,
{
    loop {
        let wanted = config
            .borrow_and_update()
            .clone()
            .filter(|c| c.remote_development.enabled);
        let leading = *leader.borrow_and_update();
        metrics.leader.set(i64::from(leading));
        match wanted {
            Some(cfg) if leading => {
                tracing::info!(
                    agent_id = cfg.agent_id,
                    "workspaces: leading; module started"
                );
                let worker = start(&cfg);
                // A worker only ends by being dropped; if one returns, wait for a
                // change all the same.
                let worker = async move {
                    worker.await;
                    std::future::pending::<()>().await
                };
                let ended = tokio::select! {
                    () = worker => false,
                    r = other_config(&mut config, &cfg) => r.is_err(),
                    r = leader.wait_for(|l| !l) => r.is_err(),
                };
                tracing::info!("workspaces: module stopped");
                metrics.leader.set(0);
                if ended {
                    return;
                }
            }
            _ => {
                let closed = tokio::select! {
                    r = config.changed() => r.is_err(),
                    r = leader.changed() => r.is_err(),
                };
                if closed {
                    metrics.leader.set(0);
                    return;
                }
            }
        }
    }
}

/// Wait until the configuration differs from `current` (or the sender is gone).
async fn other_config(
    config: &mut watch::Receiver<Option<ModuleConfig>>,
    current: &ModuleConfig,
) -> Result<(), watch::error::RecvError> {
    config
        .wait_for(|c| c.as_ref() != Some(current))
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests;

//! The election loop: client-go's `LeaderElector` with the Lease lock (acquire,
//! renew, release), as the module docs describe it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

#[cfg(doc)]
use super::Leader;
use super::{JITTER_FACTOR, LeaderConfig};

/// How the loop should end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// [`Leader::release`]: give the Lease up.
    Release,
    /// The [`Leader`] was dropped: just stop.
    Abandon,
}

/// client-go's `LeaderElector` state.
pub(super) struct Elector {
    api: Api<Lease>,
    config: LeaderConfig,
    /// The last Lease read or written (its `resourceVersion` is the lock).
    lease: Option<Lease>,
    /// The record (spec) last observed, and when, on the local clock.
    observed: Option<LeaseSpec>,
    observed_at: Instant,
    /// The holder last logged (`OnNewLeader`).
    reported_leader: String,
}

impl Elector {
    pub(super) fn new(client: kube::Client, config: LeaderConfig) -> Elector {
        Elector {
            api: Api::namespaced(client, &config.namespace),
            config,
            lease: None,
            observed: None,
            observed_at: Instant::now(),
            reported_leader: String::new(),
        }
    }

    /// The whole election: acquire, renew until lost, again; until stopped.
    pub(super) async fn run(mut self, tx: watch::Sender<bool>, mut stop: oneshot::Receiver<()>) {
        let desc = self.config.describe();
        let identity = self.config.identity.clone();
        let how = 'outer: loop {
            tracing::info!(lease = %desc, %identity, "attempting to acquire leader lease");
            // Acquire.
            loop {
                let deadline = Instant::now() + self.config.renew_deadline;
                let got = tokio::select! {
                    r = &mut stop => break 'outer stopped(r),
                    got = self.try_once(deadline) => got,
                };
                self.maybe_report_transition();
                if got {
                    break;
                }
                let wait = jittered(self.config.retry_period);
                tokio::select! {
                    r = &mut stop => break 'outer stopped(r),
                    () = tokio::time::sleep(wait) => {}
                }
            }
            tracing::info!(lease = %desc, %identity, "successfully acquired lease: became leader");
            tx.send_replace(true);
            // Renew.
            loop {
                tokio::select! {
                    r = &mut stop => break 'outer stopped(r),
                    () = tokio::time::sleep(self.config.retry_period) => {}
                }
                let deadline = Instant::now() + self.config.renew_deadline;
                let renewed = loop {
                    let ok = tokio::select! {
                        r = &mut stop => break 'outer stopped(r),
                        ok = self.try_once(deadline) => ok,
                    };
                    self.maybe_report_transition();
                    if ok {
                        break true;
                    }
                    if !self.is_leader() {
                        // Someone else holds it now: leading on is never right.
                        break false;
                    }
                    let next = Instant::now() + self.config.retry_period;
                    if next >= deadline {
                        break false;
                    }
                    tokio::select! {
                        r = &mut stop => break 'outer stopped(r),
                        () = tokio::time::sleep_until(next) => {}
                    }
                };
                if !renewed {
                    break;
                }
                tracing::trace!(lease = %desc, "renewed lease");
            }
            tx.send_replace(false);
            tracing::warn!(lease = %desc, %identity, "failed to renew lease: stopped leading");
        };
        let was_leader = *tx.borrow();
        tx.send_replace(false);
        if was_leader {
            tracing::info!(lease = %desc, %identity, "stopped leading");
        }
        if how == Stop::Release {
            self.release().await;
        }
    }

    /// One try, bounded by `deadline`.
    async fn try_once(&mut self, deadline: Instant) -> bool {
        match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
            Ok(ok) => ok,
            Err(_) => {
                tracing::warn!(lease = %self.config.describe(), "leader election: the Kubernetes API did not answer in time");
                false
            }
        }
    }

    /// Whether the last observed record names this replica.
    fn is_leader(&self) -> bool {
        self.observed
            .as_ref()
            .and_then(|r| r.holder_identity.as_deref())
            .is_some_and(|h| h == self.config.identity)
    }

    /// Whether the observed record's `leaseDurationSeconds` has not passed since it
    /// was observed (client-go's `isLeaseValid`).
    fn lease_valid(&self, now: Instant) -> bool {
        let secs = self
            .observed
            .as_ref()
            .and_then(|r| r.lease_duration_seconds)
            .unwrap_or(0)
            .max(0);
        self.observed_at + Duration::from_secs(secs as u64) > now
    }

    fn set_observed(&mut self, spec: LeaseSpec) {
        self.observed = Some(spec);
        self.observed_at = Instant::now();
    }

    /// The record this replica writes when it holds the Lease.
    fn record(&self, now: &MicroTime) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(self.config.lease_seconds()),
            acquire_time: Some(now.clone()),
            renew_time: Some(now.clone()),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }
    }

    /// client-go's `tryAcquireOrRenew`.
    async fn try_acquire_or_renew(&mut self) -> bool {
        let now = MicroTime(Timestamp::now());
        let mut record = self.record(&now);
        let desc = self.config.describe();

        // 1. The leader's fast path: replace the Lease last seen.
        if self.is_leader() && self.lease_valid(Instant::now()) {
            let old = self.observed.clone().unwrap_or_default();
            record.acquire_time = old.acquire_time;
            record.lease_transitions = old.lease_transitions;
            match self.replace(record.clone()).await {
                Ok(()) => {
                    self.set_observed(record);
                    return true;
                }
                Err(e) => {
                    tracing::debug!(lease = %desc, error = %e, "failed to update lock optimistically, falling back to slow path");
                }
            }
        }

        // 2. Read the Lease, or create it.
        let current = match self.api.get_opt(&self.config.lease_name).await {
            Ok(Some(lease)) => lease,
            Ok(None) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.lease_name.clone()),
                        namespace: Some(self.config.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(record.clone()),
                };
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(created) => {
                        self.lease = Some(created);
                        self.set_observed(record);
                        true
                    }
                    Err(e) => {
                        tracing::info!(lease = %desc, error = %e, "error initially creating leader election record");
                        false
                    }
                };
            }
            Err(e) => {
                tracing::warn!(lease = %desc, error = %e, "error retrieving resource lock");
                return false;
            }
        };
        let old = current.spec.clone().unwrap_or_default();
        self.lease = Some(current);

        // 3. Record obtained: note a change, check holder and expiry.
        if self.observed.as_ref() != Some(&old) {
            self.set_observed(old.clone());
        }
        let holder = old.holder_identity.as_deref().unwrap_or("");
        if !holder.is_empty() && self.lease_valid(Instant::now()) && !self.is_leader() {
            tracing::trace!(lease = %desc, holder, "lock is held and has not yet expired");
            return false;
        }

        // 4. Take it over, or renew it.
        if self.is_leader() {
            record.acquire_time = old.acquire_time;
            record.lease_transitions = old.lease_transitions;
        } else {
            record.lease_transitions = Some(old.lease_transitions.unwrap_or(0) + 1);
        }
        match self.replace(record.clone()).await {
            Ok(()) => {
                self.set_observed(record);
                true
            }
            Err(e) => {
                tracing::info!(lease = %desc, error = %e, "failed to update lock");
                false
            }
        }
    }

    /// Replace the Lease last seen with `spec` (its `resourceVersion` makes this
    /// fail when someone else wrote in between).
    async fn replace(&mut self, spec: LeaseSpec) -> Result<(), kube::Error> {
        let Some(mut lease) = self.lease.clone() else {
            return Err(kube::Error::Api(
                kube::core::Status::failure("lease not initialized, call get or create first", "")
                    .boxed(),
            ));
        };
        lease.spec = Some(spec);
        lease.metadata.managed_fields = None;
        let written = self
            .api
            .replace(&self.config.lease_name, &PostParams::default(), &lease)
            .await?;
        self.lease = Some(written);
        Ok(())
    }

    /// client-go's `release`: when this replica holds the Lease, clear the holder
    /// so that another takes it at once.
    async fn release(&mut self) {
        let desc = self.config.describe();
        let deadline = Instant::now() + self.config.renew_deadline;
        let released = tokio::time::timeout_at(deadline, async {
            // Read it again for a fresh resourceVersion (client-go does too).
            match self.api.get_opt(&self.config.lease_name).await {
                Ok(Some(lease)) => {
                    let spec = lease.spec.clone().unwrap_or_default();
                    if self.observed.as_ref() != Some(&spec) {
                        self.set_observed(spec);
                    }
                    self.lease = Some(lease);
                }
                Ok(None) => return true,
                Err(e) => {
                    tracing::warn!(lease = %desc, error = %e, "error retrieving resource lock to release it");
                    return false;
                }
            }
            if !self.is_leader() {
                return true;
            }
            let now = MicroTime(Timestamp::now());
            let transitions = self.observed.as_ref().and_then(|r| r.lease_transitions);
            let record = LeaseSpec {
                holder_identity: Some(String::new()),
                lease_duration_seconds: Some(1),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(transitions.unwrap_or(0)),
                ..LeaseSpec::default()
            };
            match self.replace(record.clone()).await {
                Ok(()) => {
                    self.set_observed(record);
                    tracing::info!(lease = %desc, "released leader lease");
                    true
                }
                Err(e) => {
                    tracing::warn!(lease = %desc, error = %e, "failed to release lock");
                    false
                }
            }
        })
        .await;
        if released.is_err() {
            tracing::warn!(lease = %desc, "failed to release lock: the Kubernetes API did not answer in time");
        }
    }

    /// client-go's `maybeReportTransition` (`OnNewLeader`): log a new holder.
    fn maybe_report_transition(&mut self) {
        let holder = self
            .observed
            .as_ref()
            .and_then(|r| r.holder_identity.clone())
            .unwrap_or_default();
        if holder == self.reported_leader {
            return;
        }
        tracing::info!(lease = %self.config.describe(), leader = %holder, "new leader observed");
        self.reported_leader = holder;
    }
}

/// What ended the wait for a stop signal.
fn stopped(r: Result<(), oneshot::error::RecvError>) -> Stop {
    match r {
        Ok(()) => Stop::Release,
        Err(_) => Stop::Abandon,
    }
}

/// `wait.Jitter(period, JITTER_FACTOR)`: period plus up to factor × period.
/// Not backon's `ExponentialBuilder`: the period does not grow, and its jitter adds
/// at most 1× the delay where client-go's adds up to 1.2×.
pub(super) fn jittered(period: Duration) -> Duration {
    period + period.mul_f64(rand::random::<f64>() * JITTER_FACTOR)
}

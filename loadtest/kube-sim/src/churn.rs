//! Churn: a cluster that keeps changing at a steady rate, as controllers and
//! people change a real one. Each step is one of
//!
//! - a Deployment scaled one replica up or down: its `spec.replicas` and status,
//!   its ReplicaSet's, and a Pod created (with a controller owner reference) or
//!   deleted to match;
//! - a ConfigMap created: one a Pod already mounts but that did not exist yet, or a
//!   new one;
//! - a Pod created mounting (volume and `envFrom`) a ConfigMap of its namespace,
//!   sometimes one that does not exist yet (a later step creates it); the oldest
//!   such Pod is removed once there are many, as a finished Job's Pods are;
//! - an update: a label, an annotation, a spec field (ConfigMap data, a
//!   Deployment's `minReadySeconds`) or a Pod's status;
//! - a Pod deleted (replaced as its controller would: a ReplicaSet's or
//!   DaemonSet's under a new name, a StatefulSet's under the same one) or a
//!   ConfigMap deleted, leaving the references to it dangling (it may come back).
//!
//! Creations and deletions balance, so the object count stays about where it was.
//!
//! Steps are deterministic from the seed and the cluster at start: the same cluster
//! and seed give the same writes. Objects are picked from what churn knows (what
//! existed at start and what it created); one deleted by someone else is skipped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::Method;
use serde_json::Value;
use tokio::time::{Instant, MissedTickBehavior};

use super::generate::Rng;
use super::resources::{Kind, kind};
use super::store::Shared;

mod steps;

/// What a churn has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChurnStats {
    /// Steps taken.
    pub steps: u64,
    /// Objects created (each an `ADDED` event).
    pub created: u64,
    /// Objects updated (each a `MODIFIED` event).
    pub updated: u64,
    /// Objects deleted (each a `DELETED` event).
    pub deleted: u64,
}

#[derive(Debug, Default)]
struct Counters {
    steps: AtomicU64,
    created: AtomicU64,
    updated: AtomicU64,
    deleted: AtomicU64,
}

/// A running churn (from [`KubeSim::start_churn`](super::KubeSim::start_churn));
/// dropping it stops it.
#[derive(Debug)]
pub struct Churn {
    task: Option<tokio::task::JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl Churn {
    /// What it has done so far.
    pub fn stats(&self) -> ChurnStats {
        let c = &self.counters;
        ChurnStats {
            steps: c.steps.load(Ordering::Relaxed),
            created: c.created.load(Ordering::Relaxed),
            updated: c.updated.load(Ordering::Relaxed),
            deleted: c.deleted.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// The tick period and steps per tick for `per_s` steps a second: one step a tick up
/// to 1,000 a second, then several a millisecond.
fn cadence(per_s: f64) -> (Duration, f64) {
    if per_s <= 1000.0 {
        (Duration::from_secs_f64(1.0 / per_s), 1.0)
    } else {
        (Duration::from_millis(1), per_s / 1000.0)
    }
}

/// Start churning `shared` at `per_s` steps a second (none when not positive), the
/// first step one period from now. Must be called inside a Tokio runtime.
pub(super) fn start(shared: Arc<Shared>, per_s: f64, seed: u64) -> Churn {
    let counters = Arc::new(Counters::default());
    if !(per_s.is_finite() && per_s > 0.0) {
        return Churn {
            task: None,
            counters,
        };
    }
    let mut churner = Churner::new(shared, seed, counters.clone());
    let (period, per_tick) = cadence(per_s);
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(Instant::now() + period, period);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut budget = 0.0;
        loop {
            tick.tick().await;
            budget += per_tick;
            while budget >= 1.0 {
                churner.step();
                budget -= 1.0;
            }
        }
    });
    Churn {
        task: Some(task),
        counters,
    }
}

/// (namespace, name).
type Ref = (String, String);

/// The churn's state: what it may pick from.
pub(super) struct Churner {
    shared: Arc<Shared>,
    rng: Rng,
    counters: Arc<Counters>,
    pods: Kind,
    configmaps: Kind,
    deployments: Kind,
    replicasets: Kind,
    deployment_refs: Vec<Ref>,
    configmap_refs: Vec<Ref>,
    pod_refs: Vec<Ref>,
    /// Pods churn created itself, oldest first.
    task_pods: std::collections::VecDeque<Ref>,
    /// How many of those live at once before the oldest is removed: a twentieth
    /// of the Pods at start, so the cluster keeps its size.
    max_task_pods: usize,
    /// ConfigMaps some Pod refers to that do not exist (yet).
    pending: Vec<Ref>,
    nodes: Vec<String>,
}

fn served(resource: &str) -> Kind {
    kind(resource).expect("a served kind")
}

/// The (namespace, name) of every stored object of `k`.
fn refs(shared: &Shared, k: Kind) -> Vec<Ref> {
    shared
        .lock()
        .of(k)
        .map(|((_, ns, name), _)| (ns.clone(), name.clone()))
        .collect()
}

impl Churner {
    /// A churner of the cluster as it is now.
    fn new(shared: Arc<Shared>, seed: u64, counters: Arc<Counters>) -> Self {
        let mut c = Self::with_lists(shared, seed, counters);
        c.max_task_pods = c.pod_refs.len() / 20 + 5;
        c
    }

    fn with_lists(shared: Arc<Shared>, seed: u64, counters: Arc<Counters>) -> Self {
        let (pods, configmaps, deployments) = (
            served("pods"),
            served("configmaps"),
            served("deployments.apps"),
        );
        Churner {
            deployment_refs: refs(&shared, deployments),
            // Not the CA bundle kube-controller-manager publishes (and would put back).
            configmap_refs: refs(&shared, configmaps)
                .into_iter()
                .filter(|(_, name)| name != "kube-root-ca.crt")
                .collect(),
            pod_refs: refs(&shared, pods),
            max_task_pods: 0,
            nodes: refs(&shared, served("nodes"))
                .into_iter()
                .map(|(_, n)| n)
                .collect(),
            task_pods: Default::default(),
            pending: Vec::new(),
            rng: Rng(seed ^ 0x5eed_c4a2),
            counters,
            pods,
            configmaps,
            deployments,
            replicasets: served("replicasets.apps"),
            shared,
        }
    }

    /// Write through the store as a client would; the object on success.
    fn write(&self, method: Method, k: Kind, ns: &str, name: &str, body: Value) -> Option<Value> {
        let counter = match method {
            Method::POST => &self.counters.created,
            Method::DELETE => &self.counters.deleted,
            _ => &self.counters.updated,
        };
        let (code, v) = self.shared.apply(method, k, ns, Some(name), body);
        if code.is_success() {
            counter.fetch_add(1, Ordering::Relaxed);
            Some(v)
        } else {
            None
        }
    }

    fn get(&self, k: Kind, ns: &str, name: &str) -> Option<Value> {
        self.shared
            .lock()
            .objects
            .get(&super::resources::key(k, ns, name))
            .map(|s| s.value())
    }

    /// The objects of `k` in `ns` whose controller is the object with `uid`.
    fn owned_by(&self, k: Kind, ns: &str, uid: &Value) -> Vec<Value> {
        self.shared
            .lock()
            .in_namespace(k, ns)
            .map(|(_, o)| o.value())
            .filter(|o| {
                o["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| &r["uid"] == uid))
            })
            .collect()
    }

    /// An index below `len`, at random.
    fn index(&mut self, len: usize) -> usize {
        (self.rng.next() % len as u64) as usize
    }

    /// One of the references `which` selects, at random.
    fn pick(&mut self, which: fn(&Self) -> &Vec<Ref>) -> Option<Ref> {
        let len = which(self).len();
        if len == 0 {
            return None;
        }
        let i = self.index(len);
        Some(which(self)[i].clone())
    }
}

#[cfg(test)]
mod tests;

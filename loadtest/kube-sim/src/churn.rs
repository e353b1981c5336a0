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
use serde_json::{Value, json};
use tokio::time::{Instant, MissedTickBehavior};

use super::generate::{Rng, controller_ref};
use super::resources::{Kind, kind};
use super::store::Shared;

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

    /// Take one step.
    pub(super) fn step(&mut self) {
        self.counters.steps.fetch_add(1, Ordering::Relaxed);
        match self.rng.range(0, 99) {
            0..=19 => self.scale(),
            20..=29 => self.create_configmap(),
            30..=39 => self.create_pod(),
            40..=69 => self.update(),
            70..=79 => self.pod_status(),
            80..=89 => self.delete_pod(),
            _ => self.delete_configmap(),
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

    fn index(&mut self, len: usize) -> usize {
        (self.rng.next() % len as u64) as usize
    }

    /// One of the references `which` selects, at random.
    fn pick(&mut self, which: fn(&Self) -> &Vec<Ref>) -> Option<Ref> {
        let len = which(self).len();
        if len == 0 {
            return None;
        }
        let i = (self.rng.next() % len as u64) as usize;
        Some(which(self)[i].clone())
    }

    /// A Pod of `rs` (its template, a new name, a node), as the ReplicaSet
    /// controller and the scheduler make one.
    fn pod_of(&mut self, rs: &Value) -> (String, Value) {
        let name = format!(
            "{}-{}",
            rs["metadata"]["name"].as_str().unwrap_or("rs"),
            self.rng.suffix(5)
        );
        let mut spec = rs["spec"]["template"]["spec"].clone();
        if !self.nodes.is_empty() && spec.is_object() {
            let i = self.index(self.nodes.len());
            spec["nodeName"] = json!(self.nodes[i]);
        }
        let ip = format!(
            "10.{}.{}.{}",
            self.rng.range(0, 255),
            self.rng.range(0, 255),
            self.rng.range(1, 254)
        );
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": rs["spec"]["template"]["metadata"]["labels"], "ownerReferences": controller_ref(rs)},
            "spec": spec,
            "status": {"phase": "Running", "podIP": ip},
        });
        (name, pod)
    }

    fn create_pod_of(&mut self, rs: &Value, ns: &str) {
        let (name, pod) = self.pod_of(rs);
        if self
            .write(Method::POST, self.pods, ns, &name, pod)
            .is_some()
        {
            self.pod_refs.push((ns.to_owned(), name));
        }
    }

    fn delete_known_pod(&mut self, ns: &str, name: &str) -> Option<Value> {
        self.pod_refs.retain(|(n, p)| !(n == ns && p == name));
        self.write(Method::DELETE, self.pods, ns, name, Value::Null)
    }

    /// Scale a Deployment: it, its ReplicaSet, and Pods to match.
    fn scale(&mut self) {
        let Some((ns, name)) = self.pick(|c| &c.deployment_refs) else {
            return self.create_configmap();
        };
        let Some(deployment) = self.get(self.deployments, &ns, &name) else {
            self.deployment_refs
                .retain(|r| *r != (ns.clone(), name.clone()));
            return;
        };
        let uid = &deployment["metadata"]["uid"];
        let rs = match self.owned_by(self.replicasets, &ns, uid).pop() {
            Some(rs) => rs,
            None => {
                let hash = self.rng.suffix(10);
                let mut labels = deployment["spec"]["template"]["metadata"]["labels"].clone();
                if labels.is_object() {
                    labels["pod-template-hash"] = json!(hash);
                }
                let rs_name = format!("{name}-{hash}");
                let body = json!({
                    "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "metadata": {"name": rs_name, "labels": labels, "ownerReferences": controller_ref(&deployment)},
                    "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": deployment["spec"]["template"]["spec"]}},
                });
                match self.write(Method::POST, self.replicasets, &ns, &rs_name, body) {
                    Some(rs) => rs,
                    None => return,
                }
            }
        };
        let rs_name = rs["metadata"]["name"].as_str().unwrap_or("").to_owned();
        let pods = self.owned_by(self.pods, &ns, &rs["metadata"]["uid"]);
        let current = pods.len() as u64;
        // One replica up or down, as an autoscaler steps, within 0..=5: the
        // replica counts wander without drifting.
        let want = match current {
            0 => 1,
            5.. => 4,
            n if self.rng.range(0, 1) == 0 => n - 1,
            n => n + 1,
        };
        self.write(
            Method::PATCH,
            self.deployments,
            &ns,
            &name,
            json!({"spec": {"replicas": want}, "status": {"replicas": want, "readyReplicas": want, "availableReplicas": want, "updatedReplicas": want}}),
        );
        self.write(
            Method::PATCH,
            self.replicasets,
            &ns,
            &rs_name,
            json!({"spec": {"replicas": want}, "status": {"replicas": want, "readyReplicas": want, "availableReplicas": want}}),
        );
        if want > current {
            for _ in current..want {
                self.create_pod_of(&rs, &ns);
            }
        } else {
            for pod in &pods[want as usize..] {
                let name = pod["metadata"]["name"].as_str().unwrap_or("").to_owned();
                self.delete_known_pod(&ns, &name);
            }
        }
    }

    /// A ConfigMap: one that Pods wait for, or a new one.
    fn create_configmap(&mut self) {
        let (ns, name) = if !self.pending.is_empty() && self.rng.range(0, 3) > 0 {
            let i = self.index(self.pending.len());
            self.pending.swap_remove(i)
        } else {
            let ns = match self.pick(|c| &c.configmap_refs) {
                Some((ns, _)) => ns,
                None => "default".to_owned(),
            };
            (ns, format!("settings-{}", self.rng.suffix(5)))
        };
        let body = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "churn"}},
            "data": {"LOG_LEVEL": self.rng.pick(&["info", "debug", "warn"]), "FEATURE_X": self.rng.pick(&["on", "off"])},
        });
        if self
            .write(Method::POST, self.configmaps, &ns, &name, body)
            .is_some()
        {
            self.configmap_refs.push((ns, name));
        }
    }

    /// A Pod mounting a ConfigMap of its namespace, existing or (one time in four)
    /// not yet.
    fn create_pod(&mut self) {
        if self.task_pods.len() >= self.max_task_pods
            && let Some((ns, name)) = self.task_pods.pop_front()
        {
            self.delete_known_pod(&ns, &name);
        }
        let (ns, config) = match self.pick(|c| &c.configmap_refs) {
            Some((ns, cm)) if self.rng.range(0, 3) > 0 => (ns, cm),
            other => {
                let ns = other.map_or_else(|| "default".to_owned(), |(ns, _)| ns);
                let cm = format!("feature-flags-{}", self.rng.suffix(5));
                self.pending.push((ns.clone(), cm.clone()));
                (ns, cm)
            }
        };
        let name = format!("task-{}", self.rng.suffix(8));
        let mut spec = json!({
            "restartPolicy": "Never",
            "containers": [{
                "name": "task", "image": "busybox:1.36", "command": ["sh", "-c", "sleep 3600"],
                "envFrom": [{"configMapRef": {"name": config}}],
                "volumeMounts": [{"name": "config", "mountPath": "/etc/task"}],
            }],
            "volumes": [{"name": "config", "configMap": {"name": config}}],
        });
        if !self.nodes.is_empty() {
            let i = self.index(self.nodes.len());
            spec["nodeName"] = json!(self.nodes[i]);
        }
        let body = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "task"}},
            "spec": spec,
            "status": {"phase": "Pending"},
        });
        if self
            .write(Method::POST, self.pods, &ns, &name, body)
            .is_some()
        {
            self.pod_refs.push((ns.clone(), name.clone()));
            self.task_pods.push_back((ns, name));
        }
    }

    /// A label, an annotation or a spec field changed.
    fn update(&mut self) {
        let n = self.rng.range(1, 99);
        match self.rng.range(0, 3) {
            0 => {
                if let Some((ns, name)) = self.pick(|c| &c.pod_refs) {
                    let body = json!({"metadata": {"labels": {"version": format!("v{n}")}}});
                    self.write(Method::PATCH, self.pods, &ns, &name, body);
                }
            }
            1 => {
                if let Some((ns, name)) = self.pick(|c| &c.deployment_refs) {
                    let body = json!({"metadata": {"annotations": {"deployment.kubernetes.io/revision": n.to_string()}}});
                    self.write(Method::PATCH, self.deployments, &ns, &name, body);
                }
            }
            2 => {
                if let Some((ns, name)) = self.pick(|c| &c.deployment_refs) {
                    let body = json!({"spec": {"minReadySeconds": n % 30}});
                    self.write(Method::PATCH, self.deployments, &ns, &name, body);
                }
            }
            _ => {
                if let Some((ns, name)) = self.pick(|c| &c.configmap_refs) {
                    let level = self.rng.pick(&["info", "debug", "warn", "error"]);
                    let body = json!({"data": {"LOG_LEVEL": level}});
                    self.write(Method::PATCH, self.configmaps, &ns, &name, body);
                }
            }
        }
    }

    /// A Pod's status: its phase and its first container's restart count.
    fn pod_status(&mut self) {
        if let Some((ns, name)) = self.pick(|c| &c.pod_refs) {
            let phase = self
                .rng
                .pick(&["Running", "Running", "Running", "Pending", "Failed"]);
            let restarts = self.rng.range(0, 5);
            let container = self
                .get(self.pods, &ns, &name)
                .and_then(|p| {
                    p["spec"]["containers"][0]["name"]
                        .as_str()
                        .map(str::to_owned)
                })
                .unwrap_or_else(|| "main".to_owned());
            let body = json!({"status": {"phase": phase, "containerStatuses": [{"name": container, "ready": phase == "Running", "restartCount": restarts}]}});
            self.write(Method::PATCH, self.pods, &ns, &name, body);
        }
    }

    /// A Pod deleted, and replaced as its controller replaces it: a ReplicaSet's
    /// or a DaemonSet's under a new name, a StatefulSet's under the same name (a
    /// Job's, finished, and a bare Pod are not).
    fn delete_pod(&mut self) {
        let Some((ns, name)) = self.pick(|c| &c.pod_refs) else {
            return;
        };
        self.task_pods.retain(|r| *r != (ns.clone(), name.clone()));
        let Some(pod) = self.delete_known_pod(&ns, &name) else {
            return;
        };
        let owner = &pod["metadata"]["ownerReferences"][0];
        let owner_name = owner["name"].as_str().unwrap_or("");
        let alive = |k: Kind, me: &Self| {
            me.get(k, &ns, owner_name)
                .filter(|o| o["metadata"]["uid"] == owner["uid"])
        };
        match owner["kind"].as_str() {
            Some("ReplicaSet") => {
                if let Some(rs) = alive(self.replicasets, self) {
                    self.create_pod_of(&rs, &ns);
                }
            }
            Some(kind_name @ ("StatefulSet" | "DaemonSet")) => {
                let k = if kind_name == "StatefulSet" {
                    served("statefulsets.apps")
                } else {
                    served("daemonsets.apps")
                };
                if alive(k, self).is_none() {
                    return;
                }
                let new_name = if kind_name == "StatefulSet" {
                    name.clone()
                } else {
                    format!("{owner_name}-{}", self.rng.suffix(5))
                };
                let mut again = pod.clone();
                let meta = &mut again["metadata"];
                for field in ["uid", "resourceVersion", "creationTimestamp"] {
                    if let Some(m) = meta.as_object_mut() {
                        m.remove(field);
                    }
                }
                meta["name"] = json!(new_name);
                again["status"] = json!({"phase": "Running"});
                if self
                    .write(Method::POST, self.pods, &ns, &new_name, again)
                    .is_some()
                {
                    self.pod_refs.push((ns, new_name));
                }
            }
            _ => {}
        }
    }

    /// A ConfigMap deleted, whoever mounts it; half the time it is to come back.
    fn delete_configmap(&mut self) {
        if self.configmap_refs.is_empty() {
            return;
        }
        let i = self.index(self.configmap_refs.len());
        let (ns, name) = self.configmap_refs.swap_remove(i);
        if self
            .write(Method::DELETE, self.configmaps, &ns, &name, Value::Null)
            .is_some()
            && self.rng.range(0, 1) == 0
        {
            self.pending.push((ns, name));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::KubeSim;
    use crate::store::Event;

    /// Everything the broadcast (what watches are fed from) has carried so far.
    fn drain(rx: &mut tokio::sync::broadcast::Receiver<Event>) -> Vec<Event> {
        let mut out = Vec::new();
        while let Ok(e) = rx.try_recv() {
            out.push(e);
        }
        out
    }

    fn count(events: &[Event], kind: &str) -> u64 {
        events.iter().filter(|e| e.kind == kind).count() as u64
    }

    #[tokio::test(start_paused = true)]
    async fn churn_steps_at_its_rate_and_every_write_is_an_event() {
        let sim = KubeSim::new(100_000);
        sim.generate(800, 5);
        let mut rx = sim.shared.events.subscribe();
        let churn = sim.start_churn(20.0, 9);
        // 20 a second: a step every 50 ms, the first 50 ms from now.
        tokio::time::sleep(Duration::from_millis(50 * 40 + 25)).await;
        let stats = churn.stats();
        assert_eq!(stats.steps, 40);
        let events = drain(&mut rx);
        assert_eq!(
            (
                count(&events, "ADDED"),
                count(&events, "MODIFIED"),
                count(&events, "DELETED")
            ),
            (stats.created, stats.updated, stats.deleted)
        );
        assert!(
            stats.created > 0 && stats.updated > 0 && stats.deleted > 0,
            "{stats:?}"
        );
        assert_eq!(
            events.len() as u64,
            stats.created + stats.updated + stats.deleted
        );

        // Dropped, it stops.
        drop(churn);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(drain(&mut rx).is_empty());

        // Faster than a step a millisecond: several a tick, the same rate.
        let churn = sim.start_churn(5000.0, 1);
        tokio::time::sleep(Duration::from_millis(10) + Duration::from_micros(500)).await;
        assert_eq!(churn.stats().steps, 50);
        // Not positive: nothing.
        let idle = sim.start_churn(0.0, 1);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(idle.stats(), ChurnStats::default());
    }

    /// (verb, resource, namespace, name) of each event.
    fn trace(events: &[Event]) -> Vec<(String, String, String, String)> {
        events
            .iter()
            .map(|e| {
                (
                    e.kind.to_owned(),
                    e.resource.plural.to_owned(),
                    e.object.index_namespace().to_owned(),
                    e.object.index_name().to_owned(),
                )
            })
            .collect()
    }

    fn churned(seed: u64, steps: usize) -> (KubeSim, Vec<Event>) {
        let sim = KubeSim::new(100_000);
        sim.generate(1500, 2);
        let mut rx = sim.shared.events.subscribe();
        let mut churner = Churner::new(sim.shared.clone(), seed, Arc::default());
        let mut events = Vec::new();
        for _ in 0..steps {
            churner.step();
            events.extend(drain(&mut rx));
        }
        (sim, events)
    }

    #[test]
    fn churn_is_deterministic_and_keeps_references_realistic() {
        let (sim, events) = churned(11, 3000);
        let (_, again) = churned(11, 3000);
        assert_eq!(
            trace(&events),
            trace(&again),
            "the same seed, the same writes"
        );
        let (_, other) = churned(12, 3000);
        assert_ne!(trace(&events), trace(&other));

        // Replay the events over the objects that existed before.
        let fresh = KubeSim::new(10);
        fresh.generate(1500, 2);
        let mut exists: BTreeSet<(String, String, String)> = fresh
            .objects()
            .iter()
            .map(|o| (o.resource.to_owned(), o.namespace.clone(), o.name.clone()))
            .collect();
        let uids: std::collections::BTreeMap<String, (String, String, String)> = fresh
            .objects()
            .iter()
            .map(|o| {
                (
                    o.value()["metadata"]["uid"].as_str().unwrap().to_owned(),
                    (o.resource.to_owned(), o.namespace.clone(), o.name.clone()),
                )
            })
            .collect();
        let mut uids = uids;
        let mut waited_for = BTreeSet::new();
        let (mut pending_created, mut dangling, mut owned_pods, mut replicasets_scaled) =
            (0, 0, 0, 0);
        for e in &events {
            let o = e.object.value();
            let key = (
                e.resource.plural.to_owned(),
                e.object.index_namespace().to_owned(),
                e.object.index_name().to_owned(),
            );
            let ns = key.1.clone();
            match e.kind {
                "ADDED" => {
                    assert!(exists.insert(key.clone()), "{key:?} created twice");
                    uids.insert(
                        o["metadata"]["uid"].as_str().unwrap().to_owned(),
                        key.clone(),
                    );
                    if key.0 == "pods" {
                        // Owned Pods name an owner that exists, by uid.
                        if let Some(r) = o["metadata"]["ownerReferences"].get(0) {
                            let owner = uids.get(r["uid"].as_str().unwrap()).expect("owner known");
                            assert!(exists.contains(owner), "{key:?}: owner {owner:?} gone");
                            assert_eq!(r["controller"], true);
                            owned_pods += 1;
                        }
                        for v in o["spec"]["volumes"].as_array().into_iter().flatten() {
                            if let Some(cm) = v["configMap"]["name"].as_str() {
                                let want = ("configmaps".to_owned(), ns.clone(), cm.to_owned());
                                if !exists.contains(&want) {
                                    waited_for.insert(want);
                                }
                            }
                        }
                    }
                    if key.0 == "configmaps" && waited_for.contains(&key) {
                        pending_created += 1;
                    }
                }
                "MODIFIED" => {
                    assert!(exists.contains(&key), "{key:?} modified while absent");
                    if key.0 == "replicasets" {
                        replicasets_scaled += 1;
                    }
                }
                _ => {
                    assert!(exists.remove(&key), "{key:?} deleted while absent");
                    if key.0 == "configmaps"
                        && sim.objects().iter().any(|p| {
                            p.resource == "pods"
                                && p.namespace == ns
                                && p.json().contains(&format!("\"name\":\"{}\"", key.2))
                        })
                    {
                        dangling += 1;
                    }
                }
            }
        }
        // The replay and the store agree.
        let now: BTreeSet<(String, String, String)> = sim
            .objects()
            .iter()
            .map(|o| (o.resource.to_owned(), o.namespace.clone(), o.name.clone()))
            .collect();
        assert_eq!(now, exists);
        assert!(
            pending_created > 0,
            "a ConfigMap a Pod waited for was created"
        );
        assert!(!waited_for.is_empty());
        assert!(dangling > 0, "a ConfigMap still mounted was deleted");
        assert!(owned_pods > 50, "{owned_pods}");
        // The cluster neither grows nor shrinks much.
        let pods = |objects: &[(String, String, String)]| {
            objects.iter().filter(|(r, _, _)| r == "pods").count() as f64
        };
        let before: Vec<_> = fresh
            .objects()
            .iter()
            .map(|o| (o.resource.to_owned(), o.namespace.clone(), o.name.clone()))
            .collect();
        let after: Vec<_> = now.iter().cloned().collect();
        let (b, a) = (pods(&before), pods(&after));
        assert!(
            (a - b).abs() / b < 0.2,
            "pods: {b} before, {a} after 3000 steps"
        );
        let (b, a) = (before.len() as f64, after.len() as f64);
        assert!(
            (a - b).abs() / b < 0.1,
            "objects: {b} before, {a} after 3000 steps"
        );
        assert!(replicasets_scaled > 50, "{replicasets_scaled}");
    }
}

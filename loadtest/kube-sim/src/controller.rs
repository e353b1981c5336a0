//! The controllers ([`KubeSim::start_controllers`](super::KubeSim::start_controllers)):
//! kube-controller-manager's `deployment` controller here, the `replicaset`
//! controller and a kubelet in `pods`, the endpoints controller and Service
//! backends in `backends`.
//!
//! A Deployment gets a ReplicaSet `<name>-<pod-template-hash>` (a new one when its
//! template changes; older ones are scaled to 0), and its `status` moves as
//! `pkg/controller/deployment/sync.go` (`calculateStatus`), `progress.go`
//! (`syncRolloutStatus`) and `util/deployment_util.go` move it: `observedGeneration`,
//! `replicas`, `updatedReplicas`, `readyReplicas`, `availableReplicas`,
//! `unavailableReplicas` (each omitted when 0), and the conditions
//!
//! - `Progressing`: `NewReplicaSetCreated` (`Created new replica set "x"`),
//!   `FoundNewReplicaSet` (`Found new replica set "x"`), `ReplicaSetUpdated`
//!   (`ReplicaSet "x" is progressing.`), `NewReplicaSetAvailable` (`ReplicaSet "x"
//!   has successfully progressed.`, kept through later scaling), and
//!   `ProgressDeadlineExceeded` (status `False`, `ReplicaSet "x" has timed out
//!   progressing.`) once no progress was made for `progressDeadlineSeconds` (600
//!   by default) times the `progress_deadline_factor` setting;
//! - `Available`: `MinimumReplicasAvailable` (`Deployment has minimum
//!   availability.`) while at least `replicas - maxUnavailable` are available,
//!   else `MinimumReplicasUnavailable` (`Deployment does not have minimum
//!   availability.`).
//!
//! Each step is one controller's write, so the stages are visible to watchers as
//! in a real cluster: the new ReplicaSet, then its Pods, then (after the
//! `pod_start_delay` setting) running Pods, then an available Deployment. A
//! deleted Deployment's ReplicaSets and Pods are deleted with it (the garbage
//! collector's work).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use http::Method;
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::backends::Backends;
use super::generate::{Rng, controller_ref};
use super::resources::{Kind, kind};
use super::rollout::{condition, deployment_status, revision, set_condition, template_hash};
use super::store::{Shared, Write, now};

/// The field manager of controller writes.
pub(super) const MANAGER: &str = "kube-controller-manager";

/// Running controllers; dropping the handle stops them (and their Service backends).
#[derive(Debug)]
pub struct Controllers {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Controllers {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(super) fn deployments() -> Kind {
    kind("deployments.apps").expect("served")
}

pub(super) fn replicasets() -> Kind {
    kind("replicasets.apps").expect("served")
}

pub(super) fn pods() -> Kind {
    kind("pods").expect("served")
}

/// Start the controllers over `shared` (inside a Tokio runtime).
pub(super) fn start(shared: Arc<Shared>) -> Controllers {
    // Subscribe before the first sweep: nothing falls between the two.
    let events = shared.events.subscribe();
    let seed = shared.lock().rv;
    let c = Controller {
        shared,
        born: HashMap::new(),
        dying: HashMap::new(),
        timers: BTreeMap::new(),
        backends: Backends::default(),
        rng: Rng(seed),
    };
    Controllers {
        task: tokio::spawn(c.run(events)),
    }
}

/// (namespace, name).
pub(super) type Name = (String, String);

pub(super) struct Controller {
    pub(super) shared: Arc<Shared>,
    /// When each Pod was created (its start delay counts from there).
    pub(super) born: HashMap<Name, Instant>,
    /// When each Pod was asked to go.
    pub(super) dying: HashMap<Name, Instant>,
    /// When each Deployment wants another look.
    timers: BTreeMap<Name, Instant>,
    backends: Backends,
    pub(super) rng: Rng,
}

impl Controller {
    async fn run(mut self, mut events: broadcast::Receiver<super::store::Event>) {
        let mut dirty: BTreeSet<Name> = self.all(deployments());
        let mut dirty_ns: BTreeSet<String> = dirty.iter().map(|(ns, _)| ns.clone()).collect();
        dirty_ns.extend(
            self.all(kind("services").expect("served"))
                .into_iter()
                .map(|(ns, _)| ns),
        );
        loop {
            for (ns, name) in std::mem::take(&mut dirty) {
                match self.reconcile(&ns, &name) {
                    Some(at) => self.timers.insert((ns.clone(), name), at),
                    None => self.timers.remove(&(ns.clone(), name)),
                };
                dirty_ns.insert(ns);
            }
            for ns in std::mem::take(&mut dirty_ns) {
                self.backends.reconcile(&self.shared, &ns).await;
            }
            let wake = self.timers.values().min().copied();
            let timer = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let shared = self.shared.clone();
            let changed = shared.settings_changed.notified();
            tokio::select! {
                () = changed => {
                    dirty.extend(self.timers.keys().cloned());
                }
                e = events.recv() => match e {
                    Ok(e) => self.note(&e, &mut dirty, &mut dirty_ns),
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        dirty.extend(self.all(deployments()));
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                () = timer => {
                    let now = Instant::now();
                    dirty.extend(self.timers.iter().filter(|(_, at)| **at <= now).map(|(n, _)| n.clone()));
                }
            }
            loop {
                match events.try_recv() {
                    Ok(e) => self.note(&e, &mut dirty, &mut dirty_ns),
                    Err(broadcast::error::TryRecvError::Lagged(_)) => {
                        dirty.extend(self.all(deployments()));
                    }
                    Err(_) => break,
                }
            }
        }
    }

    /// Every object of `k`, by (namespace, name).
    fn all(&self, k: Kind) -> BTreeSet<Name> {
        self.shared
            .lock()
            .of(k)
            .map(|((_, ns, n), _)| (ns.clone(), n.clone()))
            .collect()
    }

    /// Which Deployment (and namespace) a change concerns.
    fn note(
        &self,
        e: &super::store::Event,
        dirty: &mut BTreeSet<Name>,
        dirty_ns: &mut BTreeSet<String>,
    ) {
        let ns = e.object.index_namespace().to_owned();
        let name = e.object.index_name().to_owned();
        let owner = |o: &Value, owner_kind: &str| -> Option<String> {
            o["metadata"]["ownerReferences"]
                .as_array()?
                .iter()
                .find(|r| r["kind"] == owner_kind && r["controller"] == true)
                .and_then(|r| r["name"].as_str().map(str::to_owned))
        };
        match (e.resource.group, e.resource.plural) {
            ("apps", "deployments") => {
                dirty.insert((ns, name));
            }
            ("apps", "replicasets") => {
                if let Some(d) = owner(&e.object.value(), "Deployment") {
                    dirty.insert((ns, d));
                }
            }
            ("", "pods") => {
                let Some(rs) = owner(&e.object.value(), "ReplicaSet") else {
                    return;
                };
                let rs = self.get(replicasets(), &ns, &rs);
                if let Some(d) = rs.and_then(|rs| owner(&rs, "Deployment")) {
                    dirty.insert((ns, d));
                }
            }
            ("", "services") => {
                dirty_ns.insert(ns);
            }
            _ => {}
        }
    }

    pub(super) fn get(&self, k: Kind, ns: &str, name: &str) -> Option<Value> {
        self.shared
            .lock()
            .objects
            .get(&super::resources::key(k, ns, name))
            .map(|s| s.value())
    }

    /// The objects of `k` in `ns` whose controller is the `owner_kind` named `owner`.
    pub(super) fn owned(&self, k: Kind, ns: &str, owner_kind: &str, owner: &str) -> Vec<Value> {
        let store = self.shared.lock();
        store
            .in_namespace(k, ns)
            .map(|(_, o)| o.value())
            .filter(|o| {
                o["metadata"]["ownerReferences"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|r| {
                        r["kind"] == owner_kind && r["name"] == owner && r["controller"] == true
                    })
            })
            .collect()
    }

    /// A write of the main resource by `manager` (`Null` for a create the
    /// namespace lifecycle refuses).
    pub(super) fn write(
        &self,
        manager: &str,
        method: Method,
        k: Kind,
        ns: &str,
        name: &str,
        body: Value,
    ) -> Value {
        // Controllers' creates meet the namespace lifecycle too: nothing new in a
        // namespace being terminated.
        let (code, v) = self.shared.write(Write {
            manager: Some(manager.to_owned()),
            lifecycle: true,
            ..Write::new(method.clone(), k, ns, Some(name), body)
        });
        if method == Method::POST && !code.is_success() {
            return Value::Null;
        }
        v
    }

    /// Replace `status` of an object with `new` by a merge patch (fields gone in
    /// `new` are nulled).
    pub(super) fn write_status(
        &self,
        manager: &str,
        k: Kind,
        ns: &str,
        name: &str,
        old: &Value,
        new: &Value,
    ) {
        if old == new {
            return;
        }
        let mut patch = new.clone();
        for (key, _) in old.as_object().into_iter().flatten() {
            if new.get(key).is_none() {
                patch[key] = Value::Null;
            }
        }
        self.shared.write(Write {
            manager: Some(manager.to_owned()),
            status: true,
            ..Write::new(Method::PATCH, k, ns, Some(name), json!({"status": patch}))
        });
    }

    /// One look at Deployment `ns/name`; when it wants another look by time.
    fn reconcile(&mut self, ns: &str, name: &str) -> Option<Instant> {
        let d = self
            .get(deployments(), ns, name)
            .filter(|d| d["metadata"]["deletionTimestamp"].is_null());
        let owned = self.owned(replicasets(), ns, "Deployment", name);
        let Some(d) = d else {
            // The garbage collector: what the Deployment owned goes with it.
            for rs in owned {
                let rs_name = rs["metadata"]["name"].as_str().unwrap_or("");
                for pod in self.owned(pods(), ns, "ReplicaSet", rs_name) {
                    let pod_name = pod["metadata"]["name"].as_str().unwrap_or("");
                    self.shared
                        .apply(Method::DELETE, pods(), ns, Some(pod_name), Value::Null);
                }
                self.shared.apply(
                    Method::DELETE,
                    replicasets(),
                    ns,
                    Some(rs_name),
                    Value::Null,
                );
            }
            return None;
        };
        let uid = d["metadata"]["uid"].clone();
        let owned: Vec<Value> = owned
            .into_iter()
            .filter(|rs| {
                rs["metadata"]["ownerReferences"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|r| r["uid"] == uid)
            })
            .collect();
        let replicas = d["spec"]["replicas"].as_i64().unwrap_or(1);
        let template = &d["spec"]["template"];
        let hash = template_hash(template);
        let rs_name = format!("{name}-{hash}");
        let old_status = d["status"].clone();
        let mut conditions: Vec<Value> = old_status["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let now_s = now();
        let max_old = owned
            .iter()
            .filter(|rs| rs["metadata"]["name"] != rs_name.as_str())
            .filter_map(revision)
            .max()
            .unwrap_or(0);
        let new_rs = match owned
            .iter()
            .find(|rs| rs["metadata"]["name"] == rs_name.as_str())
        {
            Some(rs) => {
                if condition(&conditions, "Progressing").is_none() {
                    set_condition(
                        &mut conditions,
                        "Progressing",
                        "True",
                        "FoundNewReplicaSet",
                        &format!("Found new replica set {rs_name:?}"),
                        &now_s,
                    );
                }
                rs.clone()
            }
            None => {
                let rs = self.new_replicaset(&d, &rs_name, &hash, replicas, max_old + 1);
                if rs.is_null() {
                    return None;
                }
                set_condition(
                    &mut conditions,
                    "Progressing",
                    "True",
                    "NewReplicaSetCreated",
                    &format!("Created new replica set {rs_name:?}"),
                    &now_s,
                );
                rs
            }
        };
        let new_revision = revision(&new_rs).unwrap_or(max_old + 1).to_string();
        if d["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
            != new_revision.as_str()
        {
            self.write(MANAGER, Method::PATCH, deployments(), ns, name, json!({"metadata": {"annotations": {"deployment.kubernetes.io/revision": new_revision}}}));
        }
        // Scale: the new ReplicaSet to the Deployment's replicas, old ones to 0.
        let mut all_rs = Vec::new();
        for rs in owned.iter().chain(
            (!owned
                .iter()
                .any(|r| r["metadata"]["name"] == rs_name.as_str()))
            .then_some(&new_rs),
        ) {
            let is_new = rs["metadata"]["name"] == rs_name.as_str();
            let want = if is_new { replicas } else { 0 };
            let mut rs = rs.clone();
            if rs["spec"]["replicas"].as_i64() != Some(want) {
                let n = rs["metadata"]["name"].as_str().unwrap_or("").to_owned();
                rs = self.write(
                    MANAGER,
                    Method::PATCH,
                    replicasets(),
                    ns,
                    &n,
                    json!({"spec": {"replicas": want}}),
                );
            }
            all_rs.push(rs);
        }
        let status = deployment_status(
            &d,
            &all_rs,
            &rs_name,
            conditions,
            &now_s,
            self.shared.settings().progress_deadline_factor,
        );
        self.write_status(MANAGER, deployments(), ns, name, &old_status, &status.value);
        let mut wake = status.deadline;
        for rs in &all_rs {
            if let Some(at) = self.sync_pods(rs) {
                wake = Some(wake.map_or(at, |w| w.min(at)));
            }
        }
        wake
    }

    /// Create the ReplicaSet of `d`'s current template.
    fn new_replicaset(
        &self,
        d: &Value,
        rs_name: &str,
        hash: &str,
        replicas: i64,
        revision: i64,
    ) -> Value {
        let ns = d["metadata"]["namespace"].as_str().unwrap_or("");
        let mut template = d["spec"]["template"].clone();
        template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
        let mut selector = d["spec"]["selector"].clone();
        selector["matchLabels"]["pod-template-hash"] = json!(hash);
        let rs = json!({
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": rs_name,
                "namespace": ns,
                "labels": template["metadata"]["labels"],
                "annotations": {
                    "deployment.kubernetes.io/desired-replicas": replicas.to_string(),
                    "deployment.kubernetes.io/max-replicas": replicas.to_string(),
                    "deployment.kubernetes.io/revision": revision.to_string(),
                },
                "ownerReferences": controller_ref(d),
            },
            "spec": {"replicas": replicas, "selector": selector, "template": template},
        });
        self.write(MANAGER, Method::POST, replicasets(), ns, rs_name, rs)
    }
}

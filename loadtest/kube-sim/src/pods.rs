//! The ReplicaSet controller (`pkg/controller/replicaset`) and a kubelet, as the
//! Deployment controller needs them: a ReplicaSet gets Pods
//! `<replicaset>-<5 characters>` up to its `spec.replicas`; a Pod runs (phase
//! `Running`, `Ready`) `pod_start_delay` after its creation, unless one of its
//! containers' images is tagged `crashloop` (`busybox:crashloop`): then it runs but
//! never becomes ready (its container `CrashLoopBackOff`, restarted); each started
//! container's log gets a first line saying so. Extra Pods are
//! marked for deletion (`deletionTimestamp`) and gone `pod_stop_delay` later.
//!
//! A ReplicaSet's status counts its Pods until they are gone: unlike
//! kube-controller-manager (which stops counting a Pod once it is terminating), a
//! Deployment scaled to 0 reports its last Pods available for `pod_stop_delay`, so
//! watchers see it stopping.

use http::Method;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::controller::{Controller, MANAGER, pods, replicasets};
use super::generate::controller_ref;
use super::store;

/// Whether a Pod's containers include one whose image's tag is `crashloop`.
fn crashloops(container: &Value) -> bool {
    let image = container["image"].as_str().unwrap_or("");
    image
        .rsplit_once(':')
        .is_some_and(|(_, tag)| tag == "crashloop")
}

/// Whether a Pod is `Ready`.
fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// The status a kubelet reports for a started Pod.
fn running_status(pod: &Value) -> Value {
    let now = store::now();
    let containers = pod["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let broken: Vec<&str> = containers
        .iter()
        .filter(|c| crashloops(c))
        .filter_map(|c| c["name"].as_str())
        .collect();
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
    let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
    let statuses: Vec<Value> = containers
        .iter()
        .map(|c| {
            let cname = c["name"].as_str().unwrap_or("");
            if crashloops(c) {
                json!({
                    "name": cname, "image": c["image"], "imageID": "", "ready": false,
                    "started": false, "restartCount": 1,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": format!("back-off 10s restarting failed container={cname} pod={name}_{ns}({uid})")}},
                    "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": now, "finishedAt": now}},
                })
            } else {
                json!({
                    "name": cname, "image": c["image"], "imageID": "", "ready": true,
                    "started": true, "restartCount": 0, "state": {"running": {"startedAt": now}},
                })
            }
        })
        .collect();
    let cond = |t: &str, ok: bool| {
        let mut c = json!({"type": t, "status": if ok { "True" } else { "False" }, "lastProbeTime": null, "lastTransitionTime": now});
        if !ok {
            c["reason"] = json!("ContainersNotReady");
            c["message"] = json!(format!(
                "containers with unready status: [{}]",
                broken.join(" ")
            ));
        }
        c
    };
    let ok = broken.is_empty();
    json!({
        "phase": "Running",
        "conditions": [cond("PodReadyToStartContainers", true), cond("Initialized", true), cond("Ready", ok), cond("ContainersReady", ok), cond("PodScheduled", true)],
        "hostIP": "127.0.0.1",
        "podIP": "127.0.0.1",
        "podIPs": [{"ip": "127.0.0.1"}],
        "startTime": now,
        "containerStatuses": statuses,
        "qosClass": "BestEffort",
    })
}

impl Controller {
    /// The first line of each started container's log (`kubectl logs`), as its
    /// process would write it: that it started, or, for a `crashloop` image, that
    /// it failed.
    fn log_start(&self, ns: &str, name: &str, pod: &Value) {
        for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
            let image = c["image"].as_str().unwrap_or("");
            let line = if crashloops(c) {
                format!("kube-sim: {image} exited with status 1")
            } else {
                format!("kube-sim: {image} started")
            };
            self.shared
                .containers
                .get(ns, name, c["name"].as_str().unwrap_or(""))
                .append(line.as_bytes());
        }
    }

    /// Bring ReplicaSet `rs`'s Pods to its replicas and move them on; its status
    /// follows. When it wants another look by time.
    pub(super) fn sync_pods(&mut self, rs: &Value) -> Option<Instant> {
        let ns = rs["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        let rs_name = rs["metadata"]["name"].as_str().unwrap_or("").to_owned();
        let desired = rs["spec"]["replicas"].as_i64().unwrap_or(1).max(0) as usize;
        let settings = self.shared.settings();
        let now = Instant::now();
        let uid = rs["metadata"]["uid"].clone();
        let pods_of = |c: &Controller| -> Vec<Value> {
            c.owned(pods(), &ns, "ReplicaSet", &rs_name)
                .into_iter()
                .filter(|p| p["metadata"]["ownerReferences"][0]["uid"] == uid)
                .collect()
        };
        let mut current = pods_of(self);
        let active: Vec<&Value> = current
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .collect();
        let mut changed = false;
        if active.len() < desired {
            for _ in active.len()..desired {
                let name = format!("{rs_name}-{}", self.rng.suffix(5));
                let template = &rs["spec"]["template"];
                let pod = json!({
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": name,
                        "namespace": ns,
                        "generateName": format!("{rs_name}-"),
                        "labels": template["metadata"]["labels"],
                        "ownerReferences": controller_ref(rs),
                    },
                    "spec": template["spec"],
                    "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": store::now()}], "qosClass": "BestEffort"},
                });
                if !self
                    .write(MANAGER, Method::POST, pods(), &ns, &name, pod)
                    .is_null()
                {
                    self.born.insert((ns.clone(), name), now);
                }
            }
            changed = true;
        } else if active.len() > desired {
            // Not-ready Pods go first, then the newest (`ActivePods` ordering, roughly).
            let mut extra: Vec<&Value> = active.clone();
            extra.sort_by_key(|p| {
                (
                    ready(p),
                    std::cmp::Reverse(p["metadata"]["uid"].as_str().unwrap_or("").to_owned()),
                )
            });
            for p in extra.into_iter().take(active.len() - desired) {
                let name = p["metadata"]["name"].as_str().unwrap_or("").to_owned();
                self.write("kubelet", Method::PATCH, pods(), &ns, &name, json!({"metadata": {"deletionTimestamp": store::now(), "deletionGracePeriodSeconds": 30}}));
                self.dying.insert((ns.clone(), name), now);
            }
            changed = true;
        }
        if changed {
            current = pods_of(self);
        }
        let mut wake: Option<Instant> = None;
        let mut at = |t: Instant| wake = Some(wake.map_or(t, |w: Instant| w.min(t)));
        for p in &current {
            let name = p["metadata"]["name"].as_str().unwrap_or("").to_owned();
            let key = (ns.clone(), name.clone());
            if !p["metadata"]["deletionTimestamp"].is_null() {
                let since = *self.dying.entry(key.clone()).or_insert(now);
                if now >= since + settings.pod_stop_delay {
                    self.shared
                        .apply(Method::DELETE, pods(), &ns, Some(&name), Value::Null);
                    self.dying.remove(&key);
                    self.born.remove(&key);
                    changed = true;
                } else {
                    at(since + settings.pod_stop_delay);
                }
            } else if p["status"]["phase"] == "Pending" {
                let born = *self.born.entry(key.clone()).or_insert(now);
                if now >= born + settings.pod_start_delay {
                    // The log first, so whoever sees the Pod running finds it.
                    self.log_start(&ns, &name, p);
                    let status = running_status(p);
                    self.write_status("kubelet", pods(), &ns, &name, &p["status"], &status);
                    changed = true;
                } else {
                    at(born + settings.pod_start_delay);
                }
            }
        }
        if changed {
            current = pods_of(self);
        }
        let n = current.len() as i64;
        let ready_n = current.iter().filter(|p| ready(p)).count() as i64;
        let mut status =
            json!({"observedGeneration": rs["metadata"]["generation"].as_i64().unwrap_or(1)});
        for (f, v) in [
            ("replicas", n),
            ("fullyLabeledReplicas", n),
            ("readyReplicas", ready_n),
            ("availableReplicas", ready_n),
        ] {
            if v != 0 || f == "replicas" {
                status[f] = json!(v);
            }
        }
        let old = rs["status"].clone();
        let fresh = self
            .get(replicasets(), &ns, &rs_name)
            .map(|r| r["status"].clone())
            .unwrap_or(old);
        self.write_status(MANAGER, replicasets(), &ns, &rs_name, &fresh, &status);
        wake
    }
}

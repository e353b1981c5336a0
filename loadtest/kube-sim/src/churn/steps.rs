//! The steps of a churn: scaling, creations, updates and deletions, each written
//! through the store as a client would.

use std::sync::atomic::Ordering;

use http::Method;
use serde_json::{Value, json};

use super::super::generate::controller_ref;
use super::super::resources::Kind;
use super::{Churner, served};

impl Churner {
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

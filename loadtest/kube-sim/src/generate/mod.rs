//! Generated clusters that look real, deterministic from a seed number, of exactly
//! the number of objects asked for.
//!
//! - Cluster-wide: Nodes, a StorageClass, an IngressClass, a PriorityClass, a
//!   RuntimeClass, and a DaemonSet in `kube-system` with a Pod on each Node.
//! - Per namespace: an image-pull Secret, the `kube-root-ca.crt` ConfigMap, and
//!   apps. An app is a ConfigMap, a Secret, a ServiceAccount (with the image-pull
//!   Secret; the first app's also with a token Secret), a Service selecting the
//!   app's Pods, and a Deployment → ReplicaSet → Pods chain linked by controller
//!   owner references (`uid`, `controller: true`, `blockOwnerDeletion: true`, as
//!   kube-controller-manager sets them). Pods reach the ConfigMap and Secret through
//!   volumes, projected volumes, `env[].valueFrom`, `envFrom` (also of init and
//!   ephemeral containers), name the ServiceAccount, the image-pull Secret, a Node
//!   and sometimes a PriorityClass or RuntimeClass, and carry the
//!   `kube-api-access-*` projected volume admission adds.
//! - Then an Ingress (to the first app's Service, with a TLS Secret and the
//!   IngressClass), a StatefulSet with volume claim templates, its headless
//!   Service, bound PersistentVolumeClaims with their PersistentVolumes, and Pods, a
//!   CronJob → Job → Pod chain, and a Widget of the two-version group
//!   `example.podgate.dev`.
//! - Then Flux: a GitRepository (with its credentials Secret), Kustomizations
//!   `infra` and `apps` (`dependsOn`, `sourceRef`, `postBuild.substituteFrom`,
//!   `decryption.secretRef`, `serviceAccountName`, and a `status.inventory` listing
//!   objects of the namespace), a HelmRepository, a HelmRelease `redis` (chart
//!   `sourceRef`, `valuesFrom`, `status.history`) with its Helm storage Secrets
//!   (`sh.helm.release.v1.redis.v1`…`v3`, the release gzipped in `data.release`
//!   as Helm writes it) and the objects its manifest lists; every other namespace a
//!   second HelmRelease depending on the first, every fourth a Kustomization and a
//!   HelmRelease (its chart from an OCIRepository through `chartRef`) with
//!   `kubeConfig.secretRef`.
//!
//! Parts are added while the budget holds a whole one; what is left at the end is
//! filled with dashboard ConfigMaps, so the count is exact.
//!
//! Layout: the budget, the cluster-wide part and each namespace's header here; an
//! app in `apps`, the rest of a namespace in `extras`, Flux and Helm in `flux`.

use serde_json::{Value, json};

use super::KubeSim;
use super::resources::{EXAMPLE_GROUP, HELM_GROUP, KINDS, Kind, SOURCE_GROUP, kind};

/// A small deterministic generator (SplitMix64): the same seed, the same cluster.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    pub(super) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    pub(super) fn pick<'a>(&mut self, of: &[&'a str]) -> &'a str {
        of[(self.next() % of.len() as u64) as usize]
    }

    /// `n` characters of the alphabet Kubernetes uses in generated names.
    pub(super) fn suffix(&mut self, n: usize) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..n)
            .map(|_| ALPHABET[(self.next() % ALPHABET.len() as u64) as usize] as char)
            .collect()
    }
}

const TEAMS: &[&str] = &[
    "payments", "search", "checkout", "identity", "billing", "catalog", "shipping", "ads", "media",
    "ledger", "reports", "support",
];
const APPS: &[&str] = &[
    "api",
    "web",
    "worker",
    "gateway",
    "cache",
    "indexer",
    "scheduler",
    "notifier",
    "exporter",
    "frontend",
    "backend",
    "sync",
];
const IMAGES: &[&str] = &[
    "nginx:1.27",
    "redis:7.4",
    "postgres:16",
    "registry.example.com/app:2.3.1",
    "busybox:1.36",
    "golang:1.23",
];

/// Where generated objects go: counts them against the budget and links owners.
struct Sink<'a> {
    sim: &'a KubeSim,
    created: usize,
    limit: usize,
}

impl Sink<'_> {
    /// Store `object` of `resource`; the stored object (with its `uid`).
    fn put(&mut self, resource: &str, namespace: &str, object: Value) -> Value {
        let k: Kind = kind(resource).expect("a served kind");
        let stored = self.sim.put_kind(k, namespace, object);
        debug_assert_ne!(stored["kind"], "Status", "{stored}");
        self.created += 1;
        stored
    }

    /// Objects still to make.
    fn left(&self) -> usize {
        self.limit.saturating_sub(self.created)
    }
}

/// A controller owner reference to `owner`.
pub(super) fn controller_ref(owner: &Value) -> Value {
    json!([{
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": true,
        "blockOwnerDeletion": true,
    }])
}

/// The most objects each part makes (checked by the tests).
const NS_HEADER: usize = 3;
const APP_MAX: usize = 11;
const EXTRAS_MAX: usize = 17;
const FLUX_MAX: usize = 26;

/// Cluster-wide names pods and claims refer to.
const STORAGE_CLASS: &str = "standard";
const PRIORITY_CLASS: &str = "high-priority";
const RUNTIME_CLASS: &str = "gvisor";
const INGRESS_CLASS: &str = "nginx";

/// What the parts of one namespace share.
struct Namespace {
    name: String,
    /// Node names (empty when the cluster part did not fit).
    nodes: Vec<String>,
    /// Kustomization `apps`' inventory so far: (group, kind, name).
    inventory: Vec<(&'static str, &'static str, String)>,
    /// Kustomization `infra`'s.
    infra: Vec<(&'static str, &'static str, String)>,
    /// The first app's name.
    first_app: Option<String>,
}

impl Namespace {
    fn node(&self, rng: &mut Rng) -> Option<String> {
        (!self.nodes.is_empty())
            .then(|| self.nodes[(rng.next() % self.nodes.len() as u64) as usize].clone())
    }
}

/// Add exactly `objects` objects to `sim`, the same ones for the same `seed`;
/// returns how many were added.
pub(super) fn generate(sim: &KubeSim, objects: usize, seed: u64) -> usize {
    let mut rng = Rng(seed);
    let mut sink = Sink {
        sim,
        created: 0,
        limit: objects,
    };
    let n_nodes = (objects / 2500).clamp(2, 20);
    let nodes = if sink.left() >= 2 * n_nodes + 5 + NS_HEADER + APP_MAX {
        cluster(&mut sink, &mut rng, n_nodes)
    } else {
        Vec::new()
    };
    let mut n_ns = 0usize;
    let mut last_ns = None;
    while sink.left() >= NS_HEADER + APP_MAX {
        let mut ns = Namespace {
            name: format!("{}-{n_ns}", rng.pick(TEAMS)),
            nodes: nodes.clone(),
            inventory: Vec::new(),
            infra: Vec::new(),
            first_app: None,
        };
        header(&mut sink, &mut ns);
        let apps = rng.range(3, 12);
        for a in 0..apps {
            if sink.left() < APP_MAX {
                break;
            }
            let name = format!("{}-{a}", rng.pick(APPS));
            app(&mut sink, &mut rng, &mut ns, &name);
        }
        if sink.left() >= EXTRAS_MAX {
            extras(&mut sink, &mut rng, &mut ns);
        }
        if sink.left() >= FLUX_MAX {
            flux(&mut sink, &mut rng, &mut ns, n_ns);
        }
        last_ns = Some(ns.name);
        n_ns += 1;
    }
    // The rest: dashboards, as a Grafana sidecar collects them from ConfigMaps.
    let ns = last_ns.unwrap_or_else(|| "default".to_owned());
    for i in 0..sink.left() {
        sink.put(
            "configmaps",
            &ns,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("dashboard-{i}"), "labels": {"grafana_dashboard": "1"}}, "data": {"dashboard.json": "{\"panels\":[]}"}}),
        );
    }
    sink.created
}

/// Nodes and the cluster-wide classes; a DaemonSet with a Pod on each Node. Returns
/// the Node names.
fn cluster(sink: &mut Sink<'_>, rng: &mut Rng, n_nodes: usize) -> Vec<String> {
    let mut nodes = Vec::new();
    for i in 0..n_nodes {
        let name = format!("worker-{i}");
        sink.put(
            "nodes",
            "",
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "node-role.kubernetes.io/worker": ""}},
                "spec": {"podCIDR": format!("10.244.{i}.0/24")},
                "status": {
                    "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                    "addresses": [{"type": "InternalIP", "address": format!("10.0.0.{}", 10 + i)}],
                    "nodeInfo": {"kubeletVersion": "v1.32.0", "containerRuntimeVersion": "containerd://1.7.22", "osImage": "Ubuntu 24.04 LTS"},
                },
            }),
        );
        nodes.push(name);
    }
    sink.put(
        "storageclasses.storage.k8s.io",
        "",
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": STORAGE_CLASS, "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}, "provisioner": "rancher.io/local-path", "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer"}),
    );
    sink.put(
        "ingressclasses.networking.k8s.io",
        "",
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": INGRESS_CLASS, "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}}, "spec": {"controller": "k8s.io/ingress-nginx"}}),
    );
    sink.put(
        "priorityclasses.scheduling.k8s.io",
        "",
        json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": PRIORITY_CLASS}, "value": 1_000_000, "globalDefault": false, "preemptionPolicy": "PreemptLowerPriority", "description": "Customer-facing services."}),
    );
    sink.put(
        "runtimeclasses.node.k8s.io",
        "",
        json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": RUNTIME_CLASS}, "handler": "runsc"}),
    );
    let labels = json!({"app.kubernetes.io/name": "node-exporter"});
    let spec = json!({
        "hostNetwork": true,
        "priorityClassName": PRIORITY_CLASS,
        "containers": [{"name": "node-exporter", "image": "quay.io/prometheus/node-exporter:v1.8.2", "ports": [{"containerPort": 9100}]}],
    });
    let ds = sink.put(
        "daemonsets.apps",
        "kube-system",
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "node-exporter", "labels": labels},
            "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": spec}},
            "status": {"desiredNumberScheduled": n_nodes, "numberReady": n_nodes, "currentNumberScheduled": n_nodes},
        }),
    );
    for node in &nodes {
        let mut pod_spec = spec.clone();
        pod_spec["nodeName"] = json!(node);
        sink.put(
            "pods",
            "kube-system",
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("node-exporter-{}", rng.suffix(5)), "labels": labels, "ownerReferences": controller_ref(&ds)},
                "spec": pod_spec,
                "status": {"phase": "Running"},
            }),
        );
    }
    nodes
}

/// The namespace, its image-pull Secret and `kube-root-ca.crt`.
fn header(sink: &mut Sink<'_>, ns: &mut Namespace) {
    let name = ns.name.clone();
    sink.put(
        "namespaces",
        "",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}}}),
    );
    sink.put(
        "secrets",
        &name,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "regcred"}, "type": "kubernetes.io/dockerconfigjson", "data": {".dockerconfigjson": "eyJhdXRocyI6e319"}}),
    );
    sink.put(
        "configmaps",
        &name,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt", "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}}, "data": {"ca.crt": "-----BEGIN CERTIFICATE-----\nMIIC5zCCAc+gAwIBAgIBADANBgkqhkiG9w0BAQsFADAVMRMwEQYDVQQDEwprdWJl\n-----END CERTIFICATE-----\n"}}),
    );
    ns.infra.push(("", "Namespace", name));
    ns.infra.push(("", "Secret", "regcred".to_owned()));
}

/// The volume admission adds to every Pod: its ServiceAccount token, the cluster
/// CA (`kube-root-ca.crt`) and the namespace.
fn kube_api_access(rng: &mut Rng) -> Value {
    json!({
        "name": format!("kube-api-access-{}", rng.suffix(5)),
        "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ]},
    })
}

/// A Pod of `template_spec` as it runs: on a Node, with the admission volume.
fn pod_spec(template_spec: &Value, ns: &Namespace, rng: &mut Rng) -> Value {
    let mut spec = template_spec.clone();
    if let Some(node) = ns.node(rng) {
        spec["nodeName"] = json!(node);
    }
    let volume = kube_api_access(rng);
    if let Some(v) = spec["volumes"].as_array_mut() {
        v.push(volume);
    } else {
        spec["volumes"] = json!([volume]);
    }
    spec
}

/// A bound claim: the PersistentVolumeClaim `name` and the PersistentVolume the
/// provisioner made for it.
fn bound_claim(
    sink: &mut Sink<'_>,
    rng: &mut Rng,
    namespace: &str,
    name: &str,
    labels: &Value,
    size: &str,
) {
    let pv = format!(
        "pvc-{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        rng.next() as u32,
        rng.next() as u16,
        rng.next() % 0x1000,
        rng.next() % 0x1000,
        rng.next() % 0x1_0000_0000_0000
    );
    let claim = sink.put(
        "persistentvolumeclaims",
        namespace,
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "labels": labels}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}, "storageClassName": STORAGE_CLASS, "volumeName": pv, "volumeMode": "Filesystem"}, "status": {"phase": "Bound", "capacity": {"storage": size}}}),
    );
    sink.put(
        "persistentvolumes",
        "",
        json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": pv, "annotations": {"pv.kubernetes.io/provisioned-by": "rancher.io/local-path"}},
            "spec": {
                "capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete", "storageClassName": STORAGE_CLASS, "volumeMode": "Filesystem",
                "hostPath": {"path": format!("/var/lib/local-path/{pv}_{namespace}_{name}"), "type": "DirectoryOrCreate"},
                "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": namespace, "name": name, "uid": claim["metadata"]["uid"]},
            },
            "status": {"phase": "Bound"},
        }),
    );
}

mod apps;
mod extras;
mod flux;
#[cfg(test)]
mod tests;

use apps::app;
use extras::extras;
use flux::flux;
#[cfg(test)]
use flux::gzip;

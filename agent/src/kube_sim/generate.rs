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

use serde_json::{Value, json};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

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

/// One app in `ns`: ConfigMap, Secret, ServiceAccount, Service, Deployment,
/// ReplicaSet and its Pods.
fn app(sink: &mut Sink<'_>, rng: &mut Rng, ns: &mut Namespace, app: &str) {
    let namespace = ns.name.clone();
    let first = ns.first_app.is_none();
    let a = app
        .rsplit('-')
        .next()
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    let labels = json!({"app.kubernetes.io/name": app, "app": app});
    // The first app is Flux's (Kustomization `apps`), labelled as kustomize-controller labels what it applies.
    let mut meta_labels = labels.clone();
    if first {
        meta_labels["kustomize.toolkit.fluxcd.io/name"] = json!("apps");
        meta_labels["kustomize.toolkit.fluxcd.io/namespace"] = json!(namespace);
    }
    let config = format!("{app}-config");
    let secret = format!("{app}-credentials");
    sink.put(
        "configmaps",
        &namespace,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": config, "labels": meta_labels}, "data": {"LOG_LEVEL": rng.pick(&["info", "debug", "warn"]), "app.yaml": format!("name: {app}\nport: 8080\n")}}),
    );
    sink.put(
        "secrets",
        &namespace,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret, "labels": meta_labels}, "type": "Opaque", "data": {"password": "c2VjcmV0", "token": "dG9rZW4="}}),
    );
    let mut sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": app, "labels": meta_labels}, "imagePullSecrets": [{"name": "regcred"}]});
    if first {
        // A long-lived token Secret, as clusters before 1.24 made for every ServiceAccount.
        let token = format!("{app}-token-{}", rng.suffix(5));
        sink.put(
            "secrets",
            &namespace,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": token, "annotations": {"kubernetes.io/service-account.name": app}}, "type": "kubernetes.io/service-account-token", "data": {"token": "ZXlKaGJHY2lPaUpTVXpJMU5pSjk=", "namespace": "ZGVmYXVsdA=="}}),
        );
        sa["secrets"] = json!([{"name": token}]);
    }
    sink.put("serviceaccounts", &namespace, sa);
    sink.put(
        "services",
        &namespace,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": app, "labels": meta_labels}, "spec": {"type": "ClusterIP", "selector": {"app": app}, "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}),
    );
    let replicas = rng.range(1, 4);
    let image = rng.pick(IMAGES);
    let mut template_spec = json!({
        "serviceAccountName": app,
        "imagePullSecrets": [{"name": "regcred"}],
        "containers": [{
            "name": app,
            "image": image,
            "ports": [{"containerPort": 8080}],
            "env": [
                {"name": "LOG_LEVEL", "valueFrom": {"configMapKeyRef": {"name": config, "key": "LOG_LEVEL"}}},
                {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": secret, "key": "password"}}},
            ],
            "envFrom": [{"configMapRef": {"name": config}}, {"secretRef": {"name": secret}}],
            "volumeMounts": [
                {"name": "config", "mountPath": "/etc/app"},
                {"name": "credentials", "mountPath": "/var/run/credentials", "readOnly": true},
                {"name": "bundle", "mountPath": "/var/run/bundle", "readOnly": true},
            ],
        }],
        "volumes": [
            {"name": "config", "configMap": {"name": config}},
            {"name": "credentials", "secret": {"secretName": secret}},
            {"name": "bundle", "projected": {"sources": [
                {"configMap": {"name": config, "items": [{"key": "app.yaml", "path": "app.yaml"}]}},
                {"secret": {"name": secret, "items": [{"key": "token", "path": "token"}]}},
            ]}},
        ],
    });
    if a.is_multiple_of(2) {
        template_spec["initContainers"] = json!([{"name": "migrate", "image": image, "command": ["/bin/migrate"], "envFrom": [{"configMapRef": {"name": config}}], "env": [{"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": secret, "key": "password"}}}]}]);
    }
    if !ns.nodes.is_empty() {
        if a.is_multiple_of(3) {
            template_spec["priorityClassName"] = json!(PRIORITY_CLASS);
        }
        if a % 5 == 4 {
            template_spec["runtimeClassName"] = json!(RUNTIME_CLASS);
        }
    }
    let deployment = sink.put(
        "deployments.apps",
        &namespace,
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": app, "labels": meta_labels, "annotations": {"deployment.kubernetes.io/revision": "1"}},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": app}},
                "template": {"metadata": {"labels": labels}, "spec": template_spec},
            },
            "status": {"replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas},
        }),
    );
    let hash = rng.suffix(10);
    let rs_name = format!("{app}-{hash}");
    let mut pod_labels = labels.clone();
    pod_labels["pod-template-hash"] = json!(hash);
    let replica_set = sink.put(
        "replicasets.apps",
        &namespace,
        json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": rs_name, "labels": pod_labels, "ownerReferences": controller_ref(&deployment)},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": app, "pod-template-hash": hash}},
                "template": {"metadata": {"labels": pod_labels}, "spec": template_spec},
            },
            "status": {"replicas": replicas, "readyReplicas": replicas},
        }),
    );
    for r in 0..replicas {
        let phase = if rng.range(0, 19) == 0 {
            "Pending"
        } else {
            "Running"
        };
        let mut spec = pod_spec(&template_spec, ns, rng);
        if first && r == 0 {
            // Someone debugged it: `kubectl debug` adds an ephemeral container.
            spec["ephemeralContainers"] = json!([{"name": format!("debugger-{}", rng.suffix(5)), "image": "busybox:1.36", "targetContainerName": app, "envFrom": [{"secretRef": {"name": secret}}], "env": [{"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": config, "key": "LOG_LEVEL"}}}]}]);
        }
        sink.put(
            "pods",
            &namespace,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{rs_name}-{}", rng.suffix(5)), "labels": pod_labels, "ownerReferences": controller_ref(&replica_set)},
                "spec": spec,
                "status": {"phase": phase, "podIP": format!("10.{}.{}.{}", rng.range(0, 255), rng.range(0, 255), rng.range(1, 254))},
            }),
        );
    }
    if first {
        ns.first_app = Some(app.to_owned());
        for (group, kind_name, name) in [
            ("", "ConfigMap", config),
            ("", "Secret", secret),
            ("", "ServiceAccount", app.to_owned()),
            ("", "Service", app.to_owned()),
            ("apps", "Deployment", app.to_owned()),
        ] {
            ns.inventory.push((group, kind_name, name));
        }
    }
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

/// The rest of a namespace: an Ingress to the first app's Service with a TLS
/// Secret; a StatefulSet, its headless Service, PersistentVolumeClaims (from the
/// volume claim template, as the StatefulSet controller names them:
/// `<template>-<set>-<ordinal>`) bound to PersistentVolumes, and Pods; a CronJob →
/// Job → Pod chain; a Widget naming the first app's ConfigMap.
fn extras(sink: &mut Sink<'_>, rng: &mut Rng, ns: &mut Namespace) {
    let namespace = ns.name.clone();
    let app = ns.first_app.clone().unwrap_or_else(|| "web".to_owned());
    let tls = format!("{app}-tls");
    sink.put(
        "secrets",
        &namespace,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": tls}, "type": "kubernetes.io/tls", "data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5"}}),
    );
    let host = format!("{app}.{namespace}.example.com");
    sink.put(
        "ingresses.networking.k8s.io",
        &namespace,
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": app, "labels": {"kustomize.toolkit.fluxcd.io/name": "apps", "kustomize.toolkit.fluxcd.io/namespace": namespace}},
            "spec": {
                "ingressClassName": INGRESS_CLASS,
                "tls": [{"hosts": [host], "secretName": tls}],
                "defaultBackend": {"service": {"name": app, "port": {"number": 80}}},
                "rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": app, "port": {"number": 80}}}}]}}],
            },
        }),
    );
    ns.inventory
        .push(("networking.k8s.io", "Ingress", app.clone()));

    let set = "db";
    let labels = json!({"app": set});
    sink.put(
        "services",
        &namespace,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": set, "labels": labels}, "spec": {"clusterIP": "None", "selector": labels, "ports": [{"name": "pg", "port": 5432}]}}),
    );
    let replicas = rng.range(1, 3);
    let claim = json!({"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": STORAGE_CLASS, "resources": {"requests": {"storage": "1Gi"}}}});
    let containers = json!([{"name": "postgres", "image": "postgres:16", "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql/data"}]}]);
    let statefulset = sink.put(
        "statefulsets.apps",
        &namespace,
        json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": set, "labels": labels},
            "spec": {
                "serviceName": set,
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": {"containers": containers}},
                "volumeClaimTemplates": [claim],
            },
            "status": {"replicas": replicas, "readyReplicas": replicas},
        }),
    );
    ns.infra.push(("", "Service", set.to_owned()));
    ns.infra.push(("apps", "StatefulSet", set.to_owned()));
    for i in 0..replicas {
        let claim_name = format!("data-{set}-{i}");
        bound_claim(sink, rng, &namespace, &claim_name, &labels, "1Gi");
        let template = json!({"containers": containers, "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]});
        sink.put(
            "pods",
            &namespace,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{set}-{i}"), "labels": labels, "ownerReferences": controller_ref(&statefulset)},
                "spec": pod_spec(&template, ns, rng),
                "status": {"phase": "Running"},
            }),
        );
    }

    let cron = "report";
    let job_spec = json!({"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": cron, "image": "busybox:1.36", "command": ["sh", "-c", "date"], "envFrom": [{"configMapRef": {"name": format!("{app}-config")}}]}]}}});
    let cronjob = sink.put(
        "cronjobs.batch",
        &namespace,
        json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": cron}, "spec": {"schedule": "0 * * * *", "jobTemplate": {"spec": job_spec}}}),
    );
    let job_name = format!("{cron}-{}", 29_000_000 + rng.range(0, 999_999));
    let job = sink.put(
        "jobs.batch",
        &namespace,
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job_name, "ownerReferences": controller_ref(&cronjob)}, "spec": job_spec, "status": {"succeeded": 1}}),
    );
    sink.put(
        "pods",
        &namespace,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("{job_name}-{}", rng.suffix(5)), "labels": {"job-name": job_name}, "ownerReferences": controller_ref(&job)},
            "spec": pod_spec(&job_spec["template"]["spec"], ns, rng),
            "status": {"phase": "Succeeded"},
        }),
    );

    let widget = format!("{app}-widget");
    sink.put(
        "widgets.example.podgate.dev",
        &namespace,
        json!({"apiVersion": "example.podgate.dev/v1", "kind": "Widget", "metadata": {"name": widget}, "spec": {"size": rng.range(1, 9), "configMapRef": {"name": format!("{app}-config")}}}),
    );
    ns.inventory.push((EXAMPLE_GROUP, "Widget", widget));
}

/// A hex digest of `n` characters.
fn hex(rng: &mut Rng, n: usize) -> String {
    (0..n)
        .map(|_| char::from_digit((rng.next() % 16) as u32, 16).unwrap_or('0'))
        .collect()
}

/// Flux's `status.inventory` of objects in `ns`: entries `{id, v}` with id
/// `<namespace>_<name>_<group>_<Kind>` (`fluxcd/pkg/ssa` `ObjMetadata`, the
/// namespace empty for cluster-scoped objects), sorted as kustomize-controller
/// sorts them.
fn inventory(ns: &str, objects: &[(&str, &str, String)]) -> Value {
    let mut entries: Vec<(String, &str)> = objects
        .iter()
        .map(|(group, kind_name, name)| {
            let namespace = if *kind_name == "Namespace" { "" } else { ns };
            let version = if group.is_empty() {
                "v1"
            } else {
                kind_named_version(group)
            };
            (format!("{namespace}_{name}_{group}_{kind_name}"), version)
        })
        .collect();
    entries.sort();
    entries.dedup();
    json!({"entries": entries.into_iter().map(|(id, v)| json!({"id": id, "v": v})).collect::<Vec<_>>()})
}

/// The version Flux records for objects of `group` (the served, preferred one).
fn kind_named_version(group: &str) -> &'static str {
    KINDS
        .iter()
        .find(|k| k.group == group)
        .map_or("v1", |k| k.versions[0])
}

/// A Ready condition.
fn ready(reason: &str, message: &str) -> Value {
    json!([{"type": "Ready", "status": "True", "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z", "reason": reason, "message": message}])
}

/// Flux in `ns` (see the module docs). `index` is the namespace's number.
fn flux(sink: &mut Sink<'_>, rng: &mut Rng, ns: &mut Namespace, index: usize) {
    let namespace = ns.name.clone();
    let team = namespace.split('-').next().unwrap_or("team").to_owned();
    let sa = ns.first_app.clone().unwrap_or_else(|| "default".to_owned());
    let commit = hex(rng, 40);
    let revision = format!("main@sha1:{commit}");
    // Source: the Git repository and its credentials.
    sink.put(
        "secrets",
        &namespace,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "git-credentials"}, "type": "Opaque", "data": {"username": "Zmx1eA==", "password": "Z2xwYXQteHh4"}}),
    );
    sink.put(
        "gitrepositories.source.toolkit.fluxcd.io",
        &namespace,
        json!({
            "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
            "metadata": {"name": namespace},
            "spec": {"interval": "1m0s", "url": format!("https://gitlab.example.com/{team}/{namespace}.git"), "ref": {"branch": "main"}, "secretRef": {"name": "git-credentials"}, "timeout": "60s"},
            "status": {
                "observedGeneration": 1,
                "artifact": {"revision": revision, "digest": format!("sha256:{}", hex(rng, 64)), "path": format!("gitrepository/{namespace}/{namespace}/{commit}.tar.gz"), "url": format!("http://source-controller.flux-system.svc.cluster.local./gitrepository/{namespace}/{namespace}/{commit}.tar.gz"), "lastUpdateTime": "2026-01-01T00:00:00Z", "size": 10_240},
                "conditions": ready("Succeeded", &format!("stored artifact for revision '{revision}'")),
            },
        }),
    );
    sink.put(
        "configmaps",
        &namespace,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cluster-vars"}, "data": {"cluster_name": "production", "region": "eu-west-1"}}),
    );
    sink.put(
        "secrets",
        &namespace,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cluster-secrets"}, "type": "Opaque", "data": {"grafana_password": "c2VjcmV0"}}),
    );
    sink.put(
        "secrets",
        &namespace,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sops-age"}, "type": "Opaque", "data": {"age.agekey": "QUdFLVNFQ1JFVC1LRVktMQ=="}}),
    );
    let source = json!({"kind": "GitRepository", "name": namespace});
    let applied = |msg: &str| {
        ready(
            "ReconciliationSucceeded",
            &format!("Applied revision: {msg}"),
        )
    };

    // Helm: the repository, the release(s), their storage Secrets and objects.
    sink.put(
        "helmrepositories.source.toolkit.fluxcd.io",
        &namespace,
        json!({
            "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "HelmRepository",
            "metadata": {"name": "bitnami", "labels": {"kustomize.toolkit.fluxcd.io/name": "apps", "kustomize.toolkit.fluxcd.io/namespace": namespace}},
            "spec": {"interval": "1h0m0s", "url": "https://charts.bitnami.com/bitnami", "timeout": "60s"},
            "status": {"observedGeneration": 1, "url": format!("http://source-controller.flux-system.svc.cluster.local./helmrepository/{namespace}/bitnami/index.yaml"), "conditions": ready("Succeeded", "stored artifact: revision 'sha256:0f1e'")},
        }),
    );
    ns.inventory
        .push((SOURCE_GROUP, "HelmRepository", "bitnami".to_owned()));
    sink.put(
        "configmaps",
        &namespace,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "redis-values"}, "data": {"values.yaml": "architecture: standalone\nmaster:\n  persistence:\n    size: 2Gi\n"}}),
    );
    sink.put(
        "secrets",
        &namespace,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "redis-auth"}, "type": "Opaque", "data": {"values.yaml": "YXV0aDoKICBwYXNzd29yZDogc2VjcmV0Cg=="}}),
    );
    let redis = HelmRelease {
        name: "redis",
        chart: "redis",
        chart_version: "18.1.5",
        app_version: "7.2.4",
        revisions: 3,
    };
    let manifest_objects = redis_objects(sink, rng, ns, &redis);
    release(
        sink,
        rng,
        ns,
        &redis,
        &manifest_objects,
        json!({
            "interval": "10m0s",
            "releaseName": "redis",
            "chart": {"spec": {"chart": "redis", "version": "18.x", "sourceRef": {"kind": "HelmRepository", "name": "bitnami"}, "interval": "1h0m0s"}},
            "valuesFrom": [{"kind": "ConfigMap", "name": "redis-values"}, {"kind": "Secret", "name": "redis-auth", "valuesKey": "values.yaml"}],
            "serviceAccountName": sa,
            "install": {"remediation": {"retries": 3}},
        }),
    );
    if index % 2 == 1 {
        let metrics = HelmRelease {
            name: "metrics",
            chart: "kube-state-metrics",
            chart_version: "5.15.2",
            app_version: "2.10.1",
            revisions: 1,
        };
        let objects = metrics_objects(sink, ns, &metrics);
        release(
            sink,
            rng,
            ns,
            &metrics,
            &objects,
            json!({
                "interval": "10m0s",
                "chart": {"spec": {"chart": "kube-state-metrics", "version": "5.x", "sourceRef": {"kind": "HelmRepository", "name": "bitnami"}}},
                "dependsOn": [{"name": "redis"}],
            }),
        );
    }

    // Kustomizations: `infra` first, `apps` depending on it.
    sink.put(
        "kustomizations.kustomize.toolkit.fluxcd.io",
        &namespace,
        json!({
            "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
            "metadata": {"name": "infra"},
            "spec": {"interval": "10m0s", "path": format!("./infra/{namespace}"), "prune": true, "sourceRef": source},
            "status": {"observedGeneration": 1, "lastAppliedRevision": revision, "lastAttemptedRevision": revision, "conditions": applied(&revision), "inventory": inventory(&namespace, &ns.infra)},
        }),
    );
    sink.put(
        "kustomizations.kustomize.toolkit.fluxcd.io",
        &namespace,
        json!({
            "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
            "metadata": {"name": "apps"},
            "spec": {
                "interval": "10m0s", "path": format!("./apps/{namespace}"), "prune": true, "wait": true,
                "sourceRef": source,
                "dependsOn": [{"name": "infra"}],
                "serviceAccountName": sa,
                "targetNamespace": namespace,
                "postBuild": {"substitute": {"team": team}, "substituteFrom": [{"kind": "ConfigMap", "name": "cluster-vars"}, {"kind": "Secret", "name": "cluster-secrets"}]},
                "decryption": {"provider": "sops", "secretRef": {"name": "sops-age"}},
            },
            "status": {"observedGeneration": 1, "lastAppliedRevision": revision, "lastAttemptedRevision": revision, "conditions": applied(&revision), "inventory": inventory(&namespace, &ns.inventory)},
        }),
    );
    if index.is_multiple_of(4) {
        sink.put(
            "secrets",
            &namespace,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "edge-kubeconfig"}, "type": "Opaque", "data": {"value": "YXBpVmVyc2lvbjogdjEKa2luZDogQ29uZmlnCg=="}}),
        );
        sink.put(
            "kustomizations.kustomize.toolkit.fluxcd.io",
            &namespace,
            json!({
                "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
                "metadata": {"name": "edge"},
                "spec": {"interval": "30m0s", "path": "./edge", "prune": true, "sourceRef": source, "kubeConfig": {"secretRef": {"name": "edge-kubeconfig", "key": "value"}}},
                "status": {"observedGeneration": 1, "lastAppliedRevision": revision, "lastAttemptedRevision": revision, "conditions": applied(&revision), "inventory": {"entries": []}},
            }),
        );
        // A release into the edge cluster, its chart from an OCI repository
        // (`chartRef`); not installed yet, so no history and no storage Secret.
        sink.put(
            "ocirepositories.source.toolkit.fluxcd.io",
            &namespace,
            json!({
                "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "OCIRepository",
                "metadata": {"name": "edge-agent"},
                "spec": {"interval": "10m0s", "url": "oci://registry.gitlab.example.com/charts/edge-agent", "ref": {"semver": "1.x"}, "layerSelector": {"mediaType": "application/vnd.cncf.helm.chart.content.v1.tar+gzip", "operation": "copy"}},
                "status": {"observedGeneration": 1, "conditions": ready("Succeeded", "stored artifact for digest '1.4.0@sha256:7c1e'")},
            }),
        );
        sink.put(
            "helmreleases.helm.toolkit.fluxcd.io",
            &namespace,
            json!({
                "apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
                "metadata": {"name": "edge-agent"},
                "spec": {
                    "interval": "30m0s",
                    "chartRef": {"kind": "OCIRepository", "name": "edge-agent"},
                    "kubeConfig": {"secretRef": {"name": "edge-kubeconfig", "key": "value"}},
                    "targetNamespace": "edge-system",
                },
                "status": {"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "Unknown", "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z", "reason": "Progressing", "message": "Fresh install in progress"}]},
            }),
        );
    }
}

/// A Helm release as helm-controller installs it.
struct HelmRelease {
    name: &'static str,
    chart: &'static str,
    chart_version: &'static str,
    app_version: &'static str,
    /// Revisions so far: `v1` … `v<revisions>`, the last deployed.
    revisions: u64,
}

/// Labels and annotations Helm and helm-controller put on what a release installs.
fn helm_meta(ns: &str, r: &HelmRelease) -> Value {
    json!({
        "labels": {
            "app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/instance": r.name, "app.kubernetes.io/name": r.chart,
            "helm.sh/chart": format!("{}-{}", r.chart, r.chart_version),
            "helm.toolkit.fluxcd.io/name": r.name, "helm.toolkit.fluxcd.io/namespace": ns,
        },
        "annotations": {"meta.helm.sh/release-name": r.name, "meta.helm.sh/release-namespace": ns},
    })
}

/// `base` with `name` added to its metadata.
fn named(mut meta: Value, name: &str) -> Value {
    meta["name"] = json!(name);
    meta
}

/// The objects of the `redis` chart: what its manifest lists (ServiceAccount,
/// ConfigMap, two Services, StatefulSet), stored, and what controllers make from
/// them (the Pod, the claim and its volume). Returns the manifest's objects.
fn redis_objects(
    sink: &mut Sink<'_>,
    rng: &mut Rng,
    ns: &Namespace,
    r: &HelmRelease,
) -> Vec<Value> {
    let namespace = ns.name.clone();
    let meta = helm_meta(&namespace, r);
    let selector = json!({"app.kubernetes.io/instance": r.name, "app.kubernetes.io/name": r.chart, "app.kubernetes.io/component": "master"});
    let containers = json!([{"name": "redis", "image": format!("docker.io/bitnami/redis:{}", r.app_version), "envFrom": [{"configMapRef": {"name": "redis-configuration"}}], "volumeMounts": [{"name": "redis-data", "mountPath": "/data"}]}]);
    let manifest = vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": named(meta.clone(), "redis"), "automountServiceAccountToken": false}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": named(meta.clone(), "redis-configuration"), "data": {"redis.conf": "appendonly yes\nsave \"\"\n"}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": named(meta.clone(), "redis-headless"), "spec": {"type": "ClusterIP", "clusterIP": "None", "selector": selector, "ports": [{"name": "tcp-redis", "port": 6379}]}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": named(meta.clone(), "redis-master"), "spec": {"type": "ClusterIP", "selector": selector, "ports": [{"name": "tcp-redis", "port": 6379}]}}),
        json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": named(meta.clone(), "redis-master"),
            "spec": {
                "replicas": 1, "serviceName": "redis-headless", "selector": {"matchLabels": selector},
                "template": {"metadata": {"labels": selector}, "spec": {"serviceAccountName": "redis", "containers": containers}},
                "volumeClaimTemplates": [{"metadata": {"name": "redis-data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2Gi"}}}}],
            },
            "status": {"replicas": 1, "readyReplicas": 1},
        }),
    ];
    let mut statefulset = Value::Null;
    for o in &manifest {
        let resource = match o["kind"].as_str() {
            Some("StatefulSet") => "statefulsets.apps",
            Some("ServiceAccount") => "serviceaccounts",
            Some("ConfigMap") => "configmaps",
            _ => "services",
        };
        let stored = sink.put(resource, &namespace, o.clone());
        if resource == "statefulsets.apps" {
            statefulset = stored;
        }
    }
    bound_claim(
        sink,
        rng,
        &namespace,
        "redis-data-redis-master-0",
        &selector,
        "2Gi",
    );
    let template = json!({"serviceAccountName": "redis", "containers": containers, "volumes": [{"name": "redis-data", "persistentVolumeClaim": {"claimName": "redis-data-redis-master-0"}}]});
    let mut labels = selector.clone();
    labels["statefulset.kubernetes.io/pod-name"] = json!("redis-master-0");
    sink.put(
        "pods",
        &namespace,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "redis-master-0", "labels": labels, "ownerReferences": controller_ref(&statefulset)},
            "spec": pod_spec(&template, ns, rng),
            "status": {"phase": "Running"},
        }),
    );
    manifest
}

/// The objects of the `metrics` chart (a ConfigMap and a Service), stored.
fn metrics_objects(sink: &mut Sink<'_>, ns: &Namespace, r: &HelmRelease) -> Vec<Value> {
    let meta = helm_meta(&ns.name, r);
    let manifest = vec![
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": named(meta.clone(), "metrics-config"), "data": {"config.yaml": "collectors: [pods, deployments]\n"}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": named(meta.clone(), "metrics"), "spec": {"type": "ClusterIP", "selector": {"app.kubernetes.io/instance": r.name}, "ports": [{"name": "http", "port": 8080}]}}),
    ];
    for o in &manifest {
        let resource = if o["kind"] == "ConfigMap" {
            "configmaps"
        } else {
            "services"
        };
        sink.put(resource, &ns.name, o.clone());
    }
    manifest
}

/// A HelmRelease of `spec` with the storage Secrets of its revisions (Helm's Secret
/// driver, `helm.sh/helm/v3/pkg/storage/driver/secrets.go`: name
/// `sh.helm.release.v1.<release>.v<revision>`, type `helm.sh/release.v1`, labels
/// `owner`, `name`, `version`, `status`, `modifiedAt`; `data.release` the release
/// JSON gzipped and base64-encoded, then base64-encoded again as Secret data is).
fn release(
    sink: &mut Sink<'_>,
    rng: &mut Rng,
    ns: &mut Namespace,
    r: &HelmRelease,
    manifest: &[Value],
    spec: Value,
) {
    let namespace = ns.name.clone();
    let mut text = String::new();
    for o in manifest {
        let mut o = o.clone();
        o["metadata"]["namespace"] = json!(namespace);
        text.push_str(&format!(
            "---\n# Source: {}/templates/{}.yaml\n",
            r.chart,
            o["kind"].as_str().unwrap_or("object").to_lowercase()
        ));
        text.push_str(&serde_yaml::to_string(&o).unwrap_or_default());
    }
    let mut history = Vec::new();
    for v in 1..=r.revisions {
        let status = if v == r.revisions {
            "deployed"
        } else {
            "superseded"
        };
        let body = json!({
            "name": r.name,
            "info": {"first_deployed": "2025-11-02T09:00:00Z", "last_deployed": format!("2025-12-{:02}T09:00:00Z", v), "deleted": "", "description": if v == 1 { "Install complete" } else { "Upgrade complete" }, "status": status},
            "chart": {"metadata": {"name": r.chart, "version": r.chart_version, "appVersion": r.app_version, "apiVersion": "v2"}, "lock": null, "templates": [], "values": {}, "schema": null, "files": []},
            "config": {},
            "manifest": text,
            "version": v,
            "namespace": namespace,
        });
        let encoded = BASE64.encode(gzip(body.to_string().as_bytes()));
        sink.put(
            "secrets",
            &namespace,
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": format!("sh.helm.release.v1.{}.v{v}", r.name), "labels": {"owner": "helm", "name": r.name, "version": v.to_string(), "status": status, "modifiedAt": (1_764_580_000 + v * 86_400).to_string()}},
                "type": "helm.sh/release.v1",
                "data": {"release": BASE64.encode(encoded)},
            }),
        );
        history.push(json!({
            "name": r.name, "namespace": namespace, "version": v, "status": status,
            "chartName": r.chart, "chartVersion": r.chart_version, "appVersion": r.app_version,
            "configDigest": format!("sha256:{}", hex(rng, 64)), "digest": format!("sha256:{}", hex(rng, 64)),
            "firstDeployed": "2025-11-02T09:00:00Z", "lastDeployed": format!("2025-12-{:02}T09:00:00Z", v),
        }));
    }
    history.reverse();
    let latest = &history[0];
    sink.put(
        "helmreleases.helm.toolkit.fluxcd.io",
        &namespace,
        json!({
            "apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
            "metadata": {"name": r.name, "labels": {"kustomize.toolkit.fluxcd.io/name": "apps", "kustomize.toolkit.fluxcd.io/namespace": namespace}},
            "spec": spec,
            "status": {
                "observedGeneration": 1,
                "helmChart": format!("{namespace}/{namespace}-{}", r.name),
                "storageNamespace": namespace,
                "history": history,
                "lastAttemptedGeneration": 1,
                "lastAttemptedRevision": r.chart_version,
                "lastAttemptedConfigDigest": latest["configDigest"],
                "lastAttemptedReleaseAction": if r.revisions == 1 { "install" } else { "upgrade" },
                "conditions": [
                    {"type": "Ready", "status": "True", "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z", "reason": if r.revisions == 1 { "InstallSucceeded" } else { "UpgradeSucceeded" }, "message": format!("Helm {} succeeded for release {namespace}/{}.v{} with chart {}@{}", if r.revisions == 1 { "install" } else { "upgrade" }, r.name, r.revisions, r.chart, r.chart_version)},
                    {"type": "Released", "status": "True", "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z", "reason": "UpgradeSucceeded", "message": "release up to date"},
                ],
            },
        }),
    );
    ns.inventory
        .push((HELM_GROUP, "HelmRelease", r.name.to_owned()));
}

/// `data` as a gzip member of stored (uncompressed) deflate blocks: what any gzip
/// reader, Helm's included, reads; no compression library needed.
pub(super) fn gzip(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255];
    let mut chunks = data.chunks(0xffff).peekable();
    if data.is_empty() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(c) = chunks.next() {
        out.push(u8::from(chunks.peek().is_none()));
        let len = c.len() as u16;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(c);
    }
    let mut crc = !0u32;
    for b in data {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    out.extend_from_slice(&(!crc).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    /// Every object of `resource` in the cluster.
    fn all(sim: &KubeSim, resource: &str) -> Vec<Value> {
        let k = kind(resource).unwrap();
        sim.shared.lock().of(k).map(|(_, o)| o.value()).collect()
    }

    fn s(v: &Value) -> &str {
        v.as_str().unwrap_or_else(|| panic!("not a string: {v}"))
    }

    /// The Pod spec references of §6 in `spec` (a Pod's, or a template's):
    /// (resource, name).
    fn pod_refs(spec: &Value) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let mut add = |r: &'static str, v: &Value| {
            if let Some(n) = v.as_str() {
                out.push((r, n.to_owned()));
            }
        };
        for v in spec["volumes"].as_array().into_iter().flatten() {
            add("configmaps", &v["configMap"]["name"]);
            add("secrets", &v["secret"]["secretName"]);
            add(
                "persistentvolumeclaims",
                &v["persistentVolumeClaim"]["claimName"],
            );
            for p in v["projected"]["sources"].as_array().into_iter().flatten() {
                add("configmaps", &p["configMap"]["name"]);
                add("secrets", &p["secret"]["name"]);
            }
        }
        for list in ["containers", "initContainers", "ephemeralContainers"] {
            for c in spec[list].as_array().into_iter().flatten() {
                for e in c["env"].as_array().into_iter().flatten() {
                    add("configmaps", &e["valueFrom"]["configMapKeyRef"]["name"]);
                    add("secrets", &e["valueFrom"]["secretKeyRef"]["name"]);
                }
                for e in c["envFrom"].as_array().into_iter().flatten() {
                    add("configmaps", &e["configMapRef"]["name"]);
                    add("secrets", &e["secretRef"]["name"]);
                }
            }
        }
        add("serviceaccounts", &spec["serviceAccountName"]);
        for p in spec["imagePullSecrets"].as_array().into_iter().flatten() {
            add("secrets", &p["name"]);
        }
        add("nodes", &spec["nodeName"]);
        add("priorityclasses", &spec["priorityClassName"]);
        add("runtimeclasses", &spec["runtimeClassName"]);
        out
    }

    #[test]
    fn generated_clusters_are_exact_deterministic_and_their_references_resolve() {
        let sim = KubeSim::new(10);
        let base = sim.objects().len();
        let n = generate(&sim, 3000, 7);
        assert_eq!(n, 3000);
        assert_eq!(
            sim.objects().len(),
            base + n,
            "exactly as many objects as asked for"
        );
        for want in [0, 1, 13, 14, 100, 137, 500] {
            let small = KubeSim::new(10);
            assert_eq!(generate(&small, want, 3), want);
            assert_eq!(small.objects().len(), base + want);
        }

        // The same seed, the same names; another seed, others.
        let again = KubeSim::new(10);
        assert_eq!(generate(&again, 3000, 7), n);
        let names = |s: &KubeSim| -> Vec<String> {
            s.objects()
                .iter()
                .map(|o| format!("{}/{}/{}", o.resource, o.namespace, o.name))
                .collect()
        };
        assert_eq!(names(&sim), names(&again));
        let other = KubeSim::new(10);
        generate(&other, 3000, 8);
        assert_ne!(names(&sim), names(&other));

        // Every kind of graph-api.md §6 is there.
        let objects = sim.objects();
        let mut per: BTreeMap<&str, usize> = BTreeMap::new();
        for o in &objects {
            *per.entry(o.resource).or_default() += 1;
        }
        for r in [
            "namespaces",
            "pods",
            "configmaps",
            "secrets",
            "serviceaccounts",
            "services",
            "persistentvolumeclaims",
            "persistentvolumes",
            "nodes",
            "deployments",
            "replicasets",
            "statefulsets",
            "daemonsets",
            "jobs",
            "cronjobs",
            "ingresses",
            "ingressclasses",
            "storageclasses",
            "priorityclasses",
            "runtimeclasses",
            "widgets",
            "kustomizations",
            "helmreleases",
            "gitrepositories",
            "helmrepositories",
            "ocirepositories",
            "customresourcedefinitions",
        ] {
            assert!(per.get(r).copied().unwrap_or(0) > 0, "no {r}: {per:?}");
        }

        let by_uid: BTreeMap<String, Value> = objects
            .iter()
            .map(|o| {
                let v = o.value();
                (s(&v["metadata"]["uid"]).to_owned(), v)
            })
            .collect();
        let exists = |resource: &str, ns: &str, name: &str| {
            let k = kind(resource).unwrap();
            let ns = if k.namespaced { ns } else { "" };
            assert!(
                sim.get(resource, ns, name).is_some(),
                "{resource} {ns}/{name} missing"
            );
        };
        let mut uses: BTreeSet<&str> = BTreeSet::new();
        for o in &objects {
            let v = o.value();
            let ns = o.namespace.as_str();
            // Owner references point at the owner's uid and kind.
            for r in v["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let owner = by_uid
                    .get(s(&r["uid"]))
                    .unwrap_or_else(|| panic!("owner of {}/{} missing", o.resource, o.name));
                assert_eq!(owner["kind"], r["kind"]);
                assert_eq!(owner["metadata"]["name"], r["name"]);
                assert_eq!(owner["apiVersion"], r["apiVersion"]);
                assert_eq!(
                    (r["controller"].clone(), r["blockOwnerDeletion"].clone()),
                    (json!(true), json!(true))
                );
            }
            let spec = &v["spec"];
            match o.resource {
                "pods" => {
                    assert!(
                        v["metadata"]["ownerReferences"].is_array(),
                        "every Pod has a controller"
                    );
                    for (r, name) in pod_refs(spec) {
                        exists(r, ns, &name);
                    }
                    for (key, what) in [
                        ("initContainers", "init"),
                        ("ephemeralContainers", "ephemeral"),
                        ("priorityClassName", "priority"),
                        ("runtimeClassName", "runtime"),
                    ] {
                        if !spec[key].is_null() {
                            uses.insert(what);
                        }
                    }
                    if spec["volumes"].to_string().contains("\"projected\"") {
                        uses.insert("projected");
                    }
                }
                "deployments" | "replicasets" | "statefulsets" | "daemonsets" | "jobs" => {
                    if o.resource == "statefulsets" {
                        exists("services", ns, s(&spec["serviceName"]));
                    }
                    for (r, name) in pod_refs(&spec["template"]["spec"]) {
                        exists(r, ns, &name);
                    }
                }
                "cronjobs" => {
                    for (r, name) in pod_refs(&spec["jobTemplate"]["spec"]["template"]["spec"]) {
                        exists(r, ns, &name);
                    }
                }
                "serviceaccounts" => {
                    for key in ["secrets", "imagePullSecrets"] {
                        for r in v[key].as_array().into_iter().flatten() {
                            exists("secrets", ns, s(&r["name"]));
                            uses.insert(if key == "secrets" {
                                "sa-secrets"
                            } else {
                                "sa-pull"
                            });
                        }
                    }
                }
                "persistentvolumeclaims" => {
                    exists("persistentvolumes", "", s(&spec["volumeName"]));
                    exists("storageclasses", "", s(&spec["storageClassName"]));
                    let pv = sim
                        .get("persistentvolumes", "", s(&spec["volumeName"]))
                        .unwrap();
                    assert_eq!(pv["spec"]["claimRef"]["uid"], v["metadata"]["uid"]);
                }
                "ingresses" => {
                    exists("ingressclasses", "", s(&spec["ingressClassName"]));
                    exists("secrets", ns, s(&spec["tls"][0]["secretName"]));
                    exists(
                        "services",
                        ns,
                        s(&spec["defaultBackend"]["service"]["name"]),
                    );
                    exists(
                        "services",
                        ns,
                        s(&spec["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"]),
                    );
                }
                "kustomizations" => {
                    exists("gitrepositories", ns, s(&spec["sourceRef"]["name"]));
                    for d in spec["dependsOn"].as_array().into_iter().flatten() {
                        exists("kustomizations", ns, s(&d["name"]));
                        uses.insert("ks-depends");
                    }
                    for f in spec["postBuild"]["substituteFrom"]
                        .as_array()
                        .into_iter()
                        .flatten()
                    {
                        let r = if f["kind"] == "Secret" {
                            "secrets"
                        } else {
                            "configmaps"
                        };
                        exists(r, ns, s(&f["name"]));
                    }
                    if let Some(n) = spec["decryption"]["secretRef"]["name"].as_str() {
                        exists("secrets", ns, n);
                    }
                    if let Some(n) = spec["kubeConfig"]["secretRef"]["name"].as_str() {
                        exists("secrets", ns, n);
                        uses.insert("ks-kubeconfig");
                    }
                    if let Some(n) = spec["serviceAccountName"].as_str() {
                        exists("serviceaccounts", ns, n);
                    }
                    // The inventory lists objects that exist: <ns>_<name>_<group>_<Kind>.
                    for e in v["status"]["inventory"]["entries"].as_array().unwrap() {
                        let id: Vec<&str> = s(&e["id"]).split('_').collect();
                        let [ens, name, group, kind_name] = id[..] else {
                            panic!("bad inventory id {e}")
                        };
                        let k = KINDS
                            .iter()
                            .find(|k| k.group == group && k.kind == kind_name)
                            .unwrap_or_else(|| panic!("{e}: no such kind"));
                        assert_eq!(e["v"], k.versions[0]);
                        assert_eq!(ens, if k.namespaced { ns } else { "" }, "{e}");
                        exists(&k.id(), ens, name);
                        uses.insert("inventory");
                    }
                }
                "helmreleases" => {
                    if let Some(r) = spec["chartRef"].as_object() {
                        assert_eq!(r["kind"], "OCIRepository");
                        exists("ocirepositories", ns, s(&r["name"]));
                        exists("secrets", ns, s(&spec["kubeConfig"]["secretRef"]["name"]));
                        uses.insert("hr-chartref");
                        assert!(v["status"]["history"].is_null(), "not installed yet");
                        continue;
                    }
                    let source = &spec["chart"]["spec"]["sourceRef"];
                    assert_eq!(source["kind"], "HelmRepository");
                    exists("helmrepositories", ns, s(&source["name"]));
                    for f in spec["valuesFrom"].as_array().into_iter().flatten() {
                        let r = if f["kind"] == "Secret" {
                            "secrets"
                        } else {
                            "configmaps"
                        };
                        exists(r, ns, s(&f["name"]));
                    }
                    for d in spec["dependsOn"].as_array().into_iter().flatten() {
                        exists("helmreleases", ns, s(&d["name"]));
                        uses.insert("hr-depends");
                    }
                    // The storage Secret of the latest release, as its name is derived.
                    let latest = &v["status"]["history"][0];
                    let storage = format!(
                        "sh.helm.release.v1.{}.v{}",
                        s(&latest["name"]),
                        latest["version"]
                    );
                    let secret = sim
                        .get("secrets", s(&v["status"]["storageNamespace"]), &storage)
                        .unwrap_or_else(|| panic!("{storage} missing"));
                    assert_eq!(secret["type"], "helm.sh/release.v1");
                    assert_eq!(secret["metadata"]["labels"]["owner"], "helm");
                    assert_eq!(secret["metadata"]["labels"]["status"], "deployed");
                    assert_eq!(
                        secret["metadata"]["labels"]["version"],
                        latest["version"].to_string()
                    );
                    assert_eq!(v["status"]["lastAttemptedRevision"], latest["chartVersion"]);
                    // data.release: base64 (Secret data) of base64 of gzip of JSON.
                    let once = BASE64.decode(s(&secret["data"]["release"])).unwrap();
                    let gz = BASE64.decode(once).unwrap();
                    let mut child = std::process::Command::new("gzip")
                        .arg("-dc")
                        .stdin(std::process::Stdio::piped())
                        .stdout(std::process::Stdio::piped())
                        .spawn()
                        .expect("gzip is installed");
                    use std::io::Write as _;
                    child.stdin.take().unwrap().write_all(&gz).unwrap();
                    let out = child.wait_with_output().unwrap();
                    assert!(out.status.success(), "gzip -d refused the release");
                    let release: Value = serde_json::from_slice(&out.stdout).unwrap();
                    assert_eq!(release["name"], latest["name"]);
                    assert_eq!(release["version"], latest["version"]);
                    for doc in serde_yaml::Deserializer::from_str(s(&release["manifest"])) {
                        use serde::Deserialize as _;
                        let m = Value::deserialize(doc).unwrap();
                        let k = crate::kube_sim::resources::kind_named(
                            s(&m["apiVersion"]),
                            s(&m["kind"]),
                        )
                        .unwrap();
                        exists(
                            &k.id(),
                            s(&m["metadata"]["namespace"]),
                            s(&m["metadata"]["name"]),
                        );
                        uses.insert("manifest");
                    }
                }
                "gitrepositories" => exists("secrets", ns, s(&spec["secretRef"]["name"])),
                _ => {}
            }
        }
        assert_eq!(
            uses.into_iter().collect::<Vec<_>>(),
            [
                "ephemeral",
                "hr-chartref",
                "hr-depends",
                "init",
                "inventory",
                "ks-depends",
                "ks-kubeconfig",
                "manifest",
                "priority",
                "projected",
                "runtime",
                "sa-pull",
                "sa-secrets"
            ]
        );

        // Every Service but the Helm chart's selects a Pod of its namespace.
        let pods = all(&sim, "pods");
        for svc in all(&sim, "services") {
            let ns = s(&svc["metadata"]["namespace"]);
            if svc["metadata"]["name"] == "metrics" {
                continue;
            }
            let sel = svc["spec"]["selector"].as_object().unwrap();
            assert!(
                pods.iter().any(|p| p["metadata"]["namespace"] == ns
                    && sel.iter().all(|(k, v)| &p["metadata"]["labels"][k] == v)),
                "service {ns}/{} selects nothing",
                svc["metadata"]["name"]
            );
        }
    }

    #[test]
    fn the_parts_stay_within_their_budgets() {
        // The cluster part first: Nodes, classes, a DaemonSet and its Pods.
        let sim = KubeSim::new(10);
        let mut sink = Sink {
            sim: &sim,
            created: 0,
            limit: usize::MAX,
        };
        let mut rng = Rng(1);
        let nodes = cluster(&mut sink, &mut rng, 4);
        assert_eq!(sink.created, 2 * 4 + 5);
        for seed in 0..40 {
            let mut rng = Rng(seed);
            let mut ns = Namespace {
                name: format!("ns-{seed}"),
                nodes: nodes.clone(),
                inventory: Vec::new(),
                infra: Vec::new(),
                first_app: None,
            };
            let before = sink.created;
            header(&mut sink, &mut ns);
            assert_eq!(sink.created - before, NS_HEADER);
            for a in 0..2 {
                let before = sink.created;
                app(&mut sink, &mut rng, &mut ns, &format!("api-{a}"));
                assert!(sink.created - before <= APP_MAX);
            }
            let before = sink.created;
            extras(&mut sink, &mut rng, &mut ns);
            assert!(sink.created - before <= EXTRAS_MAX);
            let before = sink.created;
            flux(&mut sink, &mut rng, &mut ns, seed as usize);
            assert!(sink.created - before <= FLUX_MAX);
            if seed % 2 == 1 || seed % 4 == 0 {
                assert_eq!(sink.created - before, FLUX_MAX, "the largest Flux parts");
            }
        }
    }

    #[test]
    fn gzip_members_are_read_by_gzip() {
        for len in [0usize, 5, 70_000] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let mut child = std::process::Command::new("gzip")
                .arg("-dc")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("gzip is installed");
            use std::io::Write as _;
            let mut stdin = child.stdin.take().unwrap();
            let gz = gzip(&data);
            let writer = std::thread::spawn(move || stdin.write_all(&gz).unwrap());
            let out = child.wait_with_output().unwrap();
            writer.join().unwrap();
            assert!(out.status.success(), "{len}");
            assert_eq!(out.stdout, data, "{len}");
        }
    }
}

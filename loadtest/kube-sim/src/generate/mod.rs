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

mod flux;
#[cfg(test)]
mod tests;

use flux::flux;
#[cfg(test)]
use flux::gzip;

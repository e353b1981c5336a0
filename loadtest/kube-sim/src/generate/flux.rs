//! Flux and Helm parts of a generated namespace: GitRepository, Kustomizations,
//! HelmRepository, HelmReleases with their Helm storage Secrets (the release
//! gzipped as Helm writes it) and the objects their manifests list.

use serde_json::{Value, json};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::*;

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
pub(super) fn flux(sink: &mut Sink<'_>, rng: &mut Rng, ns: &mut Namespace, index: usize) {
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

/// `data` gzipped at the best compression, as Helm's `encodeRelease` writes a
/// release.
pub(super) fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(data).expect("writing to memory");
    gz.finish().expect("writing to memory")
}

//! Generated clusters that look real, deterministic from a seed number: namespaces,
//! each with an image-pull Secret and apps; an app is a ConfigMap, a Secret, a
//! ServiceAccount (with the image-pull Secret), a Service selecting the app's Pods,
//! and a Deployment → ReplicaSet → Pods chain linked by controller owner references
//! (`uid`, `controller: true`, `blockOwnerDeletion: true`, as kube-controller-manager
//! sets them). Pods mount the ConfigMap and Secret as volumes and read them through
//! `env[].valueFrom` and `envFrom`. Each namespace also gets an Ingress (to its first
//! app's Service, with a TLS Secret), a StatefulSet with volume claim templates, its
//! PersistentVolumeClaims and Pods, a CronJob → Job → Pod chain, and a Widget of the
//! two-version group `example.podgate.dev` naming a ConfigMap.

use serde_json::{Value, json};

use super::KubeSim;
use super::resources::{Kind, kind};

/// A small deterministic generator (SplitMix64): the same seed, the same cluster.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn pick<'a>(&mut self, of: &[&'a str]) -> &'a str {
        of[(self.next() % of.len() as u64) as usize]
    }

    /// `n` characters of the alphabet Kubernetes uses in generated names.
    fn suffix(&mut self, n: usize) -> String {
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

/// Where generated objects go: counts them and links owners.
struct Sink<'a> {
    sim: &'a KubeSim,
    created: usize,
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
}

/// A controller owner reference to `owner`.
fn controller_ref(owner: &Value) -> Value {
    json!([{
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": true,
        "blockOwnerDeletion": true,
    }])
}

/// Add at least `objects` objects (whole apps: the last one is completed) to `sim`,
/// the same ones for the same `seed`; returns how many were added.
pub(super) fn generate(sim: &KubeSim, objects: usize, seed: u64) -> usize {
    let mut rng = Rng(seed);
    let mut sink = Sink { sim, created: 0 };
    let mut n_ns = 0usize;
    while sink.created < objects {
        let ns = format!("{}-{n_ns}", rng.pick(TEAMS));
        n_ns += 1;
        sink.put(
            "namespaces",
            "",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}}),
        );
        sink.put(
            "secrets",
            &ns,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "regcred"}, "type": "kubernetes.io/dockerconfigjson", "data": {".dockerconfigjson": "eyJhdXRocyI6e319"}}),
        );
        let apps = rng.range(3, 12);
        let mut first = None;
        for a in 0..apps {
            if sink.created >= objects {
                break;
            }
            let name = format!("{}-{a}", rng.pick(APPS));
            app(&mut sink, &mut rng, &ns, &name);
            first.get_or_insert(name);
        }
        if let Some(first) = first
            && sink.created < objects
        {
            extras(&mut sink, &mut rng, &ns, &first);
        }
    }
    sink.created
}

/// One app in `ns`: ConfigMap, Secret, ServiceAccount, Service, Deployment,
/// ReplicaSet and its Pods.
fn app(sink: &mut Sink<'_>, rng: &mut Rng, ns: &str, app: &str) {
    let labels = json!({"app.kubernetes.io/name": app, "app": app});
    let config = format!("{app}-config");
    let secret = format!("{app}-credentials");
    sink.put(
        "configmaps",
        ns,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": config, "labels": labels}, "data": {"LOG_LEVEL": rng.pick(&["info", "debug", "warn"]), "app.yaml": format!("name: {app}\nport: 8080\n")}}),
    );
    sink.put(
        "secrets",
        ns,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret, "labels": labels}, "type": "Opaque", "data": {"password": "c2VjcmV0", "token": "dG9rZW4="}}),
    );
    sink.put(
        "serviceaccounts",
        ns,
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": app, "labels": labels}, "imagePullSecrets": [{"name": "regcred"}]}),
    );
    sink.put(
        "services",
        ns,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": app, "labels": labels}, "spec": {"type": "ClusterIP", "selector": {"app": app}, "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}),
    );
    let replicas = rng.range(1, 4);
    let image = rng.pick(IMAGES);
    let template_spec = json!({
        "serviceAccountName": app,
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
            ],
        }],
        "volumes": [
            {"name": "config", "configMap": {"name": config}},
            {"name": "credentials", "secret": {"secretName": secret}},
        ],
    });
    let deployment = sink.put(
        "deployments.apps",
        ns,
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": app, "labels": labels},
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
        ns,
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
    for _ in 0..replicas {
        let phase = if rng.range(0, 19) == 0 {
            "Pending"
        } else {
            "Running"
        };
        sink.put(
            "pods",
            ns,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{rs_name}-{}", rng.suffix(5)), "labels": pod_labels, "ownerReferences": controller_ref(&replica_set)},
                "spec": template_spec,
                "status": {"phase": phase, "podIP": format!("10.{}.{}.{}", rng.range(0, 255), rng.range(0, 255), rng.range(1, 254))},
            }),
        );
    }
}

/// The rest of a namespace: an Ingress to `app`'s Service with a TLS Secret; a
/// StatefulSet, its headless Service, PersistentVolumeClaims (from the volume claim
/// template, as the StatefulSet controller names them: `<template>-<set>-<ordinal>`)
/// and Pods; a CronJob → Job → Pod chain; a Widget naming `app`'s ConfigMap.
fn extras(sink: &mut Sink<'_>, rng: &mut Rng, ns: &str, app: &str) {
    let tls = format!("{app}-tls");
    sink.put(
        "secrets",
        ns,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": tls}, "type": "kubernetes.io/tls", "data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5"}}),
    );
    let host = format!("{app}.{ns}.example.com");
    sink.put(
        "ingresses.networking.k8s.io",
        ns,
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": app},
            "spec": {
                "ingressClassName": "nginx",
                "tls": [{"hosts": [host], "secretName": tls}],
                "rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": app, "port": {"number": 80}}}}]}}],
            },
        }),
    );

    let set = "db";
    let labels = json!({"app": set});
    sink.put(
        "services",
        ns,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": set, "labels": labels}, "spec": {"clusterIP": "None", "selector": labels, "ports": [{"name": "pg", "port": 5432}]}}),
    );
    let replicas = rng.range(1, 3);
    let claim = json!({"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
    let pod_spec = |claim_name: &str| {
        json!({
            "containers": [{"name": "postgres", "image": "postgres:16", "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}],
        })
    };
    let statefulset = sink.put(
        "statefulsets.apps",
        ns,
        json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": set, "labels": labels},
            "spec": {
                "serviceName": set,
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": {"containers": pod_spec("")["containers"]}},
                "volumeClaimTemplates": [claim],
            },
            "status": {"replicas": replicas, "readyReplicas": replicas},
        }),
    );
    for i in 0..replicas {
        let claim_name = format!("data-{set}-{i}");
        sink.put(
            "persistentvolumeclaims",
            ns,
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim_name, "labels": labels}, "spec": claim["spec"], "status": {"phase": "Bound"}}),
        );
        sink.put(
            "pods",
            ns,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{set}-{i}"), "labels": labels, "ownerReferences": controller_ref(&statefulset)},
                "spec": pod_spec(&claim_name),
                "status": {"phase": "Running"},
            }),
        );
    }

    let cron = "report";
    let job_spec = json!({"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": cron, "image": "busybox:1.36", "command": ["sh", "-c", "date"], "envFrom": [{"configMapRef": {"name": format!("{app}-config")}}]}]}}});
    let cronjob = sink.put(
        "cronjobs.batch",
        ns,
        json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": cron}, "spec": {"schedule": "0 * * * *", "jobTemplate": {"spec": job_spec}}}),
    );
    let job_name = format!("{cron}-{}", 29_000_000 + rng.range(0, 999_999));
    let job = sink.put(
        "jobs.batch",
        ns,
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job_name, "ownerReferences": controller_ref(&cronjob)}, "spec": job_spec, "status": {"succeeded": 1}}),
    );
    sink.put(
        "pods",
        ns,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("{job_name}-{}", rng.suffix(5)), "labels": {"job-name": job_name}, "ownerReferences": controller_ref(&job)},
            "spec": job_spec["template"]["spec"],
            "status": {"phase": "Succeeded"},
        }),
    );

    sink.put(
        "widgets.example.podgate.dev",
        ns,
        json!({"apiVersion": "example.podgate.dev/v1", "kind": "Widget", "metadata": {"name": format!("{app}-widget")}, "spec": {"size": rng.range(1, 9), "configMapRef": {"name": format!("{app}-config")}}}),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every object of `resource` in the cluster.
    fn all(sim: &KubeSim, resource: &str) -> Vec<Value> {
        let k = kind(resource).unwrap();
        sim.shared.lock().of(k).map(|(_, o)| o.value()).collect()
    }

    #[test]
    fn generated_clusters_are_deterministic_and_their_references_resolve() {
        let sim = KubeSim::new(10);
        let n = generate(&sim, 2000, 7);
        assert!(n >= 2000, "{n}");
        let stored: usize = [
            "namespaces",
            "secrets",
            "configmaps",
            "serviceaccounts",
            "services",
            "deployments",
            "replicasets",
            "pods",
            "persistentvolumeclaims",
            "statefulsets",
            "jobs",
            "cronjobs",
            "ingresses",
            "widgets",
        ]
        .iter()
        .map(|r| all(&sim, r).len())
        .sum();
        assert_eq!(stored, n + 2, "default and kube-system besides");

        // The same seed, the same names; another seed, others.
        let again = KubeSim::new(10);
        assert_eq!(generate(&again, 2000, 7), n);
        let names = |s: &KubeSim| -> Vec<String> {
            all(s, "pods")
                .iter()
                .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(names(&sim), names(&again));
        let other = KubeSim::new(10);
        generate(&other, 2000, 8);
        assert_ne!(names(&sim), names(&other));

        // Controller owner references point at the owner's uid.
        let owner_ok = |o: &Value, resource: &str, kind_name: &str| {
            let ns = o["metadata"]["namespace"].as_str().unwrap();
            let refs = o["metadata"]["ownerReferences"].as_array().unwrap();
            assert_eq!(refs.len(), 1);
            let r = &refs[0];
            assert_eq!(r["kind"], kind_name);
            assert_eq!(r["controller"], true);
            assert_eq!(r["blockOwnerDeletion"], true);
            let owner = sim
                .get(resource, ns, r["name"].as_str().unwrap())
                .unwrap_or_else(|| panic!("owner of {} missing", o["metadata"]["name"]));
            assert_eq!(owner["metadata"]["uid"], r["uid"]);
            assert_eq!(owner["apiVersion"], r["apiVersion"]);
            owner
        };
        let pods = all(&sim, "pods");
        assert!(pods.len() > 200);
        for rs in all(&sim, "replicasets") {
            owner_ok(&rs, "deployments", "Deployment");
        }
        let exists = |resource: &str, ns: &str, name: &Value| {
            let name = name.as_str().unwrap();
            assert!(
                sim.get(resource, ns, name).is_some(),
                "{resource} {ns}/{name} missing"
            );
        };
        let by = |pod: &&Value, owner: &str| pod["metadata"]["ownerReferences"][0]["kind"] == owner;
        assert!(
            pods.iter()
                .all(|p| by(&p, "ReplicaSet") || by(&p, "StatefulSet") || by(&p, "Job")),
            "every Pod has a controller"
        );
        for pod in pods.iter().filter(|p| by(p, "StatefulSet")) {
            owner_ok(pod, "statefulsets", "StatefulSet");
            let ns = pod["metadata"]["namespace"].as_str().unwrap();
            exists(
                "persistentvolumeclaims",
                ns,
                &pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            );
        }
        for pod in pods.iter().filter(|p| by(p, "Job")) {
            let job = owner_ok(pod, "jobs", "Job");
            owner_ok(&job, "cronjobs", "CronJob");
        }
        let statefulsets = all(&sim, "statefulsets").len();
        assert!(statefulsets > 10, "{statefulsets}");
        assert_eq!(all(&sim, "cronjobs").len(), all(&sim, "jobs").len());
        for ing in all(&sim, "ingresses") {
            let ns = ing["metadata"]["namespace"].as_str().unwrap();
            exists("secrets", ns, &ing["spec"]["tls"][0]["secretName"]);
            exists(
                "services",
                ns,
                &ing["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"],
            );
        }
        for w in all(&sim, "widgets") {
            let ns = w["metadata"]["namespace"].as_str().unwrap();
            exists("configmaps", ns, &w["spec"]["configMapRef"]["name"]);
        }
        for pod in pods.iter().filter(|p| by(p, "ReplicaSet")) {
            let rs = owner_ok(pod, "replicasets", "ReplicaSet");
            // The ReplicaSet selects its Pods.
            for (k, v) in rs["spec"]["selector"]["matchLabels"].as_object().unwrap() {
                assert_eq!(&pod["metadata"]["labels"][k], v);
            }
            let ns = pod["metadata"]["namespace"].as_str().unwrap();
            let spec = &pod["spec"];
            exists("serviceaccounts", ns, &spec["serviceAccountName"]);
            for v in spec["volumes"].as_array().unwrap() {
                if let Some(name) = v["configMap"].get("name") {
                    exists("configmaps", ns, name);
                } else {
                    exists("secrets", ns, &v["secret"]["secretName"]);
                }
            }
            let c = &spec["containers"][0];
            for e in c["env"].as_array().unwrap() {
                let from = &e["valueFrom"];
                if let Some(r) = from.get("configMapKeyRef") {
                    exists("configmaps", ns, &r["name"]);
                } else {
                    exists("secrets", ns, &from["secretKeyRef"]["name"]);
                }
            }
            for e in c["envFrom"].as_array().unwrap() {
                if let Some(r) = e.get("configMapRef") {
                    exists("configmaps", ns, &r["name"]);
                } else {
                    exists("secrets", ns, &e["secretRef"]["name"]);
                }
            }
        }
        for sa in all(&sim, "serviceaccounts") {
            let ns = sa["metadata"]["namespace"].as_str().unwrap();
            for s in sa["imagePullSecrets"].as_array().unwrap() {
                exists("secrets", ns, &s["name"]);
            }
        }
        // Every Service selects at least one Pod of its namespace.
        for svc in all(&sim, "services") {
            let ns = svc["metadata"]["namespace"].as_str().unwrap();
            let sel = svc["spec"]["selector"].as_object().unwrap();
            assert!(
                pods.iter().any(|p| p["metadata"]["namespace"] == ns
                    && sel.iter().all(|(k, v)| &p["metadata"]["labels"][k] == v)),
                "service {ns}/{} selects nothing",
                svc["metadata"]["name"]
            );
        }
    }
}

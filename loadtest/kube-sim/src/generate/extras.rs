//! The rest of a generated namespace past its apps: an Ingress, a StatefulSet with
//! bound claims, a CronJob → Job → Pod chain and a Widget.

use serde_json::json;

use super::*;

/// The rest of a namespace: an Ingress to the first app's Service with a TLS
/// Secret; a StatefulSet, its headless Service, PersistentVolumeClaims (from the
/// volume claim template, as the StatefulSet controller names them:
/// `<template>-<set>-<ordinal>`) bound to PersistentVolumes, and Pods; a CronJob →
/// Job → Pod chain; a Widget naming the first app's ConfigMap.
pub(super) fn extras(sink: &mut Sink<'_>, rng: &mut Rng, ns: &mut Namespace) {
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

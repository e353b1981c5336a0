//! One app of a generated namespace: its ConfigMap, Secret, ServiceAccount,
//! Service, and the Deployment → ReplicaSet → Pods chain whose Pods reach them.

use serde_json::json;

use super::*;

/// One app in `ns`: ConfigMap, Secret, ServiceAccount, Service, Deployment,
/// ReplicaSet and its Pods.
pub(super) fn app(sink: &mut Sink<'_>, rng: &mut Rng, ns: &mut Namespace, app: &str) {
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

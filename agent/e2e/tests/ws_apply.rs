//! The `remote_development` applier ([`KubeCluster`]) against kube-sim: a workspace's
//! `config_to_apply` stream, shaped as GitLab's Rails builds it
//! (`desired_config_generator.rb` in gitlab-org/gitlab's `ee/lib/remote_development`), applied as
//! GitLab's agentk applies it (cli-utils inventories, server-side apply as `agentk`
//! with forced conflicts, prune).

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use podgate_agentk::remote_development::apply::{KubeCluster, ObjMetadata};
use podgate_agentk::remote_development::ports::Cluster;
use podgate_testkit::kube::KubeTestServer;
use serde_json::{Value, json};

const AGENT: &str = "1";
const WS: &str = "workspace-1-1-k3x9q";
const NS: &str = "gl-rd-ns-1-1-k3x9q";

fn ws_inventory() -> String {
    format!("{WS}-workspace-inventory")
}

fn secrets_inventory() -> String {
    format!("{WS}-secrets-inventory")
}

/// What the stream holds.
#[derive(Clone, Copy)]
struct Shape {
    /// Full reconcile: the secrets inventory, the ResourceQuota and both Secrets too.
    full: bool,
    /// The Service at all.
    service: bool,
    /// The Service's (editor) port.
    port: u32,
    /// The Deployment's replicas.
    replicas: u32,
}

const FULL: Shape = Shape {
    full: true,
    service: true,
    port: 60001,
    replicas: 1,
};

fn labels() -> Value {
    json!({"agent.gitlab.com/id": AGENT})
}

fn annotations(inventory: &str) -> Value {
    json!({
        "config.k8s.io/owning-inventory": inventory,
        "workspaces.gitlab.com/host-template": format!("{{{{.port}}}}-{WS}.workspaces.localdev.me"),
        "workspaces.gitlab.com/id": "1",
        "workspaces.gitlab.com/max-resources-per-workspace-sha256": "24aefc5c4d3a9b6e1b6b3f5e2a1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c",
    })
}

fn inventory(name: &str) -> Value {
    let mut l = labels();
    l["cli-utils.sigs.k8s.io/inventory-id"] = json!(name);
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS, "labels": l, "annotations": {}}})
}

fn meta(name: &str, inventory: &str) -> Value {
    json!({"name": name, "namespace": NS, "labels": labels(), "annotations": annotations(inventory)})
}

/// The objects of one workspace's `config_to_apply`, in Rails' order.
fn objects(shape: Shape) -> Vec<Value> {
    let wi = ws_inventory();
    let si = secrets_inventory();
    let mut pod_labels = labels();
    pod_labels["workspaces.gitlab.com/id"] = json!("1");
    let mut out = vec![inventory(&wi)];
    out.push(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(WS, &wi),
        "spec": {
            "replicas": shape.replicas,
            "selector": {"matchLabels": pod_labels},
            "strategy": {"type": "Recreate"},
            "template": {
                "metadata": {"name": WS, "namespace": NS, "labels": pod_labels, "annotations": annotations(&wi)},
                "spec": {
                    "containers": [{
                        "name": "tooling-container",
                        "image": "registry.gitlab.com/gitlab-org/workspaces/gitlab-workspaces-tools:latest",
                        "imagePullPolicy": "IfNotPresent",
                        "ports": [{"containerPort": shape.port, "name": "editor-server", "protocol": "TCP"}],
                        "env": [{"name": "GL_TOOLS_DIR", "value": "/projects/.gl-tools"}],
                        "envFrom": [{"secretRef": {"name": format!("{WS}-env-var")}}],
                        "securityContext": {"allowPrivilegeEscalation": false, "privileged": false, "runAsNonRoot": true, "runAsUser": 5001},
                        "volumeMounts": [
                            {"name": "gl-workspace-data", "mountPath": "/projects"},
                            {"name": "gl-workspace-variables", "mountPath": "/.workspace-data/variables/file"}
                        ]
                    }],
                    "serviceAccountName": WS,
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 5001, "fsGroup": 0, "fsGroupChangePolicy": "OnRootMismatch"},
                    "volumes": [
                        {"name": "gl-workspace-data", "persistentVolumeClaim": {"claimName": format!("{WS}-gl-workspace-data")}},
                        {"name": "gl-workspace-variables", "projected": {"defaultMode": 508, "sources": [{"secret": {"name": format!("{WS}-file")}}]}}
                    ]
                }
            }
        },
        "status": {}
    }));
    if shape.service {
        out.push(json!({
            "apiVersion": "v1", "kind": "Service", "metadata": meta(WS, &wi),
            "spec": {
                "ports": [{"name": "editor-server", "port": shape.port, "targetPort": shape.port}],
                "selector": pod_labels
            },
            "status": {"loadBalancer": {}}
        }));
    }
    out.push(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": meta(&format!("{WS}-gl-workspace-data"), &wi),
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "15Gi"}}},
        "status": {}
    }));
    out.push(json!({
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(WS, &wi),
        "automountServiceAccountToken": false, "imagePullSecrets": []
    }));
    out.push(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta(WS, &wi),
        "spec": {
            "egress": [
                {"ports": [{"port": 53, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}],
                 "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}]},
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]}}]}
            ],
            "ingress": [{"from": [{
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gitlab-workspaces"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "gitlab-workspaces-proxy"}}
            }]}],
            "podSelector": {},
            "policyTypes": ["Ingress", "Egress"]
        }
    }));
    if shape.full {
        out.push(inventory(&si));
        out.push(json!({
            "apiVersion": "v1", "kind": "ResourceQuota", "metadata": meta(WS, &wi),
            "spec": {"hard": {"limits.cpu": "2", "limits.memory": "4Gi", "requests.cpu": "1", "requests.memory": "1Gi"}}
        }));
        out.push(json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": meta(&format!("{WS}-env-var"), &si),
            "data": {"GIT_AUTHOR_NAME": "QWRtaW5pc3RyYXRvcg==", "GITLAB_WORKFLOW_TOKEN": "Z2xwYXQtZXhhbXBsZQ=="}
        }));
        out.push(json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": meta(&format!("{WS}-file"), &si),
            "data": {"gl_token": "Z2xwYXQtZXhhbXBsZQ=="}
        }));
    }
    out
}

/// Rails' YAML stream: one `---` document per object.
fn stream(objects: &[Value]) -> String {
    objects
        .iter()
        .map(|o| format!("---\n{}", serde_yaml::to_string(o).expect("yaml")))
        .collect()
}

struct Env {
    server: KubeTestServer,
    cluster: KubeCluster,
    client: kube::Client,
}

async fn env() -> Env {
    let server = KubeTestServer::start(1000).await.expect("kube-sim");
    let client = server.client().await;
    let cluster = KubeCluster::new(client.clone());
    cluster.create_namespace(NS).await.expect("namespace");
    Env {
        server,
        cluster,
        client,
    }
}

impl Env {
    fn get(&self, resource: &str, name: &str) -> Option<Value> {
        self.server.get(resource, NS, name)
    }

    /// The objects an inventory ConfigMap lists.
    fn listed(&self, inventory: &str) -> BTreeSet<String> {
        let cm = self.get("configmaps", inventory).expect("inventory exists");
        cm["data"]
            .as_object()
            .map(|d| d.keys().cloned().collect())
            .unwrap_or_default()
    }
}

fn key(namespace: &str, name: &str, group: &str, kind: &str) -> String {
    ObjMetadata {
        namespace: namespace.into(),
        name: name.into(),
        group: group.into(),
        kind: kind.into(),
    }
    .to_string()
}

/// `manager`'s entry with `operation` in the object's managedFields.
fn managed<'a>(object: &'a Value, manager: &str, operation: &str) -> Option<&'a Value> {
    object["metadata"]["managedFields"]
        .as_array()?
        .iter()
        .find(|e| e["manager"] == manager && e["operation"] == operation)
}

#[tokio::test]
async fn a_workspace_stream_is_applied_server_side_as_agentk_with_its_inventories() {
    let env = env().await;
    // Creating an existing namespace is fine; it exists.
    env.cluster.create_namespace(NS).await.expect("again");
    assert!(env.cluster.namespace_exists(NS).await.unwrap());
    assert!(!env.cluster.namespace_exists("gl-rd-ns-none").await.unwrap());

    env.cluster
        .apply(stream(&objects(FULL)))
        .await
        .expect("applied");

    let wi = ws_inventory();
    let si = secrets_inventory();
    let applied = [
        ("deployments.apps", WS.to_owned(), &wi),
        ("services", WS.to_owned(), &wi),
        (
            "persistentvolumeclaims",
            format!("{WS}-gl-workspace-data"),
            &wi,
        ),
        ("serviceaccounts", WS.to_owned(), &wi),
        ("networkpolicies.networking.k8s.io", WS.to_owned(), &wi),
        ("resourcequotas", WS.to_owned(), &wi),
        ("secrets", format!("{WS}-env-var"), &si),
        ("secrets", format!("{WS}-file"), &si),
    ];
    for (resource, name, inv) in &applied {
        let o = env
            .get(resource, name)
            .unwrap_or_else(|| panic!("{resource} {name} exists"));
        let entry = managed(&o, "agentk", "Apply")
            .unwrap_or_else(|| panic!("{resource} {name}: no agentk Apply entry in {o}"));
        assert_eq!(entry["fieldsType"], "FieldsV1");
        assert!(
            entry["fieldsV1"]["f:metadata"]["f:labels"]["f:agent.gitlab.com/id"].is_object(),
            "{resource} {name}: agentk owns its label: {entry}"
        );
        assert_eq!(
            o["metadata"]["annotations"]["config.k8s.io/owning-inventory"],
            json!(inv),
            "{resource} {name}"
        );
        assert_eq!(o["metadata"]["labels"]["agent.gitlab.com/id"], AGENT);
    }
    let dep = env.get("deployments.apps", WS).unwrap();
    assert_eq!(dep["spec"]["replicas"], 1);
    assert_eq!(
        dep["spec"]["template"]["spec"]["containers"][0]["name"],
        "tooling-container"
    );

    // The inventories list their objects in cli-utils' format, values empty.
    assert_eq!(
        env.listed(&wi),
        BTreeSet::from([
            key(NS, WS, "apps", "Deployment"),
            key(NS, WS, "", "Service"),
            key(
                NS,
                &format!("{WS}-gl-workspace-data"),
                "",
                "PersistentVolumeClaim"
            ),
            key(NS, WS, "", "ServiceAccount"),
            key(NS, WS, "networking.k8s.io", "NetworkPolicy"),
            key(NS, WS, "", "ResourceQuota"),
        ])
    );
    assert!(env.listed(&wi).contains(&format!("{NS}_{WS}__Service")));
    assert_eq!(
        env.listed(&si),
        BTreeSet::from([
            key(NS, &format!("{WS}-env-var"), "", "Secret"),
            key(NS, &format!("{WS}-file"), "", "Secret"),
        ])
    );
    let inv = env.get("configmaps", &wi).unwrap();
    assert!(inv["data"].as_object().unwrap().values().all(|v| v == ""));
    assert_eq!(
        inv["metadata"]["labels"]["cli-utils.sigs.k8s.io/inventory-id"],
        json!(wi)
    );

    // Applying the same stream again changes nothing and succeeds.
    env.cluster
        .apply(stream(&objects(FULL)))
        .await
        .expect("re-applied");
    let again = env.get("deployments.apps", WS).unwrap();
    assert_eq!(
        again["metadata"]["uid"], dep["metadata"]["uid"],
        "not re-created"
    );
}

#[tokio::test]
async fn a_field_owned_by_another_manager_is_taken_over() {
    let env = env().await;
    env.cluster
        .apply(stream(&objects(FULL)))
        .await
        .expect("applied");
    let api: Api<Deployment> = Api::namespaced(env.client.clone(), NS);

    // Someone scales the workspace by hand: `kubectl-edit` now owns spec.replicas.
    let edit = PatchParams {
        field_manager: Some("kubectl-edit".into()),
        ..PatchParams::default()
    };
    api.patch(WS, &edit, &Patch::Merge(json!({"spec": {"replicas": 3}})))
        .await
        .expect("scaled");
    let dep = env.get("deployments.apps", WS).unwrap();
    assert_eq!(dep["spec"]["replicas"], 3);
    assert!(
        managed(&dep, "kubectl-edit", "Update").unwrap()["fieldsV1"]["f:spec"]["f:replicas"]
            .is_object()
    );
    // An apply that does not force is refused: the field is someone else's.
    let unforced = api
        .patch(
            WS,
            &PatchParams::apply("agentk"),
            &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": WS, "namespace": NS}, "spec": {"replicas": 1}})),
        )
        .await
        .expect_err("a conflict without force");
    assert!(
        matches!(&unforced, kube::Error::Api(s) if s.code == 409),
        "{unforced}"
    );

    // agentk's apply forces: the field is its again, with its value.
    env.cluster
        .apply(stream(&objects(FULL)))
        .await
        .expect("applied");
    let dep = env.get("deployments.apps", WS).unwrap();
    assert_eq!(dep["spec"]["replicas"], 1);
    let ours = managed(&dep, "agentk", "Apply").expect("agentk entry");
    assert!(
        ours["fieldsV1"]["f:spec"]["f:replicas"].is_object(),
        "{ours}"
    );
    let theirs = managed(&dep, "kubectl-edit", "Update");
    assert!(
        theirs.is_none_or(|e| e["fieldsV1"]["f:spec"]["f:replicas"].is_null()),
        "kubectl-edit no longer owns spec.replicas: {theirs:?}"
    );
}

#[tokio::test]
async fn re_applying_without_the_service_prunes_it() {
    let env = env().await;
    env.cluster
        .apply(stream(&objects(FULL)))
        .await
        .expect("applied");
    assert!(env.get("services", WS).is_some());

    let without = Shape {
        service: false,
        ..FULL
    };
    env.cluster
        .apply(stream(&objects(without)))
        .await
        .expect("applied");
    assert!(env.get("services", WS).is_none(), "the Service is pruned");
    assert!(env.get("deployments.apps", WS).is_some(), "the rest stays");
    assert!(env.get("serviceaccounts", WS).is_some());
    let listed = env.listed(&ws_inventory());
    assert!(!listed.contains(&key(NS, WS, "", "Service")), "{listed:?}");
    assert!(listed.contains(&key(NS, WS, "apps", "Deployment")));
}

#[tokio::test]
async fn a_partial_stream_without_the_secrets_inventory_keeps_the_secrets() {
    let env = env().await;
    env.cluster
        .apply(stream(&objects(FULL)))
        .await
        .expect("applied");
    // A partial reconcile for a stopped workspace (GitLab 17.11+): the workspace
    // inventory and its objects, no secrets inventory, no Secrets.
    let partial = Shape {
        full: false,
        replicas: 0,
        ..FULL
    };
    let objs = objects(partial);
    assert!(
        objs.iter()
            .all(|o| o["metadata"]["name"] != json!(secrets_inventory()) && o["kind"] != "Secret")
    );
    env.cluster.apply(stream(&objs)).await.expect("applied");
    assert_eq!(
        env.get("deployments.apps", WS).unwrap()["spec"]["replicas"],
        0
    );
    for s in [format!("{WS}-env-var"), format!("{WS}-file")] {
        assert!(env.get("secrets", &s).is_some(), "{s} survives");
    }
    assert_eq!(env.listed(&secrets_inventory()).len(), 2);
    // As in GitLab: the ResourceQuota is in the workspace inventory but sent only on
    // full reconciles (`desired_config_generator.rb`, `get_extra_k8s_resources`), so
    // a partial one prunes it; the next full brings it back.
    assert!(env.get("resourcequotas", WS).is_none());
    env.cluster
        .apply(stream(&objects(FULL)))
        .await
        .expect("applied");
    assert!(env.get("resourcequotas", WS).is_some());
}

#[tokio::test]
async fn streams_without_inventories_or_owners_are_refused_whole() {
    let env = env().await;
    let objs = objects(FULL);
    // Only the Deployment: no inventory at all.
    let err = env
        .cluster
        .apply(stream(&objs[1..2]))
        .await
        .expect_err("refused");
    assert_eq!(err, ["no inventory found"]);

    // A Service without the owning-inventory annotation.
    let mut bad = objs.clone();
    bad[2]["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove("config.k8s.io/owning-inventory");
    let err = env.cluster.apply(stream(&bad)).await.expect_err("refused");
    assert_eq!(err, ["no owning inventory found"]);
    // Nothing was written.
    assert!(env.get("configmaps", &ws_inventory()).is_none());
    assert!(env.get("deployments.apps", WS).is_none());

    // Not YAML.
    let err = env
        .cluster
        .apply("---\nkind: [unclosed\n".into())
        .await
        .expect_err("refused");
    assert_eq!(err.len(), 1);
    assert!(err[0].contains("config_to_apply"), "{err:?}");
}

#[tokio::test]
async fn an_object_the_api_refuses_is_reported_with_the_apiservers_message() {
    let env = env().await;
    let refused = Shape {
        port: 70000,
        ..FULL
    };
    let err = env
        .cluster
        .apply(stream(&objects(refused)))
        .await
        .expect_err("the Service is refused");
    assert_eq!(err.len(), 1, "{err:?}");
    assert!(
        err[0].contains(&format!(
            "Service \"{WS}\" is invalid: spec.ports[0].port: Invalid value: 70000"
        )),
        "{err:?}"
    );
    assert!(
        err[0].contains(&key(NS, WS, "", "Service")),
        "names the object: {err:?}"
    );
    // Everything else, in both inventories, was applied; the refused Service is not
    // in the inventory (it never existed).
    assert!(env.get("services", WS).is_none());
    assert!(env.get("deployments.apps", WS).is_some());
    assert!(env.get("secrets", &format!("{WS}-file")).is_some());
    assert!(
        !env.listed(&ws_inventory())
            .contains(&key(NS, WS, "", "Service"))
    );

    // Fixed on the next apply.
    env.cluster
        .apply(stream(&objects(FULL)))
        .await
        .expect("applied");
    assert!(env.get("services", WS).is_some());
}

#[tokio::test]
async fn an_object_owned_by_no_inventory_is_left_alone_and_reported() {
    let env = env().await;
    // A ServiceAccount of the workspace's name already exists, not applied by any
    // inventory: cli-utils' "must match" policy keeps agentk's hands off it.
    env.server.put(
        "serviceaccounts",
        NS,
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": WS, "namespace": NS, "labels": {"team": "a"}}}),
    );
    let err = env
        .cluster
        .apply(stream(&objects(FULL)))
        .await
        .expect_err("the ServiceAccount is skipped");
    assert_eq!(err.len(), 1, "{err:?}");
    assert!(
        err[0].contains("inventory policy prevented actuation (strategy: Apply, status: Empty, policy: MustMatch)"),
        "{err:?}"
    );
    let sa = env.get("serviceaccounts", WS).unwrap();
    assert_eq!(sa["metadata"]["labels"]["team"], "a", "untouched");
    assert!(managed(&sa, "agentk", "Apply").is_none());
    assert!(
        !env.listed(&ws_inventory())
            .contains(&key(NS, WS, "", "ServiceAccount"))
    );
    assert!(env.get("deployments.apps", WS).is_some());
}

#[tokio::test]
async fn namespaces_are_created_and_deleted_idempotently() {
    let env = env().await;
    let ns = "gl-rd-ns-1-1-other";
    assert!(!env.cluster.namespace_exists(ns).await.unwrap());
    env.cluster.create_namespace(ns).await.unwrap();
    env.cluster.create_namespace(ns).await.unwrap();
    assert!(env.cluster.namespace_exists(ns).await.unwrap());
    env.cluster.delete_namespace(ns).await.unwrap();
    // Deleting it again (terminating or gone) is fine.
    env.cluster.delete_namespace(ns).await.unwrap();
    env.cluster
        .delete_namespace("gl-rd-ns-never-there")
        .await
        .unwrap();
}

#[tokio::test]
async fn concurrent_applies_of_many_workspaces_and_of_one_all_succeed() {
    let env = env().await;
    // Twenty workspaces at once (a full reconcile applies every workspace's config
    // asynchronously), discovery not yet cached.
    let full = stream(&objects(FULL));
    let names: Vec<(String, String)> = (0..20)
        .map(|i| {
            (
                format!("workspace-1-1-w{i:02}"),
                format!("gl-rd-ns-1-1-w{i:02}"),
            )
        })
        .collect();
    for (_, ns) in &names {
        env.cluster.create_namespace(ns).await.expect("namespace");
    }
    let applies = names.iter().map(|(ws, ns)| {
        let config = full.replace(WS, ws).replace(NS, ns);
        let cluster = env.cluster.clone();
        async move { cluster.apply(config).await }
    });
    let results = futures_util::future::join_all(applies).await;
    // Discovery was asked once per API group version, not once per workspace.
    let discovery = |path: &str| {
        env.server
            .sim()
            .audit()
            .iter()
            .filter(|a| a.path == path)
            .count()
    };
    assert_eq!(discovery("/apis/apps/v1"), 1);
    assert_eq!(discovery("/api/v1"), 1);
    for (r, (ws, ns)) in results.into_iter().zip(&names) {
        r.unwrap_or_else(|e| panic!("{ws}: {e:?}"));
        assert!(env.server.get("deployments.apps", ns, ws).is_some(), "{ws}");
        assert!(
            env.server
                .get("secrets", ns, &format!("{ws}-file"))
                .is_some(),
            "{ws}"
        );
    }

    // One workspace's config applied four times at once: the inventory writes that
    // collide are retried, none fails.
    let applies = (0..4).map(|_| env.cluster.apply(full.clone()));
    for r in futures_util::future::join_all(applies).await {
        r.expect("applied");
    }
    assert_eq!(env.listed(&ws_inventory()).len(), 6);
    assert_eq!(env.listed(&secrets_inventory()).len(), 2);
}

#[tokio::test]
async fn an_unknown_kind_stops_its_inventory_before_anything_changes_and_others_still_apply() {
    let env = env().await;
    let mut objs = objects(FULL);
    objs.push(json!({"apiVersion": "example.com/v1", "kind": "Gadget",
        "metadata": meta("gadget", &ws_inventory())}));
    let err = env.cluster.apply(stream(&objs)).await.expect_err("refused");
    assert_eq!(
        err,
        [format!(
            "invalid object: \"{NS}_gadget_example.com_Gadget\": unknown resource type: \"example.com/v1, Kind=Gadget\""
        )]
    );
    // Validation failed early: nothing of the workspace inventory was written...
    assert!(env.get("configmaps", &ws_inventory()).is_none());
    assert!(env.get("deployments.apps", WS).is_none());
    // ...and the secrets inventory was applied all the same.
    assert!(env.get("secrets", &format!("{WS}-env-var")).is_some());
    assert_eq!(env.listed(&secrets_inventory()).len(), 2);
}

#[tokio::test]
async fn the_inventories_alone_prune_everything_they_listed() {
    // GitLab 2025's termination: for a workspace to terminate, Rails sends only the
    // two inventory ConfigMaps, and the apply prunes every object they tracked.
    let env = env().await;
    env.cluster
        .apply(stream(&objects(FULL)))
        .await
        .expect("applied");
    let inventories = [inventory(&ws_inventory()), inventory(&secrets_inventory())];
    env.cluster
        .apply(stream(&inventories))
        .await
        .expect("pruned");
    for (resource, name) in [
        ("deployments.apps", WS.to_owned()),
        ("services", WS.to_owned()),
        ("persistentvolumeclaims", format!("{WS}-gl-workspace-data")),
        ("serviceaccounts", WS.to_owned()),
        ("networkpolicies.networking.k8s.io", WS.to_owned()),
        ("resourcequotas", WS.to_owned()),
        ("secrets", format!("{WS}-env-var")),
        ("secrets", format!("{WS}-file")),
    ] {
        assert!(
            env.get(resource, &name).is_none(),
            "{resource} {name} pruned"
        );
    }
    assert!(env.listed(&ws_inventory()).is_empty());
    assert!(env.listed(&secrets_inventory()).is_empty());
}

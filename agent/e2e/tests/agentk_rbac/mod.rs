//! `deploy/agentk`'s RBAC against kube-sim enforcing RBAC, with agentk's
//! ServiceAccount token (a legacy token Secret):
//!
//! - the Graph API with glab's default request syncs every informer: no
//!   `INFORMER_SYNC_FAILED`, and the fixture's objects are all vertices;
//! - with a narrower role (the graph ClusterRole without `pods`, which only the
//!   graph reads), the same request warns `INFORMER_SYNC_FAILED` for v1/pods and
//!   streams the rest;
//! - the ServiceAccount may hold its Lease, and may not read what no rule grants
//!   (nodes);
//! - no more: with the shipped roles, a real agentk (in the Workspaces stack:
//!   kas, the Pod simulator as GitLab) takes a workspace through its whole
//!   lifecycle and serves the Graph API as itself, as a GitLab user and as a CI
//!   job, and its applier prunes one object of every kind; every (API group,
//!   resource, verb) a rule grants shows in kube-sim's audit of the
//!   ServiceAccount's requests ([`permissions`]), and none of them was refused.

mod permissions;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use futures_util::StreamExt as _;
use permissions::{KINDS, Permission, every_kind, granted, impersonations, permissions};
use podgate_agent::proto::kubernetes_api::{
    ImpersonationConfig, WatchGraphRequest, WatchGraphResponse, action,
};
use podgate_agentk::remote_development::apply::KubeCluster;
use podgate_agentk::remote_development::ports::Cluster as _;
use podgate_agentk::watch_graph::{Settings, watch_graph};
use podgate_loadtest::pod_sim::workspaces::{ActualState, DesiredState, WorkspaceSpec};
use podgate_testkit::kube::KubeTestServer;
use podgate_testkit::workspaces::{
    AGENTK_NAMESPACE, AGENTK_SERVICE_ACCOUNT, AGENTK_TOKEN, WorkspacesStack, install_agentk_rbac,
};
use prost::Message as _;
use serde::Deserialize as _;
use serde_json::{Value, json};

/// A client of kube-sim at `url` holding agentk's ServiceAccount token.
async fn agentk_client(url: &str) -> kube::Client {
    let kubeconfig = podgate_kube_sim::kubeconfig_with(url, Some(AGENTK_TOKEN), None);
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// `kubectl kustomize deploy/agentk`: its objects.
fn rendered() -> Vec<Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/agentk");
    let out = std::process::Command::new("kubectl")
        .args(["kustomize", dir.to_str().unwrap()])
        .output()
        .expect("kubectl is installed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_json::to_value(serde_yaml::Value::deserialize(d).unwrap()).unwrap())
        .filter(|o| !o.is_null())
        .collect()
}

/// kube-sim with the fixture, `deploy/agentk`'s ServiceAccount and RBAC (the graph
/// ClusterRole without `pods` when `narrower`), the ServiceAccount's token
/// Secret, RBAC enforced; and a client holding that token.
async fn cluster(narrower: bool) -> (KubeTestServer, kube::Client) {
    let server = KubeTestServer::start(1000).await.expect("kube-sim");
    server.put("namespaces", "", json!({"metadata": {"name": "shop"}}));
    server.put(
        "deployments",
        "shop",
        json!({"metadata": {"name": "web"}, "spec": {"replicas": 1}}),
    );
    server.put(
        "pods",
        "shop",
        json!({"metadata": {"name": "web-1"}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}),
    );
    server.put(
        "configmaps",
        "shop",
        json!({"metadata": {"name": "settings"}}),
    );
    let mut objects = rbac_objects();
    if narrower {
        let graph = objects
            .iter_mut()
            .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == "podgate-agentk-graph")
            .expect("the graph ClusterRole");
        for rule in graph["rules"].as_array_mut().unwrap() {
            if let Some(r) = rule["resources"].as_array_mut() {
                r.retain(|r| r != "pods");
            }
        }
    }
    install_agentk_rbac(&server, &objects);
    let client = agentk_client(&server.url()).await;
    (server, client)
}

/// glab's request without flags (what the web console sends too).
fn glab_default() -> Value {
    let q = |e: &str| json!({"include": {"resource_selector_expression": e}});
    json!({
        "queries": [
            q("group == '' && version == 'v1' && (resource in ['pods', 'secrets', 'configmaps', 'serviceaccounts'])"),
            q("group == 'apps' && version == 'v1' && (resource in ['deployments', 'replicasets', 'daemonsets', 'statefulsets'])"),
            q("group == 'batch' && version == 'v1' && (resource in ['jobs', 'cronjobs'])"),
            q("group == 'rbac.authorization.k8s.io' && version == 'v1' && !(resource in ['clusterrolebindings', 'clusterroles'])"),
        ],
        "namespaces": {"object_selector_expression": "name != 'kube-system'"},
    })
}

/// Run the request as agentk's ServiceAccount until 1.5 s pass with no message:
/// (resource, namespace, name) of the vertices, and (type, attributes) of the
/// warnings.
async fn graph(
    client: kube::Client,
) -> (
    BTreeSet<(String, String, String)>,
    Vec<(String, BTreeMap<String, String>)>,
) {
    graph_as(client, None).await
}

/// [`graph`], impersonating as kas asks when `impersonation` is given.
async fn graph_as(
    client: kube::Client,
    impersonation: Option<ImpersonationConfig>,
) -> (
    BTreeSet<(String, String, String)>,
    Vec<(String, BTreeMap<String, String>)>,
) {
    let payload = WatchGraphRequest {
        request_json: glab_default().to_string(),
        impersonation,
    }
    .encode_to_vec();
    let settings = Settings {
        sync_timeout: Duration::from_millis(500),
        ..Settings::default()
    };
    let mut responses = watch_graph(client, payload, settings);
    let mut vertices = BTreeSet::new();
    let mut warnings = Vec::new();
    while let Ok(Some(m)) =
        tokio::time::timeout(Duration::from_millis(1500), responses.next()).await
    {
        let r = WatchGraphResponse::decode(m.expect("not an error").as_slice()).unwrap();
        for a in r.actions {
            match a.action.unwrap() {
                action::Action::SetVertex(s) => {
                    let v = s.vertex.unwrap();
                    vertices.insert((v.resource, v.namespace, v.name));
                }
                action::Action::DeleteVertex(d) => {
                    let v = d.vertex.unwrap();
                    vertices.remove(&(v.resource, v.namespace, v.name));
                }
                _ => {}
            }
        }
        warnings.extend(
            r.warnings
                .into_iter()
                .map(|w| (w.r#type, w.attributes.into_iter().collect())),
        );
    }
    (vertices, warnings)
}

fn has(vertices: &BTreeSet<(String, String, String)>, r: &str, n: &str) -> bool {
    vertices
        .iter()
        .any(|v| v.0 == r && v.1 == "shop" && v.2 == n)
}

#[tokio::test]
async fn the_shipped_role_runs_the_default_graph_and_a_narrower_one_is_warned_about() {
    let (_server, client) = cluster(false).await;
    let (vertices, warnings) = graph(client.clone()).await;
    assert!(warnings.is_empty(), "{warnings:?}");
    for (r, n) in [
        ("deployments", "web"),
        ("pods", "web-1"),
        ("configmaps", "settings"),
    ] {
        assert!(has(&vertices, r, n), "{r}/{n}: {vertices:?}");
    }
    // The Lease of the Workspaces leader election, in agentk's namespace.
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client.clone(), "gitlab-agent");
    leases
        .create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {"name": "agentk-leader"}})).unwrap(),
        )
        .await
        .expect("the ServiceAccount may create its Lease");
    // Nothing beyond what the roles grant.
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
    let err = nodes.list(&Default::default()).await.unwrap_err();
    assert!(
        err.to_string().contains("forbidden") || err.to_string().contains("403"),
        "{err}"
    );

    let (_server, client) = cluster(true).await;
    let (vertices, warnings) = graph(client).await;
    let sync: Vec<_> = warnings
        .iter()
        .filter(|w| w.0 == "INFORMER_SYNC_FAILED")
        .collect();
    // One per namespace watched (a namespace filter watches each namespace):
    // every one but kube-system.
    assert_eq!(sync.len(), warnings.len(), "{warnings:?}");
    let namespaces: BTreeSet<&str> = sync
        .iter()
        .map(|w| {
            assert_eq!(w.1.get("r").map(String::as_str), Some("pods"), "{w:?}");
            assert_eq!(w.1.get("v").map(String::as_str), Some("v1"), "{w:?}");
            w.1["ns"].as_str()
        })
        .collect();
    assert_eq!(
        namespaces,
        BTreeSet::from(["default", "gitlab-agent", "shop"])
    );
    assert!(!has(&vertices, "pods", "web-1"), "{vertices:?}");
    assert!(
        has(&vertices, "deployments", "web"),
        "the rest still streams: {vertices:?}"
    );
}

/// `deploy/agentk`'s objects but its Deployment: what the stack installs.
fn rbac_objects() -> Vec<Value> {
    rendered()
        .into_iter()
        .filter(|o| o["kind"] != "Deployment")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_permission_the_shipped_roles_grant_is_used_and_none_is_refused() {
    let objects = rbac_objects();
    let stack = WorkspacesStack::builder()
        .rbac(objects.clone())
        .start()
        .await;
    // The impersonated users may read everything: a refusal below is then the
    // ServiceAccount's.
    stack.kube.put(
        "clusterroles",
        "",
        json!({"metadata": {"name": "test-read-all"},
               "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}]}),
    );
    stack.kube.put(
        "clusterrolebindings",
        "",
        json!({"metadata": {"name": "test-read-all"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "test-read-all"},
               "subjects": [{"kind": "Group", "name": "gitlab:user"}, {"kind": "Group", "name": "gitlab:ci_job"}]}),
    );
    let sim = stack.kube.sim().clone();
    let agentk = format!("system:serviceaccount:{AGENTK_NAMESPACE}:{AGENTK_SERVICE_ACCOUNT}");
    let mut used = BTreeSet::new();
    let mut requests = 0;
    // The stack's audit keeps every request; read what each step added.
    let mut seen = 0;
    let mut collect = |used: &mut BTreeSet<Permission>| {
        let audit = sim.audit();
        assert!(audit.len() >= seen, "the audit dropped requests");
        for e in &audit[seen..] {
            if e.requester.as_deref() != Some(agentk.as_str()) {
                continue;
            }
            assert!(e.code != 401 && e.code != 403, "refused: {e:?}");
            requests += 1;
            used.extend(permissions(e));
        }
        seen = audit.len();
    };

    // Workspaces: created and running, stopped, started, terminated.
    let ws = stack.running_workspace(WorkspaceSpec::default()).await;
    collect(&mut used);
    stack
        .set_state(ws.id, DesiredState::Stopped, ActualState::Stopped)
        .await;
    collect(&mut used);
    stack
        .set_state(ws.id, DesiredState::Running, ActualState::Running)
        .await;
    collect(&mut used);
    stack
        .set_state(ws.id, DesiredState::Terminated, ActualState::Terminated)
        .await;
    collect(&mut used);

    // The Graph API as the agent, as a GitLab user and as a CI job.
    let client = agentk_client(&stack.kube.url()).await;
    let (vertices, warnings) = graph(client.clone()).await;
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(!vertices.is_empty());
    collect(&mut used);
    for imp in impersonations() {
        let (vertices, warnings) = graph_as(client.clone(), Some(imp)).await;
        assert!(warnings.is_empty(), "{warnings:?}");
        assert!(!vertices.is_empty());
        collect(&mut used);
    }
    // Pruning, which no lifecycle above needs (GitLab's configuration of a
    // workspace keeps its objects): agentk's applier, as the ServiceAccount,
    // applies one object of every kind GitLab's configuration holds, then the
    // inventory alone.
    let applier = KubeCluster::new(client.clone());
    applier.create_namespace("prune-test").await.unwrap();
    applier.apply(every_kind("prune-test", true)).await.unwrap();
    collect(&mut used);
    for (resource, name) in KINDS {
        assert!(
            stack.kube.get(resource, "prune-test", name).is_some(),
            "{resource}/{name} applied"
        );
    }
    applier
        .apply(every_kind("prune-test", false))
        .await
        .unwrap();
    collect(&mut used);
    for (resource, name) in KINDS {
        assert!(
            stack.kube.get(resource, "prune-test", name).is_none(),
            "{resource}/{name} pruned"
        );
    }

    // agentk going away gives up its Lease.
    stack.shutdown().await;
    collect(&mut used);

    let granted = granted(&objects);
    let unused: Vec<&Permission> = granted.difference(&used).collect();
    assert!(
        unused.is_empty(),
        "granted but never used in {requests} requests: {unused:?}\nused: {used:?}"
    );
}

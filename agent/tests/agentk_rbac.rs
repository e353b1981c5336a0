//! `deploy/agentk`'s RBAC against kube-sim enforcing RBAC, with agentk's
//! ServiceAccount token (a legacy token Secret):
//!
//! - the Graph API with glab's default request syncs every informer: no
//!   `INFORMER_SYNC_FAILED`, and the fixture's objects are all vertices;
//! - with a narrower role (the graph ClusterRole without `pods`, which only the
//!   graph reads), the same request warns `INFORMER_SYNC_FAILED` for v1/pods and
//!   streams the rest;
//! - the ServiceAccount may hold its Lease, and may not read what no rule grants
//!   (nodes).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use futures_util::StreamExt as _;
use podgate_agent::agentk::watch_graph::{Settings, watch_graph};
use podgate_agent::proto::kubernetes_api::{WatchGraphRequest, WatchGraphResponse, action};
use podgate_agent::testing::kube::KubeTestServer;
use prost::Message as _;
use serde::Deserialize as _;
use serde_json::{Value, json};

const TOKEN: &str = "agentk-sa-token";

/// `kubectl kustomize deploy/agentk`: its objects.
fn rendered() -> Vec<Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/agentk");
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
    for ns in ["gitlab-agent", "shop"] {
        server.put("namespaces", "", json!({"metadata": {"name": ns}}));
    }
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
    for mut o in rendered() {
        let plural = match o["kind"].as_str().unwrap_or_else(|| panic!("no kind: {o}")) {
            "ServiceAccount" => "serviceaccounts",
            "ClusterRole" => "clusterroles",
            "ClusterRoleBinding" => "clusterrolebindings",
            "Role" => "roles",
            "RoleBinding" => "rolebindings",
            _ => continue,
        };
        if narrower && plural == "clusterroles" && o["metadata"]["name"] == "podgate-agentk-graph" {
            for rule in o["rules"].as_array_mut().unwrap() {
                if let Some(r) = rule["resources"].as_array_mut() {
                    r.retain(|r| r != "pods");
                }
            }
        }
        let ns = o["metadata"]["namespace"].as_str().unwrap_or("").to_owned();
        let stored = server.put(plural, &ns, o);
        assert_ne!(stored["kind"], "Status", "{stored}");
    }
    use base64::Engine as _;
    server.put(
        "secrets",
        "gitlab-agent",
        json!({"metadata": {"name": "podgate-agentk-token",
                            "annotations": {"kubernetes.io/service-account.name": "podgate-agentk"}},
               "type": "kubernetes.io/service-account-token",
               "data": {"token": base64::engine::general_purpose::STANDARD.encode(TOKEN)}}),
    );
    server.sim().enforce_rbac(true);
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {}\nusers:\n- name: agentk\n  user:\n    token: {TOKEN}\ncontexts:\n- name: sim\n  context:\n    cluster: sim\n    user: agentk\ncurrent-context: sim\n",
        server.url()
    );
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    (server, kube::Client::try_from(config).unwrap())
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
    let payload = WatchGraphRequest {
        request_json: glab_default().to_string(),
        impersonation: None,
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

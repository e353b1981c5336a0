//! agentk's `WatchGraph` against kube-sim, without kas: the tunnel handler is called
//! as kas would call it, and its `WatchGraphResponse` batches are applied to a graph
//! here. (The WebSocket end to end, through the proxy and kas, is
//! `tests/graph_api/` at the workspace root.)

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures_util::StreamExt as _;
use podgate_agent::proto::kubernetes_api::{WatchGraphRequest, WatchGraphResponse, action};
use podgate_agentk::Responses;
use podgate_agentk::watch_graph::{Settings, watch_graph};
use podgate_testkit::kube::KubeTestServer;
use prost::Message as _;
use serde_json::{Value, json};

type Vx = (String, String, String, String, String);

#[derive(Default, Debug)]
struct Graph {
    vertices: BTreeMap<Vx, (Vec<u8>, Vec<u8>)>,
    arcs: BTreeMap<(Vx, Vx, String), (bool, bool, bool)>,
    warnings: Vec<(String, String, BTreeMap<String, String>)>,
    messages: usize,
}

fn vx(v: Option<action::Vertex>) -> Vx {
    let v = v.expect("vertex");
    (v.group, v.version, v.resource, v.namespace, v.name)
}

impl Graph {
    fn apply(&mut self, r: WatchGraphResponse) {
        self.messages += 1;
        for a in r.actions {
            match a.action.expect("action") {
                action::Action::SetVertex(s) => {
                    self.vertices
                        .insert(vx(s.vertex), (s.object_json, s.json_path_json));
                }
                action::Action::DeleteVertex(d) => {
                    assert!(
                        self.vertices.remove(&vx(d.vertex)).is_some(),
                        "dvx of an unknown vertex"
                    );
                }
                action::Action::SetArc(s) => {
                    self.arcs.insert(
                        (vx(s.source), vx(s.destination), s.r#type),
                        (
                            s.controller,
                            s.block_owner_deletion,
                            s.destination_does_not_exist,
                        ),
                    );
                }
                action::Action::DeleteArc(d) => {
                    assert!(
                        self.arcs
                            .remove(&(vx(d.source), vx(d.destination), d.r#type))
                            .is_some(),
                        "darc of an unknown arc"
                    );
                }
            }
        }
        for w in r.warnings {
            self.warnings
                .push((w.r#type, w.message, w.attributes.into_iter().collect()));
        }
    }

    fn has(&self, r: &str, ns: &str, n: &str) -> bool {
        self.vertices
            .keys()
            .any(|k| k.2 == r && k.3 == ns && k.4 == n)
    }

    fn arc(&self, from: (&str, &str), to: (&str, &str), t: &str) -> Option<(bool, bool, bool)> {
        self.arcs
            .iter()
            .find(|((s, d, ty), _)| {
                s.2 == from.0 && s.4 == from.1 && d.2 == to.0 && d.4 == to.1 && ty == t
            })
            .map(|(_, a)| *a)
    }
}

struct Watch {
    responses: Responses,
    graph: Graph,
}

impl Watch {
    async fn start(server: &KubeTestServer, request: Value, settings: Settings) -> Watch {
        let client = server.client().await;
        let payload = WatchGraphRequest {
            request_json: request.to_string(),
            impersonation: None,
        }
        .encode_to_vec();
        let mut w = Watch {
            responses: watch_graph(client, payload, settings),
            graph: Graph::default(),
        };
        w.next().await;
        w
    }

    /// Apply the next message.
    async fn next(&mut self) {
        let m = tokio::time::timeout(Duration::from_secs(20), self.responses.next())
            .await
            .expect("a message within 20 s")
            .expect("the stream goes on")
            .expect("not an error");
        self.graph
            .apply(WatchGraphResponse::decode(m.as_slice()).expect("decodes"));
    }

    /// Apply messages until `done` holds.
    async fn until(&mut self, done: impl Fn(&Graph) -> bool) {
        while !done(&self.graph) {
            self.next().await;
        }
    }
}

fn meta(name: &str, ns: &str) -> Value {
    json!({"name": name, "namespace": ns})
}

/// Deployment web → ReplicaSet web-1 → Pod web-1-a, which mounts ConfigMap `cfg`
/// (missing at first) and Secret `tls`.
fn fixture(server: &KubeTestServer) {
    server.put(
        "namespaces",
        "",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}),
    );
    server.put(
        "deployments",
        "shop",
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": meta("web", "shop"), "spec": {"template": {"spec": {"containers": [{"name": "c",
        "envFrom": [{"configMapRef": {"name": "cfg"}}]}]}}}}),
    );
    server.put("replicasets", "shop", json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "web-1", "namespace": "shop", "ownerReferences": [{"apiVersion": "apps/v1",
        "kind": "Deployment", "name": "web", "uid": "u1", "controller": true, "blockOwnerDeletion": true}]}}));
    server.put("pods", "shop", json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-1-a", "namespace": "shop", "ownerReferences": [{"apiVersion": "apps/v1",
        "kind": "ReplicaSet", "name": "web-1", "uid": "u2", "controller": true}],
        "managedFields": [{"manager": "kubectl"}]},
        "spec": {"volumes": [{"name": "c", "configMap": {"name": "cfg"}}, {"name": "t", "secret": {"secretName": "tls"}}],
                 "containers": [{"name": "c"}]}}));
    server.put(
        "secrets",
        "shop",
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta("tls", "shop"),
        "data": {"tls.key": "c2VjcmV0"}}),
    );
}

fn core_apps() -> Value {
    json!({"queries": [
        {"include": {"resource_selector_expression": "group == '' && resource in ['pods', 'configmaps', 'secrets']"}},
        {"include": {"resource_selector_expression": "group == 'apps' && resource in ['deployments', 'replicasets']"}}
    ]})
}

#[tokio::test]
async fn initial_graph_owner_arcs_references_and_missing_destinations() {
    let server = KubeTestServer::start(1000).await.expect("kube-sim");
    fixture(&server);
    let w = Watch::start(&server, core_apps(), Settings::default()).await;
    let g = &w.graph;
    assert_eq!(g.messages, 1, "the initial graph comes as one batch");
    assert_eq!(g.vertices.len(), 4, "{:?}", g.vertices.keys());
    assert_eq!(
        g.arc(("pods", "web-1-a"), ("replicasets", "web-1"), "or"),
        Some((true, false, false))
    );
    assert_eq!(
        g.arc(("replicasets", "web-1"), ("deployments", "web"), "or"),
        Some((true, true, false))
    );
    assert_eq!(
        g.arc(("pods", "web-1-a"), ("configmaps", "cfg"), "r"),
        Some((false, false, true)),
        "e while missing"
    );
    assert_eq!(
        g.arc(("pods", "web-1-a"), ("secrets", "tls"), "r"),
        Some((false, false, false))
    );
    assert_eq!(
        g.arc(("deployments", "web"), ("configmaps", "cfg"), "t"),
        Some((false, false, true))
    );
    // Secrets carry nothing; other objects are trimmed.
    let secret = g
        .vertices
        .iter()
        .find(|(k, _)| k.2 == "secrets")
        .expect("secret")
        .1;
    assert!(secret.0.is_empty() && secret.1.is_empty());
    let pod = g
        .vertices
        .iter()
        .find(|(k, _)| k.2 == "pods")
        .expect("pod")
        .1;
    let pod: Value = serde_json::from_slice(&pod.0).expect("pod JSON");
    assert_eq!(pod["metadata"]["name"], "web-1-a");
    assert!(pod["metadata"].get("managedFields").is_none());
}

#[tokio::test]
async fn e_clears_when_the_destination_appears_and_delete_sends_dvx_and_darc() {
    let server = KubeTestServer::start(1000).await.expect("kube-sim");
    fixture(&server);
    let mut w = Watch::start(&server, core_apps(), Settings::default()).await;
    server.put(
        "configmaps",
        "shop",
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("cfg", "shop")}),
    );
    w.until(|g| {
        g.arc(("pods", "web-1-a"), ("configmaps", "cfg"), "r") == Some((false, false, false))
    })
    .await;
    assert!(w.graph.has("configmaps", "shop", "cfg"));
    assert_eq!(
        w.graph
            .arc(("deployments", "web"), ("configmaps", "cfg"), "t"),
        Some((false, false, false))
    );
    server.delete("pods", "shop", "web-1-a");
    w.until(|g| !g.has("pods", "shop", "web-1-a")).await;
    let from_pod = w
        .graph
        .arcs
        .keys()
        .filter(|(s, _, _)| s.4 == "web-1-a")
        .count();
    assert_eq!(from_pod, 0, "every arc of the deleted Pod got a darc");
}

#[tokio::test]
async fn versions_json_path_and_roots() {
    let server = KubeTestServer::start(1000).await.expect("kube-sim");
    fixture(&server);
    server.put("widgets", "", json!({"apiVersion": "example.podgate.dev/v1", "kind": "Widget", "metadata": {"name": "w1"}}));
    let request = json!({"queries": [
        {"include": {"resource_selector_expression": "group == 'example.podgate.dev'"}},
        {"include": {"resource_selector_expression": "group == 'apps'", "object": {"json_path": "{.metadata.name}"}}}
    ]});
    let w = Watch::start(&server, request, Settings::default()).await;
    let versions: BTreeSet<&str> = w
        .graph
        .vertices
        .keys()
        .filter(|k| k.2 == "widgets")
        .map(|k| k.1.as_str())
        .collect();
    assert_eq!(versions, BTreeSet::from(["v1"]), "v1 wins over v1beta1");
    let deploy = w
        .graph
        .vertices
        .iter()
        .find(|(k, _)| k.2 == "deployments")
        .expect("deployment")
        .1;
    assert!(deploy.0.is_empty());
    assert_eq!(
        serde_json::from_slice::<Value>(&deploy.1).expect("j"),
        json!(["web"])
    );

    // Roots: the Deployment alone, then with owner arcs walked both ways.
    let mut request = core_apps();
    request["roots"] =
        json!({"object_selector_expressions": ["resource == 'deployments' && name == 'web'"]});
    let w = Watch::start(&server, request.clone(), Settings::default()).await;
    let names: BTreeSet<&str> = w.graph.vertices.keys().map(|k| k.4.as_str()).collect();
    assert_eq!(names, BTreeSet::from(["web"]));
    request["roots"]["ignore_arc_direction"] = json!(["or"]);
    let w = Watch::start(&server, request, Settings::default()).await;
    let names: BTreeSet<&str> = w.graph.vertices.keys().map(|k| k.4.as_str()).collect();
    // Up the owner arcs (walked both ways) to the Pod, then forward along its `r` arc.
    assert_eq!(names, BTreeSet::from(["web", "web-1", "web-1-a", "tls"]));
}

#[tokio::test]
async fn a_denied_resource_is_warned_about_and_the_rest_streams() {
    let server = KubeTestServer::start(1000).await.expect("kube-sim");
    fixture(&server);
    server.sim().deny("apps", "deployments");
    let settings = Settings {
        sync_timeout: Duration::from_millis(500),
        ..Settings::default()
    };
    let w = Watch::start(&server, core_apps(), settings).await;
    let sync: Vec<_> = w
        .graph
        .warnings
        .iter()
        .filter(|w| w.0 == "INFORMER_SYNC_FAILED")
        .collect();
    assert_eq!(sync.len(), 1, "{:?}", w.graph.warnings);
    assert_eq!(sync[0].2.get("g").map(String::as_str), Some("apps"));
    assert_eq!(sync[0].2.get("r").map(String::as_str), Some("deployments"));
    assert!(!sync[0].2.contains_key("ns"), "cluster-wide: no ns");
    assert!(w.graph.has("pods", "shop", "web-1-a"));
    // The RS's owner arc to the unlisted Deployment: destination unknown → e.
    assert_eq!(
        w.graph
            .arc(("replicasets", "web-1"), ("deployments", "web"), "or"),
        Some((true, true, true))
    );
}

#[tokio::test]
async fn metrics_count_requests_informers_objects_and_return_to_zero_when_dropped() {
    let server = KubeTestServer::start(1000).await.expect("kube-sim");
    fixture(&server);
    let metrics = podgate_agentk::AgentkMetrics::new();
    let settings = Settings {
        metrics: Some(metrics.graph.clone()),
        ..Settings::default()
    };
    let w = Watch::start(&server, core_apps(), settings).await;
    let g = &metrics.graph;
    assert_eq!(g.requests.get(), 1);
    assert_eq!(
        g.informers.get(),
        5,
        "pods, configmaps, secrets, deployments, replicasets"
    );
    assert_eq!(g.objects.get(), 4);
    assert!(g.actions.get() >= 4 + 5, "{} actions", g.actions.get());
    let text = metrics.render();
    assert!(text.contains("podgate_agentk_graph_objects 4"), "{text}");
    drop(w);
    // The watch's task is aborted with the stream; its gauges go back.
    tokio::time::timeout(Duration::from_secs(20), async {
        while g.requests.get() != 0 || g.informers.get() != 0 || g.objects.get() != 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("gauges back to 0 once the stream is dropped");
}

//! The Graph API (`/graph` on kas's Kubernetes API proxy, GitLab's Graph API design)
//! checked from the outside: a WebSocket client of the tests' own ([`client`]) talks
//! to the real `podgate kas` and `podgate agentk` over a kube-sim ([`harness`]), and what it
//! builds is compared with a graph computed independently from the objects the
//! kube-sim holds ([`model`], written from `docs/graph-api.md`, sharing no code or
//! assumption with the server). Issue 12's acceptance list, case by case:
//!
//! - the subprotocol handshake, and its refusal without the subprotocol;
//! - 1007 closes for malformed requests, naming the field; the second-message close;
//!   a long reason sent as an `error` message before a close of at most 123 bytes;
//! - version selection; `extensions`/`events.k8s.io` and subresources never watched;
//! - owner arcs with `c`/`b`; `e` for a missing ConfigMap, cleared when it appears
//!   and set again when it goes; `dvx` and `darc` on delete;
//! - Secrets without content; `json_path` arrays; roots with and without
//!   `ignore_arc_direction`; `INFORMER_SYNC_FAILED` for a denied resource while the
//!   rest streams;
//! - the whole graph equal to the model at 5,000 generated objects, and again after
//!   a period of churn.

mod client;
mod expr;
mod harness;
mod model;
mod select;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use client::{Closed, GraphClient, SUBPROTOCOL, raw_upgrade};
use harness::{Stack, start_stack};
use model::{Attrs, Content, Expected, Vx, diff, expected_graph};

/// Long enough for a loaded machine; never a measure of speed.
const WAIT: Duration = Duration::from_secs(60);

/// A request including the resources each expression selects.
fn includes(exprs: &[&str]) -> Value {
    let queries: Vec<Value> = exprs
        .iter()
        .map(|e| json!({"include": {"resource_selector_expression": e}}))
        .collect();
    json!({ "queries": queries })
}

fn vx(g: &str, v: &str, r: &str, ns: &str, n: &str) -> Vx {
    Vx {
        g: g.into(),
        v: v.into(),
        r: r.into(),
        ns: ns.into(),
        n: n.into(),
    }
}

fn attrs(c: bool, b: bool, e: bool) -> Attrs {
    Attrs { c, b, e }
}

async fn connect(stack: &Stack, request: &Value) -> GraphClient {
    GraphClient::connect(&stack.graph_url, &stack.bearer, request)
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", stack.graph_url))
}

/// The model's graph for `request` over what the kube-sim holds now.
async fn expected(stack: &Stack, request: &Value) -> Expected {
    let (discovery, objects) = stack.cluster().await;
    expected_graph(&discovery, &objects, request)
}

/// Wait until the client's graph equals `want`; on timeout, the differences.
async fn converge(client: &GraphClient, want: &Expected, what: &str, timeout: Duration) {
    converge_unless(client, want, what, timeout, || false).await;
}

/// Wait until the client's graph equals `want` (true), or `stale()` says `want` no
/// longer describes the cluster (false); on timeout, the differences.
async fn converge_unless(
    client: &GraphClient,
    want: &Expected,
    what: &str,
    timeout: Duration,
    stale: impl Fn() -> bool,
) -> bool {
    let done = tokio::time::timeout(
        timeout,
        client.wait_until(what, timeout + Duration::from_secs(5), |s| {
            if diff(want, &s.vertices, &s.arcs).is_none() {
                Some(true)
            } else if stale() {
                Some(false)
            } else {
                None
            }
        }),
    )
    .await;
    let Ok(equal) = done else {
        let d = client.with(|s| diff(want, &s.vertices, &s.arcs));
        panic!(
            "{what}: not equal to the model after {timeout:?}:\n{}\n{}",
            d.unwrap_or_default(),
            client.with(|s| s.summary())
        );
    };
    client.with(|s| {
        assert!(
            s.anomalies.is_empty(),
            "{what}: anomalies {:?}",
            s.anomalies
        );
    });
    equal
}

/// Converge on the cluster as it is once writes stop: the model is recomputed if
/// the cluster's resourceVersion moved meanwhile (a churn step in flight when its
/// handle was dropped).
async fn converge_settled(stack: &Stack, client: &GraphClient, request: &Value, what: &str) {
    let sim = stack.kube.sim().clone();
    for _ in 0..5 {
        let rv = sim.resource_version();
        let want = expected(stack, request).await;
        if sim.resource_version() != rv {
            continue;
        }
        let s2 = sim.clone();
        if converge_unless(client, &want, what, WAIT * 2, move || {
            s2.resource_version() != rv
        })
        .await
        {
            return;
        }
    }
    panic!("{what}: the cluster kept changing after its writers stopped");
}

fn ns(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

fn config_map(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": ns}, "data": {"k": "v"}})
}

fn replica_set(ns: &str, name: &str, owner: Option<&str>) -> Value {
    let mut rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}});
    if let Some(d) = owner {
        rs["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "Deployment",
            "name": d, "uid": format!("uid-{d}"), "controller": true, "blockOwnerDeletion": true}]);
    }
    rs
}

/// A Pod owned by ReplicaSet `rs` (flags as given), mounting ConfigMap `cm`.
fn pod(ns: &str, name: &str, rs: &str, flags: bool, cm: Option<&str>) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": rs},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs,
                "uid": format!("uid-{rs}"), "controller": flags, "blockOwnerDeletion": flags}]},
        "spec": {"containers": [{"name": "c", "image": "busybox"}, {"name": "d", "image": "alpine"}]}});
    if let Some(cm) = cm {
        p["spec"]["volumes"] = json!([{"name": "cfg", "configMap": {"name": cm}}]);
    }
    p
}

fn deployment(ns: &str, name: &str, cm: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "busybox"}],
                                       "volumes": [{"name": "cfg", "configMap": {"name": cm}}]}}}})
}

// ---------------------------------------------------------------------------------------
// Handshake and request validation.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subprotocol_is_required_and_echoed() {
    let stack = start_stack(&[], None, &[]).await;
    let auth = format!("Bearer {}", stack.bearer);
    let path = stack.graph_path();

    let (status, headers) = raw_upgrade(
        stack.proxy_addr,
        &path,
        &[
            ("Authorization", &auth),
            ("Sec-WebSocket-Protocol", SUBPROTOCOL),
        ],
    )
    .await;
    assert_eq!(status, 101, "{headers:?}");
    assert_eq!(
        headers.get("sec-websocket-protocol").map(String::as_str),
        Some(SUBPROTOCOL)
    );

    for protocol in [None, Some("chat"), Some("gitlab-agent-graph-api-v2")] {
        let mut h = vec![("Authorization", auth.as_str())];
        if let Some(p) = protocol {
            h.push(("Sec-WebSocket-Protocol", p));
        }
        let (status, headers) = raw_upgrade(stack.proxy_addr, &path, &h).await;
        assert_ne!(
            status, 101,
            "subprotocol {protocol:?} accepted: {headers:?}"
        );
        assert!(
            (400..500).contains(&status),
            "subprotocol {protocol:?}: {status}"
        );
    }

    // A token GitLab does not know: refused before any upgrade (Rails answers 400
    // for an unknown PAT, which kas turns into 500 "Failed to authorize user
    // session"; docs/graph-api.md §2).
    match GraphClient::open(
        &stack.graph_url,
        &format!("pat:{}:glpat-unknown", harness::AGENT_ID),
    )
    .await
    {
        Err(client::ConnectError::Status(code, body)) => {
            assert!(
                [401, 500].contains(&code),
                "an unknown token: {code} {body}"
            );
        }
        Err(e) => panic!("an unknown token: {e}, want an HTTP refusal"),
        Ok(_) => panic!("an unknown token was upgraded"),
    }

    // The tests' client negotiates it too.
    let c = GraphClient::open(&stack.graph_url, &stack.bearer)
        .await
        .unwrap();
    assert_eq!(c.protocol.as_deref(), Some(SUBPROTOCOL));
}

/// Each malformed first message closes with 1007, and the reason (close frame or
/// `error` message) names what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_close_with_1007_naming_the_field() {
    let stack = start_stack(&[], None, &[]).await;
    let inc = |e: &str, object: Value| json!({"queries": [{"include": {"resource_selector_expression": e, "object": object}}]});
    let ok = "resource == 'pods'";
    let cases: Vec<(&str, String, &str)> = vec![
        ("not JSON", "{\"queries\": [".into(), ""),
        ("no queries", "{}".into(), "queries"),
        (
            "empty queries",
            json!({"queries": []}).to_string(),
            "queries",
        ),
        (
            "include and exclude",
            json!({"queries": [{"include": {"resource_selector_expression": ok},
                                "exclude": {"resource_selector_expression": ok}}]})
            .to_string(),
            "queries[0]",
        ),
        (
            "neither include nor exclude",
            json!({"queries": [{}]}).to_string(),
            "queries[0]",
        ),
        (
            "CEL that does not compile",
            inc("group == ", json!({})).to_string(),
            "queries[0].include.resource_selector_expression",
        ),
        (
            "CEL that is not boolean",
            inc("resource", json!({})).to_string(),
            "queries[0].include.resource_selector_expression",
        ),
        (
            "object CEL that does not compile",
            inc(
                ok,
                json!({"object_selector_expression": "obj.metadata.name =="}),
            )
            .to_string(),
            "queries[0].include.object.object_selector_expression",
        ),
        (
            "bad label selector",
            inc(ok, json!({"label_selector": "app in (a"})).to_string(),
            "queries[0].include.object.label_selector",
        ),
        (
            "bad field selector",
            inc(ok, json!({"field_selector": "metadata.name"})).to_string(),
            "queries[0].include.object.field_selector",
        ),
        (
            "bad json_path",
            inc(ok, json!({"json_path": "{.metadata.name"})).to_string(),
            "queries[0].include.object.json_path",
        ),
        (
            "a namespace name that is empty",
            json!({"queries": [{"include": {"resource_selector_expression": ok}}],
                   "namespaces": {"names": ["default", ""]}})
            .to_string(),
            "namespaces.names",
        ),
        (
            "a root expression that does not compile",
            json!({"queries": [{"include": {"resource_selector_expression": ok}}],
                   "roots": {"object_selector_expressions": ["name =="]}})
            .to_string(),
            "roots.object_selector_expressions",
        ),
        (
            "an unknown arc type to ignore",
            json!({"queries": [{"include": {"resource_selector_expression": ok}}],
                   "roots": {"object_selector_expressions": ["name == 'x'"],
                             "ignore_arc_direction": ["or", "ls"]}})
            .to_string(),
            "roots.ignore_arc_direction",
        ),
    ];
    let mut failures = Vec::new();
    for (what, text, field) in &cases {
        let c = GraphClient::open(&stack.graph_url, &stack.bearer)
            .await
            .unwrap();
        c.send_text(text).await;
        let closed = c.wait_closed(WAIT).await;
        let (reasons, actions) = c.with(|s| (s.reasons(), s.actions));
        let code_ok = matches!(closed, Closed::Frame { code: 1007, .. });
        if !code_ok || !reasons.contains(field) || actions != 0 {
            failures.push(format!(
                "{what}: closed {closed:?}, reasons {reasons:?} (want 1007 naming {field:?}), \
                 {actions} actions"
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_message_closes_the_connection() {
    let stack = start_stack(&[], None, &[]).await;
    let c = connect(&stack, &includes(&["resource == 'namespaces'"])).await;
    // The request is being served: default and kube-system arrive.
    c.wait_until("the namespaces", WAIT, |s| {
        (s.of("", "namespaces").len() >= 2).then_some(())
    })
    .await;
    c.send_text(&includes(&["resource == 'pods'"]).to_string())
        .await;
    let closed = c.wait_closed(WAIT).await;
    assert!(
        matches!(closed, Closed::Frame { code: 1008, .. }),
        "{closed:?} (want 1008 StatusPolicyViolation)"
    );
}

/// A reason too long for a close frame: first an `error` message with all of it,
/// then a close whose reason fits (≤ 123 bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_error_reason_comes_as_an_error_message_before_the_close() {
    let stack = start_stack(&[], None, &[]).await;
    let long_field = format!("unknown_{}", "x".repeat(200));
    let mut request = includes(&["resource == 'pods'"]);
    request[&long_field] = json!(1);
    let c = connect(&stack, &request).await;
    let closed = c.wait_closed(WAIT).await;
    let Closed::Frame { code, reason } = closed else {
        panic!("no close frame: {closed:?}");
    };
    assert_eq!(code, 1007);
    assert!(
        reason.len() <= 123,
        "close reason of {} bytes",
        reason.len()
    );
    let errors = c.with(|s| s.errors.clone());
    assert_eq!(errors.len(), 1, "{errors:?}");
    let e = &errors[0];
    assert_eq!(e["code"], 1007, "{e}");
    assert_eq!(e["code_string"], "StatusInvalidFramePayloadData", "{e}");
    let full = e["reason"].as_str().unwrap();
    assert!(full.contains(&long_field), "{full}");
    // The close carries the start of the same reason.
    let head = reason.trim_end_matches('…').trim_end_matches("...");
    assert!(
        !head.is_empty() && full.starts_with(head),
        "close reason {reason:?} is not the start of {full:?}"
    );
}

// ---------------------------------------------------------------------------------------
// What is watched.

/// Widgets are served as `v1` and `v1beta1`: the newest stable version is the one
/// watched; when the queries match only `v1beta1`, that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_newest_stable_version_of_a_resource_is_watched() {
    let widget = |name: &str| {
        json!({"apiVersion": "example.podgate.dev/v1beta1", "kind": "Widget",
               "metadata": {"name": name, "namespace": "default"}, "spec": {"size": 1}})
    };
    let stack = start_stack(&[widget("w1"), widget("w2")], None, &[]).await;

    let request = includes(&["group == 'example.podgate.dev'"]);
    let want = expected(&stack, &request).await;
    assert_eq!(
        want.watched
            .get(&("example.podgate.dev".into(), "widgets".into())),
        Some(&("v1".to_owned(), true))
    );
    assert_eq!(want.vertices.len(), 2);
    let c = connect(&stack, &request).await;
    converge(&c, &want, "widgets as v1", WAIT).await;
    c.with(|s| {
        assert!(
            s.vertices.keys().all(|v| v.v == "v1"),
            "{:?}",
            s.vertices.keys()
        );
    });

    let request = includes(&["group == 'example.podgate.dev' && version == 'v1beta1'"]);
    let want = expected(&stack, &request).await;
    let c = connect(&stack, &request).await;
    converge(&c, &want, "widgets as v1beta1", WAIT).await;
    c.with(|s| {
        assert_eq!(s.vertices.len(), 2);
        assert!(s.vertices.keys().all(|v| v.v == "v1beta1"));
    });
}

/// With every resource included: no `events.k8s.io` vertex, no subresource, no
/// informer warning for a subresource; the whole graph as the model says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_groups_and_subresources_are_never_watched() {
    let event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "e1", "namespace": "default"}, "reason": "Started",
        "regarding": {"kind": "Pod", "name": "p", "namespace": "default"}});
    let stack = start_stack(
        &[
            event,
            replica_set("default", "rs", None),
            pod("default", "p", "rs", true, None),
        ],
        None,
        &[],
    )
    .await;
    let request = includes(&["true"]);
    let want = expected(&stack, &request).await;
    let c = connect(&stack, &request).await;
    converge(&c, &want, "everything but events", WAIT).await;
    c.with(|s| {
        assert!(
            s.vertices
                .keys()
                .all(|v| v.g != "events.k8s.io" && v.g != "extensions")
        );
        assert!(s.vertices.keys().all(|v| !v.r.contains('/')));
        assert!(
            s.warnings.is_empty(),
            "warnings with every resource watched: {:?}",
            s.warnings
        );
    });
}

// ---------------------------------------------------------------------------------------
// Arcs.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_arcs_carry_controller_and_block_owner_deletion() {
    let stack = start_stack(
        &[
            ns("apps"),
            replica_set("apps", "rs", None),
            pod("apps", "controlled", "rs", true, None),
            pod("apps", "plain", "rs", false, None),
        ],
        None,
        &[],
    )
    .await;
    let request = includes(&["resource in ['pods', 'replicasets']"]);
    let want = expected(&stack, &request).await;
    let c = connect(&stack, &request).await;
    converge(&c, &want, "pods and their replica set", WAIT).await;
    let rs = vx("apps", "v1", "replicasets", "apps", "rs");
    c.with(|s| {
        let controlled = vx("", "v1", "pods", "apps", "controlled");
        let plain = vx("", "v1", "pods", "apps", "plain");
        assert_eq!(
            s.arcs_from(&controlled, "or"),
            [(&rs, attrs(true, true, false))]
        );
        assert_eq!(
            s.arcs_from(&plain, "or"),
            [(&rs, attrs(false, false, false))]
        );
    });
}

/// A Pod mounting a ConfigMap that does not exist: `e` on the arc; when the
/// ConfigMap is created it appears and the arc loses `e`; deleted, `e` is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e_marks_a_missing_config_map_until_it_exists() {
    let stack = start_stack(
        &[
            replica_set("default", "rs", None),
            pod("default", "p", "rs", true, Some("cm1")),
        ],
        None,
        &[],
    )
    .await;
    let request = includes(&["resource in ['pods', 'configmaps']"]);
    let c = connect(&stack, &request).await;
    let p = vx("", "v1", "pods", "default", "p");
    let cm1 = vx("", "v1", "configmaps", "default", "cm1");
    let arc = (p.clone(), cm1.clone(), "r".to_owned());
    c.wait_until("the pod → cm1 arc with e", WAIT, |s| {
        (s.arcs.get(&arc) == Some(&attrs(false, false, true))).then_some(())
    })
    .await;
    c.with(|s| assert!(!s.vertices.contains_key(&cm1)));
    converge(&c, &expected(&stack, &request).await, "before cm1", WAIT).await;

    stack.apply(config_map("default", "cm1"));
    c.wait_until("cm1 and the arc without e", WAIT, |s| {
        (s.vertices.contains_key(&cm1) && s.arcs.get(&arc) == Some(&attrs(false, false, false)))
            .then_some(())
    })
    .await;
    converge(&c, &expected(&stack, &request).await, "with cm1", WAIT).await;

    assert!(stack.kube.delete("configmaps", "default", "cm1"));
    c.wait_until("cm1 gone and e again", WAIT, |s| {
        (!s.vertices.contains_key(&cm1) && s.arcs.get(&arc) == Some(&attrs(false, false, true)))
            .then_some(())
    })
    .await;
    converge(&c, &expected(&stack, &request).await, "cm1 deleted", WAIT).await;
}

/// Deleting a watched object: `dvx` for it and `darc` for each arc it was the
/// source of (the client removes arcs only on `darc`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_an_object_sends_dvx_and_darc() {
    let stack = start_stack(
        &[
            config_map("default", "cfg"),
            replica_set("default", "rs", None),
            pod("default", "p", "rs", true, Some("cfg")),
            pod("default", "q", "rs", true, Some("cfg")),
        ],
        None,
        &[],
    )
    .await;
    let request = includes(&["resource in ['pods', 'configmaps', 'replicasets']"]);
    let c = connect(&stack, &request).await;
    let want = expected(&stack, &request).await;
    converge(&c, &want, "before the delete", WAIT).await;
    let p = vx("", "v1", "pods", "default", "p");
    c.with(|s| assert_eq!(s.arcs_from(&p, "or").len() + s.arcs_from(&p, "r").len(), 2));

    assert!(stack.kube.delete("pods", "default", "p"));
    c.wait_until("p and its arcs gone", WAIT, |s| {
        (!s.vertices.contains_key(&p) && !s.arcs.keys().any(|(src, _, _)| *src == p)).then_some(())
    })
    .await;
    converge(
        &c,
        &expected(&stack, &request).await,
        "after the delete",
        WAIT,
    )
    .await;

    // The owner goes: q's owner arc stays, with `e`.
    assert!(stack.kube.delete("replicasets.apps", "default", "rs"));
    let q = vx("", "v1", "pods", "default", "q");
    let rs = vx("apps", "v1", "replicasets", "default", "rs");
    c.wait_until("rs gone, q → rs with e", WAIT, |s| {
        (!s.vertices.contains_key(&rs)
            && s.arcs.get(&(q.clone(), rs.clone(), "or".into())) == Some(&attrs(true, true, true)))
        .then_some(())
    })
    .await;
    converge(
        &c,
        &expected(&stack, &request).await,
        "after the owner's delete",
        WAIT,
    )
    .await;
}

/// An object deleted and created again at once (as churn and controllers do): both
/// changes may land in one batch, and the client must end with the new object,
/// not the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_and_immediate_recreate_ends_with_the_new_object() {
    let stack = start_stack(
        &[
            config_map("default", "cfg"),
            replica_set("default", "rs", None),
            pod("default", "p", "rs", true, Some("cfg")),
        ],
        None,
        &[],
    )
    .await;
    let request = includes(&["resource in ['pods', 'configmaps', 'replicasets']"]);
    let c = connect(&stack, &request).await;
    converge(&c, &expected(&stack, &request).await, "before", WAIT).await;
    for round in 0..5 {
        assert!(stack.kube.delete("configmaps", "default", "cfg"));
        let mut cm = config_map("default", "cfg");
        cm["data"] = json!({"round": round.to_string()});
        stack.kube.put("configmaps", "default", cm);
        let want = expected(&stack, &request).await;
        converge(&c, &want, &format!("re-created, round {round}"), WAIT).await;
        c.with(|s| {
            let got = &s.vertices[&vx("", "v1", "configmaps", "default", "cfg")];
            assert_eq!(got.o.as_ref().unwrap()["data"]["round"], round.to_string());
        });
    }
}

// ---------------------------------------------------------------------------------------
// Contents.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_carry_content() {
    let secret = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
               "metadata": {"name": name, "namespace": "default", "labels": {"a": "b"}},
               "data": {"password": "c2VjcmV0"}, "stringData": {"x": "y"}})
    };
    let stack = start_stack(&[secret("s1"), secret("s2")], None, &[]).await;
    let whole = includes(&["resource == 'secrets'"]);
    let with_path = json!({"queries": [{"include": {"resource_selector_expression": "resource == 'secrets'",
        "object": {"json_path": "{.data}"}}}]});
    for request in [whole, with_path] {
        let want = expected(&stack, &request).await;
        assert!(want.vertices.values().all(|c| *c == Content::Empty));
        let c = connect(&stack, &request).await;
        converge(&c, &want, "secrets", WAIT).await;
        c.with(|s| {
            assert_eq!(s.vertices.len(), 2);
            for (v, p) in &s.vertices {
                let text = format!("{p:?}");
                assert!(
                    !text.contains("c2VjcmV0") && !text.contains("password"),
                    "{v}: {text}"
                );
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_path_results_are_arrays() {
    let stack = start_stack(
        &[
            config_map("default", "a"),
            config_map("default", "b"),
            replica_set("default", "rs", None),
            pod("default", "p", "rs", true, None),
        ],
        None,
        &[],
    )
    .await;
    let request = json!({"queries": [
        {"include": {"resource_selector_expression": "resource == 'configmaps'",
                     "object": {"json_path": "{.metadata.name}"}}},
        {"include": {"resource_selector_expression": "resource == 'pods'",
                     "object": {"json_path": "{.spec.containers[*].image}"}}},
        {"include": {"resource_selector_expression": "resource == 'replicasets'",
                     "object": {"json_path": "{.status.nothing}"}}},
    ]});
    let want = expected(&stack, &request).await;
    let c = connect(&stack, &request).await;
    converge(&c, &want, "json_path", WAIT).await;
    c.with(|s| {
        let a = &s.vertices[&vx("", "v1", "configmaps", "default", "a")];
        assert_eq!(
            (a.o.as_ref(), a.j.as_deref()),
            (None, Some(&[json!("a")][..]))
        );
        let p = &s.vertices[&vx("", "v1", "pods", "default", "p")];
        assert_eq!(
            p.j.as_deref(),
            Some(&[json!("busybox"), json!("alpine")][..])
        );
        let rs = &s.vertices[&vx("apps", "v1", "replicasets", "default", "rs")];
        assert!(
            rs.o.is_none() && rs.j.as_ref().is_none_or(Vec::is_empty),
            "{rs:?}"
        );
    });
}

// ---------------------------------------------------------------------------------------
// Filters.

/// Queries in order (an `exclude` before an `include` wins), both namespace modes,
/// and the object filters (label selector, field selector, CEL): each request's
/// graph as the model computes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_modes_queries_in_order_and_object_filters() {
    let labelled = |name: &str, team: &str| {
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": name, "labels": {"team": team}}})
    };
    let mut objects = vec![labelled("a", "x"), labelled("b", "x"), labelled("c", "y")];
    for n in ["a", "b", "c"] {
        objects.push(config_map(n, "cfg"));
        objects.push(replica_set(n, "rs", None));
        objects.push(pod(n, "p1", "rs", true, Some("cfg")));
        objects.push(pod(n, "p2", "rs", true, Some("gone")));
    }
    let stack = start_stack(&objects, None, &[]).await;
    let base = ["resource in ['pods', 'configmaps', 'replicasets']"];
    let with = |extra: Value| {
        let mut r = includes(&base);
        for (k, v) in extra.as_object().unwrap() {
            r[k] = v.clone();
        }
        r
    };
    let requests = [
        (
            "exclude first",
            json!({"queries": [
                {"exclude": {"resource_selector_expression": "resource == 'configmaps'"}},
                {"include": {"resource_selector_expression": "true"}}]}),
        ),
        ("names", with(json!({"namespaces": {"names": ["a", "c"]}}))),
        (
            "names and CEL",
            with(json!({"namespaces": {"names": ["a", "b", "c"],
                                        "object_selector_expression": "name != 'b'"}})),
        ),
        (
            "label selector",
            with(json!({"namespaces": {"label_selector": "team=x"}})),
        ),
        (
            "CEL over all namespaces",
            with(json!({"namespaces": {"object_selector_expression": "labels['team'] == 'y'"}})),
        ),
        (
            "object filters",
            json!({"queries": [
                {"include": {"resource_selector_expression": "resource == 'pods'",
                             "object": {"field_selector": "metadata.namespace!=b",
                                        "object_selector_expression": "name != 'p2'"}}},
                {"include": {"resource_selector_expression": "resource in ['configmaps', 'replicasets']",
                             "object": {"label_selector": "app=rs"}}}]}),
        ),
    ];
    for (what, request) in requests {
        let want = expected(&stack, &request).await;
        assert!(!want.vertices.is_empty(), "{what}: the model sees nothing");
        let c = connect(&stack, &request).await;
        converge(&c, &want, what, WAIT).await;
    }
}

// ---------------------------------------------------------------------------------------
// Roots.

/// Deployment `web` as the root: owner arcs point up (Pod → ReplicaSet →
/// Deployment), so its ReplicaSet and Pods are not reachable, until `or` arcs are
/// walked both ways. `other` is never visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roots_with_and_without_ignore_arc_direction() {
    let stack = start_stack(
        &[
            config_map("default", "web-config"),
            deployment("default", "web", "web-config"),
            replica_set("default", "web-1", Some("web")),
            pod("default", "web-1-a", "web-1", true, Some("web-config")),
            pod("default", "web-1-b", "web-1", true, Some("web-config")),
            config_map("default", "other-config"),
            deployment("default", "other", "other-config"),
            replica_set("default", "other-1", Some("other")),
            pod(
                "default",
                "other-1-a",
                "other-1",
                true,
                Some("other-config"),
            ),
        ],
        None,
        &[],
    )
    .await;
    let request = |ignore: Value| {
        let mut r = includes(&["resource in ['deployments', 'replicasets', 'pods', 'configmaps']"]);
        r["roots"] = json!({"object_selector_expressions": ["resource == 'deployments' && name == 'web'"],
                            "ignore_arc_direction": ignore});
        r
    };

    let down = request(json!([]));
    let want = expected(&stack, &down).await;
    let c = connect(&stack, &down).await;
    converge(&c, &want, "roots, arcs one way", WAIT).await;
    c.with(|s| {
        assert!(s.find("deployments", "default", "web").is_some());
        assert!(s.of("apps", "replicasets").is_empty());
        assert!(s.of("", "pods").is_empty());
        assert!(s.find("deployments", "default", "other").is_none());
    });

    let both = request(json!(["or"]));
    let want = expected(&stack, &both).await;
    let c = connect(&stack, &both).await;
    converge(&c, &want, "roots, or both ways", WAIT).await;
    c.with(|s| {
        assert!(s.find("replicasets", "default", "web-1").is_some());
        assert_eq!(s.of("", "pods").len(), 2);
        assert!(s.find("configmaps", "default", "web-config").is_some());
        assert!(s.find("deployments", "default", "other").is_none());
        assert!(s.find("pods", "default", "other-1-a").is_none());
    });

    // Visibility follows changes: a new Pod of web-1 becomes visible.
    stack.apply(pod("default", "web-1-c", "web-1", true, None));
    c.wait_until("the new pod of web", WAIT, |s| {
        s.find("pods", "default", "web-1-c").map(|_| ())
    })
    .await;
    converge(
        &c,
        &expected(&stack, &both).await,
        "roots after a new pod",
        WAIT,
    )
    .await;
}

// ---------------------------------------------------------------------------------------
// Warnings.

/// Deployments cannot be listed (403, as missing RBAC): one `INFORMER_SYNC_FAILED`
/// naming them, and Pods keep streaming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_resource_warns_and_the_rest_streams() {
    let stack = start_stack(
        &[
            deployment("default", "web", "cfg"),
            replica_set("default", "rs", None),
            pod("default", "p", "rs", true, None),
        ],
        None,
        &[("apps", "deployments")],
    )
    .await;
    let c = connect(&stack, &includes(&["resource in ['pods', 'deployments']"])).await;
    // The sync timeout is the server's (30 s, docs/graph-api.md §5); allow for it.
    let warning = c
        .wait_until("INFORMER_SYNC_FAILED", WAIT * 2, |s| {
            s.warnings
                .iter()
                .find(|w| w["t"] == "INFORMER_SYNC_FAILED")
                .cloned()
        })
        .await;
    let a = &warning["a"];
    assert_eq!(
        (&a["g"], &a["v"], &a["r"]),
        (&json!("apps"), &json!("v1"), &json!("deployments")),
        "{warning}"
    );
    assert!(
        warning["m"].as_str().is_some_and(|m| !m.is_empty()),
        "{warning}"
    );
    c.wait_until("pod p", WAIT, |s| {
        s.find("pods", "default", "p").map(|_| ())
    })
    .await;
    stack.apply(pod("default", "late", "rs", true, None));
    c.wait_until("pod late", WAIT, |s| {
        s.find("pods", "default", "late").map(|_| ())
    })
    .await;
    c.with(|s| {
        assert!(s.closed.is_none());
        assert!(s.of("apps", "deployments").is_empty());
        let sync_failed = s
            .warnings
            .iter()
            .filter(|w| w["t"] == "INFORMER_SYNC_FAILED")
            .count();
        assert_eq!(sync_failed, 1, "{:?}", s.warnings);
    });
}

// ---------------------------------------------------------------------------------------
// The whole graph.

/// Creates, updates and deletes through the kube-sim handle at a steady pace,
/// keeping references realistic: new Pods owned by existing ReplicaSets mount an
/// existing ConfigMap or (one in four) a missing one; ConfigMaps change, go and
/// come back; Deployments go (their ReplicaSets' owner arcs get `e`).
async fn churn(stack: &Stack, ops: usize, seed: u64) {
    let (_, objects) = stack.cluster().await;
    let pick = |r: &str| -> Vec<(String, String)> {
        objects
            .iter()
            .filter(|o| o.resource == r)
            .map(|o| (o.namespace.clone(), o.name.clone()))
            .collect()
    };
    let (mut pods, replica_sets, mut config_maps, mut deployments) = (
        pick("pods"),
        pick("replicasets"),
        pick("configmaps"),
        pick("deployments"),
    );
    let mut gone_config_maps: Vec<(String, String)> = Vec::new();
    let mut rng = seed;
    let mut next = move |n: usize| {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((rng >> 33) as usize) % n.max(1)
    };
    let mut tick = tokio::time::interval(Duration::from_millis(4));
    for i in 0..ops {
        tick.tick().await;
        match next(6) {
            0 if !pods.is_empty() => {
                let (ns, name) = pods.swap_remove(next(pods.len()));
                stack.kube.delete("pods", &ns, &name);
            }
            1 | 2 => {
                let (ns, rs) = replica_sets[next(replica_sets.len())].clone();
                let cm = if next(4) == 0 {
                    format!("missing-{i}")
                } else {
                    config_maps
                        .iter()
                        .find(|(n, _)| *n == ns)
                        .map_or_else(|| format!("missing-{i}"), |(_, c)| c.clone())
                };
                let name = format!("{rs}-churn{i}");
                stack
                    .kube
                    .put("pods", &ns, pod(&ns, &name, &rs, true, Some(&cm)));
                pods.push((ns, name));
            }
            3 if !config_maps.is_empty() => {
                let (ns, name) = config_maps[next(config_maps.len())].clone();
                let mut cm = config_map(&ns, &name);
                cm["data"]["rev"] = json!(i.to_string());
                stack.kube.put("configmaps", &ns, cm);
            }
            4 if !config_maps.is_empty() => {
                let (ns, name) = config_maps.swap_remove(next(config_maps.len()));
                stack.kube.delete("configmaps", &ns, &name);
                gone_config_maps.push((ns, name));
            }
            4 | 5 if !gone_config_maps.is_empty() => {
                let (ns, name) = gone_config_maps.swap_remove(next(gone_config_maps.len()));
                stack.kube.put("configmaps", &ns, config_map(&ns, &name));
                config_maps.push((ns, name));
            }
            5 if !deployments.is_empty() && next(3) == 0 => {
                let (ns, name) = deployments.swap_remove(next(deployments.len()));
                stack.kube.delete("deployments.apps", &ns, &name);
            }
            _ => {}
        }
    }
}

/// 5,000 generated objects, every resource included: the client's graph equals the
/// model's; then after churn (stopped), again. Timings and sizes are printed, not
/// asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_graph_equals_the_model_at_5000_objects_and_after_churn() {
    let stack = start_stack(&[], Some((5_000, 12)), &[]).await;
    let request = includes(&["true"]);
    let want = expected(&stack, &request).await;
    assert!(want.vertices.len() >= 5_000, "{}", want.vertices.len());
    eprintln!("the model's arcs at 5,000 objects:");
    for (kind, n) in model::census(&want) {
        eprintln!("  {kind}: {n}");
    }
    let asked = Instant::now();
    let c = connect(&stack, &request).await;
    converge(&c, &want, "the initial graph", WAIT * 2).await;
    let (messages, bytes, largest) = c.with(|s| (s.messages, s.bytes, s.largest));
    eprintln!(
        "initial graph: {} vertices, {} arcs in {} ms; {messages} messages, {bytes} bytes, \
         largest {largest}",
        want.vertices.len(),
        want.arcs.len(),
        asked.elapsed().as_millis()
    );

    // kube-sim's churn (scaling, new Pods mounting missing ConfigMaps, updates,
    // deletes) until the client has seen 2,000 actions from it; then stopped.
    let before = c.with(|s| s.actions);
    let churn_handle = stack.kube.sim().start_churn(200.0, 99);
    c.wait_until("actions from kube-sim's churn", WAIT, |s| {
        (s.actions > before + 2_000).then_some(())
    })
    .await;
    let stats = churn_handle.stats();
    drop(churn_handle);
    converge_settled(&stack, &c, &request, "the graph after kube-sim's churn").await;
    eprintln!(
        "after kube-sim's churn ({stats:?}): {}",
        c.with(|s| s.summary())
    );

    // The tests' own churn, which also deletes owners: ends when it returns.
    let before = c.with(|s| s.actions);
    churn(&stack, 1_000, 7).await;
    c.wait_until("actions from the tests' churn", WAIT, |s| {
        (s.actions > before).then_some(())
    })
    .await;
    converge_settled(&stack, &c, &request, "the graph after the tests' churn").await;
    c.with(|s| {
        assert!(
            s.largest <= client::MAX_MESSAGE,
            "a message of {} bytes",
            s.largest
        );
        assert!(s.closed.is_none());
        eprintln!("after the tests' churn: {}", s.summary());
    });
}

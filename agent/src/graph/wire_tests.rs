//! Tests of `graph::wire`: the design document's literal examples parse and print back the same,
//! omissions, and the proto → JSON encoding.

use super::*;
use serde_json::json;

/// Parse `text` as `T`, print it, and compare with the text as JSON.
fn round_trip<T: serde::de::DeserializeOwned + Serialize>(text: &str) -> T {
    let parsed: T = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let printed = serde_json::to_string(&parsed).unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&printed).unwrap(),
        serde_json::from_str::<Value>(text).unwrap(),
        "{printed}"
    );
    parsed
}

fn vx(g: &str, r: &str, ns: &str, n: &str) -> Vertex {
    Vertex {
        g: g.into(),
        v: "v1".into(),
        r: r.into(),
        ns: ns.into(),
        n: n.into(),
    }
}

#[test]
fn design_document_examples_round_trip() {
    let m: Message = round_trip(
        r#"{"error": {"code": 1007, "code_string": "StatusInvalidFramePayloadData", "reason": "error description"}}"#,
    );
    assert_eq!(m.error, Some(ErrorInfo::new(1007, "error description")));
    assert!(m.actions.is_empty() && m.warnings.is_empty());

    let w: Warning = round_trip(
        r#"{"t": "INFORMER_SYNC_FAILED",
            "m": "Failed to sync informer for apps/v1/deployments in myns in 30 seconds. Check agent's log, agent's permissions",
            "a": {"g": "apps", "v": "v1", "r": "deployments", "ns": "myns"}}"#,
    );
    assert_eq!(w.a["ns"], "myns");

    // The design document's `svx` example shows both `o` and `j` only to list them.
    let a: Action = round_trip(
        r#"{"svx": {"vx": {"g": "apps", "v": "v1", "r": "deployments", "ns": "myns", "n": "my_deployment"}, "o": {}, "j": []}}"#,
    );
    let Action::Svx { vx: v, o, j } = &a else {
        panic!("{a:?}")
    };
    assert_eq!(v, &vx("apps", "deployments", "myns", "my_deployment"));
    assert_eq!(o.as_ref().unwrap().to_value(), json!({}));
    assert_eq!(j.as_deref(), Some(&[][..]));

    let a: Action = round_trip(
        r#"{"dvx": {"vx": {"g": "apps", "v": "v1", "r": "deployments", "ns": "myns", "n": "my_deployment"}}}"#,
    );
    assert!(matches!(a, Action::Dvx { .. }));

    let a: Action = round_trip(
        r#"{"sarc": {"s": {"g": "", "v": "v1", "r": "pods", "ns": "myns", "n": "pod1"},
                     "d": {"g": "apps", "v": "v1", "r": "deployments", "ns": "myns", "n": "my_deployment"},
                     "t": "or", "a": {"c": true}}}"#,
    );
    assert_eq!(
        a,
        Action::Sarc {
            s: vx("", "pods", "myns", "pod1"),
            d: vx("apps", "deployments", "myns", "my_deployment"),
            t: "or".into(),
            a: Some(ArcAttrs {
                c: true,
                b: false,
                e: false
            }),
        }
    );

    let a: Action = round_trip(
        r#"{"darc": {"s": {"g": "", "v": "v1", "r": "pods", "ns": "myns", "n": "pod1"},
                     "d": {"g": "apps", "v": "v1", "r": "deployments", "ns": "myns", "n": "my_deployment"},
                     "t": "or"}}"#,
    );
    assert!(matches!(a, Action::Darc { .. }));

    let m: Message = round_trip(
        r#"{"actions": [{"dvx": {"vx": {"g": "", "v": "v1", "r": "nodes", "n": "n1"}}}],
            "warnings": [{"t": "INTERNAL_ERROR", "m": "x"}, {"t": "DISCOVERY_FAILED", "m": "y"}]}"#,
    );
    assert_eq!(m.warnings.len(), 2);
}

#[test]
fn omissions() {
    assert_eq!(serde_json::to_string(&Message::default()).unwrap(), "{}");
    let m = Message {
        actions: vec![
            Action::Svx {
                vx: vx("", "nodes", "", "n1"),
                o: None,
                j: None,
            },
            Action::Svx {
                vx: vx("", "secrets", "ns", "s"),
                o: None,
                j: Some(vec![json!("x")]),
            },
            Action::Sarc {
                s: vx("", "pods", "ns", "p"),
                d: vx("", "configmaps", "ns", "cm"),
                t: "r".into(),
                a: Some(ArcAttrs::default()),
            },
            Action::Sarc {
                s: vx("", "pods", "ns", "p"),
                d: vx("", "configmaps", "ns", "cm"),
                t: "r".into(),
                a: None,
            },
            Action::Sarc {
                s: vx("", "pods", "ns", "p"),
                d: vx("apps", "replicasets", "ns", "rs"),
                t: "or".into(),
                a: Some(ArcAttrs {
                    c: false,
                    b: true,
                    e: true,
                }),
            },
        ],
        warnings: vec![Warning {
            t: "DISCOVERY_FAILED".into(),
            m: "m".into(),
            a: BTreeMap::new(),
        }],
        error: None,
    };
    assert_eq!(
        serde_json::to_string(&m).unwrap(),
        concat!(
            r#"{"actions":["#,
            r#"{"svx":{"vx":{"g":"","v":"v1","r":"nodes","n":"n1"}}},"#,
            r#"{"svx":{"vx":{"g":"","v":"v1","r":"secrets","ns":"ns","n":"s"},"j":["x"]}},"#,
            r#"{"sarc":{"s":{"g":"","v":"v1","r":"pods","ns":"ns","n":"p"},"d":{"g":"","v":"v1","r":"configmaps","ns":"ns","n":"cm"},"t":"r"}},"#,
            r#"{"sarc":{"s":{"g":"","v":"v1","r":"pods","ns":"ns","n":"p"},"d":{"g":"","v":"v1","r":"configmaps","ns":"ns","n":"cm"},"t":"r"}},"#,
            r#"{"sarc":{"s":{"g":"","v":"v1","r":"pods","ns":"ns","n":"p"},"d":{"g":"apps","v":"v1","r":"replicasets","ns":"ns","n":"rs"},"t":"or","a":{"b":true,"e":true}}}"#,
            r#"],"warnings":[{"t":"DISCOVERY_FAILED","m":"m"}]}"#
        )
    );
    // A vertex without `g` (glab declares it omitempty) reads as the core group.
    let v: Vertex = serde_json::from_str(r#"{"v":"v1","r":"pods","n":"p"}"#).unwrap();
    assert_eq!(v, vx("", "pods", "", "p"));
}

fn pb_vertex(g: &str, r: &str, ns: &str, n: &str) -> Option<pb::action::Vertex> {
    Some(pb::action::Vertex {
        group: g.into(),
        version: "v1".into(),
        resource: r.into(),
        namespace: ns.into(),
        name: n.into(),
    })
}

fn pb_action(a: PbAction) -> pb::Action {
    pb::Action { action: Some(a) }
}

#[test]
fn encode_response_copies_objects_raw() {
    // Key order and number spelling as agentk wrote them survive.
    let object = br#"{"kind":"Pod","apiVersion":"v1","spec":{"n":1.50}}"#;
    let r = pb::WatchGraphResponse {
        actions: vec![
            pb_action(PbAction::SetVertex(pb::action::SetVertex {
                vertex: pb_vertex("", "pods", "ns", "p"),
                object_json: object.to_vec(),
                json_path_json: Vec::new(),
            })),
            pb_action(PbAction::SetVertex(pb::action::SetVertex {
                vertex: pb_vertex("", "secrets", "ns", "s"),
                object_json: Vec::new(),
                json_path_json: Vec::new(),
            })),
            pb_action(PbAction::SetVertex(pb::action::SetVertex {
                vertex: pb_vertex("apps", "deployments", "ns", "d"),
                object_json: Vec::new(),
                json_path_json: br#"["d",3]"#.to_vec(),
            })),
            pb_action(PbAction::SetArc(pb::action::SetArc {
                source: pb_vertex("", "pods", "ns", "p"),
                destination: pb_vertex("apps", "replicasets", "ns", "rs"),
                r#type: "or".into(),
                controller: true,
                block_owner_deletion: true,
                destination_does_not_exist: false,
            })),
            pb_action(PbAction::SetArc(pb::action::SetArc {
                source: pb_vertex("", "pods", "ns", "p"),
                destination: pb_vertex("", "nodes", "", "node1"),
                r#type: "r".into(),
                ..Default::default()
            })),
            pb_action(PbAction::DeleteArc(pb::action::DeleteArc {
                source: pb_vertex("", "pods", "ns", "p"),
                destination: pb_vertex("", "nodes", "", "node1"),
                r#type: "r".into(),
            })),
            pb_action(PbAction::DeleteVertex(pb::action::DeleteVertex {
                vertex: pb_vertex("", "pods", "ns", "p"),
            })),
        ],
        warnings: vec![pb::Warning {
            r#type: "INFORMER_SYNC_FAILED".into(),
            message: "Failed to sync".into(),
            attributes: [("g", "apps"), ("v", "v1"), ("r", "deployments")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        }],
    };
    let text = encode_response(&r).unwrap();
    assert_eq!(
        text,
        concat!(
            r#"{"actions":["#,
            r#"{"svx":{"vx":{"g":"","v":"v1","r":"pods","ns":"ns","n":"p"},"o":{"kind":"Pod","apiVersion":"v1","spec":{"n":1.50}}}},"#,
            r#"{"svx":{"vx":{"g":"","v":"v1","r":"secrets","ns":"ns","n":"s"}}},"#,
            r#"{"svx":{"vx":{"g":"apps","v":"v1","r":"deployments","ns":"ns","n":"d"},"j":["d",3]}},"#,
            r#"{"sarc":{"s":{"g":"","v":"v1","r":"pods","ns":"ns","n":"p"},"d":{"g":"apps","v":"v1","r":"replicasets","ns":"ns","n":"rs"},"t":"or","a":{"c":true,"b":true}}},"#,
            r#"{"sarc":{"s":{"g":"","v":"v1","r":"pods","ns":"ns","n":"p"},"d":{"g":"","v":"v1","r":"nodes","n":"node1"},"t":"r"}},"#,
            r#"{"darc":{"s":{"g":"","v":"v1","r":"pods","ns":"ns","n":"p"},"d":{"g":"","v":"v1","r":"nodes","n":"node1"},"t":"r"}},"#,
            r#"{"dvx":{"vx":{"g":"","v":"v1","r":"pods","ns":"ns","n":"p"}}}"#,
            r#"],"warnings":[{"t":"INFORMER_SYNC_FAILED","m":"Failed to sync","a":{"g":"apps","r":"deployments","v":"v1"}}]}"#
        )
    );
    // The client reads it back with the same types.
    let m: Message = serde_json::from_str(&text).unwrap();
    assert_eq!(m.actions.len(), 7);
    let Action::Svx { o: Some(o), .. } = &m.actions[0] else {
        panic!()
    };
    assert_eq!(o.get(), std::str::from_utf8(object).unwrap());
    assert_eq!(
        encode_response(&pb::WatchGraphResponse::default()).unwrap(),
        "{}"
    );
}

#[test]
fn encode_response_refuses_malformed_actions() {
    let set_vertex = |o: &[u8], j: &[u8], vertex| pb::WatchGraphResponse {
        actions: vec![
            pb_action(PbAction::DeleteVertex(pb::action::DeleteVertex {
                vertex: pb_vertex("", "pods", "ns", "p"),
            })),
            pb_action(PbAction::SetVertex(pb::action::SetVertex {
                vertex,
                object_json: o.to_vec(),
                json_path_json: j.to_vec(),
            })),
        ],
        warnings: Vec::new(),
    };
    let v = || pb_vertex("", "pods", "ns", "p");
    for (r, want) in [
        (
            set_vertex(b"{", b"", v()),
            "actions[1]: object_json is not JSON",
        ),
        (
            set_vertex(b"{} {}", b"", v()),
            "actions[1]: object_json is not JSON",
        ),
        (
            set_vertex(b"\xff", b"", v()),
            "actions[1]: object_json is not UTF-8",
        ),
        (
            set_vertex(b"", b"{}", v()),
            "actions[1]: json_path_json is not a JSON array",
        ),
        (
            set_vertex(b"{}", b"[]", v()),
            "actions[1]: both object_json and json_path_json set",
        ),
        (set_vertex(b"{}", b"", None), "actions[1]: vertex missing"),
        (
            pb::WatchGraphResponse {
                actions: vec![pb::Action { action: None }],
                warnings: vec![],
            },
            "actions[0]: no action set",
        ),
    ] {
        let err = encode_response(&r).unwrap_err();
        assert!(err.starts_with(want), "{err:?} should start with {want:?}");
    }
}

#[test]
fn close_codes() {
    for (code, name) in [
        (1000, "StatusNormalClosure"),
        (1001, "StatusGoingAway"),
        (1002, "StatusProtocolError"),
        (1003, "StatusUnsupportedData"),
        (1007, "StatusInvalidFramePayloadData"),
        (1008, "StatusPolicyViolation"),
        (1009, "StatusMessageTooBig"),
        (1011, "StatusInternalError"),
        (1012, "StatusServiceRestart"),
        (1013, "StatusTryAgainLater"),
    ] {
        assert_eq!(close_code_name(code), name);
        assert_eq!(close_code_string(code), name);
    }
    assert_eq!(close_code_name(4000), "StatusUnknown");
    assert_eq!(close_code_string(4000), "StatusCode(4000)");
    assert_eq!(
        serde_json::to_string(&Message {
            error: Some(ErrorInfo::new(1011, "boom")),
            ..Default::default()
        })
        .unwrap(),
        r#"{"error":{"code":1011,"code_string":"StatusInternalError","reason":"boom"}}"#
    );
}

#[test]
fn raw_json() {
    let r = RawJson::from_value(&json!({"a": [1, "x"]}));
    assert_eq!(r.get(), r#"{"a":[1,"x"]}"#);
    assert_eq!(r, RawJson::from_string(r#"{"a":[1,"x"]}"#.into()).unwrap());
    assert_ne!(r, RawJson::from_string(r#"{"a": [1,"x"]}"#.into()).unwrap());
    assert!(RawJson::from_string("nope".into()).is_err());
}

#[test]
fn close_reasons_fit_a_control_frame() {
    assert_eq!(truncate_close_reason("short"), "short");
    let long = "x".repeat(200);
    assert_eq!(truncate_close_reason(&long).len(), 123);
    // Never inside a character: 41 three-byte characters are 123 bytes, 42 are 126.
    let wide = "€".repeat(42);
    assert_eq!(truncate_close_reason(&wide), "€".repeat(41));
    let off = format!("a{}", "€".repeat(41));
    assert_eq!(truncate_close_reason(&off), format!("a{}", "€".repeat(40)));
}

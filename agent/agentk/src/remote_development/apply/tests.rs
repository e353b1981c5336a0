//! Unit tests of the apply module: inventory keys, kind order, decoding, grouping.

use serde_json::json;

use super::decode::{decode, group_by_inventory};
use super::*;

#[test]
fn inventory_keys_are_cli_utils_obj_metadata() {
    let dep = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "ws-1", "namespace": "gl-rd-ns-1"}});
    let id = ObjMetadata::of(&dep);
    assert_eq!(id.to_string(), "gl-rd-ns-1_ws-1_apps_Deployment");
    assert_eq!(
        ObjMetadata::parse("gl-rd-ns-1_ws-1_apps_Deployment").unwrap(),
        id
    );
    let svc = ObjMetadata::parse("ns_ws-1__Service").unwrap();
    assert_eq!((svc.group.as_str(), svc.kind.as_str()), ("", "Service"));
    let role = ObjMetadata {
        namespace: String::new(),
        name: "system:agentk".into(),
        group: "rbac.authorization.k8s.io".into(),
        kind: "ClusterRole".into(),
    };
    assert_eq!(
        role.to_string(),
        "_system__agentk_rbac.authorization.k8s.io_ClusterRole"
    );
    assert_eq!(ObjMetadata::parse(&role.to_string()).unwrap(), role);
    assert!(ObjMetadata::parse("nounderscores").is_err());
    assert!(
        ObjMetadata::parse("ns_a_b_c_Kind").is_err(),
        "too many fields"
    );
}

#[test]
fn objects_are_applied_in_cli_utils_kind_order() {
    let ids: Vec<ObjMetadata> = [
        ("apps", "Deployment"),
        ("networking.k8s.io", "NetworkPolicy"),
        ("", "PersistentVolumeClaim"),
        ("", "Service"),
        ("", "Secret"),
        ("", "ServiceAccount"),
        ("", "ResourceQuota"),
        ("", "ConfigMap"),
    ]
    .into_iter()
    .map(|(g, k)| ObjMetadata {
        namespace: "ns".into(),
        name: "x".into(),
        group: g.into(),
        kind: k.into(),
    })
    .collect();
    let mut sorted = ids.clone();
    sorted.sort_by(|a, b| a.apply_order(b));
    let kinds: Vec<&str> = sorted.iter().map(|i| i.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "ResourceQuota",
            "ServiceAccount",
            "ConfigMap",
            "Secret",
            "Service",
            "Deployment",
            "PersistentVolumeClaim",
            "NetworkPolicy"
        ]
    );
}

#[test]
fn decoding_skips_empty_documents_and_flattens_lists() {
    let objs = decode(
        "---\n# only a comment\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: a}\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: b}\n",
    )
    .unwrap();
    let names: Vec<&str> = objs
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert!(decode("").unwrap().is_empty());
    let e = decode("apiVersion: v1\nmetadata: {name: a}\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("Object 'Kind' is missing"), "{e}");
    let e = decode("a: [1\n").unwrap_err().to_string();
    assert!(
        e.starts_with("error decoding config_to_apply document 1"),
        "{e}"
    );
}

#[test]
fn grouping_follows_agentk() {
    let inv = |n: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": n, "namespace": "ns", "labels": {INVENTORY_LABEL: n}}})
    };
    let owned = |n: &str, owner: Option<&str>| {
        let mut o = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": n, "namespace": "ns"}});
        if let Some(owner) = owner {
            o["metadata"]["annotations"] = json!({OWNING_INVENTORY: owner});
        }
        o
    };
    let e = group_by_inventory(vec![owned("s", Some("i"))])
        .err()
        .unwrap();
    assert_eq!(e.to_string(), "no inventory found");
    let e = group_by_inventory(vec![inv("i"), owned("s", None)])
        .err()
        .unwrap();
    assert_eq!(e.to_string(), "no owning inventory found");
    let e = group_by_inventory(vec![inv("i"), owned("s", Some("j"))])
        .err()
        .unwrap();
    assert!(
        e.to_string().starts_with("no owning inventory found"),
        "{e}"
    );
    let g = group_by_inventory(vec![
        owned("a", Some("j")),
        inv("i"),
        inv("j"),
        owned("b", Some("i")),
    ])
    .unwrap();
    assert_eq!(g.len(), 2);
    assert_eq!(g[0].inventory["metadata"]["name"], "i");
    assert_eq!(g[0].objects[0]["metadata"]["name"], "b");
    assert_eq!(g[1].objects[0]["metadata"]["name"], "a");
}

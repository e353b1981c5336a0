//! Tests of field ownership: managed fields recorded on writes, server-side apply and its conflicts.

use super::*;

fn writer<'a>(manager: &'a str, now: &'a str) -> Writer<'a> {
    Writer {
        manager,
        api_version: "apps/v1",
        status: false,
        now,
    }
}

fn managers(o: &Value) -> Vec<(String, String)> {
    entries(o)
        .iter()
        .map(|e| (e.manager.clone(), e.operation.clone()))
        .collect()
}

const DEPLOY: &str = r#"{"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {"replicas": 1, "template": {"spec": {"containers": [
            {"name": "web", "image": "nginx:1", "ports": [{"containerPort": 80}]}]}}}}"#;

#[test]
fn fields_v1_is_spelled_as_the_apiserver_spells_it() {
    let o: Value = serde_json::from_str(DEPLOY).unwrap();
    let set: BTreeSet<Path> = fields(&o, Scope::Main).into_keys().collect();
    let v1 = to_fields_v1(&set);
    assert_eq!(
        v1,
        json!({
            "f:metadata": {"f:labels": {"f:app": {}}},
            "f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"web\"}": {".": {}, "f:image": {}, "f:name": {}, "f:ports": {
                    "k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}}
                }}
            }}}}
        })
    );
    assert_eq!(from_fields_v1(&v1), set);
    let image: Path = [
        "f:spec",
        "f:template",
        "f:spec",
        "f:containers",
        "k:{\"name\":\"web\"}",
        "f:image",
    ]
    .map(String::from)
    .to_vec();
    assert_eq!(
        path_string(&image),
        ".spec.template.spec.containers[name=\"web\"].image"
    );
}

#[test]
fn apply_conflicts_with_another_manager_unless_forced() {
    let config: Value = serde_json::from_str(DEPLOY).unwrap();
    let t1 = "2026-01-01T00:00:01Z";
    let created = apply(None, &config, &writer("agentk", t1), false).unwrap();
    assert_eq!(managers(&created), [("agentk".into(), "Apply".into())]);
    assert_eq!(
        created["metadata"]["managedFields"][0]["fieldsType"],
        "FieldsV1"
    );
    assert_eq!(created["metadata"]["managedFields"][0]["time"], t1);

    // kubectl scale: an Update that takes .spec.replicas.
    let mut scaled = created.clone();
    scaled["spec"]["replicas"] = json!(3);
    record_update(Some(&created), &mut scaled, &writer("kubectl", t1));
    assert_eq!(
        managers(&scaled),
        [
            ("agentk".into(), "Apply".into()),
            ("kubectl".into(), "Update".into())
        ]
    );

    // The same value again: shared, no conflict.
    let mut same = config.clone();
    same["spec"]["replicas"] = json!(3);
    assert!(apply(Some(&scaled), &same, &writer("agentk", t1), false).is_ok());

    // A different value: 409, worded as kube-apiserver.
    let e = apply(Some(&scaled), &config, &writer("agentk", t1), false).unwrap_err();
    assert_eq!(e["code"], 409);
    assert_eq!(e["reason"], "Conflict");
    assert_eq!(
        e["message"],
        "Apply failed with 1 conflict: conflict with \"kubectl\" using apps/v1: .spec.replicas"
    );
    assert_eq!(e["details"]["causes"][0]["field"], ".spec.replicas");

    // Forced: the field moves; kubectl's entry, now empty, goes.
    let forced = apply(Some(&scaled), &config, &writer("agentk", t1), true).unwrap();
    assert_eq!(forced["spec"]["replicas"], 1);
    assert_eq!(managers(&forced), [("agentk".into(), "Apply".into())]);
}

#[test]
fn fields_a_manager_stops_applying_are_removed_unless_owned_by_another() {
    let config: Value = serde_json::from_str(DEPLOY).unwrap();
    let t = "2026-01-01T00:00:01Z";
    let o = apply(None, &config, &writer("agentk", t), false).unwrap();
    // Another manager adds a label.
    let mut labelled = o.clone();
    labelled["metadata"]["labels"]["team"] = json!("a");
    record_update(Some(&o), &mut labelled, &writer("kubectl-label", t));
    // agentk now applies without labels and without the container port.
    let mut less = config.clone();
    less["metadata"].as_object_mut().unwrap().remove("labels");
    less["spec"]["template"]["spec"]["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("ports");
    let after = apply(Some(&labelled), &less, &writer("agentk", t), false).unwrap();
    assert_eq!(after["metadata"]["labels"], json!({"team": "a"}));
    assert!(
        after["spec"]["template"]["spec"]["containers"][0]["ports"]
            .as_array()
            .is_none_or(|p| p.is_empty())
    );
    assert_eq!(
        after["spec"]["template"]["spec"]["containers"][0]["image"],
        "nginx:1"
    );
}

#[test]
fn multiple_conflicts_are_grouped_by_manager() {
    let s = conflict_status(vec![
        ("\"b\"".into(), vec!["f:spec".into(), "f:x".into()]),
        ("\"a\" using v1".into(), vec!["f:data".into(), "f:k".into()]),
        ("\"a\" using v1".into(), vec!["f:data".into(), "f:j".into()]),
    ]);
    assert_eq!(
        s["message"],
        "Apply failed with 3 conflicts: conflicts with \"a\" using v1:\n- .data.j\n- .data.k\nconflicts with \"b\":\n- .spec.x"
    );
}

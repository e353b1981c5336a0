//! Tests of `graph::request`: one test per validation rule (`validate`), each
//! failing if its rule were removed, and what a valid request compiles to.

use super::*;
use serde_json::{Value, json};

use crate::graph::cel::Scope;

/// A valid request with one query, as glab sends it by default (trimmed).
fn valid() -> Value {
    json!({
        "queries": [
            {"exclude": {"resource_selector_expression": "group == 'events.k8s.io'"}},
            {"include": {"resource_selector_expression": "group == 'apps' && resource == 'deployments'",
                         "object": {"label_selector": "app=web", "field_selector": "metadata.name!=x",
                                    "object_selector_expression": "obj.status.ready == 'true'",
                                    "json_path": "{.metadata.name}"}}}
        ],
        "namespaces": {"object_selector_expression": "name != 'kube-system'"},
        "roots": {"object_selector_expressions": ["resource == 'deployments' && name == 'web'"],
                  "ignore_arc_direction": ["or", "t"]}
    })
}

/// Apply `edit` to the valid request and return the field paths of the errors.
fn fields_of(edit: impl FnOnce(&mut Value)) -> Vec<String> {
    let mut v = valid();
    edit(&mut v);
    match compile(&v.to_string()) {
        Ok(_) => Vec::new(),
        Err(e) => e.errors().iter().map(|e| e.field.clone()).collect(),
    }
}

fn message(json: &str) -> String {
    compile(json).expect_err(json).to_string()
}

#[test]
fn a_valid_request_compiles() {
    let c = compile(&valid().to_string()).unwrap();
    assert_eq!(c.queries.len(), 2);
    assert!(
        matches!(&c.queries[0], CompiledQuery::Exclude { resource } if resource.source() == "group == 'events.k8s.io'")
    );
    let CompiledQuery::Include {
        resource,
        label_selector,
        field_selector,
        object,
        json_path,
    } = &c.queries[1]
    else {
        panic!("include expected");
    };
    assert_eq!(resource.scope(), Scope::Resource);
    assert_eq!(label_selector, "app=web");
    assert_eq!(field_selector, "metadata.name!=x");
    assert_eq!(
        object.as_ref().unwrap().source(),
        "obj.status.ready == 'true'"
    );
    assert_eq!(
        json_path
            .as_ref()
            .unwrap()
            .eval(&json!({"metadata": {"name": "web"}})),
        vec![json!("web")]
    );
    assert!(c.namespaces.names.is_empty());
    assert!(c.namespaces.object.is_some());
    assert!(!c.namespaces.is_unfiltered());
    let roots = c.roots.unwrap();
    assert_eq!(roots.exprs.len(), 1);
    assert_eq!(
        roots.ignore_arc_direction,
        [ArcType::OwnerReference, ArcType::Transitive]
    );
}

#[test]
fn minimal_request_and_defaults() {
    let c =
        compile(r#"{"queries":[{"include":{"resource_selector_expression":"true"}}]}"#).unwrap();
    assert!(c.namespaces.is_unfiltered());
    assert!(c.roots.is_none());
    assert!(matches!(
        &c.queries[0],
        CompiledQuery::Include {
            object: None,
            json_path: None,
            ..
        }
    ));
    // Roots with no expressions: no root filtering (GitLab's design document: "Empty or
    // not specified"; docs/graph-api.md §7).
    let c = compile(r#"{"queries":[{"include":{"resource_selector_expression":"true"}}],"roots":{"object_selector_expressions":[]}}"#).unwrap();
    assert!(c.roots.is_none());
    // Names mode with CEL on top.
    let c = compile(r#"{"queries":[{"include":{"resource_selector_expression":"true"}}],"namespaces":{"names":["a","b-2"],"object_selector_expression":"name != 'a'"}}"#).unwrap();
    assert_eq!(c.namespaces.names, ["a", "b-2"]);
    assert!(c.namespaces.object.is_some());
}

/// The design document's example request sends `names` together with `label_selector`,
/// which rule 8 refuses (docs/graph-api.md §3: names mode takes names and CEL only).
/// Without the label selector it compiles, `namespace` in its root expression included.
#[test]
fn the_design_documents_example_request() {
    let mut example = json!({
      "queries": [
        {"exclude": {"resource_selector_expression": "group == 'apps' && resource == 'pods'"}},
        {"include": {"resource_selector_expression": "group == 'apps' && version == 'v1' && resource == 'deployments'",
            "object": {"label_selector": "app=my-app", "field_selector": "",
                       "object_selector_expression": "obj.status.ready == 'true'", "json_path": ""}}}
      ],
      "namespaces": {"names": ["my-ns"], "label_selector": "app=my-app", "field_selector": "", "object_selector_expression": ""},
      "roots": {
        "object_selector_expressions": [
          "group == 'apps' && resource == 'deployments' && namespace == 'myns' && name == 'my-deployment' && 'app' in labels"
        ],
        "ignore_arc_direction": ["or", "r", "t"]
      }
    });
    let err = compile(&example.to_string()).unwrap_err();
    assert_eq!(err.errors().len(), 1, "{err}");
    assert_eq!(err.errors()[0].field, "namespaces.label_selector");
    example["namespaces"]["label_selector"] = json!("");
    let c = compile(&example.to_string()).unwrap();
    let root = &c.roots.unwrap().exprs[0];
    let dep =
        json!({"metadata": {"name": "my-deployment", "namespace": "myns", "labels": {"app": "x"}}});
    let vars = crate::graph::cel::ObjectVars {
        obj: &dep,
        group: "apps",
        version: "v1",
        resource: "deployments",
        namespace: "myns",
        name: "my-deployment",
    };
    assert_eq!(root.eval_object(&vars), Ok(true));
}

#[test]
fn rule_1_json_shape() {
    assert!(message("{").starts_with("request: invalid JSON"));
    assert!(message("").starts_with("request: invalid JSON"));
    assert_eq!(
        message("[]"),
        "request: must be a JSON object, not an array"
    );
    assert!(message(r#"{"queries":null}"#).starts_with("queries: invalid type: null"));
    assert_eq!(
        fields_of(|v| v["queries"][1]["include"] = json!(["true"])),
        ["queries[1].include"]
    );
    assert_eq!(
        fields_of(|v| v["queries"][1]["include"]["object"] = json!([])),
        ["queries[1].include.object"]
    );
    assert_eq!(fields_of(|v| v["queries"][0] = json!([{}])), ["queries[0]"]);
    assert_eq!(fields_of(|v| v["roots"] = json!([["true"]])), ["roots"]);
    let m = message(r#"{"queries":[],"extra":1}"#);
    assert!(
        m.starts_with("request: ") && m.contains("unknown field `extra`"),
        "{m}"
    );
    let m = message(r#"{"queries":"x"}"#);
    assert!(m.starts_with("queries: "), "{m}");
    assert_eq!(
        fields_of(|v| v["queries"][1]["include"]["foo"] = json!(1)),
        ["queries[1].include"]
    );
    assert_eq!(
        fields_of(|v| v["queries"][1]["include"]["object"]["jsonpath"] = json!("")),
        ["queries[1].include.object"]
    );
    assert_eq!(
        fields_of(|v| v["queries"][0]["exclude"]["object"] = json!({})),
        ["queries[0].exclude"]
    );
    assert_eq!(
        fields_of(|v| v["queries"][0]["both"] = json!({})),
        ["queries[0]"]
    );
    assert_eq!(
        fields_of(|v| v["namespaces"]["name"] = json!(["a"])),
        ["namespaces"]
    );
    assert_eq!(
        fields_of(|v| v["roots"]["ignore_arc_direction"] = json!("or")),
        ["roots"]
    );
    assert_eq!(
        fields_of(|v| v["queries"][1]["include"]["resource_selector_expression"] = json!(true)),
        ["queries[1].include"]
    );
}

#[test]
fn rule_2_queries_required() {
    for json in [r#"{}"#, r#"{"queries":[]}"#] {
        let m = message(json);
        assert!(m.starts_with("queries: required"), "{json}: {m}");
    }
}

#[test]
fn rule_3_exactly_one_of_include_exclude() {
    assert_eq!(
        fields_of(|v| v["queries"][1]["exclude"] = json!({"resource_selector_expression": "true"})),
        ["queries[1]"]
    );
    assert_eq!(fields_of(|v| v["queries"][0] = json!({})), ["queries[0]"]);
    let m = message(r#"{"queries":[{}]}"#);
    assert!(
        m.contains("exactly one of include, exclude (has neither)"),
        "{m}"
    );
}

#[test]
fn rule_4_resource_expression() {
    let f = "queries[1].include.resource_selector_expression";
    for bad in ["", "group ==", "resource", "obj.kind == 'x'", "1 + 1"] {
        assert_eq!(
            fields_of(|v| v["queries"][1]["include"]["resource_selector_expression"] = json!(bad)),
            [f],
            "{bad:?}"
        );
    }
    // Missing altogether is empty.
    assert_eq!(fields_of(|v| v["queries"][1]["include"] = json!({})), [f]);
    assert_eq!(
        fields_of(|v| v["queries"][0]["exclude"]["resource_selector_expression"] = json!("")),
        ["queries[0].exclude.resource_selector_expression"]
    );
    let m = message(r#"{"queries":[{"include":{"resource_selector_expression":"resource"}}]}"#);
    assert!(m.contains("must evaluate to a boolean"), "{m}");
}

#[test]
fn rule_5_object_namespace_and_root_expressions() {
    assert_eq!(
        fields_of(
            |v| v["queries"][1]["include"]["object"]["object_selector_expression"] = json!("obj.")
        ),
        ["queries[1].include.object.object_selector_expression"]
    );
    assert_eq!(
        fields_of(
            |v| v["queries"][1]["include"]["object"]["object_selector_expression"] =
                json!("namespaced")
        ),
        ["queries[1].include.object.object_selector_expression"]
    );
    assert_eq!(
        fields_of(|v| v["namespaces"]["object_selector_expression"] = json!("name")),
        ["namespaces.object_selector_expression"]
    );
    assert_eq!(
        fields_of(|v| v["roots"]["object_selector_expressions"] = json!(["true", "labels"])),
        ["roots.object_selector_expressions[1]"]
    );
}

#[test]
fn rule_6_selectors() {
    assert_eq!(
        fields_of(|v| v["queries"][1]["include"]["object"]["label_selector"] = json!("app in ()")),
        ["queries[1].include.object.label_selector"]
    );
    assert_eq!(
        fields_of(
            |v| v["queries"][1]["include"]["object"]["field_selector"] = json!("metadata.name")
        ),
        ["queries[1].include.object.field_selector"]
    );
    assert_eq!(
        fields_of(|v| v["namespaces"]["label_selector"] = json!("a b")),
        ["namespaces.label_selector"]
    );
    assert_eq!(
        fields_of(|v| v["namespaces"]["field_selector"] = json!("=x")),
        ["namespaces.field_selector"]
    );
}

#[test]
fn rule_7_json_path() {
    for bad in ["{.metadata.name", "{range .a[*]}", "{end}", "{.a[}"] {
        assert_eq!(
            fields_of(|v| v["queries"][1]["include"]["object"]["json_path"] = json!(bad)),
            ["queries[1].include.object.json_path"],
            "{bad}"
        );
    }
}

#[test]
fn rule_8_namespace_names() {
    assert_eq!(
        fields_of(|v| v["namespaces"]["names"] = json!(["a", ""])),
        ["namespaces.names[1]"]
    );
    assert_eq!(
        fields_of(|v| v["namespaces"]["names"] = json!(["Not_A_Name"])),
        ["namespaces.names[0]"]
    );
    assert_eq!(
        fields_of(|v| {
            v["namespaces"]["names"] = json!(["a"]);
            v["namespaces"]["label_selector"] = json!("x=y");
        }),
        ["namespaces.label_selector"]
    );
    assert_eq!(
        fields_of(|v| {
            v["namespaces"]["names"] = json!(["a"]);
            v["namespaces"]["field_selector"] = json!("metadata.name=a");
        }),
        ["namespaces.field_selector"]
    );
    // Without names the selectors are fine.
    assert!(fields_of(|v| v["namespaces"]["label_selector"] = json!("x=y")).is_empty());
}

#[test]
fn rule_9_empty_root_expression() {
    assert_eq!(
        fields_of(|v| v["roots"]["object_selector_expressions"] = json!(["true", ""])),
        ["roots.object_selector_expressions[1]"]
    );
    let m = message(
        r#"{"queries":[{"include":{"resource_selector_expression":"true"}}],"roots":{"object_selector_expressions":[""]}}"#,
    );
    assert!(
        m.contains("roots.object_selector_expressions[0]: expression is empty"),
        "{m}"
    );
}

#[test]
fn rule_10_ignore_arc_direction() {
    assert_eq!(
        fields_of(|v| v["roots"]["ignore_arc_direction"] = json!(["or", "ls"])),
        ["roots.ignore_arc_direction[1]"]
    );
    assert_eq!(
        fields_of(|v| v["roots"]["ignore_arc_direction"] = json!(["r", "t", "r"])),
        ["roots.ignore_arc_direction[2]"]
    );
    assert!(fields_of(|v| v["roots"]["ignore_arc_direction"] = json!(["or", "r", "t"])).is_empty());
}

#[test]
fn every_problem_is_reported_in_document_order() {
    let err = compile(
        r#"{"queries":[{}, {"include":{"resource_selector_expression":"resource","object":{"json_path":"{"}}}],
            "namespaces":{"names":[""]},
            "roots":{"object_selector_expressions":[""],"ignore_arc_direction":["x"]}}"#,
    )
    .unwrap_err();
    let fields: Vec<_> = err.errors().iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "queries[0]",
            "queries[1].include.resource_selector_expression",
            "queries[1].include.object.json_path",
            "namespaces.names[0]",
            "roots.object_selector_expressions[0]",
            "roots.ignore_arc_direction[0]",
        ]
    );
    assert!(
        err.to_string()
            .starts_with("queries[0]: must have exactly one of include, exclude")
    );
}

#[test]
fn serialises_like_glab() {
    // glab omits empty fields except roots.object_selector_expressions.
    let req = GraphRequest {
        queries: vec![Query {
            include: Some(Include {
                resource_selector_expression: "true".into(),
                object: None,
            }),
            exclude: None,
        }],
        namespaces: Some(Namespaces {
            object_selector_expression: "name != 'kube-system'".into(),
            ..Default::default()
        }),
        roots: Some(Roots::default()),
    };
    let text = serde_json::to_string(&req).unwrap();
    assert_eq!(
        text,
        r#"{"queries":[{"include":{"resource_selector_expression":"true"}}],"namespaces":{"object_selector_expression":"name != 'kube-system'"},"roots":{"object_selector_expressions":[]}}"#
    );
    assert_eq!(parse(&text).unwrap(), req);
}

#[test]
fn arc_types() {
    for t in [
        ArcType::OwnerReference,
        ArcType::Reference,
        ArcType::Transitive,
    ] {
        assert_eq!(ArcType::parse(t.as_str()), Some(t));
        assert_eq!(t.to_string(), t.as_str());
    }
    assert_eq!(ArcType::parse("ls"), None);
}

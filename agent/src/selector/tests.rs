//! Tests of `crate::selector`.

use super::*;
use serde_json::{Value, json};

fn lbl(sel: &str, labels: &Value) -> bool {
    LabelSelector::parse(sel)
        .unwrap()
        .matches(|k| labels.get(k).and_then(Value::as_str))
}

#[test]
fn label_selectors_parse_and_match() {
    let labels = json!({"app": "web", "tier": "front", "env": "prod", "replicas": "3"});
    for (sel, want) in [
        ("", true),
        ("app=web", true),
        ("app==web,tier=front", true),
        ("app!=web", false),
        ("app!=api", true),
        ("missing!=x", true),
        ("env in (prod, staging)", true),
        ("env in (dev)", false),
        ("env notin (prod)", false),
        ("missing notin (prod)", true),
        ("missing in (prod)", false),
        ("tier", true),
        ("!tier", false),
        ("!missing,app in (web),env notin (dev,qa)", true),
        ("missing", false),
        ("replicas>2", true),
        ("replicas<3", false),
        ("app>2", false),
        ("app=", false),
        ("example.com/team=x", false),
        (" app = web , tier ", true),
    ] {
        assert_eq!(lbl(sel, &labels), want, "{sel}");
    }
    assert_eq!(
        LabelSelector::parse("a in (x,y),!b").unwrap().requirements,
        vec![
            Requirement::In("a".into(), vec!["x".into(), "y".into()]),
            Requirement::NotExists("b".into())
        ]
    );
}

#[test]
fn malformed_label_selectors_are_refused() {
    for sel in [
        "a b",
        "a=b c",
        "a in ()",
        "a in (b",
        "a in b",
        "a=b,",
        ",a",
        "=b",
        "!",
        "a=(b)",
        "a>x",
        "-a=b",
        "a=b-",
        "Example.com/a=b",
        "/a",
        "a/",
        &format!("{}=b", "k".repeat(64)),
        &format!("a={}", "v".repeat(64)),
        "a=b=c",
    ] {
        let err = LabelSelector::parse(sel).expect_err(sel);
        assert!(matches!(err, SelectorError::Label(_)), "{sel}: {err}");
    }
    // What kube-apiserver accepts at the edges.
    // What kube-apiserver accepts at the edges: an empty value after `=`, `==`, `!=`.
    for sel in ["a==", "a=", "a!=", "example.com/app=web_1.x", "k in (a,b)"] {
        assert!(LabelSelector::parse(sel).is_ok(), "{sel}");
    }
}

#[test]
fn field_selectors_parse_and_match() {
    let pod = json!({"metadata": {"name": "p,1", "namespace": "default"}, "status": {"phase": "Running"}});
    let field = |f: &str| {
        pod.pointer(&format!("/{}", f.replace('.', "/")))
            .and_then(Value::as_str)
    };
    let m = |s: &str| FieldSelector::parse(s).unwrap().matches(field);
    assert!(m(""));
    assert!(m(r"metadata.name=p\,1,status.phase!=Pending"));
    assert!(m(r"metadata.name==p\,1"));
    assert!(!m("status.phase=Pending"));
    assert!(m("spec.nodeName="));
    assert!(!m("spec.nodeName!="));
    assert_eq!(
        FieldSelector::parse(r"a!=b\=c\\").unwrap().requirements,
        vec![FieldRequirement {
            field: "a".into(),
            value: r"b=c\".into(),
            negate: true
        }]
    );
    for bad in ["a", "=b", "a=b=c", r"a=b\x", r"a=b\", "a,b=c"] {
        let err = FieldSelector::parse(bad).expect_err(bad);
        assert!(matches!(err, SelectorError::Field(_)), "{bad}: {err}");
    }
}

#[test]
fn kube_sim_entry_points() {
    let labels = json!({"app": "web"});
    let reqs = parse_selector("app=web").unwrap();
    assert!(labels_match(&reqs, |k| labels
        .get(k)
        .and_then(Value::as_str)));
    assert!(
        parse_selector("a b")
            .unwrap_err()
            .contains("unable to parse")
    );
}

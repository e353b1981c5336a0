//! Tests of `graph::cel`: what compiling refuses, what evaluation yields.

use super::*;
use crate::graph::cel_syntax::escape_namespace;
use serde_json::json;

fn pod() -> Json {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-1", "namespace": "shop",
            "labels": {"app": "web", "tier": "front"},
            "annotations": {"my-annotation": "x"},
            "finalizers": ["a", "b"]},
        "spec": {"replicas": 3, "ratio": 0.5, "big": 18446744073709551615u64,
            "containers": [{"name": "web", "image": "nginx:1.27"}, {"name": "side", "image": "busybox"}],
            "nodeName": null},
        "status": {"phase": "Running", "ready": "true"}
    })
}

fn obj_vars(obj: &Json) -> ObjectVars<'_> {
    ObjectVars {
        obj,
        group: "",
        version: "v1",
        resource: "pods",
        namespace: "shop",
        name: "web-1",
    }
}

fn eval(src: &str, obj: &Json) -> Result<bool, String> {
    Expr::compile(src)
        .unwrap_or_else(|e| panic!("{src}: {e}"))
        .eval_object(&obj_vars(obj))
}

const DEPLOYMENTS: ResourceVars<'static> = ResourceVars {
    group: "apps",
    version: "v1",
    resource: "deployments",
    namespaced: true,
};

#[test]
fn resource_expressions_as_glab_sends_them() {
    let nodes = ResourceVars {
        group: "",
        version: "v1",
        resource: "nodes",
        namespaced: false,
    };
    for (src, on_deployments, on_nodes) in [
        ("resource in ['pods','configmaps']", false, false),
        ("!(resource in ['pods','configmaps'])", true, true),
        (
            "group == 'apps' && version == 'v1' && resource == 'deployments'",
            true,
            false,
        ),
        (r#"group == "" && resource == "nodes""#, false, true),
        ("namespaced", true, false),
        ("!namespaced || group.startsWith('ap')", true, true),
        ("version.matches('^v[0-9]+$')", true, true),
        ("resource.endsWith('s') && size(resource) > 5", true, false),
    ] {
        let e = Expr::compile_resource(src).unwrap_or_else(|e| panic!("{src}: {e}"));
        assert_eq!(e.eval_resource(&DEPLOYMENTS), Ok(on_deployments), "{src}");
        assert_eq!(e.eval_resource(&nodes), Ok(on_nodes), "{src}");
        assert_eq!(e.source(), src);
        assert_eq!(e.scope(), Scope::Resource);
    }
}

#[test]
fn object_expressions() {
    let p = pod();
    for (src, want) in [
        ("name != 'kube-system'", true),
        ("\"my-annotation\" in annotations", true),
        (
            "'app' in labels && labels['app'] == 'web' && labels.app == 'web'",
            true,
        ),
        ("'missing' in labels", false),
        ("group == '' && version == 'v1' && resource == 'pods'", true),
        ("namespace == 'shop' && name == 'web-1'", true),
        ("obj.metadata.namespace == namespace", true),
        ("obj.status.ready == 'true'", true),
        ("obj.status.phase != 'Running'", false),
        ("has(obj.status) && !has(obj.status.reason)", true),
        ("has(obj.spec.nodeName) && obj.spec.nodeName == null", true),
        (
            "obj.spec.replicas == 3 && obj.spec.replicas > 2 && obj.spec.ratio < 1.0",
            true,
        ),
        ("obj.spec.big == 18446744073709551615u", true),
        (
            "obj.spec.containers.exists(c, c.image.startsWith('nginx'))",
            true,
        ),
        ("obj.spec.containers.all(c, c.name != '')", true),
        ("obj.spec.containers.exists_one(c, c.name == 'side')", true),
        (
            "obj.spec.containers.map(c, c.name) == ['web', 'side']",
            true,
        ),
        (
            "obj.spec.containers.filter(c, c.name == 'web').size() == 1",
            true,
        ),
        (
            "size(obj.spec.containers) == 2 && obj.spec.containers[1].name == 'side'",
            true,
        ),
        (
            "'a' in obj.metadata.finalizers && !('z' in obj.metadata.finalizers)",
            true,
        ),
        ("obj.metadata.finalizers == ['a', 'b']", true),
        (
            "obj.metadata.labels == {'app': 'web', 'tier': 'front'}",
            true,
        ),
        ("labels.all(k, k in ['app', 'tier'])", true),
        ("labels.exists(k, labels[k] == 'front')", true),
        ("obj.kind in ['Pod', 'Deployment']", true),
        ("type(obj) == map && type(obj.spec.replicas) == int", true),
        // Extension libraries.
        (
            "name.upperAscii() == 'WEB-1' && name.split('-')[1] == '1'",
            true,
        ),
        (
            "obj.spec.containers.map(c, c.name).join(',') == 'web,side'",
            true,
        ),
        ("math.greatest(obj.spec.replicas, 7) == 7", true),
        // `namespace` is reserved in CEL: in strings and as a field it stays as written.
        (
            "'namespace' != namespace && obj.metadata.namespace == 'shop'",
            true,
        ),
        (
            "obj['metadata']['namespace'] == \"shop\" // namespace comment",
            true,
        ),
    ] {
        assert_eq!(eval(src, &p), Ok(want), "{src}");
    }
}

#[test]
fn missing_labels_and_annotations_are_empty_maps() {
    let bare = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}});
    assert_eq!(
        eval("size(labels) == 0 && size(annotations) == 0", &bare),
        Ok(true)
    );
    assert_eq!(eval("'app' in labels", &bare), Ok(false));
    let odd = json!({"metadata": {"labels": "not-a-map"}});
    assert_eq!(eval("size(labels) == 0", &odd), Ok(true));
}

#[test]
fn runtime_errors_are_errors_not_matches() {
    let bare = json!({"metadata": {"name": "x"}});
    let err = eval("obj.status.ready == 'true'", &bare).unwrap_err();
    assert!(err.contains("status"), "{err}");
    assert!(eval("obj.spec.containers[5].name == 'x'", &pod()).is_err());
    assert!(eval("obj.spec.replicas / 0 == 1", &pod()).is_err());
    // A non-bool result on a real object (the sample lacks the key, so it compiled).
    let e = Expr::compile("obj.status.phase").unwrap();
    let err = e.eval_object(&obj_vars(&pod())).unwrap_err();
    assert!(err.contains("must evaluate to a boolean"), "{err}");
}

#[test]
fn compile_refuses() {
    for (src, scope, want) in [
        ("", Scope::Object, "empty"),
        ("   ", Scope::Resource, "empty"),
        ("group ==", Scope::Resource, "does not parse"),
        ("resource in [", Scope::Resource, "does not parse"),
        ("foo == 1", Scope::Resource, "undeclared reference to 'foo'"),
        (
            "obj.kind == 'Pod'",
            Scope::Resource,
            "undeclared reference to 'obj'",
        ),
        (
            "'a' in labels",
            Scope::Resource,
            "undeclared reference to 'labels'",
        ),
        (
            "namespaced",
            Scope::Object,
            "undeclared reference to 'namespaced'",
        ),
        (
            "namespace == 'x'",
            Scope::Resource,
            "undeclared reference to 'namespace'",
        ),
        ("resource", Scope::Resource, "must evaluate to a boolean"),
        ("name", Scope::Object, "must evaluate to a boolean"),
        ("labels", Scope::Object, "must evaluate to a boolean"),
        ("obj.metadata", Scope::Object, "must evaluate to a boolean"),
        ("1 + 2", Scope::Resource, "must evaluate to a boolean"),
        ("'text'", Scope::Resource, "must evaluate to a boolean"),
        ("[true]", Scope::Resource, "must evaluate to a boolean"),
        ("{'a': true}", Scope::Object, "must evaluate to a boolean"),
        ("size(labels)", Scope::Object, "must evaluate to a boolean"),
        (
            "resource == 'x' ? 1 : 2",
            Scope::Resource,
            "must evaluate to a boolean",
        ),
        (
            "nosuchfn(resource)",
            Scope::Resource,
            "undeclared reference to 'nosuchfn'",
        ),
    ] {
        let err = Expr::compile_in(src, scope).expect_err(src);
        assert!(
            err.contains(want),
            "{src:?}: {err:?} does not contain {want:?}"
        );
    }
}

#[test]
fn compile_accepts_what_may_work_on_real_objects() {
    for src in [
        "obj.status.ready == 'true'",
        "obj.spec.template.spec.containers.exists(c, c.name == 'x')",
        "true",
        "labels.all(k, k.startsWith('app'))",
        "[1, 2].map(x, x * 2).exists(y, y == 4)",
        "obj.spec.replicas > 1 || false",
    ] {
        Expr::compile(src).unwrap_or_else(|e| panic!("{src}: {e}"));
    }
    // A variable bound by a macro is not a free reference; outside it, it is.
    assert!(Expr::compile("labels.all(x, x != '') && x == 'a'").is_err());
}

#[test]
fn namespace_escaping_leaves_strings_fields_and_comments_alone() {
    for (src, want) in [
        ("namespace == 'x'", "__namespace__ == 'x'"),
        ("obj.metadata.namespace", "obj.metadata.namespace"),
        ("obj . namespace", "obj . namespace"),
        ("'namespace' + namespace", "'namespace' + __namespace__"),
        (
            r#""a \" namespace" == namespace"#,
            r#""a \" namespace" == __namespace__"#,
        ),
        (r"r'\' == namespace", r"r'\' == __namespace__"),
        (
            "'''namespace ' x''' == namespace",
            "'''namespace ' x''' == __namespace__",
        ),
        ("namespaces == namespace_x", "namespaces == namespace_x"),
        (
            "x // namespace\n|| namespace",
            "x // namespace\n|| __namespace__",
        ),
        ("ñ == namespace", "ñ == __namespace__"),
    ] {
        assert_eq!(escape_namespace(src), want, "{src}");
    }
}

#[test]
fn evaluation_cost() {
    // Not an assertion: the figure for the report (`cargo test … -- --nocapture`).
    // A release build measured 0.1–1 µs per object for these (2.5 KB Pod).
    let p = pod();
    let vars = obj_vars(&p);
    for src in [
        "'app' in labels",
        "obj.status.phase == 'Running'",
        "obj.spec.containers.exists(c, c.image.startsWith('nginx'))",
    ] {
        let e = Expr::compile(src).unwrap();
        let n = 2_000u32;
        let t = std::time::Instant::now();
        for _ in 0..n {
            assert_eq!(e.eval_object(&vars), Ok(true));
        }
        println!("{:>10?} per evaluation: {src}", t.elapsed() / n);
    }
}

/// Found by `fuzz/fuzz_targets/graph_request.rs`: long chains overflowed the stack in
/// the `cel` crate's parse tree visitor (`1+1+…` with 2,000 terms aborted a 2 MiB
/// thread). They are refused before parsing, as cel-go refuses them; what people
/// write nests far less and still compiles.
#[test]
fn chains_deeper_than_the_recursion_limit_are_refused_before_parsing() {
    use super::super::cel_syntax::{MAX_NESTING, nesting};

    for (deep, what) in [
        (format!("1{} == 1", "+1".repeat(5_000)), "arithmetic"),
        (format!("obj{} == 1", ".a".repeat(20_000)), "selections"),
        (format!("obj{} == 1", "[0]".repeat(20_000)), "indexes"),
        (format!("obj.a{}", " == obj.a".repeat(2_000)), "relations"),
        (
            format!(
                "{}true{}",
                "true ? ".repeat(2_000),
                " : false".repeat(2_000)
            ),
            "conditionals",
        ),
    ] {
        assert!(nesting(&deep) > MAX_NESTING, "{what}: {}", nesting(&deep));
        // On a thread with tokio's 2 MiB stack, as kas and agentk compile them.
        let refused = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || Expr::compile(&deep).err())
            .unwrap()
            .join()
            .expect("no stack overflow");
        assert_eq!(
            refused.as_deref(),
            Some("expression recursion limit exceeded: 250"),
            "{what}"
        );
    }
    // At the limit, a chain still compiles. (Its stack is the parser's: in release
    // it fit 2 MiB (`fuzz/README.md`); unoptimised frames are ten times larger.)
    let at_limit = format!("1{} == 1", "+1".repeat(MAX_NESTING - 1));
    assert_eq!(nesting(&at_limit), MAX_NESTING);
    let ok = std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(move || Expr::compile(&at_limit).map(|_| ()))
        .unwrap()
        .join()
        .expect("no stack overflow");
    assert_eq!(ok, Ok(()));
    // Brackets nested 26 deep are refused: the `cel` crate's own limit (96) is too
    // deep for an unoptimised build's 8 MiB stack.
    assert!(nesting(&format!("{}1{}", "[".repeat(25), "]".repeat(25))) <= MAX_NESTING);
    assert!(nesting(&format!("{}1{}", "[".repeat(26), "]".repeat(26))) > MAX_NESTING);
    // What the counting sees: siblings and strings do not nest, chains and brackets do.
    for (src, want) in [
        ("obj.metadata.name == 'web'", 3),
        ("obj.metadata.labels['app'] in ['a', 'b', 'c']", 13),
        ("size(obj.spec.containers) > 1 && obj.kind != 'Pod'", 12),
        ("'a.b.c.d.e.f' == obj.x", 2),
        ("r'[[[[' + \"((((\" == obj.x // (((( [[[[", 3),
        ("!!!!!true", 0),
        ("-1 - -1 == 0", 2),
        ("a <= b", 1),
    ] {
        assert_eq!(nesting(src), want, "{src}");
    }
}

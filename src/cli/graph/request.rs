//! The watch request `glab cluster graph` builds from its flags, byte for byte: the
//! same queries in the same order, the same default queries and namespaces, the same
//! omitted fields, and Go's `encoding/json` escaping (`&`, `<`, `>` as `\u0026`,
//! `\u003c`, `\u003e`). GitLab source: gitlab-org/cli
//! `internal/commands/cluster/graph/graph.go` (`constructWatchRequest` and the
//! `maybeConstruct…` helpers) and `json_types.go` (the request types, `omitempty`
//! everywhere but `roots.object_selector_expressions`).

use serde::Serialize;

/// The query-building flags (glab's `options`), as given on the command line.
#[derive(Debug, Default, Clone)]
pub(crate) struct RequestFlags {
    /// `-n/--namespace`, repeatable.
    pub(crate) namespaces: Vec<String>,
    /// `--ns-label-selector`.
    pub(crate) ns_label_selector: String,
    /// `--ns-field-selector`.
    pub(crate) ns_field_selector: String,
    /// `--ns-expression`.
    pub(crate) ns_expression: String,
    /// `--root-expression`, repeatable.
    pub(crate) root_expressions: Vec<String>,
    /// `--ignore-arc-direction`.
    pub(crate) ignore_arc_direction: bool,
    /// `-r/--resource`, repeatable.
    pub(crate) resources: Vec<String>,
    /// `--core`.
    pub(crate) core: bool,
    /// `--batch`.
    pub(crate) batch: bool,
    /// `--apps`.
    pub(crate) apps: bool,
    /// `--rbac`.
    pub(crate) rbac: bool,
    /// `--cluster-rbac`.
    pub(crate) cluster_rbac: bool,
    /// `--crd`.
    pub(crate) crd: bool,
}

const CORE: &str = "group == '' && version == 'v1' && (resource in ['pods', 'secrets', 'configmaps', 'serviceaccounts'])";
const APPS: &str = "group == 'apps' && version == 'v1' && (resource in ['deployments', 'replicasets', 'daemonsets', 'statefulsets'])";
const BATCH: &str = "group == 'batch' && version == 'v1' && (resource in ['jobs', 'cronjobs'])";
const RBAC_DEFAULT: &str = "group == 'rbac.authorization.k8s.io' && version == 'v1' && !(resource in ['clusterrolebindings', 'clusterroles'])";
const RBAC: &str = "group == 'rbac.authorization.k8s.io' && version == 'v1' && (resource in ['roles', 'rolebindings'])";
const CLUSTER_RBAC: &str = "group == 'rbac.authorization.k8s.io' && version == 'v1' && (resource in ['clusterroles', 'clusterrolebindings'])";
const CRD: &str =
    "group == 'apiextensions.k8s.io' && version == 'v1' && resource == 'customresourcedefinitions'";
/// glab's namespace filter when no namespace flag is given.
const DEFAULT_NAMESPACES: &str = "name != 'kube-system'";

#[derive(Serialize)]
struct WatchRequest {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    queries: Vec<Query>,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespaces: Option<Namespaces>,
    #[serde(skip_serializing_if = "Option::is_none")]
    roots: Option<Roots>,
}

/// glab only ever builds `include` queries with a resource expression.
#[derive(Serialize)]
struct Query {
    include: Include,
}

#[derive(Serialize)]
struct Include {
    #[serde(skip_serializing_if = "String::is_empty")]
    resource_selector_expression: String,
}

#[derive(Serialize)]
struct Namespaces {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    names: Vec<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    label_selector: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    field_selector: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    object_selector_expression: String,
}

#[derive(Serialize)]
struct Roots {
    object_selector_expressions: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ignore_arc_direction: Vec<String>,
}

fn include(expr: &str) -> Query {
    Query {
        include: Include {
            resource_selector_expression: expr.to_owned(),
        },
    }
}

/// The request JSON glab sends for `flags` (its `constructWatchRequest` without
/// `--stdin`).
pub(crate) fn build(flags: &RequestFlags) -> String {
    // Groups first, in glab's order, then the resources, else the defaults.
    let mut queries: Vec<Query> = [
        (flags.core, CORE),
        (flags.batch, BATCH),
        (flags.apps, APPS),
        (flags.rbac, RBAC),
        (flags.cluster_rbac, CLUSTER_RBAC),
        (flags.crd, CRD),
    ]
    .into_iter()
    .filter(|(on, _)| *on)
    .map(|(_, expr)| include(expr))
    .collect();
    if !flags.resources.is_empty() {
        // `resource in ['a','b']`: no space after the comma, as glab writes it.
        let list: Vec<String> = flags.resources.iter().map(|r| format!("'{r}'")).collect();
        queries.push(include(&format!("resource in [{}]", list.join(","))));
    }
    if queries.is_empty() {
        queries = [CORE, APPS, BATCH, RBAC_DEFAULT]
            .into_iter()
            .map(include)
            .collect();
    }
    let namespaces_empty = flags.namespaces.is_empty()
        && flags.ns_label_selector.is_empty()
        && flags.ns_field_selector.is_empty()
        && flags.ns_expression.is_empty();
    let namespaces = if namespaces_empty {
        Namespaces {
            names: Vec::new(),
            label_selector: String::new(),
            field_selector: String::new(),
            object_selector_expression: DEFAULT_NAMESPACES.to_owned(),
        }
    } else {
        Namespaces {
            names: flags.namespaces.clone(),
            label_selector: flags.ns_label_selector.clone(),
            field_selector: flags.ns_field_selector.clone(),
            object_selector_expression: flags.ns_expression.clone(),
        }
    };
    let roots = (!flags.root_expressions.is_empty()).then(|| Roots {
        object_selector_expressions: flags.root_expressions.clone(),
        ignore_arc_direction: if flags.ignore_arc_direction {
            vec!["or".into(), "r".into(), "t".into()]
        } else {
            Vec::new()
        },
    });
    let req = WatchRequest {
        queries,
        namespaces: Some(namespaces),
        roots,
    };
    go_json_escape(&serde_json::to_string(&req).expect("the request always encodes"))
}

/// Go's `json.Marshal` escapes `&`, `<`, `>`, U+2028 and U+2029 inside strings
/// (HTML-safe output); serde_json does not. Outside strings none of these can
/// occur in JSON, so replacing them everywhere is exact. Control characters are
/// escaped the same way by both (`\n`, `\t`, `\u001f`, …).
fn go_json_escape(json: &str) -> String {
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        match c {
            '&' => out.push_str("\\u0026"),
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_as_glab_marshals_them() {
        let got = build(&RequestFlags::default());
        let want = concat!(
            r#"{"queries":["#,
            r#"{"include":{"resource_selector_expression":"group == '' \u0026\u0026 version == 'v1' \u0026\u0026 (resource in ['pods', 'secrets', 'configmaps', 'serviceaccounts'])"}},"#,
            r#"{"include":{"resource_selector_expression":"group == 'apps' \u0026\u0026 version == 'v1' \u0026\u0026 (resource in ['deployments', 'replicasets', 'daemonsets', 'statefulsets'])"}},"#,
            r#"{"include":{"resource_selector_expression":"group == 'batch' \u0026\u0026 version == 'v1' \u0026\u0026 (resource in ['jobs', 'cronjobs'])"}},"#,
            r#"{"include":{"resource_selector_expression":"group == 'rbac.authorization.k8s.io' \u0026\u0026 version == 'v1' \u0026\u0026 !(resource in ['clusterrolebindings', 'clusterroles'])"}}"#,
            r#"],"namespaces":{"object_selector_expression":"name != 'kube-system'"}}"#,
        );
        assert_eq!(got, want);
        // Still the same JSON once unescaped.
        let v: serde_json::Value = serde_json::from_str(&got).unwrap();
        assert!(
            v["queries"][0]["include"]["resource_selector_expression"]
                .as_str()
                .unwrap()
                .contains("&& version")
        );
    }

    #[test]
    fn resources_roots_and_namespaces() {
        let got = build(&RequestFlags {
            resources: vec!["pods".into(), "configmaps".into()],
            namespaces: vec!["a".into()],
            root_expressions: vec!["name == 'x'".into(), "resource == 'pods'".into()],
            ignore_arc_direction: true,
            ..Default::default()
        });
        assert_eq!(
            got,
            concat!(
                r#"{"queries":[{"include":{"resource_selector_expression":"resource in ['pods','configmaps']"}}],"#,
                r#""namespaces":{"names":["a"]},"#,
                r#""roots":{"object_selector_expressions":["name == 'x'","resource == 'pods'"],"ignore_arc_direction":["or","r","t"]}}"#
            )
        );
    }

    #[test]
    fn ignore_arc_direction_alone_sends_no_roots() {
        let got = build(&RequestFlags {
            ignore_arc_direction: true,
            crd: true,
            ..Default::default()
        });
        assert!(!got.contains("roots"), "{got}");
        assert!(got.contains("customresourcedefinitions"));
    }

    #[test]
    fn go_escapes() {
        assert_eq!(
            go_json_escape("\"a<b>&\u{2028}\""),
            r#""a\u003cb\u003e\u0026\u2028""#
        );
    }
}

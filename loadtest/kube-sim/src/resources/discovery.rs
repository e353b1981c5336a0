//! The discovery documents kubectl reads before it touches the served kinds
//! (`/version`, `/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>`,
//! `/openapi/v3`), built from [`KINDS`].

use serde_json::{Value, json};

use super::{EXAMPLE_GROUP, HELM_GROUP, KINDS, KUSTOMIZE_GROUP, SOURCE_GROUP};

/// Subresources listed in discovery as kube-apiserver lists them (`pods/status`):
/// (group, resource, subresource, verbs). Discovery clients must skip them; of
/// requests to them only Pods' streaming ones (`log`, `exec`, `attach`,
/// `portforward`: the `streams` module) are served.
const SUBRESOURCES: &[(&str, &str, &str, &[&str])] = &[
    ("", "pods", "status", &["get", "patch", "update"]),
    ("", "pods", "log", &["get"]),
    ("", "pods", "exec", &["create", "get"]),
    ("", "pods", "attach", &["create", "get"]),
    ("", "pods", "portforward", &["create", "get"]),
    ("", "services", "status", &["get", "patch", "update"]),
    ("", "nodes", "status", &["get", "patch", "update"]),
    (
        "",
        "persistentvolumeclaims",
        "status",
        &["get", "patch", "update"],
    ),
    ("", "resourcequotas", "status", &["get", "patch", "update"]),
    ("apps", "deployments", "scale", &["get", "patch", "update"]),
    ("apps", "deployments", "status", &["get", "patch", "update"]),
    ("apps", "replicasets", "scale", &["get", "patch", "update"]),
    ("apps", "statefulsets", "scale", &["get", "patch", "update"]),
    ("apps", "daemonsets", "status", &["get", "patch", "update"]),
    ("batch", "jobs", "status", &["get", "patch", "update"]),
    ("batch", "cronjobs", "status", &["get", "patch", "update"]),
    (
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "status",
        &["get", "patch", "update"],
    ),
    (
        EXAMPLE_GROUP,
        "widgets",
        "status",
        &["get", "patch", "update"],
    ),
    (
        KUSTOMIZE_GROUP,
        "kustomizations",
        "status",
        &["get", "patch", "update"],
    ),
    (
        HELM_GROUP,
        "helmreleases",
        "status",
        &["get", "patch", "update"],
    ),
    (
        SOURCE_GROUP,
        "gitrepositories",
        "status",
        &["get", "patch", "update"],
    ),
    (
        SOURCE_GROUP,
        "helmrepositories",
        "status",
        &["get", "patch", "update"],
    ),
    (
        SOURCE_GROUP,
        "ocirepositories",
        "status",
        &["get", "patch", "update"],
    ),
];

/// The served groups (not the core one), in order of first appearance.
fn groups() -> Vec<(&'static str, &'static [&'static str])> {
    let mut out: Vec<(&'static str, &'static [&'static str])> = Vec::new();
    for k in KINDS.iter().filter(|k| !k.group.is_empty()) {
        if !out.iter().any(|(g, _)| *g == k.group) {
            out.push((k.group, k.versions));
        }
    }
    out
}

/// An `APIResourceList` for `group`/`version`, as kube-apiserver serves it.
fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for k in KINDS
        .iter()
        .filter(|k| k.group == group && k.versions.contains(&version))
    {
        let mut r = json!({"name": k.plural, "singularName": k.singular, "namespaced": k.namespaced, "kind": k.kind, "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "shortNames": k.short});
        if k.in_all {
            r["categories"] = json!(["all"]);
        }
        resources.push(r);
        for (_, _, sub, verbs) in SUBRESOURCES
            .iter()
            .filter(|(g, p, _, _)| *g == group && *p == k.plural)
        {
            resources.push(json!({"name": format!("{}/{sub}", k.plural), "singularName": "", "namespaced": k.namespaced, "kind": k.kind, "verbs": verbs}));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

/// The discovery document served at `path` (no trailing slash), if it is one.
pub(in super::super) fn discovery(path: &str) -> Option<Value> {
    Some(match path {
        "/version" => {
            json!({"major": "1", "minor": "32", "gitVersion": "v1.32.0-podgate-test", "platform": "linux/amd64"})
        }
        "/api" => {
            json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
        }
        // kube-apiserver lists each group's versions by priority (stable first) and
        // names the preferred one.
        "/apis" => {
            let groups: Vec<Value> = groups()
                .into_iter()
                .map(|(g, versions)| {
                    let vs: Vec<Value> = versions
                        .iter()
                        .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                        .collect();
                    json!({"name": g, "versions": vs, "preferredVersion": vs[0]})
                })
                .collect();
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        }
        // kubectl asks the OpenAPI v3 document whether the server validates fields
        // itself (a `fieldValidation` parameter on each kind's PATCH); it does, so
        // kubectl needs no schemas.
        "/openapi/v3" => {
            let mut paths = serde_json::Map::new();
            paths.insert(
                "api/v1".into(),
                json!({"serverRelativeURL": "/openapi/v3/api/v1?hash=podgate"}),
            );
            for (g, versions) in groups() {
                for v in versions {
                    paths.insert(
                        format!("apis/{g}/{v}"),
                        json!({"serverRelativeURL": format!("/openapi/v3/apis/{g}/{v}?hash=podgate")}),
                    );
                }
            }
            json!({"paths": paths})
        }
        "/api/v1" => resource_list("", "v1")?,
        _ => {
            if let Some(gv) = path.strip_prefix("/openapi/v3/api/") {
                return openapi("", gv);
            }
            if let Some(gv) = path.strip_prefix("/openapi/v3/apis/") {
                let (g, v) = gv.split_once('/')?;
                return openapi(g, v);
            }
            let gv = path.strip_prefix("/apis/")?;
            let (g, v) = gv.split_once('/')?;
            if v.contains('/') {
                return None;
            }
            return resource_list(g, v);
        }
    })
}

/// The OpenAPI v3 document of one group version: each kind's operations with the
/// `fieldValidation` parameter kubectl looks for.
fn openapi(group: &str, version: &str) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    for k in KINDS
        .iter()
        .filter(|k| k.group == group && k.versions.contains(&version))
    {
        let root = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let item = if k.namespaced {
            format!("{root}/namespaces/{{namespace}}/{}/{{name}}", k.plural)
        } else {
            format!("{root}/{}/{{name}}", k.plural)
        };
        let op = |action: &str| {
            json!({
                "operationId": format!("{action}{}", k.kind),
                "parameters": [
                    {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                    {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                    {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": k.kind},
            })
        };
        paths.insert(
            item,
            json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}),
        );
    }
    if paths.is_empty() {
        return None;
    }
    Some(
        json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.0"}, "paths": paths, "components": {"schemas": {}}}),
    )
}

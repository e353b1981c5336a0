//! The served resource types and the discovery documents kubectl reads before it
//! touches them (`/version`, `/api`, `/apis`, `/api/v1`, `/openapi/v3`).
//!
//! New kinds, groups and versions are added here: the store, selectors and watches
//! know a kind only through [`Kind`].

use serde_json::{Value, json};

/// A served resource type.
#[derive(Clone, Copy, Debug)]
pub(super) struct Kind {
    /// `pods`: the path segment, and the store's first key.
    pub(super) plural: &'static str,
    /// `pod`.
    pub(super) singular: &'static str,
    /// `Pod`.
    pub(super) kind: &'static str,
    /// `po`.
    pub(super) short: &'static [&'static str],
    /// Whether objects live in a namespace.
    pub(super) namespaced: bool,
}

pub(super) const KINDS: &[Kind] = &[
    Kind {
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        short: &["po"],
        namespaced: true,
    },
    Kind {
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        short: &["cm"],
        namespaced: true,
    },
    Kind {
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        short: &["ns"],
        namespaced: false,
    },
];

/// The store key of an object: (plural, namespace, name); cluster-scoped kinds have
/// no namespace.
pub(super) type Key = (String, String, String);

/// The store key of an object in `namespace` (ignored for cluster-scoped kinds).
pub(super) fn key(k: Kind, namespace: &str, name: &str) -> Key {
    let ns = if k.namespaced { namespace } else { "" };
    (k.plural.to_owned(), ns.to_owned(), name.to_owned())
}

/// The kind served under `plural`.
pub(super) fn kind(plural: &str) -> Option<Kind> {
    KINDS.iter().copied().find(|k| k.plural == plural)
}

/// The kind named `kind` in `apiVersion: v1` (`Pod`), for objects read from files.
pub(super) fn kind_named(api_version: &str, kind: &str) -> Option<Kind> {
    (api_version == "v1")
        .then(|| KINDS.iter().copied().find(|k| k.kind == kind))
        .flatten()
}

/// The discovery document served at `path` (no trailing slash), if it is one.
pub(super) fn discovery(path: &str) -> Option<Value> {
    Some(match path {
        "/version" => {
            json!({"major": "1", "minor": "32", "gitVersion": "v1.32.0-podgate-test", "platform": "linux/amd64"})
        }
        "/api" => {
            json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
        }
        "/apis" => json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}),
        // kubectl asks the OpenAPI v3 document whether the server validates fields
        // itself (a `fieldValidation` parameter on each kind's PATCH); it does, so
        // kubectl needs no schemas.
        "/openapi/v3" => {
            json!({"paths": {"api/v1": {"serverRelativeURL": "/openapi/v3/api/v1?hash=podgate"}}})
        }
        "/openapi/v3/api/v1" => openapi_v1(),
        "/api/v1" => {
            let resources: Vec<Value> = KINDS
                .iter()
                .map(|k| json!({"name": k.plural, "singularName": k.singular, "namespaced": k.namespaced, "kind": k.kind, "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "shortNames": k.short}))
                .collect();
            json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": resources})
        }
        _ => return None,
    })
}

fn openapi_v1() -> Value {
    let mut paths = serde_json::Map::new();
    for k in KINDS {
        let item = if k.namespaced {
            format!("/api/v1/namespaces/{{namespace}}/{}/{{name}}", k.plural)
        } else {
            format!("/api/v1/{}/{{name}}", k.plural)
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
                "x-kubernetes-group-version-kind": {"group": "", "version": "v1", "kind": k.kind},
            })
        };
        paths.insert(
            item,
            json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}),
        );
    }
    json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.0"}, "paths": paths, "components": {"schemas": {}}})
}

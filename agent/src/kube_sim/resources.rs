//! The served resource types and the discovery documents kubectl reads before it
//! touches them (`/version`, `/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>`,
//! `/openapi/v3`).
//!
//! New kinds, groups and versions are added here: the store, selectors and watches
//! know a kind only through [`Kind`].

use serde_json::{Value, json};

/// A served resource type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Kind {
    /// `apps`; `""` for the core group (served under `/api/v1`).
    pub(super) group: &'static str,
    /// The versions served, preferred (and stored) first: `["v1", "v1beta1"]`.
    /// As for a CustomResourceDefinition with conversion strategy `None`, versions
    /// differ only in `apiVersion`.
    pub(super) versions: &'static [&'static str],
    /// `pods`: the path segment.
    pub(super) plural: &'static str,
    /// `pod`.
    pub(super) singular: &'static str,
    /// `Pod`.
    pub(super) kind: &'static str,
    /// `po`.
    pub(super) short: &'static [&'static str],
    /// Whether objects live in a namespace.
    pub(super) namespaced: bool,
    /// Whether `kubectl get all` includes it (category `all`).
    pub(super) in_all: bool,
    /// Whether a CustomResourceDefinition defines it (listed under
    /// `customresourcedefinitions`); built-in kinds are not.
    pub(super) custom: bool,
}

impl Kind {
    /// `apiVersion` of objects served in `version`: `v1`, `apps/v1`.
    pub(super) fn api_version(self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_owned()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    /// `apiVersion` of stored objects (the preferred version).
    pub(super) fn storage_api_version(self) -> String {
        self.api_version(self.versions[0])
    }

    /// The same kind, cluster-scoped.
    const fn cluster(mut self) -> Self {
        self.namespaced = false;
        self
    }

    /// The same kind, defined by a CustomResourceDefinition.
    const fn crd(mut self) -> Self {
        self.custom = true;
        self
    }

    /// The store's first key: `pods`, `deployments.apps` (as kubectl names resources).
    pub(super) fn id(self) -> String {
        if self.group.is_empty() {
            self.plural.to_owned()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

const fn core(
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    short: &'static [&'static str],
    namespaced: bool,
    in_all: bool,
) -> Kind {
    Kind {
        group: "",
        versions: &["v1"],
        plural,
        singular,
        kind,
        short,
        namespaced,
        in_all,
        custom: false,
    }
}

const fn grouped(
    group: &'static str,
    versions: &'static [&'static str],
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    short: &'static [&'static str],
    in_all: bool,
) -> Kind {
    Kind {
        group,
        versions,
        plural,
        singular,
        kind,
        short,
        namespaced: true,
        in_all,
        custom: false,
    }
}

/// The group served in two versions, so that clients must choose (a CRD-like group:
/// `v1` preferred, `v1beta1` still served).
pub(super) const EXAMPLE_GROUP: &str = "example.podgate.dev";

/// Namespaces, which every cluster starts with.
pub(super) const NAMESPACES: Kind = core(
    "namespaces",
    "namespace",
    "Namespace",
    &["ns"],
    false,
    false,
);

/// Flux's groups (`fluxcd/*-controller/api`), each served in the version Flux 2.x
/// stores.
pub(super) const KUSTOMIZE_GROUP: &str = "kustomize.toolkit.fluxcd.io";
/// Flux's helm-controller group.
pub(super) const HELM_GROUP: &str = "helm.toolkit.fluxcd.io";
/// Flux's source-controller group.
pub(super) const SOURCE_GROUP: &str = "source.toolkit.fluxcd.io";

pub(super) const KINDS: &[Kind] = &[
    core("pods", "pod", "Pod", &["po"], true, true),
    core("configmaps", "configmap", "ConfigMap", &["cm"], true, false),
    core("secrets", "secret", "Secret", &[], true, false),
    NAMESPACES,
    core(
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        &["sa"],
        true,
        false,
    ),
    core("services", "service", "Service", &["svc"], true, true),
    core(
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        "PersistentVolumeClaim",
        &["pvc"],
        true,
        false,
    ),
    core(
        "persistentvolumes",
        "persistentvolume",
        "PersistentVolume",
        &["pv"],
        false,
        false,
    ),
    core("nodes", "node", "Node", &["no"], false, false),
    grouped(
        "apps",
        &["v1"],
        "deployments",
        "deployment",
        "Deployment",
        &["deploy"],
        true,
    ),
    grouped(
        "apps",
        &["v1"],
        "replicasets",
        "replicaset",
        "ReplicaSet",
        &["rs"],
        true,
    ),
    grouped(
        "apps",
        &["v1"],
        "statefulsets",
        "statefulset",
        "StatefulSet",
        &["sts"],
        true,
    ),
    grouped(
        "apps",
        &["v1"],
        "daemonsets",
        "daemonset",
        "DaemonSet",
        &["ds"],
        true,
    ),
    grouped("batch", &["v1"], "jobs", "job", "Job", &[], true),
    grouped(
        "batch",
        &["v1"],
        "cronjobs",
        "cronjob",
        "CronJob",
        &["cj"],
        true,
    ),
    grouped(
        "networking.k8s.io",
        &["v1"],
        "ingresses",
        "ingress",
        "Ingress",
        &["ing"],
        false,
    ),
    grouped(
        "networking.k8s.io",
        &["v1"],
        "ingressclasses",
        "ingressclass",
        "IngressClass",
        &[],
        false,
    )
    .cluster(),
    grouped(
        "storage.k8s.io",
        &["v1"],
        "storageclasses",
        "storageclass",
        "StorageClass",
        &["sc"],
        false,
    )
    .cluster(),
    grouped(
        "scheduling.k8s.io",
        &["v1"],
        "priorityclasses",
        "priorityclass",
        "PriorityClass",
        &["pc"],
        false,
    )
    .cluster(),
    grouped(
        "node.k8s.io",
        &["v1"],
        "runtimeclasses",
        "runtimeclass",
        "RuntimeClass",
        &[],
        false,
    )
    .cluster(),
    grouped(
        "apiextensions.k8s.io",
        &["v1"],
        "customresourcedefinitions",
        "customresourcedefinition",
        "CustomResourceDefinition",
        &["crd", "crds"],
        false,
    )
    .cluster(),
    grouped(
        EXAMPLE_GROUP,
        &["v1", "v1beta1"],
        "widgets",
        "widget",
        "Widget",
        &["wd"],
        false,
    )
    .crd(),
    grouped(
        KUSTOMIZE_GROUP,
        &["v1"],
        "kustomizations",
        "kustomization",
        "Kustomization",
        &["ks"],
        false,
    )
    .crd(),
    grouped(
        HELM_GROUP,
        &["v2"],
        "helmreleases",
        "helmrelease",
        "HelmRelease",
        &["hr"],
        false,
    )
    .crd(),
    grouped(
        SOURCE_GROUP,
        &["v1"],
        "gitrepositories",
        "gitrepository",
        "GitRepository",
        &["gitrepo"],
        false,
    )
    .crd(),
    grouped(
        SOURCE_GROUP,
        &["v1"],
        "helmrepositories",
        "helmrepository",
        "HelmRepository",
        &["helmrepo"],
        false,
    )
    .crd(),
    grouped(
        SOURCE_GROUP,
        &["v1"],
        "ocirepositories",
        "ocirepository",
        "OCIRepository",
        &["ocirepo"],
        false,
    )
    .crd(),
    // Events, in two groups as in a real cluster (clients that build graphs skip them).
    core("events", "event", "Event", &["ev"], true, false),
    grouped(
        "events.k8s.io",
        &["v1"],
        "events",
        "event",
        "Event",
        &["ev"],
        false,
    ),
];

/// Subresources listed in discovery as kube-apiserver lists them (`pods/status`):
/// (group, resource, subresource, verbs). Discovery clients must skip them; requests
/// to them are not served.
const SUBRESOURCES: &[(&str, &str, &str, &[&str])] = &[
    ("", "pods", "status", &["get", "patch", "update"]),
    ("", "pods", "log", &["get"]),
    ("", "pods", "exec", &["create", "get"]),
    ("", "services", "status", &["get", "patch", "update"]),
    ("", "nodes", "status", &["get", "patch", "update"]),
    (
        "",
        "persistentvolumeclaims",
        "status",
        &["get", "patch", "update"],
    ),
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

/// The store key of an object: (resource id, namespace, name); cluster-scoped kinds
/// have no namespace.
pub(super) type Key = (String, String, String);

/// The store key of an object in `namespace` (ignored for cluster-scoped kinds).
pub(super) fn key(k: Kind, namespace: &str, name: &str) -> Key {
    let ns = if k.namespaced { namespace } else { "" };
    (k.id(), ns.to_owned(), name.to_owned())
}

/// The kind served at `/api[s]/<group>/<version>/…/<plural>`.
pub(super) fn kind_at(group: &str, version: &str, plural: &str) -> Option<Kind> {
    KINDS
        .iter()
        .copied()
        .find(|k| k.group == group && k.plural == plural && k.versions.contains(&version))
}

/// The kind a caller names `resource`: `deployments.apps`, a core plural (`pods`,
/// `events`), or the bare plural of another group (`deployments`) when only one
/// group serves it.
pub(super) fn kind(resource: &str) -> Option<Kind> {
    KINDS
        .iter()
        .copied()
        .find(|k| k.id() == resource)
        .or_else(|| {
            let mut it = KINDS.iter().copied().filter(|k| k.plural == resource);
            let first = it.next()?;
            it.next().is_none().then_some(first)
        })
}

/// The kind named `kind` in `apiVersion` (`v1` `Pod`, `apps/v1` `Deployment`, any
/// served version), for objects read from files.
pub(super) fn kind_named(api_version: &str, kind: &str) -> Option<Kind> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    KINDS
        .iter()
        .copied()
        .find(|k| k.group == group && k.kind == kind && k.versions.contains(&version))
}

/// The kind of `group` whose plural is `plural`, in any served version.
pub(super) fn kind_of(group: &str, plural: &str) -> Option<Kind> {
    KINDS
        .iter()
        .copied()
        .find(|k| k.group == group && k.plural == plural)
}

/// The CustomResourceDefinition of a custom kind, as its controller's installer
/// (controller-gen output applied by `flux install`, or a chart) leaves it once the
/// API server has accepted it: every served version with a permissive schema, the
/// first stored, `Established`.
pub(super) fn crd_object(k: Kind) -> Value {
    let names = json!({
        "kind": k.kind,
        "listKind": format!("{}List", k.kind),
        "plural": k.plural,
        "singular": k.singular,
        "shortNames": k.short,
    });
    let versions: Vec<Value> = k
        .versions
        .iter()
        .enumerate()
        .map(|(i, v)| {
            json!({
                "name": v,
                "served": true,
                "storage": i == 0,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                "subresources": {"status": {}},
                "additionalPrinterColumns": [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}],
            })
        })
        .collect();
    let mut labels = json!({});
    if let Some(component) = match k.group {
        KUSTOMIZE_GROUP => Some("kustomize-controller"),
        HELM_GROUP => Some("helm-controller"),
        SOURCE_GROUP => Some("source-controller"),
        _ => None,
    } {
        labels = json!({
            "app.kubernetes.io/component": component,
            "app.kubernetes.io/instance": "flux-system",
            "app.kubernetes.io/part-of": "flux",
            "app.kubernetes.io/version": "v2.4.0",
        });
    }
    let condition = |t: &str, reason: &str, message: &str| json!({"type": t, "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z", "reason": reason, "message": message});
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{}.{}", k.plural, k.group),
            "labels": labels,
            "annotations": {"controller-gen.kubebuilder.io/version": "v0.16.1"},
        },
        "spec": {
            "group": k.group,
            "names": names,
            "scope": if k.namespaced { "Namespaced" } else { "Cluster" },
            "versions": versions,
            "conversion": {"strategy": "None"},
        },
        "status": {
            "acceptedNames": names,
            "conditions": [
                condition("NamesAccepted", "NoConflicts", "no conflicts found"),
                condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
            ],
            "storedVersions": [k.versions[0]],
        },
    })
}

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
pub(super) fn discovery(path: &str) -> Option<Value> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_discovered_with_their_preferred_version() {
        let list = discovery("/apis").unwrap();
        let example = list["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["name"] == EXAMPLE_GROUP)
            .unwrap();
        assert_eq!(
            example["versions"],
            json!([
                {"groupVersion": "example.podgate.dev/v1", "version": "v1"},
                {"groupVersion": "example.podgate.dev/v1beta1", "version": "v1beta1"},
            ])
        );
        assert_eq!(example["preferredVersion"]["version"], "v1");
        let apps = discovery("/apis/apps/v1").unwrap();
        assert_eq!(apps["groupVersion"], "apps/v1");
        let names: Vec<&str> = apps["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "deployments",
                "deployments/scale",
                "deployments/status",
                "replicasets",
                "replicasets/scale",
                "statefulsets",
                "statefulsets/scale",
                "daemonsets",
                "daemonsets/status"
            ]
        );
        assert!(discovery("/apis/apps/v2").is_none());
        assert!(discovery("/apis/example.podgate.dev/v1beta1").is_some());
        assert!(discovery("/openapi/v3/apis/apps/v1").is_some());
        assert_eq!(kind("deployments").unwrap().group, "apps");
        assert_eq!(kind("widgets.example.podgate.dev").unwrap().kind, "Widget");
        assert!(kind_named("example.podgate.dev/v1beta1", "Widget").is_some());
        assert!(kind_named("apps/v1beta1", "Deployment").is_none());
        assert!(kind_at("apps", "v1", "pods").is_none());
        // A plural served by two groups: the bare plural is the core one.
        assert_eq!(kind("events").unwrap().group, "");
        assert_eq!(kind("events.events.k8s.io").unwrap().group, "events.k8s.io");
    }
}

//! The served resource types and the discovery documents kubectl reads before it
//! touches them (`/version`, `/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>`,
//! `/openapi/v3`).
//!
//! New kinds, groups and versions are added here: the store, selectors and watches
//! know a kind only through [`Kind`].
//!
//! Layout: this file (the [`Kind`] table [`KINDS`], store keys and lookups);
//! `discovery` (the discovery and OpenAPI documents); `crd` (the
//! CustomResourceDefinitions of the custom kinds); `tests`.

mod crd;
mod discovery;
#[cfg(test)]
mod tests;

pub(super) use crd::crd_object;
pub(super) use discovery::discovery;

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

/// RBAC's group: Roles, RoleBindings, ClusterRoles, ClusterRoleBindings.
pub(super) const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

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
    grouped(RBAC_GROUP, &["v1"], "roles", "role", "Role", &[], false),
    grouped(
        RBAC_GROUP,
        &["v1"],
        "rolebindings",
        "rolebinding",
        "RoleBinding",
        &[],
        false,
    ),
    grouped(
        RBAC_GROUP,
        &["v1"],
        "clusterroles",
        "clusterrole",
        "ClusterRole",
        &[],
        false,
    )
    .cluster(),
    grouped(
        RBAC_GROUP,
        &["v1"],
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
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
    // What Workspaces need: agentk's leader election Lease, a workspace's
    // NetworkPolicy and ResourceQuota, and the Endpoints (and EndpointSlices) of
    // Services.
    grouped(
        "coordination.k8s.io",
        &["v1"],
        "leases",
        "lease",
        "Lease",
        &[],
        false,
    ),
    grouped(
        "networking.k8s.io",
        &["v1"],
        "networkpolicies",
        "networkpolicy",
        "NetworkPolicy",
        &["netpol"],
        false,
    ),
    core(
        "resourcequotas",
        "resourcequota",
        "ResourceQuota",
        &["quota"],
        true,
        false,
    ),
    core("endpoints", "endpoints", "Endpoints", &["ep"], true, false),
    grouped(
        "discovery.k8s.io",
        &["v1"],
        "endpointslices",
        "endpointslice",
        "EndpointSlice",
        &[],
        false,
    ),
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

//! What the "no more" test reads and writes: the permissions rules grant, the
//! permissions one audited request needed, kas's impersonations, and one object
//! of every kind GitLab's Workspaces configuration holds.

use std::collections::BTreeSet;

use podgate_agent::proto::kubernetes_api::{ExtraKeyVal, ImpersonationConfig};
use serde_json::Value;

/// (API group, resource or `resource/subresource`, verb).
pub type Permission = (String, String, String);

/// Every permission the rules of the rendered Roles and ClusterRoles grant.
pub fn granted(objects: &[Value]) -> BTreeSet<Permission> {
    let mut out = BTreeSet::new();
    for o in objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
    {
        for rule in o["rules"].as_array().unwrap() {
            let strings = |f: &str| -> Vec<String> {
                rule[f]
                    .as_array()
                    .unwrap_or_else(|| panic!("{f} in {rule}"))
                    .iter()
                    .map(|v| v.as_str().unwrap().to_owned())
                    .collect()
            };
            assert!(rule.get("resourceNames").is_none(), "{rule}");
            for g in strings("apiGroups") {
                for r in strings("resources") {
                    for v in strings("verbs") {
                        out.insert((g.clone(), r.clone(), v));
                    }
                }
            }
        }
    }
    out
}

/// The permissions one request needed, from its path (kube-apiserver's request
/// info: `/api/v1/...` is the core group, `/apis/<group>/<version>/...`;
/// `namespaces/<ns>/` scopes; a name, then a subresource) and its impersonation
/// headers (`impersonate` on `users`, `groups` and `userextras/<key>`).
pub fn permissions(e: &podgate_kube_sim::AuditEntry) -> Vec<Permission> {
    let mut out = Vec::new();
    let p = |g: &str, r: &str, v: &str| (g.to_owned(), r.to_owned(), v.to_owned());
    if e.user.is_some() {
        out.push(p("", "users", "impersonate"));
    }
    if !e.groups.is_empty() {
        out.push(p("", "groups", "impersonate"));
    }
    if e.uid.is_some() {
        out.push(p("authentication.k8s.io", "uids", "impersonate"));
    }
    for key in e.extra.keys() {
        out.push(p(
            "authentication.k8s.io",
            &format!("userextras/{key}"),
            "impersonate",
        ));
    }
    let segments: Vec<&str> = e.path.trim_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return out, // discovery: open to everyone
    };
    let rest = match rest {
        ["namespaces", _ns, more @ ..] if !more.is_empty() => more,
        other => other,
    };
    let resource = match rest {
        [] => return out,
        [r] | [r, _] => (*r).to_owned(),
        [r, _, sub, ..] => format!("{r}/{sub}"),
    };
    out.push(p(group, &resource, &e.verb));
    out
}

/// kas's impersonation of a GitLab user and of a CI job, with every extra it
/// sends (`agent/kas/src/k8s_proxy/auth/impersonation.rs`: `user_impersonation`,
/// `job_impersonation`).
pub fn impersonations() -> [ImpersonationConfig; 2] {
    let extra = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| ExtraKeyVal {
                key: format!("agent.gitlab.com/{k}"),
                val: vec![(*v).to_owned()],
            })
            .collect()
    };
    [
        ImpersonationConfig {
            username: "gitlab:user:alice".into(),
            groups: vec!["gitlab:user".into()],
            uid: String::new(),
            extra: extra(&[
                ("id", "7"),
                ("username", "alice"),
                ("access_type", "user_access"),
                ("config_project_id", "70"),
            ]),
        },
        ImpersonationConfig {
            username: "gitlab:ci_job:99".into(),
            groups: vec!["gitlab:ci_job".into()],
            uid: String::new(),
            extra: extra(&[
                ("id", "7"),
                ("config_project_id", "70"),
                ("project_id", "71"),
                ("ci_pipeline_id", "98"),
                ("ci_job_id", "99"),
                ("username", "alice"),
                ("environment_slug", "production"),
                ("environment_tier", "production"),
            ]),
        },
    ]
}

/// The kinds of GitLab's desired configuration of a workspace (`podgate pod-sim`'s
/// `desired_config`: GitLab's `desired_config_generator.rb`), one object each.
pub const KINDS: [(&str, &str); 8] = [
    ("configmaps", "settings"),
    ("secrets", "env"),
    ("services", "web"),
    ("serviceaccounts", "ws"),
    ("persistentvolumeclaims", "data"),
    ("resourcequotas", "quota"),
    ("deployments", "ws"),
    ("networkpolicies", "ws"),
];

/// An inventory (`ws-inventory`) in `namespace` and, with `objects`, one object of
/// every kind in [`KINDS`] it owns.
pub fn every_kind(namespace: &str, objects: bool) -> String {
    let meta = |name: &str| {
        format!(
            "metadata:\n  name: {name}\n  namespace: {namespace}\n  annotations:\n    config.k8s.io/owning-inventory: ws-inventory\n"
        )
    };
    let mut docs = vec![format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ws-inventory\n  namespace: {namespace}\n  labels:\n    cli-utils.sigs.k8s.io/inventory-id: ws-inventory\n"
    )];
    if objects {
        docs.extend([
            format!("apiVersion: v1\nkind: ConfigMap\n{}data:\n  a: b\n", meta("settings")),
            format!("apiVersion: v1\nkind: Secret\n{}stringData:\n  A: b\n", meta("env")),
            format!("apiVersion: v1\nkind: Service\n{}spec:\n  ports:\n  - port: 80\n", meta("web")),
            format!("apiVersion: v1\nkind: ServiceAccount\n{}", meta("ws")),
            format!(
                "apiVersion: v1\nkind: PersistentVolumeClaim\n{}spec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 1Gi\n",
                meta("data")
            ),
            format!("apiVersion: v1\nkind: ResourceQuota\n{}spec:\n  hard:\n    pods: \"2\"\n", meta("quota")),
            format!(
                "apiVersion: apps/v1\nkind: Deployment\n{}spec:\n  replicas: 0\n  selector:\n    matchLabels: {{app: ws}}\n  template:\n    metadata:\n      labels: {{app: ws}}\n    spec:\n      containers:\n      - name: c\n        image: busybox\n",
                meta("ws")
            ),
            format!(
                "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n{}spec:\n  podSelector: {{}}\n",
                meta("ws")
            ),
        ]);
    }
    docs.iter().map(|d| format!("---\n{d}")).collect()
}

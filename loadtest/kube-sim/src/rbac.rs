//! RBAC as kube-apiserver evaluates it: the rules of the ClusterRoles and Roles
//! that bindings give a user, matched against one request's attributes
//! (`plugin/pkg/auth/authorizer/rbac/rbac.go` and
//! `pkg/apis/rbac/v1/evaluation_helpers.go` in kubernetes/kubernetes):
//!
//! - a ClusterRoleBinding grants its ClusterRole's rules everywhere; a RoleBinding
//!   grants its Role's (same namespace) or ClusterRole's rules in its namespace
//!   only;
//! - subjects: `User` by name, `Group` by name, `ServiceAccount` by namespace and
//!   name (the user `system:serviceaccount:<namespace>:<name>`);
//! - a rule allows when its verbs, API groups and resources match (`*` matches
//!   all; `resource/subresource`, `*/subresource`), and its `resourceNames`, when
//!   set, name the object (never a list, watch or create, which have none);
//!   non-resource requests (discovery) match `nonResourceURLs` (`*`, exact, or a
//!   prefix ending in `*`);
//! - the group `system:masters` is allowed everything (kube-apiserver's
//!   privileged-group authorizer, before RBAC);
//! - a binding to a role that does not exist grants nothing.
//!
//! Who asks ([`Policy::authenticate`]): a bearer token is a ServiceAccount's when a
//! Secret of type `kubernetes.io/service-account-token` holds it (the legacy
//! token Secrets, `kubernetes.io/service-account.name` annotation), else the
//! request is refused (401); no token is `system:anonymous`.
//!
//! Simplifications: discovery (`/api`, `/apis`, `/version`, `/openapi`) is open
//! to everyone (kube-apiserver grants it to every authenticated user through
//! `system:discovery`); there are no bootstrap roles (`cluster-admin` and the
//! others exist when a test creates them).
//!
//! Layout: the policy and its evaluation here; who a request is served as (its
//! bearer token, its impersonation) in `requester`.

use std::collections::HashMap;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;

use super::resources::{RBAC_GROUP, kind_named};
use super::store::Store;

mod requester;

pub(super) use self::requester::{bearer, requester};

/// Who asks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct UserInfo {
    pub(super) name: String,
    pub(super) groups: Vec<String>,
}

/// What a request does, as the authorizer sees it.
#[derive(Clone, Debug, Default)]
pub(super) struct Attributes<'a> {
    pub(super) verb: &'a str,
    /// For resource requests.
    pub(super) group: &'a str,
    pub(super) resource: &'a str,
    pub(super) subresource: &'a str,
    /// `""` at the cluster scope.
    pub(super) namespace: &'a str,
    /// `""` without one (list, watch, create).
    pub(super) name: &'a str,
    /// For non-resource requests (`/api`, `/version`): the path; then the
    /// resource fields are empty.
    pub(super) path: Option<&'a str>,
}

/// One policy rule.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(super) struct Rule {
    #[serde(default)]
    verbs: Vec<String>,
    #[serde(default)]
    api_groups: Vec<String>,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    resource_names: Vec<String>,
    #[serde(default, rename = "nonResourceURLs")]
    non_resource_urls: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Subject {
    kind: String,
    name: String,
    #[serde(default)]
    namespace: String,
}

#[derive(Clone, Debug, Deserialize)]
struct RoleRef {
    kind: String,
    name: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Binding {
    #[serde(default)]
    subjects: Vec<Subject>,
    role_ref: RoleRef,
}

/// The cluster's RBAC objects, indexed for evaluation.
#[derive(Clone, Debug, Default)]
pub(super) struct Policy {
    cluster_roles: HashMap<String, Vec<Rule>>,
    /// (namespace, name).
    roles: HashMap<(String, String), Vec<Rule>>,
    cluster_bindings: Vec<Binding>,
    /// (namespace, binding).
    bindings: Vec<(String, Binding)>,
    /// ServiceAccount token → (namespace, ServiceAccount).
    tokens: HashMap<String, (String, String)>,
    /// Static tokens (`--token-auth-file`): token → user.
    static_tokens: HashMap<String, UserInfo>,
}

fn meta(o: &Value, field: &str) -> String {
    o["metadata"][field].as_str().unwrap_or("").to_owned()
}

fn rules(o: &Value) -> Vec<Rule> {
    serde_json::from_value(o["rules"].clone()).unwrap_or_default()
}

impl Policy {
    /// The RBAC objects and ServiceAccount token Secrets of `store`.
    pub(super) fn from_store(store: &Store) -> Policy {
        let mut p = Policy::default();
        for kind in ["ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"] {
            if let Some(k) = kind_named(&format!("{RBAC_GROUP}/v1"), kind) {
                for (_, o) in store.of(k) {
                    p.add(kind, &o.value());
                }
            }
        }
        if let Some(secrets) = kind_named("v1", "Secret") {
            for (_, o) in store.of(secrets) {
                let o = o.value();
                if o["type"] != "kubernetes.io/service-account-token" {
                    continue;
                }
                let sa = o["metadata"]["annotations"]["kubernetes.io/service-account.name"]
                    .as_str()
                    .unwrap_or("");
                let token = o["data"]["token"]
                    .as_str()
                    .and_then(|t| base64::engine::general_purpose::STANDARD.decode(t).ok())
                    .and_then(|t| String::from_utf8(t).ok());
                if let (false, Some(token)) = (sa.is_empty(), token) {
                    p.tokens
                        .insert(token, (meta(&o, "namespace"), sa.to_owned()));
                }
            }
        }
        p
    }

    /// Authenticate these static tokens too, before ServiceAccount tokens (as
    /// kube-apiserver's token file authenticator comes first).
    pub(super) fn add_tokens(&mut self, tokens: HashMap<String, UserInfo>) {
        self.static_tokens.extend(tokens);
    }

    /// Who a request with `bearer` (the `Authorization: Bearer` value, if any)
    /// is; `None`: a token nobody issued (401).
    pub(super) fn authenticate(&self, bearer: Option<&str>) -> Option<UserInfo> {
        let Some(token) = bearer else {
            return Some(UserInfo {
                name: "system:anonymous".into(),
                groups: vec!["system:unauthenticated".into()],
            });
        };
        if let Some(user) = self.static_tokens.get(token) {
            return Some(user.clone());
        }
        let (ns, sa) = self.tokens.get(token)?;
        Some(UserInfo {
            name: format!("system:serviceaccount:{ns}:{sa}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".into(),
            ],
        })
    }

    /// Add a stored object of kind `kind` (`ClusterRole`, `Role`,
    /// `ClusterRoleBinding`, `RoleBinding`); anything else, or an object that
    /// does not have the kind's shape, is ignored (the API validates on write).
    pub(super) fn add(&mut self, kind: &str, o: &Value) {
        match kind {
            "ClusterRole" => {
                self.cluster_roles.insert(meta(o, "name"), rules(o));
            }
            "Role" => {
                self.roles
                    .insert((meta(o, "namespace"), meta(o, "name")), rules(o));
            }
            "ClusterRoleBinding" => {
                if let Ok(b) = serde_json::from_value::<Binding>(o.clone()) {
                    self.cluster_bindings.push(b);
                }
            }
            "RoleBinding" => {
                if let Ok(b) = serde_json::from_value::<Binding>(o.clone()) {
                    self.bindings.push((meta(o, "namespace"), b));
                }
            }
            _ => {}
        }
    }

    /// Whether `user` may do `a`.
    pub(super) fn allows(&self, user: &UserInfo, a: &Attributes<'_>) -> bool {
        if user.groups.iter().any(|g| g == "system:masters") {
            return true;
        }
        let cluster = self
            .cluster_bindings
            .iter()
            .filter(|b| applies_to(b, user, ""))
            .filter(|b| b.role_ref.kind == "ClusterRole")
            .filter_map(|b| self.cluster_roles.get(&b.role_ref.name));
        let namespaced = self
            .bindings
            .iter()
            .filter(|(ns, _)| !a.namespace.is_empty() && ns == a.namespace)
            .filter(|(ns, b)| applies_to(b, user, ns))
            .filter_map(|(ns, b)| match b.role_ref.kind.as_str() {
                "ClusterRole" => self.cluster_roles.get(&b.role_ref.name),
                "Role" => self.roles.get(&(ns.clone(), b.role_ref.name.clone())),
                _ => None,
            });
        cluster
            .chain(namespaced)
            .flatten()
            .any(|r| rule_allows(r, a))
    }
}

/// `appliesTo`: whether a binding (in `namespace`, `""` for a cluster binding)
/// names `user`.
fn applies_to(b: &Binding, user: &UserInfo, namespace: &str) -> bool {
    b.subjects.iter().any(|s| match s.kind.as_str() {
        "User" => s.name == user.name,
        "Group" => user.groups.contains(&s.name),
        "ServiceAccount" => {
            // A RoleBinding's ServiceAccount subject without a namespace is in
            // the binding's (`serviceaccount.MakeUsername` with the default).
            let ns = if s.namespace.is_empty() {
                namespace
            } else {
                &s.namespace
            };
            user.name == format!("system:serviceaccount:{ns}:{}", s.name)
        }
        _ => false,
    })
}

fn has(list: &[String], want: &str) -> bool {
    list.iter().any(|x| x == "*" || x == want)
}

/// `RuleAllows`.
fn rule_allows(r: &Rule, a: &Attributes<'_>) -> bool {
    if !has(&r.verbs, a.verb) {
        return false;
    }
    if let Some(path) = a.path {
        return r.non_resource_urls.iter().any(|u| {
            u == "*" || u == path || u.strip_suffix('*').is_some_and(|p| path.starts_with(p))
        });
    }
    if !has(&r.api_groups, a.group) {
        return false;
    }
    let resource_ok = r.resources.iter().any(|res| {
        if a.subresource.is_empty() {
            res == "*" || res == a.resource
        } else {
            res == "*"
                || *res == format!("{}/{}", a.resource, a.subresource)
                || *res == format!("*/{}", a.subresource)
        }
    });
    resource_ok
        && (r.resource_names.is_empty()
            || (!a.name.is_empty() && r.resource_names.iter().any(|n| n == a.name)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    fn req<'a>(
        verb: &'a str,
        group: &'a str,
        resource: &'a str,
        ns: &'a str,
        name: &'a str,
    ) -> Attributes<'a> {
        Attributes {
            verb,
            group,
            resource,
            namespace: ns,
            name,
            ..Attributes::default()
        }
    }

    fn policy() -> Policy {
        let mut p = Policy::default();
        p.add(
            "ClusterRole",
            &json!({"metadata": {"name": "reader"}, "rules": [
                {"apiGroups": ["", "apps"], "resources": ["pods", "deployments"], "verbs": ["get", "list", "watch"]},
                {"nonResourceURLs": ["/api", "/apis/*"], "verbs": ["get"]}
            ]}),
        );
        p.add(
            "ClusterRoleBinding",
            &json!({"metadata": {"name": "agent-reads"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "reader"},
                    "subjects": [{"kind": "ServiceAccount", "name": "agentk", "namespace": "gitlab-agent"}]}),
        );
        p.add(
            "Role",
            &json!({"metadata": {"name": "lease", "namespace": "gitlab-agent"}, "rules": [
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["agent-lock"], "verbs": ["get", "update"]},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
                {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}
            ]}),
        );
        p.add(
            "RoleBinding",
            &json!({"metadata": {"name": "lease", "namespace": "gitlab-agent"},
                    "roleRef": {"kind": "Role", "name": "lease"},
                    "subjects": [{"kind": "ServiceAccount", "name": "agentk"}, {"kind": "Group", "name": "ops"}]}),
        );
        p
    }

    #[test]
    fn cluster_bindings_grant_everywhere_role_bindings_in_their_namespace() {
        let p = policy();
        let sa = user(
            "system:serviceaccount:gitlab-agent:agentk",
            &["system:serviceaccounts"],
        );
        assert!(p.allows(&sa, &req("list", "apps", "deployments", "", "")));
        assert!(p.allows(&sa, &req("watch", "", "pods", "team-a", "")));
        assert!(!p.allows(&sa, &req("delete", "", "pods", "team-a", "x")));
        assert!(!p.allows(&sa, &req("list", "", "secrets", "", "")));
        // The Role's leases, only in its namespace, only the named one for get.
        assert!(p.allows(
            &sa,
            &req(
                "get",
                "coordination.k8s.io",
                "leases",
                "gitlab-agent",
                "agent-lock"
            )
        ));
        assert!(!p.allows(
            &sa,
            &req(
                "get",
                "coordination.k8s.io",
                "leases",
                "gitlab-agent",
                "other"
            )
        ));
        assert!(p.allows(
            &sa,
            &req(
                "create",
                "coordination.k8s.io",
                "leases",
                "gitlab-agent",
                ""
            )
        ));
        assert!(!p.allows(
            &sa,
            &req("create", "coordination.k8s.io", "leases", "default", "")
        ));
        // A list has no name: resourceNames never allow it.
        assert!(!p.allows(
            &sa,
            &req(
                "update",
                "coordination.k8s.io",
                "leases",
                "gitlab-agent",
                ""
            )
        ));
        // Another ServiceAccount of the same name elsewhere is someone else.
        let other = user("system:serviceaccount:default:agentk", &[]);
        assert!(!p.allows(&other, &req("list", "apps", "deployments", "", "")));
        // Groups; subresources.
        let ops = user("jane", &["ops"]);
        let mut logs = req("get", "", "pods", "gitlab-agent", "p1");
        logs.subresource = "log";
        assert!(p.allows(&ops, &logs));
        assert!(!p.allows(&ops, &req("get", "", "pods", "gitlab-agent", "p1")));
        assert!(p.allows(
            &user("root", &["system:masters"]),
            &req("delete", "", "nodes", "", "n1")
        ));
    }

    #[test]
    fn non_resource_urls_and_dangling_role_refs() {
        let mut p = policy();
        let sa = user("system:serviceaccount:gitlab-agent:agentk", &[]);
        let path = |p: &'static str| Attributes {
            verb: "get",
            path: Some(p),
            ..Attributes::default()
        };
        assert!(p.allows(&sa, &path("/api")));
        assert!(p.allows(&sa, &path("/apis/apps/v1")));
        assert!(!p.allows(&sa, &path("/version")));
        p.add(
            "ClusterRoleBinding",
            &json!({"metadata": {"name": "x"}, "roleRef": {"kind": "ClusterRole", "name": "missing"},
                    "subjects": [{"kind": "User", "name": "bob"}]}),
        );
        assert!(!p.allows(&user("bob", &[]), &req("get", "", "pods", "default", "p")));
    }
}

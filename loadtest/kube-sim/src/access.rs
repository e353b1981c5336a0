//! Who asks, and what they may do: the user a request is served as (its
//! `Impersonate-*` headers), resources whose reads are denied (a `403 Forbidden`
//! `Status`, as missing RBAC gives), and a bounded audit log of recent requests.
//!
//! Unless RBAC is enforced, kube-sim authenticates nobody: a request without
//! impersonation headers is served as `system:anonymous`, the name kube-apiserver
//! gives an unauthenticated request, and every impersonation is allowed. With RBAC
//! enforced (`super::rbac`), bearer tokens authenticate (ServiceAccount token
//! Secrets, and static tokens such as `--enforce-rbac`'s administrator), the
//! caller must be allowed to `impersonate`, and the audit records who the token
//! authenticated. Every audit entry records the response's status.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use http::{HeaderMap, StatusCode};
use percent_encoding::percent_decode_str;
use serde_json::json;

use super::rbac::{Policy, UserInfo};
use super::resources::Kind;
use super::store::Store;

/// The user a request without impersonation headers is served as.
pub(super) const ANONYMOUS: &str = "system:anonymous";

/// How many requests [`Access`] remembers, unless told otherwise.
pub(super) const AUDIT_LIMIT: usize = 1000;

/// The verbs a denial covers when none are named: the reads RBAC gates.
const READS: &[&str] = &["get", "list", "watch"];

/// One request as kube-sim saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditEntry {
    /// The Kubernetes verb: `get`, `list`, `watch`, `create`, `update`, `patch`,
    /// `delete`; for a non-resource path (discovery) the lower-case HTTP method.
    pub verb: String,
    /// The request path, without the query.
    pub path: String,
    /// The query as sent (still percent-encoded), `""` when none: `limit=500`,
    /// `limit=500&continue=…`.
    pub query: String,
    /// `Impersonate-User`, when the request carried it.
    pub user: Option<String>,
    /// Every `Impersonate-Group`, in order.
    pub groups: Vec<String>,
    /// `Impersonate-Uid`, when sent.
    pub uid: Option<String>,
    /// `Impersonate-Extra-<key>` values by (unescaped, lower-case) key.
    pub extra: BTreeMap<String, Vec<String>>,
    /// Who the bearer token authenticated (before any impersonation), when RBAC
    /// is enforced (`system:serviceaccount:<namespace>:<name>`,
    /// `system:anonymous`); `None` when it is not, or the token was refused.
    pub requester: Option<String>,
    /// The response's status code.
    pub code: u16,
}

/// The identity of one request, from its impersonation headers.
#[derive(Clone, Debug, Default)]
pub(super) struct Identity {
    pub(super) user: Option<String>,
    pub(super) groups: Vec<String>,
    pub(super) uid: Option<String>,
    pub(super) extra: BTreeMap<String, Vec<String>>,
}

impl Identity {
    /// Read `Impersonate-User`, `Impersonate-Group` (repeatable), `Impersonate-Uid`
    /// and `Impersonate-Extra-<key>`. As kube-apiserver
    /// (`k8s.io/apiserver/pkg/endpoints/filters/impersonation.go`), groups, uid or
    /// extra without a user are an error.
    pub(super) fn from_headers(headers: &HeaderMap) -> Result<Self, String> {
        let text = |v: &http::HeaderValue| String::from_utf8_lossy(v.as_bytes()).into_owned();
        let mut id = Identity {
            user: headers.get("impersonate-user").map(text),
            groups: headers
                .get_all("impersonate-group")
                .iter()
                .map(text)
                .collect(),
            uid: headers.get("impersonate-uid").map(text),
            extra: BTreeMap::new(),
        };
        // The key: the header name's suffix, lower case (as every `HeaderName`),
        // path-unescaped (`unescapeExtraKey`: `%XX` decoded, `+` kept).
        for (name, value) in headers {
            if let Some(key) = name.as_str().strip_prefix("impersonate-extra-") {
                id.extra
                    .entry(percent_decode_str(key).decode_utf8_lossy().into_owned())
                    .or_default()
                    .push(text(value));
            }
        }
        if id.user.is_none() && (!id.groups.is_empty() || id.uid.is_some() || !id.extra.is_empty())
        {
            return Err(format!(
                "requested {} without impersonating a user",
                [
                    (!id.groups.is_empty()).then(|| format!("groups {:?}", id.groups)),
                    id.uid.as_ref().map(|u| format!("uid {u:?}")),
                    (!id.extra.is_empty()).then(|| format!("extra {:?}", id.extra)),
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(", ")
            ));
        }
        Ok(id)
    }

    /// The user name the request is served as.
    pub(super) fn name(&self) -> &str {
        self.user.as_deref().unwrap_or(ANONYMOUS)
    }
}

/// One denied resource.
#[derive(Debug)]
struct Denial {
    group: String,
    resource: String,
    verbs: Vec<String>,
}

/// Denials, RBAC enforcement and the audit log, shared by every connection.
#[derive(Debug, Default)]
pub(super) struct Access {
    denied: Mutex<Vec<Denial>>,
    audit: Mutex<VecDeque<AuditEntry>>,
    /// Authenticate bearer tokens and authorize by RBAC ([`super::rbac`]).
    enforce: AtomicBool,
    /// The policy built at a store resource version.
    policy: Mutex<Option<(u64, Arc<Policy>)>>,
    /// Static bearer tokens (kube-apiserver's `--token-auth-file`).
    tokens: Mutex<HashMap<String, UserInfo>>,
    /// How many requests the audit keeps; 0 means [`AUDIT_LIMIT`].
    audit_limit: std::sync::atomic::AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Access {
    /// Deny `verbs` (get, list and watch when empty) on `group`/`resource`,
    /// replacing an earlier denial of the same resource.
    pub(super) fn deny(&self, group: &str, resource: &str, verbs: &[&str]) {
        let verbs = if verbs.is_empty() { READS } else { verbs };
        let mut denied = lock(&self.denied);
        denied.retain(|d| !(d.group == group && d.resource == resource));
        denied.push(Denial {
            group: group.to_owned(),
            resource: resource.to_owned(),
            verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        });
    }

    /// Lift any denial of `group`/`resource`.
    pub(super) fn allow(&self, group: &str, resource: &str) {
        lock(&self.denied).retain(|d| !(d.group == group && d.resource == resource));
    }

    /// Authenticate and authorize by RBAC from now on (`on`), or serve everyone.
    pub(super) fn enforce(&self, on: bool) {
        self.enforce.store(on, Ordering::Relaxed);
    }

    /// Authenticate `token` as `user` from now on.
    pub(super) fn add_token(&self, token: &str, user: UserInfo) {
        lock(&self.tokens).insert(token.to_owned(), user);
        *lock(&self.policy) = None;
    }

    /// Whether RBAC is enforced.
    pub(super) fn enforcing(&self) -> bool {
        self.enforce.load(Ordering::Relaxed)
    }

    /// The RBAC policy of `store` as it is now (rebuilt when anything changed).
    pub(super) fn policy(&self, store: &Store) -> Arc<Policy> {
        let mut cached = lock(&self.policy);
        match &*cached {
            Some((rv, p)) if *rv == store.rv => p.clone(),
            _ => {
                let mut p = Policy::from_store(store);
                p.add_tokens(lock(&self.tokens).clone());
                let p = Arc::new(p);
                *cached = Some((store.rv, p.clone()));
                p
            }
        }
    }

    /// Whether `verb` on `k` is denied.
    pub(super) fn is_denied(&self, k: Kind, verb: &str) -> bool {
        lock(&self.denied).iter().any(|d| {
            d.group == k.group && d.resource == k.plural && d.verbs.iter().any(|v| v == verb)
        })
    }

    /// Keep the last `n` requests (at least 1) from now on.
    pub(super) fn set_audit_limit(&self, n: usize) {
        self.audit_limit.store(n.max(1), Ordering::Relaxed);
    }

    /// Remember one request, forgetting the oldest past the limit.
    pub(super) fn record(
        &self,
        (verb, path, query): (&str, &str, &str),
        id: &Identity,
        requester: Option<&str>,
        code: StatusCode,
    ) {
        let limit = match self.audit_limit.load(Ordering::Relaxed) {
            0 => AUDIT_LIMIT,
            n => n,
        };
        let mut audit = lock(&self.audit);
        while audit.len() >= limit {
            audit.pop_front();
        }
        audit.push_back(AuditEntry {
            verb: verb.to_owned(),
            path: path.to_owned(),
            query: query.to_owned(),
            user: id.user.clone(),
            groups: id.groups.clone(),
            uid: id.uid.clone(),
            extra: id.extra.clone(),
            requester: requester.map(str::to_owned),
            code: code.as_u16(),
        });
    }

    /// The remembered requests, oldest first.
    pub(super) fn audit(&self) -> Vec<AuditEntry> {
        lock(&self.audit).iter().cloned().collect()
    }
}

/// The `403 Forbidden` `Status` kube-apiserver answers when the authorizer says no
/// (`k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go`
/// `forbiddenMessage`, wrapped by `apierrors.NewForbidden`): `deployments.apps is
/// forbidden: User "u" cannot list resource "deployments" in API group "apps" at
/// the cluster scope`.
pub(super) fn forbidden(
    k: Kind,
    verb: &str,
    namespace: Option<&str>,
    name: Option<&str>,
    user: &str,
) -> serde_json::Value {
    let scope = match namespace.filter(|n| !n.is_empty()) {
        Some(ns) => format!("in the namespace {ns:?}"),
        None => "at the cluster scope".to_owned(),
    };
    let why = format!(
        "User {user:?} cannot {verb} resource {:?} in API group {:?} {scope}",
        k.plural, k.group
    );
    let message = match name {
        Some(n) => format!("{} {n:?} is forbidden: {why}", k.id()),
        None => format!("{} is forbidden: {why}", k.id()),
    };
    let mut details = json!({"kind": k.plural});
    if !k.group.is_empty() {
        details["group"] = json!(k.group);
    }
    if let Some(n) = name {
        details["name"] = json!(n);
    }
    let mut status = super::http::status(StatusCode::FORBIDDEN, "Forbidden", &message);
    status["details"] = details;
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::kind;

    #[test]
    fn impersonation_headers_are_read() {
        let mut h = HeaderMap::new();
        assert_eq!(Identity::from_headers(&h).unwrap().name(), ANONYMOUS);
        h.insert("impersonate-user", "gitlab:user:root".parse().unwrap());
        h.append("impersonate-group", "gitlab:user".parse().unwrap());
        h.append(
            "impersonate-group",
            "gitlab:project_role:7:developer".parse().unwrap(),
        );
        h.insert("impersonate-uid", "42".parse().unwrap());
        h.append(
            "impersonate-extra-agent.gitlab.com%2Fid",
            "9".parse().unwrap(),
        );
        h.append(
            "impersonate-extra-agent.gitlab.com%2Fid",
            "10".parse().unwrap(),
        );
        h.append("impersonate-extra-a+b%2fc", "x".parse().unwrap());
        let id = Identity::from_headers(&h).unwrap();
        assert_eq!(id.name(), "gitlab:user:root");
        assert_eq!(
            id.groups,
            ["gitlab:user", "gitlab:project_role:7:developer"]
        );
        assert_eq!(id.uid.as_deref(), Some("42"));
        assert_eq!(id.extra["agent.gitlab.com/id"], ["9", "10"]);
        assert_eq!(id.extra["a+b/c"], ["x"]);

        let mut h = HeaderMap::new();
        h.insert("impersonate-group", "g".parse().unwrap());
        let e = Identity::from_headers(&h).unwrap_err();
        assert!(e.contains("without impersonating a user"), "{e}");
    }

    #[test]
    fn forbidden_reads_as_kube_apiserver_writes_it() {
        let deploy = kind("deployments.apps").unwrap();
        let s = forbidden(deploy, "list", None, None, "system:anonymous");
        assert_eq!(
            s["message"],
            r#"deployments.apps is forbidden: User "system:anonymous" cannot list resource "deployments" in API group "apps" at the cluster scope"#
        );
        assert_eq!(s["reason"], "Forbidden");
        assert_eq!(s["code"], 403);
        assert_eq!(
            s["details"],
            json!({"kind": "deployments", "group": "apps"})
        );
        let pods = kind("pods").unwrap();
        let s = forbidden(pods, "get", Some("shop"), Some("web"), "alice");
        assert_eq!(
            s["message"],
            r#"pods "web" is forbidden: User "alice" cannot get resource "pods" in API group "" in the namespace "shop""#
        );

        let access = Access::default();
        access.deny("apps", "deployments", &[]);
        assert!(access.is_denied(deploy, "watch"));
        assert!(!access.is_denied(deploy, "create"));
        assert!(!access.is_denied(pods, "list"));
        access.allow("apps", "deployments");
        assert!(!access.is_denied(deploy, "list"));
    }
}

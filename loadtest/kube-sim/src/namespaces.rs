//! Namespace lifecycle, as kube-apiserver's `NamespaceLifecycle` admission plugin
//! (`k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle/admission.go`), the
//! namespace registry (`pkg/registry/core/namespace/storage/storage.go`) and the
//! namespace controller (`pkg/controller/namespace`) handle it:
//!
//! - creating an object in a namespace that does not exist is `404 NotFound`
//!   (`namespaces "x" not found`); in one being terminated, `403 Forbidden`
//!   (`pods "p" is forbidden: unable to create new content in namespace x because
//!   it is being terminated`);
//! - deleting a namespace marks it (`metadata.deletionTimestamp`, `spec.finalizers:
//!   [kubernetes]`, `status.phase: Terminating`; a `MODIFIED` event) and answers
//!   `200` with it; after the `namespace_delete_delay` setting every object in it
//!   is deleted (a `DELETED` event each), then the namespace itself;
//! - deleting it again meanwhile is `409 Conflict` (`The system is ensuring all
//!   content is removed from this namespace.  …`); `default`, `kube-system` and
//!   `kube-public` may not be deleted (`403`).

use std::sync::Arc;

use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::http::status;
use super::resources::{KINDS, Kind, NAMESPACES, key};
use super::store::{Shared, Store, Write, now};

/// Namespaces the apiserver refuses to delete.
const IMMORTAL: &[&str] = &["default", "kube-system", "kube-public"];

/// Why an object of `k` named `name` may not be created in `namespace` (the error
/// status and `Status`), judged on `store`.
pub(super) fn refusal(
    store: &Store,
    k: Kind,
    namespace: &str,
    name: &str,
) -> Option<(StatusCode, Value)> {
    if !k.namespaced {
        return None;
    }
    let Some(ns) = store
        .objects
        .get(&key(NAMESPACES, "", namespace))
        .map(|s| s.value())
    else {
        let mut s = status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("namespaces {namespace:?} not found"),
        );
        s["details"] = json!({"name": namespace, "kind": "namespaces"});
        return Some((StatusCode::NOT_FOUND, s));
    };
    if ns["metadata"]["deletionTimestamp"].is_null() {
        return None;
    }
    let what = if name.is_empty() {
        k.id()
    } else {
        format!("{} {name:?}", k.id())
    };
    let mut s = status(
        StatusCode::FORBIDDEN,
        "Forbidden",
        &format!(
            "{what} is forbidden: unable to create new content in namespace {namespace} because it is being terminated"
        ),
    );
    s["details"] = json!({"name": name, "kind": k.plural});
    if !k.group.is_empty() {
        s["details"]["group"] = json!(k.group);
    }
    s["details"]["causes"] = json!([{"reason": "NamespaceTerminating", "message": format!("namespace {namespace} is being terminated"), "field": "metadata.namespace"}]);
    Some((StatusCode::FORBIDDEN, s))
}

impl Shared {
    /// `DELETE /api/v1/namespaces/<name>`: mark it terminating and purge it after
    /// the configured delay.
    pub(super) fn delete_namespace(self: &Arc<Self>, name: &str) -> (StatusCode, Value) {
        if IMMORTAL.contains(&name) {
            let mut s = status(
                StatusCode::FORBIDDEN,
                "Forbidden",
                &format!("namespaces {name:?} is forbidden: this namespace may not be deleted"),
            );
            s["details"] = json!({"name": name, "kind": "namespaces"});
            return (StatusCode::FORBIDDEN, s);
        }
        let current = self
            .lock()
            .objects
            .get(&key(NAMESPACES, "", name))
            .map(|s| s.value());
        let Some(current) = current else {
            return (
                StatusCode::NOT_FOUND,
                status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    &format!("namespaces {name:?} not found"),
                ),
            );
        };
        if !current["metadata"]["deletionTimestamp"].is_null() {
            return (
                StatusCode::CONFLICT,
                status(
                    StatusCode::CONFLICT,
                    "Conflict",
                    &format!(
                        "Operation cannot be fulfilled on namespaces {name:?}: The system is ensuring all content is removed from this namespace.  Upon completion, this namespace will automatically be purged by the system."
                    ),
                ),
            );
        }
        let marked = self.write(Write::new(
            Method::PATCH,
            NAMESPACES,
            "",
            Some(name),
            json!({
                "metadata": {"deletionTimestamp": now()},
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Terminating"},
            }),
        ));
        let shared = self.clone();
        let name = name.to_owned();
        let since = tokio::time::Instant::now();
        tokio::spawn(async move {
            // The delay in force counts: a changed setting is looked at again.
            loop {
                let changed = shared.settings_changed.notified();
                let at = since + shared.settings().namespace_delete_delay;
                tokio::select! {
                    () = tokio::time::sleep_until(at) => break,
                    () = changed => {}
                }
            }
            shared.purge_namespace(&name);
        });
        marked
    }

    /// Delete every object in namespace `name`, then the namespace; whether the
    /// namespace existed.
    pub(super) fn purge_namespace(&self, name: &str) -> bool {
        for k in KINDS.iter().filter(|k| k.namespaced) {
            let names: Vec<String> = self
                .lock()
                .in_namespace(*k, name)
                .map(|((_, _, n), _)| n.clone())
                .collect();
            for n in names {
                self.apply(Method::DELETE, *k, name, Some(&n), Value::Null);
            }
        }
        self.apply(Method::DELETE, NAMESPACES, "", Some(name), Value::Null)
            .0
            .is_success()
    }
}

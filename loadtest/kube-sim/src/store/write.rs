//! One write to the store ([`Write`], [`Shared::write`]): create, replace, patch
//! (merge or server-side apply) and delete, with admission, the namespace
//! lifecycle, what the server sets on every write, `managedFields`, the new
//! resource version, the history and the broadcast to watches.

use std::sync::Arc;

use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::super::faults::validate;
use super::super::http::status;
use super::super::namespaces::refusal;
use super::super::resources::{Kind, key};
use super::super::ssa::{self, Writer};
use super::{Event, Shared, Stored, now};

/// One write to the store.
pub(in super::super) struct Write<'a> {
    /// POST (create), PUT (replace), PATCH or DELETE.
    pub(in super::super) method: Method,
    /// What is written.
    pub(in super::super) kind: Kind,
    /// The namespace (ignored for cluster-scoped kinds).
    pub(in super::super) namespace: &'a str,
    /// The name; a create may name it in the body instead.
    pub(in super::super) name: Option<&'a str>,
    /// The object, or the patch.
    pub(in super::super) body: Value,
    /// A server-side apply patch (PATCH; a POST when the object is created by it).
    pub(in super::super) apply: bool,
    /// `force=true` of an apply.
    pub(in super::super) force: bool,
    /// The field manager: `Some` records `metadata.managedFields`.
    pub(in super::super) manager: Option<String>,
    /// The `apiVersion` the client spoke (`apps/v1`), for `managedFields`.
    pub(in super::super) api_version: String,
    /// A write to the `status` subresource (only status is owned).
    pub(in super::super) status: bool,
    /// Refusals and validation apply (API clients; not the controllers).
    pub(in super::super) admit: bool,
    /// `dryRun=All`: answered, not stored.
    pub(in super::super) dry_run: bool,
    /// Creates meet the namespace lifecycle (`404` in a missing namespace, `403` in
    /// one being terminated): API clients and controllers.
    pub(in super::super) lifecycle: bool,
}

impl<'a> Write<'a> {
    /// An untracked write without admission.
    pub(in super::super) fn new(
        method: Method,
        kind: Kind,
        namespace: &'a str,
        name: Option<&'a str>,
        body: Value,
    ) -> Self {
        Write {
            method,
            kind,
            namespace,
            name,
            body,
            apply: false,
            force: false,
            manager: None,
            api_version: kind.storage_api_version(),
            status: false,
            admit: false,
            dry_run: false,
            lifecycle: false,
        }
    }
}

/// Kinds whose `metadata.generation` counts spec changes and whose status only the
/// status subresource (their controllers) writes.
fn controlled(k: Kind) -> bool {
    k.group == "apps" && matches!(k.plural, "deployments" | "replicasets")
}

/// What the server sets on every write of `o` (replacing `old`): the generation
/// of controlled kinds, and their status kept from `old` when an API client
/// writes the main resource (kube-apiserver's `PrepareForUpdate`/`PrepareForCreate`
/// of `pkg/registry/apps/deployment/strategy.go`).
fn settle(k: Kind, old: Option<&Value>, o: &mut Value, w: &Write<'_>) {
    if !controlled(k) {
        return;
    }
    let old_generation = old.and_then(|o| o["metadata"]["generation"].as_i64());
    let generation = match old {
        None => 1,
        Some(old) if old["spec"] != o["spec"] => old_generation.unwrap_or(1) + 1,
        Some(_) => old_generation.unwrap_or(1),
    };
    o["metadata"]["generation"] = json!(generation);
    if w.manager.is_some() && !w.status {
        match old.map(|old| &old["status"]).filter(|s| !s.is_null()) {
            Some(status) => o["status"] = status.clone(),
            None => {
                if let Some(m) = o.as_object_mut() {
                    m.remove("status");
                }
            }
        }
    }
}

impl Shared {
    /// Create (POST), replace (PUT), patch (PATCH, `body` is the patch) or delete,
    /// untracked (no `managedFields` recorded) and without admission: the writes
    /// of seeding, generation and churn. Returns the status and the object or a
    /// `Status`.
    pub(in super::super) fn apply(
        &self,
        method: Method,
        k: Kind,
        namespace: &str,
        name: Option<&str>,
        body: Value,
    ) -> (StatusCode, Value) {
        self.write(Write::new(method, k, namespace, name, body))
    }

    /// One write (see [`Write`]): the status and the object or a `Status`.
    pub(in super::super) fn write(&self, w: Write<'_>) -> (StatusCode, Value) {
        let k = w.kind;
        let method = w.method.clone();
        let ns = if k.namespaced { w.namespace } else { "" };
        let body = w.body.clone();
        let mut store = self.lock();
        let name = w
            .name
            .map(str::to_owned)
            .or_else(|| body["metadata"]["name"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let key = key(k, ns, &name);
        let not_found = || {
            (
                StatusCode::NOT_FOUND,
                status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    &format!("{} \"{name}\" not found", k.id()),
                ),
            )
        };
        let old = store.objects.get(&key).map(|s| s.value());
        if w.admit
            && method != Method::DELETE
            && let Some(refused) = self.faults.refused(k, &name)
        {
            return (StatusCode::BAD_REQUEST, refused);
        }
        let now = now();
        let writer = w.manager.as_deref().map(|m| Writer {
            manager: m,
            api_version: &w.api_version,
            status: w.status,
            now: &now,
        });
        let (event, object, code) = match method {
            Method::POST => {
                if name.is_empty() {
                    return (
                        StatusCode::UNPROCESSABLE_ENTITY,
                        status(
                            StatusCode::UNPROCESSABLE_ENTITY,
                            "Invalid",
                            "metadata.name: Required value",
                        ),
                    );
                }
                if w.lifecycle
                    && let Some(refused) = refusal(&store, k, ns, &name)
                {
                    return refused;
                }
                if old.is_some() {
                    return (
                        StatusCode::CONFLICT,
                        status(
                            StatusCode::CONFLICT,
                            "AlreadyExists",
                            &format!("{} \"{name}\" already exists", k.id()),
                        ),
                    );
                }
                let mut o = match (&writer, w.apply) {
                    (Some(wr), true) => match ssa::apply(None, &body, wr, w.force) {
                        Ok(o) => o,
                        Err(status) => return (StatusCode::CONFLICT, status),
                    },
                    _ => body,
                };
                store.uid += 1;
                let uid = format!("00000000-0000-4000-8000-{:012x}", store.uid);
                o["apiVersion"] = json!(k.storage_api_version());
                o["kind"] = json!(k.kind);
                o["metadata"]["uid"] = json!(uid);
                // Seeded and generated objects keep one fixed time (the same cluster
                // for the same seed); what clients and controllers create, now.
                o["metadata"]["creationTimestamp"] = if w.manager.is_some() {
                    json!(now)
                } else {
                    json!("2026-01-01T00:00:00Z")
                };
                if k.namespaced {
                    o["metadata"]["namespace"] = json!(ns);
                }
                if k.kind == "Pod" && o["status"]["phase"].is_null() {
                    o["status"]["phase"] = json!("Pending");
                }
                ("ADDED", o, StatusCode::CREATED)
            }
            Method::PUT => {
                let Some(old) = &old else {
                    return not_found();
                };
                let want = body["metadata"]["resourceVersion"].as_str();
                if want.is_some_and(|w| Some(w) != old["metadata"]["resourceVersion"].as_str()) {
                    return (
                        StatusCode::CONFLICT,
                        status(
                            StatusCode::CONFLICT,
                            "Conflict",
                            &format!(
                                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                                k.id()
                            ),
                        ),
                    );
                }
                let mut o = body;
                for field in ["deletionTimestamp", "managedFields"] {
                    if o["metadata"][field].is_null() && !old["metadata"][field].is_null() {
                        o["metadata"][field] = old["metadata"][field].clone();
                    }
                }
                o["metadata"]["uid"] = old["metadata"]["uid"].clone();
                o["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"].clone();
                if k.namespaced {
                    o["metadata"]["namespace"] = json!(ns);
                }
                o["apiVersion"] = json!(k.storage_api_version());
                o["kind"] = json!(k.kind);
                ("MODIFIED", o, StatusCode::OK)
            }
            Method::PATCH => {
                let Some(old) = &old else {
                    return not_found();
                };
                let o = match (&writer, w.apply) {
                    (Some(wr), true) => match ssa::apply(Some(old), &body, wr, w.force) {
                        Ok(o) => o,
                        Err(status) => return (StatusCode::CONFLICT, status),
                    },
                    _ => {
                        let mut o = old.clone();
                        json_patch::merge(&mut o, &body);
                        o
                    }
                };
                ("MODIFIED", o, StatusCode::OK)
            }
            Method::DELETE => {
                let Some(o) = old.clone() else {
                    return not_found();
                };
                ("DELETED", o, StatusCode::OK)
            }
            _ => {
                return (
                    StatusCode::METHOD_NOT_ALLOWED,
                    status(
                        StatusCode::METHOD_NOT_ALLOWED,
                        "MethodNotAllowed",
                        "method not allowed",
                    ),
                );
            }
        };
        let mut object = object;
        if event != "DELETED" {
            settle(k, old.as_ref(), &mut object, &w);
            if let Some(wr) = &writer
                && !w.apply
            {
                ssa::record_update(old.as_ref(), &mut object, wr);
            }
            if w.admit
                && let Err(invalid) = validate(k, &object)
            {
                return (StatusCode::UNPROCESSABLE_ENTITY, invalid);
            }
            if w.dry_run {
                return (code, object);
            }
        } else if w.dry_run {
            return (code, object);
        }
        store.rv += 1;
        let rv = store.rv;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let stored = Arc::new(Stored::new(&object));
        if event == "DELETED" {
            store.objects.remove(&key);
        } else {
            store.objects.insert(key, stored.clone());
        }
        let e = Event {
            rv,
            resource: k,
            kind: event,
            object: stored,
        };
        store.history.push_back(e.clone());
        while store.history.len() > self.history_limit {
            store.history.pop_front();
        }
        drop(store);
        let _ = self.events.send(e);
        (code, object)
    }
}

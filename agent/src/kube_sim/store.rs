//! The object store: one lock around every object, the resource version counter and
//! the recent change history; each write is broadcast to live watches.
//!
//! Objects are kept as JSON text (with the few fields selectors read, parsed), shared
//! between the store and the history: a parsed `serde_json::Value` takes about 14
//! times the room of its text, which at 50,000 objects is over half a GiB (RSS of
//! `podgate kube-sim --objects 50000`: 703 MB as `Value`s, 122 MB as text).

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::access::Access;
use super::http::status;
use super::paging::Snapshots;
use super::patch::merge;
use super::resources::{Key, Kind, key};
use super::selector::{fields_match, labels_match, parse_selector};

/// One change, as watches see it.
#[derive(Clone, Debug)]
pub(super) struct Event {
    pub(super) rv: u64,
    pub(super) resource: Kind,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub(super) kind: &'static str,
    pub(super) object: Arc<Stored>,
}

/// A stored object: its JSON text, and what selectors read parsed.
#[derive(Debug)]
pub(super) struct Stored {
    pub(super) text: Box<str>,
    pub(super) index: Index,
}

/// The fields of an object selectors read: `metadata.name`, `metadata.namespace`,
/// `metadata.labels`, `status.phase` (plain strings: a parsed `Value` of them
/// alone takes kilobytes).
#[derive(Debug)]
pub(super) struct Index {
    name: Box<str>,
    namespace: Box<str>,
    labels: Box<[(Box<str>, Box<str>)]>,
    phase: Box<str>,
}

impl Index {
    fn of(o: &Value) -> Self {
        let s = |v: &Value| v.as_str().unwrap_or("").into();
        let m = &o["metadata"];
        Index {
            name: s(&m["name"]),
            namespace: s(&m["namespace"]),
            labels: m["labels"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| Some((k.as_str().into(), v.as_str()?.into())))
                .collect(),
            phase: s(&o["status"]["phase"]),
        }
    }

    fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| &**k == key)
            .map(|(_, v)| &**v)
    }

    fn field(&self, field: &str) -> Option<&str> {
        Some(match field {
            "metadata.name" => &self.name,
            "metadata.namespace" => &self.namespace,
            "status.phase" if !self.phase.is_empty() => &self.phase,
            _ => return None,
        })
    }
}

impl Stored {
    fn new(o: &Value) -> Self {
        Stored {
            text: o.to_string().into_boxed_str(),
            index: Index::of(o),
        }
    }

    /// `metadata.namespace`.
    pub(super) fn index_namespace(&self) -> &str {
        &self.index.namespace
    }

    /// `metadata.name`.
    pub(super) fn index_name(&self) -> &str {
        &self.index.name
    }

    /// The object, parsed.
    pub(super) fn value(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }

    /// The object's text as served in `version` of `k` (see [`as_version`]).
    pub(super) fn text_in(&self, k: Kind, version: &str) -> Cow<'_, str> {
        if version == k.versions[0] {
            Cow::Borrowed(&self.text)
        } else {
            Cow::Owned(as_version(k, version, self.value()).to_string())
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Store {
    pub(super) rv: u64,
    /// (resource id, namespace, name) → object, in the stored version.
    pub(super) objects: BTreeMap<Key, Arc<Stored>>,
    /// Recent events, oldest first; older ones are compacted away.
    pub(super) history: VecDeque<Event>,
    uid: u64,
}

impl Store {
    /// The stored objects of kind `k`, in key order.
    pub(super) fn of(&self, k: Kind) -> impl Iterator<Item = (&Key, &Arc<Stored>)> {
        let id = k.id();
        self.objects
            .range((id.clone(), String::new(), String::new())..)
            .take_while(move |((r, _, _), _)| *r == id)
    }

    /// The stored objects of kind `k` in namespace `ns`, in name order.
    pub(super) fn in_namespace<'a>(
        &'a self,
        k: Kind,
        ns: &'a str,
    ) -> impl Iterator<Item = (&'a Key, &'a Arc<Stored>)> {
        let id = k.id();
        self.objects
            .range((id.clone(), ns.to_owned(), String::new())..)
            .take_while(move |((r, n, _), _)| *r == id && n == ns)
    }
}

/// `o` (stored in `k`'s preferred version) as served in `version`: only `apiVersion`
/// differs, as for a CustomResourceDefinition with conversion strategy `None`.
pub(super) fn as_version(k: Kind, version: &str, mut o: Value) -> Value {
    if version != k.versions[0] && o["kind"] == k.kind {
        o["apiVersion"] = json!(k.api_version(version));
    }
    o
}

/// What the HTTP side and the handle share.
pub(super) struct Shared {
    store: Mutex<Store>,
    /// Denied resources and the audit log.
    pub(super) access: Access,
    pub(super) events: broadcast::Sender<Event>,
    /// The snapshots paged lists are served from.
    pub(super) pages: Snapshots,
    history_limit: usize,
    pub(super) bookmark_every: Duration,
}

impl Shared {
    /// An empty store keeping `history_limit` events (at least one) for resumption.
    pub(super) fn new(history_limit: usize) -> Self {
        Shared {
            store: Mutex::new(Store {
                rv: 100,
                ..Store::default()
            }),
            access: Access::default(),
            events: broadcast::channel(4096).0,
            pages: Snapshots::default(),
            history_limit: history_limit.max(1),
            bookmark_every: Duration::from_millis(500),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Create (POST), replace (PUT), patch (PATCH, `body` is the patch) or delete;
    /// returns the status and the object or a `Status`.
    pub(super) fn apply(
        &self,
        method: Method,
        k: Kind,
        namespace: &str,
        name: Option<&str>,
        body: Value,
    ) -> (StatusCode, Value) {
        let ns = if k.namespaced { namespace } else { "" };
        let mut store = self.lock();
        let name = name
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
                if store.objects.contains_key(&key) {
                    return (
                        StatusCode::CONFLICT,
                        status(
                            StatusCode::CONFLICT,
                            "AlreadyExists",
                            &format!("{} \"{name}\" already exists", k.id()),
                        ),
                    );
                }
                let mut o = body;
                store.uid += 1;
                let uid = format!("00000000-0000-4000-8000-{:012x}", store.uid);
                o["apiVersion"] = json!(k.storage_api_version());
                o["kind"] = json!(k.kind);
                o["metadata"]["uid"] = json!(uid);
                o["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
                if k.namespaced {
                    o["metadata"]["namespace"] = json!(ns);
                }
                if k.kind == "Pod" && o["status"]["phase"].is_null() {
                    o["status"]["phase"] = json!("Pending");
                }
                ("ADDED", o, StatusCode::CREATED)
            }
            Method::PUT => {
                let Some(old) = store.objects.get(&key).map(|s| s.value()) else {
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
                let Some(mut o) = store.objects.get(&key).map(|s| s.value()) else {
                    return not_found();
                };
                merge(&mut o, &body);
                ("MODIFIED", o, StatusCode::OK)
            }
            Method::DELETE => {
                let Some(o) = store.objects.remove(&key).map(|s| s.value()) else {
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
        store.rv += 1;
        let rv = store.rv;
        let mut object = object;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let stored = Arc::new(Stored::new(&object));
        if event != "DELETED" {
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

    /// Whether `o` is in `namespace` (all namespaces when `None`) and meets the
    /// `labelSelector` and `fieldSelector` of query `q`; an error is a bad selector.
    pub(super) fn matching(
        &self,
        k: Kind,
        namespace: Option<&str>,
        q: &BTreeMap<String, String>,
        o: &Index,
    ) -> Result<bool, String> {
        if k.namespaced
            && let Some(ns) = namespace
            && &*o.namespace != ns
        {
            return Ok(false);
        }
        if let Some(sel) = q.get("labelSelector")
            && !labels_match(&parse_selector(sel)?, |l| o.label(l))
        {
            return Ok(false);
        }
        match q.get("fieldSelector") {
            Some(sel) => fields_match(sel, |f| o.field(f)),
            None => Ok(true),
        }
    }
}

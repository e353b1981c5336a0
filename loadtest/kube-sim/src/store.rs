//! The object store: one lock around every object, the resource version counter and
//! the recent change history; each write is broadcast to live watches.
//!
//! Objects are kept as JSON text (with the few fields selectors read, parsed), shared
//! between the store and the history: a parsed `serde_json::Value` takes about 14
//! times the room of its text, which at 50,000 objects is over half a GiB (RSS of
//! `podgate kube-sim --objects 50000`: 703 MB as `Value`s, 122 MB as text).
//!
//! Layout: this file (the objects, their indexes, the history and [`Shared`]);
//! `write` (one write: [`Write`] and [`Shared::write`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::Settings;
use super::access::Access;
use super::faults::Faults;
use super::paging::Snapshots;
use super::resources::{Key, Kind};
use super::selector::{fields_match, labels_match, parse_selector};

mod write;

pub(super) use write::Write;

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
    /// `metadata.name`.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// `metadata.namespace`.
    pub(super) fn namespace(&self) -> &str {
        &self.namespace
    }

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

/// The current time as the API writes timestamps (RFC 3339, seconds, UTC).
pub(super) fn now() -> String {
    humantime_serde::re::humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
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
    /// Refusals (`KubeSim::refuse`).
    pub(super) faults: Faults,
    /// Delays and factors of the controllers and namespace deletion.
    pub(super) settings: Mutex<Settings>,
    /// Woken when the settings change (timers waiting on them look again).
    pub(super) settings_changed: tokio::sync::Notify,
    /// Containers' logs and main processes (`streams`).
    pub(super) containers: super::streams::Containers,
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
            faults: Faults::default(),
            settings: Mutex::new(Settings::default()),
            settings_changed: tokio::sync::Notify::new(),
            containers: Default::default(),
        }
    }

    /// The settings in force.
    pub(super) fn settings(&self) -> Settings {
        self.settings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
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

//! The watches of one request: kube-runtime's [`watcher`] per (namespace, resource),
//! or per resource cluster-wide when the request filters no namespaces, plus a
//! watch on namespaces when the set of namespaces to watch depends on their labels,
//! fields or a CEL expression. Each watch ingests its objects in its own task and
//! sends the results to the graph task; dropping a [`Watch`] stops it.

use std::sync::Arc;

use futures_util::StreamExt as _;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use tokio::sync::mpsc;

use super::ingest::{Ingested, Problem, Resolver, ingest};
use super::state::VertexKey;
use podgate_agent::graph::request::Compiled;

/// What a watch reports to the graph task.
pub(crate) enum WatchEvent {
    /// A (re)list began: list generation `generation`.
    Init,
    /// An object added, changed, or listed.
    Object {
        watch: u32,
        ingested: Ingested,
        problem: Option<Problem>,
    },
    /// An object deleted.
    Deleted { key: VertexKey },
    /// The (re)list of generation `generation` is complete.
    Synced { watch: u32, generation: u32 },
    /// Listing or watching failed (the watcher retries with back-off).
    Failed { watch: u32, error: String },
    /// The namespace watch: a namespace appeared or changed.
    Namespace { object: Value },
    /// The namespace watch: a namespace is gone.
    NamespaceDeleted { name: String },
    /// The namespace watch listed every namespace.
    NamespacesSynced,
    /// The namespace watch failed.
    NamespacesFailed { error: String },
}

/// A running watch; dropping it stops the task.
pub(crate) struct Watch(tokio::task::JoinHandle<()>);

impl Drop for Watch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn api_resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// Watch resource `gvr_index` (in `namespace`, or everywhere when `None`). The
/// initial list waits for a permit of `lists`, held until it completes or fails, so
/// that a request over many resources does not hold all their first pages at once.
#[allow(clippy::too_many_arguments)]
pub(crate) fn start(
    lists: Arc<tokio::sync::Semaphore>,
    client: kube::Client,
    request: Arc<Compiled>,
    resolver: Arc<Resolver>,
    gvr_index: u16,
    namespace: Option<String>,
    watch: u32,
    events: mpsc::Sender<WatchEvent>,
) -> Watch {
    Watch(tokio::spawn(async move {
        let gvr = &resolver.gvrs()[usize::from(gvr_index)];
        let ar = api_resource(&gvr.group, &gvr.version, &gvr.kind, &gvr.resource);
        let api: Api<DynamicObject> = match &namespace {
            Some(ns) => Api::namespaced_with(client, ns, &ar),
            None => Api::all_with(client, &ar),
        };
        let mut config = watcher::Config::default();
        if let podgate_agent::graph::request::CompiledQuery::Include {
            label_selector,
            field_selector,
            ..
        } = &request.queries[gvr.query]
        {
            if !label_selector.is_empty() {
                config = config.labels(label_selector);
            }
            if !field_selector.is_empty() {
                config = config.fields(field_selector);
            }
        }
        let mut stream = watcher::watcher(api, config).default_backoff().boxed();
        let mut generation = 0u32;
        let mut failing = false;
        let mut permit = lists.acquire_owned().await.ok();
        while let Some(item) = stream.next().await {
            if matches!(item, Ok(Event::InitDone) | Err(_)) {
                permit.take();
            }
            let event = match item {
                Ok(Event::Init) => {
                    generation = generation.wrapping_add(1);
                    WatchEvent::Init
                }
                Ok(Event::InitApply(o) | Event::Apply(o)) => {
                    failing = false;
                    let obj = match serde_json::to_value(&o) {
                        Ok(v) => v,
                        Err(_) => continue,
                    };
                    let (ingested, problem) =
                        ingest(&request, &resolver, gvr_index, obj, watch, generation);
                    WatchEvent::Object {
                        watch,
                        ingested,
                        problem,
                    }
                }
                Ok(Event::Delete(o)) => {
                    let ns = if gvr.namespaced {
                        o.metadata.namespace.as_deref().unwrap_or("")
                    } else {
                        ""
                    };
                    let name = o.metadata.name.as_deref().unwrap_or("");
                    WatchEvent::Deleted {
                        key: VertexKey::new(gvr_index, resolver.namespace(ns), name),
                    }
                }
                Ok(Event::InitDone) => {
                    failing = false;
                    WatchEvent::Synced { watch, generation }
                }
                Err(e) => {
                    if std::mem::replace(&mut failing, true) {
                        continue;
                    }
                    WatchEvent::Failed {
                        watch,
                        error: e.to_string(),
                    }
                }
            };
            if events.send(event).await.is_err() {
                return;
            }
        }
    }))
}

/// Watch namespaces (with the request's namespace label and field selectors).
pub(crate) fn start_namespaces(
    client: kube::Client,
    request: Arc<Compiled>,
    events: mpsc::Sender<WatchEvent>,
) -> Watch {
    Watch(tokio::spawn(async move {
        let ar = api_resource("", "v1", "Namespace", "namespaces");
        let api: Api<DynamicObject> = Api::all_with(client, &ar);
        let mut config = watcher::Config::default();
        let ns = &request.namespaces;
        if !ns.label_selector.is_empty() {
            config = config.labels(&ns.label_selector);
        }
        if !ns.field_selector.is_empty() {
            config = config.fields(&ns.field_selector);
        }
        let mut stream = watcher::watcher(api, config).default_backoff().boxed();
        let mut failing = false;
        let mut listed: Vec<String> = Vec::new();
        let mut known: Vec<String> = Vec::new();
        while let Some(item) = stream.next().await {
            let out: Vec<WatchEvent> = match item {
                Ok(Event::Init) => {
                    listed.clear();
                    Vec::new()
                }
                Ok(Event::InitApply(o)) => {
                    failing = false;
                    listed.push(o.metadata.name.clone().unwrap_or_default());
                    vec![namespace_event(&o)]
                }
                Ok(Event::Apply(o)) => {
                    let name = o.metadata.name.clone().unwrap_or_default();
                    if !known.contains(&name) {
                        known.push(name);
                    }
                    vec![namespace_event(&o)]
                }
                Ok(Event::Delete(o)) => {
                    let name = o.metadata.name.clone().unwrap_or_default();
                    known.retain(|n| *n != name);
                    vec![WatchEvent::NamespaceDeleted { name }]
                }
                Ok(Event::InitDone) => {
                    // Namespaces gone while the watch was broken.
                    let mut out: Vec<WatchEvent> = known
                        .iter()
                        .filter(|n| !listed.contains(n))
                        .map(|n| WatchEvent::NamespaceDeleted { name: n.clone() })
                        .collect();
                    known = std::mem::take(&mut listed);
                    out.push(WatchEvent::NamespacesSynced);
                    out
                }
                Err(e) => {
                    if std::mem::replace(&mut failing, true) {
                        continue;
                    }
                    vec![WatchEvent::NamespacesFailed {
                        error: e.to_string(),
                    }]
                }
            };
            for e in out {
                if events.send(e).await.is_err() {
                    return;
                }
            }
        }
    }))
}

fn namespace_event(o: &DynamicObject) -> WatchEvent {
    WatchEvent::Namespace {
        object: serde_json::to_value(o).unwrap_or(Value::Null),
    }
}

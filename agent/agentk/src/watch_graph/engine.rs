//! One request's engine: the graph task. It starts the watches (per resource, or per
//! namespace and resource as the namespace filter decides), merges what they ingest
//! into the graph, warns about watches that do not sync in time, and sends batches:
//! the first once everything has synced or been warned about, then one per batch
//! interval while things change.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use prost::Message as _;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::Status;

use super::discovery::{self, Gvr};
use super::informers::{self, Watch, WatchEvent};
use super::ingest::{Ingested, Resolver};
use super::state::{Graph, VertexKey};
use super::{Settings, encode_batches, impersonating};
use podgate_agent::graph::cel::ObjectVars;
use podgate_agent::graph::request::Compiled;
use podgate_agent::proto::kubernetes_api::{Warning, WatchGraphRequest};

/// Initial lists one request runs at once: enough to keep two cores busy while
/// pages are decoded, few enough that a request over dozens of resources does not
/// hold all their first pages in memory together.
const LISTS_AT_ONCE: usize = 4;

fn warning(t: &str, m: String, attrs: &[(&str, &str)]) -> Warning {
    Warning {
        r#type: t.to_owned(),
        message: m,
        attributes: attrs
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

/// Adds `n` to a gauge while alive.
struct GaugeGuard(Option<prometheus::IntGauge>, i64);

impl GaugeGuard {
    fn new(g: Option<&prometheus::IntGauge>, n: i64) -> GaugeGuard {
        if let Some(g) = g {
            g.add(n);
        }
        GaugeGuard(g.cloned(), n)
    }

    /// Now `n` instead.
    fn set(&mut self, n: i64) {
        if let Some(g) = &self.0 {
            g.add(n - self.1);
        }
        self.1 = n;
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        if let Some(g) = &self.0 {
            g.sub(self.1);
        }
    }
}

/// One watch's bookkeeping.
struct WatchInfo {
    gvr: u16,
    namespace: Option<String>,
    _watch: Watch,
    _counted: GaugeGuard,
    started: Instant,
    synced: bool,
    warned: bool,
}

/// The request's running state: graph, watches, namespaces, output.
struct Engine {
    client: kube::Client,
    request: Arc<Compiled>,
    resolver: Arc<Resolver>,
    settings: Settings,
    graph: Graph,
    /// Initial lists in flight at once.
    lists: Arc<tokio::sync::Semaphore>,
    events_tx: mpsc::Sender<WatchEvent>,
    watches: HashMap<u32, WatchInfo>,
    next_watch: u32,
    /// Namespaces watched (per-namespace mode).
    namespaces: HashSet<String>,
    per_namespace: bool,
    namespaces_synced: bool,
    warnings: Vec<Warning>,
    object_warned: HashSet<VertexKey>,
    initial_sent: bool,
    out: mpsc::Sender<Result<Vec<u8>, Status>>,
    _request: GaugeGuard,
    objects: GaugeGuard,
}

pub(super) async fn run(
    client: kube::Client,
    payload: Vec<u8>,
    settings: Settings,
    out: mpsc::Sender<Result<Vec<u8>, Status>>,
) -> Result<(), Status> {
    let req = WatchGraphRequest::decode(payload.as_slice())
        .map_err(|_| Status::invalid_argument("undecodable WatchGraph request"))?;
    let request = podgate_agent::graph::request::compile(&req.request_json)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    let client = match &req.impersonation {
        Some(imp) => impersonating(client, imp)?,
        None => client,
    };
    let mut warnings = Vec::new();
    let found = discovery::discover(&client).await;
    for f in found.failures {
        warnings.push(warning("DISCOVERY_FAILED", f, &[]));
    }
    let mut errors = Vec::new();
    let gvrs: Arc<[Gvr]> = discovery::select(&request, &found.resources, &mut errors).into();
    for e in errors {
        warnings.push(warning("INTERNAL_ERROR", e, &[]));
    }
    let ns = &request.namespaces;
    let per_namespace = !ns.names.is_empty()
        || !ns.label_selector.is_empty()
        || !ns.field_selector.is_empty()
        || ns.object.is_some();
    let roots: Option<Vec<_>> = request
        .roots
        .as_ref()
        .map(|r| r.ignore_arc_direction.clone());
    let (events_tx, events) = mpsc::channel(1024);
    let settings_metrics = settings.metrics.clone();
    let mut engine = Engine {
        graph: Graph::new(gvrs.clone(), roots.as_deref()),
        resolver: Arc::new(Resolver::new(gvrs)),
        lists: Arc::new(tokio::sync::Semaphore::new(LISTS_AT_ONCE)),
        request: Arc::new(request),
        client,
        settings,
        events_tx,
        watches: HashMap::new(),
        next_watch: 0,
        namespaces: HashSet::new(),
        per_namespace,
        namespaces_synced: true,
        warnings,
        object_warned: HashSet::new(),
        initial_sent: false,
        out,
        _request: GaugeGuard::new(settings_metrics.as_ref().map(|m| &m.requests), 1),
        objects: GaugeGuard::new(settings_metrics.as_ref().map(|m| &m.objects), 0),
    };
    engine.start().await;
    engine.run(events).await;
    Ok(())
}

impl Engine {
    fn start_watch(&mut self, gvr: u16, namespace: Option<String>) {
        let id = self.next_watch;
        self.next_watch += 1;
        let watch = informers::start(
            self.lists.clone(),
            self.client.clone(),
            self.request.clone(),
            self.resolver.clone(),
            gvr,
            namespace.clone(),
            id,
            self.events_tx.clone(),
        );
        let counted = GaugeGuard::new(self.settings.metrics.as_ref().map(|m| &m.informers), 1);
        self.watches.insert(
            id,
            WatchInfo {
                gvr,
                namespace,
                _watch: watch,
                _counted: counted,
                started: Instant::now(),
                synced: false,
                warned: false,
            },
        );
    }

    async fn start(&mut self) {
        let gvrs = self.resolver.gvrs().clone();
        for (i, g) in gvrs.iter().enumerate() {
            let i = u16::try_from(i).unwrap_or(u16::MAX);
            if !g.namespaced || !self.per_namespace {
                self.start_watch(i, None);
            }
        }
        if !self.per_namespace {
            return;
        }
        let ns = &self.request.namespaces;
        if !ns.names.is_empty() && ns.object.is_none() {
            let names: Vec<String> = ns.names.clone();
            for n in names {
                self.add_namespace(n);
            }
        } else {
            self.namespaces_synced = false;
            let w = informers::start_namespaces(
                self.client.clone(),
                self.request.clone(),
                self.events_tx.clone(),
            );
            // Namespace watch: kept alive under an id no object watch uses.
            let counted = GaugeGuard::new(self.settings.metrics.as_ref().map(|m| &m.informers), 1);
            self.watches.insert(
                u32::MAX,
                WatchInfo {
                    gvr: u16::MAX,
                    namespace: None,
                    _watch: w,
                    _counted: counted,
                    started: Instant::now(),
                    synced: false,
                    warned: false,
                },
            );
        }
    }

    fn add_namespace(&mut self, name: String) {
        if !self.namespaces.insert(name.clone()) {
            return;
        }
        let gvrs = self.resolver.gvrs().clone();
        for (i, g) in gvrs.iter().enumerate() {
            if g.namespaced {
                self.start_watch(u16::try_from(i).unwrap_or(u16::MAX), Some(name.clone()));
            }
        }
    }

    fn remove_namespace(&mut self, name: &str) {
        if !self.namespaces.remove(name) {
            return;
        }
        let gone: HashSet<u32> = self
            .watches
            .iter()
            .filter(|(id, w)| **id != u32::MAX && w.namespace.as_deref() == Some(name))
            .map(|(id, _)| *id)
            .collect();
        for id in &gone {
            self.watches.remove(id);
        }
        self.graph.remove_watches(|w| gone.contains(&w));
    }

    /// Whether a namespace object passes `names` and the namespace expression.
    fn namespace_selected(&mut self, obj: &Value) -> Option<(String, bool)> {
        let name = obj.pointer("/metadata/name")?.as_str()?.to_owned();
        let ns = &self.request.namespaces;
        if !ns.names.is_empty() && !ns.names.contains(&name) {
            return Some((name, false));
        }
        let Some(expr) = &ns.object else {
            return Some((name, true));
        };
        let vars = ObjectVars {
            obj,
            group: "",
            version: "v1",
            resource: "namespaces",
            namespace: "",
            name: &name,
        };
        match expr.eval_object(&vars) {
            Ok(b) => Some((name, b)),
            Err(e) => {
                let w = warning(
                    "NAMESPACE_LIST_FAILED",
                    format!("namespaces.object_selector_expression on {name}: {e}"),
                    &[("ns", &name)],
                );
                self.warnings.push(w);
                Some((name, false))
            }
        }
    }

    fn on_event(&mut self, ev: WatchEvent) {
        match ev {
            WatchEvent::Init => {}
            WatchEvent::Object {
                watch,
                ingested,
                problem,
            } => {
                // Events of a watch stopped meanwhile (namespace gone) are dropped.
                if !self.watches.contains_key(&watch) {
                    return;
                }
                if let Some(p) = problem
                    && self.object_warned.insert(p.key.clone())
                {
                    let g = &self.resolver.gvrs()[usize::from(p.key.gvr())];
                    let w = warning(
                        "OBJECT_PROCESSING_FAILED",
                        p.message,
                        &[
                            ("g", &g.group),
                            ("v", &g.version),
                            ("r", &g.resource),
                            ("ns", p.key.namespace()),
                            ("n", p.key.name()),
                        ],
                    );
                    self.warnings.push(w);
                }
                match ingested {
                    Ingested::Keep(key, node) => self.graph.upsert(key, node),
                    Ingested::Drop(key) => self.graph.remove(&key),
                }
            }
            WatchEvent::Deleted { key } => self.graph.remove(&key),
            WatchEvent::Synced { watch, generation } => {
                if let Some(w) = self.watches.get_mut(&watch) {
                    w.synced = true;
                    self.graph.remove_stale(watch, generation);
                }
            }
            WatchEvent::Failed { watch, error } => {
                if let Some(w) = self.watches.get(&watch) {
                    tracing::debug!(%error, gvr = w.gvr, ns = ?w.namespace, "graph watch failing");
                }
            }
            WatchEvent::Namespace { object } => {
                if let Some((name, selected)) = self.namespace_selected(&object) {
                    if selected {
                        self.add_namespace(name);
                    } else {
                        self.remove_namespace(&name);
                    }
                }
            }
            WatchEvent::NamespaceDeleted { name } => self.remove_namespace(&name),
            WatchEvent::NamespacesSynced => {
                self.namespaces_synced = true;
                if let Some(w) = self.watches.get_mut(&u32::MAX) {
                    w.synced = true;
                }
            }
            WatchEvent::NamespacesFailed { error } => {
                let w = warning(
                    "NAMESPACE_LIST_FAILED",
                    format!("Failed to list namespaces: {error}"),
                    &[],
                );
                self.warnings.push(w);
            }
        }
    }

    /// Watches that have not synced and have not been warned about, by deadline.
    fn next_sync_deadline(&self) -> Option<Instant> {
        self.watches
            .values()
            .filter(|w| !w.synced && !w.warned)
            .map(|w| w.started + self.settings.sync_timeout)
            .min()
    }

    fn sync_timeouts(&mut self, now: Instant) {
        let secs = self.settings.sync_timeout.as_secs_f64();
        let mut new = Vec::new();
        for w in self.watches.values_mut() {
            if w.synced || w.warned || w.started + self.settings.sync_timeout > now {
                continue;
            }
            w.warned = true;
            if w.gvr == u16::MAX {
                new.push(warning(
                    "NAMESPACE_LIST_FAILED",
                    format!("Failed to list namespaces in {secs} seconds. Check agent's log, agent's permissions"),
                    &[],
                ));
                continue;
            }
            let g = &self.resolver.gvrs()[usize::from(w.gvr)];
            let ns = w.namespace.as_deref().unwrap_or("");
            let at = if ns.is_empty() {
                String::new()
            } else {
                format!(" in {ns}")
            };
            let gv = if g.group.is_empty() {
                g.version.to_string()
            } else {
                format!("{}/{}", g.group, g.version)
            };
            new.push(warning(
                "INFORMER_SYNC_FAILED",
                format!(
                    "Failed to sync informer for {gv}/{}{at} in {secs} seconds. Check agent's log, agent's permissions",
                    g.resource
                ),
                &[("g", &g.group), ("v", &g.version), ("r", &g.resource), ("ns", ns)],
            ));
        }
        self.warnings.extend(new);
    }

    /// Every watch started so far has synced or been warned about.
    fn initial_done(&self) -> bool {
        self.namespaces_synced && self.watches.values().all(|w| w.synced || w.warned)
    }

    async fn send(&mut self) -> bool {
        let actions = self.graph.flush();
        let warnings = std::mem::take(&mut self.warnings);
        self.objects
            .set(i64::try_from(self.graph.len()).unwrap_or(i64::MAX));
        if actions.is_empty() && warnings.is_empty() && self.initial_sent {
            return true;
        }
        if let Some(m) = &self.settings.metrics {
            m.actions.inc_by(actions.len() as u64);
            for w in &warnings {
                m.warning(&w.r#type);
            }
        }
        self.initial_sent = true;
        for msg in encode_batches(actions, warnings, self.settings.max_message_bytes) {
            if self.out.send(Ok(msg)).await.is_err() {
                return false;
            }
        }
        true
    }

    async fn run(mut self, mut events: mpsc::Receiver<WatchEvent>) {
        let mut flush_at: Option<Instant> = None;
        loop {
            let sync_deadline = self.next_sync_deadline();
            tokio::select! {
                ev = events.recv() => {
                    let Some(ev) = ev else { return };
                    self.on_event(ev);
                    // Take what else is queued before deciding anything.
                    while let Ok(ev) = events.try_recv() {
                        self.on_event(ev);
                    }
                }
                () = sleep_opt(sync_deadline) => {
                    self.sync_timeouts(Instant::now());
                }
                () = sleep_opt(flush_at) => {
                    flush_at = None;
                    if !self.send().await {
                        return;
                    }
                    continue;
                }
                () = self.out.closed() => return,
            }
            if !self.initial_sent {
                if self.initial_done() && !self.send().await {
                    return;
                }
                continue;
            }
            let dirty = self.graph.is_dirty() || !self.warnings.is_empty();
            if dirty && self.graph.pending() >= 20_000 {
                flush_at = None;
                if !self.send().await {
                    return;
                }
            } else if dirty && flush_at.is_none() {
                flush_at = Some(Instant::now() + self.settings.batch_interval);
            }
        }
    }
}

async fn sleep_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

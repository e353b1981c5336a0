//! The graph one `WatchGraph` request holds, and the actions that bring the client
//! up to date with it.
//!
//! Objects arrive already evaluated ([`super::ingest::Ingested`]: the payload to
//! send, root or not, references resolved to vertices), so only results are kept,
//! never whole objects. Changes mark vertices and arc sources dirty; [`Graph::flush`]
//! compares what should be on the client with what was sent and emits only the
//! difference, in an order a client can apply as it reads: `svx`, `darc`, `dvx`,
//! `sarc` (arcs to new vertices come after them; arcs whose destination was just
//! deleted come back with `e`).
//!
//! Rules (GitLab's Graph API design, its arcs and actions):
//! - one arc per (source, destination, type); owner-reference flags are OR-ed;
//! - `e` while the destination is absent (deleted, never existed, or its informer not
//!   synced), re-sent without `e` when it appears;
//! - with roots, a vertex is visible when a root reaches it along arcs (source →
//!   destination, both ways for the types in `ignore_arc_direction`); only visible
//!   vertices are sent, and only arcs from a visible source to a visible (or absent)
//!   destination. Visibility is recomputed after each batch of changes that can move
//!   it, and its difference sent as `svx`/`dvx`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use podgate_agent::graph::request::ArcType;
use podgate_agent::proto::kubernetes_api::{Action, action};

use super::discovery::Gvr;

/// A vertex: (watched resource, namespace, name). Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct VertexKey(Arc<(u16, Arc<str>, Box<str>)>);

impl VertexKey {
    pub(crate) fn new(gvr: u16, namespace: Arc<str>, name: &str) -> VertexKey {
        VertexKey(Arc::new((gvr, namespace, name.into())))
    }
    pub(crate) fn gvr(&self) -> u16 {
        self.0.0
    }
    pub(crate) fn namespace(&self) -> &str {
        &self.0.1
    }
    pub(crate) fn name(&self) -> &str {
        &self.0.2
    }
}

impl PartialEq for VertexKey {
    fn eq(&self, o: &Self) -> bool {
        Arc::ptr_eq(&self.0, &o.0) || (self.0.0 == o.0.0 && self.0.2 == o.0.2 && self.0.1 == o.0.1)
    }
}
impl Eq for VertexKey {}
impl Hash for VertexKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.0.hash(h);
        self.0.1.hash(h);
        self.0.2.hash(h);
    }
}

/// What `svx` carries for a vertex.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Payload {
    /// Nothing (Secrets; an empty object or array).
    None,
    /// `o`: the trimmed object, JSON.
    Object(Box<[u8]>),
    /// `j`: the JSONPath results, a JSON array.
    JsonPath(Box<[u8]>),
    /// Sent, and no longer needed: only a digest of it is kept, to tell whether a
    /// later version differs (without roots a sent vertex is never sent again
    /// unless it changes; with roots payloads are kept, as a vertex may leave the
    /// visible set and come back).
    Sent(u64),
}

impl Payload {
    /// A digest of the content (the same for equal contents).
    fn digest(&self) -> u64 {
        use std::hash::{DefaultHasher, Hash as _, Hasher as _};
        let mut h = DefaultHasher::new();
        match self {
            Payload::Sent(d) => return *d,
            Payload::None => 0u8.hash(&mut h),
            Payload::Object(b) => (1u8, b).hash(&mut h),
            Payload::JsonPath(b) => (2u8, b).hash(&mut h),
        }
        h.finish()
    }
}

/// An arc's attributes besides `e`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct OwnerFlags {
    pub(crate) controller: bool,
    pub(crate) block_owner_deletion: bool,
}

/// A resolved reference: the arc this object is the source of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OutArc {
    pub(crate) to: VertexKey,
    pub(crate) arc: ArcType,
    pub(crate) flags: OwnerFlags,
}

/// An object as kept: results only.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) payload: Payload,
    pub(crate) root: bool,
    /// Deduplicated, one per (destination, type).
    pub(crate) out: Box<[OutArc]>,
    /// The watch it came from and that watch's list generation (for relists).
    pub(crate) watch: u32,
    pub(crate) generation: u32,
}

/// An arc as sent: destination, type, flags, `e`.
type SentArc = (VertexKey, ArcType, OwnerFlags, bool);

/// The graph and what the client has of it.
pub(crate) struct Graph {
    gvrs: Arc<[Gvr]>,
    /// `Some` with roots: the arc types walked both ways.
    roots: Option<[bool; 3]>,
    nodes: HashMap<VertexKey, Node>,
    /// For each destination, the sources with an arc to it (and the arc type).
    incoming: HashMap<VertexKey, Vec<(VertexKey, ArcType)>>,
    visible: HashSet<VertexKey>,
    visibility_stale: bool,
    sent_vertices: HashSet<VertexKey>,
    sent_arcs: HashMap<VertexKey, Vec<SentArc>>,
    dirty_vertices: HashSet<VertexKey>,
    changed_payloads: HashSet<VertexKey>,
    dirty_sources: HashSet<VertexKey>,
}

fn type_index(t: ArcType) -> usize {
    match t {
        ArcType::OwnerReference => 0,
        ArcType::Reference => 1,
        ArcType::Transitive => 2,
    }
}

impl Graph {
    /// An empty graph over `gvrs`; `roots` lists the arc types walked both ways when
    /// the request has roots.
    pub(crate) fn new(gvrs: Arc<[Gvr]>, roots: Option<&[ArcType]>) -> Graph {
        Graph {
            gvrs,
            roots: roots.map(|ignore| {
                let mut both = [false; 3];
                for t in ignore {
                    both[type_index(*t)] = true;
                }
                both
            }),
            nodes: HashMap::new(),
            incoming: HashMap::new(),
            visible: HashSet::new(),
            visibility_stale: false,
            sent_vertices: HashSet::new(),
            sent_arcs: HashMap::new(),
            dirty_vertices: HashSet::new(),
            changed_payloads: HashSet::new(),
            dirty_sources: HashSet::new(),
        }
    }

    /// Objects held.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether anything waits to be flushed.
    pub(crate) fn is_dirty(&self) -> bool {
        !self.dirty_vertices.is_empty() || !self.dirty_sources.is_empty() || self.visibility_stale
    }

    /// Changes waiting (a measure for flushing early).
    pub(crate) fn pending(&self) -> usize {
        self.dirty_vertices.len() + self.dirty_sources.len()
    }

    fn touch_incoming(&mut self, key: &VertexKey) {
        if let Some(srcs) = self.incoming.get(key) {
            self.dirty_sources
                .extend(srcs.iter().map(|(s, _)| s.clone()));
        }
    }

    fn unlink(&mut self, key: &VertexKey, out: &[OutArc]) {
        for a in out {
            if let Some(srcs) = self.incoming.get_mut(&a.to) {
                srcs.retain(|(s, t)| !(s == key && *t == a.arc));
                if srcs.is_empty() {
                    self.incoming.remove(&a.to);
                }
            }
        }
    }

    /// Add or replace an object.
    pub(crate) fn upsert(&mut self, key: VertexKey, node: Node) {
        let mut moved = self.roots.is_some();
        match self.nodes.get(&key) {
            Some(old) => {
                if old.payload.digest() != node.payload.digest() {
                    self.changed_payloads.insert(key.clone());
                }
                if old.out == node.out {
                    moved = moved && old.root != node.root;
                } else {
                    let old_out = old.out.clone();
                    self.unlink(&key, &old_out);
                    self.link(&key, &node.out);
                    self.dirty_sources.insert(key.clone());
                }
            }
            None => {
                // New, or back after a delete within this batch: the client may hold
                // an older version, so it is sent whole either way.
                self.changed_payloads.insert(key.clone());
                self.link(&key, &node.out);
                self.dirty_sources.insert(key.clone());
                // Arcs to it lose `e`.
                self.touch_incoming(&key);
            }
        }
        self.visibility_stale |= moved;
        self.dirty_vertices.insert(key.clone());
        self.nodes.insert(key, node);
    }

    fn link(&mut self, key: &VertexKey, out: &[OutArc]) {
        for a in out {
            self.incoming
                .entry(a.to.clone())
                .or_default()
                .push((key.clone(), a.arc));
        }
    }

    /// Remove an object (deleted, filtered out, or its namespace no longer watched).
    pub(crate) fn remove(&mut self, key: &VertexKey) {
        if let Some(old) = self.nodes.remove(key) {
            self.unlink(key, &old.out);
            self.dirty_vertices.insert(key.clone());
            self.dirty_sources.insert(key.clone());
            self.touch_incoming(key);
            self.visibility_stale |= self.roots.is_some();
        }
    }

    /// Remove the objects of `watch` not seen since its list generation
    /// `generation` began (a relist after the watch broke).
    pub(crate) fn remove_stale(&mut self, watch: u32, generation: u32) {
        let stale: Vec<VertexKey> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.watch == watch && n.generation != generation)
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            self.remove(&k);
        }
    }

    /// Remove every object of the watches for which `drop` is true.
    pub(crate) fn remove_watches(&mut self, drop: impl Fn(u32) -> bool) {
        let gone: Vec<VertexKey> = self
            .nodes
            .iter()
            .filter(|(_, n)| drop(n.watch))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.remove(&k);
        }
    }

    /// Whether `key` is shown to the client (exists and, with roots, reachable).
    fn shown(&self, key: &VertexKey) -> bool {
        self.nodes.contains_key(key) && (self.roots.is_none() || self.visible.contains(key))
    }

    fn recompute_visibility(&mut self) {
        let Some(both) = self.roots else {
            return;
        };
        let mut seen: HashSet<VertexKey> = HashSet::with_capacity(self.visible.len());
        let mut queue: VecDeque<VertexKey> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.root)
            .map(|(k, _)| k.clone())
            .collect();
        seen.extend(queue.iter().cloned());
        while let Some(k) = queue.pop_front() {
            if let Some(n) = self.nodes.get(&k) {
                for a in n.out.iter() {
                    if self.nodes.contains_key(&a.to) && seen.insert(a.to.clone()) {
                        queue.push_back(a.to.clone());
                    }
                }
            }
            if let Some(srcs) = self.incoming.get(&k) {
                for (s, t) in srcs {
                    if both[type_index(*t)] && seen.insert(s.clone()) {
                        queue.push_back(s.clone());
                    }
                }
            }
        }
        // Vertices entering or leaving: their own vertex, their arcs, arcs to them.
        let changed: Vec<VertexKey> = seen.symmetric_difference(&self.visible).cloned().collect();
        self.visible = seen;
        for k in changed {
            self.dirty_vertices.insert(k.clone());
            self.dirty_sources.insert(k.clone());
            self.touch_incoming(&k);
        }
    }

    /// The actions that bring the client up to date, in the order to apply them.
    pub(crate) fn flush(&mut self) -> Vec<Action> {
        if std::mem::take(&mut self.visibility_stale) {
            self.recompute_visibility();
        }
        let mut set_vx = Vec::new();
        let mut del_vx = Vec::new();
        for key in std::mem::take(&mut self.dirty_vertices) {
            let want = self.shown(&key);
            let had = self.sent_vertices.contains(&key);
            let changed = self.changed_payloads.remove(&key);
            if want && (!had || changed) {
                let payload = &self.nodes[&key].payload;
                set_vx.push(self.set_vertex(&key, payload));
                if self.roots.is_none()
                    && let Some(n) = self.nodes.get_mut(&key)
                {
                    n.payload = Payload::Sent(n.payload.digest());
                }
                self.sent_vertices.insert(key);
            } else if !want && had {
                self.sent_vertices.remove(&key);
                del_vx.push(Action {
                    action: Some(action::Action::DeleteVertex(action::DeleteVertex {
                        vertex: Some(self.vertex(&key)),
                    })),
                });
            }
        }
        self.changed_payloads.clear();
        let mut set_arcs = Vec::new();
        let mut del_arcs = Vec::new();
        for src in std::mem::take(&mut self.dirty_sources) {
            let want: Vec<SentArc> = if self.shown(&src) {
                self.nodes[&src]
                    .out
                    .iter()
                    .filter_map(|a| {
                        let exists = self.nodes.contains_key(&a.to);
                        (!exists || self.shown(&a.to))
                            .then(|| (a.to.clone(), a.arc, a.flags, !exists))
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let had = self.sent_arcs.remove(&src).unwrap_or_default();
            for h in &had {
                if !want.iter().any(|w| w.0 == h.0 && w.1 == h.1) {
                    del_arcs.push(self.arc_action(&src, h, false));
                }
            }
            for w in &want {
                if !had.contains(w) {
                    set_arcs.push(self.arc_action(&src, w, true));
                }
            }
            if !want.is_empty() {
                self.sent_arcs.insert(src, want);
            }
        }
        let mut actions = set_vx;
        actions.append(&mut del_arcs);
        actions.append(&mut del_vx);
        actions.append(&mut set_arcs);
        actions
    }

    fn vertex(&self, key: &VertexKey) -> action::Vertex {
        let g = &self.gvrs[usize::from(key.gvr())];
        action::Vertex {
            group: g.group.to_string(),
            version: g.version.to_string(),
            resource: g.resource.to_string(),
            namespace: key.namespace().to_owned(),
            name: key.name().to_owned(),
        }
    }

    fn set_vertex(&self, key: &VertexKey, payload: &Payload) -> Action {
        let (object_json, json_path_json) = match payload {
            Payload::None => (Vec::new(), Vec::new()),
            Payload::Sent(_) => {
                // Not reached: a sent payload is only dropped where it is never
                // needed again (see `Payload::Sent`).
                tracing::warn!(vertex = key.name(), "graph: a dropped payload was needed");
                (Vec::new(), Vec::new())
            }
            Payload::Object(b) => (b.to_vec(), Vec::new()),
            Payload::JsonPath(b) => (Vec::new(), b.to_vec()),
        };
        Action {
            action: Some(action::Action::SetVertex(action::SetVertex {
                vertex: Some(self.vertex(key)),
                object_json,
                json_path_json,
            })),
        }
    }

    fn arc_action(&self, src: &VertexKey, a: &SentArc, set: bool) -> Action {
        let (source, destination) = (Some(self.vertex(src)), Some(self.vertex(&a.0)));
        let r#type = a.1.as_str().to_owned();
        Action {
            action: Some(if set {
                action::Action::SetArc(action::SetArc {
                    source,
                    destination,
                    r#type,
                    controller: a.2.controller,
                    block_owner_deletion: a.2.block_owner_deletion,
                    destination_does_not_exist: a.3,
                })
            } else {
                action::Action::DeleteArc(action::DeleteArc {
                    source,
                    destination,
                    r#type,
                })
            }),
        }
    }
}

#[cfg(test)]
mod tests;

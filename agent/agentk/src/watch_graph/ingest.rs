//! One object, as a watch delivers it, turned into what the graph keeps: trimmed
//! (`metadata.managedFields`, the `kubectl.kubernetes.io/last-applied-configuration`
//! annotation, and a Secret's `data` / `stringData` are dropped before anything else
//! looks at it), the query's object expression evaluated, root expressions
//! evaluated, the payload (`o` as JSON bytes, or `j` from the query's JSONPath;
//! nothing for a Secret, whatever the query) and the references resolved to
//! vertices of watched resources. This runs in the watch's task, so the work is
//! spread over the runtime's threads and the graph task only merges results.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::discovery::Gvr;
use super::refs::{Ref, Target, references};
use super::state::{Node, OutArc, OwnerFlags, Payload, VertexKey};
use podgate_agent::graph::cel::ObjectVars;
use podgate_agent::graph::request::{Compiled, CompiledQuery};

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Maps references to watched resources; shared by every watch of a request.
pub(crate) struct Resolver {
    gvrs: Arc<[Gvr]>,
    by_resource: HashMap<(String, String), u16>,
    by_kind: HashMap<(String, String), u16>,
    namespaces: Mutex<HashMap<String, Arc<str>>>,
}

impl Resolver {
    /// Over the watched resources `gvrs`.
    pub(crate) fn new(gvrs: Arc<[Gvr]>) -> Resolver {
        let mut by_resource = HashMap::new();
        let mut by_kind = HashMap::new();
        for (i, g) in gvrs.iter().enumerate() {
            let i = u16::try_from(i).unwrap_or(u16::MAX);
            by_resource.insert((g.group.to_string(), g.resource.to_string()), i);
            by_kind.insert((g.group.to_string(), g.kind.clone()), i);
        }
        Resolver {
            gvrs,
            by_resource,
            by_kind,
            namespaces: Mutex::default(),
        }
    }

    /// The watched resources.
    pub(crate) fn gvrs(&self) -> &Arc<[Gvr]> {
        &self.gvrs
    }

    /// One shared string per namespace name.
    pub(crate) fn namespace(&self, ns: &str) -> Arc<str> {
        let mut m = self.namespaces.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = m.get(ns) {
            return a.clone();
        }
        let a: Arc<str> = ns.into();
        m.insert(ns.to_owned(), a.clone());
        a
    }

    fn resolve(&self, r: &Ref) -> Option<VertexKey> {
        let i = match &r.target {
            Target::Resource(g, res) => *self
                .by_resource
                .get(&((*g).to_owned(), (*res).to_owned()))?,
            Target::Kind(g, k) => *self.by_kind.get(&(g.clone(), k.clone()))?,
        };
        let ns = if self.gvrs[usize::from(i)].namespaced {
            r.namespace.as_str()
        } else {
            ""
        };
        Some(VertexKey::new(i, self.namespace(ns), &r.name))
    }
}

/// The result of ingesting one object.
pub(crate) enum Ingested {
    /// Keep (or replace) this vertex.
    Keep(VertexKey, Node),
    /// The object exists but the query's object expression rejects it.
    Drop(VertexKey),
}

/// A problem evaluating an object (an `OBJECT_PROCESSING_FAILED` warning).
pub(crate) struct Problem {
    pub(crate) key: VertexKey,
    pub(crate) message: String,
}

/// Drop what is never needed: managed fields, the last-applied annotation, and a
/// Secret's contents.
pub(crate) fn trim(obj: &mut Value, secret: bool) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
        if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            a.remove(LAST_APPLIED);
        }
    }
    if secret && let Some(o) = obj.as_object_mut() {
        o.remove("data");
        o.remove("stringData");
    }
}

/// Ingest `obj` of watched resource `gvr` (index `gvr_index`), from `watch` in list
/// generation `generation`.
pub(crate) fn ingest(
    request: &Compiled,
    resolver: &Resolver,
    gvr_index: u16,
    mut obj: Value,
    watch: u32,
    generation: u32,
) -> (Ingested, Option<Problem>) {
    let gvr = &resolver.gvrs[usize::from(gvr_index)];
    let secret = gvr.group.is_empty() && &*gvr.resource == "secrets";
    let meta = obj.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let namespace = meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let key = VertexKey::new(
        gvr_index,
        resolver.namespace(if gvr.namespaced { &namespace } else { "" }),
        &name,
    );
    // References first: a Helm storage Secret's come from the data trimmed next.
    let refs = references(&gvr.group, &gvr.kind, &namespace, &obj);
    trim(&mut obj, secret);
    let vars = ObjectVars {
        obj: &obj,
        group: &gvr.group,
        version: &gvr.version,
        resource: &gvr.resource,
        namespace: &namespace,
        name: &name,
    };
    let mut problem = None;
    let CompiledQuery::Include {
        object, json_path, ..
    } = &request.queries[gvr.query]
    else {
        return (Ingested::Drop(key), None);
    };
    if let Some(expr) = object {
        match expr.eval_object(&vars) {
            Ok(true) => {}
            Ok(false) => return (Ingested::Drop(key), None),
            Err(e) => {
                let message = format!("object_selector_expression: {e}");
                return (Ingested::Drop(key.clone()), Some(Problem { key, message }));
            }
        }
    }
    let mut root = false;
    if let Some(roots) = &request.roots {
        for (i, expr) in roots.exprs.iter().enumerate() {
            match expr.eval_object(&vars) {
                Ok(true) => {
                    root = true;
                    break;
                }
                Ok(false) => {}
                Err(e) => {
                    problem.get_or_insert_with(|| Problem {
                        key: key.clone(),
                        message: format!("roots.object_selector_expressions[{i}]: {e}"),
                    });
                }
            }
        }
    }
    let mut out: Vec<OutArc> = Vec::new();
    for r in refs {
        let Some(to) = resolver.resolve(&r) else {
            continue;
        };
        let flags = OwnerFlags {
            controller: r.controller,
            block_owner_deletion: r.block_owner_deletion,
        };
        match out.iter_mut().find(|a| a.to == to && a.arc == r.arc) {
            Some(a) => {
                a.flags.controller |= flags.controller;
                a.flags.block_owner_deletion |= flags.block_owner_deletion;
            }
            None => out.push(OutArc {
                to,
                arc: r.arc,
                flags,
            }),
        }
    }
    let payload = if secret {
        Payload::None
    } else if let Some(jp) = json_path {
        let found = jp.eval(&obj);
        if found.is_empty() {
            Payload::None
        } else {
            Payload::JsonPath(serde_json::to_vec(&found).unwrap_or_default().into())
        }
    } else if obj.as_object().is_some_and(|o| o.is_empty()) {
        Payload::None
    } else {
        Payload::Object(serde_json::to_vec(&obj).unwrap_or_default().into())
    };
    let node = Node {
        payload,
        root,
        out: out.into(),
        watch,
        generation,
    };
    (Ingested::Keep(key, node), problem)
}

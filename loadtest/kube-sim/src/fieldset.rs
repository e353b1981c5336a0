//! Field sets, as server-side apply's field manager spells them (`FieldsV1`:
//! `f:<field>`, `k:{<keys>}` for an item of a keyed list, `v:<value>` for an item of
//! a set, `.` for an item itself) and as structured-merge-diff prints their paths
//! (`sigs.k8s.io/structured-merge-diff/v4/fieldpath`).
//!
//! Without OpenAPI schemas, which lists are keyed is decided by the field's name
//! (`containers`, `env`, `volumes`, `ports`, `conditions`, … as the Kubernetes
//! types declare them); every other list is atomic. `status` belongs to the status
//! subresource, and `apiVersion`, `kind` and the server-set metadata are never
//! tracked (`internal/stripmeta.go`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

/// A field path, one FieldsV1 key a step: `["f:spec", "f:replicas"]`.
pub(super) type Path = Vec<String>;

/// The part of an object a write owns: all but `status`, or `status` alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Scope {
    /// The main resource.
    Main,
    /// The `status` subresource.
    Status,
}

/// Metadata the server sets, never owned (`internal/stripmeta.go`).
const STRIPPED: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

/// How a list merges.
pub(super) enum ListType {
    /// Items keyed by these fields (`+listType=map`).
    Map(&'static [&'static str]),
    /// Scalars, each its own key (`+listType=set`).
    Set,
    /// Replaced whole.
    Atomic,
}

/// The list type of field `field` holding `items`, as the Kubernetes types declare it.
pub(super) fn list_type(field: &str, items: &[Value]) -> ListType {
    let objects = items.iter().all(Value::is_object);
    let keys: &'static [&'static str] = match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims"
        | "schedulingGates" => &["name"],
        "volumeMounts" => &["mountPath"],
        "volumeDevices" => &["devicePath"],
        "conditions" => &["type"],
        "ownerReferences" => &["uid"],
        "hostAliases" => &["ip"],
        "topologySpreadConstraints" => &["topologyKey", "whenUnsatisfiable"],
        "ports" if items.iter().all(|i| i.get("containerPort").is_some()) => {
            &["containerPort", "protocol"]
        }
        "ports" if items.iter().all(|i| i.get("port").is_some()) => &["port", "protocol"],
        "finalizers" if !objects => return ListType::Set,
        _ => return ListType::Atomic,
    };
    if objects {
        ListType::Map(keys)
    } else {
        ListType::Atomic
    }
}

/// The FieldsV1 key of one item of a keyed list: `k:{"name":"web"}` (keys
/// sorted; a missing `protocol` is `TCP`, as the API defaults it).
pub(super) fn item_key(keys: &[&str], item: &Value) -> String {
    let mut sorted: Vec<&str> = keys.to_vec();
    sorted.sort_unstable();
    let parts: Vec<String> = sorted
        .iter()
        .filter_map(|k| {
            let v = match item.get(*k) {
                Some(v) => v.clone(),
                None if *k == "protocol" => json!("TCP"),
                None => return None,
            };
            Some(format!("{}:{v}", Value::from(*k)))
        })
        .collect();
    format!("k:{{{}}}", parts.join(","))
}

/// Every owned path of `o` in `scope`: leaves with their values, keyed list items
/// (members with children) with `None`.
pub(super) fn fields(o: &Value, scope: Scope) -> BTreeMap<Path, Option<Value>> {
    let mut out = BTreeMap::new();
    let Some(m) = o.as_object() else {
        return out;
    };
    for (k, v) in m {
        match (scope, k.as_str()) {
            (Scope::Main, "apiVersion" | "kind" | "status") => {}
            (Scope::Main, "metadata") => {
                for (mk, mv) in v.as_object().into_iter().flatten() {
                    if !STRIPPED.contains(&mk.as_str()) {
                        let path = vec!["f:metadata".to_owned(), format!("f:{mk}")];
                        walk(mv, mk, path, &mut out);
                    }
                }
            }
            (Scope::Main, _) | (Scope::Status, "status") => {
                walk(v, k, vec![format!("f:{k}")], &mut out);
            }
            (Scope::Status, _) => {}
        }
    }
    out
}

fn walk(v: &Value, field: &str, path: Path, out: &mut BTreeMap<Path, Option<Value>>) {
    match v {
        Value::Null => {}
        Value::Object(m) if m.is_empty() => {
            out.insert(path, Some(v.clone()));
        }
        Value::Object(m) => {
            for (k, c) in m {
                let mut p = path.clone();
                p.push(format!("f:{k}"));
                walk(c, k, p, out);
            }
        }
        Value::Array(items) => match list_type(field, items) {
            ListType::Map(keys) => {
                for item in items {
                    let mut p = path.clone();
                    p.push(item_key(keys, item));
                    out.insert(p.clone(), None);
                    for (k, c) in item.as_object().into_iter().flatten() {
                        let mut cp = p.clone();
                        cp.push(format!("f:{k}"));
                        walk(c, k, cp, out);
                    }
                }
            }
            ListType::Set => {
                for item in items {
                    let mut p = path.clone();
                    p.push(format!("v:{item}"));
                    out.insert(p, Some(item.clone()));
                }
            }
            ListType::Atomic => {
                out.insert(path, Some(v.clone()));
            }
        },
        _ => {
            out.insert(path, Some(v.clone()));
        }
    }
}

/// (added or changed, removed) paths from `old` to `new`.
pub(super) fn compare(
    old: &BTreeMap<Path, Option<Value>>,
    new: &BTreeMap<Path, Option<Value>>,
) -> (BTreeSet<Path>, BTreeSet<Path>) {
    let changed = new
        .iter()
        .filter(|(p, v)| old.get(*p) != Some(*v))
        .map(|(p, _)| p.clone())
        .collect();
    let removed = old
        .keys()
        .filter(|p| !new.contains_key(*p))
        .cloned()
        .collect();
    (changed, removed)
}

/// A path as structured-merge-diff prints it: `.spec.replicas`,
/// `.spec.containers[name="web"].image`, `.metadata.finalizers[="x"]`.
pub(super) fn path_string(p: &Path) -> String {
    let mut s = String::new();
    for pe in p {
        if let Some(f) = pe.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = pe.strip_prefix("k:") {
            let keys: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
            let parts: Vec<String> = keys.iter().map(|(k, v)| format!("{k}={v}")).collect();
            s.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(v) = pe.strip_prefix("v:") {
            s.push_str(&format!("[={v}]"));
        }
    }
    s
}

#[derive(Default)]
struct Node {
    member: bool,
    children: BTreeMap<String, Node>,
}

impl Node {
    fn to_json(&self) -> Value {
        let mut m = Map::new();
        if self.member && !self.children.is_empty() {
            m.insert(".".into(), json!({}));
        }
        for (k, c) in &self.children {
            m.insert(k.clone(), c.to_json());
        }
        Value::Object(m)
    }
}

/// A set of paths as `fieldsV1`.
pub(super) fn to_fields_v1(set: &BTreeSet<Path>) -> Value {
    let mut root = Node::default();
    for p in set {
        let mut n = &mut root;
        for pe in p {
            n = n.children.entry(pe.clone()).or_default();
        }
        n.member = true;
    }
    root.to_json()
}

/// The paths of a `fieldsV1`.
pub(super) fn from_fields_v1(v: &Value) -> BTreeSet<Path> {
    fn go(v: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
        let Some(m) = v.as_object() else { return };
        if m.is_empty() && !path.is_empty() {
            out.insert(path.clone());
        }
        for (k, c) in m {
            if k == "." {
                out.insert(path.clone());
                continue;
            }
            path.push(k.clone());
            go(c, path, out);
            path.pop();
        }
    }
    let mut out = BTreeSet::new();
    go(v, &mut Vec::new(), &mut out);
    out
}

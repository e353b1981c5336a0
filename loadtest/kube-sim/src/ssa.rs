//! Field ownership: `metadata.managedFields` and server-side apply, as
//! kube-apiserver's field manager (`k8s.io/apimachinery/pkg/util/managedfields`)
//! and structured-merge-diff (`sigs.k8s.io/structured-merge-diff/v4/merge/update.go`)
//! keep them.
//!
//! - Every tracked write names a manager. A create, replace or merge patch records
//!   an `Update` entry (one per manager, API version and subresource) holding the
//!   fields it added or changed; the others lose those fields.
//! - An apply (`application/apply-patch+yaml`) merges the applied configuration
//!   into the live object and records an `Apply` entry (one per manager) holding
//!   exactly the applied fields. A field another manager owns whose value the apply
//!   would change is a conflict: `409 Conflict` worded as `internal/conflict.go`
//!   words it, unless `force=true` moves the field to the applier. Fields the
//!   manager applied before and omits now are removed when nobody else owns them.
//! - Field sets are spelled as `FieldsV1` (see `fieldset`).

use std::collections::BTreeSet;

use http::StatusCode;
use serde_json::{Value, json};

use super::fieldset::{
    ListType, Path, Scope, compare, fields, from_fields_v1, item_key, list_type, path_string,
    to_fields_v1,
};

/// One `managedFields` entry.
#[derive(Clone, Debug)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: String,
    subresource: String,
    set: BTreeSet<Path>,
}

impl Entry {
    /// Whether `self` and `other` are the same manager identifier
    /// (`internal/managedfields.go` `BuildManagerIdentifier`: appliers regardless
    /// of API version).
    fn same(&self, other: &Entry) -> bool {
        self.manager == other.manager
            && self.operation == other.operation
            && self.subresource == other.subresource
            && (self.operation == "Apply" || self.api_version == other.api_version)
    }

    /// As `internal/conflict.go` `printManager` names it.
    fn printed(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if !self.subresource.is_empty() {
            s.push_str(&format!(" with subresource {:?}", self.subresource));
        }
        if self.operation == "Update" {
            s.push_str(&format!(" using {}", self.api_version));
        }
        s
    }

    fn from_json(v: &Value) -> Option<Entry> {
        let s = |k: &str| v[k].as_str().unwrap_or("").to_owned();
        Some(Entry {
            manager: s("manager"),
            operation: v["operation"].as_str()?.to_owned(),
            api_version: s("apiVersion"),
            time: s("time"),
            subresource: s("subresource"),
            set: from_fields_v1(&v["fieldsV1"]),
        })
    }

    fn to_json(&self) -> Value {
        let mut e = json!({
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": to_fields_v1(&self.set),
        });
        if !self.subresource.is_empty() {
            e["subresource"] = json!(self.subresource);
        }
        e
    }
}

fn entries(o: &Value) -> Vec<Entry> {
    o["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Entry::from_json)
        .collect()
}

/// Store `entries` in `o`, sorted as `internal/managedfields.go`
/// `sortEncodedManagedFields` sorts them; empty ones dropped.
fn encode(o: &mut Value, mut entries: Vec<Entry>) {
    entries.retain(|e| !e.set.is_empty());
    entries.sort_by(|a, b| {
        (
            &a.operation,
            &a.time,
            &a.manager,
            &a.api_version,
            &a.subresource,
        )
            .cmp(&(
                &b.operation,
                &b.time,
                &b.manager,
                &b.api_version,
                &b.subresource,
            ))
    });
    if !o["metadata"].is_object() {
        o["metadata"] = json!({});
    }
    let meta = o["metadata"].as_object_mut().expect("an object");
    if entries.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert(
            "managedFields".into(),
            entries.iter().map(Entry::to_json).collect(),
        );
    }
}

/// Who writes: the manager, the API version it spoke, whether it wrote the status
/// subresource, and the time to record.
pub(super) struct Writer<'a> {
    /// `fieldManager`, or what the user agent names.
    pub(super) manager: &'a str,
    /// `apps/v1`.
    pub(super) api_version: &'a str,
    /// Whether the write is to the `status` subresource.
    pub(super) status: bool,
    /// RFC 3339, seconds.
    pub(super) now: &'a str,
}

impl Writer<'_> {
    fn entry(&self, operation: &str) -> Entry {
        Entry {
            manager: self.manager.to_owned(),
            operation: operation.to_owned(),
            api_version: self.api_version.to_owned(),
            time: self.now.to_owned(),
            subresource: if self.status {
                "status".into()
            } else {
                "".into()
            },
            set: BTreeSet::new(),
        }
    }

    fn scope(&self) -> Scope {
        if self.status {
            Scope::Status
        } else {
            Scope::Main
        }
    }
}

/// Record a create, replace or merge patch from `old` (`None` on create) to `new`:
/// the writer's `Update` entry gains what changed, the others lose it
/// (`merge/update.go` `Updater.Update`). `new`'s own `managedFields` are replaced.
pub(super) fn record_update(old: Option<&Value>, new: &mut Value, w: &Writer<'_>) {
    let empty = json!({});
    let old = old.unwrap_or(&empty);
    let (changed, removed) = compare(&fields(old, w.scope()), &fields(new, w.scope()));
    let mut all = entries(old);
    let me = w.entry("Update");
    for e in all.iter_mut().filter(|e| !e.same(&me)) {
        e.set
            .retain(|p| !changed.contains(p) && !removed.contains(p));
    }
    let i = match all.iter().position(|e| e.same(&me)) {
        Some(i) => i,
        None => {
            all.push(me);
            all.len() - 1
        }
    };
    let mine = &mut all[i];
    let before = mine.set.clone();
    mine.set.retain(|p| !removed.contains(p));
    mine.set.extend(changed);
    if mine.set != before {
        mine.time = w.now.to_owned();
    }
    encode(new, all);
}

/// Merge an applied configuration into `live`: maps field by field, keyed lists
/// item by item, everything else replaced.
fn merge_applied(live: &mut Value, config: &Value, field: &str) {
    match (live, config) {
        (Value::Object(l), Value::Object(c)) => {
            for (k, v) in c {
                if v.is_null() {
                    continue;
                }
                match l.get_mut(k) {
                    Some(lv) => merge_applied(lv, v, k),
                    None => {
                        l.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Array(l), Value::Array(c)) => match list_type(field, c) {
            ListType::Map(keys) if l.iter().all(Value::is_object) => {
                for item in c {
                    let k = item_key(keys, item);
                    match l.iter_mut().find(|li| item_key(keys, li) == k) {
                        Some(li) => merge_applied(li, item, ""),
                        None => l.push(item.clone()),
                    }
                }
            }
            ListType::Set => {
                for item in c {
                    if !l.contains(item) {
                        l.push(item.clone());
                    }
                }
            }
            _ => *l = c.clone(),
        },
        (l, c) => *l = c.clone(),
    }
}

/// Remove the field at `path` from `o`.
fn remove_path(o: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = o;
    let mut field = "";
    for pe in parents {
        cur = match step(cur, pe, field) {
            Some(c) => c,
            None => return,
        };
        field = pe.strip_prefix("f:").unwrap_or("");
    }
    if let Some(f) = last.strip_prefix("f:") {
        if let Some(m) = cur.as_object_mut() {
            m.remove(f);
        }
    } else if let Some(items) = cur.as_array_mut() {
        let snapshot = items.clone();
        let keep: Vec<bool> = snapshot
            .iter()
            .map(|i| item_pe(field, &snapshot, i) != *last)
            .collect();
        let mut it = keep.into_iter();
        items.retain(|_| it.next().unwrap_or(true));
    }
}

/// The path element of item `i` of the list `items` held by `field`.
fn item_pe(field: &str, items: &[Value], i: &Value) -> String {
    match list_type(field, items) {
        ListType::Map(keys) => item_key(keys, i),
        _ => format!("v:{i}"),
    }
}

fn step<'a>(cur: &'a mut Value, pe: &str, field: &str) -> Option<&'a mut Value> {
    if let Some(f) = pe.strip_prefix("f:") {
        return cur.get_mut(f);
    }
    let items = cur.as_array_mut()?;
    let snapshot = items.clone();
    let at = snapshot
        .iter()
        .position(|i| item_pe(field, &snapshot, i) == pe)?;
    items.get_mut(at)
}

/// Server-side apply of `config` by `w` over `live` (`None`: the object is
/// created): the new object with its `managedFields`, or the `409 Conflict`
/// `Status` (`merge/update.go` `Updater.Apply`, `internal/conflict.go`).
pub(super) fn apply(
    live: Option<&Value>,
    config: &Value,
    w: &Writer<'_>,
    force: bool,
) -> Result<Value, Value> {
    let empty = json!({});
    let live = live.unwrap_or(&empty);
    let mut merged = live.clone();
    merge_applied(&mut merged, config, "");
    let mut all = entries(live);
    let me = w.entry("Apply");
    let last = all
        .iter()
        .find(|e| e.same(&me))
        .map(|e| e.set.clone())
        .unwrap_or_default();
    let applied: BTreeSet<Path> = fields(config, Scope::Main).into_keys().collect();
    let live_fields = fields(live, Scope::Main);
    let (changed, _) = compare(&live_fields, &fields(&merged, Scope::Main));
    let mut conflicts: Vec<(String, Path)> = Vec::new();
    for e in all.iter().filter(|e| !e.same(&me)) {
        for p in e.set.intersection(&changed) {
            conflicts.push((e.printed(), p.clone()));
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflict_status(conflicts));
    }
    for e in all.iter_mut().filter(|e| !e.same(&me)) {
        e.set.retain(|p| !changed.contains(p));
    }
    // Fields this manager applied before and not now, owned by nobody else, go.
    let others: BTreeSet<&Path> = all
        .iter()
        .filter(|e| !e.same(&me))
        .flat_map(|e| e.set.iter())
        .collect();
    let gone: Vec<&Path> = last
        .iter()
        .filter(|p| {
            !applied
                .iter()
                .chain(others.iter().copied())
                .any(|o| o.starts_with(p))
        })
        .collect();
    // Only the outermost: an item goes whole, not field by field.
    for p in &gone {
        if !gone.iter().any(|q| q.len() < p.len() && p.starts_with(q)) {
            remove_path(&mut merged, p);
        }
    }
    let (_, removed) = compare(&live_fields, &fields(&merged, Scope::Main));
    for e in all.iter_mut() {
        e.set.retain(|p| !removed.contains(p));
    }
    match all.iter_mut().find(|e| e.same(&me)) {
        Some(e) => {
            if e.set != applied {
                e.time = w.now.to_owned();
            }
            e.set = applied;
            e.api_version = w.api_version.to_owned();
        }
        None => {
            let mut e = me;
            e.set = applied;
            all.push(e);
        }
    }
    encode(&mut merged, all);
    Ok(merged)
}

/// The `409 Conflict` of an apply (`internal/conflict.go` `NewConflictError`).
fn conflict_status(mut conflicts: Vec<(String, Path)>) -> Value {
    conflicts.sort();
    let message = if let [(manager, path)] = conflicts.as_slice() {
        format!(
            "Apply failed with 1 conflict: conflict with {manager}: {}",
            path_string(path)
        )
    } else {
        let mut lines = Vec::new();
        let mut current: Option<&str> = None;
        for (manager, path) in &conflicts {
            if current != Some(manager.as_str()) {
                lines.push(format!("conflicts with {manager}:"));
                current = Some(manager);
            }
            lines.push(format!("- {}", path_string(path)));
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(manager, path)| {
            json!({"reason": "FieldManagerConflict", "message": format!("conflict with {manager}"), "field": path_string(path)})
        })
        .collect();
    let mut status = super::http::status(StatusCode::CONFLICT, "Conflict", &message);
    status["details"] = json!({"causes": causes});
    status
}

#[cfg(test)]
mod tests;

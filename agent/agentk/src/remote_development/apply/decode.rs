//! The `config_to_apply` stream: decoded into objects and grouped by inventory, as
//! agentk does before anything is written.

use std::collections::HashMap;

use serde::Deserialize as _;
use serde_json::Value;

use super::{Error, INVENTORY_LABEL, OWNING_INVENTORY, ObjMetadata};

/// One inventory and the objects it owns.
pub(super) struct Group {
    /// The inventory ConfigMap as sent.
    pub(super) inventory: Value,
    /// The objects it owns, in stream order.
    pub(super) objects: Vec<Value>,
}

/// The objects of a multi-document YAML stream.
pub(super) fn decode(config: &str) -> Result<Vec<Value>, Error> {
    let mut objects = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(config).enumerate() {
        let bad = |message: String| Error::Decode {
            document: i + 1,
            message,
        };
        let value = Value::deserialize(doc).map_err(|e| bad(e.to_string()))?;
        match value {
            Value::Null => continue,
            Value::Object(_) => {}
            other => return Err(bad(format!("not an object: {}", short(&other)))),
        }
        let kind = value["kind"].as_str().unwrap_or("");
        if kind.is_empty() {
            return Err(bad(format!(
                "Object 'Kind' is missing in '{}'",
                short(&value)
            )));
        }
        if value["apiVersion"].as_str().unwrap_or("").is_empty() {
            return Err(bad(format!(
                "Object 'apiVersion' is missing in '{}'",
                short(&value)
            )));
        }
        if kind.ends_with("List") && value["items"].is_array() {
            for item in value["items"].as_array().into_iter().flatten() {
                if item.is_object() {
                    objects.push(item.clone());
                }
            }
            continue;
        }
        objects.push(value);
    }
    Ok(objects)
}

/// At most 200 characters of an object, for messages.
fn short(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

/// agentk's `groupObjectsByInventory`, groups in the order their inventories appear.
pub(super) fn group_by_inventory(objects: Vec<Value>) -> Result<Vec<Group>, Error> {
    let is_inventory = |o: &Value| {
        o["metadata"]["labels"][INVENTORY_LABEL]
            .as_str()
            .is_some_and(|l| !l.is_empty())
    };
    let mut groups: Vec<Group> = Vec::new();
    let mut by_name: HashMap<String, usize> = HashMap::new();
    for o in objects.iter().filter(|o| is_inventory(o)) {
        let name = o["metadata"]["name"].as_str().unwrap_or("").to_owned();
        match by_name.get(&name) {
            // A repeated inventory replaces the earlier one, as agentk's map does.
            Some(&i) => groups[i].inventory = o.clone(),
            None => {
                by_name.insert(name, groups.len());
                groups.push(Group {
                    inventory: o.clone(),
                    objects: Vec::new(),
                });
            }
        }
    }
    if groups.is_empty() {
        return Err(Error::NoInventory);
    }
    for o in objects {
        if is_inventory(&o) {
            continue;
        }
        let Some(owner) = o["metadata"]["annotations"][OWNING_INVENTORY].as_str() else {
            return Err(Error::NoOwningInventory);
        };
        let Some(&i) = by_name.get(owner) else {
            return Err(Error::UnknownInventory {
                object: ObjMetadata::of(&o).to_string(),
                inventory: owner.to_owned(),
            });
        };
        groups[i].objects.push(o);
    }
    Ok(groups)
}

//! `config_to_apply`'s text: the objects deep-sorted by key and dumped as a YAML
//! stream, as Rails' `Gitlab::Utils.deep_sort_hash` and `YAML.dump` write it.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// `config_to_apply` as Rails writes it: each object deep-sorted by key and dumped
/// as one YAML document starting with `---`, the documents concatenated; `""` (a
/// stream of zero documents) for none.
///
/// The documents are Psych's shape as far as serde_yaml (the same libyaml emitter
/// underneath) allows: block style, two-space indents, sequences in mappings not
/// indented, `{}`/`[]` for empty collections, numeric- or boolean-looking strings
/// single-quoted (`'1'`), multi-line strings as `|-` blocks. Where the text differs
/// (the parsed objects do not): null is written `null` where Psych writes nothing
/// (`creationTimestamp:`); strings starting with a character other than a letter,
/// digit or `_` (`{{.port}}-…`, `/bin/sh`) are single-quoted or plain where Psych
/// double-quotes them; long plain strings are not folded at 80 columns.
pub fn yaml_stream(objects: &[Value]) -> String {
    let mut out = String::new();
    for object in objects {
        out.push_str("---\n");
        // A JSON value (string keys, finite numbers) always serialises.
        out.push_str(&serde_yaml::to_string(&deep_sort(object)).unwrap_or_default());
    }
    out
}

/// `value` with every object's keys in order, at every depth (arrays keep their
/// order): `Gitlab::Utils.deep_sort_hash`. Independent of serde_json's
/// `preserve_order` feature.
pub fn deep_sort(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<&String, &Value> = map.iter().collect();
            let mut out = Map::new();
            for (k, v) in sorted {
                out.insert(k.clone(), deep_sort(v));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(deep_sort).collect()),
        other => other.clone(),
    }
}

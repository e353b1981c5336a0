//! Label and field selectors and kubectl JSONPath templates, as far as the model
//! needs them (written here from the Kubernetes docs, not shared with the server):
//!
//! - label selectors: `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`,
//!   comma-separated (all must hold);
//! - field selectors: `metadata.name`, `metadata.namespace` and other dotted paths
//!   with `=`, `==`, `!=`;
//! - JSONPath: one `{…}` of dotted fields, `[N]` and `[*]` (`{.metadata.name}`,
//!   `{.spec.containers[*].image}`), each match one array element.

use serde_json::Value;

/// Split `s` at commas outside parentheses.
fn terms(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect()
}

/// Whether `labels` (an object, or null) satisfy `selector` (empty: everything).
pub fn labels_match(selector: &str, labels: &Value) -> bool {
    let get = |k: &str| labels.get(k).and_then(Value::as_str);
    terms(selector).into_iter().all(|t| {
        let set = |rest: &str| -> Vec<String> {
            let inner = rest.trim().trim_start_matches('(').trim_end_matches(')');
            inner.split(',').map(|v| v.trim().to_owned()).collect()
        };
        if let Some((k, rest)) = t.split_once(" notin ") {
            !get(k.trim()).is_some_and(|v| set(rest).iter().any(|x| x == v))
        } else if let Some((k, rest)) = t.split_once(" in ") {
            get(k.trim()).is_some_and(|v| set(rest).iter().any(|x| x == v))
        } else if let Some((k, v)) = t.split_once("!=") {
            get(k.trim()) != Some(v.trim())
        } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
            get(k.trim()) == Some(v.trim())
        } else if let Some(k) = t.strip_prefix('!') {
            get(k.trim()).is_none()
        } else {
            get(t).is_some()
        }
    })
}

/// Whether `obj` satisfies the field selector (empty: everything).
pub fn fields_match(selector: &str, obj: &Value) -> bool {
    terms(selector).into_iter().all(|t| {
        let (path, want, equal) = if let Some((p, v)) = t.split_once("!=") {
            (p, v, false)
        } else if let Some((p, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
            (p, v, true)
        } else {
            panic!("field selector term the model does not know: {t:?}")
        };
        let mut cur = obj;
        for seg in path.trim().split('.') {
            cur = &cur[seg];
        }
        let have = match cur {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            v => v.to_string(),
        };
        (have == want.trim()) == equal
    })
}

/// The matches of a JSONPath template `{.a.b[*].c}` in `obj`.
pub fn json_path(template: &str, obj: &Value) -> Vec<Value> {
    let inner = template
        .trim()
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .unwrap_or_else(|| panic!("json_path the model does not know: {template:?}"));
    assert!(
        !inner.contains('{'),
        "json_path the model does not know: {template:?}"
    );
    let mut cur = vec![obj.clone()];
    let path = inner.strip_prefix('.').unwrap_or(inner);
    for seg in path.split('.').filter(|s| !s.is_empty()) {
        let (field, index) = match seg.split_once('[') {
            Some((f, rest)) => (f, Some(rest.trim_end_matches(']'))),
            None => (seg, None),
        };
        if !field.is_empty() {
            cur = cur
                .into_iter()
                .filter_map(|v| v.get(field).cloned())
                .collect();
        }
        match index {
            None => {}
            Some("*") => {
                cur = cur
                    .into_iter()
                    .flat_map(|v| match v {
                        Value::Array(a) => a,
                        Value::Object(m) => m.into_iter().map(|(_, v)| v).collect(),
                        _ => Vec::new(),
                    })
                    .collect();
            }
            Some(n) => {
                let n: usize = n.parse().expect("an index");
                cur = cur.into_iter().filter_map(|v| v.get(n).cloned()).collect();
            }
        }
    }
    cur
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors_and_paths() {
        let l = json!({"app": "web", "tier": "front"});
        assert!(labels_match("", &l));
        assert!(labels_match("app=web,tier", &l));
        assert!(labels_match("app in (web, api),!gone", &l));
        assert!(!labels_match("app notin (web)", &l));
        assert!(!labels_match("app!=web", &l));
        assert!(!labels_match("x", &Value::Null));
        let o = json!({"metadata": {"name": "a", "namespace": "n"},
            "spec": {"containers": [{"image": "i1"}, {"image": "i2"}]}});
        assert!(fields_match("metadata.name=a,metadata.namespace!=x", &o));
        assert!(!fields_match("metadata.name==b", &o));
        assert_eq!(json_path("{.metadata.name}", &o), [json!("a")]);
        assert_eq!(
            json_path("{.spec.containers[*].image}", &o),
            [json!("i1"), json!("i2")]
        );
        assert_eq!(json_path("{.spec.containers[1].image}", &o), [json!("i2")]);
        assert!(json_path("{.status.x}", &o).is_empty());
    }
}

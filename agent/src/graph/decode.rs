//! Naming the part of a request that is not shaped as it must be, since serde's own
//! errors name the offending key but not where it sits (`queries[1].include`).

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::request::{Exclude, Include, Namespaces, ObjectFilter, Query, Roots};

/// The first part of the request that must be an object but is something else.
pub(super) fn non_object(v: &Value) -> Option<(String, String)> {
    fn want(v: Option<&Value>, path: &str, optional: bool) -> Option<(String, String)> {
        match v {
            None => None,
            Some(Value::Null) if optional => None,
            Some(Value::Object(_)) => None,
            Some(other) => Some((
                path.to_owned(),
                format!("must be a JSON object, not {}", json_type(other)),
            )),
        }
    }
    if let Some(e) = want(Some(v), "request", false) {
        return Some(e);
    }
    if let Some(Value::Array(queries)) = v.get("queries") {
        for (i, q) in queries.iter().enumerate() {
            let path = format!("queries[{i}]");
            let found = want(Some(q), &path, false)
                .or_else(|| want(q.get("include"), &format!("{path}.include"), true))
                .or_else(|| want(q.get("exclude"), &format!("{path}.exclude"), true))
                .or_else(|| {
                    let inc = q.get("include")?;
                    want(inc.get("object"), &format!("{path}.include.object"), true)
                });
            if found.is_some() {
                return found;
            }
        }
    }
    want(v.get("namespaces"), "namespaces", true).or_else(|| want(v.get("roots"), "roots", true))
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The path and message of the innermost part of `v` that does not decode.
pub(super) fn locate(v: &Value) -> Option<(String, String)> {
    fn check<T: DeserializeOwned>(v: &Value, path: &str) -> Option<(String, String)> {
        serde_json::from_value::<T>(v.clone())
            .err()
            .map(|e| (path.to_owned(), e.to_string()))
    }
    let obj = v.as_object()?;
    if let Some(Value::Array(queries)) = obj.get("queries") {
        for (i, q) in queries.iter().enumerate() {
            let path = format!("queries[{i}]");
            if let Some(q) = q.as_object() {
                if let Some(inc) = q.get("include") {
                    let p = format!("{path}.include");
                    if let Some(o) = inc.get("object") {
                        let found = check::<ObjectFilter>(o, &format!("{p}.object"));
                        if found.is_some() {
                            return found;
                        }
                    }
                    let found = check::<Include>(inc, &p);
                    if found.is_some() {
                        return found;
                    }
                }
                if let Some(exc) = q.get("exclude") {
                    let found = check::<Exclude>(exc, &format!("{path}.exclude"));
                    if found.is_some() {
                        return found;
                    }
                }
            }
            let found = check::<Query>(q, &path);
            if found.is_some() {
                return found;
            }
        }
    }
    for (key, check) in [
        ("queries", check::<Vec<Query>> as fn(&Value, &str) -> _),
        ("namespaces", check::<Option<Namespaces>>),
        ("roots", check::<Option<Roots>>),
    ] {
        if let Some(x) = obj.get(key) {
            let found = check(x, key);
            if found.is_some() {
                return found;
            }
        }
    }
    None
}

//! Rack 2.2's query parser (`Rack::QueryParser#parse_nested_query` and
//! `#normalize_params`, `lib/rack/query_parser.rb` on the 2-2-stable branch, the
//! version GitLab's Gemfile pins: `gem 'rack', '~> 2.2.9'`), re-implemented here
//! from that source: pairs split at the separators followed by spaces, `+` and `%XX`
//! decoded (`URI.decode_www_form_component`: a `%` not followed by two hex digits is
//! an error), a key without `=` has a nil value, and names nest as Rack nests them
//! (`a[]` appends, `a[b]` builds a hash, a plain repeated key keeps its last value).

use serde_json::{Map, Value};

use super::Error;

/// `Rack::Utils.param_depth_limit` (Rack 2.2).
const DEPTH_LIMIT: usize = 100;
/// `QueryParser::PARAMS_LIMIT` (Rack 2.2): separators counted before parsing.
const PARAMS_LIMIT: usize = 4096;
/// `QueryParser::BYTESIZE_LIMIT` (Rack 2.2).
pub(crate) const BYTESIZE_LIMIT: usize = 4_194_304;

/// Where `Rack::Request#GET` splits a query string (`parse_query(qs, '&;')`).
pub(crate) const QUERY_SEPARATORS: &[u8] = b"&;";
/// Where `Rack::Request#POST` splits a form body (`parse_query(form_vars, '&')`).
pub(crate) const FORM_SEPARATORS: &[u8] = b"&";

/// `parse_nested_query(qs, separators)`.
pub(crate) fn parse_nested_query(
    qs: &[u8],
    separators: &[u8],
) -> Result<Map<String, Value>, Error> {
    let mut params = Map::new();
    if qs.is_empty() {
        return Ok(params);
    }
    if qs.len() > BYTESIZE_LIMIT {
        return Err(Error::BadRequest(format!(
            "total query size exceeds limit ({BYTESIZE_LIMIT})"
        )));
    }
    let count = qs.iter().filter(|b| separators.contains(b)).count();
    if count >= PARAMS_LIMIT {
        return Err(Error::BadRequest(format!(
            "total number of query parameters ({}) exceeds limit ({PARAMS_LIMIT})",
            count + 1
        )));
    }
    for pair in split(qs, separators) {
        // `p.split('=', 2)`: no `=` leaves the value nil; an empty pair names nothing.
        let (k, v) = match pair.iter().position(|&b| b == b'=') {
            Some(i) => (&pair[..i], Some(&pair[i + 1..])),
            None => (pair, None),
        };
        let k = unescape(k)?;
        let v = match v {
            Some(v) => Value::String(unescape(v)?),
            None => Value::Null,
        };
        normalize_params(&mut params, &k, v, DEPTH_LIMIT)?;
    }
    Ok(params)
}

/// Ruby's `qs.split(/[<separators>] */n)`: separators followed by any spaces; trailing
/// empty fields dropped (as `String#split` does), leading ones kept (they name nothing).
fn split<'a>(qs: &'a [u8], separators: &[u8]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < qs.len() {
        if separators.contains(&qs[i]) {
            out.push(&qs[start..i]);
            i += 1;
            while i < qs.len() && qs[i] == b' ' {
                i += 1;
            }
            start = i;
        } else {
            i += 1;
        }
    }
    out.push(&qs[start..]);
    while out.last().is_some_and(|p| p.is_empty()) {
        out.pop();
    }
    out
}

/// `URI.decode_www_form_component(s, Encoding::UTF_8)`: `+` is a space, `%XX` a byte;
/// a `%` without two hex digits after it is an error (Rack answers 400). Invalid
/// UTF-8 is kept as replacement characters.
pub(crate) fn unescape(s: &[u8]) -> Result<String, Error> {
    for (i, &b) in s.iter().enumerate() {
        if b == b'%'
            && !(s.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && s.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
        {
            return Err(Error::BadRequest(format!(
                "invalid %-encoding ({})",
                String::from_utf8_lossy(s)
            )));
        }
    }
    let plus: Vec<u8> = s
        .iter()
        .map(|&b| if b == b'+' { b' ' } else { b })
        .collect();
    Ok(percent_encoding::percent_decode(&plus)
        .decode_utf8_lossy()
        .into_owned())
}

/// What `normalize_params` returns to a nested caller: the hash it was given, an
/// array (`name == "[]"`), or nil.
enum Ret {
    Params,
    Array(Value),
    Nil,
}

/// `normalize_params(params, name, v, depth)` from Rack 2.2.
pub(crate) fn normalize(
    params: &mut Map<String, Value>,
    name: &str,
    v: Value,
) -> Result<(), Error> {
    normalize_params(params, name, v, DEPTH_LIMIT).map(|_| ())
}

fn normalize_params(
    params: &mut Map<String, Value>,
    name: &str,
    v: Value,
    depth: usize,
) -> Result<Ret, Error> {
    if depth == 0 {
        return Err(Error::BadRequest(
            "exceeded available parameter key space".into(),
        ));
    }
    // name =~ %r(\A[\[\]]*([^\[\]]+)\]*) ; k = $1 || '' ; after = $' || ''
    let bytes = name.as_bytes();
    let lead = bytes
        .iter()
        .take_while(|b| matches!(b, b'[' | b']'))
        .count();
    let key_len = bytes[lead..]
        .iter()
        .take_while(|b| !matches!(b, b'[' | b']'))
        .count();
    let (k, after) = if key_len == 0 {
        ("", "")
    } else {
        let k_end = lead + key_len;
        let close = bytes[k_end..].iter().take_while(|&&b| b == b']').count();
        (&name[lead..k_end], &name[k_end + close..])
    };

    if k.is_empty() {
        return Ok(if !v.is_null() && name == "[]" {
            Ret::Array(Value::Array(vec![v]))
        } else {
            Ret::Nil
        });
    }

    if after.is_empty() {
        params.insert(k.to_owned(), v);
    } else if after == "[" {
        params.insert(name.to_owned(), v);
    } else if after == "[]" {
        let slot = params
            .entry(k.to_owned())
            .or_insert_with(|| Value::Array(Vec::new()));
        let Value::Array(list) = slot else {
            return Err(type_error("Array", k, slot));
        };
        list.push(v);
    } else if let Some(child_key) = array_child_key(after) {
        let slot = params
            .entry(k.to_owned())
            .or_insert_with(|| Value::Array(Vec::new()));
        let Value::Array(list) = slot else {
            return Err(type_error("Array", k, slot));
        };
        match list.last_mut() {
            Some(Value::Object(last)) if !has_key(last, &child_key) => {
                normalize_params(last, &child_key, v, depth - 1)?;
            }
            _ => {
                let mut fresh = Map::new();
                let pushed = match normalize_params(&mut fresh, &child_key, v, depth - 1)? {
                    Ret::Params => Value::Object(fresh),
                    Ret::Array(a) => a,
                    Ret::Nil => Value::Null,
                };
                list.push(pushed);
            }
        }
    } else {
        let slot = params
            .entry(k.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        let Value::Object(child) = slot else {
            return Err(type_error("Hash", k, slot));
        };
        match normalize_params(child, after, v, depth - 1)? {
            Ret::Params => {}
            Ret::Array(a) => *slot = a,
            Ret::Nil => *slot = Value::Null,
        }
    }
    Ok(Ret::Params)
}

/// `after =~ %r(^\[\]\[([^\[\]]+)\]$) || after =~ %r(^\[\](.+)$)`: the child key.
fn array_child_key(after: &str) -> Option<String> {
    let rest = after.strip_prefix("[]")?;
    if let Some(inner) = rest.strip_prefix('[').and_then(|r| r.strip_suffix(']'))
        && !inner.is_empty()
        && !inner.contains(['[', ']'])
    {
        return Some(inner.to_owned());
    }
    // `.+` does not match a newline in Ruby.
    (!rest.is_empty() && !rest.contains('\n')).then(|| rest.to_owned())
}

/// `params_hash_has_key?(hash, key)`.
fn has_key(hash: &Map<String, Value>, key: &str) -> bool {
    if key.contains("[]") {
        return false;
    }
    let mut h = hash;
    let parts: Vec<&str> = key.split(['[', ']']).filter(|p| !p.is_empty()).collect();
    for (i, part) in parts.iter().enumerate() {
        match h.get(*part) {
            Some(Value::Object(next)) => h = next,
            Some(_) if i + 1 == parts.len() => return true,
            _ => return false,
        }
    }
    true
}

fn type_error(expected: &str, k: &str, got: &Value) -> Error {
    let class = match got {
        Value::Null => "NilClass",
        Value::String(_) => "String",
        Value::Array(_) => "Array",
        Value::Object(_) => "Hash",
        Value::Bool(_) | Value::Number(_) => "Object",
    };
    Error::BadRequest(format!("expected {expected} (got {class}) for param `{k}'"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn q(s: &str) -> Value {
        Value::Object(parse_nested_query(s.as_bytes(), QUERY_SEPARATORS).unwrap())
    }

    #[test]
    fn pairs_decode_and_the_last_repeated_key_wins() {
        assert_eq!(
            q("token=a&token=b&x=1+2%2B3&flag&=ignored&&"),
            json!({"token": "b", "x": "1 2+3", "flag": null})
        );
        // The query splits at `;` too, and eats spaces after a separator.
        assert_eq!(q("a=1; b=2&  c=3"), json!({"a": "1", "b": "2", "c": "3"}));
        let form = parse_nested_query(b"a=1;b=2", FORM_SEPARATORS).unwrap();
        assert_eq!(Value::Object(form), json!({"a": "1;b=2"}));
    }

    #[test]
    fn names_nest_as_rack_nests_them() {
        assert_eq!(
            q(
                "tag_list[]=a&tag_list[]=b&info[name]=r&info[features][x]=1&l[][a]=1&l[][b]=2&l[][a]=3"
            ),
            json!({
                "tag_list": ["a", "b"],
                "info": {"name": "r", "features": {"x": "1"}},
                "l": [{"a": "1", "b": "2"}, {"a": "3"}],
            })
        );
        assert_eq!(q("[]token]=x&a[=y"), json!({"token": "x", "a[": "y"}));
    }

    #[test]
    fn bad_escapes_and_conflicting_shapes_are_errors() {
        for bad in [
            "token=%zz",
            "token=abc%2",
            "a=1&a[]=2",
            "a[]=1&a[b]=2",
            "a[b]=1&a[]=2",
        ] {
            assert!(
                parse_nested_query(bad.as_bytes(), QUERY_SEPARATORS).is_err(),
                "{bad}"
            );
        }
    }
}

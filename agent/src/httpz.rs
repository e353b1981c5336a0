//! HTTP carried over gRPC, as kas and agentk both handle it: headers and query
//! strings as the protocol's [`Values`] maps (`prototool.Values`), with Go's
//! canonical header names and `url.ParseQuery` decoding, and the hop-by-hop headers
//! removed before a request or an answer crosses a hop (`httpz`). GitLab's packages
//! of the same names: gitlab-org/cluster-integration/gitlab-agent, read in the mirror
//! <https://github.com/pluralsh/kubernetes-agent> at `internal/tool/httpz/tools.go`
//! and `internal/tool/prototool/prototool.proto`.

use std::collections::HashMap;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::proto::gitlab::agent::prototool::Values;

/// Headers that only concern one connection (RFC 9110 §7.6.1), never forwarded.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Drop hop-by-hop headers, and the headers `Connection` names (kas's
/// `grpctool.cleanHeader`; kas's proxy strips them the same way).
pub fn drop_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect();
    for name in named.iter().map(String::as_str).chain(HOP_BY_HOP) {
        headers.remove(name);
    }
}

/// Headers into the protocol's map (names as given; repeated headers in order).
pub fn to_values(headers: &HeaderMap) -> HashMap<String, Values> {
    let mut out: HashMap<String, Values> = HashMap::new();
    for (name, value) in headers {
        if let Ok(v) = value.to_str() {
            out.entry(canonical(name.as_str()))
                .or_default()
                .value
                .push(v.to_owned());
        }
    }
    out
}

/// The protocol's map into headers (entries that are not headers are dropped).
pub fn from_values(map: &HashMap<String, Values>) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, values) in map {
        let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
            continue;
        };
        for v in &values.value {
            if let Ok(v) = HeaderValue::from_str(v) {
                out.append(name.clone(), v);
            }
        }
    }
    out
}

/// Go's canonical header name (`content-type` → `Content-Type`), as GitLab's
/// `http.Header` keys are.
fn canonical(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = true;
    for c in name.chars() {
        out.push(if upper {
            c.to_ascii_uppercase()
        } else {
            c.to_ascii_lowercase()
        });
        upper = c == '-';
    }
    out
}

/// A query string (`a=1&b=x%20y`) into the protocol's map, decoded as Go's
/// `url.ParseQuery` does (`+` is a space; pairs that do not decode are skipped).
pub fn parse_query(query: &str) -> HashMap<String, Values> {
    let mut out: HashMap<String, Values> = HashMap::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if let (Some(k), Some(v)) = (query_unescape(k), query_unescape(v)) {
            out.entry(k).or_default().value.push(v);
        }
    }
    out
}

/// Go's `url.QueryUnescape`: `+` is a space; `None` for a `%` without two hex digits
/// after it (which `percent_decode` would keep as it is; Go refuses the string) or a
/// result that is not UTF-8.
pub fn query_unescape(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let hex = |i: usize| b.get(i).is_some_and(u8::is_ascii_hexdigit);
    if (0..b.len()).any(|i| b[i] == b'%' && !(hex(i + 1) && hex(i + 2))) {
        return None;
    }
    let spaced = s.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8()
        .ok()
        .map(|s| s.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_with_go_names() {
        let mut h = HeaderMap::new();
        h.append("x-thing", HeaderValue::from_static("a"));
        h.append("x-thing", HeaderValue::from_static("b"));
        h.insert("content-type", HeaderValue::from_static("application/json"));
        let v = to_values(&h);
        assert_eq!(v["X-Thing"].value, ["a", "b"]);
        assert_eq!(v["Content-Type"].value, ["application/json"]);
        let back = from_values(&v);
        let things: Vec<_> = back.get_all("x-thing").iter().collect();
        assert_eq!(things, ["a", "b"]);
    }

    #[test]
    fn queries_unescape_as_go_does() {
        assert_eq!(query_unescape("a+b%2B%C3%A9").as_deref(), Some("a b+é"));
        // A `%` without two hex digits after it, or bytes that are not UTF-8: refused.
        for bad in ["%", "%4", "%zz", "%+1", "%%41", "%FF"] {
            assert_eq!(query_unescape(bad), None, "{bad}");
        }
        let q = parse_query("a=1&a=x%20y&bad=%zz&b");
        assert_eq!(q["a"].value, ["1", "x y"]);
        assert_eq!(q["b"].value, [""]);
        assert!(!q.contains_key("bad"));
    }
}

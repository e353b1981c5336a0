//! Go's `net/url` escaping and query handling, as GitLab's kas writes module
//! request URLs.

use std::collections::HashMap;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use podgate_agent::proto::gitlab::agent::prototool::Values;

/// Escaping modes of Go's `net/url`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// `encodePath`: what `url.URL.String()` does to a path.
    Path,
    /// `encodePathSegment`: `url.PathEscape`.
    PathSegment,
    /// `encodeQueryComponent`: `url.QueryEscape` (space as `+`).
    QueryComponent,
}

/// What Go's `shouldEscape` escapes in a query component: every byte but the
/// unreserved characters (RFC 3986 §2.3).
pub(crate) const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// In a path segment, of the reserved characters only `/`, `;`, `,` and `?`.
const PATH_SEGMENT: &AsciiSet = &COMPONENT
    .remove(b'$')
    .remove(b'&')
    .remove(b'+')
    .remove(b':')
    .remove(b'=')
    .remove(b'@');

/// In a path, of the reserved characters only `?`.
const PATH: &AsciiSet = &PATH_SEGMENT.remove(b'/').remove(b';').remove(b',');

/// Go's `escape`.
pub(super) fn escape(s: &str, mode: Mode) -> String {
    match mode {
        Mode::Path => utf8_percent_encode(s, PATH).to_string(),
        Mode::PathSegment => utf8_percent_encode(s, PATH_SEGMENT).to_string(),
        Mode::QueryComponent => s
            .split(' ')
            .map(|part| utf8_percent_encode(part, COMPONENT).to_string())
            .collect::<Vec<_>>()
            .join("+"),
    }
}

/// Go's `url.PathEscape`.
pub(crate) fn path_escape(s: &str) -> String {
    escape(s, Mode::PathSegment)
}

/// Go's `url.Values.Encode`: keys sorted, values in order.
pub(crate) fn encode_query(query: &HashMap<String, Values>) -> String {
    let mut keys: Vec<&String> = query.keys().collect();
    keys.sort();
    let mut out = String::new();
    for k in keys {
        let key = escape(k, Mode::QueryComponent);
        for v in &query[k].value {
            if !out.is_empty() {
                out.push('&');
            }
            out.push_str(&key);
            out.push('=');
            out.push_str(&escape(v, Mode::QueryComponent));
        }
    }
    out
}

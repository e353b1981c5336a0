//! Go's `net/url` escaping and query handling, as GitLab's kas writes module
//! request URLs.

use std::collections::HashMap;

use podgate_agent::proto::gitlab_access::Values;

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

/// Go's `shouldEscape`.
fn should_escape(c: u8, mode: Mode) -> bool {
    if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b'~') {
        return false;
    }
    if matches!(
        c,
        b'$' | b'&' | b'+' | b',' | b'/' | b':' | b';' | b'=' | b'?' | b'@'
    ) {
        return match mode {
            Mode::Path => c == b'?',
            Mode::PathSegment => matches!(c, b'/' | b';' | b',' | b'?'),
            Mode::QueryComponent => true,
        };
    }
    true
}

/// Go's `escape`.
pub(super) fn escape(s: &str, mode: Mode) -> String {
    let mut out = String::with_capacity(s.len());
    for &c in s.as_bytes() {
        if c == b' ' && mode == Mode::QueryComponent {
            out.push('+');
        } else if should_escape(c, mode) {
            out.push_str(&format!("%{c:02X}"));
        } else {
            out.push(c as char);
        }
    }
    out
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

//! The `workspaces.gitlab.com/max-resources-per-workspace-sha256` annotation: a
//! digest of Ruby's `inspect` of the agent's `max_resources_per_workspace`.

use serde_json::Value;
use sha2::{Digest as _, Sha256};

use super::deep_sort;

/// `workspaces.gitlab.com/max-resources-per-workspace-sha256`: the SHA-256 (hex)
/// of Ruby's `to_s` of the deep-sorted, symbol-keyed hash
/// (`config_values_extractor.rb`), e.g. `{}` or `{:limits=>{:cpu=>"2",
/// :memory=>"4Gi"}, :requests=>{…}}` (Ruby 3.3's `Hash#inspect`, which GitLab
/// 17–18 run; Ruby 3.4 writes `{limits: …}`).
pub fn max_resources_sha256(max_resources: &Value) -> String {
    let text = match max_resources {
        Value::Null => "{}".to_owned(),
        v => ruby_inspect(&deep_sort(v)),
    };
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Ruby's `inspect` of a JSON value with symbolized keys.
pub(super) fn ruby_inspect(v: &Value) -> String {
    match v {
        Value::Null => "nil".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => ruby_string(s),
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(ruby_inspect).collect();
            format!("[{}]", inner.join(", "))
        }
        Value::Object(map) => {
            if map.is_empty() {
                return "{}".into();
            }
            let inner: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}=>{}", ruby_symbol(k), ruby_inspect(v)))
                .collect();
            format!("{{{}}}", inner.join(", "))
        }
    }
}

/// `Symbol#inspect`: `:name` for an identifier, else `:"…"`.
pub(super) fn ruby_symbol(s: &str) -> String {
    let mut chars = s.chars();
    let ident = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.trim_end_matches(['?', '!'])
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ident {
        format!(":{s}")
    } else {
        format!(":{}", ruby_string(s))
    }
}

/// `String#inspect` for UTF-8 text.
pub(super) fn ruby_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{1b}' => out.push_str("\\e"),
            '#' if matches!(chars.peek(), Some('{' | '$' | '@')) => out.push_str("\\#"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02X}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

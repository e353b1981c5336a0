//! Field selectors (`k8s.io/apimachinery/pkg/fields/selector.go`): terms, matching,
//! and the parser with its `\,`, `\=` and `\\` escapes.

use super::{Result, SelectorError};

/// One term of a field selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    /// The field, e.g. `metadata.name`.
    pub field: String,
    /// The value, unescaped.
    pub value: String,
    /// `!=` rather than `=` / `==`.
    pub negate: bool,
}

/// A parsed field selector: every term must hold. Which fields a resource supports is
/// up to the server; parsing checks the syntax only.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldSelector {
    /// The terms, in the order written.
    pub requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parse a field selector (`metadata.name=x,status.phase!=Running`).
    pub fn parse(s: &str) -> Result<Self> {
        let mut requirements = Vec::new();
        for term in split_unescaped(s, ',') {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let Some((field, op_len, negate)) = split_field_term(term) else {
                return Err(SelectorError::Field(format!(
                    "{s:?}: can't understand {term:?}"
                )));
            };
            let (lhs, rhs) = (&term[..field], &term[field + op_len..]);
            let lhs = lhs.trim();
            if lhs.is_empty() {
                return Err(SelectorError::Field(format!(
                    "{s:?}: empty field name in {term:?}"
                )));
            }
            requirements.push(FieldRequirement {
                field: lhs.to_owned(),
                value: unescape_field_value(rhs.trim())
                    .map_err(|e| SelectorError::Field(format!("{s:?}: {e}")))?,
                negate,
            });
        }
        Ok(FieldSelector { requirements })
    }

    /// Whether an object's fields (`get` looks one up by name, absent is `""`) meet
    /// every term.
    pub fn matches<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements
            .iter()
            .all(|r| (get(&r.field).unwrap_or("") == r.value) != r.negate)
    }

    /// Whether the selector has no terms (selects everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

/// Split `s` at every `sep` not preceded by a backslash escape.
fn split_unescaped(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            parts.push(&s[start..i]);
            start = i + 1;
        }
    }
    parts.push(&s[start..]);
    parts
}

/// The first operator of a field term, as kube-apiserver looks for it: at each
/// position `!=`, then `==`, then `=`. Returns (position, operator length, negate).
fn split_field_term(term: &str) -> Option<(usize, usize, bool)> {
    let b = term.as_bytes();
    (0..b.len()).find_map(|i| {
        if b[i..].starts_with(b"!=") {
            Some((i, 2, true))
        } else if b[i..].starts_with(b"==") {
            Some((i, 2, false))
        } else if b[i] == b'=' {
            Some((i, 1, false))
        } else {
            None
        }
    })
}

/// Undo `\,`, `\=` and `\\`; any other escape, or a bare `,`/`=`... is an error
/// as in kube-apiserver's `UnescapeValue`.
fn unescape_field_value(v: &str) -> Result<String, String> {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(e) => return Err(format!("invalid escape sequence \\{e} in {v:?}")),
                None => return Err(format!("unterminated escape sequence in {v:?}")),
            },
            ',' | '=' => return Err(format!("invalid unescaped {c:?} in value {v:?}")),
            c => out.push(c),
        }
    }
    Ok(out)
}

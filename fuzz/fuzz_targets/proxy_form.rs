//! Token extraction from query strings and form bodies
//! (`podgate_proxy::params::form_values`, Rack's `parse_query`).
//!
//! - nothing panics;
//! - a query and a form body read the same where they split alike (no `;`);
//! - every value found round-trips: percent-encoded again as `token=…`, it is read
//!   back as itself, alone.

use podgate_proxy::params::{Pairs, form_values};

fn encode(v: &str) -> String {
    let mut out = String::new();
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Checks one input (module docs); panics on a violated property.
pub fn run(data: &[u8]) {
    let mut query = Vec::new();
    let q = form_values(data, "token", Pairs::Query, &mut query);
    let mut form = Vec::new();
    let f = form_values(data, "token", Pairs::Form, &mut form);
    if !data.contains(&b';') {
        // The same verdict (the error names where it was found) and values.
        assert_eq!(
            q.as_ref().err().map(std::mem::discriminant),
            f.as_ref().err().map(std::mem::discriminant)
        );
        assert_eq!(query, form);
    }
    if f.is_ok() {
        for v in &form {
            assert!(!v.is_empty());
            let again = format!("a=1&token={}&b", encode(v));
            let mut back = Vec::new();
            form_values(again.as_bytes(), "token", Pairs::Form, &mut back)
                .expect("an encoded value reads back");
            assert_eq!(back.as_slice(), std::slice::from_ref(v));
        }
    }
}

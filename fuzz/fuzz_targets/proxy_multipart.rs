//! Token extraction from multipart bodies (`podgate_proxy::params::multipart_values`,
//! Rack's multipart parser) and the boundary from the content type
//! (`BodyKind::of`). Input: a cut byte, then a `Content-Type` line, then the body.
//!
//! - nothing panics;
//! - **a look-ahead never sees other tokens than the whole body**: when the whole
//!   body reads without error, any prefix of it (as the proxy reads up to
//!   `body_lookahead_bytes`) reads without error too, and its values are the first
//!   values of the whole body's.

use podgate_proxy::params::{BodyKind, MultipartEnd, multipart_values};

/// Checks one input (module docs); panics on a violated property.
pub fn run(data: &[u8]) {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let (line, body) = match rest.iter().position(|b| *b == b'\n') {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, &b""[..]),
    };
    let line = String::from_utf8_lossy(line);
    // A multipart content type gives its boundary; anything else is the boundary.
    let boundary = match BodyKind::of(Some(&line), &http::Method::POST) {
        Ok(BodyKind::Multipart(b)) => {
            assert!(!b.is_empty());
            b
        }
        _ => line.into_owned(),
    };

    let mut whole = Vec::new();
    let end = multipart_values(body, &boundary, "token", true, &mut whole);
    if let Ok(e) = end {
        assert_eq!(e, MultipartEnd::Complete);
    }
    let at = body.len() * usize::from(cut) / 256;
    let mut seen = Vec::new();
    let partial = multipart_values(&body[..at], &boundary, "token", false, &mut seen);
    if end.is_ok() {
        assert!(partial.is_ok(), "prefix of {at}: {partial:?}");
        assert!(seen.len() <= whole.len());
        assert_eq!(seen[..], whole[..seen.len()], "prefix of {at}");
    }
}

//! Which `jobs/request` polls Workhorse would watch, and on which key: GitLab's
//! `workhorse/internal/builds/register.go` (`readRunnerRequest`, `isApplicationJson`,
//! the `runnerRequest` struct and the checks in `RegisterHandler`).
//!
//! Workhorse watches a poll when its `Content-Type` is `application/json` (Go's
//! `mime.ParseMediaType` of the first `Content-Type` value), its body (at most
//! `maxRegisterBodySize`, 32 KiB) decodes with Go's `encoding/json` into
//! `{token, last_update}` (field names matched case-insensitively, the last repeat
//! wins, `null` leaves a field alone, any other type is an error), and both are
//! non-empty. Anything else goes to Rails: the edge forwards it too, so a poll held
//! here is one the Pod's Workhorse would have held.

use std::fmt;

use http::HeaderMap;
use serde::Deserialize;
use serde::de::{self, IgnoredAny, MapAccess, Visitor};

/// Workhorse's `maxRegisterBodySize`.
pub const MAX_REGISTER_BODY: usize = 32 * 1024;

/// What Workhorse reads of a `jobs/request` body (`runnerRequest`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RunnerRequest {
    /// The runner token (the queue key is `runner:build_queue:<token>`).
    pub token: String,
    /// The queue value the runner last saw (`X-GitLab-Last-Update`).
    pub last_update: String,
}

impl fmt::Debug for RunnerRequest {
    /// The token by its fingerprint only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunnerRequest")
            .field("token", &podgate_tokens::fingerprint(&self.token))
            .field("last_update", &self.last_update)
            .finish()
    }
}

impl RunnerRequest {
    /// The poll Workhorse would watch: `None` when it would pass the request to
    /// Rails (not JSON, a body it cannot decode or larger than 32 KiB, an empty
    /// `token` or `last_update`), or when `last_update` could not be sent back in
    /// `X-GitLab-Last-Update`. `body` is the whole body, `None` when it was not read
    /// whole.
    pub fn read(headers: &HeaderMap, body: Option<&[u8]>) -> Option<RunnerRequest> {
        let body = body.filter(|b| b.len() <= MAX_REGISTER_BODY)?;
        // `r.Header.Get("Content-Type")`: the first value.
        let content_type = headers
            .get(http::header::CONTENT_TYPE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default();
        if !is_application_json(&content_type) {
            return None;
        }
        let r: RunnerRequest = serde_json::from_slice(body).ok()?;
        let ok = !r.token.is_empty()
            && !r.last_update.is_empty()
            && http::HeaderValue::from_str(&r.last_update).is_ok();
        ok.then_some(r)
    }
}

impl<'de> Deserialize<'de> for RunnerRequest {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RunnerRequestVisitor)
    }
}

struct RunnerRequestVisitor;

impl<'de> Visitor<'de> for RunnerRequestVisitor {
    type Value = RunnerRequest;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    /// A top-level `null` decodes into nothing (Go: "null has no effect").
    fn visit_unit<E: de::Error>(self) -> Result<RunnerRequest, E> {
        Ok(RunnerRequest::default())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RunnerRequest, A::Error> {
        let mut r = RunnerRequest::default();
        while let Some(key) = map.next_key::<String>()? {
            let field = if fold_eq(&key, "token") {
                Some(&mut r.token)
            } else if fold_eq(&key, "last_update") {
                Some(&mut r.last_update)
            } else {
                None
            };
            match field {
                // A string, or null (no effect); anything else is a type error.
                Some(f) => {
                    if let Some(v) = map.next_value::<Option<String>>()? {
                        *f = v;
                    }
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(r)
    }
}

/// Go's `encoding/json` field matching (`bytes.EqualFold`, Unicode simple folding):
/// ASCII case-insensitive, and `K` (U+212A KELVIN SIGN) is a `k`, `ſ` (U+017F LONG
/// S) an `s`.
fn fold_eq(key: &str, field: &str) -> bool {
    let mut k = key.chars().map(|c| match c {
        '\u{212A}' => 'k',
        '\u{17F}' => 's',
        c => c.to_ascii_lowercase(),
    });
    let mut f = field.chars();
    loop {
        match (k.next(), f.next()) {
            (None, None) => return true,
            (Some(a), Some(b)) if a == b => {}
            _ => return false,
        }
    }
}

/// Whether Go's `mime.ParseMediaType` reads `v` as `application/json`: parsed by
/// the `mime` crate, with Go's two differences from it (a trailing `;` is
/// allowed; a repeated parameter, names compared case-insensitively, is an
/// error). Go's `ParseMediaType` also takes a type without a subtype, never
/// `application/json`.
fn is_application_json(v: &str) -> bool {
    let v = v.trim();
    let v = v.strip_suffix(';').map_or(v, str::trim_end);
    let Ok(media) = v.parse::<mime::Mime>() else {
        return false;
    };
    let mut names: Vec<String> = media
        .params()
        .map(|(name, _)| name.as_str().to_ascii_lowercase())
        .collect();
    names.sort_unstable();
    let repeated = names.windows(2).any(|w| w[0] == w[1]);
    !repeated && media.essence_str() == "application/json"
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn read(ct: &str, body: &str) -> Option<(String, String)> {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_str(ct).unwrap(),
        );
        RunnerRequest::read(&h, Some(body.as_bytes())).map(|r| (r.token, r.last_update))
    }

    fn rr(token: &str, last_update: &str) -> Option<(String, String)> {
        Some((token.into(), last_update.into()))
    }

    #[test]
    fn watched_exactly_when_workhorse_watches() {
        let j = "application/json";
        assert_eq!(
            read(j, r#"{"token":"t","last_update":"v","info":{"a":[1]}}"#),
            rr("t", "v")
        );
        // Go's field matching: case-insensitive, Unicode folds, the last repeat wins,
        // null has no effect.
        assert_eq!(read(j, r#"{"TOKEN":"t","Last_Update":"v"}"#), rr("t", "v"));
        assert_eq!(
            read(j, "{\"to\u{212A}en\":\"t\",\"la\u{17F}t_update\":\"v\"}"),
            rr("t", "v")
        );
        assert_eq!(
            read(
                j,
                r#"{"token":"a","Token":"b","last_update":"v","LAST_UPDATE":null}"#
            ),
            rr("b", "v")
        );
        // Missing values: Rails answers.
        assert_eq!(read(j, r#"{"token":"t"}"#), None);
        assert_eq!(read(j, r#"{"token":"","last_update":"v"}"#), None);
        assert_eq!(read(j, r#"{"token":"t","last_update":""}"#), None);
        assert_eq!(read(j, "null"), None);
        // Bodies Go would not decode.
        assert_eq!(read(j, r#"{"token":1,"last_update":"v"}"#), None);
        assert_eq!(read(j, r#"["token"]"#), None);
        assert_eq!(read(j, ""), None);
        assert_eq!(read(j, r#"{"token":"t","last_update":"v"} x"#), None);
        // Content types as `mime.ParseMediaType` reads them.
        let body = r#"{"token":"t","last_update":"v"}"#;
        assert_eq!(read("application/json; charset=utf-8", body), rr("t", "v"));
        assert_eq!(read("Application/JSON ;", body), rr("t", "v"));
        assert_eq!(read("application/json; a=\"x;y\"", body), rr("t", "v"));
        assert_eq!(read("application/json; charset", body), None);
        assert_eq!(read("application/json; a=1; A=2", body), None);
        assert_eq!(read("application/vnd.api+json", body), None);
        assert_eq!(read("text/json", body), None);
        assert_eq!(read("application/x-www-form-urlencoded", "token=t"), None);
        assert_eq!(
            RunnerRequest::read(&HeaderMap::new(), Some(body.as_bytes())),
            None
        );
        // Not read whole, or over Workhorse's 32 KiB.
        let mut h = HeaderMap::new();
        h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(j));
        assert_eq!(RunnerRequest::read(&h, None), None);
        let big = format!(
            r#"{{"token":"t","last_update":"v","pad":"{}"}}"#,
            "x".repeat(MAX_REGISTER_BODY)
        );
        assert_eq!(RunnerRequest::read(&h, Some(big.as_bytes())), None);
        // A ticket that cannot go back in a header is not held.
        assert_eq!(read(j, r#"{"token":"t","last_update":"a\nb"}"#), None);
    }

    #[test]
    fn debug_shows_no_token() {
        let r = RunnerRequest {
            token: "glrt-secret-secret".into(),
            last_update: "v".into(),
        };
        let s = format!("{r:?}");
        assert!(!s.contains("secret"), "{s}");
    }
}

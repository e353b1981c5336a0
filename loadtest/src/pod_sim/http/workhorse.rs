//! Workhorse's `jobs/request` handler (`workhorse/internal/builds/register.go`
//! `RegisterHandler`, with `workhorse/internal/redis/keywatcher.go` `WatchKey`), in
//! front of Rails' endpoint (`jobs.rs`):
//!
//! - every answer carries `Gitlab-Ci-Builds-Polling: yes`;
//! - the body is read whole, at most 32 KiB (more, or a read error: 413,
//!   `body-read-error`);
//! - not `Content-Type: application/json` (Go's `mime.ParseMediaType`), or a body
//!   Go's `encoding/json` would not decode into `{token, last_update}` (field names
//!   matched case-insensitively, the last repeat wins, `null` leaves a field alone):
//!   passed to Rails (`body-parse-error`); `token` or `last_update` empty: passed to
//!   Rails (`missing-values`);
//! - the runner's key `runner:build_queue:<token>` differs from `last_update`: passed
//!   to Rails (`already-changed`); else the poll is held on that key up to
//!   [`PodSimConfig::long_poll`](super::super::PodSimConfig::long_poll) and answered
//!   204 by Workhorse itself, without `X-GitLab-Last-Update`, when the value changes
//!   (`seen-change`), when the poll times out (`timeout`) or when a notification
//!   carries the same value (`no-change`).
//!
//! Rails sees the body Workhorse read, with its length as `Content-Length`.

use std::fmt;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use prometheus::IntGauge;
use serde::Deserialize;
use serde::de::{self, IgnoredAny, MapAccess, Visitor};

use super::super::Shared;
use super::super::queue::WatchStatus;
use super::{Body, empty, full};

/// `maxRegisterBodySize`.
const MAX_REGISTER_BODY: usize = 32 * 1024;

/// `registerHandlerOpen{state}` for as long as it lives.
struct Open(IntGauge);

impl Open {
    fn at(shared: &Shared, state: &str) -> Open {
        let g = shared.metrics.workhorse_open.with_label_values(&[state]);
        g.inc();
        Open(g)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn count(shared: &Shared, status: &str) {
    shared
        .metrics
        .workhorse_requests
        .with_label_values(&[status])
        .inc();
}

/// `RegisterHandler`: Workhorse's part of `POST /api/v4/jobs/request`.
pub(crate) async fn register(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let mut resp = handle(shared, req).await;
    resp.headers_mut()
        .insert("gitlab-ci-builds-polling", HeaderValue::from_static("yes"));
    resp
}

async fn handle(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    let body = {
        let _open = Open::at(shared, "reading");
        // `http.MaxBytesReader` + `io.ReadAll`: any failure is a 413.
        match Limited::new(body, MAX_REGISTER_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                count(shared, "body-read-error");
                return too_large();
            }
        }
    };
    // `cloneRequestWithNewBody`: the body read, its length as the request's.
    parts.headers.remove(http::header::TRANSFER_ENCODING);
    parts
        .headers
        .insert(http::header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    let request = match runner_request(&parts.headers, &body) {
        Some(r) => r,
        None => {
            count(shared, "body-parse-error");
            return proxy(shared, parts, body).await;
        }
    };
    if request.token.is_empty() || request.last_update.is_empty() {
        count(shared, "missing-values");
        return proxy(shared, parts, body).await;
    }
    // `watchForRunnerChange`; the queues count it as `watching` themselves
    // (`RunnerQueues::set_watching_gauge`).
    let status = shared
        .state
        .queues()
        .watch(
            &request.token,
            &request.last_update,
            shared.config.long_poll,
        )
        .await;
    count(shared, status.as_str());
    match status {
        // "We detected a change before starting watching on change": Rails decides.
        WatchStatus::AlreadyChanged => proxy(shared, parts, body).await,
        WatchStatus::SeenChange | WatchStatus::Timeout | WatchStatus::NoChange => {
            empty(StatusCode::NO_CONTENT)
        }
    }
}

/// `proxyRegisterRequest`: Rails answers.
async fn proxy(shared: &Shared, parts: http::request::Parts, body: Bytes) -> Response<Body> {
    let _open = Open::at(shared, "proxying");
    super::jobs::request(shared, Request::from_parts(parts, Full::new(body))).await
}

/// `fail.Request(…, fail.WithStatus(413))`: Go's `http.Error` with the status text.
fn too_large() -> Response<Body> {
    let mut r = Response::new(full("Request Entity Too Large\n"));
    *r.status_mut() = StatusCode::PAYLOAD_TOO_LARGE;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// `runnerRequest`: what Workhorse reads of the body.
#[derive(Debug, Default, PartialEq, Eq)]
struct RunnerRequest {
    token: String,
    last_update: String,
}

/// `readRunnerRequest`: `None` when the content type is not JSON or the body does
/// not decode.
fn runner_request(headers: &HeaderMap, body: &[u8]) -> Option<RunnerRequest> {
    // `r.Header.Get("Content-Type")`: the first value.
    let ct = headers
        .get(http::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    if !is_content_type("application/json", &ct) {
        return None;
    }
    serde_json::from_slice(body).ok()
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

/// `helper.IsContentType(expected, actual)`: Go's `mime.ParseMediaType(actual)`
/// succeeds and names `expected`. The `mime` crate parses; Go differs from it in
/// allowing a trailing `;` and refusing a parameter given twice (in any case).
fn is_content_type(expected: &str, actual: &str) -> bool {
    let trimmed = actual.trim();
    let trimmed = match trimmed.strip_suffix(';') {
        Some(t) => t.trim_end(),
        None => trimmed,
    };
    let Ok(media) = trimmed.parse::<mime::Mime>() else {
        return false;
    };
    let mut seen = std::collections::HashSet::new();
    media
        .params()
        .all(|(name, _)| seen.insert(name.as_str().to_ascii_lowercase()))
        && media.essence_str() == expected
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(ct: &str, body: &str) -> Option<RunnerRequest> {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_str(ct).unwrap(),
        );
        runner_request(&h, body.as_bytes())
    }

    fn rr(token: &str, last_update: &str) -> Option<RunnerRequest> {
        Some(RunnerRequest {
            token: token.into(),
            last_update: last_update.into(),
        })
    }

    #[test]
    fn bodies_as_go_decodes_them() {
        let j = "application/json";
        assert_eq!(
            parse(j, r#"{"token":"t","last_update":"v","info":{"a":[1]}}"#),
            rr("t", "v")
        );
        assert_eq!(parse(j, r#"{"TOKEN":"t","Last_Update":"v"}"#), rr("t", "v"));
        assert_eq!(
            parse(j, "{\"to\u{212A}en\":\"t\",\"la\u{17F}t_update\":\"v\"}"),
            rr("t", "v")
        );
        assert_eq!(
            parse(j, r#"{"token":"a","token":"b","last_update":null}"#),
            rr("b", "")
        );
        assert_eq!(parse(j, r#"{"token":"a","Token":null}"#), rr("a", ""));
        assert_eq!(parse(j, "null"), rr("", ""));
        assert_eq!(parse(j, r#"{"token":1}"#), None, "a number is a type error");
        assert_eq!(parse(j, r#"["token"]"#), None);
        assert_eq!(parse(j, ""), None);
        assert_eq!(parse(j, r#"{"token":"t"} x"#), None);
        assert_eq!(
            parse("application/json; charset=utf-8", r#"{"token":"t"}"#),
            rr("t", "")
        );
        assert_eq!(parse("Application/JSON ;", r#"{"token":"t"}"#), rr("t", ""));
        assert_eq!(parse("application/json; charset", r#"{"token":"t"}"#), None);
        assert_eq!(
            parse("application/json; a=1; A=2", r#"{"token":"t"}"#),
            None
        );
        assert_eq!(
            parse("application/json; a=\"x;y\"", r#"{"token":"t"}"#),
            rr("t", "")
        );
        assert_eq!(parse("application/x-www-form-urlencoded", "token=t"), None);
        assert_eq!(parse("text/json", r#"{"token":"t"}"#), None);
        assert_eq!(runner_request(&HeaderMap::new(), br#"{"token":"t"}"#), None);
    }
}

//! Token extraction from JSON bodies: `podgate_proxy::params::json_values` (Grape's
//! `params[:token]`) and `edge_poll::RunnerRequest::read` (Workhorse's
//! `jobs/request` body).
//!
//! - nothing panics;
//! - a body serde_json reads as JSON is not refused as "not JSON" (the other way
//!   round may differ: values skipped unread, like `1e400`, are not range-checked,
//!   as Ruby's parser does not refuse them either);
//! - the value GitLab keeps (the last `token` of a top-level object, when a
//!   non-empty string or a number) is the last value found; a body that is not an
//!   object has none;
//! - a poll the edge would hold has a non-empty token and `last_update`.

use podgate_proxy::edge_poll::RunnerRequest;
use podgate_proxy::params::{Malformed, json_values};
use serde_json::Value;

/// Checks one input (module docs); panics on a violated property.
pub fn run(body: &[u8]) {
    let mut out = Vec::new();
    let r = json_values(body, "token", &mut out);
    let parsed = serde_json::from_slice::<Value>(body);
    if parsed.is_ok() {
        assert_ne!(
            r,
            Err(Malformed::Json),
            "{:?}",
            String::from_utf8_lossy(body)
        );
    }
    if let (Ok(()), Ok(Value::Object(m))) = (&r, &parsed) {
        let kept = match m.get("token") {
            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        if kept.is_some() {
            assert_eq!(out.last(), kept.as_ref());
        }
    }
    if r.is_ok() && parsed.is_ok() && !matches!(parsed, Ok(Value::Object(_))) {
        assert!(out.is_empty());
    }

    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    if let Some(poll) = RunnerRequest::read(&headers, Some(body)) {
        assert!(!poll.token.is_empty() && !poll.last_update.is_empty());
        assert!(http::HeaderValue::from_str(&poll.last_update).is_ok());
    }
}

//! `PATCH /jobs/:id/trace` (`lib/api/ci/runner.rb`, `Ci::AppendBuildTraceService`).
//!
//! The job is authenticated first (`params[:token]` from the query, then
//! `JOB-TOKEN`), then `Content-Range` must be there (400). Only its start is read —
//! `content_range.split('-')[0].to_i`, Ruby's lenient integer parse — and the end is
//! the start plus the body length: runners that send an exclusive end (or any end)
//! are fine. 416 with `Range: 0-<current length>` when the start is not where the
//! trace ends; 202 with `Range`, `Job-Status` and `X-GitLab-Trace-Update-Interval`.

use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;

use super::super::Shared;
use super::super::state::{JobState, Trace};
use super::{Body, Declare, authenticated_job, empty, header, job_status, message, read_declared};

/// Ruby's `String#to_i`: optional leading whitespace and sign, then digits (`_`
/// allowed between them); anything else ends the number; no digits is 0.
fn ruby_to_i(s: &str) -> i64 {
    let s = s.trim_start();
    let (neg, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let mut n: i64 = 0;
    let mut prev_digit = false;
    for c in digits.chars() {
        match c {
            '0'..='9' => {
                n = n
                    .saturating_mul(10)
                    .saturating_add(i64::from(c as u8 - b'0'));
                prev_digit = true;
            }
            '_' if prev_digit => prev_digit = false,
            _ => break,
        }
    }
    if neg { -n } else { n }
}

/// The start offset GitLab reads from a `Content-Range` value.
pub(crate) fn range_start(content_range: &str) -> i64 {
    // Ruby's `split('-')` drops trailing empty fields; the first field is what counts.
    ruby_to_i(content_range.split('-').next().unwrap_or(""))
}

pub(crate) async fn patch(shared: &Shared, req: Request<Incoming>, id: &str) -> Response<Body> {
    let declared = Declare {
        required: &[],
        strings: &["token"],
        hashes: &[],
    };
    let parsed = match read_declared(shared, req, &declared).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let id = match authenticated_job(shared, &parsed, id) {
        Ok(id) => id,
        Err(r) => return r,
    };
    let Some(content_range) = header(&parsed.headers, "content-range") else {
        return message(StatusCode::BAD_REQUEST, "400 Missing header Content-Range");
    };
    let range = |len: u64| HeaderValue::from_str(&format!("0-{len}")).expect("ascii");
    // A negative start can never be the trace's length.
    let start = u64::try_from(range_start(&content_range)).unwrap_or(u64::MAX);
    match shared.state.append_trace(id, start, &parsed.body) {
        Trace::Ok(len) => {
            let mut r = empty(StatusCode::ACCEPTED);
            let h = r.headers_mut();
            h.insert("range", range(len));
            h.insert("job-status", job_status(JobState::Running));
            h.insert(
                "x-gitlab-trace-update-interval",
                HeaderValue::from_static("3"),
            );
            r
        }
        Trace::RangeMismatch(len) => {
            let mut r = message(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "416 Range Not Satisfiable",
            );
            r.headers_mut().insert("range", range(len));
            r
        }
        Trace::Forbidden(s) => {
            let mut r = message(StatusCode::FORBIDDEN, "403 Forbidden");
            r.headers_mut().insert("job-status", job_status(s));
            r
        }
        Trace::NotFound => message(StatusCode::FORBIDDEN, "403 Forbidden"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_start_counts_read_as_ruby_reads_it() {
        for (v, start) in [
            ("0-5", 0),
            ("6-12", 6),
            ("10-9", 10),
            ("bytes 7-9/*", 0),
            ("", 0),
            ("-5", 0),
            (" 12 - 20", 12),
            ("1_000-2000", 1000),
            ("+3-4", 3),
            ("4", 4),
        ] {
            assert_eq!(range_start(v), start, "{v:?}");
        }
    }
}

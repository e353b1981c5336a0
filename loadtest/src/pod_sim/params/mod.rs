//! Request parameters as GitLab's API builds them, written from Grape's and Rack's
//! source (not shared with the proxy, so the simulator checks the proxy rather than
//! repeating its assumptions).
//!
//! - The query string and a `application/x-www-form-urlencoded` or
//!   `multipart/form-data` body are parsed by Rack 2.2 ([`rack`], [`multipart`]).
//! - Any other body of a `POST`, `PUT`, `PATCH` or `DELETE` is read by Grape's
//!   formatter (`Grape::Middleware::Formatter#read_body_input`, Grape 2.0): with
//!   `Content-Type: application/json`, or none at all (GitLab's API declares
//!   `format :json`), it is parsed as JSON and, when it is an object, takes the place
//!   of Rack's form hash; `text/plain` is left alone (the runner API declares
//!   `content_type :txt`); any other type is 415. A body that does not parse is 400.
//! - `params` is `GET.merge(POST)` (`Rack::Request#params`): a body key beats the
//!   same query key; a key repeated within one source keeps its last value.
//!
//! GitLab's Gemfile pins `rack ~> 2.2.9` and `grape ~> 2.0.0`.

pub(crate) mod multipart;
pub(crate) mod rack;

use std::path::Path;

use bytes::Bytes;
use futures_util::TryStreamExt;
use http::{HeaderMap, Method, Request, Uri};
use http_body_util::{BodyExt, BodyStream, Limited};
use serde_json::{Map, Value};
use thiserror::Error;

pub(crate) use multipart::Uploads;

/// Parameters: Rack's nested hash, as JSON values (a file is a hash, as in Rack).
pub(crate) type Params = Map<String, Value>;

/// Why a request's parameters could not be read; each maps to GitLab's answer. Not
/// worth retrying unchanged.
#[derive(Debug, Error)]
pub(crate) enum Error {
    /// The body or query does not parse (Rack's `BadRequest` errors, Grape's
    /// `InvalidMessageBody`): 400.
    #[error("{0}")]
    BadRequest(String),
    /// Grape: "The provided content-type '…' is not supported.": 415.
    #[error("The provided content-type '{0}' is not supported.")]
    UnsupportedMediaType(String),
    /// Larger than this simulator accepts: 413.
    #[error("413 Request Entity Too Large")]
    TooLarge,
    /// Storing an uploaded file failed: 500.
    #[error("storing an upload")]
    Io(#[from] std::io::Error),
}

/// A request read whole: head, merged parameters, and the raw body when it was not
/// multipart (the trace endpoint appends the raw body, as GitLab does).
pub(crate) struct Parsed {
    /// The request headers.
    pub headers: HeaderMap,
    /// `GET.merge(POST)`.
    pub params: Params,
    /// The body as received (empty for multipart bodies, which are streamed).
    pub body: Bytes,
    /// Files of a multipart body, on disk.
    pub uploads: Uploads,
}

/// Limits for [`read`].
pub(crate) struct Limits<'a> {
    /// Largest body read into memory (413 above).
    pub max_body: usize,
    /// Largest file part of a multipart body (413 above).
    pub max_file: u64,
    /// Where file parts are stored.
    pub upload_dir: &'a Path,
}

/// Rack's `media_type`: the content type before `;` or `,`, trimmed, lower case.
pub(crate) fn media_type(headers: &HeaderMap) -> Option<String> {
    let ct = headers.get(http::header::CONTENT_TYPE)?.to_str().ok()?;
    let t = ct.split([';', ',']).next()?.trim().to_ascii_lowercase();
    (!t.is_empty()).then_some(t)
}

/// The query string's parameters (`Rack::Request#GET`).
pub(crate) fn query(uri: &Uri) -> Result<Params, Error> {
    rack::parse_nested_query(uri.query().unwrap_or("").as_bytes(), rack::QUERY_SEPARATORS)
}

/// Whether the request declares a body (`content_length.to_i.positive?` or chunked).
fn has_body(headers: &HeaderMap) -> bool {
    let len = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let chunked = headers
        .get(http::header::TRANSFER_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    len > 0 || chunked
}

/// Read a request's parameters as Grape and Rack would (from the connection, or
/// from a body Workhorse already read).
pub(crate) async fn read<B>(req: Request<B>, limits: &Limits<'_>) -> Result<Parsed, Error>
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = req.into_parts();
    let get = query(&parts.uri)?;
    let media = media_type(&parts.headers);
    let method = &parts.method;
    let content_type = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    // Rack: `form_data?` and `parseable_data?`.
    let form_data = (method == Method::POST && media.is_none())
        || matches!(
            media.as_deref(),
            Some("application/x-www-form-urlencoded" | "multipart/form-data")
        );
    let parseable = matches!(
        media.as_deref(),
        Some("multipart/related" | "multipart/mixed")
    );
    let grape_reads = matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    ) && (!form_data || media.is_none())
        && !parseable
        && has_body(&parts.headers);

    let mut post = Params::new();
    let mut raw = Bytes::new();
    let mut uploads = Uploads::default();
    let mut post_done = false;
    if grape_reads {
        raw = collect(body, limits.max_body).await?;
        if !raw.is_empty() {
            match media.as_deref() {
                // No content type: Grape's default format, which GitLab leaves at
                // `:txt` (`lib/api/api.rb` sets only `format :json`; grape
                // `lib/grape/endpoint.rb`: `default_format: … || :txt`): no parser.
                None => {}
                Some("application/json") => {
                    let v: Value = serde_json::from_slice(&raw).map_err(|_| {
                        Error::BadRequest("message body does not match declared format".into())
                    })?;
                    if let Value::Object(m) = v {
                        post = m;
                        post_done = true;
                    }
                }
                Some("text/plain") => {}
                Some(other) => return Err(Error::UnsupportedMediaType(other.to_owned())),
            }
        }
        if !post_done && form_data {
            // A POST without a content type: Rack reads it as a form.
            post = rack::parse_nested_query(strip_nul(&raw), rack::FORM_SEPARATORS)?;
        }
    } else if form_data || parseable {
        match multipart::boundary(&content_type)? {
            Some(b) if has_body(&parts.headers) => {
                let stream = BodyStream::new(body)
                    .try_filter_map(|frame| async move { Ok(frame.into_data().ok()) })
                    .map_err(std::io::Error::other);
                let (p, u) =
                    multipart::parse(stream, &b, limits.upload_dir, limits.max_file).await?;
                post = p;
                uploads = u;
            }
            _ => {
                raw = collect(body, limits.max_body).await?;
                post = rack::parse_nested_query(strip_nul(&raw), rack::FORM_SEPARATORS)?;
            }
        }
    } else {
        raw = collect(body, limits.max_body).await?;
    }
    let mut params = get;
    params.extend(post);
    Ok(Parsed {
        headers: parts.headers,
        params,
        body: raw,
        uploads,
    })
}

/// "Fix for Safari Ajax postings that always append \0" (Rack 2.2 `POST`).
fn strip_nul(b: &[u8]) -> &[u8] {
    b.strip_suffix(b"\0").unwrap_or(b)
}

async fn collect<B>(body: B, max: usize) -> Result<Bytes, Error>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match Limited::new(body, max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Error::TooLarge),
        Err(e) => Err(Error::BadRequest(format!("reading the body: {e}"))),
    }
}

/// A parameter declared `type: String`, after Grape's coercion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Declared {
    /// Not there at all (`requires` fails: "… is missing").
    Missing,
    /// There, nil (`requires` is satisfied; the value is nil).
    Null,
    /// A string (numbers and booleans are coerced to their text).
    Value(String),
}

impl Declared {
    /// The value, if any.
    pub(crate) fn value(&self) -> Option<&str> {
        match self {
            Declared::Value(s) => Some(s),
            _ => None,
        }
    }
}

/// Parameter `key` as a Grape `String`; `Err` when it is a hash or an array (Grape:
/// "… is invalid").
pub(crate) fn string(params: &Params, key: &str) -> Result<Declared, String> {
    match params.get(key) {
        None => Ok(Declared::Missing),
        Some(Value::Null) => Ok(Declared::Null),
        Some(Value::String(s)) => Ok(Declared::Value(s.clone())),
        Some(Value::Number(n)) => Ok(Declared::Value(n.to_string())),
        Some(Value::Bool(b)) => Ok(Declared::Value(b.to_string())),
        Some(_) => Err(format!("{key} is invalid")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_strings_as_grape_coerces_them() {
        let p: Params =
            serde_json::from_str(r#"{"a": "x", "b": null, "c": 7, "d": true, "e": [], "f": {}}"#)
                .unwrap();
        assert_eq!(string(&p, "a"), Ok(Declared::Value("x".into())));
        assert_eq!(string(&p, "b"), Ok(Declared::Null));
        assert_eq!(string(&p, "c"), Ok(Declared::Value("7".into())));
        assert_eq!(string(&p, "d"), Ok(Declared::Value("true".into())));
        assert!(string(&p, "e").is_err() && string(&p, "f").is_err());
        assert_eq!(string(&p, "z"), Ok(Declared::Missing));
    }
}

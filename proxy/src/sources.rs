//! Where a request carries its token, and how to get it out without disturbing the
//! request: headers and the query string are read in place; a JSON body is read whole
//! (it is small and bounded); a multipart form is read only until its `token` field.

use std::fmt;
use std::str::FromStr;

use http::HeaderMap;
use serde::{Deserialize, Serialize};

/// Most body bytes read to find a token (Workhorse refuses `jobs/request` bodies
/// larger than this with 413, so no legitimate runner sends more).
pub const MAX_TOKEN_BODY: usize = 32 * 1024;

/// One place a token may be.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TokenSource {
    /// A header holding the bare token (`RUNNER-TOKEN`, `JOB-TOKEN`, `PRIVATE-TOKEN`).
    Header(http::HeaderName),
    /// `Authorization: Bearer <token>`.
    Bearer,
    /// `Authorization: Basic base64(user:<token>)`: the token is the password.
    Basic,
    /// A query parameter (`token`, `private_token`, `job_token`).
    Query(String),
    /// A top-level string field of a JSON body (`token`).
    JsonBody(String),
    /// A field of a `multipart/form-data` body (`token`).
    Multipart(String),
}

impl TokenSource {
    /// Whether the body must be read to look here.
    pub fn needs_body(&self) -> bool {
        matches!(self, TokenSource::JsonBody(_) | TokenSource::Multipart(_))
    }

    /// Look in the request head (headers and query). Body sources return `None`.
    pub fn from_head(&self, headers: &HeaderMap, query: Option<&str>) -> Option<String> {
        match self {
            TokenSource::Header(name) => headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned),
            TokenSource::Bearer => authorization(headers, "bearer").map(str::to_owned),
            TokenSource::Basic => {
                use base64::Engine as _;
                let raw = authorization(headers, "basic")?;
                let decoded = base64::engine::general_purpose::STANDARD.decode(raw).ok()?;
                let text = String::from_utf8(decoded).ok()?;
                let (_, password) = text.split_once(':')?;
                (!password.is_empty()).then(|| password.to_owned())
            }
            TokenSource::Query(name) => query_param(query?, name),
            TokenSource::JsonBody(_) | TokenSource::Multipart(_) => None,
        }
    }
}

/// The credentials of `Authorization: <scheme> <credentials>` (scheme case-insensitive).
fn authorization<'a>(headers: &'a HeaderMap, scheme: &str) -> Option<&'a str> {
    let v = headers
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .trim();
    let (s, rest) = v.split_once(' ')?;
    s.eq_ignore_ascii_case(scheme)
        .then(|| rest.trim())
        .filter(|t| !t.is_empty())
}

/// The first value of query parameter `name`, percent-decoded.
pub fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k)? == name)
            .then(|| percent_decode(v))
            .flatten()
            .filter(|v| !v.is_empty())
    })
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// What reading a body for a token found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BodyScan {
    /// The token.
    Found(String),
    /// The body (or prefix) holds no such field.
    Absent,
    /// More bytes are needed to decide.
    NeedMore,
    /// The body cannot be read as the declared type (malformed JSON or form).
    Malformed(&'static str),
}

/// The top-level string field `field` of a complete JSON object.
pub fn json_field(body: &[u8], field: &str) -> BodyScan {
    #[derive(Deserialize)]
    struct Any<'a>(
        #[serde(borrow)] std::collections::HashMap<std::borrow::Cow<'a, str>, serde_json::Value>,
    );
    match serde_json::from_slice::<Any<'_>>(body) {
        Ok(Any(map)) => match map.get(field) {
            Some(serde_json::Value::String(t)) if !t.is_empty() => BodyScan::Found(t.clone()),
            _ => BodyScan::Absent,
        },
        Err(_) if body.iter().all(u8::is_ascii_whitespace) => BodyScan::Absent,
        Err(_) => BodyScan::Malformed("body is not a JSON object"),
    }
}

/// The boundary of a `multipart/form-data` content type.
pub fn multipart_boundary(content_type: &str) -> Option<String> {
    let (mime, params) = content_type.split_once(';')?;
    if !mime.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_owned())
            .filter(|b| !b.is_empty())
    })
}

/// Find form field `field` in a prefix of a multipart body. Reads parts in order and
/// stops at the first part that is neither the field nor small: an artifact `file`
/// part means the token, if any, is not in the body before it.
pub fn multipart_field(prefix: &[u8], boundary: &str, field: &str, complete: bool) -> BodyScan {
    let delim = format!("--{boundary}");
    let mut pos = match find(prefix, delim.as_bytes(), 0) {
        Some(p) => p + delim.len(),
        None if complete || prefix.len() >= MAX_TOKEN_BODY => return BodyScan::Absent,
        None => return BodyScan::NeedMore,
    };
    loop {
        // After a delimiter: "--" ends the form, else CRLF then the part's headers.
        if prefix[pos..].starts_with(b"--") {
            return BodyScan::Absent;
        }
        let Some(head_end) = find(prefix, b"\r\n\r\n", pos) else {
            return more(prefix, complete);
        };
        let head = String::from_utf8_lossy(&prefix[pos..head_end]);
        let name = part_name(&head);
        let body_start = head_end + 4;
        let next = find(prefix, format!("\r\n{delim}").as_bytes(), body_start);
        match (name.as_deref() == Some(field), next) {
            (true, Some(end)) => {
                return match std::str::from_utf8(&prefix[body_start..end]) {
                    Ok(t) if !t.trim().is_empty() => BodyScan::Found(t.trim().to_owned()),
                    _ => BodyScan::Malformed("multipart token field is not text"),
                };
            }
            (true, None) => return more(prefix, complete),
            (false, Some(end)) => pos = end + 2 + delim.len(),
            // A large part (the artifact) before any token: stop reading.
            (false, None) => {
                return if complete || prefix.len() >= MAX_TOKEN_BODY || head.contains("filename=") {
                    BodyScan::Absent
                } else {
                    BodyScan::NeedMore
                };
            }
        }
    }
}

fn more(prefix: &[u8], complete: bool) -> BodyScan {
    if complete || prefix.len() >= MAX_TOKEN_BODY {
        BodyScan::Absent
    } else {
        BodyScan::NeedMore
    }
}

fn part_name(head: &str) -> Option<String> {
    head.lines()
        .find(|l| {
            l.split_once(':')
                .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("content-disposition"))
        })?
        .split(';')
        .find_map(|p| {
            let (k, v) = p.trim().split_once('=')?;
            (k.trim() == "name").then(|| v.trim().trim_matches('"').to_owned())
        })
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if from > hay.len() || needle.is_empty() {
        return None;
    }
    hay[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

impl fmt::Display for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSource::Header(h) => write!(f, "header:{}", h.as_str()),
            TokenSource::Bearer => f.write_str("bearer"),
            TokenSource::Basic => f.write_str("basic"),
            TokenSource::Query(q) => write!(f, "query:{q}"),
            TokenSource::JsonBody(j) => write!(f, "json:{j}"),
            TokenSource::Multipart(m) => write!(f, "multipart:{m}"),
        }
    }
}

impl FromStr for TokenSource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, arg) = s.split_once(':').unwrap_or((s, ""));
        let need = |what: &str| {
            if arg.is_empty() {
                Err(format!("{s:?}: `{kind}:` needs a {what}"))
            } else {
                Ok(arg.to_owned())
            }
        };
        match kind {
            "header" => http::HeaderName::from_bytes(need("header name")?.as_bytes())
                .map(TokenSource::Header)
                .map_err(|_| format!("{s:?}: not a valid header name")),
            "bearer" if arg.is_empty() => Ok(TokenSource::Bearer),
            "basic" if arg.is_empty() => Ok(TokenSource::Basic),
            "query" => need("parameter name").map(TokenSource::Query),
            "json" => need("field name").map(TokenSource::JsonBody),
            "multipart" => need("field name").map(TokenSource::Multipart),
            _ => Err(format!(
                "{s:?}: expected header:NAME, bearer, basic, query:NAME, json:FIELD or multipart:FIELD"
            )),
        }
    }
}

impl Serialize for TokenSource {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TokenSource {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn head_sources() {
        let h = headers(&[
            ("job-token", " glcbt-abc "),
            ("authorization", "Bearer glrt-xyz"),
        ]);
        let src: TokenSource = "header:JOB-TOKEN".parse().unwrap();
        assert_eq!(src.from_head(&h, None).as_deref(), Some("glcbt-abc"));
        assert_eq!(
            TokenSource::Bearer.from_head(&h, None).as_deref(),
            Some("glrt-xyz")
        );
        assert_eq!(TokenSource::Basic.from_head(&h, None), None);
        // user "x", password "glpat-1": the token is the password.
        let basic = headers(&[("authorization", "basic eDpnbHBhdC0x")]);
        assert_eq!(
            TokenSource::Basic.from_head(&basic, None).as_deref(),
            Some("glpat-1")
        );
        let q = TokenSource::Query("job_token".into());
        assert_eq!(
            q.from_head(&h, Some("a=1&job_token=glcbt-%2Bq&b"))
                .as_deref(),
            Some("glcbt-+q")
        );
        assert_eq!(q.from_head(&h, Some("job_token=")), None);
        assert_eq!(q.from_head(&h, None), None);
    }

    #[test]
    fn source_names_round_trip_and_errors_are_clear() {
        for s in [
            "header:runner-token",
            "bearer",
            "basic",
            "query:token",
            "json:token",
            "multipart:token",
        ] {
            assert_eq!(s.parse::<TokenSource>().unwrap().to_string(), s);
        }
        assert!(
            "json"
                .parse::<TokenSource>()
                .unwrap_err()
                .contains("field name")
        );
        assert!(
            "cookie:x"
                .parse::<TokenSource>()
                .unwrap_err()
                .contains("expected")
        );
    }

    #[test]
    fn json_bodies() {
        assert_eq!(
            json_field(br#"{"info":{"token":"no"},"token":"glrt-1"}"#, "token"),
            BodyScan::Found("glrt-1".into())
        );
        assert_eq!(
            json_field(br#"{"system_id":"s"}"#, "token"),
            BodyScan::Absent
        );
        assert_eq!(json_field(br#"{"token": 5}"#, "token"), BodyScan::Absent);
        assert_eq!(json_field(b"", "token"), BodyScan::Absent);
        assert!(matches!(
            json_field(b"{\"token\":", "token"),
            BodyScan::Malformed(_)
        ));
    }

    #[test]
    fn multipart_bodies() {
        let b = "XyZ";
        assert_eq!(
            multipart_boundary("multipart/form-data; boundary=\"XyZ\"").as_deref(),
            Some(b)
        );
        assert_eq!(multipart_boundary("application/json"), None);
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\nglcbt-77\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.zip\"\r\n\r\nPK....";
        assert_eq!(
            multipart_field(body, b, "token", false),
            BodyScan::Found("glcbt-77".into())
        );
        // Only part of the token part has arrived.
        assert_eq!(
            multipart_field(&body[..50], b, "token", false),
            BodyScan::NeedMore
        );
        // The file comes first: no token in the body, stop reading at once.
        let file_first = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.zip\"\r\n\r\nPK....";
        assert_eq!(
            multipart_field(file_first, b, "token", false),
            BodyScan::Absent
        );
        let end = b"--XyZ\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n1\r\n--XyZ--\r\n";
        assert_eq!(multipart_field(end, b, "token", true), BodyScan::Absent);
    }
}

//! Request parameters the way Rack and Grape read them, to find every value of a
//! token parameter (`token`, `private_token`, `job_token`, …) a request carries.
//!
//! GitLab's API is Grape on Rack. `params[:token]` there is built from:
//!
//! - the query string and a form body (`application/x-www-form-urlencoded` or any
//!   `multipart/*` with a boundary), merged as `GET.merge(POST)`: a body value beats
//!   the query's (`Rack::Request#params`, `rack/lib/rack/request.rb`);
//! - a JSON body, parsed by Grape's formatter and merged over the form hash
//!   (`Grape::Middleware::Formatter#read_rack_input`, `lib/grape/middleware/formatter.rb`).
//!   A POST with no content type is a form (`Rack::Request#form_data?`).
//!
//! Within one source a repeated key keeps its **last** value
//! (`Rack::QueryParser#normalize_params`). `token[]=…` or `token[k]=…` make
//! `params[:token]` an array or a hash, which GitLab's `type: String` parameters
//! refuse; an invalid `%` escape is a 400 (`Rack::QueryParser::InvalidParameterError`,
//! and GitLab's `Gitlab::Middleware::HandleMalformedStrings`). Multipart parts are
//! found as Rack's parser finds them (`rack/lib/rack/multipart/parser.rb`): the
//! `Content-Disposition` header and its `name=` parameter are matched without regard
//! to case, the name itself is case-sensitive, and a part with a `filename` is a file
//! (a hash, not a string).
//!
//! Every function here collects **all** values in order, so the caller can both pick
//! the one GitLab keeps (the last of the winning source) and check that every value
//! agrees (the proxy's safety rule).

use std::borrow::Cow;

use thiserror::Error;

mod json;

pub use json::json_values;

/// Why a request's parameters cannot be read as GitLab would. Not transient: the
/// client must fix its request (the proxy answers 400).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum Malformed {
    /// An invalid `%` escape (Rack refuses the whole parameter set).
    #[error("invalid %-encoding in the {0}")]
    PercentEncoding(&'static str),
    /// A JSON body that is not JSON.
    #[error("the body is not valid JSON")]
    Json,
    /// A multipart body that Rack could not parse.
    #[error("multipart body: {0}")]
    Multipart(&'static str),
    /// The token parameter is an array, a hash or a file, not a string.
    #[error("parameter {0:?} is not a single string")]
    NotAString(String),
}

/// How a body is turned into parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BodyKind {
    /// `application/json` (or `…+json`): Grape's JSON parser.
    Json,
    /// `application/x-www-form-urlencoded`.
    Form,
    /// `multipart/*` with this boundary.
    Multipart(String),
    /// Any other type (`text/plain` traces, octet streams): not parameters.
    Opaque,
}

impl BodyKind {
    /// The kind of body a request with this `Content-Type` and method carries.
    /// `Err` for a multipart type without a boundary (Rack: "bad content body").
    pub fn of(content_type: Option<&str>, method: &http::Method) -> Result<BodyKind, Malformed> {
        let Some(ct) = content_type.map(str::trim).filter(|c| !c.is_empty()) else {
            // Rack reads an untyped POST body as a form (`Rack::Request#form_data?`).
            // Grape reads it in the default format, which GitLab leaves at `:txt`
            // (`lib/api/api.rb` sets only `format :json`; grape
            // `lib/grape/endpoint.rb`: `default_format: … || :txt`), and has no
            // parser for text: no JSON.
            return Ok(if *method == http::Method::POST {
                BodyKind::Form
            } else {
                BodyKind::Opaque
            });
        };
        let media = ct.split(';').next().unwrap_or("").trim();
        // Compared as bytes: a `str` slice inside a multi-byte character panics.
        let m = media.as_bytes();
        if media.eq_ignore_ascii_case("application/json")
            || m.len() > 5 && m[m.len() - 5..].eq_ignore_ascii_case(b"+json")
        {
            Ok(BodyKind::Json)
        } else if media.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
            Ok(BodyKind::Form)
        } else if m.len() >= 10 && m[..10].eq_ignore_ascii_case(b"multipart/") {
            boundary(ct)
                .map(BodyKind::Multipart)
                .ok_or(Malformed::Multipart("no boundary in the content type"))
        } else {
            Ok(BodyKind::Opaque)
        }
    }

    /// Whether the body must be read whole to find parameters (JSON and forms; a
    /// multipart body is read only up to the look-ahead).
    pub fn whole(&self) -> bool {
        matches!(self, BodyKind::Json | BodyKind::Form)
    }

    /// The metric label of where a body parameter was found.
    pub fn label(&self) -> &'static str {
        match self {
            BodyKind::Json => "json",
            BodyKind::Form => "form",
            BodyKind::Multipart(_) => "multipart",
            BodyKind::Opaque => "body",
        }
    }
}

/// The `boundary` parameter of a multipart content type (Rack's `MULTIPART`
/// pattern: `boundary=` found without regard to case, quotes optional).
fn boundary(content_type: &str) -> Option<String> {
    content_type.split(';').skip(1).find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_owned())
            .filter(|b| !b.is_empty())
    })
}

/// Where `key=value` pairs come from: Rack 2.2 splits a query string on `&` and `;`
/// (`parse_query(query_string, '&;')`) but a form body on `&` only
/// (`parse_query(form_vars, '&')`, `rack/lib/rack/request.rb`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pairs {
    /// The query string.
    Query,
    /// An `application/x-www-form-urlencoded` body.
    Form,
}

/// Every non-empty value of `name` in a query string or form body, in order.
pub fn form_values(
    data: &[u8],
    name: &str,
    pairs: Pairs,
    out: &mut Vec<String>,
) -> Result<(), Malformed> {
    let where_ = match pairs {
        Pairs::Query => "query string",
        Pairs::Form => "form body",
    };
    let separator = |b: &u8| *b == b'&' || (pairs == Pairs::Query && *b == b';');
    for pair in data.split(separator) {
        let pair = trim_leading_spaces(pair);
        if pair.is_empty() {
            continue;
        }
        let (k, v) = match pair.iter().position(|b| *b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &b""[..]),
        };
        let key = unescape(k).ok_or(Malformed::PercentEncoding(where_))?;
        let value = unescape(v).ok_or(Malformed::PercentEncoding(where_))?;
        match rack_key(&key) {
            (k, "") if k == name && !value.is_empty() => out.push(value.into_owned()),
            (k, "") if k == name => {}
            // `token[` is a key of its own; `token[]`, `token[k]`: an array or hash.
            (k, after) if k == name && after != "[" => {
                return Err(Malformed::NotAString(name.to_owned()));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Rack 2.2's split of a parameter name into its top-level key and the rest
/// (`normalize_params`: `name =~ %r(\A[\[\]]*([^\[\]]+)\]*)`): leading brackets
/// are dropped, so `[token]` and `token]` are `token`, and `token[]` is `token` with
/// `[]` after it.
fn rack_key(name: &str) -> (&str, &str) {
    let rest = name.trim_start_matches(['[', ']']);
    let end = rest.find(['[', ']']).unwrap_or(rest.len());
    let (key, after) = rest.split_at(end);
    (key, after.trim_start_matches(']'))
}

fn trim_leading_spaces(b: &[u8]) -> &[u8] {
    let n = b.iter().take_while(|c| **c == b' ').count();
    &b[n..]
}

/// `application/x-www-form-urlencoded` unescaping: `+` is a space, `%XX` a byte;
/// `None` for an invalid escape, which Rack refuses (`URI.decode_www_form_component`
/// raises on a `%` not followed by two hex digits) and percent-encoding would keep.
fn unescape(b: &[u8]) -> Option<Cow<'_, str>> {
    if !b.iter().any(|c| matches!(c, b'%' | b'+')) {
        return Some(String::from_utf8_lossy(b));
    }
    let valid = b
        .iter()
        .enumerate()
        .filter(|(_, c)| **c == b'%')
        .all(|(i, _)| {
            b.get(i + 1..i + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
        });
    if !valid {
        return None;
    }
    let spaced: Vec<u8> = b
        .iter()
        .map(|&c| if c == b'+' { b' ' } else { c })
        .collect();
    let decoded: Vec<u8> = percent_encoding::percent_decode(&spaced).collect();
    Some(Cow::Owned(String::from_utf8_lossy(&decoded).into_owned()))
}

/// How far a multipart scan got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MultipartEnd {
    /// The closing delimiter was seen: every part was read.
    Complete,
    /// The prefix ended first (the look-ahead is spent, or the client's first bytes
    /// were all that was read): parts after it are unknown.
    Truncated,
}

/// Every value of form field `name` in a multipart body prefix, in order. `complete`
/// says the prefix is the whole body: then a missing closing delimiter is an error,
/// as Rack's "bad content body".
pub fn multipart_values(
    prefix: &[u8],
    boundary: &str,
    name: &str,
    complete: bool,
    out: &mut Vec<String>,
) -> Result<MultipartEnd, Malformed> {
    let delim = format!("--{boundary}");
    let truncated = || {
        if complete {
            Err(Malformed::Multipart("the body ends inside a part"))
        } else {
            Ok(MultipartEnd::Truncated)
        }
    };
    // Rack skips a preamble up to the first delimiter.
    let Some(first) = find(prefix, delim.as_bytes(), 0) else {
        return if complete {
            Err(Malformed::Multipart("no boundary delimiter in the body"))
        } else {
            Ok(MultipartEnd::Truncated)
        };
    };
    let next_delim = format!("\r\n{delim}");
    let mut pos = first + delim.len();
    loop {
        let rest = &prefix[pos..];
        if rest.starts_with(b"--") {
            return Ok(MultipartEnd::Complete);
        }
        if rest.len() < 2 {
            return truncated();
        }
        if !rest.starts_with(b"\r\n") {
            return Err(Malformed::Multipart("no line break after a delimiter"));
        }
        let head_start = pos + 2;
        let Some(head_end) = find(prefix, b"\r\n\r\n", head_start) else {
            return truncated();
        };
        let head = String::from_utf8_lossy(&prefix[head_start..head_end]);
        let body_start = head_end + 4;
        let end = find(prefix, next_delim.as_bytes(), body_start);
        let disposition = part_disposition(&head);
        if disposition.names.iter().any(|n| n == name) {
            if disposition.file {
                return Err(Malformed::NotAString(name.to_owned()));
            }
            let Some(end) = end else {
                return truncated();
            };
            let value = String::from_utf8_lossy(&prefix[body_start..end]);
            if !value.is_empty() {
                out.push(value.into_owned());
            }
        }
        match end {
            Some(end) => pos = end + next_delim.len(),
            None => return truncated(),
        }
    }
}

/// What a part is called, and whether it is a file.
struct Disposition {
    /// Every name the part may have: what a quote-aware reading of
    /// `Content-Disposition` gives, and what Rack 2.2's greedy pattern gives (they
    /// differ when a quoted value holds `; name=`), else its `Content-ID` (Rack's
    /// fallback). Seeing a name too many is safe: one more token to agree.
    names: Vec<String>,
    /// It has a `filename`: Rack makes it a hash, not a string.
    file: bool,
}

/// Rack 2.2 (`rack/lib/rack/multipart.rb`, `multipart/parser.rb`):
/// `MULTIPART_CONTENT_DISPOSITION = /Content-Disposition:[^:]*;\s*name=(VALUE)/ni`
/// with `VALUE = /"(?:\\"|[^"])*"|TOKEN/`; `[^:]*` is greedy, so the last
/// `; name=` before a `:` wins, quotes or not.
static RACK_NAME: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
    regex::Regex::new(
        r#"(?is)content-disposition:[^:]*;\s*name=("(?:\\"|[^"])*"|[^\s()<>,;:\\"/\[\]?=]+)"#,
    )
    .expect("Rack's pattern compiles")
});

/// A part's names (see [`Disposition`]) and whether it is a file, from its head.
fn part_disposition(head: &str) -> Disposition {
    let mut d = Disposition {
        names: Vec::new(),
        file: false,
    };
    let header = |wanted: &str| {
        head.split("\r\n").find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(wanted).then_some(v)
        })
    };
    if let Some(value) = header("content-disposition") {
        for param in split_params(value).skip(1) {
            let Some((k, v)) = param.split_once('=') else {
                continue;
            };
            let k = k.trim();
            if k.eq_ignore_ascii_case("name") && d.names.is_empty() {
                d.names.push(unquote(v.trim()));
            } else if k.eq_ignore_ascii_case("filename") || k.eq_ignore_ascii_case("filename*") {
                d.file = true;
            }
        }
    }
    if let Some(c) = RACK_NAME.captures(head) {
        let rack = unquote(&c[1]);
        if !d.names.contains(&rack) {
            d.names.push(rack);
        }
    }
    if d.names.is_empty()
        && let Some(id) = header("content-id")
    {
        d.names.push(id.trim().to_owned());
    }
    d
}

/// `;`-separated parameters, with `;` inside double quotes kept.
fn split_params(s: &str) -> impl Iterator<Item = &str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ';' if !quoted => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts.into_iter()
}

/// Rack's `dequote`: surrounding quotes dropped, then every `\x` becomes `x`.
fn unquote(v: &str) -> String {
    match v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(inner) => {
            let mut out = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                out.push(if c == '\\' {
                    chars.next().unwrap_or(c)
                } else {
                    c
                });
            }
            out
        }
        None => v.to_owned(),
    }
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

#[cfg(test)]
mod tests;

//! Where a request carries a token, and every token it carries.
//!
//! A rule lists its sources **in the order GitLab reads them** (the table is in
//! [`crate::rules`]). [`lookup`] gathers every non-empty value of every source, so
//! [`crate::decision`] can route by the one GitLab authenticates and refuse a request
//! whose tokens disagree.

use std::fmt;
use std::str::FromStr;

use http::HeaderMap;
use serde::{Deserialize, Serialize};

use crate::params::{self, BodyKind, Malformed, MultipartEnd, Pairs};

/// One place a token may be.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TokenSource {
    /// A header holding the bare token (`RUNNER-TOKEN`, `JOB-TOKEN`, `PRIVATE-TOKEN`,
    /// `Deploy-Token`).
    Header(http::HeaderName),
    /// `Authorization: Bearer <token>`.
    Bearer,
    /// kas's Kubernetes API proxy credentials, `Authorization: Bearer
    /// <type>:<agent id>:<token>` with type `pat` (a personal, project or group
    /// access token) or `ci` (a CI job token): the token is the `<token>` part. A
    /// value kas would refuse (another scheme or type, an agent id that is not an
    /// int64, an empty token; kas's `getAgentIdAndTokenFromHeader`) carries no token
    /// here: the request then goes where a request without one goes, and kas there
    /// answers its own 401 (with `Gitlab-Unauthorized: true`), as it would.
    KasBearer,
    /// `Authorization: Basic base64(user:<token>)`: the token is the password
    /// (`gitlab-ci-token:<job token>`, `<user>:<PAT>`, `<deploy user>:<deploy token>`).
    Basic,
    /// A Grape parameter (`params[:name]` in the runner and job endpoints): the query
    /// string and a JSON, form or multipart body, the body's value beating the query's
    /// (`Rack::Request#params` is `GET.merge(POST)`; [`crate::params`]).
    Param(String),
    /// A Rails parameter (`current_request.params[...]` in GitLab's auth finders,
    /// `lib/gitlab/auth/auth_finders.rb`): the same places, but the query's value
    /// beats the body's (`ActionDispatch::Http::Parameters#parameters` is
    /// `request_parameters.merge(query_parameters)`).
    RailsParam(String),
    /// A query parameter only.
    Query(String),
}

/// Where a value was found, for metrics and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// The request head (a header or `Authorization`).
    Head,
    /// The query string.
    Query,
    /// A body of this kind (`json`, `form`, `multipart`).
    Body(&'static str),
}

/// One token found in a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The token.
    pub token: String,
    /// Index of its source in the rule's `sources`.
    pub source: usize,
    /// Where exactly.
    pub place: Place,
}

/// What a lookup of a rule's sources finds in a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// At least one token.
    Found {
        /// Every token, in source order (within a parameter: query, then body, each
        /// in request order). All of them must name one Pod.
        candidates: Vec<Candidate>,
        /// Index into `candidates` of the token GitLab authenticates.
        chosen: usize,
    },
    /// No token in any source GitLab reads.
    Absent {
        /// A multipart body's look-ahead ended before the body did: a token may be
        /// in the part not read.
        truncated: bool,
    },
    /// The parameters cannot be read as GitLab reads them (GitLab answers 400).
    Malformed(Malformed),
}

/// Every token `request` carries in `sources`, and the one GitLab authenticates.
/// `body` is the prefix read for a parameter source (`None`: not read, because the
/// rule has no parameter source or the body carries no parameters).
pub fn lookup(
    sources: &[TokenSource],
    headers: &HeaderMap,
    query: Option<&str>,
    body: Option<(&BodyKind, Body<'_>)>,
    hop_by_hop: &[http::HeaderName],
) -> Lookup {
    match collect(sources, headers, query, body, hop_by_hop) {
        Err(e) => Lookup::Malformed(e),
        Ok(Found {
            candidates,
            chosen: Some(chosen),
            ..
        }) => Lookup::Found { candidates, chosen },
        Ok(Found { truncated, .. }) => Lookup::Absent { truncated },
    }
}

/// What [`collect`] gathers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Found {
    candidates: Vec<Candidate>,
    /// The first source that has a token; within a Grape parameter the body's last
    /// value, else the query's last (a Rails parameter: the other way round).
    chosen: Option<usize>,
    truncated: bool,
}

/// A body prefix read before routing.
#[derive(Clone, Copy, Debug)]
pub struct Body<'a> {
    /// The bytes read, from the start of the body.
    pub bytes: &'a [u8],
    /// Whether they are the whole body.
    pub complete: bool,
}

/// Headers listed in `Connection:` (hop-by-hop, RFC 9110 §7.6.1): removed before
/// forwarding, so never used to route. Never the body's framing
/// (`Content-Length`, `Transfer-Encoding`): the body is forwarded, so its framing
/// must be too, or the Pod would read the body as the next request.
pub fn connection_listed(headers: &HeaderMap) -> Vec<http::HeaderName> {
    crate::http1::connection_tokens(headers)
        .filter_map(|t| http::HeaderName::from_bytes(t).ok())
        .filter(|n| {
            // `Connection: upgrade` / `keep-alive` / `close` name no header a token
            // could be in; `Upgrade` itself must reach the upstream for WebSockets.
            *n != http::header::UPGRADE
                && *n != http::header::CONTENT_LENGTH
                && *n != http::header::TRANSFER_ENCODING
        })
        .collect()
}

/// A header GitLab's front drops: a name with an underscore. GitLab's bundled NGINX
/// keeps `underscores_in_headers off` (the default) with `ignore_invalid_headers on`,
/// so such a header reaches neither the HTTP Router nor Rails; Rack would otherwise
/// read `PRIVATE_TOKEN` as `Private-Token` (`HTTP_PRIVATE_TOKEN`). The proxy routes
/// on none of them (no token source names one) and forwards none (both request
/// paths).
pub fn dropped_at_the_edge(name: &[u8]) -> bool {
    name.contains(&b'_')
}

fn collect(
    sources: &[TokenSource],
    headers: &HeaderMap,
    query: Option<&str>,
    body: Option<(&BodyKind, Body<'_>)>,
    hop_by_hop: &[http::HeaderName],
) -> Result<Found, Malformed> {
    let mut found = Found::default();
    let mut values = Vec::new();
    for (i, src) in sources.iter().enumerate() {
        let start = found.candidates.len();
        let mut chosen = None;
        match src {
            TokenSource::Header(name) if hop_by_hop.contains(name) => {}
            TokenSource::Header(name) => {
                for v in headers.get_all(name) {
                    if let Some(t) = v.to_str().ok().map(str::trim).filter(|t| !t.is_empty()) {
                        values.push(t.to_owned());
                    }
                }
                push(&mut found, &mut values, i, Place::Head);
            }
            TokenSource::Bearer | TokenSource::Basic | TokenSource::KasBearer => {
                if !hop_by_hop.contains(&http::header::AUTHORIZATION) {
                    for v in headers.get_all(http::header::AUTHORIZATION) {
                        if let Some(t) = credentials(v, src) {
                            values.push(t);
                        }
                    }
                }
                push(&mut found, &mut values, i, Place::Head);
            }
            TokenSource::Query(name) => {
                if let Some(q) = query {
                    params::form_values(q.as_bytes(), name, Pairs::Query, &mut values)?;
                }
                push(&mut found, &mut values, i, Place::Query);
            }
            TokenSource::Param(name) | TokenSource::RailsParam(name) => {
                if let Some(q) = query {
                    params::form_values(q.as_bytes(), name, Pairs::Query, &mut values)?;
                }
                push(&mut found, &mut values, i, Place::Query);
                let query_end = found.candidates.len();
                if let Some((kind, body)) = body {
                    body_values(kind, body, name, &mut values, &mut found.truncated)?;
                    push(&mut found, &mut values, i, Place::Body(kind.label()));
                }
                let end = found.candidates.len();
                // The last value of the winning place: the body for Grape, the query
                // for Rails.
                let (first, second) = if matches!(src, TokenSource::Param(_)) {
                    ((query_end, end), (start, query_end))
                } else {
                    ((start, query_end), (query_end, end))
                };
                chosen = [first, second]
                    .into_iter()
                    .find(|(a, b)| b > a)
                    .map(|(_, b)| b - 1);
            }
        }
        if chosen.is_none() && found.candidates.len() > start {
            chosen = Some(found.candidates.len() - 1);
        }
        if found.chosen.is_none() {
            found.chosen = chosen;
        }
    }
    Ok(found)
}

fn push(found: &mut Found, values: &mut Vec<String>, source: usize, place: Place) {
    for token in values.drain(..) {
        found.candidates.push(Candidate {
            token,
            source,
            place,
        });
    }
}

/// Every value of `name` in a body of `kind`.
fn body_values(
    kind: &BodyKind,
    body: Body<'_>,
    name: &str,
    values: &mut Vec<String>,
    truncated: &mut bool,
) -> Result<(), Malformed> {
    match kind {
        BodyKind::Json => params::json_values(body.bytes, name, values),
        BodyKind::Form => params::form_values(body.bytes, name, Pairs::Form, values),
        BodyKind::Multipart(boundary) => {
            let end = params::multipart_values(body.bytes, boundary, name, body.complete, values)?;
            *truncated |= end == MultipartEnd::Truncated;
            Ok(())
        }
        BodyKind::Opaque => Ok(()),
    }
}

/// The token of an `Authorization` value of `src`'s scheme (`Bearer` or `Basic`,
/// case-insensitive).
fn credentials(v: &http::HeaderValue, src: &TokenSource) -> Option<String> {
    let (scheme, rest) = v.to_str().ok()?.trim().split_once(' ')?;
    let rest = rest.trim();
    match src {
        TokenSource::KasBearer if scheme.eq_ignore_ascii_case("bearer") => {
            kas_token(rest).map(str::to_owned)
        }
        TokenSource::Bearer if scheme.eq_ignore_ascii_case("bearer") => {
            (!rest.is_empty()).then(|| rest.to_owned())
        }
        TokenSource::Basic if scheme.eq_ignore_ascii_case("basic") => {
            use base64::Engine as _;
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(rest)
                .ok()?;
            let text = String::from_utf8(decoded).ok()?;
            let (_, password) = text.split_once(':')?;
            (!password.is_empty()).then(|| password.to_owned())
        }
        _ => None,
    }
}

/// The `<token>` of kas's `<type>:<agent id>:<token>`, as kas splits it: the type
/// up to the first `:`, `ci` or `pat`; the agent id up to the next, an int64; the
/// rest, non-empty, is the token (`internal/module/kubernetes_api/server/proxy.go`,
/// `getAgentIdAndTokenFromHeader`, in gitlab-org/cluster-integration/gitlab-agent).
pub fn kas_token(credentials: &str) -> Option<&str> {
    let (kind, rest) = credentials.split_once(':')?;
    if kind != "ci" && kind != "pat" {
        return None;
    }
    let (agent, token) = rest.split_once(':')?;
    agent.parse::<i64>().ok()?;
    (!token.is_empty()).then_some(token)
}

impl TokenSource {
    /// Whether a body may hold this source's token.
    pub fn reads_body(&self) -> bool {
        matches!(self, TokenSource::Param(_) | TokenSource::RailsParam(_))
    }

    /// The metric label of a value found at `place` (`json:token`, `query:token`,
    /// `header:job-token`, `basic`).
    pub fn label(&self, place: Place) -> String {
        match (self, place) {
            (TokenSource::Param(n) | TokenSource::RailsParam(n), Place::Body(kind)) => {
                format!("{kind}:{n}")
            }
            (TokenSource::Param(n) | TokenSource::RailsParam(n) | TokenSource::Query(n), _) => {
                format!("query:{n}")
            }
            _ => self.to_string(),
        }
    }

    /// Every label [`Self::label`] can return, to render them once.
    pub fn labels(&self) -> Vec<(Place, String)> {
        let places: &[Place] = match self {
            TokenSource::Param(_) | TokenSource::RailsParam(_) => &[
                Place::Query,
                Place::Body("json"),
                Place::Body("form"),
                Place::Body("multipart"),
            ],
            TokenSource::Query(_) => &[Place::Query],
            _ => &[Place::Head],
        };
        places.iter().map(|p| (*p, self.label(*p))).collect()
    }
}

impl fmt::Display for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSource::Header(h) => write!(f, "header:{}", h.as_str()),
            TokenSource::Bearer => f.write_str("bearer"),
            TokenSource::KasBearer => f.write_str("kas-bearer"),
            TokenSource::Basic => f.write_str("basic"),
            TokenSource::Param(p) => write!(f, "param:{p}"),
            TokenSource::RailsParam(p) => write!(f, "rails-param:{p}"),
            TokenSource::Query(q) => write!(f, "query:{q}"),
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
            "kas-bearer" if arg.is_empty() => Ok(TokenSource::KasBearer),
            "basic" if arg.is_empty() => Ok(TokenSource::Basic),
            "param" => need("parameter name").map(TokenSource::Param),
            "rails-param" => need("parameter name").map(TokenSource::RailsParam),
            "query" => need("parameter name").map(TokenSource::Query),
            "json" | "multipart" | "form" => Err(format!(
                "{s:?}: body fields are read as GitLab reads them, from every body type: use param:{arg}"
            )),
            _ => Err(format!(
                "{s:?}: expected header:NAME, bearer, kas-bearer, basic, param:NAME, rails-param:NAME or query:NAME"
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
mod tests;

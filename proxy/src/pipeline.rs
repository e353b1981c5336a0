//! The routing of one request, as both paths run it: pingora-proxy's service
//! ([`crate::service`]) and the HTTP/1 fast path ([`crate::fast`]) read the
//! request their own way and call these two pure functions (no I/O) in between:
//!
//! 1. [`plan`]: the Host check, the rule lookup ([`crate::rules::rule_for`]) and
//!    the body policy: whether the body must be read to find the token, as what
//!    ([`BodyKind`]) and how much of it;
//! 2. [`decide`]: the token decision ([`crate::decision::route_by_token`]) on the
//!    head and what was read of the body, or the fixed outcome of a rule that does
//!    not route by token.
//!
//! What they implement is the routing contract, `docs/routing.md`.

use http::{HeaderMap, HeaderName, Method};
use podgate_registry::Topology;
use podgate_tokens::Classifier;

use crate::body::too_large;
use crate::decision::{self, Decision, OnInvalid, Outcome, Refusal};
use crate::params::BodyKind;
use crate::rules::{self, Action, Rule};
use crate::sources::{Body, TokenSource};

/// What the proxy has read of a request head.
#[derive(Clone, Copy, Debug)]
pub struct Head<'a> {
    /// The method.
    pub method: &'a Method,
    /// The path, as received (rules match it normalised).
    pub path: &'a str,
    /// The query string.
    pub query: Option<&'a str>,
    /// The headers.
    pub headers: &'a HeaderMap,
    /// `Host`, or HTTP/2's `:authority`.
    pub host: Option<&'a str>,
    /// Whether the request came over HTTP/2 (which names the host in `:authority`,
    /// not in a `Host` header).
    pub http2: bool,
    /// The headers the request lists in `Connection:` (never routed by).
    pub hop_by_hop: &'a [HeaderName],
}

/// How much of a body to read before routing, and how to read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BodyPlan {
    /// What the body is parsed as.
    pub kind: BodyKind,
    /// Most bytes read: a JSON or form body larger than this cannot be routed by
    /// its parameters; a multipart body is looked into up to this.
    pub limit: usize,
}

impl BodyPlan {
    /// Whether the body must be read whole (JSON, forms) rather than a prefix
    /// (multipart).
    pub fn whole(&self) -> bool {
        self.kind.whole()
    }
}

/// What to do with a request head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// No rule matches: 404, nothing forwarded.
    NoRule,
    /// An HTTP/1 request without `Host` (RFC 9112 §3.2): 400 `missing_host`.
    MissingHost(Refusal),
    /// Rule `rule` applies, but the body cannot be read as GitLab reads it (a
    /// multipart type without a boundary): 400 `malformed_body`.
    Refuse {
        /// The rule's index.
        rule: usize,
        /// Why.
        refusal: Refusal,
    },
    /// Route by rule `rule`, after reading the body as `body` says (`None`: route
    /// by the head alone).
    Route {
        /// The rule's index.
        rule: usize,
        /// What to read of the body first.
        body: Option<BodyPlan>,
    },
}

/// What was read of the body a [`BodyPlan`] asked for.
#[derive(Clone, Copy, Debug)]
pub enum BodyRead<'a> {
    /// Nothing: the plan asked for no body, or the body is empty.
    Skipped,
    /// The body's first bytes, read as `plan` says, and whether they are all of it
    /// (a JSON or form body declared larger than the limit is not read at all:
    /// no bytes, not complete).
    Read {
        /// The plan it was read for.
        plan: &'a BodyPlan,
        /// The bytes, from the start of the body.
        bytes: &'a [u8],
        /// Whether they are the whole body.
        complete: bool,
    },
    /// The read overran the buffer it is replayed upstream from: 413.
    Overflow {
        /// The plan's limit.
        limit: usize,
    },
}

/// Step 1: the Host check, the rule, and what to read of the body before routing.
/// `body_lookahead` is `body_lookahead_bytes`.
pub fn plan(rules: &[Rule], head: &Head<'_>, body_lookahead: usize) -> Plan {
    // RFC 9112 §3.2: an HTTP/1 request without Host is a 400, HTTP/1.0 included
    // (HTTP/2 carries `:authority` instead).
    if !head.http2 && !head.headers.contains_key(http::header::HOST) {
        return Plan::MissingHost(Refusal::bad_request(
            "missing_host",
            "the request has no Host header",
        ));
    }
    let Some(idx) = rules::rule_for(rules, head.method, head.path, head.headers, head.host) else {
        return Plan::NoRule;
    };
    let rule = &rules[idx];
    let Some(by) = rule
        .by_token()
        .filter(|by| by.sources.iter().any(TokenSource::reads_body))
    else {
        return Plan::Route {
            rule: idx,
            body: None,
        };
    };
    let content_type = head
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    match BodyKind::of(content_type, head.method) {
        Err(e) => Plan::Refuse {
            rule: idx,
            refusal: Refusal::bad_request("malformed_body", e.to_string()),
        },
        Ok(BodyKind::Opaque) => Plan::Route {
            rule: idx,
            body: None,
        },
        Ok(kind) => {
            let limit = match by.max_body_bytes {
                Some(max) if kind.whole() => max.min(body_lookahead),
                _ => body_lookahead,
            };
            Plan::Route {
                rule: idx,
                body: Some(BodyPlan { kind, limit }),
            }
        }
    }
}

/// Step 2: where the request goes, by `rule` (the one [`plan`] chose) on the head
/// and what was read of the body.
pub fn decide(
    rule: &Rule,
    head: &Head<'_>,
    body: BodyRead<'_>,
    topology: &Topology,
    classifier: &Classifier,
    on_invalid: OnInvalid,
) -> Decision {
    let Some(by) = rule.by_token() else {
        return Decision {
            outcome: fixed_outcome(&rule.action, head.headers, topology),
            token: None,
        };
    };
    let body = match body {
        BodyRead::Skipped => None,
        BodyRead::Overflow { limit } => return refused(too_large(limit)),
        // A JSON or form body past the look-ahead. Runner and job endpoints carry
        // small bodies (Workhorse refuses `jobs/request` over 32 KiB): refuse. The
        // general API takes large ones (commits, snippets): route by the head, as
        // the cells router does.
        BodyRead::Read { plan, complete, .. } if plan.whole() && !complete => {
            if by.requires_token {
                return refused(too_large(plan.limit));
            }
            None
        }
        BodyRead::Read {
            plan,
            bytes,
            complete,
        } => Some((&plan.kind, Body { bytes, complete })),
    };
    let request = decision::Request {
        headers: head.headers,
        query: head.query,
        body,
        hop_by_hop: head.hop_by_hop,
    };
    decision::route_by_token(by, &request, topology, classifier, on_invalid)
}

/// Where a rule that does not route by token sends the request.
fn fixed_outcome(action: &Action, headers: &HeaderMap, topology: &Topology) -> Outcome {
    match action {
        Action::RouteToPod(p) => decision::to_pod(topology, *p, "pinned"),
        Action::SessionPrefix => {
            let forced = rules::force_cell(headers)
                .and_then(|cell| topology.pods.values().find(|p| p.session_prefix() == cell));
            match forced.or_else(|| {
                rules::session_cookie(headers).and_then(|v| topology.pod_for_session(v))
            }) {
                Some(p) => decision::to_pod(topology, p.id, "session"),
                None => decision::to_legacy(topology, "default"),
            }
        }
        Action::RouteByToken(_) | Action::Default => decision::to_legacy(topology, "default"),
    }
}

/// A decision to answer `refusal`.
pub fn refused(refusal: Refusal) -> Decision {
    Decision {
        outcome: Outcome::Refused(refusal),
        token: None,
    }
}

#[cfg(test)]
mod tests;

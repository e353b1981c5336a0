//! The routing decision: from a rule, a request head, a body prefix, the topology
//! and the classifier to exactly one outcome. Pure (no I/O), so every rule of the
//! routing contract (`docs/routing.md`: the token GitLab authenticates routes,
//! every token must name the same Pod, 400/401/503 and their reasons) is
//! unit-tested here; [`crate::pipeline`] calls it for both request paths.

use std::sync::Arc;

use http::HeaderMap;
use podgate_registry::{Pod, PodState, Topology};
use podgate_tokens::{Classification, Classifier, PodId};
use serde::{Deserialize, Serialize};

use crate::params::BodyKind;
use crate::rules::ByToken;
use crate::sources::{self, Body, Candidate, Lookup};

/// What to do with a request whose token is invalid.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnInvalid {
    /// Answer 401 and forward nothing (the default).
    #[default]
    Reject,
    /// Send it to the default Pod, which will refuse it itself (for migrations).
    Legacy,
}

/// Where a request goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Forward to this Pod.
    Forward {
        /// The Pod.
        pod: Arc<Pod>,
        /// Why: `routable`, `unroutable`, `no_token`, `invalid_to_legacy`, `pinned`,
        /// `session`, `default`. A metric label.
        why: &'static str,
    },
    /// Answer 401 with this reason; forward nothing.
    Unauthorized(String),
    /// Answer 4xx: the request cannot be routed as GitLab would serve it.
    Refused(Refusal),
    /// Answer 503 with `Retry-After`; the reason is logged and counted.
    Unavailable(&'static str),
}

/// A request the proxy answers itself with a 4xx.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The status (400 or 413).
    pub status: u16,
    /// A stable code, also the metric label: `conflicting_tokens`, `malformed_body`,
    /// `token_not_found`, `body_too_large`, `missing_host`.
    pub code: &'static str,
    /// What exactly, for the client.
    pub detail: String,
}

impl Refusal {
    /// A 400 with `code`.
    pub fn bad_request(code: &'static str, detail: impl Into<String>) -> Self {
        Refusal {
            status: 400,
            code,
            detail: detail.into(),
        }
    }

    /// As a pingora error from downstream: `HTTPStatus(status)`, the message as
    /// context. Not retryable.
    pub fn to_error(&self) -> Box<pingora::Error> {
        let mut e = pingora::Error::explain(
            pingora::ErrorType::HTTPStatus(self.status),
            format!("{}: {}", self.code, self.detail),
        );
        e.as_down();
        e
    }
}

impl Outcome {
    /// The label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Forward { why, .. } => why,
            Outcome::Unauthorized(_) => "unauthorized",
            Outcome::Refused(r) => r.code,
            Outcome::Unavailable(why) => why,
        }
    }
}

/// Send to `pod` if it takes traffic.
pub fn to_pod(topology: &Topology, pod: PodId, why: &'static str) -> Outcome {
    match topology.pod(pod) {
        None => Outcome::Unavailable("unknown_pod"),
        Some(p) if p.state != PodState::Active => Outcome::Unavailable(match p.state {
            PodState::Draining => "pod_draining",
            _ => "pod_down",
        }),
        Some(p) => Outcome::Forward {
            pod: p.clone(),
            why,
        },
    }
}

/// Send to the default (legacy) Pod.
pub fn to_legacy(topology: &Topology, why: &'static str) -> Outcome {
    match topology.default_pod {
        Some(id) => to_pod(topology, id, why),
        None => Outcome::Unavailable("no_default_pod"),
    }
}

/// Decide for a classified token. **Never** forwards to a Pod other than the one the
/// token names: a routable token whose Pod is unknown or not active is a 503, not a
/// trip to the legacy Pod.
pub fn decide(c: &Classification, topology: &Topology, on_invalid: OnInvalid) -> Outcome {
    match c {
        Classification::Routable(id) => to_pod(topology, id.pod, "routable"),
        Classification::Unroutable { .. } => to_legacy(topology, "unroutable"),
        Classification::Invalid { reason } => match on_invalid {
            OnInvalid::Reject => Outcome::Unauthorized(reason.to_string()),
            OnInvalid::Legacy => to_legacy(topology, "invalid_to_legacy"),
        },
    }
}

/// What the proxy read of a request, for a `route-by-token` rule.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The request headers.
    pub headers: &'a HeaderMap,
    /// The query string.
    pub query: Option<&'a str>,
    /// The body's kind and the prefix read (`None` when not read).
    pub body: Option<(&'a BodyKind, Body<'a>)>,
    /// Headers the request lists in `Connection:` (never used to route).
    pub hop_by_hop: &'a [http::HeaderName],
}

/// A decision and the token it was made by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Where the request goes.
    pub outcome: Outcome,
    /// The token routed by (GitLab's choice), when there was one: for the log's
    /// fingerprint and the source label.
    pub token: Option<Candidate>,
}

/// Route a request by its tokens, as the module docs say.
pub fn route_by_token(
    rule: &ByToken,
    request: &Request<'_>,
    topology: &Topology,
    classifier: &Classifier,
    on_invalid: OnInvalid,
) -> Decision {
    let (candidates, chosen) = match sources::lookup(
        &rule.sources,
        request.headers,
        request.query,
        request.body,
        request.hop_by_hop,
    ) {
        Lookup::Found { candidates, chosen } => (candidates, chosen),
        Lookup::Malformed(e) => {
            return Decision {
                outcome: Outcome::Refused(Refusal::bad_request("malformed_body", e.to_string())),
                token: None,
            };
        }
        Lookup::Absent { truncated } => {
            let outcome = match (rule.requires_token, truncated) {
                (true, true) => Outcome::Refused(Refusal::bad_request(
                    "token_not_found",
                    "no token within the body look-ahead; send it in a header or before the file part",
                )),
                (true, false) => Outcome::Refused(Refusal::bad_request(
                    "token_not_found",
                    "this endpoint needs a token and the request carries none",
                )),
                // No token where GitLab allows none (public projects, a signed-in
                // browser's API calls): the session's Pod, as the session rule and
                // GitLab's cells router route it (`user_from_warden` is GitLab's last
                // source), else the default Pod.
                (false, _) => {
                    match crate::rules::session_pod(rule.kas_cookie, request.headers, topology) {
                        Some(p) => to_pod(topology, p.id, "session"),
                        None => to_legacy(topology, "no_token"),
                    }
                }
            };
            return Decision {
                outcome,
                token: None,
            };
        }
    };
    // Every token must name the same Pod (an unroutable one names the default Pod).
    let label = |c: &Candidate| rule.sources[c.source].label(c.place);
    let mut classes: smallvec::SmallVec<[Classification; 2]> =
        smallvec::SmallVec::with_capacity(candidates.len());
    let mut first: Option<(Option<PodId>, usize)> = None;
    for (i, c) in candidates.iter().enumerate() {
        // A token sent twice (a new runner's header and body) is classified once.
        let class = match candidates[..i].iter().position(|o| o.token == c.token) {
            Some(j) => classes[j],
            None => classifier.classify(&c.token),
        };
        let pod = match &class {
            Classification::Routable(id) => Some(id.pod),
            Classification::Unroutable { .. } => topology.default_pod,
            Classification::Invalid { reason } => match on_invalid {
                OnInvalid::Reject => {
                    return Decision {
                        outcome: Outcome::Unauthorized(format!("{reason} (token in {})", label(c))),
                        token: Some(c.clone()),
                    };
                }
                OnInvalid::Legacy => topology.default_pod,
            },
        };
        match first {
            None => first = Some((pod, i)),
            Some((p, j)) if p != pod => {
                let name = |p: Option<PodId>| p.map_or("no Pod".to_owned(), |p| format!("Pod {p}"));
                let other = &candidates[j];
                return Decision {
                    outcome: Outcome::Refused(Refusal::bad_request(
                        "conflicting_tokens",
                        format!(
                            "the token in {} ({}) names {}, the token in {} ({}) names {}",
                            label(other),
                            podgate_tokens::fingerprint(&other.token),
                            name(p),
                            label(c),
                            podgate_tokens::fingerprint(&c.token),
                            name(pod)
                        ),
                    )),
                    token: None,
                };
            }
            Some(_) => {}
        }
        classes.push(class);
    }
    let mut candidates = candidates;
    Decision {
        outcome: decide(&classes[chosen], topology, on_invalid),
        token: Some(candidates.swap_remove(chosen)),
    }
}

#[cfg(test)]
mod tests;

//! The routing decision: from a rule, a request head, a body prefix, the topology
//! and the classifier to exactly one outcome. Pure (no I/O), so every rule of the
//! contract is unit-tested here; [`crate::service`] only reads the request and acts.
//!
//! The contract:
//! - the request goes to the Pod of the token **GitLab authenticates** (the first of
//!   the rule's sources that has one, see [`crate::sources::lookup`]);
//! - **every** token the request carries in any source GitLab might read must name
//!   that same Pod (an unroutable token names the default Pod): one invalid token is a
//!   401, two Pods are a 400 `conflicting_tokens`, and nothing is forwarded;
//! - a body that cannot be read as GitLab reads it is a 400 `malformed_body`; a
//!   multipart body whose look-ahead ends before any token is a 400
//!   `token_not_found`; neither goes to the default Pod;
//! - a request with no token at all goes to the default Pod (`no_token`), which
//!   answers it as GitLab does (401/403), as does an unroutable token.

use std::sync::Arc;

use http::HeaderMap;
use podgate_registry::{Pod, PodState, Topology};
use podgate_tokens::{Classification, Classifier, PodId};
use serde::{Deserialize, Serialize};

use crate::params::BodyKind;
use crate::rules::Rule;
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
    rule: &Rule,
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
            let outcome = if truncated {
                Outcome::Refused(Refusal::bad_request(
                    "token_not_found",
                    "no token within the body look-ahead; send it in a header or before the file part",
                ))
            } else if rule.requires_token {
                Outcome::Refused(Refusal::bad_request(
                    "token_not_found",
                    "this endpoint needs a token and the request carries none",
                ))
            } else {
                to_legacy(topology, "no_token")
            };
            return Decision {
                outcome,
                token: None,
            };
        }
    };
    // Every token must name the same Pod (an unroutable one names the default Pod).
    let label = |c: &Candidate| rule.sources[c.source].label(c.place);
    let mut chosen_class = None;
    let mut first: Option<(Option<PodId>, usize)> = None;
    for (i, c) in candidates.iter().enumerate() {
        let class = classifier.classify(&c.token);
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
        if i == chosen {
            chosen_class = Some(class);
        }
    }
    let token = candidates[chosen].clone();
    let outcome = match chosen_class {
        Some(class) => decide(&class, topology, on_invalid),
        None => to_legacy(topology, "no_token"),
    };
    Decision {
        outcome,
        token: Some(token),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podgate_registry::TopologyFile;
    use podgate_tokens::{Identity, InvalidReason, TokenFormat, TokenKind, UnroutableReason};

    fn topology() -> Topology {
        TopologyFile::parse(
            r#"
            default_pod = 1
            [[pods]]
            id = 1
            name = "legacy"
            web = ["127.0.0.1:1"]
            [[pods]]
            id = 2
            name = "two"
            web = ["127.0.0.1:2"]
            [[pods]]
            id = 3
            name = "three"
            web = ["127.0.0.1:3"]
            state = "draining"
            "#,
            "test",
        )
        .unwrap()
        .to_topology(1)
    }

    fn routable(pod: u64) -> Classification {
        Classification::Routable(Identity::new(
            PodId::new(pod).unwrap(),
            TokenKind::Runner,
            TokenFormat::GitlabV1,
        ))
    }

    fn forwarded(o: &Outcome) -> Option<u64> {
        match o {
            Outcome::Forward { pod, .. } => Some(pod.id.get()),
            _ => None,
        }
    }

    #[test]
    fn routable_goes_to_its_pod_and_nowhere_else() {
        let t = topology();
        assert_eq!(
            forwarded(&decide(&routable(2), &t, OnInvalid::Reject)),
            Some(2)
        );
        assert_eq!(
            decide(&routable(3), &t, OnInvalid::Reject),
            Outcome::Unavailable("pod_draining")
        );
        assert_eq!(
            decide(&routable(9), &t, OnInvalid::Reject),
            Outcome::Unavailable("unknown_pod")
        );
        // Even with on_invalid = legacy, a routable token for a missing Pod is never
        // sent to the legacy Pod.
        assert_eq!(
            decide(&routable(9), &t, OnInvalid::Legacy),
            Outcome::Unavailable("unknown_pod")
        );
    }

    #[test]
    fn unroutable_and_invalid() {
        let t = topology();
        let u = Classification::Unroutable {
            reason: UnroutableReason::Opaque,
        };
        assert_eq!(forwarded(&decide(&u, &t, OnInvalid::Reject)), Some(1));
        let i = Classification::Invalid {
            reason: InvalidReason::BadCrc,
        };
        assert!(
            matches!(decide(&i, &t, OnInvalid::Reject), Outcome::Unauthorized(m) if m.contains("CRC"))
        );
        assert_eq!(forwarded(&decide(&i, &t, OnInvalid::Legacy)), Some(1));
        let mut no_default = t.clone();
        no_default.default_pod = None;
        assert_eq!(
            decide(&u, &no_default, OnInvalid::Reject),
            Outcome::Unavailable("no_default_pod")
        );
    }

    fn v1(cell: u64) -> String {
        let keys = podgate_tokens::gitlab::RoutingKeys {
            cell: Some(cell),
            organization: Some(1),
            ..Default::default()
        };
        podgate_tokens::gitlab::encode("glrt-", &keys, &[7; 16]).unwrap()
    }

    fn runner_rule() -> Rule {
        crate::rules::builtin()
            .into_iter()
            .find(|r| r.name == "jobs-request")
            .unwrap()
    }

    fn route(headers: &[(&str, &str)], query: Option<&str>, json: Option<&str>) -> Decision {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let hop = crate::sources::connection_listed(&h);
        let request = Request {
            headers: &h,
            query,
            body: json.map(|b| {
                (
                    &BodyKind::Json,
                    Body {
                        bytes: b.as_bytes(),
                        complete: true,
                    },
                )
            }),
            hop_by_hop: &hop,
        };
        let classifier = Classifier::with_keys(podgate_tokens::KeySet::new());
        route_by_token(
            &runner_rule(),
            &request,
            &topology(),
            &classifier,
            OnInvalid::Reject,
        )
    }

    #[test]
    fn routes_by_the_token_gitlab_authenticates_when_all_agree() {
        let (two, also_two) = (v1(2), v1(2));
        let d = route(
            &[("runner-token", &two)],
            Some(&format!("token={also_two}")),
            Some(&format!(r#"{{"token":"{two}"}}"#)),
        );
        assert_eq!(forwarded(&d.outcome), Some(2));
        // GitLab's choice: the body's value (Grape: body beats query).
        let chosen = d.token.unwrap();
        assert_eq!(chosen.token, two);
        assert_eq!(chosen.place, crate::sources::Place::Body("json"));
    }

    #[test]
    fn disagreeing_or_invalid_tokens_are_refused_never_forwarded() {
        let (two, three) = (v1(2), v1(3));
        let d = route(
            &[("runner-token", &two)],
            None,
            Some(&format!(r#"{{"token":"{three}"}}"#)),
        );
        match d.outcome {
            Outcome::Refused(r) => {
                assert_eq!((r.status, r.code), (400, "conflicting_tokens"));
                assert!(
                    r.detail.contains("Pod 3") && r.detail.contains("Pod 2"),
                    "{}",
                    r.detail
                );
            }
            o => panic!("{o:?}"),
        }
        // A repeated key counts each time, even though Rack keeps only the last.
        let d = route(&[], Some(&format!("token={three}&token={two}")), None);
        assert_eq!(d.outcome.label(), "conflicting_tokens");
        // An unroutable token names the default Pod: it conflicts with Pod 2's.
        let d = route(
            &[("runner-token", "legacy-opaque-token")],
            None,
            Some(&format!(r#"{{"token":"{two}"}}"#)),
        );
        assert_eq!(d.outcome.label(), "conflicting_tokens");
        // ...and agrees with Pod 1's.
        let d = route(
            &[("runner-token", "legacy-opaque-token")],
            None,
            Some(&format!(r#"{{"token":"{}"}}"#, v1(1))),
        );
        assert_eq!(forwarded(&d.outcome), Some(1));
        // One invalid token anywhere: 401, whichever GitLab would pick.
        let mut bad = two.clone();
        bad.pop();
        bad.push(if two.ends_with('0') { '1' } else { '0' });
        let d = route(
            &[("runner-token", &bad)],
            None,
            Some(&format!(r#"{{"token":"{two}"}}"#)),
        );
        assert!(
            matches!(&d.outcome, Outcome::Unauthorized(m) if m.contains("header:runner-token")),
            "{:?}",
            d.outcome
        );
    }

    #[test]
    fn connection_listed_headers_do_not_route_and_absent_tokens_go_to_the_default_pod() {
        let three = v1(3);
        // jobs/request cannot be served without a token: 400, not the default Pod.
        let d = route(
            &[("connection", "Runner-Token"), ("runner-token", &three)],
            None,
            None,
        );
        assert_eq!(d.outcome.label(), "token_not_found");
        // Git may be anonymous (public projects): the default Pod answers it.
        let git = crate::rules::builtin()
            .into_iter()
            .find(|r| r.name == "git")
            .unwrap();
        let h = HeaderMap::new();
        let request = Request {
            headers: &h,
            query: None,
            body: None,
            hop_by_hop: &[],
        };
        let classifier = Classifier::with_keys(podgate_tokens::KeySet::new());
        let d = route_by_token(&git, &request, &topology(), &classifier, OnInvalid::Reject);
        assert_eq!(d.outcome.label(), "no_token");
        assert_eq!(forwarded(&d.outcome), Some(1));
        let d = route(&[], None, Some("{bad json"));
        assert_eq!(d.outcome.label(), "malformed_body");
        assert!(matches!(&d.outcome, Outcome::Refused(r) if r.status == 400));
    }

    #[test]
    fn a_multipart_look_ahead_without_a_token_fails_closed() {
        let rule = crate::rules::builtin()
            .into_iter()
            .find(|r| r.name == "job-artifacts-upload")
            .unwrap();
        let h = HeaderMap::new();
        let kind = BodyKind::Multipart("B".into());
        let prefix =
            b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nPK..";
        let request = Request {
            headers: &h,
            query: None,
            body: Some((
                &kind,
                Body {
                    bytes: prefix,
                    complete: false,
                },
            )),
            hop_by_hop: &[],
        };
        let classifier = Classifier::with_keys(podgate_tokens::KeySet::new());
        let d = route_by_token(&rule, &request, &topology(), &classifier, OnInvalid::Reject);
        assert_eq!(d.outcome.label(), "token_not_found");
        let err = match &d.outcome {
            Outcome::Refused(r) => r.to_error(),
            o => panic!("{o:?}"),
        };
        assert_eq!(*err.etype(), pingora::ErrorType::HTTPStatus(400));
        assert_eq!(*err.esource(), pingora::ErrorSource::Downstream);
    }
}

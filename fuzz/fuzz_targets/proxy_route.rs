//! A whole request through the proxy's routing, as both paths run it: head
//! (`fast/head.rs`), the plan (`pipeline::plan`: Host, the rule by production's
//! lookup `rules::rule_for` on the path as GitLab serves it, the body policy),
//! every token in every source (`sources::lookup`: headers, `Authorization`,
//! query, JSON / form / multipart body) and the decision (`pipeline::decide`), over
//! Pods 1 (default), 2 and 3; then the same bytes down the fast path and down
//! pingora-proxy alone, over loopback sockets (`fast::differential`).
//!
//! - nothing panics;
//! - **no Pod for an invalid token**: a forwarded request carries no invalid token
//!   in any source; every token it carries names the Pod it goes to (an unroutable
//!   one: the default Pod); routed as `routable`, its chosen token names that Pod;
//! - a 401 is for a request that carries an invalid token;
//! - **one behaviour**: both paths give the client the same answer and the Pod the
//!   same request (the request id the client gets is the one the Pod got);
//! - **no 5xx**: the Pod stub answers 200, so a 5xx would be the proxy's own.

use std::sync::LazyLock;

use crate::CLASSIFIER;
use podgate_proxy::body::DEFAULT_BODY_LOOKAHEAD as LOOKAHEAD;
use podgate_proxy::decision::{OnInvalid, Outcome};
use podgate_proxy::fast::fuzzing::{Request, request_head};
use podgate_proxy::pipeline::{self, BodyRead, Plan};
use podgate_proxy::rules::{self, Rule};
use podgate_proxy::sources::{self, Body, Lookup};
use podgate_registry::{Topology, TopologyFile};
use podgate_tokens::Classification;

static RULES: LazyLock<Vec<Rule>> = LazyLock::new(rules::builtin);
static TOPOLOGY: LazyLock<Topology> = LazyLock::new(|| {
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
        "#,
        "fuzz",
    )
    .expect("a valid topology")
    .to_topology(1)
});

/// Checks one input (module docs); panics on a violated property.
pub fn run(data: &[u8]) {
    let Request::Head(h) = request_head(data) else {
        return;
    };
    let available = &data[h.len..];
    if available.len() >= h.body_len {
        // One request, its body whole: what both paths do with it.
        let (fast, pingora) = crate::PATHS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .run(&data[..h.len + h.body_len]);
        assert_eq!(fast, pingora, "the fast path and pingora-proxy differ");
        assert!(fast.request_id_kept && pingora.request_id_kept);
        if let Some(answer) = &fast.answer {
            assert!(!answer.start.starts_with("HTTP/1.1 5"), "a 5xx: {fast:?}");
        }
    }
    let head = pipeline::Head {
        method: &h.method,
        path: h.path,
        query: h.query,
        headers: &h.headers,
        host: h
            .headers
            .get(http::header::HOST)
            .and_then(|v| v.to_str().ok()),
        http2: false,
        hop_by_hop: &h.hop_by_hop,
    };
    let Plan::Route { rule, body } = pipeline::plan(&RULES, &head, LOOKAHEAD) else {
        return;
    };
    let rule = &RULES[rule];
    let read = match &body {
        Some(plan) if h.body_len > 0 => {
            if plan.whole() && available.len() < h.body_len {
                return; // a body still on its way
            }
            let n = if plan.whole() && h.body_len > plan.limit {
                0 // declared larger than the cap: not read
            } else {
                h.body_len.min(available.len()).min(plan.limit)
            };
            BodyRead::Read {
                plan,
                bytes: &available[..n],
                complete: n == h.body_len,
            }
        }
        _ => BodyRead::Skipped,
    };
    let d = pipeline::decide(rule, &head, read, &TOPOLOGY, &CLASSIFIER, OnInvalid::Reject);
    let Some(by) = rule.by_token() else {
        return;
    };
    let looked_at = match read {
        BodyRead::Read {
            plan,
            bytes,
            complete,
        } if !plan.whole() || complete => Some((&plan.kind, Body { bytes, complete })),
        _ => None,
    };
    let request_headers = &h.headers;
    let request_query = h.query;
    let hop_by_hop = &h.hop_by_hop;
    let candidates = match sources::lookup(
        &by.sources,
        request_headers,
        request_query,
        looked_at,
        hop_by_hop,
    ) {
        Lookup::Found { candidates, chosen } => {
            assert!(chosen < candidates.len());
            candidates
        }
        _ => Vec::new(),
    };
    for c in &candidates {
        assert!(!c.token.is_empty());
        assert!(c.source < by.sources.len());
    }
    let classes: Vec<Classification> = candidates
        .iter()
        .map(|c| CLASSIFIER.classify(&c.token))
        .collect();
    match &d.outcome {
        Outcome::Forward { pod, why } => {
            for (c, class) in candidates.iter().zip(&classes) {
                let named = match class {
                    Classification::Routable(id) => Some(id.pod),
                    Classification::Unroutable { .. } => TOPOLOGY.default_pod,
                    Classification::Invalid { reason } => {
                        panic!(
                            "forwarded to Pod {} with an invalid token ({reason}): {c:?}",
                            pod.id
                        )
                    }
                };
                assert_eq!(named, Some(pod.id), "{c:?}");
            }
            if *why == "routable" {
                let c = d.token.as_ref().expect("routed by a token");
                assert_eq!(CLASSIFIER.classify(&c.token).pod(), Some(pod.id));
            }
        }
        Outcome::Unauthorized(_) => {
            assert!(
                classes
                    .iter()
                    .any(|c| matches!(c, Classification::Invalid { .. }))
            );
        }
        Outcome::Refused(_) | Outcome::Unavailable(_) => {}
    }
}

//! A whole request through the proxy's routing, as the fast path and
//! `PodGate::route_by_token` run it: head (`fast/head.rs`), path
//! (`path::normalize`), rule (`rules::builtin`), body kind (`params::BodyKind::of`),
//! every token in every source (`sources::lookup`: headers, `Authorization`, query,
//! JSON / form / multipart body) and the decision (`decision::route_by_token`), over
//! Pods 1 (default), 2 and 3.
//!
//! - nothing panics;
//! - **no Pod for an invalid token**: a forwarded request carries no invalid token
//!   in any source; every token it carries names the Pod it goes to (an unroutable
//!   one: the default Pod); routed as `routable`, its chosen token names that Pod;
//! - a 401 is for a request that carries an invalid token.

use std::sync::LazyLock;

use crate::CLASSIFIER;
use podgate_proxy::body::DEFAULT_BODY_LOOKAHEAD as LOOKAHEAD;
use podgate_proxy::decision::{self, OnInvalid, Outcome};
use podgate_proxy::fast::fuzzing::{Request, request_head};
use podgate_proxy::params::BodyKind;
use podgate_proxy::rules::{self, ActionKind, Rule};
use podgate_proxy::sources::{self, Body, Lookup, TokenSource};
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
    let path = podgate_proxy::path::normalize(h.path);
    let Some(rule) = rules::first_match(&RULES, &h.method, &path, &h.headers) else {
        return;
    };
    if rule.action != ActionKind::RouteByToken {
        return;
    }
    let mut kind = None;
    if rule.sources.iter().any(TokenSource::reads_body) {
        let ct = h
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        match BodyKind::of(ct, &h.method) {
            Err(_) => return,
            Ok(BodyKind::Opaque) => {}
            Ok(k) => kind = Some(k),
        }
    }
    let available = &data[h.len..];
    let body = match &kind {
        Some(k) if h.body_len > 0 => {
            let limit = match rule.max_body_bytes {
                Some(max) if k.whole() => max.min(LOOKAHEAD),
                _ => LOOKAHEAD,
            };
            if k.whole() && (h.body_len > limit || available.len() < h.body_len) {
                return; // a 413, or a body still on its way
            }
            let n = h.body_len.min(available.len()).min(limit);
            Some(Body {
                bytes: &available[..n],
                complete: n == h.body_len,
            })
        }
        _ => None,
    };
    let request = decision::Request {
        headers: &h.headers,
        query: h.query,
        body: kind.as_ref().zip(body),
        hop_by_hop: &h.hop_by_hop,
    };
    let d = decision::route_by_token(rule, &request, &TOPOLOGY, &CLASSIFIER, OnInvalid::Reject);

    let candidates = match sources::lookup(
        &rule.sources,
        request.headers,
        request.query,
        request.body,
        request.hop_by_hop,
    ) {
        Lookup::Found { candidates, chosen } => {
            assert!(chosen < candidates.len());
            candidates
        }
        _ => Vec::new(),
    };
    for c in &candidates {
        assert!(!c.token.is_empty());
        assert!(c.source < rule.sources.len());
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

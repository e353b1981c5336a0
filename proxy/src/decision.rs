//! The routing decision: from a token's classification and the current topology to
//! exactly one outcome. Pure, so every rule of the contract is unit-tested here.

use std::sync::Arc;

use podgate_registry::{Pod, PodState, Topology};
use podgate_tokens::{Classification, PodId};
use serde::{Deserialize, Serialize};

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
        /// `session`. A metric label.
        why: &'static str,
    },
    /// Answer 401 with this reason; forward nothing.
    Unauthorized(String),
    /// Answer 503 with `Retry-After`; the reason is logged and counted.
    Unavailable(&'static str),
}

impl Outcome {
    /// The label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Forward { why, .. } => why,
            Outcome::Unauthorized(_) => "unauthorized",
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
}

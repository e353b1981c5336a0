//! Tokens that are not JWTs, classified by their structure: GitLab routable tokens
//! (decoded and CRC-checked by [`gitlab`]) and opaque ones, each with the reason it
//! names no Pod; and the shape test that tells a JWT from them.

use crate::gitlab;
use crate::identity::{
    Classification, Identity, InvalidReason, PodId, TokenFormat, UnroutableReason,
};
use crate::jwt;

/// Everything that is not a JWT: GitLab routable tokens and opaque ones.
pub(super) fn classify_structural(token: &str) -> Classification {
    if let Some(shape) = gitlab::shape(token) {
        return match gitlab::decode_shaped(token, shape) {
            Ok(d) => classify_gitlab(&d),
            Err(reason) => invalid(reason),
        };
    }
    if token.contains('.') {
        return invalid(InvalidReason::Malformed(
            "a dotted token that is neither a JWT nor a GitLab routable token",
        ));
    }
    Classification::Unroutable {
        reason: opaque_reason(token),
    }
}

/// Whether `token` may be a JWT: a bare one (`eyJ…`) or one behind a short `gl…-`
/// prefix, and not a GitLab routable token (whose random part may start `eyJ` too).
pub(super) fn looks_like_jwt(token: &str) -> bool {
    let b = token.as_bytes();
    let head = &b[..b.len().min(52)];
    (b.starts_with(b"eyJ") || head.windows(4).any(|w| w == b"-eyJ"))
        && gitlab::shape(token).is_none()
}

pub(super) fn invalid(reason: InvalidReason) -> Classification {
    Classification::Invalid { reason }
}

fn classify_gitlab(d: &gitlab::Decoded) -> Classification {
    let Some(cell) = d.keys.cell else {
        return Classification::Unroutable {
            reason: UnroutableReason::NoPodKey,
        };
    };
    let Some(pod) = PodId::new(cell) else {
        return invalid(InvalidReason::BadPayload("cell id 0"));
    };
    Classification::Routable(Identity {
        pod,
        kind: d.kind(),
        format: if d.version == 0 {
            TokenFormat::GitlabV0
        } else {
            TokenFormat::GitlabV1
        },
        organization: d.keys.organization,
        group: d.keys.group,
        project: d.keys.project,
        user: d.keys.user,
        agent: None,
        runner_type: d.keys.runner_type(),
        expires_at: None,
    })
}

/// Split a `gl…-` prefix (with optional instance prefix) from the body of an
/// undotted token.
pub(crate) fn split_gitlab_prefix(token: &str) -> Option<(&str, &str)> {
    // GitLab prefixes are short; look for the dash that ends one in the first 48 bytes.
    // Byte search: '-' is ASCII, so every index found is a char boundary.
    let head = &token.as_bytes()[..token.len().min(48)];
    head.iter()
        .enumerate()
        .filter(|&(_, &c)| c == b'-')
        .map(|(i, _)| i)
        .find(|&i| jwt::is_gitlab_prefix(&token[..=i]))
        .map(|i| token.split_at(i + 1))
}

fn opaque_reason(token: &str) -> UnroutableReason {
    if token.starts_with("GR1348941") {
        return UnroutableReason::LegacyRegistration;
    }
    let Some((prefix, body)) = split_gitlab_prefix(token) else {
        return UnroutableReason::Opaque;
    };
    let b = body.as_bytes();
    if b.len() > 3 && b[0] == b't' && matches!(b[1], b'1'..=b'3') && b[2] == b'_' {
        return UnroutableReason::RunnerTypePartition;
    }
    if gitlab::kind_of_prefix(prefix) == crate::TokenKind::Job
        && let Some(us) = body.find('_')
        && us > 0
        && body[..us].bytes().all(|c| c.is_ascii_hexdigit())
    {
        return UnroutableReason::JobPartition;
    }
    UnroutableReason::LegacyPrefixed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classifier::Classifier;
    use crate::keys::KeySet;

    #[test]
    fn opaque_shapes_have_reasons() {
        let cases = [
            (
                "glrt-t1_abcdefghijklmnopqrst",
                UnroutableReason::RunnerTypePartition,
            ),
            (
                "glrt-t3_abcdefghijklmnopqrst",
                UnroutableReason::RunnerTypePartition,
            ),
            (
                "glcbt-64_abcdefghijklmnopqrst",
                UnroutableReason::JobPartition,
            ),
            (
                "glrt-abcdefghijklmnopqrst",
                UnroutableReason::LegacyPrefixed,
            ),
            (
                "acme-glpat-abcdefghijklmnopqrst",
                UnroutableReason::LegacyPrefixed,
            ),
            (
                "GR1348941abcdefghijklmnop",
                UnroutableReason::LegacyRegistration,
            ),
            ("a1b2c3d4e5f6", UnroutableReason::Opaque),
            ("x-y-z", UnroutableReason::Opaque),
        ];
        for (t, want) in cases {
            assert_eq!(
                Classifier::with_keys(KeySet::new()).classify(t),
                Classification::Unroutable { reason: want },
                "{t}"
            );
        }
    }
}

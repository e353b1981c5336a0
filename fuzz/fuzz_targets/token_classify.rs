//! The token classifier on any bytes (`Classifier::classify_at`, the cached path the
//! proxy takes; `classify_uncached_at`; `inspect_at`; `fingerprint`), with keys of
//! every algorithm loaded.
//!
//! - nothing panics;
//! - the cached and uncached verdicts agree, and a repeat (a cache hit) too;
//! - no Pod for an empty, overlong or non-visible-ASCII token, nor for bytes that
//!   are not UTF-8;
//! - a routable JWT verdict is unexpired at the time given; a routable GitLab one
//!   decodes to the same Pod;
//! - `inspect` reports the same status and Pod; a fingerprint shows nothing of a
//!   token but (the end of) its public prefix.

use crate::{CLASSIFIER, NOW};
use podgate_tokens::{Classification, InvalidReason, TokenFormat, gitlab};

/// Checks one input (module docs); panics on a violated property.
pub fn run(data: &[u8]) {
    let Ok(token) = std::str::from_utf8(data) else {
        assert_eq!(
            CLASSIFIER.classify_bytes(data),
            Classification::Invalid {
                reason: InvalidReason::BadCharacters
            }
        );
        return;
    };
    let cached = CLASSIFIER.classify_at(token, NOW);
    let uncached = CLASSIFIER.classify_uncached_at(token, NOW);
    assert_eq!(cached, uncached, "{token:?}");
    assert_eq!(CLASSIFIER.classify_at(token, NOW), cached, "{token:?}");

    let visible = token.bytes().all(|c| c.is_ascii_graphic());
    let max = CLASSIFIER.config().max_token_bytes;
    if token.is_empty() || token.len() > max || !visible {
        assert!(
            matches!(cached, Classification::Invalid { .. }),
            "{token:?}: {cached:?}"
        );
    }
    if let Classification::Routable(id) = cached {
        match id.format {
            TokenFormat::Jwt => {
                let exp = id.expires_at.expect("a routable JWT has an expiry");
                assert!(NOW <= exp + CLASSIFIER.config().leeway_secs);
                assert_eq!(token.matches('.').count(), 2, "{token:?}");
            }
            TokenFormat::GitlabV1 | TokenFormat::GitlabV0 => {
                let d = gitlab::decode(token).expect("a routable GitLab token decodes");
                assert_eq!(d.keys.cell, Some(id.pod.get()));
            }
            TokenFormat::Opaque => panic!("{token:?}: an opaque token is routable"),
        }
    }

    let inspection = CLASSIFIER.inspect_at(token, NOW);
    assert_eq!(inspection.status, cached.status());
    assert_eq!(inspection.pod, cached.pod().map(|p| p.get()));
    let _ = serde_json::to_string(&inspection).expect("an inspection serialises");
    // A fingerprint shows the public `gl…-` prefix (its last 16 characters) or
    // `jwt`, then 8 hex digits: nothing after the prefix's dash.
    let fp = podgate_tokens::fingerprint(token);
    let (shown, hex) = fp.rsplit_once('…').expect("prefix…hex");
    assert!(
        hex.len() == 8 && hex.bytes().all(|c| c.is_ascii_hexdigit()),
        "{fp:?}"
    );
    assert!(shown.len() <= 16, "{fp:?}");
    assert!(
        shown.is_empty()
            || shown == "jwt"
            || (shown.ends_with('-')
                && shown
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')),
        "{token:?}: {fp:?}"
    );
}

//! GitLab routable tokens (`podgate_tokens::gitlab::decode`, v1 and v0).
//!
//! - decoding never panics;
//! - a decoded token's routing keys encode again (v1, any random part) into a token
//!   that decodes to the same prefix and keys;
//! - the classifier agrees: a routable GitLab-format verdict is exactly a decode
//!   with a non-zero `c`, and names that Pod.

use crate::{CLASSIFIER, NOW};
use podgate_tokens::gitlab;
use podgate_tokens::{Classification, TokenFormat};

/// Checks one input (module docs); panics on a violated property.
pub fn run(data: &[u8]) {
    let Ok(token) = std::str::from_utf8(data) else {
        return;
    };
    let decoded = gitlab::decode(token);
    let verdict = CLASSIFIER.classify_uncached_at(token, NOW);
    if let Classification::Routable(id) = verdict
        && matches!(id.format, TokenFormat::GitlabV1 | TokenFormat::GitlabV0)
    {
        let d = decoded
            .as_ref()
            .unwrap_or_else(|e| panic!("routable {token:?} does not decode: {e}"));
        assert_eq!(d.keys.cell, Some(id.pod.get()), "{token:?}");
        assert_eq!(d.version == 0, id.format == TokenFormat::GitlabV0);
    }
    let Ok(d) = decoded else {
        return;
    };
    assert!(d.keys.cell != Some(0) || verdict.pod().is_none());
    // Re-encode: `o` is required to encode, and every key must fit the payload.
    if d.keys.organization.is_none() {
        return;
    }
    let again = match gitlab::encode(&d.prefix, &d.keys, &[0x5a; gitlab::RANDOM_BYTES]) {
        Ok(t) => t,
        Err(gitlab::Error::PayloadTooLarge(_)) => return,
        Err(e) => panic!("{token:?} decoded to {d:?}, which does not encode: {e}"),
    };
    let back = gitlab::decode(&again).unwrap_or_else(|e| panic!("{again:?}: {e}"));
    assert_eq!(back.prefix, d.prefix);
    assert_eq!(back.keys, d.keys);
    assert_eq!(back.version, 1);
}

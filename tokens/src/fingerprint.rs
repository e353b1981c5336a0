//! Token fingerprints: what logs and metrics may say about a token instead of the
//! token itself.

use sha2::{Digest, Sha256};

use crate::classifier::split_gitlab_prefix;

/// A short, stable, non-reversible name for `token`: its public GitLab prefix (if any)
/// and the first 8 hex digits of its SHA-256, e.g. `glrt-…3f2a9c1b`, `jwt…0c1d2e3f`.
///
/// Two log lines with the same fingerprint almost surely saw the same token; nothing
/// of the secret part can be recovered from it.
pub fn fingerprint(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    let hex = hex::encode(&digest[..4]);
    let shown = if token.starts_with("eyJ") {
        "jwt"
    } else {
        split_gitlab_prefix(token).map_or("", |(p, _)| p)
    };
    // An instance prefix may be long or odd; show the GitLab part only.
    let shown = if shown.len() > 16 {
        &shown[shown.len() - 16..]
    } else {
        shown
    };
    format!("{shown}…{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_hide_the_secret() {
        let t = "glrt-AAAAAAAAAAAAAAAAAAAAAGM6MgpnOjlpeApvOjEKdToxNhI.01.1b0zz5pn1";
        let f = fingerprint(t);
        assert!(f.starts_with("glrt-…"), "{f}");
        assert_eq!(f.chars().count(), "glrt-…".chars().count() + 8);
        assert!(!f.contains("AAAA"));
        assert_eq!(f, fingerprint(t), "stable");
        assert_ne!(
            f,
            fingerprint("glrt-AAAAAAAAAAAAAAAAAAAAAGM6MgpnOjlpeApvOjEKdToxNhJ.01.1b0zz5pn1")
        );
        assert!(fingerprint("eyJhbGciOi.x.y").starts_with("jwt…"));
        assert!(fingerprint("plainsecret").starts_with('…'));
    }
}

//! JWT keys: a [`KeySet`] of verification keys addressed by `kid`, and at most one
//! active [`SigningKey`].
//!
//! Each key has exactly one algorithm, fixed when it is loaded; a token must name
//! that algorithm to be checked against it (no algorithm confusion). Verifiers are
//! parsed once, at load time, so verifying a token costs the signature check only.
//!
//! Files (see [`KeySet::load`]):
//!
//! | file | holds | `kid` |
//! |---|---|---|
//! | `<kid>.pem` | a public key (SPKI) or private key (PKCS#8, PKCS#1, SEC1) | file stem |
//! | `<kid>.private.pem` | a private key, the signing key | stem before `.private` |
//! | `*.json` | a JWKS (`{"keys": [...]}`), `kid` required on each key | from the JWK |
//! | `<kid>.hs256` | an HS256 secret, base64 (≥ 32 bytes decoded) | file stem |
//!
//! Key types decide algorithms: Ed25519 → EdDSA, P-256 → ES256, RSA (≥ 2048 bits)
//! → RS256, a secret → HS256.
//!
//! Layout: this file holds the [`Algorithm`], the [`KeySet`] and its [`Error`](enum@Error);
//! `verify` checks signatures ([`VerifyingKey`]), `load` reads key files into a set,
//! `generate` makes new keys ([`generate()`]).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;

mod generate;
mod load;
mod verify;

pub use generate::{GeneratedKey, generate, keyset_from_generated};
use verify::Verifier;
pub use verify::VerifyingKey;

/// Smallest RSA modulus we accept, in bits.
pub const MIN_RSA_BITS: usize = 2048;
/// Smallest HS256 secret we accept, in bytes.
pub const MIN_HMAC_BYTES: usize = 32;

/// Errors loading or generating keys. A configuration problem: fix the file, do not retry.
#[derive(Debug, Error)]
pub enum Error {
    /// A key file could not be read.
    #[error("reading key file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A key file's content is not a key we can use.
    #[error("key file {path}: {reason}")]
    BadKey {
        /// The file (or `<inline>`).
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Two different keys claim the same `kid`.
    #[error("key id {kid:?} is defined twice with different keys ({first} and {second})")]
    DuplicateKid {
        /// The key id.
        kid: String,
        /// Where it was first defined.
        first: PathBuf,
        /// Where it was defined again.
        second: PathBuf,
    },
    /// A file name this loader does not know how to read.
    #[error("key file {0}: unknown extension (expected .pem, .json or .hs256)")]
    UnknownFile(PathBuf),
    /// Several private keys were loaded and none was chosen as the signing key.
    #[error("{0} private keys loaded; choose the signing key by kid")]
    AmbiguousSigningKey(usize),
    /// The requested signing `kid` has no private key.
    #[error("no private key with kid {0:?}")]
    NoSigningKey(String),
}

/// Result alias for this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The JWT algorithms podgate signs and verifies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Ed25519 signatures (`EdDSA`).
    EdDSA,
    /// ECDSA over P-256 with SHA-256.
    ES256,
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    RS256,
    /// HMAC-SHA-256 with a shared secret (development, or kas's own secrets).
    HS256,
}

impl Algorithm {
    /// The JOSE name (`alg` header value).
    pub const fn as_str(self) -> &'static str {
        match self {
            Algorithm::EdDSA => "EdDSA",
            Algorithm::ES256 => "ES256",
            Algorithm::RS256 => "RS256",
            Algorithm::HS256 => "HS256",
        }
    }

    /// The algorithm named by a JOSE `alg` value, if it is one we allow.
    pub fn from_jose(alg: &str) -> Option<Self> {
        match alg {
            "EdDSA" => Some(Algorithm::EdDSA),
            "ES256" => Some(Algorithm::ES256),
            "RS256" => Some(Algorithm::RS256),
            "HS256" => Some(Algorithm::HS256),
            _ => None,
        }
    }

    /// Parse a user-facing name: `ed25519`/`eddsa`, `es256`, `rs256`, `hs256`.
    pub fn from_cli(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "ed25519" | "eddsa" => Some(Algorithm::EdDSA),
            "es256" | "p256" | "p-256" => Some(Algorithm::ES256),
            "rs256" | "rsa" => Some(Algorithm::RS256),
            "hs256" | "hmac" => Some(Algorithm::HS256),
            _ => None,
        }
    }

    pub(crate) const fn to_jsonwebtoken(self) -> jsonwebtoken::Algorithm {
        match self {
            Algorithm::EdDSA => jsonwebtoken::Algorithm::EdDSA,
            Algorithm::ES256 => jsonwebtoken::Algorithm::ES256,
            Algorithm::RS256 => jsonwebtoken::Algorithm::RS256,
            Algorithm::HS256 => jsonwebtoken::Algorithm::HS256,
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A private key that mints tokens.
#[derive(Clone)]
pub struct SigningKey {
    kid: String,
    alg: Algorithm,
    key: jsonwebtoken::EncodingKey,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// The key id written into minted tokens' headers.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The algorithm minted tokens use.
    pub fn algorithm(&self) -> Algorithm {
        self.alg
    }

    pub(crate) fn encoding_key(&self) -> &jsonwebtoken::EncodingKey {
        &self.key
    }
}

/// Verification keys by `kid`, and at most one signing key.
///
/// Rotation with no downtime: add the new key, make it the signing key, and keep the
/// old one in the set until every token it signed has expired.
#[derive(Clone, Debug, Default)]
pub struct KeySet {
    verifying: BTreeMap<String, Arc<VerifyingKey>>,
    signing: Option<SigningKey>,
    signing_candidates: BTreeMap<String, SigningKey>,
}

impl KeySet {
    /// An empty set (every JWT is then [`InvalidReason::NoKeys`](crate::InvalidReason::NoKeys)).
    pub fn new() -> Self {
        Self::default()
    }

    fn insert(&mut self, kid: &str, verifier: Verifier, source: &Path) -> Result<()> {
        if kid.is_empty() {
            return Err(bad(source, "empty key id"));
        }
        if let Verifier::Ed(k) = &verifier
            && k.is_weak()
        {
            return Err(bad(source, "weak (small-order) Ed25519 public key"));
        }
        if let Some(existing) = self.verifying.get(kid) {
            if existing.verifier.algorithm() == verifier.algorithm()
                && existing.verifier.identity_bytes() == verifier.identity_bytes()
            {
                return Ok(());
            }
            return Err(Error::DuplicateKid {
                kid: kid.to_owned(),
                first: existing.source.clone(),
                second: source.to_owned(),
            });
        }
        self.verifying.insert(
            kid.to_owned(),
            Arc::new(VerifyingKey {
                kid: kid.to_owned(),
                source: source.to_owned(),
                verifier,
            }),
        );
        Ok(())
    }

    /// Make the private key `kid` the signing key (it must have been loaded).
    pub fn set_signing(&mut self, kid: &str) -> Result<()> {
        let sk = self
            .signing_candidates
            .get(kid)
            .cloned()
            .ok_or_else(|| Error::NoSigningKey(kid.to_owned()))?;
        self.signing = Some(sk);
        Ok(())
    }

    /// The signing key: the chosen one, or the only private key loaded.
    pub fn signing_key(&self) -> Result<&SigningKey> {
        match &self.signing {
            Some(k) => Ok(k),
            None if self.signing_candidates.is_empty() => {
                Err(Error::NoSigningKey(String::from("<none loaded>")))
            }
            None => Err(Error::AmbiguousSigningKey(self.signing_candidates.len())),
        }
    }

    /// Remove a key (e.g. the previous one, once its tokens have expired).
    pub fn remove(&mut self, kid: &str) -> bool {
        self.signing_candidates.remove(kid);
        if self.signing.as_ref().is_some_and(|s| s.kid == kid) {
            self.signing = None;
        }
        self.verifying.remove(kid).is_some()
    }

    /// Merge another set into this one (e.g. the next key during a rotation).
    pub fn merge(&mut self, other: KeySet) -> Result<()> {
        for (kid, key) in other.verifying {
            self.insert(&kid, key.verifier.clone(), &key.source)?;
        }
        self.signing_candidates.extend(other.signing_candidates);
        if other.signing.is_some() {
            self.signing = other.signing;
        }
        Ok(())
    }

    /// The verification key with this `kid`.
    pub fn get(&self, kid: &str) -> Option<&VerifyingKey> {
        self.verifying.get(kid).map(|k| &**k)
    }

    /// The one key of algorithm `alg`, when the set has exactly one (for tokens
    /// that carry no `kid`).
    pub(crate) fn only_key_for(&self, alg: Algorithm) -> Option<&VerifyingKey> {
        let mut it = self.verifying.values().filter(|k| k.algorithm() == alg);
        match (it.next(), it.next()) {
            (Some(k), None) => Some(k),
            _ => None,
        }
    }

    /// How many verification keys the set holds.
    pub fn len(&self) -> usize {
        self.verifying.len()
    }

    /// Whether the set holds no verification key.
    pub fn is_empty(&self) -> bool {
        self.verifying.is_empty()
    }

    /// The key ids, sorted.
    pub fn kids(&self) -> impl Iterator<Item = &str> {
        self.verifying.keys().map(String::as_str)
    }
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::BadKey {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

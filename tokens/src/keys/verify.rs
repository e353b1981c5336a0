//! Verification: a [`VerifyingKey`] holds one parsed key of one algorithm and
//! checks JOSE signatures with it.

use std::fmt;
use std::path::PathBuf;

use ed25519_dalek::Verifier as _;
use hmac::{Hmac, Mac};
use p256::pkcs8::EncodePublicKey;
use rsa::traits::PublicKeyParts;
use sha2::Sha256;
use zeroize::Zeroizing;

use super::{Algorithm, MIN_RSA_BITS};

/// A parsed public key (or HMAC secret), ready to check signatures.
///
/// Each backend is the fastest measured on our machines for its algorithm:
/// ed25519-dalek for EdDSA, OpenSSL for RS256 and ES256, RustCrypto HMAC for HS256.
#[derive(Clone)]
pub(super) enum Verifier {
    Ed(ed25519_dalek::VerifyingKey),
    Es {
        key: openssl::ec::EcKey<openssl::pkey::Public>,
        /// SEC1 compressed point, to compare keys.
        id: Vec<u8>,
    },
    Rs {
        key: openssl::pkey::PKey<openssl::pkey::Public>,
        /// Modulus and exponent, to compare keys.
        id: Vec<u8>,
    },
    Hs(Zeroizing<Vec<u8>>),
}

impl Verifier {
    pub(super) fn es256(k: &p256::ecdsa::VerifyingKey) -> std::result::Result<Self, String> {
        let der = k.to_public_key_der().map_err(|e| e.to_string())?;
        let key =
            openssl::ec::EcKey::public_key_from_der(der.as_bytes()).map_err(|e| e.to_string())?;
        Ok(Verifier::Es {
            key,
            id: k.to_encoded_point(true).as_bytes().to_vec(),
        })
    }

    pub(super) fn rs256(k: &rsa::RsaPublicKey) -> std::result::Result<Self, String> {
        let bits = k.size() * 8;
        if bits < MIN_RSA_BITS {
            return Err(format!(
                "RSA key of {bits} bits; at least {MIN_RSA_BITS} required"
            ));
        }
        let der = k.to_public_key_der().map_err(|e| e.to_string())?;
        let key =
            openssl::pkey::PKey::public_key_from_der(der.as_bytes()).map_err(|e| e.to_string())?;
        let mut id = k.n().to_bytes_be();
        id.extend(k.e().to_bytes_be());
        Ok(Verifier::Rs { key, id })
    }

    pub(super) fn algorithm(&self) -> Algorithm {
        match self {
            Verifier::Ed(_) => Algorithm::EdDSA,
            Verifier::Es { .. } => Algorithm::ES256,
            Verifier::Rs { .. } => Algorithm::RS256,
            Verifier::Hs(_) => Algorithm::HS256,
        }
    }

    /// Bytes that identify the key, to tell a duplicate `kid` from a conflicting one.
    pub(super) fn identity_bytes(&self) -> &[u8] {
        match self {
            Verifier::Ed(k) => k.as_bytes(),
            Verifier::Es { id, .. } | Verifier::Rs { id, .. } => id,
            Verifier::Hs(s) => s,
        }
    }
}

/// One verification key: a `kid`, its algorithm, and the parsed key.
#[derive(Clone)]
pub struct VerifyingKey {
    pub(super) kid: String,
    /// The file it came from, for error messages.
    pub(super) source: PathBuf,
    pub(super) verifier: Verifier,
}

impl fmt::Debug for VerifyingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerifyingKey")
            .field("kid", &self.kid)
            .field("alg", &self.algorithm())
            .field("source", &self.source)
            .finish()
    }
}

impl VerifyingKey {
    /// The key id.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The one algorithm this key verifies.
    pub fn algorithm(&self) -> Algorithm {
        self.verifier.algorithm()
    }

    /// Whether `signature` (raw bytes, JOSE encoding) signs `message` under this key.
    pub fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        match &self.verifier {
            // RFC 8032 verification, as jsonwebtoken does. Weak (small-order) public
            // keys are refused when loaded, and signature malleability cannot change
            // a verdict: the cache is keyed by the whole token.
            Verifier::Ed(k) => ed25519_dalek::Signature::from_slice(signature)
                .is_ok_and(|s| k.verify(message, &s).is_ok()),
            Verifier::Es { key, .. } => verify_es256(key, message, signature),
            Verifier::Rs { key, .. } => verify_rs256(key, message, signature),
            Verifier::Hs(secret) => {
                let mut mac = Hmac::<Sha256>::new_from_slice(secret)
                    .expect("HMAC accepts keys of any length");
                mac.update(message);
                // Constant-time comparison.
                mac.verify_slice(signature).is_ok()
            }
        }
    }
}

/// ES256: the JOSE signature is `r ‖ s`, 32 bytes each, over SHA-256 of the message.
fn verify_es256(
    key: &openssl::ec::EcKey<openssl::pkey::Public>,
    message: &[u8],
    signature: &[u8],
) -> bool {
    if signature.len() != 64 {
        return false;
    }
    let digest = openssl::sha::sha256(message);
    let sig = openssl::bn::BigNum::from_slice(&signature[..32])
        .and_then(|r| Ok((r, openssl::bn::BigNum::from_slice(&signature[32..])?)))
        .and_then(|(r, s)| openssl::ecdsa::EcdsaSig::from_private_components(r, s));
    sig.and_then(|sig| sig.verify(&digest, key))
        .unwrap_or(false)
}

/// RS256: RSASSA-PKCS1-v1_5 with SHA-256.
fn verify_rs256(
    key: &openssl::pkey::PKey<openssl::pkey::Public>,
    message: &[u8],
    signature: &[u8],
) -> bool {
    let Ok(mut v) = openssl::sign::Verifier::new(openssl::hash::MessageDigest::sha256(), key)
    else {
        return false;
    };
    v.set_rsa_padding(openssl::rsa::Padding::PKCS1)
        .and_then(|()| v.verify_oneshot(signature, message))
        .unwrap_or(false)
}

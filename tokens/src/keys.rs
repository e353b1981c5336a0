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

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE, URL_SAFE_NO_PAD};
use ed25519_dalek::Verifier as _;
use hmac::{Hmac, Mac};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm};
use p256::pkcs8::{
    DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey, LineEnding,
};
use rsa::pkcs1::{DecodeRsaPrivateKey, DecodeRsaPublicKey};
use rsa::traits::PublicKeyParts;
use sha2::Sha256;
use thiserror::Error;
use zeroize::Zeroizing;

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

/// A parsed public key (or HMAC secret), ready to check signatures.
///
/// Each backend is the fastest measured on our machines for its algorithm:
/// ed25519-dalek for EdDSA, OpenSSL for RS256 and ES256, RustCrypto HMAC for HS256.
#[derive(Clone)]
enum Verifier {
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
    fn es256(k: &p256::ecdsa::VerifyingKey) -> std::result::Result<Self, String> {
        let der = k.to_public_key_der().map_err(|e| e.to_string())?;
        let key =
            openssl::ec::EcKey::public_key_from_der(der.as_bytes()).map_err(|e| e.to_string())?;
        Ok(Verifier::Es {
            key,
            id: k.to_encoded_point(true).as_bytes().to_vec(),
        })
    }

    fn rs256(k: &rsa::RsaPublicKey) -> std::result::Result<Self, String> {
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

    fn algorithm(&self) -> Algorithm {
        match self {
            Verifier::Ed(_) => Algorithm::EdDSA,
            Verifier::Es { .. } => Algorithm::ES256,
            Verifier::Rs { .. } => Algorithm::RS256,
            Verifier::Hs(_) => Algorithm::HS256,
        }
    }

    /// Bytes that identify the key, to tell a duplicate `kid` from a conflicting one.
    fn identity_bytes(&self) -> &[u8] {
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
    kid: String,
    source: PathBuf,
    verifier: Verifier,
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

    /// Load keys from a file or from every key file in a directory (not recursive;
    /// hidden files skipped). A single private key found becomes the signing key.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        Self::load_all(&[path])
    }

    /// Load keys from several files or directories into one set.
    pub fn load_all<P: AsRef<Path>>(paths: &[P]) -> Result<Self> {
        let mut set = KeySet::new();
        for p in paths {
            set.load_into(p.as_ref())?;
        }
        if set.signing_candidates.len() == 1 {
            set.signing = set.signing_candidates.values().next().cloned();
        }
        Ok(set)
    }

    fn load_into(&mut self, path: &Path) -> Result<()> {
        let meta = std::fs::metadata(path).map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        })?;
        if !meta.is_dir() {
            return self.load_file(path, true);
        }
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|source| Error::Io {
                path: path.to_owned(),
                source,
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .filter(|p| {
                !p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with('.'))
            })
            .collect();
        entries.sort();
        for p in entries {
            self.load_file(&p, false)?;
        }
        Ok(())
    }

    fn load_file(&mut self, path: &Path, explicit: bool) -> Result<()> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let read = || {
            std::fs::read(path).map_err(|source| Error::Io {
                path: path.to_owned(),
                source,
            })
        };
        if let Some(stem) = name.strip_suffix(".pem") {
            let kid = stem.strip_suffix(".private").unwrap_or(stem);
            let text = String::from_utf8(read()?).map_err(|_| bad(path, "not UTF-8 PEM"))?;
            self.add_pem(kid, &text, path)
        } else if name.ends_with(".json") {
            let text = String::from_utf8(read()?).map_err(|_| bad(path, "not UTF-8 JSON"))?;
            self.add_jwks(&text, path)
        } else if let Some(kid) = name.strip_suffix(".hs256") {
            let secret = decode_secret(&read()?).map_err(|r| bad(path, r))?;
            self.add_hs256(kid, &secret, path)
        } else if explicit {
            Err(Error::UnknownFile(path.to_owned()))
        } else {
            Ok(())
        }
    }

    /// Add a PEM key (public or private). A private key also becomes a signing
    /// candidate under the same `kid`.
    pub fn add_pem(&mut self, kid: &str, pem: &str, source: &Path) -> Result<()> {
        let (verifier, signing) = parse_pem(pem).map_err(|r| bad(source, r))?;
        self.insert(kid, verifier, source)?;
        if let Some(key) = signing {
            let sk = SigningKey {
                kid: kid.to_owned(),
                alg: self.verifying[kid].algorithm(),
                key,
            };
            self.signing_candidates.insert(kid.to_owned(), sk);
        }
        Ok(())
    }

    /// Add an HS256 secret (raw bytes, at least [`MIN_HMAC_BYTES`]); it can both
    /// verify and sign.
    pub fn add_hs256(&mut self, kid: &str, secret: &[u8], source: &Path) -> Result<()> {
        if secret.len() < MIN_HMAC_BYTES {
            return Err(bad(
                source,
                format!(
                    "HS256 secret is {} bytes; at least {MIN_HMAC_BYTES} required",
                    secret.len()
                ),
            ));
        }
        self.insert(kid, Verifier::Hs(Zeroizing::new(secret.to_vec())), source)?;
        self.signing_candidates.insert(
            kid.to_owned(),
            SigningKey {
                kid: kid.to_owned(),
                alg: Algorithm::HS256,
                key: jsonwebtoken::EncodingKey::from_secret(secret),
            },
        );
        Ok(())
    }

    /// Add every key of a JWKS document. Each key needs a `kid`; public keys only
    /// (private JWK members are ignored), plus `oct` keys as HS256 secrets.
    pub fn add_jwks(&mut self, json: &str, source: &Path) -> Result<()> {
        let set: JwkSet =
            serde_json::from_str(json).map_err(|e| bad(source, format!("not a JWKS: {e}")))?;
        for jwk in &set.keys {
            let kid = jwk
                .common
                .key_id
                .clone()
                .ok_or_else(|| bad(source, "a JWK without \"kid\""))?;
            let verifier =
                jwk_verifier(jwk).map_err(|r| bad(source, format!("kid {kid:?}: {r}")))?;
            self.insert(&kid, verifier, source)?;
        }
        Ok(())
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

/// Decode an HS256 secret file: base64 (standard or URL-safe, padded or not),
/// surrounding whitespace ignored.
fn decode_secret(raw: &[u8]) -> std::result::Result<Zeroizing<Vec<u8>>, &'static str> {
    let text = std::str::from_utf8(raw).map_err(|_| "HS256 secret file is not base64 text")?;
    let t = text.trim();
    [STANDARD, URL_SAFE, URL_SAFE_NO_PAD]
        .iter()
        .find_map(|e| e.decode(t).ok())
        .or_else(|| {
            base64::engine::general_purpose::STANDARD_NO_PAD
                .decode(t)
                .ok()
        })
        .map(Zeroizing::new)
        .ok_or("HS256 secret file is not base64 text")
}

type ParsedPem = (Verifier, Option<jsonwebtoken::EncodingKey>);

/// Parse a PEM key of any supported type into its verifier (and, for private keys,
/// a jsonwebtoken signing key).
fn parse_pem(pem: &str) -> std::result::Result<ParsedPem, String> {
    let label = pem
        .lines()
        .find_map(|l| l.trim().strip_prefix("-----BEGIN "))
        .and_then(|l| l.strip_suffix("-----"))
        .ok_or("no PEM block found")?;
    match label {
        "PUBLIC KEY" => {
            if let Ok(k) = ed25519_dalek::VerifyingKey::from_public_key_pem(pem) {
                return Ok((Verifier::Ed(k), None));
            }
            if let Ok(k) = p256::ecdsa::VerifyingKey::from_public_key_pem(pem) {
                return Ok((Verifier::es256(&k)?, None));
            }
            if let Ok(k) = rsa::RsaPublicKey::from_public_key_pem(pem) {
                return Ok((Verifier::rs256(&k)?, None));
            }
            Err("unsupported public key type (expected Ed25519, P-256 or RSA)".into())
        }
        "RSA PUBLIC KEY" => {
            let k = rsa::RsaPublicKey::from_pkcs1_pem(pem).map_err(|e| e.to_string())?;
            Ok((Verifier::rs256(&k)?, None))
        }
        "PRIVATE KEY" => {
            if let Ok(k) = ed25519_dalek::SigningKey::from_pkcs8_pem(pem) {
                let ek = jsonwebtoken::EncodingKey::from_ed_pem(pem.as_bytes())
                    .map_err(|e| e.to_string())?;
                return Ok((Verifier::Ed(k.verifying_key()), Some(ek)));
            }
            if let Ok(k) = p256::ecdsa::SigningKey::from_pkcs8_pem(pem) {
                let ek = jsonwebtoken::EncodingKey::from_ec_pem(pem.as_bytes())
                    .map_err(|e| e.to_string())?;
                return Ok((Verifier::es256(k.verifying_key())?, Some(ek)));
            }
            if let Ok(k) = rsa::RsaPrivateKey::from_pkcs8_pem(pem) {
                let ek = jsonwebtoken::EncodingKey::from_rsa_pem(pem.as_bytes())
                    .map_err(|e| e.to_string())?;
                return Ok((Verifier::rs256(&k.to_public_key())?, Some(ek)));
            }
            Err("unsupported private key type (expected Ed25519, P-256 or RSA)".into())
        }
        "RSA PRIVATE KEY" => {
            let k = rsa::RsaPrivateKey::from_pkcs1_pem(pem).map_err(|e| e.to_string())?;
            let ek = jsonwebtoken::EncodingKey::from_rsa_pem(pem.as_bytes())
                .map_err(|e| e.to_string())?;
            Ok((Verifier::rs256(&k.to_public_key())?, Some(ek)))
        }
        "EC PRIVATE KEY" => {
            let sk = p256::SecretKey::from_sec1_pem(pem).map_err(|e| e.to_string())?;
            // jsonwebtoken signs with PKCS#8 only: convert.
            let pkcs8 = sk.to_pkcs8_pem(LineEnding::LF).map_err(|e| e.to_string())?;
            let ek = jsonwebtoken::EncodingKey::from_ec_pem(pkcs8.as_bytes())
                .map_err(|e| e.to_string())?;
            let vk = p256::ecdsa::VerifyingKey::from(&p256::ecdsa::SigningKey::from(sk));
            Ok((Verifier::es256(&vk)?, Some(ek)))
        }
        other => Err(format!("unsupported PEM block {other:?}")),
    }
}

fn b64url(s: &str) -> std::result::Result<Vec<u8>, String> {
    URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .map_err(|_| "member is not base64url".to_string())
}

fn jwk_verifier(jwk: &Jwk) -> std::result::Result<Verifier, String> {
    let declared = jwk.common.key_algorithm;
    let check = |alg: KeyAlgorithm| match declared {
        None => Ok(()),
        Some(d) if d == alg => Ok(()),
        Some(d) => Err(format!("\"alg\" {d:?} does not fit the key type")),
    };
    match &jwk.algorithm {
        AlgorithmParameters::OctetKeyPair(p) => {
            check(KeyAlgorithm::EdDSA)?;
            if p.curve != EllipticCurve::Ed25519 {
                return Err("only Ed25519 OKP keys are supported".into());
            }
            let x: [u8; 32] = b64url(&p.x)?
                .try_into()
                .map_err(|_| "Ed25519 \"x\" must be 32 bytes")?;
            let k = ed25519_dalek::VerifyingKey::from_bytes(&x).map_err(|e| e.to_string())?;
            Ok(Verifier::Ed(k))
        }
        AlgorithmParameters::EllipticCurve(p) => {
            check(KeyAlgorithm::ES256)?;
            if p.curve != EllipticCurve::P256 {
                return Err("only P-256 EC keys are supported".into());
            }
            let (x, y) = (b64url(&p.x)?, b64url(&p.y)?);
            if x.len() != 32 || y.len() != 32 {
                return Err("P-256 coordinates must be 32 bytes".into());
            }
            let point = p256::EncodedPoint::from_affine_coordinates(
                x.as_slice().into(),
                y.as_slice().into(),
                false,
            );
            let k = p256::ecdsa::VerifyingKey::from_encoded_point(&point)
                .map_err(|_| "EC point is not on P-256")?;
            Verifier::es256(&k)
        }
        AlgorithmParameters::RSA(p) => {
            check(KeyAlgorithm::RS256)?;
            let n = rsa::BigUint::from_bytes_be(&b64url(&p.n)?);
            let e = rsa::BigUint::from_bytes_be(&b64url(&p.e)?);
            let k = rsa::RsaPublicKey::new(n, e).map_err(|e| e.to_string())?;
            Verifier::rs256(&k)
        }
        AlgorithmParameters::OctetKey(p) => {
            check(KeyAlgorithm::HS256)?;
            let k = b64url(&p.value)?;
            if k.len() < MIN_HMAC_BYTES {
                return Err(format!("HS256 secret shorter than {MIN_HMAC_BYTES} bytes"));
            }
            Ok(Verifier::Hs(Zeroizing::new(k)))
        }
    }
}

/// A freshly generated key pair (or secret), as files' contents.
pub struct GeneratedKey {
    /// The algorithm.
    pub alg: Algorithm,
    /// The private key (PKCS#8 PEM), or the base64 secret for HS256. Keep it secret.
    pub private: Zeroizing<String>,
    /// The public key (SPKI PEM); `None` for HS256.
    pub public: Option<String>,
}

/// Generate a new key for `alg` from the operating system's CSPRNG.
pub fn generate(alg: Algorithm) -> std::result::Result<GeneratedKey, String> {
    let mut rng = rand::rngs::OsRng;
    let lf = LineEnding::LF;
    let (private, public) = match alg {
        Algorithm::EdDSA => {
            let sk = ed25519_dalek::SigningKey::generate(&mut rng);
            (
                sk.to_pkcs8_pem(lf).map_err(|e| e.to_string())?,
                Some(
                    sk.verifying_key()
                        .to_public_key_pem(lf)
                        .map_err(|e| e.to_string())?,
                ),
            )
        }
        Algorithm::ES256 => {
            let sk = p256::ecdsa::SigningKey::random(&mut rng);
            (
                sk.to_pkcs8_pem(lf).map_err(|e| e.to_string())?,
                Some(
                    sk.verifying_key()
                        .to_public_key_pem(lf)
                        .map_err(|e| e.to_string())?,
                ),
            )
        }
        Algorithm::RS256 => {
            let sk = rsa::RsaPrivateKey::new(&mut rng, MIN_RSA_BITS).map_err(|e| e.to_string())?;
            (
                sk.to_pkcs8_pem(lf).map_err(|e| e.to_string())?,
                Some(
                    sk.to_public_key()
                        .to_public_key_pem(lf)
                        .map_err(|e| e.to_string())?,
                ),
            )
        }
        Algorithm::HS256 => {
            use rand::RngCore as _;
            let mut secret = Zeroizing::new([0u8; MIN_HMAC_BYTES]);
            rng.fill_bytes(secret.as_mut());
            (Zeroizing::new(STANDARD.encode(secret.as_ref())), None)
        }
    };
    Ok(GeneratedKey {
        alg,
        private,
        public,
    })
}

/// A key set holding one generated key under `kid`, signing with it. For tests and demos.
pub fn keyset_from_generated(kid: &str, key: &GeneratedKey) -> Result<KeySet> {
    let mut set = KeySet::new();
    let src = Path::new("<generated>");
    match key.alg {
        Algorithm::HS256 => {
            let secret = decode_secret(key.private.as_bytes()).map_err(|r| bad(src, r))?;
            set.add_hs256(kid, &secret, src)?;
        }
        _ => set.add_pem(kid, &key.private, src)?,
    }
    set.set_signing(kid)?;
    Ok(set)
}

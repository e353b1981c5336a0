//! Loading keys into a [`KeySet`]: files and directories (PEM, JWKS, HS256
//! secrets; the table is in the module docs of [`keys`](super)), and the parsers
//! behind them.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm};
use p256::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, LineEnding};
use rsa::pkcs1::{DecodeRsaPrivateKey, DecodeRsaPublicKey};
use zeroize::Zeroizing;

use super::verify::Verifier;
use super::{Algorithm, Error, KeySet, MIN_HMAC_BYTES, Result, SigningKey, bad};

impl KeySet {
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
}

/// Decode an HS256 secret file: base64 (standard or URL-safe, padded or not),
/// surrounding whitespace ignored.
pub(super) fn decode_secret(raw: &[u8]) -> std::result::Result<Zeroizing<Vec<u8>>, &'static str> {
    let text = std::str::from_utf8(raw).map_err(|_| "HS256 secret file is not base64 text")?;
    let t = text.trim();
    [STANDARD, URL_SAFE, URL_SAFE_NO_PAD]
        .iter()
        .find_map(|e| e.decode(t).ok())
        .or_else(|| STANDARD_NO_PAD.decode(t).ok())
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

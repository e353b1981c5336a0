//! Key generation: a new key of any supported algorithm, as the files
//! [`KeySet::load`] reads, and a [`KeySet`] around it for tests and demos.

use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use p256::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
use zeroize::Zeroizing;

use super::load::decode_secret;
use super::{Algorithm, KeySet, MIN_HMAC_BYTES, MIN_RSA_BITS, Result, bad};

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
    let (private, public) = match alg {
        Algorithm::EdDSA => {
            let sk = ed25519_dalek::SigningKey::generate(&mut rng);
            pem_pair(&sk, &sk.verifying_key())?
        }
        Algorithm::ES256 => {
            let sk = p256::ecdsa::SigningKey::random(&mut rng);
            pem_pair(&sk, sk.verifying_key())?
        }
        Algorithm::RS256 => {
            let sk = rsa::RsaPrivateKey::new(&mut rng, MIN_RSA_BITS).map_err(|e| e.to_string())?;
            pem_pair(&sk, &sk.to_public_key())?
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

/// A private key as PKCS#8 PEM and its public key as SPKI PEM.
fn pem_pair(
    private: &impl EncodePrivateKey,
    public: &impl EncodePublicKey,
) -> std::result::Result<(Zeroizing<String>, Option<String>), String> {
    let lf = LineEnding::LF;
    Ok((
        private.to_pkcs8_pem(lf).map_err(|e| e.to_string())?,
        Some(public.to_public_key_pem(lf).map_err(|e| e.to_string())?),
    ))
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

//! JWT authentication of kas's gRPC endpoints.
//!
//! - *External* (GitLab → kas): HMAC (HS256, HS384 or HS512) with the shared GitLab ↔
//!   kas secret, audience `gitlab-kas`, any issuer unless one is configured, `exp` and
//!   `nbf` checked when present, the token in `authorization: bearer …` with the
//!   scheme in any case: as GitLab's kas checks Rails' tokens
//!   (`internal/tool/grpctool/jwt_server_auth.go`, built with an empty issuer in
//!   `cmd/kas/kasapp/app_api_server.go`,
//!   <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/tool/grpctool/jwt_server_auth.go>).
//!   Rails signs with `iss` = its host name and sends `bearer` in lower case
//!   (`lib/gitlab/kas/client.rb` in gitlabhq/gitlabhq).
//! - *Internal* (kas → kas): HS256 with a secret only kas instances hold, issuer and
//!   audience `kas-internal`, and a lifetime of at most [`INTERNAL_MAX_TTL_SECS`]. A
//!   token signed with the external secret never opens it.
//!
//! Every failure is `Unauthenticated` with the same bare message: nothing tells a
//! caller which check failed.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tonic::Status;
use tonic::metadata::MetadataMap;

/// Longest lifetime an internal token may have.
pub const INTERNAL_MAX_TTL_SECS: u64 = 60;
const INTERNAL: &str = "kas-internal";

/// Secret problems (configuration).
#[derive(Debug, Error)]
pub enum Error {
    /// Too short to be a secret.
    #[error("{0}: a secret must be at least 32 bytes")]
    ShortSecret(&'static str),
    /// Not base64.
    #[error("{0}: not base64 ({1})")]
    NotBase64(&'static str, String),
    /// Minting failed.
    #[error("minting a token: {0}")]
    Mint(String),
}

/// Decode a secret file's contents: base64 (as GitLab writes `.gitlab_kas_secret`),
/// at least 32 bytes. `field` names it in errors.
pub fn decode_secret(field: &'static str, text: &str) -> Result<Vec<u8>, Error> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| Error::NotBase64(field, e.to_string()))?;
    if bytes.len() < 32 {
        return Err(Error::ShortSecret(field));
    }
    Ok(bytes)
}

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    iss: String,
    aud: String,
    iat: u64,
    exp: u64,
    /// Not before (`Gitlab-Kas-Api-Request` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nbf: Option<u64>,
}

/// The claims [`JwtAuth::verify`] reads itself (the rest are jsonwebtoken's checks):
/// both optional, as GitLab's tokens need neither.
#[derive(Debug, Deserialize)]
struct Lifetime {
    #[serde(default)]
    iat: Option<u64>,
    #[serde(default)]
    exp: Option<u64>,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Checks the bearer JWT of every request on one listener.
#[derive(Clone)]
pub struct JwtAuth {
    key: DecodingKey,
    validation: Validation,
    max_ttl: Option<u64>,
}

impl std::fmt::Debug for JwtAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtAuth").finish_non_exhaustive()
    }
}

impl JwtAuth {
    /// The external endpoint: audience `gitlab-kas`, issuer `issuer` (empty: any
    /// issuer, as GitLab's kas), HS256/384/512, `exp` checked when present.
    pub fn external(secret: &[u8], issuer: &str) -> Result<Self, Error> {
        let mut auth = Self::new(secret, issuer, "gitlab-kas", None, "external secret")?;
        auth.validation.algorithms = vec![Algorithm::HS256, Algorithm::HS384, Algorithm::HS512];
        if issuer.is_empty() {
            auth.validation.iss = None;
            auth.validation.set_required_spec_claims(&["aud"]);
        } else {
            auth.validation.set_required_spec_claims(&["iss", "aud"]);
        }
        Ok(auth)
    }

    /// The internal endpoint.
    pub fn internal(secret: &[u8]) -> Result<Self, Error> {
        Self::new(
            secret,
            INTERNAL,
            INTERNAL,
            Some(INTERNAL_MAX_TTL_SECS),
            "internal secret",
        )
    }

    fn new(
        secret: &[u8],
        issuer: &str,
        audience: &str,
        max_ttl: Option<u64>,
        field: &'static str,
    ) -> Result<Self, Error> {
        if secret.len() < 32 {
            return Err(Error::ShortSecret(field));
        }
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_issuer(&[issuer]);
        validation.set_audience(&[audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.leeway = 5;
        Ok(JwtAuth {
            key: DecodingKey::from_secret(secret),
            validation,
            max_ttl,
        })
    }

    /// Check `authorization: Bearer <jwt>`: the same bare `Unauthenticated` for
    /// every failure.
    pub fn check(&self, metadata: &MetadataMap) -> Result<(), Status> {
        self.verify(metadata)
            .map_err(|_| Status::unauthenticated("unauthenticated"))
    }

    /// Check `authorization: Bearer <jwt>`, saying why it failed (for the kas's own
    /// logs and metrics, never for the caller).
    pub fn verify(&self, metadata: &MetadataMap) -> Result<(), Refusal> {
        use jsonwebtoken::errors::ErrorKind;
        let token = bearer(metadata).ok_or(Refusal::Missing)?;
        let data =
            jsonwebtoken::decode::<Lifetime>(token, &self.key, &self.validation).map_err(|e| {
                match e.kind() {
                    ErrorKind::InvalidSignature => Refusal::Signature,
                    ErrorKind::ExpiredSignature | ErrorKind::ImmatureSignature => Refusal::Expired,
                    ErrorKind::InvalidIssuer
                    | ErrorKind::InvalidAudience
                    | ErrorKind::MissingRequiredClaim(_)
                    | ErrorKind::InvalidAlgorithm => Refusal::Claims,
                    _ => Refusal::Malformed,
                }
            })?;
        if let Some(max) = self.max_ttl
            && data
                .claims
                .exp
                .unwrap_or(u64::MAX)
                .saturating_sub(data.claims.iat.unwrap_or(0))
                > max
        {
            return Err(Refusal::Lifetime);
        }
        Ok(())
    }
}

/// Why a bearer token was refused: a metric label, from a small fixed set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No `authorization: Bearer` header.
    Missing,
    /// Not a token this endpoint can read (not a JWT, bad encoding).
    Malformed,
    /// Signed with another secret (a mismatched secret shows up here).
    Signature,
    /// Expired, or not valid yet (clock skew).
    Expired,
    /// Issuer, audience, algorithm or a required claim is wrong.
    Claims,
    /// Valid for longer than this endpoint allows.
    Lifetime,
    /// Not an agent token this kas knows (agent listener).
    Unknown,
}

impl Refusal {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Malformed => "malformed",
            Refusal::Signature => "signature",
            Refusal::Expired => "expired",
            Refusal::Claims => "claims",
            Refusal::Lifetime => "lifetime",
            Refusal::Unknown => "unknown",
        }
    }
}

/// The token of `authorization: Bearer <token>`, if there is one; the scheme in any
/// case, as grpc-go middleware's `AuthFromMD` reads it.
pub fn bearer(metadata: &MetadataMap) -> Option<&str> {
    let v = metadata.get("authorization")?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// A token for kas → kas calls, valid for `ttl_secs` (at most
/// [`INTERNAL_MAX_TTL_SECS`]).
pub fn mint_internal(secret: &[u8], ttl_secs: u64) -> Result<String, Error> {
    mint(
        secret,
        INTERNAL,
        INTERNAL,
        ttl_secs.min(INTERNAL_MAX_TTL_SECS),
    )
}

/// A token as GitLab sends to the external endpoint (for tests and tools).
pub fn mint_external(secret: &[u8], issuer: &str, ttl_secs: u64) -> Result<String, Error> {
    mint(secret, issuer, "gitlab-kas", ttl_secs)
}

/// The `Gitlab-Kas-Api-Request` JWT kas sends with its calls to GitLab's internal
/// API (issuer `gitlab-kas`, audience `gitlab`, signed with the shared secret),
/// valid for 30 s and from 5 s ago, as GitLab's kas mints it
/// (`internal/gitlab/client.go`: `jwtValidFor`, `jwtNotBefore`).
pub fn mint_kas_api_request(secret: &[u8]) -> Result<String, Error> {
    mint_claims(secret, "gitlab-kas", "gitlab", 30, Some(5))
}

fn mint(secret: &[u8], iss: &str, aud: &str, ttl_secs: u64) -> Result<String, Error> {
    mint_claims(secret, iss, aud, ttl_secs, None)
}

fn mint_claims(
    secret: &[u8],
    iss: &str,
    aud: &str,
    ttl_secs: u64,
    not_before_secs: Option<u64>,
) -> Result<String, Error> {
    let now = now();
    let claims = Claims {
        iss: iss.to_owned(),
        aud: aud.to_owned(),
        iat: now,
        exp: now + ttl_secs,
        nbf: not_before_secs.map(|b| now.saturating_sub(b)),
    };
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret),
    )
    .map_err(|e| Error::Mint(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(token: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert("authorization", format!("Bearer {token}").parse().unwrap());
        m
    }

    /// A token that expired two minutes ago (past any leeway).
    fn expired(secret: &[u8], iss: &str, aud: &str) -> String {
        let claims = Claims {
            iss: iss.into(),
            aud: aud.into(),
            iat: now() - 150,
            exp: now() - 120,
            nbf: None,
        };
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret),
        )
        .unwrap()
    }

    #[test]
    fn kas_api_request_tokens_live_30_s_from_5_s_ago_as_gitlab_kas_mints_them() {
        let token = mint_kas_api_request(&[3u8; 32]).unwrap();
        let mut v = jsonwebtoken::Validation::new(Algorithm::HS256);
        v.set_audience(&["gitlab"]);
        v.set_issuer(&["gitlab-kas"]);
        let c = jsonwebtoken::decode::<Claims>(
            &token,
            &jsonwebtoken::DecodingKey::from_secret(&[3u8; 32]),
            &v,
        )
        .unwrap()
        .claims;
        assert_eq!(c.exp - c.iat, 30);
        assert_eq!(c.nbf, Some(c.iat - 5));
    }

    #[test]
    fn the_external_listener_takes_any_issuer_unless_one_is_set_and_bearer_in_any_case() {
        let secret = [7u8; 32];
        let any = JwtAuth::external(&secret, "").unwrap();
        let only = JwtAuth::external(&secret, "gitlab.example.com").unwrap();
        let rails = mint_external(&secret, "gitlab.example.com", 60).unwrap();
        let other = mint_external(&secret, "elsewhere", 60).unwrap();
        for scheme in ["bearer", "Bearer", "BEARER"] {
            let mut m = MetadataMap::new();
            m.insert(
                "authorization",
                format!("{scheme} {rails}").parse().unwrap(),
            );
            assert!(any.check(&m).is_ok(), "{scheme}");
            assert!(only.check(&m).is_ok(), "{scheme}");
        }
        assert!(any.check(&md(&other)).is_ok());
        assert_eq!(only.verify(&md(&other)), Err(Refusal::Claims));
        let mut m = MetadataMap::new();
        m.insert("authorization", format!("Basic {rails}").parse().unwrap());
        assert_eq!(any.verify(&m), Err(Refusal::Missing));
        // The audience is always checked.
        let wrong_audience = mint(&secret, "gitlab.example.com", "gitlab", 60).unwrap();
        assert_eq!(any.verify(&md(&wrong_audience)), Err(Refusal::Claims));
    }

    #[test]
    fn each_listener_takes_only_its_own_tokens() {
        let (ext, int) = ([7u8; 32], [9u8; 32]);
        let external = JwtAuth::external(&ext, "gitlab").unwrap();
        let internal = JwtAuth::internal(&int).unwrap();
        let gitlab = mint_external(&ext, "gitlab", 60).unwrap();
        let kas = mint_internal(&int, 30).unwrap();
        assert!(external.check(&md(&gitlab)).is_ok());
        assert!(internal.check(&md(&kas)).is_ok());
        for (auth, token) in [
            (&internal, gitlab.clone()),
            (&external, kas.clone()),
            (&external, mint_external(&ext, "not-gitlab", 60).unwrap()),
            (&external, mint_external(&[8u8; 32], "gitlab", 60).unwrap()),
            (&internal, mint(&int, INTERNAL, INTERNAL, 3600).unwrap()),
            (&internal, mint_internal(&ext, 30).unwrap()),
            (&external, expired(&ext, "gitlab", "gitlab-kas")),
            (&internal, expired(&int, INTERNAL, INTERNAL)),
        ] {
            let e = auth.check(&md(&token)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated);
            assert_eq!(e.message(), "unauthenticated");
        }
        assert!(external.check(&MetadataMap::new()).is_err());
        assert!(JwtAuth::external(&[1u8; 8], "gitlab").is_err());
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode([5u8; 32]);
        assert_eq!(
            decode_secret("external_secret", &format!("{b64}\n")).unwrap(),
            vec![5u8; 32]
        );
        assert!(decode_secret("external_secret", "c2hvcnQ=").is_err());
    }
}

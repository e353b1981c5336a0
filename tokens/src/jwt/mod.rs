//! JWT routable tokens: verification and minting.
//!
//! # Claims
//!
//! The routing claims use GitLab's routable-token letters, so GitLab's own `glcbt-`
//! JWT job tokens (which carry `c`, `o`, `u`, `p`, `g` as base-36 strings) route
//! unchanged. A routing claim may be a JSON integer (decimal) or a string (base 36,
//! GitLab's convention); podgate mints strings.
//!
//! | claim | meaning | required |
//! |---|---|---|
//! | `c` | Pod (cell) id, ≥ 1 | for a route (absent → unroutable) |
//! | `kind` | `runner`, `runner-registration`, `job`, `agent`, `personal-access`, `other` | no: else from the `gl…-` prefix, else `other` |
//! | `sub` | subject (runner, job or agent global id) | no (minted) |
//! | `exp` | expiry, Unix seconds | **yes** |
//! | `nbf` | not before, Unix seconds | no (checked when present; minted) |
//! | `iat` | issued at, Unix seconds | no (minted) |
//! | `jti` | token id, random | no (minted) |
//! | `o`, `g`, `p`, `u` | organization, group, project, user ids | no |
//! | `a` | agent id | no |
//! | `t` | runner type: 1 instance, 2 group, 3 project | no |
//! | `aud`, `iss` | audience, issuer | only when the classifier is configured with them |
//!
//! The header must carry `alg` (EdDSA, ES256, RS256 or HS256, and the same algorithm
//! as the key) and `kid` (unless the key set holds one key of that algorithm).
//! An optional prefix `gl…-` (with an optional instance prefix, `acme-glcbt-`) may
//! stand before the JWT; it is not signed and decides nothing but a default kind.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;
use serde_json::{Map, Value};
use thiserror::Error;

use crate::gitlab::{parse_base36, to_base36};
use crate::identity::{
    Classification, Identity, InvalidReason, PodId, RunnerType, TokenFormat, TokenKind,
    UnroutableReason,
};
use crate::keys::{Algorithm, KeySet, SigningKey};

/// Errors from [`mint`]. Caller or key mistakes; retrying fails the same way.
#[derive(Debug, Error)]
pub enum Error {
    /// jsonwebtoken refused to sign (a key that does not fit its algorithm).
    #[error("signing failed: {0}")]
    Sign(#[source] jsonwebtoken::errors::Error),
    /// The prefix is not of the form `gl…-` (optionally behind an instance prefix).
    #[error("prefix {0:?} must look like `glxx-` or `instance-glxx-`")]
    BadPrefix(String),
}

/// Result alias for this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a verifier accepts beyond a valid signature.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Clock skew tolerated on `exp` and `nbf`, in seconds.
    pub leeway_secs: u64,
    /// When set, `aud` must be (or contain) this value.
    pub audience: Option<String>,
    /// When set, `iss` must equal this value.
    pub issuer: Option<String>,
}

/// A JWT split into its parts (borrowed from the token).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Parts<'a> {
    /// The `gl…-` prefix, or empty.
    pub(crate) prefix: &'a str,
    /// `header.claims`: the signed bytes.
    pub(crate) signed: &'a str,
    pub(crate) header: &'a str,
    pub(crate) claims: &'a str,
    pub(crate) signature: &'a str,
}

/// Whether `prefix` (with its trailing dash) is a GitLab token prefix.
pub(crate) fn is_gitlab_prefix(prefix: &str) -> bool {
    let Some(body) = prefix.strip_suffix('-') else {
        return false;
    };
    let last = body.rsplit('-').next().unwrap_or("");
    last.len() > 2
        && last.starts_with("gl")
        && last.bytes().all(|c| c.is_ascii_lowercase())
        && body
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
}

/// Split `token` if it has a JWT's shape: optional `gl…-` prefix, then three
/// dot-separated parts, the header starting `eyJ` (base64 of `{"`).
pub(crate) fn split(token: &str) -> Option<Parts<'_>> {
    let start = if token.starts_with("eyJ") {
        0
    } else {
        let dash = token.find("-eyJ")?;
        if !is_gitlab_prefix(&token[..=dash]) {
            return None;
        }
        dash + 1
    };
    let (prefix, jwt) = token.split_at(start);
    let mut it = jwt.splitn(3, '.');
    let header = it.next()?;
    let claims = it.next()?;
    let signature = it.next()?;
    if signature.contains('.') || claims.is_empty() {
        return None;
    }
    Some(Parts {
        prefix,
        signed: &jwt[..header.len() + 1 + claims.len()],
        header,
        claims,
        signature,
    })
}

mod parse;

use parse::{RawClaims, RawHeader, Scalar, from_json};

fn b64_decode(part: &str, what: &'static str) -> std::result::Result<Vec<u8>, InvalidReason> {
    URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| InvalidReason::Malformed(what))
}

/// The header fields we act on.
pub(crate) struct Header {
    pub(crate) alg: String,
    pub(crate) kid: Option<String>,
}

pub(crate) fn header(parts: &Parts<'_>) -> std::result::Result<Header, InvalidReason> {
    const WHAT: &str = "JWT header is not base64url JSON";
    let bytes = b64_decode(parts.header, WHAT)?;
    let h: RawHeader<'_> = from_json(&bytes).ok_or(InvalidReason::Malformed(WHAT))?;
    let alg = match h.alg {
        Scalar::Str(s) => s.into_owned(),
        _ => return Err(InvalidReason::Malformed("JWT header without \"alg\"")),
    };
    let kid = match h.kid {
        Scalar::Absent | Scalar::Null => None,
        Scalar::Str(s) => Some(s.into_owned()),
        _ => return Err(InvalidReason::Malformed("JWT \"kid\" is not a string")),
    };
    Ok(Header { alg, kid })
}

/// The claims, decoded but **not verified**: for display (`podgate token inspect`)
/// only, never for routing.
pub(crate) fn unverified_claims(parts: &Parts<'_>) -> Option<Map<String, Value>> {
    let bytes = b64_decode(parts.claims, "claims").ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(m)) => Some(m),
        _ => None,
    }
}

/// Verify a JWT's signature and claims and classify it.
pub(crate) fn verify(
    parts: &Parts<'_>,
    keys: &KeySet,
    policy: &Policy,
    now: u64,
) -> Classification {
    match verify_inner(parts, keys, policy, now) {
        Ok(c) => c,
        Err(reason) => Classification::Invalid { reason },
    }
}

fn verify_inner(
    parts: &Parts<'_>,
    keys: &KeySet,
    policy: &Policy,
    now: u64,
) -> std::result::Result<Classification, InvalidReason> {
    let h = header(parts)?;
    if h.alg.eq_ignore_ascii_case("none") {
        return Err(InvalidReason::AlgorithmNone);
    }
    let alg = Algorithm::from_jose(&h.alg).ok_or(InvalidReason::AlgorithmNotAllowed)?;
    if keys.is_empty() {
        return Err(InvalidReason::NoKeys);
    }
    let key = match &h.kid {
        Some(kid) => keys.get(kid).ok_or(InvalidReason::UnknownKeyId)?,
        None => keys.only_key_for(alg).ok_or(InvalidReason::MissingKeyId)?,
    };
    if key.algorithm() != alg {
        return Err(InvalidReason::AlgorithmMismatch);
    }
    let sig = URL_SAFE_NO_PAD
        .decode(parts.signature)
        .map_err(|_| InvalidReason::BadSignature)?;
    if !key.verify(parts.signed.as_bytes(), &sig) {
        return Err(InvalidReason::BadSignature);
    }

    // Signed: now the claims may be trusted as far as they parse.
    const WHAT: &str = "JWT claims are not base64url JSON";
    let bytes = b64_decode(parts.claims, WHAT)?;
    let claims: RawClaims<'_> = from_json(&bytes).ok_or(InvalidReason::Malformed(WHAT))?;
    let exp = numeric_date(&claims.exp, "exp")?.ok_or(InvalidReason::MissingClaim("exp"))?;
    if now > exp.saturating_add(policy.leeway_secs) {
        return Err(InvalidReason::Expired);
    }
    if let Some(nbf) = numeric_date(&claims.nbf, "nbf")?
        && now.saturating_add(policy.leeway_secs) < nbf
    {
        return Err(InvalidReason::NotYetValid);
    }
    if let Some(want) = &policy.audience {
        let ok = match &claims.aud {
            Scalar::Str(s) => s == want,
            Scalar::Strings(a) => a.iter().any(|v| v == want),
            _ => false,
        };
        if !ok {
            return Err(InvalidReason::WrongAudience);
        }
    }
    if let Some(want) = &policy.issuer
        && !matches!(&claims.iss, Scalar::Str(s) if s == want)
    {
        return Err(InvalidReason::WrongIssuer);
    }
    let kind = match &claims.kind {
        Scalar::Absent | Scalar::Null => default_kind(parts.prefix),
        Scalar::Str(s) => s.parse().map_err(|_| InvalidReason::BadClaim("kind"))?,
        _ => return Err(InvalidReason::BadClaim("kind")),
    };
    let runner_type = match id_claim(&claims.t, "t")? {
        None => None,
        Some(code) => Some(RunnerType::from_code(code).ok_or(InvalidReason::BadClaim("t"))?),
    };
    let Some(cell) = id_claim(&claims.c, "c")? else {
        return Ok(Classification::Unroutable {
            reason: UnroutableReason::NoPodKey,
        });
    };
    let pod = PodId::new(cell).ok_or(InvalidReason::BadClaim("c"))?;
    Ok(Classification::Routable(Identity {
        pod,
        kind,
        format: TokenFormat::Jwt,
        organization: id_claim(&claims.o, "o")?,
        group: id_claim(&claims.g, "g")?,
        project: id_claim(&claims.p, "p")?,
        user: id_claim(&claims.u, "u")?,
        agent: id_claim(&claims.a, "a")?,
        runner_type,
        expires_at: Some(exp),
    }))
}

fn default_kind(prefix: &str) -> TokenKind {
    if prefix.is_empty() {
        TokenKind::Other
    } else {
        crate::gitlab::kind_of_prefix(prefix)
    }
}

/// A NumericDate claim as whole Unix seconds (fractions are floored).
fn numeric_date(
    v: &Scalar<'_>,
    name: &'static str,
) -> std::result::Result<Option<u64>, InvalidReason> {
    match v {
        Scalar::Absent | Scalar::Null => Ok(None),
        Scalar::Int(u) => Ok(Some(*u)),
        Scalar::Float(f) if f.is_finite() && *f >= 0.0 && *f < 1.0e15 => Ok(Some(*f as u64)),
        _ => Err(InvalidReason::BadClaim(name)),
    }
}

/// A routing id claim: a JSON integer, or a base-36 string (GitLab's convention).
fn id_claim(v: &Scalar<'_>, name: &'static str) -> std::result::Result<Option<u64>, InvalidReason> {
    match v {
        Scalar::Absent | Scalar::Null => Ok(None),
        Scalar::Int(u) => Ok(Some(*u)),
        Scalar::Str(s) => parse_base36(s.as_bytes())
            .map(Some)
            .ok_or(InvalidReason::BadClaim(name)),
        _ => Err(InvalidReason::BadClaim(name)),
    }
}

/// What to put in a new token.
#[derive(Clone, Debug)]
pub struct MintRequest {
    /// What the token is for.
    pub kind: TokenKind,
    /// The Pod it routes to.
    pub pod: PodId,
    /// The subject (e.g. `runner/12`); defaults to `<kind>`.
    pub subject: Option<String>,
    /// Lifetime in seconds from `now`.
    pub ttl_secs: u64,
    /// Seconds before `now` the token becomes valid (absorbs clock skew); usually 0.
    pub not_before_offset_secs: u64,
    /// Organization id (`o`).
    pub organization: Option<u64>,
    /// Group id (`g`).
    pub group: Option<u64>,
    /// Project id (`p`).
    pub project: Option<u64>,
    /// User id (`u`).
    pub user: Option<u64>,
    /// Agent id (`a`).
    pub agent: Option<u64>,
    /// Runner type (`t`).
    pub runner_type: Option<RunnerType>,
    /// Audience (`aud`).
    pub audience: Option<String>,
    /// Issuer (`iss`).
    pub issuer: Option<String>,
    /// Prefix put before the JWT (`glcbt-`…); `None` for a bare JWT.
    pub prefix: Option<String>,
}

impl MintRequest {
    /// A request with only the required parts set.
    pub fn new(kind: TokenKind, pod: PodId, ttl_secs: u64) -> Self {
        MintRequest {
            kind,
            pod,
            subject: None,
            ttl_secs,
            not_before_offset_secs: 0,
            organization: None,
            group: None,
            project: None,
            user: None,
            agent: None,
            runner_type: None,
            audience: None,
            issuer: None,
            prefix: None,
        }
    }
}

#[derive(Serialize)]
struct MintClaims<'a> {
    kind: &'static str,
    c: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    o: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    g: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    p: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    u: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    a: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    t: Option<String>,
    sub: String,
    iat: u64,
    nbf: u64,
    exp: u64,
    jti: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    aud: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    iss: Option<&'a str>,
}

/// Sign a new routable JWT with `key`, valid from `now`.
pub fn mint(req: &MintRequest, key: &SigningKey, now: u64) -> Result<String> {
    if let Some(p) = &req.prefix
        && !p.is_empty()
        && !is_gitlab_prefix(p)
    {
        return Err(Error::BadPrefix(p.clone()));
    }
    let b36 = |v: Option<u64>| v.map(|v| to_base36(v, 0));
    let claims = MintClaims {
        kind: req.kind.as_str(),
        c: to_base36(req.pod.get(), 0),
        o: b36(req.organization),
        g: b36(req.group),
        p: b36(req.project),
        u: b36(req.user),
        a: b36(req.agent),
        t: b36(req.runner_type.map(RunnerType::code)),
        sub: req
            .subject
            .clone()
            .unwrap_or_else(|| req.kind.as_str().to_owned()),
        iat: now,
        nbf: now.saturating_sub(req.not_before_offset_secs),
        exp: now.saturating_add(req.ttl_secs),
        jti: URL_SAFE_NO_PAD.encode(crate::gitlab::random_bytes()),
        aud: req.audience.as_deref(),
        iss: req.issuer.as_deref(),
    };
    let mut header = jsonwebtoken::Header::new(key.algorithm().to_jsonwebtoken());
    header.kid = Some(key.kid().to_owned());
    let jwt = jsonwebtoken::encode(&header, &claims, key.encoding_key()).map_err(Error::Sign)?;
    Ok(format!("{}{jwt}", req.prefix.as_deref().unwrap_or("")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_finds_prefix_and_parts() {
        let p = split("glcbt-eyJhbGciOiJIUzI1NiJ9.eyJjIjoiMiJ9.c2ln").unwrap();
        assert_eq!(p.prefix, "glcbt-");
        assert_eq!(p.signed, "eyJhbGciOiJIUzI1NiJ9.eyJjIjoiMiJ9");
        assert_eq!(p.signature, "c2ln");
        let p = split("acme-glcbt-eyJh.eyJj.x").unwrap();
        assert_eq!(p.prefix, "acme-glcbt-");
        assert!(split("eyJh.eyJj.x").is_some_and(|p| p.prefix.is_empty()));
        assert!(split("xx-eyJh.eyJj.x").is_none(), "not a gl prefix");
        assert!(split("eyJh.eyJj").is_none(), "two parts");
        assert!(split("eyJh.eyJj.x.y").is_none(), "four parts");
    }

    #[test]
    fn gitlab_prefixes() {
        for ok in ["glrt-", "glcbt-", "acme-glpat-", "my_co-glagent-"] {
            assert!(is_gitlab_prefix(ok), "{ok}");
        }
        for bad in ["gl-", "glrt", "GLRT-", "x-", "gl rt-", "-"] {
            assert!(!is_gitlab_prefix(bad), "{bad}");
        }
    }
}

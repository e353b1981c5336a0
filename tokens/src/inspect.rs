//! `podgate token inspect`: everything a token says about itself, as one JSON object.
//!
//! For operators, not for routing: JWT claims are shown even when the signature does
//! not verify (the `status` and `reason` say so). The random part of GitLab tokens is
//! never shown.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::classifier::{Classifier, split_gitlab_prefix, unix_now};
use crate::identity::{Classification, TokenFormat, TokenKind};
use crate::{fingerprint, gitlab, jwt};

/// The report on one token.
#[derive(Clone, Debug, Serialize)]
pub struct Inspection {
    /// `jwt`, `gitlab-v1`, `gitlab-v0` or `opaque`.
    pub format: TokenFormat,
    /// `routable`, `unroutable` or `invalid`.
    pub status: &'static str,
    /// The Pod id when routable.
    pub pod: Option<u64>,
    /// The token's kind when it can be told.
    pub kind: Option<TokenKind>,
    /// The decoded routing keys or claims, integers as numbers.
    pub fields: Map<String, Value>,
    /// Why the token is unroutable or invalid.
    pub reason: Option<String>,
    /// The stable code of that reason (as in metrics).
    pub reason_code: Option<&'static str>,
    /// The GitLab routable token version (0 or 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<u8>,
    /// The token's public prefix (`glrt-`, `acme-glcbt-`…), if any.
    pub prefix: Option<String>,
    /// The JWT header (`alg`, `kid`, `typ`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header: Option<Map<String, Value>>,
    /// The token's fingerprint, as logs show it.
    pub fingerprint: String,
}

impl Classifier {
    /// Inspect a token (uncached), at the current time.
    pub fn inspect(&self, token: &str) -> Inspection {
        self.inspect_at(token, unix_now())
    }

    /// Inspect a token as if the time were `now`.
    pub fn inspect_at(&self, token: &str, now: u64) -> Inspection {
        let verdict = self.classify_uncached_at(token, now);
        let mut out = Inspection {
            format: TokenFormat::Opaque,
            status: verdict.status(),
            pod: verdict.pod().map(|p| p.get()),
            kind: None,
            fields: Map::new(),
            reason: verdict.reason(),
            reason_code: match verdict {
                Classification::Routable(_) => None,
                Classification::Unroutable { reason } => Some(reason.code()),
                Classification::Invalid { reason } => Some(reason.code()),
            },
            version: None,
            prefix: None,
            header: None,
            fingerprint: fingerprint::fingerprint(token),
        };
        if let Classification::Invalid { reason } = verdict {
            use crate::InvalidReason::*;
            if matches!(reason, Empty | TooLong | BadCharacters) {
                return out;
            }
        }
        if let Some(shape) = gitlab::shape(token) {
            out.format = match shape {
                gitlab::Shape::V1 => TokenFormat::GitlabV1,
                gitlab::Shape::V0 => TokenFormat::GitlabV0,
            };
            if let Ok(d) = gitlab::decode_shaped(token, shape) {
                out.version = Some(d.version);
                out.kind = Some(d.kind());
                out.prefix = (!d.prefix.is_empty()).then(|| d.prefix.clone());
                for (k, v) in d.keys.entries() {
                    out.fields.insert(k.to_string(), Value::from(v));
                }
            }
        } else if let Some(parts) = jwt::split(token) {
            out.format = TokenFormat::Jwt;
            out.prefix = (!parts.prefix.is_empty()).then(|| parts.prefix.to_owned());
            out.header = jwt::header(&parts).ok().map(|h| {
                let mut m = Map::new();
                m.insert("alg".into(), Value::from(h.alg));
                if let Some(kid) = h.kid {
                    m.insert("kid".into(), Value::from(kid));
                }
                m
            });
            if let Some(claims) = jwt::unverified_claims(&parts) {
                for (k, v) in claims {
                    let v = if ["c", "o", "g", "p", "u", "a", "t"].contains(&k.as_str()) {
                        numeric_id(&v).map_or(v, Value::from)
                    } else {
                        v
                    };
                    out.fields.insert(k, v);
                }
            }
            out.kind = match verdict {
                Classification::Routable(id) => Some(id.kind),
                _ => out
                    .fields
                    .get("kind")
                    .and_then(Value::as_str)
                    .and_then(|s| s.parse().ok())
                    .or_else(|| out.prefix.as_deref().map(gitlab::kind_of_prefix)),
            };
        } else {
            out.prefix = split_gitlab_prefix(token).map(|(p, _)| p.to_owned());
            out.kind = if token.starts_with("GR1348941") {
                Some(TokenKind::RunnerRegistration)
            } else {
                out.prefix.as_deref().map(gitlab::kind_of_prefix)
            };
        }
        if let Classification::Routable(id) = verdict {
            out.kind = Some(id.kind);
        }
        out
    }
}

/// A routing id shown as a number: integers as they are, base-36 strings decoded.
fn numeric_id(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => gitlab::parse_base36(s.as_bytes()),
        _ => None,
    }
}

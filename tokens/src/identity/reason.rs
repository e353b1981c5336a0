//! Why a token carries no route ([`UnroutableReason`]) or is refused
//! ([`InvalidReason`]), each with a stable code for metrics and logs.

use std::fmt;

/// Why a well-formed token carries no route. Such tokens go to the default (legacy) Pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnroutableReason {
    /// No prefix, no structure: a random string, as tokens were before routable ones.
    Opaque,
    /// A `gl…-` prefixed token whose body is random (e.g. a legacy `glrt-<random>`).
    LegacyPrefixed,
    /// A runner token with a runner-type partition prefix (`glrt-t1_…`).
    RunnerTypePartition,
    /// A job token with a partition prefix (`glcbt-<hex>_…`).
    JobPartition,
    /// A legacy runner registration token (`GR1348941…`).
    LegacyRegistration,
    /// A routable token (v1 or JWT, verified) whose payload names no Pod (`c`).
    NoPodKey,
}

impl UnroutableReason {
    /// A short, stable code for metric labels and logs.
    pub const fn code(self) -> &'static str {
        match self {
            UnroutableReason::Opaque => "opaque",
            UnroutableReason::LegacyPrefixed => "legacy_prefixed",
            UnroutableReason::RunnerTypePartition => "runner_type_partition",
            UnroutableReason::JobPartition => "job_partition",
            UnroutableReason::LegacyRegistration => "legacy_registration",
            UnroutableReason::NoPodKey => "no_pod_key",
        }
    }
}

impl fmt::Display for UnroutableReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UnroutableReason::Opaque => "opaque token without routing information",
            UnroutableReason::LegacyPrefixed => "legacy prefixed token without a routing payload",
            UnroutableReason::RunnerTypePartition => {
                "legacy runner token with a runner-type prefix; it names no Pod"
            }
            UnroutableReason::JobPartition => {
                "legacy job token with a partition prefix; it names no Pod"
            }
            UnroutableReason::LegacyRegistration => {
                "legacy runner registration token; it names no Pod"
            }
            UnroutableReason::NoPodKey => "routable token without a Pod (cell) id",
        })
    }
}

/// Why a token was rejected. Every variant is a distinct reason with a stable
/// [`code`](InvalidReason::code); none of them reveals the token's secret part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InvalidReason {
    /// The token is empty.
    Empty,
    /// The token is longer than the configured limit.
    TooLong,
    /// The token holds whitespace, control or non-ASCII characters.
    BadCharacters,
    /// The token has a structure we recognise only in part.
    Malformed(&'static str),
    /// A GitLab routable token whose CRC does not match: corrupted or forged.
    BadCrc,
    /// A GitLab routable token whose CRC matches but whose payload is unusable.
    BadPayload(&'static str),
    /// A GitLab routable token with a version this build does not know.
    UnknownVersion,
    /// A JWT with `alg: none` (unsigned).
    AlgorithmNone,
    /// A JWT whose `alg` is not one we verify (EdDSA, ES256, RS256, HS256).
    AlgorithmNotAllowed,
    /// A JWT whose `alg` differs from the algorithm of the key its `kid` names
    /// (algorithm confusion, e.g. HS256 against an RSA public key).
    AlgorithmMismatch,
    /// A JWT whose `kid` is in no configured key set.
    UnknownKeyId,
    /// A JWT without `kid` where the key set cannot pick a key unambiguously.
    MissingKeyId,
    /// A JWT arrived but no verification keys are configured.
    NoKeys,
    /// The JWT signature does not verify.
    BadSignature,
    /// The JWT's `exp` (plus leeway) has passed.
    Expired,
    /// The JWT's `nbf` (minus leeway) lies in the future.
    NotYetValid,
    /// A required JWT claim is missing.
    MissingClaim(&'static str),
    /// A JWT claim has the wrong type or an impossible value.
    BadClaim(&'static str),
    /// The JWT's `aud` does not include the configured audience.
    WrongAudience,
    /// The JWT's `iss` is not the configured issuer.
    WrongIssuer,
    /// The token is of a kind this endpoint does not accept.
    WrongKind,
}

impl InvalidReason {
    /// A short, stable code for metric labels and logs.
    pub const fn code(self) -> &'static str {
        match self {
            InvalidReason::Empty => "empty",
            InvalidReason::TooLong => "too_long",
            InvalidReason::BadCharacters => "bad_characters",
            InvalidReason::Malformed(_) => "malformed",
            InvalidReason::BadCrc => "bad_crc",
            InvalidReason::BadPayload(_) => "bad_payload",
            InvalidReason::UnknownVersion => "unknown_version",
            InvalidReason::AlgorithmNone => "alg_none",
            InvalidReason::AlgorithmNotAllowed => "alg_not_allowed",
            InvalidReason::AlgorithmMismatch => "alg_mismatch",
            InvalidReason::UnknownKeyId => "unknown_kid",
            InvalidReason::MissingKeyId => "missing_kid",
            InvalidReason::NoKeys => "no_keys",
            InvalidReason::BadSignature => "bad_signature",
            InvalidReason::Expired => "expired",
            InvalidReason::NotYetValid => "not_yet_valid",
            InvalidReason::MissingClaim(_) => "missing_claim",
            InvalidReason::BadClaim(_) => "bad_claim",
            InvalidReason::WrongAudience => "wrong_audience",
            InvalidReason::WrongIssuer => "wrong_issuer",
            InvalidReason::WrongKind => "wrong_kind",
        }
    }

    /// Whether the verdict can change with time alone (so must not be cached).
    pub(crate) const fn is_time_dependent(self) -> bool {
        matches!(self, InvalidReason::NotYetValid)
    }
}

impl fmt::Display for InvalidReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidReason::Empty => f.write_str("empty token"),
            InvalidReason::TooLong => f.write_str("token too long"),
            InvalidReason::BadCharacters => {
                f.write_str("token contains whitespace, control or non-ASCII characters")
            }
            InvalidReason::Malformed(what) => write!(f, "malformed token: {what}"),
            InvalidReason::BadCrc => f.write_str("routable token checksum (CRC) mismatch"),
            InvalidReason::BadPayload(what) => write!(f, "routable token payload: {what}"),
            InvalidReason::UnknownVersion => f.write_str("unknown routable token version"),
            InvalidReason::AlgorithmNone => f.write_str("unsigned JWT (alg: none) rejected"),
            InvalidReason::AlgorithmNotAllowed => f.write_str("JWT algorithm not allowed"),
            InvalidReason::AlgorithmMismatch => {
                f.write_str("JWT algorithm does not match the key's algorithm")
            }
            InvalidReason::UnknownKeyId => f.write_str("JWT signed with an unknown key id"),
            InvalidReason::MissingKeyId => f.write_str("JWT without a key id (kid)"),
            InvalidReason::NoKeys => f.write_str("no JWT verification keys configured"),
            InvalidReason::BadSignature => f.write_str("JWT signature does not verify"),
            InvalidReason::Expired => f.write_str("JWT expired"),
            InvalidReason::NotYetValid => f.write_str("JWT not yet valid"),
            InvalidReason::MissingClaim(c) => write!(f, "JWT claim {c:?} missing"),
            InvalidReason::BadClaim(c) => write!(f, "JWT claim {c:?} invalid"),
            InvalidReason::WrongAudience => f.write_str("JWT audience not accepted"),
            InvalidReason::WrongIssuer => f.write_str("JWT issuer not accepted"),
            InvalidReason::WrongKind => f.write_str("token of the wrong kind for this endpoint"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_reason_codes_are_distinct() {
        let all = [
            InvalidReason::Empty,
            InvalidReason::TooLong,
            InvalidReason::BadCharacters,
            InvalidReason::Malformed(""),
            InvalidReason::BadCrc,
            InvalidReason::BadPayload(""),
            InvalidReason::UnknownVersion,
            InvalidReason::AlgorithmNone,
            InvalidReason::AlgorithmNotAllowed,
            InvalidReason::AlgorithmMismatch,
            InvalidReason::UnknownKeyId,
            InvalidReason::MissingKeyId,
            InvalidReason::NoKeys,
            InvalidReason::BadSignature,
            InvalidReason::Expired,
            InvalidReason::NotYetValid,
            InvalidReason::MissingClaim(""),
            InvalidReason::BadClaim(""),
            InvalidReason::WrongAudience,
            InvalidReason::WrongIssuer,
            InvalidReason::WrongKind,
        ];
        let codes: std::collections::HashSet<_> = all.iter().map(|r| r.code()).collect();
        assert_eq!(codes.len(), all.len());
    }
}

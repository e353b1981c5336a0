//! The domain types every other crate routes on: Pod ids, token kinds and formats, the
//! identity a routable token carries, and the three-way [`Classification`].

use std::fmt;
use std::num::NonZeroU64;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A Pod's id: a positive integer, as GitLab cell ids are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct PodId(NonZeroU64);

impl PodId {
    /// The Pod id `n`, or `None` for 0 (GitLab cell ids start at 1).
    pub const fn new(n: u64) -> Option<Self> {
        match NonZeroU64::new(n) {
            Some(n) => Some(Self(n)),
            None => None,
        }
    }

    /// The id as an integer.
    pub const fn get(self) -> u64 {
        self.0.get()
    }
}

impl TryFrom<u64> for PodId {
    type Error = &'static str;

    fn try_from(n: u64) -> Result<Self, Self::Error> {
        Self::new(n).ok_or("a Pod id must be a positive integer")
    }
}

impl From<PodId> for u64 {
    fn from(p: PodId) -> u64 {
        p.get()
    }
}

impl fmt::Display for PodId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for PodId {
    type Err = &'static str;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let n: u64 = s
            .parse()
            .map_err(|_| "a Pod id must be a positive integer")?;
        Self::try_from(n)
    }
}

/// What a token is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TokenKind {
    /// A registered runner's authentication token (`glrt-`, `glrtr-`); sent to
    /// `jobs/request`, `runners/verify` and friends.
    Runner,
    /// A runner registration token (legacy `GR1348941…`), sent to `POST /runners`.
    RunnerRegistration,
    /// A CI job (build) token (`glcbt-`), sent by a runner while it runs that job.
    Job,
    /// A Kubernetes agent (agentk) token (`glagent-`).
    Agent,
    /// A personal, project or group access token (`glpat-`).
    PersonalAccess,
    /// Any other kind of GitLab token.
    Other,
}

impl TokenKind {
    /// Every kind, in a stable order.
    pub const ALL: [TokenKind; 6] = [
        TokenKind::Runner,
        TokenKind::RunnerRegistration,
        TokenKind::Job,
        TokenKind::Agent,
        TokenKind::PersonalAccess,
        TokenKind::Other,
    ];

    /// The name used in JWT claims, JSON output and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            TokenKind::Runner => "runner",
            TokenKind::RunnerRegistration => "runner-registration",
            TokenKind::Job => "job",
            TokenKind::Agent => "agent",
            TokenKind::PersonalAccess => "personal-access",
            TokenKind::Other => "other",
        }
    }

    /// The kind GitLab's token prefix (`glrt`, `glcbt`, … without the dash) stands for.
    pub fn from_gitlab_prefix(prefix: &str) -> TokenKind {
        match prefix {
            "glrt" | "glrtr" => TokenKind::Runner,
            "glcbt" => TokenKind::Job,
            "glagent" => TokenKind::Agent,
            "glpat" => TokenKind::PersonalAccess,
            _ => TokenKind::Other,
        }
    }

    /// The GitLab prefix (with its dash) that tokens of this kind are minted with.
    pub const fn gitlab_prefix(self) -> &'static str {
        match self {
            TokenKind::Runner => "glrt-",
            TokenKind::RunnerRegistration => "glrtr-",
            TokenKind::Job => "glcbt-",
            TokenKind::Agent => "glagent-",
            TokenKind::PersonalAccess => "glpat-",
            TokenKind::Other => "gl-",
        }
    }
}

impl fmt::Display for TokenKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TokenKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TokenKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<_> = TokenKind::ALL.iter().map(|k| k.as_str()).collect();
                format!(
                    "unknown token kind {s:?} (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

/// How a token is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TokenFormat {
    /// A signed JWT whose claims name the Pod, optionally behind a `gl…-` prefix.
    #[serde(rename = "jwt")]
    Jwt,
    /// GitLab's routable token, format v1 (`….01.<len><crc>`).
    #[serde(rename = "gitlab-v1")]
    GitlabV1,
    /// GitLab's earlier routable token layout, without the version part.
    #[serde(rename = "gitlab-v0")]
    GitlabV0,
    /// Anything else: a legacy or opaque token with no routing information.
    #[serde(rename = "opaque")]
    Opaque,
}

impl TokenFormat {
    /// The name used in JSON output and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            TokenFormat::Jwt => "jwt",
            TokenFormat::GitlabV1 => "gitlab-v1",
            TokenFormat::GitlabV0 => "gitlab-v0",
            TokenFormat::Opaque => "opaque",
        }
    }
}

impl fmt::Display for TokenFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A runner's scope, GitLab's `t` routing key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunnerType {
    /// `t:1`, an instance-wide runner.
    Instance,
    /// `t:2`, a group runner.
    Group,
    /// `t:3`, a project runner.
    Project,
}

impl RunnerType {
    /// The runner type for GitLab's numeric code (1, 2 or 3).
    pub const fn from_code(code: u64) -> Option<Self> {
        match code {
            1 => Some(RunnerType::Instance),
            2 => Some(RunnerType::Group),
            3 => Some(RunnerType::Project),
            _ => None,
        }
    }

    /// GitLab's numeric code for this runner type.
    pub const fn code(self) -> u64 {
        match self {
            RunnerType::Instance => 1,
            RunnerType::Group => 2,
            RunnerType::Project => 3,
        }
    }
}

/// What a routable token says about where it belongs. Everything here was either
/// covered by a verified signature (JWT) or by GitLab's CRC (v1), never guessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    /// The Pod the token belongs to.
    pub pod: PodId,
    /// What the token is for.
    pub kind: TokenKind,
    /// How it was encoded.
    pub format: TokenFormat,
    /// GitLab organization id (`o`).
    pub organization: Option<u64>,
    /// Top-level group id (`g`).
    pub group: Option<u64>,
    /// Project id (`p`).
    pub project: Option<u64>,
    /// User id (`u`).
    pub user: Option<u64>,
    /// Agent id (`a`, agent tokens only).
    pub agent: Option<u64>,
    /// Runner type (`t`, runner tokens only).
    pub runner_type: Option<RunnerType>,
    /// Expiry as Unix seconds (JWTs); v1 tokens carry none.
    pub expires_at: Option<u64>,
}

impl Identity {
    /// An identity with only the required parts; the optional ids start empty.
    pub const fn new(pod: PodId, kind: TokenKind, format: TokenFormat) -> Self {
        Identity {
            pod,
            kind,
            format,
            organization: None,
            group: None,
            project: None,
            user: None,
            agent: None,
            runner_type: None,
            expires_at: None,
        }
    }
}

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

/// The verdict on one token: where it goes, or why it goes nowhere in particular.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Classification {
    /// The token names its Pod, and we checked that it says so honestly.
    Routable(Identity),
    /// A well-formed token with no route: send it to the default (legacy) Pod.
    Unroutable {
        /// Why it carries no route.
        reason: UnroutableReason,
    },
    /// A token that must not be forwarded (or only to the legacy Pod during migrations).
    Invalid {
        /// Why it was rejected.
        reason: InvalidReason,
    },
}

impl Classification {
    /// The Pod the token is routable to, if it is.
    pub fn pod(&self) -> Option<PodId> {
        match self {
            Classification::Routable(id) => Some(id.pod),
            _ => None,
        }
    }

    /// `"routable"`, `"unroutable"` or `"invalid"`: for JSON output and metric labels.
    pub const fn status(&self) -> &'static str {
        match self {
            Classification::Routable(_) => "routable",
            Classification::Unroutable { .. } => "unroutable",
            Classification::Invalid { .. } => "invalid",
        }
    }

    /// The human-readable reason for an unroutable or invalid verdict.
    pub fn reason(&self) -> Option<String> {
        match self {
            Classification::Routable(_) => None,
            Classification::Unroutable { reason } => Some(reason.to_string()),
            Classification::Invalid { reason } => Some(reason.to_string()),
        }
    }

    /// Narrow a verdict to an endpoint that accepts only `allowed` kinds: a routable
    /// token of another kind becomes [`InvalidReason::WrongKind`]. Unroutable tokens
    /// pass unchanged, since their kind cannot be known for sure.
    pub fn require_kind(self, allowed: &[TokenKind]) -> Classification {
        match self {
            Classification::Routable(id) if !allowed.contains(&id.kind) => {
                Classification::Invalid {
                    reason: InvalidReason::WrongKind,
                }
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_id_rejects_zero() {
        assert!(PodId::new(0).is_none());
        assert_eq!(PodId::new(7).map(PodId::get), Some(7));
        assert!("0".parse::<PodId>().is_err());
        assert!("-1".parse::<PodId>().is_err());
        assert_eq!("12".parse::<PodId>().map(PodId::get), Ok(12));
    }

    #[test]
    fn kind_names_round_trip() {
        for k in TokenKind::ALL {
            assert_eq!(k.as_str().parse::<TokenKind>(), Ok(k));
        }
        assert!("runners".parse::<TokenKind>().is_err());
    }

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

    #[test]
    fn require_kind_rejects_other_kinds_only() {
        let id = Identity::new(PodId::new(2).unwrap(), TokenKind::Job, TokenFormat::Jwt);
        let c = Classification::Routable(id);
        assert_eq!(c.require_kind(&[TokenKind::Job]), c);
        assert_eq!(
            c.require_kind(&[TokenKind::Runner]),
            Classification::Invalid {
                reason: InvalidReason::WrongKind
            }
        );
        let u = Classification::Unroutable {
            reason: UnroutableReason::Opaque,
        };
        assert_eq!(u.require_kind(&[TokenKind::Runner]), u);
    }
}

//! The domain types every other crate routes on: Pod ids, token kinds and formats, the
//! identity a routable token carries, and the three-way [`Classification`].
//!
//! Layout: this file holds [`PodId`], [`Identity`] and [`Classification`]; `kind`
//! the token kinds, formats and runner types; `reason` the unroutable and invalid
//! reasons.

use std::fmt;
use std::num::NonZeroU64;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

mod kind;
mod reason;

pub use kind::{RunnerType, TokenFormat, TokenKind};
pub use reason::{InvalidReason, UnroutableReason};

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

//! What a token is for ([`TokenKind`]), how it is encoded ([`TokenFormat`]), and a
//! runner's scope ([`RunnerType`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_round_trip() {
        for k in TokenKind::ALL {
            assert_eq!(k.as_str().parse::<TokenKind>(), Ok(k));
        }
        assert!("runners".parse::<TokenKind>().is_err());
    }
}

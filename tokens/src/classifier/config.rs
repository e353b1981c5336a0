//! [`ClassifierConfig`]: how the classifier verifies and caches, checked by
//! [`ClassifierConfig::validate`], and this module's [`Error`].

use thiserror::Error;

use crate::jwt;

/// Configuration errors; fix the configuration, do not retry.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    /// One or more fields are out of range; every problem is listed.
    #[error("invalid classifier configuration: {}", .0.join("; "))]
    Invalid(Vec<String>),
}

/// Result alias for this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How the classifier verifies and caches.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClassifierConfig {
    /// Clock skew tolerated on JWT `exp`/`nbf`, in seconds.
    pub leeway_secs: u64,
    /// When set, JWTs must carry this audience (`aud`).
    pub audience: Option<String>,
    /// When set, JWTs must carry this issuer (`iss`).
    pub issuer: Option<String>,
    /// Most verdicts kept in the cache (0 disables it).
    pub cache_capacity: usize,
    /// Longest a positive verdict is cached, in seconds (it never outlives the token).
    pub cache_ttl_secs: u64,
    /// How long a rejected JWT's verdict is cached, in seconds, so that a client
    /// retrying a bad token does not cost a signature check each time.
    pub negative_ttl_secs: u64,
    /// Longest token accepted, in bytes.
    pub max_token_bytes: usize,
}

impl Default for ClassifierConfig {
    fn default() -> Self {
        ClassifierConfig {
            leeway_secs: 60,
            audience: None,
            issuer: None,
            cache_capacity: 100_000,
            cache_ttl_secs: 300,
            negative_ttl_secs: 60,
            max_token_bytes: 8192,
        }
    }
}

impl ClassifierConfig {
    /// Check every field; the error lists all bad ones by name.
    pub fn validate(&self) -> Result<()> {
        let mut bad = Vec::new();
        if self.leeway_secs > 3600 {
            bad.push(format!(
                "leeway_secs = {}: at most 3600 (an hour of clock skew means a broken clock)",
                self.leeway_secs
            ));
        }
        if self.max_token_bytes < 64 || self.max_token_bytes > 1 << 20 {
            bad.push(format!(
                "max_token_bytes = {}: must lie in 64..=1048576",
                self.max_token_bytes
            ));
        }
        if self.cache_capacity > 0 && self.cache_ttl_secs == 0 {
            bad.push("cache_ttl_secs = 0: must be positive while the cache is on".into());
        }
        if self.audience.as_deref() == Some("") {
            bad.push("audience = \"\": leave it out rather than empty".into());
        }
        if self.issuer.as_deref() == Some("") {
            bad.push("issuer = \"\": leave it out rather than empty".into());
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid(bad))
        }
    }

    pub(super) fn policy(&self) -> jwt::Policy {
        jwt::Policy {
            leeway_secs: self.leeway_secs,
            audience: self.audience.clone(),
            issuer: self.issuer.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation_names_every_bad_field() {
        let cfg = ClassifierConfig {
            leeway_secs: 99_999,
            max_token_bytes: 1,
            cache_ttl_secs: 0,
            audience: Some(String::new()),
            ..ClassifierConfig::default()
        };
        let Err(Error::Invalid(msgs)) = cfg.validate() else {
            panic!("expected invalid")
        };
        let all = msgs.join("\n");
        for field in [
            "leeway_secs",
            "max_token_bytes",
            "cache_ttl_secs",
            "audience",
        ] {
            assert!(all.contains(field), "{field} not named in {all}");
        }
        assert!(ClassifierConfig::default().validate().is_ok());
    }
}

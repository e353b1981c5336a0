//! The [`Classifier`]: any string in, a [`Classification`] out.
//!
//! It picks the format by shape (cheap byte checks, no allocation), then decodes
//! and verifies. Verified JWT verdicts are kept in a bounded cache keyed by a keyed
//! 128-bit SipHash of the whole token, so a runner polling every few seconds with the
//! same token costs one hash and one lookup. Entries expire with the token, and a
//! key-set change invalidates them all.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use siphasher::sip128::{Hasher128, SipHasher13};
use std::hash::Hasher as _;
use thiserror::Error;

use crate::identity::{
    Classification, Identity, InvalidReason, PodId, TokenFormat, UnroutableReason,
};
use crate::keys::KeySet;
use crate::{gitlab, jwt};

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

    fn policy(&self) -> jwt::Policy {
        jwt::Policy {
            leeway_secs: self.leeway_secs,
            audience: self.audience.clone(),
            issuer: self.issuer.clone(),
        }
    }
}

#[derive(Clone, Copy)]
struct Entry {
    verdict: Classification,
    /// Unix seconds after which the entry must not be used.
    valid_until: u64,
    /// The key-set generation it was verified under.
    generation: u64,
}

/// Counters of the verdict cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that had to verify.
    pub misses: u64,
    /// Entries held now.
    pub len: usize,
}

/// Classifies tokens. Cheap to share: wrap it in an `Arc`; every method takes `&self`.
pub struct Classifier {
    config: ClassifierConfig,
    policy: jwt::Policy,
    keys: ArcSwap<KeySet>,
    generation: AtomicU64,
    cache: Option<quick_cache::sync::Cache<u128, Entry>>,
    sip_keys: (u64, u64),
    hits: AtomicU64,
    misses: AtomicU64,
}

impl std::fmt::Debug for Classifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Classifier")
            .field("config", &self.config)
            .field("kids", &self.keys.load().kids().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Now, as Unix seconds.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Classifier {
    /// A classifier verifying JWTs with `keys`.
    pub fn new(config: ClassifierConfig, keys: KeySet) -> Result<Self> {
        config.validate()?;
        let cache = (config.cache_capacity > 0)
            .then(|| quick_cache::sync::Cache::new(config.cache_capacity));
        let sip_keys = {
            use rand::RngCore as _;
            let mut r = rand::rngs::OsRng;
            (r.next_u64(), r.next_u64())
        };
        Ok(Classifier {
            policy: config.policy(),
            config,
            keys: ArcSwap::from_pointee(keys),
            generation: AtomicU64::new(0),
            cache,
            sip_keys,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// A classifier with default settings.
    pub fn with_keys(keys: KeySet) -> Self {
        Self::new(ClassifierConfig::default(), keys).expect("the default configuration is valid")
    }

    /// The configuration in force.
    pub fn config(&self) -> &ClassifierConfig {
        &self.config
    }

    /// The key set in force.
    pub fn keys(&self) -> Arc<KeySet> {
        self.keys.load_full()
    }

    /// Replace the key set (rotation, reload). Takes effect for the next token;
    /// verdicts cached under the old set are no longer used.
    pub fn set_keys(&self, keys: KeySet) {
        self.keys.store(Arc::new(keys));
        self.generation.fetch_add(1, Ordering::AcqRel);
        if let Some(c) = &self.cache {
            c.clear();
        }
    }

    /// Cache counters.
    pub fn cache_stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            len: self.cache.as_ref().map_or(0, |c| c.len()),
        }
    }

    /// Classify a token given as bytes (e.g. straight from a header).
    pub fn classify_bytes(&self, token: &[u8]) -> Classification {
        match std::str::from_utf8(token) {
            Ok(s) => self.classify(s),
            Err(_) => invalid(InvalidReason::BadCharacters),
        }
    }

    /// Classify a token.
    pub fn classify(&self, token: &str) -> Classification {
        self.classify_at(token, unix_now())
    }

    /// Classify a token as if the time were `now` (Unix seconds).
    pub fn classify_at(&self, token: &str, now: u64) -> Classification {
        if let Err(reason) = self.precheck(token) {
            return invalid(reason);
        }
        if looks_like_jwt(token) {
            if let Some(cache) = &self.cache {
                // Hot path: a repeat costs one hash and one lookup, nothing else.
                let key = self.hash(token);
                let generation = self.generation.load(Ordering::Acquire);
                if let Some(e) = cache.get(&key)
                    && e.generation == generation
                    && now <= e.valid_until
                {
                    self.hits.fetch_add(1, Ordering::Relaxed);
                    return e.verdict;
                }
                if let Some(parts) = jwt::split(token) {
                    self.misses.fetch_add(1, Ordering::Relaxed);
                    return self.verify_and_cache(cache, key, generation, &parts, now);
                }
            } else if let Some(parts) = jwt::split(token) {
                return jwt::verify(&parts, &self.keys.load(), &self.policy, now);
            }
        }
        self.classify_structural(token)
    }

    /// Classify without consulting or filling the cache (benchmarks, `inspect`).
    pub fn classify_uncached_at(&self, token: &str, now: u64) -> Classification {
        if let Err(reason) = self.precheck(token) {
            return invalid(reason);
        }
        if looks_like_jwt(token)
            && let Some(parts) = jwt::split(token)
        {
            return jwt::verify(&parts, &self.keys.load(), &self.policy, now);
        }
        self.classify_structural(token)
    }

    fn precheck(&self, token: &str) -> std::result::Result<(), InvalidReason> {
        if token.is_empty() {
            return Err(InvalidReason::Empty);
        }
        if token.len() > self.config.max_token_bytes {
            return Err(InvalidReason::TooLong);
        }
        // Visible ASCII only: no whitespace, controls or multi-byte characters.
        // A non-short-circuiting fold, so the compiler vectorises it.
        let visible = token
            .bytes()
            .fold(true, |ok, c| ok & (c.wrapping_sub(0x21) < 0x5e));
        if !visible {
            return Err(InvalidReason::BadCharacters);
        }
        Ok(())
    }

    /// Everything that is not a JWT: GitLab routable tokens and opaque ones.
    fn classify_structural(&self, token: &str) -> Classification {
        if let Some(shape) = gitlab::shape(token) {
            return match gitlab::decode_shaped(token, shape) {
                Ok(d) => classify_gitlab(&d),
                Err(reason) => invalid(reason),
            };
        }
        if token.contains('.') {
            return invalid(InvalidReason::Malformed(
                "a dotted token that is neither a JWT nor a GitLab routable token",
            ));
        }
        Classification::Unroutable {
            reason: opaque_reason(token),
        }
    }

    fn verify_and_cache(
        &self,
        cache: &quick_cache::sync::Cache<u128, Entry>,
        key: u128,
        generation: u64,
        parts: &jwt::Parts<'_>,
        now: u64,
    ) -> Classification {
        let verdict = jwt::verify(parts, &self.keys.load(), &self.policy, now);
        let valid_until = match verdict {
            Classification::Routable(Identity {
                expires_at: Some(exp),
                ..
            }) => Some(
                exp.saturating_add(self.config.leeway_secs)
                    .min(now.saturating_add(self.config.cache_ttl_secs)),
            ),
            Classification::Routable(_) | Classification::Unroutable { .. } => {
                Some(now.saturating_add(self.config.cache_ttl_secs))
            }
            Classification::Invalid { reason } if !reason.is_time_dependent() => {
                Some(now.saturating_add(self.config.negative_ttl_secs))
            }
            Classification::Invalid { .. } => None,
        };
        if let Some(valid_until) = valid_until {
            cache.insert(
                key,
                Entry {
                    verdict,
                    valid_until,
                    generation,
                },
            );
        }
        verdict
    }

    fn hash(&self, token: &str) -> u128 {
        let mut h = SipHasher13::new_with_keys(self.sip_keys.0, self.sip_keys.1);
        h.write(token.as_bytes());
        h.finish128().as_u128()
    }
}

/// Whether `token` may be a JWT: a bare one (`eyJ…`) or one behind a short `gl…-`
/// prefix, and not a GitLab routable token (whose random part may start `eyJ` too).
fn looks_like_jwt(token: &str) -> bool {
    let b = token.as_bytes();
    let head = &b[..b.len().min(52)];
    (b.starts_with(b"eyJ") || head.windows(4).any(|w| w == b"-eyJ"))
        && gitlab::shape(token).is_none()
}

fn invalid(reason: InvalidReason) -> Classification {
    Classification::Invalid { reason }
}

fn classify_gitlab(d: &gitlab::Decoded) -> Classification {
    let Some(cell) = d.keys.cell else {
        return Classification::Unroutable {
            reason: UnroutableReason::NoPodKey,
        };
    };
    let Some(pod) = PodId::new(cell) else {
        return invalid(InvalidReason::BadPayload("cell id 0"));
    };
    Classification::Routable(Identity {
        pod,
        kind: d.kind(),
        format: if d.version == 0 {
            TokenFormat::GitlabV0
        } else {
            TokenFormat::GitlabV1
        },
        organization: d.keys.organization,
        group: d.keys.group,
        project: d.keys.project,
        user: d.keys.user,
        agent: None,
        runner_type: d.keys.runner_type(),
        expires_at: None,
    })
}

/// Split a `gl…-` prefix (with optional instance prefix) from the body of an
/// undotted token.
pub(crate) fn split_gitlab_prefix(token: &str) -> Option<(&str, &str)> {
    // GitLab prefixes are short; look for the dash that ends one in the first 48 bytes.
    // Byte search: '-' is ASCII, so every index found is a char boundary.
    let head = &token.as_bytes()[..token.len().min(48)];
    head.iter()
        .enumerate()
        .filter(|&(_, &c)| c == b'-')
        .map(|(i, _)| i)
        .find(|&i| jwt::is_gitlab_prefix(&token[..=i]))
        .map(|i| token.split_at(i + 1))
}

fn opaque_reason(token: &str) -> UnroutableReason {
    if token.starts_with("GR1348941") {
        return UnroutableReason::LegacyRegistration;
    }
    let Some((prefix, body)) = split_gitlab_prefix(token) else {
        return UnroutableReason::Opaque;
    };
    let b = body.as_bytes();
    if b.len() > 3 && b[0] == b't' && matches!(b[1], b'1'..=b'3') && b[2] == b'_' {
        return UnroutableReason::RunnerTypePartition;
    }
    if gitlab::kind_of_prefix(prefix) == crate::TokenKind::Job
        && let Some(us) = body.find('_')
        && us > 0
        && body[..us].bytes().all(|c| c.is_ascii_hexdigit())
    {
        return UnroutableReason::JobPartition;
    }
    UnroutableReason::LegacyPrefixed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c() -> Classifier {
        Classifier::with_keys(KeySet::new())
    }

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

    #[test]
    fn opaque_shapes_have_reasons() {
        let cases = [
            (
                "glrt-t1_abcdefghijklmnopqrst",
                UnroutableReason::RunnerTypePartition,
            ),
            (
                "glrt-t3_abcdefghijklmnopqrst",
                UnroutableReason::RunnerTypePartition,
            ),
            (
                "glcbt-64_abcdefghijklmnopqrst",
                UnroutableReason::JobPartition,
            ),
            (
                "glrt-abcdefghijklmnopqrst",
                UnroutableReason::LegacyPrefixed,
            ),
            (
                "acme-glpat-abcdefghijklmnopqrst",
                UnroutableReason::LegacyPrefixed,
            ),
            (
                "GR1348941abcdefghijklmnop",
                UnroutableReason::LegacyRegistration,
            ),
            ("a1b2c3d4e5f6", UnroutableReason::Opaque),
            ("x-y-z", UnroutableReason::Opaque),
        ];
        for (t, want) in cases {
            assert_eq!(
                c().classify(t),
                Classification::Unroutable { reason: want },
                "{t}"
            );
        }
    }

    #[test]
    fn prechecks() {
        let cl = c();
        assert_eq!(cl.classify(""), invalid(InvalidReason::Empty));
        assert_eq!(cl.classify("ab c"), invalid(InvalidReason::BadCharacters));
        assert_eq!(cl.classify("abé"), invalid(InvalidReason::BadCharacters));
        assert_eq!(
            cl.classify_bytes(&[0xff, 0x41]),
            invalid(InvalidReason::BadCharacters)
        );
        assert_eq!(
            cl.classify(&"a".repeat(9000)),
            invalid(InvalidReason::TooLong)
        );
        assert!(matches!(
            cl.classify("a.b"),
            Classification::Invalid {
                reason: InvalidReason::Malformed(_)
            }
        ));
    }
}

//! The [`Classifier`]: any string in, a [`Classification`] out.
//!
//! It picks the format by shape (cheap byte checks, no allocation), then decodes
//! and verifies. Verified JWT verdicts are kept in a bounded cache keyed by a keyed
//! 128-bit SipHash of the whole token, so a runner polling every few seconds with the
//! same token costs one hash and one lookup. Entries expire with the token, and a
//! key-set change invalidates them all.

//!
//! Layout: this file holds the [`Classifier`] and its verdict cache; `config` is
//! [`ClassifierConfig`] and this module's [`Error`]; `structural` classifies what is
//! not a JWT.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use siphasher::sip128::{Hasher128, SipHasher13};
use std::hash::Hasher as _;

use crate::identity::{Classification, Identity, InvalidReason};
use crate::jwt;
use crate::keys::KeySet;
use structural::{classify_structural, invalid, looks_like_jwt};

mod config;
mod structural;

pub use config::{ClassifierConfig, Error, Result};
pub(crate) use structural::split_gitlab_prefix;

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
        classify_structural(token)
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
        classify_structural(token)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn c() -> Classifier {
        Classifier::with_keys(KeySet::new())
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

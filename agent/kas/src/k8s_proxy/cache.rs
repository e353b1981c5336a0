//! GitLab's answers, cached per key as GitLab's kas caches them
//! (`cache.CacheWithErr` in `internal/module/kubernetes_api/server/factory.go`): a
//! yes for the positive TTL, a no (GitLab's 401, 403 or 404: `gapi.IsCacheableError`)
//! for the negative TTL; any other failure is not cached.
//!
//! Concurrent misses for one key make one GitLab call: the first caller fetches,
//! the others wait for its answer. If that caller goes away (its client hung up) or
//! the call fails in a way that is not cached, the next waiter fetches.
//!
//! Keys are SHA-256 digests of what identifies the question (tokens included), so
//! no token is kept in memory longer than its request.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

/// Entries kept at most; expired ones go first when full.
const CAP: usize = 100_000;

/// A cached answer: GitLab's yes (`Ok`) or its cacheable no (`Err(status)`).
pub(super) type Answer<V> = Result<V, u16>;

type Slot<V> = Arc<OnceCell<(Instant, Answer<V>)>>;

/// A TTL cache of GitLab answers keyed by a digest.
pub(super) struct Cache<V> {
    slots: Mutex<HashMap<[u8; 32], Slot<V>>>,
    positive: Duration,
    negative: Duration,
}

/// How a lookup was answered (for metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    /// From the cache (or another caller's call).
    Cached,
    /// This caller asked GitLab.
    Fetched,
}

impl<V: Clone> Cache<V> {
    /// A yes lives `positive`, a no `negative`.
    pub(super) fn new(positive: Duration, negative: Duration) -> Self {
        Cache {
            slots: Mutex::default(),
            positive,
            negative,
        }
    }

    fn slot(&self, key: [u8; 32]) -> Slot<V> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if let Some(slot) = slots.get(&key) {
            match slot.get() {
                Some((until, _)) if *until <= now => {}
                _ => return slot.clone(),
            }
        }
        if slots.len() >= CAP {
            slots.retain(|_, s| s.get().is_none_or(|(until, _)| *until > now));
            if slots.len() >= CAP {
                slots.clear();
            }
        }
        let slot = Slot::default();
        slots.insert(key, slot.clone());
        slot
    }

    /// The answer for `key`: cached, or `fetch`ed (once for concurrent callers).
    /// `fetch` answers `Ok(Ok(v))` yes, `Ok(Err(status))` a cacheable no, `Err(e)` a
    /// failure that is not cached.
    pub(super) async fn get<E, F, Fut>(
        &self,
        key: [u8; 32],
        fetch: F,
    ) -> Result<(Answer<V>, Source), E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Answer<V>, E>>,
    {
        let slot = self.slot(key);
        let mut fetched = false;
        let (_, answer) = slot
            .get_or_try_init(|| {
                fetched = true;
                async {
                    let answer = fetch().await?;
                    let ttl = if answer.is_ok() {
                        self.positive
                    } else {
                        self.negative
                    };
                    Ok((Instant::now() + ttl, answer))
                }
            })
            .await?;
        let source = if fetched {
            Source::Fetched
        } else {
            Source::Cached
        };
        Ok((answer.clone(), source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn concurrent_misses_make_one_call() {
        let cache = Arc::new(Cache::<u32>::new(
            Duration::from_secs(60),
            Duration::from_secs(60),
        ));
        let calls = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (cache, calls, mut released) = (cache.clone(), calls.clone(), released.clone());
            tasks.push(tokio::spawn(async move {
                cache
                    .get([1; 32], || async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        let _ = released.wait_for(|r| *r).await;
                        Ok::<_, ()>(Ok(7))
                    })
                    .await
                    .unwrap()
                    .0
            }));
        }
        tokio::task::yield_now().await;
        release.send(true).unwrap();
        for t in tasks {
            assert_eq!(t.await.unwrap(), Ok(7));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let (again, source) = cache
            .get([1; 32], || async { Ok::<_, ()>(Ok(8)) })
            .await
            .unwrap();
        assert_eq!((again, source), (Ok(7), Source::Cached));
    }

    #[tokio::test]
    async fn a_no_is_cached_a_failure_is_not_and_entries_expire() {
        let cache = Cache::<u32>::new(Duration::from_millis(1), Duration::from_secs(60));
        let no = cache
            .get([2; 32], || async { Ok::<_, ()>(Err(403)) })
            .await
            .unwrap();
        assert_eq!(no, (Err(403), Source::Fetched));
        let still = cache
            .get([2; 32], || async { Ok::<_, ()>(Ok(1)) })
            .await
            .unwrap();
        assert_eq!(still, (Err(403), Source::Cached));

        assert_eq!(
            cache
                .get([3; 32], || async { Err::<Answer<u32>, _>("down") })
                .await,
            Err("down")
        );
        let after = cache
            .get([3; 32], || async { Ok::<_, ()>(Ok(5)) })
            .await
            .unwrap();
        assert_eq!(after, (Ok(5), Source::Fetched));

        // A 1 ms yes has expired by the next lookup that waited for a fresh one.
        let deadline = Instant::now() + Duration::from_millis(2);
        while Instant::now() < deadline {
            std::hint::spin_loop();
        }
        let fresh = cache
            .get([3; 32], || async { Ok::<_, ()>(Ok(6)) })
            .await
            .unwrap();
        assert_eq!(fresh, (Ok(6), Source::Fetched));
    }
}

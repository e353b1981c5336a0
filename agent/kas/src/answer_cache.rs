//! GitLab's answers, cached per key as GitLab's kas caches them
//! (`cache.CacheWithErr` in `internal/module/kubernetes_api/server/factory.go`): a
//! yes for the positive TTL, a no (GitLab's 401, 403 or 404: `gapi.IsCacheableError`)
//! for the negative TTL; any other failure is not cached.
//!
//! Concurrent misses for one key make one GitLab call (quick_cache's placeholder
//! guards): the first caller fetches, the others wait for its answer. If that caller
//! goes away (its client hung up) or the call fails in a way that is not cached, the
//! next waiter fetches. An expired entry is swapped for a guard in the same step, so
//! one caller refreshes it while the others wait.
//!
//! Bounded: at most [`CAP`] keys, the least useful evicted first. Keys holding a
//! token are SHA-256 digests of it, so no token is kept in memory longer than its
//! request.

use std::future::Future;
use std::hash::Hash;
use std::time::Duration;

use quick_cache::sync::{EntryAction, EntryResult};
use tokio::time::Instant;

/// Keys kept at most.
pub(crate) const CAP: usize = 100_000;

/// A cached answer: GitLab's yes (`Ok`) or its cacheable no (`Err`, by default the
/// HTTP status).
pub(crate) type Answer<V, N = u16> = Result<V, N>;

/// A TTL cache of GitLab answers, by default keyed by a digest.
pub(crate) struct AnswerCache<V, N = u16, K = [u8; 32]> {
    entries: quick_cache::sync::Cache<K, (Instant, Answer<V, N>)>,
    positive: Duration,
    negative: Duration,
}

/// How a lookup was answered (for metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// From the cache.
    Cached,
    /// From another caller's call, waited for.
    Joined,
    /// This caller asked GitLab.
    Fetched,
}

impl<V: Clone, N: Clone, K: Eq + Hash + Clone> AnswerCache<V, N, K> {
    /// A yes lives `positive`, a no `negative`.
    pub(crate) fn new(positive: Duration, negative: Duration) -> Self {
        AnswerCache {
            entries: quick_cache::sync::Cache::new(CAP),
            positive,
            negative,
        }
    }

    /// The answer for `key`: cached, or `fetch`ed (once for concurrent callers).
    /// `fetch` answers `Ok(Ok(v))` yes, `Ok(Err(status))` a cacheable no, `Err(e)` a
    /// failure that is not cached.
    pub(crate) async fn get<E, F, Fut>(&self, key: K, fetch: F) -> Result<(Answer<V, N>, Source), E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Answer<V, N>, E>>,
    {
        let fresh = |(until, answer): &(Instant, Answer<V, N>)| {
            (Instant::now() < *until).then(|| answer.clone())
        };
        if let Some(answer) = self.entries.get(&key).as_ref().and_then(fresh) {
            return Ok((answer, Source::Cached));
        }
        let guard = match self
            .entries
            .entry_async(&key, |_, entry| match fresh(entry) {
                Some(answer) => EntryAction::Retain(answer),
                None => EntryAction::ReplaceWithGuard,
            })
            .await
        {
            EntryResult::Retained(answer) => return Ok((answer, Source::Joined)),
            EntryResult::Vacant(guard) | EntryResult::Replaced(guard, _) => guard,
            EntryResult::Removed(..) | EntryResult::Timeout => {
                unreachable!("the callback never removes, and entry_async has no timeout")
            }
        };
        // A failure drops the guard unfilled: the next waiter, if any, fetches.
        let answer = fetch().await?;
        let ttl = if answer.is_ok() {
            self.positive
        } else {
            self.negative
        };
        let _ = guard.insert((Instant::now() + ttl, answer.clone()));
        Ok((answer, Source::Fetched))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn concurrent_misses_make_one_call() {
        let cache = Arc::new(AnswerCache::<u32>::new(
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
            }));
        }
        tokio::task::yield_now().await;
        release.send(true).unwrap();
        let mut sources = Vec::new();
        for t in tasks {
            let (answer, source) = t.await.unwrap();
            assert_eq!(answer, Ok(7));
            sources.push(source);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(
            sources.iter().filter(|s| **s == Source::Fetched).count(),
            1,
            "{sources:?}"
        );
        let (again, source) = cache
            .get([1; 32], || async { Ok::<_, ()>(Ok(8)) })
            .await
            .unwrap();
        assert_eq!((again, source), (Ok(7), Source::Cached));
    }

    #[tokio::test]
    async fn a_waiter_fetches_when_the_first_caller_goes_away() {
        let cache = Arc::new(AnswerCache::<u32>::new(
            Duration::from_secs(60),
            Duration::from_secs(60),
        ));
        let (started, mut has_started) = tokio::sync::mpsc::channel(1);
        let first = tokio::spawn({
            let cache = cache.clone();
            async move {
                cache
                    .get([4; 32], || async move {
                        let _ = started.send(()).await;
                        std::future::pending::<Result<Answer<u32>, ()>>().await
                    })
                    .await
            }
        });
        has_started.recv().await.unwrap();
        let second = tokio::spawn({
            let cache = cache.clone();
            async move { cache.get([4; 32], || async { Ok::<_, ()>(Ok(9)) }).await }
        });
        tokio::task::yield_now().await;
        first.abort();
        assert_eq!(second.await.unwrap(), Ok((Ok(9), Source::Fetched)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_no_is_cached_a_failure_is_not_and_entries_expire() {
        let cache = AnswerCache::<u32>::new(Duration::from_secs(1), Duration::from_secs(60));
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

        // A 1 s yes is kept for 1 s, then fetched again; the 60 s no is still kept.
        tokio::time::advance(Duration::from_millis(999)).await;
        let kept = cache
            .get([3; 32], || async { Ok::<_, ()>(Ok(6)) })
            .await
            .unwrap();
        assert_eq!(kept, (Ok(5), Source::Cached));
        tokio::time::advance(Duration::from_millis(1)).await;
        let fresh = cache
            .get([3; 32], || async { Ok::<_, ()>(Ok(6)) })
            .await
            .unwrap();
        assert_eq!(fresh, (Ok(6), Source::Fetched));
        let no = cache
            .get([2; 32], || async { Ok::<_, ()>(Ok(1)) })
            .await
            .unwrap();
        assert_eq!(no, (Err(403), Source::Cached));
    }
}

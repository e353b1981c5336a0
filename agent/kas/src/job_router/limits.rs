//! How many `GetJob` calls kas holds at once: at most `max_held` in all and
//! `max_held_per_runner` per runner token. A call over either limit is not queued:
//! it goes to Rails at once, as Workhorse passes a poll it cannot watch
//! (`workhorse/internal/builds/register.go` in gitlabhq/gitlabhq).

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher as _;
use std::sync::{Arc, Mutex};

/// The hold limits and the holds counted against them.
pub(crate) struct Limits {
    max_held: usize,
    max_per_runner: usize,
    state: Mutex<Counts>,
    /// Keys runners by a keyed hash of their token: no token is kept.
    hasher: RandomState,
}

#[derive(Default)]
struct Counts {
    total: usize,
    by_runner: HashMap<u64, usize>,
}

/// One hold counted; dropping it releases it.
pub(crate) struct Slot {
    limits: Arc<Limits>,
    runner: u64,
}

impl Limits {
    pub(crate) fn new(max_held: usize, max_per_runner: usize) -> Arc<Limits> {
        Arc::new(Limits {
            max_held,
            max_per_runner,
            state: Mutex::default(),
            hasher: RandomState::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for one more hold of `token`'s runner, or `None` when a limit is
    /// reached.
    pub(crate) fn acquire(self: &Arc<Self>, token: &str) -> Option<Slot> {
        let runner = self.hasher.hash_one(token);
        let mut st = self.lock();
        if st.total >= self.max_held {
            return None;
        }
        let n = st.by_runner.entry(runner).or_default();
        if *n >= self.max_per_runner {
            return None;
        }
        *n += 1;
        st.total += 1;
        Some(Slot {
            limits: self.clone(),
            runner,
        })
    }

    /// Holds counted now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.lock().total
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut st = self.limits.lock();
        st.total -= 1;
        if let Some(n) = st.by_runner.get_mut(&self.runner) {
            *n -= 1;
            if *n == 0 {
                st.by_runner.remove(&self.runner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_runner_and_global_limits_refuse_at_once_and_free_on_drop() {
        let l = Limits::new(3, 2);
        let a1 = l.acquire("a").expect("a's first");
        let a2 = l.acquire("a").expect("a's second");
        assert!(l.acquire("a").is_none(), "a is at its limit");
        let b1 = l.acquire("b").expect("b has its own");
        assert!(l.acquire("c").is_none(), "the global limit");
        drop(a1);
        let c1 = l.acquire("c").expect("a slot came free");
        assert_eq!(l.held(), 3);
        drop((a2, b1, c1));
        assert_eq!(l.held(), 0);
        assert!(l.lock().by_runner.is_empty(), "no runner left behind");
    }
}

//! Background applies, shared by the reconcilers of one worker and queued behind
//! [`MAX_CONCURRENT_APPLIES`].

use std::sync::{Arc, Mutex};

use tokio::task::JoinSet;

/// Most applies running at once. agentk starts every apply of a cycle at once (a
/// goroutine each); a full cycle over 1,000 workspaces would open as many
/// connections to the API server, so podgate queues them (first come, first
/// started) behind this many.
pub const MAX_CONCURRENT_APPLIES: usize = 32;

/// Background applies. Shared by every reconciler of a worker: an apply started by
/// a reconciler that a full cycle replaced runs on (as in agentk), and all of them
/// are aborted when the last handle is dropped (the worker stopped).
#[derive(Clone)]
pub struct Applies {
    set: Arc<Mutex<JoinSet<()>>>,
    /// Permits for running applies ([`MAX_CONCURRENT_APPLIES`]).
    pub(super) limit: Arc<tokio::sync::Semaphore>,
}

impl Default for Applies {
    fn default() -> Self {
        Applies {
            set: Arc::default(),
            limit: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_APPLIES)),
        }
    }
}

impl Applies {
    pub(super) fn spawn(&self, f: impl Future<Output = ()> + Send + 'static) {
        let mut set = self.set.lock().unwrap_or_else(|e| e.into_inner());
        while set.try_join_next().is_some() {}
        set.spawn(f);
    }
}

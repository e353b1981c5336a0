//! What one reconciler remembers between cycles, as
//! GitLab agentk's `persisted_state.go`, `termination_tracker.go` and
//! `error_tracker.go` (`internal/module/remote_development/agent/`, gitlab-agent
//! v16):
//!
//! - [`PersistedVersions`]: the Deployment resourceVersion GitLab has acknowledged,
//!   by workspace name, so an unchanged Deployment is not sent again;
//! - [`TerminationTracker`]: workspaces being deleted, re-reported every cycle until
//!   GitLab answers `actual_state: Terminated`;
//! - [`ErrorTracker`]: the result of the latest apply per workspace, under
//!   monotonically increasing versions, so that an older apply finishing late never
//!   overwrites a newer one and an error is dropped only once GitLab has answered the
//!   cycle that reported it, and only if no newer apply started meanwhile.
//!
//! All three are thrown away with their reconciler at every full cycle.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::body::TerminationProgress;

/// The Deployment resourceVersion GitLab has stored, by workspace name
/// (`persisted_state.go`: keyed by name only, as agentk does).
#[derive(Debug, Default)]
pub struct PersistedVersions {
    versions: HashMap<String, String>,
}

impl PersistedVersions {
    /// Whether GitLab already has `resource_version` of workspace `name`.
    pub fn is_persisted(&self, name: &str, resource_version: &str) -> bool {
        self.versions
            .get(name)
            .is_some_and(|v| v == resource_version)
    }

    /// GitLab answered with `resource_version` for `name` (even `""`).
    pub fn record(&mut self, name: &str, resource_version: &str) {
        self.versions
            .insert(name.to_owned(), resource_version.to_owned());
    }

    /// Forget `name` (GitLab confirmed it `Terminated`).
    pub fn delete(&mut self, name: &str) {
        self.versions.remove(name);
    }

    /// Whether anything is recorded for `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.versions.contains_key(name)
    }
}

/// A workspace: its name and namespace.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkspaceKey {
    /// The workspace's (Deployment's) name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
}

impl WorkspaceKey {
    /// The key of `name` in `namespace`.
    pub fn new(name: &str, namespace: &str) -> WorkspaceKey {
        WorkspaceKey {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
        }
    }
}

/// Workspaces whose deletion agentk started, with how far it had come when last
/// looked at (`termination_tracker.go`). What is reported is decided afresh each
/// cycle from the Deployment store.
#[derive(Debug, Default)]
pub struct TerminationTracker {
    entries: BTreeMap<WorkspaceKey, TerminationProgress>,
}

impl TerminationTracker {
    /// Track `name` in `namespace` at `progress`.
    pub fn add(&mut self, name: &str, namespace: &str, progress: TerminationProgress) {
        self.entries
            .insert(WorkspaceKey::new(name, namespace), progress);
    }

    /// Stop tracking (GitLab confirmed `Terminated`).
    pub fn delete(&mut self, name: &str, namespace: &str) {
        self.entries.remove(&WorkspaceKey::new(name, namespace));
    }

    /// The progress recorded for a workspace, if tracked.
    pub fn get(&self, name: &str, namespace: &str) -> Option<TerminationProgress> {
        self.entries
            .get(&WorkspaceKey::new(name, namespace))
            .copied()
    }

    /// Every tracked workspace, ordered by name then namespace.
    pub fn iter(&self) -> impl Iterator<Item = (&WorkspaceKey, TerminationProgress)> {
        self.entries.iter().map(|(k, p)| (k, *p))
    }

    /// How many are tracked.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The state of a workspace's latest operation (`error_tracker.go`'s
/// `operationState`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationState {
    /// The operation's version (higher = started later).
    pub version: u64,
    /// `None` while it runs; its errors, joined by newlines, once it failed.
    pub error: Option<String>,
}

/// The applier's results, shared between the reconciler and the applies it started
/// (`error_tracker.go`). Cloning shares the tracker.
#[derive(Clone, Debug)]
pub struct ErrorTracker {
    store: Arc<Mutex<HashMap<WorkspaceKey, OperationState>>>,
    /// Operations started and not yet finished.
    pending: Arc<watch::Sender<usize>>,
}

impl Default for ErrorTracker {
    fn default() -> Self {
        ErrorTracker {
            store: Arc::default(),
            pending: Arc::new(watch::channel(0).0),
        }
    }
}

impl ErrorTracker {
    /// A copy of every entry, taken at the start of a cycle.
    pub fn snapshot(&self) -> HashMap<WorkspaceKey, OperationState> {
        self.lock().clone()
    }

    /// Start tracking operation `version` of a workspace: an entry with no error,
    /// unless an entry of a newer version exists (`markEntryWithVersion`).
    pub fn mark(&self, key: &WorkspaceKey, version: u64) {
        let mut store = self.lock();
        if store.get(key).is_some_and(|s| s.version > version) {
            return;
        }
        store.insert(
            key.clone(),
            OperationState {
                version,
                error: None,
            },
        );
    }

    /// Record the error of operation `version`, only if that is still the tracked
    /// operation (`saveErrorIfVersion`).
    pub fn save_error_if_version(&self, key: &WorkspaceKey, error: String, version: u64) {
        let mut store = self.lock();
        if let Some(state) = store.get_mut(key)
            && state.version == version
        {
            state.error = Some(error);
        }
    }

    /// Drop the entry if it is still of `version` (`deleteErrorIfVersion`): after a
    /// successful operation, and after GitLab answered the cycle that reported its
    /// error.
    pub fn delete_if_version(&self, key: &WorkspaceKey, version: u64) {
        let mut store = self.lock();
        if store.get(key).is_some_and(|s| s.version == version) {
            store.remove(key);
        }
    }

    /// Mark operation `version` and record what `operation` ends with: its errors
    /// joined by newlines (Go's `errors.Join`), or the entry dropped when there were
    /// none (`watchForLatestErrors`). The caller runs the returned future (spawned:
    /// applies are asynchronous).
    pub fn watch(
        &self,
        key: WorkspaceKey,
        version: u64,
        operation: impl Future<Output = Vec<String>> + Send + 'static,
    ) -> impl Future<Output = ()> + Send + 'static {
        self.mark(&key, version);
        self.pending.send_modify(|n| *n += 1);
        let tracker = self.clone();
        async move {
            // Counted down even if the future is dropped mid-way (aborted).
            let _done = PendingGuard(tracker.pending.clone());
            let errors = operation.await;
            if errors.is_empty() {
                tracker.delete_if_version(&key, version);
            } else {
                tracker.save_error_if_version(&key, errors.join("\n"), version);
            }
        }
    }

    /// Wait until every operation started so far has ended (`waitForErrors`).
    pub async fn wait_idle(&self) {
        let mut rx = self.pending.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// The tracked entry of a workspace.
    pub fn get(&self, key: &WorkspaceKey) -> Option<OperationState> {
        self.lock().get(key).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<WorkspaceKey, OperationState>> {
        // A panic while holding this lock leaves plain data; keep using it.
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct PendingGuard(Arc<watch::Sender<usize>>);

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> WorkspaceKey {
        WorkspaceKey::new("ws", "ns")
    }

    #[test]
    fn persisted_versions_match_name_and_version() {
        let mut p = PersistedVersions::default();
        assert!(!p.is_persisted("ws", ""));
        p.record("ws", "");
        assert!(p.is_persisted("ws", ""));
        assert!(!p.is_persisted("ws", "7"));
        p.record("ws", "7");
        assert!(p.is_persisted("ws", "7"));
        p.delete("ws");
        assert!(!p.contains("ws"));
    }

    #[test]
    fn termination_tracker_orders_and_overwrites() {
        let mut t = TerminationTracker::default();
        t.add("b", "n", TerminationProgress::Terminating);
        t.add("a", "n", TerminationProgress::Terminated);
        t.add("b", "n", TerminationProgress::Terminated);
        let names: Vec<_> = t.iter().map(|(k, p)| (k.name.clone(), p)).collect();
        assert_eq!(
            names,
            vec![
                ("a".to_owned(), TerminationProgress::Terminated),
                ("b".to_owned(), TerminationProgress::Terminated)
            ]
        );
        t.delete("a", "n");
        assert_eq!(t.len(), 1);
        assert_eq!(t.get("a", "n"), None);
    }

    #[test]
    fn an_older_version_never_overwrites_a_newer_one() {
        let t = ErrorTracker::default();
        t.mark(&key(), 2);
        t.mark(&key(), 1);
        assert_eq!(t.get(&key()).unwrap().version, 2);
        t.save_error_if_version(&key(), "old".into(), 1);
        assert_eq!(t.get(&key()).unwrap().error, None);
        t.delete_if_version(&key(), 1);
        assert!(t.get(&key()).is_some());
        t.save_error_if_version(&key(), "new".into(), 2);
        assert_eq!(t.get(&key()).unwrap().error.as_deref(), Some("new"));
        // Nothing is written for a workspace not marked.
        t.save_error_if_version(&WorkspaceKey::new("other", "ns"), "x".into(), 2);
        assert!(t.get(&WorkspaceKey::new("other", "ns")).is_none());
        t.delete_if_version(&key(), 2);
        assert!(t.get(&key()).is_none());
    }

    #[tokio::test]
    async fn watch_joins_errors_and_a_late_old_result_is_dropped() {
        let t = ErrorTracker::default();
        let (old_tx, old_rx) = tokio::sync::oneshot::channel::<Vec<String>>();
        let old = tokio::spawn(t.watch(key(), 1, async move { old_rx.await.unwrap() }));
        assert_eq!(
            t.get(&key()),
            Some(OperationState {
                version: 1,
                error: None
            })
        );
        // A newer apply starts and fails first.
        tokio::spawn(t.watch(key(), 2, async { vec!["e1".to_owned(), "e2".to_owned()] }))
            .await
            .unwrap();
        assert_eq!(t.get(&key()).unwrap().error.as_deref(), Some("e1\ne2"));
        // The old one ends later, successfully: the newer error stays.
        old_tx.send(vec![]).unwrap();
        old.await.unwrap();
        t.wait_idle().await;
        assert_eq!(
            t.get(&key()),
            Some(OperationState {
                version: 2,
                error: Some("e1\ne2".into())
            })
        );
        // A successful newer apply drops the entry.
        tokio::spawn(t.watch(key(), 3, async { vec![] }));
        t.wait_idle().await;
        assert_eq!(t.get(&key()), None);
    }
}

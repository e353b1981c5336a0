//! The runners' queue keys, `runner:build_queue:<runner token>`, in memory, with
//! Rails' semantics (`app/models/ci/runner.rb`: `ensure_runner_queue_value`,
//! `tick_runner_queue`, `runner_queue_value_latest?`; `lib/gitlab/workhorse.rb`:
//! `set_key_and_notify`) and Workhorse's watch (`workhorse/internal/redis/keywatcher.go`
//! `WatchKey`). A long poll waits on its own runner's key only: each watched key has
//! a `watch` channel, created by its first watcher and dropped with its last, so
//! 10,000 runners cost one map entry each and a channel only while held.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus::{IntCounter, IntGauge};
use tokio::sync::watch;

use super::mirror::{Mirror, Op};

/// `Ci::Runner::RUNNER_QUEUE_EXPIRY_TIME`: a key lives an hour after its last write.
pub const RUNNER_QUEUE_EXPIRY: Duration = Duration::from_secs(3600);

/// The key prefix (`Gitlab::Workhorse` / Workhorse's `runnerBuildQueue`).
pub const KEY_PREFIX: &str = "runner:build_queue:";

/// The notification channel prefix (`Gitlab::Workhorse::NOTIFICATION_PREFIX`).
pub const NOTIFICATION_PREFIX: &str = "workhorse:notifications:";

/// The Redis key of the runner with `token`.
pub fn key(token: &str) -> String {
    format!("{KEY_PREFIX}{token}")
}

/// The channel a new value of `token`'s key is published on.
pub fn channel(token: &str) -> String {
    format!("{NOTIFICATION_PREFIX}{KEY_PREFIX}{token}")
}

/// `SecureRandom.hex`: 16 random bytes as 32 hex digits.
fn random_hex() -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(32);
    for b in podgate_tokens::gitlab::random_bytes() {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 15)] as char);
    }
    s
}

/// How a Workhorse watch ended (`redis.WatchKeyStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchStatus {
    /// The value already differed when the watch began (Workhorse passes the request
    /// to Rails).
    AlreadyChanged,
    /// A new value was seen while watching.
    SeenChange,
    /// The long poll ended with no notification.
    Timeout,
    /// A notification came with the same value.
    NoChange,
}

impl WatchStatus {
    /// Workhorse's metric label (`already-changed`, `seen-change`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            WatchStatus::AlreadyChanged => "already-changed",
            WatchStatus::SeenChange => "seen-change",
            WatchStatus::Timeout => "timeout",
            WatchStatus::NoChange => "no-change",
        }
    }
}

#[derive(Debug)]
struct Key {
    value: String,
    expires: Instant,
    /// Held polls on this key (`None` when nobody waits).
    watch: Option<watch::Sender<String>>,
}

/// Every runner's queue key.
pub struct RunnerQueues {
    keys: Mutex<HashMap<String, Key>>,
    mirror: Option<Mirror>,
    ticks: IntCounter,
    /// Polls held now.
    held: watch::Sender<usize>,
    /// Workhorse's `registerHandlerOpen{state="watching"}`: watches under way.
    watching: Option<IntGauge>,
}

impl Default for RunnerQueues {
    fn default() -> Self {
        RunnerQueues::new(
            IntCounter::new(
                "podsim_runner_queue_ticks_total",
                "Runner queue keys ticked.",
            )
            .expect("valid metric"),
        )
    }
}

impl RunnerQueues {
    /// No keys yet; `ticks` counts [`RunnerQueues::tick`]s.
    pub fn new(ticks: IntCounter) -> Self {
        RunnerQueues {
            keys: Mutex::default(),
            mirror: None,
            ticks,
            held: watch::channel(0).0,
            watching: None,
        }
    }

    /// Count watches under way in `gauge` (Workhorse's
    /// `registerHandlerOpen{state="watching"}`, around the whole `WatchKey`). It is
    /// lowered before [`RunnerQueues::held_polls`] changes, so a test that awaited
    /// the latter reads the gauge settled.
    pub fn set_watching_gauge(&mut self, gauge: IntGauge) {
        self.watching = Some(gauge);
    }

    /// Mirror every write into Redis through `mirror`.
    pub(crate) fn set_mirror(&mut self, mirror: Mirror) {
        self.mirror = Some(mirror);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Key>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `GET runner:build_queue:<token>`: `None` when missing or expired.
    pub fn get(&self, token: &str) -> Option<String> {
        let now = Instant::now();
        self.lock()
            .get(token)
            .filter(|k| k.expires > now)
            .map(|k| k.value.clone())
    }

    /// `Gitlab::Workhorse.set_key_and_notify(key, value, expire: 3600, overwrite:)`:
    /// `SET key value EX 3600 [NX unless overwrite]`; when set, wake the key's
    /// watchers (`PUBLISH`) and answer `value`, else answer the stored value.
    fn set_key_and_notify(&self, token: &str, value: String, overwrite: bool) -> String {
        let now = Instant::now();
        let mut keys = self.lock();
        let entry = keys.entry(token.to_owned()).or_insert_with(|| Key {
            value: String::new(),
            expires: now,
            watch: None,
        });
        let live = entry.expires > now;
        if live && !overwrite {
            return entry.value.clone();
        }
        entry.value.clone_from(&value);
        entry.expires = now + RUNNER_QUEUE_EXPIRY;
        if let Some(w) = &entry.watch {
            w.send_replace(value.clone());
        }
        if let Some(m) = &self.mirror {
            // Sent under the lock, so Redis sees each key's writes in this order.
            m.send(Op::Set {
                token: token.to_owned(),
                value: value.clone(),
                nx: !overwrite,
            });
        }
        value
    }

    /// `Ci::Runner#ensure_runner_queue_value`: the key's value, set to a new random
    /// one first when it is missing.
    pub fn ensure(&self, token: &str) -> String {
        self.set_key_and_notify(token, random_hex(), false)
    }

    /// `Ci::Runner#tick_runner_queue`: a new random value, always set and published.
    pub fn tick(&self, token: &str) -> String {
        self.ticks.inc();
        self.set_key_and_notify(token, random_hex(), true)
    }

    /// `Ci::Runner#runner_queue_value_latest?(value)`:
    /// `ensure_runner_queue_value == value if value.present?`.
    pub fn latest(&self, token: &str, value: Option<&str>) -> bool {
        match value {
            Some(v) if !v.trim().is_empty() => self.ensure(token) == v,
            _ => false,
        }
    }

    /// Workhorse's `WatchKey(key, value, timeout)`: subscribe, then compare the
    /// current value (missing: `""`) with `value` (differs: `AlreadyChanged` at once),
    /// then wait for a notification (a different value: `SeenChange`; the same:
    /// `NoChange`) or the timeout (`Timeout`). Dropping the future unsubscribes.
    pub async fn watch(&self, token: &str, value: &str, timeout: Duration) -> WatchStatus {
        if let Some(g) = &self.watching {
            g.inc();
        }
        let unwatch = || {
            if let Some(g) = &self.watching {
                g.dec();
            }
        };
        let mut watcher = {
            let now = Instant::now();
            let mut keys = self.lock();
            let current = keys
                .get(token)
                .filter(|k| k.expires > now)
                .map_or("", |k| k.value.as_str());
            if current != value {
                unwatch();
                return WatchStatus::AlreadyChanged;
            }
            // `value` is not empty (Workhorse never watches without one), so the key
            // exists.
            let Some(entry) = keys.get_mut(token) else {
                unwatch();
                return WatchStatus::AlreadyChanged;
            };
            let rx = entry
                .watch
                .get_or_insert_with(|| watch::channel(value.to_owned()).0)
                .subscribe();
            self.held.send_modify(|n| *n += 1);
            Watcher {
                rx: Some(rx),
                queues: self,
                token,
            }
        };
        let rx = watcher.rx.as_mut().expect("set above");
        match tokio::time::timeout(timeout, rx.changed()).await {
            Err(_) => WatchStatus::Timeout,
            Ok(Err(_)) => WatchStatus::NoChange,
            Ok(Ok(())) if *rx.borrow() == value => WatchStatus::NoChange,
            Ok(Ok(())) => WatchStatus::SeenChange,
        }
    }

    /// How many polls are held now, as a channel that changes with it (tests await
    /// `wait_for(|n| *n == k)` instead of sleeping).
    pub fn held_polls(&self) -> watch::Receiver<usize> {
        self.held.subscribe()
    }

    /// How many keys have a held poll now.
    pub fn watched_keys(&self) -> usize {
        self.lock().values().filter(|k| k.watch.is_some()).count()
    }

    /// Forget keys that expired and nobody watches (Redis expires them by itself).
    pub fn sweep(&self) {
        let now = Instant::now();
        self.lock()
            .retain(|_, k| k.expires > now || k.watch.is_some());
    }
}

/// One held poll's subscription; the key's channel goes with its last watcher.
struct Watcher<'a> {
    rx: Option<watch::Receiver<String>>,
    queues: &'a RunnerQueues,
    token: &'a str,
}

impl Drop for Watcher<'_> {
    fn drop(&mut self) {
        drop(self.rx.take());
        {
            let mut keys = self.queues.lock();
            if let Some(k) = keys.get_mut(self.token)
                && k.watch.as_ref().is_some_and(|w| w.receiver_count() == 0)
            {
                k.watch = None;
            }
        }
        if let Some(g) = &self.queues.watching {
            g.dec();
        }
        self.queues.held.send_modify(|n| *n -= 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rails_semantics_and_workhorse_watches() {
        let q = RunnerQueues::default();
        assert_eq!(q.get("t"), None);
        assert!(!q.latest("t", None) && !q.latest("t", Some(" ")));
        let v = q.ensure("t");
        assert!(
            v.len() == 32 && v.bytes().all(|b| b.is_ascii_hexdigit()),
            "{v}"
        );
        assert_eq!(q.ensure("t"), v, "NX: the stored value stays");
        assert!(q.latest("t", Some(&v)));
        assert!(!q.latest("t", Some("old")));
        // A stale value: already changed, nothing held.
        assert_eq!(
            q.watch("t", "old", Duration::from_secs(5)).await,
            WatchStatus::AlreadyChanged
        );
        assert_eq!(
            q.watch("missing", "x", Duration::from_secs(5)).await,
            WatchStatus::AlreadyChanged
        );
        // The current value: held until the timeout…
        assert_eq!(
            q.watch("t", &v, Duration::from_millis(20)).await,
            WatchStatus::Timeout
        );
        assert_eq!(q.watched_keys(), 0, "the last watcher removes the channel");
        // …or a tick.
        let held = q.watch("t", &v, Duration::from_secs(30));
        tokio::pin!(held);
        assert!(futures_util::poll!(held.as_mut()).is_pending());
        assert_eq!(q.watched_keys(), 1);
        let new = q.tick("t");
        assert_ne!(new, v);
        assert_eq!(held.await, WatchStatus::SeenChange);
        assert_eq!(q.watched_keys(), 0);
        assert_eq!(q.get("t"), Some(new));
        assert_eq!(q.ticks.get(), 1);
    }
}

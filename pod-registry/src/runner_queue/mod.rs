//! GitLab's runner queue keys, watched as Workhorse watches them, for every holder
//! of `jobs/request` long polls in podgate: the proxy's edge polls and kas's Job
//! Router (`GetJob`) use the same [`QueueWatch`].
//!
//! GitLab keeps one queue key per runner in the Pod's Redis,
//! `runner:build_queue:<runner token>`, and announces every new value on
//! `workhorse:notifications:runner:build_queue:<runner token>`
//! (`Gitlab::Workhorse.set_key_and_notify`, `lib/gitlab/workhorse.rb` in
//! gitlabhq/gitlabhq). Workhorse holds a poll while the key still equals the
//! runner's `last_update` (`workhorse/internal/builds/register.go`
//! `RegisterHandler`, `workhorse/internal/redis/keywatcher.go` `WatchKey`).
//! [`QueueWatch::hold`] does the same, in keywatcher order:
//!
//! 1. the waiter is registered on the watch, then the key is read with `GET`; no
//!    live watch, or the `GET` fails: [`Outcome::FailOpen`];
//! 2. the key differs from `last_update` (or is missing): [`Outcome::Stale`]
//!    (Workhorse's `already-changed`: Rails answers);
//! 3. else held up to the caller's hold duration:
//!    - a notification with another value: [`Outcome::Changed`];
//!    - a notification with the same value: [`Outcome::NoChange`];
//!    - the hold ends: [`Outcome::Timeout`];
//!    - the Redis connection breaks, or the watch is stopped: [`Outcome::FailOpen`];
//!    - the client goes away: [`Outcome::ClientGone`], its waiter released;
//!    - the holder shuts down: [`Outcome::Shutdown`] (Workhorse's `kw.shutdown`).
//!
//! What the caller does with each outcome is its own: the proxy forwards a
//! `Changed` poll to the Pod, kas asks Rails.

pub mod watcher;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use prometheus::{IntCounter, IntGauge};
use thiserror::Error;

pub use watcher::{BACKOFF_MAX, PATTERN, PING_EVERY};
use watcher::{Shared, Wake};

/// The queue key prefix (Workhorse's `runnerBuildQueue`).
pub const KEY_PREFIX: &str = "runner:build_queue:";
/// The notification channel prefix (Workhorse's `channelPrefix`).
pub const CHANNEL_PREFIX: &str = "workhorse:notifications:";

/// Why a runner queue Redis could not be watched. Never fatal: the holds fail open
/// meanwhile.
#[derive(Debug, Error)]
pub enum Error {
    /// Redis refused or failed a command, or the connection failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// No answer in time.
    #[error("{0}: no answer in time")]
    Timeout(&'static str),
    /// The pub/sub connection closed.
    #[error("the pub/sub connection closed")]
    Closed,
}

/// How one hold ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Held until the hold ended.
    Timeout,
    /// Woken by a new value.
    Changed,
    /// A notification with the same value.
    NoChange,
    /// The key already differed (or was missing): not held.
    Stale,
    /// No live watch, a failed `GET`, or the connection broke during the hold.
    FailOpen,
    /// The client went away during the hold.
    ClientGone,
    /// The holder is shutting down: answer now.
    Shutdown,
}

/// Why a watch is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The watched Redis is no longer this watch's (a Pod gone, its URL changed):
    /// held calls end [`Outcome::FailOpen`].
    Replaced,
    /// The holder shuts down: held calls end [`Outcome::Shutdown`].
    Shutdown,
}

/// The metrics a watch keeps, children of the holder's own families (each holder
/// names and labels them).
#[derive(Clone, Debug)]
pub struct WatchMetrics {
    /// 1 while the subscription is live.
    pub up: IntGauge,
    /// Failed connections, commands and pings.
    pub errors: IntCounter,
    /// Notifications received (each after its waiters were woken).
    pub notifications: IntCounter,
    /// Calls held now (past their `GET`, waiting).
    pub held: IntGauge,
}

/// One Redis's watch on its runners' queue keys ([`watcher`]): one pub/sub
/// connection and one multiplexed connection for every runner and every hold.
/// Dropping it stops the watch and fails its held calls open.
pub struct QueueWatch {
    url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for QueueWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueWatch")
            .field("name", &self.shared.name)
            .field("up", &self.is_up())
            .finish_non_exhaustive()
    }
}

/// `podgate_*_held` for as long as it lives.
struct Held(IntGauge);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl QueueWatch {
    /// Start watching `url` (a `redis://` or `unix://` URL) on the current tokio
    /// runtime; `name` names it in logs (a Pod, a kas).
    pub fn start(name: impl Into<String>, url: &str, metrics: WatchMetrics) -> QueueWatch {
        metrics.up.set(0);
        let shared = Arc::new(Shared::new(name.into(), metrics));
        let task = tokio::spawn(watcher::run(url.to_owned(), shared.clone()));
        QueueWatch {
            url: url.to_owned(),
            shared,
            task,
        }
    }

    /// The Redis URL watched.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether the subscription is live (holds can register).
    pub fn is_up(&self) -> bool {
        self.shared.metrics.up.get() == 1
    }

    /// Calls registered now (held, or reading their key).
    pub fn waiting(&self) -> usize {
        self.shared.waiting()
    }

    /// The metrics this watch keeps.
    pub fn metrics(&self) -> &WatchMetrics {
        &self.shared.metrics
    }

    /// Stop the watch: no call registers any more; the held ones end as `why` says.
    pub fn stop(&self, why: Stop) {
        self.task.abort();
        self.shared.stop(&match why {
            Stop::Replaced => Wake::Broken,
            Stop::Shutdown => Wake::Shutdown,
        });
    }

    /// Hold a runner's call while its queue key equals `last_update`, for up to
    /// `hold` (module docs for the order of checks). `client_gone` completes when
    /// the caller's client has gone; every resource of the hold is released then.
    /// `token` is the runner's authentication token (the key's suffix); it is never
    /// logged, only its fingerprint.
    pub async fn hold<F: Future<Output = ()>>(
        &self,
        token: &str,
        last_update: &str,
        hold: Duration,
        client_gone: F,
    ) -> Outcome {
        let shared = &self.shared;
        // `WatchKey`: subscribe first, then read the key, so no change between the
        // two is missed.
        let Some((mut registration, mut conn)) = shared.register(token) else {
            return Outcome::FailOpen;
        };
        let key = format!("{KEY_PREFIX}{token}");
        let current = tokio::time::timeout(
            watcher::RESPONSE_TIMEOUT,
            redis::cmd("GET")
                .arg(&key)
                .query_async::<Option<Vec<u8>>>(&mut conn),
        )
        .await;
        let current = match current {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return self.get_failed(token, &e.to_string()),
            Err(_) => return self.get_failed(token, "no answer in time"),
        };
        // A missing key reads as "" (which `last_update` never is).
        if current.as_deref().unwrap_or_default() != last_update.as_bytes() {
            return Outcome::Stale;
        }
        shared.metrics.held.inc();
        let _held = Held(shared.metrics.held.clone());
        tokio::select! {
            woken = &mut registration.rx => match woken {
                Ok(Wake::Value(v)) if v == last_update.as_bytes() => Outcome::NoChange,
                Ok(Wake::Value(_)) => Outcome::Changed,
                Ok(Wake::Shutdown) => Outcome::Shutdown,
                Ok(Wake::Broken) | Err(_) => Outcome::FailOpen,
            },
            () = tokio::time::sleep(hold) => Outcome::Timeout,
            () = client_gone => Outcome::ClientGone,
        }
    }

    fn get_failed(&self, token: &str, error: &str) -> Outcome {
        let shared = &self.shared;
        shared.metrics.errors.inc();
        shared.suspect();
        tracing::warn!(
            pod = %shared.name,
            runner = %podgate_tokens::fingerprint(token),
            error,
            "runner queue: GET of the runner's queue key failed; not held"
        );
        Outcome::FailOpen
    }
}

impl Drop for QueueWatch {
    fn drop(&mut self) {
        self.stop(Stop::Replaced);
    }
}

#[cfg(test)]
mod tests;

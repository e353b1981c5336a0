//! GitLab's job queueing for runners, as Rails and Workhorse share it: one queue key
//! per runner (`runner:build_queue:<runner token>`, [`keys`]), who may take which job
//! ([`matching`]), and the optional mirror of every key write into a real Redis
//! ([`mirror`], `set_key_and_notify`), so that something outside the simulator (the
//! proxy's edge long polls) can watch the keys exactly as Workhorse does.
//!
//! - Rails (`app/models/ci/runner.rb`): `ensure_runner_queue_value` sets a random hex
//!   value only when the key is missing (`SET … NX EX 3600`) and answers the stored
//!   value; `tick_runner_queue` always sets a new one; `runner_queue_value_latest?`
//!   compares. Both go through `Gitlab::Workhorse.set_key_and_notify`
//!   (`lib/gitlab/workhorse.rb`), which `PUBLISH`es the new value on
//!   `workhorse:notifications:<key>` when it was set.
//! - A job becoming pending ticks the keys of the runners that can take it
//!   (`Ci::UpdateBuildQueueService#tick_for`, `Ci::Runner#pick_build!`,
//!   `Gitlab::Ci::Matching::RunnerMatcher#matches?`).
//! - Workhorse (`workhorse/internal/redis/keywatcher.go` `WatchKey`) holds a poll on
//!   one key until its value changes or the poll times out ([`RunnerQueues::watch`]).
//!
//! The in-memory values are the source of truth for the simulator's own Workhorse
//! layer; Redis only mirrors them.

pub mod keys;
pub mod matching;
pub mod mirror;

use thiserror::Error;

pub use keys::{RunnerQueues, WatchStatus};
pub use matching::{AccessLevel, BuildMatcher, RunnerMatcher, RunnerType};

/// Problems setting up the queue's Redis mirror. Not worth retrying unchanged.
#[derive(Debug, Error)]
pub enum QueueError {
    /// The Redis URL does not parse.
    #[error("redis: not a Redis URL ({0})")]
    RedisUrl(String),
}

//! `[job_router]`: GitLab's Job Router on the agent listener
//! ([`crate::job_router`]).

use std::time::Duration;

use serde::Deserialize;

use crate::job_router::{
    DEFAULT_HOLD, DEFAULT_MAX_HELD, DEFAULT_MAX_HELD_PER_RUNNER, JobRouterConfig,
};

/// `[job_router]` as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobRouterFile {
    /// Off: `GetJob` answers `UNIMPLEMENTED` and runners poll REST.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The Cell's Redis holding its runners' queue keys (`redis://`, `rediss://`,
    /// `unix://`); none: every call goes to Rails at once.
    #[serde(default)]
    pub runner_queue_redis: Option<String>,
    /// Longest a call is held.
    #[serde(default = "default_hold", with = "humantime_serde")]
    pub hold: Duration,
    /// Calls held at once, in all.
    #[serde(default = "default_max_held")]
    pub max_held: usize,
    /// Calls held at once per runner.
    #[serde(default = "default_max_held_per_runner")]
    pub max_held_per_runner: usize,
}

fn yes() -> bool {
    true
}

fn default_hold() -> Duration {
    DEFAULT_HOLD
}

fn default_max_held() -> usize {
    DEFAULT_MAX_HELD
}

fn default_max_held_per_runner() -> usize {
    DEFAULT_MAX_HELD_PER_RUNNER
}

impl JobRouterFile {
    /// Check the section (`has_gitlab`: `[gitlab] url` is set, where Rails is
    /// asked); every problem names its field.
    pub(super) fn validate(&self, has_gitlab: bool, bad: &mut Vec<String>) -> JobRouterConfig {
        if self.enabled && !has_gitlab {
            bad.push("job_router: needs [gitlab] url (Rails answers the job requests)".into());
        }
        if let Some(url) = &self.runner_queue_redis
            && !["redis://", "rediss://", "unix://"]
                .iter()
                .any(|s| url.starts_with(s))
        {
            bad.push(format!(
                "job_router.runner_queue_redis = {url:?}: expected a redis://, rediss:// or unix:// URL"
            ));
        }
        super::require_positive(bad, [("job_router.hold", self.hold)]);
        for (field, n) in [
            ("job_router.max_held", self.max_held),
            ("job_router.max_held_per_runner", self.max_held_per_runner),
        ] {
            if n == 0 {
                bad.push(format!("{field}: must be at least 1"));
            }
        }
        JobRouterConfig {
            enabled: self.enabled,
            runner_queue_redis: self.runner_queue_redis.clone(),
            hold: self.hold,
            max_held: self.max_held,
            max_held_per_runner: self.max_held_per_runner,
        }
    }
}

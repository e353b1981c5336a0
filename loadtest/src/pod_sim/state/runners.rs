//! Runners: registration with the instance or a project registration token
//! (`Ci::Runners::RegisterRunnerService`), their attributes (`Ci::Runner`), tokens,
//! managers, and the runners a queue tick goes to.

use std::time::{Duration, Instant};

use podgate_tokens::TokenKind;

use super::super::Error;
use super::super::queue::keys::RUNNER_QUEUE_EXPIRY;
use super::super::queue::{AccessLevel, BuildMatcher, RunnerMatcher, RunnerType};
use super::{Owner, State};

/// What a registration asks for (`POST /runners` parameters).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunnerSpec {
    /// Instance or project runner (the registration token decides).
    pub runner_type: RunnerType,
    /// Its tags (`tag_list`), cleaned.
    pub tags: Vec<String>,
    /// Whether it runs untagged jobs (`run_untagged`, default true).
    pub run_untagged: bool,
    /// Whether it is locked to its project (`locked`).
    pub locked: bool,
    /// `access_level` (default `not_protected`).
    pub access_level: AccessLevel,
    /// Paused (`paused: true` or `active: false`): `jobs/request` gives it nothing.
    pub paused: bool,
    /// `description`.
    pub description: String,
}

impl Default for RunnerSpec {
    fn default() -> Self {
        RunnerSpec {
            runner_type: RunnerType::Instance,
            tags: Vec::new(),
            run_untagged: true,
            locked: false,
            access_level: AccessLevel::NotProtected,
            paused: false,
            description: String::new(),
        }
    }
}

impl RunnerSpec {
    /// `Ci::Runner#tag_constraints`: a runner that does not run untagged jobs needs
    /// tags (`tags_list`: "can not be empty when runner is not allowed to pick
    /// untagged jobs").
    pub fn validate(&self) -> Result<(), String> {
        if self.tags.is_empty() && !self.run_untagged {
            return Err("can not be empty when runner is not allowed to pick untagged jobs".into());
        }
        Ok(())
    }

    fn matcher(&self) -> RunnerMatcher {
        RunnerMatcher::new(
            self.runner_type,
            &self.tags,
            self.run_untagged,
            self.access_level,
        )
    }
}

/// A registered runner.
#[derive(Clone, Debug)]
pub struct Runner {
    /// Runner id.
    pub id: u64,
    /// Its authentication token.
    pub token: String,
    /// What it registered with.
    pub spec: RunnerSpec,
    /// When it last talked to Rails (`contacted_at`).
    pub contacted_at: Option<Instant>,
}

/// `Ci::Runner.with_recent_runner_queue`: contacted within the queue keys' lifetime.
const RECENT: Duration = RUNNER_QUEUE_EXPIRY;

impl State {
    /// Whether `token` is a registration token: the instance one, or a project's
    /// (or another Pod's: misrouted).
    pub fn check_registration(&self, token: &str) -> Owner<RunnerType> {
        let found = if token == self.registration_token {
            Some(RunnerType::Instance)
        } else {
            self.projects
                .iter()
                .find(|(_, t)| t == token)
                .map(|(id, _)| RunnerType::Project(*id))
        };
        self.owner(token, found)
    }

    /// Register an instance runner without tags that runs untagged jobs: (id, token).
    pub fn register(&self) -> Result<(u64, String), Error> {
        self.register_runner(RunnerSpec::default())
    }

    /// Register a runner as `spec` says: (id, token). Its queue key is ticked, as
    /// `Ci::Runner`'s `after_save :tick_runner_queue` does when its attributes are set.
    pub fn register_runner(&self, spec: RunnerSpec) -> Result<(u64, String), Error> {
        spec.validate()
            .map_err(|e| Error::Config(format!("tag_list: {e}")))?;
        if let RunnerType::Project(p) = spec.runner_type
            && !self.projects.iter().any(|(id, _)| *id == p)
        {
            return Err(Error::Config(format!(
                "project {p}: not a project of this Pod"
            )));
        }
        let token = self.issue(TokenKind::Runner, "glrt-")?;
        let id = {
            let mut inner = self.lock();
            inner.next_runner += 1;
            let id = inner.next_runner;
            inner.runners.insert(token.clone(), id);
            inner.classes.entry(spec.matcher()).or_default().insert(id);
            inner.runner_info.insert(
                id,
                Runner {
                    id,
                    token: token.clone(),
                    spec,
                    contacted_at: None,
                },
            );
            id
        };
        self.queues.tick(&token);
        Ok((id, token))
    }

    /// The runner `token` authenticates.
    pub fn runner(&self, token: &str) -> Owner<u64> {
        let found = self.lock().runners.get(token).copied();
        self.owner(token, found)
    }

    /// A copy of runner `id`.
    pub fn runner_info(&self, id: u64) -> Option<Runner> {
        self.lock().runner_info.get(&id).cloned()
    }

    /// How many runners are registered.
    pub fn runners(&self) -> usize {
        self.lock().runners.len()
    }

    /// `Ci::Runner#heartbeat`: runner `id` talked to Rails now (`contacted_at`).
    pub fn heartbeat(&self, id: u64) {
        if let Some(r) = self.lock().runner_info.get_mut(&id) {
            r.contacted_at = Some(Instant::now());
        }
    }

    /// `current_runner_manager`: the runner `runner` runs on `system_id`
    /// (`params.fetch(:system_id, '<legacy>')`, `lib/api/ci/helpers/runner.rb`).
    pub fn ensure_manager(&self, runner: u64, system_id: &str) {
        self.lock().managers.insert((runner, system_id.to_owned()));
    }

    /// Remove a runner manager: whether there was one.
    pub fn remove_manager(&self, runner: u64, system_id: &str) -> bool {
        self.lock().managers.remove(&(runner, system_id.to_owned()))
    }

    /// Forget a runner (its queue key expires by itself, as in Redis).
    pub fn unregister(&self, token: &str) -> bool {
        let mut inner = self.lock();
        let Some(id) = inner.runners.remove(token) else {
            return false;
        };
        if let Some(r) = inner.runner_info.remove(&id) {
            let matcher = r.spec.matcher();
            if let Some(ids) = inner.classes.get_mut(&matcher) {
                ids.remove(&id);
                if ids.is_empty() {
                    inner.classes.remove(&matcher);
                }
            }
        }
        true
    }

    /// Replace a runner's token: the new token.
    pub fn reset_token(&self, token: &str) -> Result<Option<String>, Error> {
        let new = self.issue(TokenKind::Runner, "glrt-")?;
        let mut inner = self.lock();
        let Some(id) = inner.runners.remove(token) else {
            return Ok(None);
        };
        inner.runners.insert(new.clone(), id);
        if let Some(r) = inner.runner_info.get_mut(&id) {
            r.token.clone_from(&new);
        }
        Ok(Some(new))
    }

    /// `tick_runner_queue` of every runner (what Rails does when runners change):
    /// how many keys were ticked.
    pub fn tick_all(&self) -> usize {
        let tokens: Vec<String> = self.lock().runners.keys().cloned().collect();
        for t in &tokens {
            self.queues.tick(t);
        }
        tokens.len()
    }

    /// `Ci::UpdateBuildQueueService#tick_for(build, runners.with_recent_runner_queue)`:
    /// `pick_build!` ticks the key of every recently seen runner that matches
    /// `build`. How many keys were ticked.
    pub(super) fn tick_for(&self, build: &BuildMatcher) -> usize {
        let now = Instant::now();
        let tokens: Vec<String> = {
            let inner = self.lock();
            inner
                .classes
                .iter()
                .filter(|(m, _)| m.matches(build))
                .flat_map(|(_, ids)| ids.iter())
                .filter_map(|id| inner.runner_info.get(id))
                .filter(|r| {
                    r.contacted_at
                        .is_some_and(|c| now.duration_since(c) < RECENT)
                })
                .map(|r| r.token.clone())
                .collect()
        };
        for t in &tokens {
            self.queues.tick(t);
        }
        tokens.len()
    }

    /// What runner `id` accepts (`None`: no such runner).
    pub(super) fn matcher(&self, id: u64) -> Option<RunnerMatcher> {
        self.lock().runner_info.get(&id).map(|r| r.spec.matcher())
    }
}

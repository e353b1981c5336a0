//! A Pod's workspaces and its agents' workspaces configurations, as Rails keeps them
//! in the `workspaces` and `workspaces_agent_configs` tables, with the model rules
//! of `ee/app/models/remote_development/workspace.rb`:
//!
//! - create (`ee/lib/remote_development/workspace_operations/create/`): the agent
//!   needs a workspaces configuration ("Agent must have an associated workspaces
//!   agent config") that is enabled ("Agent must have the 'enabled' flag set to
//!   true"), within its per-user and total quotas (`-1` unlimited, `0` none);
//!   names `workspace-<agent>-<user>-<6 random [a-z0-9]>`
//!   (`creator_bootstrapper.rb`), namespace `gl-rd-ns-<agent>-<user>-<random>` or
//!   the agent's `shared_namespace`; URL
//!   `https://<editor port>-<name>.<dns zone>/?folder=%2Fprojects%2F<project>`;
//!   desired `Running`, actual `CreationRequested`. Failures are worded as
//!   `Gitlab::Fp::MessageSupport` words `WorkspaceCreateFailed`: `Workspace create
//!   failed: <full messages joined by ",  ">`.
//! - update: a desired state that is `Terminated` never changes (`Workspace update
//!   failed: Desired state is 'Terminated', and cannot be updated. Create a new
//!   workspace instead.`); a change touches `desired_state_updated_at`.
//! - the lifecycle rules of the reconcile pipeline are in [`super::reconcile`]; they
//!   run in a [`Txn`], one lock over the whole request, as Rails' request runs in
//!   one database transaction's worth of writes.
//!
//! Time comes from a [`Clock`] that tests can move. Every write gets a stamp
//! strictly later than the previous one (`max(clock, last + 1µs)`), as database
//! timestamps of successive writes are distinct, so "updated since the last
//! response" never ties.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use thiserror::Error;

use super::model::{ActualState, DesiredState, Workspace, WorkspaceSpec, WorkspacesAgentConfig};

/// Store errors, worded as Rails' services word them.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum StoreError {
    /// No workspace of that id.
    #[error("404 Workspace Not Found")]
    NotFound(u64),
    /// A create refused (`Workspace create failed: …`).
    #[error("Workspace create failed: {0}")]
    Create(String),
    /// An update refused (`Workspace update failed: …`).
    #[error("Workspace update failed: {0}")]
    Update(String),
}

/// The namespace prefix of per-workspace namespaces (`NAMESPACE_PREFIX`).
pub const NAMESPACE_PREFIX: &str = "gl-rd-ns";
/// Where a workspace's project is checked out (`WORKSPACE_DATA_VOLUME_PATH`).
pub const PROJECTS_DIR: &str = "/projects";
/// Length of the random part of a workspace's name (`RANDOM_STRING_LENGTH`).
pub const RANDOM_STRING_LENGTH: usize = 6;

/// The store's time: the system clock (moved by an offset) or a manual one. Unix
/// microseconds.
#[derive(Debug)]
pub struct Clock {
    manual: AtomicBool,
    /// Manual: the time; system: the offset added to the system clock.
    value: AtomicU64,
}

impl Clock {
    /// The system clock.
    pub fn system() -> Clock {
        Clock {
            manual: AtomicBool::new(false),
            value: AtomicU64::new(0),
        }
    }

    /// A clock standing at `micros` until moved.
    pub fn manual(micros: u64) -> Clock {
        Clock {
            manual: AtomicBool::new(true),
            value: AtomicU64::new(micros),
        }
    }

    /// Now, in Unix microseconds.
    pub fn now(&self) -> u64 {
        let v = self.value.load(Ordering::SeqCst);
        if self.manual.load(Ordering::SeqCst) {
            v
        } else {
            let sys = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64);
            sys.saturating_add(v)
        }
    }

    /// Move the clock forward by `by` (both kinds).
    pub fn advance(&self, by: Duration) {
        self.value
            .fetch_add(by.as_micros() as u64, Ordering::SeqCst);
    }
}

/// A workspace to create.
#[derive(Clone, Debug)]
pub struct NewWorkspace {
    /// The agent to run it.
    pub agent_id: i64,
    /// Its owner.
    pub user_id: u64,
    /// What it runs.
    pub spec: WorkspaceSpec,
}

/// The tables.
#[derive(Default)]
pub(crate) struct Inner {
    pub(crate) workspaces: BTreeMap<u64, Workspace>,
    pub(crate) by_name: HashMap<String, u64>,
    pub(crate) configs: BTreeMap<i64, WorkspacesAgentConfig>,
    next_id: u64,
    last_stamp: u64,
}

/// One request's access to the tables, under the store's lock.
pub struct Txn<'a> {
    pub(crate) inner: &'a mut Inner,
    clock: &'a Clock,
}

impl Txn<'_> {
    /// The clock's time, for "has this passed?" questions (no stamp taken).
    pub fn now(&self) -> u64 {
        self.clock.now()
    }

    /// A write's timestamp: now, and strictly later than every earlier stamp.
    pub fn stamp(&mut self) -> u64 {
        let t = self.clock.now().max(self.inner.last_stamp + 1);
        self.inner.last_stamp = t;
        t
    }

    /// Agent `agent_id`'s workspaces configuration.
    pub fn agent_config(&self, agent_id: i64) -> Option<&WorkspacesAgentConfig> {
        self.inner.configs.get(&agent_id)
    }

    /// The id of agent `agent_id`'s workspace called `name`.
    pub fn id_by_name(&self, agent_id: i64, name: &str) -> Option<u64> {
        let id = *self.inner.by_name.get(name)?;
        (self.inner.workspaces.get(&id)?.agent_id == agent_id).then_some(id)
    }

    /// Agent `agent_id`'s workspaces, by id.
    pub fn agent_workspaces(&self, agent_id: i64) -> impl Iterator<Item = &Workspace> {
        self.inner
            .workspaces
            .values()
            .filter(move |w| w.agent_id == agent_id)
    }

    /// Workspace `id`.
    pub fn get(&self, id: u64) -> Option<&Workspace> {
        self.inner.workspaces.get(&id)
    }

    /// Workspace `id`, to change.
    pub fn get_mut(&mut self, id: u64) -> Option<&mut Workspace> {
        self.inner.workspaces.get_mut(&id)
    }
}

/// A Pod's workspaces.
pub struct WorkspaceStore {
    clock: Clock,
    inner: Mutex<Inner>,
}

impl Default for WorkspaceStore {
    fn default() -> Self {
        WorkspaceStore::new(Clock::system())
    }
}

/// `SecureRandom.alphanumeric(n).downcase`: `n` characters of `[a-z0-9]`.
fn random_string(n: usize) -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(n);
    while out.len() < n {
        for b in podgate_tokens::gitlab::random_bytes() {
            // Reject the top of the range so every character is equally likely.
            if (b as usize) < 252 && out.len() < n {
                out.push(CHARS[b as usize % 36] as char);
            }
        }
    }
    out
}

/// `{folder: dir}.to_query`'s value: `/` and other reserved bytes percent-encoded.
fn query_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl WorkspaceStore {
    /// An empty store on `clock`.
    pub fn new(clock: Clock) -> WorkspaceStore {
        WorkspaceStore {
            clock,
            inner: Mutex::default(),
        }
    }

    /// Its clock (tests move it).
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run `f` with the tables locked.
    pub fn transaction<R>(&self, f: impl FnOnce(&mut Txn<'_>) -> R) -> R {
        let mut inner = self.lock();
        let mut txn = Txn {
            inner: &mut inner,
            clock: &self.clock,
        };
        f(&mut txn)
    }

    /// Store (replace) an agent's workspaces configuration.
    pub fn put_agent_config(&self, config: WorkspacesAgentConfig) {
        self.lock().configs.insert(config.agent_id, config);
    }

    /// Agent `agent_id`'s workspaces configuration.
    pub fn agent_config(&self, agent_id: i64) -> Option<WorkspacesAgentConfig> {
        self.lock().configs.get(&agent_id).cloned()
    }

    /// Create a workspace for `new.agent_id`; `project_name` is the project's path
    /// (its checkout folder is `/projects/<project_name>`).
    pub fn create(&self, new: NewWorkspace, project_name: &str) -> Result<Workspace, StoreError> {
        self.transaction(|txn| {
            let Some(config) = txn.agent_config(new.agent_id).cloned() else {
                return Err(StoreError::Create(
                    "Agent must have an associated workspaces agent config".into(),
                ));
            };
            let mut errors = Vec::new();
            if !config.enabled {
                errors.push("Agent must have the 'enabled' flag set to true".to_owned());
            }
            // Quotas count workspaces whose desired state is not Terminated.
            let live: Vec<&Workspace> = txn
                .agent_workspaces(new.agent_id)
                .filter(|w| w.desired_state != DesiredState::Terminated)
                .collect();
            let mine = live.iter().filter(|w| w.user_id == new.user_id).count();
            let per_user = config.workspaces_per_user_quota;
            if per_user != -1 && (per_user == 0 || mine as i64 >= per_user) {
                errors.push(format!(
                    "You cannot create a workspace because you already have '{mine}' existing \
                     workspaces for the given agent which has a per user quota of '{per_user}' workspaces"
                ));
            }
            let total = config.workspaces_quota;
            if total != -1 && (total == 0 || live.len() as i64 >= total) {
                errors.push(format!(
                    "You cannot create a workspace because there are already '{}' existing \
                     workspaces for the given agent which has a quota of '{total}' workspaces",
                    live.len()
                ));
            }
            if !errors.is_empty() {
                return Err(StoreError::Create(errors.join(",  ")));
            }
            let (name, random) = loop {
                let random = random_string(RANDOM_STRING_LENGTH);
                let name = format!("workspace-{}-{}-{random}", new.agent_id, new.user_id);
                if !txn.inner.by_name.contains_key(&name) {
                    break (name, random);
                }
            };
            let namespace = if config.shared_namespace.is_empty() {
                format!("{NAMESPACE_PREFIX}-{}-{}-{random}", new.agent_id, new.user_id)
            } else {
                config.shared_namespace.clone()
            };
            let url = format!(
                "https://{}-{name}.{}/?folder={}",
                new.spec.editor_port,
                config.dns_zone,
                query_escape(&format!("{PROJECTS_DIR}/{project_name}"))
            );
            let now = txn.stamp();
            txn.inner.next_id += 1;
            let ws = Workspace {
                id: txn.inner.next_id,
                name,
                namespace,
                agent_id: new.agent_id,
                user_id: new.user_id,
                spec: new.spec,
                url,
                desired_state: DesiredState::Running,
                desired_state_updated_at: now,
                actual_state: ActualState::CreationRequested,
                actual_state_updated_at: now,
                responded_to_agent_at: None,
                deployment_resource_version: None,
                force_include_all_resources: false,
                created_at: now,
            };
            txn.inner.by_name.insert(ws.name.clone(), ws.id);
            txn.inner.workspaces.insert(ws.id, ws.clone());
            Ok(ws)
        })
    }

    /// Workspace `id`.
    pub fn get(&self, id: u64) -> Option<Workspace> {
        self.lock().workspaces.get(&id).cloned()
    }

    /// The workspace called `name`, whatever its agent (Rails'
    /// `Workspace.find_by_name`, as `authorize_user_access` looks it up).
    pub fn find_by_name(&self, name: &str) -> Option<Workspace> {
        let inner = self.lock();
        let id = inner.by_name.get(name)?;
        inner.workspaces.get(id).cloned()
    }

    /// Every workspace, by id.
    pub fn list(&self) -> Vec<Workspace> {
        self.lock().workspaces.values().cloned().collect()
    }

    /// Set workspace `id`'s desired state (`Terminated` is final).
    pub fn set_desired_state(&self, id: u64, state: DesiredState) -> Result<Workspace, StoreError> {
        self.transaction(|txn| {
            let now = txn.stamp();
            let ws = txn.get_mut(id).ok_or(StoreError::NotFound(id))?;
            ws.set_desired_state(state, now)
                .map_err(|m| StoreError::Update(m.to_owned()))?;
            Ok(ws.clone())
        })
    }

    /// How many workspaces are in each (desired, actual) pair.
    pub fn counts(&self) -> BTreeMap<(&'static str, &'static str), i64> {
        let mut out = BTreeMap::new();
        for w in self.lock().workspaces.values() {
            *out.entry((w.desired_state.as_str(), w.actual_state.as_str()))
                .or_insert(0) += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests;

//! Finished jobs past the window of [`super::FINISHED_KEPT`]: what a late request
//! for one still needs, in about 70 bytes instead of the whole job.
//!
//! GitLab keeps a finished job for good, but moves what is large out of the hot
//! path (`Ci::ArchiveTraceService` puts the trace in object storage; artifacts
//! expire). A simulator that kept every job whole grows ~1.3 KB per job, which a
//! 30-minute soak (`scripts/drills.sh` R7, ~9,000 jobs per Pod) reads as the Pod's
//! memory growing: the simulator's, not the system's under test. An archived job
//! still authenticates its token (a late update is a 403 with `Job-Status`, and a
//! second final state a duplicate in the ledger), still shows its state, runner,
//! project and trace length and CRC; its name, script, tags, trace text and
//! artifact are gone (the artifact file is deleted, as an expired artifact).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use super::jobs::{Job, JobState};

/// What is kept of an archived job.
#[derive(Clone, Copy, Debug)]
struct Kept {
    state: JobState,
    runner: Option<u64>,
    project: u64,
    trace_len: u64,
    trace_crc: u32,
}

/// Archived jobs by id, and their tokens by hash.
#[derive(Debug, Default)]
pub(super) struct Archive {
    jobs: HashMap<u64, Kept>,
    tokens: HashMap<u64, u64>,
}

/// A token's key in the archive: 64 bits of SipHash (fixed keys). Two tokens
/// colliding would let one authenticate as the other's finished job, which a
/// finished job refuses anyway (403); at 2^-64 per pair it is not expected.
fn token_key(token: &str) -> u64 {
    let mut h = DefaultHasher::new();
    token.hash(&mut h);
    h.finish()
}

impl Archive {
    /// Archive `job` (finished), deleting its artifact file.
    pub(super) fn insert(&mut self, job: Job) {
        debug_assert!(job.state.is_final());
        if let Some(a) = &job.artifact {
            let _ = std::fs::remove_file(&a.path);
        }
        self.tokens.insert(token_key(&job.token), job.id);
        self.jobs.insert(
            job.id,
            Kept {
                state: job.state,
                runner: job.runner,
                project: job.project,
                trace_len: job.trace_len,
                trace_crc: job.trace_crc,
            },
        );
    }

    /// The job a token names, if it is archived.
    pub(super) fn by_token(&self, token: &str) -> Option<u64> {
        self.tokens.get(&token_key(token)).copied()
    }

    /// An archived job's state.
    pub(super) fn state(&self, id: u64) -> Option<JobState> {
        self.jobs.get(&id).map(|k| k.state)
    }

    /// What is left of archived job `id`, as a [`Job`] with the rest empty.
    pub(super) fn job(&self, id: u64) -> Option<Job> {
        let k = self.jobs.get(&id)?;
        Some(Job {
            id,
            name: String::new(),
            stage: String::new(),
            script: Vec::new(),
            image: None,
            artifact_paths: Vec::new(),
            tags: Vec::new(),
            project: k.project,
            token: String::new(),
            state: k.state,
            runner: k.runner,
            trace_len: k.trace_len,
            trace_crc: k.trace_crc,
            trace: Vec::new(),
            dependencies: Vec::new(),
            artifact: None,
        })
    }

    /// Whether job `id` is archived.
    pub(super) fn contains(&self, id: u64) -> bool {
        self.jobs.contains_key(&id)
    }
}

//! The per-job ledger the fault drills (`scripts/drills.sh`) check: for every job the
//! Pod handed out, which runner got it (in a `jobs/request` 201), every final-state
//! update (`PUT jobs/:id` with `success` or `failed`) that authenticated as the job,
//! and counts over all of it. Served as JSON on the control API (`GET
//! /-/podsim/ledger`).
//!
//! "Finished exactly once" is what a drill wants to see: one pick and one accepted
//! final state per job, no final update for a job already finished (a *duplicate*:
//! a runner that sent its result twice, or two runners that ran the same job).

use std::collections::BTreeMap;

use serde::Serialize;

use super::JobState;

/// One job's line in the ledger.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LedgerEntry {
    /// Job id.
    pub id: u64,
    /// The runners a `jobs/request` answer gave the job to, in order (one; more would
    /// mean the Pod handed it out twice).
    pub picked_by: Vec<u64>,
    /// The final states accepted for it (`PUT jobs/:id` answered 200): one once
    /// finished.
    pub finals: Vec<&'static str>,
    /// Final-state updates refused because the job had finished already.
    pub duplicates: u64,
}

/// Counts over the ledger.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LedgerSummary {
    /// Jobs handed to a runner at least once.
    pub picked: u64,
    /// Jobs handed out more than once (0 unless the Pod is wrong).
    pub picked_twice: u64,
    /// Jobs with an accepted final state.
    pub finished: u64,
    /// Jobs with exactly one accepted final state and no duplicate.
    pub finished_once: u64,
    /// Jobs finished `success`.
    pub success: u64,
    /// Jobs finished `failed`.
    pub failed: u64,
    /// Jobs picked and not finished (running, or lost with their runner).
    pub unfinished: u64,
    /// Final-state updates refused because the job had finished already.
    pub duplicates: u64,
}

/// The ledger: kept inside [`super::State`]'s lock, so a pick and its ledger line are
/// one step.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    jobs: BTreeMap<u64, LedgerEntry>,
}

impl Ledger {
    fn entry(&mut self, id: u64) -> &mut LedgerEntry {
        self.jobs.entry(id).or_insert_with(|| LedgerEntry {
            id,
            ..LedgerEntry::default()
        })
    }

    /// Job `id` went to `runner` in a `jobs/request` answer.
    pub(super) fn picked(&mut self, id: u64, runner: u64) {
        self.entry(id).picked_by.push(runner);
    }

    /// A final state was accepted for job `id`.
    pub(super) fn finished(&mut self, id: u64, state: JobState) {
        debug_assert!(state.is_final());
        self.entry(id).finals.push(state.as_str());
    }

    /// A final state was refused for job `id`: it had finished already.
    pub(super) fn duplicate(&mut self, id: u64) {
        self.entry(id).duplicates += 1;
    }

    pub(super) fn summary(&self) -> LedgerSummary {
        let mut s = LedgerSummary::default();
        for e in self.jobs.values() {
            let picked = !e.picked_by.is_empty();
            s.picked += u64::from(picked);
            s.picked_twice += u64::from(e.picked_by.len() > 1);
            s.finished += u64::from(!e.finals.is_empty());
            s.finished_once += u64::from(e.finals.len() == 1 && e.duplicates == 0);
            s.unfinished += u64::from(picked && e.finals.is_empty());
            s.duplicates += e.duplicates;
            match e.finals.first() {
                Some(&"success") => s.success += 1,
                Some(_) => s.failed += 1,
                None => {}
            }
        }
        s
    }

    pub(super) fn entries(&self) -> Vec<LedgerEntry> {
        self.jobs.values().cloned().collect()
    }
}

//! Storage behind the registry: in memory or Redis, one set of operations.

use std::sync::Arc;

use podgate_tokens::PodId;

use crate::presence::AgentEvent;
use crate::topology::{Pod, PodState, Topology};

pub mod memory;
pub mod redis;

/// What a backend tells its subscribers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum BackendEvent {
    /// Presence changed somewhere.
    Agent(AgentEvent),
    /// The topology reached this version.
    Topology(u64),
    /// Events may have been lost (reconnect): re-read state.
    Resync,
}

/// One change to the topology.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopologyChange {
    /// Add or replace a Pod.
    Put(Pod),
    /// Remove a Pod.
    Remove(PodId),
    /// Change a Pod's state.
    SetState(PodId, PodState),
    /// Choose the default ("legacy") Pod.
    SetDefault(Option<PodId>),
}

impl TopologyChange {
    /// Apply to a snapshot, giving the next one (version + 1).
    pub(crate) fn apply(&self, t: &Topology) -> crate::Result<Topology> {
        let mut next = t.clone();
        next.version = t.version + 1;
        match self {
            TopologyChange::Put(pod) => {
                let problems = pod.problems(&format!("pod {}", pod.id));
                if !problems.is_empty() {
                    return Err(crate::Error::Config {
                        origin: "pod".into(),
                        problems,
                    });
                }
                next.pods.insert(pod.id, Arc::new(pod.clone()));
            }
            TopologyChange::Remove(id) => {
                next.pods.remove(id).ok_or(crate::Error::NoSuchPod(*id))?;
                if next.default_pod == Some(*id) {
                    next.default_pod = None;
                }
            }
            TopologyChange::SetState(id, state) => {
                let pod = next.pods.get_mut(id).ok_or(crate::Error::NoSuchPod(*id))?;
                Arc::make_mut(pod).state = *state;
            }
            TopologyChange::SetDefault(id) => {
                if let Some(id) = id
                    && !next.pods.contains_key(id)
                {
                    return Err(crate::Error::NoSuchPod(*id));
                }
                next.default_pod = *id;
            }
        }
        let problems = next.problems();
        if !problems.is_empty() {
            return Err(crate::Error::Config {
                origin: "topology".into(),
                problems,
            });
        }
        Ok(next)
    }
}

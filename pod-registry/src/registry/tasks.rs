//! The registry's background tasks: periodic work and the backend event pump.

use std::sync::Weak;
use std::time::Duration;

use backon::BackoffBuilder as _;
use tokio::sync::broadcast;

use super::{Inner, Registry, reconnect_backoff};
use crate::backend::BackendEvent;
use crate::presence::AgentEvent;

/// Run `f` every `period` while the registry lives.
pub(super) async fn every<F, Fut>(weak: Weak<Inner>, period: Duration, f: F)
where
    F: Fn(Registry) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick fires at once
    loop {
        tick.tick().await;
        let Some(inner) = weak.upgrade() else { return };
        f(Registry { inner }).await;
    }
}

/// Forward backend events to listeners; reload the topology on change; refresh
/// everything owned after a resubscription (Redis may have restarted empty).
pub(super) async fn event_pump(weak: Weak<Inner>, mut rx: broadcast::Receiver<BackendEvent>) {
    loop {
        let ev = rx.recv().await;
        let Some(inner) = weak.upgrade() else { return };
        let r = Registry { inner };
        match ev {
            Ok(BackendEvent::Agent(e)) => {
                let label = match &e {
                    AgentEvent::Connected { .. } => "connected",
                    AgentEvent::Disconnected { .. } => "disconnected",
                    AgentEvent::Resync => "resync",
                };
                r.metrics().events.with_label_values(&[label]).inc();
                let _ = r.inner.events.send(e);
            }
            Ok(BackendEvent::Kas(payload)) => {
                let _ = r.inner.kas_events.send(payload);
            }
            Ok(BackendEvent::Topology(v)) => {
                if v != r.topology().version {
                    let _ = r.reload_topology().await;
                }
            }
            Ok(BackendEvent::Resync) | Err(broadcast::error::RecvError::Lagged(_)) => {
                let _ = r.inner.events.send(AgentEvent::Resync);
                let backoff_max = r.inner.config.backoff_max;
                drop(r);
                // After a Redis restart the command connection may still hold the
                // old server's socket: its first call fails and reconnects. Try again
                // at once (six tries, with the reconnect back-off), so the topology,
                // everything owned and `backend_up` are back now, not at the next
                // periodic tick. Each try takes the registry anew and none holds it
                // while sleeping: a registry dropped meanwhile stops here instead of
                // refreshing on.
                for delay in reconnect_backoff(backoff_max).build().take(6) {
                    let Some(inner) = weak.upgrade() else { return };
                    let r = Registry { inner };
                    let topology = r.reload_topology().await.is_ok();
                    if topology && r.refresh().await.is_ok() {
                        break;
                    }
                    drop(r);
                    tokio::time::sleep(delay).await;
                }
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

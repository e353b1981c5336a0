//! The pub/sub subscriber: one subscription to the event channels (agents,
//! topology, kas events), kept alive by reconnecting with back-off, its messages
//! forwarded as [`BackendEvent`]s.

use std::sync::Arc;
use std::time::Duration;

use backon::BackoffBuilder as _;
use futures_util::StreamExt as _;
use tokio::sync::broadcast;

use super::RedisTarget;
use super::keys::Keys;
use crate::backend::BackendEvent;
use crate::error::Error;
use crate::metrics::Health;
use crate::presence::AgentEvent;
use crate::registry::reconnect_backoff;

/// Keep one pub/sub subscription alive: (re)connect with back-off (pauses up to
/// `backoff_max`, with jitter), subscribe to the channels, forward messages, and
/// announce `Resync` after every (re)subscription. Every failure is recorded in
/// `health` (logged once per outage, counted every time); a subscription that held
/// starts the back-off over.
pub(super) async fn subscriber(
    target: RedisTarget,
    keys: Keys,
    events: broadcast::Sender<BackendEvent>,
    health: Arc<Health>,
    backoff_max: Duration,
) {
    let agents = keys.agents_channel();
    let topology = keys.topology_channel();
    let kas = keys.kas_events_channel();
    let urls = match &target {
        RedisTarget::Standalone(u) => vec![u.clone()],
        RedisTarget::Cluster(nodes) => nodes.clone(),
    };
    let backoff = reconnect_backoff(backoff_max);
    let mut delays = backoff.build();
    let mut next = 0usize;
    loop {
        // In a Cluster every node relays PUBLISH, so any reachable node will do.
        let url = &urls[next % urls.len()];
        next += 1;
        let res: redis::RedisResult<redis::aio::PubSub> = async {
            let mut ps = redis::Client::open(url.as_str())?
                .get_async_pubsub()
                .await?;
            ps.subscribe(&agents).await?;
            ps.subscribe(&topology).await?;
            ps.subscribe(&kas).await?;
            Ok(ps)
        }
        .await;
        match res {
            Ok(mut ps) => {
                health.record::<()>("subscribe", &Ok(()));
                delays = backoff.build();
                let _ = events.send(BackendEvent::Resync);
                let mut msgs = ps.on_message();
                while let Some(msg) = msgs.next().await {
                    let channel = msg.get_channel_name();
                    let payload = msg.get_payload_bytes();
                    let event = if channel == agents {
                        serde_json::from_slice::<AgentEvent>(payload)
                            .ok()
                            .map(BackendEvent::Agent)
                    } else if channel == kas {
                        Some(BackendEvent::Kas(payload.into()))
                    } else if channel == topology {
                        std::str::from_utf8(payload)
                            .ok()
                            .and_then(|s| s.parse().ok())
                            .map(BackendEvent::Topology)
                    } else {
                        None
                    };
                    match event {
                        Some(e) => {
                            let _ = events.send(e);
                        }
                        None => health.corrupt(channel, "unreadable event"),
                    }
                }
                // The stream ended: the connection is gone.
                let err = redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "pub/sub connection closed",
                ));
                health.record::<()>("subscribe", &Err(Error::backend("subscribe")(err)));
            }
            Err(e) => {
                health.record::<()>("subscribe", &Err(Error::backend("subscribe")(e)));
            }
        }
        // With no limit on attempts the delays never run out.
        tokio::time::sleep(delays.next().unwrap_or(backoff_max)).await;
    }
}

//! The kas → kas channels ([`Channels`]): one per kas address, made once and connected
//! lazily, with a connect timeout and HTTP/2 keep-alive; bounded, the oldest dropped
//! first.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tonic::Status;
use tonic::transport::{Channel, Endpoint};

use super::CONNECT_TIMEOUT;

/// kas → kas channels kept at most; past it the least recently made one is dropped
/// (a kas that left the fleet is never asked again, so its channel would stay).
pub const MAX_CHANNELS: usize = 256;

/// HTTP/2 keep-alive pings on kas → kas channels: a silent peer is dropped after
/// `KEEPALIVE_INTERVAL + KEEPALIVE_TIMEOUT`, ending the calls on it.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// kas → kas channels by address, with the order they were made in (for eviction).
#[derive(Default)]
pub(super) struct Channels(Mutex<ByKas>);

#[derive(Default)]
struct ByKas {
    by_kas: HashMap<String, Channel>,
    made: VecDeque<String>,
}

impl Channels {
    fn lock(&self) -> std::sync::MutexGuard<'_, ByKas> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The channel to kas `kas` (made once, lazily connected, with timeouts). At
    /// most [`MAX_CHANNELS`] are kept.
    pub(super) fn get(&self, kas: &str) -> Result<Channel, Status> {
        let mut channels = self.lock();
        if let Some(c) = channels.by_kas.get(kas) {
            return Ok(c.clone());
        }
        let c = Endpoint::from_shared(format!("http://{kas}"))
            .map_err(|_| Status::internal("a kas address in the registry is not a URI"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .connect_lazy();
        while channels.by_kas.len() >= MAX_CHANNELS {
            let Some(oldest) = channels.made.pop_front() else {
                break;
            };
            channels.by_kas.remove(&oldest);
        }
        channels.by_kas.insert(kas.to_owned(), c.clone());
        channels.made.push_back(kas.to_owned());
        Ok(c)
    }

    /// How many channels are kept.
    pub(super) fn len(&self) -> usize {
        self.lock().by_kas.len()
    }

    /// Forget the channel to a kas that failed (a new one reconnects from scratch).
    pub(super) fn forget(&self, kas: &str) {
        let mut channels = self.lock();
        if channels.by_kas.remove(kas).is_some() {
            channels.made.retain(|k| k != kas);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Channels to kas instances that come and go are not kept forever.
    #[tokio::test]
    async fn kas_channels_are_bounded() {
        let channels = Channels::default();
        let kas = |i: usize| format!("10.0.{}.{}:8155", i / 250, i % 250);
        for i in 0..(MAX_CHANNELS + 50) {
            channels.get(&kas(i)).unwrap();
        }
        assert_eq!(channels.len(), MAX_CHANNELS);
        // The oldest went first; the newest is kept.
        let newest = kas(MAX_CHANNELS + 49);
        assert!(channels.lock().by_kas.contains_key(&newest));
        assert!(!channels.lock().by_kas.contains_key(&kas(0)));
        channels.forget(&newest);
        assert_eq!(channels.len(), MAX_CHANNELS - 1);
    }
}

//! One Redis's watch on its runners' queue keys, as Workhorse's `KeyWatcher`
//! (`workhorse/internal/redis/keywatcher.go` in gitlabhq/gitlabhq) keeps it, for
//! every runner at once:
//!
//! - **one pub/sub connection** with one `PSUBSCRIBE
//!   workhorse:notifications:runner:build_queue:*` (Workhorse subscribes per key on its
//!   one connection; a pattern covers every runner without a subscription per
//!   hold), and a multiplexed connection for `GET`;
//! - a **waiter map** keyed by runner token: a notification wakes every poll held on
//!   that token with the published value (`notifySubscribers`); one nobody waits on is
//!   dropped (`drop-message`);
//! - **fail open**: no connection → no waiter can register (`addSubscription`'s "no
//!   redis connection"); when the connection breaks every held waiter is woken with
//!   `Wake::Broken` (`receivePubSubStream` closing its channels) and the hold fails
//!   open. A `PING` every [`PING_EVERY`] (and after a failed `GET`) notices a
//!   connection that died without closing;
//! - **reconnect** with back-off, 100 ms doubling to [`BACKOFF_MAX`], each pause
//!   lengthened by up to as much again at random (`reconnectBackoff`; `backoff`),
//!   the pattern subscribed before any waiter may register.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::BackoffBuilder;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use tokio::sync::{Notify, oneshot};

use super::{CHANNEL_PREFIX, Error, KEY_PREFIX, WatchMetrics};

/// The pattern every queue key's notifications match.
pub const PATTERN: &str = "workhorse:notifications:runner:build_queue:*";
/// Connecting (each connection) may take this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// A `GET` (or `PING`) may take this long; then the hold fails open.
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
/// How often both connections are pinged.
pub const PING_EVERY: Duration = Duration::from_secs(5);
/// First pause before reconnecting (Workhorse: 100 ms).
const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest pause before reconnecting (Workhorse: 60 s; shorter here, since every hold
/// fails open meanwhile).
pub const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// Why a held call was woken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Wake {
    /// A notification on its key carried this value.
    Value(Vec<u8>),
    /// The connection broke (or the watch was stopped): fail open.
    Broken,
    /// The holder is shutting down: answer now (Workhorse's `kw.shutdown`).
    Shutdown,
}

struct Slot {
    id: u64,
    tx: oneshot::Sender<Wake>,
}

#[derive(Default)]
struct State {
    /// `Some` while the subscription is live: waiters may register.
    conn: Option<MultiplexedConnection>,
    /// Held calls by runner token.
    waiters: HashMap<String, Vec<Slot>>,
    next_id: u64,
    /// No more waiters, ever.
    stopped: bool,
}

impl State {
    /// Wake every waiter with `why` and forget them all.
    fn wake_all(&mut self, why: &Wake) {
        for (_, slots) in self.waiters.drain() {
            for s in slots {
                let _ = s.tx.send(why.clone());
            }
        }
    }
}

/// What the watch task and the holds share.
pub(crate) struct Shared {
    /// Names the watch in logs.
    pub(crate) name: String,
    state: Mutex<State>,
    /// Ping now (a `GET` failed).
    suspect: Notify,
    pub(crate) metrics: WatchMetrics,
}

impl Shared {
    pub(crate) fn new(name: String, metrics: WatchMetrics) -> Shared {
        Shared {
            name,
            state: Mutex::default(),
            suspect: Notify::new(),
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `addSubscription`: register a waiter on `token`'s key, and a connection for
    /// its `GET`. `None`: no live subscription (forward).
    pub(crate) fn register(
        self: &Arc<Self>,
        token: &str,
    ) -> Option<(Registration, MultiplexedConnection)> {
        let mut st = self.lock();
        let conn = st.conn.clone()?;
        let id = st.next_id;
        st.next_id += 1;
        let (tx, rx) = oneshot::channel();
        st.waiters
            .entry(token.to_owned())
            .or_default()
            .push(Slot { id, tx });
        drop(st);
        Some((
            Registration {
                shared: self.clone(),
                token: token.to_owned(),
                id,
                rx,
            },
            conn,
        ))
    }

    /// A `GET` failed: check the connections now.
    pub(crate) fn suspect(&self) {
        self.suspect.notify_one();
    }

    /// `notifySubscribers`: wake the waiters on `token` with `value`.
    fn notify(&self, token: &str, value: &[u8]) {
        let slots = self.lock().waiters.remove(token);
        for s in slots.into_iter().flatten() {
            let _ = s.tx.send(Wake::Value(value.to_vec()));
        }
    }

    /// The subscription is live: waiters may register.
    fn up(&self, conn: MultiplexedConnection) {
        let mut st = self.lock();
        if !st.stopped {
            st.conn = Some(conn);
            self.metrics.up.set(1);
        }
    }

    /// The subscription is gone: every held call fails open, none registers.
    fn down(&self) {
        let mut st = self.lock();
        st.conn = None;
        st.wake_all(&Wake::Broken);
        self.metrics.up.set(0);
    }

    /// No more waiters; wake the held ones with `why`.
    pub(crate) fn stop(&self, why: &Wake) {
        let mut st = self.lock();
        st.stopped = true;
        st.conn = None;
        st.wake_all(why);
    }

    /// Calls registered now.
    pub(crate) fn waiting(&self) -> usize {
        self.lock().waiters.values().map(Vec::len).sum()
    }
}

/// A registered waiter; dropping it unregisters it (`delSubscription`).
pub(crate) struct Registration {
    shared: Arc<Shared>,
    token: String,
    id: u64,
    /// Woken once.
    pub(crate) rx: oneshot::Receiver<Wake>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        if let Some(slots) = st.waiters.get_mut(&self.token) {
            slots.retain(|s| s.id != self.id);
            if slots.is_empty() {
                st.waiters.remove(&self.token);
            }
        }
    }
}

/// The pauses before each reconnection attempt, from [`BACKOFF_MIN`] doubling to
/// [`BACKOFF_MAX`], each lengthened by up to as much again at random so watches whose
/// Redis came back together do not reconnect in step. Endless.
pub(crate) fn backoff() -> impl Iterator<Item = Duration> {
    backon::ExponentialBuilder::new()
        .with_min_delay(BACKOFF_MIN)
        .with_max_delay(BACKOFF_MAX)
        .with_jitter()
        .without_max_times()
        .build()
}

async fn connect(
    client: &redis::Client,
) -> Result<(redis::aio::PubSub, MultiplexedConnection), Error> {
    let timed = |what: &'static str| move |_| Error::Timeout(what);
    let mut pubsub = tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_pubsub())
        .await
        .map_err(timed("connect (pub/sub)"))??;
    tokio::time::timeout(RESPONSE_TIMEOUT, pubsub.psubscribe(PATTERN))
        .await
        .map_err(timed("PSUBSCRIBE"))??;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT));
    let conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    Ok((pubsub, conn))
}

/// `PING` both connections.
async fn ping(
    sink: &mut redis::aio::PubSubSink,
    conn: &mut MultiplexedConnection,
) -> Result<(), Error> {
    tokio::time::timeout(RESPONSE_TIMEOUT, sink.ping::<redis::Value>())
        .await
        .map_err(|_| Error::Timeout("PING (pub/sub)"))??;
    redis::cmd("PING").query_async::<redis::Value>(conn).await?;
    Ok(())
}

/// `Process`: keep the subscription, deliver notifications, reconnect.
pub(crate) async fn run(url: String, shared: Arc<Shared>) {
    let pod = shared.name.clone();
    let client = match redis::Client::open(url.as_str()) {
        Ok(c) => c,
        Err(e) => {
            shared.metrics.errors.inc();
            tracing::error!(%pod, error = %e, "runner queue: the Redis URL cannot be used; holds fail open");
            return;
        }
    };
    let mut pauses = backoff();
    let mut failing = false;
    loop {
        let (pubsub, mut conn) = match connect(&client).await {
            Ok(c) => c,
            Err(e) => {
                shared.metrics.errors.inc();
                let backoff = pauses.next().unwrap_or(BACKOFF_MAX);
                if failing {
                    tracing::debug!(%pod, error = %e, retry_in = ?backoff, "runner queue: Redis still unreachable");
                } else {
                    tracing::warn!(%pod, error = %e, retry_in = ?backoff, "runner queue: Redis unreachable; holds fail open until it answers");
                }
                failing = true;
                tokio::time::sleep(backoff).await;
                continue;
            }
        };
        let (mut sink, mut stream) = pubsub.split();
        shared.up(conn.clone());
        pauses = backoff();
        failing = false;
        tracing::info!(%pod, "runner queue: watching the runners' queue keys");
        let mut tick = tokio::time::interval(PING_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.reset();
        let broken = loop {
            tokio::select! {
                msg = stream.next() => match msg {
                    Some(msg) => {
                        if let Some(token) = msg.get_channel_name().strip_prefix(CHANNEL_PREFIX).and_then(|k| k.strip_prefix(KEY_PREFIX)) {
                            shared.notify(token, msg.get_payload_bytes());
                            // After delivery: a count seen means its waiters were woken.
                            shared.metrics.notifications.inc();
                        }
                    }
                    None => break Error::Closed,
                },
                _ = tick.tick() => {
                    if let Err(e) = ping(&mut sink, &mut conn).await {
                        break e;
                    }
                }
                () = shared.suspect.notified() => {
                    if let Err(e) = ping(&mut sink, &mut conn).await {
                        break e;
                    }
                }
            }
        };
        shared.down();
        shared.metrics.errors.inc();
        let backoff = pauses.next().unwrap_or(BACKOFF_MAX);
        tracing::warn!(%pod, error = %broken, retry_in = ?backoff, "runner queue: Redis connection lost; held calls failed open");
        drop((sink, stream, conn));
        tokio::time::sleep(backoff).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_to_the_cap_with_at_most_as_much_again_at_random() {
        let mut base = BACKOFF_MIN;
        for pause in backoff().take(12) {
            assert!(pause >= base && pause <= base * 2, "{base:?}: {pause:?}");
            base = (base * 2).min(BACKOFF_MAX);
        }
    }
}

//! The Redis mirror of the runners' queue keys (`PodSimConfig::redis`): every write
//! of [`RunnerQueues`](super::RunnerQueues) is replayed exactly as
//! `Gitlab::Workhorse.set_key_and_notify` (`lib/gitlab/workhorse.rb`) does it:
//! `SET runner:build_queue:<token> <value> EX 3600 [NX]`, then, when it was set,
//! `PUBLISH workhorse:notifications:runner:build_queue:<token> <value>`.
//!
//! A request never waits on Redis: writes are queued (bounded) to one background task
//! that pipelines them in order. A broken connection is retried with back-off (the
//! writes wait and are sent once it is back), logged and counted in
//! `podsim_redis_errors_total`; a full queue drops the write and counts it too. Logs
//! name tokens by their fingerprint only.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus::IntCounter;
use redis::Value;
use tokio::sync::mpsc;

use super::QueueError;
use super::keys::{RUNNER_QUEUE_EXPIRY, channel, key};

/// Writes waiting for Redis at most; more are dropped (and counted).
const QUEUE_LIMIT: usize = 1 << 18;
/// Writes sent in one pipeline at most.
const BATCH: usize = 512;
/// First and longest pause before reconnecting.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// One write to mirror.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// `SET key value EX 3600 [NX]`, then `PUBLISH` when set.
    Set {
        /// The runner token of the key.
        token: String,
        /// The new value.
        value: String,
        /// Only when missing (`ensure_runner_queue_value`).
        nx: bool,
    },
    /// The `PUBLISH` of an `NX` set that succeeded.
    Publish {
        /// The runner token of the key.
        token: String,
        /// The value set.
        value: String,
    },
}

/// Where [`RunnerQueues`](super::RunnerQueues) sends its writes.
#[derive(Clone, Debug)]
pub(crate) struct Mirror {
    tx: mpsc::Sender<Op>,
    errors: IntCounter,
    dropped: Arc<AtomicU64>,
}

impl Mirror {
    /// Queue `op`; a full queue drops it (counted, logged now and then).
    pub(crate) fn send(&self, op: Op) {
        match self.tx.try_send(op) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.errors.inc();
                let n = self.dropped.fetch_add(1, Ordering::Relaxed);
                if n.is_power_of_two() || n == 0 {
                    tracing::warn!(
                        dropped = n + 1,
                        "pod-sim: the Redis mirror is behind; queue key writes dropped"
                    );
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }
}

/// Start mirroring into the Redis at `url`: the handle to send writes to, and the
/// task (abort it to stop).
pub(crate) fn spawn(
    url: &str,
    errors: IntCounter,
) -> Result<(Mirror, tokio::task::JoinHandle<()>), QueueError> {
    let client = redis::Client::open(url).map_err(|e| QueueError::RedisUrl(e.to_string()))?;
    let (tx, rx) = mpsc::channel(QUEUE_LIMIT);
    let task = tokio::spawn(run(client, rx, errors.clone()));
    Ok((
        Mirror {
            tx,
            errors,
            dropped: Arc::default(),
        },
        task,
    ))
}

/// Whether `e` means the connection is gone (reconnect and send again) rather than
/// a command Redis refused (sending it again would fail the same way).
fn broken(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout() || e.is_connection_refusal()
}

fn describe(ops: &VecDeque<Op>) -> String {
    match ops.front() {
        Some(Op::Set { token, .. } | Op::Publish { token, .. }) => format!(
            "{} write(s), first for runner {}",
            ops.len(),
            podgate_tokens::fingerprint(token)
        ),
        None => "no writes".into(),
    }
}

async fn run(client: redis::Client, mut rx: mpsc::Receiver<Op>, errors: IntCounter) {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(5)));
    let mut pending: VecDeque<Op> = VecDeque::new();
    let mut backoff = BACKOFF_MIN;
    'connect: loop {
        let mut conn = match client
            .get_multiplexed_async_connection_with_config(&config)
            .await
        {
            Ok(c) => c,
            Err(e) => {
                errors.inc();
                tracing::warn!(error = %e, retry_in = ?backoff, "pod-sim: cannot reach the Redis mirror");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        loop {
            if pending.is_empty() {
                match rx.recv().await {
                    Some(op) => pending.push_back(op),
                    None => return,
                }
            }
            while pending.len() < BATCH {
                match rx.try_recv() {
                    Ok(op) => pending.push_back(op),
                    Err(_) => break,
                }
            }
            // One pipeline, in order, up to and including the first `NX` set: the
            // `PUBLISH` after it depends on its answer.
            let mut pipe = redis::pipe();
            let mut sent = 0;
            let mut nx = None;
            for op in &pending {
                sent += 1;
                match op {
                    Op::Set {
                        token,
                        value,
                        nx: false,
                    } => {
                        pipe.cmd("SET")
                            .arg(key(token))
                            .arg(value)
                            .arg("EX")
                            .arg(RUNNER_QUEUE_EXPIRY.as_secs())
                            .ignore();
                        pipe.cmd("PUBLISH").arg(channel(token)).arg(value).ignore();
                    }
                    Op::Publish { token, value } => {
                        pipe.cmd("PUBLISH").arg(channel(token)).arg(value).ignore();
                    }
                    Op::Set {
                        token,
                        value,
                        nx: true,
                    } => {
                        pipe.cmd("SET")
                            .arg(key(token))
                            .arg(value)
                            .arg("EX")
                            .arg(RUNNER_QUEUE_EXPIRY.as_secs())
                            .arg("NX");
                        nx = Some((token.clone(), value.clone()));
                        break;
                    }
                }
            }
            let result: redis::RedisResult<Vec<Value>> = pipe.query_async(&mut conn).await;
            match result {
                Ok(replies) => {
                    backoff = BACKOFF_MIN;
                    pending.drain(..sent);
                    if let Some((token, value)) = nx
                        && replies.last().is_some_and(|v| !matches!(v, Value::Nil))
                    {
                        pending.push_front(Op::Publish { token, value });
                    }
                }
                Err(e) if broken(&e) => {
                    errors.inc();
                    tracing::warn!(
                        error = %e,
                        waiting = %describe(&pending),
                        retry_in = ?backoff,
                        "pod-sim: the Redis mirror connection broke; reconnecting"
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue 'connect;
                }
                Err(e) => {
                    errors.inc();
                    let batch: VecDeque<Op> = pending.drain(..sent).collect();
                    tracing::warn!(
                        error = %e,
                        dropped = %describe(&batch),
                        "pod-sim: Redis refused queue key writes"
                    );
                }
            }
        }
    }
}

//! A bound on the requests in flight to one upstream address of a Pod's web pool,
//! HAProxy's per-server `maxconn` with its queue (`timeout queue`): past
//! `upstreams.max_connections_per_address`, a request waits for one of them to
//! finish, up to `upstreams.queue_timeout_ms`, then gets the 503 + `Retry-After` a
//! Pod that cannot take it gets.
//!
//! Each request in flight holds one upstream connection (HTTP/1: one request per
//! connection at a time), so the bound is on the connections in use or being
//! opened; idle ones kept for reuse are apart (at most 128 per address, as
//! pingora's pool). Without it a burst of clients became a burst of connects: at
//! 14,000 req/s from a standing start the fast path opened connections to one Pod
//! faster than it accepted them, its listen backlog overflowed, and 38 requests got
//! a 503 after the 2 s connect timeout (drill R7), while the Pod's memory rose with
//! its connection count. Queued, they wait for a connection the Pod has already
//! accepted.
//!
//! Only the web pools are bounded: kas pools carry agentk's long-lived streams,
//! whose number is the number of agents.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pingora::{Error, ErrorType};
use podgate_tokens::PodId;
use prometheus::{IntCounter, IntGauge};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::METRICS;

/// The bound of every address, and each address's slots.
#[derive(Debug)]
pub(crate) struct ConnLimits {
    /// Requests in flight per address; 0: unbounded.
    max: usize,
    queue_timeout: Duration,
    /// Tells this one's entries apart in each thread's cache ([`RECENT`]).
    id: u64,
    by_addr: Mutex<Known>,
}

/// What requests so far met: each address's slots, each (Pod, address)'s entry.
#[derive(Debug, Default)]
struct Known {
    slots: HashMap<SocketAddr, Arc<Semaphore>>,
    /// Looked up per request once per thread, then from [`RECENT`]: foldhash (the
    /// keys are the topology's).
    entries: HashMap<(PodId, SocketAddr), Arc<Entry>, foldhash::fast::RandomState>,
}

/// Entries each thread met last, by (limits, Pod, address): a request finds its
/// entry without the shared table's lock. A proxy thread sees few (Pods ×
/// addresses); past [`RECENT_KEPT`], the oldest goes.
const RECENT_KEPT: usize = 64;

/// A cached entry: its limits' id, Pod and address, and the entry.
type Recent = (u64, PodId, SocketAddr, Arc<Entry>);

thread_local! {
    static RECENT: RefCell<Vec<Recent>> = const { RefCell::new(Vec::new()) };
}

/// Tells [`ConnLimits`] apart ([`ConnLimits::id`]).
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// One (Pod, address): its address's slots and the Pod's metric children, resolved
/// once (no label hashing per request) and shared by its requests.
#[derive(Debug)]
struct Entry {
    slots: Arc<Semaphore>,
    in_use: IntGauge,
    queue: IntGauge,
    admitted: IntCounter,
    timed_out: IntCounter,
}

/// A request's place among its address's requests in flight; given back when
/// dropped (the request finished, or its connection failed and the next attempt
/// takes another).
#[derive(Debug)]
pub(crate) struct Slot {
    held: Option<(OwnedSemaphorePermit, Arc<Entry>)>,
    queued: bool,
}

impl Slot {
    /// Whether the request waited in the queue for it.
    pub(crate) fn queued(&self) -> bool {
        self.queued
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some((_, entry)) = &self.held {
            entry.in_use.dec();
        }
    }
}

/// One request in `podgate_proxy_upstream_queue` until dropped.
struct Waiting<'a>(&'a IntGauge);

impl<'a> Waiting<'a> {
    fn new(queue: &'a IntGauge) -> Self {
        queue.inc();
        Waiting(queue)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl ConnLimits {
    pub(crate) fn new(max: usize, queue_timeout: Duration) -> Self {
        ConnLimits {
            max,
            queue_timeout,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            by_addr: Mutex::default(),
        }
    }

    /// A slot for a request to `addr` of `pod`: at once while the address has fewer
    /// than the bound in flight, else after waiting for one to finish (counted in
    /// `podgate_proxy_upstream_queued_total`). Past the queue timeout, an error
    /// pingora's types call `ConnectTimedout`, answered 503 + `Retry-After`
    /// ([`crate::answer`]).
    pub(crate) async fn admit(&self, pod: PodId, addr: SocketAddr) -> Result<Slot, Box<Error>> {
        if self.max == 0 {
            return Ok(Slot {
                held: None,
                queued: false,
            });
        }
        let entry = self.entry(pod, addr);
        let (permit, queued) = match entry.slots.clone().try_acquire_owned() {
            Ok(p) => (p, false),
            Err(_) => {
                // Counted while it waits, also when the wait is dropped (its client
                // went away and the request with it).
                let waiting = Waiting::new(&entry.queue);
                let waited =
                    tokio::time::timeout(self.queue_timeout, entry.slots.clone().acquire_owned())
                        .await;
                drop(waiting);
                match waited {
                    Ok(Ok(p)) => {
                        entry.admitted.inc();
                        (p, true)
                    }
                    // Never closed; timed out.
                    _ => {
                        entry.timed_out.inc();
                        return Err(Error::explain(
                            ErrorType::ConnectTimedout,
                            format!(
                                "{} requests in flight to {addr} (upstreams.max_connections_per_address); none finished within {} ms",
                                self.max,
                                self.queue_timeout.as_millis()
                            ),
                        )
                        .into_up());
                    }
                }
            }
        };
        entry.in_use.inc();
        Ok(Slot {
            held: Some((permit, entry)),
            queued,
        })
    }

    /// The entry of (`pod`, `addr`): from this thread's cache, else the shared
    /// table (created on first use).
    fn entry(&self, pod: PodId, addr: SocketAddr) -> Arc<Entry> {
        let cached = RECENT.with_borrow(|recent| {
            recent
                .iter()
                .find(|(id, p, a, _)| *id == self.id && *p == pod && *a == addr)
                .map(|(.., e)| e.clone())
        });
        if let Some(e) = cached {
            return e;
        }
        let e = self.shared_entry(pod, addr);
        RECENT.with_borrow_mut(|recent| {
            if recent.len() == RECENT_KEPT {
                recent.remove(0);
            }
            recent.push((self.id, pod, addr, e.clone()));
        });
        e
    }

    fn shared_entry(&self, pod: PodId, addr: SocketAddr) -> Arc<Entry> {
        let mut known = self.by_addr.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = known.entries.get(&(pod, addr)) {
            return e.clone();
        }
        let max = self.max;
        let slots = known
            .slots
            .entry(addr)
            .or_insert_with(|| Arc::new(Semaphore::new(max)))
            .clone();
        let label = pod.to_string();
        let queued = |result| {
            METRICS
                .upstream_queued
                .with_label_values(&[label.as_str(), result])
        };
        let e = Arc::new(Entry {
            slots,
            in_use: METRICS.upstream_in_use.with_label_values(&[label.as_str()]),
            queue: METRICS.upstream_queue.with_label_values(&[label.as_str()]),
            admitted: queued("admitted"),
            timed_out: queued("timed_out"),
        });
        known.entries.insert((pod, addr), e.clone());
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_use(pod: PodId) -> IntGauge {
        METRICS
            .upstream_in_use
            .with_label_values(&[pod.to_string().as_str()])
    }

    fn addr(n: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, n], 8080))
    }

    fn queued(pod: PodId, result: &str) -> u64 {
        METRICS
            .upstream_queued
            .with_label_values(&[pod.to_string().as_str(), result])
            .get()
    }

    /// Past the bound a request waits for one in flight to finish, and gets its
    /// slot as soon as it does; another address is not held up meanwhile.
    #[tokio::test(start_paused = true)]
    async fn past_the_bound_a_request_waits_for_one_to_finish() {
        let pod = PodId::new(9101).unwrap();
        let limits = Arc::new(ConnLimits::new(2, Duration::from_secs(2)));
        let a = limits.admit(pod, addr(1)).await.unwrap();
        let _b = limits.admit(pod, addr(1)).await.unwrap();
        assert_eq!(in_use(pod).get(), 2);
        let waiting = tokio::spawn({
            let limits = limits.clone();
            async move { limits.admit(pod, addr(1)).await }
        });
        // Another address has its own slots.
        let _other = limits.admit(pod, addr(2)).await.unwrap();
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "admitted past the bound");
        let queue = METRICS.upstream_queue.with_label_values(&["9101"]);
        assert_eq!(queue.get(), 1);
        drop(a);
        let c = waiting.await.unwrap().expect("admitted once one finished");
        assert_eq!(queued(pod, "admitted"), 1);
        assert_eq!(queue.get(), 0);
        assert_eq!(in_use(pod).get(), 3);
        drop(c);
        assert_eq!(in_use(pod).get(), 2);
    }

    /// Nothing finishes within the queue timeout: a ConnectTimedout naming the
    /// bound, which the proxy answers 503 + Retry-After.
    #[tokio::test(start_paused = true)]
    async fn a_request_queued_past_the_timeout_is_refused() {
        let pod = PodId::new(9102).unwrap();
        let limits = ConnLimits::new(1, Duration::from_millis(1500));
        let _a = limits.admit(pod, addr(1)).await.unwrap();
        let started = tokio::time::Instant::now();
        let e = limits.admit(pod, addr(1)).await.unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_millis(1500));
        assert_eq!(e.etype(), &ErrorType::ConnectTimedout);
        assert!(
            e.to_string()
                .contains("max_connections_per_address); none finished within 1500 ms"),
            "{e}"
        );
        assert_eq!(queued(pod, "timed_out"), 1);
        assert_eq!(in_use(pod).get(), 1);
        let (status, answer) = crate::answer::Answer::for_error(&e);
        assert_eq!(status, 503);
        assert!(answer.is_some());
    }

    /// A request for `addr(1)` of `pod`, spawned, once it waits in the queue; and
    /// `pod`'s queue gauge.
    async fn queued_request(
        limits: &Arc<ConnLimits>,
        pod: PodId,
    ) -> (tokio::task::JoinHandle<Result<Slot, Box<Error>>>, IntGauge) {
        let request = tokio::spawn({
            let limits = limits.clone();
            async move { limits.admit(pod, addr(1)).await }
        });
        let queue = METRICS
            .upstream_queue
            .with_label_values(&[pod.to_string().as_str()]);
        while queue.get() == 0 {
            tokio::task::yield_now().await;
        }
        (request, queue)
    }

    /// A slot freed while requests are queued goes to the first of them (tokio's
    /// semaphore is fair): a request that comes meanwhile queues behind.
    #[tokio::test(start_paused = true)]
    async fn a_queued_request_is_not_overtaken() {
        let pod = PodId::new(9105).unwrap();
        let limits = Arc::new(ConnLimits::new(1, Duration::from_secs(60)));
        let a = limits.admit(pod, addr(1)).await.unwrap();
        assert!(!a.queued());
        let (first, _) = queued_request(&limits, pod).await;
        // Freed, and asked for at once, before the queued request runs again.
        drop(a);
        let mut late = std::pin::pin!(limits.admit(pod, addr(1)));
        assert!(
            futures_util::poll!(late.as_mut()).is_pending(),
            "a new request took the slot freed for the queued one"
        );
        let first = first.await.unwrap().expect("the queued request's slot");
        assert!(first.queued());
        drop(first);
        let late = late.await.unwrap();
        assert!(late.queued());
    }

    /// Each thread's cache tells the limits apart: another one's slots for the same
    /// Pod and address are its own.
    #[tokio::test]
    async fn two_limits_on_one_thread_keep_their_own_slots() {
        let pod = PodId::new(9106).unwrap();
        let (one, two) = (
            ConnLimits::new(1, Duration::from_millis(1)),
            ConnLimits::new(1, Duration::from_millis(1)),
        );
        let _a = one.admit(pod, addr(1)).await.unwrap();
        let b = two.admit(pod, addr(1)).await.expect("its own slot");
        assert!(!b.queued());
        assert!(
            one.admit(pod, addr(1)).await.is_err(),
            "the first one's bound"
        );
    }

    /// A request dropped while it waits (its client went away) leaves the queue.
    #[tokio::test(start_paused = true)]
    async fn a_wait_dropped_leaves_the_queue() {
        let pod = PodId::new(9104).unwrap();
        let limits = Arc::new(ConnLimits::new(1, Duration::from_secs(60)));
        let _a = limits.admit(pod, addr(1)).await.unwrap();
        let (waiting, queue) = queued_request(&limits, pod).await;
        waiting.abort();
        assert!(waiting.await.unwrap_err().is_cancelled());
        assert_eq!(queue.get(), 0, "a dropped wait stayed in the queue");
    }

    #[tokio::test]
    async fn zero_is_unbounded() {
        let pod = PodId::new(9103).unwrap();
        let limits = ConnLimits::new(0, Duration::from_millis(1));
        let held: Vec<Slot> =
            futures_util::future::try_join_all((0..10_000).map(|_| limits.admit(pod, addr(1))))
                .await
                .unwrap();
        assert_eq!(held.len(), 10_000);
        assert_eq!(in_use(pod).get(), 0, "unbounded slots are not counted");
    }
}

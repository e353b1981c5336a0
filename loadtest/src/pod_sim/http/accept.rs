//! The accept loop, with back-off on errors.
//!
//! `accept` fails for reasons that last (out of descriptors: `EMFILE`, `ENFILE`;
//! out of memory: `ENOBUFS`, `ENOMEM`), and retrying at once turns one into a busy
//! loop at 100 % CPU that starves the connections being served, which are what would
//! free the descriptors. So each failure in a row waits twice as long as the last,
//! from [`MIN`] to [`MAX`], and an accepted connection starts over (mini-redis
//! `src/server.rs`, hyper's and linkerd's accept loops). The log says when the wait
//! changes and when accepting works again, not once per failure.

use std::future::Future;
use std::io;
use std::time::Duration;

/// The first wait after a failed `accept`.
pub(crate) const MIN: Duration = Duration::from_millis(10);
/// The longest wait between failed `accept`s.
pub(crate) const MAX: Duration = Duration::from_secs(1);

/// The wait before the next `accept` after failures in a row.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
    failures: u64,
    /// The wait last reported by [`Backoff::failed`] (`None`: none since the last
    /// success).
    last: Option<Duration>,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: MIN,
            failures: 0,
            last: None,
        }
    }
}

impl Backoff {
    /// One more failure: how long to wait, and whether that differs from the last
    /// wait (worth a log line).
    pub(crate) fn failed(&mut self) -> (Duration, bool) {
        let wait = self.next;
        let changed = self.last.replace(wait) != Some(wait);
        self.failures += 1;
        self.next = (wait * 2).min(MAX);
        (wait, changed)
    }

    /// An accepted connection: the failures in a row that ended (0: none), and the
    /// wait starts over.
    pub(crate) fn succeeded(&mut self) -> u64 {
        self.next = MIN;
        self.last = None;
        std::mem::take(&mut self.failures)
    }
}

/// Accept with `accept` and hand each connection to `serve`, forever; failures wait
/// as [`Backoff`] says.
pub(crate) async fn accept_loop<C, F, Fut>(mut accept: F, mut serve: impl FnMut(C))
where
    F: FnMut() -> Fut,
    Fut: Future<Output = io::Result<C>>,
{
    let mut backoff = Backoff::default();
    loop {
        match accept().await {
            Ok(conn) => {
                let failures = backoff.succeeded();
                if failures > 0 {
                    tracing::info!(failures, "pod-sim: accepting again");
                }
                serve(conn);
            }
            Err(e) => {
                let (wait, changed) = backoff.failed();
                if changed {
                    tracing::warn!(error = %e, wait_ms = wait.as_millis() as u64, "pod-sim: accept failed; backing off");
                }
                tokio::time::sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::time::Instant;

    use super::*;

    /// One call of the fake accept source.
    type Accepting = std::pin::Pin<Box<dyn Future<Output = io::Result<u32>> + Send>>;

    fn emfile() -> io::Error {
        io::Error::from_raw_os_error(24)
    }

    /// An accept source that answers from `script` (`true`: a connection), then
    /// fails forever; records when each call came. Past `limit` calls it never
    /// answers again, so a loop that retries at once still ends the test (with the
    /// count showing it).
    fn source(
        script: Vec<bool>,
        limit: usize,
    ) -> (Arc<Mutex<Vec<Instant>>>, impl FnMut() -> Accepting) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let seen = calls.clone();
        let accept = move || {
            let n = {
                let mut c = seen.lock().unwrap();
                c.push(Instant::now());
                c.len()
            };
            let ok = script.get(n - 1).copied().unwrap_or(false);
            Box::pin(async move {
                if n > limit {
                    std::future::pending::<()>().await;
                }
                tokio::task::yield_now().await;
                if ok { Ok(n as u32) } else { Err(emfile()) }
            }) as Accepting
        };
        (calls, accept)
    }

    #[tokio::test(start_paused = true)]
    async fn failing_accepts_back_off_to_one_per_second() {
        let (calls, accept) = source(Vec::new(), 1000);
        let _ = tokio::time::timeout(Duration::from_secs(10), accept_loop(accept, |_| {})).await;
        let calls = calls.lock().unwrap().clone();
        // 10, 20, …, 640 ms (1.27 s in 8 calls), then one a second: 17 in 10 s.
        // Retrying at once would make 1,000 here; a fixed 50 ms wait 200.
        assert!(
            (15..=18).contains(&calls.len()),
            "{} accept calls in 10 s",
            calls.len()
        );
        let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(gaps[0], MIN);
        assert_eq!(gaps[1], MIN * 2);
        assert!(gaps.iter().all(|g| *g <= MAX), "{gaps:?}");
        assert_eq!(*gaps.last().unwrap(), MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn an_accepted_connection_resets_the_back_off() {
        // Five failures, a connection, failures again.
        let script = vec![false, false, false, false, false, true];
        let (calls, accept) = source(script, 1000);
        let served = Arc::new(Mutex::new(Vec::new()));
        let s = served.clone();
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            accept_loop(accept, move |c| s.lock().unwrap().push(c)),
        )
        .await;
        assert_eq!(*served.lock().unwrap(), vec![6]);
        let calls = calls.lock().unwrap().clone();
        let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1] - w[0]).collect();
        // 10, 20, 40, 80, 160 ms; then the connection (no wait); then 10 ms again.
        assert_eq!(
            &gaps[..7],
            &[
                MIN,
                MIN * 2,
                MIN * 4,
                MIN * 8,
                MIN * 16,
                Duration::ZERO,
                MIN
            ]
        );
    }

    #[test]
    fn the_log_says_when_the_wait_changes_only() {
        let mut b = Backoff::default();
        let changes: Vec<bool> = (0..10).map(|_| b.failed().1).collect();
        // 10 ms … 640 ms change, then 1 s (a change), then 1 s again: quiet.
        assert_eq!(
            changes,
            [true, true, true, true, true, true, true, true, false, false]
        );
        assert_eq!(b.succeeded(), 10);
        assert_eq!(b.succeeded(), 0);
        assert_eq!(b.failed(), (MIN, true));
    }
}

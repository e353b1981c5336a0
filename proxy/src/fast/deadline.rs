//! One timer per connection for the fast path's waits (the keep-alive between
//! requests, the Pod's answer), re-armed lazily.
//!
//! A wait's deadline is almost always later than the one before it (each is "now
//! plus the same minute"), so setting it only records the instant: the tokio timer
//! stays armed where it was, and when it fires before the recorded deadline it is
//! moved there and waited on again, at most once per wait that outlives its first
//! timer. Registering a tokio timer per wait instead cost a timer-wheel insertion
//! and removal per request, and, whenever the new timer was earlier than the
//! one the event loop last went to sleep on, a write to the runtime's eventfd and
//! a wasted `epoll_wait` (tokio's `time::Handle::reregister` wakes the driver
//! even from its own thread): about one request in ten on `scripts/bench-proxy.sh`.

use std::pin::Pin;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// A connection's deadline and the timer behind it.
pub(super) struct Deadline {
    timer: Pin<Box<Sleep>>,
    at: Instant,
}

impl Deadline {
    /// A deadline `after` from now (not armed until first waited on).
    pub(super) fn new(after: Duration) -> Self {
        let at = Instant::now() + after;
        Deadline {
            timer: Box::pin(tokio::time::sleep_until(at)),
            at,
        }
    }

    /// The next wait ends `after` from `now` (a reading of the runtime's clock,
    /// [`crate::service::now`], taken just before), else from now.
    pub(super) fn set(&mut self, now: Option<std::time::Instant>, after: Duration) {
        self.at = now.map_or_else(Instant::now, Instant::from_std) + after;
    }

    /// Resolves at the deadline last [`Deadline::set`]. Cancel-safe: dropped
    /// unfinished, the timer stays armed for the next wait.
    pub(super) async fn passed(&mut self) {
        loop {
            if self.timer.deadline() > self.at {
                // An earlier deadline than the armed one: the timer moves now.
                self.timer.as_mut().reset(self.at);
            }
            self.timer.as_mut().await;
            if Instant::now() >= self.at {
                return;
            }
            self.timer.as_mut().reset(self.at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    const MINUTE: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn a_deadline_set_later_is_kept_not_the_first_one() {
        let start = Instant::now();
        let mut d = Deadline::new(MINUTE);
        // The timer is armed for the first minute, then the deadline moves on.
        assert!(d.passed().now_or_never().is_none());
        tokio::time::advance(Duration::from_secs(30)).await;
        d.set(None, MINUTE);
        tokio::time::timeout(Duration::from_secs(89), d.passed())
            .await
            .expect("passed at 90 s");
        assert_eq!(start.elapsed(), Duration::from_secs(90));
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_deadline_moves_the_armed_timer() {
        let start = Instant::now();
        let mut d = Deadline::new(MINUTE);
        assert!(d.passed().now_or_never().is_none());
        d.set(None, Duration::from_secs(5));
        d.passed().await;
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_cut_short_leaves_the_next_one_its_own_deadline() {
        let start = Instant::now();
        let mut d = Deadline::new(MINUTE);
        // A wait ended by something else (the request came) after 10 s.
        assert!(
            tokio::time::timeout(Duration::from_secs(10), d.passed())
                .await
                .is_err()
        );
        d.set(None, MINUTE);
        d.passed().await;
        assert_eq!(start.elapsed(), Duration::from_secs(70));
    }
}

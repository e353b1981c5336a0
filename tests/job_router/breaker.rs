//! gitlab-runner's circuit breaker, as the Job Router client configures it: written
//! from `helpers/circuitbreaker/circuitbreaker.go` (gitlabhq/gitlab-runner, commit
//! d79f3e7b) and the constants of `router/client.go`.
//!
//! Three consecutive failures trip it, but only once they have persisted for the
//! failure grace (5 s), so that a burst of calls failing together (one shared
//! connection dropping) does not; open, it refuses calls for 30 s and then lets one
//! trial through (half-open) whose outcome closes or reopens it. Time is tokio's, so
//! tests drive it with paused time.
//!
//! Differences from the Go breaker: no Prometheus collector (the state is read with
//! [`Breaker::state`]); the state is an enum carrying its own data where Go keeps a
//! failure count and two times beside a state number (Go leaves the count stale while
//! open and resets it on the only way back to closed, `RecordSuccess`, which comes to
//! the same).

use std::sync::Mutex;

use tokio::time::{Duration, Instant};

/// Consecutive failures that trip the breaker (`routerBreakerFailureThreshold`).
pub const FAILURE_THRESHOLD: u32 = 3;
/// How long it stays open before a trial call (`routerBreakerOpenTimeout`).
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long failures must persist before they may trip it (`routerBreakerFailureGrace`).
pub const FAILURE_GRACE: Duration = Duration::from_secs(5);

/// What the breaker lets through (Go's `State`: 0 closed, 1 open, 2 half-open).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Calls flow.
    Closed,
    /// Calls are refused until the open timeout has passed.
    Open,
    /// One trial call is in flight; others are refused until it resolves.
    HalfOpen,
}

#[derive(Debug)]
enum Phase {
    /// `streak`: the consecutive failures so far and when the first of them came.
    Closed {
        streak: Option<(u32, Instant)>,
    },
    Open {
        since: Instant,
    },
    HalfOpen,
}

/// A circuit breaker; safe to share between tasks.
#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    open_timeout: Duration,
    failure_grace: Duration,
    phase: Mutex<Phase>,
}

impl Default for Breaker {
    /// The Job Router client's breaker (`router.NewClient`).
    fn default() -> Self {
        Breaker::new(FAILURE_THRESHOLD, OPEN_TIMEOUT, FAILURE_GRACE)
    }
}

impl Breaker {
    /// Opens after `threshold` consecutive failures spanning at least `failure_grace`;
    /// stays open `open_timeout` before a trial (`circuitbreaker.New` with
    /// `WithFailureGrace`).
    pub fn new(threshold: u32, open_timeout: Duration, failure_grace: Duration) -> Breaker {
        Breaker {
            threshold,
            open_timeout,
            failure_grace,
            phase: Mutex::new(Phase::Closed { streak: None }),
        }
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the next call may go ahead (`Allow`). Open, once the timeout has passed,
    /// it grants one trial and turns half-open; the caller must then record an outcome
    /// or [`abort`](Breaker::abort).
    pub fn allow(&self) -> bool {
        let mut phase = self.phase();
        match *phase {
            Phase::Closed { .. } => true,
            Phase::HalfOpen => false,
            Phase::Open { since } => {
                if since.elapsed() >= self.open_timeout {
                    *phase = Phase::HalfOpen;
                    true
                } else {
                    false
                }
            }
        }
    }

    /// Closes the breaker; true when this success ended a half-open trial
    /// (`RecordSuccess`'s `recovered`).
    pub fn record_success(&self) -> bool {
        let mut phase = self.phase();
        let recovered = matches!(*phase, Phase::HalfOpen);
        *phase = Phase::Closed { streak: None };
        recovered
    }

    /// Counts a failure; true when it tripped the breaker open: the threshold reached
    /// past the grace while closed, or the half-open trial failed (`RecordFailure`).
    pub fn record_failure(&self) -> bool {
        let mut phase = self.phase();
        let now = Instant::now();
        match *phase {
            Phase::Open { .. } => false,
            Phase::HalfOpen => {
                *phase = Phase::Open { since: now };
                true
            }
            Phase::Closed { streak } => {
                let (failures, first) = streak.map_or((1, now), |(n, first)| (n + 1, first));
                if failures >= self.threshold && now - first >= self.failure_grace {
                    *phase = Phase::Open { since: now };
                    true
                } else {
                    *phase = Phase::Closed {
                        streak: Some((failures, first)),
                    };
                    false
                }
            }
        }
    }

    /// Releases a call [`allow`](Breaker::allow) let through that never reached the
    /// router: a half-open trial goes back to open for another timeout (`Abort`).
    pub fn abort(&self) {
        let mut phase = self.phase();
        if matches!(*phase, Phase::HalfOpen) {
            *phase = Phase::Open {
                since: Instant::now(),
            };
        }
    }

    /// The current state (`State`).
    pub fn state(&self) -> State {
        match *self.phase() {
            Phase::Closed { .. } => State::Closed,
            Phase::Open { .. } => State::Open,
            Phase::HalfOpen => State::HalfOpen,
        }
    }
}

/// The breaker alone, on paused time (`helpers/circuitbreaker/circuitbreaker_test.go`
/// and `router/client_test.go`'s breaker cases, d79f3e7b).
mod tests {
    use super::*;
    use tokio::time::advance;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn three_failures_inside_the_grace_do_not_trip() {
        let b = Breaker::default();
        for _ in 0..3 {
            assert!(!b.record_failure());
            advance(Duration::from_secs(1)).await;
        }
        // A fourth, 4.999 s after the first: past the threshold, still inside the grace.
        advance(Duration::from_secs(2) - MS).await;
        assert!(!b.record_failure());
        assert_eq!(b.state(), State::Closed);
        assert!(b.allow());
    }

    #[tokio::test(start_paused = true)]
    async fn failures_persisting_past_the_grace_trip_on_the_next_one() {
        let b = Breaker::default();
        assert!(!b.record_failure());
        assert!(!b.record_failure());
        assert!(!b.record_failure());
        advance(FAILURE_GRACE).await;
        assert!(
            b.record_failure(),
            "the 4th failure, 5 s after the 1st, trips"
        );
        assert_eq!(b.state(), State::Open);
        assert!(!b.allow());
        // Open: more failures are not trips.
        assert!(!b.record_failure());
    }

    #[tokio::test(start_paused = true)]
    async fn the_grace_alone_does_not_trip_below_the_threshold() {
        let b = Breaker::default();
        assert!(!b.record_failure());
        advance(Duration::from_secs(60)).await;
        assert!(!b.record_failure());
        assert_eq!(b.state(), State::Closed);
        // The streak began 60 s ago: the third failure trips at once.
        assert!(b.record_failure());
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_starts_the_streak_and_its_grace_again() {
        let b = Breaker::default();
        assert!(!b.record_failure());
        assert!(!b.record_failure());
        advance(Duration::from_secs(10)).await;
        assert!(!b.record_success(), "closed: not a recovery");
        for _ in 0..3 {
            assert!(!b.record_failure());
        }
        advance(FAILURE_GRACE - MS).await;
        assert!(!b.record_failure());
        advance(MS).await;
        assert!(b.record_failure());
    }

    /// Trips `b` (threshold failures spanning the grace).
    async fn trip(b: &Breaker) {
        for _ in 0..FAILURE_THRESHOLD {
            b.record_failure();
        }
        advance(FAILURE_GRACE).await;
        assert!(b.record_failure());
    }

    #[tokio::test(start_paused = true)]
    async fn open_for_30_s_then_one_trial_whose_success_closes_it() {
        let b = Breaker::default();
        trip(&b).await;
        advance(OPEN_TIMEOUT - MS).await;
        assert!(!b.allow(), "still open 1 ms before the timeout");
        advance(MS).await;
        assert!(b.allow(), "the trial");
        assert_eq!(b.state(), State::HalfOpen);
        assert!(!b.allow(), "one trial at a time");
        assert!(b.record_success(), "the trial's success is a recovery");
        assert_eq!(b.state(), State::Closed);
        assert!(b.allow());
        // Closed again with a fresh streak: three quick failures do not trip.
        for _ in 0..FAILURE_THRESHOLD {
            assert!(!b.record_failure());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_trial_reopens_for_another_30_s() {
        let b = Breaker::default();
        trip(&b).await;
        advance(OPEN_TIMEOUT).await;
        assert!(b.allow());
        assert!(b.record_failure(), "a failed trial is a trip");
        assert_eq!(b.state(), State::Open);
        advance(OPEN_TIMEOUT - MS).await;
        assert!(!b.allow());
        advance(MS).await;
        assert!(b.allow());
    }

    #[tokio::test(start_paused = true)]
    async fn an_aborted_trial_waits_the_timeout_again() {
        let b = Breaker::default();
        trip(&b).await;
        advance(OPEN_TIMEOUT).await;
        assert!(b.allow());
        b.abort();
        assert_eq!(b.state(), State::Open);
        assert!(!b.allow());
        advance(OPEN_TIMEOUT).await;
        assert!(b.allow());
        // Abort outside a trial changes nothing.
        b.record_success();
        b.abort();
        assert_eq!(b.state(), State::Closed);
    }
}

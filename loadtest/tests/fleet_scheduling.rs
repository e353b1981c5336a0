//! The fleet schedules `jobs/request` as gitlab-runner's `commands/multi.go` does: an
//! idle runner asks once per `check_interval`; after a job it asks again at once when a
//! worker is idle (and not when none is); `request_concurrency` bounds its requests in
//! flight. Counts are asserted with generous bounds, never timings.

use crate::fleet_gitlab;

use std::time::Duration;

use fleet_gitlab::{GitLab, Reply, Running};

/// Idle runners whose polls Rails answers at once ask about once per
/// `check_interval`: with 4 runners, 200 ms and 3 s, about 15 requests each — never
/// more than the feeds that fit in the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_runner_asks_once_per_check_interval() {
    let gitlab = GitLab::start(|c| Reply::immediate(&format!("ticket-{}", c.n))).await;
    let mut config = gitlab.config(&["reg"], 4, Duration::from_secs(3));
    config.check_interval = Duration::from_millis(200);
    let report = Running::start(config).finish().await;

    let calls = gitlab.log(|l| l.calls.clone());
    assert_eq!(calls.len(), 4, "every runner polled: {calls:?}");
    for (token, n) in &calls {
        // Feeds at start + k × 200 ms while k × 200 ms < 3 s: at most 15.
        assert!((5..=15).contains(n), "{token} asked {n} times in 3 s");
    }
    let total: usize = calls.values().sum();
    let j = report.jobs_request;
    assert_eq!(j.no_content_immediate, j.total(), "{j:?}");
    assert!(j.total() as usize <= total && j.total() as usize + 4 >= total);
    assert_eq!(report.scheduler.requeues, 0);
    // Nothing to do but poll: the prediction is runners / check_interval.
    let e = report.expected();
    assert_eq!(e.polling_per_second, 20.0);
    assert!((0.4..=1.05).contains(&e.ratio), "{e:?}");
    let per_runner = report.per_runner_per_minute();
    assert_eq!(report.runner_requests_per_minute.len(), 4);
    // 300 a minute, plus one feed of rounding for a runner that started late.
    assert!(per_runner.p99 <= 400.0, "{per_runner:?}");
}

/// After a job the runner asks again at once, on its idle second worker: with a
/// `check_interval` of a minute, the second request can only be the requeue. (Counts
/// the fleet makes before its last answer arrives are asserted from its report; the
/// last answers themselves from the server's log, as the stop may cut them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_job_it_asks_again_at_once_when_a_worker_is_idle() {
    let gitlab = GitLab::start(|c| {
        if c.n == 0 {
            Reply::job(7)
        } else {
            Reply::held()
        }
    })
    .await;
    let mut config = gitlab.config(&["reg"], 1, Duration::from_secs(600));
    config.check_interval = Duration::from_secs(60);
    let fleet = Running::start(config);
    gitlab
        .wait_until("the re-request and the finished job", |l| {
            l.answered("request", 204) == 1 && l.count("update") == 2
        })
        .await;
    let report = fleet.stop().await;
    assert_eq!(gitlab.log(|l| l.count("request")), 2);
    assert_eq!(report.scheduler.requeues, 1, "{:?}", report.scheduler);
    assert_eq!(report.scheduler.feeds, 1, "{:?}", report.scheduler);
    assert_eq!(report.jobs_request.created, 1);
    assert_eq!(
        gitlab.log(|l| l.of("update")[1].body["state"].clone()),
        "success"
    );
}

/// With `concurrent = 1` the only worker runs the job: no immediate re-request; the
/// runner waits for its next feed (a minute away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_idle_worker_it_waits_for_the_next_feed() {
    let gitlab = GitLab::start(|c| {
        if c.n == 0 {
            Reply::job(8)
        } else {
            Reply::held()
        }
    })
    .await;
    let mut config = gitlab.config(&["reg"], 1, Duration::from_secs(600));
    config.check_interval = Duration::from_secs(60);
    config.concurrent = 1;
    let fleet = Running::start(config);
    gitlab
        .wait_until("the job's final update", |l| l.count("update") == 2)
        .await;
    let report = fleet.stop().await;
    assert_eq!(report.scheduler.requeues, 0, "{:?}", report.scheduler);
    assert_eq!(report.scheduler.requeues_no_idle_worker, 1);
    assert_eq!(gitlab.log(|l| l.count("request")), 1);
    assert_eq!(
        gitlab.log(|l| l.of("update")[1].body["state"].clone()),
        "success"
    );
}

/// `strict_check_interval`: no re-request after a job even with idle workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_check_interval_never_requeues() {
    let gitlab = GitLab::start(|c| {
        if c.n == 0 {
            Reply::job(9)
        } else {
            Reply::held()
        }
    })
    .await;
    let mut config = gitlab.config(&["reg"], 1, Duration::from_secs(600));
    config.check_interval = Duration::from_secs(60);
    config.strict_check_interval = true;
    let fleet = Running::start(config);
    gitlab
        .wait_until("the job's final update", |l| l.count("update") == 2)
        .await;
    let report = fleet.stop().await;
    assert_eq!(
        report.scheduler.requeues + report.scheduler.requeues_no_idle_worker,
        0
    );
    assert_eq!(gitlab.log(|l| l.count("request")), 1);
}

/// Polls held 300 ms, fed every 50 ms to 4 workers: with `request_concurrency = 1` one
/// runner never has two `jobs/request` in flight (the other feeds give up at once);
/// with 3 it has up to 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_concurrency_bounds_requests_in_flight() {
    for limit in [1usize, 3] {
        let gitlab = GitLab::start(|_| Reply::held().hold(Duration::from_millis(300))).await;
        let mut config = gitlab.config(&["reg"], 1, Duration::from_secs(2));
        config.check_interval = Duration::from_millis(50);
        config.concurrent = 4;
        config.request_concurrency = limit;
        let report = Running::start(config).finish().await;
        let (max, calls) = gitlab.log(|l| {
            (
                l.max_in_flight.values().copied().max().unwrap_or(0),
                l.count("request"),
            )
        });
        assert!(calls >= 3, "limit {limit}: only {calls} requests");
        assert!(
            report.scheduler.request_slot_full > 0,
            "{:?}",
            report.scheduler
        );
        if limit == 1 {
            assert_eq!(max, 1, "two requests of one runner in flight");
        } else {
            assert!((2..=limit).contains(&max), "limit {limit}: {max} in flight");
        }
        assert_eq!(
            report.jobs_request.no_content_held,
            report.jobs_request.total()
        );
    }
}

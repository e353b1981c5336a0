//! Retries and health as gitlab-runner's `network/retry_requester.go` and
//! `commands/health_helper.go` do them: 429 waits as `Retry-After` says, a 503 is
//! tried 5 times in all and then left to the next feed, a connection error is not
//! retried, and three 403s in a row make the runner stop asking.

use crate::fleet_gitlab;

use std::time::Duration;

use fleet_gitlab::{GitLab, Reply, Running};

/// A 429 with `Retry-After: 1` is retried after that second (the back-off alone
/// would wait 100 ms), and the retry's answer is the call's: here a job, whose running
/// update shows the runner has taken the answer in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_retried_after_retry_after() {
    let gitlab = GitLab::start(|c| match c.n {
        0 => Reply::status(429).header("Retry-After", "1"),
        1 => Reply::job(3),
        _ => Reply::held(),
    })
    .await;
    let mut config = gitlab.config(&["reg"], 1, Duration::from_secs(600));
    config.check_interval = Duration::from_secs(60);
    config.concurrent = 1;
    let fleet = Running::start(config);
    gitlab
        .wait_until("the job's running update", |l| l.count("update") >= 1)
        .await;
    let report = fleet.stop().await;
    let at = gitlab.log(|l| l.of("request").iter().map(|s| s.at).collect::<Vec<_>>());
    assert_eq!(at.len(), 2);
    let gap = at[1] - at[0];
    assert!(gap >= Duration::from_millis(950), "retried after {gap:?}");
    assert_eq!(report.scheduler.retries, 1);
    assert_eq!(report.scheduler.feeds, 1, "the retry is not a new feed");
    let statuses = &report.endpoints["jobs_request"].statuses;
    assert_eq!(statuses.get(&429), Some(&1), "{statuses:?}");
    assert_eq!(statuses.get(&201), Some(&1), "{statuses:?}");
}

/// 503 five times: the call gives up after the fifth attempt (four back-off waits, at
/// most 1.5 s in all) and the runner asks again only at its next feed, 5 s after the
/// first; a 503 is a healthy answer, so the runner is still fed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_is_tried_five_times_then_left_to_the_next_feed() {
    let gitlab = GitLab::start(|c| {
        if c.n < 5 {
            Reply::status(503)
        } else {
            Reply::immediate("t1")
        }
    })
    .await;
    let mut config = gitlab.config(&["reg"], 1, Duration::from_secs(600));
    config.check_interval = Duration::from_secs(5);
    let fleet = Running::start(config);
    gitlab
        .wait_until("the next feed's request answered", |l| {
            l.answered("request", 204) == 1
        })
        .await;
    let report = fleet.stop().await;
    let at = gitlab.log(|l| l.of("request").iter().map(|s| s.at).collect::<Vec<_>>());
    assert_eq!(at.len(), 6);
    // Retries: 100 ms, then up to 200, 400 and 800 ms.
    assert!(
        at[4] - at[0] >= Duration::from_millis(400),
        "{:?}",
        at[4] - at[0]
    );
    // A sixth attempt would have come at most 1.6 s after the fifth, by 3.1 s.
    assert!(
        at[5] - at[0] >= Duration::from_millis(4900),
        "{:?}",
        at[5] - at[0]
    );
    assert_eq!(report.scheduler.retries, 4);
    assert_eq!(report.scheduler.feeds, 2);
    assert_eq!(report.scheduler.runners_unhealthy, 0);
    assert_eq!(report.endpoints["jobs_request"].statuses[&503], 5);
}

/// Three 403s in a row and the runner is unhealthy: not fed again (for 60 minutes).
/// A 403 is not retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_403s_make_the_runner_stop_asking() {
    let gitlab = GitLab::start(|_| Reply::status(403)).await;
    let mut config = gitlab.config(&["reg"], 1, Duration::from_secs(3));
    config.check_interval = Duration::from_millis(300);
    let report = Running::start(config).finish().await;
    assert_eq!(gitlab.log(|l| l.count("request")), 3);
    let s = report.scheduler;
    assert_eq!(
        (s.runners_unhealthy, s.retries, s.feeds),
        (1, 0, 3),
        "{s:?}"
    );
    assert!(s.feeds_unhealthy >= 3, "{s:?}");
    assert_eq!(report.jobs_request.other, 3);
}

/// A healthy answer between 403s resets the count: 403, 403, 204, 403, 403 keeps the
/// runner asking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_answer_between_403s_keeps_the_runner_asking() {
    let gitlab = GitLab::start(|c| match c.n {
        2 => Reply::immediate("t"),
        0..=4 => Reply::status(403),
        _ => Reply::immediate("t"),
    })
    .await;
    let mut config = gitlab.config(&["reg"], 1, Duration::from_secs(600));
    config.check_interval = Duration::from_millis(100);
    let fleet = Running::start(config);
    gitlab
        .wait_until("the sixth request", |l| l.answered("request", 204) >= 2)
        .await;
    let report = fleet.stop().await;
    assert_eq!(report.scheduler.runners_unhealthy, 0);
}

/// A connection dropped without an answer is not retried: the worker gives up and the
/// runner asks again at its next feed, 5 s later. It is a healthy answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_error_waits_for_the_next_feed() {
    let gitlab = GitLab::start(|c| match c.n {
        0 => Reply::status(0),
        _ => Reply::immediate("t1"),
    })
    .await;
    let mut config = gitlab.config(&["reg"], 1, Duration::from_secs(600));
    config.check_interval = Duration::from_secs(5);
    let fleet = Running::start(config);
    gitlab
        .wait_until("the next feed's request answered", |l| {
            l.answered("request", 204) == 1
        })
        .await;
    let report = fleet.stop().await;
    let at = gitlab.log(|l| l.of("request").iter().map(|s| s.at).collect::<Vec<_>>());
    assert_eq!(at.len(), 2);
    assert!(
        at[1] - at[0] >= Duration::from_millis(4900),
        "{:?}",
        at[1] - at[0]
    );
    let s = report.scheduler;
    assert_eq!(
        (s.retries, s.feeds, s.runners_unhealthy),
        (0, 2, 0),
        "{s:?}"
    );
    assert_eq!(report.endpoints["jobs_request"].statuses[&0], 1);
    assert_eq!(report.jobs_request.other, 1);
}

//! What the fleet sends at registration (`tag_list`, `run_untagged`), how it keeps its
//! `last_update` ticket (`network/client.go`), and what its report says: held 204s
//! (Workhorse, no `X-GitLab-Last-Update`) apart from immediate ones (Rails, with it),
//! requests per runner per minute, and the predicted request rate beside the measured.

use crate::fleet_gitlab;

use std::time::Duration;

use fleet_gitlab::{GitLab, Reply, Running};

/// Runner `n` registers with `tokens[n % 2]` and tag set `(n / 2) % 3`; `tag_list` is
/// comma-separated (left out when empty, as gitlab-runner does); old runners send no
/// `RUNNER-TOKEN`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_sends_tag_list_and_run_untagged() {
    let gitlab = GitLab::start(|_| Reply::held().hold(Duration::from_secs(30))).await;
    let mut config = gitlab.config(&["reg-a", "reg-b"], 6, Duration::from_secs(600));
    config.check_interval = Duration::from_millis(100);
    config.tag_sets = vec![
        (vec![], true),
        (vec!["docker".into()], true),
        (vec!["docker".into(), "linux".into()], false),
    ];
    let fleet = Running::start(config);
    gitlab
        .wait_until("6 registrations", |l| l.count("register") == 6)
        .await;
    fleet.stop().await;
    let registrations = gitlab.log(|l| l.of("register").into_iter().cloned().collect::<Vec<_>>());
    for r in registrations {
        let n: usize = r.body["description"]
            .as_str()
            .and_then(|d| d.strip_prefix("fleet-"))
            .and_then(|d| d.parse().ok())
            .expect("description fleet-<n>");
        assert_eq!(r.token, ["reg-a", "reg-b"][n % 2], "runner {n}");
        let (tags, untagged) = match (n / 2) % 3 {
            0 => (None, true),
            1 => (Some("docker"), true),
            _ => (Some("docker,linux"), false),
        };
        assert_eq!(r.body["tag_list"].as_str(), tags, "runner {n}: {}", r.body);
        assert_eq!(r.body["run_untagged"], untagged, "runner {n}: {}", r.body);
        // old_share 0.5: runners 0..3 are old.
        assert_eq!(r.token_header, n >= 3, "runner {n}");
    }
}

/// The server answers in turn: Rails' 204 with a new ticket, Workhorse's 204 without
/// one, the proxy's edge 204 with the ticket the runner sent, a job. The report counts
/// held (the second and third kinds) and immediate 204s apart, exactly as sent; the
/// runner always sends back the last ticket it was given (a 204 or 201 without the
/// header leaves it as it was).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_and_immediate_204s_are_counted_apart_and_the_ticket_is_kept() {
    let gitlab = GitLab::start(|c| match c.nth_for_runner % 4 {
        0 => Reply::immediate(&format!("ticket-{}-{}", c.token, c.nth_for_runner)),
        1 => Reply::held(),
        2 => Reply::immediate(&c.last_update),
        _ => Reply::job(c.n as u64 + 1),
    })
    .await;
    let mut config = gitlab.config(&["reg"], 2, Duration::from_secs(600));
    config.check_interval = Duration::from_millis(100);
    let fleet = Running::start(config);
    gitlab
        .wait_until("30 answered requests", |l| {
            l.seen
                .iter()
                .filter(|s| s.kind == "request" && s.status.is_some())
                .count()
                >= 30
        })
        .await;
    let report = fleet.stop().await;

    let (sent_immediate, sent_held, sent_jobs) = gitlab.log(|l| {
        let mut counts = (0, 0, 0);
        for (token, _) in l.calls.iter() {
            let answered = l
                .of("request")
                .iter()
                .filter(|s| &s.token == token && s.status.is_some())
                .count();
            for i in 0..answered {
                match i % 4 {
                    0 => counts.0 += 1,
                    1 | 2 => counts.1 += 1,
                    _ => counts.2 += 1,
                }
            }
        }
        counts
    });
    let j = report.jobs_request;
    // The end of the run may cut an answer on its way back: at most one per runner.
    assert!(
        j.no_content_immediate <= sent_immediate && j.no_content_immediate + 2 >= sent_immediate,
        "{j:?} vs {sent_immediate}"
    );
    assert!(
        j.no_content_held <= sent_held && j.no_content_held + 2 >= sent_held,
        "{j:?} vs {sent_held}"
    );
    assert!(
        j.created <= sent_jobs && j.created + 2 >= sent_jobs,
        "{j:?} vs {sent_jobs}"
    );
    assert!(
        j.no_content_immediate >= 8 && j.no_content_held >= 8,
        "{j:?}"
    );
    assert_eq!(j.other + j.conflict, 0);

    // The ticket each request carried: the one of the runner's last immediate 204.
    gitlab.log(|l| {
        let mut per_runner: std::collections::HashMap<&str, usize> = Default::default();
        for s in l.of("request") {
            let nth = per_runner.entry(s.token.as_str()).or_default();
            let expected = if *nth == 0 {
                String::new()
            } else {
                format!("ticket-{}-{}", s.token, (*nth - 1) / 4 * 4)
            };
            assert_eq!(
                s.body["last_update"],
                expected.as_str(),
                "request {nth} of {}",
                s.token
            );
            *nth += 1;
        }
    });

    // The table and the JSON carry the same figures.
    let table = report.table();
    assert!(
        table.contains(&format!(
            "204 held {}   204 immediate {}",
            j.no_content_held, j.no_content_immediate
        )),
        "{table}"
    );
    let json = report.to_json();
    assert_eq!(json["jobs_request"]["no_content_held"], j.no_content_held);
    assert_eq!(
        json["jobs_request"]["no_content_immediate"],
        j.no_content_immediate
    );
    assert_eq!(json["jobs_request"]["created"], j.created);
}

/// The prediction is `runners / check_interval + jobs per second`, from the configured
/// job rate when given (else the measured 201s per second), beside the measured rate,
/// in the table and the JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_expected_rate_is_shown_beside_the_measured_one() {
    let gitlab = GitLab::start(|c| Reply::immediate(&format!("t{}", c.n))).await;
    let mut config = gitlab.config(&["reg"], 5, Duration::from_secs(3));
    config.check_interval = Duration::from_millis(500);
    config.job_rate = Some(4.0);
    let report = Running::start(config).finish().await;

    let e = report.expected();
    assert_eq!(e.job_rate_source, "configured");
    assert_eq!(e.polling_per_second, 10.0);
    assert_eq!(e.expected_per_second, 14.0);
    assert_eq!(e.expected_per_runner_per_minute, 14.0 * 60.0 / 5.0);
    let measured = report.jobs_request.total() as f64 / report.elapsed.as_secs_f64();
    assert!((e.measured_per_second - measured).abs() < 1e-9);
    assert!((e.ratio - measured / 14.0).abs() < 1e-9);
    // No jobs came: about 10 requests a second, so well under the prediction.
    assert!(e.ratio > 0.3 && e.ratio < 0.8, "{e:?}");

    let table = report.table();
    assert!(
        table.contains("expected 14.0/s = 5 runners / 0.5 s + 4.0 jobs/s (configured)"),
        "{table}"
    );
    let json = report.to_json();
    assert_eq!(json["expected"]["expected_per_second"], 14.0);
    assert_eq!(json["expected"]["job_rate_source"], "configured");
    let r = report.per_runner_per_minute();
    assert_eq!(json["jobs_request_per_runner_per_minute"]["p50"], r.p50);
    assert_eq!(report.runner_requests_per_minute.len(), 5);
    // One feed per 500 ms: 120 a minute; in a 3 s run a runner that starts late fits
    // one feed more than its share (6 in 2.6 s is 138 a minute), more if a busy
    // machine delays its start.
    assert!(r.p99 <= 180.0 && r.mean > 40.0, "{r:?}");

    // Without a configured rate, the measured one (201s per second): none here.
    let mut measured_only = report;
    measured_only.job_rate = None;
    let e = measured_only.expected();
    assert_eq!((e.job_rate_source, e.job_rate), ("measured", 0.0));
    assert_eq!(e.expected_per_second, 10.0);
}

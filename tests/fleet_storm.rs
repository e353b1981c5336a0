//! The runner fleet against a Pod simulator, as gitlab-runner against Workhorse and
//! Rails (issue 17): a queued job wakes only the held polls of the runners that can
//! take it, and a burst of stale tickets settles back to held polls — each runner is
//! answered at once exactly once, then waits out its `check_interval` and is held
//! again; no runner re-polls in a loop (the storm one ticket for the whole Pod would
//! cause: every job would make every runner's ticket stale).
//!
//! Everything is counted on the Pod's side (Workhorse's and Rails' counters of the
//! simulator), so the fleet's own report is not trusted here.

use std::sync::Arc;
use std::time::Duration;

use crate::common::metrics::value_or_zero;
use podgate_loadtest::fleet::{self, FleetConfig, Progress};
use podgate_loadtest::pod_sim::state::JobState;
use podgate_loadtest::pod_sim::{JobSpec, PodSim, PodSimConfig};
use podgate_registry::testing::eventually;
use podgate_tokens::PodId;

/// Runners in the fleet: 4 tag sets × 3 registration tokens × 4.
const RUNNERS: usize = 48;
/// Long enough for a few check intervals on a busy 2-core machine.
const WITHIN: Duration = Duration::from_secs(60);

/// The simulator's counters of interest, read from its `/metrics` text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    watching: u64,
    seen_change: u64,
    timeout: u64,
    already_changed: u64,
    build_found: u64,
    build_not_found: u64,
    build_not_found_cached: u64,
    ticks: u64,
}

fn counts(sim: &PodSim) -> Counts {
    let text = sim.metrics().render();
    let count = |selector: &str| value_or_zero(&text, selector) as u64;
    let workhorse = |status: &str| {
        count(&format!(
            r#"podsim_workhorse_register_requests_total{{status="{status}"}}"#
        ))
    };
    let rails = |event: &str| {
        count(&format!(
            r#"podsim_rails_job_request_total{{event="{event}"}}"#
        ))
    };
    Counts {
        watching: count(r#"podsim_workhorse_register_open{state="watching"}"#),
        seen_change: workhorse("seen-change"),
        timeout: workhorse("timeout"),
        already_changed: workhorse("already-changed"),
        build_found: rails("build_found"),
        build_not_found: rails("build_not_found"),
        build_not_found_cached: rails("build_not_found_cached"),
        ticks: count("podsim_runner_queue_ticks_total"),
    }
}

struct Setup {
    sim: PodSim,
    /// Registration tokens in the order the fleet spreads runners over them:
    /// the instance token, then one per project (with the project's id).
    tokens: Vec<(Option<u64>, String)>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    fleet: tokio::task::JoinHandle<Result<fleet::Report, fleet::Error>>,
}

impl Setup {
    async fn start(check_interval: Duration) -> Setup {
        let mut c = PodSimConfig::new(PodId::new(1).unwrap(), "127.0.0.1:0".parse().unwrap());
        c.job_rate = 0.0;
        // Polls end only when a key changes during the test.
        c.long_poll = Duration::from_secs(600);
        let sim = PodSim::start(c).await.expect("pod-sim starts");
        let mut tokens = vec![(None, sim.state().registration_token().to_owned())];
        for (project, token) in sim.state().project_registration_tokens() {
            tokens.push((Some(project), token));
        }
        assert_eq!(tokens.len(), 3, "an instance token and two projects");
        let mut config = FleetConfig::new(
            format!("http://{}", sim.addr()),
            tokens.iter().map(|(_, t)| t.clone()).collect(),
            RUNNERS,
            Duration::from_secs(3600),
        );
        config.check_interval = check_interval;
        config.artifact_bytes = 0;
        config.trace_patches = 1;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let fleet = tokio::spawn(fleet::run(
            config,
            Arc::new(Progress::default()),
            async move {
                let _ = rx.await;
            },
        ));
        Setup {
            sim,
            tokens,
            stop: Some(tx),
            fleet,
        }
    }

    /// Wait until every runner's poll is held by Workhorse.
    async fn all_held(&self, what: &str) -> Counts {
        eventually(WITHIN, what, || async {
            let c = counts(&self.sim);
            (c.watching == RUNNERS as u64).then_some(c)
        })
        .await
    }

    async fn finish(mut self) -> fleet::Report {
        let _ = self.stop.take().unwrap().send(());
        self.fleet.await.unwrap().unwrap()
    }
}

/// `POST /-/podsim/runners/tick`: the number of keys ticked.
async fn tick_all(sim: &PodSim) -> u64 {
    let url = format!("http://{}/-/podsim/runners/tick", sim.addr());
    let out = tokio::process::Command::new("curl")
        .args(["-sf", "-X", "POST", &url])
        .output()
        .await
        .expect("curl runs");
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["ticked"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_stale_tickets_settles_back_to_held_polls() {
    let s = Setup::start(Duration::from_secs(1)).await;
    let before = s.all_held("every runner's first poll held").await;
    assert_eq!(before.build_found, 0);

    // Every key changes at once (as when Rails ticks the runners): every held poll
    // ends, and every runner's next request carries a stale ticket.
    assert_eq!(tick_all(&s.sim).await, RUNNERS as u64);
    let after = eventually(
        WITHIN,
        "the burst answered and every poll held again",
        || async {
            let c = counts(&s.sim);
            (c.watching == RUNNERS as u64
                && c.seen_change - before.seen_change == RUNNERS as u64
                && c.build_not_found > before.build_not_found)
                .then_some(c)
        },
    )
    .await;
    // Exactly one immediate answer per runner (Rails' 204 with the new value), each
    // after Workhorse saw the stale ticket at once; then every runner is held again.
    assert_eq!(
        after.build_not_found - before.build_not_found,
        RUNNERS as u64,
        "{before:?} → {after:?}"
    );
    assert_eq!(
        after.already_changed - before.already_changed,
        RUNNERS as u64,
        "{before:?} → {after:?}"
    );
    assert_eq!(after.build_not_found_cached, before.build_not_found_cached);
    assert_eq!(after.timeout, before.timeout, "no poll ran out");

    let report = s.finish().await;
    assert_eq!(report.misroutes, 0);
    assert_eq!(report.unexpected(), 0, "{}", report.table());
    // The fleet saw the same: one immediate answer per runner for its first poll
    // (no ticket yet) and one for the burst; every other poll ended by Workhorse.
    assert_eq!(
        report.jobs_request.no_content_immediate,
        2 * RUNNERS as u64,
        "{}",
        report.table()
    );
    assert_eq!(
        report.jobs_request.no_content_held,
        RUNNERS as u64,
        "{}",
        report.table()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_job_wakes_only_the_runners_that_can_take_it() {
    let s = Setup::start(Duration::from_secs(1)).await;
    let before = s.all_held("every runner's first poll held").await;

    // A `gpu` job of the first project: the instance runners and that project's
    // runners with the `gpu` tag set can take it; no one else.
    let (project, _) = s.tokens[1].clone();
    let project = project.unwrap();
    let job = s
        .sim
        .enqueue_spec(JobSpec {
            tags: vec!["gpu".into()],
            project: Some(project),
            ..JobSpec::default()
        })
        .unwrap();
    // The fleet's documented spread: runner n registers with token n % 3 and tag set
    // (n / 3) % 4; tag set 3 is `gpu` (no untagged jobs).
    let can_take = (0..RUNNERS)
        .filter(|n| (n / 3) % 4 == 3 && s.tokens[n % 3].0.is_none_or(|p| p == project))
        .count() as u64;
    assert_eq!(can_take, 8);

    let after = eventually(
        WITHIN,
        "the job taken and the woken runners held again",
        || async {
            let c = counts(&s.sim);
            (c.build_found == 1 && c.watching == RUNNERS as u64).then_some(c)
        },
    )
    .await;
    assert_eq!(after.ticks - before.ticks, can_take, "keys ticked");
    assert_eq!(
        after.seen_change - before.seen_change,
        can_take,
        "held polls released: only the runners that can take the job"
    );
    // Each woken runner asked Rails once with its old ticket: one got the job, the
    // others the new value; the one that got it asked again at once (a worker was
    // free: gitlab-runner's requeue) and got the new value too.
    assert_eq!(
        after.build_not_found - before.build_not_found,
        can_take,
        "{before:?} → {after:?}"
    );
    eventually(WITHIN, "the job run to success", || async {
        let j = s.sim.state().job(job)?;
        (j.state == JobState::Success).then_some(())
    })
    .await;

    let report = s.finish().await;
    assert_eq!(report.misroutes, 0);
    assert_eq!(report.jobs_done, 1, "{}", report.table());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuous_queueing_wakes_only_its_runners_each_at_its_check_interval() {
    const JOBS: u64 = 40;
    let check_interval = Duration::from_secs(1);
    let s = Setup::start(check_interval).await;
    let before = s.all_held("every runner's first poll held").await;

    // `gpu` jobs, 20 a second, for the two projects in turn: only the 12 runners of
    // the `gpu` tag set can take them (the instance ones any, the project ones their
    // project's); the other 36 stay held all along.
    let started = std::time::Instant::now();
    let sim = &s.sim;
    let queue = async {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        for _ in 0..JOBS {
            tick.tick().await;
            sim.enqueue_spec(JobSpec {
                tags: vec!["gpu".into()],
                ..JobSpec::default()
            })
            .unwrap();
        }
    };
    let mut fewest_held = u64::MAX;
    let watch = eventually(WITHIN, "every job taken and every poll held again", || {
        let c = counts(sim);
        fewest_held = fewest_held.min(c.watching);
        async move {
            (c.build_found - before.build_found == JOBS && c.watching == RUNNERS as u64)
                .then_some(c)
        }
    });
    let ((), after) = tokio::join!(queue, watch);
    let window = started.elapsed();

    assert!(
        fewest_held >= (RUNNERS - RUNNERS / 4) as u64,
        "runners that cannot take a gpu job were woken: {fewest_held} held at one point"
    );
    // Each job ticks the keys of the 8 runners that can take it (4 instance, 4 of its
    // project).
    assert_eq!(
        after.ticks - before.ticks,
        8 * JOBS,
        "{before:?} → {after:?}"
    );
    // No storm: a gpu runner reaches Rails at most once per feed (one per
    // check_interval) plus once per job it took (gitlab-runner's requeue).
    let rails = |c: &Counts| c.build_found + c.build_not_found + c.build_not_found_cached;
    let gpu_runners = (RUNNERS / 4) as f64;
    let bound =
        JOBS as f64 + gpu_runners * (window.as_secs_f64() / check_interval.as_secs_f64() + 2.0);
    let reached = rails(&after) - rails(&before);
    assert!(
        (reached as f64) <= bound,
        "{reached} requests reached Rails in {window:?}; gitlab-runner's pacing allows {bound:.0}"
    );

    let report = s.finish().await;
    assert_eq!(report.misroutes, 0);
    assert_eq!(report.unexpected(), 0, "{}", report.table());
}

//! The simulator queues jobs as Workhorse and Rails do, one queue key per runner
//! (`runner:build_queue:<token>`), over real HTTP: a queued job wakes only the held
//! polls of the runners that can take it (instance and project runners, tags); a
//! stale ticket is answered at once by Rails with the runner's current value and a
//! poll with that value is held; Workhorse's own answers (413, parse errors passed
//! to Rails); and with a real redis-server, every key write is mirrored exactly as
//! GitLab's `set_key_and_notify` (SET … EX 3600, then PUBLISH on
//! `workhorse:notifications:runner:build_queue:<token>`), surviving a Redis restart.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::{Reply, call, json as post_json, sim_with};
use futures_util::StreamExt;
use podgate_loadtest::pod_sim::{PodSim, sum_samples};
use podgate_registry::testing::{RedisServer, eventually};
use serde_json::{Value, json};

fn metric(sim: &PodSim, prefix: &str, label: &str) -> u64 {
    sum_samples(&sim.metrics().render(), prefix, |l| l.contains(label))
}

/// Register a runner with `body` (the registration token added): its token.
async fn register(sim: &PodSim, token: &str, mut body: Value) -> String {
    body["token"] = json!(token);
    let r = post_json(sim.addr(), "POST", "/api/v4/runners", &[], body).await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    r.json()["token"].as_str().unwrap().to_owned()
}

async fn request(sim: &PodSim, body: Value) -> Reply {
    post_json(sim.addr(), "POST", "/api/v4/jobs/request", &[], body).await
}

/// A first `jobs/request` (no ticket): Rails' 204 and the runner's queue value.
async fn ticket(sim: &PodSim, runner: &str) -> String {
    let r = request(sim, json!({"token": runner})).await;
    assert_eq!(r.status, 204);
    r.header("x-gitlab-last-update").unwrap().to_owned()
}

fn hold(sim: &PodSim, runner: &str, ticket: &str) -> tokio::task::JoinHandle<Reply> {
    let addr = sim.addr();
    let body = json!({"token": runner, "last_update": ticket});
    tokio::spawn(async move { post_json(addr, "POST", "/api/v4/jobs/request", &[], body).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_job_wakes_only_the_runners_that_can_take_it() {
    let sim = sim_with(2, |c| c.long_poll = Duration::from_secs(120)).await;
    let projects = sim.state().project_registration_tokens();
    assert_eq!(projects.len(), 2);
    let (p0, p1) = (projects[0].clone(), projects[1].clone());
    let instance = sim.state().registration_token().to_owned();
    // Instance and project runners, tag lists as gitlab-runner sends them (a
    // comma-separated string) and as an array.
    let runners: Vec<(&str, String)> = vec![
        ("untagged", register(&sim, &instance, json!({})).await),
        (
            "docker-linux",
            register(
                &sim,
                &instance,
                json!({"tag_list": "docker, linux", "run_untagged": false}),
            )
            .await,
        ),
        (
            "p0-docker",
            register(&sim, &p0.1, json!({"tag_list": ["docker"]})).await,
        ),
        (
            "p1-docker",
            register(
                &sim,
                &p1.1,
                json!({"tag_list": "docker", "run_untagged": "false"}),
            )
            .await,
        ),
        (
            "gpu",
            register(
                &sim,
                &instance,
                json!({"tag_list": "gpu", "run_untagged": false}),
            )
            .await,
        ),
    ];
    // Without tags, a runner must run untagged jobs (`Ci::Runner#tag_constraints`).
    let r = post_json(
        sim.addr(),
        "POST",
        "/api/v4/runners",
        &[],
        json!({"token": instance, "run_untagged": false}),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["message"]["tags_list"][0],
        "can not be empty when runner is not allowed to pick untagged jobs"
    );

    let mut tickets = HashMap::new();
    for (name, token) in &runners {
        tickets.insert(*name, ticket(&sim, token).await);
    }
    let mut held = sim.state().queues().held_polls();
    let mut polls: HashMap<&str, tokio::task::JoinHandle<Reply>> = runners
        .iter()
        .map(|(name, token)| (*name, hold(&sim, token, &tickets[name])))
        .collect();
    held.wait_for(|n| *n == 5).await.unwrap();
    assert_eq!(sim.metrics().held_polls(), 5);

    // A docker job of project 1: only the docker instance runner and project 1's
    // docker runner can take it.
    let r = post_json(
        sim.addr(),
        "POST",
        "/-/podsim/jobs",
        &[],
        json!({"tags": ["docker"], "project": p1.0}),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let job = r.json()["id"].as_u64().unwrap();
    for name in ["docker-linux", "p1-docker"] {
        let r = polls.remove(name).unwrap().await.unwrap();
        assert_eq!(
            (r.status, r.header("x-gitlab-last-update")),
            (204, None),
            "{name}: Workhorse's seen-change answer"
        );
        assert_eq!(r.header("gitlab-ci-builds-polling"), Some("yes"));
    }
    held.wait_for(|n| *n == 3).await.unwrap();
    assert_eq!(sim.metrics().held_polls(), 3);
    for (name, poll) in &polls {
        assert!(!poll.is_finished(), "{name} was woken");
    }
    assert_eq!(
        metric(
            &sim,
            "podsim_workhorse_register_requests_total{",
            "seen-change"
        ),
        2
    );
    // The woken runners come back with their old tickets: Workhorse sees the change
    // and passes them to Rails; the first gets the job, the second nothing (204 with
    // its new value).
    let r = request(
        &sim,
        json!({"token": runners[1].1, "last_update": tickets["docker-linux"]}),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let payload = r.json();
    assert_eq!(payload["id"].as_u64(), Some(job));
    assert_eq!(payload["job_info"]["project_id"].as_u64(), Some(p1.0));
    assert_eq!(
        common::variable(&payload, "CI_PROJECT_ID"),
        Some(p1.0.to_string().as_str())
    );
    let r = request(
        &sim,
        json!({"token": runners[3].1, "last_update": tickets["p1-docker"]}),
    )
    .await;
    assert_eq!(r.status, 204);
    let current = sim.state().queues().get(&runners[3].1).unwrap();
    assert_ne!(current, tickets["p1-docker"]);
    assert_eq!(r.header("x-gitlab-last-update"), Some(current.as_str()));
    assert_eq!(
        metric(
            &sim,
            "podsim_workhorse_register_requests_total{",
            "already-changed"
        ),
        2
    );
    assert_eq!(
        metric(&sim, "podsim_rails_job_request_total{", "\"build_found\""),
        1
    );
    assert_eq!(
        metric(
            &sim,
            "podsim_rails_job_request_total{",
            "\"build_not_found\""
        ),
        6
    );

    // A runner that goes away stops being watched: its key's channel goes too.
    for (_, poll) in polls.drain() {
        poll.abort();
    }
    held.wait_for(|n| *n == 0).await.unwrap();
    assert_eq!(sim.state().queues().watched_keys(), 0);
    assert_eq!(sim.metrics().held_polls(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_ticket_gets_the_current_one_and_that_one_is_held() {
    let sim = sim_with(2, |c| c.long_poll = Duration::from_secs(120)).await;
    let instance = sim.state().registration_token().to_owned();
    let runner = register(&sim, &instance, json!({"tag_list": "docker"})).await;
    let current = sim.state().queues().get(&runner).unwrap();
    let r = request(&sim, json!({"token": runner, "last_update": "stale"})).await;
    assert_eq!(r.status, 204);
    assert_eq!(r.header("x-gitlab-last-update"), Some(current.as_str()));
    assert_eq!(
        metric(
            &sim,
            "podsim_workhorse_register_requests_total{",
            "already-changed"
        ),
        1
    );
    // The current ticket: held, not answered.
    let mut held = sim.state().queues().held_polls();
    let poll = hold(&sim, &runner, &current);
    held.wait_for(|n| *n == 1).await.unwrap();
    assert!(!poll.is_finished());
    // Rails sees a current ticket only when Workhorse passes it on (a form body):
    // `build_not_found_cached`, 204 with the same ticket.
    let r = call(
        sim.addr(),
        "POST",
        "/api/v4/jobs/request",
        &["content-type: application/x-www-form-urlencoded"],
        format!("token={runner}&last_update={current}").as_bytes(),
    )
    .await;
    assert_eq!(r.status, 204);
    assert_eq!(r.header("x-gitlab-last-update"), Some(current.as_str()));
    assert_eq!(
        metric(
            &sim,
            "podsim_rails_job_request_total{",
            "build_not_found_cached"
        ),
        1
    );
    assert_eq!(
        metric(
            &sim,
            "podsim_workhorse_register_requests_total{",
            "body-parse-error"
        ),
        1
    );
    // Ticking every runner (what Rails does when runners change) ends the poll.
    let r = post_json(sim.addr(), "POST", "/-/podsim/runners/tick", &[], json!({})).await;
    assert_eq!((r.status, r.json()["ticked"].as_u64()), (200, Some(1)));
    let r = poll.await.unwrap();
    assert_eq!((r.status, r.header("x-gitlab-last-update")), (204, None));
    assert!(metric(&sim, "podsim_runner_queue_ticks_total", "") >= 2);

    // Workhorse reads at most 32 KiB: more is its 413, Rails never sees it.
    let big = json!({"token": runner, "last_update": current, "pad": "x".repeat(33 * 1024)});
    let r = request(&sim, big).await;
    assert_eq!(r.status, 413);
    assert_eq!(r.header("gitlab-ci-builds-polling"), Some("yes"));
    assert_eq!(
        metric(
            &sim,
            "podsim_workhorse_register_requests_total{",
            "body-read-error"
        ),
        1
    );
    // No last_update: passed to Rails (`missing-values`), which names the runner's
    // current value.
    let r = request(&sim, json!({"token": runner, "last_update": ""})).await;
    assert_eq!(r.status, 204);
    assert_eq!(
        r.header("x-gitlab-last-update"),
        sim.state().queues().get(&runner).as_deref()
    );
    assert_eq!(
        metric(
            &sim,
            "podsim_workhorse_register_requests_total{",
            "missing-values"
        ),
        1
    );
    // A paused runner gets nothing, with its current value.
    let paused = register(&sim, &instance, json!({"paused": true})).await;
    sim.enqueue_spec(Default::default()).unwrap();
    let r = request(&sim, json!({"token": paused})).await;
    assert_eq!(r.status, 204);
    assert_eq!(
        metric(&sim, "podsim_rails_job_request_total{", "inactive"),
        1
    );
}

/// Wait for the next publication on `channel` (others are skipped).
async fn next_on(
    stream: &mut (impl futures_util::Stream<Item = redis::Msg> + Unpin),
    channel: &str,
) -> String {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("a publication within 10 s")
            .expect("the subscription is open");
        if msg.get_channel_name() == channel {
            return msg.get_payload().unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_every_key_write_is_set_and_published_as_gitlab_does() {
    let mut redis_server = RedisServer::start();
    let sim = sim_with(2, |c| c.redis = Some(redis_server.url())).await;
    let client = redis::Client::open(redis_server.url()).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub
        .psubscribe("workhorse:notifications:runner:build_queue:*")
        .await
        .unwrap();
    let mut messages = pubsub.into_on_message();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();

    let instance = sim.state().registration_token().to_owned();
    let runner = register(&sim, &instance, json!({})).await;
    let key = format!("runner:build_queue:{runner}");
    let channel = format!("workhorse:notifications:{key}");
    // Registration ticks the runner's key (`after_save :tick_runner_queue`).
    let registered = next_on(&mut messages, &channel).await;
    assert_eq!(
        sim.state().queues().get(&runner).as_deref(),
        Some(registered.as_str())
    );
    // Rails answers with the value in Redis.
    let r = request(&sim, json!({"token": runner})).await;
    assert_eq!(r.status, 204);
    assert_eq!(r.header("x-gitlab-last-update"), Some(registered.as_str()));

    // A job the runner can take: a new value, SET then PUBLISHed.
    let job = sim.enqueue().unwrap();
    let ticked = next_on(&mut messages, &channel).await;
    assert_ne!(ticked, registered);
    let stored: Option<String> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(stored.as_deref(), Some(ticked.as_str()));
    let ttl: i64 = redis::cmd("TTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!((3590..=3600).contains(&ttl), "TTL {ttl}");
    let r = request(&sim, json!({"token": runner, "last_update": registered})).await;
    assert_eq!(r.status, 201);
    assert_eq!(r.json()["id"].as_u64(), Some(job));
    let r = request(&sim, json!({"token": runner, "last_update": registered})).await;
    assert_eq!(r.status, 204);
    assert_eq!(r.header("x-gitlab-last-update"), Some(ticked.as_str()));

    // Redis goes away: writes fail, are counted, and are sent once it is back (here
    // empty: the runner's next tick sets its key again).
    redis_server.kill();
    sim.state().tick_all();
    eventually(Duration::from_secs(20), "a Redis error counted", || async {
        (sim.metrics().redis_errors.get() > 0).then_some(())
    })
    .await;
    let r = request(&sim, json!({"token": runner, "last_update": "stale"})).await;
    assert_eq!(r.status, 204, "Redis down never fails a request");
    redis_server.restart_empty();
    let current = sim.state().queues().get(&runner).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    eventually(Duration::from_secs(30), "the key mirrored again", || {
        let mut conn = conn.clone();
        let (key, current) = (key.clone(), current.clone());
        async move {
            let v: Option<String> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .ok()?;
            (v.as_deref() == Some(current.as_str())).then_some(())
        }
    })
    .await;
}

/// `max_pending`: the job generator pauses while that many jobs wait (each tick it
/// skips is counted), and fills the queue up again once a runner takes one.
#[tokio::test(start_paused = true)]
async fn the_generator_keeps_at_most_max_pending_jobs_waiting() {
    let sim = sim_with(2, |c| {
        c.job_rate = 100.0;
        c.max_pending = 3;
    })
    .await;
    let skipped = |sim: &PodSim| metric(sim, "podsim_generator_skipped_total", "");
    eventually(
        Duration::from_secs(5),
        "skipped generator ticks",
        || async { (skipped(&sim) >= 20).then_some(()) },
    )
    .await;
    assert_eq!(sim.state().queued(), 3);
    assert_eq!(sim.state().jobs_created(), 3);

    let runner = common::register(&sim).await;
    let r = request(&sim, json!({"token": runner})).await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    eventually(Duration::from_secs(5), "the queue filled again", || async {
        (sim.state().jobs_created() == 4).then_some(())
    })
    .await;
    let before = skipped(&sim);
    eventually(Duration::from_secs(5), "more skipped ticks", || async {
        (skipped(&sim) >= before + 20).then_some(())
    })
    .await;
    assert_eq!(sim.state().queued(), 3);
    assert_eq!(sim.state().jobs_created(), 4);
}

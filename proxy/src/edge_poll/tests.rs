//! The hold decision against a real `redis-server`, keys and notifications written
//! as GitLab writes them (`SET runner:build_queue:<token> <value> EX 3600`, then
//! `PUBLISH workhorse:notifications:runner:build_queue:<token> <value>`).

use std::sync::Arc;
use std::time::Duration;

use podgate_registry::testing::{RedisServer, eventually};
use podgate_registry::{Pod, Topology};
use podgate_tokens::PodId;

use super::*;

fn topology(pod: u64, url: Option<&str>) -> Topology {
    let id = PodId::new(pod).unwrap();
    let mut p = Pod::new(id, format!("pod-{pod}"), "127.0.0.1:1");
    p.runner_queue_redis = url.map(str::to_owned);
    Topology {
        version: 1,
        pods: [(id, Arc::new(p))].into_iter().collect(),
        default_pod: Some(id),
    }
}

fn req(token: &str, last_update: &str) -> Option<RunnerRequest> {
    Some(RunnerRequest {
        token: token.into(),
        last_update: last_update.into(),
    })
}

async fn tick(redis: &RedisServer, token: &str, value: &str) {
    podgate_registry::testing::set_runner_queue_key(&redis.url(), token, value).await;
}

/// The Pod's polls, once its watch is up.
async fn watched(polls: &EdgePolls, pod: u64) -> PodPolls {
    let id = PodId::new(pod).unwrap();
    eventually(Duration::from_secs(10), "the watch to be up", || async {
        polls.pod(id).filter(|p| p.watcher.watch.is_up())
    })
    .await
}

fn count(p: &PodPolls, r: PollResult) -> u64 {
    p.watcher.metrics.results[r as usize].get()
}

/// Until `p` holds `n` polls (registered and past their `GET`).
async fn held(p: &PodPolls, n: i64) {
    eventually(Duration::from_secs(5), "polls to be held", || async {
        (p.watcher.metrics.held.get() == n).then_some(())
    })
    .await;
}

#[tokio::test]
async fn held_until_the_hold_ends_a_change_or_the_client_goes() {
    let redis = RedisServer::start();
    let polls = EdgePolls::new(Duration::from_millis(200));
    polls.apply(&topology(101, Some(&redis.url())));
    let p = watched(&polls, 101).await;
    let never = std::future::pending::<()>;

    // Not a poll Workhorse would watch.
    assert_eq!(
        p.hold(None, never()).await,
        Verdict::Forward(PollResult::Ineligible)
    );
    // Stale: the key differs, or is missing.
    tick(&redis, "t1", "v1").await;
    assert_eq!(
        p.hold(req("t1", "v0"), never()).await,
        Verdict::Forward(PollResult::Stale)
    );
    assert_eq!(
        p.hold(req("missing", "v0"), never()).await,
        Verdict::Forward(PollResult::Stale)
    );
    // Current: held until the hold ends, then 204 with the ticket.
    assert_eq!(
        p.hold(req("t1", "v1"), never()).await,
        Verdict::NoContent(PollResult::Timeout, "v1".into())
    );
    assert_eq!(p.watcher.watch.waiting(), 0, "the waiter is released");

    // A new value wakes exactly the polls on that runner's key.
    let long = EdgePolls::new(Duration::from_secs(60));
    long.apply(&topology(102, Some(&redis.url())));
    let lp = watched(&long, 102).await;
    tick(&redis, "t2", "w1").await;
    let (a, b, other) = tokio::join!(
        lp.hold(req("t1", "v1"), never()),
        lp.hold(req("t1", "v1"), never()),
        async {
            held(&lp, 2).await;
            tick(&redis, "t2", "w2").await; // another runner: no effect
            let other = lp.hold(req("t2", "w2"), async {
                held(&lp, 3).await;
                tick(&redis, "t1", "v2").await;
                held(&lp, 1).await;
            });
            other.await
        }
    );
    assert_eq!(a, Verdict::Forward(PollResult::Changed));
    assert_eq!(b, Verdict::Forward(PollResult::Changed));
    assert_eq!(other, Verdict::ClientGone, "t2's poll was still held");
    assert_eq!(lp.watcher.watch.waiting(), 0);
    assert_eq!(lp.watcher.metrics.held.get(), 0);

    // The same value published again: 204 at once, as Workhorse's `no-change`.
    let (r, ()) = tokio::join!(lp.hold(req("t1", "v2"), never()), async {
        held(&lp, 1).await;
        tick(&redis, "t1", "v2").await;
    });
    assert_eq!(r, Verdict::NoContent(PollResult::NoChange, "v2".into()));

    // Shutdown answers held polls, and holds no more.
    let (r, ()) = tokio::join!(lp.hold(req("t1", "v2"), never()), async {
        held(&lp, 1).await;
        long.shutdown();
    });
    assert_eq!(r, Verdict::NoContent(PollResult::NoChange, "v2".into()));
    assert!(long.pod(PodId::new(102).unwrap()).is_none());

    assert_eq!(count(&lp, PollResult::Changed), 2);
    assert_eq!(count(&lp, PollResult::ClientGone), 1);
    assert_eq!(count(&lp, PollResult::NoChange), 2);
    assert_eq!(count(&p, PollResult::Timeout), 1);
    assert_eq!(count(&p, PollResult::Stale), 2);
    assert_eq!(count(&p, PollResult::Ineligible), 1);
}

#[tokio::test]
async fn redis_going_away_forwards_held_and_new_polls() {
    let mut redis = RedisServer::start();
    let polls = EdgePolls::new(Duration::from_secs(60));
    polls.apply(&topology(103, Some(&redis.url())));
    let p = watched(&polls, 103).await;
    tick(&redis, "t", "v").await;
    let never = std::future::pending::<()>;
    let (r, ()) = tokio::join!(p.hold(req("t", "v"), never()), async {
        held(&p, 1).await;
        redis.kill();
    });
    assert_eq!(r, Verdict::Forward(PollResult::FailOpen));
    assert_eq!(p.watcher.metrics.up.get(), 0);
    assert_eq!(
        p.hold(req("t", "v"), never()).await,
        Verdict::Forward(PollResult::FailOpen),
        "no watch, no hold"
    );
    assert!(p.watcher.metrics.errors.get() >= 1);
    // Back (empty): watched again; the key is gone, so the ticket is stale.
    redis.restart_empty();
    let p = watched(&polls, 103).await;
    assert_eq!(
        p.hold(req("t", "v"), never()).await,
        Verdict::Forward(PollResult::Stale)
    );
}

#[tokio::test]
async fn watches_follow_the_topology() {
    let redis = RedisServer::start();
    let polls = EdgePolls::new(Duration::from_secs(60));
    let id = PodId::new(104).unwrap();
    polls.apply(&topology(104, None));
    assert!(polls.pod(id).is_none(), "not opted in: untouched");
    polls.apply(&topology(104, Some(&redis.url())));
    let p = watched(&polls, 104).await;
    // Unchanged URL: the same watch.
    polls.apply(&topology(104, Some(&redis.url())));
    assert!(Arc::ptr_eq(&polls.pod(id).unwrap().watcher, &p.watcher));
    // Opted out while a poll is held: the poll is forwarded.
    tick(&redis, "t", "v").await;
    let (r, ()) = tokio::join!(p.hold(req("t", "v"), std::future::pending()), async {
        held(&p, 1).await;
        polls.apply(&topology(104, None));
    });
    // `p` still holds the old watch; the topology change stopped it all the same.
    assert_eq!(r, Verdict::Forward(PollResult::FailOpen));
    assert!(polls.pod(id).is_none());
    let text = crate::metrics::render();
    assert!(
        !text.contains("podgate_proxy_edge_poll_redis_up{pod=\"104\"}"),
        "{text}"
    );
}

//! [`QueueWatch::hold`] against a real `redis-server`, keys and notifications written
//! as GitLab writes them (`SET runner:build_queue:<token> <value> EX 3600`, then
//! `PUBLISH workhorse:notifications:runner:build_queue:<token> <value>`). The
//! proxy's edge polls test the same watch through their topology
//! (`proxy/src/edge_poll/tests.rs`).

use std::time::Duration;

use prometheus::{IntCounter, IntGauge};

use super::*;
use crate::testing::{RedisServer, eventually};

fn metrics() -> WatchMetrics {
    WatchMetrics {
        up: IntGauge::new("up", "up").unwrap(),
        errors: IntCounter::new("errors", "errors").unwrap(),
        notifications: IntCounter::new("notifications", "notifications").unwrap(),
        held: IntGauge::new("held", "held").unwrap(),
    }
}

async fn tick(redis: &RedisServer, token: &str, value: &str) {
    crate::testing::set_runner_queue_key(&redis.url(), token, value).await;
}

async fn up(w: &QueueWatch) {
    eventually(Duration::from_secs(10), "the watch to be up", || async {
        w.is_up().then_some(())
    })
    .await;
}

async fn held(w: &QueueWatch, n: i64) {
    eventually(Duration::from_secs(5), "calls to be held", || async {
        (w.metrics().held.get() == n).then_some(())
    })
    .await;
}

#[tokio::test]
async fn every_outcome_of_a_hold() {
    let redis = RedisServer::start();
    let w = QueueWatch::start("kas", &redis.url(), metrics());
    up(&w).await;
    let never = std::future::pending::<()>;
    let long = Duration::from_secs(60);

    tick(&redis, "t1", "v1").await;
    assert_eq!(w.hold("t1", "v0", long, never()).await, Outcome::Stale);
    assert_eq!(w.hold("gone", "v0", long, never()).await, Outcome::Stale);
    assert_eq!(
        w.hold("t1", "v1", Duration::from_millis(50), never()).await,
        Outcome::Timeout
    );
    // A change wakes the holds on its key only: t1's, not t2's.
    tick(&redis, "t2", "w1").await;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (changed, gone, ()) = tokio::join!(
        w.hold("t1", "v1", long, never()),
        w.hold("t2", "w1", long, async {
            let _ = rx.await;
        }),
        async {
            held(&w, 2).await;
            tick(&redis, "t1", "v2").await;
            held(&w, 1).await;
            // t2's client goes before anything of t2's changed.
            drop(tx);
        }
    );
    assert_eq!(changed, Outcome::Changed);
    assert_eq!(gone, Outcome::ClientGone);
    assert_eq!(w.waiting(), 0, "every waiter released");
    assert_eq!(w.metrics().held.get(), 0);
    let (same, ()) = tokio::join!(w.hold("t1", "v2", long, never()), async {
        held(&w, 1).await;
        tick(&redis, "t1", "v2").await;
    });
    assert_eq!(same, Outcome::NoChange);
    assert!(w.metrics().notifications.get() >= 2);

    // Shutdown answers the held calls and holds no more.
    let (r, ()) = tokio::join!(w.hold("t1", "v2", long, never()), async {
        held(&w, 1).await;
        w.stop(Stop::Shutdown);
    });
    assert_eq!(r, Outcome::Shutdown);
    assert_eq!(w.hold("t1", "v2", long, never()).await, Outcome::FailOpen);
}

#[tokio::test]
async fn redis_gone_fails_open_and_a_restart_is_watched_again() {
    let mut redis = RedisServer::start();
    let w = QueueWatch::start("kas", &redis.url(), metrics());
    up(&w).await;
    tick(&redis, "t", "v").await;
    let long = Duration::from_secs(60);
    let (r, ()) = tokio::join!(w.hold("t", "v", long, std::future::pending()), async {
        held(&w, 1).await;
        redis.kill();
    });
    assert_eq!(r, Outcome::FailOpen);
    assert!(!w.is_up());
    assert_eq!(
        w.hold("t", "v", long, std::future::pending()).await,
        Outcome::FailOpen
    );
    assert!(w.metrics().errors.get() >= 1);
    redis.restart_empty();
    up(&w).await;
    assert_eq!(
        w.hold("t", "v", long, std::future::pending()).await,
        Outcome::Stale
    );
}

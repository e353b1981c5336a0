//! Long polls held at the edge (issue 14, item 4), end to end: the real `podgate
//! proxy` binary in front of real Pod simulators (Workhorse + Rails, one queue key
//! per runner, every key write mirrored into a real `redis-server` as GitLab writes
//! it), with a counting TCP relay between the proxy and Pod 1 so the tests see every
//! upstream connection and byte.
//!
//! - a poll with the current ticket is held by the proxy and answered 204 with the
//!   ticket when the hold ends; the Pod sees no connection and no byte for it;
//! - a queue change (a job the runner can take) wakes it and it is forwarded: 201
//!   with the job (the wake → answer latency is printed, not asserted);
//! - a stale ticket is forwarded at once (Rails' 204 with the current ticket);
//! - the Pod's Redis killed during a hold: the poll is forwarded, never stuck, and so
//!   are new polls while Redis is down;
//! - a Pod without `runner_queue_redis` is untouched.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::metrics::value_or_zero;
use common::{Proxy, Reply, admin_get, request, start_proxy};
use podgate_loadtest::pod_sim::{JobSpec, PodSim, PodSimConfig};
use podgate_registry::testing::{RedisServer, eventually};
use podgate_tokens::PodId;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const WITHIN: Duration = Duration::from_secs(20);

/// One test at a time: each starts Redis servers (one killed and restarted on its
/// port) and proxies on ports `free_port` picked, and a port released by one test
/// must not be taken by another's process meanwhile.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const POLL: &str = "POST /api/v4/jobs/request HTTP/1.1\r\ncontent-type: application/json";

/// A TCP relay in front of a Pod: counts the connections it accepts and the bytes
/// clients send through it.
#[derive(Clone)]
struct Relay {
    addr: SocketAddr,
    connections: Arc<AtomicU64>,
    bytes_in: Arc<AtomicU64>,
    /// When the first byte after [`Relay::mark`] reached the relay.
    first_in: Arc<std::sync::Mutex<Option<Instant>>>,
}

impl Relay {
    async fn start(to: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = Relay {
            addr: listener.local_addr().unwrap(),
            connections: Arc::default(),
            bytes_in: Arc::default(),
            first_in: Arc::default(),
        };
        let r = relay.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                r.connections.fetch_add(1, Ordering::SeqCst);
                let bytes_in = r.bytes_in.clone();
                let first_in = r.first_in.clone();
                tokio::spawn(async move {
                    let Ok(upstream) = TcpStream::connect(to).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut ur, mut uw) = upstream.into_split();
                    let up = async move {
                        let mut buf = vec![0; 16 * 1024];
                        loop {
                            let n = match cr.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            first_in.lock().unwrap().get_or_insert_with(Instant::now);
                            bytes_in.fetch_add(n as u64, Ordering::SeqCst);
                            if uw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = uw.shutdown().await;
                    };
                    let down = async move {
                        let _ = tokio::io::copy(&mut ur, &mut cw).await;
                        let _ = cw.shutdown().await;
                    };
                    tokio::join!(up, down);
                });
            }
        });
        relay
    }

    /// Forget when bytes last arrived: [`Relay::first_in`] is the next arrival.
    fn mark(&self) {
        *self.first_in.lock().unwrap() = None;
    }

    /// When the first byte since [`Relay::mark`] arrived.
    fn first_in(&self) -> Option<Instant> {
        *self.first_in.lock().unwrap()
    }

    /// (connections, bytes sent to the Pod) so far.
    fn seen(&self) -> (u64, u64) {
        (
            self.connections.load(Ordering::SeqCst),
            self.bytes_in.load(Ordering::SeqCst),
        )
    }
}

/// One notification: (channel, value, when it was read).
type Notification = (String, String, Instant);

/// `PSUBSCRIBE workhorse:notifications:runner:build_queue:*` over raw RESP: every
/// queue key notification, with the time this process read it.
async fn subscribe(redis: &RedisServer) -> mpsc::UnboundedReceiver<Notification> {
    let mut s = BufReader::new(
        TcpStream::connect(("127.0.0.1", redis.port()))
            .await
            .unwrap(),
    );
    s.get_mut()
        .write_all(b"PSUBSCRIBE workhorse:notifications:runner:build_queue:*\r\n")
        .await
        .unwrap();
    async fn frame(s: &mut BufReader<TcpStream>) -> Option<Vec<String>> {
        let mut line = String::new();
        s.read_line(&mut line).await.ok()?;
        let n: usize = line.trim_end().strip_prefix('*')?.parse().ok()?;
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            line.clear();
            s.read_line(&mut line).await.ok()?;
            let l = line.trim_end();
            if let Some(len) = l.strip_prefix('$') {
                let mut data = vec![0; len.parse::<usize>().ok()? + 2];
                s.read_exact(&mut data).await.ok()?;
                data.truncate(data.len() - 2);
                items.push(String::from_utf8_lossy(&data).into_owned());
            } else {
                items.push(l.trim_start_matches(':').to_owned());
            }
        }
        Some(items)
    }
    // The subscription is confirmed before this returns: nothing published later is
    // missed.
    let confirm = frame(&mut s).await.expect("psubscribe confirmation");
    assert_eq!(confirm[0], "psubscribe", "{confirm:?}");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(items) = frame(&mut s).await {
            if items.len() == 4 && items[0] == "pmessage" {
                let _ = tx.send((items[2].clone(), items[3].clone(), Instant::now()));
            }
        }
    });
    rx
}

/// The next notification on `token`'s key.
async fn next_on(rx: &mut mpsc::UnboundedReceiver<Notification>, token: &str) -> Notification {
    let channel = format!("workhorse:notifications:runner:build_queue:{token}");
    tokio::time::timeout(WITHIN, async {
        loop {
            let n = rx.recv().await.expect("the subscriber runs");
            if n.0 == channel {
                return n;
            }
        }
    })
    .await
    .expect("a notification on the runner's key")
}

/// A Pod simulator mirroring its queue keys into `redis`; Workhorse holds polls for
/// `long_poll`.
async fn pod_sim(pod: u64, redis: &RedisServer, long_poll: Duration) -> PodSim {
    let mut c = PodSimConfig::new(PodId::new(pod).unwrap(), "127.0.0.1:0".parse().unwrap());
    c.redis = Some(redis.url());
    c.long_poll = long_poll;
    PodSim::start(c).await.expect("pod-sim starts")
}

/// A proxy holding polls `hold_secs` at the edge, health checks off (so the relay
/// sees only requests): Pod 1 (default) through `relay`, watched in `redis`; Pod 2,
/// if any, without `runner_queue_redis`; `extra` lines at the top.
async fn edge_proxy(
    hold_secs: u64,
    relay: &Relay,
    redis: &RedisServer,
    pod2: Option<&PodSim>,
    extra: &str,
) -> Proxy {
    let mut config = format!(
        r#"edge_poll_hold_secs = {hold_secs}
        {extra}
        [health]
        enabled = false
        [topology]
        default_pod = 1
        [[topology.pods]]
        id = 1
        name = "pod-1"
        web = ["{relay}"]
        runner_queue_redis = "{redis}"
        "#,
        relay = relay.addr,
        redis = redis.url(),
    );
    if let Some(p) = pod2 {
        config.push_str(&format!(
            "[[topology.pods]]\nid = 2\nname = \"pod-2\"\nweb = [\"{}\"]\n",
            p.addr()
        ));
    }
    let proxy = start_proxy(&config, tempfile::tempdir().unwrap()).await;
    metric_becomes(&proxy, r#"podgate_proxy_edge_poll_redis_up{pod="1"}"#, 1).await;
    proxy
}

/// A series of the proxy's `/metrics` (0 when absent).
async fn metric(proxy: &Proxy, series: &str) -> u64 {
    let (_, text) = admin_get(proxy, "/metrics").await;
    value_or_zero(&text, series) as u64
}

async fn metric_becomes(proxy: &Proxy, sample: &str, value: u64) {
    eventually(WITHIN, &format!("{sample} = {value}"), || async {
        (metric(proxy, sample).await == value).then_some(())
    })
    .await;
}

fn edge_result(pod: u64, result: &str) -> String {
    format!(r#"podgate_proxy_edge_polls_total{{pod="{pod}",result="{result}"}}"#)
}

/// Workhorse's counter of polls that ended with `status` on `sim`.
fn workhorse(sim: &PodSim, status: &str) -> u64 {
    value_or_zero(
        &sim.metrics().render(),
        &format!(r#"podsim_workhorse_register_requests_total{{status="{status}"}}"#),
    ) as u64
}

fn body(token: &str, last_update: &str) -> Vec<u8> {
    format!(
        r#"{{"token":"{token}","last_update":"{last_update}","info":{{"name":"gitlab-runner","version":"17.0.0","features":{{"refspecs":true}}}}}}"#
    )
    .into_bytes()
}

async fn poll(proxy: &Proxy, token: &str, last_update: &str) -> Reply {
    request(proxy.port, POLL, &body(token, last_update)).await
}

fn header<'a>(r: &'a Reply, name: &str) -> Option<&'a str> {
    r.headers.get(name).map(String::as_str)
}

/// Register a runner on `sim` and start it as gitlab-runner starts: a first poll
/// without `last_update` (forwarded: Rails records the contact, so queued jobs tick
/// the runner's key, and answers the ticket). Its token and ticket, once the ticket
/// is in Redis (registration ticks the runner's key, as `Ci::Runner`'s `after_save`
/// does).
async fn runner(
    sim: &PodSim,
    proxy: &Proxy,
    notifications: &mut mpsc::UnboundedReceiver<Notification>,
) -> (String, String) {
    let delivered = r#"podgate_proxy_edge_poll_notifications_total{pod="1"}"#;
    let seen = metric(proxy, delivered).await;
    let (_, token) = sim.state().register().unwrap();
    let (_, ticket, _) = next_on(notifications, &token).await;
    // The proxy has had the registration's notification too: delivered late, it would
    // end the next held poll at once (Workhorse's `no-change`), as it may in
    // production; here nothing else publishes, so the next one is this one.
    eventually(
        WITHIN,
        "the proxy has the registration's notification",
        || async { (metric(proxy, delivered).await > seen).then_some(()) },
    )
    .await;
    let r = request(
        proxy.port,
        POLL,
        format!(r#"{{"token":"{token}"}}"#).as_bytes(),
    )
    .await;
    assert_eq!(r.status, 204);
    assert_eq!(header(&r, "x-gitlab-last-update"), Some(ticket.as_str()));
    (token, ticket)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_current_ticket_is_held_at_the_edge_and_answered_204_with_it() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let mut notifications = subscribe(&redis).await;
    // Workhorse in the Pods would hold a poll 30 s: a 204 within the test is the edge's.
    let sim1 = pod_sim(1, &redis, Duration::from_secs(30)).await;
    let sim2 = pod_sim(2, &redis, Duration::from_secs(1)).await;
    let relay = Relay::start(sim1.addr()).await;
    let proxy = edge_proxy(1, &relay, &redis, Some(&sim2), "").await;
    let (token, ticket) = runner(&sim1, &proxy, &mut notifications).await;
    let pod_requests = sim1.metrics().requests_total();

    let before = relay.seen();
    // On a kept-alive connection, as runners poll.
    let mut conn = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
    let b = body(&token, &ticket);
    let head = format!(
        "{POLL}\r\nhost: gitlab.example.com\r\ncontent-length: {}\r\n\r\n",
        b.len()
    );
    let started = Instant::now();
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(&b).await.unwrap();
    let mut raw = Vec::new();
    while !raw.ends_with(b"\r\n\r\n") {
        let mut byte = [0];
        assert_eq!(conn.read(&mut byte).await.unwrap(), 1, "{raw:?}");
        raw.push(byte[0]);
    }
    let held = started.elapsed();
    let r = common::parse_reply(&raw);
    assert_eq!(r.status, 204, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(header(&r, "x-gitlab-last-update"), Some(ticket.as_str()));
    assert_eq!(header(&r, "gitlab-ci-builds-polling"), Some("yes"));
    assert!(r.body.is_empty());
    assert!(held >= Duration::from_secs(1), "answered after {held:?}");
    assert_eq!(
        relay.seen(),
        before,
        "the Pod saw no connection and no byte"
    );
    assert_eq!(
        sim1.metrics().requests_total(),
        pod_requests,
        "nothing reached Pod 1"
    );
    assert_eq!(metric(&proxy, &edge_result(1, "timeout")).await, 1);
    assert_eq!(
        metric(&proxy, r#"podgate_proxy_edge_polls_held{pod="1"}"#).await,
        0
    );
    let (_, text) = admin_get(&proxy, "/metrics").await;
    assert!(
        text.contains(r#"podgate_proxy_requests_total{outcome="edge_held",pod="1",rule="jobs-request",source="json:token",status="204"} 1"#),
        "{text}"
    );
    // The connection serves the runner's next poll (a stale ticket: forwarded).
    let b = body(&token, "stale");
    conn.write_all(
        format!(
            "{POLL}\r\nhost: gitlab.example.com\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
            b.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    conn.write_all(&b).await.unwrap();
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).await.unwrap();
    let r = common::parse_reply(&raw);
    assert_eq!(r.status, 204);
    assert_eq!(header(&r, "x-gitlab-last-update"), Some(ticket.as_str()));
    assert_eq!(metric(&proxy, &edge_result(1, "stale")).await, 1);
    let before = relay.seen();

    // A client that goes away during the hold releases its waiter.
    let long = edge_proxy(30, &relay, &redis, None, "grace_period_secs = 5").await;
    let mut s = TcpStream::connect(("127.0.0.1", long.port)).await.unwrap();
    let b = body(&token, &ticket);
    s.write_all(
        format!(
            "{POLL}\r\nhost: gitlab.example.com\r\ncontent-length: {}\r\n\r\n",
            b.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    s.write_all(&b).await.unwrap();
    metric_becomes(&long, r#"podgate_proxy_edge_polls_held{pod="1"}"#, 1).await;
    drop(s);
    metric_becomes(&long, &edge_result(1, "client_gone"), 1).await;
    assert_eq!(
        metric(&long, r#"podgate_proxy_edge_polls_held{pod="1"}"#).await,
        0
    );
    assert_eq!(relay.seen(), before, "still nothing reached Pod 1");

    // SIGTERM: held polls are answered now (Workhorse's shutdown), not cut when
    // the grace period ends.
    let held = tokio::spawn({
        let (port, token, ticket) = (long.port, token.clone(), ticket.clone());
        async move { request(port, POLL, &body(&token, &ticket)).await }
    });
    metric_becomes(&long, r#"podgate_proxy_edge_polls_held{pod="1"}"#, 1).await;
    common::process::terminate(long.child.id());
    let r = held.await.unwrap();
    assert_eq!(r.status, 204);
    assert_eq!(header(&r, "x-gitlab-last-update"), Some(ticket.as_str()));
    assert_eq!(relay.seen(), before, "still nothing reached Pod 1");

    // Pod 2 sets no `runner_queue_redis`: its poll is forwarded to it, and its
    // Workhorse answers when its own hold ends (a 204 without a ticket).
    let (_, token2) = sim2.state().register().unwrap();
    let ticket2 = sim2.state().queues().get(&token2).unwrap();
    let r = poll(&proxy, &token2, &ticket2).await;
    assert_eq!(r.status, 204);
    assert_eq!(header(&r, "x-gitlab-last-update"), None, "Workhorse's 204");
    assert_eq!(workhorse(&sim2, "timeout"), 1, "held by Pod 2's Workhorse");
    let (_, text) = admin_get(&proxy, "/metrics").await;
    assert!(
        !text.contains(r#"podgate_proxy_edge_polls_total{pod="2""#),
        "{text}"
    );
    assert!(
        !text.contains(r#"podgate_proxy_edge_poll_redis_up{pod="2"}"#),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_change_forwards_the_held_poll_and_a_stale_ticket_goes_at_once() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let mut notifications = subscribe(&redis).await;
    let sim = pod_sim(1, &redis, Duration::from_secs(30)).await;
    let relay = Relay::start(sim.addr()).await;
    let proxy = edge_proxy(60, &relay, &redis, None, "").await;
    let (token, ticket) = runner(&sim, &proxy, &mut notifications).await;

    let before = relay.seen();
    let held = tokio::spawn({
        let (port, token, ticket) = (proxy.port, token.clone(), ticket.clone());
        async move {
            let r = request(port, POLL, &body(&token, &ticket)).await;
            (r, Instant::now())
        }
    });
    metric_becomes(&proxy, r#"podgate_proxy_edge_polls_held{pod="1"}"#, 1).await;
    assert_eq!(relay.seen(), before, "held at the edge");
    relay.mark();
    // A job the runner can take: Rails ticks its key, Redis announces it.
    let queued = Instant::now();
    let job = sim.enqueue_spec(JobSpec::default()).unwrap();
    let (_, new_ticket, published) = next_on(&mut notifications, &token).await;
    assert_ne!(new_ticket, ticket);
    let (r, answered) = held.await.unwrap();
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let payload: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(payload["id"].as_u64(), Some(job));
    assert!(relay.seen().1 > before.1, "forwarded to the Pod");
    assert_eq!(
        workhorse(&sim, "already-changed"),
        1,
        "Workhorse passed it to Rails"
    );
    assert_eq!(metric(&proxy, &edge_result(1, "changed")).await, 1);
    let forwarded = relay.first_in().expect("the relay saw the forwarded poll");
    println!(
        "edge poll wake latency: PUBLISH seen -> poll forwarded to the Pod {:?}; PUBLISH seen -> 201 at the client {:?}; enqueue -> 201 {:?}",
        forwarded.saturating_duration_since(published),
        answered.saturating_duration_since(published),
        answered - queued
    );

    // A stale ticket: forwarded at once, Rails answers 204 with the current one.
    let r = poll(&proxy, &token, &ticket).await;
    assert_eq!(r.status, 204);
    assert_eq!(
        header(&r, "x-gitlab-last-update"),
        Some(new_ticket.as_str())
    );
    assert_eq!(metric(&proxy, &edge_result(1, "stale")).await, 1);
    assert_eq!(workhorse(&sim, "already-changed"), 2);
    // Not Workhorse's way: a poll without `last_update` goes to Rails (ineligible).
    let r = request(
        proxy.port,
        POLL,
        format!(r#"{{"token":"{token}"}}"#).as_bytes(),
    )
    .await;
    assert_eq!(r.status, 204);
    assert_eq!(
        header(&r, "x-gitlab-last-update"),
        Some(new_ticket.as_str())
    );
    assert_eq!(
        metric(&proxy, &edge_result(1, "ineligible")).await,
        2,
        "with the first poll"
    );
    assert_eq!(workhorse(&sim, "missing-values"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_going_away_forwards_held_and_new_polls() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let mut notifications = subscribe(&redis).await;
    // Pod 1's Workhorse holds a forwarded poll 1 s (its own Redis is in memory).
    let sim = pod_sim(1, &redis, Duration::from_secs(1)).await;
    let relay = Relay::start(sim.addr()).await;
    let proxy = edge_proxy(60, &relay, &redis, None, "").await;
    let (token, ticket) = runner(&sim, &proxy, &mut notifications).await;

    let before = relay.seen();
    let held = tokio::spawn({
        let (port, token, ticket) = (proxy.port, token.clone(), ticket.clone());
        async move { request(port, POLL, &body(&token, &ticket)).await }
    });
    metric_becomes(&proxy, r#"podgate_proxy_edge_polls_held{pod="1"}"#, 1).await;
    redis.kill();
    let r = tokio::time::timeout(WITHIN, held)
        .await
        .expect("the held poll is not stuck")
        .unwrap();
    assert_eq!(r.status, 204);
    assert_eq!(
        header(&r, "x-gitlab-last-update"),
        None,
        "Workhorse's 204: forwarded"
    );
    assert!(relay.seen().1 > before.1);
    assert_eq!(workhorse(&sim, "timeout"), 1);
    assert_eq!(metric(&proxy, &edge_result(1, "fail_open")).await, 1);
    assert_eq!(
        metric(&proxy, r#"podgate_proxy_edge_poll_redis_up{pod="1"}"#).await,
        0
    );
    assert!(
        metric(
            &proxy,
            r#"podgate_proxy_edge_poll_redis_errors_total{pod="1"}"#
        )
        .await
            >= 1
    );

    // While Redis is down, polls are forwarded.
    let r = poll(&proxy, &token, &ticket).await;
    assert_eq!(r.status, 204);
    assert_eq!(workhorse(&sim, "timeout"), 2);
    assert_eq!(metric(&proxy, &edge_result(1, "fail_open")).await, 2);

    // Redis back (empty): the watch comes back; the ticket is no longer in Redis,
    // so the next poll is stale and forwarded.
    redis.restart_empty();
    metric_becomes(&proxy, r#"podgate_proxy_edge_poll_redis_up{pod="1"}"#, 1).await;
    let r = poll(&proxy, &token, "stale").await;
    assert_eq!(r.status, 204);
    assert_eq!(header(&r, "x-gitlab-last-update"), Some(ticket.as_str()));
    assert_eq!(metric(&proxy, &edge_result(1, "stale")).await, 1);
}

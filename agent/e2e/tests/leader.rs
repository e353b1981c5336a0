//! agentk leader election on kube-sim: two replicas compete for one
//! `coordination.k8s.io/v1` Lease; one wins, a release hands over at once, a
//! dropped leader is replaced once its lease has expired, a leader whose Lease is
//! taken stops leading. Waits are on the `is_leader` watches and on Lease watch
//! events, never on sleeps.

use std::time::Duration;

use futures_util::TryStreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::watcher;
use podgate_agentk::leader::{Leader, LeaderConfig};
use podgate_testkit::kube::KubeTestServer;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

const NS: &str = "gitlab-agent";
const LEASE: &str = "agent-7-lock";

async fn cluster() -> (KubeTestServer, kube::Client) {
    let server = KubeTestServer::start(1000).await.expect("kube-sim");
    server.put(
        "namespaces",
        "",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
    );
    let c = server.client().await;
    (server, c)
}

/// Short timings: lease `lease`, renew deadline 600 ms, retry 100 ms.
fn config(identity: &str, lease: Duration) -> LeaderConfig {
    let mut c = LeaderConfig::for_agent(NS, 7, identity);
    c.lease_duration = lease;
    c.renew_deadline = Duration::from_millis(600);
    c.retry_period = Duration::from_millis(100);
    c
}

/// Wait (at most `limit`) until the watch says `want`.
async fn until(rx: &mut watch::Receiver<bool>, want: bool, limit: Duration, what: &str) {
    tokio::time::timeout(limit, rx.wait_for(|v| *v == want))
        .await
        .unwrap_or_else(|_| panic!("{what}: not {want} within {limit:?}"))
        .expect("the election is running");
}

/// The replicas' identities, by index.
const NAMES: [&str; 2] = ["agentk-a", "agentk-b"];

/// Two replicas once one of them leads.
struct Race {
    /// The index in [`NAMES`] of the one that leads.
    won: usize,
    leader: Leader,
    other: Leader,
    /// The leader's `is_leader` watch.
    winner: watch::Receiver<bool>,
    /// The other's.
    loser: watch::Receiver<bool>,
}

/// Start replicas `agentk-a` and `agentk-b` with lease `lease` and wait (20 s at
/// most) until one of them leads.
async fn race(client: &kube::Client, lease: Duration) -> Race {
    let a = Leader::start(client.clone(), config(NAMES[0], lease));
    let b = Leader::start(client.clone(), config(NAMES[1], lease));
    let (mut ra, mut rb) = (a.is_leader(), b.is_leader());
    let won = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::select! {
            r = ra.wait_for(|v| *v) => { r.expect("running"); 0 }
            r = rb.wait_for(|v| *v) => { r.expect("running"); 1 }
        }
    })
    .await
    .expect("a leader within 20 s");
    let (leader, other, winner, loser) = if won == 0 {
        (a, b, ra, rb)
    } else {
        (b, a, rb, ra)
    };
    Race {
        won,
        leader,
        other,
        winner,
        loser,
    }
}

/// Wait (30 s at most) until the replica that did not win leads.
async fn takes_over(loser: &mut watch::Receiver<bool>) {
    until(loser, true, Duration::from_secs(30), "the other replica").await;
}

async fn lease(api: &Api<Lease>) -> Lease {
    api.get(LEASE).await.expect("the Lease exists")
}

fn holder(l: &Lease) -> String {
    l.spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .unwrap_or_default()
}

fn transitions(l: &Lease) -> i32 {
    l.spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or_default()
}

#[tokio::test]
async fn one_of_two_replicas_leads_and_keeps_renewing_while_the_other_waits() {
    let (_server, client) = cluster().await;
    let api: Api<Lease> = Api::namespaced(client.clone(), NS);
    let r = race(&client, Duration::from_secs(1)).await;
    let l = lease(&api).await;
    assert_eq!(holder(&l), NAMES[r.won]);
    assert_eq!(
        l.spec.as_ref().unwrap().lease_duration_seconds,
        Some(1),
        "leaseDurationSeconds is the configured duration"
    );
    assert!(l.spec.as_ref().unwrap().renew_time.is_some());

    // Watch the Lease through several renewals (each a MODIFIED event) — past the
    // lease duration, so the waiting replica would have taken an unrenewed Lease.
    let stream = watcher(
        api.clone(),
        watcher::Config::default().fields(&format!("metadata.name={LEASE}")),
    );
    let mut stream = std::pin::pin!(stream);
    let mut renewals = 0;
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut last_renew = None;
        while renewals < 15 || started.elapsed() < Duration::from_millis(1500) {
            let ev = stream.try_next().await.expect("watch").expect("open");
            if let watcher::Event::Apply(l) = ev {
                assert_eq!(holder(&l), NAMES[r.won], "the holder never changes");
                let renew = l.spec.as_ref().and_then(|s| s.renew_time.clone());
                if renew != last_renew {
                    renewals += 1;
                    last_renew = renew;
                }
            }
        }
    })
    .await
    .expect("renewals");
    assert!(*r.winner.borrow());
    assert!(!*r.loser.borrow(), "only one leads");
    assert_eq!(transitions(&lease(&api).await), 0, "nobody took it over");
    drop(r);
}

#[tokio::test]
async fn a_released_lease_is_taken_by_the_other_replica_at_once() {
    let (_server, client) = cluster().await;
    let api: Api<Lease> = Api::namespaced(client.clone(), NS);
    // A lease of 60 s: without the release, the other replica would wait a minute.
    let mut r = race(&client, Duration::from_secs(60)).await;

    r.leader.release().await;
    assert!(!*r.winner.borrow(), "the released replica no longer leads");
    until(&mut r.winner, false, Duration::from_secs(1), "released").await;

    takes_over(&mut r.loser).await;
    let l = lease(&api).await;
    assert_eq!(holder(&l), NAMES[1 - r.won]);
    assert_eq!(transitions(&l), 1, "one transition");
    assert_eq!(l.spec.as_ref().unwrap().lease_duration_seconds, Some(60));

    // The new holder releases too: the Lease is left with no holder, as client-go's
    // ReleaseOnCancel leaves it.
    r.other.release().await;
    let l = lease(&api).await;
    assert_eq!(holder(&l), "");
    assert_eq!(l.spec.as_ref().unwrap().lease_duration_seconds, Some(1));
    assert_eq!(transitions(&l), 1, "a release is no transition");
}

#[tokio::test]
async fn a_dropped_leader_is_replaced_after_the_lease_duration() {
    let (_server, client) = cluster().await;
    let api: Api<Lease> = Api::namespaced(client.clone(), NS);
    let lease_duration = Duration::from_secs(1);
    let mut r = race(&client, lease_duration).await;

    // Every version of the Lease from here on, in order, read in the background.
    let (versions_tx, mut versions) = tokio::sync::mpsc::unbounded_channel::<Option<Lease>>();
    let stream = watcher(
        api.clone(),
        watcher::Config::default().fields(&format!("metadata.name={LEASE}")),
    );
    let reader = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.try_next().await.expect("watch") {
            let sent = match ev {
                watcher::Event::Apply(l) | watcher::Event::InitApply(l) => {
                    versions_tx.send(Some(l))
                }
                // The initial list is in: the watch is running.
                watcher::Event::InitDone => versions_tx.send(None),
                _ => Ok(()),
            };
            if sent.is_err() {
                return;
            }
        }
    });
    // The dropped replica's last renewal (renewTime while it held the Lease).
    let mut last_renewal = None;
    tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(l) = versions.recv().await.expect("watching") {
            last_renewal = l.spec.and_then(|s| s.renew_time);
        }
    })
    .await
    .expect("the watch starts");

    drop(r.leader);
    // The dropped replica stops leading at once (its watch ends `false`).
    let _ = tokio::time::timeout(Duration::from_secs(5), r.winner.wait_for(|v| !*v)).await;
    assert!(!*r.winner.borrow());

    takes_over(&mut r.loser).await;
    // The last renewal of the dropped replica and the survivor's acquisition, as
    // the Lease recorded them (both written on this machine's clock).
    let acquired = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let Some(l) = versions.recv().await.expect("watching") else {
                continue;
            };
            let spec = l.spec.clone().unwrap_or_default();
            if holder(&l) == NAMES[r.won] {
                last_renewal = spec.renew_time.clone();
            } else if holder(&l) == NAMES[1 - r.won] {
                return (l, spec.acquire_time.clone().expect("acquireTime"));
            }
        }
    })
    .await
    .expect("the take-over is seen");
    reader.abort();
    let (l, acquired) = acquired;
    assert_eq!(transitions(&l), 1);
    assert_eq!(l.spec.as_ref().unwrap().renew_time, Some(acquired.clone()));
    // Nobody released: the survivor waited until the dropped replica's last renewal
    // was a full lease duration old.
    let last_renewal = last_renewal.expect("the dropped replica's renewals were seen");
    let waited = acquired.0.duration_since(last_renewal.0);
    assert!(
        waited >= k8s_openapi::jiff::SignedDuration::try_from(lease_duration).unwrap(),
        "taken over {waited:?} after the last renewal"
    );
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_stops_leading() {
    let (server, client) = cluster().await;
    let api: Api<Lease> = Api::namespaced(client.clone(), NS);
    let a = Leader::start(client.clone(), config("agentk-a", Duration::from_secs(1)));
    let mut ra = a.is_leader();
    until(&mut ra, true, Duration::from_secs(20), "the only replica").await;

    // Another client writes the Lease: held by someone else for a minute.
    let mut l = serde_json::to_value(lease(&api).await).unwrap();
    l["spec"]["holderIdentity"] = json!("intruder");
    l["spec"]["leaseDurationSeconds"] = json!(60);
    let stored = server.put("leases.coordination.k8s.io", NS, l);
    assert_eq!(stored["spec"]["holderIdentity"], "intruder", "{stored}");

    until(
        &mut ra,
        false,
        Duration::from_secs(20),
        "the overtaken replica",
    )
    .await;
    assert_eq!(holder(&lease(&api).await), "intruder", "left alone");
    a.release().await;
    assert_eq!(
        holder(&lease(&api).await),
        "intruder",
        "a replica that does not hold the Lease does not release it"
    );
}

#[tokio::test]
async fn an_invalid_configuration_never_leads() {
    let (_server, client) = cluster().await;
    let mut c = config("agentk-a", Duration::from_secs(1));
    c.renew_deadline = Duration::from_secs(5);
    assert!(c.validate().is_err());
    let a = Leader::start(client, c);
    assert!(!*a.is_leader().borrow());
    a.release().await;
}

//! Tests of churn: its rate, its events, determinism and realistic references.

use std::collections::BTreeSet;

use super::*;
use crate::KubeSim;
use crate::store::Event;

/// Everything the broadcast (what watches are fed from) has carried so far.
fn drain(rx: &mut tokio::sync::broadcast::Receiver<Event>) -> Vec<Event> {
    let mut out = Vec::new();
    while let Ok(e) = rx.try_recv() {
        out.push(e);
    }
    out
}

fn count(events: &[Event], kind: &str) -> u64 {
    events.iter().filter(|e| e.kind == kind).count() as u64
}

#[tokio::test(start_paused = true)]
async fn churn_steps_at_its_rate_and_every_write_is_an_event() {
    let sim = KubeSim::new(100_000);
    sim.generate(800, 5);
    let mut rx = sim.shared.events.subscribe();
    let churn = sim.start_churn(20.0, 9);
    // 20 a second: a step every 50 ms, the first 50 ms from now.
    tokio::time::sleep(Duration::from_millis(50 * 40 + 25)).await;
    let stats = churn.stats();
    assert_eq!(stats.steps, 40);
    let events = drain(&mut rx);
    assert_eq!(
        (
            count(&events, "ADDED"),
            count(&events, "MODIFIED"),
            count(&events, "DELETED")
        ),
        (stats.created, stats.updated, stats.deleted)
    );
    assert!(
        stats.created > 0 && stats.updated > 0 && stats.deleted > 0,
        "{stats:?}"
    );
    assert_eq!(
        events.len() as u64,
        stats.created + stats.updated + stats.deleted
    );

    // Dropped, it stops.
    drop(churn);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(drain(&mut rx).is_empty());

    // Faster than a step a millisecond: several a tick, the same rate.
    let churn = sim.start_churn(5000.0, 1);
    tokio::time::sleep(Duration::from_millis(10) + Duration::from_micros(500)).await;
    assert_eq!(churn.stats().steps, 50);
    // Not positive: nothing.
    let idle = sim.start_churn(0.0, 1);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(idle.stats(), ChurnStats::default());
}

/// (verb, resource, namespace, name) of each event.
fn trace(events: &[Event]) -> Vec<(String, String, String, String)> {
    events
        .iter()
        .map(|e| {
            (
                e.kind.to_owned(),
                e.resource.plural.to_owned(),
                e.object.index_namespace().to_owned(),
                e.object.index_name().to_owned(),
            )
        })
        .collect()
}

fn churned(seed: u64, steps: usize) -> (KubeSim, Vec<Event>) {
    let sim = KubeSim::new(100_000);
    sim.generate(1500, 2);
    let mut rx = sim.shared.events.subscribe();
    let mut churner = Churner::new(sim.shared.clone(), seed, Arc::default());
    let mut events = Vec::new();
    for _ in 0..steps {
        churner.step();
        events.extend(drain(&mut rx));
    }
    (sim, events)
}

#[test]
fn churn_is_deterministic_and_keeps_references_realistic() {
    let (sim, events) = churned(11, 3000);
    let (_, again) = churned(11, 3000);
    assert_eq!(
        trace(&events),
        trace(&again),
        "the same seed, the same writes"
    );
    let (_, other) = churned(12, 3000);
    assert_ne!(trace(&events), trace(&other));

    // Replay the events over the objects that existed before.
    let fresh = KubeSim::new(10);
    fresh.generate(1500, 2);
    let mut exists: BTreeSet<(String, String, String)> = fresh
        .objects()
        .iter()
        .map(|o| (o.resource.to_owned(), o.namespace.clone(), o.name.clone()))
        .collect();
    let uids: std::collections::BTreeMap<String, (String, String, String)> = fresh
        .objects()
        .iter()
        .map(|o| {
            (
                o.value()["metadata"]["uid"].as_str().unwrap().to_owned(),
                (o.resource.to_owned(), o.namespace.clone(), o.name.clone()),
            )
        })
        .collect();
    let mut uids = uids;
    let mut waited_for = BTreeSet::new();
    let (mut pending_created, mut dangling, mut owned_pods, mut replicasets_scaled) = (0, 0, 0, 0);
    for e in &events {
        let o = e.object.value();
        let key = (
            e.resource.plural.to_owned(),
            e.object.index_namespace().to_owned(),
            e.object.index_name().to_owned(),
        );
        let ns = key.1.clone();
        match e.kind {
            "ADDED" => {
                assert!(exists.insert(key.clone()), "{key:?} created twice");
                uids.insert(
                    o["metadata"]["uid"].as_str().unwrap().to_owned(),
                    key.clone(),
                );
                if key.0 == "pods" {
                    // Owned Pods name an owner that exists, by uid.
                    if let Some(r) = o["metadata"]["ownerReferences"].get(0) {
                        let owner = uids.get(r["uid"].as_str().unwrap()).expect("owner known");
                        assert!(exists.contains(owner), "{key:?}: owner {owner:?} gone");
                        assert_eq!(r["controller"], true);
                        owned_pods += 1;
                    }
                    for v in o["spec"]["volumes"].as_array().into_iter().flatten() {
                        if let Some(cm) = v["configMap"]["name"].as_str() {
                            let want = ("configmaps".to_owned(), ns.clone(), cm.to_owned());
                            if !exists.contains(&want) {
                                waited_for.insert(want);
                            }
                        }
                    }
                }
                if key.0 == "configmaps" && waited_for.contains(&key) {
                    pending_created += 1;
                }
            }
            "MODIFIED" => {
                assert!(exists.contains(&key), "{key:?} modified while absent");
                if key.0 == "replicasets" {
                    replicasets_scaled += 1;
                }
            }
            _ => {
                assert!(exists.remove(&key), "{key:?} deleted while absent");
                if key.0 == "configmaps"
                    && sim.objects().iter().any(|p| {
                        p.resource == "pods"
                            && p.namespace == ns
                            && p.json().contains(&format!("\"name\":\"{}\"", key.2))
                    })
                {
                    dangling += 1;
                }
            }
        }
    }
    // The replay and the store agree.
    let now: BTreeSet<(String, String, String)> = sim
        .objects()
        .iter()
        .map(|o| (o.resource.to_owned(), o.namespace.clone(), o.name.clone()))
        .collect();
    assert_eq!(now, exists);
    assert!(
        pending_created > 0,
        "a ConfigMap a Pod waited for was created"
    );
    assert!(!waited_for.is_empty());
    assert!(dangling > 0, "a ConfigMap still mounted was deleted");
    assert!(owned_pods > 50, "{owned_pods}");
    // The cluster neither grows nor shrinks much.
    let pods = |objects: &[(String, String, String)]| {
        objects.iter().filter(|(r, _, _)| r == "pods").count() as f64
    };
    let before: Vec<_> = fresh
        .objects()
        .iter()
        .map(|o| (o.resource.to_owned(), o.namespace.clone(), o.name.clone()))
        .collect();
    let after: Vec<_> = now.iter().cloned().collect();
    let (b, a) = (pods(&before), pods(&after));
    assert!(
        (a - b).abs() / b < 0.2,
        "pods: {b} before, {a} after 3000 steps"
    );
    let (b, a) = (before.len() as f64, after.len() as f64);
    assert!(
        (a - b).abs() / b < 0.1,
        "objects: {b} before, {a} after 3000 steps"
    );
    assert!(replicasets_scaled > 50, "{replicasets_scaled}");
}

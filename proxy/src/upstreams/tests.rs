use std::collections::BTreeMap;

use async_trait::async_trait;
use podgate_registry::Pod;
use prometheus::core::Collector;

use super::discovery::SystemResolver;
use super::*;

fn pod_id(n: u64) -> PodId {
    PodId::new(n).unwrap()
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn topology(pods: &[(u64, &[&str], &[&str])]) -> Topology {
    Topology {
        version: 1,
        pods: pods
            .iter()
            .map(|(id, web, kas)| {
                let mut p = Pod::new(pod_id(*id), format!("pod-{id}"), "x:1");
                p.web = web.iter().map(|s| s.to_string()).collect();
                p.kas = kas.iter().map(|s| s.to_string()).collect();
                (pod_id(*id), Arc::new(p))
            })
            .collect::<BTreeMap<_, _>>(),
        default_pod: Some(pod_id(pods[0].0)),
    }
}

fn no_checks() -> HealthConfig {
    HealthConfig {
        enabled: false,
        ..HealthConfig::default()
    }
}

/// A resolver answering from a table the test changes.
#[derive(Default)]
struct Names(Mutex<HashMap<String, Vec<SocketAddr>>>);

impl Names {
    fn set(&self, name: &str, addrs: &[&str]) {
        self.0
            .lock()
            .unwrap()
            .insert(name.into(), addrs.iter().map(|a| sa(a)).collect());
    }
}

#[async_trait]
impl Resolve for Names {
    async fn resolve(&self, host_port: &str) -> std::io::Result<Vec<SocketAddr>> {
        match self.0.lock().unwrap().get(host_port) {
            Some(a) if !a.is_empty() => Ok(a.clone()),
            _ => Err(std::io::Error::other("NXDOMAIN")),
        }
    }
}

fn gauge(pod: u64, pool: &str, upstream: &str) -> i64 {
    METRICS
        .upstream_healthy
        .with_label_values(&[pod.to_string().as_str(), pool, upstream])
        .get()
}

/// Every address a request may be sent to, first try and retries, in order.
fn attempts(u: &Upstreams, pod: u64, pool: Pool) -> Vec<SocketAddr> {
    let mut tried = Vec::new();
    while let Some(a) = u.select(pod_id(pod), pool, b"req", &tried) {
        assert!(!tried.contains(&a), "{a} chosen twice");
        tried.push(a);
    }
    assert!(!u.untried_left(pod_id(pod), pool, &tried));
    tried
}

#[tokio::test]
async fn retries_stay_within_the_pod_and_cover_all_its_addresses() {
    let u = Upstreams::new(
        no_checks(),
        UpstreamsConfig::default(),
        Arc::new(SystemResolver),
    );
    u.apply(&topology(&[
        (
            101,
            &["10.1.0.1:80", "10.1.0.2:80", "10.1.0.3:80"],
            &["10.1.0.9:8150"],
        ),
        (102, &["10.2.0.1:80"], &[]),
    ]))
    .await;
    let mut web = attempts(&u, 101, Pool::Web);
    web.sort();
    assert_eq!(
        web,
        vec![sa("10.1.0.1:80"), sa("10.1.0.2:80"), sa("10.1.0.3:80")]
    );
    assert_eq!(attempts(&u, 101, Pool::Kas), vec![sa("10.1.0.9:8150")]);
    assert_eq!(attempts(&u, 102, Pool::Web), vec![sa("10.2.0.1:80")]);
    assert_eq!(u.availability(pod_id(101), Pool::Web), Availability::Ready);
    assert_eq!(
        u.availability(pod_id(102), Pool::Kas),
        Availability::NoUpstream
    );
    assert_eq!(
        u.availability(pod_id(103), Pool::Web),
        Availability::NoUpstream
    );
    assert!(u.select(pod_id(102), Pool::Kas, b"", &[]).is_none());
    // kas's Kubernetes API proxy listener is a pool of its own.
    assert_eq!(
        u.availability(pod_id(101), Pool::KasK8sProxy),
        Availability::NoUpstream
    );
    let mut t = topology(&[(101, &["10.1.0.1:80"], &["10.1.0.9:8150"])]);
    let mut pod = (*t.pods[&pod_id(101)]).clone();
    pod.kas_k8s_proxy = vec!["10.1.0.9:8154".into()];
    pod.kas_workspaces = vec!["10.1.0.9:8160".into()];
    t.pods.insert(pod_id(101), Arc::new(pod));
    u.apply(&t).await;
    assert_eq!(
        attempts(&u, 101, Pool::KasK8sProxy),
        vec![sa("10.1.0.9:8154")]
    );
    // So is its Workspaces HTTP server's.
    assert_eq!(
        attempts(&u, 101, Pool::KasWorkspaces),
        vec![sa("10.1.0.9:8160")]
    );
    assert_eq!(attempts(&u, 101, Pool::Kas), vec![sa("10.1.0.9:8150")]);
}

#[tokio::test]
async fn round_robin_spreads_first_attempts_over_the_pod() {
    let u = Upstreams::new(
        no_checks(),
        UpstreamsConfig::default(),
        Arc::new(SystemResolver),
    );
    u.apply(&topology(&[(111, &["10.11.0.1:80", "10.11.0.2:80"], &[])]))
        .await;
    let firsts: HashSet<_> = (0..4)
        .map(|_| u.select(pod_id(111), Pool::Web, b"", &[]).unwrap())
        .collect();
    assert_eq!(firsts.len(), 2);
}

/// In a kas pool every request with one agent's token goes to the same kas (its
/// configuration stream and its tunnels must meet there); different agents spread
/// over the pool; a retry still takes another kas of the same Pod.
#[tokio::test]
async fn a_kas_pool_sends_one_agents_streams_to_one_kas() {
    let u = Upstreams::new(
        no_checks(),
        UpstreamsConfig::default(),
        Arc::new(SystemResolver),
    );
    let kas = ["10.12.0.1:8150", "10.12.0.2:8150", "10.12.0.3:8150"];
    u.apply(&topology(&[(112, &["10.12.0.9:80"], &kas)])).await;
    let mut chosen = HashSet::new();
    for agent in 0..32 {
        let token = format!("glagent-token-of-agent-{agent}");
        let first = u
            .select(pod_id(112), Pool::Kas, token.as_bytes(), &[])
            .unwrap();
        for _ in 0..20 {
            assert_eq!(
                u.select(pod_id(112), Pool::Kas, token.as_bytes(), &[]),
                Some(first),
                "agent {agent}'s streams went to two kas"
            );
        }
        let retry = u
            .select(pod_id(112), Pool::Kas, token.as_bytes(), &[first])
            .unwrap();
        assert_ne!(retry, first);
        assert!(kas.contains(&retry.to_string().as_str()));
        chosen.insert(first);
    }
    assert_eq!(chosen.len(), 3, "agents spread over every kas: {chosen:?}");
    // The web pool still spreads one key's requests (round robin).
    let firsts: HashSet<_> = (0..4)
        .map(|_| u.select(pod_id(112), Pool::Web, b"same", &[]).unwrap())
        .collect();
    assert_eq!(firsts.len(), 1, "one web address");
}

#[tokio::test]
async fn a_name_that_does_not_resolve_leaves_only_its_pod_without_addresses() {
    let names = Arc::new(Names::default());
    names.set("web.pod121:8080", &["10.21.0.1:8080"]);
    let u = Upstreams::new(no_checks(), UpstreamsConfig::default(), names.clone());
    u.apply(&topology(&[
        (121, &["web.pod121:8080"], &[]),
        (122, &["no-such-host.invalid:80"], &[]),
    ]))
    .await;
    assert_eq!(u.availability(pod_id(121), Pool::Web), Availability::Ready);
    assert_eq!(attempts(&u, 121, Pool::Web), vec![sa("10.21.0.1:8080")]);
    assert_eq!(
        u.availability(pod_id(122), Pool::Web),
        Availability::Unresolved
    );
    assert_eq!(
        Availability::Unresolved.reason(),
        Some("unresolved_upstream")
    );
    assert!(u.select(pod_id(122), Pool::Web, b"", &[]).is_none());
    assert_eq!(gauge(121, "web", "web.pod121:8080"), 1);
    assert_eq!(gauge(122, "web", "no-such-host.invalid:80"), 0);
}

/// Periodic re-resolution (driven by hand here): a new answer replaces the
/// addresses, a failure keeps the last good ones.
#[tokio::test]
async fn re_resolution_moves_traffic_and_keeps_the_last_good_set_on_failure() {
    let names = Arc::new(Names::default());
    names.set("web.pod131:8080", &["10.31.0.1:8080"]);
    let u = Upstreams::new(no_checks(), UpstreamsConfig::default(), names.clone());
    u.apply(&topology(&[(131, &["web.pod131:8080"], &[])]))
        .await;
    assert_eq!(attempts(&u, 131, Pool::Web), vec![sa("10.31.0.1:8080")]);

    names.set("web.pod131:8080", &["10.31.0.2:8080"]);
    u.resolve_all().await;
    assert_eq!(attempts(&u, 131, Pool::Web), vec![sa("10.31.0.2:8080")]);

    names.set("web.pod131:8080", &[]);
    u.resolve_all().await;
    assert_eq!(attempts(&u, 131, Pool::Web), vec![sa("10.31.0.2:8080")]);
    assert_eq!(u.availability(pod_id(131), Pool::Web), Availability::Ready);
}

/// The service loop re-resolves on its own every `resolve_interval_ms` (paused
/// time) and follows topology changes.
#[tokio::test(start_paused = true)]
async fn the_service_loop_re_resolves_periodically_and_follows_the_topology() {
    let names = Arc::new(Names::default());
    names.set("web.pod141:8080", &["10.41.0.1:8080"]);
    let config = UpstreamsConfig {
        resolve_interval_ms: 1_000,
        resolve_timeout_ms: 500,
        ..UpstreamsConfig::default()
    };
    let u = Arc::new(Upstreams::new(no_checks(), config, names.clone()));
    let (topo_tx, topo_rx) =
        watch::channel(Arc::new(topology(&[(141, &["web.pod141:8080"], &[])])));
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let task = tokio::spawn({
        let u = u.clone();
        async move { u.run(topo_rx, shutdown_rx, None).await }
    });
    let wait_for = |want: SocketAddr| {
        let u = u.clone();
        async move {
            // Each step lets the loop run; paused time only moves when all wait.
            for _ in 0..100 {
                if u.select(pod_id(141), Pool::Web, b"", &[]) == Some(want) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("never selected {want}");
        }
    };
    wait_for(sa("10.41.0.1:8080")).await;
    names.set("web.pod141:8080", &["10.41.0.2:8080"]);
    let changed_at = tokio::time::Instant::now();
    wait_for(sa("10.41.0.2:8080")).await;
    assert!(changed_at.elapsed() <= Duration::from_millis(1_100));

    topo_tx
        .send(Arc::new(topology(&[(141, &["10.41.0.3:8080"], &[])])))
        .unwrap();
    wait_for(sa("10.41.0.3:8080")).await;

    shutdown_tx.send(true).unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn an_unchanged_pod_keeps_its_load_balancer_and_a_changed_one_keeps_known_names() {
    let names = Arc::new(Names::default());
    names.set("web.pod151:8080", &["10.51.0.1:8080"]);
    let u = Upstreams::new(no_checks(), UpstreamsConfig::default(), names.clone());
    u.apply(&topology(&[
        (151, &["web.pod151:8080"], &[]),
        (152, &["10.52.0.1:80"], &[]),
    ]))
    .await;
    let before = u.shared.pools.load_full();
    // The name stops resolving, then Pod 151 gains an upstream and Pod 152 drains
    // (no upstream change).
    names.set("web.pod151:8080", &[]);
    let mut t = topology(&[
        (151, &["web.pod151:8080", "10.51.0.2:8080"], &[]),
        (152, &["10.52.0.1:80"], &[]),
    ]);
    Arc::make_mut(t.pods.get_mut(&pod_id(152)).unwrap()).state =
        podgate_registry::PodState::Draining;
    u.apply(&t).await;
    let after = u.shared.pools.load_full();
    assert!(Arc::ptr_eq(
        &before[&(pod_id(152), Pool::Web)],
        &after[&(pod_id(152), Pool::Web)]
    ));
    assert!(!Arc::ptr_eq(
        &before[&(pod_id(151), Pool::Web)],
        &after[&(pod_id(151), Pool::Web)]
    ));
    let mut got = attempts(&u, 151, Pool::Web);
    got.sort();
    assert_eq!(got, vec![sa("10.51.0.1:8080"), sa("10.51.0.2:8080")]);
    // A Pod that leaves the topology leaves the table and its gauges.
    u.apply(&topology(&[(152, &["10.52.0.1:80"], &[])])).await;
    assert_eq!(
        u.availability(pod_id(151), Pool::Web),
        Availability::NoUpstream
    );
    assert!(
        !METRICS
            .upstream_healthy
            .collect()
            .iter()
            .flat_map(|f| f.get_metric())
            .any(|m| m.get_label().iter().any(|l| l.value() == "web.pod151:8080"))
    );
}

/// The health checks (run by hand here, as their background service would): an
/// address that refuses connections turns unhealthy after `fall` failures, its Pod
/// then has no healthy upstream, and the failures are counted for every Pod
/// listing it.
#[tokio::test]
async fn failing_checks_take_an_address_out_and_count_for_each_pod() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let live = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let live_addr = live.local_addr().unwrap().to_string();
    let health = HealthConfig {
        fall: 2,
        rise: 1,
        timeout_ms: 500,
        ..HealthConfig::default()
    };
    let u = Upstreams::new(health, UpstreamsConfig::default(), Arc::new(SystemResolver));
    assert_eq!(
        u.health_services().len(),
        4,
        "web, kas, kas_k8s_proxy, kas_workspaces"
    );
    u.apply(&topology(&[
        (161, &[closed.as_str()], &[]),
        (162, &[closed.as_str()], &[live_addr.as_str()]),
    ]))
    .await;
    assert_eq!(gauge(161, "web", &closed), 1, "healthy until checked");
    let failures = |pod: u64| {
        METRICS
            .health_failures
            .with_label_values(&[pod.to_string().as_str(), closed.as_str()])
            .get()
    };

    u.web_health.run_health_check(true).await;
    u.kas_health.run_health_check(true).await;
    assert_eq!(u.availability(pod_id(161), Pool::Web), Availability::Ready);
    assert_eq!((failures(161), failures(162)), (1, 1));

    u.web_health.run_health_check(true).await;
    assert_eq!(
        u.availability(pod_id(161), Pool::Web),
        Availability::NoHealthy
    );
    assert_eq!(
        u.availability(pod_id(162), Pool::Web),
        Availability::NoHealthy
    );
    assert_eq!(u.availability(pod_id(162), Pool::Kas), Availability::Ready);
    assert_eq!(gauge(161, "web", &closed), 0);
    assert_eq!(gauge(162, "kas", &live_addr), 1);
    // A retry may still try it: a stale check must not strand a request.
    assert_eq!(attempts(&u, 161, Pool::Web), vec![sa(&closed)]);
}

#[test]
fn config_problems_name_fields() {
    let bad = UpstreamsConfig {
        resolve_interval_ms: 10,
        resolve_timeout_ms: 0,
        max_connections_per_address: 0,
        queue_timeout_ms: 0,
    }
    .problems()
    .join("\n");
    for f in [
        "upstreams.resolve_interval_ms",
        "upstreams.resolve_timeout_ms",
        "upstreams.queue_timeout_ms",
    ] {
        assert!(bad.contains(f), "{f}: {bad}");
    }
    assert!(UpstreamsConfig::default().problems().is_empty());
}

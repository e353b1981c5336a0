//! Service discovery for one (Pod, pool): the topology's `host:port` strings turned
//! into socket addresses, off the request path.
//!
//! An IP literal is taken as is. A name is resolved with tokio's resolver (the
//! system's `getaddrinfo`, on tokio's blocking pool) within a timeout, and every
//! address it resolves to becomes a backend. When a name fails to resolve, the
//! addresses it had last time are kept (a DNS outage must not empty a Pod), and the
//! failure is logged once, when it starts; the recovery is logged too. A name that
//! never resolved has no backend, so the Pod answers 503 `unresolved_upstream`
//! instead of a request resolving (and, in pingora 0.9, panicking) on its own.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pingora::lb::discovery::ServiceDiscovery;
use pingora::lb::{Backend, Extensions};

use super::Error;

/// Resolves `host:port` names. The system resolver in production; tests inject
/// their own.
#[async_trait]
pub trait Resolve: Send + Sync {
    /// Every address `host_port` (a name, never an IP literal) stands for.
    async fn resolve(&self, host_port: &str) -> std::io::Result<Vec<SocketAddr>>;
}

/// tokio's resolver: `getaddrinfo` on the blocking pool.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemResolver;

#[async_trait]
impl Resolve for SystemResolver {
    async fn resolve(&self, host_port: &str) -> std::io::Result<Vec<SocketAddr>> {
        Ok(tokio::net::lookup_host(host_port).await?.collect())
    }
}

/// What one configured upstream stands for now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Resolution {
    /// The addresses in use: the last good answer.
    addrs: Vec<SocketAddr>,
    /// The current failure, while the name does not resolve.
    failing: Option<String>,
}

/// The discovery of one (Pod, pool). Cheap to share: the load balancer owns one
/// handle, the upstream table another (for the per-upstream health gauge).
pub struct NameDiscovery {
    /// The Pod, for log lines.
    pod: String,
    /// `web` or `kas`, for log lines.
    pool: &'static str,
    upstreams: Vec<String>,
    resolver: Arc<dyn Resolve>,
    timeout: Duration,
    state: Mutex<BTreeMap<String, Resolution>>,
}

impl std::fmt::Debug for NameDiscovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NameDiscovery")
            .field("pod", &self.pod)
            .field("pool", &self.pool)
            .field("upstreams", &self.upstreams)
            .finish_non_exhaustive()
    }
}

impl NameDiscovery {
    /// Discovery of `upstreams` (as configured) for `pod`'s `pool`, resolving names
    /// with `resolver` within `timeout`. `previous`, when given, seeds the last good
    /// addresses of the names it shares (a topology change keeps what was known).
    pub fn new(
        pod: String,
        pool: &'static str,
        upstreams: Vec<String>,
        resolver: Arc<dyn Resolve>,
        timeout: Duration,
        previous: Option<&NameDiscovery>,
    ) -> Self {
        let mut state = BTreeMap::new();
        if let Some(prev) = previous {
            let prev = prev.lock();
            for u in &upstreams {
                if let Some(r) = prev.get(u) {
                    state.insert(u.clone(), r.clone());
                }
            }
        }
        NameDiscovery {
            pod,
            pool,
            upstreams,
            resolver,
            timeout,
            state: Mutex::new(state),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Resolution>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The upstreams as configured.
    pub fn upstreams(&self) -> &[String] {
        &self.upstreams
    }

    /// The addresses `upstream` stands for now (empty: never resolved).
    pub fn addrs_of(&self, upstream: &str) -> Vec<SocketAddr> {
        self.lock()
            .get(upstream)
            .map(|r| r.addrs.clone())
            .unwrap_or_default()
    }

    /// Resolve one upstream. An IP literal never waits.
    async fn lookup(&self, upstream: &str) -> Result<Vec<SocketAddr>, Error> {
        if let Ok(addr) = upstream.parse::<SocketAddr>() {
            return Ok(vec![addr]);
        }
        let failed = |source| Error::Resolve {
            upstream: upstream.to_owned(),
            source,
        };
        let addrs = tokio::time::timeout(self.timeout, self.resolver.resolve(upstream))
            .await
            .map_err(|_| Error::ResolveTimeout {
                upstream: upstream.to_owned(),
                after: self.timeout,
            })?
            .map_err(failed)?;
        if addrs.is_empty() {
            return Err(failed(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no addresses",
            )));
        }
        Ok(addrs)
    }

    /// Resolve every upstream (names concurrently), record the outcome, and return
    /// the addresses now in use.
    pub async fn refresh(&self) -> BTreeSet<SocketAddr> {
        let results =
            futures_util::future::join_all(self.upstreams.iter().map(|u| self.lookup(u))).await;
        let mut state = self.lock();
        let mut all = BTreeSet::new();
        for (upstream, result) in self.upstreams.iter().zip(results) {
            let entry = state.entry(upstream.clone()).or_default();
            match result {
                Ok(mut addrs) => {
                    addrs.sort_unstable();
                    addrs.dedup();
                    if entry.failing.take().is_some() {
                        tracing::warn!(pod = %self.pod, pool = self.pool, upstream, addrs = ?addrs, "upstream resolves again");
                    }
                    entry.addrs = addrs;
                }
                Err(e) => {
                    let message = e.to_string();
                    if entry.failing.as_deref() != Some(message.as_str()) {
                        tracing::warn!(
                            pod = %self.pod,
                            pool = self.pool,
                            upstream,
                            kept = ?entry.addrs,
                            error = %message,
                            "upstream does not resolve; keeping its last good addresses"
                        );
                    }
                    entry.failing = Some(message);
                }
            }
            all.extend(entry.addrs.iter().copied());
        }
        state.retain(|u, _| self.upstreams.contains(u));
        all
    }
}

/// The [`ServiceDiscovery`] pingora's load balancer runs: a handle on a shared
/// [`NameDiscovery`].
pub struct Discovery(pub Arc<NameDiscovery>);

#[async_trait]
impl ServiceDiscovery for Discovery {
    async fn discover(&self) -> pingora::Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        let backends = self
            .0
            .refresh()
            .await
            .into_iter()
            .map(|addr| Backend {
                addr: pingora::protocols::l4::socket::SocketAddr::Inet(addr),
                weight: 1,
                ext: Extensions::new(),
            })
            .collect();
        Ok((backends, HashMap::new()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Answers from a table that the test changes; counts calls; a name mapped to
    /// `None` hangs forever.
    #[derive(Default)]
    struct Table {
        answers: Mutex<HashMap<String, Option<std::io::Result<Vec<SocketAddr>>>>>,
        calls: AtomicUsize,
    }

    impl Table {
        fn set(&self, name: &str, answer: Option<std::io::Result<Vec<SocketAddr>>>) {
            self.answers.lock().unwrap().insert(name.into(), answer);
        }
    }

    #[async_trait]
    impl Resolve for Table {
        async fn resolve(&self, host_port: &str) -> std::io::Result<Vec<SocketAddr>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let answer = match self.answers.lock().unwrap().get(host_port) {
                Some(Some(Ok(a))) => Some(Ok(a.clone())),
                Some(Some(Err(e))) => Some(Err(std::io::Error::new(e.kind(), e.to_string()))),
                Some(None) => None,
                None => Some(Err(std::io::Error::other("unknown name"))),
            };
            match answer {
                Some(a) => a,
                None => std::future::pending().await,
            }
        }
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn discovery(table: &Arc<Table>, upstreams: &[&str]) -> NameDiscovery {
        NameDiscovery::new(
            "2".into(),
            "web",
            upstreams.iter().map(|s| s.to_string()).collect(),
            table.clone(),
            Duration::from_secs(2),
            None,
        )
    }

    #[tokio::test]
    async fn literals_are_taken_as_is_and_never_resolved() {
        let table = Arc::new(Table::default());
        let d = discovery(&table, &["10.0.0.1:80", "[::1]:8080"]);
        assert_eq!(
            d.refresh().await,
            BTreeSet::from([sa("10.0.0.1:80"), sa("[::1]:8080")])
        );
        assert_eq!(table.calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_name_becomes_every_address_it_resolves_to() {
        let table = Arc::new(Table::default());
        table.set(
            "web.pod2:8080",
            Some(Ok(vec![sa("10.0.0.2:8080"), sa("10.0.0.1:8080")])),
        );
        let d = discovery(&table, &["web.pod2:8080", "10.0.0.9:80"]);
        assert_eq!(
            d.refresh().await,
            BTreeSet::from([sa("10.0.0.1:8080"), sa("10.0.0.2:8080"), sa("10.0.0.9:80")])
        );
        assert_eq!(
            d.addrs_of("web.pod2:8080"),
            vec![sa("10.0.0.1:8080"), sa("10.0.0.2:8080")]
        );
    }

    #[tokio::test]
    async fn a_name_that_never_resolved_has_no_backend_and_others_stay() {
        let table = Arc::new(Table::default());
        let d = discovery(&table, &["no-such-host.invalid:80", "10.0.0.9:80"]);
        assert_eq!(d.refresh().await, BTreeSet::from([sa("10.0.0.9:80")]));
        assert!(d.addrs_of("no-such-host.invalid:80").is_empty());
    }

    /// Re-resolution: a changed answer replaces the addresses, a failure (error or
    /// timeout) keeps the last good ones, and a later answer is taken again.
    #[tokio::test(start_paused = true)]
    async fn re_resolution_follows_changes_and_keeps_the_last_good_set() {
        let table = Arc::new(Table::default());
        let d = discovery(&table, &["web.pod2:8080"]);
        table.set("web.pod2:8080", Some(Ok(vec![sa("10.0.0.1:8080")])));
        assert_eq!(d.refresh().await, BTreeSet::from([sa("10.0.0.1:8080")]));

        table.set("web.pod2:8080", Some(Ok(vec![sa("10.0.0.2:8080")])));
        assert_eq!(d.refresh().await, BTreeSet::from([sa("10.0.0.2:8080")]));

        table.set(
            "web.pod2:8080",
            Some(Err(std::io::Error::other("SERVFAIL"))),
        );
        assert_eq!(d.refresh().await, BTreeSet::from([sa("10.0.0.2:8080")]));

        // A resolver that hangs: the timeout (paused time jumps to it) ends the
        // attempt, and the last good set stays.
        table.set("web.pod2:8080", None);
        let started = tokio::time::Instant::now();
        assert_eq!(d.refresh().await, BTreeSet::from([sa("10.0.0.2:8080")]));
        assert_eq!(started.elapsed(), Duration::from_secs(2));

        table.set("web.pod2:8080", Some(Ok(vec![sa("10.0.0.3:8080")])));
        assert_eq!(d.refresh().await, BTreeSet::from([sa("10.0.0.3:8080")]));
        assert_eq!(table.calls.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn a_topology_change_keeps_what_was_known_of_shared_names() {
        let table = Arc::new(Table::default());
        table.set("a:1", Some(Ok(vec![sa("10.0.0.1:1")])));
        let old = discovery(&table, &["a:1"]);
        old.refresh().await;
        table.set("a:1", Some(Err(std::io::Error::other("down"))));
        let new = NameDiscovery::new(
            "2".into(),
            "web",
            vec!["a:1".into(), "10.0.0.5:1".into()],
            table.clone(),
            Duration::from_secs(2),
            Some(&old),
        );
        assert_eq!(
            new.refresh().await,
            BTreeSet::from([sa("10.0.0.1:1"), sa("10.0.0.5:1")])
        );
    }
}

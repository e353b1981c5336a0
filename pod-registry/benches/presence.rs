//! Presence at scale against a local redis-server: register 100k agent connections,
//! refresh them all, look them up.
//!
//! Run: `cargo bench -p podgate-registry --bench presence`
//! Goals (issue 3): refresh of 100k ≤ 1 s; lookup p99 ≤ 1 ms.
//! Under `cargo test --benches` it runs a 1k-connection smoke version.

use std::time::{Duration, Instant};

use futures_util::{StreamExt as _, stream};
use podgate_registry::testing::RedisServer;
use podgate_registry::{AgentConnection, BackendConfig, Registry, RegistryConfig};

fn conn(i: i64) -> AgentConnection {
    AgentConnection {
        agent_id: i,
        connection_id: 1_000_000 + i,
        project_id: i / 10,
        version: "v17.6.0".into(),
        commit: "0123abcd".into(),
        pod_namespace: "gitlab-agent".into(),
        pod_name: format!("agentk-7d9f8c6b5-{i:05}"),
        kubernetes_version: None,
        connected_at_ms: 1_700_000_000_000,
        kas: "grpc://10.0.0.5:8155".into(),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// Print throughput and latency percentiles of one lookup run.
fn report(label: &str, mut lat: Vec<Duration>, took: Duration) {
    lat.sort();
    println!(
        "{label} ({:.0}/s): p50 {:?}  p90 {:?}  p99 {:?}  p99.9 {:?}  max {:?}",
        lat.len() as f64 / took.as_secs_f64(),
        percentile(&lat, 0.50),
        percentile(&lat, 0.90),
        percentile(&lat, 0.99),
        percentile(&lat, 0.999),
        lat[lat.len() - 1]
    );
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let n: i64 = if full { 100_000 } else { 1_000 };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start();
    rt.block_on(async {
        let registry = Registry::connect(RegistryConfig {
            backend: BackendConfig::Redis { url: server.url() },
            // Long periods: the background tasks must not run during the measurement.
            ttl: Duration::from_secs(3600),
            refresh_interval: Duration::from_secs(1800),
            gc_interval: Duration::from_secs(3600),
            ..RegistryConfig::default()
        })
        .await
        .unwrap();

        let t = Instant::now();
        let failures = stream::iter(0..n)
            .map(|i| {
                let r = registry.clone();
                async move { r.register_agent(conn(i)).await.is_err() }
            })
            .buffer_unordered(256)
            .filter(|failed| std::future::ready(*failed))
            .count()
            .await;
        assert_eq!(failures, 0);
        let register = t.elapsed();
        println!(
            "register {n} connections: {register:?} ({:.0}/s)",
            n as f64 / register.as_secs_f64()
        );

        let mut refreshes = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            assert_eq!(registry.refresh().await.unwrap(), n as usize);
            refreshes.push(t.elapsed());
        }
        refreshes.sort();
        println!(
            "refresh {n} connections, 5 runs: min {:?}  median {:?}  max {:?}",
            refreshes[0], refreshes[2], refreshes[4]
        );

        let lookups = n.min(100_000);
        let mut lat = Vec::with_capacity(lookups as usize);
        let t = Instant::now();
        for i in 0..lookups {
            let agent = (i * 7919) % n;
            let s = Instant::now();
            let found = registry.connections_by_agent(agent).await.unwrap();
            lat.push(s.elapsed());
            assert_eq!(found.len(), 1);
        }
        report(
            &format!("lookup by agent, {lookups} one at a time"),
            lat,
            t.elapsed(),
        );

        let mut lat = Vec::with_capacity(lookups as usize);
        let t = Instant::now();
        for i in 0..lookups {
            let s = Instant::now();
            let found = registry
                .connections_by_project((i * 31) % (n / 10))
                .await
                .unwrap();
            lat.push(s.elapsed());
            assert_eq!(found.len(), 10);
        }
        report(
            &format!("lookup by project (10 connections each), {lookups} one at a time"),
            lat,
            t.elapsed(),
        );

        let t = Instant::now();
        let lat: Vec<Duration> = stream::iter(0..lookups)
            .map(|i| {
                let r = registry.clone();
                async move {
                    let s = Instant::now();
                    let found = r.connections_by_project((i * 31) % (n / 10)).await.unwrap();
                    assert_eq!(found.len(), 10);
                    s.elapsed()
                }
            })
            .buffer_unordered(32)
            .collect()
            .await;
        report(
            &format!("lookup by project (10 connections each), {lookups} with 32 in flight"),
            lat,
            t.elapsed(),
        );
        let info = server.cli(&["INFO", "memory"]);
        let used = info
            .lines()
            .find_map(|l| l.strip_prefix("used_memory_human:"))
            .unwrap_or("?");
        println!("redis used_memory: {}", used.trim());
    });
}

//! The Topology Service on Redis: `Classify` requests per second and their
//! latency (32 concurrent callers over h2c, as many Cells' gitlab-shell and mail
//! room would call), and the memory claims take on a Redis Cluster.
//!
//! Run: `cargo bench -p podgate-topology-service --bench claims` (10,000 claims
//! classified for 10 s; 100,000 claims on a 3-master Cluster, Redis's
//! `used_memory` before and after, per claim and for 1,000,000). Under
//! `cargo test --benches` it runs a smoke version (1,000 claims, 1 s).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use podgate_registry::testing::{RedisCluster, RedisServer};
use podgate_topology_service::classify::ClassifyRequest;
use podgate_topology_service::config::Config;
use podgate_topology_service::proto::gitlab::cells::topology_service as ts;
use podgate_topology_service::server::Bound;
use ts::claims::v1 as cv1;
use ts::types::v1::{Claim, claim};

const CELLS: &str = "[[cells]]\nid = 1\naddress = \"cell-1.example.com:443\"\nsession_prefix = \"cell-1\"\n\
                     [[cells]]\nid = 2\naddress = \"cell-2.example.com:443\"\nsession_prefix = \"cell-2\"\n";

/// A Topology Service on `backend` (a `[claims]` backend table), serving; its
/// address.
async fn start(backend: &str) -> std::net::SocketAddr {
    let config = Config::parse(
        &format!("listen = \"127.0.0.1:0\"\n{CELLS}[claims]\nbackend = {backend}\n"),
        "bench",
    )
    .unwrap();
    let bound = Bound::bind(&config).await.unwrap();
    let addr = bound.local_addr().unwrap();
    tokio::spawn(bound.serve(std::future::pending()));
    addr
}

async fn channel(addr: std::net::SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// `n` routes `ns-<i>` claimed by Cell 2, in leases of 500, as Rails claims them.
async fn claim(addr: std::net::SocketAddr, n: u64) {
    let mut c = cv1::claim_service_client::ClaimServiceClient::new(channel(addr).await)
        .max_decoding_message_size(16 << 20)
        .max_encoding_message_size(16 << 20);
    let ids: Vec<u64> = (0..n).collect();
    for batch in ids.chunks(500) {
        let create = batch
            .iter()
            .map(|i| cv1::Metadata {
                bucket: Some(cv1::Bucket {
                    r#type: cv1::bucket::Type::Routes as i32,
                    value: format!("ns-{i}"),
                }),
                subject: Some(cv1::Subject {
                    r#type: cv1::subject::Type::Namespace as i32,
                    id: *i as i64,
                }),
                source: Some(cv1::Source {
                    r#type: cv1::source::Type::RailsTableRoutes as i32,
                    rails_primary_key_id: i.to_be_bytes().to_vec(),
                }),
                ..Default::default()
            })
            .collect();
        let lease = c
            .begin_update(cv1::BeginUpdateRequest {
                create_records: create,
                cell_id: 2,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .lease_uuid;
        c.commit_update(cv1::CommitUpdateRequest {
            cell_id: 2,
            lease_uuid: lease,
        })
        .await
        .unwrap();
    }
}

/// Redis's `used_memory` of the server at `url`.
fn used_memory(url: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let mut c = client.get_connection().unwrap();
    let info: String = redis::cmd("INFO").arg("memory").query(&mut c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (claims, secs, cluster_claims) = if full {
        (10_000, 10, 100_000)
    } else {
        (1_000, 1, 1_000)
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start();
    rt.block_on(async {
        let addr = start(&format!("{{ kind = \"redis\", url = \"{}\" }}", server.url())).await;
        claim(addr, claims).await;
        // 32 callers on 4 connections, each asking for a route claimed or not (a
        // fifth unclaimed: NOT_FOUND), with the fallback chain of a path lookup.
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for t in 0..32u64 {
            let ch = channel(addr).await;
            let stop = stop.clone();
            tasks.push(tokio::spawn(async move {
                let mut c = ts::classify_service_client::ClassifyServiceClient::new(ch);
                let mut hist = hdrhistogram::Histogram::<u64>::new(3).unwrap();
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    i = i.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let n = (i >> 33) % (claims + claims / 4);
                    let route = format!("ns-{n}");
                    let began = Instant::now();
                    let r = c
                        .classify(ClassifyRequest {
                            claims: vec![
                                Claim {
                                    claim: Some(claim::Claim::Route(route.clone())),
                                },
                                Claim {
                                    claim: Some(claim::Claim::RedirectRoute(route)),
                                },
                            ],
                            ..Default::default()
                        })
                        .await;
                    assert!(
                        r.is_ok() || r.as_ref().unwrap_err().code() == tonic::Code::NotFound,
                        "{r:?}"
                    );
                    hist.record(began.elapsed().as_micros() as u64).unwrap();
                }
                hist
            }));
        }
        tokio::time::sleep(Duration::from_secs(secs)).await;
        stop.store(true, Ordering::Relaxed);
        let mut all = hdrhistogram::Histogram::<u64>::new(3).unwrap();
        for t in tasks {
            all.add(t.await.unwrap()).unwrap();
        }
        let took = started.elapsed().as_secs_f64();
        println!(
            "classify on Redis, {claims} claims, 32 callers: {:.0} req/s, p50 {} µs, p99 {} µs, p99.9 {} µs ({} requests in {took:.1} s)",
            all.len() as f64 / took,
            all.value_at_quantile(0.5),
            all.value_at_quantile(0.99),
            all.value_at_quantile(0.999),
            all.len()
        );
    });
    drop(server);

    let cluster = RedisCluster::start();
    rt.block_on(async {
        let urls = cluster.urls();
        let before: u64 = urls.iter().map(|u| used_memory(u)).sum();
        let addr = start(&format!("{{ kind = \"redis-cluster\", nodes = {urls:?} }}")).await;
        claim(addr, cluster_claims).await;
        let after: u64 = urls.iter().map(|u| used_memory(u)).sum();
        let per = (after.saturating_sub(before)) as f64 / cluster_claims as f64;
        println!(
            "claims on a 3-master Redis Cluster: {cluster_claims} claims took {:.1} MB ({per:.0} B a claim): 1,000,000 would take {:.0} MB",
            (after - before) as f64 / 1e6,
            per * 1e6 / 1e6
        );
    });
}

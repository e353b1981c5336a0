//! kube-sim at scale: generation time, resident memory, `objects()`, a cluster-wide
//! Pod list and a cluster-wide kube-runtime watch start, for 5,000 and 50,000
//! objects; then the same watch under churn. Figures, not assertions.
//!
//! `cargo bench -p podgate-kube-sim --bench kube_sim` (`KUBE_SIM_OBJECTS=50000` for
//! one size only).

use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Api;
use kube::runtime::watcher;
use podgate_kube_sim::KubeSim;

/// This process's resident set, in MiB, from /proc/self/status.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

async fn client(url: &str) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(&podgate_kube_sim::kubeconfig(url))
        .expect("a kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("a config");
    kube::Client::try_from(config).expect("a client")
}

/// Time until a cluster-wide watcher of `K` has its initial state: (time, objects).
async fn watch_start<K>(client: kube::Client) -> (Duration, usize)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    let t = Instant::now();
    let mut n = 0;
    let mut stream = watcher(Api::<K>::all(client), watcher::Config::default()).boxed();
    while let Some(e) = stream.next().await {
        match e.expect("the watch") {
            watcher::Event::InitApply(_) => n += 1,
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    (t.elapsed(), n)
}

async fn run(objects: usize) {
    println!("== {objects} objects");
    let before = rss_mib();
    let sim = KubeSim::new(10_000);
    let t = Instant::now();
    let n = sim.generate(objects, 1);
    println!("generate: {n} objects in {:.2?}", t.elapsed());
    println!(
        "RSS: {:.0} MiB (process before: {before:.0} MiB)",
        rss_mib()
    );
    let t = Instant::now();
    let all = sim.objects();
    let bytes: usize = all.iter().map(|o| o.json().len()).sum();
    println!(
        "objects(): {} in {:.2?}, {:.1} MiB of JSON",
        all.len(),
        t.elapsed(),
        bytes as f64 / 1048576.0
    );
    let t = Instant::now();
    let parsed = all.iter().filter(|o| o.value().is_object()).count();
    println!("objects() all parsed: {parsed} in {:.2?}", t.elapsed());
    drop(all);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn({
        let sim = sim.clone();
        async move { sim.serve(listener, std::future::pending()).await }
    });
    let client = client(&url).await;
    let t = Instant::now();
    let pods = Api::<Pod>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("a list");
    println!("list pods -A: {} in {:.2?}", pods.items.len(), t.elapsed());
    drop(pods);
    let (d, n) = watch_start::<Pod>(client.clone()).await;
    println!("watcher start, pods -A: {n} in {d:.2?}");
    let (d, n) = watch_start::<ConfigMap>(client.clone()).await;
    println!("watcher start, configmaps -A: {n} in {d:.2?}");
    println!("RSS after serving: {:.0} MiB", rss_mib());

    // Under churn: the watch start while 200 changes a second go on.
    let churn = sim.start_churn(200.0, 1);
    let (d, n) = watch_start::<Pod>(client.clone()).await;
    println!("watcher start under churn (200/s), pods -A: {n} in {d:.2?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!("churn after 2 s more: {:?}", churn.stats());
    drop(churn);
    server.abort();
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let sizes: Vec<usize> = match std::env::var("KUBE_SIM_OBJECTS") {
        Ok(v) => vec![v.parse().expect("KUBE_SIM_OBJECTS: a number")],
        Err(_) => vec![5_000, 50_000],
    };
    for objects in sizes {
        rt.block_on(run(objects));
    }
}

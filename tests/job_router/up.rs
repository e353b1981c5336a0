//! `podgate up --no-fleet` on free ports for the end-to-end tests, and what they ask
//! of it: runners registered through the proxy, jobs queued through a Pod's control
//! API, and each Pod's kas metrics.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use podgate_registry::testing::free_port;
use serde_json::{Value, json};

use super::gitlab::{Reply, exchange};
use crate::common::metrics::value_or_zero;
use crate::common::process::Terminated;
use crate::common::spawn_up;

/// How long `podgate up` may take to print `podgate up: ready`.
const READY_WITHIN: Duration = Duration::from_secs(180);

/// Flags every start gets besides the caller's: no fleet (the tests are the runners)
/// and no Kubernetes side (every Pod has its kas without it).
const BASE: [&str; 4] = ["--no-fleet", "--no-kube", "--duration", "15m"];

/// One Pod as `podgate up` printed it.
#[derive(Clone, Debug)]
pub struct Pod {
    pub id: u64,
    /// Its GitLab (the simulator), which serves the control API.
    pub address: SocketAddr,
    pub registration_token: String,
    /// Its kas's Prometheus endpoint.
    pub kas_metrics: String,
}

/// A runner registered on a Pod.
#[derive(Clone, Debug)]
pub struct Runner {
    pub id: u64,
    pub token: String,
}

/// `podgate up`, stopped (SIGTERM) when dropped.
pub struct Up {
    _process: Terminated,
    /// The proxy's listener.
    pub listen: SocketAddr,
    /// `http://<listen>`: GitLab's URL for the runners.
    pub proxy: String,
    pub pods: Vec<Pod>,
}

impl Up {
    /// `podgate up --no-fleet ARGS` on free ports, once it is ready.
    pub async fn start(args: &[&str]) -> Up {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        tokio::task::spawn_blocking(move || Up::start_blocking(&args))
            .await
            .unwrap()
    }

    fn start_blocking(args: &[String]) -> Up {
        let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let ports = [
            "--listen".to_owned(),
            listen.to_string(),
            "--admin".to_owned(),
            format!("127.0.0.1:{}", free_port()),
            "--tls-listen".to_owned(),
            format!("127.0.0.1:{}", free_port()),
        ];
        let (child, lines) = spawn_up(
            BASE.iter()
                .map(|a| (*a).to_owned())
                .chain(ports)
                .chain(args.iter().cloned()),
        );
        let process = Terminated(child);
        let deadline = Instant::now() + READY_WITHIN;
        let mut printed = String::new();
        let mut pods = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = lines.recv_timeout(left).unwrap_or_else(|_| {
                panic!("podgate up {args:?}: not ready after {READY_WITHIN:?}:\n{printed}")
            });
            printed.push_str(&line);
            printed.push('\n');
            if line.contains("podgate up: ready") {
                break;
            }
            if let Some(pod) = parse_pod(&line) {
                pods.push(pod);
            }
        }
        assert_eq!(pods.len(), 3, "{printed}");
        Up {
            _process: process,
            listen,
            proxy: format!("http://{listen}"),
            pods,
        }
    }

    /// The router URL discovery should name for `scheme` (`--job-router-scheme`).
    pub fn router_url(&self, scheme: &str) -> String {
        match scheme {
            "ws" => format!("ws://{}/-/kubernetes-agent/", self.listen),
            _ => format!("grpc://{}", self.listen),
        }
    }

    /// Registers a runner with `pod`'s registration token, through the proxy.
    pub async fn register_runner(&self, pod: &Pod) -> Runner {
        let reply = call(
            Method::POST,
            &format!("{}/api/v4/runners", self.proxy),
            Some(&json!({
                "token": pod.registration_token,
                "description": format!("job-router-test-pod-{}", pod.id),
            })),
        )
        .await;
        assert_eq!(
            reply.status,
            StatusCode::CREATED,
            "registering on Pod {}",
            pod.id
        );
        let body = reply.json();
        let token = body["token"].as_str().expect("a token").to_owned();
        assert!(
            token.starts_with("glrt-"),
            "Pod {}: not a runner token",
            pod.id
        );
        Runner {
            id: body["id"].as_u64().expect("an id"),
            token,
        }
    }
}

/// `method url` with a JSON body, which must get an answer.
async fn call(method: Method, url: &str, body: Option<&Value>) -> Reply {
    exchange(method.clone(), url, &[], body)
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e:?}"))
}

/// `  pod id=2 address=http://… registration_token=glrt-… control_api=… kas_metrics=…`.
fn parse_pod(line: &str) -> Option<Pod> {
    let fields: BTreeMap<&str, &str> = line
        .trim()
        .strip_prefix("pod ")?
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let address = fields
        .get("address")?
        .strip_prefix("http://")?
        .parse()
        .ok()?;
    let kas_metrics = fields
        .get("kas_metrics")
        .unwrap_or_else(|| panic!("no kas_metrics= on the Pod's line: {line}"));
    Some(Pod {
        id: fields.get("id")?.parse().ok()?,
        address,
        registration_token: fields.get("registration_token")?.to_string(),
        kas_metrics: kas_metrics.to_string(),
    })
}

impl Pod {
    /// Queues a job named `name` through the control API: its id.
    pub async fn queue_job(&self, name: &str) -> u64 {
        let reply = call(
            Method::POST,
            &format!("http://{}/-/podsim/jobs", self.address),
            Some(&json!({
                "name": name,
                "stage": "test",
                "image": null,
                "script": ["true"],
                "artifacts": [],
                "dependencies": [],
            })),
        )
        .await;
        assert_eq!(
            reply.status,
            StatusCode::CREATED,
            "queueing on Pod {}",
            self.id
        );
        reply.json()["id"].as_u64().expect("a job id")
    }

    /// The control API's view of job `id`: `state`, `runner_id`, ….
    pub async fn job(&self, id: u64) -> Value {
        let reply = call(
            Method::GET,
            &format!("http://{}/-/podsim/jobs/{id}", self.address),
            None,
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "job {id} of Pod {}", self.id);
        reply.json()
    }

    /// The sum of the kas samples `selector` picks (0 when none).
    pub async fn kas_metric(&self, selector: &str) -> f64 {
        let reply = call(Method::GET, &self.kas_metrics, None).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", self.kas_metrics);
        value_or_zero(&String::from_utf8_lossy(&reply.body), selector)
    }
}

/// `CI_POD_ID`, the simulator's own variable in every job payload: which Pod made it.
pub fn pod_of(job: &Value) -> Option<u64> {
    job["variables"]
        .as_array()?
        .iter()
        .find(|v| v["key"] == "CI_POD_ID")?["value"]
        .as_str()?
        .parse()
        .ok()
}

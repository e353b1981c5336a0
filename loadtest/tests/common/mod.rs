//! Helpers shared by the Pod simulator tests: one raw HTTP/1.1 request per
//! connection (so every byte of the request is the test's), simulators on ephemeral
//! ports, and request bodies in each form GitLab accepts.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use podgate_loadtest::pod_sim::{PodSim, PodSimConfig};
use podgate_tokens::PodId;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: HashMap<String, String>,
    pub(crate) body: Vec<u8>,
}

impl Reply {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// One request over a fresh HTTP/1.1 connection; `headers` are `name: value` lines.
pub(crate) async fn call(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[&str],
    body: &[u8],
) -> Reply {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut head = format!(
        "{method} {target} HTTP/1.1\r\nhost: pod\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    if headers
        .get("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    Reply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") {
        let n =
            usize::from_str_radix(std::str::from_utf8(&raw[..eol]).unwrap().trim(), 16).unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&raw[eol + 2..eol + 2 + n]);
        raw = &raw[eol + 2 + n + 2..];
    }
    out
}

/// A JSON request.
pub(crate) async fn json(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[&str],
    body: Value,
) -> Reply {
    let mut h = vec!["content-type: application/json"];
    h.extend_from_slice(headers);
    call(addr, method, path, &h, body.to_string().as_bytes()).await
}

/// An `application/x-www-form-urlencoded` request; `body` is sent as written.
pub(crate) async fn form(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &str,
) -> Reply {
    let mut h = vec!["content-type: application/x-www-form-urlencoded"];
    h.extend_from_slice(headers);
    call(addr, method, path, &h, body.as_bytes()).await
}

/// A multipart part: its head lines (after the boundary) and its content.
pub(crate) struct Part<'a> {
    pub(crate) head: String,
    pub(crate) body: &'a [u8],
}

/// A plain field.
pub(crate) fn field<'a>(name: &str, value: &'a str) -> Part<'a> {
    Part {
        head: format!("Content-Disposition: form-data; name=\"{name}\""),
        body: value.as_bytes(),
    }
}

/// A file part.
pub(crate) fn file<'a>(name: &str, filename: &str, body: &'a [u8]) -> Part<'a> {
    Part {
        head: format!(
            "Content-Disposition: form-data; name=\"{name}\"; filename=\"{filename}\"\r\nContent-Type: application/octet-stream"
        ),
        body,
    }
}

pub(crate) const BOUNDARY: &str = "podsim-test-boundary";

/// A `multipart/form-data` body of `parts`.
pub(crate) fn multipart_body(parts: &[Part<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(format!("--{BOUNDARY}\r\n{}\r\n\r\n", p.head).as_bytes());
        out.extend_from_slice(p.body);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    out
}

/// A multipart request.
pub(crate) async fn multipart(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[&str],
    parts: &[Part<'_>],
) -> Reply {
    let ct = format!("content-type: multipart/form-data; boundary={BOUNDARY}");
    let mut h = vec![ct.as_str()];
    h.extend_from_slice(headers);
    call(addr, method, path, &h, &multipart_body(parts)).await
}

/// A simulator for Pod `pod` on an ephemeral port, with a short long poll.
pub(crate) async fn sim(pod: u64) -> PodSim {
    sim_with(pod, |_| {}).await
}

/// A simulator configured by `f`.
pub(crate) async fn sim_with(pod: u64, f: impl FnOnce(&mut PodSimConfig)) -> PodSim {
    let mut config = PodSimConfig::new(PodId::new(pod).unwrap(), "127.0.0.1:0".parse().unwrap());
    config.long_poll = Duration::from_secs(2);
    f(&mut config);
    PodSim::start(config).await.unwrap()
}

/// Register a runner (JSON): its token.
pub(crate) async fn register(sim: &PodSim) -> String {
    let reg = sim.state().registration_token().to_owned();
    let r = json(
        sim.addr(),
        "POST",
        "/api/v4/runners",
        &[],
        serde_json::json!({"token": reg}),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    r.json()["token"].as_str().unwrap().to_owned()
}

/// Queue a job through the control API and pick it with `runner`: the job JSON.
pub(crate) async fn take_job(sim: &PodSim, runner: &str, spec: Value) -> Value {
    let r = json(sim.addr(), "POST", "/-/podsim/jobs", &[], spec).await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let id = r.json()["id"].as_u64().unwrap();
    let r = json(
        sim.addr(),
        "POST",
        "/api/v4/jobs/request",
        &[],
        serde_json::json!({"token": runner}),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let job = r.json();
    assert_eq!(job["id"].as_u64(), Some(id));
    job
}

/// The variable `key` of a job payload.
pub(crate) fn variable<'a>(job: &'a Value, key: &str) -> Option<&'a str> {
    job["variables"]
        .as_array()?
        .iter()
        .find(|v| v["key"] == key)?["value"]
        .as_str()
}

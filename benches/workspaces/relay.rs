//! The workspaces bench's recording relay between kas and GitLab: every request
//! kas makes (module requests, agent configurations) is forwarded to the Pod
//! simulator and recorded with its sizes on the wire (bodies; request and status
//! lines and headers counted as HTTP/1.1 writes them), the reconcile body's
//! `update_type` and infos each way, and GitLab's time to answer.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;

/// One request kas made to GitLab, as the relay saw it.
#[derive(Clone, Debug)]
pub struct Exchange {
    pub at: Instant,
    pub path: String,
    pub status: u16,
    pub update_type: String,
    pub infos_sent: usize,
    pub infos_back: usize,
    pub request_head: usize,
    pub request_body: usize,
    pub response_head: usize,
    pub response_body: usize,
    pub gitlab: Duration,
}

/// A relay between kas and GitLab that records every exchange.
#[derive(Default)]
pub struct Relay {
    seen: Mutex<Vec<Exchange>>,
    changed: tokio::sync::Notify,
}

impl Relay {
    pub fn reconciles(&self) -> Vec<Exchange> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|e| e.path.ends_with("/reconcile"))
            .cloned()
            .collect()
    }

    /// Wait until `check` finds something in the reconcile exchanges.
    pub async fn until<T>(
        &self,
        what: &str,
        within: Duration,
        mut check: impl FnMut(&[Exchange]) -> Option<T>,
    ) -> T {
        tokio::time::timeout(within, async {
            loop {
                let changed = self.changed.notified();
                if let Some(t) = check(&self.reconciles()) {
                    return t;
                }
                changed.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("workspaces bench: {what} not within {within:?}"))
    }
}

fn head_bytes(first_line: usize, headers: &http::HeaderMap) -> usize {
    first_line
        + headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum::<usize>()
        + 2
}

pub async fn start_relay(upstream: SocketAddr, relay: Arc<Relay>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (client, relay) = (client.clone(), relay.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let (client, relay) = (client.clone(), relay.clone());
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await?.to_bytes();
                        let path = parts
                            .uri
                            .path_and_query()
                            .map(|p| p.to_string())
                            .unwrap_or_default();
                        let request_head = head_bytes(
                            parts.method.as_str().len() + path.len() + 11,
                            &parts.headers,
                        );
                        let mut up = http::Request::builder()
                            .method(parts.method.clone())
                            .uri(format!("http://{upstream}{path}"));
                        for (k, v) in &parts.headers {
                            up = up.header(k, v);
                        }
                        let t = Instant::now();
                        let resp = client
                            .request(up.body(Full::new(body.clone())).unwrap())
                            .await
                            .expect("GitLab (the Pod simulator) answers");
                        let (rparts, rbody) = resp.into_parts();
                        let rbody = rbody.collect().await?.to_bytes();
                        let gitlab = t.elapsed();
                        let sent: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        let back: Value = serde_json::from_slice(&rbody).unwrap_or(Value::Null);
                        let count = |v: &Value| v.as_array().map_or(0, Vec::len);
                        relay.seen.lock().unwrap().push(Exchange {
                            at: t,
                            path: parts.uri.path().to_owned(),
                            status: rparts.status.as_u16(),
                            update_type: sent["update_type"].as_str().unwrap_or("").to_owned(),
                            infos_sent: count(&sent["workspace_agent_infos"]),
                            infos_back: count(&back["workspace_rails_infos"]),
                            request_head,
                            request_body: body.len(),
                            response_head: head_bytes(
                                17 + rparts.status.canonical_reason().unwrap_or("").len(),
                                &rparts.headers,
                            ),
                            response_body: rbody.len(),
                            gitlab,
                        });
                        relay.changed.notify_waiters();
                        let mut out = http::Response::builder().status(rparts.status);
                        for (k, v) in &rparts.headers {
                            if k != http::header::TRANSFER_ENCODING {
                                out = out.header(k, v);
                            }
                        }
                        Ok::<_, hyper::Error>(out.body(Full::new(rbody)).unwrap())
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

//! JSON clients: [`Json`] for the Pod simulator's control API (hyper, HTTP/1.1), and
//! [`Kube`] for kube-sim's REST API as its administrator (kube-rs, HTTPS, the
//! kubeconfig kube-sim wrote): the test reads and writes them as any client would.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// A client of one server.
#[derive(Clone)]
pub struct Json {
    base: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Json {
    /// A client of `http://addr`.
    pub fn new(addr: SocketAddr) -> Json {
        Json {
            base: format!("http://{addr}"),
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// `method path` with an optional JSON body: the status and the parsed body
    /// (`Null` when empty or not JSON).
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        let bytes = match body {
            Some(b) => {
                req = req.header("content-type", "application/json");
                Bytes::from(b.to_string())
            }
            None => Bytes::new(),
        };
        let resp = self
            .client
            .request(req.body(Full::new(bytes)).unwrap())
            .await
            .unwrap_or_else(|e| panic!("{method} {}{path}: {e}", self.base));
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.call("GET", path, None).await
    }
}

/// kube-sim's administrator: the raw REST API through kube-rs's client (TLS
/// trusting kube-sim's certificate, its bearer token).
#[derive(Clone)]
pub struct Kube {
    client: kube::Client,
}

impl Kube {
    /// A client from the kubeconfig at `path`.
    pub async fn from_kubeconfig(path: &std::path::Path) -> Kube {
        let kc = kube::config::Kubeconfig::read_from(path).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        Kube {
            client: kube::Client::try_from(config).unwrap(),
        }
    }

    /// `method path` with an optional JSON body: the status and the parsed body
    /// (`Null` when empty or not JSON).
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = hyper::Request::builder().method(method).uri(path);
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        let resp = self
            .client
            .send(req.body(kube::client::Body::from(bytes)).unwrap())
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.call("GET", path, None).await
    }
}

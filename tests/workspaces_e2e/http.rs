//! A plain JSON client for the Pod simulator's control API and kube-sim's REST API
//! (hyper, HTTP/1.1): the test reads and writes them as any client would.

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

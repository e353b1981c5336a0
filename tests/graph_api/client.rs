//! A Graph API client of the tests' own (tokio-tungstenite, no podgate code): it
//! connects with a bearer value and the `gitlab-agent-graph-api` subprotocol, sends
//! the request, and applies every server message to a [`State`] in order
//! (`svx`/`dvx`/`sarc`/`darc`), keeping warnings, `error` messages and the close.
//!
//! It is strict on purpose: `dvx` removes only the vertex (the server must send
//! `darc` for the arcs), and oddities (a `darc` for an unknown arc, a binary frame,
//! a message over 4 MiB, `svx` with both `o` and `j`) are recorded as anomalies.
//!
//! Tests wait for a predicate on the state with [`GraphClient::wait_until`], woken by
//! each message; a closed connection or the timeout fails with the state's summary.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::SplitSink;
use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::model::{ArcKey, Attrs, Payload, Vx};

/// The Graph API's WebSocket subprotocol.
pub const SUBPROTOCOL: &str = "gitlab-agent-graph-api";

/// GitLab's own client refuses messages over this (docs/graph-api.md §1).
pub const MAX_MESSAGE: usize = 4 << 20;

/// How the connection ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Closed {
    /// A close frame: code and reason.
    Frame { code: u16, reason: String },
    /// The stream ended or failed without a close frame.
    Abrupt(String),
}

/// Everything the client has received.
#[derive(Debug, Default)]
pub struct State {
    pub vertices: BTreeMap<Vx, Payload>,
    pub arcs: BTreeMap<ArcKey, Attrs>,
    /// Warning objects `{t, m, a}`, in arrival order.
    pub warnings: Vec<Value>,
    /// `error` objects `{code, code_string, reason}`, in arrival order.
    pub errors: Vec<Value>,
    pub closed: Option<Closed>,
    /// Data messages received.
    pub messages: u64,
    /// Their total size, and the largest.
    pub bytes: u64,
    pub largest: usize,
    /// Actions applied.
    pub actions: u64,
    /// Protocol oddities, each described.
    pub anomalies: Vec<String>,
}

impl State {
    /// Apply one text message.
    fn apply(&mut self, text: &str) {
        self.messages += 1;
        self.bytes += text.len() as u64;
        self.largest = self.largest.max(text.len());
        if text.len() > MAX_MESSAGE {
            self.anomalies
                .push(format!("a message of {} bytes (over 4 MiB)", text.len()));
        }
        let msg: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                self.anomalies.push(format!("not JSON ({e}): {text:.200}"));
                return;
            }
        };
        for w in msg["warnings"].as_array().into_iter().flatten() {
            self.warnings.push(w.clone());
        }
        if let Some(e) = msg.get("error") {
            self.errors.push(e.clone());
        }
        for a in msg["actions"].as_array().into_iter().flatten() {
            self.actions += 1;
            self.action(a);
        }
    }

    fn action(&mut self, a: &Value) {
        let vx = |v: &Value| Vx::from_json(v);
        if let Some(svx) = a.get("svx") {
            let Some(id) = vx(&svx["vx"]) else {
                self.anomalies.push(format!("svx without a vertex: {a}"));
                return;
            };
            let o = svx.get("o").cloned();
            let j = svx
                .get("j")
                .map(|j| j.as_array().cloned().unwrap_or_default());
            if o.is_some() && j.is_some() {
                self.anomalies.push(format!("svx with both o and j: {id}"));
            }
            self.vertices.insert(id, Payload { o, j });
        } else if let Some(dvx) = a.get("dvx") {
            match vx(&dvx["vx"]) {
                Some(id) => {
                    if self.vertices.remove(&id).is_none() {
                        self.anomalies
                            .push(format!("dvx of an unknown vertex {id}"));
                    }
                }
                None => self.anomalies.push(format!("dvx without a vertex: {a}")),
            }
        } else if let Some(sarc) = a.get("sarc") {
            let (Some(s), Some(d), Some(t)) = (vx(&sarc["s"]), vx(&sarc["d"]), sarc["t"].as_str())
            else {
                self.anomalies.push(format!("malformed sarc: {a}"));
                return;
            };
            let at = &sarc["a"];
            let attrs = Attrs {
                c: at["c"] == true,
                b: at["b"] == true,
                e: at["e"] == true,
            };
            self.arcs.insert((s, d, t.to_owned()), attrs);
        } else if let Some(darc) = a.get("darc") {
            let (Some(s), Some(d), Some(t)) = (vx(&darc["s"]), vx(&darc["d"]), darc["t"].as_str())
            else {
                self.anomalies.push(format!("malformed darc: {a}"));
                return;
            };
            let key = (s, d, t.to_owned());
            if self.arcs.remove(&key).is_none() {
                self.anomalies.push(format!(
                    "darc of an unknown arc {} -{}-> {}",
                    key.0, key.2, key.1
                ));
            }
        } else {
            self.anomalies.push(format!("unknown action {a}"));
        }
    }

    /// Vertices of `group`/`resource`.
    pub fn of(&self, group: &str, resource: &str) -> Vec<&Vx> {
        self.vertices
            .keys()
            .filter(|v| v.g == group && v.r == resource)
            .collect()
    }

    /// The vertex `resource` `ns/name`, any group and version.
    pub fn find(&self, resource: &str, ns: &str, name: &str) -> Option<&Vx> {
        self.vertices
            .keys()
            .find(|v| v.r == resource && v.ns == ns && v.n == name)
    }

    /// The arcs of type `t` from `src`.
    pub fn arcs_from(&self, src: &Vx, t: &str) -> Vec<(&Vx, Attrs)> {
        self.arcs
            .iter()
            .filter(|((s, _, tt), _)| s == src && tt == t)
            .map(|((_, d, _), a)| (d, *a))
            .collect()
    }

    /// The close frame or the `error` message's reason: where the server says why.
    pub fn reasons(&self) -> String {
        let mut out: Vec<String> = self
            .errors
            .iter()
            .map(|e| e["reason"].as_str().unwrap_or("").to_owned())
            .collect();
        if let Some(Closed::Frame { reason, .. }) = &self.closed {
            out.push(reason.clone());
        }
        out.join(" | ")
    }

    /// A short description for failure messages.
    pub fn summary(&self) -> String {
        let mut by_type: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, _, t) in self.arcs.keys() {
            *by_type.entry(t).or_default() += 1;
        }
        format!(
            "{} messages, {} actions; {} vertices, arcs {by_type:?}; warnings {:?}; errors {:?}; \
             closed {:?}; anomalies {:?}",
            self.messages,
            self.actions,
            self.vertices.len(),
            self.warnings,
            self.errors,
            self.closed,
            self.anomalies.iter().take(5).collect::<Vec<_>>()
        )
    }
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Why a connection was not established.
#[derive(Debug)]
pub enum ConnectError {
    /// The server answered the upgrade with this HTTP status.
    Status(u16, String),
    /// Anything else.
    Other(String),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Status(code, body) => write!(f, "HTTP {code}: {body}"),
            ConnectError::Other(e) => write!(f, "{e}"),
        }
    }
}

/// A connected Graph API client.
pub struct GraphClient {
    state: Arc<Mutex<State>>,
    changed: watch::Receiver<u64>,
    sink: tokio::sync::Mutex<SplitSink<Ws, Message>>,
    reader: tokio::task::JoinHandle<()>,
    /// The `Sec-WebSocket-Protocol` the server chose.
    pub protocol: Option<String>,
}

impl Drop for GraphClient {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl GraphClient {
    /// Connect to `url` (`ws://…/graph`) with `Authorization: Bearer <bearer>` and the
    /// subprotocol, and send `request` as the first text message.
    pub async fn connect(url: &str, bearer: &str, request: &Value) -> Result<Self, ConnectError> {
        let c = Self::open(url, bearer).await?;
        c.send_text(&request.to_string()).await;
        Ok(c)
    }

    /// Connect and send nothing yet.
    pub async fn open(url: &str, bearer: &str) -> Result<Self, ConnectError> {
        let mut req = url
            .into_client_request()
            .map_err(|e| ConnectError::Other(e.to_string()))?;
        let h = req.headers_mut();
        h.insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {bearer}")).unwrap(),
        );
        h.insert(
            "sec-websocket-protocol",
            HeaderValue::from_static(SUBPROTOCOL),
        );
        let (ws, resp) = match tokio_tungstenite::connect_async(req).await {
            Ok(x) => x,
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                let body = resp
                    .body()
                    .as_ref()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default();
                return Err(ConnectError::Status(resp.status().as_u16(), body));
            }
            Err(e) => return Err(ConnectError::Other(e.to_string())),
        };
        let protocol = resp
            .headers()
            .get("sec-websocket-protocol")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let (sink, mut stream) = ws.split();
        let state = Arc::new(Mutex::new(State::default()));
        let (tx, changed) = watch::channel(0u64);
        let st = state.clone();
        let reader = tokio::spawn(async move {
            let mut n = 0u64;
            loop {
                let next = stream.next().await;
                let mut s = st.lock().unwrap();
                let done = match next {
                    Some(Ok(Message::Text(t))) => {
                        s.apply(t.as_str());
                        false
                    }
                    Some(Ok(Message::Binary(b))) => {
                        s.anomalies
                            .push(format!("a binary message of {} bytes", b.len()));
                        false
                    }
                    Some(Ok(Message::Close(frame))) => {
                        s.closed = Some(match frame {
                            Some(f) => Closed::Frame {
                                code: u16::from(f.code),
                                reason: f.reason.to_string(),
                            },
                            None => Closed::Frame {
                                code: 1005,
                                reason: String::new(),
                            },
                        });
                        true
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => {
                        s.closed.get_or_insert(Closed::Abrupt(e.to_string()));
                        true
                    }
                    None => {
                        s.closed
                            .get_or_insert(Closed::Abrupt("end of stream".into()));
                        true
                    }
                };
                drop(s);
                n += 1;
                let _ = tx.send(n);
                if done {
                    return;
                }
            }
        });
        Ok(GraphClient {
            state,
            changed,
            sink: tokio::sync::Mutex::new(sink),
            reader,
            protocol,
        })
    }

    /// Send a text message (errors ignored: the state records how the connection ends).
    pub async fn send_text(&self, text: &str) {
        let _ = self.sink.lock().await.send(Message::text(text)).await;
    }

    /// Look at the state now.
    pub fn with<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.state.lock().unwrap())
    }

    /// Wait until `check` gives `Some` (checked now and after every message); panic
    /// naming `what` if the connection closes first or `timeout` passes.
    pub async fn wait_until<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&State) -> Option<T>,
    ) -> T {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changed = self.changed.clone();
        loop {
            {
                let s = self.state.lock().unwrap();
                if let Some(v) = check(&s) {
                    return v;
                }
                if s.closed.is_some() {
                    panic!("closed before {what}: {}", s.summary());
                }
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    // The reader ended: one last look.
                    let s = self.state.lock().unwrap();
                    return check(&s)
                        .unwrap_or_else(|| panic!("ended before {what}: {}", s.summary()));
                }
                Err(_) => {
                    let s = self.state.lock().unwrap();
                    panic!(
                        "timed out after {timeout:?} waiting for {what}: {}",
                        s.summary()
                    );
                }
            }
        }
    }

    /// Wait for the connection to end; how it ended.
    pub async fn wait_closed(&self, timeout: Duration) -> Closed {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changed = self.changed.clone();
        loop {
            if let Some(c) = self.state.lock().unwrap().closed.clone() {
                return c;
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    return self
                        .state
                        .lock()
                        .unwrap()
                        .closed
                        .clone()
                        .unwrap_or(Closed::Abrupt("reader ended".into()));
                }
                Err(_) => {
                    let s = self.state.lock().unwrap();
                    panic!("not closed after {timeout:?}: {}", s.summary());
                }
            }
        }
    }
}

/// A WebSocket upgrade written by hand (so nothing is negotiated for us): `GET path`
/// on `addr` with the given extra headers. Returns the status and the response
/// headers (names lower-cased).
pub async fn raw_upgrade(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, BTreeMap<String, String>) {
    let mut s = TcpStream::connect(addr).await.expect("connecting");
    let mut req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.expect("writing");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head = loop {
        let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut chunk))
            .await
            .expect("an answer to the upgrade within 30 s")
            .expect("reading");
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((head, _)) = text.split_once("\r\n\r\n") {
            break head.to_owned();
        }
        assert!(
            n > 0,
            "connection closed before the response head: {text:?}"
        );
    };
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("an HTTP status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers)
}

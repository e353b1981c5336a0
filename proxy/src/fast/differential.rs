//! The same request bytes down both paths — the HTTP/1 fast path and
//! pingora-proxy alone (`fast_path = false`) — over loopback sockets to one Pod
//! stub, and what each path answered and sent to the Pod. For the differential
//! test (`fast/differential_tests.rs`) and the `proxy_route` fuzz target only
//! (feature `test-util`): not an API, free to change.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use pingora::apps::ServerApp;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::server::configuration::ServerConf;
use podgate_registry::{MemoryBackend, Registry, RegistryConfig, TopologyFile};
use podgate_tokens::Classifier;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use super::{FastPath, FastPathSettings};
use crate::decision::OnInvalid;
use crate::health::HealthConfig;
use crate::server::RegistryHandle;
use crate::service::PodGate;
use crate::upstreams::discovery::SystemResolver;
use crate::upstreams::{Upstreams, UpstreamsConfig};

/// Longest a path may take to answer one request before the run counts as hung.
const HUNG: Duration = Duration::from_secs(10);

/// What the Pod stub answers every request with (its head alone to a `HEAD`).
pub const POD_ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Pod: stub\r\n\r\nok";

/// What one path did with a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// The response the client read: its status, its headers (names lowercased,
    /// `x-request-id`, `date` and `connection: keep-alive` left out, sorted by
    /// name, each name's values in order) and its body; `None` when the connection
    /// closed with no response. pingora's session adds `Date` and, HTTP/1.1's
    /// default, `Connection: keep-alive` to every response it writes; the fast
    /// path writes neither.
    pub answer: Option<Message>,
    /// The requests the Pod received, likewise (request line as the status line).
    pub upstream: Vec<Message>,
    /// Whether every request the Pod received carried the `x-request-id` the
    /// client got back.
    pub request_id_kept: bool,
    /// Whether the path sent `100 Continue` before its answer.
    pub continued: bool,
    /// Whether the connection served another request after the answer: a
    /// well-formed [`PROBE`] written after it was answered, not closed. `false`
    /// where the path closed (the framing of what followed the request was lost,
    /// or the client asked to close).
    pub kept_alive: bool,
}

/// The request written after each answer, to learn whether the connection still
/// serves requests. The Pod's copy of it is left out of [`Observed::upstream`].
pub const PROBE: &[u8] = b"GET /-/podgate-probe HTTP/1.1\r\nHost: probe\r\n\r\n";

/// An HTTP/1 message, reduced to what both paths must agree on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The start line.
    pub start: String,
    /// The headers (see [`Observed::answer`]).
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body.
    pub body: Vec<u8>,
}

/// Both paths, over Pods 1 (default), 2 and 3, each with the one stub as its
/// web upstream.
pub struct Differential {
    runtime: tokio::runtime::Runtime,
    fast: Arc<FastPath>,
    pingora: Arc<FastPath>,
    seen: std::sync::Mutex<mpsc::UnboundedReceiver<Vec<u8>>>,
    _shutdown: watch::Sender<bool>,
    shutdown: watch::Receiver<bool>,
}

impl Differential {
    /// Start the Pod stub and both paths, routing with `classifier` and the
    /// built-in rules.
    pub fn new(classifier: Arc<Classifier>) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let (tx, rx) = mpsc::unbounded_channel();
        let (fast, pingora) = runtime.block_on(async {
            let stub = TcpListener::bind("127.0.0.1:0").await.expect("a port");
            let addr = stub.local_addr().expect("bound");
            tokio::spawn(pod_stub(stub, tx));
            let gate = gate(addr, classifier).await;
            let conf = Arc::new(ServerConf::default());
            let path = |enabled| {
                let mut proxy = pingora::proxy::http_proxy(&conf, gate.clone());
                proxy.server_options = Some(crate::server::http_server_options(
                    false,
                    Duration::from_secs(5),
                ));
                let settings = FastPathSettings {
                    enabled,
                    ..FastPathSettings::default()
                };
                Arc::new(FastPath::new(gate.clone(), proxy, &conf, settings))
            };
            (path(true), path(false))
        });
        let (shutdown_tx, shutdown) = watch::channel(false);
        Differential {
            runtime,
            fast,
            pingora,
            seen: std::sync::Mutex::new(rx),
            _shutdown: shutdown_tx,
            shutdown,
        }
    }

    /// `request` (one request head, and its body if any) on a new connection to
    /// each path: what the fast path did, and what pingora-proxy did.
    pub fn run(&self, request: &[u8]) -> (Observed, Observed) {
        let fast = self.observe(&self.fast, request, false);
        let pingora = self.observe(&self.pingora, request, false);
        (fast, pingora)
    }

    /// As [`Differential::run`], but the client closes its side once `bytes` are
    /// sent (any bytes: a head cut short is answered or closed at once rather
    /// than waited for), so no probe follows: `kept_alive` is `false`.
    pub fn run_then_close(&self, bytes: &[u8]) -> (Observed, Observed) {
        let fast = self.observe(&self.fast, bytes, true);
        let pingora = self.observe(&self.pingora, bytes, true);
        (fast, pingora)
    }

    /// The size of a connection's future on the fast path, as its task holds it
    /// (not polled: the state every held poll and idle connection carries, beside
    /// its buffers and the task's own header).
    pub fn connection_future_size(&self) -> usize {
        self.runtime.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
            let _client = TcpStream::connect(listener.local_addr().expect("bound"))
                .await
                .expect("connected");
            let (server, _) = listener.accept().await.expect("accepted");
            let stream: pingora::protocols::Stream = Box::new(L4Stream::from(server));
            let future = self.fast.process_new(stream, &self.shutdown);
            std::mem::size_of_val(&*future)
        })
    }

    fn observe(&self, path: &Arc<FastPath>, request: &[u8], close: bool) -> Observed {
        let raw = self.runtime.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
            let mut client = TcpStream::connect(listener.local_addr().expect("bound"))
                .await
                .expect("connected");
            let (server, _) = listener.accept().await.expect("accepted");
            let path = path.clone();
            let shutdown = self.shutdown.clone();
            let served = tokio::spawn(async move {
                let stream: pingora::protocols::Stream = Box::new(L4Stream::from(server));
                path.process_new(stream, &shutdown).await;
            });
            // A path may answer and close before reading everything.
            let _ = client.write_all(request).await;
            if close {
                let _ = client.shutdown().await;
            }
            let head_request = request.starts_with(b"HEAD ");
            let mut buf = Vec::new();
            let (answer, continued) =
                tokio::time::timeout(HUNG, read_response(&mut client, &mut buf, head_request))
                    .await
                    .expect("a path answers or closes");
            // A path that closed may have reset the connection: the probe's write
            // then fails, and that is an answer too.
            let kept_alive = answer.is_some()
                && !close
                && client.write_all(PROBE).await.is_ok()
                && tokio::time::timeout(HUNG, read_response(&mut client, &mut buf, false))
                    .await
                    .expect("a path answers the probe or closes")
                    .0
                    .is_some();
            drop(client);
            let _ = served.await;
            (answer, continued, kept_alive)
        });
        let (raw, continued, kept_alive) = raw;
        let mut seen = self.seen.lock().expect("not poisoned");
        let mut upstream = Vec::new();
        while let Ok(r) = seen.try_recv() {
            if !r.starts_with(b"GET /-/podgate-probe ") {
                upstream.push(r);
            }
        }
        let id = raw.as_deref().and_then(request_id);
        let request_id_kept = upstream.iter().all(|r| request_id(r) == id);
        let answer = raw.map(|r| message(&r).expect("a response the client could read"));
        let upstream: Vec<Message> = upstream
            .iter()
            .map(|r| message(r).expect("a request the Pod could read"))
            .collect();
        Observed {
            answer,
            upstream,
            request_id_kept,
            continued,
            kept_alive,
        }
    }
}

/// The router over the built-in rules and Pods 1, 2, 3, each with `pod` as its web
/// and kas upstreams (so that no request meets a Pod without the upstream it
/// needs: a 5xx is the proxy's own).
pub(super) async fn gate(pod: SocketAddr, classifier: Arc<Classifier>) -> PodGate {
    let pods: String = [(1, "legacy"), (2, "two"), (3, "three")]
        .iter()
        .map(|(id, name)| {
            format!(
                "[[pods]]\nid = {id}\nname = \"{name}\"\nweb = [\"{pod}\"]\nkas = [\"{pod}\"]\n\
                 kas_k8s_proxy = [\"{pod}\"]\nkas_workspaces = [\"{pod}\"]\n"
            )
        })
        .collect();
    let topology = TopologyFile::parse(&format!("default_pod = 1\n{pods}"), "differential")
        .expect("a valid topology")
        .to_topology(1);
    let registry = Registry::with_memory(
        MemoryBackend::new(topology.clone()),
        RegistryConfig::default(),
    )
    .await
    .expect("an in-memory registry");
    let upstreams = Arc::new(Upstreams::new(
        HealthConfig {
            enabled: false,
            ..HealthConfig::default()
        },
        UpstreamsConfig::default(),
        Arc::new(SystemResolver),
    ));
    upstreams.apply(&topology).await;
    PodGate::new(
        crate::rules::builtin(),
        classifier,
        RegistryHandle::of(registry),
        upstreams,
        OnInvalid::Reject,
    )
}

/// The Pod: reads each request (head and `Content-Length` body), records its
/// bytes, answers [`POD_ANSWER`], keeps the connection.
async fn pod_stub(listener: TcpListener, seen: mpsc::UnboundedSender<Vec<u8>>) {
    while let Ok((mut conn, _)) = listener.accept().await {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut buf = Vec::new();
            while let Some(request) = read_message(&mut conn, &mut buf, false).await {
                let answer = match request.starts_with(b"HEAD ") {
                    true => &POD_ANSWER[..POD_ANSWER.len() - 2],
                    false => POD_ANSWER,
                };
                let _ = seen.send(request);
                if conn.write_all(answer).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// The final response on `conn`, past any `1xx` (and whether one was `100
/// Continue`). `None`: closed (or reset) before a whole head.
async fn read_response(
    conn: &mut TcpStream,
    buf: &mut Vec<u8>,
    head_request: bool,
) -> (Option<Vec<u8>>, bool) {
    let mut continued = false;
    loop {
        match read_message(conn, buf, head_request).await {
            Some(m) if m.starts_with(b"HTTP/1.1 1") => {
                continued |= m.starts_with(b"HTTP/1.1 100 ");
            }
            m => return (m, continued),
        }
    }
}

/// One message's bytes from `conn`, after what `buf` holds of it already: its
/// head and `Content-Length` body (none without one, or in a response to `HEAD`).
/// What follows it stays in `buf`. `None`: closed before a whole head.
async fn read_message(
    conn: &mut TcpStream,
    buf: &mut Vec<u8>,
    head_request: bool,
) -> Option<Vec<u8>> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head_len = end + 4;
            let chunked = !head_request && is_chunked(&buf[..head_len]);
            let length = match head_request {
                true => 0,
                false => content_length(&buf[..head_len]),
            };
            let end = loop {
                let end = match chunked {
                    true => chunked_end(&buf[head_len..]).map(|n| head_len + n),
                    false => (buf.len() >= head_len + length).then_some(head_len + length),
                };
                if let Some(end) = end {
                    break end;
                }
                if conn.read_buf(buf).await.ok()? == 0 {
                    break buf.len();
                }
            };
            let rest = buf.split_off(end);
            return Some(std::mem::replace(buf, rest));
        }
        if conn.read_buf(buf).await.ok()? == 0 {
            return None;
        }
    }
}

fn is_chunked(head: &[u8]) -> bool {
    String::from_utf8_lossy(head).lines().any(|l| {
        l.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("transfer-encoding")
                && value.trim().eq_ignore_ascii_case("chunked")
        })
    })
}

/// Where a chunked body that `body` starts with ends (trailers included), once it
/// holds all of it.
fn chunked_end(body: &[u8]) -> Option<usize> {
    let mut at = 0;
    loop {
        let line = body[at..].windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&body[at..at + line]).ok()?;
        let size = size.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16).ok()?;
        at += line + 2;
        if size == 0 {
            // Trailers, then the empty line.
            loop {
                let line = body[at..].windows(2).position(|w| w == b"\r\n")?;
                at += line + 2;
                if line == 0 {
                    return Some(at);
                }
            }
        }
        at += size + 2;
        if body.len() < at {
            return None;
        }
    }
}

fn content_length(head: &[u8]) -> usize {
    String::from_utf8_lossy(head)
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0)
}

/// The `x-request-id` of a message.
fn request_id(raw: &[u8]) -> Option<String> {
    message_headers(raw)?
        .find(|(name, _)| name == "x-request-id")
        .map(|(_, v)| String::from_utf8_lossy(&v).into_owned())
}

fn message_headers(raw: &[u8]) -> Option<impl Iterator<Item = (String, Vec<u8>)> + '_> {
    let head_len = raw.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    // Bytes, not text: a field value may hold obs-text (0x80-0xFF), which HTTP/1
    // allows and both paths pass on.
    Some(
        raw[..head_len - 4]
            .split(|&b| b == b'\n')
            .skip(1)
            .filter_map(|line| {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let colon = line.iter().position(|&b| b == b':')?;
                Some((
                    String::from_utf8_lossy(line[..colon].trim_ascii()).to_ascii_lowercase(),
                    line[colon + 1..].trim_ascii().to_vec(),
                ))
            }),
    )
}

/// `raw` as a [`Message`]; `None` if it is not one. `x-request-id` is left out
/// (each path generates its own unless the client sent one), and so are what
/// only pingora's session writes ([`Observed::answer`]).
fn message(raw: &[u8]) -> Option<Message> {
    let head_len = raw.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let start_len = raw.windows(2).position(|w| w == b"\r\n")?;
    let start = String::from_utf8_lossy(&raw[..start_len]).into_owned();
    let mut headers: Vec<(String, Vec<u8>)> = message_headers(raw)?
        .filter(|(name, value)| {
            name != "x-request-id"
                && name != "date"
                && !(name == "connection" && value.eq_ignore_ascii_case(b"keep-alive"))
        })
        .collect();
    // Stable: each name's values stay in the order sent.
    headers.sort_by(|a, b| a.0.cmp(&b.0));
    Some(Message {
        start,
        headers,
        body: raw[head_len..].to_vec(),
    })
}

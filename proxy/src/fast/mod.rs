//! The HTTP/1 fast path for the runner and job endpoints: a pingora `ServerApp`
//! in front of pingora-proxy's service on the plaintext listener.
//!
//! It serves the requests runners send all day — `jobs/request` polls, job
//! updates, trace patches, runner registration — as an I/O adapter over the same
//! routing as pingora-proxy's [`crate::service::PodGate`]: it holds a clone of it
//! and runs the two steps of [`crate::pipeline`] on what it read, then the steps
//! the service shares after the decision (the answer, the edge hold, address
//! selection and retries, the headers added upstream, metrics and the log line).
//! What it saves is pingora-proxy's per-request structure (session objects, header
//! copies, two channels and select loops, a 64 KiB response buffer, boxed hook
//! futures): one parse per direction, one write per direction for a small
//! response, and a held poll that is a socket, its request bytes and a waiter.
//! `differential` (feature `test-util`) runs the same bytes down both paths.
//!
//! Everything else is handed to pingora-proxy on the same connection, with the
//! bytes already read put back ([`pingora::protocols::l4::stream::Stream::rewind`])
//! so pingora parses the request as if the fast path did not exist:
//!
//! - TLS connections, HTTP/1.0, h2c, WebSocket and other upgrades, `Expect`;
//! - any framing but one plain `Content-Length` (`Transfer-Encoding`, repeated or
//!   malformed lengths: the smuggling vectors, which pingora refuses);
//! - a `Connection` header that nominates headers as hop by hop (pingora checks and
//!   strips them);
//! - a head `httparse` or the `http` crate refuses, or no `Host`;
//! - rules without `fast_path` (runner and job endpoints have it);
//! - multipart bodies and bodies above the look-ahead (pingora answers the 413 or
//!   streams them).
//!
//! pingora-proxy serves that one request and gives the connection back, so between
//! requests every plaintext HTTP/1.1 connection waits here (and is handed to the new
//! process at an upgrade, [`crate::handover`]); only a head that is not HTTP/1.1
//! (h2c's preface, HTTP/1.0) leaves the connection with pingora-proxy for good.
//! `podgate_proxy_fast_path_requests_total{result}` counts both.

mod deadline;
#[cfg(test)]
#[path = "deadline_tests.rs"]
mod deadline_tests;
#[cfg(any(test, feature = "test-util"))]
#[doc(hidden)]
pub mod differential;
#[cfg(test)]
#[path = "differential_tests.rs"]
mod differential_tests;
mod forward;
#[doc(hidden)]
pub mod fuzzing;
mod head;
mod io;
#[cfg(test)]
#[path = "malformed_tests.rs"]
mod malformed_tests;
mod response;
mod serve;
mod upstream;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::listeners::L4BufferSettings;
use pingora::prelude::*;
use pingora::protocols::Stream;
use pingora::protocols::http::ServerSession;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;
use pingora::server::configuration::ServerConf;
use prometheus::IntCounter;

use self::deadline::Deadline;
use self::io::Access;
use crate::handover::Handover;
use crate::metrics::METRICS;
use crate::rules::Rule;
use crate::service::PodGate;

pub use head::HandOff;

/// How long an idle client connection is kept between requests (pingora's
/// default keep-alive, `apps/mod.rs`).
const KEEPALIVE: Duration = Duration::from_secs(60);

/// How long one read of a request body may take.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest read of a response body relayed at a time.
const RELAY_CHUNK: usize = 64 * 1024;

/// How a [`FastPath`] serves its listener.
#[derive(Clone, Default)]
pub struct FastPathSettings {
    /// `false`: hand every connection to pingora-proxy (`fast_path = false`).
    pub enabled: bool,
    /// The listener's buffer settings (`read_buffer_bytes`), restored on a
    /// connection handed to pingora-proxy.
    pub listener_buffers: L4BufferSettings,
    /// Where idle connections go when this process shuts down, if a new one
    /// serves.
    pub handover: Option<Arc<Handover>>,
}

/// The fast path, and pingora-proxy's service behind it. A clone shares
/// everything (the upstream pool too): the one serving connections handed over at
/// an upgrade is a clone of the listener's ([`crate::handover`]).
#[derive(Clone)]
pub struct FastPath {
    gate: PodGate,
    proxy: Arc<HttpProxy<PodGate>>,
    pool: Arc<upstream::Pool>,
    head_timeout: Duration,
    enabled: bool,
    /// The listener's buffers, given back to a connection handed to pingora-proxy.
    buffers: L4BufferSettings,
    served: IntCounter,
    /// Where idle connections go when this process shuts down, if a new one serves.
    handover: Option<Arc<Handover>>,
    /// Most connection attempts for one request: pingora-proxy's `max_retries`.
    max_attempts: usize,
    /// Whether a request waits for the rest of its event loop pass before it goes
    /// upstream ([`FastPath::forward`]): on a thread's own runtime, not a
    /// work-stealing one.
    batch_sends: bool,
}

impl FastPath {
    /// Serve runner requests with `gate` (a clone of the one inside `proxy`), hand
    /// everything else to `proxy`. The limits are pingora-proxy's: a request head
    /// must be complete within its options' `h1_header_deadline` of its first byte
    /// (`head_timeout_ms`; without one, within a body read's timeout), and a
    /// request makes at most `conf.max_retries` connection attempts.
    pub fn new(
        gate: PodGate,
        proxy: HttpProxy<PodGate>,
        conf: &ServerConf,
        settings: FastPathSettings,
    ) -> Self {
        let head_timeout = proxy
            .server_options
            .as_ref()
            .and_then(|o| o.h1_header_deadline)
            .unwrap_or(BODY_READ_TIMEOUT);
        FastPath {
            gate,
            proxy: Arc::new(proxy),
            pool: Arc::default(),
            head_timeout,
            enabled: settings.enabled,
            buffers: settings.listener_buffers,
            served: METRICS.fast_path.with_label_values(&["served"]),
            handover: settings.handover,
            max_attempts: conf.max_retries,
            batch_sends: !conf.work_stealing,
        }
    }
}

/// A client connection and the bytes read from it not yet consumed.
struct Conn {
    /// Unbuffered until pingora-proxy has served a request on it: the fast path
    /// reads into `buf` and writes whole buffers (each write flushed), so the
    /// listener's buffers would only cost memory (1.4 KiB per held poll). Once
    /// pingora has used them they stay, since it may have read ahead into them.
    stream: Box<L4Stream>,
    buf: Vec<u8>,
    /// The server's shutdown: an answer written once it is on says
    /// `Connection: close`.
    shutdown: ShutdownWatch,
    /// When the current wait ends: the keep-alive between requests, the Pod's
    /// answer.
    deadline: Deadline,
    /// A clock read taken just now (by the last request's log line), for the next
    /// keep-alive deadline: a clock read costs, and a request needs few.
    clock: Option<std::time::Instant>,
    /// How the connection is read and written: on its socket itself while the
    /// stream has neither buffers nor rewound bytes (it has not been
    /// pingora-proxy's yet).
    access: Access,
}

impl Conn {
    fn shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }
}

/// How a connection leaves the fast path.
enum Next {
    /// Closed (by the client, a timeout, shutdown or an error).
    Close,
    /// To pingora-proxy, with the bytes read put back; why.
    HandOff(HandOff),
}

#[async_trait]
impl ServerApp for FastPath {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        if !self.enabled {
            return ServerApp::process_new(&self.proxy, stream, shutdown).await;
        }
        if !stream.as_any().is::<L4Stream>() {
            // TLS: ALPN and h2 are pingora's.
            METRICS.fast_path.with_label_values(&["tls"]).inc();
            return ServerApp::process_new(&self.proxy, stream, shutdown).await;
        }
        let mut stream = stream.into_any().downcast::<L4Stream>().ok()?;
        // Nothing has been read or written yet: no buffered byte is lost.
        stream.set_buffer(L4BufferSettings::unbuffered());
        // Nothing here asks how long its reads and writes were pending: no clock
        // reads for it (vendor patch 0011).
        stream.set_pending_time_tracking(false);
        let mut conn = Conn {
            stream,
            buf: Vec::new(),
            shutdown: shutdown.clone(),
            deadline: Deadline::new(KEEPALIVE),
            clock: None,
            access: Access::Socket,
        };
        let mut buffered = false;
        loop {
            let why = match self.serve(&mut conn).await {
                Next::Close => return None,
                Next::HandOff(why) => why,
            };
            METRICS.fast_path.with_label_values(&[why.label()]).inc();
            let Conn {
                mut stream,
                buf,
                deadline,
                ..
            } = conn;
            if !buffered {
                // Every write was flushed and every read went into `buf`: the
                // stream's (empty) buffers can be replaced. They stay: what pingora
                // read ahead into them is read from them from now on.
                stream.set_buffer(self.buffers);
                buffered = true;
            }
            // pingora-proxy's timing digest is pingora's again.
            stream.set_pending_time_tracking(true);
            stream.rewind(&buf);
            drop(buf);
            if why.for_good() {
                // Not an HTTP/1.1 head (h2c's preface among them): the connection
                // is pingora's from here on.
                return ServerApp::process_new(&self.proxy, stream, shutdown).await;
            }
            // One request on pingora-proxy, as its own loop would serve it
            // (`apps/mod.rs`), and the connection comes back: idle between requests
            // it is the fast path's, so it is handed over at an upgrade
            // ([`crate::handover`]) rather than closed by pingora's loop.
            let mut session = ServerSession::new_http1(stream);
            session.set_keepalive((!*shutdown.borrow()).then_some(KEEPALIVE.as_secs()));
            if let Some(options) = &self.proxy.server_options {
                session.set_header_deadline(options.h1_header_deadline);
                session.set_strict_framing(options.h1_strict_framing);
            }
            let (stream, _) = self
                .proxy
                .process_new_http(session, shutdown)
                .await?
                .consume();
            let mut stream = stream.into_any().downcast::<L4Stream>().ok()?;
            stream.set_pending_time_tracking(false);
            conn = Conn {
                stream,
                buf: Vec::new(),
                shutdown: shutdown.clone(),
                deadline,
                clock: None,
                access: Access::Stream,
            };
        }
    }

    async fn cleanup(&self) {
        ServerApp::cleanup(&*self.proxy).await;
    }
}

/// Resolves, with the hand-over, once the server shuts down and a new process
/// serves; never without.
async fn handover_due<'h>(
    handover: Option<&'h Handover>,
    shutdown: &mut ShutdownWatch,
) -> &'h Handover {
    let Some(handover) = handover else {
        return std::future::pending().await;
    };
    while !*shutdown.borrow_and_update() {
        if shutdown.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
    if !handover.has_successor() {
        return std::future::pending().await;
    }
    handover
}

/// Whether a rule's requests may take the fast path: runner and job endpoints
/// (GitLab requires their token) on the Pod's web pool.
fn fast_rule(rule: &Rule) -> bool {
    rule.fast_path()
}

/// A failed forward: the error (for the log and the answer) and whether a response
/// had started (then nothing more can be said to the client).
struct Failed {
    error: Box<Error>,
    responded: bool,
}

impl Failed {
    fn before(error: Box<Error>) -> Self {
        Failed {
            error,
            responded: false,
        }
    }
}

/// Write all of `bytes` to the client, as [`Conn::access`] says.
async fn write_all(conn: &mut Conn, bytes: &[u8]) -> std::io::Result<()> {
    io::write(&mut conn.stream, conn.access, bytes).await
}

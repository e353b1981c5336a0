//! Idle client connections handed to the new process at a binary upgrade.
//!
//! pingora's upgrade (`podgate proxy --upgrade`, then SIGQUIT to the running proxy)
//! passes the *listening* sockets to the new process; the old one serves what it
//! has accepted until its grace period ends and then drops it. A kept-alive client
//! connection idle at that moment is closed under its client, and a request the
//! client sends just then is lost — a reset, which no HTTP client may retry for a
//! `POST` (RFC 9110 §9.2.2; Go's `net/http` does not, so neither does
//! gitlab-runner). `scripts/drills.sh` R5 lost runner requests this way.
//!
//! So the old process hands each idle fast-path connection to the new one instead:
//!
//! - every proxy listens on `<upgrade_sock>.conns` (mode 0600, peers of another
//!   user refused);
//! - a proxy started with `--upgrade` connects to it before it takes that path over
//!   for its own successor, and once it serves (its services running) says so with
//!   one byte; the old process only ever hands connections to a successor that did;
//! - once the old process shuts down, each fast-path connection waiting for its
//!   next request, with nothing of it read, is sent over that connection
//!   (`SCM_RIGHTS`) and closed in the old process only — the socket stays open in
//!   the new one, and a request the client sends meanwhile waits in it to be read
//!   there;
//! - the new process serves each connection it receives on the fast path, and
//!   answers its next request `Connection: close`, so the client moves to a
//!   connection the new process accepted (and its worker threads serve).
//!
//! Connections busy at shutdown finish in the old process and are closed after an
//! answer saying `Connection: close` (`crate::fast`). Without a successor (SIGTERM,
//! or a new process that never said it serves) nothing changes.
//! `podgate_proxy_upgrade_connections_total{result}` counts `sent`, `send_failed`
//! and `received`.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::{GetSocketDigest, SocketDigest, Stream};
use pingora::server::ShutdownWatch;
use pingora::services::listening::Service;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};

use crate::fast::FastPath;
use crate::metrics::METRICS;

/// What the new process sends once it serves.
const READY: u8 = b'r';

/// The byte each handed connection's descriptor rides on.
const CONN: u8 = b'c';

/// How long one hand-over may block the old process (a successor that stopped
/// reading).
const SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// Errors of the hand-over.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The hand-over socket could not be set up.
    #[error("connection hand-over socket {path}: {source}")]
    Socket {
        /// Its path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// No successor that serves.
    #[error("no new process to hand connections to")]
    NoSuccessor,
    /// Sending a connection failed.
    #[error("handing a connection over: {0}")]
    Send(std::io::Error),
    /// The connection is not a TCP one (only those are handed over).
    #[error("only TCP connections are handed over")]
    NotTcp,
}

/// The hand-over socket's path for `upgrade_sock`.
pub fn path(upgrade_sock: &Path) -> PathBuf {
    let mut p = upgrade_sock.as_os_str().to_owned();
    p.push(".conns");
    PathBuf::from(p)
}

/// The old process's side: whom to hand idle connections to, if anyone.
#[derive(Debug, Default)]
pub struct Handover {
    successor: Mutex<Option<StdUnixStream>>,
}

impl Handover {
    /// Whether a successor that serves is connected.
    pub fn has_successor(&self) -> bool {
        self.successor.lock().expect("handover lock").is_some()
    }

    /// Hand `stream` to the successor. On success the caller drops its copy (which
    /// only closes this process's descriptor). A failed send forgets the successor,
    /// and the caller keeps serving the connection.
    pub fn send(&self, stream: &L4Stream) -> Result<(), Error> {
        // The fast path serves the plaintext listener's TCP connections only.
        let fd = stream.tcp().ok_or(Error::NotTcp)?.as_fd();
        let mut successor = self.successor.lock().expect("handover lock");
        let Some(to) = successor.as_ref() else {
            return Err(Error::NoSuccessor);
        };
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        let fds = [fd];
        control.push(SendAncillaryMessage::ScmRights(&fds));
        match rustix::net::sendmsg(
            to,
            &[IoSlice::new(&[CONN])],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(1) => {
                METRICS
                    .upgrade_connections
                    .with_label_values(&["sent"])
                    .inc();
                Ok(())
            }
            result => {
                *successor = None;
                METRICS
                    .upgrade_connections
                    .with_label_values(&["send_failed"])
                    .inc();
                let e = match result {
                    Err(e) => std::io::Error::from(e),
                    Ok(_) => std::io::ErrorKind::WriteZero.into(),
                };
                tracing::warn!(error = %e, "handing a connection to the new process failed; it stays here");
                Err(Error::Send(e))
            }
        }
    }

    /// Accept successors on `listener` until `shutdown`: each one that says it
    /// serves replaces the one before.
    pub async fn accept(self: Arc<Self>, listener: UnixListener, mut shutdown: ShutdownWatch) {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = shutdown.changed() => {
                    if *shutdown.borrow() {
                        // Successors that connect later are not waited for.
                        return;
                    }
                    continue;
                }
            };
            let stream = match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting on the connection hand-over socket");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let this = self.clone();
            tokio::spawn(async move {
                if let Err(e) = this.adopt_successor(stream).await {
                    tracing::warn!(error = %e, "a new process on the connection hand-over socket");
                }
            });
        }
    }

    async fn adopt_successor(&self, mut stream: UnixStream) -> std::io::Result<()> {
        let peer = rustix::net::sockopt::socket_peercred(&stream)?;
        if peer.uid != rustix::process::getuid() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "peer pid {} runs as another user",
                    peer.pid.as_raw_nonzero()
                ),
            ));
        }
        // Waits as long as the new process takes to start serving (or closes).
        let mut ready = [0u8; 1];
        stream.read_exact(&mut ready).await?;
        if ready[0] != READY {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "unexpected hand-over greeting",
            ));
        }
        let stream = stream.into_std()?;
        stream.set_nonblocking(false)?;
        stream.set_write_timeout(Some(SEND_TIMEOUT))?;
        tracing::info!(
            pid = peer.pid.as_raw_nonzero(),
            "a new process serves: idle connections go to it at shutdown"
        );
        *self.successor.lock().expect("handover lock") = Some(stream);
        Ok(())
    }
}

/// Listen on `path` for a successor (replacing whatever socket file is there:
/// a predecessor's, already connected to, or a stale one).
pub fn listen(path: &Path) -> Result<std::os::unix::net::UnixListener, Error> {
    let err = |source| Error::Socket {
        path: path.to_owned(),
        source,
    };
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let listener = std::os::unix::net::UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    listener.set_nonblocking(true).map_err(err)?;
    Ok(listener)
}

/// The new process's side: connect to the running proxy's hand-over socket.
/// `None` (logged) when none answers: the upgrade goes on without hand-over.
pub fn connect_predecessor(path: &Path) -> Option<StdUnixStream> {
    match StdUnixStream::connect(path) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::info!(path = %path.display(), error = %e, "no connection hand-over from the running proxy");
            None
        }
    }
}

/// Say this process serves, then serve every connection the predecessor hands over
/// on `fast`, until it closes the socket.
pub async fn receive(predecessor: StdUnixStream, fast: Arc<FastPath>) -> std::io::Result<()> {
    predecessor.set_nonblocking(true)?;
    let mut stream = UnixStream::from_std(predecessor)?;
    stream.write_all(&[READY]).await?;
    // Handed connections answer their next request `Connection: close`, as a
    // connection does once its server shuts down.
    let (_closing, close_after_next) = tokio::sync::watch::channel(true);
    loop {
        stream.readable().await?;
        let received = match stream.try_io(Interest::READABLE, || recv_fds(&stream)) {
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        let Some(fds) = received else {
            return Ok(());
        };
        for fd in fds {
            let stream = match adopt(fd) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "a handed-over connection could not be adopted");
                    continue;
                }
            };
            METRICS
                .upgrade_connections
                .with_label_values(&["received"])
                .inc();
            tokio::spawn(Service::<FastPath>::handle_event(
                stream,
                fast.clone(),
                close_after_next.clone(),
            ));
        }
    }
}

/// One read: the descriptors that came with it, `None` at the end of the stream.
fn recv_fds(stream: &UnixStream) -> std::io::Result<Option<Vec<OwnedFd>>> {
    let mut bytes = [0u8; 16];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(16))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        stream,
        &mut [IoSliceMut::new(&mut bytes)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            fds.extend(rights);
        }
    }
    if msg.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    Ok(Some(fds))
}

/// A received descriptor as the stream pingora's listener would have made of it.
fn adopt(fd: OwnedFd) -> std::io::Result<Stream> {
    let tcp = std::net::TcpStream::from(fd);
    tcp.set_nonblocking(true)?;
    let tcp = tokio::net::TcpStream::from_std(tcp)?;
    let mut stream = L4Stream::from(tcp);
    stream.set_socket_digest(SocketDigest::from_raw_fd(stream.as_raw_fd()));
    Ok(Box::new(stream))
}

/// The background service of both sides: accepts successors on the hand-over
/// socket, and serves what a predecessor hands over (`--upgrade`).
pub struct HandoverService {
    handover: Arc<Handover>,
    listener: Mutex<Option<std::os::unix::net::UnixListener>>,
    predecessor: Mutex<Option<StdUnixStream>>,
    fast: FastPath,
}

impl HandoverService {
    /// `listener` from [`listen`]; `predecessor` from [`connect_predecessor`];
    /// `fast` a clone of the listener's fast path.
    pub fn new(
        handover: Arc<Handover>,
        listener: Option<std::os::unix::net::UnixListener>,
        predecessor: Option<StdUnixStream>,
        fast: FastPath,
    ) -> Self {
        HandoverService {
            handover,
            listener: Mutex::new(listener),
            predecessor: Mutex::new(predecessor),
            fast,
        }
    }
}

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for HandoverService {
    async fn start(&self, shutdown: ShutdownWatch) {
        let listener = self.listener.lock().expect("handover lock").take();
        let predecessor = self.predecessor.lock().expect("handover lock").take();
        let fast = Arc::new(self.fast.clone());
        let receiving = async move {
            if let Some(p) = predecessor
                && let Err(e) = receive(p, fast).await
            {
                tracing::warn!(error = %e, "receiving connections from the previous process");
            }
        };
        let accepting = async {
            match listener.map(UnixListener::from_std) {
                Some(Ok(l)) => self.handover.clone().accept(l, shutdown).await,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "the connection hand-over socket");
                }
                None => {}
            }
        };
        tokio::join!(receiving, accepting);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_sits_beside_the_upgrade_socket() {
        assert_eq!(
            path(Path::new("/run/podgate/upgrade.sock")),
            PathBuf::from("/run/podgate/upgrade.sock.conns")
        );
    }
}

//! Connections to the Pods' upstreams for the fast path: a pool of idle HTTP/1
//! connections per address, checked out with no system call (an idle connection
//! the Pod closed has reported readable to tokio's reactor: it is dropped), and
//! connected with pingora's connect timeout when none is idle.
//!
//! Each runtime keeps its own idle connections: with pingora's no-steal runtime
//! (`work_stealing = false`), a worker thread's tasks use the connections its own
//! reactor watches, never one whose readiness another thread's event loop reports.
//!
//! A request that fails on a reused connection before any byte of the response
//! arrived is sent again on a new one, as pingora retries `ReusedOnly` errors
//! (`pingora-core/src/protocols/http/v1/client.rs`): the Pod closed an idle
//! connection as the request went out.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::task::{Context, Poll};

use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::runtime::{Handle, Id};

/// Most idle connections kept per upstream address (pingora's pool default).
const MAX_IDLE_PER_ADDR: usize = 128;

/// Idle upstream connections by runtime and address, hashed with foldhash (the
/// addresses are the topology's).
#[derive(Debug, Default)]
pub(crate) struct Pool {
    idle: Mutex<HashMap<(Id, SocketAddr), Vec<TcpStream>, foldhash::fast::RandomState>>,
}

/// Why no connection could be had.
#[derive(Debug)]
pub(crate) enum ConnectError {
    /// Refused, unreachable, …
    Failed(std::io::Error),
    /// Not within [`crate::service::CONNECT_TIMEOUT`].
    TimedOut,
}

impl Pool {
    /// An idle connection to `addr` the Pod has not closed, else a new one.
    /// `true` with a reused connection.
    pub(crate) async fn checkout(
        &self,
        addr: SocketAddr,
    ) -> Result<(TcpStream, bool), ConnectError> {
        while let Some(conn) = self.take_idle(addr) {
            if still_idle(&conn) {
                return Ok((conn, true));
            }
        }
        Ok((connect(addr).await?, false))
    }

    fn take_idle(&self, addr: SocketAddr) -> Option<TcpStream> {
        let key = (Handle::current().id(), addr);
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.get_mut(&key)?.pop()
    }

    /// Keep `conn`, whose response was read to its end, for the next request to
    /// `addr`.
    pub(crate) fn put_back(&self, addr: SocketAddr, conn: TcpStream) {
        // The reactor's readable flag still stands from the response just read (it
        // clears only on a read that would block): clear it without asking the
        // socket, so that only a later event — the Pod closing the idle connection —
        // sets it again. A close that came with the response's last bytes is missed
        // here and caught as a reused connection failing before any byte (retried).
        let _ = conn.try_io(Interest::READABLE, || {
            Err::<(), _>(std::io::ErrorKind::WouldBlock.into())
        });
        let key = (Handle::current().id(), addr);
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.entry(key).or_default();
        if list.len() < MAX_IDLE_PER_ADDR {
            list.push(conn);
        }
    }

    /// Idle connections held now (tests).
    #[cfg(test)]
    pub(crate) fn idle_count(&self) -> usize {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.values().map(Vec::len).sum()
    }
}

/// A new connection to `addr`, Nagle off (a request leaves in one write).
pub(crate) async fn connect(addr: SocketAddr) -> Result<TcpStream, ConnectError> {
    match tokio::time::timeout(crate::service::CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
        Err(_) => Err(ConnectError::TimedOut),
        Ok(Err(e)) => Err(ConnectError::Failed(e)),
        Ok(Ok(conn)) => {
            let _ = conn.set_nodelay(true);
            Ok(conn)
        }
    }
}

/// Whether an idle connection is still open and silent: the reactor has not
/// reported it readable (a close, a reset, or bytes an idle connection must not
/// carry). Asks tokio's readiness, not the socket: no system call.
fn still_idle(conn: &TcpStream) -> bool {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    matches!(conn.poll_read_ready(&mut cx), Poll::Pending)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn a_connection_the_pod_closed_is_not_checked_out_again() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let pool = Pool::default();
        let (mut conn, reused) = pool.checkout(addr).await.unwrap();
        assert!(!reused);
        let (mut server_side, _) = listener.accept().await.unwrap();
        // A response read to its end leaves the reactor's readable flag set: the
        // connection is still reused.
        server_side.write_all(b"response").await.unwrap();
        let mut got = [0u8; 8];
        conn.read_exact(&mut got).await.unwrap();
        pool.put_back(addr, conn);
        assert_eq!(pool.idle_count(), 1);
        let (conn, reused) = pool.checkout(addr).await.unwrap();
        assert!(
            reused,
            "an idle connection with its response read was not reused"
        );
        pool.put_back(addr, conn);
        // The Pod closes it while it is idle: once the reactor has delivered the
        // close (awaited here as the event it is), it is never checked out again.
        server_side.shutdown().await.unwrap();
        drop(server_side);
        let idle = pool.take_idle(addr).unwrap();
        idle.readable().await.unwrap();
        pool.idle
            .lock()
            .unwrap()
            .entry((Handle::current().id(), addr))
            .or_default()
            .push(idle);
        let (conn, reused) = pool.checkout(addr).await.unwrap();
        assert!(!reused, "a closed idle connection was reused");
        drop(conn);
        assert_eq!(pool.idle_count(), 0);
    }

    /// With the no-steal runtime every worker thread runs a runtime of its own: a
    /// connection one put back is reused by that one only.
    #[test]
    fn each_runtime_reuses_its_own_connections_only() {
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let (a, b) = (runtime(), runtime());
        let pool = Pool::default();
        let listener = a.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        a.block_on(async {
            let (conn, reused) = pool.checkout(addr).await.unwrap();
            assert!(!reused);
            pool.put_back(addr, conn);
        });
        let from_b = b.block_on(async { pool.checkout(addr).await.unwrap() });
        assert!(!from_b.1, "runtime b reused runtime a's connection");
        let from_a = a.block_on(async { pool.checkout(addr).await.unwrap() });
        assert!(from_a.1, "runtime a did not reuse its own connection");
    }

    #[tokio::test]
    async fn a_refused_connection_is_an_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        assert!(matches!(
            Pool::default().checkout(addr).await,
            Err(ConnectError::Failed(_))
        ));
    }
}

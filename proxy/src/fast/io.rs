//! The fast path's socket calls: sends (`send(2)`) and the Pod's responses
//! (`recv(2)`) made directly with rustix's system calls inside tokio's readiness,
//! rather than through pingora's stream layers, tokio's `AsyncRead`/`AsyncWrite`,
//! mio and `std`, which end in libc's wrappers: those mark each call a
//! thread-cancellation point, two more calls per system call that a tokio worker
//! never needs. The client's reads are made the same way ([`recv`]).
//!
//! Readiness stays tokio's: a call is made only while tokio holds the socket
//! ready, and one that would block clears that readiness and waits for the next
//! event ([`TcpStream::try_io`]), as tokio's own reads and writes do.

use std::io;
use std::task::{Poll, ready};

use pingora::protocols::l4::stream::Stream as L4Stream;
use rustix::net::{RecvFlags, SendFlags};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::TcpStream;

/// How a client connection is read and written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Access {
    /// Through pingora's stream: it has been pingora-proxy's, whose buffers may
    /// hold bytes read ahead.
    Stream,
    /// On the socket itself: sends with [`send_all`], reads with [`recv`].
    Socket,
}

/// Read more of what `stream` holds into `buf`, as `access` says. `Ok(0)`: the
/// client closed.
pub(super) async fn read(
    stream: &mut L4Stream,
    access: Access,
    buf: &mut Vec<u8>,
) -> io::Result<usize> {
    match (access, stream.tcp_mut()) {
        (Access::Socket, Some(tcp)) => recv(tcp, buf).await,
        _ => stream.read_buf(buf).await,
    }
}

/// Read into `buf` (a watch for the client closing), as `access` says. `Ok(0)`:
/// the client closed.
pub(super) async fn read_into(
    stream: &mut L4Stream,
    access: Access,
    buf: &mut [u8],
) -> io::Result<usize> {
    match (access, stream.tcp_mut()) {
        (Access::Socket, Some(tcp)) => tcp.read(buf).await,
        _ => stream.read(buf).await,
    }
}

/// Write all of `bytes` to `stream`, as `access` says: on the socket itself, or
/// through the stream and flushed.
pub(super) async fn write(stream: &mut L4Stream, access: Access, bytes: &[u8]) -> io::Result<()> {
    match (access, stream.tcp()) {
        (Access::Socket, Some(tcp)) => send_all(tcp, bytes).await,
        _ => {
            stream.write_all(bytes).await?;
            stream.flush().await
        }
    }
}

/// Receive into the spare capacity of `buf` (which must have some), waiting for
/// readiness. `Ok(0)`: the peer closed.
///
/// A short read (fewer bytes than there was room for) drained the socket: it
/// clears tokio's readiness, so that the next read waits for the next event
/// instead of failing with `EAGAIN`. The readiness cleared is the one the read
/// was tried under (its tick, taken by [`TcpStream::try_io`] before the call): an
/// event the reactor reported during the read is kept, on any runtime. This is
/// what tokio's own read does (`PollEvented::poll_read` in tokio's
/// `io/poll_evented.rs`); the read's result leaves the closure beside the
/// `WouldBlock` that asks `try_io` to clear.
pub(super) async fn recv(sock: &TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    debug_assert!(buf.capacity() > buf.len());
    std::future::poll_fn(|cx| {
        loop {
            ready!(sock.poll_read_ready(cx))?;
            let room = buf.capacity() - buf.len();
            let mut got = 0;
            let read = sock.try_io(Interest::READABLE, || {
                let (n, _) = rustix::net::recv(
                    sock,
                    rustix::buffer::spare_capacity(&mut *buf),
                    RecvFlags::empty(),
                )?;
                got = n;
                if n > 0 && n < room {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(n)
            });
            match read {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => {
                    return Poll::Ready(Ok(got));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    })
    .await
}

/// Send all of `bytes` on `sock`, waiting for room when the socket has none. The
/// wait is tokio's write-readiness slot of the socket, not a `writable()` future:
/// nothing more is kept across it than the bytes left to send (every connection's
/// future holds this one's state).
pub(super) async fn send_all(sock: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    std::future::poll_fn(|cx| {
        while !bytes.is_empty() {
            let sent = sock.try_io(Interest::WRITABLE, || {
                Ok(rustix::net::send(sock, bytes, SendFlags::NOSIGNAL)?)
            });
            match sent {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready!(sock.poll_write_ready(cx))?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(()))
    })
    .await
}

/// Read what `sock` holds into the spare capacity of `buf` (which must have
/// some), without waiting: `WouldBlock` when nothing is there yet.
pub(super) fn try_recv(sock: &TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    debug_assert!(buf.capacity() > buf.len());
    sock.try_io(Interest::READABLE, || {
        let (n, _) = rustix::net::recv(
            sock,
            rustix::buffer::spare_capacity(buf),
            RecvFlags::empty(),
        )?;
        Ok(n)
    })
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use super::*;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    /// More than the socket buffers hold: the send waits for room (tokio's
    /// readiness), and every byte arrives once, in order.
    #[tokio::test]
    async fn a_send_larger_than_the_socket_takes_waits_for_room() {
        let (client, mut server) = pair().await;
        let bytes: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            server.read_to_end(&mut got).await.unwrap();
            got
        });
        send_all(&client, &bytes).await.unwrap();
        drop(client);
        assert!(reader.await.unwrap() == bytes);
    }

    /// A short read leaves the socket not ready in tokio's eyes, so the next read
    /// waits for the next event rather than trying (an `EAGAIN`); the next bytes
    /// make it ready again and are read. A read that fills the buffer may have
    /// left bytes behind: the socket stays ready.
    #[tokio::test(flavor = "current_thread")]
    async fn a_short_read_waits_for_the_next_event() {
        let (client, server) = pair().await;
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        send_all(&client, b"first").await.unwrap();
        let mut buf = Vec::with_capacity(64);
        assert_eq!(recv(&server, &mut buf).await.unwrap(), 5);
        assert!(
            server.poll_read_ready(&mut cx).is_pending(),
            "still ready after a short read"
        );
        send_all(&client, b"second").await.unwrap();
        assert_eq!(recv(&server, &mut buf).await.unwrap(), 6);
        assert_eq!(buf, b"firstsecond");
        send_all(&client, &[7u8; 100]).await.unwrap();
        let mut full = Vec::with_capacity(10);
        server.readable().await.unwrap();
        assert_eq!(recv(&server, &mut full).await.unwrap(), full.capacity());
        assert!(server.poll_read_ready(&mut cx).is_ready());
        let mut rest = Vec::with_capacity(200);
        assert_eq!(recv(&server, &mut rest).await.unwrap(), 90);
        drop(client);
        assert_eq!(
            recv(&server, &mut rest).await.unwrap(),
            0,
            "a close reads 0"
        );
    }

    #[tokio::test]
    async fn a_send_to_a_closed_peer_fails() {
        let (client, server) = pair().await;
        drop(server);
        let bytes = vec![0u8; 1 << 20];
        let mut result = Ok(());
        for _ in 0..16 {
            result = send_all(&client, &bytes).await;
            if result.is_err() {
                break;
            }
        }
        let e = result.expect_err("a reset or broken pipe");
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ),
            "{e}"
        );
    }

    /// Nothing there: `WouldBlock`, and the readiness it clears comes back with
    /// the next bytes; then they are appended to what the buffer held.
    #[tokio::test]
    async fn a_receive_reads_what_came_and_says_when_nothing_did() {
        let (client, server) = pair().await;
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(b"kept:");
        let e = try_recv(&server, &mut buf).expect_err("nothing was sent");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        send_all(&client, b"hello").await.unwrap();
        server.readable().await.unwrap();
        assert_eq!(try_recv(&server, &mut buf).unwrap(), 5);
        assert_eq!(buf, b"kept:hello");
        drop(client);
        server.readable().await.unwrap();
        assert_eq!(try_recv(&server, &mut buf).unwrap(), 0, "the peer closed");
    }
}

//! An upgraded connection as two channels of bytes, whatever carries them: a
//! WebSocket (each binary message is a chunk; what kubectl's SPDY tunnel and the
//! channel protocol send) or the raw socket of a SPDY upgrade. Sessions read and
//! write chunks and need not know which.

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

/// The two directions of a connection. Dropping `tx` ends the connection
/// (a WebSocket is closed normally, a socket shut down); `rx` ends when the
/// client closes or goes away.
pub(super) struct Pipe {
    /// Chunks from the client.
    pub(super) rx: mpsc::Receiver<Bytes>,
    /// Chunks to the client.
    pub(super) tx: mpsc::Sender<Bytes>,
    /// Resolves once everything sent has been written and the connection closed.
    pub(super) closed: tokio::task::JoinHandle<()>,
}

/// A WebSocket's binary messages as chunks.
pub(super) fn websocket<S>(ws: WebSocketStream<S>) -> Pipe
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut source) = ws.split();
    let (in_tx, rx) = mpsc::channel::<Bytes>(64);
    let (tx, mut out_rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        while let Some(Ok(m)) = source.next().await {
            let b = match m {
                Message::Binary(b) => b,
                Message::Close(_) => return,
                // Pings are answered by the library; text is in no protocol here.
                _ => continue,
            };
            if in_tx.send(b).await.is_err() {
                return;
            }
        }
    });
    let closed = tokio::spawn(async move {
        while let Some(b) = out_rx.recv().await {
            if sink.send(Message::Binary(b)).await.is_err() {
                return;
            }
        }
        let _ = sink
            .send(Message::Close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            })))
            .await;
    });
    Pipe { rx, tx, closed }
}

/// A raw socket's bytes as chunks.
pub(super) fn raw<S>(io: S) -> Pipe
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut read, mut write) = tokio::io::split(io);
    let (in_tx, rx) = mpsc::channel::<Bytes>(64);
    let (tx, mut out_rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if in_tx.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    let closed = tokio::spawn(async move {
        while let Some(b) = out_rx.recv().await {
            if write.write_all(&b).await.is_err() {
                return;
            }
        }
        let _ = write.shutdown().await;
    });
    Pipe { rx, tx, closed }
}

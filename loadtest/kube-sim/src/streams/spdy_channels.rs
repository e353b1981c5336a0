//! `exec` and `attach` over SPDY/3.1, kubectl's fallback when the WebSocket
//! upgrade fails: `v4.channel.k8s.io`, or `v5.channel.k8s.io`, which over SPDY
//! is the same (negotiated by `X-Stream-Protocol-Version`),
//! one SPDY stream per channel, each opened by the client and named by its
//! `streamtype` header (`error`, `stdin`, `stdout`, `stderr`, `resize`; client-go
//! `tools/remotecommand/v2.go`, `v3.go`, `v4.go`). As the kubelet does
//! (`k8s.io/kubelet/pkg/cri/streaming/remotecommand/httpstream.go`), the session starts
//! once the streams the request asked for are open; stdin ends when the client
//! half-closes its stream; at the end the status is written on the error stream,
//! every stream is finished and the connection closed.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::Result;
use super::channels::{self, STDERR, STDOUT, Streams, Work};
use super::pipe::Pipe;
use super::spdy::{self, Frame, Reader, Writer};

/// The channel protocols served over SPDY.
pub(super) const PROTOCOLS: &[&str] = &["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// Serve one session on a SPDY connection.
pub(super) async fn serve(mut pipe: Pipe, streams: Streams, work: Work) {
    if let Err(e) = session(&mut pipe, streams, work).await {
        tracing::debug!(error = %e, "kube-sim: SPDY exec or attach session ended");
    }
    drop(pipe.tx);
    let _ = tokio::time::timeout(Duration::from_secs(5), pipe.closed).await;
}

async fn session(pipe: &mut Pipe, streams: Streams, work: Work) -> Result<()> {
    let mut reader = Reader::new();
    let mut writer = Writer::new()?;
    let mut ids: HashMap<String, u32> = HashMap::new();
    let mut expected = vec!["error"];
    if streams.stdin {
        expected.push("stdin");
    }
    if streams.stdout {
        expected.push("stdout");
    }
    if streams.stderr && !streams.tty {
        expected.push("stderr");
    }
    if streams.tty {
        expected.push("resize");
    }
    // Frames that came after the last expected stream, in the same chunk.
    let mut early = Vec::new();
    while !expected.iter().all(|t| ids.contains_key(*t)) {
        let Some(b) = pipe.rx.recv().await else {
            return Ok(());
        };
        reader.extend(&b);
        while let Some(frame) = reader.next()? {
            match frame {
                Frame::SynStream {
                    stream, headers, ..
                } => {
                    send(pipe, writer.syn_reply(stream)?).await;
                    if let Some((_, t)) = headers.iter().find(|(k, _)| k == "streamtype") {
                        ids.insert(t.clone(), stream);
                    }
                }
                Frame::Ping { id } => send(pipe, spdy::ping(id)).await,
                Frame::GoAway => return Ok(()),
                other => early.push(other),
            }
        }
    }
    let id = |t: &str| ids.get(t).copied();
    let (stdin_tx, stdin_rx) = mpsc::channel::<Bytes>(16);
    let mut stdin_tx = Some(stdin_tx);
    let (out_tx, mut out_rx) = mpsc::channel::<(u8, Bytes)>(64);
    let (gone_tx, gone_rx) = oneshot::channel::<()>();
    let mut gone_tx = Some(gone_tx);
    let mut task = tokio::spawn(channels::run(streams, work, stdin_rx, out_tx, async {
        let _ = gone_rx.await;
    }));
    let mut client_open = true;
    let mut pending = early;
    let status = loop {
        for frame in pending.drain(..) {
            match frame {
                Frame::Data { stream, fin, data } if Some(stream) == id("stdin") => {
                    if let Some(tx) = &stdin_tx
                        && !data.is_empty()
                        && tx.send(data).await.is_err()
                    {
                        stdin_tx = None;
                    }
                    if fin {
                        stdin_tx = None;
                    }
                }
                Frame::RstStream { stream } if Some(stream) == id("stdin") => stdin_tx = None,
                Frame::Ping { id } => send(pipe, spdy::ping(id)).await,
                Frame::GoAway => {
                    client_open = false;
                    stdin_tx = None;
                    gone_tx.take().map(|g| g.send(()));
                }
                _ => {}
            }
        }
        tokio::select! {
            b = pipe.rx.recv(), if client_open => match b {
                Some(b) => {
                    reader.extend(&b);
                    while let Some(frame) = reader.next()? {
                        pending.push(frame);
                    }
                }
                None => {
                    client_open = false;
                    stdin_tx = None;
                    gone_tx.take().map(|g| g.send(()));
                }
            },
            Some((channel, data)) = out_rx.recv() => {
                let name = if channel == STDERR { "stderr" } else { "stdout" };
                if let Some(stream) = id(name) {
                    send(pipe, spdy::data(stream, false, &data)).await;
                }
            }
            r = &mut task => break r.ok().flatten(),
        }
    };
    // What the process wrote last, then the status, then every stream's end.
    while let Some((channel, data)) = out_rx.recv().await {
        let name = if channel == STDERR {
            "stderr"
        } else {
            "stdout"
        };
        if channel != STDOUT && channel != STDERR {
            continue;
        }
        if let Some(stream) = id(name) {
            send(pipe, spdy::data(stream, false, &data)).await;
        }
    }
    if let (Some(status), Some(error)) = (status, id("error")) {
        send(
            pipe,
            spdy::data(error, false, status.to_string().as_bytes()),
        )
        .await;
    }
    for t in expected {
        if let Some(stream) = id(t) {
            send(pipe, spdy::data(stream, true, &[])).await;
        }
    }
    Ok(())
}

async fn send(pipe: &Pipe, frame: Bytes) {
    let _ = pipe.tx.send(frame).await;
}

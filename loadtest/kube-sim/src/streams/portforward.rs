//! `port-forward` as kubectl (1.31 and later) speaks it by default: SPDY/3.1
//! tunnelled through a WebSocket (subprotocol `SPDY/3.1+portforward.k8s.io`),
//! each binary message carrying bytes of the SPDY connection (client-go
//! `tools/portforward/tunneling_dialer.go`, `tunneling_connection.go`), or, its
//! fallback, SPDY/3.1 on the upgraded socket itself (`portforward.k8s.io`). Per
//! forwarded connection kubectl opens an error stream, then a data stream, both
//! with the headers `streamtype`, `port` and `requestid` (client-go
//! `tools/portforward/portforward.go`); the kubelet pairs them by request id
//! (`k8s.io/kubelet/pkg/cri/streaming/portforward/httpstream.go`).
//!
//! kube-sim's Pods have no network: a port a container declares
//! (`spec.containers[].ports[].containerPort`) answers as an echo server, every
//! byte sent coming back; any other port is refused with the kubelet's words on
//! the error stream (as plain text, as kubelets wrote it before they wrapped it
//! in a JSON `portForwardErrResponse`).

use std::collections::{BTreeSet, HashMap};

use super::Result;
use super::pipe::Pipe;
use super::spdy::{self, Frame, Reader, Writer};

/// The WebSocket subprotocol served.
pub(super) const PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";
/// The `X-Stream-Protocol-Version` served on a plain SPDY upgrade.
pub(super) const SPDY_PROTOCOL: &str = "portforward.k8s.io";

/// One forwarded connection: its two streams, as far as they have arrived.
#[derive(Default)]
struct Pair {
    port: u16,
    error: Option<u32>,
    data: Option<u32>,
    /// Whether the port answers (decided when the data stream arrives).
    open: bool,
}

/// Serve one port-forward session for the Pod `pod` (`name`, `uid`) whose
/// containers declare `ports`, until the client closes the connection.
pub(super) async fn serve(mut pipe: Pipe, pod: (String, String), ports: BTreeSet<u16>) {
    if let Err(e) = session(&mut pipe, &pod, &ports).await {
        tracing::debug!(error = %e, pod = pod.0, "kube-sim: port-forward session ended");
    }
}

async fn session(pipe: &mut Pipe, pod: &(String, String), ports: &BTreeSet<u16>) -> Result<()> {
    let (pod, uid) = pod;
    let mut reader = Reader::new();
    let mut writer = Writer::new()?;
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    // Stream id → request id.
    let mut streams: HashMap<u32, String> = HashMap::new();
    while let Some(b) = pipe.rx.recv().await {
        reader.extend(&b);
        let mut out = Vec::new();
        while let Some(frame) = reader.next()? {
            match frame {
                Frame::SynStream {
                    stream, headers, ..
                } => {
                    out.push(writer.syn_reply(stream)?);
                    let header = |n: &str| {
                        headers
                            .iter()
                            .find(|(k, _)| k == n)
                            .map(|(_, v)| v.clone())
                            .unwrap_or_default()
                    };
                    let request = header("requestid");
                    let Ok(port) = header("port").parse::<u16>() else {
                        out.push(spdy::rst_stream(stream, 1));
                        continue;
                    };
                    let pair = pairs.entry(request.clone()).or_default();
                    pair.port = port;
                    match header("streamtype").as_str() {
                        "error" => pair.error = Some(stream),
                        "data" => pair.data = Some(stream),
                        _ => {
                            out.push(spdy::rst_stream(stream, 1));
                            continue;
                        }
                    }
                    streams.insert(stream, request.clone());
                    if let (Some(error), Some(data)) = (pair.error, pair.data) {
                        pair.open = ports.contains(&port);
                        if !pair.open {
                            let message = format!(
                                "error forwarding port {port} to pod {pod}, uid {uid}: failed to connect to localhost:{port} inside the pod: dial tcp4 127.0.0.1:{port}: connect: connection refused"
                            );
                            out.push(spdy::data(error, false, message.as_bytes()));
                            out.push(spdy::data(error, true, &[]));
                            out.push(spdy::data(data, true, &[]));
                        }
                    }
                }
                Frame::Data { stream, fin, data } => {
                    let Some(pair) = streams.get(&stream).and_then(|r| pairs.get(r)) else {
                        continue;
                    };
                    if pair.data != Some(stream) || !pair.open {
                        continue;
                    }
                    // The echo server: every byte back, and the end too.
                    if !data.is_empty() {
                        out.push(spdy::data(stream, false, &data));
                    }
                    if fin {
                        out.push(spdy::data(stream, true, &[]));
                        if let Some(error) = pair.error {
                            out.push(spdy::data(error, true, &[]));
                        }
                        close_pair(&mut pairs, &mut streams, stream);
                    }
                }
                Frame::RstStream { stream } => {
                    if let Some(pair) = streams.get(&stream).and_then(|r| pairs.get(r))
                        && pair.data == Some(stream)
                    {
                        if let (Some(error), true) = (pair.error, pair.open) {
                            out.push(spdy::data(error, true, &[]));
                        }
                        close_pair(&mut pairs, &mut streams, stream);
                    }
                }
                Frame::Ping { id } => out.push(spdy::ping(id)),
                Frame::GoAway => return Ok(()),
                Frame::Other => {}
            }
        }
        for frame in out {
            if pipe.tx.send(frame).await.is_err() {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Forget the pair `stream` belongs to.
fn close_pair(pairs: &mut HashMap<String, Pair>, streams: &mut HashMap<u32, String>, stream: u32) {
    if let Some(request) = streams.get(&stream).cloned()
        && let Some(pair) = pairs.remove(&request)
    {
        for s in [pair.error, pair.data].into_iter().flatten() {
            streams.remove(&s);
        }
    }
}

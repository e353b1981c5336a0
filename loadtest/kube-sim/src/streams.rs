//! Pods' streaming subresources, served as kube-apiserver (with the kubelet
//! behind it) serves them to kubectl 1.32:
//!
//! - `pods/exec` and `pods/attach`: a WebSocket upgrade of a `GET`, subprotocol
//!   `v5.channel.k8s.io` or `v4.channel.k8s.io` (`channels`), which kubectl
//!   tries first, or its fallback, a SPDY/3.1 upgrade of a `POST`,
//!   `v4.channel.k8s.io` (`spdy_channels`); running the built-in shell
//!   (`shell`) or attaching to the container's main process (`containers`);
//! - `pods/portforward`: a WebSocket upgrade tunnelling SPDY/3.1, which kubectl
//!   tries first, or a SPDY/3.1 upgrade (`portforward`, `spdy`);
//! - `pods/log`: the container's log as text, followed with `follow=true` until
//!   the container's main process ends, the Pod is deleted or the client goes.
//!
//! `pipe` makes either kind of upgraded connection two channels of bytes.
//!
//! Read from Kubernetes' source (kubernetes/kubernetes; kubectl's side in
//! client-go, the kubelet's in `k8s.io/kubelet`):
//! <https://github.com/kubernetes/kubernetes/blob/030880a5dc5449403c6d1f0aa146a7dc21d6c6dc/staging/src/k8s.io/client-go/tools/remotecommand/websocket.go>,
//! <https://github.com/kubernetes/kubernetes/blob/286d1a4bd7a10618ab423c62293b030a96170bfc/staging/src/k8s.io/client-go/tools/portforward/tunneling_dialer.go>,
//! <https://github.com/kubernetes/kubernetes/blob/2bb08438fd2bb0f557e8f72431ddab0e4b4d9282/staging/src/k8s.io/client-go/tools/portforward/tunneling_connection.go>,
//! <https://github.com/kubernetes/kubernetes/blob/0cd27302dbe406a417b3e4167105382bfde77aec/staging/src/k8s.io/kubelet/pkg/cri/streaming/remotecommand/httpstream.go>,
//! <https://github.com/kubernetes/kubernetes/blob/cb07ae69a32f3bbde82cfc58a5e2041cb4093ab8/staging/src/k8s.io/kubelet/pkg/cri/streaming/remotecommand/exec.go>,
//! <https://github.com/kubernetes/kubernetes/blob/551ef3cb68b5698d56a082358d824380cc26225c/staging/src/k8s.io/kubelet/pkg/cri/streaming/portforward/httpstream.go>;
//! SPDY's framing from moby/spdystream,
//! <https://github.com/moby/spdystream/blob/6f72e20417ac3a81b74b4243917248f911fa4523/spdy/types.go>.
//! Authorization is kube-apiserver 1.32's: the verb is the request's (`get` for
//! the WebSocket `GET`, `create` for the SPDY `POST`) on the subresource
//! (`pods/exec`), so a user with `create` alone gets the WebSocket refused and
//! succeeds with the fallback; kube-apiserver 1.35 also asks for `create` on
//! WebSocket upgrades (the `AuthorizePodWebsocketUpgradeCreatePermission` gate),
//! which kube-sim, reporting 1.32, does not.

mod channels;
mod containers;
mod dictionary;
mod pipe;
mod portforward;
mod shell;
mod spdy;
mod spdy_channels;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

pub(crate) use containers::Containers;
use containers::Output;

use super::http::{Body, error, percent_decode};
use super::resources::{key, kind};
use super::store::Shared;

/// Errors of a streaming session. None is retried: the session ends.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The client sent SPDY kube-sim cannot read.
    #[error("SPDY: {0}")]
    Spdy(String),
}

/// Results of streaming sessions.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// Where a connection's upgraded sessions run: the connection's own task, so a
/// server that stops ends them with its connections.
#[derive(Clone)]
pub(crate) struct Sessions(pub(crate) tokio::sync::mpsc::UnboundedSender<BoxFuture<'static, ()>>);

/// The streaming subresources served.
pub(super) const SUBRESOURCES: &[&str] = &["exec", "attach", "portforward", "log"];

impl Shared {
    /// Serve `pods/<sub>` of the Pod `ns`/`name` (already authorized).
    pub(super) fn pod_stream(
        self: &Arc<Self>,
        mut req: Request<Incoming>,
        ns: &str,
        name: &str,
        sub: &str,
    ) -> Response<Body> {
        let pods = kind("pods").expect("served");
        let pod = self
            .lock()
            .objects
            .get(&key(pods, ns, name))
            .map(|o| o.value());
        let Some(pod) = pod else {
            return error(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("pods \"{name}\" not found"),
            );
        };
        let q = query_pairs(req.uri());
        let one = |k: &str| q.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        let flag = |k: &str| one(k).is_some_and(|v| v == "true" || v == "1");
        // Port-forwarding reaches the Pod's network namespace, not a container.
        let container = match sub {
            "portforward" => Value::Null,
            _ => match pick_container(&pod, name, one("container")) {
                Ok(c) => c,
                Err(message) => return error(StatusCode::BAD_REQUEST, "BadRequest", &message),
            },
        };
        let container_name = container["name"].as_str().unwrap_or("").to_owned();
        let env = shell::Env::of(name, &container);
        let phase = pod["status"]["phase"].as_str().unwrap_or("");
        if sub == "log" {
            let tail = one("tailLines").and_then(|t| t.parse().ok());
            return self.log(ns, name, &container_name, tail, flag("follow"));
        }
        if matches!(phase, "Succeeded" | "Failed") && sub != "portforward" {
            let verb = if sub == "exec" { "exec into" } else { "attach" };
            return error(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                &format!("cannot {verb} a container in a completed pod; current phase is {phase}"),
            );
        }
        let upgrade = match negotiate(req.headers(), sub) {
            Ok(u) => u,
            Err(message) => return error(StatusCode::BAD_REQUEST, "BadRequest", &message),
        };
        let session: BoxFuture<'static, ()> = {
            let on_upgrade = hyper::upgrade::on(&mut req);
            let streams = channels::Streams {
                stdin: flag("stdin"),
                stdout: flag("stdout"),
                stderr: flag("stderr"),
                tty: flag("tty"),
            };
            let work = match sub {
                "exec" => {
                    let argv: Vec<String> = q
                        .iter()
                        .filter(|(k, _)| k == "command")
                        .map(|(_, v)| v.clone())
                        .collect();
                    if argv.is_empty() {
                        return error(
                            StatusCode::BAD_REQUEST,
                            "BadRequest",
                            "you must specify at least 1 command",
                        );
                    }
                    Some(channels::Work::Exec { argv, env })
                }
                "attach" => Some(channels::Work::Attach {
                    container: self.containers.get(ns, name, &container_name),
                    env,
                }),
                _ => None,
            };
            if work.is_some() && !(streams.stdin || streams.stdout || streams.stderr) {
                return error(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "you must specify at least 1 of stdin, stdout, stderr",
                );
            }
            let ports = declared_ports(&pod);
            let pod_name = (
                name.to_owned(),
                pod["metadata"]["uid"].as_str().unwrap_or("").to_owned(),
            );
            let websocket = matches!(upgrade, Upgrade::WebSocket { .. });
            Box::pin(async move {
                let Ok(upgraded) = on_upgrade.await else {
                    return;
                };
                let io = TokioIo::new(upgraded);
                let pipe = if websocket {
                    pipe::websocket(WebSocketStream::from_raw_socket(io, Role::Server, None).await)
                } else {
                    pipe::raw(io)
                };
                match (work, websocket) {
                    (Some(work), true) => channels::serve(pipe, streams, work).await,
                    (Some(work), false) => spdy_channels::serve(pipe, streams, work).await,
                    (None, _) => portforward::serve(pipe, pod_name, ports).await,
                }
            })
        };
        match req.extensions().get::<Sessions>() {
            Some(s) => {
                let _ = s.0.send(session);
            }
            None => {
                tokio::spawn(session);
            }
        }
        let mut r = Response::new(http_body_util::Empty::new().boxed());
        *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = r.headers_mut();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        match upgrade {
            Upgrade::WebSocket { accept, protocol } => {
                h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
                if let Ok(accept) = HeaderValue::from_str(&accept) {
                    h.insert("sec-websocket-accept", accept);
                }
                h.insert("sec-websocket-protocol", HeaderValue::from_static(protocol));
            }
            Upgrade::Spdy { protocol } => {
                h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
                h.insert(
                    "x-stream-protocol-version",
                    HeaderValue::from_static(protocol),
                );
            }
        }
        r
    }

    /// `pods/log`: the kept lines (the last `tail` of them), then, when
    /// following, new ones until the main process ends or the Pod goes.
    fn log(
        self: &Arc<Self>,
        ns: &str,
        pod: &str,
        container: &str,
        tail: Option<usize>,
        follow: bool,
    ) -> Response<Body> {
        let c = self.containers.get(ns, pod, container);
        let mut events = self.events.subscribe();
        let (backlog, mut output) = c.follow(tail);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
        let (ns, pod) = (ns.to_owned(), pod.to_owned());
        tokio::spawn(async move {
            for line in backlog {
                if tx.send(Ok(Frame::data(line))).await.is_err() {
                    return;
                }
            }
            if !follow {
                return;
            }
            loop {
                tokio::select! {
                    o = output.recv() => match o {
                        Ok(Output::Line(line)) => {
                            if tx.send(Ok(Frame::data(line))).await.is_err() {
                                return;
                            }
                        }
                        Ok(Output::Exit) | Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    },
                    e = events.recv() => match e {
                        Ok(e) if e.kind == "DELETED"
                            && e.resource.plural == "pods"
                            && e.object.index.name() == pod
                            && e.object.index.namespace() == ns => return,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                        _ => {}
                    },
                    () = tx.closed() => return,
                }
            }
        });
        let mut r = Response::new(StreamBody::new(tokio_stream_from(rx)).boxed());
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        r
    }
}

/// A receiver as a stream of body frames.
fn tokio_stream_from(
    rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + 'static {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) })
}

/// Every query pair in order, repeated keys kept (`command=echo&command=hi`).
fn query_pairs(uri: &http::Uri) -> Vec<(String, String)> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// How a streaming request upgrades its connection.
enum Upgrade {
    /// To a WebSocket: the `Sec-WebSocket-Accept` value and the subprotocol.
    WebSocket {
        accept: String,
        protocol: &'static str,
    },
    /// To SPDY/3.1 on the socket, with this `X-Stream-Protocol-Version`.
    Spdy { protocol: &'static str },
}

/// The upgrade a request for `pods/<sub>` asks for and kube-sim serves, or why
/// none is: a WebSocket with a served subprotocol, or SPDY/3.1 with a served
/// `X-Stream-Protocol-Version` (apimachinery's `httpstream.Handshake`).
fn negotiate(headers: &http::HeaderMap, sub: &str) -> Result<Upgrade, String> {
    let upgrade = headers
        .get(header::UPGRADE)
        .map(|u| String::from_utf8_lossy(u.as_bytes()).to_ascii_lowercase())
        .unwrap_or_default();
    // The client's first choice that is served, as `httpstream.Handshake` and
    // `wsstream`'s handshake choose.
    let pick = |offered: Vec<String>, served: &[&'static str], what: &str| {
        offered
            .iter()
            .find_map(|o| served.iter().copied().find(|p| p == o))
            .ok_or_else(|| {
                format!(
                    "unable to upgrade: unable to negotiate {what}: client supports [{}], server supports [{}]",
                    offered.join(" "),
                    served.join(" ")
                )
            })
    };
    match upgrade.as_str() {
        "websocket" => {
            let key = headers
                .get("sec-websocket-key")
                .ok_or("a WebSocket upgrade needs Sec-WebSocket-Key")?;
            let served: &[&'static str] = if sub == "portforward" {
                &[portforward::PROTOCOL]
            } else {
                channels::PROTOCOLS
            };
            Ok(Upgrade::WebSocket {
                accept: derive_accept_key(key.as_bytes()),
                protocol: pick(
                    protocols(headers, "sec-websocket-protocol"),
                    served,
                    "subprotocol",
                )?,
            })
        }
        "spdy/3.1" => {
            let served: &[&'static str] = if sub == "portforward" {
                &[portforward::SPDY_PROTOCOL]
            } else {
                spdy_channels::PROTOCOLS
            };
            Ok(Upgrade::Spdy {
                protocol: pick(
                    protocols(headers, "x-stream-protocol-version"),
                    served,
                    "protocol",
                )?,
            })
        }
        _ => Err(format!(
            "pods/{sub} needs a connection upgrade to a WebSocket or to SPDY/3.1"
        )),
    }
}

/// The protocols a request offers in header `name` (every such header,
/// comma-separated).
fn protocols(headers: &http::HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .flat_map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .split(',')
                .map(|p| p.trim().to_owned())
                .collect::<Vec<_>>()
        })
        .filter(|p| !p.is_empty())
        .collect()
}

/// The container a request names, or the only one; kube-apiserver's words when
/// neither fits (`pkg/registry/core/pod/strategy.go`, `validateContainer`).
fn pick_container(pod: &Value, name: &str, wanted: Option<&str>) -> Result<Value, String> {
    let containers: Vec<&Value> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let names: Vec<&str> = containers
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    match wanted.filter(|w| !w.is_empty()) {
        Some(w) => containers
            .iter()
            .find(|c| c["name"] == w)
            .map(|c| (*c).clone())
            .ok_or_else(|| format!("container {w} is not valid for pod {name}")),
        None if containers.len() == 1 => Ok(containers[0].clone()),
        None if containers.is_empty() => Err(format!("pod {name} does not have a container")),
        None => Err(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            names.join(" ")
        )),
    }
}

/// The ports a Pod's containers declare.
fn declared_ports(pod: &Value) -> BTreeSet<u16> {
    pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .filter_map(|p| p["containerPort"].as_u64())
        .filter_map(|p| u16::try_from(p).ok())
        .collect()
}

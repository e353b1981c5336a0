//! Reverse tunnels on the kas side. agentk opens `ReverseTunnel.Open` streams and
//! leaves them idle; kas takes one to send a request back to that agentk replica and
//! reads one response, then the tunnel ends (agentk replaces it).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use podgate_tokens::Classifier;
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::presence::authenticate;
use crate::proto::reverse_tunnel_server::ReverseTunnel;
use crate::proto::{TunnelDown, TunnelRequest, TunnelUp, tunnel_up};

/// An idle tunnel to one agentk replica.
struct Idle {
    connection_id: i64,
    down: mpsc::Sender<Result<TunnelDown, Status>>,
    up: Streaming<TunnelUp>,
}

/// This kas's idle tunnels, by agent.
#[derive(Default)]
pub struct Tunnels {
    idle: Mutex<HashMap<i64, VecDeque<Idle>>>,
    arrived: Notify,
}

impl Tunnels {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, VecDeque<Idle>>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Idle tunnels held for `agent_id` (replica `connection_id`, or any when 0).
    pub fn idle(&self, agent_id: i64, connection_id: i64) -> usize {
        self.lock().get(&agent_id).map_or(0, |q| {
            q.iter()
                .filter(|t| connection_id == 0 || t.connection_id == connection_id)
                .count()
        })
    }

    fn take(&self, agent_id: i64, connection_id: i64) -> Option<Idle> {
        let mut idle = self.lock();
        let q = idle.get_mut(&agent_id)?;
        let i = q
            .iter()
            .position(|t| connection_id == 0 || t.connection_id == connection_id)?;
        q.remove(i)
    }

    /// Send `method(payload)` to agent `agent_id` (replica `connection_id`, or any when
    /// 0) through an idle tunnel: `None` when this kas holds no usable tunnel to it.
    /// A tunnel that turns out dead is dropped and the next one tried.
    pub async fn call(
        &self,
        agent_id: i64,
        connection_id: i64,
        method: &str,
        payload: Vec<u8>,
    ) -> Option<Result<(i64, Vec<u8>), Status>> {
        while let Some(mut t) = self.take(agent_id, connection_id) {
            let request = TunnelDown {
                request: Some(TunnelRequest {
                    method: method.to_owned(),
                    payload: payload.clone(),
                }),
            };
            if t.down.send(Ok(request)).await.is_err() {
                continue;
            }
            match t.up.message().await {
                Ok(Some(TunnelUp {
                    msg: Some(tunnel_up::Msg::Response(r)),
                })) => {
                    return Some(if r.code == 0 {
                        Ok((t.connection_id, r.payload))
                    } else {
                        Err(Status::new(tonic::Code::from(r.code), r.message))
                    });
                }
                _ => continue,
            }
        }
        None
    }

    /// Wait until at least `n` idle tunnels to `agent_id` (replica `connection_id`, or
    /// any when 0) are held.
    pub async fn wait_idle(&self, agent_id: i64, connection_id: i64, n: usize) {
        loop {
            let notified = self.arrived.notified();
            tokio::pin!(notified);
            // Registered before the check, so an arrival in between is not missed.
            notified.as_mut().enable();
            if self.idle(agent_id, connection_id) >= n {
                return;
            }
            notified.await;
        }
    }
}

pub(crate) struct TunnelService {
    pub(crate) tunnels: Arc<Tunnels>,
    pub(crate) classifier: Arc<Classifier>,
}

#[tonic::async_trait]
impl ReverseTunnel for TunnelService {
    type OpenStream = ReceiverStream<Result<TunnelDown, Status>>;

    async fn open(
        &self,
        request: Request<Streaming<TunnelUp>>,
    ) -> Result<Response<Self::OpenStream>, Status> {
        let who = authenticate(&self.classifier, request.metadata())?;
        let mut up = request.into_inner();
        let connection_id = match up.message().await {
            Ok(Some(TunnelUp {
                msg: Some(tunnel_up::Msg::Hello(h)),
            })) => h.connection_id,
            _ => return Err(Status::invalid_argument("a tunnel starts with a hello")),
        };
        let (down, rx) = mpsc::channel(1);
        self.tunnels
            .lock()
            .entry(who.agent_id)
            .or_default()
            .push_back(Idle {
                connection_id,
                down,
                up,
            });
        self.tunnels.arrived.notify_waiters();
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

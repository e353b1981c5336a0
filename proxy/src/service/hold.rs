//! The edge hold of a runner's long poll ([`crate::edge_poll`]), as both paths
//! run it: which requests are held, and what the end of a hold means for the
//! request. Each path only supplies the future that resolves when its client
//! goes away.

use std::future::Future;

use pingora::prelude::*;

use super::{Ctx, PodGate};
use crate::answer::Answer;
use crate::edge_poll::{PodPolls, PollResult, RunnerRequest, Verdict};
use crate::rules::Rule;

/// How a request leaves an edge hold.
pub(crate) enum Held {
    /// Not held, or woken: forward it to the Pod.
    Forward,
    /// Answer it here (204 with `X-GitLab-Last-Update`); the Pod never sees it.
    Answer(Answer),
    /// The client went away during the hold: the error to log, nothing to answer.
    ClientGone(Box<Error>),
}

impl PodGate {
    /// The Pod's polls, when the request is forwarded by a rule with `edge_hold`
    /// to a Pod that opts in to edge holds (`runner_queue_redis`).
    pub(crate) fn edge_polls_for(&self, ctx: &Ctx, rule: &Rule) -> Option<PodPolls> {
        let pod = ctx.forwarded().filter(|_| rule.edge_hold())?;
        self.edge_polls.as_ref()?.pod(pod.id)
    }

    /// Hold the poll `request` (read with [`RunnerRequest::read`] from its headers
    /// and whole body) on `polls` ([`crate::edge_poll::PodPolls::hold`]) until it
    /// is answered, woken, or `gone` resolves; how it ended goes in `ctx.edge`.
    pub(crate) async fn hold(
        &self,
        ctx: &mut Ctx,
        polls: PodPolls,
        request: Option<RunnerRequest>,
        gone: impl Future<Output = ()>,
    ) -> Held {
        match polls.hold(request, gone).await {
            Verdict::Forward(r) => {
                ctx.edge = Some(r);
                Held::Forward
            }
            Verdict::NoContent(r, last_update) => {
                ctx.edge = Some(r);
                Held::Answer(Answer::edge_no_content(&last_update))
            }
            Verdict::ClientGone => {
                ctx.edge = Some(PollResult::ClientGone);
                Held::ClientGone(
                    Error::explain(
                        ErrorType::ConnectionClosed,
                        "the client went away during a long poll held at the edge",
                    )
                    .into_down(),
                )
            }
        }
    }
}

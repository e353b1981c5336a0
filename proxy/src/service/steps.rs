//! The steps of a request that both paths share (pingora-proxy's [`ProxyHttp`] in
//! the parent module and the HTTP/1 fast path in [`crate::fast`]): they do not
//! depend on how the request was read or how the answer is written.
//!
//! [`ProxyHttp`]: pingora::proxy::ProxyHttp

use std::fmt;
use std::time::{Duration, Instant};

use pingora::prelude::*;

use super::{Ctx, PodGate};
use crate::answer::Answer;
use crate::decision::{Decision, Outcome};
use crate::edge_poll::PollResult;
use crate::metrics::{self, METRICS};
use crate::pipeline::{self, BodyRead, Plan};
use crate::request_id::sane_request_id;

/// `X-Request-Id`, named once (a `&str` key is parsed on every lookup).
const X_REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-request-id");

/// What both paths share: the steps of a request that do not depend on how it was
/// read or is written.
impl PodGate {
    /// `X-Request-Id`: the client's if it sent a sane one, else a new one.
    pub(crate) fn request_id(&self, headers: &http::HeaderMap) -> String {
        match headers.get(X_REQUEST_ID) {
            Some(v) if sane_request_id(v.as_bytes()) => {
                String::from_utf8_lossy(v.as_bytes()).into_owned()
            }
            _ => self.ids.generate(),
        }
    }

    /// Path rules, before rule `rule`'s own action: a request to the web pool whose
    /// path names a claim goes to the owning Cell's Pod. `None`: the rule decides
    /// (no path rules, no claim in the path, no owner, or no answer in time).
    pub(crate) async fn route_by_path(&self, rule: usize, path: &str) -> Option<Decision> {
        let router = self.path_router.as_ref()?;
        if self.rules[rule].pool != crate::rules::Pool::Web {
            return None;
        }
        let claim = router.claim(path)?;
        let label = |outcome: &str| {
            METRICS.path_rules.with_label_values(&[outcome]).inc();
        };
        let address = match router.owner(&claim).await {
            crate::claims::Owner::Cell(a) => a,
            crate::claims::Owner::Unclaimed => {
                label("unclaimed");
                return None;
            }
            crate::claims::Owner::Unavailable => {
                label("unavailable");
                return None;
            }
        };
        let topology = self.registry.topology();
        let Some(pod) = crate::claims::pod_of(&topology, &address) else {
            // A Cell the topology does not name: the token rules decide, and the
            // operator is told.
            label("unknown_cell");
            tracing::warn!(cell = %address, "a claim's owner is no Pod's cell_address");
            return None;
        };
        label("claimed");
        let why = match claim {
            crate::claims::PathClaim::Route(_) => crate::claims::BY_ROUTE,
            crate::claims::PathClaim::Organization(_) => crate::claims::BY_ORGANIZATION,
        };
        Some(Decision {
            outcome: crate::decision::to_pod(&topology, pod, why),
            token: None,
        })
    }

    /// Step 1 of [`crate::pipeline`] with this router's rules and look-ahead.
    pub(crate) fn plan(&self, head: &pipeline::Head<'_>) -> Plan {
        pipeline::plan(&self.rules, head, self.body_lookahead)
    }

    /// Step 2 of [`crate::pipeline`] for rule `rule`, on the current topology.
    pub(crate) fn decide(
        &self,
        rule: usize,
        head: &pipeline::Head<'_>,
        body: BodyRead<'_>,
    ) -> Decision {
        pipeline::decide(
            &self.rules[rule],
            head,
            body,
            &self.registry.topology(),
            &self.classifier,
            self.on_invalid,
        )
    }

    /// Record the decision for rule `rule` in `ctx` ([`PodGate::settle`]d) and
    /// say what the proxy answers itself, if anything (`None`: forward).
    pub(crate) fn conclude(
        &self,
        rule: usize,
        decision: Decision,
        ctx: &mut Ctx,
    ) -> Option<Answer> {
        ctx.rule = Some(rule);
        ctx.token = decision.token;
        let now = super::now();
        let started = ctx.started.unwrap_or(now);
        let outcome = self.settle(rule, decision.outcome, now - started);
        ctx.decided = Some(now);
        let answer = Answer::for_outcome(self.rules[rule].pool, &outcome);
        ctx.outcome = Some(outcome);
        answer
    }

    /// The outcome as decided, except that a Pod with no address to try (none
    /// listed, none resolved, every one failing its health check) is a 503 now,
    /// rather than a connection attempt bound to fail. Observes the decision time
    /// (`took`).
    pub(crate) fn settle(&self, rule: usize, outcome: Outcome, took: Duration) -> Outcome {
        let outcome = match outcome {
            Outcome::Forward { pod, why } => {
                match self
                    .upstreams
                    .availability(pod.id, self.rules[rule].pool)
                    .reason()
                {
                    Some(reason) => Outcome::Unavailable(reason),
                    None => Outcome::Forward { pod, why },
                }
            }
            o => o,
        };
        self.histograms[rule].decision.observe(took.as_secs_f64());
        outcome
    }

    /// Count and log a finished request (both paths) that ended at `now`: one line
    /// per request with a token fingerprint only. Failures from the Pod or from us
    /// are warnings; a client that went away (a runner abandoning a long poll) is
    /// routine: debug.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn log_request(
        &self,
        method: &str,
        path: &str,
        status: u16,
        ctx: &Ctx,
        e: Option<&Error>,
        via: &'static str,
        now: Instant,
    ) {
        let rule = ctx.rule.map_or("-", |i| self.rules[i].name.as_str());
        let outcome = match (&ctx.edge, &ctx.outcome) {
            // Answered at the edge, the Pod never saw it.
            (Some(PollResult::Timeout | PollResult::NoChange), _) => "edge_held",
            (_, o) => o.as_ref().map_or("-", Outcome::label),
        };
        let pod = ctx.forwarded().map_or(0, |p| p.id.get());
        let source_label = match (ctx.rule, &ctx.token) {
            (Some(r), Some(t)) => self.source_label(r, t),
            _ => "none",
        };
        let mut pod_buf = itoa::Buffer::new();
        let mut status_buf = itoa::Buffer::new();
        metrics::count_request([
            rule,
            pod_buf.format(pod),
            status_buf.format(status),
            source_label,
            outcome,
        ]);
        let elapsed = ctx.started.map_or(0.0, |t| (now - t).as_secs_f64());
        if let Some(h) = ctx.rule.and_then(|i| self.histograms.get(i)) {
            h.duration[metrics::status_class_index(status)].observe(elapsed);
        }
        let request_id = ctx.request_id.as_str();
        // Formatted only when the line is emitted: nothing is hashed or rendered on
        // a request whose log level is off.
        let source = source_label;
        let token = Lazy(|f: &mut fmt::Formatter<'_>| match &ctx.token {
            Some(t) => f.write_str(&podgate_tokens::fingerprint(&t.token)),
            None => f.write_str("-"),
        });
        match e {
            None => match &ctx.outcome {
                // Refused here: say why, so a client's mistake is visible in the log.
                Some(Outcome::Refused(r)) => tracing::info!(
                    method, path, status, rule, outcome, source, token = %token, request_id, elapsed, via, refusal = %r.detail, "refused"
                ),
                _ => tracing::info!(
                    method, path, status, rule, outcome, pod, source, token = %token, request_id, elapsed, via, edge = ctx.edge.map_or("-", PollResult::as_str), "request"
                ),
            },
            Some(e) if *e.esource() == ErrorSource::Downstream => {
                tracing::debug!(method, path, status, rule, outcome, pod, source, token = %token, request_id, elapsed, via, error = %e, "client went away")
            }
            Some(e) => {
                tracing::warn!(method, path, status, rule, outcome, pod, source, token = %token, request_id, elapsed, via, error = %e, "request failed")
            }
        }
    }
}

/// A value formatted by a closure, only when displayed.
struct Lazy<F>(F);

impl<F: Fn(&mut fmt::Formatter<'_>) -> fmt::Result> fmt::Display for Lazy<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (self.0)(f)
    }
}

//! The steps of a request that both paths share (pingora-proxy's [`ProxyHttp`] in
//! the parent module and the HTTP/1 fast path in [`crate::fast`]): they do not
//! depend on how the request was read or how the answer is written.
//!
//! [`ProxyHttp`]: pingora::proxy::ProxyHttp

use std::fmt;
use std::time::Instant;

use pingora::prelude::*;

use super::{Ctx, PodGate};
use crate::decision::{self, Decision, Outcome};
use crate::edge_poll::PollResult;
use crate::metrics::{self, METRICS};
use crate::request_id::sane_request_id;
use crate::rules::{self, ActionKind, Rule};

/// What both paths share: the steps of a request that do not depend on how it was
/// read or is written.
impl PodGate {
    /// `X-Request-Id`: the client's if it sent a sane one, else a new one.
    pub(crate) fn request_id(&self, headers: &http::HeaderMap) -> String {
        match headers.get("x-request-id") {
            Some(v) if sane_request_id(v.as_bytes()) => {
                String::from_utf8_lossy(v.as_bytes()).into_owned()
            }
            _ => self.ids.generate(),
        }
    }

    /// The first rule matching the request. Rules match the path GitLab would serve
    /// ([`crate::path::normalize`]); the request is forwarded as received.
    pub(crate) fn rule_for(
        &self,
        method: &http::Method,
        path: &str,
        headers: &http::HeaderMap,
        host: Option<&str>,
    ) -> Option<usize> {
        let path = crate::path::normalize(path);
        self.rules
            .iter()
            .position(|r| r.matches_host(method, &path, headers, host))
    }

    /// Where a rule that does not route by token sends the request.
    pub(crate) fn fixed_outcome(&self, rule: &Rule, headers: &http::HeaderMap) -> Outcome {
        let topology = self.registry.topology();
        match rule.action {
            ActionKind::RouteToPod => match rule.pod {
                Some(p) => decision::to_pod(&topology, p, "pinned"),
                None => decision::to_legacy(&topology, "default"),
            },
            ActionKind::SessionPrefix => {
                match rules::cookie(headers, "_gitlab_session")
                    .and_then(|v| topology.pod_for_session(v))
                {
                    Some(p) => decision::to_pod(&topology, p.id, "session"),
                    None => decision::to_legacy(&topology, "default"),
                }
            }
            ActionKind::RouteByToken | ActionKind::Default => {
                decision::to_legacy(&topology, "default")
            }
        }
    }

    /// Route by the tokens in what was read of the request
    /// ([`decision::route_by_token`] on the current topology).
    pub(crate) fn token_decision(&self, rule: &Rule, request: &decision::Request<'_>) -> Decision {
        decision::route_by_token(
            rule,
            request,
            &self.registry.topology(),
            &self.classifier,
            self.on_invalid,
        )
    }

    /// The outcome as decided, except that a Pod with no address to try (none
    /// listed, none resolved, every one failing its health check) is a 503 now,
    /// rather than a connection attempt bound to fail. Observes the decision time.
    pub(crate) fn settle(&self, rule: usize, outcome: Outcome, started: Instant) -> Outcome {
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
        self.histograms[rule]
            .decision
            .observe(started.elapsed().as_secs_f64());
        outcome
    }

    /// Count and log a finished request (both paths): one line per request with a
    /// token fingerprint only. Failures from the Pod or from us are warnings; a
    /// client that went away (a runner abandoning a long poll) is routine: debug.
    pub(crate) fn log_request(
        &self,
        method: &str,
        path: &str,
        status: u16,
        ctx: &Ctx,
        e: Option<&Error>,
        via: &'static str,
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
        let mut pod_buf = itoa_buf::Buf::default();
        let mut status_buf = itoa_buf::Buf::default();
        METRICS
            .requests
            .with_label_values(&[
                rule,
                pod_buf.format(pod),
                status_buf.format(u64::from(status)),
                source_label,
                outcome,
            ])
            .inc();
        let elapsed = ctx.started.map_or(0.0, |t| t.elapsed().as_secs_f64());
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

/// Decimal formatting of label values on the stack, without allocating.
mod itoa_buf {
    /// Room for any `u64`.
    #[derive(Default)]
    pub(super) struct Buf([u8; 20]);

    impl Buf {
        pub(super) fn format(&mut self, mut n: u64) -> &str {
            let mut i = self.0.len();
            loop {
                i -= 1;
                self.0[i] = b'0' + (n % 10) as u8;
                n /= 10;
                if n == 0 {
                    break;
                }
            }
            std::str::from_utf8(&self.0[i..]).unwrap_or("0")
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn formats_like_display() {
            for n in [0, 7, 10, 401, 503, 65_535, u64::MAX] {
                assert_eq!(super::Buf::default().format(n), n.to_string());
            }
        }
    }
}

//! Forwarding steps both paths share: which address of the decided Pod a
//! request (or its retry) goes to, what a failed connection attempt means, and the
//! headers the proxy adds to the request the Pod receives.

use std::net::SocketAddr;

use pingora::prelude::*;
use podgate_tokens::PodId;

use super::{Ctx, PodGate};
use crate::metrics::METRICS;
use crate::rules::{Pool, Rule};

/// How long a connection to a Pod's upstream may take to open, on both paths
/// (pingora's peers and the fast path's own connections).
pub(crate) const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The headers the proxy sets on a forwarded request, replacing any the client
/// sent: the Pod decided, the rule that decided it, the request id, and how GitLab's
/// HTTP Router would name the decision (Rails logs and counts these,
/// `lib/gitlab/http_router/rule_context.rb` in gitlabhq/gitlabhq): the action
/// (`classify` or `proxy`) and, for `classify`, its type (`CELL_ID`,
/// `SESSION_PREFIX`, or a path rule's claim: `route`, `organizationPath`).
pub(crate) const ADDED_HEADERS: [&str; 5] = [
    "x-podgate-pod",
    "x-podgate-rule",
    "x-request-id",
    "x-gitlab-http-router-rule-action",
    "x-gitlab-http-router-rule-type",
];

/// The values of [`ADDED_HEADERS`] for one request.
pub(crate) struct Added<'a> {
    pod: PodId,
    rule: &'a str,
    request_id: &'a str,
    why: &'static str,
}

/// How GitLab's HTTP Router names a decision that forwarded for `why` (an
/// [`crate::decision::Outcome::Forward`]'s reason): the action and, when it
/// classified, the type.
pub(crate) fn router_rule(why: &str) -> (&'static str, Option<&'static str>) {
    match why {
        "routable" => ("classify", Some("CELL_ID")),
        "session" => ("classify", Some("SESSION_PREFIX")),
        crate::claims::BY_ROUTE => ("classify", Some("route")),
        crate::claims::BY_ORGANIZATION => ("classify", Some("organizationPath")),
        _ => ("proxy", None),
    }
}

impl<'a> Added<'a> {
    /// The headers for a request to `pod`, by rule `rule`, with `request_id`,
    /// forwarded for `why`.
    pub(crate) fn new(pod: PodId, rule: &'a str, request_id: &'a str, why: &'static str) -> Self {
        Added {
            pod,
            rule,
            request_id,
            why,
        }
    }

    /// Each added header's name and value, in [`ADDED_HEADERS`]' order; the
    /// values are formatted without allocating.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&'static str, &[u8])) {
        let mut pod = itoa::Buffer::new();
        f(ADDED_HEADERS[0], pod.format(self.pod.get()).as_bytes());
        f(ADDED_HEADERS[1], self.rule.as_bytes());
        f(ADDED_HEADERS[2], self.request_id.as_bytes());
        let (action, kind) = router_rule(self.why);
        f(ADDED_HEADERS[3], action.as_bytes());
        if let Some(kind) = kind {
            f(ADDED_HEADERS[4], kind.as_bytes());
        }
    }

    /// Whether `name` is one of the added headers (a client's copy is dropped).
    pub(crate) fn is_added(name: &[u8]) -> bool {
        ADDED_HEADERS
            .iter()
            .any(|h| name.eq_ignore_ascii_case(h.as_bytes()))
    }
}

impl PodGate {
    /// The rule `ctx` was routed by; `None` before one was (a request without a
    /// rule is never forwarded, held or retried).
    pub(crate) fn rule_of(&self, ctx: &Ctx) -> Option<&Rule> {
        ctx.rule.map(|i| &self.rules[i])
    }

    /// The headers added to a request forwarded to `pod` by `rule`.
    pub(crate) fn added<'a>(&self, ctx: &'a Ctx, rule: &'a Rule, pod: PodId) -> Added<'a> {
        let why = match &ctx.outcome {
            Some(crate::decision::Outcome::Forward { why, .. }) => why,
            _ => "default",
        };
        Added::new(pod, rule.name.as_str(), ctx.request_id.as_str(), why)
    }

    /// The next address of the decided Pod's pool to send the request to: one it
    /// has not tried ([`crate::upstreams::Upstreams::select`]; kas: the one the
    /// agent's token hashes to, so every stream of one agentk reaches the same
    /// kas), once it has a slot under `upstreams.max_connections_per_address`
    /// (a retry's address takes its own slot; the failed one's is given back).
    /// Recorded in `ctx.tried`. `Err`: no decision, no address left to try, or no
    /// slot within the queue timeout.
    pub(crate) async fn next_address(&self, ctx: &mut Ctx) -> Result<SocketAddr> {
        let (Some(pod), Some(rule)) = (ctx.forwarded().map(|p| p.id), self.rule_of(ctx)) else {
            return Err(Error::new_str("no routing decision"));
        };
        let pool = rule.pool;
        let key = match (&ctx.token, pool) {
            (Some(t), Pool::Kas) => t.token.as_bytes(),
            _ => ctx.request_id.as_bytes(),
        };
        let Some(addr) = self.upstreams.select(pod, pool, key, &ctx.tried) else {
            return Err(Error::explain(
                ErrorType::ConnectNoRoute,
                "no address of the Pod left to try",
            )
            .into_up());
        };
        ctx.tried.push(addr);
        ctx.slot = None;
        ctx.slot = self.upstreams.admit(pod, pool, addr).await?;
        Ok(addr)
    }

    /// A connection attempt for the request failed: count it, and say whether
    /// another address of the same Pod (never another Pod's) is left to try.
    pub(crate) fn connect_failed(&self, ctx: &Ctx) -> bool {
        let (Some(pod), Some(rule)) = (ctx.forwarded(), self.rule_of(ctx)) else {
            return false;
        };
        let mut id = itoa::Buffer::new();
        METRICS
            .connect_failures
            .with_label_values(&[id.format(pod.id.get())])
            .inc();
        self.upstreams.untried_left(pod.id, rule.pool, &ctx.tried)
    }
}

//! A rule as `proxy.toml` writes it: one flat table per rule, checked into a typed
//! [`Rule`] by [`RuleSpec::build`], every problem naming its field.

use podgate_tokens::PodId;
use regex::Regex;
use serde::{Deserialize, Serialize};

use super::{Action, ActionKind, ByToken, PathMatch, Pool, Rule};
use crate::sources::TokenSource;

/// One `[[rules]]` table of `proxy.toml`. The fields after `action` belong to one
/// action each; [`RuleSpec::build`] refuses a field the action does not take.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// [`Rule::name`].
    pub name: String,
    /// [`Rule::methods`].
    #[serde(default)]
    pub methods: Vec<String>,
    /// [`Rule::path`].
    pub path: PathMatch,
    /// [`Rule::header`].
    #[serde(default)]
    pub header: Option<String>,
    /// [`Rule::cookie`].
    #[serde(default)]
    pub cookie: Option<String>,
    /// [`Rule::host_suffix`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_suffix: Option<String>,
    /// [`Rule::authorization`].
    #[serde(
        default,
        with = "serde_regex_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub authorization: Option<Regex>,
    /// What to do.
    pub action: ActionKind,
    /// `route-by-token`: [`ByToken::kas_cookie`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kas_cookie: bool,
    /// `route-by-token`: [`ByToken::sources`].
    #[serde(default)]
    pub sources: Vec<TokenSource>,
    /// `route-by-token`: [`ByToken::requires_token`].
    #[serde(default)]
    pub requires_token: bool,
    /// `route-by-token`: [`ByToken::max_body_bytes`].
    #[serde(default)]
    pub max_body_bytes: Option<usize>,
    /// `route-by-token`: [`ByToken::edge_hold`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub edge_hold: bool,
    /// `route-by-token`: [`ByToken::fast_path`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fast_path: bool,
    /// `route-to-pod`: the Pod.
    #[serde(default)]
    pub pod: Option<PodId>,
    /// [`Rule::pool`].
    #[serde(default)]
    pub pool: Pool,
    /// [`Rule::read_timeout_secs`].
    #[serde(default = "default_timeout")]
    pub read_timeout_secs: u64,
}

fn default_timeout() -> u64 {
    60
}

impl RuleSpec {
    /// The rule this table describes, or every problem with it, each naming its
    /// field (`rules[3].pod`); `at` is the table's place (`rules[3]`).
    pub fn build(&self, at: &str) -> Result<Rule, Vec<String>> {
        let mut bad = Vec::new();
        let by_token = self.action == ActionKind::RouteByToken;
        let only_by_token = [
            ("kas_cookie", self.kas_cookie),
            ("sources", !self.sources.is_empty()),
            ("requires_token", self.requires_token),
            ("max_body_bytes", self.max_body_bytes.is_some()),
            ("edge_hold", self.edge_hold),
            ("fast_path", self.fast_path),
        ];
        if !by_token {
            for (field, _) in only_by_token.iter().filter(|(_, set)| *set) {
                bad.push(format!(
                    "{at}.{field}: only a route-by-token rule takes it (this one is {})",
                    kind_name(self.action)
                ));
            }
        }
        if self.pod.is_some() && self.action != ActionKind::RouteToPod {
            bad.push(format!(
                "{at}.pod: only a route-to-pod rule takes it (this one is {})",
                kind_name(self.action)
            ));
        }
        let action = match self.action {
            ActionKind::RouteByToken => Action::RouteByToken(ByToken {
                sources: self.sources.clone(),
                requires_token: self.requires_token,
                max_body_bytes: self.max_body_bytes,
                kas_cookie: self.kas_cookie,
                edge_hold: self.edge_hold,
                fast_path: self.fast_path,
            }),
            ActionKind::RouteToPod => match self.pod {
                Some(pod) => Action::RouteToPod(pod),
                None => {
                    bad.push(format!("{at}.pod: route-to-pod needs a Pod id"));
                    Action::Default
                }
            },
            ActionKind::SessionPrefix => Action::SessionPrefix,
            ActionKind::Default => Action::Default,
        };
        let rule = Rule {
            name: self.name.clone(),
            methods: self.methods.clone(),
            path: self.path.clone(),
            header: self.header.clone(),
            cookie: self.cookie.clone(),
            host_suffix: self.host_suffix.clone(),
            authorization: self.authorization.clone(),
            action,
            pool: self.pool,
            read_timeout_secs: self.read_timeout_secs,
        };
        bad.extend(rule.problems(at));
        if bad.is_empty() { Ok(rule) } else { Err(bad) }
    }
}

fn kind_name(kind: ActionKind) -> &'static str {
    match kind {
        ActionKind::RouteByToken => "route-by-token",
        ActionKind::RouteToPod => "route-to-pod",
        ActionKind::SessionPrefix => "session-prefix",
        ActionKind::Default => "default",
    }
}

mod serde_regex_opt {
    use regex::Regex;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(r: &Option<Regex>, s: S) -> Result<S::Ok, S::Error> {
        match r {
            Some(r) => s.serialize_some(r.as_str()),
            None => s.serialize_none(),
        }
    }
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Regex>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| Regex::new(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

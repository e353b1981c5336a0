//! Agent tokens (what kas passes on in `Authorization: Bearer`): opaque tokens
//! registered for an agent, and JWT agent tokens the Pod's keys verify.

use podgate_tokens::{Classification, Classifier, KeySet, PodId, TokenFormat, TokenKind};

use super::KubeAccess;

/// Whose an agent token is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentTokenOwner {
    /// One of this Pod's agents.
    Agent(i64),
    /// A token routed to another Pod.
    Misrouted(PodId),
    /// Nobody's here.
    Unknown,
}

impl KubeAccess {
    /// Verify JWT agent tokens with `keys`.
    pub fn with_keys(mut self, keys: KeySet) -> KubeAccess {
        self.classifier = Classifier::with_keys(keys);
        self
    }

    /// Register the opaque agent token `token` for agent `agent_id` (which must be
    /// registered).
    pub fn add_agent_token(&self, token: String, agent_id: i64) -> Result<(), String> {
        let mut inner = self.lock();
        if !inner.agents.contains_key(&agent_id) {
            return Err(format!("agent {agent_id}: no such agent"));
        }
        if token.is_empty() {
            return Err("token: must not be empty".into());
        }
        inner.agent_tokens.insert(token, agent_id);
        Ok(())
    }

    /// The agent `token` authenticates: a registered opaque token, or a JWT agent
    /// token the Pod's keys verify, routed here, naming a registered agent.
    pub fn agent_for_token(&self, token: &str) -> AgentTokenOwner {
        let inner = self.lock();
        if let Some(id) = inner.agent_tokens.get(token) {
            return AgentTokenOwner::Agent(*id);
        }
        match self.classifier.classify(token) {
            Classification::Routable(id) if id.pod != self.pod => {
                AgentTokenOwner::Misrouted(id.pod)
            }
            Classification::Routable(id)
                if id.kind == TokenKind::Agent && id.format == TokenFormat::Jwt =>
            {
                match id.agent.and_then(|a| i64::try_from(a).ok()) {
                    Some(a) if inner.agents.contains_key(&a) => AgentTokenOwner::Agent(a),
                    _ => AgentTokenOwner::Unknown,
                }
            }
            _ => AgentTokenOwner::Unknown,
        }
    }
}

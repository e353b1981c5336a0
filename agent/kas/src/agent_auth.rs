//! Who an agentk is, from its token. Signed (JWT) routable agent tokens carry the
//! agent and project ids and are verified here, locally. Any other well-formed token
//! (an opaque `glagent-` token) is asked of GitLab's internal `agent_info` endpoint
//! when one is configured, as GitLab's kas does, and the answer is cached: a yes for
//! 5 minutes, a no for 1 minute, both configurable. GitLab being unreachable is not a
//! no: that caller gets `Unavailable` and nothing is cached.
//!
//! The cache is bounded ([`CACHE_CAP`] tokens, the least useful evicted first, never
//! cleared outright) and single-flight: callers that present the same uncached token
//! at once wait for the one lookup in flight (counted as `joined`) instead of each
//! asking GitLab (`crate::answer_cache`, shared with the Kubernetes API proxy).
//!
//! Every refusal is the same `Unauthenticated("unauthenticated")`: nothing tells a
//! caller which check failed. Tokens are never logged or kept: the cache is keyed by
//! a SHA-256 of the token.

use std::sync::Arc;
use std::time::Duration;

use podgate_tokens::{Classification, Classifier, TokenFormat, TokenKind};

use crate::answer_cache::{Answer, AnswerCache, Source};
use podgate_agent::auth::Refusal;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use tonic::Status;

/// Who an agent token says the caller is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentIdentity {
    /// Agent id.
    pub agent_id: i64,
    /// Configuration project.
    pub project_id: i64,
    /// The configuration project's full path, as GitLab's `agent_info` names it
    /// (`gitaly_repository.gl_project_path`); empty for podgate's JWT agent tokens,
    /// which carry no path.
    pub project_path: Arc<str>,
}

/// GitLab's `agent_info` endpoint, for opaque agent tokens.
#[derive(Clone, Debug)]
pub struct AgentInfoConfig {
    /// GitLab's base URL (`http://host:port`); kas calls
    /// `{url}/api/v4/internal/kubernetes/agent_info`.
    pub url: String,
    /// The GitLab ↔ kas shared secret: signs the `Gitlab-Kas-Api-Request` JWT.
    pub secret: Vec<u8>,
    /// How long a yes is cached (5 min).
    pub positive_ttl: Duration,
    /// How long a no is cached (1 min).
    pub negative_ttl: Duration,
    /// How long one lookup may take.
    pub timeout: Duration,
}

/// Cache entries kept at most.
pub const CACHE_CAP: usize = crate::answer_cache::CAP;

struct AgentInfo {
    config: AgentInfoConfig,
    client: super::gitlab::GitlabClient,
    /// By SHA-256 of the token.
    cache: AnswerCache<AgentIdentity>,
    lookups: prometheus::IntCounterVec,
}

/// What kas reads of GitLab's `agent_info` answer (`lib/api/internal/kubernetes.rb`
/// in gitlabhq/gitlabhq; `gitaly_repository` is the project's Gitaly repository,
/// whose `gl_project_path` is the project's full path).
#[derive(Deserialize)]
struct AgentInfoResponse {
    agent_id: i64,
    project_id: i64,
    #[serde(default)]
    gitaly_repository: GitalyRepository,
}

#[derive(Default, Deserialize)]
struct GitalyRepository {
    #[serde(default)]
    gl_project_path: String,
}

/// Agent authentication: local JWT verification, and the optional `agent_info`
/// backend.
pub struct AgentAuth {
    classifier: Arc<Classifier>,
    backend: Option<AgentInfo>,
    /// Where refusals are counted and logged (kas's metrics), if anywhere.
    metrics: Option<Arc<super::metrics::KasMetrics>>,
}

fn denied() -> Status {
    Status::unauthenticated("unauthenticated")
}

impl AgentAuth {
    /// Verify JWT agent tokens with `classifier`'s keys; ask `agent_info` (if any)
    /// about other tokens. `registry` gets the backend's lookup counter.
    pub fn new(
        classifier: Arc<Classifier>,
        agent_info: Option<AgentInfoConfig>,
        registry: &prometheus::Registry,
    ) -> AgentAuth {
        let backend = agent_info.map(|config| {
            let lookups = prometheus::IntCounterVec::new(
                prometheus::Opts::new(
                    "podgate_kas_agent_info_lookups_total",
                    "Opaque agent tokens checked, by result (cached_yes, cached_no, joined: waited for the same token's lookup in flight, yes, no, error)",
                ),
                &["result"],
            )
            .expect("valid metric");
            let _ = registry.register(Box::new(lookups.clone()));
            AgentInfo {
                client: super::gitlab::GitlabClient::new(&config.url, config.secret.clone()),
                cache: AnswerCache::new(config.positive_ttl, config.negative_ttl),
                config,
                lookups,
            }
        });
        AgentAuth {
            classifier,
            backend,
            metrics: None,
        }
    }

    /// Count and log refusals (listener `agent`) in `metrics`.
    pub fn counted_in(mut self, metrics: Arc<super::metrics::KasMetrics>) -> AgentAuth {
        self.metrics = Some(metrics);
        self
    }

    /// Who the bearer token in `metadata` belongs to.
    pub async fn authenticate(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<AgentIdentity, Status> {
        let result = self.identify(metadata).await;
        if let (Err(e), Some(m)) = (&result, &self.metrics)
            && e.code() == tonic::Code::Unauthenticated
        {
            let reason = match podgate_agent::auth::bearer(metadata) {
                None => Refusal::Missing,
                Some(t) => match self.classifier.classify(t) {
                    Classification::Invalid { .. } => Refusal::Signature,
                    _ => Refusal::Unknown,
                },
            };
            m.auth_failure("agent", reason, metadata);
        }
        result
    }

    async fn identify(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<AgentIdentity, Status> {
        let token = podgate_agent::auth::bearer(metadata).ok_or_else(denied)?;
        match self.classifier.classify(token) {
            Classification::Routable(id)
                if id.kind == TokenKind::Agent && id.format == TokenFormat::Jwt =>
            {
                let agent_id = id
                    .agent
                    .and_then(|a| i64::try_from(a).ok())
                    .ok_or_else(denied)?;
                let project_id = id
                    .project
                    .and_then(|p| i64::try_from(p).ok())
                    .ok_or_else(denied)?;
                Ok(AgentIdentity {
                    agent_id,
                    project_id,
                    project_path: "".into(),
                })
            }
            // Forged or malformed: never worth asking GitLab.
            Classification::Invalid { .. } => Err(denied()),
            _ => match &self.backend {
                Some(b) => b.lookup(token).await,
                None => Err(denied()),
            },
        }
    }
}

impl AgentInfo {
    fn count(&self, result: &str) {
        self.lookups.with_label_values(&[result]).inc();
    }

    async fn lookup(&self, token: &str) -> Result<AgentIdentity, Status> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        // `Err(None)`: timed out.
        let fetch = || async {
            match tokio::time::timeout(self.config.timeout, self.ask(token)).await {
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(why)) => Err(Some(why)),
                Err(_) => Err(None),
            }
        };
        match self.cache.get(key, fetch).await {
            Ok((answer, source)) => {
                self.count(match (source, answer.is_ok()) {
                    (Source::Cached, true) => "cached_yes",
                    (Source::Cached, false) => "cached_no",
                    (Source::Joined, _) => "joined",
                    (Source::Fetched, true) => "yes",
                    (Source::Fetched, false) => "no",
                });
                answer.map_err(|_| denied())
            }
            // GitLab did not say: nothing is cached, and one of the callers waiting
            // for this lookup (if any) asks again.
            Err(why) => {
                self.count("error");
                match why {
                    Some(why) => tracing::warn!(
                        token = %podgate_tokens::fingerprint(token),
                        error = %why,
                        "agent_info lookup failed"
                    ),
                    None => tracing::warn!(
                        token = %podgate_tokens::fingerprint(token),
                        "agent_info lookup timed out"
                    ),
                }
                Err(Status::unavailable("agent authentication unavailable"))
            }
        }
    }

    /// `Ok(Ok)` yes, `Ok(Err(status))` no (401, 403, 404), `Err` when GitLab did not
    /// say.
    async fn ask(&self, token: &str) -> Result<Answer<AgentIdentity>, String> {
        let authorization = format!("Bearer {token}");
        let answer = self
            .client
            .request(
                http::Method::GET,
                "/api/v4/internal/kubernetes/agent_info",
                &[(http::header::AUTHORIZATION.as_str(), &authorization)],
                None,
                true,
            )
            .await
            .map_err(|e| e.to_string())?;
        let (status, body) = (answer.status, answer.body);
        if let s @ (401 | 403 | 404) = status.as_u16() {
            return Ok(Err(s));
        }
        if !status.is_success() {
            return Err(format!("GitLab answered {status}"));
        }
        let info: AgentInfoResponse =
            serde_json::from_slice(&body).map_err(|e| format!("agent_info body: {e}"))?;
        Ok(Ok(AgentIdentity {
            agent_id: info.agent_id,
            project_id: info.project_id,
            project_path: info.gitaly_repository.gl_project_path.into(),
        }))
    }
}

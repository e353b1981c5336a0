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
//! asking GitLab.
//!
//! Every refusal is the same `Unauthenticated("unauthenticated")`: nothing tells a
//! caller which check failed. Tokens are never logged or kept: the cache is keyed by
//! a SHA-256 of the token.

use std::sync::Arc;
use std::time::{Duration, Instant};

use podgate_tokens::{Classification, Classifier, TokenFormat, TokenKind};

use podgate_agent::auth::Refusal;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use tonic::Status;

/// Who an agent token says the caller is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentIdentity {
    /// Agent id.
    pub agent_id: i64,
    /// Configuration project.
    pub project_id: i64,
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

/// SHA-256 of a token → until when, and the answer (`None`: refused).
type Cache = quick_cache::sync::Cache<[u8; 32], (Instant, Option<AgentIdentity>)>;

/// Cache entries kept at most.
pub const CACHE_CAP: usize = 100_000;

struct AgentInfo {
    config: AgentInfoConfig,
    client: super::gitlab::GitlabClient,
    cache: Cache,
    lookups: prometheus::IntCounterVec,
}

#[derive(Deserialize)]
struct AgentInfoResponse {
    agent_id: i64,
    project_id: i64,
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
                config,
                cache: Cache::new(CACHE_CAP),
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
    fn ttl(&self, answer: &Option<AgentIdentity>) -> Duration {
        if answer.is_some() {
            self.config.positive_ttl
        } else {
            self.config.negative_ttl
        }
    }

    fn count(&self, result: &str) {
        self.lookups.with_label_values(&[result]).inc();
    }

    async fn lookup(&self, token: &str) -> Result<AgentIdentity, Status> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        loop {
            if let Some((until, answer)) = self.cache.get(&key) {
                if Instant::now() < until {
                    self.count(if answer.is_some() {
                        "cached_yes"
                    } else {
                        "cached_no"
                    });
                    return answer.ok_or_else(denied);
                }
                self.cache.remove(&key);
            }
            // Not cached: one caller looks it up, the others wait for its answer.
            let guard = match self.cache.get_value_or_guard_async(&key).await {
                Ok((until, answer)) if Instant::now() < until => {
                    self.count("joined");
                    return answer.ok_or_else(denied);
                }
                Ok(_) => {
                    // Expired: forget it and take the guard on the next turn.
                    self.cache.remove(&key);
                    continue;
                }
                Err(guard) => guard,
            };
            return match tokio::time::timeout(self.config.timeout, self.ask(token)).await {
                Ok(Ok(answer)) => {
                    let _ = guard.insert((Instant::now() + self.ttl(&answer), answer));
                    self.count(if answer.is_some() { "yes" } else { "no" });
                    answer.ok_or_else(denied)
                }
                // GitLab did not say: nothing is cached. The guard goes, and one of
                // the callers waiting on it (if any) asks again.
                Ok(Err(why)) => {
                    self.count("error");
                    tracing::warn!(
                        token = %podgate_tokens::fingerprint(token),
                        error = %why,
                        "agent_info lookup failed"
                    );
                    Err(Status::unavailable("agent authentication unavailable"))
                }
                Err(_) => {
                    self.count("error");
                    tracing::warn!(
                        token = %podgate_tokens::fingerprint(token),
                        "agent_info lookup timed out"
                    );
                    Err(Status::unavailable("agent authentication unavailable"))
                }
            };
        }
    }

    /// `Ok(Some)` yes, `Ok(None)` no (401, 403, 404), `Err` when GitLab did not say.
    async fn ask(&self, token: &str) -> Result<Option<AgentIdentity>, String> {
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
        if matches!(status.as_u16(), 401 | 403 | 404) {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(format!("GitLab answered {status}"));
        }
        let info: AgentInfoResponse =
            serde_json::from_slice(&body).map_err(|e| format!("agent_info body: {e}"))?;
        Ok(Some(AgentIdentity {
            agent_id: info.agent_id,
            project_id: info.project_id,
        }))
    }
}

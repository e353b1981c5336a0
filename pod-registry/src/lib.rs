//! # podgate-registry
//!
//! The topology of Pods and the presence of kas instances and agents, in one API
//! over two backends: in memory (one process, nothing to install) and Redis
//! (standalone, or a Cluster when one server is not enough).
//!
//! ## Where to start reading
//!
//! - [`Registry`] (in [`registry`]): the handle. Topology snapshots
//!   ([`Registry::topology`], a lock-free load), changes and a watch; agent and kas
//!   registration, lookups, refresh, GC, shutdown cleanup; presence events and
//!   [`Registry::wait_for_agent`].
//! - [`topology`]: [`Pod`], [`PodState`], the immutable [`Topology`] snapshot and
//!   the static [`TopologyFile`] (TOML).
//! - [`presence`]: [`AgentConnection`], [`KasInstance`], [`AgentEvent`].
//! - `backend/`: the storage trait the registry calls, and its two implementations:
//!   `memory.rs`, and `redis/` with a file per concern (connection, key schema, Lua
//!   scripts, topology compare-and-set, presence writes and reads, the refresh by
//!   slot, kas instances, GC, the pub/sub subscriber).
//! - [`runner_queue`]: GitLab's runner queue keys (`runner:build_queue:<token>` in a
//!   Pod's Redis), watched as Workhorse watches them, and long polls held on them:
//!   the proxy's edge polls and kas's Job Router share one [`runner_queue::QueueWatch`].
//! - `testing` (feature `test-util`): a real `redis-server` and a 3-master Redis
//!   Cluster on ephemeral ports, for tests.
//!
//! ## Redis keys
//!
//! Human-readable, so an operator can look with `redis-cli`. `P` is the configured
//! prefix (default `podgate`). Values are JSON. Every presence entry has its own
//! expiry (`expires_at_ms` in its JSON, or for a connection its `exp:` field), and
//! readers skip expired ones, so an entry of a kas that died disappears at once even
//! while others keep the key alive. Each key also has a TTL so a key no one
//! refreshes vanishes whole. A refresh rewrites only expiries; `HSET` reports the
//! fields it had to create, and an agent hash that lost its data (restart, eviction,
//! `FLUSHALL`) gets its connection JSON back in the same refresh.
//!
//! | key | type | field → value |
//! |---|---|---|
//! | `P:{topology}` | hash | `pod:<id>` → Pod JSON, `default` → Pod id, `version` → n |
//! | `P:{p:<project>}:project` | hash | `<agent>:<connection>` → `{"expires_at_ms": …}` (membership) |
//! | `P:{p:<project>}:agent:<agent>` | hash | `conn:<connection>` → connection JSON; `exp:<connection>` → its expiry (Unix ms); `kas:<kas address>` → `{"expires_at_ms": …}` |
//! | `P:{a:<agent mod 1024>}:agents` | hash | `<agent>` → `{"expires_at_ms": …, "project": <id>}` (finds the keys above) |
//! | `P:{kas}:instances` | hash | `<kas address>` → kas instance JSON |
//! | `P:events:agents` | channel | `{"type": "connected" \| "disconnected", …}` |
//! | `P:events:topology` | channel | the new topology version |
//! | `kas_events` (no prefix, GitLab's name) | channel | a kas event for every kas: a protobuf `google.protobuf.Any` (GitLab's `gitlab.agent.event.GitPushEvent`) |
//!
//! ```text
//! redis-cli HGETALL 'podgate:{p:42}:agent:7'
//! redis-cli HGET 'podgate:{a:7}:agents' 7
//! redis-cli SUBSCRIBE podgate:events:agents
//! ```
//!
//! An agent belongs to one configuration project, so every key a registration
//! touches carries the hash tag `{p:<project>}`: the by-project index and the agent
//! hash (connections by agent, and the agent→kas index) are written in one
//! `MULTI`/`EXEC` with one expiry, in one Cluster slot, while different projects
//! spread over the Cluster. Lookups by agent read the agent's pointer (in one of
//! 1,024 bucket hashes, so a refresh rewrites all pointers with about 2,000
//! commands) and then the agent hash: two round trips. A refresh of 100,000
//! connections sends about 222,000 small commands, one `HSET` + `PEXPIRE` per key.
//! No request path uses `KEYS` or `SCAN`; refresh and GC touch only the keys this
//! process writes, so their cost grows with what it owns, not with the keyspace.
//!
//! ## Failure behaviour
//!
//! Redis down: calls return [`Error::Backend`] (transient); the registry logs once
//! when the backend goes away and once when it returns, counts every failure in
//! `podgate_registry_backend_errors_total{op}` (each registry has its own metrics,
//! which its process serves through [`Registry::register_metrics`]), keeps the last good topology, and
//! reconnects with back-off. Redis restarted empty: the pub/sub subscription
//! reconnects, which triggers an immediate refresh of everything owned; the
//! periodic refresh does the same at the latest one `refresh_interval` later.

pub mod backend;
pub mod error;
pub mod metrics;
pub mod presence;
pub mod registry;
pub mod runner_queue;
pub mod topology;

#[cfg(feature = "test-util")]
pub mod testing;

pub use backend::TopologyChange;
pub use backend::memory::MemoryBackend;
pub use backend::redis::{RedisConn, RedisTarget};
pub use error::{Error, Result};
pub use metrics::RegistryMetrics;
pub use presence::{AgentConnection, AgentEvent, KasAddress, KasInstance, KubernetesVersion};
pub use registry::{BackendConfig, Registry, RegistryConfig};
pub use topology::{Pod, PodState, Topology, TopologyFile};

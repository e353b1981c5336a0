//! # podgate-registry
//!
//! The topology of Pods (ids, upstream addresses, state, the default "legacy" Pod)
//! and the presence of kas instances and connected agents, in memory or in Redis.
//!
//! Not built yet: issue 3 fills this crate. The proxy reads topology snapshots from
//! here and the kas registers agent connections here.

//! # podgate-agent
//!
//! kas and agentk: reverse tunnels from agents, the presence registry, kas-to-kas
//! routing, the `KasApi`, the Graph API and the Workspaces reconciliation loop.
//!
//! Not built yet: issue 6 fills this crate.

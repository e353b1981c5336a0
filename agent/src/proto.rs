//! Generated from `agent/proto/kas.proto`: messages and the `KasApi` / `KasInternal`
//! clients and servers.
#![allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]

tonic::include_proto!("podgate.kas.v1");

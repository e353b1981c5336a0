//! The Graph API's messages (`podgate_agent::graph::wire`). The first input byte
//! picks the parser:
//!
//! - even: a `WatchGraphResponse` batch from agentk (protobuf, over the tunnel),
//!   decoded and encoded as the text message kas sends (`encode_response`): the
//!   message is JSON that a client decodes (`wire::Message`) to the same JSON;
//! - odd: a server message as the client (`podgate graph`) decodes it: what decodes
//!   encodes to JSON that decodes to the same message.
//!
//! Nothing panics.

use crate::json_eq;
use podgate_agent::graph::wire::{Message, encode_response};
use podgate_agent::proto::kubernetes_api::WatchGraphResponse;
use prost::Message as _;
use serde_json::Value;

/// Checks one input (module docs); panics on a violated property.
pub fn run(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    if which % 2 == 0 {
        let Ok(batch) = WatchGraphResponse::decode(rest) else {
            return;
        };
        let Ok(text) = encode_response(&batch) else {
            return;
        };
        let sent: Value = serde_json::from_str(&text).expect("kas sends JSON");
        let msg: Message = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let again = serde_json::to_value(&msg).expect("a message serialises");
        assert!(json_eq(&sent, &again), "{text}");
    } else {
        let Ok(msg) = serde_json::from_slice::<Message>(rest) else {
            return;
        };
        let text = serde_json::to_string(&msg).expect("a message serialises");
        let back: Message = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let (a, b) = (
            serde_json::to_value(&msg).expect("serialises"),
            serde_json::to_value(&back).expect("serialises"),
        );
        assert!(json_eq(&a, &b), "{text}");
    }
}

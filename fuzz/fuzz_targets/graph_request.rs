//! The Graph API request (`podgate_agent::graph::request::{parse, compile}`: JSON
//! shape, CEL expressions, label/field selectors, JSONPath templates), the first
//! message a client sends on `/graph`.
//!
//! - nothing panics (and no stack overflows: CEL and JSONPath parsers recurse);
//! - a request that parses serialises and parses back to itself, and compiles (or
//!   not) the same from either;
//! - a refusal names at least one field, and its close reason fits a close frame.

use podgate_agent::graph::request;
use podgate_agent::graph::wire::{MAX_CLOSE_REASON, truncate_close_reason};

/// Checks one input (module docs); panics on a violated property.
pub fn run(data: &[u8]) {
    let Ok(json) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = request::parse(json);
    let compiled = request::compile(json);
    match (&parsed, &compiled) {
        (Err(_), Ok(_)) => panic!("compiles but does not parse"),
        (Ok(req), _) => {
            let text = serde_json::to_string(req).expect("a request serialises");
            let again = request::parse(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(&again, req, "{text}");
            assert_eq!(request::compile_request(req).is_ok(), compiled.is_ok());
        }
        (Err(_), Err(_)) => {}
    }
    if let Err(e) = compiled {
        assert!(!e.errors().is_empty());
        let reason = format!("Invalid request: {e}");
        let cut = truncate_close_reason(&reason);
        assert!(cut.len() <= MAX_CLOSE_REASON && reason.starts_with(cut));
    }
}

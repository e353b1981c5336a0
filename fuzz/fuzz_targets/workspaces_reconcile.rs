//! The Workspaces reconcile exchange (`POST …/modules/remote_development/reconcile`,
//! `podgate_agentk::remote_development::body`). The first input byte picks:
//!
//! - even: the request body (`ReconcileRequest`, what the reconcile endpoint reads):
//!   what decodes is written as Go's `json.Marshal` would (`to_json`: no raw `<`,
//!   `>`, `&`), and reads back to the same JSON;
//! - odd: GitLab's answer as agentk decodes it (`ReconcileResponse::from_json`,
//!   lenient as Go): what decodes encodes and decodes to itself.
//!
//! Nothing panics.

use crate::json_eq;
use podgate_agentk::remote_development::body::{ReconcileRequest, ReconcileResponse};
use serde_json::Value;

/// Checks one input (module docs); panics on a violated property.
pub fn run(data: &[u8]) {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    if which % 2 == 0 {
        let Ok(req) = serde_json::from_slice::<ReconcileRequest>(body) else {
            return;
        };
        let out = req.to_json();
        assert!(!out.iter().any(|b| b"<>&".contains(b)));
        let back: ReconcileRequest = serde_json::from_slice(&out)
            .unwrap_or_else(|e| panic!("{}: {e}", String::from_utf8_lossy(&out)));
        let (a, b): (Value, Value) = (
            serde_json::from_slice(&out).expect("JSON"),
            serde_json::from_slice(&back.to_json()).expect("JSON"),
        );
        assert!(json_eq(&a, &b), "{}", String::from_utf8_lossy(&out));
    } else {
        let Ok(resp) = ReconcileResponse::from_json(body) else {
            return;
        };
        let out = serde_json::to_vec(&resp).expect("an answer serialises");
        let back = ReconcileResponse::from_json(&out).expect("an answer reads back");
        assert_eq!(back, resp);
    }
}

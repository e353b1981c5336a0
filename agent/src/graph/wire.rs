//! What the `/graph` WebSocket carries from server to client (GitLab's Graph API
//! design, "Response to client"): the JSON message types, used both to write messages
//! (kas) and to read them (the CLI client, tests), and [`encode_response`], which
//! turns one `WatchGraphResponse` batch from agentk into one text message.
//!
//! Omissions, as GitLab's design document specifies them (docs/graph-api.md §8): `actions`, `warnings`, `error` when empty;
//! a vertex's `ns` when empty (cluster-scoped); `o` and `j` when not set (never both);
//! an arc's `a` when it has no attribute set, and each of `c`, `b`, `e` unless true;
//! a warning's `a` when empty. The core group is sent as `"g":""`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::proto::kubernetes_api::{self as pb, action::Action as PbAction};

/// One server → client text message.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct Message {
    /// Graph changes, to apply in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<Action>,
    /// Non-terminal problems.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<Warning>,
    /// The terminal error, sent before a close frame whose reason had to be truncated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
}

/// One graph action: `{"svx":…}`, `{"dvx":…}`, `{"sarc":…}` or `{"darc":…}`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Set (add or update) a vertex.
    Svx {
        /// The vertex.
        vx: Vertex,
        /// The whole object, when the query had no `json_path` (copied raw).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        o: Option<RawJson>,
        /// The JSONPath results, when the query had a `json_path`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        j: Option<Vec<Value>>,
    },
    /// Delete a vertex.
    Dvx {
        /// The vertex.
        vx: Vertex,
    },
    /// Set (add or update) an arc.
    Sarc {
        /// Source: the referring object.
        s: Vertex,
        /// Destination: the referred object.
        d: Vertex,
        /// Arc type: `or`, `r`, `t`.
        t: String,
        /// Attributes; omitted when none is set.
        #[serde(default, skip_serializing_if = "attrs_empty")]
        a: Option<ArcAttrs>,
    },
    /// Delete an arc.
    Darc {
        /// Source.
        s: Vertex,
        /// Destination.
        d: Vertex,
        /// Arc type.
        t: String,
    },
}

/// A vertex: one object.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Vertex {
    /// Group, `""` for core.
    #[serde(default)]
    pub g: String,
    /// Version.
    pub v: String,
    /// Resource (plural).
    pub r: String,
    /// Namespace; omitted when empty (cluster-scoped).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ns: String,
    /// Name.
    pub n: String,
}

/// Arc attributes; each sent only when true.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArcAttrs {
    /// Owner reference with `controller: true`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub c: bool,
    /// Owner reference with `blockOwnerDeletion: true`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub b: bool,
    /// The destination does not exist, or is not known to exist yet.
    #[serde(default, skip_serializing_if = "is_false")]
    pub e: bool,
}

impl ArcAttrs {
    /// Whether no attribute is set (then `a` is omitted).
    pub fn is_empty(&self) -> bool {
        !(self.c || self.b || self.e)
    }
}

/// A warning.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct Warning {
    /// Type, e.g. `INFORMER_SYNC_FAILED`.
    pub t: String,
    /// Message for a human.
    pub m: String,
    /// Type-specific attributes; omitted when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub a: BTreeMap<String, String>,
}

/// The terminal error (`error`).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorInfo {
    /// WebSocket close code (RFC 6455 §7.4.1).
    pub code: u16,
    /// The code's name as coder/websocket spells it, e.g. `StatusInvalidFramePayloadData`.
    pub code_string: String,
    /// The full reason.
    pub reason: String,
}

impl ErrorInfo {
    /// An error for close `code` with its [`close_code_string`].
    pub fn new(code: u16, reason: impl Into<String>) -> Self {
        ErrorInfo {
            code,
            code_string: close_code_string(code).into_owned(),
            reason: reason.into(),
        }
    }
}

/// A JSON value kept as its text, so an object agentk encoded goes to the client
/// without being parsed into a tree and encoded again. Equality compares the text.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(transparent)]
pub struct RawJson(pub Box<RawValue>);

impl RawJson {
    /// Check that `text` is one JSON value and keep it as is.
    pub fn from_string(text: String) -> Result<Self, serde_json::Error> {
        RawValue::from_string(text).map(RawJson)
    }

    /// Encode `v`.
    pub fn from_value(v: &Value) -> Self {
        RawJson(serde_json::value::to_raw_value(v).expect("a Value always encodes"))
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// Parse the text into a tree.
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.get()).expect("RawJson holds valid JSON")
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn attrs_empty(a: &Option<ArcAttrs>) -> bool {
    a.is_none_or(|a| a.is_empty())
}

/// The name coder/websocket's `StatusCode.String()` gives `code` (docs/graph-api.md §9;
/// the table is coder/websocket's generated `stringer.go`); `"StatusUnknown"` for a
/// code it has no name for (see [`close_code_string`]).
pub fn close_code_name(code: u16) -> &'static str {
    match code {
        1000 => "StatusNormalClosure",
        1001 => "StatusGoingAway",
        1002 => "StatusProtocolError",
        1003 => "StatusUnsupportedData",
        1004 => "statusReserved",
        1005 => "StatusNoStatusRcvd",
        1006 => "StatusAbnormalClosure",
        1007 => "StatusInvalidFramePayloadData",
        1008 => "StatusPolicyViolation",
        1009 => "StatusMessageTooBig",
        1010 => "StatusMandatoryExtension",
        1011 => "StatusInternalError",
        1012 => "StatusServiceRestart",
        1013 => "StatusTryAgainLater",
        1014 => "StatusBadGateway",
        1015 => "StatusTLSHandshake",
        _ => "StatusUnknown",
    }
}

/// Like [`close_code_name`], but a code without a name is spelled as Go's `stringer`
/// does for coder/websocket: `StatusCode(4000)`.
pub fn close_code_string(code: u16) -> Cow<'static, str> {
    match close_code_name(code) {
        "StatusUnknown" => Cow::Owned(format!("StatusCode({code})")),
        name => Cow::Borrowed(name),
    }
}

/// The most bytes a close frame's reason can hold (RFC 6455 §5.5: a control frame
/// carries at most 125 bytes, 2 of which are the code).
pub const MAX_CLOSE_REASON: usize = 123;

/// `reason` cut to at most [`MAX_CLOSE_REASON`] bytes on a character boundary. When
/// it had to be cut, GitLab's design document wants the whole reason sent first as an `error` message
/// ([`ErrorInfo`]).
pub fn truncate_close_reason(reason: &str) -> &str {
    if reason.len() <= MAX_CLOSE_REASON {
        return reason;
    }
    let mut end = MAX_CLOSE_REASON;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

/// One `WatchGraphResponse` batch from agentk as one JSON text message (what kas
/// sends on the WebSocket). `object_json` is copied as is after checking it is JSON;
/// empty bytes mean "not set" for both `object_json` and `json_path_json`. An error
/// names a malformed action (agentk's bug, not the client's).
pub fn encode_response(r: &pb::WatchGraphResponse) -> Result<String, String> {
    let msg = Message {
        actions: r
            .actions
            .iter()
            .enumerate()
            .map(|(i, a)| action_from_proto(a).map_err(|e| format!("actions[{i}]: {e}")))
            .collect::<Result<_, _>>()?,
        warnings: r
            .warnings
            .iter()
            .map(|w| Warning {
                t: w.r#type.clone(),
                m: w.message.clone(),
                a: w.attributes
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            })
            .collect(),
        error: None,
    };
    serde_json::to_string(&msg).map_err(|e| e.to_string())
}

fn vertex(v: Option<&pb::action::Vertex>, what: &str) -> Result<Vertex, String> {
    let v = v.ok_or_else(|| format!("{what} missing"))?;
    Ok(Vertex {
        g: v.group.clone(),
        v: v.version.clone(),
        r: v.resource.clone(),
        ns: v.namespace.clone(),
        n: v.name.clone(),
    })
}

/// One proto action as a wire action.
pub fn action_from_proto(a: &pb::Action) -> Result<Action, String> {
    Ok(match a.action.as_ref().ok_or("no action set")? {
        PbAction::SetVertex(s) => {
            let o = if s.object_json.is_empty() {
                None
            } else {
                let text = String::from_utf8(s.object_json.clone())
                    .map_err(|_| "object_json is not UTF-8".to_owned())?;
                Some(
                    RawJson::from_string(text)
                        .map_err(|e| format!("object_json is not JSON: {e}"))?,
                )
            };
            let j = if s.json_path_json.is_empty() {
                None
            } else {
                Some(
                    serde_json::from_slice::<Vec<Value>>(&s.json_path_json)
                        .map_err(|e| format!("json_path_json is not a JSON array: {e}"))?,
                )
            };
            if o.is_some() && j.is_some() {
                return Err("both object_json and json_path_json set".into());
            }
            Action::Svx {
                vx: vertex(s.vertex.as_ref(), "vertex")?,
                o,
                j,
            }
        }
        PbAction::DeleteVertex(d) => Action::Dvx {
            vx: vertex(d.vertex.as_ref(), "vertex")?,
        },
        PbAction::SetArc(s) => {
            let a = ArcAttrs {
                c: s.controller,
                b: s.block_owner_deletion,
                e: s.destination_does_not_exist,
            };
            Action::Sarc {
                s: vertex(s.source.as_ref(), "source")?,
                d: vertex(s.destination.as_ref(), "destination")?,
                t: s.r#type.clone(),
                a: (!a.is_empty()).then_some(a),
            }
        }
        PbAction::DeleteArc(d) => Action::Darc {
            s: vertex(d.source.as_ref(), "source")?,
            d: vertex(d.destination.as_ref(), "destination")?,
            t: d.r#type.clone(),
        },
    })
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;

//! The client's request (the first WebSocket message; GitLab's Graph API design,
//! "Client request"): its serde model (here), [`compile`], which parses and validates
//! it (`validate`, with every rule it checks), and what it compiles to: CEL programs,
//! selectors and JSONPath templates ready to evaluate (`compiled`).

use serde::{Deserialize, Serialize};

mod compiled;
mod validate;

pub use compiled::{ArcType, Compiled, CompiledNamespaces, CompiledQuery, CompiledRoots};
pub use validate::{FieldError, RequestError, compile, compile_request, parse};

/// The request JSON.
#[derive(Deserialize, Serialize, Default, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GraphRequest {
    /// Which group/version/resources to watch; the first matching query decides.
    #[serde(default)]
    pub queries: Vec<Query>,
    /// Which namespaces to watch; absent: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Namespaces>,
    /// Root selection; absent: every object is visible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roots: Option<Roots>,
}

/// One query: exactly one of `include` and `exclude` is set.
#[derive(Deserialize, Serialize, Default, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Query {
    /// Watch the matching group/version/resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<Include>,
    /// Skip the matching group/version/resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude: Option<Exclude>,
}

/// An `include` query.
#[derive(Deserialize, Serialize, Default, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Include {
    /// CEL over `group`, `version`, `resource`, `namespaced`.
    #[serde(default)]
    pub resource_selector_expression: String,
    /// How to filter the objects and what of them to send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<ObjectFilter>,
}

/// An `exclude` query.
#[derive(Deserialize, Serialize, Default, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Exclude {
    /// CEL over `group`, `version`, `resource`, `namespaced`.
    #[serde(default)]
    pub resource_selector_expression: String,
}

/// `include.object`: per-object filters and the JSONPath of what to send.
#[derive(Deserialize, Serialize, Default, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ObjectFilter {
    /// Label selector, applied by the API server.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub label_selector: String,
    /// Field selector, applied by the API server.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field_selector: String,
    /// CEL over the object's variables, applied by agentk.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub object_selector_expression: String,
    /// kubectl JSONPath template: send `j` (its results) instead of `o`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub json_path: String,
}

/// `namespaces`: a list of names, or all namespaces filtered by selectors; CEL on top
/// of either.
#[derive(Deserialize, Serialize, Default, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Namespaces {
    /// Watch exactly these namespaces ("names" mode).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// Label selector on Namespace objects ("all namespaces" mode only).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub label_selector: String,
    /// Field selector on Namespace objects ("all namespaces" mode only).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field_selector: String,
    /// CEL over the Namespace object's variables.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub object_selector_expression: String,
}

/// `roots`: objects from which visible objects are reachable.
#[derive(Deserialize, Serialize, Default, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Roots {
    /// CEL expressions, OR-ed in order; empty: no root filtering.
    #[serde(default)]
    pub object_selector_expressions: Vec<String>,
    /// Arc types walked in both directions: `or`, `r`, `t`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignore_arc_direction: Vec<String>,
}

#[cfg(test)]
mod tests;

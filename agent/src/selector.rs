//! Kubernetes label and field selectors: parsing the strings `list` and `watch` take
//! in `labelSelector` / `fieldSelector`, and matching objects against them.
//!
//! Used by kube-sim (serving `kubectl get -l … --field-selector …`) and by the Graph
//! API (validating `label_selector` / `field_selector` of a request before they are
//! passed to the API server).
//!
//! The grammar follows kube-apiserver's (`k8s.io/apimachinery/pkg/labels/selector.go`
//! and `pkg/fields/selector.go`):
//!
//! - label selector: comma-separated requirements `k=v`, `k==v`, `k!=v`,
//!   `k in (v1,v2)`, `k notin (v1)`, `k` (exists), `!k` (does not exist), `k>3`,
//!   `k<3`; keys are qualified names (`[prefix/]name`), values label values;
//! - field selector: comma-separated `field=value`, `field==value`, `field!=value`,
//!   with `\,`, `\=` and `\\` escapes in values.
//!
//! Layout: `label` (requirements, the tokenizer and parser, key and value rules),
//! `field` (terms and their escapes).

mod field;
mod label;

pub use field::{FieldRequirement, FieldSelector};
pub use label::{LabelSelector, Requirement, labels_match, parse_selector};

/// Why a selector string was refused. Not retryable: the selector must change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A label selector that does not parse.
    #[error("unable to parse requirement: {0}")]
    Label(String),
    /// A field selector that does not parse.
    #[error("invalid field selector: {0}")]
    Field(String),
}

/// The result type of this module.
pub type Result<T, E = SelectorError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests;

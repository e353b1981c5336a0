//! What a validated request compiles to: the queries' CEL programs and selectors, the
//! namespace selection and the roots, shared by agentk's watcher tasks.

use std::fmt;

use super::super::cel::Expr;
use super::super::jsonpath::JsonPath;

/// A validated request, ready to evaluate. `Send + Sync`: watcher tasks share it
/// through an `Arc`.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The queries, in order.
    pub queries: Vec<CompiledQuery>,
    /// Namespace selection (all namespaces, unfiltered, when the request had none).
    pub namespaces: CompiledNamespaces,
    /// Root selection; `None`: no root filtering (no `roots`, or no expressions).
    pub roots: Option<CompiledRoots>,
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Compiled>();
};

/// A compiled query.
#[derive(Debug, Clone)]
pub enum CompiledQuery {
    /// Watch what `resource` matches.
    Include {
        /// The `resource_selector_expression`.
        resource: Expr,
        /// Label selector for list/watch (validated; `""` for none).
        label_selector: String,
        /// Field selector for list/watch (validated; `""` for none).
        field_selector: String,
        /// The `object_selector_expression`, if any.
        object: Option<Expr>,
        /// The `json_path`, if any: send `j` instead of `o`.
        json_path: Option<JsonPath>,
    },
    /// Skip what `resource` matches.
    Exclude {
        /// The `resource_selector_expression`.
        resource: Expr,
    },
}

impl CompiledQuery {
    /// The resource expression of either kind of query.
    pub fn resource(&self) -> &Expr {
        match self {
            CompiledQuery::Include { resource, .. } | CompiledQuery::Exclude { resource } => {
                resource
            }
        }
    }
}

/// Compiled namespace selection.
#[derive(Debug, Clone, Default)]
pub struct CompiledNamespaces {
    /// "names" mode when not empty.
    pub names: Vec<String>,
    /// Label selector on Namespaces (`""` for none; never with `names`).
    pub label_selector: String,
    /// Field selector on Namespaces (`""` for none; never with `names`).
    pub field_selector: String,
    /// CEL over each Namespace object.
    pub object: Option<Expr>,
}

impl CompiledNamespaces {
    /// Whether every namespace is selected without any filter, so cluster-wide
    /// watches serve (GitLab's design document: "if no filtering is used, agent will
    /// establish cluster-wide watch"; docs/graph-api.md §5).
    pub fn is_unfiltered(&self) -> bool {
        self.names.is_empty()
            && self.label_selector.is_empty()
            && self.field_selector.is_empty()
            && self.object.is_none()
    }
}

/// Compiled root selection.
#[derive(Debug, Clone)]
pub struct CompiledRoots {
    /// The root expressions, in order (at least one).
    pub exprs: Vec<Expr>,
    /// Arc types walked in both directions.
    pub ignore_arc_direction: Vec<ArcType>,
}

/// The type of an arc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ArcType {
    /// `or`: an owner reference.
    OwnerReference,
    /// `r`: a reference the object uses itself.
    Reference,
    /// `t`: a reference the object passes on (e.g. a Deployment's pod template).
    Transitive,
}

impl ArcType {
    /// The wire name: `or`, `r`, `t`.
    pub fn as_str(self) -> &'static str {
        match self {
            ArcType::OwnerReference => "or",
            ArcType::Reference => "r",
            ArcType::Transitive => "t",
        }
    }

    /// The type of a wire name.
    pub fn parse(s: &str) -> Option<ArcType> {
        match s {
            "or" => Some(ArcType::OwnerReference),
            "r" => Some(ArcType::Reference),
            "t" => Some(ArcType::Transitive),
            _ => None,
        }
    }
}

impl fmt::Display for ArcType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

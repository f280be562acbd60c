//! Answers of the workflow commands.

use schemars::JsonSchema;
use serde::Serialize;

use crate::hash::Hash;
use crate::workflow::{Problem, Workflow};

/// `workflow add`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct WorkflowAdded {
    /// Whether the name now points at a different definition.
    pub changed: bool,
    /// The definition's hash.
    pub hash: Hash,
    /// The workflow's name.
    pub name: String,
}

/// One line of `workflow list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct WorkflowEntry {
    /// The definition the name points at.
    pub hash: Hash,
    /// The name.
    pub name: String,
}

/// `workflow show`: the definition and its hash.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct WorkflowDetail {
    /// The definition.
    #[serde(flatten)]
    pub workflow: Workflow,
    /// Its hash.
    pub hash: Hash,
}

/// `workflow validate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct WorkflowValidation {
    /// The workflow's name, when it is valid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Every problem found, with its place in the file.
    pub problems: Vec<Problem>,
    /// No problem found.
    pub valid: bool,
}

//! The validated workflow model, as stored in a `workflow` blob.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Entry pseudo-role.
pub const START: &str = "$START";
/// End target.
pub const END: &str = "$END";
/// Suspend target.
pub const SUSPEND: &str = "$SUSPEND";
/// The status key used when an agent gives no `$status`.
pub const DEFAULT_STATUS: &str = "_";
/// The reference's name for the `$START` entry edge (the same as `_`).
pub const START_NEW: &str = "new";
/// The `$START` edge a resumed completed or failed thread follows.
pub const RESUME: &str = "resume";
/// The reserved template variable holding the previous reply's body.
pub const BODY_VARIABLE: &str = "_body";
/// The reference's format version this crate reads (`version: 1`).
pub const FORMAT_VERSION: u32 = 1;
/// Default loop protection.
pub const DEFAULT_MAX_ROUNDS: u32 = 100;

/// A workflow: roles joined by status edges (SPEC §4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Workflow {
    /// Automatic compaction.
    pub compact: Option<Compact>,
    /// What it is for.
    pub description: Option<String>,
    /// `graph[role][status]` = the edge taken after `role` answers `status`.
    pub graph: BTreeMap<String, BTreeMap<String, Edge>>,
    /// Role steps allowed between two ends.
    pub max_rounds: u32,
    /// The workflow's name (the file stem).
    pub name: String,
    /// The roles.
    pub roles: BTreeMap<String, Role>,
    /// The retry policy of every role that sets none (`retry:` at the
    /// top). Left out of the stored form when absent, so workflows without
    /// it keep their hashes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<super::RetryPolicy>,
}

/// `compact: {every: N, prompt: TEXT}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Compact {
    /// Summarise after every N role steps.
    pub every: u32,
    /// The summarising instruction (a built-in one when absent).
    pub prompt: Option<String>,
}

/// A role: an agent's job, or a child workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct Role {
    /// Tools an agent CLI may use in this role (`allowedTools:`; given to
    /// a `claude:` agent as `--allowedTools` unless its spec sets them).
    /// Left out of the stored form when empty, so workflows without it
    /// keep their hashes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_tools: Vec<String>,
    /// Tools or skills the role may use.
    pub capabilities: Vec<String>,
    /// What the role does.
    pub description: Option<String>,
    /// A fan-out role (`foreach:` or `parallel:`, with `join:`): it runs
    /// many child workflows and joins them (SPEC §13). Left out of the
    /// stored form when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fan_out: Option<FanOut>,
    /// JSON Schema of the agent's frontmatter.
    pub frontmatter: Option<serde_json::Value>,
    /// The role's goal.
    pub goal: Option<String>,
    /// The model an agent CLI should use for this role (`model:`; given
    /// to a `claude:` agent as `--model` unless its spec sets one). Left
    /// out of the stored form when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// What the reply must contain.
    pub output: Option<String>,
    /// How to work.
    pub procedure: Option<String>,
    /// When a failed agent call of this role is made again (`retry:`;
    /// replaces the workflow's). Left out of the stored form when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<super::RetryPolicy>,
    /// For a role that runs a child workflow: its name.
    pub workflow: Option<String>,
}

/// A fan-out role's children and their join (`docs/design.md` §5f).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FanOut {
    /// `foreach:`: one child per item of a list; `None` for `parallel:`.
    pub foreach: Option<Foreach>,
    /// `parallel:`: named branches, in name order (empty for `foreach:`).
    pub branches: Vec<Branch>,
    /// Children driven at once.
    pub max_concurrency: u32,
    /// Failed children the join allows (`u32::MAX`: `on_failure:
    /// continue`).
    pub tolerate: u32,
    /// No new child starts once failures pass `tolerate`.
    pub fail_fast: bool,
}

/// `foreach:`: the list, the child workflow and its task template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Foreach {
    /// A dotted path into the previous reply's frontmatter: the list.
    pub items: String,
    /// The item's name in `prompt`.
    #[serde(rename = "as")]
    pub as_name: String,
    /// The child workflow's name.
    pub workflow: String,
    /// The child's task: a template of the previous frontmatter, the item
    /// (as `as_name`) and `index` (1-based).
    pub prompt: String,
    /// More items than this fail the step.
    pub max_items: u32,
}

/// A `parallel:` branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Branch {
    /// Its name.
    pub key: String,
    /// The child workflow's name.
    pub workflow: String,
    /// The child's task: a template of the previous frontmatter.
    pub prompt: String,
}

impl Role {
    /// Whether the role runs child workflows (`workflow:`, `foreach:`,
    /// `parallel:`) instead of calling an agent: its statuses are `done`
    /// and `failed`.
    pub fn runs_children(&self) -> bool {
        self.workflow.is_some() || self.fan_out.is_some()
    }
}

/// The variables a fan-out role's edge prompts may use (beside `_body`).
pub const JOIN_VARIABLES: [&str; 5] = ["$status", "results", "completed", "failed", "total"];

/// An edge: the next role (or `$END`/`$SUSPEND`) and its prompt template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Edge {
    /// A role, `$END` or `$SUSPEND`.
    pub role: String,
    /// A Mustache template rendered with the step's frontmatter.
    pub prompt: String,
    /// A template rendered like the prompt: the directory the target
    /// role's agent works in, relative to the thread's `cwd` (the
    /// reference's `location`; absent or null: the thread's `cwd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
}

impl Workflow {
    /// The retry policy `role` runs under, before the command line's
    /// override: its own `retry:`, else the workflow's.
    pub fn retry_of(&self, role: &str) -> Option<&super::RetryPolicy> {
        self.roles
            .get(role)
            .and_then(|r| r.retry.as_ref())
            .or(self.retry.as_ref())
    }

    /// The `$START` edge.
    pub fn start_edge(&self) -> Option<&Edge> {
        self.graph.get(START).and_then(|e| e.get(DEFAULT_STATUS))
    }

    /// The `$START.resume` edge, if the workflow has one.
    pub fn resume_edge(&self) -> Option<&Edge> {
        self.graph.get(START).and_then(|e| e.get(RESUME))
    }
}

impl Role {
    /// The `$status` values the role's schema allows: one per `oneOf`
    /// variant `const`, or the `enum`. Empty when the schema has no `$status`.
    pub fn statuses(&self) -> Vec<String> {
        let Some(schema) = &self.frontmatter else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let status_of =
            |s: &serde_json::Value| s.get("properties").and_then(|p| p.get("$status")).cloned();
        let mut add = |st: &serde_json::Value| {
            if let Some(c) = st.get("const").and_then(|c| c.as_str()) {
                out.push(c.to_owned());
            }
            if let Some(e) = st.get("enum").and_then(|e| e.as_array()) {
                out.extend(e.iter().filter_map(|v| v.as_str().map(str::to_owned)));
            }
        };
        if let Some(variants) = schema.get("oneOf").and_then(|v| v.as_array()) {
            for v in variants {
                if let Some(st) = status_of(v) {
                    add(&st);
                }
            }
        }
        if let Some(st) = status_of(schema) {
            add(&st);
        }
        out.dedup();
        out
    }

    /// The frontmatter properties a step answering `status` may carry (the
    /// variant with that `const`, or the whole schema), `$status` included.
    pub fn properties_for(&self, status: &str) -> Vec<String> {
        let mut out = vec!["$status".to_owned()];
        let Some(schema) = &self.frontmatter else {
            return out;
        };
        let props = |s: &serde_json::Value| -> Vec<String> {
            s.get("properties")
                .and_then(|p| p.as_object())
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default()
        };
        out.extend(props(schema));
        if let Some(variants) = schema.get("oneOf").and_then(|v| v.as_array()) {
            for v in variants {
                let matches = v
                    .get("properties")
                    .and_then(|p| p.get("$status"))
                    .and_then(|s| s.get("const"))
                    .and_then(|c| c.as_str())
                    .is_none_or(|c| c == status);
                if matches {
                    out.extend(props(v));
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

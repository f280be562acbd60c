//! What a thread write is given and what it returns: a new thread, a step,
//! an end, what comes next ([`Next`]) and what was written.

use std::collections::BTreeMap;

use super::labels::Labels;
use super::{ThreadId, ThreadRecord};
use crate::hash::Hash;
use crate::node::Value;

/// A new thread.
#[derive(Debug, Clone, PartialEq)]
pub struct NewThread {
    /// The workflow's name.
    pub workflow: String,
    /// The stored `workflow` blob (must exist).
    pub workflow_hash: Hash,
    /// The task prompt.
    pub prompt: String,
    /// Loop protection for the start node.
    pub max_rounds: u32,
    /// 0 for a top-level thread.
    pub depth: u32,
    /// For a child workflow: the parent's head when it was spawned.
    pub parent_state: Option<Hash>,
    /// For a child workflow: the parent thread.
    pub parent_thread: Option<ThreadId>,
    /// The first role.
    pub next_role: String,
    /// The first role's instruction (the rendered `$START` prompt).
    pub next_instruction: String,
    /// The agent spec to store on the record.
    pub agent: Option<String>,
    /// The directory the thread's agents work in ([`ThreadRecord::cwd`]).
    pub cwd: Option<String>,
    /// The rendered `location` of the `$START` edge.
    pub next_location: Option<String>,
    /// The thread's labels (checked when the thread is written; a child
    /// workflow's thread gets its parent's).
    pub labels: Labels,
}

/// The state node meta key of a fan-out role's join step: its children's
/// end nodes, in item order (a join is not an agent's answer).
pub const JOIN_META: &str = "$children";

/// One role step to append.
#[derive(Debug, Clone, PartialEq)]
pub struct StepWrite {
    /// The role that ran.
    pub role: String,
    /// Its frontmatter, including `$status`.
    pub meta: BTreeMap<String, Value>,
    /// The reply body.
    pub reply: String,
    /// Artifacts the reply refers to (must exist).
    pub artifacts: Vec<Hash>,
    /// The exact instruction the role was given.
    pub instruction: String,
    /// The final state of a child thread this step ran.
    pub child_thread: Option<Hash>,
}

/// How a thread ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndSpec {
    /// 0 reached `$END`, 1 `maxRounds`, 2 cancelled.
    pub return_code: u8,
    /// The end summary (the end node's content).
    pub summary: String,
    /// The rendered `$END` prompt or a fixed text (the end node's input).
    pub prompt: String,
}

/// What comes next for a thread: what a workflow routes a step to
/// ([`Workflow::route`](crate::workflow::Workflow::route)), what a step
/// write applies ([`LowLevel::append_step`](super::LowLevel::append_step)), and the state a fork starts in
/// ([`LowLevel::fork_thread`](super::LowLevel::fork_thread), which refuses `End`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// A role runs next: status `idle`.
    Role {
        /// The next role.
        role: String,
        /// Its rendered instruction.
        instruction: String,
        /// The rendered `location` of the edge into it: the directory its
        /// agent works in, relative to the thread's `cwd` (SPEC §4).
        location: Option<String>,
    },
    /// Wait for a human: status `suspended`; `role` (the one that produced
    /// the suspending status) runs again on resume.
    Suspend {
        /// The role that produced the suspending status.
        role: String,
        /// The rendered edge prompt.
        message: String,
    },
    /// The thread ends: the end node is written in the same transaction and
    /// the thread moves to history.
    End(EndSpec),
}

/// What a write committed.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    /// The record after the write.
    pub record: ThreadRecord,
    /// The role step's state node, if one was written.
    pub step: Option<Hash>,
    /// The end node, if one was written.
    pub end: Option<Hash>,
}

//! What a child workflow's agent is told of the thread that called it
//! (seed 000, phase 3, "Agent observability"): the parent's workflow and
//! calling role, its task, its steps before the call, the ancestors above it
//! named, and how to read more. Built from stored data only (the start
//! node's `parent_state`, the parent's chain up to it, the parent's record
//! for the calling role), bounded by [`PARENT_CONTEXT_BYTES`]; see
//! `docs/design.md` §8e.

use std::fmt::Write;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Serialize;

use super::{Engine, EngineError};
use crate::hash::Hash;
use crate::thread::{ThreadId, ThreadRecord, ThreadStatus};

/// The largest parent-context section a prompt carries, in bytes.
pub const PARENT_CONTEXT_BYTES: usize = 4096;

/// The most of the parent's steps listed (older ones are counted, and a
/// command pages to them).
pub const PARENT_STEPS: usize = 20;

/// How much of the parent's task, and of its summary, is inlined.
const TEXT_BYTES: usize = 1024;
/// How much of each listed step's reply is inlined.
const REPLY_BYTES: usize = 200;
/// How much of the calling role's goal is inlined.
const GOAL_BYTES: usize = 300;

/// What a child workflow's thread knows of the thread that called it: the
/// data of the `## You are working for a parent workflow` section of its
/// agents' prompts, and that section itself (`section`).
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ParentContext {
    /// Deeper ancestors (the parent's parent first), named, never inlined.
    pub ancestors: Vec<Ancestor>,
    /// The parent's role whose step runs this child workflow: from the
    /// parent's record while the call is open, else the one role of the
    /// parent's workflow that runs this workflow (`None` when several do).
    pub role: Option<String>,
    /// That role's goal (or its description) in the parent's workflow.
    pub role_goal: Option<String>,
    /// The section as the agents' prompts carry it (at most
    /// [`PARENT_CONTEXT_BYTES`] bytes).
    pub section: String,
    /// The parent's head when this thread was started (this thread's
    /// `parent_state`): what the parent had done when it called.
    pub state: Hash,
    /// The parent's steps up to `state` (after its summary), oldest first,
    /// newest [`PARENT_STEPS`] at most, fewer when the section's size limit
    /// cuts the oldest.
    pub steps: Vec<ParentStep>,
    /// How many of the parent's steps before the first listed one are not
    /// listed (the summary, when there is one, covers some of them).
    pub steps_not_listed: u64,
    /// The parent's newest compact summary at `state`.
    pub summary: Option<Excerpt>,
    /// The parent's own task.
    pub task: Excerpt,
    /// The parent thread.
    pub thread: ThreadId,
    /// The parent's workflow.
    pub workflow: String,
}

/// A text blob, inlined up to a limit.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Excerpt {
    /// Its whole length in bytes.
    pub bytes: u64,
    /// Whether `text` is cut (read it whole with `uwf-db cas get HASH`).
    pub cut: bool,
    /// The content blob.
    pub hash: Hash,
    /// The text, or its beginning.
    pub text: String,
}

/// One step of the parent, in a line.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ParentStep {
    /// Whether `reply` is cut.
    pub cut: bool,
    /// The state node.
    pub hash: Hash,
    /// The beginning of the reply, on one line.
    pub reply: String,
    /// The role that answered (`__end__` for an end node).
    pub role: String,
    /// Its position on the parent's chain.
    pub seq: u64,
    /// The status it chose.
    pub status: Option<String>,
}

/// An ancestor above the parent, named by its thread, workflow and node.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Ancestor {
    /// Its depth (0 is the top-level thread).
    pub depth: u32,
    /// Its state when it called (its `parent_state` link).
    pub state: Hash,
    /// The content blob of its task.
    pub task: Hash,
    /// Its thread, while its record is stored.
    pub thread: Option<ThreadId>,
    /// Its workflow.
    pub workflow: String,
}

impl Engine {
    /// The parent context of `record`'s thread: `None` for a top-level
    /// thread. Every node it names is read (a missing or damaged one is an
    /// error); the parent's and ancestors' records are read for their ids
    /// and the calling role, and may be gone (removed).
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// let engine = store.engine();
    /// let top = engine.start_workflow(hash, "a task", &Default::default())?;
    /// assert!(engine.parent_context(&top)?.is_none()); // a top-level thread
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn parent_context(
        &self,
        record: &ThreadRecord,
    ) -> Result<Option<ParentContext>, EngineError> {
        self.parent_context_as(record, record.id)
    }

    /// The prompt section of `record`'s parent context (what a step's
    /// prompt shows), cached by the parent's state, the parent and the
    /// child's workflow: the section differs between the children of one
    /// call only in the child's id (a fan-out's thousand children render
    /// it once).
    pub(super) fn parent_section(
        &self,
        record: &ThreadRecord,
    ) -> Result<Option<String>, EngineError> {
        let Some(parent_id) = record.parent_thread else {
            return Ok(None);
        };
        let Some(state) = self.start_node(record.start)?.parent_state else {
            return Ok(None);
        };
        let key = (state, parent_id, record.workflow.clone());
        let cache = &self.engine_state().sections;
        let section = match cache.get(&key) {
            Some(hit) => hit,
            None => {
                // Rendered for a stand-in id (ids all have one length, so
                // the fit is the same), replaced wherever it is named.
                let Some(pc) = self.parent_context_as(record, ThreadId::NIL)? else {
                    return Ok(None);
                };
                let section: Arc<str> = Arc::from(pc.section);
                cache.insert(key, Arc::clone(&section));
                section
            }
        };
        Ok(Some(section.replace(
            &ThreadId::NIL.to_string(),
            &record.id.to_string(),
        )))
    }

    /// [`Engine::parent_context`], its section naming the child `child`.
    fn parent_context_as(
        &self,
        record: &ThreadRecord,
        child: ThreadId,
    ) -> Result<Option<ParentContext>, EngineError> {
        let Some(parent_id) = record.parent_thread else {
            return Ok(None);
        };
        let start = self.start_node(record.start)?;
        let Some(state) = start.parent_state else {
            return Ok(None);
        };
        let threads = self.threads();
        let base = self.parent_base(state)?;
        let Some(parent_frame) = base.frames.first() else {
            return Ok(None);
        };
        let frames = &base.frames;
        let parent_wf = self
            .store
            .workflows()
            .load(parent_frame.start_node.workflow)?;
        // The parent's record is read only when its workflow alone does not
        // say which role called (two roles run this child's workflow) or
        // for the ids of ancestors above it: a fan-out parent's record
        // names all its children, and each of their steps asks.
        let only_caller = sole_caller(record, &parent_wf);
        let parent = if only_caller.is_none() || frames.len() > 1 {
            threads.get(parent_id)?
        } else {
            None
        };
        let role = match only_caller {
            Some(role) => Some(role),
            None => calling_role(parent.as_ref(), record, &parent_wf),
        };
        let role_goal = role
            .as_ref()
            .and_then(|r| parent_wf.roles.get(r))
            .and_then(|r| r.goal.clone().or_else(|| r.description.clone()))
            .map(|g| cut(&g, GOAL_BYTES).0);
        let (task, summary, steps) = (base.task.clone(), base.summary.clone(), base.steps.clone());
        // Ancestors above the parent: their ids from the records' links.
        let mut ancestors = Vec::new();
        let mut up = parent.as_ref().and_then(|p| p.parent_thread);
        for frame in frames.iter().skip(1) {
            ancestors.push(Ancestor {
                depth: frame.start_node.depth,
                state: frame.node,
                task: frame.start_node.prompt,
                thread: up,
                workflow: frame.start_node.name.clone(),
            });
            up = match up {
                Some(id) => threads.get(id)?.and_then(|r| r.parent_thread),
                None => None,
            };
        }
        let mut pc = ParentContext {
            ancestors,
            role,
            role_goal,
            section: String::new(),
            state,
            steps_not_listed: 0,
            steps,
            summary,
            task,
            thread: parent_id,
            workflow: parent_frame.start_node.name.clone(),
        };
        fit(&mut pc, child, &record.workflow);
        Ok(Some(pc))
    }

    /// What a parent context shows of the parent's state `state` that the
    /// nodes alone decide (the call stack, the task, the summary, the steps
    /// before the call), cached by `state`: every step of every child of
    /// one call (a fan-out's thousand) reads the same nodes.
    fn parent_base(&self, state: Hash) -> Result<Arc<ParentBase>, EngineError> {
        let cache = &self.engine_state().parents;
        if let Some(hit) = cache.get(&state) {
            return Ok(hit);
        }
        let threads = self.threads();
        let frames = threads.call_stack(state)?;
        let task = match frames.first() {
            Some(f) => self.excerpt(f.start_node.prompt)?,
            None => {
                return Ok(Arc::new(ParentBase {
                    frames,
                    task: Excerpt {
                        bytes: 0,
                        cut: false,
                        hash: state,
                        text: String::new(),
                    },
                    summary: None,
                    steps: Vec::new(),
                }));
            }
        };
        let context = threads.context_at(state, PARENT_STEPS)?;
        let summary = match &context.summary {
            Some((hash, _)) => Some(self.excerpt(*hash)?),
            None => None,
        };
        let steps = context
            .steps
            .iter()
            .map(|e| {
                let text = self.text(&e.node.content)?;
                let (reply, was_cut) = cut(&one_line(&text), REPLY_BYTES);
                Ok(ParentStep {
                    cut: was_cut,
                    hash: e.hash,
                    reply,
                    role: e.node.role.clone(),
                    seq: e.node.seq,
                    status: e.node.meta.get("$status").map(status_text),
                })
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        let base = Arc::new(ParentBase {
            frames,
            task,
            summary,
            steps,
        });
        cache.insert(state, Arc::clone(&base));
        Ok(base)
    }

    /// A text blob, its first [`TEXT_BYTES`] inlined.
    fn excerpt(&self, hash: Hash) -> Result<Excerpt, EngineError> {
        let text = self.text(&hash)?;
        let (inlined, was_cut) = cut(&text, TEXT_BYTES);
        Ok(Excerpt {
            bytes: text.len() as u64,
            cut: was_cut,
            hash,
            text: inlined,
        })
    }
}

/// The part of a parent context the parent's state node decides
/// ([`Engine::parent_base`]).
#[derive(Debug)]
pub(crate) struct ParentBase {
    /// The call stack from the parent's state up.
    frames: Vec<crate::thread::Frame>,
    /// The parent's task.
    task: Excerpt,
    /// Its compact summary, if any.
    summary: Option<Excerpt>,
    /// Its steps before the call.
    steps: Vec<ParentStep>,
}

/// The parent's role that called `child`: its record's next (or suspended)
/// role while its open call is this child, else the one role of its
/// workflow that runs `child`'s workflow.
fn calling_role(
    parent: Option<&ThreadRecord>,
    child: &ThreadRecord,
    parent_wf: &crate::workflow::Workflow,
) -> Option<String> {
    if let Some(p) = parent
        && (p.active_child == Some(child.id)
            || p.fan_out.as_ref().is_some_and(|c| c.contains(&child.id)))
    {
        let role = match p.underlying_status() {
            ThreadStatus::Suspended => p.suspended_role.clone(),
            _ => p.next_role.clone(),
        };
        if role.is_some() {
            return role;
        }
    }
    sole_caller(child, parent_wf)
}

/// The one role of `parent_wf` that runs `child`'s workflow (`workflow:`,
/// `foreach:` or a `parallel:` branch); `None` when none or several do.
fn sole_caller(child: &ThreadRecord, parent_wf: &crate::workflow::Workflow) -> Option<String> {
    let calls = |r: &crate::workflow::Role| {
        r.workflow.as_deref() == Some(child.workflow.as_str())
            || r.fan_out.as_ref().is_some_and(|f| {
                f.foreach
                    .as_ref()
                    .is_some_and(|e| e.workflow == child.workflow)
                    || f.branches.iter().any(|b| b.workflow == child.workflow)
            })
    };
    let mut callers = parent_wf.roles.iter().filter(|(_, r)| calls(r));
    match (callers.next(), callers.next()) {
        (Some((name, _)), None) => Some(name.clone()),
        _ => None,
    }
}

/// The section under [`PARENT_CONTEXT_BYTES`]: the oldest listed steps go
/// first, then the inlined task and summary shrink; as a last resort (names
/// that alone pass the limit) the text is cut.
fn fit(pc: &mut ParentContext, child: ThreadId, child_workflow: &str) {
    // Every parent step before the first listed one (the summary covers
    // some), or all of them up to `state` when none is listed.
    pc.steps_not_listed = pc.steps.first().map_or(0, |s| s.seq.saturating_sub(1));
    loop {
        pc.section = render(pc, child, child_workflow);
        if pc.section.len() <= PARENT_CONTEXT_BYTES {
            return;
        }
        if !pc.steps.is_empty() {
            pc.steps.remove(0);
            pc.steps_not_listed += 1;
            continue;
        }
        let mut shrunk = false;
        for excerpt in [Some(&mut pc.task), pc.summary.as_mut()]
            .into_iter()
            .flatten()
        {
            if excerpt.text.len() > 256 {
                excerpt.text = cut(&excerpt.text, 256).0;
                excerpt.cut = true;
                shrunk = true;
            }
        }
        if !shrunk {
            let (text, _) = cut(&pc.section, PARENT_CONTEXT_BYTES - 16);
            pc.section = format!("{text}\n[… cut]\n");
            return;
        }
    }
}

/// The prompt section, as `docs/design.md` §8e shows it.
fn render(pc: &ParentContext, child: ThreadId, child_workflow: &str) -> String {
    let mut s = String::with_capacity(PARENT_CONTEXT_BYTES);
    let _ = writeln!(s, "\n## You are working for a parent workflow");
    let caller = match &pc.role {
        Some(role) => format!("its role `{role}`"),
        None => "one of its roles".to_owned(),
    };
    let _ = writeln!(
        s,
        "This thread ({child}, workflow `{child_workflow}`) runs for thread {} (workflow `{}`): \
         {caller} gave you the task above, and the parent goes on with this thread's end summary.",
        pc.thread, pc.workflow
    );
    if let Some(goal) = &pc.role_goal {
        let _ = writeln!(s, "That role's goal: {goal}");
    }
    let _ = writeln!(s, "\n### The parent's task (blob {})", pc.task.hash);
    push_excerpt(&mut s, &pc.task);
    if let Some(summary) = &pc.summary {
        let _ = writeln!(
            s,
            "\n### The parent's summary of its earlier steps (blob {})",
            summary.hash
        );
        push_excerpt(&mut s, summary);
    }
    if pc.steps.is_empty() && pc.steps_not_listed == 0 {
        let _ = writeln!(
            s,
            "\n### The parent's steps before it called\nNone: calling you is its first step."
        );
    } else {
        let _ = writeln!(s, "\n### The parent's steps before it called, oldest first");
        if let Some(first) = pc.steps.first().filter(|_| pc.steps_not_listed > 0) {
            let _ = writeln!(
                s,
                "({} earlier: uwf-db thread log {} --before {})",
                pc.steps_not_listed,
                pc.thread,
                first.hash.short(12)
            );
        } else if pc.steps.is_empty() {
            let _ = writeln!(
                s,
                "({} steps: uwf-db thread log {})",
                pc.steps_not_listed, pc.thread
            );
        }
        for step in &pc.steps {
            let status = step
                .status
                .as_deref()
                .map_or_else(String::new, |st| format!(" → {st}"));
            let _ = writeln!(
                s,
                "- #{} {}{} (node {}): {}{}",
                step.seq,
                step.role,
                status,
                step.hash.short(12),
                step.reply,
                if step.cut { " […]" } else { "" }
            );
        }
    }
    if !pc.ancestors.is_empty() {
        let _ = writeln!(s, "\n### Further up the call stack, nearest first");
        for a in &pc.ancestors {
            let thread = a
                .thread
                .map_or_else(|| "(record removed)".to_owned(), |t| t.to_string());
            let _ = writeln!(
                s,
                "- depth {}: thread {thread} (workflow `{}`), at node {}; its task: uwf-db cas get {}",
                a.depth, a.workflow, a.state, a.task
            );
        }
    }
    let _ = writeln!(s, "\n### Reading more (nodes never change)");
    let _ = writeln!(
        s,
        "- uwf-db thread show {} --json: the parent's record, usage and next step",
        pc.thread
    );
    let _ = writeln!(
        s,
        "- uwf-db thread log {}: its steps, newest first",
        pc.thread
    );
    let _ = writeln!(
        s,
        "- uwf-db thread tree {child}: the whole call stack, parents up and children down"
    );
    let _ = writeln!(s, "- uwf-db cas get HASH: any node or text named here");
    let _ = writeln!(
        s,
        "- MCP (uwf-db mcp): get_thread, read_log, read_node, call_stack"
    );
    s
}

fn push_excerpt(s: &mut String, e: &Excerpt) {
    let _ = writeln!(s, "{}", e.text);
    if e.cut {
        let _ = writeln!(
            s,
            "[… {} more bytes: uwf-db cas get {}]",
            e.bytes.saturating_sub(e.text.len() as u64),
            e.hash
        );
    }
}

/// A status value as text (a string as it is, anything else as JSON).
fn status_text(v: &crate::node::Value) -> String {
    match v {
        crate::node::Value::Str(s) => s.clone(),
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

/// The text on one line: runs of whitespace become one space.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The text's first `max` bytes at most, cut at a character boundary, and
/// whether anything was cut.
fn cut(text: &str, max: usize) -> (String, bool) {
    if text.len() <= max {
        return (text.to_owned(), false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (
        text.get(..end).unwrap_or_default().trim_end().to_owned(),
        true,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_keeps_whole_characters() {
        assert_eq!(cut("héllo", 2), ("h".to_owned(), true));
        assert_eq!(cut("héllo", 3), ("hé".to_owned(), true));
        assert_eq!(cut("abc", 3), ("abc".to_owned(), false));
        assert_eq!(one_line(" a\n\n b\tc "), "a b c");
    }
}

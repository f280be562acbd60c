//! Threads as the faces show them: summaries, details, log entries, the
//! call tree, and the answers of the thread commands.

use std::collections::BTreeMap;

use schemars::JsonSchema;

use super::Timestamp;
use serde::Serialize;

use crate::hash::Hash;
use crate::node::StateNode;
use crate::store::Store;
use crate::thread::{
    END_ROLE, ForkOrigin, Labels, ThreadError, ThreadId, ThreadRecord, ThreadStatus, ThreadTree,
};
use crate::usage::{StepUsage, USAGE_META, UsageTotals};

/// A thread as `thread list` gives it: its stored record, with `labels`
/// always present. Times are RFC 3339 strings in UTC ([`Timestamp`]).
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ThreadSummary {
    /// The child thread this one waits for (a `workflow:` role's step).
    pub active_child: Option<ThreadId>,
    /// The agent spec stored with the thread (what drives it by default).
    pub agent: Option<String>,
    /// Agent-answered role steps so far (`None` on threads of old stores).
    pub agent_steps: Option<u64>,
    /// While a driver holds the thread (`status` is `running`): the status
    /// under the claim.
    pub claimed_status: Option<ThreadStatus>,
    /// When it ended.
    pub completed_at: Option<Timestamp>,
    /// When it started.
    pub created_at: Timestamp,
    /// The directory its agents run in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Where a fork came from.
    pub forked_from: Option<ForkOrigin>,
    /// The newest node of its chain.
    pub head: Hash,
    /// Its labels (`{}` when none).
    pub labels: Labels,
    /// The seq of the newest end node (0: none).
    pub last_end_seq: u64,
    /// Why its last drive stopped early, if it did.
    pub last_error: Option<String>,
    /// The instruction for the next role.
    pub next_instruction: Option<String>,
    /// The edge's `location` for the next role.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_location: Option<String>,
    /// The role that answers next.
    pub next_role: Option<String>,
    /// The thread whose `workflow:` role started this one.
    pub parent_thread: Option<ThreadId>,
    /// Nodes on its chain after the start node.
    pub seq: u64,
    /// A summary staged by `thread compact`, used by the next step.
    pub staged_compact: Option<Hash>,
    /// The start node.
    pub start: Hash,
    /// Where the thread is in its life.
    pub status: ThreadStatus,
    /// When `thread stop` asked its driver to stop.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_requested_at: Option<Timestamp>,
    /// Why it waits for a human.
    pub suspend_message: Option<String>,
    /// The role that suspended it.
    pub suspended_role: Option<String>,
    /// The thread's id.
    pub thread: ThreadId,
    /// When its record last changed.
    pub updated_at: Timestamp,
    /// What its agent calls reported (absent: none yet). In a
    /// [`ThreadDetail`], the totals with its children's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageTotals>,
    /// Its workflow's name.
    pub workflow: String,
    /// Its workflow's hash.
    pub workflow_hash: Hash,
}

impl From<&ThreadRecord> for ThreadSummary {
    fn from(r: &ThreadRecord) -> Self {
        ThreadSummary {
            active_child: r.active_child,
            agent: r.agent.clone(),
            agent_steps: r.agent_steps,
            claimed_status: r.claimed_status,
            completed_at: r.completed_at.map(Timestamp),
            created_at: Timestamp(r.created_at),
            cwd: r.cwd.clone(),
            forked_from: r.forked_from,
            head: r.head,
            labels: r.labels.clone(),
            last_end_seq: r.last_end_seq,
            last_error: r.last_error.clone(),
            next_instruction: r.next_instruction.clone(),
            next_location: r.next_location.clone(),
            next_role: r.next_role.clone(),
            parent_thread: r.parent_thread,
            seq: r.seq,
            staged_compact: r.staged_compact,
            start: r.start,
            status: r.status,
            stop_requested_at: r.stop_requested_at.map(Timestamp),
            suspend_message: r.suspend_message.clone(),
            suspended_role: r.suspended_role.clone(),
            thread: r.id,
            updated_at: Timestamp(r.updated_at),
            usage: r.usage.clone(),
            workflow: r.workflow.clone(),
            workflow_hash: r.workflow_hash,
        }
    }
}

/// A thread as `thread show` gives it: the summary, with `usage` the
/// totals of the thread and all its children, plus its children and
/// whether a driver holds it now.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ThreadDetail {
    /// The record.
    #[serde(flatten)]
    pub thread: ThreadSummary,
    /// Its child threads (direct ones), oldest first.
    pub children: Vec<ThreadId>,
    /// Completed, failed or cancelled.
    pub done: bool,
    /// Whether a live driver holds its claim.
    pub driver_alive: bool,
    /// For a child workflow's thread: what its agents are told of the
    /// thread that called it (the prompt section and its data), as
    /// [`crate::engine::Engine::parent_context`] gives it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_context: Option<crate::engine::ParentContext>,
    /// For a suspended thread: the command that answers it and runs it on
    /// (through its top-level parent when it is a child workflow's thread,
    /// which is what resumes it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume_command: Option<String>,
    /// Role steps since the last end.
    pub rounds: u64,
    /// The task the thread was started with (its start node's prompt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
}

/// The command that resumes suspended thread `id` with a human's answer.
///
/// ```
/// let id = uwf_db::thread::ThreadId::generate();
/// let cmd = uwf_db::api::resume_command(id);
/// assert_eq!(cmd, format!("uwf-db thread resume {id} -p 'YOUR ANSWER'"));
/// ```
pub fn resume_command(id: ThreadId) -> String {
    format!("uwf-db thread resume {id} -p 'YOUR ANSWER'")
}

impl ThreadDetail {
    /// The detail of `tree`'s thread; `driver_alive` from
    /// [`crate::engine::claim::is_held`].
    pub fn of(tree: &ThreadTree, driver_alive: bool) -> Self {
        let r = &tree.thread;
        let mut thread = ThreadSummary::from(r);
        thread.usage = Some(crate::thread::Threads::tree_usage(tree));
        ThreadDetail {
            thread,
            children: tree.children.iter().map(|c| c.thread.id).collect(),
            done: r.status.is_done(),
            driver_alive,
            parent_context: None,
            resume_command: (r.underlying_status() == ThreadStatus::Suspended)
                .then(|| resume_command(tree.parents.first().map_or(r.id, |p| p.id))),
            rounds: r.rounds(),
            task: None,
        }
    }

    /// With the task the thread was started with.
    #[must_use]
    pub fn with_task(mut self, task: String) -> Self {
        self.task = Some(task);
        self
    }

    /// With the parent context of a child workflow's thread.
    #[must_use]
    pub fn with_parent_context(mut self, pc: Option<crate::engine::ParentContext>) -> Self {
        self.parent_context = pc;
        self
    }
}

/// One step of a thread's chain, as `thread log` and `thread watch` give it.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct LogEntry {
    /// The final node of the child thread a `workflow:` role's step ran.
    pub child_thread: Option<Hash>,
    /// The reply's text (for an end node, its message).
    pub content: String,
    /// The node's hash.
    pub hash: Hash,
    /// The prompt the role was given.
    pub input: String,
    /// The reply's frontmatter and the engine's keys, less `$usage`,
    /// `$attempts`, `$prompt` and `$stderr`.
    pub meta: BTreeMap<String, serde_json::Value>,
    /// The role that answered (`$end` for an end node).
    pub role: String,
    /// Its position on the chain (1 is the first step).
    pub seq: u64,
    /// The status the reply chose (none for an end node).
    pub status: Option<serde_json::Value>,
    /// When the step was written (ms since the epoch).
    pub timestamp: u64,
    /// What the step's agent calls reported (every attempt's).
    pub usage: StepUsageEntry,
    /// The failed attempts before the one that answered, oldest first
    /// (empty when the first answered; SPEC §13): the step took
    /// `attempts.len() + 1` attempts.
    pub attempts: Vec<crate::engine::retry::AttemptEntry>,
    /// Whether the step kept the exact prompt its agent was sent on the
    /// call that answered (not for a step that called no agent, a step
    /// written before prompts were kept, or in a store that keeps none).
    pub prompt_kept: bool,
    /// That prompt, when asked for (`thread log --prompt`).
    pub sent_prompt: Option<String>,
    /// The tail of what the agent wrote on stderr on that call, as a
    /// content blob (none when it wrote nothing).
    pub stderr: Option<Hash>,
    /// Its text, when asked for (`thread log --stderr`).
    pub stderr_text: Option<String>,
}

/// Which kept texts [`LogEntry::read_with`] reads whole.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeptTexts {
    /// The exact prompt sent.
    pub prompt: bool,
    /// The agent's stderr tail.
    pub stderr: bool,
}

impl LogEntry {
    /// The entry of `entry`, with its reply and prompt read from `store`.
    pub fn read(store: &Store, entry: &crate::thread::LogEntry) -> Result<Self, ThreadError> {
        Self::read_with(store, entry, KeptTexts::default())
    }

    /// [`read`](Self::read), with the kept texts `texts` asks for.
    pub fn read_with(
        store: &Store,
        entry: &crate::thread::LogEntry,
        texts: KeptTexts,
    ) -> Result<Self, ThreadError> {
        let mut one = Self::read_all(store, std::slice::from_ref(entry), texts)?;
        one.pop()
            .ok_or(ThreadError::MissingNode { hash: entry.hash })
    }

    /// The entries of `entries`, in their order, with the kept texts
    /// `texts` asks for. Every step's prompt and reply are read in one
    /// read (one round trip on a server backend, where an entry at a time
    /// cost two each); the kept texts, a debugging aid asked for by name,
    /// are read an entry at a time.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// # struct Echo;
    /// # impl uwf_db::engine::agent::Agent for Echo {
    /// #     fn call(&mut self, _: &uwf_db::engine::agent::AgentRequest<'_>) -> Result<uwf_db::engine::agent::AgentReply, uwf_db::engine::agent::AgentError> { Ok("written".to_owned().into()) }
    /// # }
    /// let id = store.engine().start_workflow(hash, "task", &Default::default())?.id;
    /// store.engine().drive(id, &Default::default(), &mut Echo).into_result()?;
    /// let log = store.threads().log(id, 10, None)?; // newest first
    /// let entries = uwf_db::api::LogEntry::read_all(&store, &log, Default::default())?;
    /// assert_eq!(entries.len(), 2);
    /// assert_eq!((entries[1].role.as_str(), entries[1].content.as_str()), ("writer", "written"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn read_all(
        store: &Store,
        entries: &[crate::thread::LogEntry],
        texts: KeptTexts,
    ) -> Result<Vec<Self>, ThreadError> {
        use crate::engine::kept::{Kept, PROMPT_META, STDERR_META, prompt_text};
        // Each entry's input node and reply, in one read.
        let wanted: Vec<Hash> = entries
            .iter()
            .flat_map(|e| [e.node.input, e.node.content])
            .collect();
        let mut found = store.threads().content_nodes(&wanted)?.into_iter();
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            let n = &entry.node;
            let (Some(input), Some(content)) = (found.next(), found.next()) else {
                return Err(ThreadError::MissingNode { hash: n.input });
            };
            let kept = Kept::of(&n.meta, &input.artifacts);
            let sent_prompt = match texts.prompt {
                true => prompt_text(store, &n.meta, &input.artifacts)?,
                false => None,
            };
            let stderr_text = match (texts.stderr, kept.stderr) {
                (true, Some(h)) => Some(store.threads().content_text(&h)?),
                _ => None,
            };
            out.push(LogEntry {
                prompt_kept: kept.prompt,
                sent_prompt,
                stderr_text,
                stderr: kept.stderr,
                child_thread: n.child_thread,
                content: content.text,
                hash: entry.hash,
                input: input.text,
                meta: n
                    .meta
                    .iter()
                    .filter(|(k, _)| {
                        ![
                            USAGE_META,
                            crate::engine::retry::ATTEMPTS_META,
                            PROMPT_META,
                            STDERR_META,
                        ]
                        .contains(&k.as_str())
                    })
                    .map(|(k, v)| (k.clone(), v.to_json()))
                    .collect(),
                role: n.role.clone(),
                seq: n.seq,
                status: n
                    .meta
                    .get("$status")
                    .map(|v| v.to_json())
                    .filter(|_| n.role != END_ROLE),
                timestamp: n.timestamp,
                usage: StepUsageEntry::of(n),
                attempts: crate::engine::retry::attempts_of(&n.meta),
            });
        }
        Ok(out)
    }
}

/// A step's usage (SPEC §11); every field null for an end node or a child
/// workflow's step, which no agent call made.
#[derive(Debug, Clone, Default, PartialEq, Serialize, JsonSchema)]
pub struct StepUsageEntry {
    /// Agent calls (the answer and any re-asks).
    pub calls: Option<u64>,
    /// What the calls cost, in US dollars, when they said.
    pub cost_usd: Option<f64>,
    /// Input tokens the calls reported.
    pub input_tokens: Option<u64>,
    /// The model that answered, when it said.
    pub model: Option<String>,
    /// Output tokens the calls reported.
    pub output_tokens: Option<u64>,
    /// The calls' wall time, in ms.
    pub wall_ms: Option<u64>,
}

impl StepUsageEntry {
    /// The usage recorded on `node`.
    pub fn of(node: &StateNode) -> Self {
        match StepUsage::of_meta(&node.meta) {
            Some(u) => StepUsageEntry {
                calls: Some(u.calls),
                cost_usd: u.cost_usd,
                input_tokens: u.input_tokens,
                model: u.model,
                output_tokens: u.output_tokens,
                wall_ms: Some(u.wall_ms),
            },
            None => StepUsageEntry::default(),
        }
    }
}

/// A thread's place in its call tree (`thread tree`).
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct TreeView {
    /// Its forks, and theirs, depth first (only when asked for:
    /// `thread tree --forks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forks: Option<Vec<TreeFork>>,
    /// Its parents, from the top-level thread down to the direct parent.
    pub parents: Vec<TreeParent>,
    /// The thread, with its children below it.
    pub thread: TreeNode,
}

/// A fork in a [`TreeView`].
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct TreeFork {
    /// How many forks down (1: forked from the thread itself).
    pub depth: usize,
    /// The node it was forked at.
    pub forked_at: Option<Hash>,
    /// The thread it was forked from.
    pub forked_from: Option<ThreadId>,
    /// Its head.
    pub head: Hash,
    /// Its status.
    pub status: ThreadStatus,
    /// Its id.
    pub thread: ThreadId,
    /// Its workflow's name.
    pub workflow: String,
}

impl TreeFork {
    /// The view of `fork`.
    pub fn of(fork: &crate::thread::Fork) -> Self {
        let t = &fork.thread;
        TreeFork {
            depth: fork.depth,
            forked_at: t.forked_from.as_ref().map(|o| o.node),
            forked_from: t.forked_from.as_ref().map(|o| o.thread),
            head: t.head,
            status: t.status,
            thread: t.id,
            workflow: t.workflow.clone(),
        }
    }
}

/// A parent in a [`TreeView`].
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct TreeParent {
    /// Its head.
    pub head: Hash,
    /// Its status.
    pub status: ThreadStatus,
    /// Its id.
    pub thread: ThreadId,
    /// Its workflow's name.
    pub workflow: String,
}

/// A thread and its children in a [`TreeView`].
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct TreeNode {
    /// Its children, each with theirs.
    pub children: Vec<TreeNode>,
    /// Its head.
    pub head: Hash,
    /// Its status.
    pub status: ThreadStatus,
    /// Its id.
    pub thread: ThreadId,
    /// Its workflow's name.
    pub workflow: String,
}

impl TreeView {
    /// The view of `tree`.
    pub fn of(tree: &ThreadTree) -> Self {
        fn node(t: &ThreadTree) -> TreeNode {
            TreeNode {
                children: t.children.iter().map(node).collect(),
                head: t.thread.head,
                status: t.thread.status,
                thread: t.thread.id,
                workflow: t.thread.workflow.clone(),
            }
        }
        TreeView {
            forks: None,
            parents: tree
                .parents
                .iter()
                .map(|p| TreeParent {
                    head: p.head,
                    status: p.status,
                    thread: p.id,
                    workflow: p.workflow.clone(),
                })
                .collect(),
            thread: node(tree),
        }
    }
}

/// `thread start`: the new thread.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ThreadStarted {
    /// The role that answers first.
    pub current_role: Option<String>,
    /// Its start node.
    pub head: Hash,
    /// Its labels.
    pub labels: Labels,
    /// Its status (`idle`).
    pub status: ThreadStatus,
    /// Its id.
    pub thread: ThreadId,
    /// Its workflow's name.
    pub workflow: String,
}

impl From<&ThreadRecord> for ThreadStarted {
    fn from(r: &ThreadRecord) -> Self {
        ThreadStarted {
            current_role: r.next_role.clone(),
            head: r.head,
            labels: r.labels.clone(),
            status: r.status,
            thread: r.id,
            workflow: r.workflow.clone(),
        }
    }
}

/// `thread fork`: the new thread and where it came from.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ThreadForked {
    /// The role that answers next on the fork.
    pub current_role: Option<String>,
    /// The thread and node it was forked from.
    pub forked_from: ForkedFrom,
    /// The fork's status.
    pub status: ThreadStatus,
    /// The fork's id.
    pub thread: ThreadId,
}

/// Where a [`ThreadForked`] came from.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ForkedFrom {
    /// The node the fork starts after (none: forked at the start).
    pub node: Option<Hash>,
    /// The thread forked.
    pub thread: ThreadId,
}

impl ThreadForked {
    /// The answer for fork `r` of thread `from`.
    pub fn of(from: ThreadId, r: &ThreadRecord) -> Self {
        ThreadForked {
            current_role: r.next_role.clone(),
            forked_from: ForkedFrom {
                node: r.forked_from.map(|f| f.node),
                thread: from,
            },
            status: r.status,
            thread: r.id,
        }
    }
}

/// `thread compact`: the summary staged for the next step.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct SummaryStaged {
    /// The summary's content blob.
    pub summary: Hash,
    /// The thread.
    pub thread: ThreadId,
}

/// `thread label`: the labels after the change.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct LabelsSet {
    /// Every label the thread has now.
    pub labels: Labels,
    /// The thread.
    pub thread: ThreadId,
}

/// `thread rm`: the thread removed (its blobs stay until `gc`).
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ThreadRemoved {
    /// Its head when it was removed.
    pub head: Hash,
    /// Always true.
    pub removed: bool,
    /// The thread.
    pub thread: ThreadId,
}

/// `thread stop`: when the stop was asked for.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct StopRequested {
    /// When.
    pub stop_requested_at: Option<Timestamp>,
    /// The thread.
    pub thread: ThreadId,
}

/// A line of `thread list --watch`: a thread that changed.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ThreadActivity {
    /// Its labels.
    pub labels: Labels,
    /// Its last activity.
    pub last_activity: Timestamp,
    /// Why its last drive stopped early, if it did.
    pub last_error: Option<String>,
    /// Its chain's length.
    pub seq: u64,
    /// Its status.
    pub status: ThreadStatus,
    /// Its id.
    pub thread: ThreadId,
    /// What its agent calls reported (absent: none yet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageTotals>,
    /// Its workflow's name.
    pub workflow: String,
}

impl From<&ThreadRecord> for ThreadActivity {
    fn from(r: &ThreadRecord) -> Self {
        ThreadActivity {
            labels: r.labels.clone(),
            last_activity: Timestamp(r.last_activity()),
            last_error: r.last_error.clone(),
            seq: r.seq,
            status: r.status,
            thread: r.id,
            usage: r.usage.clone(),
            workflow: r.workflow.clone(),
        }
    }
}

//! The answers and requests of the HTTP face (`uwf-db serve`, SPEC §12)
//! that no CLI command prints: pages with their cursors, a workflow's
//! graph, the diff of two threads, health, and the bodies of the write
//! endpoints. The MCP server and the Python package use the same ones.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{LogEntry, ThreadSummary, WorkflowDetail};
use crate::hash::Hash;
use crate::store::Store;
use crate::thread::{Labels, ThreadError, ThreadId};
use crate::workflow::Workflow;

/// `GET /api/threads`: a page of threads, newest activity first.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ThreadPage {
    /// Pass as `cursor` for the next (older) page; `null` on the last.
    pub next_cursor: Option<String>,
    /// The page's threads (no step bodies).
    pub threads: Vec<ThreadSummary>,
}

/// `GET /api/threads/{id}/log`: a page of steps, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct LogPage {
    /// The steps.
    pub entries: Vec<LogEntry>,
    /// Pass as `before` for the next (older) page; `null` on the last.
    pub next_before: Option<Hash>,
}

/// `GET /api/healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Health {
    /// The agents write requests may name (`--agent NAME=SPEC`).
    pub agents: Vec<String>,
    /// The JSON contract's version.
    pub api_version: u32,
    /// `lmdb` or `postgres`.
    pub backend: String,
    /// Whether writes are refused.
    pub read_only: bool,
    /// `ok`.
    pub status: String,
    /// The server's version.
    pub version: String,
}

/// A workflow drawn as a graph: roles and the status edges between them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct WorkflowGraph {
    /// One edge per `graph[from][status]`.
    pub edges: Vec<GraphEdge>,
    /// `$START`, every role, and `$END`/`$SUSPEND` when an edge reaches them.
    pub nodes: Vec<GraphNode>,
}

/// A node of a [`WorkflowGraph`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct GraphNode {
    /// The role's name, or `$START`, `$END`, `$SUSPEND`.
    pub id: String,
    /// `start`, `end`, `suspend`, `role`, or `workflow` (a role that runs a
    /// child workflow).
    pub kind: String,
    /// The child workflow's name, for a `workflow` node.
    pub workflow: Option<String>,
}

/// An edge of a [`WorkflowGraph`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct GraphEdge {
    /// The role that answered.
    pub from: String,
    /// The status its reply chose (`_`: any other).
    pub status: String,
    /// The next role, `$END` or `$SUSPEND`.
    pub to: String,
}

impl WorkflowGraph {
    /// The graph of `wf`.
    ///
    /// ```
    /// let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// let g = uwf_db::api::WorkflowGraph::of(&wf);
    /// let ids: Vec<&str> = g.nodes.iter().map(|n| n.id.as_str()).collect();
    /// assert_eq!(ids, ["$START", "writer", "$END"]);
    /// assert_eq!(g.edges.len(), 2);
    /// ```
    pub fn of(wf: &Workflow) -> Self {
        use crate::workflow::model::{END, START, SUSPEND};
        let mut nodes = vec![GraphNode {
            id: START.into(),
            kind: "start".into(),
            workflow: None,
        }];
        for (name, role) in &wf.roles {
            nodes.push(GraphNode {
                id: name.clone(),
                kind: if role.workflow.is_some() {
                    "workflow"
                } else {
                    "role"
                }
                .into(),
                workflow: role.workflow.clone(),
            });
        }
        let mut edges = Vec::new();
        for (from, by_status) in &wf.graph {
            for (status, edge) in by_status {
                edges.push(GraphEdge {
                    from: from.clone(),
                    status: status.clone(),
                    to: edge.role.clone(),
                });
            }
        }
        for (id, kind) in [(END, "end"), (SUSPEND, "suspend")] {
            if edges.iter().any(|e| e.to == id) {
                nodes.push(GraphNode {
                    id: id.into(),
                    kind: kind.into(),
                    workflow: None,
                });
            }
        }
        WorkflowGraph { edges, nodes }
    }
}

/// `GET /api/workflows/{name}`: the definition, its graph, and its YAML.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct WorkflowView {
    /// The definition (as `workflow show` gives it).
    pub definition: WorkflowDetail,
    /// Roles and edges.
    pub graph: WorkflowGraph,
    /// The definition's hash.
    pub hash: Hash,
    /// The name.
    pub name: String,
    /// The definition as YAML (regenerated from the stored definition).
    pub yaml: String,
}

/// `GET /api/workflows`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct WorkflowList {
    /// Every registered name and the definition it points at.
    pub workflows: Vec<super::WorkflowEntry>,
}

/// `GET /api/diff`: two threads step by step. Chains are content
/// addressed, so the steps they share are the same nodes: only what comes
/// after is listed.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ThreadDiff {
    /// The first thread.
    pub a: ThreadSummary,
    /// Its steps after the shared ones, oldest first.
    pub a_steps: Vec<LogEntry>,
    /// The second thread.
    pub b: ThreadSummary,
    /// Its steps after the shared ones, oldest first.
    pub b_steps: Vec<LogEntry>,
    /// Whether the two start from the same start node (same workflow,
    /// prompt and origin): a fork and its source do.
    pub same_start: bool,
    /// How many steps (from the first) the two have in common.
    pub shared: u64,
    /// Whether a side had more differing steps than were compared (the
    /// newest are listed).
    pub truncated: bool,
}

impl ThreadDiff {
    /// The diff of threads `a` and `b`, comparing at most `limit` of each
    /// one's newest steps.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
    /// struct Echo(&'static str);
    /// impl Agent for Echo {
    ///     fn call(&mut self, _: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
    ///         Ok(self.0.to_owned().into())
    ///     }
    /// }
    /// let (a, _) = store.engine().run_workflow(hash, "task", &Default::default(), &mut Echo("one"))?;
    /// let (b, _) = store.engine().run_workflow(hash, "task", &Default::default(), &mut Echo("two"))?;
    /// let diff = uwf_db::api::ThreadDiff::of(&store, a.id, b.id, 100)?;
    /// assert_eq!(diff.shared, 0);
    /// assert_eq!(diff.a_steps[0].content, "one");
    /// assert_eq!(diff.b_steps[0].content, "two");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn of(store: &Store, a: ThreadId, b: ThreadId, limit: usize) -> Result<Self, ThreadError> {
        let threads = store.threads();
        let need = |id: ThreadId| {
            threads
                .get(id)?
                .ok_or_else(|| ThreadError::Unknown(id.to_string()))
        };
        let (ra, rb) = (need(a)?, need(b)?);
        let (la, lb) = (threads.log(a, limit, None)?, threads.log(b, limit, None)?);
        let same_start = ra.start == rb.start;
        let shared = if same_start {
            let by_seq: BTreeMap<u64, Hash> = la.iter().map(|e| (e.node.seq, e.hash)).collect();
            lb.iter()
                .filter(|e| by_seq.get(&e.node.seq) == Some(&e.hash))
                .map(|e| e.node.seq)
                .max()
                .unwrap_or(0)
        } else {
            0
        };
        let after = |log: &[crate::thread::LogEntry]| -> Result<Vec<LogEntry>, ThreadError> {
            let steps: Vec<_> = log
                .iter()
                .rev()
                .filter(|e| e.node.seq > shared)
                .cloned()
                .collect();
            LogEntry::read_all(store, &steps, super::KeptTexts::default())
        };
        let cut =
            |log: &[crate::thread::LogEntry]| log.last().is_some_and(|e| e.node.seq > shared + 1);
        Ok(ThreadDiff {
            truncated: cut(&la) || cut(&lb),
            a_steps: after(&la)?,
            b_steps: after(&lb)?,
            a: ThreadSummary::from(&ra),
            b: ThreadSummary::from(&rb),
            same_start,
            shared,
        })
    }
}

/// `POST /api/threads`: start a thread of a registered workflow.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    /// A registered workflow's name.
    #[schemars(length(min = 1))]
    pub workflow: String,
    /// The task prompt.
    pub prompt: String,
    /// Labels for the thread.
    #[serde(default)]
    pub labels: Labels,
    /// The server agent (by name) that drives it; with `drive`, absent
    /// means `default`.
    #[serde(default)]
    pub agent: Option<String>,
    /// Drive it now, until it ends or suspends (the answer does not wait).
    #[serde(default)]
    pub drive: bool,
    /// Loop protection (default: the workflow's `maxRounds`).
    #[serde(default)]
    pub max_rounds: Option<u32>,
}

/// `POST /api/threads/{id}/resume`: run a suspended (or ended) thread on.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeRequest {
    /// The human's answer, added to the resume instruction.
    #[serde(default)]
    pub text: Option<String>,
    /// The server agent (by name) that drives it (absent: the one whose
    /// spec the thread stores, else `default`).
    #[serde(default)]
    pub agent: Option<String>,
}

/// `POST /api/threads/{id}/cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    /// Cancel even while a live driver holds it.
    #[serde(default)]
    pub force: bool,
}

/// `POST /api/threads/{id}/fork`: a new thread sharing the chain up to a
/// step. At most one of `seq`, `node` and `before_role`; none: the head.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// Fork at the step with this number (1 is the first step).
    #[serde(default)]
    pub seq: Option<u64>,
    /// Fork at this node (a hash or unique prefix).
    #[serde(default)]
    pub node: Option<String>,
    /// Fork before the latest step of this role (so it runs again).
    #[serde(default)]
    pub before_role: Option<String>,
}

/// `POST /api/threads/{id}/labels`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LabelsRequest {
    /// Labels to set (replacing a label with the same key).
    #[serde(default)]
    pub set: Labels,
    /// Keys to remove.
    #[serde(default)]
    pub remove: Vec<String>,
}

/// The answer to a write that may drive a thread in the background
/// (`POST /api/threads`, `POST /api/threads/{id}/resume`, `POST
/// /api/threads/{id}/drive`): the answer does not wait for the drive;
/// the thread's events follow it.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct DriveAccepted {
    /// The server agent driving it (`null`: started, not driven).
    pub agent: Option<String>,
    /// The thread as it was when driving began.
    pub thread: ThreadSummary,
}

/// `POST /api/threads/{id}/drive`: drive an idle thread on.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DriveRequest {
    /// The server agent (by name) that drives it (absent: the one whose
    /// spec the thread stores, else `default`).
    #[serde(default)]
    pub agent: Option<String>,
}

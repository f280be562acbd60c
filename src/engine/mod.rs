//! The synchronous workflow engine: starting threads of registered
//! workflows, stepping them with agents, routing, suspend and resume,
//! child workflows, compaction, cancel and forks that compute their state
//! from the pinned workflow.

pub mod agent;
pub mod batch;
pub mod claim;
mod drive;
pub mod extract;
pub mod prompt;
pub(crate) mod state;

pub use drive::{RunOutcome, StepResult};

use crate::hash::Hash;
use crate::node::Blob;
use crate::store::{Store, StoreError};
use crate::thread::{END_ROLE, ForkState, NewThread, ThreadError, ThreadId, ThreadRecord};
use crate::workflow::{Route, Workflow, WorkflowError};

/// What went wrong while driving a thread.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A thread operation failed.
    #[error(transparent)]
    Thread(#[from] ThreadError),
    /// A workflow problem (unknown, invalid, routing).
    #[error(transparent)]
    Workflow(#[from] WorkflowError),
    /// Forking at a step that routed to `$END`.
    #[error(
        "step {node} of thread {thread} routed to $END: fork at an earlier step, or resume the thread"
    )]
    ForkAfterEnd {
        /// The thread.
        thread: ThreadId,
        /// The node.
        node: Hash,
    },
    /// A step failed (agent error, invalid reply, unknown status): nothing
    /// was committed; the error is recorded as the thread's `last_error`.
    #[error("step of thread {thread} failed: {message}")]
    StepFailed {
        /// The thread.
        thread: ThreadId,
        /// What went wrong.
        message: String,
    },
    /// The thread cannot take a step in its status.
    #[error(
        "thread {thread} is {status}: only idle threads take steps (resume a suspended or ended thread)"
    )]
    NotSteppable {
        /// The thread.
        thread: ThreadId,
        /// Its status.
        status: crate::thread::ThreadStatus,
    },
    /// The thread cannot be resumed in its status.
    #[error(
        "thread {thread} is {status}: only suspended, completed or failed threads can be resumed"
    )]
    NotResumable {
        /// The thread.
        thread: ThreadId,
        /// Its status.
        status: crate::thread::ThreadStatus,
    },
    /// A child suspended inside its parent is resumed through the parent.
    #[error(
        "thread {thread} is a child workflow suspended inside thread {parent}: resume the parent (uwf-db thread resume {parent})"
    )]
    ResumeThroughParent {
        /// The child.
        thread: ThreadId,
        /// The parent to resume.
        parent: ThreadId,
    },
    /// A batch was given prompts but no agent to drive them.
    #[error("a batch needs at least one agent (one per driver thread)")]
    NoAgents,
    /// The process was interrupted (Ctrl-C): no new drive starts.
    #[error("interrupted")]
    Interrupted,
    /// Another live driver holds the thread.
    #[error(
        "thread {thread} is being driven by another process; wait for it, or stop that driver (a driver that died is taken over automatically)"
    )]
    Claimed {
        /// The thread.
        thread: ThreadId,
    },
    /// An agent spec could not be used.
    #[error(transparent)]
    Agent(#[from] agent::AgentError),
    /// No step of that role on the chain.
    #[error("thread {thread} has no step of role '{role}'")]
    NoSuchStep {
        /// The thread.
        thread: ThreadId,
        /// The role.
        role: String,
    },
}

/// Where a fork starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForkAt {
    /// The source's head.
    Head,
    /// A node of the source's chain.
    Node(Hash),
    /// The parent of the latest step of this role (so the role runs again).
    BeforeRole(String),
}

impl Store {
    /// Starts a thread of a registered workflow (or one already stored, by
    /// hash) with the task `prompt`; it is `idle` with the first role.
    pub fn start_workflow(
        &self,
        workflow: Hash,
        prompt: &str,
        agent: Option<String>,
        max_rounds: Option<u32>,
    ) -> Result<ThreadRecord, EngineError> {
        let new = self.top_level_thread(workflow, prompt, agent, max_rounds)?;
        Ok(self.start_thread(new)?)
    }

    /// Starts a thread and drives it until it ends or suspends (what
    /// `uwf-db run` does): the thread is created already claimed, so the
    /// drive costs no separate claim commit.
    pub fn run_workflow(
        &self,
        workflow: Hash,
        prompt: &str,
        agent_spec: Option<String>,
        max_rounds: Option<u32>,
        agent: &mut dyn agent::Agent,
    ) -> Result<(ThreadRecord, RunOutcome), EngineError> {
        let new = self.top_level_thread(workflow, prompt, agent_spec, max_rounds)?;
        let id = ThreadId::generate();
        let claim = self.claim_new(id)?;
        let record = self.start_thread_as(new, id, true)?;
        let outcome = self.run_thread(id, usize::MAX, agent);
        match outcome.results.last() {
            Some(last) if outcome.error.is_none() && last.current_role.is_none() => {
                claim.released_by_commit();
            }
            _ => drop(claim),
        }
        Ok((record, outcome))
    }

    /// A top-level thread of a stored workflow, idle with its first role.
    fn top_level_thread(
        &self,
        workflow: Hash,
        prompt: &str,
        agent: Option<String>,
        max_rounds: Option<u32>,
    ) -> Result<NewThread, EngineError> {
        let wf = self.load_workflow(workflow)?;
        let (role, instruction) = wf.first_in(Some(&self.engine_state().templates))?;
        Ok(NewThread {
            workflow: wf.name.clone(),
            workflow_hash: workflow,
            prompt: prompt.to_owned(),
            max_rounds: max_rounds.unwrap_or(wf.max_rounds),
            depth: 0,
            parent_state: None,
            parent_thread: None,
            next_role: role,
            next_instruction: instruction,
            agent,
        })
    }

    /// Forks a thread, computing the fork's status once from the node and
    /// the pinned workflow: the start → `idle` with the first role; a step
    /// that routed to a role → `idle` with that role; a step that routed to
    /// `$SUSPEND` → `suspended` with the same role and message.
    pub fn fork(&self, source: ThreadId, at: ForkAt) -> Result<ThreadRecord, EngineError> {
        let record = self
            .thread(source)?
            .ok_or_else(|| ThreadError::Unknown(source.to_string()))?;
        let node = match at {
            ForkAt::Head => record.head,
            ForkAt::Node(h) => h,
            ForkAt::BeforeRole(role) => self.before_latest_step(&record, &role)?,
        };
        let wf = self.load_workflow(record.workflow_hash)?;
        let state = fork_state(self, &wf, &record, node)?;
        Ok(self.fork_thread(source, node, state)?)
    }

    /// The parent (or the start) of the newest step of `role` on the chain.
    fn before_latest_step(&self, record: &ThreadRecord, role: &str) -> Result<Hash, EngineError> {
        let mut before = None;
        loop {
            let page = self.thread_log(record.id, 256, before)?;
            if let Some(e) = page.iter().find(|e| e.node.role == role) {
                return Ok(e.node.ancestors.first().copied().unwrap_or(record.start));
            }
            match page.last() {
                Some(last) if page.len() == 256 => before = Some(last.hash),
                _ => {
                    return Err(EngineError::NoSuchStep {
                        thread: record.id,
                        role: role.to_owned(),
                    });
                }
            }
        }
    }
}

fn fork_state(
    store: &Store,
    wf: &Workflow,
    record: &ThreadRecord,
    node: Hash,
) -> Result<ForkState, EngineError> {
    if node == record.start {
        let (role, instruction) = wf.first_in(Some(&store.engine_state().templates))?;
        return Ok(ForkState::Idle { role, instruction });
    }
    let state = match store.get(&node)? {
        Some(Blob::State(s)) => s,
        Some(_) => {
            return Err(ThreadError::WrongKind {
                hash: node,
                expected: "state",
            }
            .into());
        }
        None => return Err(ThreadError::MissingNode { hash: node }.into()),
    };
    if state.role == END_ROLE {
        return Err(ThreadError::ForkAtEnd {
            thread: record.id,
            node,
        }
        .into());
    }
    match wf.route_in(
        Some(&store.engine_state().templates),
        &state.role,
        &state.meta,
    )? {
        Route::Next { role, instruction } => Ok(ForkState::Idle { role, instruction }),
        Route::Suspend { role, message } => Ok(ForkState::Suspended { role, message }),
        Route::End { .. } => Err(EngineError::ForkAfterEnd {
            thread: record.id,
            node,
        }),
    }
}

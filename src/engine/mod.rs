//! The synchronous workflow engine: starting threads of registered
//! workflows, stepping them with agents, routing, suspend and resume,
//! child workflows, compaction, cancel and forks that compute their state
//! from the pinned workflow.

pub mod agent;
pub mod batch;
mod cancel;
mod child;
pub mod claim;
mod compact;
mod drive;
pub mod extract;
pub mod prompt;
pub(crate) mod state;

pub use cancel::Cancel;
pub use drive::{CancelOptions, DriveOptions, DriveReport, StepResult};

use crate::hash::Hash;
use crate::node::Blob;
use crate::store::{Store, StoreError};
use crate::thread::{END_ROLE, NewThread, Next, ThreadError, ThreadId, ThreadRecord};
use crate::workflow::{Workflow, WorkflowError};

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
        /// What went wrong (as recorded in `last_error`).
        message: String,
        /// The cause (an [`agent::AgentError`], an
        /// [`extract::ExtractError`], a [`WorkflowError`], or a child
        /// thread's [`EngineError`]), when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
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
    /// No agent spec was given and none is stored on the thread.
    #[error("thread {thread} has no agent: pass --agent script:FILE or --agent 'cmd:PROGRAM ARGS'")]
    NoAgent {
        /// The thread.
        thread: ThreadId,
    },
    /// A batch was given prompts but no agent to drive them.
    #[error("a batch needs at least one agent (one per driver thread)")]
    NoAgents,
    /// The drive's [`Cancel`] token was cancelled (for the CLI: Ctrl-C):
    /// no new drive, claim or agent starts under it, and a step whose agent
    /// was killed records nothing.
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

/// How to start a thread of a workflow ([`Store::start_workflow`],
/// [`Store::run_workflow`]).
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// An agent spec stored on the thread (so later drives reuse it).
    pub agent_spec: Option<String>,
    /// Loop protection (default: the workflow's `maxRounds`).
    pub max_rounds: Option<u32>,
    /// The token the drive of [`Store::run_workflow`] runs under (starting
    /// alone runs nothing and ignores it).
    pub cancel: Cancel,
}

impl Store {
    /// Starts a thread of a registered workflow (or one already stored, by
    /// hash) with the task `prompt`; it is `idle` with the first role.
    pub fn start_workflow(
        &self,
        workflow: Hash,
        prompt: &str,
        options: &StartOptions,
    ) -> Result<ThreadRecord, EngineError> {
        let new = self.top_level_thread(workflow, prompt, options)?;
        Ok(self.low_level().start_thread(new)?)
    }

    /// Starts a thread and drives it until it ends or suspends (what
    /// `uwf-db run` does): the thread is created already claimed, so the
    /// drive costs no separate claim commit. An error before the thread
    /// exists is `Err`; a failure of a step is in the report.
    pub fn run_workflow(
        &self,
        workflow: Hash,
        prompt: &str,
        options: &StartOptions,
        agent: &mut dyn agent::Agent,
    ) -> Result<(ThreadRecord, DriveReport), EngineError> {
        let new = self.top_level_thread(workflow, prompt, options)?;
        let id = ThreadId::generate();
        let claim = self.claim_new(id, &options.cancel)?;
        let record = self.low_level().start_thread_as(new, id, true)?;
        let mut outcome = self.run_thread(id, usize::MAX, agent, &options.cancel);
        match outcome.results.last() {
            Some(last) if outcome.error.is_none() && last.current_role.is_none() => {
                claim.released_by_commit();
            }
            _ => {
                if let Err(e) = claim.release()
                    && outcome.error.is_none()
                {
                    outcome.error = Some(e);
                }
            }
        }
        Ok((record, outcome))
    }

    /// The agent to drive thread `id` with, and its spec: `spec` when given,
    /// else the one stored on the thread, else [`EngineError::NoAgent`]. The
    /// agent is built here, so a spec that does not work fails before
    /// anything is stored; give the spec as [`DriveOptions::agent_spec`] to
    /// store it on the thread.
    pub fn agent_for(
        &self,
        id: ThreadId,
        spec: Option<&str>,
        options: &agent::AgentOptions,
    ) -> Result<(Box<dyn agent::Agent>, String), EngineError> {
        let spec = match spec {
            Some(s) => s.to_owned(),
            None => self
                .thread(id)?
                .ok_or_else(|| ThreadError::Unknown(id.to_string()))?
                .agent
                .ok_or(EngineError::NoAgent { thread: id })?,
        };
        let agent = self.build_agent(&spec, options)?;
        Ok((agent, spec))
    }

    /// Builds the agent a spec names (`script:FILE` or `cmd:PROGRAM ARGS`),
    /// with this store's directory as a `cmd:` program's `UWF_STORE`.
    pub fn build_agent(
        &self,
        spec: &str,
        options: &agent::AgentOptions,
    ) -> Result<Box<dyn agent::Agent>, EngineError> {
        let options = agent::AgentOptions {
            store: self.path().to_path_buf(),
            ..options.clone()
        };
        Ok(agent::AgentSpec::parse(spec)?.build(&options)?)
    }

    /// A top-level thread of a stored workflow, idle with its first role.
    fn top_level_thread(
        &self,
        workflow: Hash,
        prompt: &str,
        options: &StartOptions,
    ) -> Result<NewThread, EngineError> {
        let wf = self.load_workflow(workflow)?;
        let (role, instruction) = wf.first_in(Some(&self.engine_state().templates))?;
        Ok(NewThread {
            workflow: wf.name.clone(),
            workflow_hash: workflow,
            prompt: prompt.to_owned(),
            max_rounds: options.max_rounds.unwrap_or(wf.max_rounds),
            depth: 0,
            parent_state: None,
            parent_thread: None,
            next_role: role,
            next_instruction: instruction,
            agent: options.agent_spec.clone(),
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
        Ok(self.low_level().fork_thread(source, node, state)?)
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
) -> Result<Next, EngineError> {
    if node == record.start {
        let (role, instruction) = wf.first_in(Some(&store.engine_state().templates))?;
        return Ok(Next::Role { role, instruction });
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
        Next::End(_) => Err(EngineError::ForkAfterEnd {
            thread: record.id,
            node,
        }),
        next => Ok(next),
    }
}

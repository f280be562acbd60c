//! The engine's errors: [`EngineError`] and the typed cause of a failed
//! step, [`StepFailure`].

use super::{agent, extract};
use crate::hash::Hash;
use crate::store::StoreError;
use crate::thread::{ThreadError, ThreadId};
use crate::workflow::WorkflowError;

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
    /// was committed; the failure's text is recorded as the thread's
    /// `last_error`.
    #[error("step of thread {thread} failed: {cause}")]
    StepFailed {
        /// The thread.
        thread: ThreadId,
        /// What went wrong.
        #[source]
        cause: StepFailure,
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
    /// `thread stop` of a thread no live driver holds.
    #[error("thread {thread} is {status}, not being driven: there is nothing to stop")]
    NotRunning {
        /// The thread.
        thread: ThreadId,
        /// Its status (under a dead driver's claim: the status underneath).
        status: crate::thread::ThreadStatus,
    },
    /// An ended thread cannot be cancelled.
    #[error("thread {thread} has already ended ({status}): there is nothing to cancel")]
    AlreadyEnded {
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
        "thread {thread} is a child workflow suspended inside thread {parent}: resume the parent, which resumes it"
    )]
    ResumeThroughParent {
        /// The child.
        thread: ThreadId,
        /// The parent to resume.
        parent: ThreadId,
    },
    /// No agent spec was given and none is stored on the thread.
    #[error(
        "thread {thread} has no agent: none was given and none is stored on the thread (an imported thread keeps none unless imported with --trust-agents); name one with --agent script:FILE or --agent 'cmd:PROGRAM ARGS'"
    )]
    NoAgent {
        /// The thread.
        thread: ThreadId,
    },
    /// A batch asked for more threads than [`batch::MAX_BATCH_THREADS`](super::batch::MAX_BATCH_THREADS).
    #[error("a batch starts at most {max} threads; {count} were asked for")]
    TooManyThreads {
        /// The count asked for.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A batch was given prompts but no agent to drive them.
    #[error("a batch needs at least one agent (one per driver thread)")]
    NoAgents,
    /// The drive's [`Cancel`](super::Cancel) token was cancelled (for the CLI: SIGINT, SIGTERM or SIGHUP):
    /// no new drive, claim or agent starts under it, and a step whose agent
    /// was killed records nothing.
    #[error("interrupted")]
    Interrupted,
    /// A fan-out step stopped before its join because it was asked to
    /// (`thread stop` of the parent, or a graceful stop): its children
    /// stay as they are and the next drive goes on with them.
    #[error(
        "thread {thread}: the fan-out stopped before its join, as asked; its children wait for the next drive"
    )]
    FanOutStopped {
        /// The parent thread.
        thread: ThreadId,
    },
    /// Another live driver holds the thread.
    #[error(
        "thread {thread} is being driven by another process; wait for it, or stop that driver (a driver that died is taken over automatically)"
    )]
    Claimed {
        /// The thread.
        thread: ThreadId,
    },
    /// `thread rm` of a thread a live driver holds.
    #[error("thread {thread} is being driven by another process; stop that driver first")]
    RemoveDriven {
        /// The thread.
        thread: ThreadId,
    },
    /// An agent spec could not be used.
    #[error(transparent)]
    Agent(#[from] agent::AgentError),
    /// No step of that role on the chain.
    #[error("thread {thread} has no step of role '{role}' ({})", roles_that_ran(.ran))]
    NoSuchStep {
        /// The thread.
        thread: ThreadId,
        /// The role.
        role: String,
        /// The roles that did run on the chain, in the order each first ran.
        ran: Vec<String>,
    },
}

/// Why a step failed: the cause of [`EngineError::StepFailed`], typed so a
/// caller can tell an agent's failure from an invalid reply or a workflow
/// that routes nowhere without reading the text. Its text is what the
/// thread's `last_error` records.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StepFailure {
    /// The agent's call failed (its program exited non-zero, timed out,
    /// wrote too much; a Rust agent returned an error).
    #[error("agent failed on role '{role}': {source}")]
    Agent {
        /// The role it was called for.
        role: String,
        /// What the agent reported.
        source: agent::AgentError,
    },
    /// The reply stayed invalid after every re-ask (frontmatter, schema).
    #[error("invalid reply from role '{role}': {source}")]
    InvalidReply {
        /// The role that replied.
        role: String,
        /// What is wrong with the reply.
        source: extract::ExtractError,
    },
    /// The workflow could not route the reply (an unknown status, a
    /// template that failed).
    #[error("{0}")]
    Route(#[source] WorkflowError),
    /// The role to run is not in the thread's workflow.
    #[error("role '{role}' is not in workflow '{workflow}'")]
    UnknownRole {
        /// The role.
        role: String,
        /// The workflow's name.
        workflow: String,
    },
    /// The directory the step's agent would work in does not exist.
    #[error("directory '{}' does not exist ({what})", dir.display())]
    MissingDirectory {
        /// The directory.
        dir: std::path::PathBuf,
        /// Where it came from (the thread's cwd, or an edge's location).
        what: String,
    },
    /// The reply names an artifact the store does not hold.
    #[error("role '{role}' referred to artifact {missing}, which is not in the store")]
    MissingArtifact {
        /// The role that replied.
        role: String,
        /// The artifact's hash.
        missing: Hash,
    },
    /// A child-workflow role cannot be the first step of a resumed
    /// ended thread.
    #[error(
        "role '{role}' runs child workflows and cannot be the first step of a resumed ended thread"
    )]
    ChildOnResumedEnd {
        /// The role.
        role: String,
    },
    /// Starting the child would nest workflows deeper than the limit.
    #[error(
        "role '{role}' would nest workflow '{workflow}' at depth {depth}; the limit is {limit}"
    )]
    TooDeep {
        /// The role.
        role: String,
        /// The child workflow.
        workflow: String,
        /// The depth the child would have.
        depth: u32,
        /// The limit.
        limit: u32,
    },
    /// The role's child workflow is not registered.
    #[error("child workflow '{workflow}' of role '{role}' is not registered")]
    ChildNotRegistered {
        /// The child workflow's name.
        workflow: String,
        /// The role.
        role: String,
    },
    /// Driving the child thread failed.
    #[error("child workflow thread {child}: {source}")]
    Child {
        /// The child thread.
        child: ThreadId,
        /// Its error.
        source: Box<EngineError>,
    },
    /// A fan-out role's list of items is missing, not a list, or longer
    /// than its `max_items`.
    #[error("fan-out role '{role}': {detail}")]
    FanOutItems {
        /// The role.
        role: String,
        /// What is wrong.
        detail: String,
    },
    /// More children of a fan-out role failed than its join tolerates, and
    /// some failed with an error a retry may mend: the join is not written
    /// and the next drive goes on with the same children.
    #[error(
        "fan-out role '{role}': {failed} children failed, more than the {tolerate} its join tolerates; child {child}: {error}"
    )]
    FanOut {
        /// The role.
        role: String,
        /// Children that failed.
        failed: usize,
        /// Failures the join tolerates.
        tolerate: u32,
        /// A child that failed with an error (or is held by another driver).
        child: ThreadId,
        /// Its error.
        error: String,
    },
    /// Every attempt the step's retry policy allowed failed (SPEC §13):
    /// the last failure, with how many attempts were made and why each
    /// earlier one failed.
    #[error("after {attempts} attempts ({}): {last}", causes_text(.causes))]
    Retried {
        /// Attempts made, the last one included.
        attempts: u32,
        /// Why each earlier attempt failed, in order.
        causes: Vec<crate::workflow::RetryOn>,
        /// The last attempt's failure.
        #[source]
        last: Box<StepFailure>,
    },
    /// The child thread stopped in a status its parent cannot go on from.
    #[error("child workflow thread {child} stopped while {status}")]
    ChildStopped {
        /// The child thread.
        child: ThreadId,
        /// Its status.
        status: crate::thread::ThreadStatus,
    },
}
impl EngineError {
    /// Whether the error says the store's data file is damaged
    /// ([`StoreError::is_damage`]), at whatever layer it was met: the CLI
    /// exits 3 for these.
    pub fn is_damage(&self) -> bool {
        match self {
            EngineError::Store(e) => e.is_damage(),
            EngineError::Thread(e) => e.is_damage(),
            EngineError::Workflow(e) => e.is_damage(),
            _ => false,
        }
    }

    /// Whether the store has no room left ([`StoreError::is_full`]): a
    /// batch starts no new thread after this error.
    pub fn is_store_full(&self) -> bool {
        match self {
            EngineError::Store(e) | EngineError::Thread(ThreadError::Store(e)) => e.is_full(),
            _ => false,
        }
    }
}

/// `Retried`'s causes: `earlier: exit, timeout`.
fn causes_text(causes: &[crate::workflow::RetryOn]) -> String {
    let words: Vec<&str> = causes.iter().map(|c| c.as_str()).collect();
    format!("earlier: {}", words.join(", "))
}

/// `NoSuchStep`'s list of the roles a thread did run.
fn roles_that_ran(ran: &[String]) -> String {
    if ran.is_empty() {
        "no role has run on it yet".to_owned()
    } else {
        format!("roles that ran: {}", ran.join(", "))
    }
}

impl From<crate::backend::BackendError> for EngineError {
    fn from(e: crate::backend::BackendError) -> Self {
        EngineError::Store(e.into())
    }
}

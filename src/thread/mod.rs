//! Threads: records in the active index and the date-partitioned history,
//! compare-and-swap appends, ends, forks, history paging, the Merkle call
//! stack and compaction. The database layouts are in `docs/design.md`.
//!
//! Every function that changes a thread runs in one write transaction and
//! checks the head the caller expects (compare-and-swap), so two writers
//! racing on one thread cannot both commit.

mod chain;
mod check;
mod edit;
mod fork;
pub(crate) mod index;
pub(crate) mod labels;
mod prune;
mod read;
mod write;
mod writes;

pub use crate::record::id::{IdPrefix, MIN_ID_PREFIX_LEN, ParseIdError, ThreadId};
pub(crate) use crate::record::thread as record;
pub use chain::{Context, Frame, LogEntry};
pub(crate) use check::check_against_chain;
pub use labels::{
    LabelError, Labels, MAX_LABEL_KEY, MAX_LABEL_VALUE, MAX_LABELS, check_key, check_label,
    check_labels, parse_label,
};
pub use prune::{PruneReport, RetentionPolicy};
pub use read::{ActivityCursor, Fork, HistoryPage, ParseCursorError, ThreadQuery, ThreadTree};
pub use record::{ForkOrigin, ThreadRecord, ThreadStatus, utc_day};
pub use write::{LowLevel, MAX_LAST_ERROR};
pub use writes::{EndSpec, JOIN_META, NewThread, Next, StepWrite, Written};

use crate::codec::CodecError;
use crate::hash::Hash;
use crate::store::{Store, StoreError};

/// The thread layer of one store: reads (records, lists, logs, history,
/// the call stack, context) and the edits a user makes (labels, staged
/// compaction, unlinking, retention), each one transaction. A cheap
/// borrow: get one with [`Store::threads`] whenever needed.
///
/// Driving threads (starting, stepping, resuming, stopping) is the
/// engine's job ([`Engine`](crate::engine::Engine)); raw record writes
/// below the engine are on [`LowLevel`], from [`Threads::low_level`].
///
/// ```
/// let store = uwf_db::Store::memory();
/// let threads = store.threads();
/// assert!(threads.list(&uwf_db::thread::ThreadQuery::default())?.is_empty());
/// # Ok::<(), uwf_db::thread::ThreadError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Threads<'s> {
    store: &'s Store,
}

impl<'s> Threads<'s> {
    /// The thread layer of `store` (the same as [`Store::threads`]).
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// let threads = uwf_db::Threads::new(&store);
    /// assert!(threads.list(&Default::default())?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(store: &'s Store) -> Threads<'s> {
        Threads { store }
    }

    /// The store these threads live in.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// assert!(store.threads().store().same_store(&store));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn store(&self) -> &'s Store {
        self.store
    }
}

impl Store {
    /// The thread layer of this store: see [`Threads`].
    ///
    /// ```
    /// let store = uwf_db::Store::memory();
    /// let id = uwf_db::thread::ThreadId::generate();
    /// assert!(store.threads().get(id)?.is_none());
    /// # Ok::<(), uwf_db::thread::ThreadError>(())
    /// ```
    pub fn threads(&self) -> Threads<'_> {
        Threads::new(self)
    }
}

/// Role name of end nodes.
pub const END_ROLE: &str = "__end__";

/// Most entries in a state node's `ancestors`: the parent and 10 more.
pub const MAX_ANCESTORS: usize = 11;

/// What went wrong with a thread operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ThreadError {
    /// A storage failure.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No thread has this id or prefix.
    #[error("no thread matches '{0}'")]
    Unknown(String),
    /// More than one thread has this prefix.
    #[error("'{prefix}' is ambiguous: it matches {}; give more characters",
        candidates.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    Ambiguous {
        /// The prefix given.
        prefix: String,
        /// Some of the matching ids.
        candidates: Vec<ThreadId>,
    },
    /// A thread was to be made with an id (given by the caller) that a
    /// thread already has.
    #[error("a thread {0} exists already; nothing was written")]
    IdTaken(ThreadId),
    /// The head moved since the caller read it.
    #[error(
        "thread {thread} changed: expected head {expected}, found {actual}; nothing was written"
    )]
    Conflict {
        /// The thread.
        thread: ThreadId,
        /// The head the caller expected.
        expected: Hash,
        /// The head found.
        actual: Hash,
    },
    /// A fan-out's parent names another number of children than the
    /// caller expected: another driver made some meanwhile.
    #[error(
        "thread {thread} names {actual} fan-out children, not the {expected} expected (another driver is making them); nothing was written"
    )]
    ChildrenConflict {
        /// The parent.
        thread: ThreadId,
        /// The children the caller expected it to name.
        expected: usize,
        /// The children it names.
        actual: usize,
    },
    /// The operation does not apply to the thread's status.
    #[error("thread {thread} is {status}: cannot {action}")]
    WrongStatus {
        /// The thread.
        thread: ThreadId,
        /// Its status.
        status: ThreadStatus,
        /// What was attempted.
        action: &'static str,
    },
    /// A node that is not on the thread's chain.
    #[error("node {node} is not on the chain of thread {thread}")]
    NotOnChain {
        /// The node given.
        node: Hash,
        /// The thread.
        thread: ThreadId,
    },
    /// Forking at an end node.
    #[error("cannot fork thread {thread} at its end node {node}: resume the thread instead")]
    ForkAtEnd {
        /// The thread.
        thread: ThreadId,
        /// The end node.
        node: Hash,
    },
    /// A fork was asked to start in an end state ([`Next::End`]).
    #[error(
        "a fork of thread {thread} at {node} cannot start ended: fork at an earlier step, or resume the thread"
    )]
    ForkIntoEnd {
        /// The thread.
        thread: ThreadId,
        /// The node.
        node: Hash,
    },
    /// Forking a thread suspended inside a child workflow.
    #[error(
        "cannot fork thread {thread}: it is suspended inside child workflow thread {child}; resume it first"
    )]
    ForkInsideChild {
        /// The thread.
        thread: ThreadId,
        /// The suspended child.
        child: ThreadId,
    },
    /// A node of the wrong kind where a chain node was expected.
    #[error("blob {hash} is not a {expected} node")]
    WrongKind {
        /// The blob.
        hash: Hash,
        /// What was expected.
        expected: &'static str,
    },
    /// A blob the chain needs is not stored.
    #[error("blob {hash} is missing from the store; run `uwf-db verify`")]
    MissingNode {
        /// The blob.
        hash: Hash,
    },
    /// A thread record cannot be decoded.
    #[error("the record of thread {thread} is corrupt: {detail}; run `uwf-db verify`")]
    CorruptRecord {
        /// The thread.
        thread: String,
        /// The decoder's error.
        detail: String,
    },
    /// A retention policy without any condition (it would unlink every
    /// ended thread).
    #[error(
        "a retention policy needs at least one condition (--older-than, --keep-latest, --status, --workflow or --label): without one it would prune every ended thread"
    )]
    EmptyRetention,
    /// A retention policy naming a status that is not an ended one.
    #[error(
        "prune never touches {0} threads: --status takes ended statuses only (completed, failed, cancelled)"
    )]
    RetentionStatus(ThreadStatus),
    /// A label that is not valid.
    #[error(transparent)]
    Label(#[from] LabelError),
    /// The stored retention policy cannot be read.
    #[error(
        "the stored retention policy is unreadable: {0}; store a new one with `uwf-db prune --set`"
    )]
    BadRetention(String),
}

impl ThreadError {
    /// Whether the error says the store's data file is damaged
    /// ([`StoreError::is_damage`]).
    pub fn is_damage(&self) -> bool {
        matches!(self, ThreadError::Store(e) if e.is_damage())
    }
}

impl From<crate::backend::BackendError> for ThreadError {
    fn from(e: crate::backend::BackendError) -> Self {
        ThreadError::Store(e.into())
    }
}

impl From<CodecError> for ThreadError {
    fn from(e: CodecError) -> Self {
        ThreadError::Store(StoreError::Codec(e))
    }
}

//! What can go wrong in the store, whatever the backend.

use std::path::PathBuf;
use std::sync::Arc;

pub use crate::backend::BackendError;
use crate::codec::CodecError;
use crate::hash::Hash;
use crate::store::record::RecordError;

/// Why a stored blob cannot be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Damage {
    /// The record's header is malformed.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// The canonical bytes do not decode.
    #[error(transparent)]
    Encoding(#[from] CodecError),
}

/// What went wrong opening a store ([`Store::open`](crate::Store::open),
/// [`Store::open_location`](crate::Store::open_location)): the store's own
/// reasons, and the backend's (no store there, a newer format, a damaged
/// or planted file, a server that refuses).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The store is open in this process with different options.
    #[error(
        "the store at {path} is already open in this process with {existing}; requested {requested}"
    )]
    OptionsConflict {
        /// The store directory.
        path: PathBuf,
        /// The options in force.
        existing: String,
        /// The options requested.
        requested: String,
    },
    /// A `postgres://` store was named but this build has no PostgreSQL
    /// support (the `postgres` cargo feature is off).
    #[error(
        "{location} is a PostgreSQL store, but this build of uwf-db has no PostgreSQL support (the `postgres` feature)"
    )]
    NoPostgres {
        /// The URL given.
        location: String,
    },
    /// The backend could not open the store.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl OpenError {
    /// Whether the store's data file is damaged
    /// ([`BackendError::is_damage`]).
    pub fn is_damage(&self) -> bool {
        matches!(self, OpenError::Backend(b) if b.is_damage())
    }

    /// Whether the server connection was lost while opening.
    pub fn is_connection_lost(&self) -> bool {
        matches!(self, OpenError::Backend(b) if b.is_connection_lost())
    }
}

impl From<OpenError> for StoreError {
    /// A backend's open error stays a [`StoreError::Backend`] (the same
    /// words, the same `is_damage`); the store's own open errors are kept
    /// whole in [`StoreError::Open`].
    fn from(e: OpenError) -> StoreError {
        match e {
            OpenError::Backend(b) => StoreError::Backend(b),
            other => StoreError::Open(Box::new(other)),
        }
    }
}

/// What went wrong in the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A blob refers to a blob that is not stored.
    #[error("blob {blob} refers to {missing}, which is not in the store; nothing was written")]
    MissingRef {
        /// The blob being written.
        blob: Hash,
        /// The missing target.
        missing: Hash,
    },
    /// No blob has this hash or prefix.
    #[error("no blob matches '{prefix}'")]
    UnknownHash {
        /// The hash or prefix given.
        prefix: String,
    },
    /// More than one blob has this prefix.
    #[error("'{prefix}' is ambiguous: it matches {}{}; give more characters",
        candidates.iter().map(|h| h.short(16)).collect::<Vec<_>>().join(", "),
        if *truncated { ", …" } else { "" })]
    AmbiguousPrefix {
        /// The prefix given.
        prefix: String,
        /// Some of the matching hashes.
        candidates: Vec<Hash>,
        /// Whether more matched than are listed.
        truncated: bool,
    },
    /// A stored blob is damaged.
    #[error("blob {hash} is corrupt: {source}; run `uwf-db verify`")]
    Corrupt {
        /// The blob's key.
        hash: Hash,
        /// What is wrong.
        source: Damage,
    },
    /// A blob could not be encoded.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// The group-commit writer is gone (its handle outlived
    /// [`Store::group_commit`](crate::Store::group_commit)).
    #[error("the group-commit writer has stopped; nothing was written")]
    GroupStopped,
    /// A group commit failed; every write in the group was discarded.
    #[error("a group commit failed and nothing of the group was stored: {source}")]
    GroupCommit {
        /// The failure, shared by every request of the group.
        source: Arc<StoreError>,
    },
    /// Opening a store failed (what [`OpenError`] says; an open error of
    /// the backend itself converts to [`StoreError::Backend`]).
    #[error(transparent)]
    Open(Box<OpenError>),
    /// The backend failed (an open, a page, the disk, the server).
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl StoreError {
    /// Whether the error says a server connection was lost (PostgreSQL:
    /// closed, terminated, the server shutting down): the transaction in
    /// flight is over, and the same operation on a new connection may
    /// succeed.
    pub fn is_connection_lost(&self) -> bool {
        matches!(self, StoreError::Backend(b) if b.is_connection_lost())
    }

    /// Whether the error says the store's data file is damaged
    /// ([`BackendError::is_damage`]): the CLI exits 3 for these.
    pub fn is_damage(&self) -> bool {
        match self {
            StoreError::Backend(b) => b.is_damage(),
            StoreError::Open(o) => o.is_damage(),
            _ => false,
        }
    }

    /// Whether the store has no room left (its maximum map size or its
    /// disk): every further write fails the same way until the limit is
    /// raised or space is freed.
    ///
    /// ```
    /// use std::path::PathBuf;
    /// use uwf_db::StoreError;
    /// use uwf_db::backend::BackendError;
    /// let full = StoreError::from(BackendError::MapFull { path: PathBuf::from("s"), map_size: 1 << 20 });
    /// assert!(full.is_full());
    /// assert!(!StoreError::from(BackendError::NotInitialized { path: PathBuf::from("s") }).is_full());
    /// ```
    pub fn is_full(&self) -> bool {
        matches!(self, StoreError::Backend(b) if b.is_full())
    }

    /// The error again, for each request of a failed group: the kinds a
    /// caller acts on (a full disk or map) are kept; others become
    /// [`StoreError::GroupCommit`] sharing the error as their source.
    pub(crate) fn for_each_request(self: &Arc<Self>) -> StoreError {
        match &**self {
            StoreError::Backend(BackendError::DiskFull { path }) => {
                BackendError::DiskFull { path: path.clone() }.into()
            }
            StoreError::Backend(BackendError::MapFull { path, map_size }) => {
                BackendError::MapFull {
                    path: path.clone(),
                    map_size: *map_size,
                }
                .into()
            }
            StoreError::Backend(BackendError::MapResized { path }) => {
                BackendError::MapResized { path: path.clone() }.into()
            }
            StoreError::GroupStopped => StoreError::GroupStopped,
            _ => StoreError::GroupCommit {
                source: Arc::clone(self),
            },
        }
    }
}

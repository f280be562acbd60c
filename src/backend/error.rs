//! What can go wrong below the store: opening, reading and writing the
//! backend's tables (LMDB's pages, map and disk; PostgreSQL's server and
//! connections), and its locks.

use std::path::PathBuf;

use super::format::FORMAT_VERSION;

/// What went wrong in a backend. The store wraps it
/// ([`StoreError::Backend`](crate::StoreError::Backend)) and says it in the
/// same words.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// Reading a store that does not exist.
    #[error("no uwf-db store at {path}: run `uwf-db init` to create one")]
    NotInitialized {
        /// The directory that was given.
        path: PathBuf,
    },
    /// The store was written by a format this build does not read.
    #[error(
        "the store at {path} has format version {found}; this build reads version {FORMAT_VERSION} only"
    )]
    UnsupportedFormat {
        /// The store directory.
        path: PathBuf,
        /// The version found.
        found: u32,
    },
    /// The store has data but no format version.
    #[error("the store at {path} has no valid format version: {detail}")]
    MissingFormat {
        /// The store directory.
        path: PathBuf,
        /// What was found.
        detail: String,
    },
    /// The configured maximum map size was reached.
    #[error(
        "the store at {path} is full: it reached its maximum size of {map_size} bytes; nothing of \
         this write was stored. Raise the limit (--max-map-size or UWF_MAX_MAP_SIZE) and retry"
    )]
    MapFull {
        /// The store directory.
        path: PathBuf,
        /// The map size in force.
        map_size: u64,
    },
    /// The maximum map size asked for cannot be mapped on this platform.
    #[error(
        "cannot reserve {requested} bytes of address space for the store at {path}: the largest \
         maximum accepted is {max} bytes, and the system may grant less. Lower the limit \
         (--max-map-size or UWF_MAX_MAP_SIZE)"
    )]
    MapTooLarge {
        /// The store directory.
        path: PathBuf,
        /// The maximum size asked for.
        requested: u64,
        /// The largest maximum this build accepts ([`crate::store::MAX_MAP_SIZE`]).
        max: u64,
    },
    /// The disk is full (or a quota was reached).
    #[error(
        "no space left on the disk holding {path}: the write was not committed and the store is \
         unchanged; free space and retry"
    )]
    DiskFull {
        /// The store directory.
        path: PathBuf,
    },
    /// Another process grew the map past this process's map size.
    #[error(
        "another process grew the store at {path} beyond this process's map size; reopen the store"
    )]
    MapResized {
        /// The store directory.
        path: PathBuf,
    },
    /// All reader slots are taken.
    #[error("all {max} reader slots of the store at {path} are in use")]
    ReadersFull {
        /// The store directory.
        path: PathBuf,
        /// The reader limit.
        max: u32,
    },
    /// The LMDB data file is damaged in a way that opening it would turn
    /// into a crash (a file shorter than its own meta page says, say):
    /// refused before it is mapped.
    #[error(
        "the data file {path} is damaged: {detail}; nothing was read or changed. `uwf-db salvage` copies what can still be read into a new store; or restore the store from a backup or an `uwf-db copy` of it"
    )]
    DamagedDataFile {
        /// The data file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// A write to a store opened read-only: its file system is read-only,
    /// or this user may read its files but not write them. Reads work.
    #[error(
        "cannot {op}: the store {path} is open read-only ({reason}); reading commands work, writing ones need a store this user may write"
    )]
    ReadOnly {
        /// The store.
        path: PathBuf,
        /// What was refused.
        op: String,
        /// Why the store is read-only here.
        reason: String,
    },
    /// A file of the store that is not what the store itself would have
    /// made: a symbolic link, not a regular file, or another user's.
    /// Opening it would let whoever planted it choose what the store
    /// reads, or which file LMDB overwrites.
    #[error(
        "refusing to open the store: {}; a store's files are never followed through links, and are regular files of the user who opens the store. Remove what you did not put there",
        files.join("; ")
    )]
    PlantedFile {
        /// Each file found, as its path and what it is ("… is a symbolic
        /// link to …").
        files: Vec<String>,
    },
    /// LMDB found a page of the data file it cannot use (`MDB_CORRUPTED`,
    /// `MDB_PAGE_NOTFOUND`), or returned a value longer than the whole
    /// map: the file was damaged on disk. LMDB keeps no page checksums,
    /// so damage is found only where it breaks the tree's structure.
    #[error(
        "the data file {path} is damaged: {detail} while {op}; nothing was changed. `uwf-db verify` lists what can still be read; `uwf-db salvage` copies it into a new store"
    )]
    DamagedPage {
        /// The data file.
        path: PathBuf,
        /// What was being done.
        op: String,
        /// What LMDB said, or what was wrong.
        detail: String,
    },
    /// Creating the store directory failed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The backend could not serialize this transaction with a concurrent
    /// one; nothing of it was applied. [`crate::Store::write`] retries a
    /// few times before reporting it.
    #[error(
        "the store could not serialize a transaction with a concurrent one (nothing was applied): {detail}"
    )]
    Serialization {
        /// The backend's message.
        detail: String,
    },
    /// A read begun with [`crate::backend::Backend::begin_read_once`]
    /// needed a second statement; the store runs it again in a read
    /// transaction, so callers of the store never see this.
    #[error("a one-statement read needed another statement (it runs again in a transaction)")]
    NeedsTransaction,
    /// A PostgreSQL statement or connection failed; the transaction in
    /// flight was not applied.
    #[cfg(feature = "postgres")]
    #[error("PostgreSQL error while {op} in {location}: {detail}")]
    Postgres {
        /// What was being done.
        op: String,
        /// The store (its URL, password hidden).
        location: String,
        /// What the server said (severity, SQLSTATE, message, detail and
        /// hint), or that the connection was lost or could not be made, and
        /// what became of the transaction in flight.
        detail: String,
        /// The cause.
        source: postgres::Error,
    },
    /// Every connection this process may open for transactions
    /// (`--pg-connections`) stayed in use for as long as a caller waits.
    #[error(
        "no free connection to {location}: all {connections} of this process stayed in use for {waited_s} s (raise --pg-connections)"
    )]
    PoolExhausted {
        /// The store.
        location: String,
        /// The bound.
        connections: usize,
        /// How long the caller waited, in seconds.
        waited_s: u64,
    },
    /// A transaction's connection was already given up (after an error).
    #[error(
        "the connection of this transaction to {location} was lost while {op}; nothing of it was applied"
    )]
    ConnectionLost {
        /// The store.
        location: String,
        /// What was being done.
        op: String,
    },
    /// A transaction was committed after one of its statements had
    /// failed (an error its caller did not pass on): the server aborted
    /// it at that statement, so nothing of it was applied.
    #[error(
        "a transaction in {location} was committed after its statement failed while {op}: the server aborted it, and nothing of it was applied"
    )]
    Aborted {
        /// The store.
        location: String,
        /// What the failed statement was doing.
        op: String,
    },
    /// A lock this process held in a server connection (a driver's claim,
    /// the GC lock) was lost with that connection: another runner may
    /// hold it now, so the holder must stop.
    #[error(
        "the lock held in {location} was lost with its connection ({detail}); another runner may have taken over"
    )]
    LockLost {
        /// The store.
        location: String,
        /// Why the connection is gone.
        detail: String,
    },
    /// The database holds a schema newer than this build reads.
    #[error(
        "the store at {location} has schema version {found}; this build reads version {supported} or older: open it with a newer uwf-db"
    )]
    UnsupportedSchema {
        /// The store.
        location: String,
        /// The version found.
        found: i32,
        /// The newest version this build reads.
        supported: i32,
    },
    /// A table of a server backend does not have the columns this build
    /// expects (it was changed by hand).
    #[error("the table {table} does not have the expected columns: {detail}")]
    BadSchema {
        /// The table.
        table: &'static str,
        /// What did not match.
        detail: String,
    },
    /// A thread record written to (or, by a schema migration, read from) a
    /// PostgreSQL thread table does not decode, so the backend cannot fill
    /// the table's typed columns; nothing of the transaction is applied.
    #[error(
        "the thread record of {thread} in {table} does not decode, so its typed columns cannot be filled: {detail}"
    )]
    UndecodableRecord {
        /// The table (`uwf_threads` or `uwf_history`).
        table: &'static str,
        /// The thread its key names (or the key in hex).
        thread: String,
        /// What is wrong with the record.
        detail: String,
    },
    /// Any other LMDB failure.
    #[error("LMDB error while {op} in {path}: {source}")]
    Lmdb {
        /// What was being done.
        op: String,
        /// The store directory.
        path: PathBuf,
        /// The cause.
        source: heed::Error,
    },
}

impl BackendError {
    /// Whether a server connection was lost (PostgreSQL: closed,
    /// terminated, the server shutting down): the transaction in flight is
    /// over, and the same operation on a new connection may succeed.
    pub fn is_connection_lost(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            BackendError::Postgres { source, .. } => super::postgres::connection_lost(source),
            BackendError::ConnectionLost { .. } => true,
            _ => false,
        }
    }

    /// Whether the store's data file is damaged
    /// ([`BackendError::DamagedDataFile`] or [`BackendError::DamagedPage`]).
    pub fn is_damage(&self) -> bool {
        matches!(
            self,
            BackendError::DamagedDataFile { .. } | BackendError::DamagedPage { .. }
        )
    }

    /// Whether the store has no room left (its maximum map size or its
    /// disk).
    pub fn is_full(&self) -> bool {
        matches!(
            self,
            BackendError::MapFull { .. } | BackendError::DiskFull { .. }
        )
    }
}

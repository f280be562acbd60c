//! The storage boundary: what the rest of the crate needs from a storage
//! engine, and nothing more.
//!
//! Everything above this module — blobs and their integrity checks
//! (`store`), threads and their indexes (`thread`), workflows, the engine,
//! batch runs, garbage collection and `verify` — is written once against
//! the traits here. A backend provides:
//!
//! - **Transactions over named tables** ([`Table`]): a read transaction is
//!   one consistent snapshot ([`ReadTables`]); a write transaction
//!   ([`WriteTables`]) sees its own writes and commits all of them or none.
//!   Tables map byte keys to byte values and are ordered by unsigned
//!   byte-wise key comparison (memcmp), so every key layout in
//!   `docs/design.md` sorts as designed.
//! - **Point reads, puts, insert-if-absent, deletes and ordered range
//!   scans**, forwards and backwards. Reads return [`Cow`] bytes, so an
//!   embedded engine (LMDB) hands out borrowed, zero-copy slices of its
//!   map while a client–server engine returns owned rows.
//! - **Locks that die with their holder**: a driver's claim on a thread
//!   ([`Backend::try_lock_claim`]) and the one-collector-at-a-time lock of
//!   garbage collection ([`Backend::try_lock_gc`]).
//!
//! Two backends implement it: [`lmdb`] (the embedded default, a directory)
//! and [`memory`] (tables in memory, owned rows: for tests and throwaway
//! runs, and the proof that nothing above depends on LMDB's borrowed
//! slices).
//!
//! What a backend must guarantee (`docs/design.md` §4b states it in full):
//!
//! - **Isolation**: a write transaction's reads of a thread's record (in
//!   `threads`, `history_ids` or `history`) or a workflow's name, and the
//!   writes that depend on them, never interleave with another writer of
//!   the same record: this is what makes every head move a
//!   compare-and-swap. LMDB runs one writer at a time across processes;
//!   PostgreSQL runs writers of different threads in parallel and orders
//!   those of one thread by a lock on its id. Blobs are immutable and
//!   `meta` is written only by exclusive writers
//!   ([`Backend::begin_write_exclusive`]), which no writer interleaves
//!   with. A backend that reports a conflict it cannot order (a deadlock)
//!   says [`BackendError::Serialization`], and the caller re-runs the
//!   whole transaction closure ([`crate::Store::write`] does), so closures
//!   given to a write must have no effect outside the transaction.
//! - **Atomicity and durability**: a commit that returns `Ok` is durable
//!   in the store's [`Durability`] mode; a commit that
//!   fails, or a transaction dropped without commit, leaves no trace. A
//!   lost connection is an error of the transaction in flight (nothing of
//!   it applied) and never half-applies it.
//! - **Conflict** means only what the layer above defines: a
//!   compare-and-swap whose expected head is not the stored one
//!   (`ThreadError::Conflict`), detected by reading the record inside the
//!   write transaction. Backends do not invent conflicts of their own
//!   beyond retryable serialization failures.

mod durability;
mod error;
pub mod format;
pub mod lmdb;
pub mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;

/// Whether a store location names a PostgreSQL database
/// (`postgres://…` or `postgresql://…`) rather than an LMDB directory.
pub fn is_postgres_url(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}

use std::borrow::Cow;
use std::fmt;
use std::ops::Bound;

pub use durability::Durability;
pub use error::BackendError;

/// A named table of a store (`docs/design.md` §4 gives every key and value
/// layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// Settings: the format version, a running GC's epoch. UTF-8 keys.
    Meta,
    /// Hash (32 bytes) → blob record.
    Blobs,
    /// Active thread records, by id (16 bytes).
    Threads,
    /// Ended thread records, by UTC day (u32 BE) then id.
    History,
    /// Id → UTC day (u32 BE) of its `history` entry.
    HistoryIds,
    /// Last activity (u64 BE ms) then id → status, flags, workflow.
    Activity,
    /// Parent id then child id → empty.
    Children,
    /// Workflow name (UTF-8) → hash of its `workflow` blob.
    Workflows,
    /// Hash (32 bytes) → empty: GC roots.
    Pins,
    /// Label key, 0, value, 0, then the `activity` key (last activity,
    /// id) → the `activity` value: `thread list --label`.
    Labels,
}

impl Table {
    /// Every table, in a fixed order.
    pub const ALL: [Table; 10] = [
        Table::Meta,
        Table::Blobs,
        Table::Threads,
        Table::History,
        Table::HistoryIds,
        Table::Activity,
        Table::Children,
        Table::Workflows,
        Table::Pins,
        Table::Labels,
    ];

    /// The table's name (the LMDB database name).
    pub const fn name(self) -> &'static str {
        match self {
            Table::Meta => "meta",
            Table::Blobs => "blobs",
            Table::Threads => "threads",
            Table::History => "history",
            Table::HistoryIds => "history_ids",
            Table::Activity => "activity",
            Table::Children => "children",
            Table::Workflows => "workflows",
            Table::Pins => "pins",
            Table::Labels => "labels",
        }
    }

    /// Position in [`Table::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which way a range scan goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Ascending keys.
    Forward,
    /// Descending keys.
    Reverse,
}

/// A key and its value, borrowed from the transaction or owned.
pub type Entry<'t> = (Cow<'t, [u8]>, Cow<'t, [u8]>);

/// The entries of a range scan, in key order (or reverse key order).
pub type Entries<'t> = Box<dyn Iterator<Item = Result<Entry<'t>, BackendError>> + 't>;

/// The callback of [`ReadTables::visit_range`]: gets each key and value,
/// returns whether to go on.
pub type Visitor<'v> = dyn FnMut(&[u8], &[u8]) -> Result<bool, BackendError> + 'v;

/// Key bounds of a range scan (inclusive, exclusive or open on each side).
#[derive(Debug, Clone, Copy)]
pub struct KeyRange<'k> {
    /// The lower bound.
    pub lower: Bound<&'k [u8]>,
    /// The upper bound.
    pub upper: Bound<&'k [u8]>,
}

impl<'k> KeyRange<'k> {
    /// Every key.
    pub const ALL: KeyRange<'static> = KeyRange {
        lower: Bound::Unbounded,
        upper: Bound::Unbounded,
    };

    /// Keys at or after `lower`.
    pub fn from(lower: &'k [u8]) -> Self {
        KeyRange {
            lower: Bound::Included(lower),
            upper: Bound::Unbounded,
        }
    }

    /// Keys after `key` (exclusive).
    pub fn after(key: &'k [u8]) -> Self {
        KeyRange {
            lower: Bound::Excluded(key),
            upper: Bound::Unbounded,
        }
    }

    /// Keys in `lower..upper` (upper exclusive).
    pub fn between(lower: &'k [u8], upper: &'k [u8]) -> Self {
        KeyRange {
            lower: Bound::Included(lower),
            upper: Bound::Excluded(upper),
        }
    }
}

/// Reads of one transaction (a consistent snapshot).
pub trait ReadTables {
    /// The value under `key`, if any.
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>, BackendError>;

    /// The entries whose keys are in `range`, in `direction`. Backends may
    /// fetch lazily (a client–server backend in pages), so a caller that
    /// stops early pays for what it read.
    fn range(
        &self,
        table: Table,
        range: KeyRange<'_>,
        direction: Direction,
    ) -> Result<Entries<'_>, BackendError>;

    /// Number of entries in `table`.
    fn count(&self, table: Table) -> Result<u64, BackendError>;

    /// A hint: this transaction is about to read these keys. A
    /// client–server backend may fetch them with its first statement
    /// (PostgreSQL sends them with `BEGIN`, in the same round trip) and
    /// answer the `get`s from what it fetched; it may also ignore the
    /// hint (once a transaction has sent anything, PostgreSQL does). The
    /// default does nothing: an embedded engine's reads are cheap.
    fn prefetch(&self, keys: &[(Table, &[u8])]) -> Result<(), BackendError> {
        let _ = keys;
        Ok(())
    }

    /// Whether this transaction's connection to a server was lost (so an
    /// error it gave may be that, and a fresh transaction on a new
    /// connection may succeed). An embedded backend has none to lose.
    fn connection_lost(&self) -> bool {
        false
    }

    /// Whether a statement of this transaction failed with
    /// [`BackendError::Serialization`] (a deadlock between writers, say):
    /// then whatever error the caller got from it, the transaction is over
    /// with nothing applied, and running it again from the start may
    /// succeed. A backend with one writer at a time has none.
    fn serialization_failed(&self) -> bool {
        false
    }

    /// Whether this read, begun by [`Backend::begin_read_once`], needed a
    /// second statement and so was refused: whatever error the caller got
    /// from it, the read may run again in an ordinary read transaction.
    fn needs_transaction(&self) -> bool {
        false
    }

    /// Whether one [`ReadTables::get_many`] of several keys is much cheaper
    /// than a `get` of each (a client–server backend: one round trip
    /// instead of many), so a caller should fetch together what it will
    /// read next. An embedded engine says no (the default): there a batch
    /// only adds allocations, and callers read key by key as they go.
    fn prefers_batches(&self) -> bool {
        false
    }

    /// The values under `keys`, in their order: what a `get` of each
    /// would return, in one round trip on a client–server backend. The
    /// default calls [`ReadTables::get`] for each key.
    fn get_many(
        &self,
        table: Table,
        keys: &[&[u8]],
    ) -> Result<Vec<Option<Cow<'_, [u8]>>>, BackendError> {
        keys.iter().map(|key| self.get(table, key)).collect()
    }

    /// Calls `visit` with each entry of `range` in key order until it
    /// returns `Ok(false)` or an error: what [`ReadTables::range`] gives,
    /// without an iterator object or a per-entry dynamic call, for the long
    /// scans (garbage collection, `verify`). A backend may override it with
    /// a tighter loop; the default walks [`ReadTables::range`].
    fn visit_range(
        &self,
        table: Table,
        range: KeyRange<'_>,
        visit: &mut Visitor<'_>,
    ) -> Result<(), BackendError> {
        for entry in self.range(table, range, Direction::Forward)? {
            let (key, value) = entry?;
            if !visit(&key, &value)? {
                break;
            }
        }
        Ok(())
    }
}

/// A write transaction: reads see its own writes; dropping it without
/// [`WriteTables::commit`] discards every write.
pub trait WriteTables: ReadTables {
    /// Sets `key` to `value`, replacing any value.
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), BackendError>;

    /// Sets `key` to `value` only if `key` is absent. Returns whether it
    /// wrote (`false`: the key exists, nothing was written).
    fn insert(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<bool, BackendError>;

    /// Deletes `key`; returns whether it was there.
    fn delete(&mut self, table: Table, key: &[u8]) -> Result<bool, BackendError>;

    /// Deletes `key` if it is there, without saying whether it was: a
    /// client–server backend may hold it back and send it with the
    /// commit. The default calls [`WriteTables::delete`].
    fn remove(&mut self, table: Table, key: &[u8]) -> Result<(), BackendError> {
        self.delete(table, key).map(|_| ())
    }

    /// Sets `key` to `value` if it is absent; if it is there, applies
    /// `refresh` to the stored value (a content-addressed blob stored
    /// again: only its `touched_at` may move forward). Says neither which
    /// happened, so a client–server backend may hold it back and send it
    /// with the commit (PostgreSQL does the refresh in the statement's
    /// `ON CONFLICT` clause). The default is [`WriteTables::insert`], then
    /// a `get` and a `put` when the refresh changes the stored value.
    fn insert_or_refresh(
        &mut self,
        table: Table,
        key: &[u8],
        value: &[u8],
        refresh: Refresh,
    ) -> Result<(), BackendError> {
        insert_then_refresh(self, table, key, value, refresh)
    }

    /// Commits every write of the transaction, or none of them.
    fn commit(self: Box<Self>) -> Result<(), BackendError>;
}

/// [`WriteTables::insert_or_refresh`] made of the plain operations: an
/// `insert`, then, when the key was there, a `get` and (if the refresh
/// changes the value) a `put`. The trait's default, and what a backend
/// falls back to where it has no held form.
pub fn insert_then_refresh<T: WriteTables + ?Sized>(
    t: &mut T,
    table: Table,
    key: &[u8],
    value: &[u8],
    refresh: Refresh,
) -> Result<(), BackendError> {
    if t.insert(table, key, value)? {
        return Ok(());
    }
    let refreshed = t.get(table, key)?.and_then(|stored| refresh.apply(&stored));
    match refreshed {
        Some(new) => t.put(table, key, &new),
        None => Ok(()),
    }
}

/// How [`WriteTables::insert_or_refresh`] updates a stored value: the
/// 8 bytes at `offset`, a big-endian `u64`, become `stamp` when they are
/// below `below`. A value too short to hold them is left alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refresh {
    /// Where the field starts.
    pub offset: usize,
    /// The field is rewritten only when it is below this.
    pub below: u64,
    /// What it becomes.
    pub stamp: u64,
    /// The refresh must be made by this transaction (a garbage
    /// collection's write barrier, §7). When `false` (a re-put's refresh,
    /// which only restarts a grace period), a backend with concurrent
    /// writers may leave it to another transaction refreshing the same
    /// value at the same time rather than wait for that one.
    pub required: bool,
}

impl Refresh {
    /// The value after the refresh, or `None` when it leaves `value` as
    /// it is.
    pub fn apply(&self, value: &[u8]) -> Option<Vec<u8>> {
        let end = self.offset.checked_add(8)?;
        let field: [u8; 8] = value.get(self.offset..end)?.try_into().ok()?;
        if u64::from_be_bytes(field) >= self.below {
            return None;
        }
        let mut new = value.to_vec();
        new.get_mut(self.offset..end)?
            .copy_from_slice(&self.stamp.to_be_bytes());
        Some(new)
    }
}

/// What a claim lock is keyed by: a thread id's 16 bytes (the backend
/// knows no threads).
pub type ClaimKey = [u8; 16];

/// A lock held until dropped (a driver's claim, a collector's lock). It
/// must also be released when its holder dies (`kill -9`, a lost
/// connection), so that another process can take over.
pub trait HeldLock: Send + Sync + fmt::Debug {
    /// Whether the lock is still held: a lock that lives in a server
    /// connection (PostgreSQL) is lost with that connection, and its
    /// holder must stop ([`BackendError::LockLost`]). A lock of this
    /// process's own (a file lock) cannot be lost while held.
    fn check(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

/// Backend-specific figures for `uwf-db stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageStats {
    /// Bytes of pages (or rows) holding the blobs.
    pub blob_bytes: u64,
    /// The virtual map reserved by this process (LMDB).
    pub map_size: u64,
    /// The configured maximum, if any.
    pub max_map_size: Option<u64>,
    /// Bytes of the map in use.
    pub map_used: u64,
    /// Size of the data file on disk.
    pub file_size: u64,
    /// Reader slots used so far.
    pub readers: u32,
    /// Reader slots available.
    pub max_readers: u32,
    /// Whether every value carries its own checksum (LMDB stores of the
    /// checksummed layout; a server keeps its own).
    pub value_checksums: bool,
}

/// A storage engine holding one store.
pub trait Backend: Send + Sync + fmt::Debug {
    /// Starts a read transaction (a consistent snapshot). Keep it short.
    fn begin_read(&self) -> Result<Box<dyn ReadTables + '_>, BackendError>;

    /// Starts a write transaction.
    fn begin_write(&self) -> Result<Box<dyn WriteTables + '_>, BackendError>;

    /// Starts a write transaction that no other write transaction
    /// interleaves with: it begins once every writer in flight has ended,
    /// and writers that begin meanwhile wait for it. For the few writes
    /// whose correctness argument needs every writer on one side of them
    /// (a garbage collection's marker and sweep, `meta` settings). A
    /// backend whose writers are all serial anyway (LMDB) gives an
    /// ordinary one, the default.
    fn begin_write_exclusive(&self) -> Result<Box<dyn WriteTables + '_>, BackendError> {
        self.begin_write()
    }

    /// A read that may send one statement: on a server backend that
    /// statement runs without `BEGIN` (a single statement sees one
    /// snapshot), so the read costs one round trip and no `ROLLBACK`; a
    /// second statement is refused with [`BackendError::NeedsTransaction`]
    /// and [`ReadTables::needs_transaction`] says so, and the caller runs
    /// the read again with [`Backend::begin_read`]. The default is an
    /// ordinary read transaction (a read of an embedded engine costs none).
    fn begin_read_once(&self) -> Result<Box<dyn ReadTables + '_>, BackendError> {
        self.begin_read()
    }

    /// Whether every read costs a round trip to a server (PostgreSQL):
    /// the store then keeps the chain nodes it writes and reads in memory
    /// for its chain walks (`store::txn::RecentNodes`). `false` for a
    /// backend reading its own map (LMDB, memory).
    fn reads_cost_round_trips(&self) -> bool {
        false
    }

    /// How many write transactions a group-commit handle may keep in
    /// flight at once (at most; a second goes only when many requests
    /// wait): one for a backend with a single writer (the default), more
    /// for a server that commits several in parallel.
    fn parallel_writers(&self) -> usize {
        1
    }

    /// Where the store lives, for messages and for agents (`UWF_STORE`).
    fn location(&self) -> &str;

    /// The store directory, for a backend that has one.
    fn dir(&self) -> Option<&std::path::Path>;

    /// Commit durability.
    fn durability(&self) -> Durability;

    /// Takes the claim lock of thread `id` for this process: `None` when a
    /// live holder elsewhere has it. Holding it twice in one process is the
    /// caller's business (the engine tracks its own claims).
    fn try_lock_claim(&self, id: ClaimKey) -> Result<Option<Box<dyn HeldLock>>, BackendError>;

    /// Whether a live holder somewhere (this process included) has the
    /// claim lock of thread `id`.
    fn claim_locked(&self, id: ClaimKey) -> Result<bool, BackendError>;

    /// [`Backend::claim_locked`] for many threads at once, in their order:
    /// a listing probes every thread it returns, so a server backend
    /// answers with one query, not one per thread.
    fn claims_locked(&self, ids: &[ClaimKey]) -> Result<Vec<bool>, BackendError> {
        ids.iter().map(|&id| self.claim_locked(id)).collect()
    }

    /// Takes the garbage collector's lock: `None` when another collection
    /// holds it.
    fn try_lock_gc(&self) -> Result<Option<Box<dyn HeldLock>>, BackendError>;

    /// Backend-specific statistics.
    fn storage_stats(&self) -> Result<StorageStats, BackendError>;

    /// The concrete backend, for checks that only make sense for one
    /// (reopening an LMDB directory with other options).
    fn as_any(&self) -> &dyn std::any::Any;
}

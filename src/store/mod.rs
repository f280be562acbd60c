//! The store: blobs with referential integrity, prefix resolution and
//! transactions, on any backend behind the storage boundary
//! ([`crate::backend`]).
//!
//! - `error.rs`: [`StoreError`].
//! - `options.rs`: [`StoreOptions`], [`Durability`].
//! - `open.rs`: opening a store (and the per-process registry that opens
//!   one LMDB directory once).
//! - `txn.rs`: [`ReadTxn`] and [`WriteTxn`]: blob put/get, integrity
//!   checks, the GC's write barrier.
//! - `record.rs`: the value layout of the `blobs` table.
//! - `group.rs`: group commit.
//! - `pins.rs`: pinned blobs (GC roots).
//! - `copy_marker.rs`: the marker an unfinished copy leaves in its
//!   destination.
//! - `stats.rs`: [`Stats`].
//!
//! Every table and value layout is described in `docs/design.md`.

mod copy_marker;
mod error;
mod group;
mod open;
mod options;
mod pins;
pub mod record;
mod stats;
mod txn;

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::backend::{Backend, BackendError, Direction, KeyRange, ReadTables, Table};
use crate::hash::{Hash, HashPrefix};
use crate::node::Blob;

pub use crate::backend::lmdb::{DEFAULT_MAP_SIZE, MAX_MAP_SIZE};
pub use copy_marker::{COPY_MARKER_KEY, UnfinishedCopy};
pub use error::{Damage, OpenError, StoreError};
pub use group::{DEFAULT_MAX_GROUP, GroupStats};
pub use options::{DEFAULT_PG_CONNECTIONS, Durability, StoreOptions};
pub use record::{BlobRecord, RecordError};
pub use stats::Stats;
pub use txn::{ReadTxn, StoredBlob, WriteTxn};

pub(crate) use crate::backend::format::parse_format;
pub use crate::backend::format::{FORMAT_VERSION, FORMAT_VERSION_KEY};

/// Key of a running garbage collection's epoch (u64 BE ms) in `meta`.
pub const GC_EPOCH_KEY: &str = "gc_epoch";

/// How many times [`Store::write`] runs a transaction that the backend
/// could not serialize with a concurrent one before reporting it.
const SERIALIZATION_RETRIES: usize = 8;

/// Tries at a transaction whose server connection is lost before it
/// commits (a connection terminated while it idled in the pool is found
/// so by the first statement): nothing of it was applied, so it runs
/// again on the next pooled or a new connection. Several pooled
/// connections may have been cut at once.
const LOST_CONNECTION_TRIES: usize = 6;

/// Starts a transaction with `begin`, again while the connection is found
/// lost as it starts (see [`LOST_CONNECTION_TRIES`]).
fn begin_with_retries<T>(
    mut begin: impl FnMut() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let mut tries = 0;
    loop {
        tries += 1;
        match begin() {
            Err(e) if e.is_connection_lost() && tries < LOST_CONNECTION_TRIES => {}
            other => return other,
        }
    }
}

pub(crate) struct StoreInner {
    pub(crate) backend: Box<dyn Backend>,
    /// What the layers above keep per open store (the engine's caches and
    /// claim bookkeeping), one value per type, made on first use: the store
    /// names none of their types ([`Store::layer_state`]).
    pub(crate) layers: std::sync::Mutex<Vec<Arc<dyn std::any::Any + Send + Sync>>>,
    /// The chain nodes this handle wrote or walked lately, when reads cost
    /// round trips ([`txn::RecentNodes`]).
    pub(crate) recent: Option<txn::RecentNodes>,
}

impl StoreInner {
    pub(crate) fn new(backend: Box<dyn Backend>) -> StoreInner {
        let recent = backend
            .reads_cost_round_trips()
            .then(|| txn::RecentNodes::new(txn::RECENT_NODES));
        StoreInner {
            backend,
            layers: std::sync::Mutex::new(Vec::new()),
            recent,
        }
    }
}

/// A handle to an open store: `Send + Sync`, cheap to clone.
///
/// ```
/// use uwf_db::{Blob, Store, StoreOptions};
/// let dir = tempfile::tempdir().unwrap();
/// let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
/// let hash = store.put(&Blob::content("hello", [])).unwrap();
/// assert_eq!(store.get(&hash).unwrap(), Some(Blob::content("hello", [])));
/// ```
#[derive(Clone)]
pub struct Store {
    inner: Arc<StoreInner>,
    /// Set on handles made by [`Store::group_commit`].
    group: Option<Arc<group::GroupSender>>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("location", &self.inner.backend.location())
            .field("durability", &self.inner.backend.durability())
            .finish()
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Store {
    /// The store directory (canonical). For a backend without a directory
    /// this is empty; [`Store::location`] names every store.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = uwf_db::Store::open(dir.path(), uwf_db::StoreOptions::default())?;
    /// assert!(store.path().join("data.mdb").is_file());
    /// assert_eq!(uwf_db::Store::memory().path(), std::path::Path::new(""));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn path(&self) -> &Path {
        self.inner.backend.dir().unwrap_or(Path::new(""))
    }

    /// Where the store lives: its directory, or its URL.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = uwf_db::Store::open(dir.path(), uwf_db::StoreOptions::default())?;
    /// let name = dir.path().file_name().ok_or("no name")?.to_string_lossy();
    /// assert!(store.location().ends_with(&*name));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn location(&self) -> &str {
        self.inner.backend.location()
    }

    /// This handle's commit durability.
    ///
    /// ```
    /// use uwf_db::{Durability, Store, StoreOptions};
    /// let dir = tempfile::tempdir()?;
    /// let options = StoreOptions { durability: Durability::None, ..StoreOptions::default() };
    /// assert_eq!(Store::open(dir.path(), options)?.durability(), Durability::None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn durability(&self) -> Durability {
        self.inner.backend.durability()
    }

    /// Whether two handles are handles of one open store (clones, or two
    /// opens of one LMDB directory in this process).
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let a = uwf_db::Store::open(dir.path(), uwf_db::StoreOptions::default())?;
    /// let b = uwf_db::Store::open(dir.path(), uwf_db::StoreOptions::default())?;
    /// assert!(a.same_store(&b) && a.same_store(&a.clone()));
    /// assert!(!a.same_store(&uwf_db::Store::memory()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn same_store(&self, other: &Store) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The storage backend (the boundary every layer above is written on):
    /// for backend-specific figures, such as
    /// `backend().as_any().downcast_ref::<PostgresBackend>()` and its
    /// round trips. Writing through it bypasses every check of the store.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// // Below every check of the store: count the rows of a table.
    /// store.put(&uwf_db::Blob::content("a reply", []))?;
    /// let rows = store.backend().begin_read()?.count(uwf_db::backend::Table::Blobs)?;
    /// assert_eq!(rows, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn backend(&self) -> &dyn Backend {
        &*self.inner.backend
    }

    /// Runs `f` in one read transaction (a consistent snapshot). Keep it
    /// short: a long read transaction stops LMDB from reusing pages. A
    /// read is not run again when its connection is lost under it: `f`
    /// may have given rows away (a log streamed out) already.
    ///
    /// ```
    /// use uwf_db::{Blob, Store, StoreError};
    /// let store = Store::memory();
    /// let hash = store.put(&Blob::content("hello", []))?;
    /// // One snapshot for both lookups.
    /// let (there, blob) = store.read(|r| Ok::<_, StoreError>((r.contains(&hash)?, r.get_blob(&hash)?)))?;
    /// assert!(there && blob.is_some());
    /// # Ok::<(), StoreError>(())
    /// ```
    pub fn read<R, E: From<StoreError>>(
        &self,
        f: impl FnOnce(&ReadTxn<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        let txn = begin_with_retries(|| ReadTxn::begin(&self.inner))?;
        f(&txn)
    }

    /// Whether naming the keys a write reads first pays
    /// ([`Store::write_op_reading`]): on a backend whose reads cost round
    /// trips.
    pub(crate) fn prefetches(&self) -> bool {
        self.inner.backend.reads_cost_round_trips()
    }

    /// [`Store::read`] for a short read that usually needs one statement
    /// (a thread's record, a blob): on a server backend `f` first runs on a
    /// read that sends its one statement without `BEGIN` (one round trip,
    /// no `ROLLBACK`), and, should it need a second, runs again in a read
    /// transaction. So `f` must do nothing but read (it may run twice).
    pub(crate) fn read_once<R, E: From<StoreError>>(
        &self,
        f: impl Fn(&ReadTxn<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        if self.inner.backend.reads_cost_round_trips() {
            let txn = begin_with_retries(|| ReadTxn::begin_once(&self.inner))?;
            match f(&txn) {
                Err(_) if txn.needs_transaction() => {}
                out => return out,
            }
        }
        self.read(f)
    }

    /// Runs `f` in one write transaction and commits it if `f` succeeds;
    /// if `f` fails nothing of it is written. Writers (across processes)
    /// are serialized. When the backend reports that it could not serialize
    /// the transaction with a concurrent one, `f` runs again in a fresh
    /// transaction (a few times), so `f` must have no effect outside it.
    /// A PostgreSQL connection found lost as the transaction starts is
    /// replaced (a few times); one lost later fails the call, since the
    /// commit may or may not have been applied.
    ///
    /// ```
    /// use uwf_db::{Blob, Store, StoreError};
    /// let store = Store::memory();
    /// // Both blobs or neither.
    /// let (a, b) = store.write(|w| {
    ///     Ok::<_, StoreError>((w.put_blob(&Blob::content("a", []))?, w.put_blob(&Blob::content("b", []))?))
    /// })?;
    /// assert!(store.contains(&a)? && store.contains(&b)?);
    /// # Ok::<(), StoreError>(())
    /// ```
    pub fn write<R, E: From<StoreError>>(
        &self,
        f: impl FnMut(&mut WriteTxn<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        self.write_as(false, &[], f)
    }

    /// [`Store::write`] for `f` that reads `reads` first: a server backend
    /// fetches them with `BEGIN` (`Store::write_op_reading`).
    pub(crate) fn write_reading<R, E: From<StoreError>>(
        &self,
        reads: &[(Table, Vec<u8>)],
        f: impl FnMut(&mut WriteTxn<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        self.write_as(false, reads, f)
    }

    /// [`Store::write`] in a transaction no other writer interleaves with
    /// (`Backend::begin_write_exclusive`): for the garbage collector's
    /// marker and sweep and for `meta` settings, whose correctness needs
    /// every writer on one side of them. Writers wait while it runs: keep
    /// it short.
    pub(crate) fn write_exclusive<R, E: From<StoreError>>(
        &self,
        f: impl FnMut(&mut WriteTxn<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        self.write_as(true, &[], f)
    }

    fn write_as<R, E: From<StoreError>>(
        &self,
        exclusive: bool,
        reads: &[(Table, Vec<u8>)],
        mut f: impl FnMut(&mut WriteTxn<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        let reads: Vec<(Table, &[u8])> = reads.iter().map(|(t, k)| (*t, k.as_slice())).collect();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut txn = begin_with_retries(|| WriteTxn::begin_as(&self.inner, exclusive))?;
            txn.prefetch(&reads)?;
            let out = match f(&mut txn) {
                // Lost before the commit: nothing was applied.
                Err(_) if txn.connection_lost() && attempt < LOST_CONNECTION_TRIES => continue,
                // A deadlock or serialization failure under it, whatever
                // error `f` made of it: nothing was applied.
                Err(_) if txn.serialization_failed() && attempt < SERIALIZATION_RETRIES => continue,
                out => out?,
            };
            match txn.commit() {
                Ok(()) => return Ok(out),
                Err(StoreError::Backend(BackendError::Serialization { .. }))
                    if attempt < SERIALIZATION_RETRIES => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Stores one blob in its own transaction and returns its hash.
    /// Putting a blob that exists already changes nothing.
    ///
    /// ```
    /// use uwf_db::{Blob, Hash, Store};
    /// let store = Store::memory();
    /// let blob = Blob::content("hello", []);
    /// let hash = store.put(&blob)?;
    /// assert_eq!(hash, blob.encode()?.hash());
    /// assert_eq!(store.put(&blob)?, hash); // stored once
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn put(&self, blob: &Blob) -> Result<Hash, StoreError> {
        self.write(|w| w.put_blob(blob))
    }

    /// Reads and decodes one blob.
    ///
    /// ```
    /// use uwf_db::{Blob, Hash, Store};
    /// let store = Store::memory();
    /// let hash = store.put(&Blob::content("hello", []))?;
    /// assert!(matches!(store.get(&hash)?, Some(Blob::Content(c)) if c.text == "hello"));
    /// assert!(store.get(&Hash::of(b"never stored"))?.is_none());
    /// # Ok::<(), uwf_db::StoreError>(())
    /// ```
    pub fn get(&self, hash: &Hash) -> Result<Option<Blob>, StoreError> {
        self.read_once(|r| r.get_blob(hash))
    }

    /// Reads and decodes the blobs `hashes` names, in their order (`None`
    /// for one not stored), in one read: one statement on PostgreSQL,
    /// with no `BEGIN` or `ROLLBACK` around it, as [`Store::get`] reads
    /// one.
    ///
    /// ```
    /// use uwf_db::{Blob, Hash, Store};
    /// let store = Store::memory();
    /// let a = store.put(&Blob::content("a", []))?;
    /// let b = store.put(&Blob::content("b", []))?;
    /// let got = store.get_many(&[b, Hash::of(b"never stored"), a])?;
    /// assert!(matches!(&got[0], Some(Blob::Content(c)) if c.text == "b"));
    /// assert!(got[1].is_none());
    /// assert!(matches!(&got[2], Some(Blob::Content(c)) if c.text == "a"));
    /// # Ok::<(), uwf_db::StoreError>(())
    /// ```
    pub fn get_many(&self, hashes: &[Hash]) -> Result<Vec<Option<Blob>>, StoreError> {
        self.read_once(|r| r.get_blobs(hashes))
    }

    /// Reads one blob's record: header fields and canonical bytes.
    ///
    /// ```
    /// use uwf_db::{Blob, Kind, Store};
    /// let store = Store::memory();
    /// let hash = store.put(&Blob::content("hello", []))?;
    /// let stored = store.get_stored(&hash)?.ok_or("missing")?;
    /// assert_eq!((stored.kind, stored.hash), (Kind::Content, hash));
    /// assert!(matches!(stored.decode()?, Blob::Content(_)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn get_stored(&self, hash: &Hash) -> Result<Option<StoredBlob>, StoreError> {
        self.read(|r| r.get_stored(hash))
    }

    /// Whether a blob is stored.
    ///
    /// ```
    /// use uwf_db::{Blob, Hash, Store};
    /// let store = Store::memory();
    /// let hash = store.put(&Blob::content("hello", []))?;
    /// assert!(store.contains(&hash)?);
    /// assert!(!store.contains(&Hash::of(b"other"))?);
    /// # Ok::<(), uwf_db::StoreError>(())
    /// ```
    pub fn contains(&self, hash: &Hash) -> Result<bool, StoreError> {
        self.read(|r| r.contains(hash))
    }

    /// Resolves a full hash or a unique prefix to a stored blob's hash.
    ///
    /// ```
    /// use uwf_db::{Blob, HashPrefix, Store};
    /// let store = Store::memory();
    /// let hash = store.put(&Blob::content("hello", []))?;
    /// let prefix: HashPrefix = hash.to_string()[..10].parse()?;
    /// assert_eq!(store.resolve(&prefix)?, hash);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resolve(&self, prefix: &HashPrefix) -> Result<Hash, StoreError> {
        self.read(|r| r.resolve(prefix))
    }

    /// Everything reachable from `root` (itself included), breadth first,
    /// each blob once. Reads in batches, each in a short read transaction,
    /// and calls `visit` outside any transaction.
    ///
    /// ```
    /// use uwf_db::{Blob, Store, StoreError};
    /// let store = Store::memory();
    /// let leaf = store.put(&Blob::content("leaf", []))?;
    /// let root = store.put(&Blob::content("root", [leaf]))?;
    /// let mut seen = Vec::new();
    /// let count = store.walk(&root, |b| {
    ///     seen.push(b.hash);
    ///     Ok::<(), StoreError>(())
    /// })?;
    /// assert_eq!((count, seen), (2, vec![root, leaf]));
    /// # Ok::<(), StoreError>(())
    /// ```
    pub fn walk<E: From<StoreError>>(
        &self,
        root: &Hash,
        mut visit: impl FnMut(&StoredBlob) -> Result<(), E>,
    ) -> Result<u64, E> {
        const BATCH: usize = 1024;
        let mut seen = std::collections::HashSet::from([*root]);
        let mut queue = std::collections::VecDeque::from([(*root, None::<Hash>)]);
        let mut count = 0;
        while !queue.is_empty() {
            let take = queue.len().min(BATCH);
            let batch: Vec<(Hash, Option<Hash>)> = queue.drain(..take).collect();
            let found = self.read(|r| {
                batch
                    .iter()
                    .map(|(h, from)| match r.get_stored(h)? {
                        Some(b) => Ok(b),
                        None => Err(match from {
                            Some(parent) => StoreError::MissingRef {
                                blob: *parent,
                                missing: *h,
                            },
                            None => StoreError::UnknownHash {
                                prefix: h.to_string(),
                            },
                        }),
                    })
                    .collect::<Result<Vec<_>, StoreError>>()
            })?;
            for blob in found {
                for r in &blob.refs {
                    if seen.insert(*r) {
                        queue.push_back((*r, Some(blob.hash)));
                    }
                }
                visit(&blob)?;
                count += 1;
            }
        }
        Ok(count)
    }

    /// Number of stored blobs.
    ///
    /// ```
    /// use uwf_db::{Blob, Store};
    /// let store = Store::memory();
    /// store.put(&Blob::content("a", []))?;
    /// store.put(&Blob::content("a", []))?;
    /// assert_eq!(store.blob_count()?, 1);
    /// # Ok::<(), uwf_db::StoreError>(())
    /// ```
    pub fn blob_count(&self) -> Result<u64, StoreError> {
        self.read(|r| Ok(r.tables().count(Table::Blobs)?))
    }

    /// The `T` a layer above keeps for this store, shared by every handle
    /// of it: made with `T::default()` on first use.
    pub(crate) fn layer_state<T: std::any::Any + Send + Sync + Default>(&self) -> Arc<T> {
        let mut layers = self.inner.layers.lock().unwrap_or_else(|p| p.into_inner());
        for state in layers.iter() {
            if let Ok(found) = Arc::clone(state).downcast::<T>() {
                return found;
            }
        }
        let made = Arc::new(T::default());
        layers.push(made.clone());
        made
    }

    /// Scans one table in key order, 4,096 entries per read transaction
    /// (so no snapshot is held long), calling `visit` with the transaction
    /// (for lookups), the key and the value. Returns the entries visited.
    pub(crate) fn scan_table<E: From<StoreError>>(
        &self,
        table: Table,
        mut visit: impl FnMut(&ReadTxn<'_>, &[u8], &[u8]) -> Result<(), E>,
    ) -> Result<u64, E> {
        const BATCH: usize = 4096;
        let mut after: Option<Vec<u8>> = None;
        let mut count = 0;
        loop {
            let last = self.read(|r| {
                let range = match &after {
                    Some(k) => KeyRange::after(k),
                    None => KeyRange::ALL,
                };
                let mut last = None;
                let entries = r
                    .tables()
                    .range(table, range, Direction::Forward)
                    .map_err(StoreError::from)?;
                for entry in entries.take(BATCH) {
                    let (key, value) = entry.map_err(StoreError::from)?;
                    count += 1;
                    visit(r, &key, &value)?;
                    last = Some(key.into_owned());
                }
                Ok::<_, E>(last)
            })?;
            match last {
                Some(k) => after = Some(k),
                None => return Ok(count),
            }
        }
    }
}

/// Parses a stored `gc_epoch` value (8 bytes, big-endian ms).
pub(crate) fn parse_gc_epoch(value: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(value).ok().map(u64::from_be_bytes)
}

/// Reads the format version in a transaction.
pub(crate) fn read_format_version(
    tables: &dyn ReadTables,
    location: &str,
) -> Result<u32, StoreError> {
    tables
        .get(Table::Meta, FORMAT_VERSION_KEY.as_bytes())?
        .as_deref()
        .and_then(parse_format)
        .ok_or_else(|| {
            BackendError::MissingFormat {
                path: location.into(),
                detail: "the version key is absent or malformed".into(),
            }
            .into()
        })
}

// The handle must stay shareable across a batch runner's threads.
const _: () = {
    const fn shareable<T: Send + Sync + Clone>() {}
    shareable::<Store>();
};

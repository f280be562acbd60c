//! The LMDB store: one environment per directory, typed databases, blob
//! put/get with referential integrity, prefix resolution and statistics.
//!
//! Every database and value layout is described in `docs/design.md`.

mod env;
mod group;
pub mod record;
mod txn;

use std::collections::HashMap;
use std::fmt;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use heed::types::{Bytes, Str};
use heed::{Database, Env, MdbError, WithoutTls};

use crate::codec::CodecError;
use crate::hash::{Hash, HashPrefix};
use crate::node::Blob;

pub use group::{DEFAULT_MAX_GROUP, GroupStats};
pub use record::{BlobRecord, RecordError};
pub use txn::{ReadTxn, StoredBlob, WriteTxn};

/// The on-disk format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// Key of the format version in the `meta` database.
pub const FORMAT_VERSION_KEY: &str = "format_version";

/// Key of a running garbage collection's epoch (u64 BE ms) in `meta`.
pub const GC_EPOCH_KEY: &str = "gc_epoch";

/// Virtual map reserved when no maximum is configured: 1 TiB. LMDB files grow
/// only as pages are used, so this costs address space, not disk.
pub const DEFAULT_MAP_SIZE: u64 = 1 << 40;

/// Map sizes are rounded up to a multiple of this (a multiple of every page size).
const MAP_ALIGN: u64 = 1 << 20;

/// Whether a commit waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Every commit is flushed to disk before it returns (LMDB's default).
    #[default]
    Sync,
    /// Commits are not flushed: a crash of the machine (not of the process)
    /// may lose recent commits. For throwaway runs and benchmarks.
    None,
}

impl Durability {
    /// `"sync"` or `"none"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Durability::Sync => "sync",
            Durability::None => "none",
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sync" => Ok(Durability::Sync),
            "none" => Ok(Durability::None),
            other => Err(format!("unknown durability '{other}' (use sync or none)")),
        }
    }
}

/// How to open a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// Commit durability for this process.
    pub durability: Durability,
    /// Largest size the data file may reach, in bytes. `None` reserves
    /// [`DEFAULT_MAP_SIZE`]. A write that would pass it fails with
    /// [`StoreError::MapFull`] and changes nothing.
    pub max_map_size: Option<u64>,
    /// Create the store when it does not exist (else fail with
    /// [`StoreError::NotInitialized`]).
    pub create: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            durability: Durability::Sync,
            max_map_size: None,
            create: true,
        }
    }
}

/// What went wrong in the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
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
    #[error("blob {hash} is corrupt: {detail}; run `uwf-db verify`")]
    Corrupt {
        /// The blob's key.
        hash: Hash,
        /// What is wrong.
        detail: String,
    },
    /// A blob could not be encoded.
    #[error(transparent)]
    Codec(#[from] CodecError),
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
    /// The group-commit writer is gone (its handle outlived
    /// [`Store::group_commit`]).
    #[error("the group-commit writer has stopped; nothing was written")]
    GroupStopped,
    /// A group commit failed; every write in the group was discarded.
    #[error("a group commit failed and nothing of the group was stored: {detail}")]
    GroupCommit {
        /// The failure.
        detail: String,
    },
    /// Any other LMDB failure.
    #[error("LMDB error while {op} in {path}: {source}")]
    Lmdb {
        /// What was being done.
        op: &'static str,
        /// The store directory.
        path: PathBuf,
        /// The cause.
        source: heed::Error,
    },
}

impl StoreError {
    /// The error again, for each request of a failed group: the kinds a
    /// caller acts on (a full disk or map) are kept; others become
    /// [`StoreError::GroupCommit`] with the message.
    pub(crate) fn for_each_request(&self) -> StoreError {
        match self {
            StoreError::DiskFull { path } => StoreError::DiskFull { path: path.clone() },
            StoreError::MapFull { path, map_size } => StoreError::MapFull {
                path: path.clone(),
                map_size: *map_size,
            },
            StoreError::MapResized { path } => StoreError::MapResized { path: path.clone() },
            StoreError::GroupStopped => StoreError::GroupStopped,
            other => StoreError::GroupCommit {
                detail: other.to_string(),
            },
        }
    }
}

/// The typed LMDB databases of a store (`docs/design.md`).
#[derive(Clone, Copy)]
pub(crate) struct Databases {
    /// `meta`: settings such as the format version.
    pub meta: Database<Str, Bytes>,
    /// `blobs`: hash (32 bytes) → blob record.
    pub blobs: Database<Bytes, Bytes>,
    /// `threads`: active thread records, by id (16 bytes).
    pub threads: Database<Bytes, Bytes>,
    /// `history`: ended thread records, by UTC day (u32 BE) then id.
    pub history: Database<Bytes, Bytes>,
    /// `history_ids`: id → UTC day (u32 BE) of its `history` entry.
    pub history_ids: Database<Bytes, Bytes>,
    /// `activity`: last activity (u64 BE ms) then id → status, flags, workflow.
    pub activity: Database<Bytes, Bytes>,
    /// `children`: parent id then child id → empty.
    pub children: Database<Bytes, Bytes>,
    /// `workflows`: workflow name (UTF-8) → hash of its `workflow` blob.
    pub workflows: Database<Bytes, Bytes>,
    /// `pins`: hash (32 bytes) → empty; GC roots.
    pub pins: Database<Bytes, Bytes>,
}

/// Names of the byte-keyed databases after `meta`, in `Databases` order.
const BYTE_DATABASES: [&str; 8] = [
    "blobs",
    "threads",
    "history",
    "history_ids",
    "activity",
    "children",
    "workflows",
    "pins",
];

impl Databases {
    fn from_parts(meta: Database<Str, Bytes>, dbs: [Database<Bytes, Bytes>; 8]) -> Self {
        let [
            blobs,
            threads,
            history,
            history_ids,
            activity,
            children,
            workflows,
            pins,
        ] = dbs;
        Databases {
            meta,
            blobs,
            threads,
            history,
            history_ids,
            activity,
            children,
            workflows,
            pins,
        }
    }
}

pub(crate) struct StoreInner {
    env: Env<WithoutTls>,
    pub(crate) dbs: Databases,
    path: PathBuf,
    durability: Durability,
    max_map_size: Option<u64>,
    map_size: u64,
    /// The engine's caches and claim bookkeeping for this store.
    pub(crate) engine: crate::engine::state::EngineState,
}

impl StoreInner {
    /// Maps an LMDB error to the store error a user can act on.
    pub(crate) fn error(&self, op: &'static str, e: heed::Error) -> StoreError {
        map_heed_error(&self.path, self.map_size, self.env.max_readers(), op, e)
    }
}

fn map_heed_error(
    path: &Path,
    map_size: u64,
    max_readers: u32,
    op: &'static str,
    e: heed::Error,
) -> StoreError {
    let path = path.to_path_buf();
    match e {
        heed::Error::Mdb(MdbError::MapFull) => StoreError::MapFull { path, map_size },
        heed::Error::Mdb(MdbError::MapResized) => StoreError::MapResized { path },
        heed::Error::Mdb(MdbError::ReadersFull) => StoreError::ReadersFull {
            path,
            max: max_readers,
        },
        heed::Error::Io(io) if io.raw_os_error() == Some(28) || io.raw_os_error() == Some(122) => {
            // ENOSPC and EDQUOT on Linux.
            StoreError::DiskFull { path }
        }
        source => StoreError::Lmdb { op, path, source },
    }
}

/// Stores open in this process, by canonical path: LMDB (and heed) forbid
/// opening one environment twice in a process, so a second open returns a
/// handle to the first.
static OPEN_STORES: LazyLock<Mutex<HashMap<PathBuf, Weak<StoreInner>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

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
            .field("path", &self.inner.path)
            .field("durability", &self.inner.durability)
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
    /// Opens (or, with `options.create`, creates) the store in directory `path`.
    ///
    /// Opening a store that this process already has open returns a handle to
    /// the same environment; asking for different durability or a different
    /// maximum size then is an [`StoreError::OptionsConflict`].
    pub fn open(path: impl AsRef<Path>, options: StoreOptions) -> Result<Store, StoreError> {
        let path = path.as_ref();
        let io = |op| {
            let path = path.to_path_buf();
            move |source| StoreError::Io { op, path, source }
        };
        if !path.join("data.mdb").is_file() {
            if !options.create {
                return Err(StoreError::NotInitialized {
                    path: path.to_path_buf(),
                });
            }
            std::fs::create_dir_all(path).map_err(io("create directory"))?;
        }
        let canonical = std::fs::canonicalize(path).map_err(io("resolve"))?;

        let mut open = OPEN_STORES.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|_, weak| weak.strong_count() > 0);
        if let Some(inner) = open.get(&canonical).and_then(Weak::upgrade) {
            let same_max = options
                .max_map_size
                .is_none_or(|m| Some(m) == inner.max_map_size);
            if inner.durability != options.durability || !same_max {
                let describe = |d: Durability, m: Option<u64>| {
                    format!(
                        "durability {d}, maximum size {}",
                        m.map_or("default".to_owned(), |m| m.to_string())
                    )
                };
                return Err(StoreError::OptionsConflict {
                    path: canonical,
                    existing: describe(inner.durability, inner.max_map_size),
                    requested: describe(options.durability, options.max_map_size),
                });
            }
            return Ok(Store { inner, group: None });
        }

        let map_size = options
            .max_map_size
            .unwrap_or(DEFAULT_MAP_SIZE)
            .max(MAP_ALIGN)
            .div_ceil(MAP_ALIGN)
            * MAP_ALIGN;
        let usize_map = usize::try_from(map_size).unwrap_or(usize::MAX / 2);
        let env = env::open_env(&canonical, usize_map, options.durability)
            .map_err(|e| map_heed_error(&canonical, map_size, env::MAX_READERS, "opening", e))?;
        let fail = |op, e| map_heed_error(&canonical, map_size, env.max_readers(), op, e);
        env.clear_stale_readers()
            .map_err(|e| fail("clearing stale readers", e))?;
        let dbs = open_databases(&env, &canonical, &fail)?;
        let inner = Arc::new(StoreInner {
            env,
            dbs,
            path: canonical.clone(),
            durability: options.durability,
            max_map_size: options.max_map_size,
            map_size,
            engine: crate::engine::state::EngineState::default(),
        });
        open.insert(canonical, Arc::downgrade(&inner));
        Ok(Store { inner, group: None })
    }

    /// The store directory (canonical).
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// This handle's commit durability.
    pub fn durability(&self) -> Durability {
        self.inner.durability
    }

    /// Runs `f` in one read transaction (a consistent snapshot). Keep it
    /// short: a long read transaction stops LMDB from reusing pages.
    pub fn read<R, E: From<StoreError>>(
        &self,
        f: impl FnOnce(&ReadTxn<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        let txn = ReadTxn::begin(&self.inner)?;
        f(&txn)
    }

    /// Runs `f` in one write transaction and commits it if `f` succeeds;
    /// if `f` fails nothing of it is written. Writers (across processes)
    /// run one at a time.
    pub fn write<R, E: From<StoreError>>(
        &self,
        f: impl FnOnce(&mut WriteTxn<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        let mut txn = WriteTxn::begin(&self.inner)?;
        let out = f(&mut txn)?;
        txn.commit()?;
        Ok(out)
    }

    /// Stores one blob in its own transaction and returns its hash.
    /// Putting a blob that exists already changes nothing.
    pub fn put(&self, blob: &Blob) -> Result<Hash, StoreError> {
        self.write(|w| w.put_blob(blob))
    }

    /// Reads and decodes one blob.
    pub fn get(&self, hash: &Hash) -> Result<Option<Blob>, StoreError> {
        self.read(|r| r.get_blob(hash))
    }

    /// Reads one blob's record: header fields and canonical bytes.
    pub fn get_stored(&self, hash: &Hash) -> Result<Option<StoredBlob>, StoreError> {
        self.read(|r| r.get_stored(hash))
    }

    /// Whether a blob is stored.
    pub fn contains(&self, hash: &Hash) -> Result<bool, StoreError> {
        self.read(|r| r.contains(hash))
    }

    /// Resolves a full hash or a unique prefix to a stored blob's hash.
    pub fn resolve(&self, prefix: &HashPrefix) -> Result<Hash, StoreError> {
        self.read(|r| r.resolve(prefix))
    }

    /// Everything reachable from `root` (itself included), breadth first,
    /// each blob once. Reads in batches, each in a short read transaction,
    /// and calls `visit` outside any transaction.
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

    /// Number of stored blobs (LMDB keeps the count: O(1)).
    pub fn blob_count(&self) -> Result<u64, StoreError> {
        let inner = &self.inner;
        self.read(|r| {
            inner
                .dbs
                .blobs
                .len(r.raw())
                .map_err(|e| inner.error("counting blobs", e))
        })
    }

    /// Counts, sizes and map usage.
    pub fn stats(&self) -> Result<Stats, StoreError> {
        let inner = &self.inner;
        let (blobs, counts, format_version, gc_epoch) = self.read(|r| {
            let err = |e| inner.error("reading statistics", e);
            let stat = inner.dbs.blobs.stat(r.raw()).map_err(err)?;
            let dbs = &inner.dbs;
            let counts = [dbs.threads, dbs.history, dbs.workflows, dbs.pins]
                .map(|db| db.len(r.raw()).map_err(err));
            let [active, ended, workflows, pins] = counts;
            let gc = dbs
                .meta
                .get(r.raw(), GC_EPOCH_KEY)
                .map_err(err)?
                .and_then(parse_gc_epoch);
            Ok::<_, StoreError>((
                stat,
                [active?, ended?, workflows?, pins?],
                r.format_version()?,
                gc,
            ))
        })?;
        let info = inner.env.info();
        let page = u64::from(blobs.page_size);
        let file_size = std::fs::metadata(inner.path.join("data.mdb"))
            .map(|m| m.len())
            .unwrap_or(0);
        Ok(Stats {
            path: inner.path.clone(),
            format_version,
            blob_count: blobs.entries as u64,
            active_threads: counts[0],
            ended_threads: counts[1],
            workflows: counts[2],
            pins: counts[3],
            gc_epoch,
            blob_bytes: (blobs.branch_pages + blobs.leaf_pages + blobs.overflow_pages) as u64
                * page,
            map_size: info.map_size as u64,
            max_map_size: inner.max_map_size,
            map_used: (info.last_page_number as u64 + 1) * page,
            file_size,
            readers: info.number_of_readers,
            max_readers: info.maximum_number_of_readers,
            durability: inner.durability,
        })
    }

    pub(crate) fn inner(&self) -> &StoreInner {
        &self.inner
    }

    /// The engine's state for this store (caches, claims).
    pub(crate) fn engine_state(&self) -> &crate::engine::state::EngineState {
        &self.inner.engine
    }

    /// Scans one database in key order, 4,096 entries per read transaction
    /// (so no snapshot is held long), calling `visit` with the transaction
    /// (for lookups), the key and the value. Returns the entries visited.
    pub(crate) fn scan_db<E: From<StoreError>>(
        &self,
        db: Database<Bytes, Bytes>,
        mut visit: impl FnMut(&ReadTxn<'_>, &[u8], &[u8]) -> Result<(), E>,
    ) -> Result<u64, E> {
        const BATCH: usize = 4096;
        let inner = &self.inner;
        let mut after: Option<Vec<u8>> = None;
        let mut count = 0;
        loop {
            let last = self.read(|r| {
                let range = match &after {
                    Some(k) => (Bound::Excluded(k.as_slice()), Bound::Unbounded),
                    None => (Bound::Unbounded, Bound::Unbounded),
                };
                let mut last = None;
                let iter = db
                    .range(r.raw(), &range)
                    .map_err(|e| inner.error("scanning an index", e))?;
                for entry in iter.take(BATCH) {
                    let (key, value) = entry.map_err(|e| inner.error("scanning an index", e))?;
                    count += 1;
                    visit(r, key, value)?;
                    last = Some(key.to_vec());
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

/// What `uwf-db stats` reports.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// The store directory.
    pub path: PathBuf,
    /// The stored format version.
    pub format_version: u32,
    /// Number of blobs.
    pub blob_count: u64,
    /// Threads in the active index.
    pub active_threads: u64,
    /// Pinned blobs (GC roots).
    pub pins: u64,
    /// The start (ms since the epoch) of a garbage collection in progress,
    /// or left behind by one that died.
    pub gc_epoch: Option<u64>,
    /// Threads in history.
    pub ended_threads: u64,
    /// Registered workflow names.
    pub workflows: u64,
    /// Bytes of pages holding the blobs database.
    pub blob_bytes: u64,
    /// The virtual map reserved by this process.
    pub map_size: u64,
    /// The configured maximum, if any.
    pub max_map_size: Option<u64>,
    /// Bytes of the map in use (up to the last used page).
    pub map_used: u64,
    /// Size of `data.mdb` on disk.
    pub file_size: u64,
    /// Reader slots used so far (LMDB's high-water mark, all processes).
    pub readers: u32,
    /// Reader slots available.
    pub max_readers: u32,
    /// This handle's durability.
    pub durability: Durability,
}

impl serde::Serialize for Durability {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Opens the databases, creating them (and writing the format version) in a
/// new store; checks the format version of an existing one.
fn open_databases(
    env: &Env<WithoutTls>,
    path: &Path,
    fail: &dyn Fn(&'static str, heed::Error) -> StoreError,
) -> Result<Databases, StoreError> {
    // Fast path: an existing store needs only a read transaction, so opening
    // it never waits for another process's write transaction.
    let rtxn = env.read_txn().map_err(|e| fail("opening", e))?;
    let meta = env
        .open_database::<Str, Bytes>(&rtxn, Some("meta"))
        .map_err(|e| fail("opening the meta database", e))?;
    let mut found = Vec::with_capacity(BYTE_DATABASES.len());
    for name in BYTE_DATABASES {
        found.push(
            env.open_database::<Bytes, Bytes>(&rtxn, Some(name))
                .map_err(|e| fail("opening a database", e))?,
        );
    }
    let all: Option<Vec<_>> = found.into_iter().collect();
    if let (Some(meta), Some(Ok(dbs))) = (meta, all.map(<[_; 8]>::try_from)) {
        let stored = meta
            .get(&rtxn, FORMAT_VERSION_KEY)
            .map_err(|e| fail("reading the format version", e))?
            .map(<[u8]>::to_vec);
        rtxn.commit().map_err(|e| fail("opening", e))?;
        check_format(path, stored.as_deref())?;
        return Ok(Databases::from_parts(meta, dbs));
    }
    drop(rtxn);

    let mut wtxn = env.write_txn().map_err(|e| fail("creating", e))?;
    let meta = env
        .create_database::<Str, Bytes>(&mut wtxn, Some("meta"))
        .map_err(|e| fail("creating the meta database", e))?;
    let mut created = Vec::with_capacity(BYTE_DATABASES.len());
    for name in BYTE_DATABASES {
        created.push(
            env.create_database::<Bytes, Bytes>(&mut wtxn, Some(name))
                .map_err(|e| fail("creating a database", e))?,
        );
    }
    let Ok(dbs) = <[_; 8]>::try_from(created) else {
        unreachable!("one database per name");
    };
    let dbs = Databases::from_parts(meta, dbs);
    let stored = meta
        .get(&wtxn, FORMAT_VERSION_KEY)
        .map_err(|e| fail("reading the format version", e))?
        .map(<[u8]>::to_vec);
    match stored {
        Some(v) => check_format(path, Some(&v))?,
        None => {
            let has_data = !dbs
                .blobs
                .is_empty(&wtxn)
                .map_err(|e| fail("reading the blobs database", e))?;
            if has_data {
                return Err(StoreError::MissingFormat {
                    path: path.to_path_buf(),
                    detail: "blobs are stored but the version key is absent".into(),
                });
            }
            meta.put(&mut wtxn, FORMAT_VERSION_KEY, &FORMAT_VERSION.to_be_bytes())
                .map_err(|e| fail("writing the format version", e))?;
        }
    }
    wtxn.commit().map_err(|e| fail("creating", e))?;
    Ok(dbs)
}

/// Parses a stored `gc_epoch` value (8 bytes, big-endian ms).
pub(crate) fn parse_gc_epoch(value: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(value).ok().map(u64::from_be_bytes)
}

/// Parses a stored format version value (4 bytes, big-endian).
pub(crate) fn parse_format(value: &[u8]) -> Option<u32> {
    <[u8; 4]>::try_from(value).ok().map(u32::from_be_bytes)
}

fn check_format(path: &Path, stored: Option<&[u8]>) -> Result<(), StoreError> {
    let missing = |detail: String| StoreError::MissingFormat {
        path: path.to_path_buf(),
        detail,
    };
    let value = stored.ok_or_else(|| missing("the version key is absent".into()))?;
    match parse_format(value) {
        Some(FORMAT_VERSION) => Ok(()),
        Some(found) => Err(StoreError::UnsupportedFormat {
            path: path.to_path_buf(),
            found,
        }),
        None => Err(missing(format!(
            "the version value has {} bytes, not 4",
            value.len()
        ))),
    }
}

// The handle must stay shareable across a batch runner's threads.
const _: () = {
    const fn shareable<T: Send + Sync + Clone>() {}
    shareable::<Store>();
};

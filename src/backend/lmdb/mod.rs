//! The LMDB backend (through `heed`): one environment per store directory,
//! one named database per [`Table`], zero-copy reads borrowed from the map,
//! and claim and GC locks as open-file-description locks on files beside
//! the data.

mod check;
mod env;
pub(crate) use check::STORE_FILES;
mod locks;
mod open;
pub(crate) use open::OpenFor;
use open::*;
pub(crate) mod pages;
mod sum;

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use heed::types::Bytes;
use heed::{Database, Env, MdbError, PutFlags, RoTxn, RwTxn, WithoutTls};

use super::{
    Backend, Direction, Entries, HeldLock, KeyRange, ReadTables, StorageStats, Table, Visitor,
    WriteTables,
};
use crate::backend::BackendError;
use crate::backend::format::{FORMAT_VERSION, FORMAT_VERSION_KEY, parse_format};
use crate::backend::{ClaimKey, Durability};

/// Virtual map reserved when no maximum is configured: 1 TiB. LMDB files grow
/// only as pages are used, so this costs address space, not disk.
pub const DEFAULT_MAP_SIZE: u64 = 1 << 40;

/// Map sizes are rounded up to a multiple of this (a multiple of every page size).
const MAP_ALIGN: u64 = 1 << 20;

/// The largest maximum map size accepted: 64 TiB on 64-bit platforms, half
/// of the 128 TiB of address space a process gets on x86-64 (and at least
/// that on AArch64), 2 GiB on 32-bit ones. A system may still refuse to
/// reserve less (an address-space limit): opening then fails the same way.
pub const MAX_MAP_SIZE: u64 = if usize::BITS >= 64 { 1 << 46 } else { 1 << 31 };

/// How to open an LMDB store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LmdbOptions {
    /// Commit durability.
    pub durability: Durability,
    /// Largest size the data file may reach (`None`: [`DEFAULT_MAP_SIZE`]).
    pub max_map_size: Option<u64>,
}

/// An open LMDB environment with the store's databases.
pub struct LmdbBackend {
    env: Env<WithoutTls>,
    dbs: TableDbs,
    path: PathBuf,
    location: String,
    options: LmdbOptions,
    map_size: u64,
    /// `<store>/claims.lock`, opened on first use.
    claims: OnceLock<std::fs::File>,
    /// Why the store is open read-only (`None`: it is writable).
    read_only: Option<String>,
    /// Whether values carry checksums (the checksummed layout; `sum.rs`).
    checksums: bool,
}

impl fmt::Debug for LmdbBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LmdbBackend")
            .field("path", &self.path)
            .field("options", &self.options)
            .finish()
    }
}

impl LmdbBackend {
    /// Opens the environment in `path` (a canonical directory that exists),
    /// creating the databases and writing the format version in a new
    /// store, and checking the version of an existing one.
    ///
    /// The caller must not open one path twice in a process (LMDB forbids
    /// it): [`crate::Store::open`] keeps a registry for that.
    pub(crate) fn open(
        path: &Path,
        options: LmdbOptions,
        purpose: OpenFor,
    ) -> Result<LmdbBackend, BackendError> {
        // A store this user may not write (a read-only file system, or
        // files of another user that they may read) opens read-only; so
        // does a damaged store opened to be salvaged.
        let read_only = match (purpose, check::read_only(path)) {
            (OpenFor::Use, found) => found,
            (OpenFor::Salvage, Some(found)) => Some(found),
            (OpenFor::Salvage, None) => Some((
                env::ReadOnly::WithLocks,
                "it is opened to be salvaged, which never writes to it".to_owned(),
            )),
        };
        // Before LMDB opens anything: a planted link (or, to write, another
        // user's file) is refused; a truncated data file would crash on read.
        check::store_files(path, read_only.is_none())?;
        check::data_file(path)?;
        let requested = options.max_map_size.unwrap_or(DEFAULT_MAP_SIZE);
        let too_large = || BackendError::MapTooLarge {
            path: path.to_path_buf(),
            requested,
            max: MAX_MAP_SIZE,
        };
        if requested > MAX_MAP_SIZE {
            return Err(too_large());
        }
        // Cannot overflow: MAX_MAP_SIZE is a multiple of MAP_ALIGN.
        let map_size = requested.max(MAP_ALIGN).div_ceil(MAP_ALIGN) * MAP_ALIGN;
        let usize_map = usize::try_from(map_size).map_err(|_| too_large())?;
        let mode = read_only.as_ref().map(|(mode, _)| *mode);
        let env =
            env::open_env(path, usize_map, options.durability, mode).map_err(|e| match e {
                // The system would not reserve that much address space.
                heed::Error::Io(io) if io.raw_os_error() == Some(nix::libc::ENOMEM) => too_large(),
                e => map_error(path, map_size, env::MAX_READERS, "opening".into(), e),
            })?;
        // LMDB never maps less than the data file: a maximum below the
        // file's size gives way to the file's size, and errors name that.
        let map_size = map_size.max(env.info().map_size as u64);
        let fail = |op: &str, e| map_error(path, map_size, env.max_readers(), op.into(), e);
        if read_only.is_none() {
            env.clear_stale_readers()
                .map_err(|e| fail("clearing stale readers", e))?;
        }
        let (dbs, checksums) = open_databases(&env, path, purpose, read_only.is_some(), &fail)
            .map_err(|e| match (&read_only, e) {
                // A store with no databases yet needs a write to create them.
                (Some((_, reason)), BackendError::Lmdb { op, .. }) if op == "creating" => {
                    BackendError::ReadOnly {
                        path: path.to_path_buf(),
                        op: "create the store's databases".into(),
                        reason: reason.clone(),
                    }
                }
                (_, e) => e,
            })?;
        Ok(LmdbBackend {
            env,
            dbs,
            path: path.to_path_buf(),
            location: path.display().to_string(),
            options,
            map_size,
            claims: OnceLock::new(),
            read_only: read_only.map(|(_, reason)| reason),
            checksums,
        })
    }

    /// Whether every value carries its checksum (stores created by this
    /// build; a store of the legacy layout reads as it is, and `copy`
    /// into a new store upgrades it).
    pub fn checksums(&self) -> bool {
        self.checksums
    }

    /// Why the store is open read-only here, if it is: its file system is
    /// read-only, or this user may not write its files. Reads work; every
    /// write, claim and GC lock fails with [`BackendError::ReadOnly`].
    pub fn read_only(&self) -> Option<&str> {
        self.read_only.as_deref()
    }

    fn refuse_if_read_only(&self, op: &str) -> Result<(), BackendError> {
        match &self.read_only {
            Some(reason) => Err(BackendError::ReadOnly {
                path: self.path.clone(),
                op: op.to_owned(),
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// The options this environment was opened with.
    pub fn options(&self) -> LmdbOptions {
        self.options
    }

    /// The table's database; `None` in a store opened read-only that
    /// was made before the table existed (it reads as empty).
    fn db(&self, table: Table) -> Option<Database<Bytes, Bytes>> {
        self.dbs.get(table)
    }

    /// The table's database, to write it.
    fn db_to_write(&self, table: Table) -> Result<Database<Bytes, Bytes>, BackendError> {
        self.db(table).ok_or_else(|| BackendError::ReadOnly {
            path: self.path.clone(),
            op: format!("write {table}"),
            reason: self
                .read_only
                .clone()
                .unwrap_or_else(|| format!("the store has no {table} table")),
        })
    }

    fn error(&self, op: String, e: heed::Error) -> BackendError {
        map_error(&self.path, self.map_size, self.env.max_readers(), op, e)
    }
}

/// Maps an LMDB error to the store error a user can act on.
fn map_error(
    path: &Path,
    map_size: u64,
    max_readers: u32,
    op: String,
    e: heed::Error,
) -> BackendError {
    let path = path.to_path_buf();
    match e {
        heed::Error::Mdb(MdbError::MapFull) => BackendError::MapFull { path, map_size },
        heed::Error::Mdb(MdbError::MapResized) => BackendError::MapResized { path },
        heed::Error::Mdb(MdbError::ReadersFull) => BackendError::ReadersFull {
            path,
            max: max_readers,
        },
        heed::Error::Io(io) if io.raw_os_error() == Some(28) || io.raw_os_error() == Some(122) => {
            // ENOSPC and EDQUOT on Linux.
            BackendError::DiskFull { path }
        }
        // LMDB turns a short write (what a full disk gives a `pwrite`
        // that wrote part of its pages) into EIO: a full file system is
        // the likely reason, and says so when it has no room left.
        heed::Error::Io(io) if io.raw_os_error() == Some(5) && disk_is_full(&path) => {
            BackendError::DiskFull { path }
        }
        heed::Error::Mdb(
            e
            @ (MdbError::Corrupted | MdbError::PageNotFound | MdbError::Panic | MdbError::Invalid),
        ) => BackendError::DamagedPage {
            path: path.join("data.mdb"),
            op,
            detail: format!("LMDB: {e}"),
        },
        // LMDB marks a transaction failed after such an error; every later
        // use of it says BAD_TXN. Errors end a write transaction at once
        // here, so in practice that is a read after a damaged page.
        heed::Error::Mdb(e @ MdbError::BadTxn) => BackendError::DamagedPage {
            path: path.join("data.mdb"),
            op,
            detail: format!("LMDB: {e} (after a damaged page in the same transaction)"),
        },
        source => BackendError::Lmdb { op, path, source },
    }
}

/// Whether the file system holding `dir` has (next to) no room left for
/// an unprivileged writer: less than 64 KiB, a few pages.
fn disk_is_full(dir: &Path) -> bool {
    nix::sys::statvfs::statvfs(dir)
        .is_ok_and(|fs| fs.blocks_available().saturating_mul(fs.fragment_size()) < 64 << 10)
}

/// A value no longer than the whole map, else the page that gave it is
/// damaged (a garbage length LMDB trusted); checked before anyone copies
/// it. In a checksummed store, the value without its trailer, which must
/// match (else the value changed on disk: damage, naming the key).
fn sane<'t>(
    backend: &LmdbBackend,
    table: Table,
    key: &[u8],
    v: &'t [u8],
) -> Result<&'t [u8], BackendError> {
    if v.len() as u64 > backend.map_size {
        return Err(BackendError::DamagedPage {
            path: backend.path.join("data.mdb"),
            op: format!("reading {table}"),
            detail: format!(
                "a value of {} bytes in a map of {} bytes",
                v.len(),
                backend.map_size
            ),
        });
    }
    if !backend.checksums {
        return Ok(v);
    }
    sum::strip(table, key, v).ok_or_else(|| BackendError::DamagedPage {
        path: backend.path.join("data.mdb"),
        op: format!("reading {table}"),
        detail: format!(
            "the value of key {} in {table} does not match its checksum (a byte changed on disk)",
            crate::hash::hex(key)
        ),
    })
}

/// The span a range scan prefetches when it enters a page: the smallest
/// page LMDB uses (the OS page), aligned, so the lines hinted are those of
/// the page a record lies in.
const PREFETCH_PAGE: usize = 4096;

/// LMDB's key size limit in its default build (`mdb_env_get_maxkeysize`).
const MAX_KEY_LEN: usize = 511;

/// Cache lines of a value [`get`] prefetches from its start (up to 512
/// bytes: a blob's header, its refs and a short text; most thread records).
const GET_PREFETCH_LINES: usize = 8;

/// Reads shared by read and write transactions.
fn get<'t>(
    backend: &LmdbBackend,
    txn: &'t RoTxn<'_, WithoutTls>,
    table: Table,
    key: &[u8],
) -> Result<Option<Cow<'t, [u8]>>, BackendError> {
    let Some(db) = backend.db(table) else {
        return Ok(None);
    };
    // A key LMDB cannot hold (empty, or past its 511-byte limit) is in no
    // table: asked for one (a workflow named "" by a request), the answer
    // is "absent", as on the other backends, not MDB_BAD_VALSIZE.
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Ok(None);
    }
    db.get(txn, key)
        .map_err(|e| backend.error(format!("reading {table}"), e))?
        .map(|v| {
            // The value's lines from its second (the first is usually the
            // line of LMDB's node header, just read) and its last, all at
            // once: the checksum reads its header and its trailer, a decode
            // the rest in order, and a random key's value is rarely in the
            // cache. Asked for together, their misses overlap instead of
            // following one another (a content blob's get + decode 4–21%
            // faster, docs/benchmarks.md). A length past the map (a damaged
            // page, which `sane` refuses) gets none.
            if v.len() as u64 <= backend.map_size {
                let second = 64 - v.as_ptr() as usize % 64;
                for at in (second..v.len()).step_by(64).take(GET_PREFETCH_LINES - 1) {
                    crate::prefetch::prefetch_addr(v.as_ptr().wrapping_add(at));
                }
                if let Some(last) = v.last().filter(|_| backend.checksums) {
                    crate::prefetch::prefetch(last);
                }
            }
            sane(backend, table, key, v).map(Cow::Borrowed)
        })
        .transpose()
}

fn range<'t>(
    backend: &'t LmdbBackend,
    txn: &'t RoTxn<'_, WithoutTls>,
    table: Table,
    range: KeyRange<'_>,
    direction: Direction,
) -> Result<Entries<'t>, BackendError> {
    let bounds = (range.lower, range.upper);
    let Some(db) = backend.db(table) else {
        return Ok(Box::new(std::iter::empty()));
    };
    let op = move || format!("scanning {table}");
    let entries: Entries<'t> = match direction {
        Direction::Forward => Box::new(
            db.range(txn, &bounds)
                .map_err(|e| backend.error(op(), e))?
                .map(move |r| {
                    let (k, v) = r.map_err(|e| backend.error(op(), e))?;
                    Ok((Cow::Borrowed(k), Cow::Borrowed(sane(backend, table, k, v)?)))
                }),
        ),
        Direction::Reverse => Box::new(
            db.rev_range(txn, &bounds)
                .map_err(|e| backend.error(op(), e))?
                .map(move |r| {
                    let (k, v) = r.map_err(|e| backend.error(op(), e))?;
                    Ok((Cow::Borrowed(k), Cow::Borrowed(sane(backend, table, k, v)?)))
                }),
        ),
    };
    Ok(entries)
}

/// A forward scan straight over heed's cursor: no boxing, borrowed slices.
fn visit_range(
    backend: &LmdbBackend,
    txn: &RoTxn<'_, WithoutTls>,
    table: Table,
    range: KeyRange<'_>,
    visit: &mut Visitor<'_>,
) -> Result<(), BackendError> {
    let bounds = (range.lower, range.upper);
    let op = || format!("scanning {table}");
    let Some(db) = backend.db(table) else {
        return Ok(());
    };
    let mut iter = db.range(txn, &bounds).map_err(|e| backend.error(op(), e))?;
    // One record ahead: while `visit` reads this one, the next one's
    // bytes are on their way. A leaf page's records lie in it in no
    // useful order, so the first record read from a page has the whole
    // page (4 KiB, whatever LMDB's page size: the hint is for lines of
    // that 4 KiB only, never beyond it) prefetched; a large value, most of
    // it on overflow pages, has its first lines. The GC's scan, which reads
    // every blob's header and refs, went from about 300 to 250 ms over
    // 1 M blobs (docs/benchmarks.md).
    let mut current = iter.next();
    // The page of the first record is not prefetched: a short scan (a
    // listing's page) stays on one or two pages and would only crowd the
    // cache with lines it never reads.
    let mut page = match &current {
        Some(Ok((_, v))) => v.as_ptr() as usize / PREFETCH_PAGE,
        _ => 0,
    };
    while let Some(entry) = current {
        let (key, value) = entry.map_err(|e| backend.error(op(), e))?;
        current = iter.next();
        if let Some(Ok((_, next))) = &current {
            let at = next.as_ptr() as usize;
            if at / PREFETCH_PAGE != page && next.len() < PREFETCH_PAGE / 2 {
                page = at / PREFETCH_PAGE;
                let first = next.as_ptr().wrapping_sub(at % PREFETCH_PAGE);
                for line in (0..PREFETCH_PAGE).step_by(64) {
                    crate::prefetch::prefetch_addr(first.wrapping_add(line));
                }
            } else {
                for line in next.iter().step_by(64).take(8) {
                    crate::prefetch::prefetch(line);
                }
            }
        }
        if !visit(key, sane(backend, table, key, value)?)? {
            break;
        }
    }
    Ok(())
}

fn count(
    backend: &LmdbBackend,
    txn: &RoTxn<'_, WithoutTls>,
    table: Table,
) -> Result<u64, BackendError> {
    let Some(db) = backend.db(table) else {
        return Ok(0);
    };
    db.len(txn)
        .map_err(|e| backend.error(format!("counting {table}"), e))
}

struct LmdbRead<'e> {
    txn: RoTxn<'e, WithoutTls>,
    backend: &'e LmdbBackend,
}

struct LmdbWrite<'e> {
    txn: RwTxn<'e>,
    backend: &'e LmdbBackend,
}

/// Reads are the same for both kinds of transaction (a write transaction
/// derefs to a read one).
macro_rules! lmdb_reads {
    ($txn:ident) => {
        impl ReadTables for $txn<'_> {
            fn get(&self, table: Table, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>, BackendError> {
                get(self.backend, &self.txn, table, key)
            }

            fn range(
                &self,
                table: Table,
                r: KeyRange<'_>,
                direction: Direction,
            ) -> Result<Entries<'_>, BackendError> {
                range(self.backend, &self.txn, table, r, direction)
            }

            fn count(&self, table: Table) -> Result<u64, BackendError> {
                count(self.backend, &self.txn, table)
            }

            fn visit_range(
                &self,
                table: Table,
                r: KeyRange<'_>,
                visit: &mut Visitor<'_>,
            ) -> Result<(), BackendError> {
                visit_range(self.backend, &self.txn, table, r, visit)
            }
        }
    };
}

lmdb_reads!(LmdbRead);
lmdb_reads!(LmdbWrite);

impl WriteTables for LmdbWrite<'_> {
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), BackendError> {
        let db = self.backend.db_to_write(table)?;
        let written = if self.backend.checksums {
            // Written in place: LMDB reserves the room, no copy of the value.
            let trailer = sum::sum(table, key, value);
            db.put_reserved(&mut self.txn, key, value.len() + sum::SUM_LEN, |space| {
                use std::io::Write;
                space.write_all(value)?;
                space.write_all(&trailer)
            })
        } else {
            db.put(&mut self.txn, key, value)
        };
        written.map_err(|e| self.backend.error(format!("writing {table}"), e))
    }

    fn insert(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<bool, BackendError> {
        let stored;
        let value = if self.backend.checksums {
            stored = sum::with_sum(table, key, value);
            &stored[..]
        } else {
            value
        };
        match self.backend.db_to_write(table)?.put_with_flags(
            &mut self.txn,
            PutFlags::NO_OVERWRITE,
            key,
            value,
        ) {
            Ok(()) => Ok(true),
            Err(heed::Error::Mdb(MdbError::KeyExist)) => Ok(false),
            Err(e) => Err(self.backend.error(format!("writing {table}"), e)),
        }
    }

    fn delete(&mut self, table: Table, key: &[u8]) -> Result<bool, BackendError> {
        self.backend
            .db_to_write(table)?
            .delete(&mut self.txn, key)
            .map_err(|e| self.backend.error(format!("deleting from {table}"), e))
    }

    fn commit(self: Box<Self>) -> Result<(), BackendError> {
        let backend = self.backend;
        self.txn
            .commit()
            .map_err(|e| backend.error("committing".into(), e))
    }
}

impl Backend for LmdbBackend {
    fn begin_read(&self) -> Result<Box<dyn ReadTables + '_>, BackendError> {
        let txn = self
            .env
            .read_txn()
            .map_err(|e| self.error("starting a read transaction".into(), e))?;
        Ok(Box::new(LmdbRead { txn, backend: self }))
    }

    fn begin_write(&self) -> Result<Box<dyn WriteTables + '_>, BackendError> {
        self.refuse_if_read_only("write")?;
        let txn = self
            .env
            .write_txn()
            .map_err(|e| self.error("starting a write transaction".into(), e))?;
        Ok(Box::new(LmdbWrite { txn, backend: self }))
    }

    fn location(&self) -> &str {
        &self.location
    }

    fn dir(&self) -> Option<&Path> {
        Some(&self.path)
    }

    fn durability(&self) -> Durability {
        self.options.durability
    }

    fn try_lock_claim(&self, id: ClaimKey) -> Result<Option<Box<dyn HeldLock>>, BackendError> {
        self.refuse_if_read_only("claim a thread")?;
        locks::try_lock_claim(self.claims_file()?, &self.path, id)
    }

    fn claim_locked(&self, id: ClaimKey) -> Result<bool, BackendError> {
        if self.read_only.is_some() {
            // Read-only: look at the claims without creating the file (no
            // file, no claims) and without tightening its mode.
            return match locks::open_claims_read_only(&self.path)? {
                Some(file) => locks::claim_locked(&file, &self.path, id),
                None => Ok(false),
            };
        }
        locks::claim_locked(self.claims_file()?, &self.path, id)
    }

    fn try_lock_gc(&self) -> Result<Option<Box<dyn HeldLock>>, BackendError> {
        self.refuse_if_read_only("collect garbage")?;
        locks::try_lock_gc(&self.path)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn storage_stats(&self) -> Result<StorageStats, BackendError> {
        let txn = self
            .env
            .read_txn()
            .map_err(|e| self.error("reading statistics".into(), e))?;
        let stat = match self.db(Table::Blobs) {
            Some(db) => Some(
                db.stat(&txn)
                    .map_err(|e| self.error("reading statistics".into(), e))?,
            ),
            None => None,
        };
        drop(txn);
        let info = self.env.info();
        let page = u64::from(stat.as_ref().map_or(4096, |s| s.page_size));
        let file_size = std::fs::metadata(self.path.join("data.mdb"))
            .map(|m| m.len())
            .map_err(|source| BackendError::Io {
                op: "read the size of",
                path: self.path.join("data.mdb"),
                source,
            })?;
        Ok(StorageStats {
            blob_bytes: stat.map_or(0, |s| {
                (s.branch_pages + s.leaf_pages + s.overflow_pages) as u64 * page
            }),
            map_size: info.map_size as u64,
            max_map_size: self.options.max_map_size,
            map_used: (info.last_page_number as u64 + 1) * page,
            file_size,
            readers: info.number_of_readers,
            max_readers: info.maximum_number_of_readers,
            value_checksums: self.checksums,
        })
    }
}

impl LmdbBackend {
    fn claims_file(&self) -> Result<&std::fs::File, BackendError> {
        if let Some(f) = self.claims.get() {
            return Ok(f);
        }
        let path = self.path.join("claims.lock");
        let file = locks::open_lock_file(&path, true, "open the claim lock file")?;
        // A racing thread may have set it first; either file works, and the
        // loser's is closed (it holds no locks yet).
        Ok(self.claims.get_or_init(|| file))
    }
}

//! `salvage`: copy everything that can still be read out of a damaged
//! store into a new one, and say what was lost (`docs/design.md` §6b).
//!
//! LMDB keeps no page checksums. A damaged page is found only where it
//! breaks the B-tree: LMDB returns `MDB_CORRUPTED` or `MDB_PAGE_NOTFOUND`,
//! trips one of its assertions, or follows a garbage pointer and the
//! process dies. So the reading is done by a [`SalvageSource`] that may
//! fail at any row and be asked to start again at any key: the CLI's
//! source runs each read in a child process, so a crash costs that read
//! only; [`StoreSource`] reads in this process (for a store whose damage
//! gives errors, not crashes, and for tests).
//!
//! What is kept, table by table, in [`salvage_order`]:
//!
//! - **blobs** whose record parses, whose bytes hash to their key, decode
//!   canonically and agree with their header; then every blob that refers,
//!   directly or through others, to a blob that was not kept is dropped
//!   too, so the new store has no dangling ref;
//! - **workflows** and **pins** that name a kept blob (a workflow blob for
//!   `workflows`);
//! - **thread records** (`threads` and `history`) that decode, sit under
//!   their own id, and whose start, head, workflow and staged summary are
//!   kept blobs of the right kinds: since the head's chain of parents was
//!   kept whole or not at all, such a thread's history is complete.
//!
//! The other thread tables (`history_ids`, `activity`, `children`) are
//! derived from the records and are rebuilt, not read. `meta` is not
//! copied: the new store has its own format version and no GC or copy in
//! progress.
//!
//! When a read fails after key K, the next readable key is searched for:
//! first K + 1, then K + 2, K + 4, … (as big-endian numbers of K's length),
//! until a read at K + 2^b succeeds; then a bisection between K + 2^(b-1)
//! and K + 2^b, to 16 bits of precision, finds the lowest start that reads.
//! Keys between K and that start are reported lost. For hash keys (blobs)
//! the lost range is about the damaged page's share of the key space.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::backend::{Direction, KeyRange, Table};
use crate::hash::{Hash, hex};
use crate::node::Kind;
use crate::store::{BlobRecord, Store, StoreError};
use crate::thread::record::history_key;
use crate::thread::{ThreadError, ThreadId, ThreadRecord, index, utc_day};
use crate::verify::VerifyReport;

mod datafile;
mod read;
use read::{read_table, recover};
pub mod process;
pub use datafile::{LmdbDataFile, MetaPage, OrphanScan};

/// Rows per destination write transaction.
const CHUNK_ROWS: usize = 1024;
/// Bytes per destination write transaction (at least one row).
const CHUNK_BYTES: usize = 8 << 20;
/// Bits of precision of the bisection that narrows a lost range.
const BISECT_BITS: u32 = 16;
/// Unreadable stretches after which a table is given up (the rest of it
/// reported lost): with the search's reads per stretch, this bounds the
/// reads one table costs.
pub const MAX_LOST_STRETCHES: usize = 256;

/// Reads rows of a store that may be damaged.
pub trait SalvageSource {
    /// Gives `table`'s rows in key order, from the first key at or after
    /// `from` (every row when `None`), to `sink` until it returns `false`
    /// or the table ends. Returns `Ok(true)` at the end of the table,
    /// `Ok(false)` when the sink stopped, and `Err(what happened)` when
    /// the read failed (after the rows already given).
    fn read(
        &mut self,
        table: Table,
        from: Option<&[u8]>,
        sink: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<bool, ReadFailure>;

    /// Gives `sink` rows of `table` that no read reaches because a page
    /// of the table's tree above them is damaged, found some other way
    /// (for LMDB, on the leaf pages no tree reaches:
    /// [`LmdbDataFile::orphan_rows`]), in no order. Called for a table
    /// with lost stretches; the salvage takes the rows inside them. The
    /// default finds none.
    fn orphans(
        &mut self,
        table: Table,
        sink: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Result<(), ReadFailure> {
        let _ = (table, sink);
        Ok(())
    }
}

/// Why a [`SalvageSource`] read failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadFailure {
    /// The read failed at or after a key (a damaged page): a read that
    /// starts at a later key may succeed.
    Page(String),
    /// No read is worth trying any more (the store cannot be opened at
    /// all, or readers keep stalling): the salvage stops and reports what
    /// it kept so far.
    Stop(String),
}

impl std::fmt::Display for ReadFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadFailure::Page(d) | ReadFailure::Stop(d) => f.write_str(d),
        }
    }
}

/// A [`SalvageSource`] reading an open store in this process: a damaged
/// page that gives an error is survived; one that crashes LMDB is not.
#[derive(Debug)]
pub struct StoreSource<'s>(pub &'s Store);

impl SalvageSource for StoreSource<'_> {
    fn read(
        &mut self,
        table: Table,
        from: Option<&[u8]>,
        sink: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<bool, ReadFailure> {
        self.0
            .read(|r| {
                let range = from.map_or(KeyRange::ALL, KeyRange::from);
                for entry in r.tables().range(table, range, Direction::Forward)? {
                    let (k, v) = entry?;
                    if !sink(&k, &v) {
                        return Ok(false);
                    }
                }
                Ok::<_, StoreError>(true)
            })
            .map_err(|e| ReadFailure::Page(e.to_string()))
    }
}

/// Opens the LMDB store in directory `dir` to be salvaged: read-only
/// (nothing in it is created or changed), and opened even when the page
/// that holds its format version is damaged, the layout (values with or
/// without checksums) then told from the rows that can be read. A store
/// of a newer format is still refused. Read it with [`StoreSource`].
///
/// ```
/// use uwf_db::{Blob, Store, StoreOptions, salvage::{StoreSource, open_damaged, salvage}};
/// let dir = tempfile::tempdir().unwrap();
/// let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
/// Store::open(&src, StoreOptions::default()).unwrap().put(&Blob::content("hello", [])).unwrap();
/// let damaged = open_damaged(&src).unwrap();
/// let new = Store::open(&dst, StoreOptions::default()).unwrap();
/// let report = salvage(&mut StoreSource(&damaged), &new, |_| {}).unwrap();
/// assert!(report.is_complete());
/// assert_eq!(new.stats().unwrap().blob_count, 1);
/// ```
pub fn open_damaged(dir: &Path) -> Result<Store, crate::store::OpenError> {
    Store::open_damaged(dir)
}

/// The tables a salvage reads, in order: blobs first, then what names
/// them, then the thread records.
///
/// ```
/// use uwf_db::backend::Table;
/// assert_eq!(uwf_db::salvage::salvage_order()[0], Table::Blobs);
/// ```
pub fn salvage_order() -> [Table; 5] {
    [
        Table::Blobs,
        Table::Workflows,
        Table::Pins,
        Table::Threads,
        Table::History,
    ]
}

/// Keys a salvage could not read: everything after `after` and before
/// `before` in one table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct LostRange {
    /// The last key read before the failure, in hex (`None`: the table's
    /// start).
    pub after: Option<String>,
    /// The first key read again, in hex (`None`: nothing after the failure
    /// could be read).
    pub before: Option<String>,
    /// What the failed read said.
    pub detail: String,
}

/// What happened to one table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct TableSalvage {
    /// The table's name.
    pub table: &'static str,
    /// Rows read.
    pub read: u64,
    /// Rows written to the new store.
    pub kept: u64,
    /// Rows read and not kept (each has a reason in the report).
    pub dropped: u64,
    /// Stretches of keys that could not be read.
    pub lost: Vec<LostRange>,
    /// Reads started (one, plus the probes that looked for a readable key
    /// after each failure).
    pub reads: u64,
    /// Rows of the lost stretches found below a damaged page (on pages no
    /// read reaches) and read anyway; counted in `read` too. Stretches
    /// stay listed as lost: what was on the damaged page itself is gone.
    pub recovered: u64,
}

/// A row read and not kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Dropped {
    /// The table.
    pub table: &'static str,
    /// The key (a hash, a thread id, or hex).
    pub key: String,
    /// Why.
    pub reason: String,
}

/// What [`salvage`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct SalvageReport {
    /// One entry per table read, in [`salvage_order`].
    pub tables: Vec<TableSalvage>,
    /// Rows read and not kept, with the reason (at most
    /// [`SalvageReport::DROPPED_LISTED`]; the counts are in `tables`).
    pub dropped: Vec<Dropped>,
    /// Thread records kept.
    pub threads: u64,
    /// Why the reading stopped before the end (a [`ReadFailure::Stop`]):
    /// the tables not read are reported lost.
    pub stopped: Option<String>,
    /// The new store's `verify` report.
    pub verify: VerifyReport,
}

impl SalvageReport {
    /// Most dropped rows listed one by one.
    pub const DROPPED_LISTED: usize = 1000;

    /// Whether everything was read and kept.
    pub fn is_complete(&self) -> bool {
        self.stopped.is_none()
            && self
                .tables
                .iter()
                .all(|t| t.lost.is_empty() && t.dropped == 0)
    }

    /// Counts `change` into the entry of `table` (one per table of
    /// [`salvage_order`], made when the report is).
    fn count(&mut self, table: Table, change: impl FnOnce(&mut TableSalvage)) {
        if let Some(t) = self.tables.iter_mut().find(|t| t.table == table.name()) {
            change(t);
        }
    }

    fn drop_row(&mut self, table: Table, key: String, reason: String) {
        self.count(table, |t| t.dropped += 1);
        if self.dropped.len() < Self::DROPPED_LISTED {
            self.dropped.push(Dropped {
                table: table.name(),
                key,
                reason,
            });
        }
    }
}

/// What went wrong with a salvage itself (not with the damaged store).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SalvageError {
    /// The destination already holds blobs or threads.
    #[error(
        "the destination {location} is not empty: salvage writes only into a new store (found {blobs} blobs and {threads} threads)"
    )]
    NotEmpty {
        /// The destination.
        location: String,
        /// Blobs found.
        blobs: u64,
        /// Threads found.
        threads: u64,
    },
    /// Writing the destination failed.
    #[error("writing the salvaged store failed")]
    Store(#[from] StoreError),
    /// Writing a thread record failed.
    #[error("writing a salvaged thread failed")]
    Thread(#[from] ThreadError),
    /// The source's LMDB data file has nothing a salvage can start from.
    #[error("cannot salvage {path}: {detail}")]
    DataFile {
        /// The data file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// Reading the source's data file or writing its working copy failed.
    #[error("cannot {op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

impl From<crate::backend::BackendError> for SalvageError {
    fn from(e: crate::backend::BackendError) -> Self {
        SalvageError::Store(e.into())
    }
}

/// Copies everything readable from `source` into `dst`, which must be
/// empty, and reports what was kept and what was lost; `progress` is
/// called with each table's name as it starts.
///
/// ```
/// use uwf_db::salvage::{StoreSource, salvage};
/// let source = uwf_db::Store::memory();
/// let hash = source.put(&uwf_db::Blob::content("worth keeping", []))?;
/// let dst = uwf_db::Store::memory();
/// let report = salvage(&mut StoreSource(&source), &dst, |_table| {})?;
/// assert!(report.is_complete());
/// assert!(dst.contains(&hash)?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn salvage(
    source: &mut dyn SalvageSource,
    dst: &Store,
    mut progress: impl FnMut(&'static str),
) -> Result<SalvageReport, SalvageError> {
    let (blobs, threads) = dst.read(|r| {
        let t = r.tables();
        Ok::<_, StoreError>((
            t.count(Table::Blobs)?,
            t.count(Table::Threads)? + t.count(Table::History)?,
        ))
    })?;
    if blobs > 0 || threads > 0 {
        return Err(SalvageError::NotEmpty {
            location: dst.location().to_owned(),
            blobs,
            threads,
        });
    }
    let mut report = SalvageReport {
        tables: salvage_order()
            .iter()
            .map(|t| TableSalvage {
                table: t.name(),
                ..TableSalvage::default()
            })
            .collect(),
        ..SalvageReport::default()
    };
    // Kept blobs: kind and refs.
    let mut kept: HashMap<Hash, (Kind, Vec<Hash>)> = HashMap::new();
    let mut writer = Writer::new(dst);

    progress("blobs");
    // A key once: a read gives keys in order, the orphan pages may give
    // a blob again (older copies of a leaf).
    let mut blobs_taken = HashSet::new();
    let mut take = |report: &mut SalvageReport, key: &[u8], value: &[u8]| {
        if !blobs_taken.insert(key.to_vec()) {
            return Ok(false);
        }
        match check_blob(key, value) {
            Ok((hash, kind, refs)) => {
                kept.insert(hash, (kind, refs));
                writer.put(Table::Blobs, key, value)?;
                Ok(true)
            }
            Err(reason) => {
                report.drop_row(Table::Blobs, hex(key), reason);
                Ok(false)
            }
        }
    };
    read_table(source, Table::Blobs, &mut report, &mut take)?;
    recover(source, Table::Blobs, &mut report, take)?;
    writer.flush()?;
    // Drop every blob that reaches a blob that was not kept.
    for (hash, missing) in dangling(&mut kept) {
        report.drop_row(
            Table::Blobs,
            hash.to_string(),
            format!("refers (directly or through others) to {missing}, which was not kept"),
        );
        report.count(Table::Blobs, |t| t.kept -= 1);
        writer.remove(Table::Blobs, hash.as_bytes())?;
    }
    writer.flush()?;

    for (table, name) in [(Table::Workflows, "workflows"), (Table::Pins, "pins")] {
        progress(name);
        let mut take = |report: &mut SalvageReport, key: &[u8], value: &[u8]| {
            let target = if table == Table::Pins { key } else { value };
            let reason = match Hash::from_slice(target) {
                None => Some(format!("{} bytes, not a hash", target.len())),
                Some(h) => match kept.get(&h) {
                    None => Some(format!("names {h}, which was not kept")),
                    Some((kind, _)) if table == Table::Workflows && *kind != Kind::Workflow => {
                        Some(format!("names {h}, a {kind} blob"))
                    }
                    Some(_) => None,
                },
            };
            match reason {
                None => {
                    writer.put(table, key, value)?;
                    Ok(true)
                }
                Some(reason) => {
                    let key = String::from_utf8(key.to_vec()).unwrap_or_else(|_| hex(key));
                    report.drop_row(table, key, reason);
                    Ok(false)
                }
            }
        };
        read_table(source, table, &mut report, &mut take)?;
        recover(source, table, &mut report, take)?;
        writer.flush()?;
    }

    let mut seen: HashSet<ThreadId> = HashSet::new();
    for table in [Table::Threads, Table::History] {
        progress(table.name());
        let mut take = |report: &mut SalvageReport, key: &[u8], value: &[u8]| match check_record(
            table, key, value, &kept,
        ) {
            Ok(record) if seen.insert(record.id) => {
                dst.write(|w| {
                    index::put(w, None, &record)?;
                    Ok::<_, SalvageError>(())
                })?;
                report.threads += 1;
                Ok(true)
            }
            Ok(record) => {
                report.drop_row(
                    table,
                    record.id.to_string(),
                    "a second record of a thread already kept".into(),
                );
                Ok(false)
            }
            Err(reason) => {
                let key = match table {
                    Table::History => key.get(4..).and_then(ThreadId::from_slice),
                    _ => ThreadId::from_slice(key),
                }
                .map_or_else(|| hex(key), |id| id.to_string());
                report.drop_row(table, key, reason);
                Ok(false)
            }
        };
        read_table(source, table, &mut report, &mut take)?;
        recover(source, table, &mut report, take)?;
    }
    progress("verify");
    report.verify = crate::verify::verify(dst, |_| {})?;
    Ok(report)
}

/// A lost stretch of keys: after the first (the table's start when
/// `None`), before the second (its end when `None`).
type Stretch = (Option<Vec<u8>>, Option<Vec<u8>>);

/// A blob row that can be kept: its hash, kind and refs; else why not.
fn check_blob(key: &[u8], value: &[u8]) -> Result<(Hash, Kind, Vec<Hash>), String> {
    let hash = Hash::from_slice(key).ok_or_else(|| format!("a {}-byte key", key.len()))?;
    let mut problems = Vec::new();
    let refs = crate::verify::check_blob(hash, value, &mut problems);
    if let Some(p) = problems.first() {
        return Err(p.to_string());
    }
    let kind = BlobRecord::parse(value).map_err(|e| e.to_string())?.kind;
    Ok((hash, kind, refs))
}

/// Every kept blob that reaches a blob not kept, with one missing blob it
/// reaches; they are removed from `kept`.
fn dangling(kept: &mut HashMap<Hash, (Kind, Vec<Hash>)>) -> Vec<(Hash, Hash)> {
    let mut referrers: HashMap<Hash, Vec<Hash>> = HashMap::new();
    let mut queue = Vec::new();
    for (hash, (_, refs)) in kept.iter() {
        for target in refs {
            referrers.entry(*target).or_default().push(*hash);
            if !kept.contains_key(target) {
                queue.push((*target, *target));
            }
        }
    }
    let mut out = Vec::new();
    while let Some((gone, root)) = queue.pop() {
        for referrer in referrers.get(&gone).into_iter().flatten() {
            if kept.remove(referrer).is_some() {
                out.push((*referrer, root));
                queue.push((*referrer, root));
            }
        }
    }
    out
}

/// A thread record that can be kept, else why not.
fn check_record(
    table: Table,
    key: &[u8],
    value: &[u8],
    kept: &HashMap<Hash, (Kind, Vec<Hash>)>,
) -> Result<ThreadRecord, String> {
    let record =
        ThreadRecord::decode(value).map_err(|e| format!("the record does not decode: {e}"))?;
    let expected = match table {
        Table::History => record
            .completed_at
            .map(|at| history_key(utc_day(at), record.id).to_vec()),
        _ => Some(record.id.to_bytes().to_vec()),
    };
    if expected.as_deref() != Some(key) {
        return Err(format!(
            "the record of thread {} is under another key",
            record.id
        ));
    }
    for (what, hash, want) in record.blob_refs() {
        let Some(hash) = hash else { continue };
        match kept.get(&hash) {
            None => return Err(format!("its {what} {hash} was not kept")),
            Some((kind, _)) if !want.is_empty() && !want.contains(kind) => {
                return Err(format!("its {what} {hash} is a {kind} blob"));
            }
            Some(_) => {}
        }
    }
    Ok(record)
}
/// Destination writes in bounded transactions.
struct Writer<'s> {
    dst: &'s Store,
    puts: Vec<(Table, Vec<u8>, Option<Vec<u8>>)>,
    bytes: usize,
}

impl<'s> Writer<'s> {
    fn new(dst: &'s Store) -> Self {
        Writer {
            dst,
            puts: Vec::new(),
            bytes: 0,
        }
    }

    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), SalvageError> {
        self.bytes += key.len() + value.len();
        self.puts.push((table, key.to_vec(), Some(value.to_vec())));
        self.maybe_flush()
    }

    fn remove(&mut self, table: Table, key: &[u8]) -> Result<(), SalvageError> {
        self.bytes += key.len();
        self.puts.push((table, key.to_vec(), None));
        self.maybe_flush()
    }

    fn maybe_flush(&mut self) -> Result<(), SalvageError> {
        if self.puts.len() >= CHUNK_ROWS || self.bytes >= CHUNK_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), SalvageError> {
        if self.puts.is_empty() {
            return Ok(());
        }
        let puts = std::mem::take(&mut self.puts);
        self.bytes = 0;
        self.dst.write(|w| {
            let t = w.tables_mut();
            for (table, key, value) in &puts {
                match value {
                    Some(v) => t.put(*table, key, v)?,
                    None => t.remove(*table, key)?,
                }
            }
            Ok::<_, StoreError>(())
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;

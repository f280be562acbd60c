//! `copy`: a whole store into another store, on any pair of backends
//! (LMDB → PostgreSQL, PostgreSQL → LMDB, memory, or two stores of one
//! backend), restartable after an interruption and verified at the end.
//! `docs/design.md` §4c states the protocol; in short:
//!
//! 1. **Claim the destination.** Take its GC lock (no collection and no
//!    second copy while this one runs), then, in one write transaction,
//!    either find the marker of an unfinished copy *of the same source*
//!    (a rerun: continue it) or find the store empty and write the marker
//!    ([`UnfinishedCopy`], `meta["copy_in_progress"]`). Anything else is
//!    refused: a copy never merges into an unrelated store.
//! 2. **Copy every table from one source snapshot** (one read
//!    transaction), in [`copy_order`]: settings, blobs, then the roots that
//!    name blobs (workflows, pins), then the thread tables. Each
//!    destination transaction handles a bounded chunk of rows: it reads the
//!    destination's rows in the same key span and makes them equal to the
//!    source's (writes missing or different rows, deletes rows the source
//!    does not have). A first run finds nothing there and only writes; a
//!    rerun after a kill finds what the killed run committed, skips it and
//!    goes on, and if the source changed in between, the destination ends
//!    up equal to the new snapshot — never a mix, never a duplicate.
//! 3. **Compare**: the row count and a BLAKE3 digest of every table,
//!    computed from the source rows as they were streamed and from a fresh
//!    snapshot of the destination ([`table_digests`]), must agree.
//! 4. **Verify** the destination ([`crate::verify`]), then delete the
//!    marker. Until that commit the destination says it is unfinished.
//!
//! The library never prints: progress goes to a callback, the outcome is a
//! [`CopyReport`] or a [`CopyError`].

use std::collections::VecDeque;
use std::time::Instant;

use serde::Serialize;

use crate::backend::memory::MemoryBackend;
use crate::backend::{BackendError, Direction, KeyRange, ReadTables, Table};
use crate::engine::Cancel;
use crate::store::{
    COPY_MARKER_KEY, FORMAT_VERSION_KEY, GC_EPOCH_KEY, Store, StoreError, UnfinishedCopy, now_ms,
    read_format_version,
};
use crate::verify::{Problem, VerifyProgress, VerifyReport};

mod table;
use table::*;

/// Rows per destination transaction unless told otherwise.
pub const DEFAULT_CHUNK_ROWS: usize = 1024;

/// Bytes of keys and values per destination transaction unless told
/// otherwise (a chunk always holds at least one row, however large).
pub const DEFAULT_CHUNK_BYTES: usize = 8 << 20;

/// `meta` keys that describe what is happening to one store, not what it
/// holds: never copied, never compared, never deleted from a destination.
/// A new `meta` key is copied unless it is listed here (`docs/design.md`
/// §4 says, for each key, whether it is).
const NOT_COPIED: [&str; 2] = [GC_EPOCH_KEY, COPY_MARKER_KEY];

/// The position of a table in the copy (an exhaustive match, so a new
/// table cannot be forgotten): settings first; then blobs; then what
/// names blobs and nothing else (workflows, pins); then the thread tables,
/// records before the indexes that point at them. A copy interrupted at
/// any commit therefore never holds a root whose blob is missing.
const fn copy_rank(table: Table) -> usize {
    match table {
        Table::Meta => 0,
        Table::Blobs => 1,
        Table::Workflows => 2,
        Table::Pins => 3,
        Table::Threads => 4,
        Table::History => 5,
        Table::HistoryIds => 6,
        Table::Activity => 7,
        Table::Children => 8,
        Table::Labels => 9,
    }
}

/// Every table, in the order a copy writes them (see `docs/design.md` §4c).
///
/// ```
/// use uwf_db::backend::Table;
/// let order = uwf_db::copy::copy_order();
/// assert_eq!(order.len(), Table::ALL.len());
/// // Blobs before anything that names them.
/// let at = |t| order.iter().position(|x| *x == t);
/// assert!(at(Table::Blobs) < at(Table::Threads));
/// ```
pub fn copy_order() -> [Table; 10] {
    let mut tables = Table::ALL;
    tables.sort_by_key(|t| copy_rank(*t));
    tables
}

/// Whether a row of `table` is part of what a copy moves.
fn copied(table: Table, key: &[u8]) -> bool {
    table != Table::Meta || !NOT_COPIED.iter().any(|k| k.as_bytes() == key)
}

/// How to copy.
#[derive(Debug, Clone)]
pub struct CopyOptions {
    /// Most rows per destination write transaction (at least 1).
    pub chunk_rows: usize,
    /// Most bytes of keys and values per destination write transaction;
    /// a chunk always takes at least one row.
    pub chunk_bytes: usize,
    /// Checked before each destination transaction: once cancelled, the
    /// copy stops with [`CopyError::Cancelled`] and a rerun continues it.
    pub cancel: Option<Cancel>,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            chunk_rows: DEFAULT_CHUNK_ROWS,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            cancel: None,
        }
    }
}

/// Where a copy is, for progress display.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CopyProgress {
    /// The source snapshot is open and the destination claimed.
    Started {
        /// Rows in the source snapshot, all tables.
        total: u64,
        /// Whether this run continues an unfinished copy.
        resumed: bool,
    },
    /// A destination transaction committed.
    Copied {
        /// The table being copied.
        table: Table,
        /// Source rows handled so far, all tables.
        done: u64,
        /// Rows in the source snapshot, all tables.
        total: u64,
    },
    /// Reading the destination back to compare it with the source.
    Comparing {
        /// The table being read.
        table: Table,
    },
    /// Verifying the destination.
    Verifying(VerifyProgress),
}

/// One table of a copy, as the [`CopyReport`] gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct TableCopy {
    /// The table.
    #[serde(serialize_with = "table_name")]
    #[schemars(with = "String")]
    pub table: Table,
    /// Rows in the source snapshot, now also in the destination.
    pub rows: u64,
    /// Bytes of their keys and values.
    pub bytes: u64,
    /// Rows this run wrote (missing from the destination, or different).
    pub written: u64,
    /// Destination rows this run deleted (not in the source snapshot: left
    /// by an earlier run from a source that changed since).
    pub deleted: u64,
    /// The table's digest (see [`TableDigest`]), equal on both sides.
    pub digest: String,
}

/// A table's contents in brief: what [`table_digests`] returns and
/// what a copy compares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct TableDigest {
    /// The table.
    #[serde(serialize_with = "table_name")]
    #[schemars(with = "String")]
    pub table: Table,
    /// Rows (in `meta`, those a copy moves).
    pub rows: u64,
    /// Bytes of their keys and values.
    pub bytes: u64,
    /// BLAKE3, in hex, over every row in key order, each row as its key's
    /// length (u64 big-endian), the key, its value's length (u64
    /// big-endian) and the value.
    pub digest: String,
}

fn table_name<S: serde::Serializer>(table: &Table, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(table.name())
}

/// What a finished copy did and found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct CopyReport {
    /// The source's location.
    pub source: String,
    /// The destination's location.
    pub destination: String,
    /// Whether this run continued an unfinished copy.
    pub resumed: bool,
    /// Every table, in copy order.
    pub tables: Vec<TableCopy>,
    /// Rows copied, all tables.
    pub rows: u64,
    /// Bytes of their keys and values.
    pub bytes: u64,
    /// Rows this run wrote.
    pub written: u64,
    /// Destination rows this run deleted.
    pub deleted: u64,
    /// The destination's verification (clean, or the copy fails).
    pub verify: VerifyReport,
    /// Wall time of the whole copy, verification included.
    pub elapsed_ms: u64,
}

/// Refuses an LMDB destination `dir` that is a directory holding anything
/// but a store's own files: `copy` (which creates the store) writes its
/// files only into a new or empty directory, or a store. A path that does
/// not exist, or a store (it has `data.mdb`), passes; what a store holds
/// is [`copy_to`]'s to check.
///
/// ```
/// let dir = tempfile::tempdir()?;
/// uwf_db::copy::check_destination_dir(dir.path())?; // empty: fine
/// std::fs::write(dir.path().join("notes.txt"), "mine")?;
/// assert!(uwf_db::copy::check_destination_dir(dir.path()).is_err()); // not a store
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn check_destination_dir(dir: &std::path::Path) -> Result<(), CopyError> {
    let location = dir.display().to_string();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
            return Err(CopyError::DestinationNotAStore {
                location,
                found: "it is a file, not a directory".into(),
            });
        }
        Err(source) => {
            return Err(CopyError::OpenDestination {
                location: location.clone(),
                source: BackendError::Io {
                    op: "list",
                    path: dir.to_path_buf(),
                    source,
                }
                .into(),
            });
        }
    };
    let mut names: Vec<String> = Vec::new();
    let mut others: Vec<String> = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        names.push(name.clone());
        if !crate::backend::lmdb::STORE_FILES.contains(&name.as_str()) {
            others.push(name);
        }
    }
    if names.iter().any(|n| n == "data.mdb") || others.is_empty() {
        return Ok(());
    }
    others.sort();
    let more = others.len().saturating_sub(3);
    let mut found = others
        .iter()
        .take(3)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if more > 0 {
        found.push_str(&format!(" and {more} more"));
    }
    Err(CopyError::DestinationNotAStore { location, found })
}

/// Why a copy failed. Whatever it is, every destination transaction
/// committed before it stays, the destination keeps its marker, and
/// rerunning the same copy continues from there.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CopyError {
    /// The source does not exist.
    #[error("the source {location} is not a uwf-db store: there is nothing to copy")]
    SourceMissing {
        /// The location given.
        location: String,
    },
    /// The source could not be opened.
    #[error("cannot open the source {location}")]
    OpenSource {
        /// The location given.
        location: String,
        /// The cause.
        #[source]
        source: StoreError,
    },
    /// The destination could not be opened or created.
    #[error("cannot open or create the destination {location}")]
    OpenDestination {
        /// The location given.
        location: String,
        /// The cause.
        #[source]
        source: StoreError,
    },
    /// Source and destination are one store.
    #[error("the source and the destination are the same store ({location})")]
    SameStore {
        /// The store.
        location: String,
    },
    /// The source is itself an unfinished copy: copying it would copy a
    /// part of something.
    #[error(
        "the source {location} is an unfinished copy of {from}; finish that copy first (rerun it)"
    )]
    SourceUnfinished {
        /// The source.
        location: String,
        /// What it is an unfinished copy of.
        from: String,
    },
    /// The destination holds data and is not an unfinished copy of this
    /// source.
    #[error(
        "the destination {location} is not empty ({what}) and is not an unfinished copy of \
         {from}; copy only into a new or empty store"
    )]
    DestinationNotEmpty {
        /// The destination.
        location: String,
        /// The source of this copy.
        from: String,
        /// What was found first.
        what: String,
    },
    /// The destination is a directory that holds files of its own (not a
    /// store): a copy would write the store's files among them.
    #[error(
        "the destination {location} is a directory that holds other files ({found}); copy only \
         into a new directory, an empty one, or a store"
    )]
    DestinationNotAStore {
        /// The destination.
        location: String,
        /// The first entries found.
        found: String,
    },
    /// The destination is an unfinished copy of another source.
    #[error(
        "the destination {location} is an unfinished copy of {other}, not of {from}; rerun that \
         copy to finish it, or copy into a new store"
    )]
    OtherCopy {
        /// The destination.
        location: String,
        /// The source of the copy in the destination.
        other: String,
        /// The source of this copy.
        from: String,
    },
    /// A garbage collection or another copy holds the destination's lock.
    #[error(
        "the destination {location} is busy: a garbage collection or another copy into it is \
         running; wait for it to finish"
    )]
    Busy {
        /// The destination.
        location: String,
    },
    /// The two stores are of different format versions.
    #[error(
        "the source has format version {source_version} and the destination {destination_version}; \
         a copy needs both at one version"
    )]
    FormatMismatch {
        /// The source's.
        source_version: u32,
        /// The destination's.
        destination_version: u32,
    },
    /// Reading the source failed.
    #[error("reading the source {location} failed; rerun the copy to continue it")]
    Source {
        /// The source.
        location: String,
        /// The cause.
        #[source]
        source: StoreError,
    },
    /// Writing or reading the destination failed; the transaction in
    /// flight was not applied.
    #[error("writing the destination {location} failed; rerun the copy to continue it")]
    Destination {
        /// The destination.
        location: String,
        /// The cause.
        #[source]
        source: StoreError,
    },
    /// The destination, read back, differs from the source snapshot
    /// (something else wrote it during the copy, or a backend lost a
    /// write).
    #[error(
        "the destination differs from the source in table {table} after the copy: {detail}; \
         the destination stays marked unfinished"
    )]
    Mismatch {
        /// The table.
        table: Table,
        /// Rows and digests on each side.
        detail: String,
    },
    /// The destination equals the source but does not verify: the source
    /// has the same problems.
    #[error(
        "the destination {location} equals the source but verify found {} problem(s), first: {}; \
         the source has them too (run `uwf-db verify` on it); the destination stays marked \
         unfinished",
        problems.len(),
        problems.first().map(ToString::to_string).unwrap_or_default()
    )]
    Problems {
        /// The destination.
        location: String,
        /// What verify found.
        problems: Vec<Problem>,
    },
    /// [`CopyOptions::cancel`] was cancelled.
    #[error(
        "the copy into {location} was cancelled; the destination is an unfinished copy until the \
         copy is rerun"
    )]
    Cancelled {
        /// The destination.
        location: String,
    },
}

/// Copies this whole store into `dst` (`docs/design.md` §4c): every
/// table from one snapshot of this store, in bounded chunks, then
/// compares both sides table by table and verifies `dst`.
///
/// `dst` must be empty (a new store) or an unfinished copy of this
/// store, which the copy then continues. Other writers should leave
/// `dst` alone until the copy returns; writers of this store may go on
/// (the copy is of the snapshot taken when it started), but a long
/// snapshot keeps LMDB from reusing pages and PostgreSQL from vacuuming
/// rows, so copy a busy store when it is quiet.
///
/// ```
/// use uwf_db::{Blob, Store};
/// use uwf_db::copy::CopyOptions;
///
/// let src = Store::memory();
/// let hash = src.put(&Blob::content("a reply", [])).unwrap();
/// src.pin(&hash).unwrap();
/// let dst = Store::memory();
/// let report = uwf_db::copy::copy_to(&src, &dst, &CopyOptions::default(), |_| {}).unwrap();
/// assert!(report.verify.is_ok());
/// assert_eq!(dst.get(&hash).unwrap(), Some(Blob::content("a reply", [])));
/// assert_eq!(uwf_db::copy::table_digests(&src).unwrap(), uwf_db::copy::table_digests(&dst).unwrap());
/// assert_eq!(dst.unfinished_copy().unwrap(), None);
/// ```
pub fn copy_to(
    store: &Store,
    dst: &Store,
    options: &CopyOptions,
    mut progress: impl FnMut(CopyProgress),
) -> Result<CopyReport, CopyError> {
    let started = Instant::now();
    let from = store.location().to_owned();
    let to = dst.location().to_owned();
    let in_memory = |s: &Store| s.backend().as_any().is::<MemoryBackend>();
    if store.same_store(dst) || (from == to && !in_memory(store)) {
        return Err(CopyError::SameStore { location: from });
    }
    let source_err = |source| CopyError::Source {
        location: from.clone(),
        source,
    };
    let dest_err = |source: StoreError| CopyError::Destination {
        location: to.clone(),
        source,
    };
    let chunk = Chunk {
        rows: options.chunk_rows.max(1),
        bytes: options.chunk_bytes.max(1),
    };

    // Held to the end: no collection (which would free blobs whose
    // threads are not copied yet) and no second copy meanwhile.
    let _lock = dst
        .backend()
        .try_lock_gc()
        .map_err(|e| dest_err(e.into()))?
        .ok_or_else(|| CopyError::Busy {
            location: to.clone(),
        })?;

    let copy = Copy {
        dst,
        from: &from,
        to: &to,
        chunk,
        cancel: options.cancel.as_ref(),
    };
    // One read transaction: the whole copy is of one snapshot.
    let (resumed, copied) = store
        .read(|r| Ok::<_, StoreError>(copy.all_tables(r.tables(), &mut progress)))
        .map_err(source_err)??;

    let theirs =
        digests(dst, |table| progress(CopyProgress::Comparing { table })).map_err(dest_err)?;
    for (ours, theirs) in copied.iter().zip(&theirs) {
        if (ours.rows, &ours.digest) != (theirs.rows, &theirs.digest) {
            return Err(CopyError::Mismatch {
                table: ours.table,
                detail: format!(
                    "the source has {} rows (digest {}), the destination {} (digest {})",
                    ours.rows, ours.digest, theirs.rows, theirs.digest
                ),
            });
        }
    }

    let mut verify =
        crate::verify::verify(dst, |p| progress(CopyProgress::Verifying(p))).map_err(dest_err)?;
    // The marker is ours and goes next.
    verify
        .problems
        .retain(|p| !matches!(p, Problem::UnfinishedCopy { .. }));
    if !verify.is_ok() {
        return Err(CopyError::Problems {
            location: to,
            problems: verify.problems,
        });
    }
    copy.finish()?;

    Ok(CopyReport {
        rows: copied.iter().map(|t| t.rows).sum(),
        bytes: copied.iter().map(|t| t.bytes).sum(),
        written: copied.iter().map(|t| t.written).sum(),
        deleted: copied.iter().map(|t| t.deleted).sum(),
        source: from.clone(),
        destination: to.clone(),
        resumed,
        tables: copied,
        verify,
        elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    })
}

/// The row count, size and digest of every table, in [`copy_order`],
/// read from one snapshot (`meta` without the keys a copy does not
/// move). Two stores with equal digests hold the same bytes in every
/// table.
///
/// ```
/// use uwf_db::{Blob, Store};
/// let a = Store::memory();
/// let b = Store::memory();
/// assert_eq!(uwf_db::copy::table_digests(&a).unwrap(), uwf_db::copy::table_digests(&b).unwrap());
/// a.put(&Blob::content("only in a", [])).unwrap();
/// assert_ne!(uwf_db::copy::table_digests(&a).unwrap(), uwf_db::copy::table_digests(&b).unwrap());
/// ```
pub fn table_digests(store: &Store) -> Result<Vec<TableDigest>, StoreError> {
    digests(store, |_| {})
}

fn digests(store: &Store, mut each: impl FnMut(Table)) -> Result<Vec<TableDigest>, StoreError> {
    store.read(|r| {
        copy_order()
            .into_iter()
            .map(|table| {
                each(table);
                let mut digest = Digest::new();
                r.tables().visit_range(table, KeyRange::ALL, &mut |k, v| {
                    if copied(table, k) {
                        digest.add(k, v);
                    }
                    Ok(true)
                })?;
                Ok(digest.finish(table))
            })
            .collect()
    })
}

#[cfg(test)]
mod tests;

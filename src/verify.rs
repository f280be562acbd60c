//! `verify`: re-hash every blob, check every ref and every index entry.
//!
//! The scan reads the blobs database in key order, a bounded batch per read
//! transaction, so it never holds one snapshot for the whole store (which
//! would stop LMDB from reusing pages while writers run). Refs are checked in
//! the same snapshot as the blob that holds them; since only garbage
//! collection deletes blobs, a ref found missing is a real problem.

use crate::backend::{Direction, KeyRange, Table};
use std::fmt;

use crate::hash::{Hash, hex};
use crate::node::{Blob, Kind};
use crate::store::{BlobRecord, ReadTxn, Store, StoreError};
use crate::thread::index;
use crate::thread::labels::{label_key, parse_label_key};
use crate::thread::record::{ActivityEntry, activity_key, history_key};
use crate::thread::{ThreadId, ThreadRecord, utc_day};

/// Blobs checked per read transaction.
const BATCH: usize = 4096;

/// One problem found by [`verify`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[serde(tag = "problem", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Problem {
    /// A key that is not 32 bytes.
    BadKey {
        /// The key, in hex.
        key: String,
    },
    /// The stored bytes do not hash to their key.
    HashMismatch {
        /// The key.
        hash: Hash,
        /// What the bytes hash to.
        actual: Hash,
    },
    /// The record header cannot be parsed.
    BadRecord {
        /// The key.
        hash: Hash,
        /// What is wrong.
        detail: String,
    },
    /// The bytes are not a canonical blob.
    Undecodable {
        /// The key.
        hash: Hash,
        /// The decoder's error.
        detail: String,
    },
    /// The header's kind or refs differ from the blob's own.
    HeaderMismatch {
        /// The key.
        hash: Hash,
        /// What differs.
        detail: String,
    },
    /// A ref whose target is not stored.
    MissingRef {
        /// The blob holding the ref.
        hash: Hash,
        /// The missing target.
        missing: Hash,
    },
    /// An index entry that is malformed or disagrees with another (thread
    /// indexes), or a root that names no stored blob (`workflows`, `pins`).
    ThreadIndex {
        /// The database: `threads`, `history`, `history_ids`, `activity`,
        /// `children`, `workflows` or `pins`.
        db: &'static str,
        /// The entry's key (thread id, or day/id).
        key: String,
        /// What is wrong.
        detail: String,
    },
    /// The format version entry is absent or malformed.
    FormatVersion {
        /// What is wrong.
        detail: String,
    },
    /// A stretch of a table could not be read: the data file is damaged
    /// there (LMDB found a page it cannot use). The scan went on with the
    /// next table; `uwf-db salvage` recovers what is readable around it.
    Unreadable {
        /// The table.
        db: &'static str,
        /// The last key read before it, in hex (`None`: the table's start).
        after: Option<String>,
        /// What the read said.
        detail: String,
    },
    /// The store is the destination of a copy that has not finished
    /// (`docs/design.md` §4c): it may hold only part of its source.
    UnfinishedCopy {
        /// The copy's source.
        source: String,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::BadKey { key } => write!(f, "key {key} is not a 32-byte hash"),
            Problem::HashMismatch { hash, actual } => {
                write!(f, "blob {hash}: bytes hash to {actual} (altered content)")
            }
            Problem::BadRecord { hash, detail } => write!(f, "blob {hash}: bad record: {detail}"),
            Problem::Undecodable { hash, detail } => {
                write!(f, "blob {hash}: not a canonical blob: {detail}")
            }
            Problem::HeaderMismatch { hash, detail } => {
                write!(f, "blob {hash}: header disagrees with the blob: {detail}")
            }
            Problem::MissingRef { hash, missing } => {
                write!(f, "blob {hash}: refers to missing blob {missing}")
            }
            Problem::ThreadIndex { db, key, detail } => write!(f, "{db} entry {key}: {detail}"),
            Problem::FormatVersion { detail } => write!(f, "format version: {detail}"),
            Problem::Unreadable { db, after, detail } => write!(
                f,
                "{db}: {}: {detail}",
                after
                    .as_deref()
                    .map_or("cannot be read in full".into(), |k| format!(
                        "cannot be read past key {k}"
                    ))
            ),
            Problem::UnfinishedCopy { source } => write!(
                f,
                "the store is an unfinished copy of {source}: rerun the copy to finish it"
            ),
        }
    }
}

/// What [`verify`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct VerifyReport {
    /// Blobs examined.
    pub blobs_checked: u64,
    /// Refs examined.
    pub refs_checked: u64,
    /// Thread index entries examined (all five thread databases).
    pub index_entries_checked: u64,
    /// Every problem, in key order.
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    /// Whether the store is clean.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Progress of a running [`verify`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyProgress {
    /// Blobs checked so far.
    pub checked: u64,
    /// Blobs in the store when the scan started.
    pub total: u64,
}

/// Checks the whole store (every hash against its bytes, every ref,
/// every index entry; `docs/design.md` §6) and reports every problem
/// found; `progress` is called after each batch. Reads in short
/// transactions, so writers keep going.
///
/// ```
/// use uwf_db::{Blob, Store};
/// let store = Store::memory();
/// store.put(&Blob::content("a reply", [])).unwrap();
/// let report = uwf_db::verify::verify(&store, |_| {}).unwrap();
/// assert!(report.is_ok());
/// assert_eq!(report.blobs_checked, 1);
/// ```
pub fn verify(
    store: &Store,
    mut progress: impl FnMut(VerifyProgress),
) -> Result<VerifyReport, StoreError> {
    let mut report = VerifyReport::default();
    if let Err(e) = store.read(|r| r.format_version()) {
        report.problems.push(Problem::FormatVersion {
            detail: e.to_string(),
        });
    }
    if let Some(copy) = store.unfinished_copy()? {
        report.problems.push(Problem::UnfinishedCopy {
            source: copy.source,
        });
    }
    let total = store.blob_count()?;

    let mut after: Option<Vec<u8>> = None;
    loop {
        // The last key of this batch looked at, kept when the batch fails.
        let mut last: Option<Vec<u8>> = None;
        let read = store.read(|r| {
            let range = match &after {
                Some(k) => KeyRange::after(k),
                None => KeyRange::ALL,
            };
            let entries = r.tables().range(Table::Blobs, range, Direction::Forward)?;
            for entry in entries.take(BATCH) {
                let (key, value) = entry?;
                last = Some(key.to_vec());
                report.blobs_checked += 1;
                let Some(hash) = Hash::from_slice(&key) else {
                    report.problems.push(Problem::BadKey { key: hex(&key) });
                    continue;
                };
                let refs = check_blob(hash, &value, &mut report.problems);
                for target in refs {
                    report.refs_checked += 1;
                    if !r.contains(&target)? {
                        report.problems.push(Problem::MissingRef {
                            hash,
                            missing: target,
                        });
                    }
                }
            }
            Ok::<_, StoreError>(())
        });
        progress(VerifyProgress {
            checked: report.blobs_checked,
            total,
        });
        match read {
            Ok(()) => {}
            Err(e) if e.is_damage() => {
                // Not searched past here: a probe into a damaged tree can
                // crash this process (salvage probes in child processes).
                report.problems.push(Problem::Unreadable {
                    db: "blobs",
                    after: last.as_deref().or(after.as_deref()).map(hex),
                    detail: e.to_string(),
                });
                break;
            }
            Err(e) => return Err(e),
        }
        match last {
            Some(k) => after = Some(k),
            None => break,
        }
    }
    check_thread_indexes(store, &mut report)?;
    Ok(report)
}

/// Checks that every thread record decodes, names its own key, points at
/// stored start/head/workflow blobs of the right kinds, and that
/// `history_ids`, `activity` and `children` agree with the records.
fn check_thread_indexes(store: &Store, report: &mut VerifyReport) -> Result<(), StoreError> {
    let problems = &mut report.problems;
    let mut n = 0;
    n += check_threads_table(store, problems)?;
    n += check_history_table(store, problems)?;
    n += check_history_ids(store, problems)?;
    n += check_activity_entries(store, Table::Activity, problems, |key| {
        let (at, id) = key.split_first_chunk::<8>()?;
        let (at, id) = (u64::from_be_bytes(*at), ThreadId::from_slice(id)?);
        Some(ActivityRef {
            text: format!("{at}/{id}"),
            at,
            id,
            label: None,
        })
    })?;
    n += check_activity_entries(store, Table::Labels, problems, |key| {
        let (k, v, at, id) = parse_label_key(key)?;
        Some(ActivityRef {
            text: format!("{k}={v}/{at}/{id}"),
            at,
            id,
            label: Some((k, v)),
        })
    })?;
    n += check_children(store, problems)?;
    n += check_roots(store, problems)?;
    report.index_entries_checked = n;
    Ok(())
}

/// One thread record (of `threads` or `history`): it decodes, names its
/// key's thread, its start, head, workflow and staged summary are stored
/// blobs of the right kinds, it agrees with its head node, and its
/// activity and labels entries agree with it. `None` when it cannot be
/// checked further.
fn check_record(
    r: &ReadTxn<'_>,
    db: &'static str,
    key_text: String,
    id: Option<ThreadId>,
    value: &[u8],
    problems: &mut Vec<Problem>,
) -> Result<Option<ThreadRecord>, StoreError> {
    let mut bad = |detail: String| {
        problems.push(Problem::ThreadIndex {
            db,
            key: key_text.clone(),
            detail,
        })
    };
    let record = match ThreadRecord::decode(value) {
        Ok(rec) => rec,
        Err(e) => {
            bad(format!("record does not decode: {e}"));
            return Ok(None);
        }
    };
    if Some(record.id) != id {
        bad(format!("record names thread {}", record.id));
    }
    for (what, hash, want) in [
        ("start", record.start, &[Kind::Start][..]),
        ("head", record.head, &[Kind::Start, Kind::State][..]),
        ("workflow", record.workflow_hash, &[Kind::Workflow][..]),
    ] {
        match r.get_stored(&hash) {
            Err(e) if e.is_damage() => {
                // The transaction can read nothing more.
                bad(format!("{what} {hash} cannot be read: {e}"));
                return Ok(None);
            }
            Err(e) => return Err(e),
            Ok(None) => bad(format!("{what} {hash} is not stored")),
            Ok(Some(b)) if !want.contains(&b.kind) => {
                bad(format!("{what} {hash} is a {} blob", b.kind))
            }
            Ok(Some(_)) => {}
        }
    }
    if let Some(c) = record.staged_compact
        && !r.contains(&c)?
    {
        bad(format!("staged summary {c} is not stored"));
    }
    // The record against its head node (the head alone: the whole
    // chain is import's check).
    let mut node = |h: &crate::hash::Hash| match r.get_blob(h) {
        Err(e) if e.is_damage() => Ok(None),
        other => other,
    };
    if let Some(detail) = crate::thread::check_against_chain(&record, 1, &mut node)? {
        bad(detail);
    }
    let activity = r.tables().get(
        Table::Activity,
        &activity_key(record.last_activity(), record.id),
    )?;
    match activity.as_deref().and_then(ActivityEntry::parse) {
        None => bad("no activity entry at its last activity time".into()),
        Some(a) if a != ActivityEntry::of(&record) => {
            bad("activity entry disagrees with the record".into())
        }
        Some(_) => {}
    }
    let suffix = activity_key(record.last_activity(), record.id);
    for (k, v) in &record.labels {
        let entry = r.tables().get(Table::Labels, &label_key(k, v, &suffix))?;
        match entry.as_deref().and_then(ActivityEntry::parse) {
            None => bad(format!("no labels entry for {k}={v}")),
            Some(a) if a != ActivityEntry::of(&record) => bad(format!(
                "labels entry for {k}={v} disagrees with the record"
            )),
            Some(_) => {}
        }
    }
    Ok(Some(record))
}

/// `threads`: every record checked, none of an ended thread.
fn check_threads_table(store: &Store, problems: &mut Vec<Problem>) -> Result<u64, StoreError> {
    scanned(
        store.scan_table::<StoreError>(Table::Threads, |r, key, value| {
            let id = ThreadId::from_slice(key);
            if let Some(rec) = check_record(
                r,
                "threads",
                id.map_or_else(|| hex(key), |i| i.to_string()),
                id,
                value,
                problems,
            )? && rec.status.is_done()
                && rec.completed_at.is_some()
            {
                problems.push(Problem::ThreadIndex {
                    db: "threads",
                    key: rec.id.to_string(),
                    detail: format!("an ended ({}) thread in the active index", rec.status),
                });
            }
            Ok(())
        }),
        Table::Threads,
        problems,
    )
}

/// `history`: every record checked, ended, in its completion day's partition, pointed at by `history_ids`, not also active.
fn check_history_table(store: &Store, problems: &mut Vec<Problem>) -> Result<u64, StoreError> {
    scanned(
        store.scan_table::<StoreError>(Table::History, |r, key, value| {
            let (day, id) = match key.split_first_chunk::<4>() {
                Some((day, id)) => (u32::from_be_bytes(*day), ThreadId::from_slice(id)),
                None => (0, None),
            };
            let key_text = id.map_or_else(|| hex(key), |i| format!("{day}/{i}"));
            let Some(rec) = check_record(r, "history", key_text.clone(), id, value, problems)?
            else {
                return Ok(());
            };
            let mut bad = |detail: String| {
                problems.push(Problem::ThreadIndex {
                    db: "history",
                    key: key_text.clone(),
                    detail,
                })
            };
            if !rec.status.is_done() {
                bad(format!("a {} thread in history", rec.status));
            }
            if rec.completed_at.map(utc_day) != Some(day) {
                bad("completion time is not in this day's partition".into());
            }
            let ids = r.tables().get(Table::HistoryIds, &rec.id.to_bytes())?;
            if ids.as_deref() != Some(&day.to_be_bytes()[..]) {
                bad("history_ids does not point at this entry".into());
            }
            if r.tables()
                .get(Table::Threads, &rec.id.to_bytes())?
                .is_some()
            {
                bad("also present in the active index".into());
            }
            Ok(())
        }),
        Table::History,
        problems,
    )
}

/// `history_ids`: every entry points at a `history` entry.
fn check_history_ids(store: &Store, problems: &mut Vec<Problem>) -> Result<u64, StoreError> {
    scanned(
        store.scan_table::<StoreError>(Table::HistoryIds, |r, key, value| {
            let id = ThreadId::from_slice(key);
            let day = <[u8; 4]>::try_from(value).ok().map(u32::from_be_bytes);
            let ok = match (id, day) {
                (Some(id), Some(day)) => r
                    .tables()
                    .get(Table::History, &history_key(day, id))?
                    .is_some(),
                _ => false,
            };
            if !ok {
                problems.push(Problem::ThreadIndex {
                    db: "history_ids",
                    key: id.map_or_else(|| hex(key), |i| i.to_string()),
                    detail: "points at no history entry".into(),
                });
            }
            Ok(())
        }),
        Table::HistoryIds,
        problems,
    )
}

/// `children`: every pair names a child thread whose parent is the pair's.
fn check_children(store: &Store, problems: &mut Vec<Problem>) -> Result<u64, StoreError> {
    scanned(
        store.scan_table::<StoreError>(Table::Children, |r, key, _| {
            let pair = key
                .split_first_chunk::<16>()
                .and_then(|(p, c)| Some((ThreadId::from_slice(p)?, ThreadId::from_slice(c)?)));
            let detail = match pair {
                None => Some("malformed key".to_owned()),
                Some((parent, child)) => match index::find(r.tables(), child) {
                    Ok(Some((rec, _))) if rec.parent_thread == Some(parent) => None,
                    Ok(Some(_)) => Some("the child names another parent".to_owned()),
                    Ok(None) => Some("no such child thread".to_owned()),
                    Err(e) => Some(e.to_string()),
                },
            };
            if let Some(detail) = detail {
                problems.push(Problem::ThreadIndex {
                    db: "children",
                    key: pair.map_or_else(|| hex(key), |(p, c)| format!("{p}/{c}")),
                    detail,
                });
            }
            Ok(())
        }),
        Table::Children,
        problems,
    )
}

/// Registered workflows and pins are GC roots: each must name a stored
/// blob (a registered workflow a `workflow` blob).
fn check_roots(store: &Store, problems: &mut Vec<Problem>) -> Result<u64, StoreError> {
    let mut n = 0;
    for (table, name) in [(Table::Workflows, "workflows"), (Table::Pins, "pins")] {
        n += scanned(
            store.scan_table::<StoreError>(table, |r, key, value| {
                let target = if name == "pins" { key } else { value };
                let detail = match Hash::from_slice(target) {
                    None => Some(format!("{} bytes, not a hash", target.len())),
                    Some(h) => match r.get_stored(&h)? {
                        None => Some(format!("names {h}, which is not stored")),
                        Some(rec) if name == "workflows" && rec.kind != Kind::Workflow => {
                            Some(format!("names {h}, a {} blob", rec.kind))
                        }
                        Some(_) => None,
                    },
                };
                if let Some(detail) = detail {
                    problems.push(Problem::ThreadIndex {
                        db: name,
                        key: String::from_utf8(key.to_vec()).unwrap_or_else(|_| hex(key)),
                        detail,
                    });
                }
                Ok(())
            }),
            table,
            problems,
        )?;
    }
    Ok(n)
}

/// What an `activity` or `labels` key names: the thread, its last
/// activity and, for `labels`, the label.
struct ActivityRef {
    text: String,
    at: u64,
    id: ThreadId,
    label: Option<(String, String)>,
}

/// Checks every entry of an index keyed by last activity (`activity`,
/// `labels`): its value is an activity entry, and it names a thread whose
/// last activity (and label) it has. Returns the entries read.
fn check_activity_entries(
    store: &Store,
    table: Table,
    problems: &mut Vec<Problem>,
    parse: fn(&[u8]) -> Option<ActivityRef>,
) -> Result<u64, StoreError> {
    let result = store.scan_table::<StoreError>(table, |r, key, value| {
        let parsed = parse(key);
        let key_text = parsed.as_ref().map_or_else(|| hex(key), |p| p.text.clone());
        let detail = match (parsed, ActivityEntry::parse(value)) {
            (Some(p), Some(_)) => match index::find(r.tables(), p.id) {
                Ok(Some((rec, _))) => match &p.label {
                    Some((k, v)) if rec.labels.get(k) != Some(v) => {
                        Some(format!("thread {} does not carry {k}={v}", p.id))
                    }
                    _ if rec.last_activity() == p.at => None,
                    _ => Some("stale: the record's last activity differs".to_owned()),
                },
                Ok(None) => Some("no such thread".to_owned()),
                Err(e) => Some(e.to_string()),
            },
            _ => Some("malformed key or value".to_owned()),
        };
        if let Some(detail) = detail {
            problems.push(Problem::ThreadIndex {
                db: table.name(),
                key: key_text,
                detail,
            });
        }
        Ok(())
    });
    scanned(result, table, problems)
}

/// A table scan's count, or, when the data file is damaged under it, 0
/// and a [`Problem::Unreadable`]: the checks go on with the next table.
fn scanned(
    result: Result<u64, StoreError>,
    table: Table,
    problems: &mut Vec<Problem>,
) -> Result<u64, StoreError> {
    match result {
        Err(e) if e.is_damage() => {
            problems.push(Problem::Unreadable {
                db: table.name(),
                after: None,
                detail: e.to_string(),
            });
            Ok(0)
        }
        other => other,
    }
}

/// Checks one record; returns the refs to look up.
pub(crate) fn check_blob(hash: Hash, value: &[u8], problems: &mut Vec<Problem>) -> Vec<Hash> {
    let record = match BlobRecord::parse(value) {
        Ok(r) => r,
        Err(e) => {
            problems.push(Problem::BadRecord {
                hash,
                detail: e.to_string(),
            });
            return Vec::new();
        }
    };
    let header_refs: Vec<Hash> = record.refs().collect();
    let actual = Hash::of(record.bytes);
    if actual != hash {
        problems.push(Problem::HashMismatch { hash, actual });
        return header_refs;
    }
    match Blob::decode(record.bytes) {
        Err(e) => problems.push(Problem::Undecodable {
            hash,
            detail: e.to_string(),
        }),
        Ok(blob) => {
            if blob.kind() != record.kind {
                problems.push(Problem::HeaderMismatch {
                    hash,
                    detail: format!("header kind {} but blob kind {}", record.kind, blob.kind()),
                });
            }
            if blob.collect_refs() != header_refs {
                problems.push(Problem::HeaderMismatch {
                    hash,
                    detail: "header refs differ from the blob's refs".into(),
                });
            }
        }
    }
    header_refs
}

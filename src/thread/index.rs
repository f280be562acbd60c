//! Reading and writing thread records across `threads`, `history`,
//! `history_ids`, `activity` and `children`, keeping them consistent.

use std::ops::Bound;

use heed::{RoTxn, WithoutTls};

use super::record::{ActivityEntry, activity_key, child_key, history_key, record_head, utc_day};
use super::{IdPrefix, ThreadError, ThreadId, ThreadRecord};
use crate::hash::Hash;
use crate::store::{Databases, StoreInner, WriteTxn};

/// Where a record lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Location {
    /// In `threads`.
    Active,
    /// In `history`, under this UTC day.
    History(u32),
}

impl Location {
    /// Where `record` belongs: history once it has ended.
    pub fn of(record: &ThreadRecord) -> Location {
        match record.completed_at {
            Some(at) if record.status.is_done() => Location::History(utc_day(at)),
            _ => Location::Active,
        }
    }
}

fn decode(id: ThreadId, bytes: &[u8]) -> Result<ThreadRecord, ThreadError> {
    ThreadRecord::decode(bytes).map_err(|e| ThreadError::CorruptRecord {
        thread: id.to_string(),
        detail: e.to_string(),
    })
}

/// Finds a thread's record, active or in history: two O(log n) lookups at most.
pub(crate) fn find(
    txn: &RoTxn<'_, WithoutTls>,
    dbs: &Databases,
    inner: &StoreInner,
    id: ThreadId,
) -> Result<Option<(ThreadRecord, Location)>, ThreadError> {
    let key = id.to_bytes();
    let err = |e| ThreadError::Store(inner.error("reading a thread record", e));
    if let Some(bytes) = dbs.threads.get(txn, &key).map_err(err)? {
        return Ok(Some((decode(id, bytes)?, Location::Active)));
    }
    let Some(day) = dbs.history_ids.get(txn, &key).map_err(err)? else {
        return Ok(None);
    };
    let day = <[u8; 4]>::try_from(day)
        .map(u32::from_be_bytes)
        .map_err(|_| ThreadError::CorruptRecord {
            thread: id.to_string(),
            detail: "history_ids entry is not 4 bytes".into(),
        })?;
    match dbs.history.get(txn, &history_key(day, id)).map_err(err)? {
        Some(bytes) => Ok(Some((decode(id, bytes)?, Location::History(day)))),
        None => Err(ThreadError::CorruptRecord {
            thread: id.to_string(),
            detail: format!("history_ids points at day {day}, which has no entry"),
        }),
    }
}

/// A thread's head, read from the record header without decoding the record.
pub(crate) fn head(
    txn: &RoTxn<'_, WithoutTls>,
    dbs: &Databases,
    inner: &StoreInner,
    id: ThreadId,
) -> Result<Option<Hash>, ThreadError> {
    let key = id.to_bytes();
    let err = |e| ThreadError::Store(inner.error("reading a thread record", e));
    let corrupt = || ThreadError::CorruptRecord {
        thread: id.to_string(),
        detail: "malformed record header".into(),
    };
    if let Some(bytes) = dbs.threads.get(txn, &key).map_err(err)? {
        return record_head(bytes).map(Some).ok_or_else(corrupt);
    }
    // Ended threads are rarely paged: the general lookup is fine.
    Ok(find(txn, dbs, inner, id)?.map(|(r, _)| r.head))
}

/// Resolves a full id or unique prefix among active and history threads.
pub(crate) fn resolve(
    txn: &RoTxn<'_, WithoutTls>,
    dbs: &Databases,
    inner: &StoreInner,
    prefix: &IdPrefix,
) -> Result<ThreadId, ThreadError> {
    let err = |e| ThreadError::Store(inner.error("resolving a thread id", e));
    if let Some(id) = prefix.as_full_id() {
        return match find(txn, dbs, inner, id)? {
            Some(_) => Ok(id),
            None => Err(ThreadError::Unknown(prefix.to_string())),
        };
    }
    let lower = prefix.lower_bound();
    let mut found: Vec<ThreadId> = Vec::new();
    for db in [dbs.threads, dbs.history_ids] {
        let range = (Bound::Included(&lower[..]), Bound::Unbounded);
        for entry in db.range(txn, &range).map_err(err)? {
            let (key, _) = entry.map_err(err)?;
            let Some(id) = ThreadId::from_slice(key) else {
                break;
            };
            if !prefix.matches(&id) || found.len() > 5 {
                break;
            }
            if !found.contains(&id) {
                found.push(id);
            }
        }
    }
    found.sort();
    match found.as_slice() {
        [] => Err(ThreadError::Unknown(prefix.to_string())),
        [one] => Ok(*one),
        _ => Err(ThreadError::Ambiguous {
            prefix: prefix.to_string(),
            candidates: found,
        }),
    }
}

/// Writes `new`, replacing `old` (when the thread existed): moves it between
/// the active index and history as its status requires and keeps `activity`
/// and `children` in step. Returns where it now lives.
pub(crate) fn put(
    w: &mut WriteTxn<'_>,
    old: Option<(&ThreadRecord, Location)>,
    new: &ThreadRecord,
) -> Result<Location, ThreadError> {
    for root in [Some(new.head), Some(new.start), new.staged_compact]
        .into_iter()
        .flatten()
    {
        w.relink_root(&root)?;
    }
    let bytes = new.encode()?;
    let (txn, dbs, inner) = w.parts();
    let err = |e| ThreadError::Store(inner.error("writing a thread record", e));
    let id = new.id;
    let key = id.to_bytes();
    let location = Location::of(new);
    if let Some((old, old_location)) = old {
        dbs.activity
            .delete(txn, &activity_key(old.last_activity(), id))
            .map_err(err)?;
        if old_location != location {
            delete_record(txn, dbs, id, old_location).map_err(err)?;
        }
    } else if let Some(parent) = new.parent_thread {
        dbs.children
            .put(txn, &child_key(parent, id), &[])
            .map_err(err)?;
    }
    match location {
        Location::Active => dbs.threads.put(txn, &key, &bytes).map_err(err)?,
        Location::History(day) => {
            dbs.history
                .put(txn, &history_key(day, id), &bytes)
                .map_err(err)?;
            dbs.history_ids
                .put(txn, &key, &day.to_be_bytes())
                .map_err(err)?;
        }
    }
    dbs.activity
        .put(
            txn,
            &activity_key(new.last_activity(), id),
            &ActivityEntry::of(new).encode(),
        )
        .map_err(err)?;
    Ok(location)
}

/// Deletes a record from where it lives (`threads`, or `history` and
/// `history_ids`).
fn delete_record(
    txn: &mut heed::RwTxn<'_>,
    dbs: &Databases,
    id: ThreadId,
    location: Location,
) -> heed::Result<()> {
    let key = id.to_bytes();
    match location {
        Location::Active => {
            dbs.threads.delete(txn, &key)?;
        }
        Location::History(day) => {
            dbs.history.delete(txn, &history_key(day, id))?;
            dbs.history_ids.delete(txn, &key)?;
        }
    }
    Ok(())
}

/// Removes every index entry of a thread (its blobs stay for GC).
pub(crate) fn remove(
    w: &mut WriteTxn<'_>,
    record: &ThreadRecord,
    location: Location,
) -> Result<(), ThreadError> {
    let (txn, dbs, inner) = w.parts();
    let err = |e| ThreadError::Store(inner.error("removing a thread", e));
    let id = record.id;
    delete_record(txn, dbs, id, location).map_err(err)?;
    dbs.activity
        .delete(txn, &activity_key(record.last_activity(), id))
        .map_err(err)?;
    if let Some(parent) = record.parent_thread {
        dbs.children
            .delete(txn, &child_key(parent, id))
            .map_err(err)?;
    }
    Ok(())
}

/// The ids of a thread's children (threads spawned by its `workflow:` roles).
pub(crate) fn children(
    txn: &RoTxn<'_, WithoutTls>,
    dbs: &Databases,
    inner: &StoreInner,
    parent: ThreadId,
) -> Result<Vec<ThreadId>, ThreadError> {
    let err = |e| ThreadError::Store(inner.error("reading children", e));
    let lower = child_key(parent, ThreadId::NIL);
    let range = (Bound::Included(&lower[..]), Bound::Unbounded);
    let mut out = Vec::new();
    for entry in dbs.children.range(txn, &range).map_err(err)? {
        let (key, _) = entry.map_err(err)?;
        if key.len() != 32 || key[..16] != parent.to_bytes() {
            break;
        }
        out.extend(ThreadId::from_slice(&key[16..]));
    }
    Ok(out)
}

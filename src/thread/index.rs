//! Reading and writing thread records across `threads`, `history`,
//! `history_ids`, `activity` and `children`, keeping them consistent.

use super::record::{ActivityEntry, activity_key, child_key, history_key, record_head, utc_day};
use super::{IdPrefix, ThreadError, ThreadId, ThreadRecord};
use crate::backend::{Direction, KeyRange, ReadTables, Table, WriteTables};
use crate::hash::Hash;
use crate::store::WriteTxn;

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
    t: &dyn ReadTables,
    id: ThreadId,
) -> Result<Option<(ThreadRecord, Location)>, ThreadError> {
    let key = id.to_bytes();
    t.prefetch(&[(Table::Threads, &key), (Table::HistoryIds, &key)])?;
    if let Some(bytes) = t.get(Table::Threads, &key)? {
        return Ok(Some((decode(id, &bytes)?, Location::Active)));
    }
    let Some(day) = t.get(Table::HistoryIds, &key)? else {
        return Ok(None);
    };
    let day = <[u8; 4]>::try_from(&*day)
        .map(u32::from_be_bytes)
        .map_err(|_| ThreadError::CorruptRecord {
            thread: id.to_string(),
            detail: "history_ids entry is not 4 bytes".into(),
        })?;
    match t.get(Table::History, &history_key(day, id))? {
        Some(bytes) => Ok(Some((decode(id, &bytes)?, Location::History(day)))),
        None => Err(ThreadError::CorruptRecord {
            thread: id.to_string(),
            detail: format!("history_ids points at day {day}, which has no entry"),
        }),
    }
}

/// A thread's head, read from the record header without decoding the record.
pub(crate) fn head(t: &dyn ReadTables, id: ThreadId) -> Result<Option<Hash>, ThreadError> {
    let key = id.to_bytes();
    let corrupt = || ThreadError::CorruptRecord {
        thread: id.to_string(),
        detail: "malformed record header".into(),
    };
    if let Some(bytes) = t.get(Table::Threads, &key)? {
        return record_head(&bytes).map(Some).ok_or_else(corrupt);
    }
    // Ended threads are rarely paged: the general lookup is fine.
    Ok(find(t, id)?.map(|(r, _)| r.head))
}

/// Resolves a full id or unique prefix among active and history threads.
pub(crate) fn resolve(t: &dyn ReadTables, prefix: &IdPrefix) -> Result<ThreadId, ThreadError> {
    if let Some(id) = prefix.as_full_id() {
        return match find(t, id)? {
            Some(_) => Ok(id),
            None => Err(ThreadError::Unknown(prefix.to_string())),
        };
    }
    let lower = prefix.lower_bound();
    let mut found: Vec<ThreadId> = Vec::new();
    for table in [Table::Threads, Table::HistoryIds] {
        for entry in t.range(table, KeyRange::from(&lower[..]), Direction::Forward)? {
            let (key, _) = entry?;
            let Some(id) = ThreadId::from_slice(&key) else {
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
    let t = w.tables_mut();
    let id = new.id;
    let key = id.to_bytes();
    let location = Location::of(new);
    if let Some((old, old_location)) = old {
        t.remove(Table::Activity, &activity_key(old.last_activity(), id))?;
        if old_location != location {
            delete_record(t, id, old_location)?;
        }
    } else if let Some(parent) = new.parent_thread {
        t.put(Table::Children, &child_key(parent, id), &[])?;
    }
    match location {
        Location::Active => t.put(Table::Threads, &key, &bytes)?,
        Location::History(day) => {
            t.put(Table::History, &history_key(day, id), &bytes)?;
            t.put(Table::HistoryIds, &key, &day.to_be_bytes())?;
        }
    }
    t.put(
        Table::Activity,
        &activity_key(new.last_activity(), id),
        &ActivityEntry::of(new).encode(),
    )?;
    Ok(location)
}

/// Deletes a record from where it lives (`threads`, or `history` and
/// `history_ids`).
fn delete_record(
    t: &mut dyn WriteTables,
    id: ThreadId,
    location: Location,
) -> Result<(), ThreadError> {
    let key = id.to_bytes();
    match location {
        Location::Active => {
            t.remove(Table::Threads, &key)?;
        }
        Location::History(day) => {
            t.remove(Table::History, &history_key(day, id))?;
            t.remove(Table::HistoryIds, &key)?;
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
    let t = w.tables_mut();
    let id = record.id;
    delete_record(t, id, location)?;
    t.remove(Table::Activity, &activity_key(record.last_activity(), id))?;
    if let Some(parent) = record.parent_thread {
        t.remove(Table::Children, &child_key(parent, id))?;
    }
    Ok(())
}

/// The ids of a thread's children (threads spawned by its `workflow:` roles).
pub(crate) fn children(t: &dyn ReadTables, parent: ThreadId) -> Result<Vec<ThreadId>, ThreadError> {
    let lower = child_key(parent, ThreadId::NIL);
    let mut out = Vec::new();
    for entry in t.range(
        Table::Children,
        KeyRange::from(&lower[..]),
        Direction::Forward,
    )? {
        let (key, _) = entry?;
        let (Some(prefix), Some(child)) = (key.get(..16), key.get(16..)) else {
            break;
        };
        if key.len() != 32 || prefix != parent.to_bytes() {
            break;
        }
        out.extend(ThreadId::from_slice(child));
    }
    Ok(out)
}

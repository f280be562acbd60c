//! Reading and writing thread records across `threads`, `history`,
//! `history_ids`, `activity` and `children`, keeping them consistent.

use super::labels::label_key;
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

/// Decodes thread `id`'s record (a corrupt one is named by its id).
pub(crate) fn decode(id: ThreadId, bytes: &[u8]) -> Result<ThreadRecord, ThreadError> {
    ThreadRecord::decode(bytes).map_err(|e| ThreadError::CorruptRecord {
        thread: id.to_string(),
        detail: e.to_string(),
    })
}

/// The keys [`find`] reads first for thread `id` (a write prefetches them:
/// `Store::write_op_reading`); none where that would not pay (LMDB,
/// memory: `Store::prefetches`).
pub(crate) fn record_reads(id: ThreadId) -> Vec<(Table, Vec<u8>)> {
    let key = id.to_bytes().to_vec();
    vec![(Table::Threads, key.clone()), (Table::HistoryIds, key)]
}

/// [`record_reads`] when `store` prefetches, else nothing.
pub(crate) fn record_reads_for(store: &crate::Store, id: ThreadId) -> Vec<(Table, Vec<u8>)> {
    if store.prefetches() {
        record_reads(id)
    } else {
        Vec::new()
    }
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
    let day = history_day(id, &day)?;
    match t.get(Table::History, &history_key(day, id))? {
        Some(bytes) => Ok(Some((decode(id, &bytes)?, Location::History(day)))),
        None => Err(no_history_entry(id, day)),
    }
}

/// A thread's head, read from the record header without decoding the record.
pub(crate) fn head(t: &dyn ReadTables, id: ThreadId) -> Result<Option<Hash>, ThreadError> {
    let key = id.to_bytes();
    let corrupt = || ThreadError::CorruptRecord {
        thread: id.to_string(),
        detail: "malformed record header".into(),
    };
    // Both places an id may be, read together (with `BEGIN` on a server
    // backend): an ended thread's `thread log` costs no round trip more.
    t.prefetch(&[(Table::Threads, &key), (Table::HistoryIds, &key)])?;
    if let Some(bytes) = t.get(Table::Threads, &key)? {
        return record_head(&bytes).map(Some).ok_or_else(corrupt);
    }
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

/// [`find`] for many threads, in their order: one `get_many` of
/// `threads`, then of `history_ids` and of `history` for those not there
/// (three round trips at most on a server backend, whatever the count).
pub(crate) fn find_many(
    t: &dyn ReadTables,
    ids: &[ThreadId],
) -> Result<Vec<Option<(ThreadRecord, Location)>>, ThreadError> {
    let keys: Vec<[u8; 16]> = ids.iter().map(|id| id.to_bytes()).collect();
    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
    let mut found = Vec::with_capacity(ids.len());
    // Those not active: (position, id).
    let mut elsewhere = Vec::new();
    for (i, (&id, value)) in ids
        .iter()
        .zip(t.get_many(Table::Threads, &refs)?)
        .enumerate()
    {
        match value {
            Some(bytes) => found.push(Some((decode(id, &bytes)?, Location::Active))),
            None => {
                found.push(None);
                elsewhere.push((i, id));
            }
        }
    }
    if elsewhere.is_empty() {
        return Ok(found);
    }
    let keys: Vec<[u8; 16]> = elsewhere.iter().map(|(_, id)| id.to_bytes()).collect();
    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
    // Those in history: (position, id, day).
    let mut ended = Vec::new();
    for (&(i, id), day) in elsewhere.iter().zip(t.get_many(Table::HistoryIds, &refs)?) {
        if let Some(day) = day {
            ended.push((i, id, history_day(id, &day)?));
        }
    }
    let keys: Vec<[u8; 20]> = ended
        .iter()
        .map(|&(_, id, day)| history_key(day, id))
        .collect();
    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
    for (&(i, id, day), value) in ended.iter().zip(t.get_many(Table::History, &refs)?) {
        let Some(bytes) = value else {
            return Err(no_history_entry(id, day));
        };
        if let Some(slot) = found.get_mut(i) {
            *slot = Some((decode(id, &bytes)?, Location::History(day)));
        }
    }
    Ok(found)
}

/// The day a `history_ids` entry holds.
fn history_day(id: ThreadId, value: &[u8]) -> Result<u32, ThreadError> {
    <[u8; 4]>::try_from(value)
        .map(u32::from_be_bytes)
        .map_err(|_| ThreadError::CorruptRecord {
            thread: id.to_string(),
            detail: "history_ids entry is not 4 bytes".into(),
        })
}

fn no_history_entry(id: ThreadId, day: u32) -> ThreadError {
    ThreadError::CorruptRecord {
        thread: id.to_string(),
        detail: format!("history_ids points at day {day}, which has no entry"),
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
        let old_activity = activity_key(old.last_activity(), id);
        t.remove(Table::Activity, &old_activity)?;
        for (k, v) in &old.labels {
            t.remove(Table::Labels, &label_key(k, v, &old_activity))?;
        }
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
    let activity = activity_key(new.last_activity(), id);
    let entry = ActivityEntry::of(new).encode();
    t.put(Table::Activity, &activity, &entry)?;
    for (k, v) in &new.labels {
        t.put(Table::Labels, &label_key(k, v, &activity), &entry)?;
    }
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
    let activity = activity_key(record.last_activity(), id);
    t.remove(Table::Activity, &activity)?;
    for (k, v) in &record.labels {
        t.remove(Table::Labels, &label_key(k, v, &activity))?;
    }
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

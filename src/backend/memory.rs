//! An in-memory backend: every table a `BTreeMap`, nothing on disk.
//!
//! It exists for two reasons. Tests and embedders get a throwaway store
//! with no directory. And it proves the boundary: it hands out **owned**
//! rows (as a client–server backend such as PostgreSQL does) where LMDB
//! lends slices of its map, so the conformance suite run on it exercises
//! the path a network backend takes.
//!
//! Isolation: one writer at a time (a mutex held by the write
//! transaction, as LMDB's writer lock); a read transaction holds a snapshot
//! (reference-counted tables, copied on write only while a reader still
//! holds the old version). A write transaction buffers its writes in an
//! overlay and applies them at commit, so dropping it leaves nothing.
//! Durability: none — the store lives as long as its handles. Locks: claims
//! and the GC lock are held in the backend and released when their guard
//! drops; they cannot outlive the process because the store cannot.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use super::{
    Backend, Direction, Entries, Entry, HeldLock, KeyRange, ReadTables, StorageStats, Table,
    WriteTables,
};
use crate::backend::BackendError;
use crate::backend::format::{FORMAT_VERSION, FORMAT_VERSION_KEY};
use crate::backend::{ClaimKey, Durability};

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

/// The committed tables, one shared map per [`Table`].
#[derive(Clone, Default)]
struct Tables([Arc<Map>; Table::ALL.len()]);

impl Tables {
    #[allow(clippy::indexing_slicing)] // `Table::index` is below `Table::ALL.len()` by construction
    fn get(&self, table: Table) -> &Map {
        &self.0[table.index()]
    }

    #[allow(clippy::indexing_slicing)] // as above
    fn get_mut(&mut self, table: Table) -> &mut Map {
        Arc::make_mut(&mut self.0[table.index()])
    }
}

/// A store held in memory. Cheap to create; gone when its last handle is.
#[derive(Debug)]
pub struct MemoryBackend {
    committed: RwLock<Tables>,
    writer: Mutex<()>,
    claims: Arc<Mutex<HashSet<ClaimKey>>>,
    gc: Arc<AtomicBool>,
    location: String,
}

impl std::fmt::Debug for Tables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tables").finish_non_exhaustive()
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new()
    }
}

impl MemoryBackend {
    /// An empty store with the current format version.
    pub fn new() -> MemoryBackend {
        let mut tables = Tables::default();
        tables.get_mut(Table::Meta).insert(
            FORMAT_VERSION_KEY.as_bytes().to_vec(),
            FORMAT_VERSION.to_be_bytes().to_vec(),
        );
        MemoryBackend {
            committed: RwLock::new(tables),
            writer: Mutex::new(()),
            claims: Arc::new(Mutex::new(HashSet::new())),
            gc: Arc::new(AtomicBool::new(false)),
            location: "memory:".into(),
        }
    }

    fn snapshot(&self) -> Tables {
        self.committed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

fn bounds(range: KeyRange<'_>) -> OwnedRange {
    let own = |b: Bound<&[u8]>| match b {
        Bound::Included(k) => Bound::Included(k.to_vec()),
        Bound::Excluded(k) => Bound::Excluded(k.to_vec()),
        Bound::Unbounded => Bound::Unbounded,
    };
    (own(range.lower), own(range.upper))
}

/// An empty or inverted range would make `BTreeMap::range` panic.
fn is_empty(range: &OwnedRange) -> bool {
    match range {
        (Bound::Included(a), Bound::Included(b)) => a > b,
        (Bound::Included(a) | Bound::Excluded(a), Bound::Excluded(b))
        | (Bound::Excluded(a), Bound::Included(b)) => a >= b,
        _ => false,
    }
}

/// Owned key bounds.
type OwnedRange = (Bound<Vec<u8>>, Bound<Vec<u8>>);

/// The owned bounds of `range`, or `None` when it is empty or inverted
/// (`BTreeMap::range` would panic on those).
fn nonempty(range: KeyRange<'_>) -> Option<OwnedRange> {
    let range = bounds(range);
    (!is_empty(&range)).then_some(range)
}

/// Entries in `direction`.
fn ordered<'t>(
    entries: impl DoubleEndedIterator<Item = Result<Entry<'t>, BackendError>> + 't,
    direction: Direction,
) -> Entries<'t> {
    match direction {
        Direction::Forward => Box::new(entries),
        Direction::Reverse => Box::new(entries.rev()),
    }
}

fn owned(k: &[u8], v: &[u8]) -> Result<Entry<'static>, BackendError> {
    Ok((Cow::Owned(k.to_vec()), Cow::Owned(v.to_vec())))
}

struct MemoryRead {
    snapshot: Tables,
}

impl ReadTables for MemoryRead {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>, BackendError> {
        Ok(self
            .snapshot
            .get(table)
            .get(key)
            .map(|v| Cow::Owned(v.clone())))
    }

    fn range(
        &self,
        table: Table,
        range: KeyRange<'_>,
        direction: Direction,
    ) -> Result<Entries<'_>, BackendError> {
        let Some(range) = nonempty(range) else {
            return Ok(Box::new(std::iter::empty()));
        };
        let entries = self.snapshot.get(table).range(range);
        Ok(ordered(entries.map(|(k, v)| owned(k, v)), direction))
    }

    fn count(&self, table: Table) -> Result<u64, BackendError> {
        Ok(self.snapshot.get(table).len() as u64)
    }
}

/// Writes not yet committed: `None` is a delete.
type Overlay = BTreeMap<(Table, Vec<u8>), Option<Vec<u8>>>;

struct MemoryWrite<'b> {
    backend: &'b MemoryBackend,
    _writer: MutexGuard<'b, ()>,
    base: Tables,
    overlay: Overlay,
}

impl MemoryWrite<'_> {
    fn current(&self, table: Table, key: &[u8]) -> Option<&[u8]> {
        match self.overlay.get(&(table, key.to_vec())) {
            Some(pending) => pending.as_deref(),
            None => self.base.get(table).get(key).map(Vec::as_slice),
        }
    }
}

impl ReadTables for MemoryWrite<'_> {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>, BackendError> {
        Ok(self.current(table, key).map(|v| Cow::Owned(v.to_vec())))
    }

    fn range(
        &self,
        table: Table,
        range: KeyRange<'_>,
        direction: Direction,
    ) -> Result<Entries<'_>, BackendError> {
        let Some(range) = nonempty(range) else {
            return Ok(Box::new(std::iter::empty()));
        };
        // Base entries overridden by the overlay, in key order.
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> = self
            .base
            .get(table)
            .range(range.clone())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for ((t, k), v) in &self.overlay {
            if *t != table || !std::ops::RangeBounds::contains(&range, k) {
                continue;
            }
            match v {
                Some(v) => merged.insert(k.clone(), v.clone()),
                None => merged.remove(k),
            };
        }
        let entries = merged
            .into_iter()
            .map(|(k, v)| Ok((Cow::Owned(k), Cow::Owned(v))));
        Ok(ordered(entries, direction))
    }

    fn count(&self, table: Table) -> Result<u64, BackendError> {
        let base = self.base.get(table);
        let mut n = base.len() as i64;
        for ((t, k), v) in &self.overlay {
            if *t != table {
                continue;
            }
            match (base.contains_key(k), v.is_some()) {
                (false, true) => n += 1,
                (true, false) => n -= 1,
                _ => {}
            }
        }
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

impl WriteTables for MemoryWrite<'_> {
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), BackendError> {
        self.overlay
            .insert((table, key.to_vec()), Some(value.to_vec()));
        Ok(())
    }

    fn insert(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<bool, BackendError> {
        if self.current(table, key).is_some() {
            return Ok(false);
        }
        self.put(table, key, value)?;
        Ok(true)
    }

    fn delete(&mut self, table: Table, key: &[u8]) -> Result<bool, BackendError> {
        let existed = self.current(table, key).is_some();
        self.overlay.insert((table, key.to_vec()), None);
        Ok(existed)
    }

    fn commit(self: Box<Self>) -> Result<(), BackendError> {
        let MemoryWrite {
            backend,
            _writer,
            base,
            overlay,
        } = *self;
        // Let go of our own reference first, so a table no reader holds is
        // updated in place rather than copied.
        drop(base);
        let mut committed = backend.committed.write().unwrap_or_else(|p| p.into_inner());
        for ((table, key), value) in overlay {
            let map = committed.get_mut(table);
            match value {
                Some(v) => map.insert(key, v),
                None => map.remove(&key),
            };
        }
        Ok(())
    }
}

/// A claim held in memory; released on drop.
#[derive(Debug)]
struct MemoryClaim {
    claims: Arc<Mutex<HashSet<ClaimKey>>>,
    id: ClaimKey,
}

impl HeldLock for MemoryClaim {}

impl Drop for MemoryClaim {
    fn drop(&mut self) {
        self.claims
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

#[derive(Debug)]
struct MemoryGcLock(Arc<AtomicBool>);

impl HeldLock for MemoryGcLock {}

impl Drop for MemoryGcLock {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl Backend for MemoryBackend {
    fn begin_read(&self) -> Result<Box<dyn ReadTables + '_>, BackendError> {
        Ok(Box::new(MemoryRead {
            snapshot: self.snapshot(),
        }))
    }

    fn begin_write(&self) -> Result<Box<dyn WriteTables + '_>, BackendError> {
        let writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        Ok(Box::new(MemoryWrite {
            backend: self,
            _writer: writer,
            base: self.snapshot(),
            overlay: Overlay::new(),
        }))
    }

    fn location(&self) -> &str {
        &self.location
    }

    fn dir(&self) -> Option<&std::path::Path> {
        None
    }

    fn durability(&self) -> Durability {
        Durability::None
    }

    fn try_lock_claim(&self, id: ClaimKey) -> Result<Option<Box<dyn HeldLock>>, BackendError> {
        let mut claims = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        if !claims.insert(id) {
            return Ok(None);
        }
        Ok(Some(Box::new(MemoryClaim {
            claims: Arc::clone(&self.claims),
            id,
        })))
    }

    fn claim_locked(&self, id: ClaimKey) -> Result<bool, BackendError> {
        Ok(self
            .claims
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&id))
    }

    fn try_lock_gc(&self) -> Result<Option<Box<dyn HeldLock>>, BackendError> {
        if self.gc.swap(true, Ordering::SeqCst) {
            return Ok(None);
        }
        Ok(Some(Box::new(MemoryGcLock(Arc::clone(&self.gc)))))
    }

    fn storage_stats(&self) -> Result<StorageStats, BackendError> {
        let tables = self.snapshot();
        let blob_bytes = tables
            .get(Table::Blobs)
            .iter()
            .map(|(k, v)| (k.len() + v.len()) as u64)
            .sum();
        Ok(StorageStats {
            blob_bytes,
            ..StorageStats::default()
        })
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

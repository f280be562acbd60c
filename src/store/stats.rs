//! `uwf-db stats`: counts from the tables, sizes from the backend.

use std::path::PathBuf;

use super::{
    Durability, GC_EPOCH_KEY, Store, StoreError, UnfinishedCopy, parse_gc_epoch,
    read_format_version,
};
use crate::backend::Table;

/// What `uwf-db stats` reports.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
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
    /// The marker of an unfinished copy into this store (`uwf-db copy`
    /// was interrupted; rerunning it finishes the copy).
    pub unfinished_copy: Option<UnfinishedCopy>,
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
    /// Whether every value carries its own checksum (LMDB: stores made by
    /// this build; `copy` a store of the legacy layout to add them).
    pub value_checksums: bool,
}

/// In JSON a durability is its name, as `--durability` takes it.
impl schemars::JsonSchema for Durability {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Durability".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "`sync`: every commit is on disk when it returns; `none`: commits are not flushed.",
            "type": "string",
            "enum": [Durability::Sync.as_str(), Durability::None.as_str()]
        })
    }
}

impl serde::Serialize for Durability {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl Store {
    /// Counts, sizes and map usage.
    ///
    /// ```
    /// use uwf_db::{Blob, Store};
    /// let store = Store::memory();
    /// store.put(&Blob::content("a", []))?;
    /// let stats = store.stats()?;
    /// assert_eq!((stats.blob_count, stats.active_threads), (1, 0));
    /// # Ok::<(), uwf_db::StoreError>(())
    /// ```
    pub fn stats(&self) -> Result<Stats, StoreError> {
        let location = self.location().to_owned();
        let (counts, format_version, gc_epoch, unfinished_copy) = self.read(|r| {
            let t = r.tables();
            let counts = [
                Table::Blobs,
                Table::Threads,
                Table::History,
                Table::Workflows,
                Table::Pins,
            ]
            .map(|table| t.count(table));
            let [blobs, active, ended, workflows, pins] = counts;
            let gc = t
                .get(Table::Meta, GC_EPOCH_KEY.as_bytes())?
                .as_deref()
                .and_then(parse_gc_epoch);
            Ok::<_, StoreError>((
                [blobs?, active?, ended?, workflows?, pins?],
                read_format_version(t, &location)?,
                gc,
                UnfinishedCopy::read(t)?,
            ))
        })?;
        let storage = self.backend().storage_stats()?;
        Ok(Stats {
            path: self.location().into(),
            format_version,
            blob_count: counts[0],
            active_threads: counts[1],
            ended_threads: counts[2],
            workflows: counts[3],
            pins: counts[4],
            gc_epoch,
            unfinished_copy,
            blob_bytes: storage.blob_bytes,
            map_size: storage.map_size,
            max_map_size: storage.max_map_size,
            map_used: storage.map_used,
            file_size: storage.file_size,
            readers: storage.readers,
            max_readers: storage.max_readers,
            durability: self.durability(),
            value_checksums: storage.value_checksums,
        })
    }
}

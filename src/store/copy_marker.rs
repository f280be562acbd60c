//! The marker an unfinished `copy` leaves in its destination's `meta`
//! (`docs/design.md` §4c). While it is there the store is not a finished
//! copy of anything: a rerun of the same copy recognises it and continues,
//! `stats` shows it, `verify` reports it, and garbage collection refuses to
//! run (the copy writes blobs before the threads that reach them, so a
//! collection in between would free blobs whose roots are not copied yet).

use super::{Store, StoreError};
use crate::backend::{ReadTables, Table};
use crate::hash::hex;

/// Key of the marker in the `meta` table. Its value is JSON:
/// `{"source": LOCATION, "started_at": MS}`.
pub const COPY_MARKER_KEY: &str = "copy_in_progress";

/// What the marker of an unfinished copy says.
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct UnfinishedCopy {
    /// Where the copy reads from: a directory, or a URL with any password
    /// hidden (the source's [`Store::location`]).
    pub source: String,
    /// When the first run of the copy began (ms since the epoch).
    pub started_at: u64,
}

impl UnfinishedCopy {
    /// The stored value.
    pub(crate) fn encode(&self) -> Vec<u8> {
        // Two plain fields: serialization cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads a stored value. A malformed one is still a marker (the store is
    /// an unfinished copy of something), naming its bytes as the source.
    pub(crate) fn decode(value: &[u8]) -> UnfinishedCopy {
        serde_json::from_slice(value).unwrap_or_else(|_| UnfinishedCopy {
            source: format!("(unreadable copy marker {})", hex(value)),
            started_at: 0,
        })
    }

    /// Reads the marker in a transaction.
    pub(crate) fn read(tables: &dyn ReadTables) -> Result<Option<UnfinishedCopy>, StoreError> {
        Ok(tables
            .get(Table::Meta, COPY_MARKER_KEY.as_bytes())?
            .map(|v| UnfinishedCopy::decode(&v)))
    }
}

impl Store {
    /// The marker of an unfinished copy into this store, if any: such a
    /// store holds part of a copy and should not be used until `copy`
    /// finishes (`docs/design.md` §4c).
    ///
    /// ```
    /// let store = uwf_db::Store::memory();
    /// assert_eq!(store.unfinished_copy().unwrap(), None);
    /// ```
    pub fn unfinished_copy(&self) -> Result<Option<UnfinishedCopy>, StoreError> {
        self.read(|r| UnfinishedCopy::read(r.tables()))
    }
}

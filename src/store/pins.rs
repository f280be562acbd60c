//! Pinned blobs: GC roots named by hand (`uwf-db cas pin`).

use super::{Store, StoreError};
use crate::backend::Table;
use crate::hash::Hash;

impl Store {
    /// Pins a stored blob: it and everything it reaches become GC roots.
    /// Returns whether it was newly pinned.
    ///
    /// ```
    /// use uwf_db::{Blob, Hash, Store};
    /// let store = Store::memory();
    /// let hash = store.put(&Blob::content("keep me", []))?;
    /// assert!(store.pin(&hash)?);
    /// assert!(!store.pin(&hash)?); // already pinned
    /// assert_eq!(store.pins()?, vec![hash]);
    /// assert!(store.pin(&Hash::of(b"absent")).is_err());
    /// # Ok::<(), uwf_db::StoreError>(())
    /// ```
    pub fn pin(&self, hash: &Hash) -> Result<bool, StoreError> {
        self.write(|w| {
            if !w.touch(hash, true)? {
                return Err(StoreError::UnknownHash {
                    prefix: hash.to_string(),
                });
            }
            Ok(w.tables_mut().insert(Table::Pins, hash.as_bytes(), &[])?)
        })
    }

    /// Unpins a blob; returns whether it was pinned. The next collection may
    /// delete it if nothing else reaches it.
    ///
    /// ```
    /// use uwf_db::{Blob, Store};
    /// let store = Store::memory();
    /// let hash = store.put(&Blob::content("keep me", []))?;
    /// store.pin(&hash)?;
    /// assert!(store.unpin(&hash)?);
    /// assert!(!store.unpin(&hash)?);
    /// assert!(store.pins()?.is_empty());
    /// # Ok::<(), uwf_db::StoreError>(())
    /// ```
    pub fn unpin(&self, hash: &Hash) -> Result<bool, StoreError> {
        self.write(|w| Ok(w.tables_mut().delete(Table::Pins, hash.as_bytes())?))
    }

    /// The pinned hashes, in order.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// let hash = store.put(&uwf_db::Blob::content("keep me", []))?;
    /// store.pin(&hash)?;
    /// assert_eq!(store.pins()?, [hash]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pins(&self) -> Result<Vec<Hash>, StoreError> {
        let mut out = Vec::new();
        self.scan_table::<StoreError>(Table::Pins, |_, key, _| {
            out.extend(Hash::from_slice(key));
            Ok(())
        })?;
        Ok(out)
    }
}

//! Read and write transactions over the store's databases.

use std::ops::Bound;

use heed::{MdbError, PutFlags, RoTxn, RwTxn, WithoutTls};

use super::record::{BlobRecord, TOUCHED_AT, touched_at, write_record};
use super::{
    Databases, FORMAT_VERSION_KEY, GC_EPOCH_KEY, StoreError, StoreInner, now_ms, parse_format,
    parse_gc_epoch,
};
use crate::hash::{Hash, HashPrefix};
use crate::node::{Blob, EncodedBlob, Kind};

/// Most candidates listed in an ambiguous-prefix error.
const MAX_CANDIDATES: usize = 5;

/// A blob as stored: its record header fields and canonical bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBlob {
    /// The blob's hash (its key).
    pub hash: Hash,
    /// The blob's kind.
    pub kind: Kind,
    /// When it was first written (ms since the epoch).
    pub written_at: u64,
    /// When a writer last re-put or re-linked it (ms since the epoch).
    pub touched_at: u64,
    /// Its refs, from the header.
    pub refs: Vec<Hash>,
    /// The canonical bytes: BLAKE3 of these is `hash`.
    pub bytes: Vec<u8>,
}

impl StoredBlob {
    /// Decodes the canonical bytes.
    pub fn decode(&self) -> Result<Blob, StoreError> {
        Blob::decode_trusted(&self.bytes).map_err(|e| StoreError::Corrupt {
            hash: self.hash,
            detail: e.to_string(),
        })
    }
}

fn parse_record<'v>(hash: &Hash, value: &'v [u8]) -> Result<BlobRecord<'v>, StoreError> {
    BlobRecord::parse(value).map_err(|e| StoreError::Corrupt {
        hash: *hash,
        detail: e.to_string(),
    })
}

/// A read transaction: one consistent snapshot of the store.
pub struct ReadTxn<'s> {
    txn: RoTxn<'s, WithoutTls>,
    store: &'s StoreInner,
}

/// Reads shared by read and write transactions.
macro_rules! blob_reads {
    () => {
        pub(crate) fn dbs(&self) -> &'s Databases {
            &self.store.dbs
        }

        pub(crate) fn store_inner(&self) -> &'s StoreInner {
            self.store
        }

        /// Whether a blob is stored.
        pub fn contains(&self, hash: &Hash) -> Result<bool, StoreError> {
            self.store
                .dbs
                .blobs
                .get(self.raw(), hash.as_bytes())
                .map(|v| v.is_some())
                .map_err(|e| self.store.error("reading a blob", e))
        }

        /// A blob's record, borrowed from the map (valid for this transaction).
        pub fn get_record(&self, hash: &Hash) -> Result<Option<BlobRecord<'_>>, StoreError> {
            let value = self
                .store
                .dbs
                .blobs
                .get(self.raw(), hash.as_bytes())
                .map_err(|e| self.store.error("reading a blob", e))?;
            value.map(|v| parse_record(hash, v)).transpose()
        }

        /// Reads one blob's record.
        pub fn get_stored(&self, hash: &Hash) -> Result<Option<StoredBlob>, StoreError> {
            Ok(self.get_record(hash)?.map(|rec| StoredBlob {
                hash: *hash,
                kind: rec.kind,
                written_at: rec.written_at,
                touched_at: rec.touched_at,
                refs: rec.refs().collect(),
                bytes: rec.bytes.to_vec(),
            }))
        }

        /// Reads and decodes one blob.
        pub fn get_blob(&self, hash: &Hash) -> Result<Option<Blob>, StoreError> {
            let Some(rec) = self.get_record(hash)? else {
                return Ok(None);
            };
            Blob::decode_trusted(rec.bytes)
                .map(Some)
                .map_err(|e| StoreError::Corrupt {
                    hash: *hash,
                    detail: e.to_string(),
                })
        }

        /// Resolves a full hash or a unique prefix of a stored blob.
        pub fn resolve(&self, prefix: &HashPrefix) -> Result<Hash, StoreError> {
            let unknown = || StoreError::UnknownHash {
                prefix: prefix.to_string(),
            };
            if let Some(full) = prefix.as_full_hash() {
                return if self.contains(&full)? {
                    Ok(full)
                } else {
                    Err(unknown())
                };
            }
            let lower = prefix.lower_bound();
            let range = (Bound::Included(&lower[..]), Bound::Unbounded);
            let iter = self
                .store
                .dbs
                .blobs
                .range(self.raw(), &range)
                .map_err(|e| self.store.error("resolving a prefix", e))?;
            let mut found = Vec::new();
            let mut truncated = false;
            for entry in iter {
                let (key, _) = entry.map_err(|e| self.store.error("resolving a prefix", e))?;
                if !prefix.matches_bytes(key) {
                    break;
                }
                if found.len() == MAX_CANDIDATES {
                    truncated = true;
                    break;
                }
                found.extend(Hash::from_slice(key));
            }
            match found.as_slice() {
                [] => Err(unknown()),
                [one] => Ok(*one),
                _ => Err(StoreError::AmbiguousPrefix {
                    prefix: prefix.to_string(),
                    candidates: found,
                    truncated,
                }),
            }
        }

        /// The stored format version.
        pub fn format_version(&self) -> Result<u32, StoreError> {
            let value = self
                .store
                .dbs
                .meta
                .get(self.raw(), FORMAT_VERSION_KEY)
                .map_err(|e| self.store.error("reading the format version", e))?;
            value
                .and_then(parse_format)
                .ok_or_else(|| StoreError::MissingFormat {
                    path: self.store.path.clone(),
                    detail: "the version key is absent or malformed".into(),
                })
        }
    };
}

impl<'s> ReadTxn<'s> {
    pub(super) fn begin(store: &'s StoreInner) -> Result<Self, StoreError> {
        let txn = store
            .env
            .read_txn()
            .map_err(|e| store.error("starting a read transaction", e))?;
        Ok(ReadTxn { txn, store })
    }

    pub(crate) fn raw(&self) -> &RoTxn<'s, WithoutTls> {
        &self.txn
    }

    blob_reads!();
}

/// A re-put refreshes `touched_at` only when it is older than this (ms), so
/// re-putting a hot blob (a repeated instruction) rarely writes.
const REFRESH_AFTER_MS: u64 = 1000;

/// A write transaction. Dropping it without [`WriteTxn::commit`] aborts it.
pub struct WriteTxn<'s> {
    txn: RwTxn<'s>,
    store: &'s StoreInner,
    now_ms: u64,
    buf: Vec<u8>,
    /// `meta["gc_epoch"]`, read on first need: `Some(None)` when no GC runs.
    gc_epoch: Option<Option<u64>>,
}

impl<'s> WriteTxn<'s> {
    pub(super) fn begin(store: &'s StoreInner) -> Result<Self, StoreError> {
        let txn = store
            .env
            .write_txn()
            .map_err(|e| store.error("starting a write transaction", e))?;
        Ok(WriteTxn {
            txn,
            store,
            now_ms: now_ms(),
            buf: Vec::with_capacity(1024),
            gc_epoch: None,
        })
    }

    /// The epoch of a garbage collection in progress (`docs/design.md` §7),
    /// read once per transaction.
    pub(crate) fn gc_epoch(&mut self) -> Result<Option<u64>, StoreError> {
        if let Some(e) = self.gc_epoch {
            return Ok(e);
        }
        let epoch = self
            .store
            .dbs
            .meta
            .get(&self.txn, GC_EPOCH_KEY)
            .map_err(|e| self.store.error("reading the GC marker", e))?
            .and_then(parse_gc_epoch);
        self.gc_epoch = Some(epoch);
        Ok(epoch)
    }

    /// The `touched_at` this transaction writes: now, but never before a
    /// running GC's epoch (so a clock that steps back cannot hide a write).
    fn stamp(&mut self) -> Result<u64, StoreError> {
        Ok(self.gc_epoch()?.map_or(self.now_ms, |e| e.max(self.now_ms)))
    }

    /// The write barrier for a root this transaction points at a blob (a
    /// thread record's head, start or staged summary; a pin; a registered
    /// workflow): while a GC runs, refresh the blob (§7). Free otherwise.
    pub(crate) fn relink_root(&mut self, hash: &Hash) -> Result<(), StoreError> {
        if self.gc_epoch()?.is_some() {
            self.touch(hash, false)?;
        }
        Ok(())
    }

    /// Refreshes the `touched_at` of a stored blob that this transaction
    /// links to (`reput: false`: only while a GC runs) or puts again
    /// (`reput: true`: also when it is over a second old). Returns whether
    /// the blob is stored. This is the GC's write barrier (§7).
    pub(crate) fn touch(&mut self, hash: &Hash, reput: bool) -> Result<bool, StoreError> {
        let epoch = self.gc_epoch()?;
        if epoch.is_none() && !reput {
            return self.contains(hash);
        }
        let stamp = self.stamp()?;
        let Some(value) = self
            .store
            .dbs
            .blobs
            .get(&self.txn, hash.as_bytes())
            .map_err(|e| self.store.error("reading a blob", e))?
        else {
            return Ok(false);
        };
        // A record too short to hold the field is corrupt: `verify` reports
        // it; the barrier leaves it alone.
        let Some(touched) = touched_at(value) else {
            return Ok(true);
        };
        let stale_for_gc = epoch.is_some_and(|e| touched < e);
        let stale = reput && touched.saturating_add(REFRESH_AFTER_MS) < self.now_ms;
        if !(stale_for_gc || stale) || touched >= stamp {
            return Ok(true);
        }
        self.buf.clear();
        self.buf.extend_from_slice(value);
        self.buf[TOUCHED_AT].copy_from_slice(&stamp.to_be_bytes());
        self.store
            .dbs
            .blobs
            .put(&mut self.txn, hash.as_bytes(), &self.buf)
            .map_err(|e| self.store.error("refreshing a blob", e))?;
        Ok(true)
    }

    pub(crate) fn raw(&self) -> &RoTxn<'s, WithoutTls> {
        &self.txn
    }

    /// The write transaction and the databases, for the modules that own
    /// other databases (threads).
    pub(crate) fn parts(&mut self) -> (&mut RwTxn<'s>, &'s Databases, &'s StoreInner) {
        (&mut self.txn, &self.store.dbs, self.store)
    }

    /// The time this transaction stamps on what it writes (ms since the epoch).
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    blob_reads!();

    /// Encodes and stores a blob; returns its hash. See [`WriteTxn::put_encoded`].
    pub fn put_blob(&mut self, blob: &Blob) -> Result<Hash, StoreError> {
        let encoded = blob.encode()?;
        self.put_encoded(&encoded)?;
        Ok(encoded.hash())
    }

    /// Stores an encoded blob. Returns `true` if it was new and `false` if it
    /// was already stored (then only its `touched_at` may be refreshed). Fails with
    /// [`StoreError::MissingRef`] if a blob it refers to is not stored (in
    /// the store or earlier in this transaction); nothing is written then.
    pub fn put_encoded(&mut self, blob: &EncodedBlob) -> Result<bool, StoreError> {
        for target in blob.refs_to_check() {
            if !self.touch(target, false)? {
                return Err(StoreError::MissingRef {
                    blob: blob.hash(),
                    missing: *target,
                });
            }
        }
        let stamp = self.stamp()?;
        write_record(&mut self.buf, blob, self.now_ms, stamp);
        let put = self.store.dbs.blobs.put_with_flags(
            &mut self.txn,
            PutFlags::NO_OVERWRITE,
            blob.hash().as_bytes(),
            &self.buf,
        );
        match put {
            Ok(()) => Ok(true),
            // Content addressing: same key, same bytes. Only the record's
            // `touched_at` may need refreshing.
            Err(heed::Error::Mdb(MdbError::KeyExist)) => {
                self.touch(&blob.hash(), true)?;
                Ok(false)
            }
            Err(e) => Err(self.store.error("writing a blob", e)),
        }
    }

    /// Commits: durable on return when the store's durability is `sync`.
    pub fn commit(self) -> Result<(), StoreError> {
        let store = self.store;
        self.txn.commit().map_err(|e| store.error("committing", e))
    }
}

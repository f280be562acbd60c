//! Read and write transactions over the store's databases.

use std::ops::Bound;

use heed::{MdbError, PutFlags, RoTxn, RwTxn, WithoutTls};

use super::record::{BlobRecord, write_record};
use super::{Databases, FORMAT_VERSION_KEY, StoreError, StoreInner, now_ms, parse_format};
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

/// A write transaction. Dropping it without [`WriteTxn::commit`] aborts it.
pub struct WriteTxn<'s> {
    txn: RwTxn<'s>,
    store: &'s StoreInner,
    now_ms: u64,
    buf: Vec<u8>,
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
        })
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
    /// was already stored (then nothing is written). Fails with
    /// [`StoreError::MissingRef`] if a blob it refers to is not stored (in
    /// the store or earlier in this transaction); nothing is written then.
    pub fn put_encoded(&mut self, blob: &EncodedBlob) -> Result<bool, StoreError> {
        for target in blob.refs_to_check() {
            if !self.contains(target)? {
                return Err(StoreError::MissingRef {
                    blob: blob.hash(),
                    missing: *target,
                });
            }
        }
        write_record(&mut self.buf, blob, self.now_ms);
        let put = self.store.dbs.blobs.put_with_flags(
            &mut self.txn,
            PutFlags::NO_OVERWRITE,
            blob.hash().as_bytes(),
            &self.buf,
        );
        match put {
            Ok(()) => Ok(true),
            // Content addressing: same key, same bytes. Nothing to do.
            Err(heed::Error::Mdb(MdbError::KeyExist)) => Ok(false),
            Err(e) => Err(self.store.error("writing a blob", e)),
        }
    }

    /// Commits: durable on return when the store's durability is `sync`.
    pub fn commit(self) -> Result<(), StoreError> {
        let store = self.store;
        self.txn.commit().map_err(|e| store.error("committing", e))
    }
}

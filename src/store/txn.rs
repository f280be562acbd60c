//! Read and write transactions over the store's databases.

use foldhash::HashSet;
use std::borrow::Cow;
use std::sync::Arc;

use super::record::{BlobRecord, TOUCHED_AT, touched_at, write_record};
use super::{GC_EPOCH_KEY, StoreError, StoreInner, now_ms, parse_gc_epoch, read_format_version};
use crate::backend::{Backend, Direction, KeyRange, ReadTables, Refresh, Table, WriteTables};
use crate::hash::{Hash, HashPrefix};
use crate::node::{Blob, EncodedBlob, Kind};

/// Most candidates listed in an ambiguous-prefix error.
const MAX_CANDIDATES: usize = 5;

/// The chain nodes (state and start nodes) a store handle wrote or walked
/// lately, as stored records by hash, kept when every read costs a round
/// trip (`Backend::reads_cost_round_trips`): a driver's next step walks
/// back over the nodes its last steps wrote (the prompt's recent steps),
/// and reading them again would be a read transaction a step. A node is
/// content-addressed, so an entry is never stale; its record's stamps
/// (`touched_at`) may be older than the stored ones, which is why only the
/// chain walks read it ([`ReadTxn::get_chain_records`]). Written nodes are
/// added when their transaction commits (`docs/design.md` §8f).
pub(crate) type RecentNodes = crate::cache::Bounded<Hash, Arc<[u8]>>;

/// Most nodes [`RecentNodes`] keeps: with [`RECENT_NODE_MAX`], 64 MiB at
/// the very most (a state node is usually well under 1 KiB).
pub(crate) const RECENT_NODES: usize = 8192;

/// The largest record [`RecentNodes`] keeps (a node with a large
/// frontmatter is read from the store each time).
pub(crate) const RECENT_NODE_MAX: usize = 8 << 10;

/// Whether a record of `kind`, `len` bytes long, belongs in [`RecentNodes`].
fn is_chain_node(kind: Kind, len: usize) -> bool {
    matches!(kind, Kind::State | Kind::Start) && len <= RECENT_NODE_MAX
}

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
            source: e.into(),
        })
    }
}

fn parse_record<'v>(hash: &Hash, value: &'v [u8]) -> Result<BlobRecord<'v>, StoreError> {
    BlobRecord::parse(value).map_err(|e| StoreError::Corrupt {
        hash: *hash,
        source: e.into(),
    })
}

/// A blob record as read: borrowed from the backend's map (LMDB) or owned
/// (a client–server backend). Parsed once when read.
#[derive(Debug)]
pub struct RecordRef<'t> {
    hash: Hash,
    value: Cow<'t, [u8]>,
}

impl RecordRef<'_> {
    /// The parsed record.
    pub fn record(&self) -> Result<BlobRecord<'_>, StoreError> {
        parse_record(&self.hash, &self.value)
    }
}

/// A read transaction: one consistent snapshot of the store.
pub struct ReadTxn<'s> {
    txn: Box<dyn ReadTables + 's>,
    backend: &'s dyn Backend,
    recent: Option<&'s RecentNodes>,
}

/// Reads shared by read and write transactions.
macro_rules! blob_reads {
    () => {
        /// Whether a blob is stored.
        pub fn contains(&self, hash: &Hash) -> Result<bool, StoreError> {
            Ok(self.tables().get(Table::Blobs, hash.as_bytes())?.is_some())
        }

        /// A blob's record, borrowed from the map where the backend can
        /// (valid for this transaction).
        pub fn get_record(&self, hash: &Hash) -> Result<Option<RecordRef<'_>>, StoreError> {
            let Some(value) = self.tables().get(Table::Blobs, hash.as_bytes())? else {
                return Ok(None);
            };
            parse_record(hash, &value)?;
            Ok(Some(RecordRef { hash: *hash, value }))
        }

        /// The records of many blobs, in their order: what
        /// [`Self::get_record`] gives for each, in one read (one round trip
        /// on a server backend).
        pub fn get_records(
            &self,
            hashes: &[Hash],
        ) -> Result<Vec<Option<RecordRef<'_>>>, StoreError> {
            let keys: Vec<&[u8]> = hashes.iter().map(|h| h.as_bytes().as_slice()).collect();
            let values = self.tables().get_many(Table::Blobs, &keys)?;
            hashes
                .iter()
                .zip(values)
                .map(|(hash, value)| {
                    value
                        .map(|value| {
                            parse_record(hash, &value)?;
                            Ok(RecordRef { hash: *hash, value })
                        })
                        .transpose()
                })
                .collect()
        }

        /// Reads one blob's record.
        pub fn get_stored(&self, hash: &Hash) -> Result<Option<StoredBlob>, StoreError> {
            let Some(value) = self.tables().get(Table::Blobs, hash.as_bytes())? else {
                return Ok(None);
            };
            let rec = parse_record(hash, &value)?;
            Ok(Some(StoredBlob {
                hash: *hash,
                kind: rec.kind,
                written_at: rec.written_at,
                touched_at: rec.touched_at,
                refs: rec.refs().collect(),
                bytes: rec.bytes.to_vec(),
            }))
        }

        /// Many blobs, in their order: what [`Self::get_blob`] gives for
        /// each, in one read (one round trip on a server backend).
        pub fn get_blobs(&self, hashes: &[Hash]) -> Result<Vec<Option<Blob>>, StoreError> {
            self.get_records(hashes)?
                .into_iter()
                .map(|found| {
                    found
                        .map(|found| {
                            let rec = found.record()?;
                            Blob::decode_trusted(rec.bytes).map_err(|e| StoreError::Corrupt {
                                hash: found.hash,
                                source: e.into(),
                            })
                        })
                        .transpose()
                })
                .collect()
        }

        /// Reads and decodes one blob.
        pub fn get_blob(&self, hash: &Hash) -> Result<Option<Blob>, StoreError> {
            let Some(value) = self.tables().get(Table::Blobs, hash.as_bytes())? else {
                return Ok(None);
            };
            let rec = parse_record(hash, &value)?;
            Blob::decode_trusted(rec.bytes)
                .map(Some)
                .map_err(|e| StoreError::Corrupt {
                    hash: *hash,
                    source: e.into(),
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
            let entries = self.tables().range(
                Table::Blobs,
                KeyRange::from(&lower[..]),
                Direction::Forward,
            )?;
            let mut found = Vec::new();
            let mut truncated = false;
            for entry in entries {
                let (key, _) = entry?;
                if !prefix.matches_bytes(&key) {
                    break;
                }
                if found.len() == MAX_CANDIDATES {
                    truncated = true;
                    break;
                }
                found.extend(Hash::from_slice(&key));
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
            read_format_version(self.tables(), self.backend.location())
        }
    };
}

impl<'s> ReadTxn<'s> {
    pub(super) fn begin(inner: &'s StoreInner) -> Result<Self, StoreError> {
        Ok(ReadTxn {
            txn: inner.backend.begin_read()?,
            backend: &*inner.backend,
            recent: inner.recent.as_ref(),
        })
    }

    /// A read that may send one statement ([`Backend::begin_read_once`]).
    pub(super) fn begin_once(inner: &'s StoreInner) -> Result<Self, StoreError> {
        Ok(ReadTxn {
            txn: inner.backend.begin_read_once()?,
            backend: &*inner.backend,
            recent: inner.recent.as_ref(),
        })
    }

    /// Whether this read, begun by [`Self::begin_once`], needed a second
    /// statement (and must run again in a transaction).
    pub(super) fn needs_transaction(&self) -> bool {
        self.txn.needs_transaction()
    }

    /// [`Self::get_records`] for a chain walk: a node the store handle
    /// wrote or walked lately ([`RecentNodes`], on a server backend) is not
    /// read again, the others are read in one round trip and kept. The
    /// records' kinds and bytes are the stored ones; their stamps may be
    /// older (callers read nodes, not stamps).
    pub(crate) fn get_chain_records(
        &self,
        hashes: &[Hash],
    ) -> Result<Vec<Option<RecordRef<'_>>>, StoreError> {
        let Some(recent) = self.recent else {
            return self.get_records(hashes);
        };
        let mut out: Vec<Option<RecordRef<'_>>> = Vec::with_capacity(hashes.len());
        let mut missing = Vec::new();
        for (i, hash) in hashes.iter().enumerate() {
            match recent.get(hash) {
                Some(value) => out.push(Some(RecordRef {
                    hash: *hash,
                    value: Cow::Owned(value.to_vec()),
                })),
                None => {
                    out.push(None);
                    missing.push(i);
                }
            }
        }
        if missing.is_empty() {
            return Ok(out);
        }
        let wanted: Vec<Hash> = missing
            .iter()
            .filter_map(|&i| hashes.get(i))
            .copied()
            .collect();
        for (i, found) in missing.into_iter().zip(self.get_records(&wanted)?) {
            if let Some(found) = &found
                && is_chain_node(found.record()?.kind, found.value.len())
            {
                recent.insert(found.hash, Arc::from(&*found.value));
            }
            if let Some(slot) = out.get_mut(i) {
                *slot = found;
            }
        }
        Ok(out)
    }

    /// The tables, for the modules that own them (threads, workflows, GC).
    pub(crate) fn tables(&self) -> &dyn ReadTables {
        &*self.txn
    }

    blob_reads!();
}

/// A re-put refreshes `touched_at` only when it is older than this (ms), so
/// re-putting a hot blob (a repeated instruction) rarely writes.
const REFRESH_AFTER_MS: u64 = 1000;

/// A write transaction. Dropping it without [`WriteTxn::commit`] aborts it.
pub struct WriteTxn<'s> {
    txn: Box<dyn WriteTables + 's>,
    backend: &'s dyn Backend,
    now_ms: u64,
    buf: Vec<u8>,
    /// `meta["gc_epoch"]`, read on first need: `Some(None)` when no GC runs.
    gc_epoch: Option<Option<u64>>,
    /// Blobs this transaction wrote (inserted, or refreshed by the
    /// barrier): stored, with a `touched_at` of this transaction's stamp,
    /// so a ref check or barrier for one of them reads nothing.
    written: HashSet<Hash>,
    /// Blobs this transaction found stored: a ref check for one of them
    /// reads nothing while no GC runs (while one runs, the barrier must
    /// still look at its `touched_at`).
    seen: HashSet<Hash>,
    /// Where the chain nodes this transaction writes go when it commits
    /// (a server backend), and those nodes.
    recent: Option<&'s RecentNodes>,
    fresh: Vec<(Hash, Arc<[u8]>)>,
}

impl<'s> WriteTxn<'s> {
    pub(super) fn begin(inner: &'s StoreInner) -> Result<Self, StoreError> {
        Self::begin_as(inner, false)
    }

    /// A write transaction; `exclusive`: one no other writer interleaves
    /// with ([`Backend::begin_write_exclusive`]).
    pub(super) fn begin_as(inner: &'s StoreInner, exclusive: bool) -> Result<Self, StoreError> {
        let backend = &*inner.backend;
        let txn = if exclusive {
            backend.begin_write_exclusive()?
        } else {
            backend.begin_write()?
        };
        // Nearly every write reads it (the GC barrier): fetched with `BEGIN`
        // by a server backend.
        txn.prefetch(&[(Table::Meta, GC_EPOCH_KEY.as_bytes())])?;
        Ok(WriteTxn {
            txn,
            backend,
            now_ms: now_ms(),
            buf: Vec::with_capacity(1024),
            gc_epoch: None,
            written: HashSet::default(),
            seen: HashSet::default(),
            recent: inner.recent.as_ref(),
            fresh: Vec::new(),
        })
    }

    /// Keys this transaction will read first: a server backend fetches
    /// them with its `BEGIN` (taking the order locks they need), unless a
    /// statement was sent already ([`ReadTables::prefetch`]).
    pub(crate) fn prefetch(&self, keys: &[(Table, &[u8])]) -> Result<(), StoreError> {
        Ok(self.txn.prefetch(keys)?)
    }

    /// The record of a chain node for its kind and bytes (`next_position`
    /// reading a thread's head): the record this transaction wrote, when
    /// it kept one (a server backend keeps the chain nodes it writes, up to
    /// `RECENT_NODE_MAX`, for [`RecentNodes`]), else the stored one. A
    /// server backend holds the write back until the commit, so reading it
    /// back sent the held writes and then the read: two round trips inside
    /// the group's transaction, in every group where a thread's last step
    /// and its end node are written together (`docs/design.md` §8f). The
    /// stored record can differ only in its stamps, when the node was
    /// stored already.
    pub(crate) fn get_node_record(&self, hash: &Hash) -> Result<Option<RecordRef<'_>>, StoreError> {
        if let Some((_, record)) = self.fresh.iter().rev().find(|(h, _)| h == hash) {
            return Ok(Some(RecordRef {
                hash: *hash,
                value: Cow::Borrowed(record),
            }));
        }
        self.get_record(hash)
    }

    /// Keeps a chain node this transaction writes (its record is in
    /// `self.buf`), for [`RecentNodes`] once the transaction commits.
    fn keep_fresh(&mut self, blob: &EncodedBlob) {
        if self.recent.is_some() && is_chain_node(blob.kind(), self.buf.len()) {
            self.fresh
                .push((blob.hash(), Arc::from(self.buf.as_slice())));
        }
    }

    /// Whether the transaction's server connection was lost (before its
    /// commit, nothing of it was applied).
    pub(super) fn connection_lost(&self) -> bool {
        self.txn.connection_lost()
    }

    /// Whether a statement failed for a serialization failure or a
    /// deadlock: nothing of the transaction is applied, and running it
    /// again may succeed.
    pub(super) fn serialization_failed(&self) -> bool {
        self.txn.serialization_failed()
    }

    /// The epoch of a garbage collection in progress (`docs/design.md` §7),
    /// read once per transaction.
    pub(crate) fn gc_epoch(&mut self) -> Result<Option<u64>, StoreError> {
        if let Some(e) = self.gc_epoch {
            return Ok(e);
        }
        let epoch = self
            .txn
            .get(Table::Meta, GC_EPOCH_KEY.as_bytes())?
            .as_deref()
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
        // Written by this transaction: stored, and stamped now.
        if self.written.contains(hash) {
            return Ok(true);
        }
        let epoch = self.gc_epoch()?;
        if epoch.is_none() && !reput {
            if self.seen.contains(hash) {
                return Ok(true);
            }
            let stored = self.contains(hash)?;
            if stored {
                self.seen.insert(*hash);
            }
            return Ok(stored);
        }
        let stamp = self.stamp()?;
        let Some(value) = self.txn.get(Table::Blobs, hash.as_bytes())? else {
            return Ok(false);
        };
        // A record too short to hold the field is corrupt: `verify` reports
        // it; the barrier leaves it alone.
        let Some(touched) = touched_at(&value) else {
            return Ok(true);
        };
        let stale_for_gc = epoch.is_some_and(|e| touched < e);
        let stale = reput && touched.saturating_add(REFRESH_AFTER_MS) < self.now_ms;
        if !(stale_for_gc || stale) || touched >= stamp {
            return Ok(true);
        }
        self.buf.clear();
        self.buf.extend_from_slice(&value);
        drop(value);
        if let Some(field) = self.buf.get_mut(TOUCHED_AT) {
            field.copy_from_slice(&stamp.to_be_bytes());
        }
        self.txn.put(Table::Blobs, hash.as_bytes(), &self.buf)?;
        self.written.insert(*hash);
        Ok(true)
    }

    /// The tables, for the modules that own them (threads, workflows, GC).
    pub(crate) fn tables(&self) -> &dyn ReadTables {
        &*self.txn
    }

    /// The tables for writing. Blob records are written only through
    /// [`WriteTxn::put_encoded`] and the barrier; other modules write the
    /// tables they own.
    pub(crate) fn tables_mut(&mut self) -> &mut dyn WriteTables {
        &mut *self.txn
    }

    /// The time this transaction stamps on what it writes (ms since the epoch).
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    blob_reads!();

    /// Encodes and stores a blob; returns its hash. See [`WriteTxn::put_encoded`].
    pub fn put_blob(&mut self, blob: &Blob) -> Result<Hash, StoreError> {
        let encoded = blob.encode()?;
        self.store_encoded(&encoded)?;
        Ok(encoded.hash())
    }

    /// Notes which of `hashes` are stored, in one read (one round trip on a
    /// server backend, whose later `get` of them is answered from it): a
    /// ref check of one of them then reads nothing.
    pub(crate) fn note_stored(&mut self, hashes: &[Hash]) -> Result<(), StoreError> {
        let unknown: Vec<&[u8]> = hashes
            .iter()
            .filter(|h| !self.written.contains(*h) && !self.seen.contains(*h))
            .map(|h| h.as_bytes().as_slice())
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        let found = self.txn.get_many(Table::Blobs, &unknown)?;
        let stored: Vec<Hash> = unknown
            .iter()
            .zip(&found)
            .filter(|(_, value)| value.is_some())
            .filter_map(|(key, _)| Hash::from_slice(key))
            .collect();
        drop(found);
        self.seen.extend(stored);
        Ok(())
    }

    /// Notes which of a blob's refs are stored, in one read, before its
    /// ref checks, where reads cost round trips and there are several: a
    /// fan-out's join names every child's end node, which were checked
    /// one round trip each inside the write transaction. LMDB checks each
    /// in its own map, as before.
    fn note_refs(&mut self, blob: &EncodedBlob) -> Result<(), StoreError> {
        let targets = blob.refs_to_check();
        if targets.len() > 1 && self.backend.reads_cost_round_trips() {
            self.note_stored(targets)?;
        }
        Ok(())
    }

    /// Stores an encoded blob, like [`WriteTxn::put_encoded`], without
    /// finding out whether it was new: a server backend sends it with the
    /// commit, the refresh of a stored copy's `touched_at` included
    /// ([`WriteTables::insert_or_refresh`]).
    pub(crate) fn store_encoded(&mut self, blob: &EncodedBlob) -> Result<(), StoreError> {
        self.note_refs(blob)?;
        for target in blob.refs_to_check() {
            if !self.touch(target, false)? {
                return Err(StoreError::MissingRef {
                    blob: blob.hash(),
                    missing: *target,
                });
            }
        }
        let hash = blob.hash();
        if self.written.contains(&hash) {
            return Ok(());
        }
        let epoch = self.gc_epoch()?;
        let stamp = self.stamp()?;
        write_record(&mut self.buf, blob, self.now_ms, stamp);
        // What `touch(hash, true)` refreshes: a `touched_at` before a
        // running GC's epoch, or over a second old.
        let refresh = Refresh {
            offset: TOUCHED_AT.start,
            below: epoch
                .unwrap_or(0)
                .max(self.now_ms.saturating_sub(REFRESH_AFTER_MS)),
            stamp,
            required: epoch.is_some(),
        };
        self.txn
            .insert_or_refresh(Table::Blobs, hash.as_bytes(), &self.buf, refresh)?;
        self.keep_fresh(blob);
        // Stored now, with a `touched_at` at or after `below`: no barrier
        // or refresh of it is due in this transaction.
        self.written.insert(hash);
        Ok(())
    }

    /// Stores an encoded blob. Returns `true` if it was new and `false` if it
    /// was already stored (then only its `touched_at` may be refreshed). Fails with
    /// [`StoreError::MissingRef`] if a blob it refers to is not stored (in
    /// the store or earlier in this transaction); nothing is written then.
    pub fn put_encoded(&mut self, blob: &EncodedBlob) -> Result<bool, StoreError> {
        self.note_refs(blob)?;
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
        if self
            .txn
            .insert(Table::Blobs, blob.hash().as_bytes(), &self.buf)?
        {
            self.written.insert(blob.hash());
            self.keep_fresh(blob);
            return Ok(true);
        }
        // Content addressing: same key, same bytes. Only the record's
        // `touched_at` may need refreshing.
        self.touch(&blob.hash(), true)?;
        Ok(false)
    }

    /// Commits: durable on return when the store's durability is `sync`.
    pub fn commit(self) -> Result<(), StoreError> {
        self.txn.commit()?;
        if let Some(recent) = self.recent {
            for (hash, record) in self.fresh {
                recent.insert(hash, record);
            }
        }
        Ok(())
    }
}

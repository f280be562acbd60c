//! The collector's in-memory graph: every blob header scanned in parallel
//! into one chunk per key range, refs kept as 8-byte keys with an O(1)
//! bucket lookup, and an atomic bitmap of marks (`docs/design.md` §7,
//! phases 3 and 4).
//!
//! Indexing here is by ids the graph itself hands out (`Id`: a chunk and a
//! position in it), and bucket positions computed modulo the table size,
//! so every index is in bounds by construction; checked indexing would
//! cost the mark's inner loop for nothing.
#![allow(clippy::indexing_slicing)]

use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use super::{GcError, GcProgress, SCAN_RANGES};
use crate::backend::{KeyRange, Table};
use crate::hash::{HASH_LEN, Hash, hex};
use crate::node::{Kind, state_ancestors_raw};
use crate::store::{BlobRecord, Store};

/// A scanned blob: its key range (the hash's first byte) in the top 8 bits,
/// its index in that range below.
pub(super) type Id = u32;

const LOCAL_BITS: u32 = 24;

#[inline]
fn id(chunk: usize, local: usize) -> Id {
    ((chunk as u32) << LOCAL_BITS) | local as u32
}

#[inline]
fn split(id: Id) -> (usize, usize) {
    (
        (id >> LOCAL_BITS) as usize,
        (id & ((1 << LOCAL_BITS) - 1)) as usize,
    )
}

/// The first 8 bytes of a hash, big-endian: what the graph looks refs up
/// by. Two blobs sharing them are both treated as the target of such a ref,
/// which can only keep more, never less.
#[inline]
pub(super) fn key_of(hash: &[u8]) -> u64 {
    let mut k = [0u8; 8];
    k.copy_from_slice(&hash[..8]);
    u64::from_be_bytes(k)
}

/// One key range of the scanned blob graph (hashes with one first byte),
/// sorted by hash.
#[derive(Default)]
pub(super) struct Chunk {
    hashes: Vec<Hash>,
    keys: Vec<u64>,
    touched: Vec<u64>,
    sizes: Vec<u32>,
    /// `refs[ref_ends[i - 1]..ref_ends[i]]` are blob `i`'s ref keys.
    ref_ends: Vec<u32>,
    refs: Vec<u64>,
    /// `keys[buckets[b]..buckets[b + 1]]` are the keys whose bits after the
    /// first byte start with `b` (`bits` of them).
    buckets: Vec<u32>,
    bits: u32,
}

impl Chunk {
    /// When blob `i` of this chunk was last touched.
    #[inline]
    pub(super) fn touched_at(&self, i: usize) -> u64 {
        self.touched[i]
    }

    pub(super) fn with_capacity(n: usize) -> Chunk {
        Chunk {
            hashes: Vec::with_capacity(n),
            keys: Vec::with_capacity(n),
            touched: Vec::with_capacity(n),
            sizes: Vec::with_capacity(n),
            ref_ends: Vec::with_capacity(n),
            refs: Vec::with_capacity(n * 4),
            ..Chunk::default()
        }
    }

    pub(super) fn push(
        &mut self,
        hash: Hash,
        touched: u64,
        size: usize,
        refs: impl Iterator<Item = u64>,
    ) {
        self.keys.push(key_of(hash.as_bytes()));
        self.hashes.push(hash);
        self.touched.push(touched);
        self.sizes.push(u32::try_from(size).unwrap_or(u32::MAX));
        self.refs.extend(refs);
        self.ref_ends
            .push(u32::try_from(self.refs.len()).unwrap_or(u32::MAX));
    }

    #[inline]
    pub(super) fn bucket(&self, key: u64) -> usize {
        ((key << 8) >> (64 - self.bits)) as usize
    }

    /// Builds the bucket table: about one key per bucket.
    pub(super) fn index(&mut self) {
        let n = self.keys.len();
        self.bits = (usize::BITS - n.leading_zeros()).clamp(1, 24);
        let mut buckets = vec![0u32; (1 << self.bits) + 1];
        for &k in &self.keys {
            buckets[self.bucket(k) + 1] += 1;
        }
        for b in 1..buckets.len() {
            buckets[b] += buckets[b - 1];
        }
        self.buckets = buckets;
    }

    #[inline]
    pub(super) fn refs_of(&self, i: usize) -> &[u64] {
        let start = if i == 0 {
            0
        } else {
            self.ref_ends[i - 1] as usize
        };
        &self.refs[start..self.ref_ends[i] as usize]
    }
}

/// The scanned blob graph: 256 chunks, one per first byte of the hash.
pub(super) struct Graph {
    chunks: Vec<Chunk>,
}

impl Graph {
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.chunks.iter().map(|c| c.keys.len()).sum()
    }

    #[inline]
    pub(super) fn hash(&self, id: Id) -> Hash {
        let (c, i) = split(id);
        self.chunks[c].hashes[i]
    }

    #[inline]
    pub(super) fn size(&self, id: Id) -> u32 {
        let (c, i) = split(id);
        self.chunks[c].sizes[i]
    }

    #[inline]
    pub(super) fn refs_of(&self, id: Id) -> &[u64] {
        let (c, i) = split(id);
        self.chunks[c].refs_of(i)
    }

    /// The scanned blobs a ref key names (one, or none if the target was
    /// not scanned: written after its range was read).
    #[inline]
    pub(super) fn targets(&self, key: u64) -> impl Iterator<Item = Id> + '_ {
        let c = (key >> 56) as usize;
        let chunk = &self.chunks[c];
        let range = if chunk.keys.is_empty() {
            0..0
        } else {
            let b = chunk.bucket(key);
            chunk.buckets[b] as usize..chunk.buckets[b + 1] as usize
        };
        range
            .filter(move |&i| chunk.keys[i] == key)
            .map(move |i| id(c, i))
    }

    /// Every blob whose `keep` holds, in parallel.
    pub(super) fn select(&self, keep: impl Fn(&Chunk, usize, Id) -> bool + Sync) -> Vec<Id> {
        self.chunks
            .par_iter()
            .enumerate()
            .flat_map_iter(|(c, chunk)| {
                let keep = &keep;
                (0..chunk.keys.len())
                    .map(move |i| (i, id(c, i)))
                    .filter(move |&(i, id)| keep(chunk, i, id))
                    .map(|(_, id)| id)
            })
            .collect()
    }
}

/// One bit per scanned blob, settable from many threads.
pub(super) struct Marks(Vec<Vec<AtomicU64>>);

impl Marks {
    pub(super) fn new(graph: &Graph) -> Marks {
        Marks(
            graph
                .chunks
                .iter()
                .map(|c| {
                    (0..c.keys.len().div_ceil(64))
                        .map(|_| AtomicU64::new(0))
                        .collect()
                })
                .collect(),
        )
    }
    /// Sets the bit; true if this call set it.
    #[inline]
    pub(super) fn set(&self, id: Id) -> bool {
        let (c, i) = split(id);
        let bit = 1u64 << (i % 64);
        self.0[c][i / 64].fetch_or(bit, Ordering::Relaxed) & bit == 0
    }
    #[inline]
    pub(super) fn get(&self, id: Id) -> bool {
        let (c, i) = split(id);
        self.0[c][i / 64].load(Ordering::Relaxed) & (1u64 << (i % 64)) != 0
    }
}

/// Reads every blob header, one key range per task, each in its own
/// short read transaction.
pub(super) fn scan_blobs(
    store: &Store,
    progress: &(dyn Fn(GcProgress) + Sync),
) -> Result<Graph, GcError> {
    let total = store.blob_count()?;
    let per_range = usize::try_from(total / u64::from(SCAN_RANGES)).unwrap_or(0);
    let done = AtomicU64::new(0);
    let chunks: Vec<Chunk> = (0..SCAN_RANGES)
        .into_par_iter()
        .map(|first| {
            let chunk = scan_range(store, first, per_range + per_range / 8 + 16);
            progress(GcProgress::Scanning {
                done: done.fetch_add(1, Ordering::Relaxed) + 1,
                total: u64::from(SCAN_RANGES),
            });
            chunk
        })
        .collect::<Result<_, _>>()?;
    Ok(Graph { chunks })
}

pub(super) fn scan_range(store: &Store, first: u16, capacity: usize) -> Result<Chunk, GcError> {
    let lower = [first as u8];
    let upper = [first as u8 + u8::from(first < 255)];
    let range = KeyRange {
        lower: Bound::Included(&lower[..]),
        upper: if first < 255 {
            Bound::Excluded(&upper[..])
        } else {
            Bound::Unbounded
        },
    };
    let mut chunk =
        store.read(|r| {
            let mut c = Chunk::with_capacity(capacity);
            let mut damaged = None;
            r.tables()
                .visit_range(Table::Blobs, range, &mut |key, value| match scan_one(
                    &mut c, key, value,
                ) {
                    Ok(()) => Ok(true),
                    Err(e) => {
                        damaged = Some(e);
                        Ok(false)
                    }
                })?;
            match damaged {
                Some(e) => Err(e),
                None => Ok::<_, GcError>(c),
            }
        })?;
    if chunk.keys.len() >= 1 << LOCAL_BITS {
        return Err(GcError::TooLarge {
            blobs: chunk.keys.len(),
        });
    }
    chunk.index();
    Ok(chunk)
}

/// The refs the mark follows: the header's, except that a state node's
/// older ancestors are left out, because its parent refers to them too
/// (`ancestors[1..]` of a node are `ancestors[..10]` of its parent). This
/// is what cuts a state node's edges from up to 16 to at most 6. If the
/// layout is not the expected one, every ref is kept.
/// Reads one blob record's header into the chunk.
fn scan_one(c: &mut Chunk, key: &[u8], value: &[u8]) -> Result<(), GcError> {
    let corrupt = |detail: String| GcError::Corrupt {
        what: format!("the blob record under key {}", hex(key)),
        detail,
    };
    let hash = Hash::from_slice(key).ok_or_else(|| corrupt("bad key".into()))?;
    let rec = BlobRecord::parse(value).map_err(|e| corrupt(e.to_string()))?;
    let refs = marking_refs(&rec);
    c.push(
        hash,
        rec.touched_at,
        value.len(),
        refs.chunks_exact(HASH_LEN).map(key_of),
    );
    Ok(())
}

fn marking_refs<'a>(rec: &BlobRecord<'a>) -> std::borrow::Cow<'a, [u8]> {
    let refs = rec.refs_bytes();
    if rec.kind != Kind::State {
        return refs.into();
    }
    let Some(ancestors) = state_ancestors_raw(rec.bytes) else {
        return refs.into();
    };
    let n = ancestors.len() / 34;
    if n < 2 {
        return refs.into();
    }
    let parent = &ancestors[2..34];
    let Some(p) = refs
        .chunks_exact(HASH_LEN)
        .take(4)
        .position(|r| r == parent)
    else {
        return refs.into();
    };
    let older = &refs[(p + 1) * HASH_LEN..];
    let in_order = older.len() >= (n - 1) * HASH_LEN
        && older
            .chunks_exact(HASH_LEN)
            .zip(ancestors.chunks_exact(34).skip(1))
            .all(|(r, a)| r == &a[2..]);
    if !in_order {
        return refs.into();
    }
    let mut kept = refs[..(p + 1) * HASH_LEN].to_vec();
    kept.extend_from_slice(&refs[(p + n) * HASH_LEN..]);
    kept.into()
}

//! The collector's in-memory graph: every blob header scanned in parallel
//! into one chunk per key range, refs kept as 8-byte keys with an O(1)
//! bucket lookup, then resolved once to the ids they name, so the mark
//! follows ids, not keys; and an atomic bitmap of marks (`docs/design.md`
//! §7, phases 3 and 4).
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
use crate::prefetch::prefetch;
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

/// Bytes of a hash after its 8-byte key.
const TAIL_LEN: usize = HASH_LEN - 8;

/// One key range of the scanned blob graph (hashes with one first byte),
/// sorted by hash. About 50 bytes a blob once resolved (`docs/design.md`
/// §7, "Memory"): a blob's hash is
/// its key and its tail, and what the collection needs of its header
/// (whether it is young, its refs) is taken during the scan, not kept.
#[derive(Default)]
pub(super) struct Chunk {
    keys: Vec<u64>,
    /// `keys[i]` then `tails[i]` is blob `i`'s hash.
    tails: Vec<[u8; TAIL_LEN]>,
    /// The blobs touched at or after the scan's `keep_after` (within the
    /// grace period): roots of the mark. Usually few.
    young: Vec<u32>,
    /// `refs[ref_ends[i - 1]..ref_ends[i]]` are blob `i`'s ref keys.
    ref_ends: Vec<u32>,
    /// Bit `i` set: blob `i` refers to nothing (a leaf), so the mark sets
    /// its bit and never visits it. One bit a blob, small enough to stay
    /// in cache where `ref_ends` is not.
    leaves: Vec<u64>,
    refs: Vec<u64>,
    /// `edges[j]`: the first scanned blob `refs[j]` names, or [`NONE`]
    /// (filled by [`Graph::resolve`], which then empties `refs`).
    edges: Vec<Id>,
    /// Whether two blobs of this chunk share an 8-byte key (keys are
    /// sorted, so they are neighbours).
    shared_keys: bool,
    /// `keys[buckets[b]..buckets[b + 1]]` are the keys whose bits after the
    /// first byte start with `b` (`bits` of them).
    buckets: Vec<u32>,
    bits: u32,
}

impl Chunk {
    pub(super) fn with_capacity(n: usize) -> Chunk {
        Chunk {
            keys: Vec::with_capacity(n),
            tails: Vec::with_capacity(n),
            ref_ends: Vec::with_capacity(n),
            refs: Vec::with_capacity(n * 4),
            ..Chunk::default()
        }
    }

    /// Adds a blob (hashes in ascending order); `young` if it was touched
    /// within the grace period.
    pub(super) fn push(&mut self, hash: &Hash, young: bool, refs: impl Iterator<Item = u64>) {
        let (key, tail) = hash.as_bytes().split_at(8);
        if young {
            self.young
                .push(u32::try_from(self.keys.len()).unwrap_or(u32::MAX));
        }
        let i = self.keys.len();
        self.keys.push(key_of(key));
        let mut t = [0u8; TAIL_LEN];
        t.copy_from_slice(tail);
        self.tails.push(t);
        let before = self.refs.len();
        self.refs.extend(refs);
        if i.is_multiple_of(64) {
            self.leaves.push(0);
        }
        if self.refs.len() == before
            && let Some(word) = self.leaves.last_mut()
        {
            *word |= 1 << (i % 64);
        }
        self.ref_ends
            .push(u32::try_from(self.refs.len()).unwrap_or(u32::MAX));
    }

    #[inline]
    pub(super) fn bucket(&self, key: u64) -> usize {
        ((key << 8) >> (64 - self.bits)) as usize
    }

    /// Builds the bucket table: about one key per bucket.
    pub(super) fn index(&mut self) {
        self.shared_keys = self.keys.windows(2).any(|w| w[0] == w[1]);
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
    fn ref_range(&self, i: usize) -> std::ops::Range<usize> {
        let start = if i == 0 {
            0
        } else {
            self.ref_ends[i - 1] as usize
        };
        start..self.ref_ends[i] as usize
    }
}

/// How many refs ahead the resolve prefetches a ref's bucket, and its
/// first key.
const PREFETCH_BUCKET: usize = 16;
const PREFETCH_KEY: usize = 8;

/// An edge to no scanned blob (its target was written after its range was
/// read, or is missing). Never a real id: a chunk holds fewer than 2^24
/// blobs.
const NONE: Id = Id::MAX;

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
        let chunk = &self.chunks[c];
        let mut bytes = [0u8; HASH_LEN];
        bytes[..8].copy_from_slice(&chunk.keys[i].to_be_bytes());
        bytes[8..].copy_from_slice(&chunk.tails[i]);
        Hash::from_bytes(bytes)
    }

    /// The blobs touched within the grace period.
    pub(super) fn young(&self) -> Vec<Id> {
        self.chunks
            .iter()
            .enumerate()
            .flat_map(|(c, chunk)| chunk.young.iter().map(move |&i| id(c, i as usize)))
            .collect()
    }

    /// Resolves every ref key to the first scanned blob it names, once, in
    /// parallel: a pass over each chunk's refs in order whose lookups do
    /// not depend on each other, each prefetched ahead, so their cache
    /// misses overlap, where a search that looked each key up as it reached
    /// it would wait for each (the prefetch alone took the resolve from
    /// about 63 ms to 27 ms over 2 M refs). The ref keys are dropped after: only the ids
    /// are read from then on.
    fn resolve(&mut self) {
        let edges: Vec<Vec<Id>> = self
            .chunks
            .par_iter()
            .map(|c| {
                let refs = &c.refs;
                let mut out = Vec::with_capacity(refs.len());
                // Two stages ahead: the bucket of the ref 16 on, then
                // the first key of the ref 8 on (its bucket loaded by then).
                for j in 0..refs.len() {
                    if let Some(&k) = refs.get(j + PREFETCH_BUCKET) {
                        let t = &self.chunks[(k >> 56) as usize];
                        if let Some(b) = t.buckets.get(t.bucket(k)) {
                            prefetch(b);
                        }
                    }
                    if let Some(&k) = refs.get(j + PREFETCH_KEY) {
                        let t = &self.chunks[(k >> 56) as usize];
                        if let Some(&start) = t.buckets.get(t.bucket(k))
                            && let Some(key) = t.keys.get(start as usize)
                        {
                            prefetch(key);
                        }
                    }
                    out.push(self.targets(refs[j]).next().unwrap_or(NONE));
                }
                out
            })
            .collect();
        for (c, e) in self.chunks.iter_mut().zip(edges) {
            c.edges = e;
            c.refs = Vec::new();
        }
    }

    /// Starts loading what [`Graph::edges`] reads first for `id`.
    #[inline]
    pub(super) fn prefetch_node(&self, id: Id) {
        let (c, i) = split(id);
        let chunk = &self.chunks[c];
        if let Some(e) = chunk.ref_ends.get(i) {
            prefetch(e);
        }
    }

    /// Starts loading `id`'s edges (its ref offsets should be loaded).
    #[inline]
    pub(super) fn prefetch_edges(&self, id: Id) {
        let (c, i) = split(id);
        let chunk = &self.chunks[c];
        let start = if i == 0 {
            0
        } else {
            chunk.ref_ends[i - 1] as usize
        };
        if let Some(e) = chunk.edges.get(start) {
            prefetch(e);
        }
    }

    /// Whether blob `id` refers to nothing.
    #[inline]
    pub(super) fn is_leaf(&self, id: Id) -> bool {
        let (c, i) = split(id);
        self.chunks[c]
            .leaves
            .get(i / 64)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    /// The scanned blobs blob `id` refers to.
    /// A ref whose 8-byte key several blobs share names all of them, which
    /// can only keep more, never less.
    #[inline]
    pub(super) fn edges(&self, id: Id) -> impl Iterator<Item = Id> + '_ {
        let (c, i) = split(id);
        let chunk = &self.chunks[c];
        chunk.edges[chunk.ref_range(i)]
            .iter()
            .filter(|&&t| t != NONE)
            .flat_map(move |&t| {
                let (tc, ti) = split(t);
                let target = &self.chunks[tc];
                // Only where keys are shared: the blobs after the first
                // with the same key (its neighbours in key order).
                let more = if target.shared_keys {
                    target.keys[ti + 1..]
                        .iter()
                        .take_while(|&&k| k == target.keys[ti])
                        .count()
                } else {
                    0
                };
                (0..=more).map(move |d| t + d as Id)
            })
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
    pub(super) fn select(&self, keep: impl Fn(Id) -> bool + Sync) -> Vec<Id> {
        self.chunks
            .par_iter()
            .enumerate()
            .flat_map_iter(|(c, chunk)| {
                let keep = &keep;
                (0..chunk.keys.len())
                    .map(move |i| id(c, i))
                    .filter(move |&id| keep(id))
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
/// short read transaction; blobs touched at or after `keep_after` are
/// young.
pub(super) fn scan_blobs(
    store: &Store,
    keep_after: u64,
    progress: &(dyn Fn(GcProgress) + Sync),
) -> Result<Graph, GcError> {
    let total = store.blob_count()?;
    let per_range = usize::try_from(total / u64::from(SCAN_RANGES)).unwrap_or(0);
    let done = AtomicU64::new(0);
    let chunks: Vec<Chunk> = (0..SCAN_RANGES)
        .into_par_iter()
        .map(|first| {
            let chunk = scan_range(store, first, per_range + per_range / 8 + 16, keep_after);
            progress(GcProgress::Scanning {
                done: done.fetch_add(1, Ordering::Relaxed) + 1,
                total: u64::from(SCAN_RANGES),
            });
            chunk
        })
        .collect::<Result<_, _>>()?;
    let mut graph = Graph { chunks };
    graph.resolve();
    Ok(graph)
}

pub(super) fn scan_range(
    store: &Store,
    first: u16,
    capacity: usize,
    keep_after: u64,
) -> Result<Chunk, GcError> {
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
    let mut chunk = store.read(|r| {
        let mut c = Chunk::with_capacity(capacity);
        let mut damaged = None;
        r.tables()
            .visit_range(Table::Blobs, range, &mut |key, value| match scan_one(
                &mut c, key, value, keep_after,
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

/// Reads one blob record's header into the chunk.
fn scan_one(c: &mut Chunk, key: &[u8], value: &[u8], keep_after: u64) -> Result<(), GcError> {
    let corrupt = |detail: String| GcError::Corrupt {
        what: format!("the blob record under key {}", hex(key)),
        detail,
    };
    let hash = Hash::from_slice(key).ok_or_else(|| corrupt("bad key".into()))?;
    let rec = BlobRecord::parse(value).map_err(|e| corrupt(e.to_string()))?;
    let (before, after) = marking_refs(&rec);
    c.push(
        &hash,
        rec.touched_at >= keep_after,
        before
            .chunks_exact(HASH_LEN)
            .chain(after.chunks_exact(HASH_LEN))
            .map(key_of),
    );
    Ok(())
}

/// The refs the mark follows: the header's, except that a state node's
/// older ancestors are left out, because its parent refers to them too
/// (`ancestors[1..]` of a node are `ancestors[..10]` of its parent). This
/// is what cuts a state node's edges from up to 16 to at most 6. If the
/// layout is not the expected one, every ref is kept. Given as two runs of
/// the header's ref bytes (the second empty when nothing is left out),
/// borrowed: no allocation per blob.
fn marking_refs<'a>(rec: &BlobRecord<'a>) -> (&'a [u8], &'a [u8]) {
    let refs = rec.refs_bytes();
    let all = (refs, &refs[..0]);
    if rec.kind != Kind::State {
        return all;
    }
    let Some(ancestors) = state_ancestors_raw(rec.bytes) else {
        return all;
    };
    let n = ancestors.len() / 34;
    if n < 2 {
        return all;
    }
    let parent = &ancestors[2..34];
    let Some(p) = refs
        .chunks_exact(HASH_LEN)
        .take(4)
        .position(|r| r == parent)
    else {
        return all;
    };
    let older = &refs[(p + 1) * HASH_LEN..];
    let in_order = older.len() >= (n - 1) * HASH_LEN
        && older
            .chunks_exact(HASH_LEN)
            .zip(ancestors.chunks_exact(34).skip(1))
            .all(|(r, a)| r == &a[2..]);
    if !in_order {
        return all;
    }
    (&refs[..(p + 1) * HASH_LEN], &refs[(p + n) * HASH_LEN..])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hash whose first 8 bytes are `key` and the rest `tail`.
    fn hash(key: u64, tail: u8) -> Hash {
        let mut b = [tail; HASH_LEN];
        b[..8].copy_from_slice(&key.to_be_bytes());
        Hash::from_bytes(b)
    }

    /// A resolved graph of `blobs` (each with the hashes it refers to).
    fn graph(blobs: &[(Hash, Vec<Hash>)]) -> Graph {
        let mut sorted: Vec<_> = blobs.iter().collect();
        sorted.sort_by_key(|(h, _)| *h);
        let mut chunks: Vec<Chunk> = (0..256).map(|_| Chunk::default()).collect();
        for (h, refs) in sorted {
            chunks[usize::from(h.as_bytes()[0])].push(
                h,
                false,
                refs.iter().map(|r| key_of(r.as_bytes())),
            );
        }
        for c in &mut chunks {
            c.index();
        }
        let mut g = Graph { chunks };
        g.resolve();
        g
    }

    #[test]
    fn leaves_are_flagged_across_the_words_of_a_large_chunk() {
        // 300 blobs in one chunk (first byte 1), in index order; every
        // third has no refs, the others refer to the blob before them: the
        // flags span five 64-bit words.
        let hash = |i: usize| {
            let mut b = [0u8; HASH_LEN];
            b[0] = 1;
            b[1..8].copy_from_slice(&(i as u64).to_be_bytes()[1..]);
            Hash::from_bytes(b)
        };
        let blobs: Vec<(Hash, Vec<Hash>)> = (0..300)
            .map(|i| {
                let refs = if i % 3 == 0 {
                    vec![]
                } else {
                    vec![hash(i - 1)]
                };
                (hash(i), refs)
            })
            .collect();
        let g = graph(&blobs);
        for (i, (h, refs)) in blobs.iter().enumerate() {
            let id = id_of(&g, h);
            assert_eq!(split(id), (1, i));
            assert_eq!(g.is_leaf(id), refs.is_empty(), "blob {i}");
        }
    }

    fn id_of(g: &Graph, h: &Hash) -> Id {
        g.targets(key_of(h.as_bytes()))
            .find(|&i| g.hash(i) == *h)
            .expect("scanned")
    }

    #[test]
    fn an_edge_names_every_blob_sharing_its_key_and_none_unscanned() {
        let key = 0x42_0000_0000_0001;
        let (a, b) = (hash(key, 1), hash(key, 2));
        let c = hash(0x42_0000_0000_0002, 0);
        let unscanned = hash(0x42_0000_0000_0003, 0);
        let d = hash(0x07_0000_0000_0000, 0);
        let g = graph(&[
            (a, vec![]),
            (b, vec![]),
            (c, vec![]),
            (d, vec![a, unscanned, c]),
        ]);
        let mut reached: Vec<Hash> = g.edges(id_of(&g, &d)).map(|i| g.hash(i)).collect();
        reached.sort();
        assert_eq!(reached, vec![a, b, c]);
        assert_eq!(g.edges(id_of(&g, &c)).count(), 0);
        // Without shared keys, an edge names one blob.
        let g = graph(&[(c, vec![]), (d, vec![c])]);
        assert_eq!(
            g.edges(id_of(&g, &d)).collect::<Vec<_>>(),
            vec![id_of(&g, &c)]
        );
    }

    #[test]
    fn the_mark_reaches_a_long_chain_and_a_wide_fan_and_nothing_else() {
        // A chain of 3,000 (deeper than any stack split), a root with 1,000
        // children (wider than a task's stack: split into stolen tasks),
        // and 10 blobs nothing reaches.
        let h = |group: u64, i: u64| {
            hash(
                (group << 56) | (i.wrapping_mul(0x9e37_79b9) & 0xff_ffff_ffff),
                9,
            )
        };
        let mut blobs = Vec::new();
        for i in 0..3000 {
            let parent = if i == 0 { vec![] } else { vec![h(1, i - 1)] };
            blobs.push((h(1, i), parent));
        }
        let children: Vec<Hash> = (0..1000).map(|i| h(2, i)).collect();
        blobs.extend(children.iter().map(|c| (*c, vec![])));
        blobs.push((h(3, 0), children));
        blobs.extend((0..10).map(|i| (h(4, i), vec![])));
        let g = graph(&blobs);
        let marks = Marks::new(&g);
        let roots: Vec<Id> = [h(1, 2999), h(3, 0)]
            .iter()
            .map(|r| id_of(&g, r))
            .filter(|&i| marks.set(i))
            .collect();
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap()
            .install(|| {
                rayon::scope(|s| super::super::mark_from(s, &g, &marks, roots));
            });
        for (hash, _) in &blobs {
            let unreached = hash.as_bytes()[0] == 4;
            assert_eq!(marks.get(id_of(&g, hash)), !unreached, "{hash}");
        }
    }

    /// A scanned state node's edges are its refs less its older ancestors
    /// (which its parent reaches): the parent, its start and content, and
    /// nothing else; a young blob is listed as such and its hash read back
    /// whole from its key and tail.
    #[test]
    fn a_state_node_is_scanned_with_its_parent_not_its_older_ancestors() {
        use crate::thread::{NewThread, Next, StepWrite};
        use crate::{Blob, Store, Value, WorkflowNode};
        use std::collections::BTreeMap;

        let store = Store::memory();
        let workflow = store
            .put(&Blob::Workflow(WorkflowNode {
                definition: Value::Str("wf".into()),
            }))
            .unwrap();
        let threads = store.threads();
        let rec = threads
            .low_level()
            .start_thread(NewThread {
                workflow: "wf".into(),
                workflow_hash: workflow,
                prompt: "task".into(),
                max_rounds: 100,
                depth: 0,
                parent_state: None,
                parent_thread: None,
                next_role: "dev".into(),
                next_instruction: "do it".into(),
                agent: None,
                cwd: None,
                next_location: None,
                labels: BTreeMap::default(),
            })
            .unwrap();
        let mut head = rec.head;
        for i in 0..15 {
            let step = StepWrite {
                role: "dev".into(),
                meta: BTreeMap::new(),
                reply: format!("step {i}"),
                artifacts: vec![],
                instruction: "do it".into(),
                child_thread: None,
            };
            let next = Next::Role {
                role: "dev".into(),
                instruction: "do it".into(),
                location: None,
            };
            head = threads
                .low_level()
                .append_step(rec.id, head, step, next)
                .unwrap()
                .record
                .head;
        }
        let Some(Blob::State(node)) = store.get(&head).unwrap() else {
            panic!("the head is a state node");
        };
        assert_eq!(node.ancestors.len(), 11, "the parent and ten older");
        let stored = Blob::State(node.clone()).encode().unwrap();
        let g = scan_blobs(&store, u64::MAX, &|_| {}).unwrap();
        assert_eq!(g.len() as u64, store.blob_count().unwrap());
        assert!(g.young().is_empty(), "nothing is touched after u64::MAX");

        let mut edges: Vec<Hash> = g.edges(id_of(&g, &head)).map(|i| g.hash(i)).collect();
        edges.sort();
        let mut expected: Vec<Hash> = stored
            .refs()
            .iter()
            .copied()
            .filter(|r| !node.ancestors[1..].contains(r))
            .collect();
        expected.sort();
        expected.dedup();
        assert!(expected.contains(&node.ancestors[0]) && expected.contains(&node.content));
        assert!(
            stored.refs().len() >= expected.len() + 10,
            "older ancestors are refs"
        );
        assert_eq!(edges, expected);

        // The blobs without refs (the replies, the instruction, the
        // workflow) are flagged leaves, and no other: the mark marks a
        // leaf without visiting it, so a blob with refs flagged as one
        // would lose what it reaches.
        let mut leaves = 0;
        for i in g.select(|_| true) {
            let blob = store.get(&g.hash(i)).unwrap().expect("a scanned blob");
            let leaf = blob.encode().unwrap().refs().is_empty();
            assert_eq!(g.is_leaf(i), leaf, "{}", g.hash(i));
            leaves += usize::from(leaf);
        }
        assert!(leaves > 15 && leaves < g.len(), "{leaves} of {}", g.len());

        // Everything is young after time 0.
        let g = scan_blobs(&store, 0, &|_| {}).unwrap();
        assert_eq!(g.young().len(), g.len());
    }
}

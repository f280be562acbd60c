//! Garbage collection (`docs/design.md` §7): roots from the thread indexes,
//! the workflow registry and pins; a parallel scan of blob headers; a
//! parallel mark; and a sweep in short write transactions, ordered so that it
//! is safe while writers run (the write barrier is in `store/txn.rs`).

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rayon::prelude::*;
use serde::Serialize;

use crate::backend::{Direction, HeldLock, KeyRange, Table};
use crate::hash::{HASH_LEN, Hash, hex};
use crate::node::{Kind, state_ancestors_raw};
use crate::store::record::touched_at;
use crate::store::{BlobRecord, GC_EPOCH_KEY, Store, StoreError, now_ms};
use crate::thread::ThreadRecord;

/// Grace period used when none is given: longer than the default agent
/// timeout, so an artifact stored for a step survives until the step commits.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3600);

/// Blobs deleted per sweep transaction.
const SWEEP_BATCH: usize = 1024;

/// Key ranges scanned in parallel (one per first byte of the hash).
const SCAN_RANGES: u16 = 256;

/// Why a collection could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GcError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Another collection holds the store's GC lock.
    #[error("another garbage collection is running on the store at {store}; wait for it to finish")]
    Busy {
        /// The store's location.
        store: String,
    },
    /// A record the collector must understand is damaged: collecting could
    /// delete what it refers to.
    #[error("{what} is corrupt ({detail}); run `uwf-db verify` before collecting garbage")]
    Corrupt {
        /// Which record.
        what: String,
        /// What is wrong.
        detail: String,
    },
    /// More blobs in one key range than the collector's ids can name
    /// (2^24 per first hash byte: about 4 billion in all).
    #[error("the store has too many blobs for one collection ({blobs} in one key range)")]
    TooLarge {
        /// Blobs in the range.
        blobs: usize,
    },
    /// The worker pool could not start.
    #[error("cannot start {threads} GC worker threads: {detail}")]
    Pool {
        /// Threads asked for.
        threads: usize,
        /// The cause.
        detail: String,
    },
}

/// How to collect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcOptions {
    /// Blobs touched this recently are kept with everything they reach.
    pub grace: Duration,
    /// Report what would be deleted; delete nothing.
    pub dry_run: bool,
    /// Worker threads for the scan and mark (`None`: rayon's global pool).
    pub threads: Option<usize>,
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions {
            grace: DEFAULT_GRACE,
            dry_run: false,
            threads: None,
        }
    }
}

/// Where a collection is, for progress display.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GcProgress {
    /// Roots read.
    Roots {
        /// Distinct root hashes.
        roots: u64,
    },
    /// A key range of the blob scan is done (from a worker thread).
    Scanning {
        /// Ranges done.
        done: u64,
        /// Ranges in all.
        total: u64,
    },
    /// Blob headers read.
    Scanned {
        /// Blobs seen.
        blobs: u64,
    },
    /// Marking done; the sweep comes next.
    Marked {
        /// Reachable or young blobs.
        marked: u64,
        /// Blobs the sweep will consider.
        candidates: u64,
    },
    /// A sweep transaction committed.
    Swept {
        /// Candidates processed so far.
        done: u64,
        /// All candidates.
        total: u64,
    },
}

/// What a collection did (SPEC §7: roots, marked, swept, bytes freed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GcReport {
    /// Nothing was deleted.
    pub dry_run: bool,
    /// The grace period, in ms.
    pub grace_ms: u64,
    /// The collection's start (ms since the epoch).
    pub epoch_ms: u64,
    /// Distinct root hashes.
    pub roots: u64,
    /// Blobs scanned.
    pub blobs: u64,
    /// Blobs kept because they were touched within the grace period.
    pub young: u64,
    /// Blobs reachable from roots or young blobs.
    pub marked: u64,
    /// Blobs deleted (or, in a dry run, that would be).
    pub swept: u64,
    /// Unreachable blobs kept because a writer re-linked them during the
    /// collection, with what they reach.
    pub rescued: u64,
    /// Bytes of keys and values deleted (LMDB reuses the pages).
    pub bytes_freed: u64,
    /// Wall time of the collection, in ms.
    pub elapsed_ms: u64,
}

/// A scanned blob: its key range (the hash's first byte) in the top 8 bits,
/// its index in that range below.
type Id = u32;

const LOCAL_BITS: u32 = 24;

fn id(chunk: usize, local: usize) -> Id {
    ((chunk as u32) << LOCAL_BITS) | local as u32
}

fn split(id: Id) -> (usize, usize) {
    (
        (id >> LOCAL_BITS) as usize,
        (id & ((1 << LOCAL_BITS) - 1)) as usize,
    )
}

/// The first 8 bytes of a hash, big-endian: what the graph looks refs up
/// by. Two blobs sharing them are both treated as the target of such a ref,
/// which can only keep more, never less.
fn key_of(hash: &[u8]) -> u64 {
    let mut k = [0u8; 8];
    k.copy_from_slice(&hash[..8]);
    u64::from_be_bytes(k)
}

/// One key range of the scanned blob graph (hashes with one first byte),
/// sorted by hash.
#[derive(Default)]
struct Chunk {
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
    fn with_capacity(n: usize) -> Chunk {
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

    fn push(&mut self, hash: Hash, touched: u64, size: usize, refs: impl Iterator<Item = u64>) {
        self.keys.push(key_of(hash.as_bytes()));
        self.hashes.push(hash);
        self.touched.push(touched);
        self.sizes.push(u32::try_from(size).unwrap_or(u32::MAX));
        self.refs.extend(refs);
        self.ref_ends
            .push(u32::try_from(self.refs.len()).unwrap_or(u32::MAX));
    }

    fn bucket(&self, key: u64) -> usize {
        ((key << 8) >> (64 - self.bits)) as usize
    }

    /// Builds the bucket table: about one key per bucket.
    fn index(&mut self) {
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

    fn refs_of(&self, i: usize) -> &[u64] {
        let start = if i == 0 {
            0
        } else {
            self.ref_ends[i - 1] as usize
        };
        &self.refs[start..self.ref_ends[i] as usize]
    }
}

/// The scanned blob graph: 256 chunks, one per first byte of the hash.
struct Graph {
    chunks: Vec<Chunk>,
}

impl Graph {
    fn len(&self) -> usize {
        self.chunks.iter().map(|c| c.keys.len()).sum()
    }

    fn hash(&self, id: Id) -> Hash {
        let (c, i) = split(id);
        self.chunks[c].hashes[i]
    }

    fn size(&self, id: Id) -> u32 {
        let (c, i) = split(id);
        self.chunks[c].sizes[i]
    }

    fn refs_of(&self, id: Id) -> &[u64] {
        let (c, i) = split(id);
        self.chunks[c].refs_of(i)
    }

    /// The scanned blobs a ref key names (one, or none if the target was
    /// not scanned: written after its range was read).
    fn targets(&self, key: u64) -> impl Iterator<Item = Id> + '_ {
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
    fn select(&self, keep: impl Fn(&Chunk, usize, Id) -> bool + Sync) -> Vec<Id> {
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
struct Marks(Vec<Vec<AtomicU64>>);

impl Marks {
    fn new(graph: &Graph) -> Marks {
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
    fn set(&self, id: Id) -> bool {
        let (c, i) = split(id);
        let bit = 1u64 << (i % 64);
        self.0[c][i / 64].fetch_or(bit, Ordering::Relaxed) & bit == 0
    }
    fn get(&self, id: Id) -> bool {
        let (c, i) = split(id);
        self.0[c][i / 64].load(Ordering::Relaxed) & (1u64 << (i % 64)) != 0
    }
}

/// Holds the GC lock and the `gc_epoch` marker; clears the marker on drop.
struct Running<'a> {
    store: &'a Store,
    epoch: u64,
    _lock: Box<dyn HeldLock>,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        // Best effort: a marker left behind only makes writers refresh
        // `touched_at` until the next collection replaces it.
        let _ = self.store.write(|w| {
            let t = w.tables_mut();
            let ours = t.get(Table::Meta, GC_EPOCH_KEY.as_bytes())?.as_deref()
                == Some(&self.epoch.to_be_bytes()[..]);
            if ours {
                t.delete(Table::Meta, GC_EPOCH_KEY.as_bytes())?;
            }
            Ok::<_, StoreError>(())
        });
    }
}

impl Store {
    /// Collects garbage: deletes every blob that no root reaches and that
    /// was not touched within the grace period. Safe while other threads and
    /// processes write (`docs/design.md` §7 states the invariant and why it
    /// holds). `progress` is called between phases, after each key range
    /// of the scan (from worker threads) and after each sweep transaction,
    /// always outside any transaction.
    pub fn collect_garbage(
        &self,
        options: &GcOptions,
        progress: &(dyn Fn(GcProgress) + Sync),
    ) -> Result<GcReport, GcError> {
        match options.threads {
            None => self.collect(options, progress),
            Some(threads) => rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .map_err(|e| GcError::Pool {
                    threads,
                    detail: e.to_string(),
                })?
                .install(|| self.collect(options, progress)),
        }
    }

    fn collect(
        &self,
        options: &GcOptions,
        progress: &(dyn Fn(GcProgress) + Sync),
    ) -> Result<GcReport, GcError> {
        let started = Instant::now();
        let running = if options.dry_run {
            None
        } else {
            Some(self.start_gc()?)
        };
        let epoch = running.as_ref().map_or_else(now_ms, |r| r.epoch);
        let grace_ms = u64::try_from(options.grace.as_millis()).unwrap_or(u64::MAX);
        let keep_after = epoch.saturating_sub(grace_ms);

        let roots = self.gc_roots()?;
        progress(GcProgress::Roots {
            roots: roots.len() as u64,
        });
        let graph = self.scan_blobs(progress)?;
        progress(GcProgress::Scanned {
            blobs: graph.len() as u64,
        });

        let marks = Marks::new(&graph);
        let young = graph.select(|c, i, _| c.touched[i] >= keep_after);
        let mut frontier: Vec<Id> = roots
            .iter()
            .flat_map(|h| graph.targets(key_of(h.as_bytes())))
            .chain(young.iter().copied())
            .filter(|&i| marks.set(i))
            .collect();
        while !frontier.is_empty() {
            frontier = frontier
                .par_iter()
                .flat_map_iter(|&i| {
                    graph
                        .refs_of(i)
                        .iter()
                        .flat_map(|&k| graph.targets(k))
                        .filter(|&j| marks.set(j))
                })
                .collect();
        }
        let candidates = graph.select(|_, _, id| !marks.get(id));
        let marked = (graph.len() - candidates.len()) as u64;
        progress(GcProgress::Marked {
            marked,
            candidates: candidates.len() as u64,
        });

        let mut report = GcReport {
            dry_run: options.dry_run,
            grace_ms,
            epoch_ms: epoch,
            roots: roots.len() as u64,
            blobs: graph.len() as u64,
            young: young.len() as u64,
            marked,
            swept: 0,
            rescued: 0,
            bytes_freed: 0,
            elapsed_ms: 0,
        };
        if options.dry_run {
            report.swept = candidates.len() as u64;
            report.bytes_freed = candidates
                .iter()
                .map(|&i| HASH_LEN as u64 + u64::from(graph.size(i)))
                .sum();
        } else if !candidates.is_empty() {
            self.sweep(&graph, &candidates, keep_after, &mut report, progress)?;
        }
        drop(running);
        report.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(report)
    }

    /// Takes the GC lock and commits the `gc_epoch` marker.
    fn start_gc(&self) -> Result<Running<'_>, GcError> {
        let Some(lock) = self.backend().try_lock_gc()? else {
            return Err(GcError::Busy {
                store: self.location().to_owned(),
            });
        };
        let epoch = self.write(|w| {
            // Never behind a marker a dead collection left: writers may
            // have stamped blobs with it.
            let epoch = w.gc_epoch()?.map_or(w.now_ms(), |e| e.max(w.now_ms()));
            w.tables_mut()
                .put(Table::Meta, GC_EPOCH_KEY.as_bytes(), &epoch.to_be_bytes())?;
            Ok::<_, StoreError>(epoch)
        })?;
        Ok(Running {
            store: self,
            epoch,
            _lock: lock,
        })
    }

    /// Every root hash, deduplicated and sorted.
    fn gc_roots(&self) -> Result<Vec<Hash>, GcError> {
        let mut roots = Vec::new();
        for table in [Table::Threads, Table::History] {
            self.scan_table::<GcError>(table, |_, key, value| {
                let r = ThreadRecord::decode(value).map_err(|e| GcError::Corrupt {
                    what: format!("the thread record under key {}", hex(key)),
                    detail: e.to_string(),
                })?;
                roots.extend([r.head, r.start]);
                roots.extend(r.staged_compact);
                Ok(())
            })?;
        }
        for (table, what) in [(Table::Workflows, "workflow"), (Table::Pins, "pin")] {
            self.scan_table::<GcError>(table, |_, key, value| {
                let bytes = if what == "pin" { key } else { value };
                let h = Hash::from_slice(bytes).ok_or_else(|| GcError::Corrupt {
                    what: format!("the {what} entry {}", hex(key)),
                    detail: format!("{} bytes, not a hash", bytes.len()),
                })?;
                roots.push(h);
                Ok(())
            })?;
        }
        roots.sort_unstable();
        roots.dedup();
        Ok(roots)
    }

    /// Reads every blob header, one key range per task, each in its own
    /// short read transaction.
    fn scan_blobs(&self, progress: &(dyn Fn(GcProgress) + Sync)) -> Result<Graph, GcError> {
        let total = self.blob_count()?;
        let per_range = usize::try_from(total / u64::from(SCAN_RANGES)).unwrap_or(0);
        let done = AtomicU64::new(0);
        let chunks: Vec<Chunk> = (0..SCAN_RANGES)
            .into_par_iter()
            .map(|first| {
                let chunk = self.scan_range(first, per_range + per_range / 8 + 16);
                progress(GcProgress::Scanning {
                    done: done.fetch_add(1, Ordering::Relaxed) + 1,
                    total: u64::from(SCAN_RANGES),
                });
                chunk
            })
            .collect::<Result<_, _>>()?;
        Ok(Graph { chunks })
    }

    fn scan_range(&self, first: u16, capacity: usize) -> Result<Chunk, GcError> {
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
        let mut chunk = self.read(|r| {
            let mut c = Chunk::with_capacity(capacity);
            for entry in r.tables().range(Table::Blobs, range, Direction::Forward)? {
                let (key, value) = entry?;
                let corrupt = |detail: String| GcError::Corrupt {
                    what: format!("the blob record under key {}", hex(&key)),
                    detail,
                };
                let hash = Hash::from_slice(&key).ok_or_else(|| corrupt("bad key".into()))?;
                let rec = BlobRecord::parse(&value).map_err(|e| corrupt(e.to_string()))?;
                let refs = marking_refs(&rec);
                c.push(
                    hash,
                    rec.touched_at,
                    value.len(),
                    refs.chunks_exact(HASH_LEN).map(key_of),
                );
            }
            Ok::<_, GcError>(c)
        })?;
        if chunk.keys.len() >= 1 << LOCAL_BITS {
            return Err(GcError::TooLarge {
                blobs: chunk.keys.len(),
            });
        }
        chunk.index();
        Ok(chunk)
    }

    /// Deletes the candidates, every candidate before those it refers to,
    /// re-reading each in the deleting transaction and rescuing those a
    /// writer touched since the scan (with every candidate they reach).
    fn sweep(
        &self,
        graph: &Graph,
        candidates: &[Id],
        keep_after: u64,
        report: &mut GcReport,
        progress: &(dyn Fn(GcProgress) + Sync),
    ) -> Result<(), GcError> {
        let order = referrers_first(graph, candidates);
        let is_candidate = Marks::new(graph);
        for &c in candidates {
            is_candidate.set(c);
        }
        let rescued = Marks::new(graph);
        let total = order.len() as u64;
        let mut done = 0u64;
        for batch in order.chunks(SWEEP_BATCH) {
            let (swept, freed, saved) = self.write(|w| {
                let t = w.tables_mut();
                let (mut swept, mut freed, mut saved) = (0u64, 0u64, 0u64);
                // Decide in sweep order (a rescue reaches only later
                // candidates), then delete in key order, which touches each
                // B-tree page once per batch.
                let mut doomed = Vec::with_capacity(batch.len());
                for &i in batch {
                    if rescued.get(i) {
                        continue;
                    }
                    let Some(value) = t.get(Table::Blobs, graph.hash(i).as_bytes())? else {
                        continue;
                    };
                    if touched_at(&value).unwrap_or(u64::MAX) >= keep_after {
                        saved += rescue(graph, &is_candidate, &rescued, i);
                    } else {
                        doomed.push((i, value.len()));
                    }
                }
                doomed.sort_unstable();
                for (i, len) in doomed {
                    t.delete(Table::Blobs, graph.hash(i).as_bytes())?;
                    swept += 1;
                    freed += (HASH_LEN + len) as u64;
                }
                Ok::<_, StoreError>((swept, freed, saved))
            })?;
            report.swept += swept;
            report.bytes_freed += freed;
            report.rescued += saved;
            done += batch.len() as u64;
            progress(GcProgress::Swept { done, total });
        }
        Ok(())
    }
}

/// The refs the mark follows: the header's, except that a state node's
/// older ancestors are left out, because its parent refers to them too
/// (`ancestors[1..]` of a node are `ancestors[..10]` of its parent). This
/// is what cuts a state node's edges from up to 16 to at most 6. If the
/// layout is not the expected one, every ref is kept.
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

/// Marks `from` and every candidate it reaches as rescued; returns how many
/// were newly rescued.
fn rescue(graph: &Graph, is_candidate: &Marks, rescued: &Marks, from: Id) -> u64 {
    let mut n = 0;
    let mut stack = vec![from];
    while let Some(i) = stack.pop() {
        if !rescued.set(i) {
            continue;
        }
        n += 1;
        for &k in graph.refs_of(i) {
            for j in graph.targets(k) {
                if is_candidate.get(j) && !rescued.get(j) {
                    stack.push(j);
                }
            }
        }
    }
    n
}

/// The candidates ordered so that each comes before every candidate it
/// refers to (Kahn's algorithm on the candidate subgraph, a DAG).
fn referrers_first(graph: &Graph, candidates: &[Id]) -> Vec<Id> {
    let slot: HashMap<Id, usize> = candidates
        .iter()
        .enumerate()
        .map(|(k, &i)| (i, k))
        .collect();
    let targets = |i: Id| {
        graph
            .refs_of(i)
            .iter()
            .flat_map(|&k| graph.targets(k))
            .filter_map(|j| slot.get(&j).map(|&k| (j, k)))
    };
    let mut referrers = vec![0u32; candidates.len()];
    for &i in candidates {
        for (_, k) in targets(i) {
            referrers[k] += 1;
        }
    }
    let mut ready: Vec<Id> = candidates
        .iter()
        .copied()
        .filter(|i| referrers[slot[i]] == 0)
        .collect();
    let mut order = Vec::with_capacity(candidates.len());
    while let Some(i) = ready.pop() {
        order.push(i);
        for (j, k) in targets(i) {
            referrers[k] -= 1;
            if referrers[k] == 0 {
                ready.push(j);
            }
        }
    }
    order
}

//! Garbage collection (`docs/design.md` §7): roots from the thread indexes,
//! the workflow registry and pins; a parallel scan of blob headers; a
//! parallel mark; and a sweep in short write transactions, ordered so that it
//! is safe while writers run (the write barrier is in `store/txn.rs`).

use std::time::{Duration, Instant};

use serde::Serialize;

mod graph;
mod sweep;

use crate::backend::{HeldLock, Table};
use crate::hash::{HASH_LEN, Hash, hex};
use crate::store::{GC_EPOCH_KEY, Store, StoreError, UnfinishedCopy, now_ms};
use crate::thread::ThreadRecord;
use graph::{Id, Marks, key_of};

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
    /// The store is the destination of an unfinished copy: its threads may
    /// not be copied yet, so the blobs they reach would look unreachable.
    #[error(
        "the store at {store} is an unfinished copy of {from}: collecting garbage now could free \
         blobs whose threads are not copied yet; finish the copy first (rerun it)"
    )]
    UnfinishedCopy {
        /// The store's location.
        store: String,
        /// The copy's source.
        from: String,
    },
    /// Applying the stored retention policy (`uwf-db prune --set`) failed.
    #[error("applying the stored retention policy failed")]
    Retention(#[source] crate::thread::ThreadError),
    /// The worker pool could not start.
    #[error("cannot start {threads} GC worker threads: {source}")]
    Pool {
        /// Threads asked for.
        threads: usize,
        /// The cause.
        source: rayon::ThreadPoolBuildError,
    },
}

impl GcError {
    /// Whether the error says the store's data file is damaged
    /// ([`StoreError::is_damage`]).
    pub fn is_damage(&self) -> bool {
        match self {
            GcError::Store(e) => e.is_damage(),
            GcError::Retention(e) => e.is_damage(),
            _ => false,
        }
    }
}

impl From<crate::backend::BackendError> for GcError {
    fn from(e: crate::backend::BackendError) -> Self {
        GcError::Store(e.into())
    }
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
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
    /// Threads the stored retention policy unlinked first (or, in a dry
    /// run, would unlink; their blobs are then still counted as reached).
    pub pruned: u64,
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
        let _ = self.store.write_exclusive(|w| {
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

/// Collects garbage: deletes every blob that no root reaches and that
/// was not touched within the grace period. Safe while other threads and
/// processes write (`docs/design.md` §7 states the invariant and why it
/// holds). `progress` is called between phases, after each key range
/// of the scan (from worker threads) and after each sweep transaction,
/// always outside any transaction.
///
/// ```
/// use std::time::Duration;
/// use uwf_db::gc::GcOptions;
/// use uwf_db::{Blob, Store};
///
/// let store = Store::memory();
/// let kept = store.put(&Blob::content("pinned", [])).unwrap();
/// store.pin(&kept).unwrap();
/// let lost = store.put(&Blob::content("unreachable", [])).unwrap();
/// // A blob touched at or after (start − grace) is young and kept.
/// std::thread::sleep(Duration::from_millis(5));
///
/// let options = GcOptions { grace: Duration::ZERO, ..GcOptions::default() };
/// let report = uwf_db::gc::collect_garbage(&store, &options, &|_| {}).unwrap();
/// assert_eq!(report.swept, 1);
/// assert!(store.contains(&kept).unwrap());
/// assert!(!store.contains(&lost).unwrap());
/// ```
pub fn collect_garbage(
    store: &Store,
    options: &GcOptions,
    progress: &(dyn Fn(GcProgress) + Sync),
) -> Result<GcReport, GcError> {
    let span = tracing::info_span!("uwf.gc", dry_run = options.dry_run);
    let _entered = span.enter();
    let report = match options.threads {
        None => collect(store, options, progress),
        Some(threads) => rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|source| GcError::Pool { threads, source })?
            .install(|| collect(store, options, progress)),
    };
    match &report {
        Ok(r) => tracing::info!(
            dry_run = r.dry_run,
            blobs = r.blobs,
            marked = r.marked,
            swept = r.swept,
            bytes_freed = r.bytes_freed,
            elapsed_ms = r.elapsed_ms,
            "garbage collected"
        ),
        Err(e) => tracing::warn!(error = %e, "garbage collection failed"),
    }
    report
}

fn collect(
    store: &Store,
    options: &GcOptions,
    progress: &(dyn Fn(GcProgress) + Sync),
) -> Result<GcReport, GcError> {
    let started = Instant::now();
    let running = if options.dry_run {
        refuse_unfinished_copy(store, store.unfinished_copy()?)?;
        None
    } else {
        Some(start_gc(store)?)
    };
    // The stored retention policy first, so that what only the pruned
    // threads reached is collected now.
    let pruned = match store
        .threads()
        .retention_policy()
        .map_err(GcError::Retention)?
    {
        Some(policy) => store
            .threads()
            .prune(&policy, options.dry_run)
            .map_err(GcError::Retention)?
            .pruned
            .len() as u64,
        None => 0,
    };
    let epoch = running.as_ref().map_or_else(now_ms, |r| r.epoch);
    let grace_ms = u64::try_from(options.grace.as_millis()).unwrap_or(u64::MAX);
    let keep_after = epoch.saturating_sub(grace_ms);

    let roots = gc_roots(store)?;
    progress(GcProgress::Roots {
        roots: roots.len() as u64,
    });
    let graph = graph::scan_blobs(store, keep_after, progress)?;
    progress(GcProgress::Scanned {
        blobs: graph.len() as u64,
    });

    let marks = Marks::new(&graph);
    let young = graph.young();
    let frontier: Vec<Id> = roots
        .iter()
        .flat_map(|h| graph.targets(key_of(h.as_bytes())))
        .chain(young.iter().copied())
        .filter(|&i| marks.set(i))
        .collect();
    rayon::scope(|s| {
        for part in frontier.chunks(MARK_SPLIT) {
            let (graph, marks) = (&graph, &marks);
            s.spawn(move |s| mark_from(s, graph, marks, part.to_vec()));
        }
    });
    let candidates = graph.select(|id| !marks.get(id));
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
        pruned,
    };
    if options.dry_run {
        report.swept = candidates.len() as u64;
        report.bytes_freed = dry_run_bytes(store, &graph, &candidates)?;
    } else if !candidates.is_empty() {
        sweep::sweep(
            store,
            &graph,
            &candidates,
            keep_after,
            &mut report,
            progress,
        )?;
    }
    drop(running);
    report.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    Ok(report)
}

/// The bytes the sweep would free: the candidates' keys and values as
/// stored now (the graph keeps no sizes; read in batches of short read
/// transactions, like the sweep's).
fn dry_run_bytes(store: &Store, graph: &graph::Graph, candidates: &[Id]) -> Result<u64, GcError> {
    let mut bytes = 0u64;
    for batch in candidates.chunks(SWEEP_BATCH) {
        bytes += store.read(|r| {
            let mut n = 0u64;
            for &i in batch {
                if let Some(value) = r.tables().get(Table::Blobs, graph.hash(i).as_bytes())? {
                    n += (HASH_LEN + value.len()) as u64;
                }
            }
            Ok::<_, StoreError>(n)
        })?;
    }
    Ok(bytes)
}

/// Blobs a mark task starts from; a task whose stack grows past twice
/// this hands half of it to a new task (which an idle worker steals).
const MARK_SPLIT: usize = 64;

/// Marks everything reachable from `stack` (already marked), depth first:
/// a breadth-first search by levels would wait for every worker at each
/// level, and a chain of steps is as many levels deep as it is long.
fn mark_from<'s>(
    s: &rayon::Scope<'s>,
    graph: &'s graph::Graph,
    marks: &'s Marks,
    mut stack: Vec<Id>,
) {
    while let Some(i) = stack.pop() {
        // What later iterations read, loaded ahead: the ref offsets of
        // every blob pushed now, and the edges of the blob on top of the
        // stack before this one's are pushed (the next popped when this
        // one pushes nothing; otherwise later, after those).
        if let Some(&next) = stack.last() {
            graph.prefetch_edges(next);
        }
        stack.extend(graph.edges(i).filter(|&j| {
            // A leaf is marked and never visited: it has no edges.
            let new = marks.set(j) && !graph.is_leaf(j);
            if new {
                graph.prefetch_node(j);
            }
            new
        }));
        if stack.len() > 2 * MARK_SPLIT {
            let half = stack.split_off(stack.len() / 2);
            s.spawn(move |s| mark_from(s, graph, marks, half));
        }
    }
}

/// Takes the GC lock and commits the `gc_epoch` marker.
fn start_gc(store: &Store) -> Result<Running<'_>, GcError> {
    let Some(lock) = store.backend().try_lock_gc()? else {
        return Err(GcError::Busy {
            store: store.location().to_owned(),
        });
    };
    let epoch = store.write_exclusive(|w| {
        // Under the lock, so a copy (which holds it while it runs)
        // cannot start between this check and the collection.
        refuse_unfinished_copy(store, UnfinishedCopy::read(w.tables())?)?;
        // Never behind a marker a dead collection left: writers may
        // have stamped blobs with it.
        let epoch = w.gc_epoch()?.map_or(w.now_ms(), |e| e.max(w.now_ms()));
        w.tables_mut()
            .put(Table::Meta, GC_EPOCH_KEY.as_bytes(), &epoch.to_be_bytes())?;
        Ok::<_, GcError>(epoch)
    })?;
    Ok(Running {
        store,
        epoch,
        _lock: lock,
    })
}

/// Refuses to collect an unfinished copy (`docs/design.md` §4c).
fn refuse_unfinished_copy(store: &Store, marker: Option<UnfinishedCopy>) -> Result<(), GcError> {
    match marker {
        Some(copy) => Err(GcError::UnfinishedCopy {
            store: store.location().to_owned(),
            from: copy.source,
        }),
        None => Ok(()),
    }
}

/// Every root hash, deduplicated and sorted.
fn gc_roots(store: &Store) -> Result<Vec<Hash>, GcError> {
    let mut roots = Vec::new();
    for table in [Table::Threads, Table::History] {
        store.scan_table::<GcError>(table, |_, key, value| {
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
        store.scan_table::<GcError>(table, |_, key, value| {
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

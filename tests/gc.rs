//! Garbage collection through the library API: what is kept (roots, grace,
//! pins), what is freed, and safety against writers that run during a
//! collection (`docs/design.md` §7).

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::backend::TestBackend;
use common::{append_n, new_thread, next, step, try_new_thread};
use uwf_db::gc::{GcError, GcOptions, GcProgress, GcReport};
use uwf_db::thread::{Next, ThreadError, ThreadId};
use uwf_db::verify::verify;
use uwf_db::{Blob, Hash, Store};

fn gc(store: &Store, grace_ms: u64) -> GcReport {
    gc_with(store, grace_ms, &|_| {})
}

/// Collects; with no grace period, first lets the clock pass the last write
/// (a blob touched in the collection's own millisecond counts as young).
fn gc_with(store: &Store, grace_ms: u64, progress: &(dyn Fn(GcProgress) + Sync)) -> GcReport {
    if grace_ms == 0 {
        settle();
    }
    let options = GcOptions {
        grace: Duration::from_millis(grace_ms),
        ..GcOptions::default()
    };
    uwf_db::gc::collect_garbage(store, &options, progress).unwrap()
}

fn settle() {
    std::thread::sleep(Duration::from_millis(2));
}

fn assert_verified(store: &Store) {
    let report = verify(store, |_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

/// Every blob reachable from a thread's head and start.
fn reachable(store: &Store, id: ThreadId) -> HashSet<Hash> {
    let rec = store.threads().get(id).unwrap().unwrap();
    let mut out = HashSet::new();
    for root in [rec.head, rec.start] {
        store
            .walk::<uwf_db::StoreError>(&root, |b| {
                out.insert(b.hash);
                Ok(())
            })
            .unwrap();
    }
    out
}

fn blob_count(store: &Store) -> u64 {
    store.stats().unwrap().blob_count
}

fn nothing_reachable_is_collected(b: TestBackend) {
    let store = b.fast();
    let a = new_thread(&store, "a");
    let a = append_n(&store, a.id, 25);
    let b = new_thread(&store, "b");
    append_n(&store, b.id, 3);
    store
        .threads()
        .low_level()
        .end_thread(
            b.id,
            store.threads().get(b.id).unwrap().unwrap().head,
            uwf_db::thread::EndSpec {
                return_code: 0,
                summary: "done".into(),
                prompt: "Approved".into(),
            },
        )
        .unwrap();
    let fork = store
        .threads()
        .low_level()
        .fork_thread(
            a.id,
            a.head,
            Next::Role {
                role: "dev".into(),
                instruction: "again".into(),
                location: None,
            },
        )
        .unwrap();
    store
        .threads()
        .stage_compact(fork.id, fork.head, "summary so far")
        .unwrap();
    let pinned = store.put(&Blob::content("keep me", [])).unwrap();
    store.pin(&pinned).unwrap();

    let before = blob_count(&store);
    let report = gc(&store, 0);
    assert_eq!(report.blobs, before);
    assert_eq!(report.swept, 0, "{report:?}");
    assert_eq!(report.marked, before);
    assert_eq!(blob_count(&store), before);
    assert!(store.stats().unwrap().gc_epoch.is_none(), "marker cleared");
    assert_verified(&store);
}

fn a_removed_thread_is_freed_and_history_shared_with_a_fork_stays(b: TestBackend) {
    let store = b.fast();
    let a = new_thread(&store, "a");
    let at_10 = append_n(&store, a.id, 10);
    append_n(&store, a.id, 20);
    let fork = store
        .threads()
        .low_level()
        .fork_thread(
            a.id,
            at_10.head,
            Next::Role {
                role: "dev".into(),
                instruction: "again".into(),
                location: None,
            },
        )
        .unwrap();
    let keep = reachable(&store, fork.id);
    let before = blob_count(&store);
    store.threads().remove(a.id).unwrap();
    assert_eq!(blob_count(&store), before, "removal only unlinks");

    settle();
    let dry = uwf_db::gc::collect_garbage(
        &store,
        &GcOptions {
            grace: Duration::ZERO,
            dry_run: true,
            threads: None,
        },
        &|_| {},
    )
    .unwrap();
    assert_eq!(dry.swept, before - keep.len() as u64);
    assert!(dry.bytes_freed > 0);
    assert_eq!(blob_count(&store), before, "a dry run deletes nothing");

    let report = gc(&store, 0);
    assert_eq!(report.swept, dry.swept);
    assert_eq!(report.bytes_freed, dry.bytes_freed);
    assert_eq!(report.rescued, 0);
    assert_eq!(blob_count(&store), keep.len() as u64);
    assert_eq!(store.threads().log(fork.id, 100, None).unwrap().len(), 10);
    assert_verified(&store);
    // The fork goes on.
    store
        .threads()
        .low_level()
        .append_step(fork.id, fork.head, step("dev", "ok", "more"), next("dev"))
        .unwrap();
    assert_verified(&store);
    assert_eq!(gc(&store, 0).swept, 0);
}

fn the_grace_period_keeps_recent_garbage_with_what_it_reaches(b: TestBackend) {
    let store = b.fast();
    let artifact = store.put(&Blob::content("artifact", [])).unwrap();
    let note = store.put(&Blob::content("note", [artifact])).unwrap();
    let report = gc(&store, 3_600_000);
    assert_eq!(report.swept, 0);
    assert_eq!(report.young, 2);
    assert!(store.contains(&artifact).unwrap() && store.contains(&note).unwrap());
    let report = gc(&store, 0);
    assert_eq!(report.swept, 2);
    assert!(!store.contains(&artifact).unwrap() && !store.contains(&note).unwrap());
    assert_verified(&store);
}

fn a_reput_restarts_the_grace_period(b: TestBackend) {
    let store = b.fast();
    let blob = Blob::content("put twice", []);
    let h = store.put(&blob).unwrap();
    let first = store.get_stored(&h).unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    store.put(&blob).unwrap();
    let second = store.get_stored(&h).unwrap().unwrap();
    assert_eq!(second.written_at, first.written_at);
    assert!(second.touched_at >= first.touched_at + 1000, "{second:?}");
    // Kept by a grace period that covers the re-put but not the first put.
    let report = gc(&store, 900);
    assert_eq!((report.young, report.swept), (1, 0));
}

fn pins_are_roots(b: TestBackend) {
    let store = b.fast();
    let artifact = store.put(&Blob::content("artifact", [])).unwrap();
    let note = store.put(&Blob::content("note", [artifact])).unwrap();
    assert!(store.pin(&note).unwrap());
    assert!(!store.pin(&note).unwrap(), "pinning twice is a no-op");
    assert_eq!(store.pins().unwrap(), vec![note]);
    assert_eq!(gc(&store, 0).swept, 0);
    assert!(store.contains(&artifact).unwrap());
    assert!(store.unpin(&note).unwrap());
    assert!(!store.unpin(&note).unwrap());
    assert_eq!(gc(&store, 0).swept, 2);
    let err = store.pin(&Hash::of(b"absent")).unwrap_err();
    assert!(err.to_string().contains("no blob"), "{err}");
}

/// The race the barrier exists for: blobs unreachable when marking ends are
/// re-linked by a writer before the sweep. They and everything they reach
/// must survive.
fn blobs_relinked_between_mark_and_sweep_are_rescued(b: TestBackend) {
    let store = b.fast();
    let t = new_thread(&store, "t");
    let t = append_n(&store, t.id, 3);
    let deep = store.put(&Blob::content("deep", [])).unwrap();
    let mid = store.put(&Blob::content("mid", [deep])).unwrap();
    let orphan_text = "a reply the writer will produce again";
    let same = store.put(&Blob::content(orphan_text, [])).unwrap();
    let garbage = store.put(&Blob::content("garbage", [])).unwrap();

    let injected = AtomicBool::new(false);
    let report = gc_with(&store, 0, &|p| {
        if let GcProgress::Marked { candidates, .. } = p {
            assert_eq!(candidates, 4, "deep, mid, same, garbage");
            assert!(store.stats().unwrap().gc_epoch.is_some());
            // A new blob links `mid` (which reaches `deep`)...
            store.put(&Blob::content("top", [mid])).unwrap();
            // ...and a step's reply is the same bytes as `same`.
            store
                .threads()
                .low_level()
                .append_step(t.id, t.head, step("dev", "ok", orphan_text), next("dev"))
                .unwrap();
            injected.store(true, Ordering::SeqCst);
        }
    });
    assert!(injected.load(Ordering::SeqCst));
    assert_eq!(report.rescued, 3, "{report:?}");
    assert_eq!(report.swept, 1, "{report:?}");
    for h in [deep, mid, same] {
        assert!(store.contains(&h).unwrap(), "{h} was re-linked");
    }
    assert!(!store.contains(&garbage).unwrap());
    assert_verified(&store);
    // The thread's chain reads back whole.
    let log = store.threads().log(t.id, 10, None).unwrap();
    assert_eq!(log.len(), 4);
}

fn a_thread_removed_during_a_collection_is_freed_by_the_next(b: TestBackend) {
    let store = b.fast();
    let t = new_thread(&store, "t");
    append_n(&store, t.id, 5);
    let report = gc_with(&store, 0, &|p| {
        if let GcProgress::Marked { .. } = p {
            store.threads().remove(t.id).unwrap();
        }
    });
    assert_eq!(report.swept, 0, "marked before the removal");
    assert_verified(&store);
    let report = gc(&store, 0);
    assert_eq!(report.swept, report.blobs, "{report:?}");
    assert_eq!(blob_count(&store), 0);
    assert_verified(&store);
}

fn one_collection_at_a_time(b: TestBackend) {
    let store = b.fast();
    new_thread(&store, "t");
    let checked = AtomicBool::new(false);
    gc_with(&store, 0, &|p| {
        if let GcProgress::Roots { .. } = p {
            let err =
                uwf_db::gc::collect_garbage(&store, &GcOptions::default(), &|_| {}).unwrap_err();
            assert!(matches!(err, GcError::Busy { .. }), "{err}");
            // A dry run takes no lock.
            let dry = GcOptions {
                dry_run: true,
                ..GcOptions::default()
            };
            uwf_db::gc::collect_garbage(&store, &dry, &|_| {}).unwrap();
            checked.store(true, Ordering::SeqCst);
        }
    });
    assert!(checked.load(Ordering::SeqCst));
}

fn worker_counts_give_the_same_result(b: TestBackend) {
    let store = b.fast();
    for i in 0..6 {
        let t = new_thread(&store, &format!("w{i}"));
        append_n(&store, t.id, 40);
        if i % 2 == 0 {
            store.threads().remove(t.id).unwrap();
        }
    }
    settle();
    let dry = |threads| {
        let mut r = uwf_db::gc::collect_garbage(
            &store,
            &GcOptions {
                grace: Duration::ZERO,
                dry_run: true,
                threads: Some(threads),
            },
            &|_| {},
        )
        .unwrap();
        r.elapsed_ms = 0;
        r.epoch_ms = 0;
        r
    };
    let one = dry(1);
    assert!(one.swept > 0);
    assert_eq!(dry(2), one);
    assert_eq!(dry(4), one);
}

/// Writers append, fork, remove and put blobs linking older blobs while
/// collections with no grace period run back to back. Nothing reachable may
/// go: `verify` finds every ref, and every live thread reads back whole.
fn writers_during_collections(b: TestBackend, rounds: usize, writers: usize) {
    let store = b.fast();
    let stop = AtomicBool::new(false);
    let collections = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for w in 0..writers {
            let store = &store;
            let stop = &stop;
            s.spawn(move || {
                let mut rng = 0x9e37_79b9_7f4a_7c15_u64 ^ (w as u64 + 1);
                let mut rand = move |n: u64| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng % n
                };
                let mut live: Vec<ThreadId> = Vec::new();
                let mut seen: Vec<Hash> = Vec::new();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    match rand(10) {
                        0 | 1 => match try_new_thread(store, &format!("w{w}")) {
                            Ok(t) => live.push(t.id),
                            // The workflow blob was put in a transaction of
                            // its own and, unreferenced, collected before the
                            // thread named it: refused, nothing written.
                            Err(ThreadError::Store(uwf_db::StoreError::MissingRef { .. })) => {}
                            Err(e) => panic!("{e}"),
                        },
                        2..=5 if !live.is_empty() => {
                            let id = live[rand(live.len() as u64) as usize];
                            let rec = store.threads().get(id).unwrap().unwrap();
                            // Replies repeat, so some are re-puts of blobs
                            // a removed thread left unreachable.
                            let reply = format!("reply {}", rand(20));
                            let w = store
                                .threads()
                                .low_level()
                                .append_step(id, rec.head, step("dev", "ok", &reply), next("dev"))
                                .unwrap();
                            seen.push(w.record.head);
                        }
                        6 if !live.is_empty() => {
                            let id = live[rand(live.len() as u64) as usize];
                            let log = store.threads().log(id, 20, None).unwrap();
                            if let Some(e) = log.get(rand(log.len() as u64 + 1) as usize) {
                                let f = store
                                    .threads()
                                    .low_level()
                                    .fork_thread(
                                        id,
                                        e.hash,
                                        Next::Role {
                                            role: "dev".into(),
                                            instruction: "again".into(),
                                            location: None,
                                        },
                                    )
                                    .unwrap();
                                live.push(f.id);
                            }
                        }
                        7 if live.len() > 2 => {
                            let id = live.swap_remove(rand(live.len() as u64) as usize);
                            store.threads().remove(id).unwrap();
                        }
                        8 if !seen.is_empty() => {
                            // Link an older node, which may be unreachable by
                            // now; if a collection already freed it the put
                            // is refused, never half-done.
                            let old = seen[rand(seen.len() as u64) as usize];
                            match store.put(&Blob::content(format!("note {i}"), [old])) {
                                Ok(_) => {}
                                Err(uwf_db::StoreError::MissingRef { missing, .. }) => {
                                    assert_eq!(missing, old);
                                }
                                Err(e) => panic!("{e}"),
                            }
                        }
                        _ => {}
                    }
                }
                for id in live {
                    let rec = store.threads().get(id).unwrap().unwrap();
                    let n = store.threads().log(id, 100_000, None).unwrap().len() as u64;
                    assert_eq!(n, rec.seq, "thread {id} reads back whole");
                }
            });
        }
        let (mut swept, mut rescued) = (0, 0);
        for _ in 0..rounds {
            let r = gc(&store, 0);
            swept += r.swept;
            rescued += r.rescued;
            collections.fetch_add(1, Ordering::Relaxed);
        }
        eprintln!("{rounds} collections: {swept} blobs swept, {rescued} rescued");
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(collections.load(Ordering::Relaxed), rounds);
    assert_verified(&store);
    gc(&store, 0);
    assert_verified(&store);
}

fn collections_are_safe_while_writers_run(b: TestBackend) {
    writers_during_collections(b, 40, 2);
}

/// The long version: `cargo test --release --test gc -- --ignored`.
fn collections_are_safe_while_writers_run_long(b: TestBackend) {
    writers_during_collections(b, 300, 3);
}

/// A batch (group commit) runs while collections with no grace period loop.
fn collections_are_safe_during_a_batch(b: TestBackend) {
    use uwf_db::engine::agent::{Agent, ScriptAgent};
    use uwf_db::engine::batch::BatchOptions;
    let store = b.fast();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let yaml = std::fs::read_to_string(root.join("examples/review.yaml")).unwrap();
    let wf = uwf_db::workflow::parse_workflow(&yaml, Some("review"), &|_| false).unwrap();
    let (hash, _) = store.workflows().add(&wf).unwrap();
    // Garbage for the collections to find: removed threads.
    for i in 0..20 {
        let t = new_thread(&store, &format!("old{i}"));
        append_n(&store, t.id, 5);
        store.threads().remove(t.id).unwrap();
    }
    let prompts: Vec<String> = (0..300).map(|i| format!("change {i}")).collect();
    let agents: Vec<Box<dyn Agent>> = (0..8)
        .map(|_| {
            Box::new(ScriptAgent::load(&root.join("examples/review.scenario.yaml")).unwrap())
                as Box<dyn Agent>
        })
        .collect();
    let done = AtomicBool::new(false);
    let swept = std::thread::scope(|s| {
        let collector = s.spawn(|| {
            let mut swept = 0;
            while !done.load(Ordering::Relaxed) {
                swept += gc(&store, 0).swept;
            }
            swept
        });
        let report = store
            .engine()
            .run_batch(
                hash,
                &prompts,
                &BatchOptions::default(),
                agents,
                &mut |_| {},
            )
            .unwrap();
        done.store(true, Ordering::Relaxed);
        assert_eq!(report.completed, 300, "{report:?}");
        collector.join().unwrap()
    });
    assert!(swept > 0, "the removed threads were collected");
    assert_verified(&store);
    for t in store
        .threads()
        .list(&uwf_db::thread::ThreadQuery::default())
        .unwrap()
    {
        assert_eq!(store.threads().log(t.id, 10, None).unwrap().len(), 5);
    }
}

fn progress_reports_every_phase_in_order(b: TestBackend) {
    let store = b.fast();
    let t = new_thread(&store, "t");
    append_n(&store, t.id, 5);
    store.threads().remove(t.id).unwrap();
    let events = std::sync::Mutex::new(Vec::new());
    let report = gc_with(&store, 0, &|p| events.lock().unwrap().push(p));
    let events = events.into_inner().unwrap();
    let phase = |p: &GcProgress| match p {
        GcProgress::Roots { .. } => 0,
        GcProgress::Scanning { .. } => 1,
        GcProgress::Scanned { .. } => 2,
        GcProgress::Marked { .. } => 3,
        GcProgress::Swept { .. } => 4,
        _ => 5,
    };
    let phases: Vec<i32> = events.iter().map(phase).collect();
    assert!(phases.windows(2).all(|w| w[0] <= w[1]), "{phases:?}");
    let scanned: Vec<u64> = events
        .iter()
        .filter_map(|p| match p {
            GcProgress::Scanning { done, total } => {
                assert_eq!(*total, 256);
                Some(*done)
            }
            _ => None,
        })
        .collect();
    assert_eq!(scanned.len(), 256);
    assert_eq!(scanned.iter().max(), Some(&256));
    assert!(events.contains(&GcProgress::Swept {
        done: report.swept,
        total: report.swept
    }));
}

conformance!(
    nothing_reachable_is_collected,
    a_removed_thread_is_freed_and_history_shared_with_a_fork_stays,
    the_grace_period_keeps_recent_garbage_with_what_it_reaches,
    a_reput_restarts_the_grace_period,
    pins_are_roots,
    blobs_relinked_between_mark_and_sweep_are_rescued,
    a_thread_removed_during_a_collection_is_freed_by_the_next,
    one_collection_at_a_time,
    worker_counts_give_the_same_result,
    collections_are_safe_while_writers_run,
    #[ignore]
    collections_are_safe_while_writers_run_long,
    collections_are_safe_during_a_batch,
    progress_reports_every_phase_in_order,
);

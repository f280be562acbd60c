//! `copy::copy_to` through the library (`docs/design.md` §4c), once per
//! backend: a rich store (finished, suspended, idle, forked and cancelled
//! threads, child workflows, workflows, pins) copied from memory into the
//! backend and back out, interrupted and continued, continued after the
//! source changed, and the destinations a copy refuses. The real binary,
//! LMDB ↔ PostgreSQL and `kill -9` are in `tests/cli_copy.rs`.

mod common;

use std::path::Path;
use std::time::Duration;

use common::backend::TestBackend;
use uwf_db::copy::{CopyError, CopyOptions, CopyProgress, CopyReport};
use uwf_db::engine::agent::ScriptAgent;
use uwf_db::engine::{Cancel, CancelOptions, ForkAt, StartOptions};
use uwf_db::gc::{GcError, GcOptions};
use uwf_db::thread::{ThreadQuery, ThreadStatus};
use uwf_db::verify::Problem;
use uwf_db::workflow::parse_workflow;
use uwf_db::{Blob, Hash, Store};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn register(store: &Store, file: &str) -> Hash {
    let yaml = std::fs::read_to_string(root().join(file)).unwrap();
    let wf = parse_workflow(&yaml, None, &|_| true).unwrap();
    store.workflows().add(&wf).unwrap().0
}

fn script(file: &str) -> ScriptAgent {
    ScriptAgent::load(&root().join(file)).unwrap()
}

/// Threads in every state the tables know: completed (in history), a
/// parent whose child finished, a parent suspended by its suspended child,
/// idle, a fork, cancelled; four workflows; a pinned blob; and `extra`
/// loose content blobs (which a copy moves like any other).
fn rich_store(store: &Store, extra: usize) {
    let review = register(store, "examples/review.yaml");
    register(store, "examples/planner.yaml");
    let ship = register(store, "examples/ship.yaml");
    let plan = register(store, "tests/fixtures/plan-and-build.yaml");
    let start = StartOptions::default();
    let run = |wf, prompt, scenario| {
        let (record, report) = store
            .engine()
            .run_workflow(wf, prompt, &start, &mut script(scenario))
            .unwrap();
        report.into_result().unwrap();
        record.id
    };
    let done = run(review, "Add a flag", "examples/review.scenario.yaml");
    run(ship, "Ship it", "examples/ship.scenario.yaml");
    run(
        plan,
        "Export",
        "tests/fixtures/plan-and-build.scenario.yaml",
    );
    store
        .engine()
        .start_workflow(review, "Later", &start)
        .unwrap();
    store
        .engine()
        .fork(done, ForkAt::BeforeRole("reviewer".into()))
        .unwrap();
    let cancelled = store
        .engine()
        .start_workflow(review, "Never", &start)
        .unwrap();
    store
        .engine()
        .cancel_thread(cancelled.id, &CancelOptions::default())
        .unwrap();
    let pinned = store.put(&Blob::content("pinned", [])).unwrap();
    store.pin(&pinned).unwrap();
    store
        .write(|w| {
            for i in 0..extra {
                w.put_blob(&Blob::content(format!("loose blob {i}"), []))?;
            }
            Ok::<_, uwf_db::StoreError>(())
        })
        .unwrap();
}

fn all_threads(store: &Store) -> Vec<uwf_db::thread::ThreadRecord> {
    store
        .threads()
        .list(&ThreadQuery {
            limit: 10_000,
            ..ThreadQuery::default()
        })
        .unwrap()
}

/// Both stores hold the same bytes in every table, and the engine reads
/// the same threads and logs from both.
fn assert_same(a: &Store, b: &Store) {
    assert_eq!(
        uwf_db::copy::table_digests(a).unwrap(),
        uwf_db::copy::table_digests(b).unwrap()
    );
    let threads = all_threads(a);
    assert_eq!(threads, all_threads(b));
    for t in &threads {
        assert_eq!(
            a.threads().log(t.id, 1000, None).unwrap(),
            b.threads().log(t.id, 1000, None).unwrap()
        );
    }
    assert_eq!(a.pins().unwrap(), b.pins().unwrap());
}

fn copy(src: &Store, dst: &Store) -> CopyReport {
    uwf_db::copy::copy_to(src, dst, &CopyOptions::default(), |_| {}).unwrap()
}

fn a_store_copied_into_this_backend_and_back_is_identical(b: TestBackend) {
    let src = Store::memory();
    rich_store(&src, 10);
    let threads = all_threads(&src);
    let statuses: Vec<ThreadStatus> = threads.iter().map(|t| t.status).collect();
    for s in [
        ThreadStatus::Completed,
        ThreadStatus::Suspended,
        ThreadStatus::Idle,
        ThreadStatus::Cancelled,
    ] {
        assert!(statuses.contains(&s), "{s:?} in {statuses:?}");
    }

    let mid = b.fast();
    let there = copy(&src, &mid);
    let back = Store::memory();
    let again = copy(&mid, &back);
    assert_same(&src, &mid);
    assert_same(&src, &back);

    for report in [&there, &again] {
        assert!(!report.resumed);
        assert!(report.verify.is_ok());
        assert_eq!(report.deleted, 0);
        // Everything but the format version, which a new store has.
        assert_eq!(report.written, report.rows - 1);
        let digests = uwf_db::copy::table_digests(&src).unwrap();
        let reported: Vec<(u64, &str)> = report
            .tables
            .iter()
            .map(|t| (t.rows, t.digest.as_str()))
            .collect();
        let expected: Vec<(u64, &str)> = digests
            .iter()
            .map(|d| (d.rows, d.digest.as_str()))
            .collect();
        assert_eq!(reported, expected);
    }
    assert!(there.verify.blobs_checked > 10);
    assert_eq!(mid.unfinished_copy().unwrap(), None);
    assert!(uwf_db::verify::verify(&mid, |_| {}).unwrap().is_ok());
    let stats = mid.stats().unwrap();
    assert_eq!(stats.unfinished_copy, None);
    assert_eq!(stats.blob_count, src.stats().unwrap().blob_count);
    assert_eq!(stats.pins, 1);
    // The copy is a working store: its threads go on.
    let idle = threads
        .iter()
        .find(|t| t.status == ThreadStatus::Suspended && t.parent_thread.is_none())
        .unwrap();
    assert_eq!(mid.threads().get(idle.id).unwrap().as_ref(), Some(idle));
}

/// Cancels `copy` after `after` committed chunks of `table` (any table when
/// `None`); returns the error and the source rows handled by then.
fn interrupt(
    src: &Store,
    dst: &Store,
    chunk_rows: usize,
    table: Option<uwf_db::backend::Table>,
    after: usize,
) -> (CopyError, u64) {
    let cancel = Cancel::new();
    let options = CopyOptions {
        chunk_rows,
        cancel: Some(cancel.clone()),
        ..CopyOptions::default()
    };
    let mut chunks = 0;
    let mut handled = 0;
    let err = uwf_db::copy::copy_to(src, dst, &options, |p| {
        if let CopyProgress::Copied { table: t, done, .. } = p {
            handled = done;
            if table.is_none_or(|want| want == t) {
                chunks += 1;
                if chunks == after {
                    cancel.cancel();
                }
            }
        }
    })
    .unwrap_err();
    (err, handled)
}

fn an_interrupted_copy_is_marked_and_a_rerun_continues_it(b: TestBackend) {
    let src = Store::memory();
    rich_store(&src, 300);
    let dst = b.fast();
    let (err, handled) = interrupt(&src, &dst, 16, None, 5);
    assert!(matches!(err, CopyError::Cancelled { .. }), "{err}");
    // The format version, then four chunks of blobs.
    assert_eq!(handled, 1 + 4 * 16);

    // The destination says what it is, to everyone.
    let marker = dst.unfinished_copy().unwrap().unwrap();
    assert_eq!(marker.source, src.location());
    assert_eq!(dst.stats().unwrap().unfinished_copy, Some(marker.clone()));
    let problems = uwf_db::verify::verify(&dst, |_| {}).unwrap().problems;
    assert!(
        problems.contains(&Problem::UnfinishedCopy {
            source: src.location().to_owned()
        }),
        "{problems:?}"
    );
    for dry_run in [true, false] {
        let gc = uwf_db::gc::collect_garbage(
            &dst,
            &GcOptions {
                grace: Duration::ZERO,
                dry_run,
                threads: None,
            },
            &|_| {},
        );
        assert!(matches!(gc, Err(GcError::UnfinishedCopy { .. })), "{gc:?}");
    }
    // An unfinished copy is not a source.
    let err =
        uwf_db::copy::copy_to(&dst, &Store::memory(), &CopyOptions::default(), |_| {}).unwrap_err();
    assert!(matches!(err, CopyError::SourceUnfinished { .. }), "{err}");
    assert!(
        uwf_db::copy::table_digests(&dst).unwrap()[1].rows > 0,
        "some blobs were copied before the interruption"
    );

    let mut resumed_seen = false;
    let report = uwf_db::copy::copy_to(&src, &dst, &CopyOptions::default(), |p| {
        if let CopyProgress::Started { resumed, .. } = p {
            resumed_seen = resumed;
        }
    })
    .unwrap();
    assert!(report.resumed && resumed_seen);
    // Nothing twice: the rerun wrote exactly what the first run had not.
    assert_eq!(report.written, report.rows - handled);
    assert_eq!(report.deleted, 0);
    assert!(report.verify.is_ok());
    assert_eq!(dst.unfinished_copy().unwrap(), None);
    assert_same(&src, &dst);
    // And a rerun of a finished copy is refused: the store is no longer
    // an unfinished copy, and not empty.
    let err = uwf_db::copy::copy_to(&src, &dst, &CopyOptions::default(), |_| {}).unwrap_err();
    assert!(
        matches!(err, CopyError::DestinationNotEmpty { .. }),
        "{err}"
    );
}

fn a_rerun_after_the_source_changed_copies_the_new_source(b: TestBackend) {
    let src = Store::memory();
    rich_store(&src, 40);
    let dst = b.fast();
    // Stop once the thread records are partly copied.
    let (err, _) = interrupt(&src, &dst, 2, Some(uwf_db::backend::Table::Threads), 1);
    assert!(matches!(err, CopyError::Cancelled { .. }), "{err}");
    let copied = uwf_db::copy::table_digests(&dst).unwrap();
    let threads = copied
        .iter()
        .find(|d| d.table == uwf_db::backend::Table::Threads);
    assert_eq!(threads.map(|d| d.rows), Some(2));

    // Meanwhile the source moves on: an idle thread is cancelled (it moves
    // to history), another is removed and its blobs collected, the pin
    // goes, a blob arrives.
    let idle: Vec<_> = all_threads(&src)
        .into_iter()
        .filter(|t| t.status == ThreadStatus::Idle)
        .collect();
    assert_eq!(idle.len(), 2, "the later thread and the fork");
    src.engine()
        .cancel_thread(idle[0].id, &CancelOptions::default())
        .unwrap();
    src.threads().remove(idle[1].id).unwrap();
    for pin in src.pins().unwrap() {
        src.unpin(&pin).unwrap();
    }
    let gc = uwf_db::gc::collect_garbage(
        &src,
        &GcOptions {
            grace: Duration::ZERO,
            ..GcOptions::default()
        },
        &|_| {},
    )
    .unwrap();
    assert!(gc.swept > 0);
    src.put(&Blob::content("new since the first run", []))
        .unwrap();

    let report = uwf_db::copy::copy_to(
        &src,
        &dst,
        &CopyOptions {
            chunk_rows: 3,
            ..CopyOptions::default()
        },
        |_| {},
    )
    .unwrap();
    assert!(report.resumed);
    assert!(report.deleted > 0, "{report:?}");
    assert_same(&src, &dst);
    assert!(uwf_db::verify::verify(&dst, |_| {}).unwrap().is_ok());
}

fn a_copy_refuses_destinations_that_are_not_its_own(b: TestBackend) {
    let src = Store::memory();
    rich_store(&src, 0);

    // Unrelated data: refused, untouched.
    let used = b.fast();
    let theirs = used.put(&Blob::content("someone else's", [])).unwrap();
    let before = uwf_db::copy::table_digests(&used).unwrap();
    let err = copy_err(&src, &used);
    assert!(
        matches!(err, CopyError::DestinationNotEmpty { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("blobs table has rows"), "{err}");
    assert_eq!(uwf_db::copy::table_digests(&used).unwrap(), before);
    assert_eq!(used.unfinished_copy().unwrap(), None);
    assert!(used.contains(&theirs).unwrap());

    // The same store, through another handle.
    let err = copy_err(&used, &used.open_again());
    assert!(matches!(err, CopyError::SameStore { .. }), "{err}");

    // An unfinished copy of another source. (Every in-memory store has one
    // location, `memory:`, so the other source is of this backend.)
    if b != TestBackend::Memory {
        let other = b.fast();
        rich_store(&other, 0);
        let dst = Store::memory();
        let (err, _) = interrupt(&other, &dst, 1, None, 3);
        assert!(matches!(err, CopyError::Cancelled { .. }), "{err}");
        let err = copy_err(&src, &dst);
        assert!(matches!(err, CopyError::OtherCopy { .. }), "{err}");
        assert!(err.to_string().contains(Store::location(&other)), "{err}");
    }
}

fn copy_err(src: &Store, dst: &Store) -> CopyError {
    uwf_db::copy::copy_to(src, dst, &CopyOptions::default(), |_| {}).unwrap_err()
}

fn any_chunk_size_gives_the_same_copy(b: TestBackend) {
    let src = b.fast();
    rich_store(&src, 20);
    for (chunk_rows, chunk_bytes) in [(1, usize::MAX), (7, usize::MAX), (1000, 1), (5, 700)] {
        let dst = Store::memory();
        let mut last = None;
        let report = uwf_db::copy::copy_to(
            &src,
            &dst,
            &CopyOptions {
                chunk_rows,
                chunk_bytes,
                cancel: None,
            },
            |p| {
                if let CopyProgress::Copied { done, total, .. } = p {
                    last = Some((done, total));
                }
            },
        )
        .unwrap();
        assert_eq!(report.written, report.rows - 1);
        assert_eq!(
            last,
            Some((report.rows, report.rows)),
            "progress ends at its total"
        );
        assert_same(&src, &dst);
    }
}

conformance!(
    a_store_copied_into_this_backend_and_back_is_identical,
    an_interrupted_copy_is_marked_and_a_rerun_continues_it,
    a_rerun_after_the_source_changed_copies_the_new_source,
    a_copy_refuses_destinations_that_are_not_its_own,
    any_chunk_size_gives_the_same_copy,
);

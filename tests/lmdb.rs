//! LMDB-only tests: what is inherently about the LMDB backend and so is not
//! part of the backend-neutral conformance suite (`common::backend`). The
//! map size and `MapFull`, opening one directory twice in one process (the
//! shared environment), a missing directory, format-version bytes written
//! with heed, and damage done to the databases with heed that `verify` and
//! the GC must find. Crash tests that kill processes mid-write are in the
//! CLI suites (`tests/cli_*.rs`).
//!
//! These open stores by directory; no other handle of a directory may be
//! open in this process while `raw_env` has it.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{append_n, new_thread};
use heed::types::Bytes;
use uwf_db::backend::BackendError;
use uwf_db::gc::{GcError, GcOptions};
use uwf_db::store::{FORMAT_VERSION, FORMAT_VERSION_KEY};
use uwf_db::thread::EndSpec;
use uwf_db::verify::{Problem, verify};
use uwf_db::{Blob, Durability, OpenError, Store, StoreError, StoreOptions};

/// A durable store in `dir` (the default options).
fn open(dir: &Path) -> Store {
    Store::open(dir, StoreOptions::default()).unwrap()
}

/// A store in `dir` that commits without fsync.
fn fast_store(dir: &Path) -> Store {
    Store::open(
        dir,
        StoreOptions {
            durability: Durability::None,
            ..StoreOptions::default()
        },
    )
    .unwrap()
}

/// Opens a store's LMDB environment directly, to damage it from outside.
/// No store handle of that path may be open in this process meanwhile.
fn raw_env(path: &std::path::Path) -> heed::Env {
    // SAFETY (test): no other handle of this environment is open in this
    // process while the raw one is.
    #[allow(unsafe_code)]
    unsafe {
        heed::EnvOpenOptions::new()
            .max_dbs(16)
            .map_size(1 << 30)
            .open(path)
            .unwrap()
    }
}

/// `value` with the trailer a store of the checksummed layout ends every
/// value with (`docs/design.md` §4, "Value checksums"; a second
/// implementation of it): damage written this way passes the checksum, so
/// what the test looks at is the check behind it.
fn sealed(table: &str, key: &[u8], value: &[u8]) -> Vec<u8> {
    use xxhash_rust::xxh3::xxh3_64_with_seed;
    let table = uwf_db::backend::Table::ALL
        .into_iter()
        .find(|t| t.name() == table)
        .unwrap();
    let covered = match value.get(18..22) {
        Some(n) if table == uwf_db::backend::Table::Blobs => {
            let n = u32::from_be_bytes(n.try_into().unwrap()) as usize;
            value.get(..22 + 32 * n).unwrap_or(value)
        }
        _ => value,
    };
    let seed = xxh3_64_with_seed(key, table.index() as u64);
    let mut out = value.to_vec();
    out.extend_from_slice(&(xxh3_64_with_seed(covered, seed) as u32).to_le_bytes());
    out
}

/// A stored value without its trailer.
fn unsealed(stored: &[u8]) -> Vec<u8> {
    stored[..stored.len() - 4].to_vec()
}

fn blob_count(store: &Store) -> u64 {
    store.stats().unwrap().blob_count
}

fn assert_verified(store: &Store) {
    let report = verify(store, |_| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

/// Lets the clock pass the last write before a collection with no grace.
fn settle() {
    std::thread::sleep(Duration::from_millis(2));
}

fn end(code: u8) -> EndSpec {
    EndSpec {
        return_code: code,
        summary: format!("ended with {code}"),
        prompt: "Approved".into(),
    }
}

// ---- store: formerly in tests/store.rs

#[test]
fn opening_twice_in_one_process_shares_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path());
    let b = open(dir.path());
    let h = a.put(&Blob::content("shared", [])).unwrap();
    assert!(b.contains(&h).unwrap());
    // Different durability for an open store is a clear error.
    let err = Store::open(
        dir.path(),
        StoreOptions {
            durability: Durability::None,
            ..StoreOptions::default()
        },
    )
    .unwrap_err();
    assert!(matches!(err, OpenError::OptionsConflict { .. }), "{err}");
    // Handles work from other threads.
    let c = a.clone();
    std::thread::spawn(move || c.put(&Blob::content("from a thread", [])).unwrap())
        .join()
        .unwrap();
    assert_eq!(b.stats().unwrap().blob_count, 2);
}

#[test]
fn reading_a_missing_store_asks_for_init() {
    let dir = tempfile::tempdir().unwrap();
    let err = Store::open(
        dir.path().join("nope"),
        StoreOptions {
            create: false,
            ..StoreOptions::default()
        },
    )
    .unwrap_err();
    assert!(matches!(
        err,
        OpenError::Backend(BackendError::NotInitialized { .. })
    ));
    assert!(err.to_string().contains("uwf-db init"));
    assert!(!dir.path().join("nope").exists(), "a read creates nothing");
}

#[test]
fn map_full_is_distinct_keeps_committed_data_and_a_larger_maximum_continues() {
    let dir = tempfile::tempdir().unwrap();
    let small = StoreOptions {
        max_map_size: Some(1 << 20),
        ..StoreOptions::default()
    };
    let mut committed = Vec::new();
    {
        let store = Store::open(dir.path(), small.clone()).unwrap();
        let err = loop {
            let i = committed.len();
            let blob = Blob::content(format!("{i:04} {}", "x".repeat(2000)), []);
            match store.put(&blob) {
                Ok(h) => committed.push(h),
                Err(e) => break e,
            }
            assert!(i < 10_000, "a 1 MiB map must fill up");
        };
        assert!(
            matches!(err, StoreError::Backend(BackendError::MapFull { map_size, .. }) if map_size == 1 << 20),
            "{err}"
        );
        assert!(err.to_string().contains("--max-map-size"));
        assert!(committed.len() > 100);
        for h in &committed {
            assert!(store.contains(h).unwrap());
        }
    }
    // Every handle is dropped: the environment closed. Reopen larger.
    let store = Store::open(
        dir.path(),
        StoreOptions {
            max_map_size: Some(64 << 20),
            ..StoreOptions::default()
        },
    )
    .unwrap();
    for h in &committed {
        assert!(store.get(h).unwrap().is_some());
    }
    for i in 0..500 {
        store
            .put(&Blob::content(
                format!("after {i} {}", "y".repeat(2000)),
                [],
            ))
            .unwrap();
    }
    assert_eq!(blob_count(&store), committed.len() as u64 + 500);
    assert!(verify(&store, |_| {}).unwrap().is_ok());
}

#[test]
fn unknown_format_versions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path()));
    {
        let env = raw_env(dir.path());
        let mut w = env.write_txn().unwrap();
        let meta: heed::Database<heed::types::Str, Bytes> =
            env.open_database(&w, Some("meta")).unwrap().unwrap();
        meta.put(
            &mut w,
            FORMAT_VERSION_KEY,
            &(FORMAT_VERSION + 1).to_be_bytes(),
        )
        .unwrap();
        w.commit().unwrap();
    }
    let err = Store::open(dir.path(), StoreOptions::default()).unwrap_err();
    assert!(
        matches!(err, OpenError::Backend(BackendError::UnsupportedFormat { found, .. }) if found == FORMAT_VERSION + 1),
        "{err}"
    );
}

#[test]
fn verify_finds_altered_bytes_and_removed_ref_targets() {
    let dir = tempfile::tempdir().unwrap();
    let (victim, target, holder, clean) = {
        let store = open(dir.path());
        let victim = store.put(&Blob::content("original text", [])).unwrap();
        let target = store.put(&Blob::content("artifact", [])).unwrap();
        let holder = store.put(&Blob::content("points at it", [target])).unwrap();
        let clean = store.put(&Blob::content("untouched", [])).unwrap();
        assert!(verify(&store, |_| {}).unwrap().is_ok());
        (victim, target, holder, clean)
    };
    {
        let env = raw_env(dir.path());
        let mut w = env.write_txn().unwrap();
        let blobs: heed::Database<Bytes, Bytes> =
            env.open_database(&w, Some("blobs")).unwrap().unwrap();
        let mut value = unsealed(blobs.get(&w, victim.as_bytes()).unwrap().unwrap());
        let last = value.len() - 2;
        value[last] ^= 0x01; // flip a bit inside the text
        blobs
            .put(
                &mut w,
                victim.as_bytes(),
                &sealed("blobs", victim.as_bytes(), &value),
            )
            .unwrap();
        assert!(blobs.delete(&mut w, target.as_bytes()).unwrap());
        w.commit().unwrap();
    }
    let store = open(dir.path());
    let report = verify(&store, |_| {}).unwrap();
    assert_eq!(report.problems.len(), 2, "{:?}", report.problems);
    assert!(
        report
            .problems
            .iter()
            .any(|p| matches!(p, Problem::HashMismatch { hash, .. } if *hash == victim))
    );
    assert!(report.problems.contains(&Problem::MissingRef {
        hash: holder,
        missing: target
    }));
    assert!(
        !report
            .problems
            .iter()
            .any(|p| p.to_string().contains(&clean.to_string()))
    );
    // Reading the altered blob still works; reading through a missing ref is reported.
    let err = store
        .walk(&holder, |_| Ok::<_, StoreError>(()))
        .unwrap_err();
    assert!(matches!(err, StoreError::MissingRef { .. }), "{err}");
}

// ---- threads: formerly in tests/threads.rs

#[test]
fn verify_finds_damaged_thread_indexes() {
    use heed::types::Bytes;
    let dir = tempfile::tempdir().unwrap();
    let (ended, active) = {
        let store = fast_store(dir.path());
        let a = new_thread(&store, "a");
        store
            .threads()
            .low_level()
            .end_thread(a.id, a.head, end(0))
            .unwrap();
        let b = new_thread(&store, "b");
        append_n(&store, b.id, 2);
        assert!(verify(&store, |_| {}).unwrap().is_ok());
        (a.id, b.id)
    };
    {
        let env = raw_env(dir.path());
        let mut w = env.write_txn().unwrap();
        let db = |name| -> heed::Database<Bytes, Bytes> {
            env.open_database(&w, Some(name)).unwrap().unwrap()
        };
        let (history_ids, threads) = (db("history_ids"), db("threads"));
        assert!(history_ids.delete(&mut w, &ended.to_bytes()).unwrap());
        threads
            .put(
                &mut w,
                &active.to_bytes(),
                &sealed("threads", &active.to_bytes(), b"garbage"),
            )
            .unwrap();
        w.commit().unwrap();
    }
    let store = fast_store(dir.path());
    let report = verify(&store, |_| {}).unwrap();
    let text: Vec<String> = report.problems.iter().map(ToString::to_string).collect();
    assert!(
        text.iter()
            .any(|p| p.contains("history") && p.contains(&ended.to_string())),
        "{text:?}"
    );
    assert!(
        text.iter()
            .any(|p| p.contains("threads entry") && p.contains("does not decode")),
        "{text:?}"
    );
}

// ---- gc: formerly in tests/gc.rs

#[test]
fn verify_reports_roots_that_name_missing_blobs() {
    use heed::types::Bytes;
    use uwf_db::verify::Problem;
    let dir = tempfile::tempdir().unwrap();
    let (pinned, workflow) = {
        let store = fast_store(dir.path());
        let pinned = store.put(&Blob::content("pinned", [])).unwrap();
        store.pin(&pinned).unwrap();
        let yaml = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/review.yaml"),
        )
        .unwrap();
        let wf = uwf_db::workflow::parse_workflow(&yaml, Some("review"), &|_| false).unwrap();
        let (workflow, _) = store.workflows().add(&wf).unwrap();
        assert_verified(&store);
        (pinned, workflow)
    };
    {
        let env = raw_env(dir.path());
        let mut w = env.write_txn().unwrap();
        let blobs: heed::Database<Bytes, Bytes> =
            env.open_database(&w, Some("blobs")).unwrap().unwrap();
        assert!(blobs.delete(&mut w, pinned.as_bytes()).unwrap());
        assert!(blobs.delete(&mut w, workflow.as_bytes()).unwrap());
        w.commit().unwrap();
    }
    let store = fast_store(dir.path());
    let report = verify(&store, |_| {}).unwrap();
    let dbs: Vec<&str> = report
        .problems
        .iter()
        .filter_map(|p| match p {
            Problem::ThreadIndex { db, detail, .. } if detail.contains("not stored") => Some(*db),
            _ => None,
        })
        .collect();
    assert_eq!(dbs, ["workflows", "pins"], "{:?}", report.problems);
}

#[test]
fn a_corrupt_record_stops_the_collection_before_anything_is_deleted() {
    use heed::types::Bytes;
    let dir = tempfile::tempdir().unwrap();
    let (victim, before) = {
        let store = fast_store(dir.path());
        let t = new_thread(&store, "t");
        append_n(&store, t.id, 3);
        store.threads().remove(t.id).unwrap();
        let victim = store.put(&Blob::content("victim", [])).unwrap();
        (victim, blob_count(&store))
    };
    {
        let env = raw_env(dir.path());
        let mut w = env.write_txn().unwrap();
        let blobs: heed::Database<Bytes, Bytes> =
            env.open_database(&w, Some("blobs")).unwrap().unwrap();
        // A header cut short: the refs can no longer be read.
        blobs
            .put(
                &mut w,
                victim.as_bytes(),
                &sealed("blobs", victim.as_bytes(), &[1, 2, 0]),
            )
            .unwrap();
        w.commit().unwrap();
    }
    let store = fast_store(dir.path());
    settle();
    let err = uwf_db::gc::collect_garbage(
        &store,
        &GcOptions {
            grace: Duration::ZERO,
            ..GcOptions::default()
        },
        &|_| {},
    )
    .unwrap_err();
    assert!(matches!(err, GcError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("uwf-db verify"), "{err}");
    assert_eq!(blob_count(&store), before, "nothing was deleted");
    assert_eq!(
        store.stats().unwrap().gc_epoch,
        None,
        "the marker is cleared"
    );
}

// ---- batch: formerly in tests/batch.rs

#[test]
fn a_full_map_fails_its_request_and_the_store_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        StoreOptions {
            max_map_size: Some(1 << 20),
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let small = store.put(&Blob::content("before", [])).unwrap();
    let ((), _) = store.group_commit(0, |g| {
        let big = Blob::content("x".repeat(4 << 20), []);
        let err = g.write_op(move |w| w.put_blob(&big)).unwrap_err();
        assert!(
            matches!(err, StoreError::Backend(BackendError::MapFull { .. })),
            "{err}"
        );
        g.write_op(|w| w.put_blob(&Blob::content("after", [])))
            .unwrap();
    });
    assert!(store.contains(&small).unwrap());
    assert!(
        store
            .contains(&Blob::content("after", []).encode().unwrap().hash())
            .unwrap()
    );
    assert!(verify(&store, |_| {}).unwrap().is_ok());
}

/// The newest meta page's `mm_last_pg` and the page size (4096 here).
fn last_page_of(data: &Path) -> u64 {
    let bytes = std::fs::read(data).unwrap();
    let field = |page: usize, at: usize| {
        u64::from_le_bytes(
            bytes[page * 4096 + at..page * 4096 + at + 8]
                .try_into()
                .unwrap(),
        )
    };
    // mm_last_pg at 136, mm_txnid at 144 of each meta page.
    if field(1, 144) > field(0, 144) {
        field(1, 136)
    } else {
        field(0, 136)
    }
}

/// A data file may end before LMDB's last page: a transaction that
/// takes pages and gives them back before it commits (its "loose" pages;
/// `prune` then `gc` did it) counts them in the meta page's last page but
/// never writes them. Such a store is whole, and was once refused as
/// truncated by every command. Here the file is cut by the free pages at
/// its end (a large value written, then deleted, leaves them): every cut
/// that opens must verify, take writes and reopen (a used page cut away
/// would fail `verify` or the mapping's reads); the first cut into a used
/// page is refused as truncated; and at least one cut opens.
#[test]
fn a_data_file_short_by_free_pages_only_is_whole() {
    let dir = tempfile::tempdir().unwrap();
    let kept = {
        let store = open(dir.path());
        store.put(&Blob::content("kept", [])).unwrap()
    };
    {
        let env = raw_env(dir.path());
        let meta = |w: &heed::RwTxn| -> heed::Database<heed::types::Str, Bytes> {
            env.open_database(w, Some("meta")).unwrap().unwrap()
        };
        // Free pages to take from first (so the deletion below writes
        // nothing past the large value's pages), then the large value at
        // the end of the file.
        let mut w = env.write_txn().unwrap();
        for i in 0..200 {
            meta(&w)
                .put(&mut w, &format!("churn{i:04}"), &[1u8; 500])
                .unwrap();
        }
        w.commit().unwrap();
        let mut w = env.write_txn().unwrap();
        for i in 0..200 {
            meta(&w).delete(&mut w, &format!("churn{i:04}")).unwrap();
        }
        w.commit().unwrap();
        let mut w = env.write_txn().unwrap();
        meta(&w)
            .put(&mut w, "scratch", &vec![7u8; 400 * 1024])
            .unwrap();
        w.commit().unwrap();
        let mut w = env.write_txn().unwrap();
        meta(&w).delete(&mut w, "scratch").unwrap();
        w.commit().unwrap();
    }
    let data = dir.path().join("data.mdb");
    let whole = std::fs::read(&data).unwrap();
    assert_eq!((last_page_of(&data) + 1) * 4096, whole.len() as u64);
    let mut opened = 0;
    for cut in 1..=whole.len() / 4096 - 3 {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("data.mdb"),
            &whole[..whole.len() - cut * 4096],
        )
        .unwrap();
        match Store::open(dir.path(), StoreOptions::default()) {
            Ok(store) => {
                assert!(store.contains(&kept).unwrap());
                assert!(verify(&store, |_| {}).unwrap().is_ok(), "cut {cut}");
                if cut % 25 == 1 {
                    // It grows again over the pages it lacked.
                    drop(store);
                    let store = fast_store(dir.path());
                    for i in 0..150 {
                        let text = format!("more {i} {}", "x".repeat(3000));
                        store.put(&Blob::content(text, [])).unwrap();
                    }
                    drop(store);
                    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
                    assert!(verify(&store, |_| {}).unwrap().is_ok(), "cut {cut}, grown");
                }
                opened += 1;
            }
            Err(e) => {
                assert!(e.to_string().contains("truncated"), "cut {cut}: {e}");
                break;
            }
        }
    }
    assert!(
        opened >= 1,
        "no free page at the end: the setup did not make one"
    );
}

//! The LMDB store through the public API: integrity, dedup, prefixes,
//! map limits, reopening, format versions, damage found by verify.

mod common;

use std::collections::BTreeMap;

use heed::types::Bytes;
use uwf_db::store::{FORMAT_VERSION, FORMAT_VERSION_KEY};
use uwf_db::verify::{Problem, verify};
use uwf_db::{Blob, Durability, Hash, HashPrefix, StateNode, Store, StoreError, StoreOptions};

fn open(dir: &std::path::Path) -> Store {
    Store::open(dir, StoreOptions::default()).unwrap()
}

fn blob_count(store: &Store) -> u64 {
    store.stats().unwrap().blob_count
}

#[test]
fn put_get_and_dedup() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let blob = Blob::content("hello", []);
    let h = store.put(&blob).unwrap();
    assert_eq!(h, blob.encode().unwrap().hash());
    assert_eq!(store.get(&h).unwrap(), Some(blob.clone()));
    let stored = store.get_stored(&h).unwrap().unwrap();
    assert_eq!(Hash::of(&stored.bytes), h);
    assert!(stored.written_at > 0);

    // A second put is a no-op: the record (and its timestamps) are unchanged.
    let again = store.write(|w| w.put_encoded(&blob.encode()?)).unwrap();
    assert!(!again, "re-put reports the blob as existing");
    assert_eq!(store.get_stored(&h).unwrap().unwrap(), stored);
    assert_eq!(blob_count(&store), 1);
    assert!(store.get(&Hash::of(b"absent")).unwrap().is_none());
}

#[test]
fn a_missing_ref_fails_naming_the_hash_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let present = store.put(&Blob::content("present", [])).unwrap();
    let missing = Hash::of(b"never stored");
    let before = blob_count(&store);

    // Several puts in one transaction: the last one fails, so none is kept.
    let err = store
        .write(|w| {
            w.put_blob(&Blob::content("first of the batch", []))?;
            w.put_blob(&Blob::content("refers", [present, missing]))
        })
        .unwrap_err();
    match &err {
        StoreError::MissingRef { missing: m, .. } => assert_eq!(*m, missing),
        other => panic!("expected MissingRef, got {other}"),
    }
    assert!(err.to_string().contains(&missing.to_string()));
    assert_eq!(blob_count(&store), before, "store unchanged");
    assert!(verify(&store, |_| {}).unwrap().is_ok());
}

#[test]
fn refs_may_point_to_blobs_earlier_in_the_same_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let (a, b) = store
        .write(|w| {
            let a = w.put_blob(&Blob::content("artifact", []))?;
            let b = w.put_blob(&Blob::content("uses it", [a]))?;
            Ok::<_, StoreError>((a, b))
        })
        .unwrap();
    let mut seen = Vec::new();
    store
        .walk(&b, |s| {
            seen.push(s.hash);
            Ok::<_, StoreError>(())
        })
        .unwrap();
    assert_eq!(seen, vec![b, a]);
}

#[test]
fn a_state_node_checks_its_parent_not_every_ancestor() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let text = store.put(&Blob::content("t", [])).unwrap();
    let state = |ancestors: Vec<Hash>, seq| {
        Blob::State(StateNode {
            ancestors,
            child_thread: None,
            compact: None,
            content: text,
            input: text,
            meta: BTreeMap::new(),
            role: "r".into(),
            seq,
            start: text,
            timestamp: 0,
        })
    };
    let s1 = store.put(&state(vec![], 1)).unwrap();
    let s2 = store.put(&state(vec![s1], 2)).unwrap();
    // A missing parent is refused...
    let err = store
        .put(&state(vec![Hash::of(b"no parent"), s2], 3))
        .unwrap_err();
    assert!(matches!(err, StoreError::MissingRef { .. }));
    // ...and a present parent is enough (older ancestors are implied).
    store.put(&state(vec![s2, s1], 3)).unwrap();
    assert!(verify(&store, |_| {}).unwrap().is_ok());
}

#[test]
fn prefixes_resolve_and_ambiguity_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut hashes = Vec::new();
    store
        .write(|w| {
            for i in 0..5000 {
                hashes.push(w.put_blob(&Blob::content(format!("blob {i}"), []))?);
            }
            Ok::<_, StoreError>(())
        })
        .unwrap();
    for h in hashes.iter().take(50) {
        let p: HashPrefix = h.to_string()[..12].parse().unwrap();
        assert_eq!(store.resolve(&p).unwrap(), *h);
    }
    let full: HashPrefix = hashes[0].to_string().parse().unwrap();
    assert_eq!(store.resolve(&full).unwrap(), hashes[0]);
    let unknown: HashPrefix = "ffffff0000".parse().unwrap();
    let err = store.resolve(&unknown).unwrap_err();
    assert!(matches!(err, StoreError::UnknownHash { .. }), "{err}");
}

#[test]
fn ambiguous_prefix_names_the_candidates() {
    // Birthday search: among 20,000 hashes about 12 pairs share their first
    // 6 hex characters (16^6 = 16.7 M); the contents are fixed, so the
    // outcome is deterministic.
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut first: BTreeMap<String, Hash> = BTreeMap::new();
    let mut pair = None;
    store
        .write(|w| {
            for i in 0..20_000 {
                let h = w.put_blob(&Blob::content(format!("candidate {i}"), []))?;
                let key = h.to_string()[..6].to_owned();
                if let Some(prev) = first.insert(key.clone(), h) {
                    pair = Some((key, prev, h));
                    break;
                }
            }
            Ok::<_, StoreError>(())
        })
        .unwrap();
    let (prefix, x, y) = pair.expect("a 6-character collision among 20,000 hashes");
    let err = store.resolve(&prefix.parse().unwrap()).unwrap_err();
    match &err {
        StoreError::AmbiguousPrefix { candidates, .. } => {
            assert!(candidates.contains(&x) && candidates.contains(&y));
        }
        other => panic!("expected ambiguity, got {other}"),
    }
    assert!(err.to_string().contains("ambiguous"));
}

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
    assert!(matches!(err, StoreError::OptionsConflict { .. }), "{err}");
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
    assert!(matches!(err, StoreError::NotInitialized { .. }));
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
            matches!(err, StoreError::MapFull { map_size, .. } if map_size == 1 << 20),
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
        let env = common::raw_env(dir.path());
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
        matches!(err, StoreError::UnsupportedFormat { found, .. } if found == FORMAT_VERSION + 1),
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
        let env = common::raw_env(dir.path());
        let mut w = env.write_txn().unwrap();
        let blobs: heed::Database<Bytes, Bytes> =
            env.open_database(&w, Some("blobs")).unwrap().unwrap();
        let mut value = blobs.get(&w, victim.as_bytes()).unwrap().unwrap().to_vec();
        let last = value.len() - 2;
        value[last] ^= 0x01; // flip a bit inside the text
        blobs.put(&mut w, victim.as_bytes(), &value).unwrap();
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

#[test]
fn concurrent_writers_in_threads_all_land() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let s = store.clone();
            std::thread::spawn(move || {
                for i in 0..200 {
                    s.put(&Blob::content(format!("thread {t} blob {i}"), []))
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(blob_count(&store), 800);
    assert!(verify(&store, |_| {}).unwrap().is_ok());
}

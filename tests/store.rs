//! The store through the public API, on every backend: integrity, dedup,
//! prefixes, concurrent writers. (Map limits, reopening, format versions
//! and damage found by verify are LMDB's: `tests/lmdb.rs`.)

mod common;

use std::collections::BTreeMap;

use common::backend::TestBackend;
use uwf_db::verify::verify;
use uwf_db::{Blob, Hash, HashPrefix, StateNode, Store, StoreError};

fn blob_count(store: &Store) -> u64 {
    store.stats().unwrap().blob_count
}

fn put_get_and_dedup(b: TestBackend) {
    let store = b.durable();
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

fn a_missing_ref_fails_naming_the_hash_and_writes_nothing(b: TestBackend) {
    let store = b.durable();
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

fn refs_may_point_to_blobs_earlier_in_the_same_transaction(b: TestBackend) {
    let store = b.durable();
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

fn a_state_node_checks_its_parent_not_every_ancestor(b: TestBackend) {
    let store = b.durable();
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

fn prefixes_resolve_and_ambiguity_is_reported(b: TestBackend) {
    let store = b.durable();
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

fn ambiguous_prefix_names_the_candidates(b: TestBackend) {
    // Birthday search: among 20,000 hashes about 12 pairs share their first
    // 6 hex characters (16^6 = 16.7 M); the contents are fixed, so the
    // outcome is deterministic.
    let store = b.durable();
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

fn concurrent_writers_in_threads_all_land(b: TestBackend) {
    let store = b.durable();
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

/// Two handles opened on one store (in PostgreSQL terms, two connections)
/// see each other's commits, and a head moved through one is a conflict for
/// a stale write through the other.
fn a_second_handle_sees_commits_and_conflicts(b: TestBackend) {
    let store = b.durable();
    let other = store.open_again();
    let h = store.put(&Blob::content("through the first", [])).unwrap();
    assert!(other.contains(&h).unwrap());
    let t = common::new_thread(&other, "shared");
    assert_eq!(store.threads().get(t.id).unwrap().unwrap(), t);
    store
        .threads()
        .low_level()
        .append_step(
            t.id,
            t.head,
            common::step("dev", "ok", "first"),
            common::next("dev"),
        )
        .unwrap();
    let err = other
        .threads()
        .low_level()
        .append_step(
            t.id,
            t.head,
            common::step("dev", "ok", "stale"),
            common::next("dev"),
        )
        .unwrap_err();
    assert!(
        matches!(err, uwf_db::thread::ThreadError::Conflict { .. }),
        "{err}"
    );
    assert_eq!(other.threads().get(t.id).unwrap().unwrap().seq, 1);
}

conformance!(
    put_get_and_dedup,
    a_missing_ref_fails_naming_the_hash_and_writes_nothing,
    refs_may_point_to_blobs_earlier_in_the_same_transaction,
    a_state_node_checks_its_parent_not_every_ancestor,
    prefixes_resolve_and_ambiguity_is_reported,
    ambiguous_prefix_names_the_candidates,
    concurrent_writers_in_threads_all_land,
    a_second_handle_sees_commits_and_conflicts,
);

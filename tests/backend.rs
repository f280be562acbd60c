//! The storage boundary itself (`docs/design.md` §4b), on every backend:
//! a write transaction sees its own writes in every combination of
//! operations, however a backend holds them (PostgreSQL keeps writes that
//! need no answer until the commit, and fetches some reads with `BEGIN`),
//! and commits all of them or none.

mod common;

use std::borrow::Cow;

use common::backend::TestBackend;
use uwf_db::Store;
use uwf_db::backend::{Direction, KeyRange, ReadTables, Refresh, Table};

fn owned(v: Option<Cow<'_, [u8]>>) -> Option<Vec<u8>> {
    v.map(|v| v.into_owned())
}

/// Every key and value of `table` with `prefix`, forwards or backwards.
fn scan(
    t: &dyn ReadTables,
    table: Table,
    prefix: &[u8],
    direction: Direction,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut end = prefix.to_vec();
    end.push(0xff);
    t.range(table, KeyRange::between(prefix, &end), direction)
        .unwrap()
        .map(|e| {
            let (k, v) = e.unwrap();
            (k.into_owned(), v.into_owned())
        })
        .collect()
}

fn key(name: &str) -> Vec<u8> {
    format!("boundary-test:{name}").into_bytes()
}

const PREFIX: &[u8] = b"boundary-test:";

fn a_write_transaction_reads_its_own_writes(b: TestBackend) {
    let store = b.fast();
    let backend = Store::backend(&store);
    // Stored before: `a`, `b`.
    let mut w = backend.begin_write().unwrap();
    w.put(Table::Meta, &key("a"), b"1").unwrap();
    w.put(Table::Meta, &key("b"), b"2").unwrap();
    w.commit().unwrap();

    let mut w = backend.begin_write().unwrap();
    // A hint names keys, present and absent; reads answer the same.
    w.prefetch(&[(Table::Meta, &key("a")), (Table::Meta, &key("zz"))])
        .unwrap();
    assert_eq!(
        owned(w.get(Table::Meta, &key("a")).unwrap()),
        Some(b"1".to_vec())
    );
    assert_eq!(owned(w.get(Table::Meta, &key("zz")).unwrap()), None);
    // A put is read back at once, by get, get_many, range and count.
    w.put(Table::Meta, &key("c"), b"3").unwrap();
    w.put(Table::Meta, &key("a"), b"1bis").unwrap();
    assert_eq!(
        owned(w.get(Table::Meta, &key("c")).unwrap()),
        Some(b"3".to_vec())
    );
    let many: Vec<Option<Vec<u8>>> = w
        .get_many(
            Table::Meta,
            &[&key("c"), &key("nope"), &key("a"), &key("b")],
        )
        .unwrap()
        .into_iter()
        .map(owned)
        .collect();
    assert_eq!(
        many,
        [
            Some(b"3".to_vec()),
            None,
            Some(b"1bis".to_vec()),
            Some(b"2".to_vec())
        ]
    );
    // `remove` of a present key and of an absent one.
    w.remove(Table::Meta, &key("b")).unwrap();
    w.remove(Table::Meta, &key("never")).unwrap();
    assert_eq!(owned(w.get(Table::Meta, &key("b")).unwrap()), None);
    let forward = scan(&*w, Table::Meta, PREFIX, Direction::Forward);
    assert_eq!(
        forward,
        [(key("a"), b"1bis".to_vec()), (key("c"), b"3".to_vec())]
    );
    let mut backward = scan(&*w, Table::Meta, PREFIX, Direction::Reverse);
    backward.reverse();
    assert_eq!(backward, forward);
    // insert answers from what the transaction wrote: exists, removed, new.
    assert!(!w.insert(Table::Meta, &key("c"), b"other").unwrap());
    assert!(w.insert(Table::Meta, &key("b"), b"2bis").unwrap());
    assert!(w.insert(Table::Meta, &key("d"), b"4").unwrap());
    assert!(!w.insert(Table::Meta, &key("d"), b"again").unwrap());
    // delete answers whether it was there, held or stored.
    assert!(w.delete(Table::Meta, &key("d")).unwrap());
    assert!(!w.delete(Table::Meta, &key("d")).unwrap());
    assert!(!w.delete(Table::Meta, &key("never")).unwrap());
    // After a range, writes go on being seen.
    w.put(Table::Meta, &key("e"), b"5").unwrap();
    assert_eq!(
        scan(&*w, Table::Meta, PREFIX, Direction::Forward),
        [
            (key("a"), b"1bis".to_vec()),
            (key("b"), b"2bis".to_vec()),
            (key("c"), b"3".to_vec()),
            (key("e"), b"5".to_vec()),
        ]
    );
    let before = w.count(Table::Meta).unwrap();
    w.put(Table::Meta, &key("f"), b"6").unwrap();
    assert_eq!(w.count(Table::Meta).unwrap(), before + 1);
    w.commit().unwrap();

    let r = backend.begin_read().unwrap();
    assert_eq!(
        scan(&*r, Table::Meta, PREFIX, Direction::Forward),
        [
            (key("a"), b"1bis".to_vec()),
            (key("b"), b"2bis".to_vec()),
            (key("c"), b"3".to_vec()),
            (key("e"), b"5".to_vec()),
            (key("f"), b"6".to_vec()),
        ]
    );
    drop(r);

    // A transaction dropped without commit leaves nothing: neither what it
    // sent (a range made it send its held writes) nor what it still held.
    let mut w = backend.begin_write().unwrap();
    w.put(Table::Meta, &key("g"), b"7").unwrap();
    w.remove(Table::Meta, &key("a")).unwrap();
    assert_eq!(scan(&*w, Table::Meta, PREFIX, Direction::Forward).len(), 5);
    w.put(Table::Meta, &key("h"), b"8").unwrap();
    w.remove(Table::Meta, &key("c")).unwrap();
    drop(w);
    let r = backend.begin_read().unwrap();
    assert_eq!(scan(&*r, Table::Meta, PREFIX, Direction::Forward).len(), 5);
    assert_eq!(
        owned(r.get(Table::Meta, &key("a")).unwrap()),
        Some(b"1bis".to_vec())
    );
}

/// A value with an 8-byte big-endian field at offset 2.
fn valued(field: u64) -> Vec<u8> {
    let mut v = b"xy".to_vec();
    v.extend(field.to_be_bytes());
    v.extend(b"tail");
    v
}

fn refresh(below: u64, stamp: u64) -> Refresh {
    Refresh {
        offset: 2,
        below,
        stamp,
        required: true,
    }
}

fn insert_or_refresh_inserts_or_moves_the_field_forward(b: TestBackend) {
    let store = b.fast();
    let backend = Store::backend(&store);
    let t = Table::Blobs;
    let mut w = backend.begin_write().unwrap();
    // Stored: field 100 (old), field 500 (recent), and a value too short.
    w.put(t, &key("old"), &valued(100)).unwrap();
    w.put(t, &key("recent"), &valued(500)).unwrap();
    w.put(t, &key("short"), b"xy\x00").unwrap();
    w.commit().unwrap();

    let mut w = backend.begin_write().unwrap();
    for k in ["old", "recent", "short", "new"] {
        w.insert_or_refresh(t, &key(k), &valued(900), refresh(300, 900))
            .unwrap();
    }
    // In the same transaction, a value held as written is refreshed too.
    w.put(t, &key("held"), &valued(10)).unwrap();
    w.insert_or_refresh(t, &key("held"), &valued(900), refresh(300, 900))
        .unwrap();
    // Read back before and after the commit: the same.
    let expect = [
        ("old", valued(900)),
        ("recent", valued(500)),
        ("short", b"xy\x00".to_vec()),
        ("new", valued(900)),
        ("held", valued(900)),
    ];
    for (k, v) in &expect {
        assert_eq!(owned(w.get(t, &key(k)).unwrap()).as_ref(), Some(v), "{k}");
    }
    w.commit().unwrap();
    let r = backend.begin_read().unwrap();
    for (k, v) in &expect {
        assert_eq!(owned(r.get(t, &key(k)).unwrap()).as_ref(), Some(v), "{k}");
    }
    drop(r);

    // Held, then read by a range in the same transaction.
    let mut w = backend.begin_write().unwrap();
    w.insert_or_refresh(t, &key("old"), &valued(1), refresh(1000, 1000))
        .unwrap();
    w.insert_or_refresh(t, &key("zz-new"), &valued(7), refresh(1000, 1000))
        .unwrap();
    let seen: Vec<(Vec<u8>, Vec<u8>)> = scan(&*w, t, PREFIX, Direction::Forward)
        .into_iter()
        .filter(|(k, _)| k == &key("old") || k == &key("zz-new"))
        .collect();
    assert_eq!(
        seen,
        [(key("old"), valued(1000)), (key("zz-new"), valued(7))]
    );
    // An insert of a key held as a refresh: it exists.
    assert!(!w.insert(t, &key("zz-new"), b"other").unwrap());
    w.commit().unwrap();

    // Refreshes that are not required (a re-put's), several in one
    // transaction (PostgreSQL sends them as one statement): the same
    // outcome when no other writer holds the rows.
    let lazy = |below, stamp| Refresh {
        required: false,
        ..refresh(below, stamp)
    };
    let mut w = backend.begin_write().unwrap();
    for k in ["old", "recent", "fresh-1", "fresh-2"] {
        w.insert_or_refresh(t, &key(k), &valued(5000), lazy(950, 2000))
            .unwrap();
    }
    w.commit().unwrap();
    let r = backend.begin_read().unwrap();
    // "old" was refreshed to 1000 above: below 950 it is not; "recent"
    // (500) is.
    for (k, v) in [
        ("old", valued(1000)),
        ("recent", valued(2000)),
        ("fresh-1", valued(5000)),
        ("fresh-2", valued(5000)),
    ] {
        assert_eq!(owned(r.get(t, &key(k)).unwrap()).as_ref(), Some(&v), "{k}");
    }
    drop(r);

    // Puts, removes and refreshes of neighbouring keys in one commit
    // (PostgreSQL sends each run of one kind as one statement, in key
    // order): each key ends as its own write left it.
    let mut w = backend.begin_write().unwrap();
    w.put(t, &key("mix-a"), &valued(1)).unwrap();
    w.insert_or_refresh(t, &key("mix-b"), &valued(2), refresh(3000, 3000))
        .unwrap();
    w.insert_or_refresh(t, &key("old"), &valued(9), refresh(3000, 3000))
        .unwrap();
    w.put(t, &key("mix-c"), &valued(4)).unwrap();
    w.remove(t, &key("fresh-1")).unwrap();
    w.remove(t, &key("fresh-2")).unwrap();
    w.put(t, &key("mix-d"), &valued(5)).unwrap();
    w.commit().unwrap();
    let r = backend.begin_read().unwrap();
    for (k, v) in [
        ("mix-a", Some(valued(1))),
        ("mix-b", Some(valued(2))),
        ("old", Some(valued(3000))),
        ("mix-c", Some(valued(4))),
        ("fresh-1", None),
        ("fresh-2", None),
        ("mix-d", Some(valued(5))),
    ] {
        assert_eq!(owned(r.get(t, &key(k)).unwrap()), v, "{k}");
    }
}

/// More than the PostgreSQL backend holds back before sending early
/// (4 MiB of SQL): committed whole, or, dropped, not at all.
fn a_large_transaction_commits_whole_or_not_at_all(b: TestBackend) {
    let store = b.fast();
    let backend = Store::backend(&store);
    let value = vec![0xab_u8; 16 * 1024];
    let keys: Vec<Vec<u8>> = (0..400).map(|i| key(&format!("big{i:04}"))).collect();
    let mut w = backend.begin_write().unwrap();
    for k in &keys {
        w.put(Table::Pins, k, &value).unwrap();
    }
    drop(w);
    let r = backend.begin_read().unwrap();
    assert!(scan(&*r, Table::Pins, PREFIX, Direction::Forward).is_empty());
    drop(r);

    let mut w = backend.begin_write().unwrap();
    for k in &keys {
        w.put(Table::Pins, k, &value).unwrap();
    }
    w.remove(Table::Pins, &keys[0]).unwrap();
    w.commit().unwrap();
    let r = backend.begin_read().unwrap();
    let stored = scan(&*r, Table::Pins, PREFIX, Direction::Forward);
    assert_eq!(stored.len(), keys.len() - 1);
    assert!(stored.iter().all(|(_, v)| *v == value));
    assert_eq!(stored[0].0, keys[1]);
}

/// Values of very different sizes written together, by puts and by
/// inserts-or-refreshes, each come back whole and only its own bytes
/// (PostgreSQL sends a run's values as one `bytea` cut by starts and
/// lengths: an offset off by one would shift every later value).
fn a_run_of_values_of_every_size_comes_back_byte_for_byte(b: TestBackend) {
    let store = b.fast();
    let backend = Store::backend(&store);
    let sizes = [0usize, 1, 2, 7, 255, 1, 0, 4096, 70_000, 3, 0, 33];
    let value = |i: usize, n: usize| -> Vec<u8> {
        (0..n).map(|j| (i * 31 + j * 7 + j / 256) as u8).collect()
    };
    let mut w = backend.begin_write().unwrap();
    for (i, &n) in sizes.iter().enumerate() {
        w.put(Table::Pins, &key(&format!("run{i:02}")), &value(i, n))
            .unwrap();
        w.insert_or_refresh(
            Table::Blobs,
            &key(&format!("run{i:02}")),
            &value(i + 100, n),
            refresh(0, 0),
        )
        .unwrap();
    }
    w.commit().unwrap();
    let r = backend.begin_read().unwrap();
    for (i, &n) in sizes.iter().enumerate() {
        let k = key(&format!("run{i:02}"));
        assert_eq!(
            owned(r.get(Table::Pins, &k).unwrap()),
            Some(value(i, n)),
            "put {i} of {n} bytes"
        );
        assert_eq!(
            owned(r.get(Table::Blobs, &k).unwrap()),
            Some(value(i + 100, n)),
            "insert {i} of {n} bytes"
        );
    }
}

conformance!(
    a_write_transaction_reads_its_own_writes,
    insert_or_refresh_inserts_or_moves_the_field_forward,
    a_large_transaction_commits_whole_or_not_at_all,
    a_run_of_values_of_every_size_comes_back_byte_for_byte,
);

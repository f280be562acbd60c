//! Bench `blobs`: content-blob put and get through the store vs raw heed on
//! the same bytes, keys and batch sizes. Goal (SPEC §9): each ≥ 0.5× raw.
//!
//! Run: `cargo bench --bench blobs` (set `UWF_BENCH_N` to change the count).

mod common;

use common::{Comparison, Rng, raw_env, report, scratch_dir, time};
use heed::types::Bytes;
use uwf_db::{Blob, Durability, Store, StoreOptions};

fn texts(n: usize) -> Vec<String> {
    // A few hundred bytes each, all distinct.
    (0..n)
        .map(|i| {
            format!(
                "reply {i}: {}",
                "The reviewer approved the change after the tests passed. ".repeat(5)
            )
        })
        .collect()
}

fn store_put(texts: &[String], batch: usize, durability: Durability) -> std::time::Duration {
    let dir = scratch_dir("blobs-store");
    let store = Store::open(
        dir.path(),
        StoreOptions {
            durability,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    time(|| {
        for chunk in texts.chunks(batch) {
            store
                .write(|w| {
                    for t in chunk {
                        w.put_blob(&Blob::content(t.as_str(), []))?;
                    }
                    Ok::<_, uwf_db::StoreError>(())
                })
                .unwrap();
        }
    })
}

fn raw_put(pairs: &[([u8; 32], Vec<u8>)], batch: usize, durable: bool) -> std::time::Duration {
    let dir = scratch_dir("blobs-raw");
    let env = raw_env(dir.path(), durable);
    let mut w = env.write_txn().unwrap();
    let db: heed::Database<Bytes, Bytes> = env.create_database(&mut w, Some("blobs")).unwrap();
    w.commit().unwrap();
    time(|| {
        for chunk in pairs.chunks(batch) {
            let mut w = env.write_txn().unwrap();
            for (k, v) in chunk {
                db.put(&mut w, k, v).unwrap();
            }
            w.commit().unwrap();
        }
    })
}

fn main() {
    let n: usize = std::env::var("UWF_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let reps = 5;
    let texts = texts(n);
    let pairs: Vec<([u8; 32], Vec<u8>)> = texts
        .iter()
        .map(|t| {
            let e = Blob::content(t.as_str(), []).encode().unwrap();
            (*e.hash().as_bytes(), e.bytes().to_vec())
        })
        .collect();
    let avg = pairs.iter().map(|p| p.1.len()).sum::<usize>() / n;
    println!("{n} content blobs, {avg} bytes each on average");

    let mut rows = Vec::new();
    for (batch, durability) in [
        (1000, Durability::None),
        (1000, Durability::Sync),
        (10_000, Durability::Sync),
    ] {
        let durable = durability == Durability::Sync;
        rows.push(Comparison::run(
            &format!("put, batch {batch}, durability {durability}"),
            n as u64,
            reps,
            || store_put(&texts, batch, durability),
            || raw_put(&pairs, batch, durable),
        ));
    }

    // Gets: one store and one raw env holding the same blobs.
    let sdir = scratch_dir("blobs-get-store");
    let store = Store::open(
        sdir.path(),
        StoreOptions {
            durability: Durability::None,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let hashes: Vec<uwf_db::Hash> = store
        .write(|w| {
            texts
                .iter()
                .map(|t| w.put_blob(&Blob::content(t.as_str(), [])))
                .collect::<Result<Vec<_>, _>>()
        })
        .unwrap();
    let rdir = scratch_dir("blobs-get-raw");
    let env = raw_env(rdir.path(), false);
    let mut w = env.write_txn().unwrap();
    let db: heed::Database<Bytes, Bytes> = env.create_database(&mut w, Some("blobs")).unwrap();
    for (k, v) in &pairs {
        db.put(&mut w, k, v).unwrap();
    }
    w.commit().unwrap();
    let mut order: Vec<usize> = (0..n).collect();
    Rng::new(42).shuffle(&mut order);

    rows.push(Comparison::run(
        "get + decode, 1000 per read txn",
        n as u64,
        reps,
        || {
            time(|| {
                for chunk in order.chunks(1000) {
                    store
                        .read(|r| {
                            for &i in chunk {
                                let b = r.get_blob(&hashes[i])?.expect("stored");
                                std::hint::black_box(b);
                            }
                            Ok::<_, uwf_db::StoreError>(())
                        })
                        .unwrap();
                }
            })
        },
        || {
            time(|| {
                for chunk in order.chunks(1000) {
                    let r = env.read_txn().unwrap();
                    for &i in chunk {
                        let v = db.get(&r, &pairs[i].0).unwrap().expect("stored");
                        std::hint::black_box(v);
                    }
                }
            })
        },
    ));
    rows.push(Comparison::run(
        "get + decode, one read txn each",
        n as u64,
        reps,
        || {
            time(|| {
                for &i in &order {
                    std::hint::black_box(store.get(&hashes[i]).unwrap().expect("stored"));
                }
            })
        },
        || {
            time(|| {
                for &i in &order {
                    let r = env.read_txn().unwrap();
                    let v = db.get(&r, &pairs[i].0).unwrap().expect("stored").to_vec();
                    std::hint::black_box(v);
                }
            })
        },
    ));
    report(
        "blobs: store vs raw heed",
        "put and get each ≥ 0.5× raw heed",
        &rows,
    );
}

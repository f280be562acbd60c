//! Bench `gc` (SPEC §9), each against a baseline in the same run:
//! - a full collection with nothing to collect over about 1 M blobs (1,000
//!   threads of 500 steps) vs one raw heed cursor pass over a copy of the
//!   same `blobs` database (goal: within 3×, ratio ≥ 0.33);
//! - the same collection on 2 worker threads vs 1 (goal ≥ 1.6×);
//! - a collection that frees 10% of the blobs (100 removed threads), vs the
//!   raw cursor pass (reported).
//!
//! Run: `cargo bench --bench gc`. `UWF_BENCH_SCALE=0.1` shrinks it.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{
    Comparison, placeholder_workflow, raw_env, report, scale, scratch_dir, start_thread, time,
};
use heed::types::Bytes;
use uwf_db::gc::{GcOptions, GcReport};
use uwf_db::thread::{Next, StepWrite, ThreadId};
use uwf_db::{Durability, Store, StoreOptions, Value};

const THREADS: usize = 1000;
const STEPS: usize = 500;

/// `threads` threads of `STEPS` steps, each step with a unique reply (so
/// about two blobs per step: the state node and its reply).
fn build(store: &Store, threads: usize) -> Vec<ThreadId> {
    let wf = placeholder_workflow(store, "bench");
    let mut ids = Vec::new();
    for t in 0..threads {
        let rec = start_thread(store, wf, "bench", format!("task {t}"), "dev");
        let mut head = rec.head;
        for i in 0..STEPS {
            let step = StepWrite {
                role: "dev".into(),
                meta: BTreeMap::from([("$status".to_owned(), Value::Str("again".into()))]),
                reply: format!("thread {t}, step {i}: changed the code and ran the tests"),
                artifacts: vec![],
                instruction: "Implement the change".into(),
                child_thread: None,
            };
            let next = Next::Role {
                role: "dev".into(),
                instruction: "Implement the change".into(),
                location: None,
            };
            head = store
                .threads()
                .low_level()
                .append_step(rec.id, head, step, next)
                .unwrap()
                .record
                .head;
        }
        ids.push(rec.id);
    }
    ids
}

fn collect(store: &Store, threads: usize) -> GcReport {
    uwf_db::gc::collect_garbage(
        store,
        &GcOptions {
            grace: Duration::ZERO,
            dry_run: false,
            threads: Some(threads),
        },
        &|_| {},
    )
    .unwrap()
}

fn main() {
    let dir = scratch_dir("gc");
    let store = Store::open(
        dir.path(),
        StoreOptions {
            durability: Durability::None,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let t = Instant::now();
    let ids = build(&store, scale(THREADS, 10));
    let blobs = store.stats().unwrap().blob_count;
    eprintln!("built {blobs} blobs in {:.1} s", t.elapsed().as_secs_f64());

    // The baseline reads a copy of the same file with raw heed (this process
    // already has the store's environment open).
    let raw_dir = scratch_dir("gc-raw");
    std::fs::copy(dir.path().join("data.mdb"), raw_dir.path().join("data.mdb")).unwrap();
    let env = raw_env(raw_dir.path(), false);
    let rtxn = env.read_txn().unwrap();
    let raw_blobs = env
        .open_database::<Bytes, Bytes>(&rtxn, Some("blobs"))
        .unwrap()
        .unwrap();
    // Committing makes the handle usable in later transactions.
    rtxn.commit().unwrap();
    let raw_pass = || {
        time(|| {
            let rtxn = env.read_txn().unwrap();
            let mut n = 0u64;
            let mut bytes = 0usize;
            for entry in raw_blobs.iter(&rtxn).unwrap() {
                let (k, v) = entry.unwrap();
                n += 1;
                bytes += k.len() + v.len();
            }
            assert_eq!(n, blobs);
            std::hint::black_box(bytes);
        })
    };

    // Let the clock pass the last write (with no grace period nothing is
    // young), outside the timed part.
    let timed_gc = |threads: usize| {
        std::thread::sleep(Duration::from_millis(2));
        let mut r = None;
        let d = time(|| r = Some(collect(&store, threads)));
        (d, r.unwrap())
    };
    let mut rows = Vec::new();
    rows.push(Comparison::run(
        "full GC, nothing to collect, 2 workers, vs one raw cursor pass (ops = blobs)",
        blobs,
        5,
        || {
            let (d, r) = timed_gc(2);
            assert_eq!(r.swept, 0);
            d
        },
        raw_pass,
    ));
    rows.push(Comparison::run(
        "full GC, nothing to collect, 2 workers vs 1 worker (ops = blobs)",
        blobs,
        5,
        || timed_gc(2).0,
        || timed_gc(1).0,
    ));

    // Garbage: remove a tenth of the threads and collect once.
    for id in ids.iter().step_by(10) {
        store.threads().remove(*id).unwrap();
    }
    let (d, freed) = timed_gc(2);
    rows.push(Comparison {
        name: format!(
            "full GC sweeping {} of {} blobs, 2 workers, vs one raw cursor pass (ops = blobs)",
            freed.swept, freed.blobs
        ),
        ops: blobs,
        subject: d,
        baseline: raw_pass(),
    });

    report(
        "gc: full collection vs a raw cursor pass; 2 workers vs 1",
        "within 3× one raw cursor pass (ratio ≥ 0.33); 2 workers ≥ 1.6× faster than 1",
        &rows,
    );
    println!("\nTypeScript implementation, for context: 45,000 blobs in 9.7 s (4,639 blobs/s).");
}

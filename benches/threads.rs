//! Bench `threads` (SPEC §9), each against a baseline in the same run:
//! - durable `append_step`, one step per transaction, vs a raw durable heed
//!   transaction writing the same bytes (goal ≥ 0.8×);
//! - the newest 50 steps of a 10,000-step thread vs 50 raw heed gets of the
//!   same keys (goal ≥ 0.5×);
//! - fork of a 10-step vs a 100,000-step thread (goal within 1.2×: O(1));
//! - first page of 50 from `list_threads` with 100,000 active threads vs 50
//!   raw gets (reported);
//! - the first page of 50 filtered by one label and by two labels
//!   (`team=a`: 1 thread in 4; `team=a` and `kind=review`: 1 in 12) vs the
//!   unfiltered first page of the same store (goal: the same order of
//!   time, ratio ≥ 0.1).
//!
//! Run: `cargo bench --bench threads`. `UWF_BENCH_SCALE=0.1` shrinks it.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{
    Comparison, placeholder_workflow, raw_env, report, scale, scratch_dir, start_thread, step_puts,
    time,
};
use heed::types::Bytes;
use uwf_db::thread::{NewThread, Next, StepWrite, ThreadId, ThreadQuery};
use uwf_db::{Blob, Durability, Hash, Store, StoreError, StoreOptions, Value, WorkflowNode};

fn open(dir: &std::path::Path, durability: Durability) -> Store {
    Store::open(
        dir,
        StoreOptions {
            durability,
            ..StoreOptions::default()
        },
    )
    .unwrap()
}

fn start(store: &Store, name: &str) -> uwf_db::thread::ThreadRecord {
    let wf = placeholder_workflow(store, name);
    start_thread(
        store,
        wf,
        name,
        "Implement the change described in the issue".into(),
        "developer",
    )
}

fn step(i: usize) -> StepWrite {
    StepWrite {
        role: "developer".into(),
        meta: BTreeMap::from([("$status".to_owned(), Value::Str("review_needed".into()))]),
        reply: format!(
            "Step {i}: implemented the change, added tests, and updated the documentation."
        ),
        artifacts: vec![],
        instruction: format!("Review round {i}: address the comments"),
        child_thread: None,
    }
}

fn next() -> Next {
    Next::Role {
        role: "reviewer".into(),
        instruction: "Review the change".into(),
        location: None,
    }
}

/// Appends `n` steps (one transaction each).
fn grow(store: &Store, id: ThreadId, mut head: Hash, n: usize) -> Hash {
    for i in 0..n {
        head = store
            .threads()
            .low_level()
            .append_step(id, head, step(i), next())
            .unwrap()
            .record
            .head;
    }
    head
}

fn append_bench(n: usize) -> Comparison {
    // The bytes a step writes, for the raw side: reply and instruction
    // content blobs, a state node of the same shape, and a record-sized value.
    let steps: Vec<Vec<(Vec<u8>, Vec<u8>)>> = (0..n)
        .map(|i| {
            let prev = Hash::of(&(i as u64).to_be_bytes());
            step_puts(&step(i), i, prev, vec![7u8; 16])
        })
        .collect();
    Comparison::run(
        "durable append_step, one step per txn",
        n as u64,
        3,
        || {
            let dir = scratch_dir("append-store");
            let store = open(dir.path(), Durability::Sync);
            let t = start(&store, "review");
            time(|| {
                grow(&store, t.id, t.head, n);
            })
        },
        || {
            let dir = scratch_dir("append-raw");
            let env = raw_env(dir.path(), true);
            let mut w = env.write_txn().unwrap();
            let blobs: heed::Database<Bytes, Bytes> =
                env.create_database(&mut w, Some("blobs")).unwrap();
            let threads: heed::Database<Bytes, Bytes> =
                env.create_database(&mut w, Some("threads")).unwrap();
            w.commit().unwrap();
            time(|| {
                for puts in &steps {
                    let mut w = env.write_txn().unwrap();
                    for (k, v) in &puts[..3] {
                        blobs.put(&mut w, k, v).unwrap();
                    }
                    threads.put(&mut w, &puts[3].0, &puts[3].1).unwrap();
                    w.commit().unwrap();
                }
            })
        },
    )
}

/// A store of `n` idle threads of two workflows (alternating), labelled
/// `team` (a–d) and `kind` (review, plan, bug) when `labelled`; its
/// directory, the store and the ids in creation order.
fn list_store(name: &str, n: usize, labelled: bool) -> (tempfile::TempDir, Store, Vec<ThreadId>) {
    let dir = scratch_dir(name);
    let store = open(dir.path(), Durability::None);
    let wf = store
        .put(&Blob::Workflow(WorkflowNode {
            definition: Value::Str("wf".into()),
        }))
        .unwrap();
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let labels = if labelled {
            [
                ("team".to_owned(), ["a", "b", "c", "d"][i % 4].to_owned()),
                (
                    "kind".to_owned(),
                    ["review", "plan", "bug"][i % 3].to_owned(),
                ),
            ]
            .into()
        } else {
            Default::default()
        };
        let r = store
            .threads()
            .low_level()
            .start_thread(NewThread {
                workflow: if i % 2 == 0 { "review" } else { "plan" }.into(),
                workflow_hash: wf,
                prompt: format!("task {i}"),
                max_rounds: 100,
                depth: 0,
                parent_state: None,
                parent_thread: None,
                next_role: "developer".into(),
                next_instruction: "Implement".into(),
                agent: None,
                cwd: None,
                next_location: None,
                labels,
            })
            .unwrap();
        ids.push(r.id);
    }
    (dir, store, ids)
}

fn main() {
    let mut rows = Vec::new();
    let mut context = Vec::new();

    rows.push(append_bench(scale(2000, 10)));

    // History fetch: newest 50 steps of a 10,000-step thread.
    let steps = scale(10_000, 10);
    let dir = scratch_dir("log-store");
    let store = open(dir.path(), Durability::None);
    let t = start(&store, "long");
    grow(&store, t.id, t.head, steps);
    let page = store.threads().log(t.id, 50, None).unwrap();
    let keys: Vec<Hash> = page.iter().map(|e| e.hash).collect();
    let rdir = scratch_dir("log-raw");
    let env = raw_env(rdir.path(), false);
    let mut w = env.write_txn().unwrap();
    let raw_blobs: heed::Database<Bytes, Bytes> =
        env.create_database(&mut w, Some("blobs")).unwrap();
    store
        .walk(&t.head, |b| {
            raw_blobs.put(&mut w, b.hash.as_bytes(), &b.bytes).unwrap();
            Ok::<_, StoreError>(())
        })
        .unwrap();
    w.commit().unwrap();
    let fetches = 2000;
    let raw_gets = || {
        time(|| {
            for _ in 0..fetches {
                let r = env.read_txn().unwrap();
                for k in &keys {
                    std::hint::black_box(raw_blobs.get(&r, k.as_bytes()).unwrap());
                }
            }
        })
    };
    let decoded = Comparison::run(
        "newest 50 steps decoded (thread_log) vs fresh raw env",
        fetches,
        5,
        || {
            time(|| {
                for _ in 0..fetches {
                    std::hint::black_box(store.threads().log(t.id, 50, None).unwrap());
                }
            })
        },
        raw_gets,
    );
    let visit = || {
        time(|| {
            for _ in 0..fetches {
                let n = store
                    .threads()
                    .visit_log(t.id, 50, None, |h, bytes| {
                        std::hint::black_box((h, bytes));
                        Ok::<_, uwf_db::thread::ThreadError>(())
                    })
                    .unwrap();
                assert_eq!(n, 50);
            }
        })
    };
    // Like for like: heed gets of the same 50 keys in the same environment
    // (same file, same page layout), one read transaction per fetch.
    let log = Comparison::run(
        "newest 50 steps (visit_log) vs 50 heed gets, same env",
        fetches,
        5,
        visit,
        || {
            time(|| {
                for _ in 0..fetches {
                    store
                        .read(|r| {
                            for k in &keys {
                                std::hint::black_box(r.contains(k)?);
                            }
                            Ok::<_, StoreError>(())
                        })
                        .unwrap();
                }
            })
        },
    );
    let log_fresh = Comparison::run(
        "newest 50 steps (visit_log) vs 50 gets in a freshly built raw env",
        fetches,
        5,
        visit,
        raw_gets,
    );
    context.push((
        "fetch newest 50 (TypeScript: 18 ms)",
        log.subject / fetches as u32,
        18.0,
    ));
    context.push((
        "fetch and decode newest 50",
        decoded.subject / fetches as u32,
        18.0,
    ));
    rows.push(log);
    rows.push(log_fresh);
    rows.push(decoded);

    // Fork: O(1) in the thread's length.
    let fdir = scratch_dir("fork-store");
    let fstore = open(fdir.path(), Durability::None);
    let short = start(&fstore, "short");
    let short_head = grow(&fstore, short.id, short.head, 10);
    let long = start(&fstore, "long");
    let long_head = grow(&fstore, long.id, long.head, scale(100_000, 10));
    let forks = 2000;
    let fork_state = || Next::Role {
        role: "developer".into(),
        instruction: "again".into(),
        location: None,
    };
    let fork = Comparison::run(
        "fork a 100,000-step thread (baseline: a 10-step one)",
        forks,
        5,
        || {
            time(|| {
                for _ in 0..forks {
                    fstore
                        .threads()
                        .low_level()
                        .fork_thread(long.id, long_head, fork_state())
                        .unwrap();
                }
            })
        },
        || {
            time(|| {
                for _ in 0..forks {
                    fstore
                        .threads()
                        .low_level()
                        .fork_thread(short.id, short_head, fork_state())
                        .unwrap();
                }
            })
        },
    );
    context.push((
        "fork (TypeScript: 54 ms)",
        fork.subject / forks as u32,
        54.0,
    ));
    rows.push(fork);

    // List: first page of 50 with 100,000 active threads (unlabelled, as
    // before labels existed).
    let n_threads = scale(100_000, 10);
    let (_ldir, lstore, ids) = list_store("list-store", n_threads, false);
    let l_raw_dir = scratch_dir("list-raw");
    let lenv = raw_env(l_raw_dir.path(), false);
    let mut w = lenv.write_txn().unwrap();
    let raw_threads: heed::Database<Bytes, Bytes> =
        lenv.create_database(&mut w, Some("threads")).unwrap();
    let sample = vec![0u8; 330];
    for id in &ids {
        raw_threads.put(&mut w, &id.to_bytes(), &sample).unwrap();
    }
    w.commit().unwrap();
    let newest: Vec<[u8; 16]> = ids.iter().rev().take(50).map(|i| i.to_bytes()).collect();
    let lists = 2000;
    let q = ThreadQuery {
        limit: 50,
        ..ThreadQuery::default()
    };
    // `lists` first pages of `query`, timed.
    let pages = |store: &Store, query: &ThreadQuery| {
        time(|| {
            for _ in 0..lists {
                let page = store.threads().list(query).unwrap();
                assert_eq!(page.len(), 50);
                std::hint::black_box(page);
            }
        })
    };
    let list = Comparison::run(
        "first page of 50 of 100,000 active threads",
        lists,
        5,
        || pages(&lstore, &q),
        || {
            time(|| {
                for _ in 0..lists {
                    let r = lenv.read_txn().unwrap();
                    for k in &newest {
                        std::hint::black_box(raw_threads.get(&r, k).unwrap());
                    }
                }
            })
        },
    );
    context.push((
        "list first 50 (TypeScript: 101 ms for 400)",
        list.subject / lists as u32,
        101.0,
    ));
    rows.push(list);

    // Labels: a filtered first page vs the unfiltered one, in a store of
    // as many threads, each labelled team (4 values) and kind (3 values).
    let (_labelled_dir, labelled, _) = list_store("labelled-store", n_threads, true);
    for (what, labels) in [
        ("first page of 50 labelled team=a", vec![("team", "a")]),
        (
            "first page of 50 labelled team=a and kind=review",
            vec![("team", "a"), ("kind", "review")],
        ),
    ] {
        let filtered = ThreadQuery {
            limit: 50,
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..ThreadQuery::default()
        };
        let row = Comparison::run(
            what,
            lists,
            5,
            || pages(&labelled, &filtered),
            || pages(&labelled, &q),
        );
        rows.push(row);
    }

    report(
        "threads: store vs raw heed",
        "append ≥ 0.8×; newest-50 fetch ≥ 0.5×; fork within 1.2× (ratio ≥ 0.83); list reported; labelled pages vs the unfiltered page ≥ 0.1×",
        &rows,
    );
    println!("\n| operation | uwf-db per op | TypeScript reference | factor |");
    println!("|---|---:|---:|---:|");
    for (what, per_op, ts_ms) in context {
        println!(
            "| {what} | {:.1} µs | {ts_ms} ms | {:.0}× |",
            per_op.as_secs_f64() * 1e6,
            ts_ms / 1000.0 / per_op.as_secs_f64()
        );
    }
    let _: Duration = Duration::ZERO;
}

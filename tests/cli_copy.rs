//! `uwf-db copy SRC DST` through the real binary (`docs/design.md` §4c):
//! LMDB → PostgreSQL → LMDB with every table identical byte for byte
//! (read with heed, not through the store) and `verify` clean on each;
//! a copy killed with `kill -9` midway, marked unfinished, and finished by
//! a rerun with the same result; and the stores a copy refuses.
#![cfg(feature = "cli")]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::backend::TestBackend;
use common::cli::*;
use uwf_db::backend::Table;
use uwf_db::store::{COPY_MARKER_KEY, GC_EPOCH_KEY};
use uwf_db::{Blob, Store, StoreOptions};

/// Every table of an LMDB store: name → key → value.
type Dump = BTreeMap<&'static str, BTreeMap<Vec<u8>, Vec<u8>>>;

/// Reads every table of the LMDB store in `dir` with heed, beside the
/// store code. No store handle of `dir` may be open in this process.
fn lmdb_dump(dir: &Path) -> Dump {
    // SAFETY (test): no other handle of this environment is open in this
    // process while this one is.
    #[allow(unsafe_code)]
    let env = unsafe {
        heed::EnvOpenOptions::new()
            .max_dbs(16)
            .map_size(1 << 30)
            .open(dir)
            .unwrap()
    };
    let rtxn = env.read_txn().unwrap();
    let mut dump = Dump::new();
    // A store of the checksummed layout (its version value is 8 bytes)
    // ends every value with a trailer (`docs/design.md` §4, "Value
    // checksums"): checked here by a second implementation, and stripped.
    let meta: heed::Database<heed::types::Bytes, heed::types::Bytes> =
        env.open_database(&rtxn, Some("meta")).unwrap().unwrap();
    let checksums = meta
        .get(&rtxn, b"format_version")
        .unwrap()
        .is_some_and(|v| v.len() == 8);
    let strip = |table: Table, k: &[u8], v: &[u8]| -> Vec<u8> {
        if !checksums {
            return v.to_vec();
        }
        use xxhash_rust::xxh3::xxh3_64_with_seed;
        let (value, trailer) = v.split_at(v.len() - 4);
        let covered = if table == Table::Blobs {
            let n = u32::from_be_bytes(value[18..22].try_into().unwrap()) as usize;
            &value[..22 + 32 * n]
        } else {
            value
        };
        let seed = xxh3_64_with_seed(k, table.index() as u64);
        let sum = (xxh3_64_with_seed(covered, seed) as u32).to_le_bytes();
        assert_eq!(trailer, sum, "the trailer of {table} key {k:?}");
        value.to_vec()
    };
    for table in Table::ALL {
        let db: heed::Database<heed::types::Bytes, heed::types::Bytes> = env
            .open_database(&rtxn, Some(table.name()))
            .unwrap()
            .unwrap_or_else(|| panic!("no {table} database in {}", dir.display()));
        let rows = db
            .iter(&rtxn)
            .unwrap()
            .map(|r| {
                let (k, v) = r.unwrap();
                (k.to_vec(), strip(table, k, v))
            })
            .collect();
        dump.insert(table.name(), rows);
    }
    drop(rtxn);
    env.prepare_for_closing().wait();
    dump
}

/// The digest `copy` reports for a table, computed here from the bytes as
/// `docs/design.md` §4c defines it (in `meta`, without the keys a copy
/// does not move).
fn digest(table: &str, rows: &BTreeMap<Vec<u8>, Vec<u8>>) -> (u64, String) {
    let mut hasher = blake3::Hasher::new();
    let mut n = 0;
    for (k, v) in rows {
        if table == "meta"
            && [GC_EPOCH_KEY, COPY_MARKER_KEY].contains(&&*String::from_utf8_lossy(k))
        {
            continue;
        }
        for part in [k, v] {
            hasher.update(&(part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        n += 1;
    }
    (n, hasher.finalize().to_hex().to_string())
}

/// The rows and digests of a `copy --json` report, by table.
fn reported(report: &serde_json::Value) -> BTreeMap<String, (u64, String)> {
    report["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["table"].as_str().unwrap().to_owned(),
                (
                    t["rows"].as_u64().unwrap(),
                    t["digest"].as_str().unwrap().to_owned(),
                ),
            )
        })
        .collect()
}

fn digests_of(dump: &Dump) -> BTreeMap<String, (u64, String)> {
    dump.iter()
        .map(|(t, rows)| ((*t).to_owned(), digest(t, rows)))
        .collect()
}

/// Threads in every state, through the CLI: completed (history), a parent
/// with its finished child, a parent suspended by its suspended child,
/// idle, a fork, cancelled; three workflows; a pinned blob.
fn build_store(cli: &Cli) {
    cli.json(&["workflow", "add", "examples/review.yaml"]);
    cli.json(&["workflow", "add", "examples/planner.yaml"]);
    let run = |workflow: &str, prompt: &str, scenario: &str| {
        let r = cli.json(&[
            "run",
            workflow,
            "-p",
            prompt,
            "--agent",
            &format!("script:{scenario}"),
        ]);
        r["thread"].as_str().unwrap().to_owned()
    };
    let done = run(
        "examples/review.yaml",
        "Add a flag",
        "examples/review.scenario.yaml",
    );
    run(
        "examples/ship.yaml",
        "Ship it",
        "examples/ship.scenario.yaml",
    );
    run(
        "tests/fixtures/plan-and-build.yaml",
        "Export",
        "tests/fixtures/plan-and-build.scenario.yaml",
    );
    cli.json(&["thread", "start", "review", "-p", "Later"]);
    cli.json(&["thread", "fork", &done, "--from-role", "reviewer"]);
    let never = cli.json(&["thread", "start", "review", "-p", "Never"]);
    let o = cli.uwf(&["thread", "cancel", never["thread"].as_str().unwrap()]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let o = cli.uwf_stdin(&["cas", "put", "-"], b"pinned by hand");
    let pinned = stdout(&o).trim().to_owned();
    let o = cli.uwf(&["cas", "pin", &pinned]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
}

/// What the engine reads from a store: every thread's record and log, the
/// workflows and the pins.
fn engine_view(cli: &Cli) -> serde_json::Value {
    let list = cli.json(&["thread", "list", "--limit", "1000"]);
    let mut threads = Vec::new();
    for t in list.as_array().unwrap() {
        let id = t["thread"].as_str().unwrap();
        threads.push(serde_json::json!({"show": cli.show(id), "log": cli.log(id)}));
    }
    assert!(threads.len() >= 8, "{list}");
    serde_json::json!({
        "list": list,
        "threads": threads,
        "workflows": cli.json(&["workflow", "list"]),
        "pins": cli.json(&["cas", "pins"]),
    })
}

/// `uwf-db --json copy SRC DST`, which must succeed.
fn copy(from: &Cli, to: &Cli, extra: &[&str]) -> serde_json::Value {
    let (src, dst) = (from.location().arg_str(), to.location().arg_str());
    let mut args = vec!["copy", src.as_str(), dst.as_str()];
    args.extend_from_slice(extra);
    from.json(&args)
}

#[cfg(feature = "postgres")]
#[test]
fn lmdb_to_postgres_to_lmdb_gives_identical_tables_and_clean_stores() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let a = Cli::new(TestBackend::Lmdb);
    build_store(&a);
    let pg = Cli::new(TestBackend::Postgres);
    let b = Cli::new(TestBackend::Lmdb);
    let there = copy(&a, &pg, &[]);
    let back = copy(&pg, &b, &[]);

    let original = lmdb_dump(a.location().lmdb_dir());
    assert_eq!(
        lmdb_dump(b.location().lmdb_dir()),
        original,
        "every blob, thread record, history entry and index entry"
    );
    assert!(original["history"].len() >= 4, "ended threads");
    assert!(original["children"].len() >= 2, "child workflows");
    // The digests both copies compared are those of these bytes.
    let digests = digests_of(&original);
    for report in [&there, &back] {
        assert_eq!(reported(report), digests);
        assert_eq!(report["resumed"], false);
        assert_eq!(report["verify"]["problems"], serde_json::json!([]));
    }
    assert_eq!(there["destination"], pg.location().arg_str());
    for store in [&a, &pg, &b] {
        store.verify_clean();
        assert_eq!(
            store.json(&["stats"])["unfinished_copy"],
            serde_json::Value::Null
        );
    }
    // The engine, on PostgreSQL and on the copy of the copy, reads what it
    // wrote on LMDB.
    let view = engine_view(&a);
    assert_eq!(engine_view(&pg), view);
    assert_eq!(engine_view(&b), view);
}

/// Loose blobs added to the source, so that a copy one row per transaction
/// takes long enough to be killed midway.
const LOOSE_BLOBS: usize = 3000;

/// Opens `cli`'s store from this process once the copy has created it.
fn open_when_created(cli: &Cli) -> Option<Store> {
    let options = StoreOptions {
        create: false,
        ..StoreOptions::default()
    };
    if !cli.location().exists() {
        return None;
    }
    Store::open_location(&cli.location().arg_str(), options).ok()
}

/// The marker's source as the binary names it: the canonical directory,
/// or the URL.
fn location_name(cli: &Cli) -> String {
    match cli.location().backend() {
        TestBackend::Lmdb => std::fs::canonicalize(cli.location().lmdb_dir())
            .unwrap()
            .display()
            .to_string(),
        _ => cli.location().arg_str(),
    }
}

/// Copies a store from `from` to `to` one row per transaction, kills the
/// copy with SIGKILL midway, checks that the destination says it is an
/// unfinished copy (and is treated as one), reruns the copy, and checks
/// the result is the source, table for table.
fn a_killed_copy_is_finished_by_a_rerun(from: TestBackend, to: TestBackend) {
    let src = Cli::new(from);
    build_store(&src);
    {
        let store = src.open_store();
        store
            .write(|w| {
                for i in 0..LOOSE_BLOBS {
                    w.put_blob(&Blob::content(format!("loose blob {i}"), []))?;
                }
                Ok::<_, uwf_db::StoreError>(())
            })
            .unwrap();
    }
    let source_blobs = src.json(&["stats"])["blob_count"].as_u64().unwrap();
    let dst = Cli::new(to);

    let (s, d) = (src.location().arg_str(), dst.location().arg_str());
    let mut child = src
        .std_cmd()
        .args(["copy", &s, &d, "--chunk-rows", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let watcher = loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the copy ended ({status}) before it could be killed");
        }
        assert!(started.elapsed() < Duration::from_secs(120), "no progress");
        if let Some(store) = open_when_created(&dst)
            && store.stats().is_ok_and(|s| s.blob_count >= 300)
        {
            break store;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert_eq!(status.code(), None, "killed by the signal, not finished");

    let stats = watcher.stats().unwrap();
    drop(watcher);
    let marker = stats.unfinished_copy.clone().expect("marked unfinished");
    assert_eq!(marker.source, location_name(&src));
    assert!(stats.blob_count < source_blobs, "{stats:?}");
    assert_eq!(
        (stats.active_threads, stats.ended_threads),
        (0, 0),
        "blobs are copied before any thread"
    );

    // Everyone sees what the destination is.
    let o = dst.uwf(&["verify"]);
    assert_eq!(code(&o), Some(1));
    assert!(stdout(&o).contains("unfinished copy of"), "{}", stdout(&o));
    let o = dst.uwf(&["gc", "--grace", "0"]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("unfinished copy"), "{}", stderr(&o));
    let o = dst.uwf(&["stats"]);
    assert!(stdout(&o).contains("UNFINISHED COPY"), "{}", stdout(&o));
    let elsewhere = Cli::new(TestBackend::Lmdb);
    let o = dst.uwf(&["copy", &d, &elsewhere.location().arg_str()]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("is an unfinished copy of"),
        "{}",
        stderr(&o)
    );

    // The rerun continues: what the killed run committed is not written
    // again, nothing is deleted, and the result is the source.
    let report = copy(&src, &dst, &[]);
    assert_eq!(report["resumed"], true);
    let rows = report["rows"].as_u64().unwrap();
    let written = report["written"].as_u64().unwrap();
    assert!(written > 0 && written + 300 <= rows, "{report}");
    assert_eq!(report["deleted"], 0);
    dst.verify_clean();
    assert_eq!(
        dst.json(&["stats"])["unfinished_copy"],
        serde_json::Value::Null
    );
    assert_eq!(engine_view(&dst), engine_view(&src));

    // Table for table, read beside the store code: the destination itself
    // when it is LMDB, else a further copy of it into LMDB.
    let witness;
    let dump = if to == TestBackend::Lmdb {
        lmdb_dump(dst.location().lmdb_dir())
    } else {
        witness = Cli::new(TestBackend::Lmdb);
        copy(&dst, &witness, &[]);
        lmdb_dump(witness.location().lmdb_dir())
    };
    assert_eq!(digests_of(&dump), reported(&report));
    if from == TestBackend::Lmdb {
        assert_eq!(dump, lmdb_dump(src.location().lmdb_dir()));
    }
}

#[test]
fn lmdb_to_lmdb_killed_midway_then_rerun() {
    a_killed_copy_is_finished_by_a_rerun(TestBackend::Lmdb, TestBackend::Lmdb);
}

#[cfg(feature = "postgres")]
#[test]
fn lmdb_to_postgres_killed_midway_then_rerun() {
    if TestBackend::Postgres.available() {
        a_killed_copy_is_finished_by_a_rerun(TestBackend::Lmdb, TestBackend::Postgres);
    }
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_to_lmdb_killed_midway_then_rerun() {
    if TestBackend::Postgres.available() {
        a_killed_copy_is_finished_by_a_rerun(TestBackend::Postgres, TestBackend::Lmdb);
    }
}

fn a_copy_refuses_what_it_cannot_copy_or_must_not_overwrite(b: TestBackend) {
    let src = Cli::new(TestBackend::Lmdb);
    src.json(&["workflow", "add", "examples/review.yaml"]);
    let s = src.location().arg_str();

    // Into an unrelated store: refused, and the store is left as it was.
    let used = Cli::new(b);
    let o = used.uwf_stdin(&["cas", "put", "-"], b"someone else's");
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let before = used.json(&["stats"]);
    let o = used.uwf(&["copy", &s, &used.location().arg_str()]);
    assert_eq!(code(&o), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("is not empty (its blobs table has rows)")
            && err.contains("copy only into a new or empty store"),
        "{err}"
    );
    let after = used.json(&["stats"]);
    assert_eq!(after["blob_count"], before["blob_count"]);
    assert_eq!(after["unfinished_copy"], serde_json::Value::Null);

    // A source that does not exist: a clear error, and no destination made.
    let nowhere = Cli::new(b);
    let missing: PathBuf = src.path("no-such-store");
    let o = nowhere.uwf(&[
        "copy",
        missing.to_str().unwrap(),
        &nowhere.location().arg_str(),
    ]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("is not a uwf-db store: there is nothing to copy"),
        "{}",
        stderr(&o)
    );
    assert!(!missing.exists());
    assert!(
        !nowhere.location().exists(),
        "the destination was not created"
    );

    // A store onto itself.
    let o = used.uwf(&[
        "copy",
        &used.location().arg_str(),
        &used.location().arg_str(),
    ]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("the same store"), "{}", stderr(&o));

    // Bad usage.
    let o = used.uwf(&["copy", &s]);
    assert_eq!(code(&o), Some(2));
    let o = used.uwf(&["copy", &s, "x", "--chunk-rows", "0"]);
    assert_eq!(code(&o), Some(2));
}

process_conformance!(a_copy_refuses_what_it_cannot_copy_or_must_not_overwrite);

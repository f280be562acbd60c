//! Damaged pages and `uwf-db salvage` (issue 10): a page of the data file
//! overwritten with garbage ends every command with a message and exit 3,
//! never a bare signal, and `salvage` copies everything still readable into
//! a new store that verifies.
#![cfg(feature = "cli")]

mod common;

use std::path::Path;
use std::process::Command;

use common::backend::TestBackend;
use common::cli::*;

const PAGE: usize = 4096;

fn uwf_at(store: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_uwf-db"))
        .arg("--store")
        .arg(store)
        .args(args)
        .env_remove("UWF_STORE")
        .current_dir(root())
        .output()
        .unwrap()
}

fn salvage(src: &Path, dst: &Path, json: bool) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_uwf-db"));
    if json {
        c.arg("--json");
    }
    c.arg("salvage")
        .arg(src)
        .arg(dst)
        .env_remove("UWF_STORE")
        .current_dir(root())
        .output()
        .unwrap()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for f in ["data.mdb", "lock.mdb"] {
        if from.join(f).exists() {
            std::fs::copy(from.join(f), to.join(f)).unwrap();
        }
    }
}

/// A store with completed threads, an idle one and a fork.
fn populated(threads: &str) -> Cli {
    let env = Cli::new(TestBackend::Lmdb).without_final_verify();
    let o = env.uwf(&[
        "batch",
        "examples/review.yaml",
        "-n",
        threads,
        "-p",
        "Add a --json flag",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let o = env.uwf(&["thread", "start", "examples/review.yaml", "-p", "left idle"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    env
}

/// Bytes that look like nothing LMDB wrote: a fixed pseudo-random stream.
fn garbage(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..PAGE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[test]
fn salvage_of_an_undamaged_store_keeps_everything() {
    let env = populated("8");
    let src = env.location().lmdb_dir().to_path_buf();
    let dst = env.path("salvaged");
    let o = salvage(&src, &dst, false);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("everything was read and kept"), "{out}");
    assert!(out.contains("9 threads kept"), "{out}");
    assert!(out.contains(": ok"), "{out}");
    // The same threads, the same histories.
    let list = |store: &Path| {
        let o = uwf_at(store, &["--json", "thread", "list", "--limit", "1000"]);
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
        json_of(&o)
    };
    assert_eq!(list(&src), list(&dst));
    let o = uwf_at(&dst, &["verify"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    // The new store is a working store: the idle thread goes on there.
    let idle = list(&dst)
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["status"] == "idle")
        .map(|t| t["thread"].as_str().unwrap().to_owned())
        .expect("the idle thread was kept");
    let o = uwf_at(
        &dst,
        &[
            "thread",
            "step",
            &idle,
            "--agent",
            "script:examples/review.scenario.yaml",
        ],
    );
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    // A second salvage into the same, now non-empty, store is refused.
    let o = salvage(&src, &dst, false);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("is not empty"), "{}", stderr(&o));
}

#[test]
fn salvage_refuses_what_it_cannot_read_or_write() {
    let env = populated("1");
    let src = env.location().lmdb_dir().to_path_buf();
    let o = salvage(&env.path("nothing-here"), &env.path("dst"), false);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("no LMDB data file at"),
        "{}",
        stderr(&o)
    );
    let o = salvage(&src, &src, false);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("the same store"), "{}", stderr(&o));
}

/// Every page but the meta pages, overwritten in turn with garbage:
/// `verify` and `thread list` end with exit 0, 1 or 3 (with the damage
/// named), never a signal; each store that `verify` calls damaged is
/// salvaged into a new store that verifies, with the loss reported.
#[test]
fn every_damaged_page_is_reported_and_salvaged() {
    let env = populated("12");
    let src = env.location().lmdb_dir().to_path_buf();
    let whole = std::fs::read(src.join("data.mdb")).unwrap();
    let pages = whole.len() / PAGE;
    assert!(pages > 10, "{pages} pages");
    let mut damaged = 0;
    let mut salvaged = 0;
    for page in 2..pages {
        let copy = env.path(&format!("copy-{page}"));
        copy_dir(&src, &copy);
        let mut bytes = whole.clone();
        bytes[page * PAGE..(page + 1) * PAGE].copy_from_slice(&garbage(page as u64));
        std::fs::write(copy.join("data.mdb"), &bytes).unwrap();
        let mut verify_code = None;
        for args in [&["verify"][..], &["thread", "list", "--limit", "1000"][..]] {
            let o = uwf_at(&copy, args);
            // `verify` reports on stdout, the others on stderr.
            let (c, err) = (code(&o), stderr(&o) + &stdout(&o));
            assert!(
                matches!(c, Some(0 | 1 | 3)),
                "page {page}, {args:?}: ended by a signal or panic ({c:?}): {err}"
            );
            if c == Some(3) {
                assert!(err.contains("is damaged"), "page {page}: {err}");
            }
            if args == ["verify"] {
                verify_code = c;
            }
        }
        if verify_code == Some(3) {
            damaged += 1;
            // Salvage a few (each costs a dozen processes).
            if salvaged < 4 {
                let dst = env.path(&format!("salvaged-{page}"));
                let o = salvage(&copy, &dst, true);
                let report: serde_json::Value = serde_json::from_slice(&o.stdout)
                    .unwrap_or_else(|e| panic!("page {page}: {e}: {}", stderr(&o)));
                // Exit 1 only when the salvage stopped (no reader could
                // open the store), with the reason in the report.
                let stopped = !report["report"]["stopped"].is_null();
                assert_eq!(
                    code(&o),
                    Some(if stopped { 1 } else { 0 }),
                    "page {page}: {}",
                    stderr(&o)
                );
                assert_eq!(
                    report["report"]["verify"]["problems"],
                    serde_json::json!([])
                );
                let o = uwf_at(&dst, &["verify"]);
                assert_eq!(code(&o), Some(0), "page {page}: {}", stdout(&o));
                salvaged += 1;
            }
        }
        std::fs::remove_dir_all(&copy).unwrap();
    }
    assert!(damaged > 0, "no page of {pages} was found damaged");
    assert!(salvaged > 0);
}

/// A hang is what these tests guard against: a salvage still running
/// after this long is killed and the test fails. Generous (a debug build,
/// a busy machine); a salvage here takes seconds.
const HANG: std::time::Duration = std::time::Duration::from_secs(300);

/// `uwf-db --json salvage SRC DST`, killed if it runs past [`HANG`]
/// (then `None`).
fn salvage_guarded(src: &Path, dst: &Path, scratch: &Path) -> Option<std::process::Output> {
    std::fs::create_dir_all(scratch).unwrap();
    let out = scratch.join("salvage.out");
    let err = scratch.join("salvage.err");
    let mut child = Command::new(env!("CARGO_BIN_EXE_uwf-db"))
        .arg("--json")
        .arg("salvage")
        .arg(src)
        .arg(dst)
        .env_remove("UWF_STORE")
        .current_dir(root())
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > HANG {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    Some(std::process::Output {
        status,
        stdout: std::fs::read(out).unwrap(),
        stderr: std::fs::read(err).unwrap(),
    })
}

/// Threads in a store, by `thread list`.
fn thread_count(store: &Path) -> usize {
    let o = uwf_at(store, &["--json", "thread", "list", "--limit", "1000"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    json_of(&o).as_array().unwrap().len()
}

/// Every thread of a store, by id, with its head.
fn heads(store: &Path) -> std::collections::BTreeMap<String, String> {
    let o = uwf_at(store, &["--json", "thread", "list", "--limit", "1000"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    json_of(&o)
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let field = |k: &str| t[k].as_str().unwrap().to_owned();
            (field("thread"), field("head"))
        })
        .collect()
}

/// A copy of `src` whose data file is `bytes`.
fn damaged_copy(env: &Cli, src: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let copy = env.path(name);
    copy_dir(src, &copy);
    std::fs::write(copy.join("data.mdb"), bytes).unwrap();
    copy
}

/// The leaf pages whose first key is 32 bytes (blobs, mostly) and that
/// hold more than one key: LMDB's page header is 16 bytes (`mp_flags` at
/// 10, `mp_lower` at 12), then the node offsets; a leaf node has its key
/// size at 6.
fn leaf_pages_of_hash_keys(bytes: &[u8]) -> Vec<usize> {
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]) as usize;
    (2..bytes.len() / PAGE)
        .filter(|&page| {
            let at = page * PAGE;
            let leaf = u16_at(at + 10) & 0x02 != 0;
            let keys = u16_at(at + 12).saturating_sub(16) / 2;
            if !leaf || keys < 2 {
                return false;
            }
            let node = u16_at(at + 16);
            node + 8 < PAGE && u16_at(at + node + 6) == 32
        })
        .collect()
}

/// Issue 18: a zeroed leaf page reads as rows with empty keys before
/// LMDB crashes, and the search for the next readable key went back to
/// the table's start each time: salvage restarted the same reader for
/// ever. Now each such page ends in a report that names the lost keys.
#[test]
fn regression_a_zeroed_page_ends_in_a_report_not_a_hang() {
    let env = populated("12");
    let src = env.location().lmdb_dir().to_path_buf();
    let whole = std::fs::read(src.join("data.mdb")).unwrap();
    let leaves = leaf_pages_of_hash_keys(&whole);
    let mut tried = 0;
    for &page in &leaves {
        let mut bytes = whole.clone();
        bytes[page * PAGE..(page + 1) * PAGE].fill(0);
        let copy = damaged_copy(&env, &src, &format!("zeroed-{page}"), &bytes);
        // A page the current snapshot uses (a free one is no damage).
        if code(&uwf_at(&copy, &["verify"])) != Some(3) {
            continue;
        }
        tried += 1;
        if tried > 3 {
            break;
        }
        let dst = env.path(&format!("zeroed-{page}-salvaged"));
        let o = salvage_guarded(&copy, &dst, &env.path(&format!("zeroed-{page}-io")))
            .unwrap_or_else(|| panic!("page {page}: salvage still running after {HANG:?}"));
        assert_eq!(code(&o), Some(0), "page {page}: {}", stderr(&o));
        let report = json_of(&o);
        assert_eq!(report["complete"], false, "page {page}: {report}");
        let lost: usize = report["report"]["tables"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["lost"].as_array().unwrap().len())
            .sum();
        assert!(lost >= 1, "page {page}: {report}");
        assert_eq!(
            report["report"]["verify"]["problems"],
            serde_json::json!([])
        );
    }
    assert!(tried > 0, "no page in use among the leaves {leaves:?}");
}

/// Issue 18: an empty data file sent salvage probing for ever; now it
/// is refused at once, with the reason.
#[test]
fn regression_an_empty_data_file_is_refused_with_the_reason() {
    let env = populated("1");
    let src = env.location().lmdb_dir().to_path_buf();
    let copy = damaged_copy(&env, &src, "empty", &[]);
    let o = salvage_guarded(&copy, &env.path("empty-salvaged"), &env.path("empty-io"))
        .unwrap_or_else(|| panic!("salvage still running after {HANG:?}"));
    assert_eq!(code(&o), Some(1), "{}", stdout(&o));
    assert!(stderr(&o).contains("empty (0 bytes)"), "{}", stderr(&o));
}

/// Issue 18: with a meta page zeroed LMDB refuses to open the file, and
/// salvage kept nothing although every data page was intact. The other
/// meta page names an intact snapshot: with the older meta page zeroed
/// (page 0 in this store) every thread is kept; with the current one
/// zeroed, the snapshot before the last commit is read, which lacks only
/// the idle thread that commit started.
#[test]
fn regression_a_zeroed_meta_page_loses_no_thread() {
    let env = populated("8");
    let src = env.location().lmdb_dir().to_path_buf();
    let threads = thread_count(&src);
    let whole = std::fs::read(src.join("data.mdb")).unwrap();
    // `mm_txnid`, a u64 at 144 of each meta page.
    let txnid = |meta: usize| {
        let at = meta * PAGE + 144;
        u64::from_le_bytes(whole[at..at + 8].try_into().unwrap())
    };
    let older = if txnid(0) < txnid(1) { 0 } else { 1 };
    for meta in [older, 1 - older] {
        let mut bytes = whole.clone();
        bytes[meta * PAGE..(meta + 1) * PAGE].fill(0);
        let copy = damaged_copy(&env, &src, &format!("meta-{meta}"), &bytes);
        let dst = env.path(&format!("meta-{meta}-salvaged"));
        let o = salvage_guarded(&copy, &dst, &env.path(&format!("meta-{meta}-io")))
            .unwrap_or_else(|| panic!("meta {meta}: salvage still running after {HANG:?}"));
        assert_eq!(code(&o), Some(0), "meta {meta}: {}", stderr(&o));
        let report = json_of(&o);
        let want = if meta == older { threads } else { threads - 1 };
        assert_eq!(report["report"]["threads"], want, "meta {meta}: {report}");
        let notes = report["source_notes"].to_string();
        assert!(
            notes.contains(&format!("meta page {meta} is not a valid")),
            "{notes}"
        );
        assert_eq!(thread_count(&dst), want);
        let o = uwf_at(&dst, &["verify"]);
        assert_eq!(code(&o), Some(0), "meta {meta}: {}", stdout(&o));
    }
}

/// Issue 18: a data file one page short was refused by the open check
/// in every reader, and salvage kept nothing. The pages that are there
/// are read (the missing one as zeros): at most the threads whose pages
/// were on it are lost.
#[test]
fn regression_a_data_file_one_page_short_keeps_what_is_there() {
    let env = populated("8");
    let src = env.location().lmdb_dir().to_path_buf();
    let whole = std::fs::read(src.join("data.mdb")).unwrap();
    let copy = damaged_copy(&env, &src, "short", &whole[..whole.len() - PAGE]);
    let dst = env.path("short-salvaged");
    let o = salvage_guarded(&copy, &dst, &env.path("short-io"))
        .unwrap_or_else(|| panic!("salvage still running after {HANG:?}"));
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let report = json_of(&o);
    let kept = report["report"]["threads"].as_u64().unwrap() as usize;
    // The rows on the missing page are lost (blobs, or thread records),
    // and with them every thread that reaches one of those blobs; threads of one scenario share blobs (the
    // same replies, even the same state nodes), so one lost blob can drop
    // several. Each dropped thread must reach a blob the salvaged store
    // lacks, and those blobs must be few enough to have been on one page.
    let kept_threads = heads(&dst);
    assert_eq!(kept_threads.len(), kept, "{report}");
    let records_lost = report["report"]["tables"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| {
            ["threads", "history"].contains(&t["table"].as_str().unwrap())
                && !t["lost"].as_array().unwrap().is_empty()
        });
    let mut lost = std::collections::BTreeSet::new();
    for (id, head) in heads(&src) {
        if kept_threads.contains_key(&id) {
            continue;
        }
        let walk = uwf_at(&src, &["--json", "cas", "walk", &head]);
        assert_eq!(code(&walk), Some(0), "{}", stderr(&walk));
        let missing: Vec<String> = stdout(&walk)
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["hash"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .filter(|h| lost.contains(h) || code(&uwf_at(&dst, &["cas", "has", h])) == Some(1))
            .collect();
        // Or the thread's own record was on the page: the table of thread
        // records (`threads` for active ones, `history` for ended ones)
        // reports a range it could not read.
        assert!(
            !missing.is_empty() || records_lost,
            "thread {id} was dropped though all it reaches and every record were kept: {report}"
        );
        lost.extend(missing);
    }
    assert!(
        lost.len() <= PAGE / 64,
        "{} blobs lost with one page: {report}",
        lost.len()
    );
    assert!(
        report["source_notes"].to_string().contains("short of the"),
        "{report}"
    );
    assert_eq!(
        report["report"]["verify"]["problems"],
        serde_json::json!([])
    );
    // The working copy is gone.
    let leftovers: Vec<_> = std::fs::read_dir(dst.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".uwf-salvage-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Salvages a copy of `src` whose data file is `bytes` and checks that
/// all `threads` were kept, the new store verifies and the damaged copy
/// was not written to; returns the JSON report. `None` when the damage
/// is no damage (`verify` is clean: the page is not in use).
fn salvage_keeps_every_thread(
    env: &Cli,
    src: &Path,
    tag: &str,
    bytes: &[u8],
    threads: usize,
) -> Option<serde_json::Value> {
    let copy = damaged_copy(env, src, tag, bytes);
    if code(&uwf_at(&copy, &["verify"])) == Some(0) {
        return None;
    }
    let dst = env.path(&format!("{tag}-salvaged"));
    let o = salvage_guarded(&copy, &dst, &env.path(&format!("{tag}-io")))
        .unwrap_or_else(|| panic!("{tag}: salvage still running after {HANG:?}"));
    assert_eq!(code(&o), Some(0), "{tag}: {}", stderr(&o));
    let report = json_of(&o);
    assert_eq!(report["report"]["threads"], threads, "{tag}: {report}");
    assert_eq!(thread_count(&dst), threads, "{tag}");
    let o = uwf_at(&dst, &["verify"]);
    assert_eq!(code(&o), Some(0), "{tag}: {}", stdout(&o));
    // Nothing was written to the damaged store.
    assert!(
        std::fs::read(copy.join("data.mdb")).unwrap() == bytes,
        "{tag}: the damaged store was written to"
    );
    Some(report)
}

/// The pages of `bytes` that hold the key `format_version`: the leaf of
/// the `meta` table (and older copies of it in free pages).
fn pages_holding_the_format_version(bytes: &[u8]) -> Vec<usize> {
    let key = b"format_version";
    (2..bytes.len() / PAGE)
        .filter(|&page| {
            bytes[page * PAGE..(page + 1) * PAGE]
                .windows(key.len())
                .any(|w| w == key)
        })
        .collect()
}

/// Issue 18: with the page that holds the format version damaged, every
/// reader refused to open the store and salvage kept 0 threads although
/// every other page was intact. The reader now opens such a store anyway
/// (read-only) and tells the layout from the rows: every thread is kept,
/// from a store with value checksums and from one of the legacy layout
/// (the format-1 fixture, as it is: made before the `labels` table, which
/// a read-only open cannot add), with the `meta` page zeroed or filled
/// with garbage.
#[test]
fn regression_a_damaged_format_version_page_loses_no_thread() {
    let env = populated("8");
    let legacy = env.path("legacy");
    copy_dir(&root().join("tests/fixtures/v1-store"), &legacy);
    for (name, src) in [
        ("checksummed", env.location().lmdb_dir().to_path_buf()),
        ("legacy", legacy),
    ] {
        // Counted on a copy: a command that may write would give the
        // legacy store its missing tables.
        let counted = env.path(&format!("{name}-counted"));
        copy_dir(&src, &counted);
        let threads = thread_count(&counted);
        assert!(threads > 0, "{name}: no thread to keep");
        let whole = std::fs::read(src.join("data.mdb")).unwrap();
        let mut tried = 0;
        for page in pages_holding_the_format_version(&whole) {
            for (how, fill) in [("zeroed", vec![0; PAGE]), ("garbage", garbage(page as u64))] {
                let mut bytes = whole.clone();
                bytes[page * PAGE..(page + 1) * PAGE].copy_from_slice(&fill);
                let tag = format!("{name}-{page}-{how}");
                if salvage_keeps_every_thread(&env, &src, &tag, &bytes, threads).is_some() {
                    tried += 1;
                }
            }
        }
        assert!(tried > 0, "{name}: no page in use holds the format version");
    }
}

/// The branch pages of `bytes` (`mp_flags` & `P_BRANCH`) that say they
/// are themselves (`mp_pgno`): the upper levels of the B-trees.
fn branch_pages(bytes: &[u8]) -> Vec<usize> {
    (2..bytes.len() / PAGE)
        .filter(|&page| {
            let at = page * PAGE;
            let pgno = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
            let flags = u16::from_le_bytes([bytes[at + 10], bytes[at + 11]]);
            pgno == page as u64 && flags & 0x01 != 0
        })
        .collect()
}

/// Issue 18: a damaged branch page (the root of the blobs tree, say) hid
/// every leaf below it from LMDB although they were intact, and salvage
/// kept nothing of them: 0 threads. The leaf pages no tree reaches are
/// now read with plain file reads, each row checked by its checksum, and
/// every thread is kept whichever branch page is zeroed.
#[test]
fn regression_a_damaged_branch_page_loses_no_thread() {
    let env = populated("40");
    let src = env.location().lmdb_dir().to_path_buf();
    let threads = thread_count(&src);
    let whole = std::fs::read(src.join("data.mdb")).unwrap();
    let mut tried = 0;
    for page in branch_pages(&whole) {
        let mut bytes = whole.clone();
        bytes[page * PAGE..(page + 1) * PAGE].fill(0);
        let tag = format!("branch-{page}");
        let Some(report) = salvage_keeps_every_thread(&env, &src, &tag, &bytes, threads) else {
            continue;
        };
        tried += 1;
        let recovered: u64 = report["report"]["tables"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["recovered"].as_u64().unwrap())
            .sum();
        assert!(recovered > 0, "{tag}: {report}");
    }
    assert!(tried > 0, "no branch page in use");
}

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
        .map(|t| t["id"].as_str().unwrap().to_owned())
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
                assert_eq!(code(&o), Some(0), "page {page}: {}", stderr(&o));
                let report = json_of(&o);
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

//! A store made by an older build still opens, verifies and runs (issue
//! 10): `tests/fixtures/v1-store` was made by `scripts/make-v1-store.sh`
//! at the commit in its `COMMIT` file (format version 1). A change that
//! can no longer read it — a record field made required, a key layout or
//! node encoding changed — fails here.
#![cfg(feature = "cli")]

mod common;

use std::process::{Command, Output};

use common::cli::{BIN, code, root, stderr, stdout};

fn uwf(store: &std::path::Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("--store")
        .arg(store)
        .args(args)
        .env_remove("UWF_STORE")
        .current_dir(root())
        .output()
        .unwrap()
}

fn json(store: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let o = uwf(store, &all);
    assert_eq!(code(&o), Some(0), "{args:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn a_store_made_by_an_older_build_opens_verifies_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir(&store).unwrap();
    std::fs::copy(
        root().join("tests/fixtures/v1-store/data.mdb"),
        store.join("data.mdb"),
    )
    .unwrap();

    let o = uwf(&store, &["verify"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("verified 39 blobs, 65 refs and 19 index entries: ok"),
        "{}",
        stdout(&o)
    );
    let threads = json(&store, &["thread", "list"]);
    let threads = threads.as_array().unwrap();
    let count = |status: &str| threads.iter().filter(|t| t["status"] == status).count();
    assert_eq!(
        (threads.len(), count("completed"), count("idle")),
        (6, 3, 3)
    );
    // The failed attempt kept its error.
    assert!(threads.iter().any(|t| {
        t["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("no model"))
    }));

    // The completed review: its whole history reads.
    let done = threads
        .iter()
        .find(|t| t["status"] == "completed" && t["workflow"] == "review" && t["seq"] == 5)
        .expect("the completed review thread");
    let id = done["thread"].as_str().unwrap();
    let log = json(&store, &["thread", "log", id]);
    let roles: Vec<&str> = log
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["__end__", "reviewer", "developer", "reviewer", "developer"]
    );

    // The idle thread two steps in goes on to the end with its stored
    // agent, under today's build.
    let idle = threads
        .iter()
        .find(|t| t["status"] == "idle" && t["seq"] == 2)
        .expect("the idle thread");
    let id = idle["thread"].as_str().unwrap();
    let r = json(&store, &["thread", "step", id, "--count", "10"]);
    let last = r.as_array().and_then(|a| a.last()).unwrap();
    assert_eq!(last["status"], "completed", "{r}");

    // A collection keeps everything reachable; the store still verifies.
    let o = uwf(&store, &["gc", "--grace", "0"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let o = uwf(&store, &["verify"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));

    // It is read as it is, without value checksums (issue 18): its values
    // were written without them. A copy into a new store adds them.
    assert_eq!(json(&store, &["stats"])["value_checksums"], false);
    let copy = dir.path().join("copy");
    let o = uwf(
        &store,
        &["copy", store.to_str().unwrap(), copy.to_str().unwrap()],
    );
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(json(&copy, &["stats"])["value_checksums"], true);
    let o = uwf(&copy, &["verify"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(
        json(&copy, &["thread", "list"]).as_array().map(Vec::len),
        Some(6)
    );
}

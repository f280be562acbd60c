//! Retention (issue 12, SPEC §11): `uwf-db prune` unlinks ended threads by
//! policy, `--dry-run` lists exactly what `prune` then removes, active and
//! suspended threads and children of kept parents are never pruned, `gc`
//! frees the blobs afterwards, and a stored policy (`prune --set`) is
//! applied by every `gc` first. On LMDB and PostgreSQL.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;

const REVIEW: &str = "examples/review.yaml";
const AGENT: &str = "script:examples/review.scenario.yaml";

fn ids(v: &serde_json::Value) -> Vec<String> {
    let mut ids: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

fn listed(env: &Cli, status: &str) -> Vec<String> {
    let v = env.json(&["thread", "list", "--status", status, "--limit", "1000"]);
    let mut ids: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["thread"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

/// Runs `n` review threads to completion.
/// `n` completed threads, each with its own prompt: threads with the same
/// prompt whose steps land in the same millisecond share every node
/// (content addressing), and then pruning some of them frees nothing
/// (which failed `gc["swept"] > 0` once in a loaded run).
fn completed(env: &Cli, n: &str) {
    static BATCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let batch = BATCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let count: usize = n.parse().unwrap();
    let prompts = env.path(&format!("prompts-{batch}.txt"));
    let lines: Vec<String> = (0..count).map(|i| format!("work {batch}.{i}")).collect();
    std::fs::write(&prompts, lines.join("\n")).unwrap();
    let file = prompts.to_str().unwrap();
    let o = env.uwf(&["batch", REVIEW, "--prompts", file, "--agent", AGENT]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
}

fn a_dry_run_lists_exactly_what_prune_removes(b: TestBackend) {
    let env = Cli::new(b);
    completed(&env, "6");
    let idle = env.json(&["thread", "start", REVIEW, "-p", "left idle"]);
    let idle = idle["thread"].as_str().unwrap().to_owned();
    let before = listed(&env, "completed");
    assert_eq!(before.len(), 6);

    let dry = env.json(&["prune", "--keep-latest", "2", "--dry-run"]);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["kept"], 2);
    let would = ids(&dry["pruned"]);
    assert_eq!(would.len(), 4);
    // A dry run changes nothing.
    assert_eq!(listed(&env, "completed"), before);
    // In text, a summary; the list only with -v; -q does not hide the answer.
    let text = stdout(&env.uwf(&["prune", "--keep-latest", "2", "--dry-run"]));
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.starts_with("would prune 4 ended threads (not among the newest 2"),
        "{text}"
    );
    let listed_v = stdout(&env.uwf(&["prune", "--keep-latest", "2", "--dry-run", "-v"]));
    let mut named: Vec<String> = listed_v
        .lines()
        .filter_map(|l| l.strip_prefix("would prune "))
        .filter(|rest| !rest.contains(' '))
        .map(str::to_owned)
        .collect();
    named.sort();
    let mut expected = would.clone();
    expected.sort();
    assert_eq!(named, expected, "{listed_v}");
    let o = env.uwf(&["-q", "prune", "--keep-latest", "2", "--dry-run"]);
    assert_eq!((stdout(&o), stderr(&o)), (text.clone(), String::new()));
    let o = env.uwf(&["-q", "-v", "prune", "--keep-latest", "2", "--dry-run"]);
    assert_eq!(code(&o), Some(2), "-q and -v conflict: {}", stderr(&o));
    assert_eq!(listed(&env, "completed"), before);

    let done = env.json(&["prune", "--keep-latest", "2"]);
    assert_eq!(
        ids(&done["pruned"]),
        would,
        "exactly what the dry run listed"
    );
    let after = listed(&env, "completed");
    assert_eq!(after.len(), 2);
    assert!(after.iter().all(|id| !would.contains(id)));
    // The idle thread is untouched.
    assert_eq!(listed(&env, "idle"), vec![idle.clone()]);
    let o = env.uwf(&["thread", "show", &would[0]]);
    assert_eq!(code(&o), Some(1), "a pruned thread is gone");

    // gc frees what only the pruned threads reached.
    let gc = env.json(&["gc", "--grace", "0"]);
    assert!(gc["swept"].as_u64().unwrap() > 0, "{gc}");
    assert!(gc["bytes_freed"].as_u64().unwrap() > 0, "{gc}");
    // The kept threads are whole: their logs read back.
    for id in &after {
        assert_eq!(env.log(id).len(), 5);
    }
    // Drop verifies the store.
}

fn suspended_active_and_children_of_kept_parents_stay(b: TestBackend) {
    let env = Cli::new(b);
    completed(&env, "3");
    // A suspended thread (the planner asks a human) and an idle one.
    let o = env.uwf(&[
        "run",
        "examples/planner.yaml",
        "-p",
        "plan it",
        "--agent",
        "script:examples/planner.scenario.yaml",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let suspended = listed(&env, "suspended");
    assert_eq!(suspended.len(), 1);
    let idle = env.json(&["thread", "start", REVIEW, "-p", "idle"]);
    let idle = idle["thread"].as_str().unwrap().to_owned();
    // A completed parent (ship) with a completed child (review).
    let o = env.uwf(&["workflow", "add", REVIEW]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let o = env.uwf(&[
        "run",
        "examples/ship.yaml",
        "-p",
        "ship it",
        "--agent",
        "script:examples/ship.scenario.yaml",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let all = env.json(&["thread", "list", "--limit", "1000"]);
    let child = all
        .as_array()
        .unwrap()
        .iter()
        .find(|t| !t["parent_thread"].is_null())
        .expect("ship ran a child workflow");
    let (child, parent) = (
        child["thread"].as_str().unwrap().to_owned(),
        child["parent_thread"].as_str().unwrap().to_owned(),
    );

    // Every ended review thread goes, except the child: its parent is kept.
    let report = env.json(&["prune", "--workflow", "review"]);
    let pruned = ids(&report["pruned"]);
    assert_eq!(pruned.len(), 3, "{report}");
    assert!(!pruned.contains(&child), "{report}");
    // Everything ended, whatever its age: still never a suspended, idle
    // or running thread, and the child stays while its parent is kept.
    let report = env.json(&["prune", "--older-than", "0", "--dry-run"]);
    let would = ids(&report["pruned"]);
    assert!(
        would.contains(&parent) && would.contains(&child),
        "{report}"
    );
    let report = env.json(&["prune", "--workflow", "ship"]);
    assert_eq!(ids(&report["pruned"]), vec![parent]);
    assert_eq!(listed(&env, "suspended"), suspended);
    assert_eq!(listed(&env, "idle"), vec![idle]);
    // Its parent gone, the child can go.
    let report = env.json(&["prune", "--workflow", "review"]);
    assert_eq!(ids(&report["pruned"]), vec![child]);
    assert_eq!(listed(&env, "completed"), Vec::<String>::new());
    let gc = env.json(&["gc", "--grace", "0"]);
    assert!(gc["swept"].as_u64().unwrap() > 0, "{gc}");
}

fn a_stored_policy_is_applied_by_gc(b: TestBackend) {
    let env = Cli::new(b);
    completed(&env, "4");
    let shown = env.json(&["prune", "--show"]);
    assert_eq!(shown["policy"], serde_json::Value::Null);
    env.json(&[
        "prune",
        "--set",
        "--keep-latest",
        "1",
        "--status",
        "completed",
    ]);
    let shown = env.json(&["prune", "--show"]);
    assert_eq!(shown["policy"]["keep_latest"], 1);
    assert_eq!(
        shown["policy"]["statuses"],
        serde_json::json!(["completed"])
    );
    // Storing changed nothing yet.
    assert_eq!(listed(&env, "completed").len(), 4);
    let gc = env.json(&["gc", "--grace", "0"]);
    assert_eq!(gc["pruned"], 3, "{gc}");
    assert!(gc["swept"].as_u64().unwrap() > 0, "{gc}");
    assert_eq!(listed(&env, "completed").len(), 1);
    env.json(&["prune", "--unset"]);
    completed(&env, "2");
    let gc = env.json(&["gc", "--grace", "0"]);
    assert_eq!(gc["pruned"], 0, "no policy, nothing pruned: {gc}");
    assert_eq!(listed(&env, "completed").len(), 3);
}

fn prune_refuses_what_it_must_not_do(b: TestBackend) {
    let env = Cli::new(b);
    completed(&env, "1");
    // No condition: bad usage, not "prune everything".
    let o = env.uwf(&["prune"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--older-than"), "{}", stderr(&o));
    // Only ended statuses.
    for s in ["idle", "running", "suspended"] {
        let o = env.uwf(&["prune", "--status", s]);
        assert_eq!(code(&o), Some(2), "{s}");
        assert!(stderr(&o).contains("prune never touches"), "{}", stderr(&o));
    }
    let o = env.uwf(&["prune", "--older-than", "soon"]);
    assert_eq!(code(&o), Some(2));
    let o = env.uwf(&["prune", "--set", "--dry-run", "--keep-latest", "1"]);
    assert_eq!(code(&o), Some(2));
    // Nothing was pruned by any of these.
    assert_eq!(listed(&env, "completed").len(), 1);
    // --older-than keeps what ended recently.
    let r = env.json(&["prune", "--older-than", "1h"]);
    assert_eq!(r["pruned"], serde_json::json!([]));
    assert_eq!(r["kept"], 1);
}

process_conformance!(
    a_dry_run_lists_exactly_what_prune_removes,
    suspended_active_and_children_of_kept_parents_stay,
    a_stored_policy_is_applied_by_gc,
    prune_refuses_what_it_must_not_do,
);

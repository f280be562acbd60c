//! Labels through the real binary (issue 12, SPEC §11): `--label` on
//! `run`, `thread start` and `batch` (and per prompt in `.jsonl`), kept by
//! forks and child workflows, changed by `thread label`, shown by `thread
//! show` and `thread list` (text and `--json`), filtered by `thread list
//! --label` and `prune --label`. On LMDB and PostgreSQL.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;
use serde_json::json;

const REVIEW: &str = "examples/review.yaml";
const AGENT: &str = "script:examples/review.scenario.yaml";

/// The ids `thread list --json` gives for `args`, in its order.
fn list_ids(env: &Cli, args: &[&str]) -> Vec<String> {
    let mut all = vec!["thread", "list"];
    all.extend_from_slice(args);
    if !args.contains(&"--limit") {
        all.extend_from_slice(&["--limit", "1000"]);
    }
    env.json(&all)
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["thread"].as_str().unwrap().to_owned())
        .collect()
}

fn start(env: &Cli, labels: &[&str]) -> String {
    let mut args = vec!["thread", "start", REVIEW, "-p", "task"];
    for l in labels {
        args.extend_from_slice(&["--label", l]);
    }
    let r = env.json(&args);
    r["thread"].as_str().unwrap().to_owned()
}

fn labels_are_stored_shown_and_inherited(b: TestBackend) {
    let env = Cli::new(b);
    env.json(&["workflow", "add", REVIEW]);
    // run: a parent and its child workflow's thread.
    let r = env.json(&[
        "run",
        "examples/ship.yaml",
        "-p",
        "Ship it",
        "--agent",
        "script:examples/ship.scenario.yaml",
        "--label",
        "team=a",
        "--label",
        "kind=release",
    ]);
    let parent = r["thread"].as_str().unwrap().to_owned();
    let want = json!({"team": "a", "kind": "release"});
    assert_eq!(env.show(&parent)["labels"], want);
    let tree = env.json(&["thread", "tree", &parent]);
    let child = tree["thread"]["children"][0]["thread"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(env.show(&child)["labels"], want, "a child inherits");

    // thread start, then a fork of it.
    let t = start(&env, &["team=b", "note=two words = fine"]);
    let shown = env.show(&t);
    assert_eq!(
        shown["labels"],
        json!({"team": "b", "note": "two words = fine"})
    );
    let o = env.uwf(&["thread", "step", &t, "--agent", AGENT]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let fork = env.json(&["thread", "fork", &t]);
    let fork = fork["thread"].as_str().unwrap().to_owned();
    assert_eq!(
        env.show(&fork)["labels"],
        shown["labels"],
        "a fork inherits"
    );

    // An unlabelled thread has an empty object, in show and in list.
    let plain = start(&env, &[]);
    assert_eq!(env.show(&plain)["labels"], json!({}));
    let listed = env.json(&["thread", "list"]);
    for t in listed.as_array().unwrap() {
        assert!(t["labels"].is_object(), "{t}");
    }
    // Text: show has a labels line; list a LABELS column.
    let o = env.uwf(&["thread", "show", &t]);
    assert!(
        stdout(&o).contains("note=two words = fine team=b"),
        "{}",
        stdout(&o)
    );
    let o = env.uwf(&["thread", "list"]);
    assert!(stdout(&o).contains("LABELS"), "{}", stdout(&o));
    assert!(stdout(&o).contains("kind=release team=a"), "{}", stdout(&o));
}

fn list_filters_by_every_label_in_activity_order(b: TestBackend) {
    let env = Cli::new(b);
    let a_review = start(&env, &["team=a", "kind=review"]);
    let a_plan = start(&env, &["team=a", "kind=plan"]);
    let b_review = start(&env, &["team=b", "kind=review"]);
    start(&env, &[]); // unlabelled
    let all = list_ids(&env, &[]);
    assert_eq!(all.len(), 4);
    // Each filtered listing is the unfiltered one, filtered, same order.
    let keep = |ids: &[&String]| -> Vec<String> {
        all.iter().filter(|id| ids.contains(id)).cloned().collect()
    };
    assert_eq!(
        list_ids(&env, &["--label", "team=a"]),
        keep(&[&a_review, &a_plan])
    );
    assert_eq!(
        list_ids(&env, &["--label", "kind=review"]),
        keep(&[&a_review, &b_review])
    );
    assert_eq!(
        list_ids(&env, &["--label", "team=a", "--label", "kind=review"]),
        keep(&[&a_review])
    );
    assert!(list_ids(&env, &["--label", "team=c"]).is_empty());
    assert!(list_ids(&env, &["--label", "team=a", "--label", "team=b"]).is_empty());
    // With other filters.
    let o = env.uwf(&["thread", "step", &a_plan, "--agent", AGENT]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(
        list_ids(&env, &["--label", "team=a", "--status", "idle"]),
        list_ids(&env, &["--status", "idle"])
            .into_iter()
            .filter(|id| *id == a_review || *id == a_plan)
            .collect::<Vec<_>>()
    );
    // Paging.
    let first = list_ids(&env, &["--label", "team=a", "--limit", "1"]);
    let second = list_ids(
        &env,
        &["--label", "team=a", "--limit", "1", "--offset", "1"],
    );
    assert_eq!(
        [first, second].concat(),
        list_ids(&env, &["--label", "team=a"])
    );
    // A bad filter is bad usage, not an empty list.
    let o = env.uwf(&["thread", "list", "--label", "team"]);
    assert_eq!(code(&o), Some(2));
    assert!(stderr(&o).contains("not KEY=VALUE"), "{}", stderr(&o));
}

fn thread_label_sets_and_removes(b: TestBackend) {
    let env = Cli::new(b);
    let t = start(&env, &["team=a"]);
    let r = env.json(&["thread", "label", &t, "team=b", "tier=gold"]);
    assert_eq!(r["labels"], json!({"team": "b", "tier": "gold"}));
    assert!(list_ids(&env, &["--label", "team=a"]).is_empty());
    assert_eq!(list_ids(&env, &["--label", "team=b"]), vec![t.clone()]);
    let r = env.json(&[
        "thread", "label", &t, "--remove", "team", "--remove", "absent",
    ]);
    assert_eq!(r["labels"], json!({"tier": "gold"}));
    assert!(list_ids(&env, &["--label", "team=b"]).is_empty());
    // Labels of an ended thread change too.
    let o = env.uwf(&["thread", "step", &t, "-c", "10", "--agent", AGENT]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(env.show(&t)["status"], "completed");
    env.json(&["thread", "label", &t, "outcome=shipped"]);
    assert_eq!(
        list_ids(
            &env,
            &["--label", "outcome=shipped", "--status", "completed"]
        ),
        vec![t.clone()]
    );
    // Bad input: exit 2 and a message naming the problem; nothing changes.
    for (args, says) in [
        (vec!["thread", "label", &t], "required"),
        (vec!["thread", "label", &t, "novalue"], "not KEY=VALUE"),
        (
            vec!["thread", "label", &t, "bad key=v"],
            "label key 'bad key'",
        ),
        (
            vec!["thread", "label", &t, "--remove", "bad key"],
            "label key 'bad key'",
        ),
    ] {
        let o = env.uwf(&args);
        assert_ne!(code(&o), Some(0), "{args:?}");
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    let too_long = format!("k={}", "v".repeat(256));
    let o = env.uwf(&["thread", "start", REVIEW, "-p", "x", "--label", &too_long]);
    assert_eq!(code(&o), Some(2));
    assert!(stderr(&o).contains("256 bytes"), "{}", stderr(&o));
    assert_eq!(
        env.show(&t)["labels"],
        json!({"tier": "gold", "outcome": "shipped"})
    );
}

fn batch_labels_every_thread_and_each_prompt(b: TestBackend) {
    let env = Cli::new(b);
    let o = env.uwf(&[
        "batch", REVIEW, "-n", "3", "-p", "work", "--agent", AGENT, "--label", "run=one",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(list_ids(&env, &["--label", "run=one"]).len(), 3);
    let prompts = env.file(
        "p.jsonl",
        "{\"prompt\": \"first\", \"labels\": {\"lang\": \"rust\"}}\n\
         \"second\"\n\
         {\"prompt\": \"third\", \"labels\": {\"lang\": \"go\", \"run\": \"own\"}}\n",
    );
    let o = env.uwf(&[
        "batch",
        REVIEW,
        "--prompts",
        &prompts,
        "--agent",
        AGENT,
        "--label",
        "run=two",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(list_ids(&env, &["--label", "run=two"]).len(), 2);
    let rust = list_ids(&env, &["--label", "lang=rust", "--label", "run=two"]);
    assert_eq!(rust.len(), 1);
    let go = list_ids(&env, &["--label", "lang=go"]);
    assert_eq!(go.len(), 1);
    assert_eq!(
        env.show(&go[0])["labels"],
        json!({"lang": "go", "run": "own"}),
        "a prompt's own labels win"
    );
    // A bad label on line 2: refused before any thread starts.
    let before = list_ids(&env, &[]).len();
    let bad = env.file(
        "bad.jsonl",
        "\"fine\"\n{\"prompt\": \"x\", \"labels\": {\"bad key\": \"v\"}}\n",
    );
    let o = env.uwf(&["batch", REVIEW, "--prompts", &bad, "--agent", AGENT]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("bad.jsonl:2"), "{}", stderr(&o));
    let bad = env.file("bad2.jsonl", "{\"prompt\": \"x\", \"labels\": [\"a=b\"]}\n");
    let o = env.uwf(&["batch", REVIEW, "--prompts", &bad, "--agent", AGENT]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("must be an object"), "{}", stderr(&o));
    assert_eq!(list_ids(&env, &[]).len(), before);
}

fn prune_by_label(b: TestBackend) {
    let env = Cli::new(b);
    for run in ["old", "old", "new"] {
        let o = env.uwf(&[
            "batch",
            REVIEW,
            "-n",
            "1",
            "-p",
            "work",
            "--agent",
            AGENT,
            "--label",
            &format!("run={run}"),
        ]);
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    }
    let old = list_ids(&env, &["--label", "run=old"]);
    let dry = env.json(&["prune", "--label", "run=old", "--dry-run"]);
    let mut would: Vec<String> = dry["pruned"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    would.sort();
    let mut want = old.clone();
    want.sort();
    assert_eq!(would, want);
    env.json(&["prune", "--label", "run=old"]);
    assert!(list_ids(&env, &["--label", "run=old"]).is_empty());
    assert_eq!(list_ids(&env, &["--label", "run=new"]).len(), 1);
}

process_conformance!(
    labels_are_stored_shown_and_inherited,
    list_filters_by_every_label_in_activity_order,
    thread_label_sets_and_removes,
    batch_labels_every_thread_and_each_prompt,
    prune_by_label,
);

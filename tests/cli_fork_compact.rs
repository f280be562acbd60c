//! `thread fork` (the state computed from the node and the workflow) and
//! compaction (manual and automatic) through the real binary.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;

fn fork_computes_its_state_from_the_node_and_the_workflow(b: TestBackend) {
    let env = Cli::new(b);
    let r = env.json(&[
        "run",
        "examples/review.yaml",
        "-p",
        "t",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    let id = r["thread"].as_str().unwrap().to_owned();
    let log = env.log(&id);
    // At the rejected review: the developer runs next with the reason.
    let rejected = log[3]["hash"].as_str().unwrap();
    let f = env.json(&["thread", "fork", &id, "--at", &rejected[..10]]);
    assert_eq!(f["status"], "idle");
    assert_eq!(f["current_role"], "developer");
    assert_eq!(f["forked_from"]["thread"], id.as_str());
    assert_eq!(f["forked_from"]["node"], rejected);
    let fid = f["thread"].as_str().unwrap();
    assert_eq!(
        env.show(fid)["next_instruction"],
        "Fix this: the README does not mention --json"
    );
    // --from-role reviewer: at the parent of the latest review, so the reviewer runs again.
    let f = env.json(&["thread", "fork", &id, "--from-role", "reviewer"]);
    assert_eq!(f["current_role"], "reviewer");
    assert_eq!(f["forked_from"]["node"], log[2]["hash"]);
    // At the head of a completed thread: the end node is refused.
    let o = env.uwf(&["thread", "fork", &id]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("resume the thread instead"),
        "{}",
        stderr(&o)
    );
    // At the approving step, which routed to $END: refused with a reason.
    let o = env.uwf(&[
        "thread",
        "fork",
        &id,
        "--at",
        log[1]["hash"].as_str().unwrap(),
    ]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("$END"), "{}", stderr(&o));
    // A suspended planner forks as suspended with the same role and message.
    let p = env.json(&[
        "run",
        "examples/planner.yaml",
        "-p",
        "t",
        "--agent",
        "script:examples/planner.scenario.yaml",
    ]);
    let pid = p["thread"].as_str().unwrap();
    let f = env.json(&["thread", "fork", pid]);
    assert_eq!(f["status"], "suspended");
    let fs = env.show(f["thread"].as_str().unwrap());
    assert_eq!(fs["suspended_role"], "planner");
    assert_eq!(fs["suspend_message"], p["suspend_message"]);
    // The source is unchanged by all of this.
    assert_eq!(env.log(&id), log);
}

fn fork_from_a_role_that_did_not_run_lists_the_roles_that_did(b: TestBackend) {
    let env = Cli::new(b);
    let r = env.json(&[
        "run",
        "examples/review.yaml",
        "-p",
        "t",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    let id = r["thread"].as_str().unwrap();
    let o = env.uwf(&["thread", "fork", id, "--from-role", "tester"]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("has no step of role 'tester' (roles that ran: developer, reviewer)"),
        "{}",
        stderr(&o)
    );
    // A thread where nothing ran yet says so.
    let t = env.json(&["thread", "start", "review", "-p", "t"]);
    let o = env.uwf(&[
        "thread",
        "fork",
        t["thread"].as_str().unwrap(),
        "--from-role",
        "developer",
    ]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("no role has run on it yet"),
        "{}",
        stderr(&o)
    );
}

fn compaction_manual_and_automatic(b: TestBackend) {
    let env = Cli::new(b);
    let wf = env.file(
        "compacting.yaml",
        &std::fs::read_to_string("examples/review.yaml")
            .unwrap()
            .replace("name: review", "name: compacting")
            .replace("maxRounds: 20", "maxRounds: 20\ncompact: { every: 2 }"),
    );
    let sc = env.file(
        "c.yaml",
        &format!(
            "{}compact:\n  - Summary after two steps\n  - Summary after four steps\n",
            std::fs::read_to_string("examples/review.scenario.yaml").unwrap()
        ),
    );
    let t = env.json(&[
        "thread",
        "start",
        &wf,
        "-p",
        "t",
        "--agent",
        &format!("script:{sc}"),
    ]);
    let id = t["thread"].as_str().unwrap().to_owned();
    let r = env.json(&["thread", "step", &id, "--count", "2"]);
    assert_eq!(r.as_array().unwrap().len(), 2);
    let s = env.show(&id);
    let staged = s["staged_compact"]
        .as_str()
        .expect("a summary is staged after two steps")
        .to_owned();
    assert_eq!(
        env.json(&["cas", "get", &staged])["payload"],
        "Summary after two steps"
    );
    env.json(&["thread", "step", &id]);
    let log = env.log(&id);
    let node = env.json(&["cas", "get", log[0]["hash"].as_str().unwrap()]);
    assert_eq!(
        node["payload"]["compact"],
        staged.as_str(),
        "written on the next node"
    );
    assert_eq!(log.len(), 3, "the summarising call is not a role step");
    // Manual staging.
    let o = env.json(&["thread", "compact", &id, "--summary", "By hand"]);
    let by_hand = o["summary"].as_str().unwrap();
    assert_eq!(env.show(&id)["staged_compact"], by_hand);
}

/// `thread tree --forks`: a thread's forks and theirs, depth first, each
/// with the node it was forked at, in text and JSON; an ended fork too
/// (found in history); `--forks` with no fork says so; without the flag,
/// the tree is as before.
fn thread_tree_shows_forks(b: TestBackend) {
    let env = Cli::new(b);
    let run = |p: &str| {
        env.json(&[
            "run",
            "examples/review.yaml",
            "-p",
            p,
            "--agent",
            "script:examples/review.scenario.yaml",
        ])["thread"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let origin = run("origin");
    let other = run("unrelated");
    let fork = |from: &str, role: &str| {
        env.json(&["thread", "fork", from, "--from-role", role])["thread"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let a = fork(&origin, "reviewer");
    let b2 = fork(&origin, "developer");
    let a1 = fork(&a, "developer");
    // A fork of the unrelated thread is not shown.
    fork(&other, "reviewer");
    // An ended fork (driven to completion, in history) is still one.
    env.json(&[
        "thread",
        "step",
        &b2,
        "--count",
        "10",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);

    let v = env.json(&["thread", "tree", &origin, "--forks"]);
    let forks: Vec<(u64, String, String)> = v["forks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["depth"].as_u64().unwrap(),
                f["thread"].as_str().unwrap().to_owned(),
                f["forked_from"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        forks,
        [
            (1, a.clone(), origin.clone()),
            (2, a1.clone(), a.clone()),
            (1, b2.clone(), origin.clone())
        ]
    );
    let ended = &v["forks"][2];
    assert_eq!(ended["status"], "completed");
    let a_show = env.show(&a);
    assert_eq!(
        v["forks"][0]["forked_at"], a_show["forked_from"]["node"],
        "{a_show}"
    );

    let o = env.uwf(&["thread", "tree", &origin, "--forks"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[1], "forks: 3", "{text}");
    assert!(lines[2].starts_with(&format!("  {a}  review  ")), "{text}");
    assert!(lines[2].contains("(forked at "), "{text}");
    assert!(lines[3].starts_with(&format!("    {a1}  ")), "{text}");
    assert!(
        lines[4].starts_with(&format!("  {b2}  review  completed")),
        "{text}"
    );

    let none = env.uwf(&["thread", "tree", &a1, "--forks"]);
    assert!(
        stdout(&none).ends_with("forks: none\n"),
        "{}",
        stdout(&none)
    );
    let plain = env.json(&["thread", "tree", &origin]);
    assert!(plain.get("forks").is_none(), "{plain}");
}

process_conformance!(
    thread_tree_shows_forks,
    fork_computes_its_state_from_the_node_and_the_workflow,
    fork_from_a_role_that_did_not_run_lists_the_roles_that_did,
    compaction_manual_and_automatic,
);

//! Driving threads through the real binary: `run` and `thread step`
//! (loops, `--count`, templates that reach the next prompt exactly),
//! `maxRounds`, and steps that fail and commit nothing.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;

fn run_loops_and_templates_reach_the_next_prompt_exactly(b: TestBackend) {
    let env = Cli::new(b);
    let r = env.json(&[
        "run",
        "examples/review.yaml",
        "-p",
        "Add a --json flag",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    assert_eq!(r["status"], "completed");
    assert_eq!(r["done"], true);
    let id = r["thread"].as_str().unwrap();
    let log = env.log(id);
    let roles: Vec<&str> = log
        .iter()
        .rev()
        .map(|e| e["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["developer", "reviewer", "developer", "reviewer", "__end__"]
    );
    // The rejected reason reached the developer's next instruction exactly.
    assert_eq!(
        log[2]["input"],
        "Fix this: the README does not mention --json"
    );
    assert_eq!(log[4]["input"], "Implement the change");
    assert_eq!(log[0]["input"], "Approved");
    assert_eq!(log[0]["meta"]["return_code"], 0);
}

fn count_returns_one_result_per_step(b: TestBackend) {
    let env = Cli::new(b);
    let t = env.json(&[
        "thread",
        "start",
        "examples/review.yaml",
        "-p",
        "task",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    assert_eq!(t["status"], "idle");
    assert_eq!(t["current_role"], "developer");
    let id = t["thread"].as_str().unwrap();
    let r = env.json(&["thread", "step", id, "--count", "3"]);
    let r = r.as_array().unwrap();
    assert_eq!(r.len(), 3);
    assert_eq!(r[0]["current_role"], "reviewer");
    assert_eq!(r[1]["current_role"], "developer");
    assert_eq!(r[2]["current_role"], "reviewer");
    // Stops early at the end: asking for 5 more runs only 1.
    let r = env.json(&["thread", "step", id, "--count", "5"]);
    assert_eq!(r.as_array().unwrap().len(), 1);
    assert_eq!(r[0]["status"], "completed");
    // A single step prints one object, not an array.
    let o = env.uwf(&["thread", "step", id]);
    assert_eq!(code(&o), Some(1), "a completed thread takes no step");
    assert!(stderr(&o).contains("completed"));
}

/// A regression: `--count 0` ran nothing and exited 0, hiding the mistake.
fn count_zero_is_bad_usage_and_c_is_short_for_count(b: TestBackend) {
    let env = Cli::new(b);
    // Approved at once, twice: a run, then a resume.
    let sc = env.file(
        "twice.yaml",
        &review_scenario(&[
            ("developer", DEV),
            ("reviewer", OK),
            ("developer", DEV),
            ("reviewer", OK),
        ]),
    );
    let agent = &format!("script:{sc}");
    let t = env.json(&[
        "thread",
        "start",
        "examples/review.yaml",
        "-p",
        "task",
        "--agent",
        agent,
    ]);
    let id = t["thread"].as_str().unwrap();
    for args in [
        ["thread", "step", id, "--count", "0"],
        ["thread", "step", id, "-c", "0"],
        ["thread", "resume", id, "--count", "0"],
        ["thread", "resume", id, "-c", "0"],
    ] {
        let o = env.uwf(&args);
        assert_eq!(code(&o), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("--count") && stderr(&o).contains("at least 1"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    let o = env.uwf(&["thread", "step", id, "-c", "two"]);
    assert_eq!(code(&o), Some(2));
    assert!(stderr(&o).contains("not a whole number"), "{}", stderr(&o));
    assert!(env.log(id).is_empty(), "nothing ran");
    // -c N is --count N for step, resume and batch.
    let r = env.json(&["thread", "step", id, "-c", "4"]);
    assert_eq!(r.as_array().unwrap().len(), 2, "stops early at the end");
    assert_eq!(r[1]["status"], "completed");
    let r = env.json(&["thread", "resume", id, "-c", "2", "-p", "again"]);
    assert_eq!(r.as_array().unwrap().len(), 2);
    assert_eq!(r[1]["status"], "completed");
    let agent = "script:examples/review.scenario.yaml";
    let o = env.uwf(&["batch", "review", "-c", "0", "-p", "x", "--agent", agent]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    let o = env.uwf(&["batch", "review", "-c", "2", "-p", "x", "--agent", agent]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let listed = env.json(&["thread", "list", "--status", "completed"]);
    assert_eq!(
        listed.as_array().unwrap().len(),
        3,
        "the batch's two threads too"
    );
}

fn a_role_mismatch_commits_nothing_and_a_retry_works(b: TestBackend) {
    let env = Cli::new(b);
    let bad = env.file("bad.yaml", &review_scenario(&[("reviewer", OK)]));
    let t = env.json(&[
        "thread",
        "start",
        "examples/review.yaml",
        "-p",
        "task",
        "--agent",
        &format!("script:{bad}"),
    ]);
    let id = t["thread"].as_str().unwrap();
    let o = env.uwf(&["thread", "step", id]);
    assert_eq!(code(&o), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("'reviewer'") && err.contains("'developer'"),
        "{err}"
    );
    let s = env.show(id);
    assert_eq!(s["head"], t["head"], "head unchanged");
    assert_eq!(s["status"], "idle");
    assert!(s["last_error"].as_str().unwrap().contains("reviewer"));
    let failed = env.json(&["thread", "list", "--failed"]);
    assert_eq!(failed.as_array().unwrap().len(), 1);
    // Fix the scenario; the retry goes through and clears the error.
    env.file("bad.yaml", &review_scenario(&[("developer", DEV)]));
    let r = env.json(&["thread", "step", id]);
    assert_eq!(r["current_role"], "reviewer");
    assert_eq!(env.show(id)["last_error"], serde_json::Value::Null);
}

fn max_rounds_ends_the_thread_as_failed(b: TestBackend) {
    let env = Cli::new(b);
    let sc = env.file(
        "loop.yaml",
        &review_scenario(&[
            ("developer", DEV),
            ("reviewer", "$status: rejected\nreason: again"),
            ("developer", DEV),
        ]),
    );
    let o = env.uwf(&[
        "--json",
        "run",
        "examples/review.yaml",
        "-p",
        "t",
        "--max-rounds",
        "3",
        "--agent",
        &format!("script:{sc}"),
    ]);
    // A thread that ends failed is a failed run (SPEC §13): exit 1, the
    // reason in a JSON error on stderr, the result still on stdout.
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["status"], "failed");
    let id = r["thread"].as_str().unwrap();
    let err: serde_json::Value = serde_json::from_str(stderr(&o).trim()).unwrap();
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("thread {id} ended failed")),
        "{message}"
    );
    assert!(
        message.contains("maxRounds (3) reached after 3 role steps"),
        "{message}"
    );
    assert_eq!(err["error"]["exit_code"], 1);
    let log = env.log(id);
    assert_eq!(log.len(), 4, "three role steps and the end node");
    assert_eq!(log[0]["meta"]["return_code"], 1);
    // `thread show` says why, with the round count.
    let shown = env.show(id);
    assert!(
        shown["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("maxRounds (3) reached after 3 role steps")),
        "{shown}"
    );
}

fn unknown_status_is_a_step_failure(b: TestBackend) {
    let env = Cli::new(b);
    let wf = env.file("loose.yaml", "name: loose\nroles:\n  writer:\n    frontmatter:\n      properties: { $status: { type: string } }\ngraph:\n  $START:\n    _: { role: writer, prompt: 'Write' }\n  writer:\n    _: { role: $END, prompt: 'Done' }\n");
    let sc = env.file("w.yaml", &review_scenario(&[("writer", "$status: maybe")]));
    let o = env.uwf(&["run", &wf, "-p", "t", "--agent", &format!("script:{sc}")]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("status 'maybe'"), "{}", stderr(&o));
    let list = env.json(&["thread", "list"]);
    let s = &list[0];
    assert_eq!(s["status"], "idle");
    assert_eq!(s["seq"], 0, "nothing committed");
}

process_conformance!(
    run_loops_and_templates_reach_the_next_prompt_exactly,
    count_returns_one_result_per_step,
    count_zero_is_bad_usage_and_c_is_short_for_count,
    a_role_mismatch_commits_nothing_and_a_retry_works,
    max_rounds_ends_the_thread_as_failed,
    unknown_status_is_a_step_failure,
);

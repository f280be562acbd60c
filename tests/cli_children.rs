//! Child workflows through the real binary: links both ways, a child's
//! suspend suspends its parent (and resumes through it), cancelling a
//! parent cancels its child.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;

fn a_child_workflow_links_both_ways(b: TestBackend) {
    let env = Cli::new(b);
    env.json(&["workflow", "add", "examples/review.yaml"]);
    let r = env.json(&[
        "run",
        "examples/ship.yaml",
        "-p",
        "Ship it",
        "--agent",
        "script:examples/ship.scenario.yaml",
    ]);
    assert_eq!(r["status"], "completed");
    let parent = r["thread"].as_str().unwrap();
    let tree = env.json(&["thread", "tree", parent]);
    let kids = tree["thread"]["children"].as_array().unwrap();
    assert_eq!(kids.len(), 1);
    let child = kids[0]["thread"].as_str().unwrap();
    assert_eq!(kids[0]["workflow"], "review");
    let up = env.json(&["thread", "tree", child]);
    assert_eq!(up["parents"][0]["thread"], parent);
    let plog = env.log(parent);
    let step = &plog[2];
    assert_eq!(step["role"], "implement");
    assert_eq!(step["status"], "done");
    assert_eq!(step["content"], "Approved", "the child's end summary");
    let clog = env.log(child);
    assert_eq!(
        step["child_thread"], clog[0]["hash"],
        "the child's end node"
    );
    assert_eq!(
        clog.len(),
        3,
        "the parent's log never shows the child's steps"
    );
    assert_eq!(env.show(child)["parent_thread"], parent);
    // The child's task is the rendered edge prompt.
    let start = env.json(&["cas", "get", env.show(child)["start"].as_str().unwrap()]);
    let prompt = start["payload"]["prompt"].as_str().unwrap().to_owned();
    assert_eq!(
        env.json(&["cas", "get", &prompt])["payload"],
        "Add a --json flag to the CLI"
    );
    assert_eq!(start["payload"]["depth"], 1);
}

fn a_child_that_suspends_suspends_its_parent_and_resumes_through_it(b: TestBackend) {
    let env = Cli::new(b);
    env.json(&["workflow", "add", "examples/planner.yaml"]);
    let r = env.json(&[
        "run",
        "tests/fixtures/plan-and-build.yaml",
        "-p",
        "Export",
        "--agent",
        "script:tests/fixtures/plan-and-build.scenario.yaml",
    ]);
    assert_eq!(r["status"], "suspended");
    assert_eq!(r["suspended_role"], "plan");
    assert_eq!(r["suspend_message"], "The planner asks: Which database?");
    let parent = r["thread"].as_str().unwrap().to_owned();
    let before = env.show(&parent);
    assert_eq!(
        before["status"], "suspended",
        "the record, not only the result"
    );
    assert_eq!(
        before["claimed_status"],
        serde_json::Value::Null,
        "the claim is released"
    );
    assert_eq!(before["seq"], 0, "no parent step written");
    let child = before["active_child"].as_str().unwrap().to_owned();
    // The child cannot be resumed directly.
    let o = env.uwf(&["thread", "resume", &child, "-p", "PostgreSQL"]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("resume the parent"), "{}", stderr(&o));
    // The binary adds the command line; the library names the problem.
    assert!(
        stderr(&o).contains(&format!("hint: uwf-db thread resume {parent}")),
        "{}",
        stderr(&o)
    );
    // What to do next is said: the child's and the parent's pages name the
    // command that resumes the parent (issue 21).
    let want = format!("uwf-db thread resume {parent} -p 'YOUR ANSWER'");
    assert_eq!(env.show(&child)["resume_command"], want.as_str());
    assert_eq!(before["resume_command"], want.as_str());
    let o = env.uwf(&["thread", "show", &child]);
    assert!(stdout(&o).contains(&want), "{}", stdout(&o));
    // Forking the suspended parent is refused too.
    assert_eq!(code(&env.uwf(&["thread", "fork", &parent])), Some(1));
    let r = env.json(&["thread", "resume", &parent, "-p", "PostgreSQL"]);
    assert_eq!(r["status"], "completed");
    let clog = env.log(&child);
    assert_eq!(clog.last().unwrap()["input"], "Plan the task");
    assert_eq!(
        clog[clog.len() - 2]["input"],
        "The planner asks: Which database?\n\nPostgreSQL"
    );
    let plog = env.log(&parent);
    assert_eq!(plog[1]["role"], "plan");
    assert_eq!(plog[1]["child_thread"], clog[0]["hash"]);
}

fn cancelling_a_parent_cancels_its_suspended_child(b: TestBackend) {
    let env = Cli::new(b);
    env.json(&["workflow", "add", "examples/planner.yaml"]);
    let r = env.json(&[
        "run",
        "tests/fixtures/plan-and-build.yaml",
        "-p",
        "Export",
        "--agent",
        "script:tests/fixtures/plan-and-build.scenario.yaml",
    ]);
    let parent = r["thread"].as_str().unwrap().to_owned();
    let child = env.show(&parent)["active_child"]
        .as_str()
        .unwrap()
        .to_owned();
    let c = env.json(&["thread", "cancel", &parent]);
    assert_eq!(c["status"], "cancelled");
    assert_eq!(env.show(&child)["status"], "cancelled");
}

process_conformance!(
    a_child_workflow_links_both_ways,
    a_child_that_suspends_suspends_its_parent_and_resumes_through_it,
    cancelling_a_parent_cancels_its_suspended_child,
);

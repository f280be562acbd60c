//! Suspend, resume and cancel through the real binary: what the human
//! said is recorded, completed threads resume with the first role, a failed
//! resume keeps the previous status, cancel ends with return code 2.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;

const PLANNER_TWICE: &str = r#"steps:
  - role: planner
    output: |
      ---
      $status: need_info
      question: Which database?
      ---
      Unclear.
  - role: planner
    output: |
      ---
      $status: need_info
      question: Which version?
      ---
      Still unclear.
  - role: planner
    output: |
      ---
      $status: planned
      ---
      Plan.
  - role: developer
    output: |
      ---
      $status: done
      ---
      Done.
"#;

fn suspend_resume_cycles_record_what_the_human_said(b: TestBackend) {
    let env = Cli::new(b);
    let sc = env.file("p.yaml", PLANNER_TWICE);
    let r = env.json(&[
        "run",
        "examples/planner.yaml",
        "-p",
        "Export",
        "--agent",
        &format!("script:{sc}"),
    ]);
    assert_eq!(r["status"], "suspended");
    assert_eq!(r["suspended_role"], "planner");
    assert_eq!(r["suspend_message"], "The planner asks: Which database?");
    let id = r["thread"].as_str().unwrap();
    // Its page says what to do next; so does the text of a run that
    // suspends (issue 21).
    let want = format!("uwf-db thread resume {id} -p 'YOUR ANSWER'");
    assert_eq!(env.show(id)["resume_command"], want.as_str());
    let o = env.uwf(&["thread", "show", id]);
    assert!(stdout(&o).contains(&want), "{}", stdout(&o));
    let o = env.uwf(&[
        "run",
        "examples/planner.yaml",
        "-p",
        "Export",
        "--agent",
        &format!("script:{sc}"),
    ]);
    assert!(
        stdout(&o).contains("answer and go on: uwf-db thread resume"),
        "{}",
        stdout(&o)
    );
    // Stepping a suspended thread is refused; resuming it works.
    assert_eq!(code(&env.uwf(&["thread", "step", id])), Some(1));
    let r = env.json(&["thread", "resume", id, "-p", "PostgreSQL"]);
    assert_eq!(r["status"], "suspended");
    assert_eq!(r["suspend_message"], "The planner asks: Which version?");
    // A suspended thread needs the human's answer (SPEC §13): without -p
    // it is refused, saying so, or read from stdin.
    let o = env.uwf(&["thread", "resume", id, "--count", "5"]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("waiting for a human's answer to: The planner asks: Which version?"),
        "{}",
        stderr(&o)
    );
    let o = env.uwf_stdin(&["--json", "thread", "resume", id, "--count", "5"], b"16\n");
    let r = json_of(&o);
    assert_eq!(r.as_array().unwrap().last().unwrap()["status"], "completed");
    let log = env.log(id);
    let inputs: Vec<&str> = log
        .iter()
        .rev()
        .map(|e| e["input"].as_str().unwrap())
        .collect();
    assert_eq!(inputs[1], "The planner asks: Which database?\n\nPostgreSQL");
    assert_eq!(inputs[2], "The planner asks: Which version?\n\n16");
}

fn a_completed_thread_resumes_with_the_first_role(b: TestBackend) {
    let env = Cli::new(b);
    let sc = env.file(
        "s.yaml",
        &review_scenario(&[
            ("developer", DEV),
            ("reviewer", OK),
            ("developer", DEV),
            ("reviewer", OK),
        ]),
    );
    let r = env.json(&[
        "run",
        "examples/review.yaml",
        "-p",
        "t",
        "--agent",
        &format!("script:{sc}"),
    ]);
    assert_eq!(r["status"], "completed");
    let id = r["thread"].as_str().unwrap();
    let o = env.uwf(&["thread", "resume", id, "-p", "also add --yaml"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let s = env.show(id);
    assert_eq!(s["status"], "idle");
    assert_eq!(s["next_role"], "reviewer");
    let log = env.log(id);
    assert_eq!(log[0]["input"], "Implement the change\n\nalso add --yaml");
    assert_eq!(log[0]["seq"], 4, "continues after the end node");
    assert_eq!(log[1]["role"], "__end__");
    let r = env.json(&["thread", "step", id]);
    assert_eq!(r["status"], "completed");
    // Idle and cancelled threads cannot be resumed.
    let t = env.json(&["thread", "start", "review", "-p", "x"]);
    let o = env.uwf(&[
        "thread",
        "resume",
        t["thread"].as_str().unwrap(),
        "--agent",
        &format!("script:{sc}"),
    ]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("idle"), "{}", stderr(&o));
}

fn a_failed_resume_keeps_the_previous_status(b: TestBackend) {
    let env = Cli::new(b);
    let r = env.json(&[
        "run",
        "examples/planner.yaml",
        "-p",
        "t",
        "--agent",
        "script:examples/planner.scenario.yaml",
    ]);
    let id = r["thread"].as_str().unwrap().to_owned();
    let o = env.uwf(&[
        "thread",
        "resume",
        &id,
        "-p",
        "x",
        "--agent",
        "cmd:sh -c 'exit 4'",
    ]);
    assert_eq!(code(&o), Some(1));
    let s = env.show(&id);
    assert_eq!(s["status"], "suspended", "still suspended");
    assert!(s["last_error"].as_str().unwrap().contains("exit status: 4"));
    // A completed thread whose resume fails stays in history, completed.
    let done = env.json(&[
        "run",
        "examples/review.yaml",
        "-p",
        "t",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    let did = done["thread"].as_str().unwrap().to_owned();
    let o = env.uwf(&["thread", "resume", &did, "--agent", "cmd:sh -c 'exit 5'"]);
    assert_eq!(code(&o), Some(1));
    let s = env.show(&did);
    assert_eq!(s["status"], "completed");
    assert!(
        s["completed_at"].as_str().is_some_and(|t| t.ends_with('Z')),
        "an RFC 3339 time in UTC: {s}"
    );
    assert!(s["last_error"].as_str().unwrap().contains("exit status: 5"));
}

/// A regression: resuming a thread that cannot be resumed, with no agent
/// given or stored, said "has no agent" instead of the thread's status.
fn resume_reports_the_status_before_a_missing_agent(b: TestBackend) {
    let env = Cli::new(b);
    let t = env.json(&["thread", "start", "examples/review.yaml", "-p", "t"]);
    let id = t["thread"].as_str().unwrap();
    let o = env.uwf(&["thread", "resume", id]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("is idle: only suspended, completed or failed threads"),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("no agent"), "{}", stderr(&o));
    env.json(&["thread", "cancel", id]);
    let o = env.uwf(&["thread", "resume", id, "-p", "x"]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("is cancelled"), "{}", stderr(&o));
    // A thread that can be resumed, with no agent anywhere: now the agent
    // is what is missing (the stored spec is removed through the library).
    let p = env.json(&[
        "run",
        "examples/planner.yaml",
        "-p",
        "t",
        "--agent",
        "script:examples/planner.scenario.yaml",
    ]);
    assert_eq!(p["status"], "suspended");
    let pid = p["thread"].as_str().unwrap();
    {
        let store = env.open_store();
        let tid: uwf_db::thread::ThreadId = pid.parse().unwrap();
        store
            .threads()
            .low_level()
            .update_record(tid, |r| {
                r.agent = None;
                Ok(())
            })
            .unwrap();
    }
    let o = env.uwf(&["thread", "resume", pid]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("has no agent"), "{}", stderr(&o));
}

fn cancel_ends_with_return_code_2(b: TestBackend) {
    let env = Cli::new(b);
    let t = env.json(&["thread", "start", "examples/review.yaml", "-p", "t"]);
    let id = t["thread"].as_str().unwrap();
    let r = env.json(&["thread", "cancel", id]);
    assert_eq!(r["status"], "cancelled");
    assert_eq!(env.log(id)[0]["meta"]["return_code"], 2);
    let again = env.uwf(&["thread", "cancel", id]);
    assert_eq!(code(&again), Some(1));
    // A regression: this said "only idle threads take steps".
    assert!(
        stderr(&again).contains("has already ended (cancelled)"),
        "{}",
        stderr(&again)
    );
    let o = env.uwf(&[
        "thread",
        "resume",
        id,
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("cancelled"));
}

process_conformance!(
    suspend_resume_cycles_record_what_the_human_said,
    a_completed_thread_resumes_with_the_first_role,
    a_failed_resume_keeps_the_previous_status,
    resume_reports_the_status_before_a_missing_agent,
    cancel_ends_with_return_code_2,
);

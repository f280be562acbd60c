//! The engine through the real binary: runs, loops, counts, templates,
//! failures that commit nothing, suspend/resume cycles, maxRounds, cancel,
//! and `cmd:` agents that fail, hang or answer badly. `verify` is clean
//! after every scenario.

use std::path::PathBuf;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_uwf-db");

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn store(&self) -> PathBuf {
        self.dir.path().join("store")
    }
    fn file(&self, name: &str, text: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_owned()
    }
    fn uwf(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .arg("--store")
            .arg(self.store())
            .args(args)
            .env_remove("UWF_STORE")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap()
    }
    fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let o = self.uwf(&all);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::from_slice(&o.stdout).unwrap()
    }
    /// Starts `uwf-db` in the background (stdout discarded, stderr piped).
    fn spawn(&self, args: &[&str]) -> std::process::Child {
        Command::new(BIN)
            .arg("--store")
            .arg(self.store())
            .args(args)
            .env_remove("UWF_STORE")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }
    fn show(&self, id: &str) -> serde_json::Value {
        self.json(&["thread", "show", id])
    }
    fn log(&self, id: &str) -> Vec<serde_json::Value> {
        self.json(&["thread", "log", id, "--limit", "1000"])
            .as_array()
            .unwrap()
            .clone()
    }
    fn verify_clean(&self) {
        let o = self.uwf(&["verify"]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "verify: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if !std::thread::panicking() && self.store().exists() {
            self.verify_clean();
        }
    }
}

fn code(o: &Output) -> Option<i32> {
    o.status.code()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn step(role: &str, front: &str, body: &str) -> String {
    format!(
        "  - role: {role}\n    output: |\n      ---\n{}      ---\n      {body}\n",
        front
            .lines()
            .map(|l| format!("      {l}\n"))
            .collect::<String>()
    )
}

fn review_scenario(steps: &[(&str, &str)]) -> String {
    let mut s = String::from("steps:\n");
    for (role, front) in steps {
        s.push_str(&step(role, front, &format!("{role} answered")));
    }
    s
}

const DEV: &str = "$status: review_needed";
const OK: &str = "$status: approved";

#[test]
fn run_loops_and_templates_reach_the_next_prompt_exactly() {
    let env = Env::new();
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

#[test]
fn count_returns_one_result_per_step() {
    let env = Env::new();
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

#[test]
fn a_role_mismatch_commits_nothing_and_a_retry_works() {
    let env = Env::new();
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

#[test]
fn suspend_resume_cycles_record_what_the_human_said() {
    let env = Env::new();
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
    // Stepping a suspended thread is refused; resuming it works.
    assert_eq!(code(&env.uwf(&["thread", "step", id])), Some(1));
    let r = env.json(&["thread", "resume", id, "-p", "PostgreSQL"]);
    assert_eq!(r["status"], "suspended");
    assert_eq!(r["suspend_message"], "The planner asks: Which version?");
    let r = env.json(&["thread", "resume", id, "--count", "5"]);
    assert_eq!(r.as_array().unwrap().last().unwrap()["status"], "completed");
    let log = env.log(id);
    let inputs: Vec<&str> = log
        .iter()
        .rev()
        .map(|e| e["input"].as_str().unwrap())
        .collect();
    assert_eq!(inputs[1], "The planner asks: Which database?\n\nPostgreSQL");
    assert_eq!(inputs[2], "The planner asks: Which version?");
}

#[test]
fn a_completed_thread_resumes_with_the_first_role() {
    let env = Env::new();
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

#[test]
fn max_rounds_ends_the_thread_as_failed() {
    let env = Env::new();
    let sc = env.file(
        "loop.yaml",
        &review_scenario(&[
            ("developer", DEV),
            ("reviewer", "$status: rejected\nreason: again"),
            ("developer", DEV),
        ]),
    );
    let r = env.json(&[
        "run",
        "examples/review.yaml",
        "-p",
        "t",
        "--max-rounds",
        "3",
        "--agent",
        &format!("script:{sc}"),
    ]);
    assert_eq!(r["status"], "failed");
    let id = r["thread"].as_str().unwrap();
    let log = env.log(id);
    assert_eq!(log.len(), 4, "three role steps and the end node");
    assert_eq!(log[0]["meta"]["return_code"], 1);
}

#[test]
fn unknown_status_is_a_step_failure() {
    let env = Env::new();
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

#[test]
fn a_failing_agent_program_is_recorded_with_its_stderr() {
    let env = Env::new();
    let o = env.uwf(&[
        "run",
        "examples/review.yaml",
        "-p",
        "t",
        "--agent",
        "cmd:sh -c 'echo model overloaded >&2; exit 3'",
    ]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("model overloaded"), "{}", stderr(&o));
    let list = env.json(&["thread", "list", "--failed"]);
    assert!(
        list[0]["last_error"]
            .as_str()
            .unwrap()
            .contains("exit status: 3")
    );
}

#[test]
fn a_hanging_agent_is_killed_after_its_timeout() {
    let env = Env::new();
    let started = std::time::Instant::now();
    let o = env.uwf(&[
        "run",
        "examples/review.yaml",
        "-p",
        "t",
        "--agent-timeout",
        "1s",
        "--agent",
        "cmd:sh -c 'sleep 30 & sleep 30'",
    ]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("timed out"), "{}", stderr(&o));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "the process group was killed"
    );
}

#[test]
fn invalid_frontmatter_twice_then_valid_is_reasked() {
    let env = Env::new();
    let counter = env.dir.path().join("n");
    let script = env.file("agent.sh", &format!(
        "n=$(cat {c} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {c}\ncat > /dev/null\nif [ $n -le 2 ]; then echo 'no frontmatter'; else printf -- '---\\n$status: review_needed\\n---\\nDone on try %s\\n' $n; fi\n",
        c = counter.display()));
    let t = env.json(&["thread", "start", "examples/review.yaml", "-p", "t"]);
    let id = t["thread"].as_str().unwrap();
    let r = env.json(&["thread", "step", id, "--agent", &format!("cmd:sh {script}")]);
    assert_eq!(r["current_role"], "reviewer");
    assert_eq!(env.log(id)[0]["content"], "Done on try 3\n");
    // With no re-asks the same kind of agent fails the step.
    std::fs::write(&counter, "0").unwrap();
    let t = env.json(&["thread", "start", "review", "-p", "t2"]);
    let o = env.uwf(&[
        "thread",
        "step",
        t["thread"].as_str().unwrap(),
        "--reasks",
        "0",
        "--agent",
        &format!("cmd:sh {script}"),
    ]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("no frontmatter"), "{}", stderr(&o));
}

#[test]
fn cancel_ends_with_return_code_2() {
    let env = Env::new();
    let t = env.json(&["thread", "start", "examples/review.yaml", "-p", "t"]);
    let id = t["thread"].as_str().unwrap();
    let r = env.json(&["thread", "cancel", id]);
    assert_eq!(r["status"], "cancelled");
    assert_eq!(env.log(id)[0]["meta"]["return_code"], 2);
    assert_eq!(code(&env.uwf(&["thread", "cancel", id])), Some(1));
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

#[test]
fn no_agent_is_a_clear_error() {
    let env = Env::new();
    let t = env.json(&["thread", "start", "examples/review.yaml", "-p", "t"]);
    let o = env.uwf(&["thread", "step", t["thread"].as_str().unwrap()]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("--agent"), "{}", stderr(&o));
    // A spec that does not work is refused and not stored on the thread.
    let id = t["thread"].as_str().unwrap();
    let o = env.uwf(&["thread", "step", id, "--agent", "telepathy"]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("unknown agent spec 'telepathy'"),
        "{}",
        stderr(&o)
    );
    let o = env.uwf(&[
        "thread",
        "step",
        id,
        "--agent",
        "script:/no/such/scenario.yaml",
    ]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("/no/such/scenario.yaml"),
        "{}",
        stderr(&o)
    );
    assert_eq!(env.show(id)["agent"], serde_json::Value::Null);
}

const SLOW_AGENT: &str =
    "cmd:sh -c 'sleep 2; printf -- \"---\\n\\$status: review_needed\\n---\\nslow\\n\"'";

#[test]
fn a_second_driver_is_refused_while_the_first_runs() {
    let env = Env::new();
    let t = env.json(&[
        "thread",
        "start",
        "examples/review.yaml",
        "-p",
        "t",
        "--agent",
        SLOW_AGENT,
    ]);
    let id = t["thread"].as_str().unwrap().to_owned();
    let first = env.spawn(&["thread", "step", &id]);
    std::thread::sleep(std::time::Duration::from_millis(700));
    let s = env.show(&id);
    assert_eq!(s["status"], "running", "the driver's claim shows");
    assert_eq!(s["driver_alive"], true);
    let second = env.uwf(&["thread", "step", &id]);
    assert_eq!(code(&second), Some(1));
    assert!(
        stderr(&second).contains("being driven by another process"),
        "{}",
        stderr(&second)
    );
    let o = env.uwf(&["thread", "cancel", &id]);
    assert_eq!(
        code(&o),
        Some(1),
        "cancel refused while a live driver holds it"
    );
    let first = first.wait_with_output().unwrap();
    assert_eq!(
        first.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let s = env.show(&id);
    assert_eq!(s["status"], "idle");
    assert_eq!(s["next_role"], "reviewer");
}

#[test]
fn a_driver_killed_with_kill_9_leaves_a_thread_the_next_driver_takes_over() {
    let env = Env::new();
    let t = env.json(&[
        "thread",
        "start",
        "examples/review.yaml",
        "-p",
        "t",
        "--agent",
        SLOW_AGENT,
    ]);
    let id = t["thread"].as_str().unwrap().to_owned();
    let mut victim = env.spawn(&["thread", "step", &id]);
    std::thread::sleep(std::time::Duration::from_millis(700));
    assert_eq!(env.show(&id)["status"], "running");
    victim.kill().unwrap(); // SIGKILL
    victim.wait().unwrap();
    // The record still says running, but the lock died with the process.
    assert_eq!(env.show(&id)["driver_alive"], false);
    let fast = env.file("fast.yaml", &review_scenario(&[("developer", DEV)]));
    let r = env.json(&["thread", "step", &id, "--agent", &format!("script:{fast}")]);
    assert_eq!(r["status"], "idle");
    assert_eq!(r["current_role"], "reviewer");
    assert_eq!(env.log(&id).len(), 1, "exactly one step");
    assert_eq!(env.show(&id)["status"], "idle");
}

#[test]
fn a_child_workflow_links_both_ways() {
    let env = Env::new();
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

#[test]
fn a_child_that_suspends_suspends_its_parent_and_resumes_through_it() {
    let env = Env::new();
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

#[test]
fn fork_computes_its_state_from_the_node_and_the_workflow() {
    let env = Env::new();
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

#[test]
fn compaction_manual_and_automatic() {
    let env = Env::new();
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

#[test]
fn ctrl_c_kills_the_agent_releases_the_claim_and_exits_130() {
    let env = Env::new();
    let t = env.json(&["thread", "start", "examples/review.yaml", "-p", "t"]);
    let id = t["thread"].as_str().unwrap().to_owned();
    let marker = env.dir.path().join("agent-survived");
    let agent = format!("cmd:sh -c 'sleep 3; touch {}'", marker.display());
    let child = env.spawn(&["thread", "step", &id, "--agent", &agent]);
    std::thread::sleep(std::time::Duration::from_millis(800));
    assert_eq!(env.show(&id)["status"], "running");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = env.show(&id);
    assert_eq!(s["status"], "idle", "the claim was released");
    assert_eq!(s["seq"], 0, "nothing committed");
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert!(!marker.exists(), "the agent's process group was killed");
    // Retryable at once.
    let r = env.json(&[
        "thread",
        "step",
        &id,
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    assert_eq!(r["current_role"], "reviewer");
}

#[test]
fn workflow_validate_reports_every_problem_with_its_location() {
    let env = Env::new();
    let o = env.uwf(&["workflow", "validate", "tests/fixtures/five-mistakes.yaml"]);
    assert_eq!(code(&o), Some(1));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    for needle in [
        "tests/fixtures/five-mistakes.yaml:6:5: roles.$END",
        ":25:15: graph.writer.finished",
        ":27:9: graph.editor.ok.role",
        ":27:9: graph.editor.ok.prompt: template variable 'mood'",
        ":20:5: roles.orphan",
        "unknown key 'colour'",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    let o = env.json(&["workflow", "validate", "examples/review.yaml"]);
    assert_eq!(o["valid"], true);
    let o = env.uwf(&[
        "--json",
        "workflow",
        "validate",
        "tests/fixtures/five-mistakes.yaml",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["valid"], false);
    assert!(v["problems"].as_array().unwrap().len() >= 5);
    let o = env.json(&["workflow", "add", "examples/review.yaml"]);
    assert_eq!(o["name"], "review");
    assert_eq!(o["hash"].as_str().unwrap().len(), 64);
}

#[test]
fn a_failed_resume_keeps_the_previous_status() {
    let env = Env::new();
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
    assert!(s["completed_at"].is_u64());
    assert!(s["last_error"].as_str().unwrap().contains("exit status: 5"));
}

#[test]
fn cancelling_a_parent_cancels_its_suspended_child() {
    let env = Env::new();
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

#[test]
fn gc_frees_a_removed_thread_while_other_processes_drive_threads() {
    let env = Env::new();
    let run = |prompt: &str| {
        env.json(&[
            "run",
            "examples/review.yaml",
            "-p",
            prompt,
            "--agent",
            "script:examples/review.scenario.yaml",
        ])
    };
    let gone = run("to be removed");
    let kept = run("to be kept");
    let gone = gone["thread"].as_str().unwrap();
    let kept = kept["thread"].as_str().unwrap();
    env.json(&["thread", "rm", gone]);
    let dry = env.json(&["gc", "--dry-run", "--grace", "0"]);
    // The removed thread's start, four steps, end, and their unique texts.
    assert!(dry["swept"].as_u64().unwrap() >= 6, "{dry}");
    assert_eq!(env.json(&["gc"])["swept"], 0, "within the default grace");

    // Collections with no grace period while other processes run threads.
    let drivers: Vec<_> = (0..3)
        .map(|i| {
            env.spawn(&[
                "run",
                "examples/review.yaml",
                "-p",
                &format!("concurrent {i}"),
                "--agent",
                "script:examples/review.scenario.yaml",
            ])
        })
        .collect();
    let mut swept = 0;
    for _ in 0..5 {
        swept += env.json(&["gc", "--grace", "0"])["swept"].as_u64().unwrap();
    }
    for d in drivers {
        let o = d.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    assert_eq!(swept, dry["swept"].as_u64().unwrap());
    assert_eq!(env.log(kept).len(), 5);
    let listed = env.json(&["thread", "list"]);
    assert_eq!(listed.as_array().unwrap().len(), 4, "{listed}");
    for t in listed.as_array().unwrap() {
        let id = t["id"].as_str().unwrap();
        assert_eq!(env.log(id).len(), 5, "thread {id} reads back whole");
    }
    // Drop runs `verify`.
}

#[test]
fn batch_runs_threads_from_a_prompt_file_and_streams_json_lines() {
    let env = Env::new();
    let prompts: String = (0..12).map(|i| format!("change {i}\n\n")).collect();
    let file = env.file("prompts.txt", &prompts);
    let o = env.uwf(&[
        "--json",
        "batch",
        "examples/review.yaml",
        "--prompts",
        &file,
        "--agent",
        "script:examples/review.scenario.yaml",
        "--jobs",
        "4",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 13, "one line per thread, then the summary");
    let summary = &lines[12]["summary"];
    assert_eq!(summary["threads"], 12);
    assert_eq!(summary["completed"], 12);
    assert_eq!(summary["steps"], 48);
    let mut indexes: Vec<u64> = lines[..12]
        .iter()
        .map(|l| l["index"].as_u64().unwrap())
        .collect();
    indexes.sort_unstable();
    assert_eq!(indexes, (0..12).collect::<Vec<_>>());
    for l in &lines[..12] {
        assert_eq!(l["status"], "completed");
        assert_eq!(l["result"]["done"], true);
        let id = l["thread"].as_str().unwrap();
        assert_eq!(env.log(id).len(), 5);
        // The agent spec is stored, as for `run`.
        assert_eq!(
            env.show(id)["agent"],
            "script:examples/review.scenario.yaml"
        );
    }
    // Usage errors.
    let o = env.uwf(&["batch", "examples/review.yaml", "--agent", "script:x.yaml"]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("--prompts FILE"), "{}", stderr(&o));
    let o = env.uwf(&["batch", "examples/review.yaml", "-n", "2", "-p", "x"]);
    assert!(stderr(&o).contains("needs an agent"), "{}", stderr(&o));
    let o = env.uwf(&["batch", "examples/review.yaml", "-n", "2"]);
    assert_eq!(code(&o), Some(2), "-n needs -p");
    let o = env.uwf(&["batch", "examples/review.yaml", "-n", "0", "-p", "x"]);
    assert_eq!(code(&o), Some(2), "-n 0 is bad usage, not a crash");
}

#[test]
fn a_batch_killed_mid_run_keeps_every_acknowledged_step() {
    use std::io::{BufRead, BufReader};
    let env = Env::new();
    let mut child = Command::new(BIN)
        .arg("--store")
        .arg(env.store())
        .args([
            "--json",
            "batch",
            "examples/review.yaml",
            "-n",
            "100000",
            "-p",
            "work",
            "--agent",
            "script:examples/review.scenario.yaml",
            "--jobs",
            "8",
        ])
        .env_remove("UWF_STORE")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut reported = Vec::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while reported.len() < 40 {
        let line = lines.next().unwrap().unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        reported.push(v["thread"].as_str().unwrap().to_owned());
    }
    // SIGKILL: no handler runs; open transactions die with the process.
    child.kill().unwrap();
    child.wait().unwrap();
    for id in &reported {
        let s = env.show(id);
        assert_eq!(s["status"], "completed", "{s}");
        assert_eq!(env.log(id).len(), 5, "thread {id}: every step is there");
    }
    // Threads caught mid-drive show a dead driver's claim; `batch
    // --continue` takes them over and finishes every one.
    let listed = env.json(&["thread", "list", "--limit", "100000"]);
    let all = listed.as_array().unwrap().len();
    assert!(all >= reported.len());
    let o = env.uwf(&[
        "--json",
        "batch",
        "examples/review.yaml",
        "--continue",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let r: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let unfinished = all
        - env
            .json(&[
                "thread",
                "list",
                "--status",
                "completed",
                "--limit",
                "100000",
            ])
            .as_array()
            .unwrap()
            .len();
    assert_eq!(unfinished, 0, "{r}");
    assert_eq!(r["summary"]["errors"], 0, "{r}");
    assert!(
        r["summary"]["threads"].as_u64().unwrap() >= 1,
        "the kill caught threads mid-drive: {r}"
    );
    // Nothing is left to continue.
    let again = env.uwf(&[
        "batch",
        "examples/review.yaml",
        "--continue",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    assert_eq!(code(&again), Some(0));
    assert!(String::from_utf8_lossy(&again.stdout).contains("no idle thread"));
    // Drop runs `verify`.
}

#[test]
fn ctrl_c_stops_a_batch_kills_its_agents_and_leaves_threads_retryable() {
    let env = Env::new();
    let marker = env.dir.path().join("agent-survived");
    let agent = format!("cmd:sh -c 'sleep 2; touch {}'", marker.display());
    let child = env.spawn(&[
        "batch",
        "examples/review.yaml",
        "-n",
        "20",
        "-p",
        "t",
        "--agent",
        &agent,
        "--jobs",
        "3",
    ]);
    std::thread::sleep(std::time::Duration::from_millis(800));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    let listed = env.json(&["thread", "list"]);
    let threads = listed.as_array().unwrap();
    assert!(!threads.is_empty() && threads.len() <= 3, "{listed}");
    for t in threads {
        assert_eq!(t["status"], "idle", "claims released: {t}");
        assert!(
            t["last_error"].is_null(),
            "an interrupt is not a failure: {t}"
        );
    }
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert!(!marker.exists(), "every agent's process group was killed");
}

#[test]
fn batch_reads_multi_line_prompts_from_json_lines() {
    let env = Env::new();
    let file = env.file(
        "prompts.jsonl",
        "\"first line\\nsecond line\"\n\n{\"prompt\": \"another\", \"id\": 7}\n",
    );
    let o = env.uwf(&[
        "--json",
        "batch",
        "examples/review.yaml",
        "--prompts",
        &file,
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let mut tasks = Vec::new();
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let Some(id) = v["thread"].as_str() else {
            continue;
        };
        let start = env.show(id)["start"].as_str().unwrap().to_owned();
        let node = env.json(&["cas", "get", &start]);
        let prompt = node["payload"]["prompt"].as_str().unwrap().to_owned();
        tasks.push(
            env.json(&["cas", "get", &prompt])["payload"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    tasks.sort();
    assert_eq!(tasks, ["another", "first line\nsecond line"]);
    let bad = env.file("bad.jsonl", "not json\n");
    let o = env.uwf(&[
        "batch",
        "examples/review.yaml",
        "--prompts",
        &bad,
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("bad.jsonl:1: not JSON"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn batch_json_stops_starting_threads_when_its_reader_is_gone() {
    use std::io::{BufRead, BufReader};
    let env = Env::new();
    let wf = env.file(
        "one.yaml",
        "name: one\nroles:\n  worker:\n    goal: Work\ngraph:\n  $START:\n    _: { role: worker, prompt: 'Work' }\n  worker:\n    _: { role: $END, prompt: 'Done' }\n",
    );
    // 200 threads of 0.1 s each, two at a time: at least 10 s to drive them
    // all.
    let mut child = Command::new(BIN)
        .arg("--store")
        .arg(env.store())
        .args([
            "--json",
            "batch",
            &wf,
            "-n",
            "200",
            "-p",
            "t",
            "--agent",
            "cmd:sh -c 'sleep 0.1; echo done'",
            "--jobs",
            "2",
        ])
        .env_remove("UWF_STORE")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    // `| head -1`: read one line, then close the pipe.
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let item: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(item["status"], "completed", "{first}");
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "a closed pipe is not a failure: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(6),
        "stopped soon after the reader left: {:?}",
        started.elapsed()
    );
    let listed = env.json(&["thread", "list", "--limit", "1000"]);
    let threads = listed.as_array().unwrap();
    assert!(
        threads.len() < 40,
        "far fewer than 200 threads were started: {}",
        threads.len()
    );
    // Drop runs `verify`.
}

//! Agents through the real binary: `cmd:` programs that fail, hang or
//! answer badly (re-asked), and agent specs that are missing or wrong.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;

fn a_failing_agent_program_is_recorded_with_its_stderr(b: TestBackend) {
    let env = Cli::new(b);
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

fn a_hanging_agent_is_killed_after_its_timeout(b: TestBackend) {
    let env = Cli::new(b);
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

fn invalid_frontmatter_twice_then_valid_is_reasked(b: TestBackend) {
    let env = Cli::new(b);
    let counter = env.path("n");
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

fn no_agent_is_a_clear_error(b: TestBackend) {
    let env = Cli::new(b);
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

process_conformance!(
    a_failing_agent_program_is_recorded_with_its_stderr,
    a_hanging_agent_is_killed_after_its_timeout,
    invalid_frontmatter_twice_then_valid_is_reasked,
    no_agent_is_a_clear_error,
);

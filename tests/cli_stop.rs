//! Graceful stop (issue 12, SPEC §11) through the real binary, on LMDB and
//! PostgreSQL: `thread stop` makes the live driver stop after the step in
//! flight (the step is committed, the thread idle, the driver exits 0 and
//! says so), and a first Ctrl-C in `batch` does the same for every thread.
#![cfg(feature = "cli")]

mod common;

use std::time::{Duration, Instant};

use common::backend::TestBackend;
use common::cli::*;

/// A slow agent for the review workflow: the reviewer approves, the
/// developer asks for review; each reply takes `secs`.
fn slow_agent(secs: &str) -> String {
    format!(
        "cmd:sh -c 'sleep {secs}; if grep -q \"Review the change\"; then printf -- \"---\\n\\$status: approved\\n---\\nok\\n\"; else printf -- \"---\\n\\$status: review_needed\\n---\\ndone\\n\"; fi'"
    )
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn thread_stop_ends_the_drive_after_the_step_in_flight(b: TestBackend) {
    let env = Cli::new(b);
    let t = env.json(&["thread", "start", "examples/review.yaml", "-p", "a change"]);
    let id = t["thread"].as_str().unwrap().to_owned();
    // Nothing drives it yet: nothing to stop.
    let o = env.uwf(&["thread", "stop", &id]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("nothing to stop"), "{}", stderr(&o));

    let agent = slow_agent("1");
    let driver = env
        .std_cmd()
        .args(["thread", "step", &id, "-c", "10", "--agent", &agent])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the driver's claim", || {
        env.show(&id)["status"] == "running"
    });
    let o = env.uwf(&["thread", "stop", &id]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("asked the driver"), "{}", stdout(&o));
    let out = driver.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("stopped after the step in flight"), "{text}");
    // The step in flight was committed; the thread is idle, not failed.
    let s = env.show(&id);
    assert_eq!(s["status"], "idle", "{s}");
    assert_eq!(s["last_error"], serde_json::Value::Null, "{s}");
    assert_eq!(
        s["stop_requested_at"],
        serde_json::Value::Null,
        "the request is cleared: {s}"
    );
    let steps = env.log(&id).len();
    assert!((1..10).contains(&steps), "{steps} steps");
    // `thread step` goes on later, to the end.
    let o = env.uwf(&[
        "thread",
        "step",
        &id,
        "-c",
        "10",
        "--agent",
        &slow_agent("0"),
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(env.show(&id)["status"], "completed");
}

fn a_first_ctrl_c_stops_a_batch_after_the_steps_in_flight(b: TestBackend) {
    let env = Cli::new(b);
    let o = env.uwf(&["init"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let agent = slow_agent("1");
    let batch = env
        .std_cmd()
        .args([
            "batch",
            "examples/review.yaml",
            "-n",
            "6",
            "-p",
            "work",
            "--jobs",
            "2",
            "--agent",
            &agent,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("two running threads", || {
        env.json(&["thread", "list", "--status", "running"])
            .as_array()
            .is_some_and(|a| a.len() == 2)
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(batch.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let started = Instant::now();
    let out = batch.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("stopping after the steps in flight"), "{err}");
    // The agents were not killed: their steps finished (about 1 s).
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    let all = env.json(&["thread", "list", "--limit", "100"]);
    let all = all.as_array().unwrap();
    assert_eq!(
        all.len(),
        2,
        "no new thread started after the Ctrl-C: {all:?}"
    );
    for t in all {
        assert_eq!(t["status"], "idle", "{t}");
        assert_eq!(t["last_error"], serde_json::Value::Null, "{t}");
        let id = t["thread"].as_str().unwrap();
        assert!(
            !env.log(id).is_empty(),
            "the step in flight of {id} was committed"
        );
    }
    // `batch --continue` finishes them.
    let o = env.uwf(&[
        "batch",
        "examples/review.yaml",
        "--continue",
        "--agent",
        &slow_agent("0"),
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let done = env.json(&["thread", "list", "--status", "completed"]);
    assert_eq!(done.as_array().unwrap().len(), 2);
}

process_conformance!(
    thread_stop_ends_the_drive_after_the_step_in_flight,
    a_first_ctrl_c_stops_a_batch_after_the_steps_in_flight,
);

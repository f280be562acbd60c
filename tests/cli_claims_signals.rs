//! Claims and signals through the real binary: one live driver per
//! thread, a driver killed with SIGKILL is taken over, Ctrl-C kills the
//! agents' process groups, releases claims and exits 130.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;

const SLOW_AGENT: &str =
    "cmd:sh -c 'sleep 2; printf -- \"---\\n\\$status: review_needed\\n---\\nslow\\n\"'";

fn a_second_driver_is_refused_while_the_first_runs(b: TestBackend) {
    let env = Cli::new(b);
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

fn a_driver_killed_with_kill_9_leaves_a_thread_the_next_driver_takes_over(b: TestBackend) {
    let env = Cli::new(b);
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

fn ctrl_c_kills_the_agent_releases_the_claim_and_exits_130(b: TestBackend) {
    let env = Cli::new(b);
    let t = env.json(&["thread", "start", "examples/review.yaml", "-p", "t"]);
    let id = t["thread"].as_str().unwrap().to_owned();
    let marker = env.path("agent-survived");
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

fn ctrl_c_stops_a_batch_kills_its_agents_and_leaves_threads_retryable(b: TestBackend) {
    let env = Cli::new(b);
    let marker = env.path("agent-survived");
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

process_conformance!(
    a_second_driver_is_refused_while_the_first_runs,
    a_driver_killed_with_kill_9_leaves_a_thread_the_next_driver_takes_over,
    ctrl_c_kills_the_agent_releases_the_claim_and_exits_130,
    ctrl_c_stops_a_batch_kills_its_agents_and_leaves_threads_retryable,
);

//! Claims and signals through the real binary: one live driver per
//! thread, a driver killed with SIGKILL is taken over (and its agent dies
//! with it), Ctrl-C, SIGTERM and SIGHUP kill the agents' process groups,
//! release claims and exit 130, 143 and 129.
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
    // The record still says running, but the lock died with the process
    // (on PostgreSQL once the server has seen the connection close, which
    // happens after the kill returns: a bounded wait).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while env.show(&id)["driver_alive"] != false && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
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
    // Until the drivers are in their agents (a fixed 800 ms was too short
    // on a loaded machine: the kill came before any thread existed).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let o = env.uwf(&["--json", "thread", "list", "--status", "running"]);
        if code(&o) == Some(0) && json_of(&o).as_array().is_some_and(|a| a.len() == 3) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the batch never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    // A first Ctrl-C lets the steps in flight finish (tests/cli_stop.rs);
    // the second kills the agents at once.
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
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

/// Polls `ready` every 20 ms for up to 60 s (a loaded machine is slow).
fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !ready() {
        assert!(
            std::time::Instant::now() < until,
            "timed out waiting: {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Whether process `pid` has ended (gone, or a zombie nobody reaped yet).
fn process_ended(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name in parentheses.
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Starts `thread step` of a new thread with a `cmd:` agent that writes its
/// pid and sleeps for ten minutes; returns the thread, the driver and the
/// agent's pid once the agent runs.
fn step_with_a_sleeping_agent(env: &Cli) -> (String, std::process::Child, i32) {
    let t = env.json(&["thread", "start", "examples/review.yaml", "-p", "t"]);
    let id = t["thread"].as_str().unwrap().to_owned();
    let pidfile = env.path("agent.pid");
    // `exec` keeps the pid: the sleeping process is the agent's program.
    let agent = format!(
        "cmd:sh -c 'echo $$ > {0}.tmp && mv {0}.tmp {0} && exec sleep 600'",
        pidfile.display()
    );
    let driver = env.spawn(&["thread", "step", &id, "--agent", &agent]);
    wait_for("the agent to start", || pidfile.exists());
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!process_ended(pid));
    (id, driver, pid)
}

fn a_signal_kills_the_agent_releases_the_claim_and_exits(
    b: TestBackend,
    signal: nix::sys::signal::Signal,
    exit: i32,
) {
    let env = Cli::new(b);
    let (id, driver, agent) = step_with_a_sleeping_agent(&env);
    assert_eq!(env.show(&id)["status"], "running");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(driver.id()).unwrap());
    nix::sys::signal::kill(pid, signal).unwrap();
    let out = driver.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(exit),
        "{signal}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for("the agent to be killed", || process_ended(agent));
    let s = env.show(&id);
    assert_eq!(s["status"], "idle", "the claim was released");
    assert_eq!(s["seq"], 0, "nothing committed");
    assert!(s["last_error"].is_null(), "a signal is not a failure: {s}");
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

fn sigterm_kills_the_agent_releases_the_claim_and_exits_143(b: TestBackend) {
    a_signal_kills_the_agent_releases_the_claim_and_exits(
        b,
        nix::sys::signal::Signal::SIGTERM,
        143,
    );
}

fn sighup_kills_the_agent_releases_the_claim_and_exits_129(b: TestBackend) {
    a_signal_kills_the_agent_releases_the_claim_and_exits(b, nix::sys::signal::Signal::SIGHUP, 129);
}

/// The driver runs no cleanup when killed with SIGKILL; the agent's
/// parent-death signal (Linux) ends it all the same.
#[cfg(target_os = "linux")]
fn an_agent_dies_with_a_driver_killed_with_kill_9(b: TestBackend) {
    let env = Cli::new(b);
    let (id, mut driver, agent) = step_with_a_sleeping_agent(&env);
    driver.kill().unwrap(); // SIGKILL
    driver.wait().unwrap();
    wait_for("the orphaned agent to die", || process_ended(agent));
    assert_eq!(env.show(&id)["driver_alive"], false);
}

/// The value of a `/proc/PID/status` field (Linux).
#[cfg(target_os = "linux")]
fn proc_status(pid: u32, field: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
}

/// A quick command (no agent, no claim: here `cas put -`, waiting on its
/// stdin) has no signal thread, yet says the same word and exits with the
/// same code as any other command.
#[cfg(target_os = "linux")]
fn a_quick_command_exits_on_a_signal_with_its_code_and_no_signal_thread(b: TestBackend) {
    use nix::sys::signal::Signal;
    use std::io::Write as _;
    let env = Cli::new(b);
    env.json(&["workflow", "add", "examples/review.yaml"]);
    for (signal, exit, word) in [
        (Signal::SIGINT, 130, "interrupted"),
        (Signal::SIGTERM, 143, "terminated"),
        (Signal::SIGHUP, 129, "hangup"),
    ] {
        let mut child = env
            .std_cmd()
            .args(["cas", "put", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"never stored: ").unwrap();
        // Ready once the signal is caught (bit N-1 of the SigCgt mask); a
        // child that ended first fails here, not after the timeout.
        let bit = 1u64 << (signal as i32 - 1);
        wait_for("the handler to be installed", || {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("`cas put -` ended before the signal: {status}");
            }
            proc_status(child.id(), "SigCgt")
                .and_then(|m| u64::from_str_radix(&m, 16).ok())
                .is_some_and(|m| m & bit != 0)
        });
        assert_eq!(
            proc_status(child.id(), "Threads").as_deref(),
            Some("1"),
            "a quick command starts no signal thread"
        );
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(exit), "{signal}: {err}");
        assert_eq!(err.trim(), word, "{signal}");
        assert!(out.stdout.is_empty(), "no hash printed");
        drop(stdin);
    }
}

process_conformance!(
    #[cfg(target_os = "linux")]
    a_quick_command_exits_on_a_signal_with_its_code_and_no_signal_thread,
    sigterm_kills_the_agent_releases_the_claim_and_exits_143,
    sighup_kills_the_agent_releases_the_claim_and_exits_129,
    #[cfg(target_os = "linux")]
    an_agent_dies_with_a_driver_killed_with_kill_9,
    a_second_driver_is_refused_while_the_first_runs,
    a_driver_killed_with_kill_9_leaves_a_thread_the_next_driver_takes_over,
    ctrl_c_kills_the_agent_releases_the_claim_and_exits_130,
    ctrl_c_stops_a_batch_kills_its_agents_and_leaves_threads_retryable,
);

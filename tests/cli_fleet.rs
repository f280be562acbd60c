//! A fleet of `uwf-db batch --continue --wait` runner processes sharing one
//! store (SPEC §10, `docs/design.md` §5d "Fleets"): the idle threads are
//! divided among them, no thread is driven twice, and when one runner is
//! killed with SIGKILL the others finish its threads.
#![cfg(feature = "cli")]

mod common;

use std::collections::HashMap;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::backend::TestBackend;
use common::cli::*;
use uwf_db::engine::StartOptions;
use uwf_db::thread::{ThreadId, ThreadStatus};
use uwf_db::{Durability, Store};

/// Registers the workflow and starts `n` idle threads of it.
fn idle_threads(store: &Store, n: usize) -> Vec<ThreadId> {
    let hash = common::two_roles(store, "fleet");
    (0..n)
        .map(|i| {
            store
                .engine()
                .start_workflow(hash, &format!("task {i}"), &StartOptions::default())
                .unwrap()
                .id
        })
        .collect()
}

/// A `cmd:` agent that logs `RUNNER_PID THREAD ROLE` per call to `log`.
fn counting_agent(env: &Cli, log: &str) -> String {
    let script = env.file(
        "agent.sh",
        &format!(
            "#!/bin/sh\ncat >/dev/null\necho \"$PPID $UWF_THREAD $UWF_ROLE\" >> '{log}'\necho \"$UWF_ROLE did it\"\n"
        ),
    );
    let mut perms = std::fs::metadata(&script).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&script, perms).unwrap();
    format!("cmd:{script}")
}

/// The agent calls logged so far: (runner pid, thread, role).
fn calls(log: &str) -> Vec<(u32, String, String)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut w = l.split(' ');
            Some((
                w.next()?.parse().ok()?,
                w.next()?.to_owned(),
                w.next()?.to_owned(),
            ))
        })
        .collect()
}

fn runner(env: &Cli, agent: &str) -> Child {
    env.std_cmd()
        .args([
            "--json",
            "batch",
            "fleet",
            "--continue",
            "--wait",
            "--jobs",
            "4",
            "--agent",
            agent,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `child` (at most `limit`), returning its output.
fn finish(child: Child, limit: Duration) -> std::process::Output {
    let pid = child.id();
    let started = Instant::now();
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    while !waiter.is_finished() {
        if started.elapsed() > limit {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            // What it said before it was killed (a panic on one of its
            // threads, say), if its pipes close now.
            let mut said = String::from("(its output pipes stayed open)");
            for _ in 0..100 {
                if waiter.is_finished() {
                    if let Ok(o) = waiter.join() {
                        said = format!("stderr:\n{}", stderr(&o));
                    }
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            panic!("runner {pid} still running after {limit:?}; {said}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    waiter.join().unwrap()
}

/// The summary line of a runner's JSON Lines output.
fn summary(o: &std::process::Output) -> serde_json::Value {
    assert_eq!(code(o), Some(0), "runner failed: {}", stderr(o));
    json_lines(o).pop().unwrap()["summary"].clone()
}

/// Checks every thread completed with the same chain length (no step lost,
/// none doubled).
fn all_completed(store: &Store, ids: &[ThreadId]) {
    let mut seqs = HashMap::new();
    for &id in ids {
        let r = store.threads().get(id).unwrap().unwrap();
        assert_eq!(r.status, ThreadStatus::Completed, "thread {id}");
        assert_eq!(r.claimed_status, None, "thread {id}");
        *seqs.entry(r.seq).or_insert(0) += 1;
    }
    assert_eq!(seqs.len(), 1, "chain lengths differ: {seqs:?}");
}

/// Four runners, no failure: every (thread, role) is called exactly once,
/// and the runners' reports add up to the threads.
fn four_runners_share_the_threads_and_drive_each_once(b: TestBackend) {
    let env = Cli::new(b);
    let ids = {
        let store = env.location().open(Durability::None);
        idle_threads(&store, 300)
    };
    let log = env.path("calls.log").to_str().unwrap().to_owned();
    let agent = counting_agent(&env, &log);
    let runners: Vec<Child> = (0..4).map(|_| runner(&env, &agent)).collect();
    let mut threads = 0;
    let mut drove = 0;
    for r in runners {
        let s = summary(&finish(r, Duration::from_secs(300)));
        threads += s["threads"].as_u64().unwrap();
        drove += u64::from(s["threads"].as_u64().unwrap() > 0);
        assert_eq!(s["errors"], 0, "{s}");
    }
    assert_eq!(threads, 300, "each thread reported by exactly one runner");
    assert!(
        drove >= 2,
        "the threads were shared ({drove} runners drove any)"
    );
    let mut per_step: HashMap<(String, String), usize> = HashMap::new();
    for (_, thread, role) in calls(&log) {
        *per_step.entry((thread, role)).or_default() += 1;
    }
    assert_eq!(per_step.len(), 600, "two roles of 300 threads");
    let twice: Vec<_> = per_step.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "agent called more than once: {twice:?}");
    all_completed(&env.open_store(), &ids);
}

/// 2,000 threads, four runners, one killed with SIGKILL midway: the others
/// finish its threads. The only repeated agent calls are the killed
/// runner's steps in flight (never committed), at most one per job.
fn a_killed_runner_s_threads_are_finished_by_the_others(b: TestBackend) {
    const THREADS: usize = 2000;
    let env = Cli::new(b);
    let ids = {
        let store = env.location().open(Durability::None);
        idle_threads(&store, THREADS)
    };
    let log = env.path("calls.log").to_str().unwrap().to_owned();
    let agent = counting_agent(&env, &log);
    let mut runners: Vec<Child> = (0..4).map(|_| runner(&env, &agent)).collect();
    let victim = runners.remove(0);
    let victim_pid = victim.id();
    let survivors: Vec<u32> = runners.iter().map(Child::id).collect();
    // Midway: a third of the steps called, some of them by the victim.
    let started = Instant::now();
    loop {
        let c = calls(&log);
        if c.len() >= THREADS * 2 / 3 && c.iter().any(|(pid, _, _)| *pid == victim_pid) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(300), "no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut victim = victim;
    victim.kill().unwrap();
    victim.wait().unwrap();
    let killed_at = calls(&log).len();
    assert!(killed_at < THREADS * 2, "killed before the end");
    let mut threads = 0;
    for r in runners {
        let s = summary(&finish(r, Duration::from_secs(600)));
        threads += s["threads"].as_u64().unwrap();
        assert_eq!(s["errors"], 0, "{s}");
    }
    all_completed(&env.open_store(), &ids);
    let all = calls(&log);
    let mut per_step: HashMap<(String, String), Vec<u32>> = HashMap::new();
    for (pid, thread, role) in &all {
        per_step
            .entry((thread.clone(), role.clone()))
            .or_default()
            .push(*pid);
    }
    assert_eq!(per_step.len(), THREADS * 2, "every step was called");
    let mut repeated = 0;
    for (step, pids) in &per_step {
        if pids.len() > 1 {
            repeated += 1;
            // The victim's call in flight, then one survivor's. (An agent
            // the victim started just before it died may log its parent as
            // init: what no survivor called, the victim did.)
            assert_eq!(pids.len(), 2, "{step:?} called by {pids:?}");
            let by_survivors = pids.iter().filter(|p| survivors.contains(p)).count();
            assert_eq!(
                by_survivors, 1,
                "{step:?} called by {pids:?}; survivors {survivors:?}, victim {victim_pid}"
            );
        }
    }
    assert!(
        repeated <= 4,
        "{repeated} steps repeated; the victim had 4 jobs"
    );
    // The survivors drove what the victim did not finish.
    let victim_threads: std::collections::HashSet<&String> = all
        .iter()
        .filter(|(pid, _, _)| *pid == victim_pid)
        .map(|(_, t, _)| t)
        .collect();
    assert!(!victim_threads.is_empty());
    assert!(threads as usize >= THREADS - victim_threads.len());
}

process_conformance!(
    four_runners_share_the_threads_and_drive_each_once,
    a_killed_runner_s_threads_are_finished_by_the_others,
);

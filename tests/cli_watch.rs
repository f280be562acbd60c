//! Live watch through the real binary (issue 12, SPEC §11): `thread watch`
//! in one process while other processes step the thread prints every step
//! once, in order, and exits when the thread ends; killed and restarted
//! with `--after`, nothing is missed or repeated; `thread list --watch`
//! streams status changes. On LMDB and PostgreSQL.
#![cfg(feature = "cli")]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::Duration;

use common::backend::TestBackend;
use common::cli::*;

const REVIEW: &str = "examples/review.yaml";
const AGENT: &str = "script:examples/review.scenario.yaml";

/// Generous: a slow CI machine must not fail a correct watcher.
const PATIENCE: Duration = Duration::from_secs(60);

/// `uwf-db ARGS` with its stdout read line by line into a channel.
fn watcher(env: &Cli, args: &[&str]) -> (Child, Receiver<String>) {
    let mut child = env
        .std_cmd()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

fn next_line(rx: &Receiver<String>) -> serde_json::Value {
    let line = rx
        .recv_timeout(PATIENCE)
        .expect("the watcher printed nothing");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

fn step(env: &Cli, id: &str) {
    let o = env.uwf(&["thread", "step", id, "--agent", AGENT]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
}

/// (seq, hash) of every entry of `thread log`, oldest first.
fn logged(env: &Cli, id: &str) -> Vec<(u64, String)> {
    let mut log: Vec<(u64, String)> = env
        .log(id)
        .iter()
        .map(|e| {
            (
                e["seq"].as_u64().unwrap(),
                e["hash"].as_str().unwrap().into(),
            )
        })
        .collect();
    log.reverse();
    log
}

fn entry(v: &serde_json::Value) -> (u64, String) {
    (
        v["seq"].as_u64().unwrap(),
        v["hash"].as_str().unwrap().into(),
    )
}

fn watch_prints_every_step_once_in_order(b: TestBackend) {
    let env = Cli::new(b);
    let t = env.json(&["thread", "start", REVIEW, "-p", "task"]);
    let id = t["thread"].as_str().unwrap().to_owned();
    let (mut child, rx) = watcher(&env, &["--json", "thread", "watch", &id]);
    let mut seen = Vec::new();
    // Four role steps by four other processes; the watcher prints each.
    for n in 1..=4u64 {
        step(&env, &id);
        let v = next_line(&rx);
        assert_eq!(v["seq"], n, "{v}");
        seen.push(entry(&v));
    }
    // The end node (seq 5) came with the fourth step: printed, then the
    // watcher exits by itself.
    let v = next_line(&rx);
    assert_eq!(v["role"], "__end__", "{v}");
    seen.push(entry(&v));
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(
        matches!(
            rx.recv_timeout(PATIENCE),
            Err(RecvTimeoutError::Disconnected)
        ),
        "nothing after the end"
    );
    assert_eq!(seen, logged(&env, &id));
    // The entries are `thread log --json` entries.
    let log = env.log(&id);
    let o = env.uwf(&["--json", "thread", "watch", &id, "--after", "3"]);
    assert_eq!(code(&o), Some(0));
    let lines = json_lines(&o);
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0], log[1], "seq 4, as thread log shows it");
    assert_eq!(lines[1], log[0]);
}

fn a_restarted_watch_misses_and_repeats_nothing(b: TestBackend) {
    let env = Cli::new(b);
    let t = env.json(&["thread", "start", REVIEW, "-p", "task"]);
    let id = t["thread"].as_str().unwrap().to_owned();
    let (mut first, rx) = watcher(&env, &["--json", "thread", "watch", &id]);
    let mut seen = Vec::new();
    step(&env, &id);
    step(&env, &id);
    for _ in 0..2 {
        seen.push(entry(&next_line(&rx)));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    // Steps committed while nobody watches.
    step(&env, &id);
    let cursor = seen.last().unwrap().0.to_string();
    let (mut second, rx) = watcher(
        &env,
        &["--json", "thread", "watch", &id, "--after", &cursor],
    );
    seen.push(entry(&next_line(&rx)));
    step(&env, &id);
    seen.push(entry(&next_line(&rx)));
    seen.push(entry(&next_line(&rx)));
    assert!(second.wait().unwrap().success());
    assert_eq!(seen, logged(&env, &id), "each step exactly once, in order");
    // Text mode says where to resume.
    let o = env.uwf(&["thread", "watch", &id, "--after", "4"]);
    assert_eq!(code(&o), Some(0));
    assert!(stdout(&o).contains("#5"), "{}", stdout(&o));
    assert!(stdout(&o).contains("--after 5"), "{}", stdout(&o));
}

fn an_ended_thread_ends_the_watch_and_bad_input_is_refused(b: TestBackend) {
    let env = Cli::new(b);
    let t = env.json(&["thread", "start", REVIEW, "-p", "task"]);
    let id = t["thread"].as_str().unwrap().to_owned();
    // An unknown thread, a bad cursor.
    let o = env.uwf(&["thread", "watch", "01ARZ3NDEKTSV4RRFFQ69G5FAV"]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("no thread matches"), "{}", stderr(&o));
    let o = env.uwf(&["thread", "watch", &id, "--after", "-1"]);
    assert_eq!(code(&o), Some(2));
    // A cursor past the head prints nothing until the thread gets there.
    step(&env, &id);
    env.json(&["thread", "cancel", &id]);
    let o = env.uwf(&["--json", "thread", "watch", &id, "--after", "9"]);
    assert_eq!(code(&o), Some(0));
    assert!(json_lines(&o).is_empty());
    // Cancelled: the watch prints the rest and exits.
    let o = env.uwf(&["--json", "thread", "watch", &id]);
    let lines = json_lines(&o);
    assert_eq!(lines.len(), 2, "the step and the cancel's end node");
    assert_eq!(lines[1]["meta"]["return_code"], 2);
}

fn list_watch_streams_status_changes(b: TestBackend) {
    let env = Cli::new(b);
    let old = env.json(&["thread", "start", REVIEW, "-p", "before"]);
    let old = old["thread"].as_str().unwrap().to_owned();
    let (mut child, rx) = watcher(
        &env,
        &[
            "--json",
            "thread",
            "list",
            "--watch",
            "--workflow",
            "review",
        ],
    );
    // First the current state.
    let v = next_line(&rx);
    assert_eq!(v["thread"], old.as_str());
    assert_eq!(v["status"], "idle");
    assert!(v["labels"].is_object());
    // Then each change: a new thread, its steps, its end.
    let t = env.json(&["thread", "start", REVIEW, "-p", "task", "--label", "k=v"]);
    let id = t["thread"].as_str().unwrap().to_owned();
    let v = next_line(&rx);
    assert_eq!(
        (v["thread"].as_str(), v["status"].as_str()),
        (Some(&id[..]), Some("idle"))
    );
    assert_eq!(v["labels"]["k"], "v");
    let o = env.uwf(&["thread", "step", &id, "-c", "10", "--agent", AGENT]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    // Polled, so intermediate states may be merged; the last is the end.
    loop {
        let v = next_line(&rx);
        assert_eq!(v["thread"], id.as_str(), "only the changed thread: {v}");
        if v["status"] == "completed" {
            assert_eq!(v["seq"], 5);
            break;
        }
    }
    // Nothing more while nothing changes.
    assert!(matches!(
        rx.recv_timeout(Duration::from_millis(500)),
        Err(RecvTimeoutError::Timeout)
    ));
    // Interrupted like any command: exit 130.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{status:?}");
}

process_conformance!(
    watch_prints_every_step_once_in_order,
    a_restarted_watch_misses_and_repeats_nothing,
    an_ended_thread_ends_the_watch_and_bad_input_is_refused,
    list_watch_streams_status_changes,
);

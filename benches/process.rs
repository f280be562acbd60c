//! Bench `process` (issue 22, "short commands stay short"): agents, MCP
//! clients and scripts run `uwf-db` as a process many times per step, so
//! what a read command costs as a whole process matters. Each read command
//! on an LMDB store (one 1,000-step thread among 100) is timed against
//! `uwf-db --version` in the same run, alternating: wall time of the whole
//! process (spawn to exit) and its CPU time (user + system, from the
//! kernel's accounting of the child). Goal: a read command costs at most
//! 1 ms more than `--version`.
//!
//! Run: `cargo bench --bench process` (the release `uwf-db` binary).

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{children_cpu, placeholder_workflow, scratch_dir, start_thread};
use uwf_db::thread::{Next, StepWrite};
use uwf_db::{Store, StoreOptions};

const BIN: &str = env!("CARGO_BIN_EXE_uwf-db");
/// Runs of each command (alternating with `--version`).
const REPS: usize = 150;

/// Wall and CPU time of one run of `uwf-db ARGS` (stdout discarded).
fn run(store: &str, args: &[&str]) -> (Duration, Duration) {
    let before = children_cpu();
    let started = Instant::now();
    let status = Command::new(BIN)
        .arg("--store")
        .arg(store)
        .args(args)
        .env_remove("UWF_STORE")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run uwf-db");
    let wall = started.elapsed();
    assert!(status.success(), "uwf-db {args:?}: {status}");
    (wall, children_cpu() - before)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let dir = scratch_dir("process");
    let path = dir.path().join("store");
    let (long, other) = {
        let store = Store::open(&path, StoreOptions::default()).unwrap();
        let wf = placeholder_workflow(&store, "review");
        let low = store.threads().low_level();
        // 99 short threads, then one of 1,000 steps (the newest).
        for i in 0..99 {
            start_thread(&store, wf, "review", format!("task {i}"), "developer");
        }
        let t = start_thread(&store, wf, "review", "a long task".into(), "developer");
        let mut head = t.head;
        for i in 0..1000 {
            let step = StepWrite {
                role: "developer".into(),
                meta: Default::default(),
                reply: format!("turn {i}: {}", "words ".repeat(40)),
                artifacts: vec![],
                instruction: "Go on".into(),
                child_thread: None,
            };
            let next = Next::Role {
                role: "developer".into(),
                instruction: "Go on".into(),
                location: None,
            };
            head = low.append_step(t.id, head, step, next).unwrap().record.head;
        }
        let other = store.threads().list(&Default::default()).unwrap();
        (t.id.to_string(), other.last().unwrap().id.to_string())
    };
    let store = path.to_str().unwrap().to_owned();
    let commands: Vec<(&str, Vec<&str>)> = vec![
        ("thread list", vec!["thread", "list"]),
        ("thread list --json", vec!["--json", "thread", "list"]),
        ("thread show (1,000 steps)", vec!["thread", "show", &long]),
        ("thread show (no steps)", vec!["thread", "show", &other]),
        (
            "thread log --limit 50 (newest of 1,000 steps)",
            vec!["thread", "log", &long, "--limit", "50"],
        ),
        (
            "thread log --json --limit 50",
            vec!["--json", "thread", "log", &long, "--limit", "50"],
        ),
    ];
    println!("\n## process: a read command as a whole process vs `uwf-db --version`\n");
    println!("goal: at most 1 ms more than `--version` (wall and CPU)\n");
    println!(
        "| command | wall ms | `--version` wall ms | excess ms | CPU ms | `--version` CPU ms | excess ms | ratio (wall) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (name, args) in &commands {
        let (mut w, mut c, mut vw, mut vc) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        // Warm the page cache for both.
        run(&store, args);
        run(&store, &["--version"]);
        for i in 0..REPS {
            let mut subject = || {
                let (a, b) = run(&store, args);
                w.push(a);
                c.push(b);
            };
            let mut baseline = || {
                let (a, b) = run(&store, &["--version"]);
                vw.push(a);
                vc.push(b);
            };
            if i % 2 == 0 {
                subject();
                baseline();
            } else {
                baseline();
                subject();
            }
        }
        let (w, c, vw, vc) = (median(w), median(c), median(vw), median(vc));
        println!(
            "| {name} | {:.2} | {:.2} | {:+.2} | {:.2} | {:.2} | {:+.2} | {:.2}× |",
            ms(w),
            ms(vw),
            ms(w) - ms(vw),
            ms(c),
            ms(vc),
            ms(c) - ms(vc),
            vw.as_secs_f64() / w.as_secs_f64()
        );
    }
    println!(
        "\nmachine: {} cores; {REPS} runs of each, alternating; medians",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
}

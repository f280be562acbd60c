//! `uwf-db batch` through the real binary: prompt files (text and JSON
//! Lines), streamed JSON Lines results, usage errors, and a batch killed
//! mid-run that `batch --continue` finishes.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;

fn batch_runs_threads_from_a_prompt_file_and_streams_json_lines(b: TestBackend) {
    let env = Cli::new(b);
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

fn a_batch_killed_mid_run_keeps_every_acknowledged_step(b: TestBackend) {
    // The kill can land while no thread is mid-drive (every driver between
    // two threads): then there is nothing to take over, and the run is
    // repeated on a fresh store, up to `TRIES` times (issue 18: this was a
    // CI flake). The assertions are the same whichever run is kept.
    const TRIES: usize = 5;
    let mut tries = 0;
    let (env, reported, all) = loop {
        tries += 1;
        let (env, reported) = kill_a_batch_after_40_threads(b);
        let listed = env.json(&["thread", "list", "--limit", "100000"]);
        let all = listed.as_array().unwrap().len();
        let completed = listed
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["status"] == "completed")
            .count();
        if all > completed || tries == TRIES {
            break (env, reported, all);
        }
        eprintln!("try {tries}: the kill caught no thread mid-drive; again on a fresh store");
    };
    for id in &reported {
        let s = env.show(id);
        assert_eq!(s["status"], "completed", "{s}");
        assert_eq!(env.log(id).len(), 5, "thread {id}: every step is there");
    }
    assert!(all >= reported.len());
    // Threads caught mid-drive show a dead driver's claim; `batch
    // --continue` takes them over and finishes every one.
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

/// A durable batch of many threads, killed (SIGKILL) once 40 threads are
/// reported done; returns its store and the threads it reported.
fn kill_a_batch_after_40_threads(b: TestBackend) -> (Cli, Vec<String>) {
    use std::io::{BufRead, BufReader};
    let env = Cli::new(b);
    let mut child = env
        .std_cmd()
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
    (env, reported)
}

fn batch_reads_multi_line_prompts_from_json_lines(b: TestBackend) {
    let env = Cli::new(b);
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

fn batch_json_stops_starting_threads_when_its_reader_is_gone(b: TestBackend) {
    use std::io::{BufRead, BufReader};
    let env = Cli::new(b);
    let wf = env.file(
        "one.yaml",
        "name: one\nroles:\n  worker:\n    goal: Work\ngraph:\n  $START:\n    _: { role: worker, prompt: 'Work' }\n  worker:\n    _: { role: $END, prompt: 'Done' }\n",
    );
    // 200 threads of 0.1 s each, two at a time: at least 10 s to drive them
    // all.
    let mut child = env
        .std_cmd()
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

/// `batch --continue` without `--agent` drives the idle threads with the
/// agent they were started with when they share one (as `thread step`
/// reuses a thread's), refuses when they differ (naming them) and drives
/// nothing then; `--agent` still overrides.
fn continue_reuses_the_agent_the_idle_threads_share(b: TestBackend) {
    const SCRIPT: &str = "script:examples/review.scenario.yaml";
    let env = Cli::new(b);
    let start = |prompt: &str, agent: &str| {
        env.json(&[
            "thread",
            "start",
            "examples/review.yaml",
            "-p",
            prompt,
            "--agent",
            agent,
        ])["thread"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let shared = [start("a", SCRIPT), start("b", SCRIPT)];
    let o = env.uwf(&["batch", "examples/review.yaml", "--continue"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    for id in &shared {
        assert_eq!(env.show(id)["status"], "completed", "thread {id}");
    }
    // Nothing idle: said, with or without an agent.
    let o = env.uwf(&["batch", "examples/review.yaml", "--continue"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("no idle thread"));
    // Two agents among the idle threads: refused, nothing driven.
    let mixed = [start("c", SCRIPT), start("d", "cmd:false")];
    let o = env.uwf(&["batch", "examples/review.yaml", "--continue"]);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("2 different agents") && err.contains("cmd:false") && err.contains(SCRIPT),
        "{err}"
    );
    for id in &mixed {
        assert_eq!(env.show(id)["seq"], 0, "thread {id} was not driven");
    }
    // --agent drives them all with the one it names.
    let o = env.uwf(&[
        "batch",
        "examples/review.yaml",
        "--continue",
        "--agent",
        SCRIPT,
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    for id in &mixed {
        assert_eq!(env.show(id)["status"], "completed", "thread {id}");
    }
}

process_conformance!(
    continue_reuses_the_agent_the_idle_threads_share,
    batch_runs_threads_from_a_prompt_file_and_streams_json_lines,
    a_batch_killed_mid_run_keeps_every_acknowledged_step,
    batch_reads_multi_line_prompts_from_json_lines,
    batch_json_stops_starting_threads_when_its_reader_is_gone,
);

/// On a terminal (`script` gives the batch one), the progress line says
/// threads done, failed and running, calls per second, the cost reported
/// so far and an ETA; `-q` draws none; without a terminal there is none.
#[test]
fn the_progress_line_on_a_terminal() {
    let env = Cli::new(TestBackend::Lmdb);
    env.json(&["workflow", "add", "examples/review.yaml"]);
    let agent = env.file(
        "agent.sh",
        "sleep 0.4\n\
         case \"$UWF_ROLE\" in developer) s=review_needed ;; *) s=approved ;; esac\n\
         [ \"$UWF_ROLE\" = developer ] && case \"$(cat)\" in *'prompt 3'*) exit 7 ;; esac\n\
         printf -- '---\\n$status: %s\\n$usage: {cost_usd: 0.01}\\n---\\nok\\n' \"$s\"\n",
    );
    let store = env.store_arg().into_string().unwrap();
    let bin = env!("CARGO_BIN_EXE_uwf-db");
    let run = |quiet: &str| {
        let line = format!(
            "{bin} --store {store} {quiet} batch review --prompts {prompts} --agent 'cmd:sh {agent}' --jobs 4",
            prompts = env.file(
                "p.txt",
                &(0..16).map(|i| format!("prompt {i}\n")).collect::<String>()
            ),
        );
        let typescript = env.path("typescript");
        let o = std::process::Command::new("script")
            .args(["-qfec", &line])
            .arg(&typescript)
            .env_remove("UWF_STORE")
            .current_dir(root())
            .output()
            .expect("`script` (util-linux) gives the batch a terminal");
        assert_eq!(o.status.code(), Some(1), "one thread fails: exit 1");
        let raw = std::fs::read_to_string(&typescript).unwrap();
        raw.replace('\r', "\n")
    };
    let shown = run("");
    let frames: Vec<&str> = shown
        .lines()
        .filter(|l| l.contains("review threads ["))
        .collect();
    assert!(frames.len() >= 3, "{shown}");
    assert!(frames.iter().any(|f| f.contains(" running")), "{frames:?}");
    assert!(frames.iter().any(|f| f.contains("1 failed")), "{frames:?}");
    assert!(frames.iter().any(|f| f.contains("calls/s")), "{frames:?}");
    assert!(frames.iter().any(|f| f.contains("$0.")), "{frames:?}");
    assert!(frames.iter().any(|f| f.contains("ETA")), "{frames:?}");
    // The summary after it.
    assert!(shown.contains("16: 15 completed"), "{shown}");
    let quiet = run("-q");
    assert!(!quiet.contains("review threads ["), "{quiet}");
}

//! The `claude:` agent through the real binary (issue 21, "Agent CLIs as
//! agents"), against `tests/fixtures/fake-claude` (named by `UWF_CLAUDE`;
//! no test runs the real Claude Code): the exact command line, run in the
//! step's directory with the prompt on stdin; the JSON result's reply and
//! usage recorded; an `is_error` result, a crash without JSON and a hang
//! each failing the step clearly. On LMDB and PostgreSQL.
#![cfg(feature = "cli")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use common::backend::TestBackend;
use common::cli::*;

/// The stand-in for `claude`.
fn fake_claude() -> PathBuf {
    root().join("tests/fixtures/fake-claude")
}

/// Runs `uwf-db ARGS` with the stand-in as the `claude:` program, in
/// `mode`, recording its calls in `record`.
fn with_fake(env: &Cli, mode: &str, record: &Path, args: &[&str]) -> Output {
    env.cmd()
        .env("UWF_CLAUDE", fake_claude())
        .env("FAKE_CLAUDE_MODE", mode)
        .env("FAKE_CLAUDE_RECORD", record)
        .args(args)
        .output()
        .unwrap()
}

/// A directory for the stand-in's records.
fn record_dir(env: &Cli) -> PathBuf {
    let dir = env.path("calls");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn recorded(record: &Path, what: &str) -> String {
    std::fs::read_to_string(record.join(what)).unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn close(a: &serde_json::Value, b: f64) -> bool {
    a.as_f64().is_some_and(|a| (a - b).abs() < 1e-9)
}

fn a_claude_agent_answers_from_its_json_result_with_usage(b: TestBackend) {
    let env = Cli::new(b);
    let record = record_dir(&env);
    let project = env.path("project");
    std::fs::create_dir_all(&project).unwrap();
    let spec = "claude:--model claude-test --allowedTools 'Read,Edit'";
    let o = with_fake(
        &env,
        "success",
        &record,
        &[
            "--json",
            "run",
            "examples/review.yaml",
            "-p",
            "Add a --json flag",
            "--cwd",
            project.to_str().unwrap(),
            "--agent",
            spec,
        ],
    );
    let r = json_of(&o);
    assert_eq!(r["status"], "completed", "{r}");
    let id = r["thread"].as_str().unwrap();

    // The exact command line, in the step's directory, the prompt on stdin,
    // the thread and role in the environment.
    for role in ["developer", "reviewer"] {
        let argv = recorded(&record, &format!("argv.{role}"));
        assert_eq!(
            argv.lines().collect::<Vec<_>>(),
            [
                "-p",
                "--output-format",
                "json",
                "--model",
                "claude-test",
                "--allowedTools",
                "Read,Edit"
            ],
            "{role}"
        );
        assert_eq!(
            Path::new(recorded(&record, &format!("cwd.{role}")).trim()),
            project.canonicalize().unwrap(),
            "{role}"
        );
        let envs = recorded(&record, &format!("env.{role}"));
        assert!(envs.contains(&format!("UWF_THREAD={id}\n")), "{envs}");
        assert!(envs.contains(&format!("UWF_ROLE={role}\n")), "{envs}");
    }
    let prompt = recorded(&record, "stdin.developer");
    assert!(prompt.contains("Add a --json flag"), "{prompt}");
    assert!(prompt.contains("$status"), "the output format is asked for");

    // The reply is the JSON's `result`; its usage is the step's.
    let log = env.log(id);
    let (end, steps) = log.split_first().unwrap();
    assert!(end["usage"]["calls"].is_null(), "{end}");
    assert_eq!(steps.len(), 2, "{log:?}");
    for e in steps {
        let role = e["role"].as_str().unwrap();
        let status = e["meta"]["$status"].as_str().unwrap();
        assert_eq!(
            e["content"].as_str().unwrap().trim(),
            format!("{status} by fake-claude as {role}"),
            "{e}"
        );
        let u = &e["usage"];
        assert_eq!(u["calls"], 1, "{e}");
        assert_eq!(u["input_tokens"], 15, "input plus cache tokens: {u}");
        assert_eq!(u["output_tokens"], 20, "{u}");
        assert!(close(&u["cost_usd"], 0.0123), "{u}");
        assert_eq!(u["model"], "claude-fake-1", "{u}");
    }
    let show = env.show(id);
    let u = &show["usage"];
    assert_eq!(u["calls"], 2, "{show}");
    assert_eq!(u["input_tokens"], 30, "{u}");
    assert_eq!(u["output_tokens"], 40, "{u}");
    assert!(close(&u["cost_usd"], 0.0246), "{u}");
    // The spec is stored on the thread, as given.
    assert_eq!(show["agent"], spec, "{show}");
}

fn an_is_error_result_fails_the_step_with_the_agents_message(b: TestBackend) {
    let env = Cli::new(b);
    let record = record_dir(&env);
    let o = with_fake(
        &env,
        "error",
        &record,
        &[
            "run",
            "examples/review.yaml",
            "-p",
            "t",
            "--agent",
            "claude:",
        ],
    );
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    let message = format!(
        "{} reported an error: Credit balance is too low",
        fake_claude().display()
    );
    assert!(stderr(&o).contains(&message), "{}", stderr(&o));
    // The default command line: nothing after the fixed flags.
    assert_eq!(
        recorded(&record, "argv.developer")
            .lines()
            .collect::<Vec<_>>(),
        ["-p", "--output-format", "json"]
    );
    let list = env.json(&["thread", "list", "--failed"]);
    let id = list[0]["thread"].as_str().unwrap().to_owned();
    let show = env.show(&id);
    assert_eq!(show["status"], "idle", "kept for another try: {show}");
    assert_eq!(show["next_role"], "developer", "{show}");
    assert!(
        show["last_error"].as_str().unwrap().contains(&message),
        "{show}"
    );
    assert!(env.log(&id).is_empty(), "no step was written");
    // The failed call is counted, with what the agent said it cost.
    assert_eq!(show["usage"]["calls"], 1, "{show}");
    assert_eq!(show["usage"]["input_tokens"], 7, "{show}");
    assert_eq!(show["usage"]["output_tokens"], 3, "{show}");
    assert!(close(&show["usage"]["cost_usd"], 0.002), "{show}");
}

fn a_crash_without_json_is_reported_with_its_output(b: TestBackend) {
    let env = Cli::new(b);
    let record = record_dir(&env);
    let o = with_fake(
        &env,
        "crash",
        &record,
        &[
            "run",
            "examples/review.yaml",
            "-p",
            "t",
            "--agent",
            "claude:",
        ],
    );
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    for says in [
        "printed no JSON result",
        "exited with exit status: 1",
        "stdout is not JSON",
        "Segmentation fault (core dumped) #!%@ garbage",
        "fake-claude: internal error: boom",
    ] {
        assert!(err.contains(says), "{says}: {err}");
    }
    let list = env.json(&["thread", "list", "--failed"]);
    assert!(
        list[0]["last_error"]
            .as_str()
            .unwrap()
            .contains("printed no JSON result"),
        "{list}"
    );
}

fn a_slow_claude_is_killed_with_its_process_group_at_the_timeout(b: TestBackend) {
    let env = Cli::new(b);
    let record = record_dir(&env);
    let started = Instant::now();
    let o = with_fake(
        &env,
        "slow",
        &record,
        &[
            "run",
            "examples/review.yaml",
            "-p",
            "t",
            "--agent-timeout",
            "1s",
            "--agent",
            "claude:",
        ],
    );
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("timed out"), "{}", stderr(&o));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
    // The process the stand-in left in the background died with it.
    #[cfg(target_os = "linux")]
    sleeper_is_gone(&recorded(&record, "sleeper.pid"));
    let list = env.json(&["thread", "list", "--failed"]);
    assert!(
        list[0]["last_error"]
            .as_str()
            .unwrap()
            .contains("timed out"),
        "{list}"
    );
}

/// Waits (at most 10 s, else panics) until process `pid` is gone or a
/// zombie: killed.
#[cfg(target_os = "linux")]
fn sleeper_is_gone(pid: &str) {
    let stat = PathBuf::from(format!("/proc/{}/stat", pid.trim()));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let gone = std::fs::read_to_string(&stat).map_or(true, |s| {
            s.rsplit(") ").next().unwrap_or("").starts_with('Z')
        });
        if gone {
            break;
        }
        assert!(Instant::now() < deadline, "sleeper {pid} still runs");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn claude_specs_that_cannot_work_are_refused_clearly(b: TestBackend) {
    let env = Cli::new(b);
    let t = env.json(&["thread", "start", "examples/review.yaml", "-p", "t"]);
    let id = t["thread"].as_str().unwrap();
    // A changed output format is refused before anything runs, and the
    // spec is not stored.
    let o = env.uwf(&[
        "thread",
        "step",
        id,
        "--agent",
        "claude:--output-format text",
    ]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("--output-format cannot be given"),
        "{}",
        stderr(&o)
    );
    assert_eq!(env.show(id)["agent"], serde_json::Value::Null);
    // A program that does not exist is named.
    let o = env
        .cmd()
        .env("UWF_CLAUDE", "/no/such/claude")
        .args(["thread", "step", id, "--agent", "claude:"])
        .output()
        .unwrap();
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("cannot run agent program '/no/such/claude'"),
        "{}",
        stderr(&o)
    );
}

/// A role's `model:` and `allowedTools:` reach the command line, unless
/// the spec sets that flag itself (the operator's spec wins).
fn a_role_names_its_model_and_tools_unless_the_spec_does(b: TestBackend) {
    let env = Cli::new(b);
    let yaml = std::fs::read_to_string(root().join("examples/review.yaml"))
        .unwrap()
        .replace(
            "    description: Implements changes\n",
            "    description: Implements changes\n    model: claude-deep\n    allowedTools: [Read, 'Bash(cargo test:*)']\n",
        );
    assert!(yaml.contains("model: claude-deep"), "the example changed");
    let wf = env.file("review.yaml", &yaml);
    let record = record_dir(&env);
    let argv = |role: &str| -> Vec<String> {
        recorded(&record, &format!("argv.{role}"))
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let o = with_fake(
        &env,
        "success",
        &record,
        &["--json", "run", &wf, "-p", "t", "--agent", "claude:"],
    );
    assert_eq!(json_of(&o)["status"], "completed");
    assert_eq!(
        argv("developer"),
        [
            "-p",
            "--output-format",
            "json",
            "--model",
            "claude-deep",
            "--allowedTools",
            "Read,Bash(cargo test:*)"
        ]
    );
    // The reviewer role names neither.
    assert_eq!(argv("reviewer"), ["-p", "--output-format", "json"]);
    // A spec that sets the model keeps it; the role still adds its tools.
    let o = with_fake(
        &env,
        "success",
        &record,
        &[
            "--json",
            "run",
            "review",
            "-p",
            "t",
            "--agent",
            "claude:--model=claude-fast",
        ],
    );
    assert_eq!(json_of(&o)["status"], "completed");
    assert_eq!(
        argv("developer"),
        [
            "-p",
            "--output-format",
            "json",
            "--model=claude-fast",
            "--allowedTools",
            "Read,Bash(cargo test:*)"
        ]
    );
    // Stored with the workflow, shown by `workflow show`.
    let shown = env.json(&["workflow", "show", "review"]);
    let dev = &shown["roles"]["developer"];
    assert_eq!(dev["model"], "claude-deep", "{shown}");
    assert!(
        shown["workflow"]["roles"]["reviewer"]
            .get("model")
            .is_none()
    );
}

process_conformance!(
    a_role_names_its_model_and_tools_unless_the_spec_does,
    a_claude_agent_answers_from_its_json_result_with_usage,
    an_is_error_result_fails_the_step_with_the_agents_message,
    a_crash_without_json_is_reported_with_its_output,
    a_slow_claude_is_killed_with_its_process_group_at_the_timeout,
    claude_specs_that_cannot_work_are_refused_clearly,
);

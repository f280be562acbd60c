//! The rest of the reference's workflow language through the real binary
//! (SPEC §13, issue 23): a reply of `$status: $SUSPEND`, `!include`, a
//! workflow at `NAME/index.yaml`, `thread pause`; and the small truths: a
//! resume without an answer, `thread show` printing the task,
//! `batch --continue --label`.
#![cfg(feature = "cli")]

mod common;

use std::time::{Duration, Instant};

use common::backend::TestBackend;
use common::cli::*;

/// The reference's suspend without a graph edge: a role replies
/// `$status: $SUSPEND` with its question as `reason`; the thread suspends
/// at that role with the question as the message, and resuming runs that
/// role again with the answer.
fn a_role_suspends_with_status_suspend_and_runs_again_on_resume(b: TestBackend) {
    let cli = Cli::new(b);
    let sc = cli.file(
        "ask.yaml",
        &review_scenario(&[
            ("developer", "$status: $SUSPEND\nreason: Which branch?"),
            ("developer", DEV),
            ("reviewer", "$status: approved"),
        ]),
    );
    let r = cli.json(&[
        "run",
        "examples/review.yaml",
        "-p",
        "Fix the bug",
        "--agent",
        &format!("script:{sc}"),
    ]);
    assert_eq!(r["status"], "suspended", "{r}");
    assert_eq!(r["suspended_role"], "developer");
    assert_eq!(r["suspend_message"], "Which branch?");
    let id = r["thread"].as_str().unwrap();
    // The suspending reply is a committed step of the role.
    let log = cli.log(id);
    assert_eq!(log.len(), 1);
    assert_eq!(log[0]["status"], "$SUSPEND");
    assert_eq!(log[0]["meta"]["reason"], "Which branch?");
    let r = cli.json(&["thread", "resume", id, "-p", "main", "-c", "5"]);
    let last = r.as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["status"], "completed", "{r}");
    let log = cli.log(id);
    let inputs: Vec<(&str, &str)> = log
        .iter()
        .rev()
        .map(|e| (e["role"].as_str().unwrap(), e["input"].as_str().unwrap()))
        .collect();
    assert_eq!(inputs[1], ("developer", "Which branch?\n\nmain"));
    assert_eq!(inputs[2], ("reviewer", "Review the change"));
    // The schema's own statuses still hold: another unknown one fails.
    let bad = cli.file(
        "bad.yaml",
        &review_scenario(&[("developer", "$status: $PAUSE")]),
    );
    let o = cli.uwf(&[
        "run",
        "examples/review.yaml",
        "-p",
        "t",
        "--agent",
        &format!("script:{bad}"),
    ]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("$PAUSE"), "{}", stderr(&o));
}

/// `!include PATH`: roles and schemas in other files, resolved against the
/// including file's folder; escapes, absolute paths and cycles refused.
fn include_takes_roles_and_schemas_from_other_files(b: TestBackend) {
    let cli = Cli::new(b);
    let dir = cli.path("flows/ship");
    std::fs::create_dir_all(dir.join("roles/schemas")).unwrap();
    std::fs::write(
        dir.join("index.yaml"),
        "roles:
  writer: !include roles/writer.yaml
  checker:
    goal: Check the work
    frontmatter: !include roles/schemas/verdict.yaml
graph:
  $START: { _: { role: writer, prompt: 'Write it' } }
  writer: { _: { role: checker, prompt: 'Check it' } }
  checker: { ok: { role: $END, prompt: 'Shipped' } }
",
    )
    .unwrap();
    std::fs::write(
        dir.join("roles/writer.yaml"),
        "goal: Write the release notes\nprocedure: Read the changelog\n",
    )
    .unwrap();
    // Resolved against the including file's own folder.
    std::fs::write(
        dir.join("roles/schemas/verdict.yaml"),
        "properties: { $status: { const: ok } }\nrequired: [$status]\n",
    )
    .unwrap();
    let dir_arg = dir.to_str().unwrap();
    let added = cli.json(&["workflow", "add", dir_arg]);
    assert_eq!(added["name"], "ship", "the folder's name: {added}");
    let shown = cli.json(&["workflow", "show", "ship"]);
    let wf = &shown;
    assert_eq!(
        wf["roles"]["writer"]["goal"], "Write the release notes",
        "{shown}"
    );
    assert_eq!(
        wf["roles"]["checker"]["frontmatter"]["properties"]["$status"]["const"],
        "ok"
    );
    let sc = cli.file(
        "ship.scenario.yaml",
        "steps:\n  - { role: writer, output: \"notes\" }\n  - { role: checker, output: \"---\\n$status: ok\\n---\\nfine\" }\n",
    );
    let r = cli.json(&[
        "run",
        dir_arg,
        "-p",
        "2.0",
        "--agent",
        &format!("script:{sc}"),
    ]);
    assert_eq!(r["status"], "completed", "{r}");

    // Out of the folder, absolute, a cycle, a symlink: each refused with
    // what and where.
    std::fs::write(cli.path("flows/secret.yaml"), "goal: Leak\n").unwrap();
    let bad = |name: &str, writer: &str| {
        let d = cli.path(&format!("flows/{name}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("index.yaml"),
            format!(
                "roles:\n  writer: {writer}\ngraph:\n  $START: {{ _: {{ role: writer, prompt: 'W' }} }}\n  writer: {{ _: {{ role: $END, prompt: 'D' }} }}\n"
            ),
        )
        .unwrap();
        let o = cli.uwf(&["workflow", "add", d.to_str().unwrap()]);
        assert_eq!(code(&o), Some(1), "{name}: {}", stdout(&o));
        stderr(&o)
    };
    let e = bad("escape", "!include ../secret.yaml");
    assert!(e.contains("../secret.yaml"), "{e}");
    let e = bad(
        "absolute",
        &format!("!include {}", cli.path("flows/secret.yaml").display()),
    );
    assert!(e.contains("secret.yaml"), "{e}");
    let d = cli.path("flows/cycle");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("a.yaml"), "goal: !include b.yaml\n").unwrap();
    std::fs::write(d.join("b.yaml"), "!include a.yaml\n").unwrap();
    let e = bad("cycle", "!include a.yaml");
    assert!(e.to_lowercase().contains("a.yaml"), "{e}");
    let d = cli.path("flows/link");
    std::fs::create_dir_all(&d).unwrap();
    std::os::unix::fs::symlink(cli.path("flows/secret.yaml"), d.join("role.yaml")).unwrap();
    let e = bad("link", "!include role.yaml");
    assert!(e.contains("role.yaml"), "{e}");
    assert_eq!(
        cli.json(&["workflow", "list"]).as_array().unwrap().len(),
        1,
        "nothing refused was registered"
    );
}

/// A workflow at `NAME/index.yaml` takes its folder's name; a `name:` that
/// differs is refused, naming the folder.
fn a_workflow_folder_takes_its_name(b: TestBackend) {
    let cli = Cli::new(b);
    let d = cli.path("triage");
    std::fs::create_dir_all(&d).unwrap();
    let body = "roles:\n  sorter: { goal: Sort }\ngraph:\n  $START: { _: { role: sorter, prompt: 'Sort' } }\n  sorter: { _: { role: $END, prompt: 'Sorted' } }\n";
    std::fs::write(d.join("index.yaml"), body).unwrap();
    let file = d.join("index.yaml");
    let added = cli.json(&["workflow", "add", file.to_str().unwrap()]);
    assert_eq!(added["name"], "triage");
    std::fs::write(d.join("index.yaml"), format!("name: sorting\n{body}")).unwrap();
    let o = cli.uwf(&["workflow", "add", file.to_str().unwrap()]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("'sorting' must match the file stem 'triage'"),
        "{}",
        stderr(&o)
    );
    // A folder without an index.yaml says so.
    std::fs::create_dir_all(cli.path("empty")).unwrap();
    let o = cli.uwf(&["workflow", "add", cli.path("empty").to_str().unwrap()]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("without an index.yaml"),
        "{}",
        stderr(&o)
    );
}

/// `thread pause` is `thread stop`: the live driver stops after the step
/// in flight, which is kept.
fn thread_pause_stops_after_the_step_in_flight(b: TestBackend) {
    let cli = Cli::new(b);
    let t = cli.json(&["thread", "start", "examples/review.yaml", "-p", "t"]);
    let id = t["thread"].as_str().unwrap().to_owned();
    let agent = "cmd:sh -c 'sleep 1; if grep -q \"Review the change\"; then printf -- \"---\\n\\$status: rejected\\nreason: again\\n---\\nno\\n\"; else printf -- \"---\\n\\$status: review_needed\\n---\\ndone\\n\"; fi'";
    let driver = cli
        .std_cmd()
        .args(["thread", "step", &id, "-c", "10", "--agent", agent])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while cli.show(&id)["status"] != "running" {
        assert!(started.elapsed() < Duration::from_secs(20), "no driver");
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = cli.uwf(&["thread", "pause", &id]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let out = driver.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("stopped after the step in flight"));
    let s = cli.show(&id);
    assert_eq!(s["status"], "idle", "{s}");
    let steps = cli.log(&id).len();
    assert!((1..10).contains(&steps), "{steps}");
}

/// `thread resume` of a suspended thread without `-p` says it needs the
/// human's answer, or takes it from stdin; `thread show` prints the task.
fn resume_needs_the_answer_and_show_prints_the_task(b: TestBackend) {
    let cli = Cli::new(b);
    let r = cli.json(&[
        "run",
        "examples/planner.yaml",
        "-p",
        "Export the report",
        "--agent",
        "script:examples/planner.scenario.yaml",
    ]);
    assert_eq!(r["status"], "suspended");
    let id = r["thread"].as_str().unwrap();
    let o = cli.uwf(&["thread", "resume", id]);
    assert_eq!(code(&o), Some(1));
    let e = stderr(&o);
    assert!(e.contains("waiting for a human's answer"), "{e}");
    assert!(
        e.contains("Which database should the export support?"),
        "{e}"
    );
    assert!(e.contains(&format!("uwf-db thread resume {id} -p")), "{e}");
    assert_eq!(cli.show(id)["status"], "suspended", "nothing changed");
    let o = cli.uwf_stdin(&["--json", "thread", "resume", id], b"PostgreSQL\n");
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let log = cli.log(id);
    let input = log[0]["input"].as_str().unwrap();
    assert!(
        input.contains("Which database should the export support?"),
        "{input}"
    );
    assert!(
        input.ends_with("\n\nPostgreSQL"),
        "the answer, its newline trimmed: {input:?}"
    );
    // The task, in text and JSON.
    let o = cli.uwf(&["thread", "show", id]);
    let text = stdout(&o);
    assert!(
        text.lines()
            .any(|l| l.starts_with("task") && l.ends_with("Export the report")),
        "{text}"
    );
    assert_eq!(cli.show(id)["task"], "Export the report");
}

/// `batch --continue --label K=V` takes only the threads with that label.
fn batch_continue_takes_only_the_labelled_threads(b: TestBackend) {
    let cli = Cli::new(b);
    let start = |label: &str| {
        let t = cli.json(&[
            "thread",
            "start",
            "examples/review.yaml",
            "-p",
            "t",
            "--label",
            label,
        ]);
        t["thread"].as_str().unwrap().to_owned()
    };
    let a = [start("team=a"), start("team=a")];
    let other = start("team=b");
    let o = cli.uwf(&[
        "--json",
        "batch",
        "review",
        "--continue",
        "--label",
        "team=a",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let summary = json_lines(&o).pop().unwrap();
    assert_eq!(summary["summary"]["threads"], 2, "{summary}");
    for id in &a {
        assert_eq!(cli.show(id)["status"], "completed");
    }
    assert_eq!(cli.show(&other)["status"], "idle");
}

process_conformance!(
    a_role_suspends_with_status_suspend_and_runs_again_on_resume,
    include_takes_roles_and_schemas_from_other_files,
    a_workflow_folder_takes_its_name,
    thread_pause_stops_after_the_step_in_flight,
    resume_needs_the_answer_and_show_prints_the_task,
    batch_continue_takes_only_the_labelled_threads,
);

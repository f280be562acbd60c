//! Where agents work (SPEC §4, `location`): a thread's working directory
//! (`--cwd`, else where it was started), an edge's `location` rendered from
//! the previous step's frontmatter and resolved against it, recorded with
//! the step; a directory that does not exist fails the step, naming it.
#![cfg(feature = "cli")]

mod common;

use std::path::Path;

use common::backend::TestBackend;
use common::cli::*;

/// In the reference's style: the picker names a directory, the worker
/// works there.
const WHERE: &str = r#"version: 1
name: where
roles:
  picker:
    goal: Pick a directory
    frontmatter:
      oneOf:
        - properties: { $status: { const: picked }, repoPath: { type: string } }
          required: [$status, repoPath]
  worker:
    goal: Work there
graph:
  $START:
    new: { role: picker, prompt: 'Pick a directory' }
  picker:
    picked: { role: worker, prompt: 'Work in {{ repoPath }}', location: '{{ repoPath }}' }
  worker:
    _: { role: $END, prompt: '{{{ _body }}}' }
"#;

/// A `cmd:` agent: the picker answers with the directory in `pick`; the
/// worker prints where it runs.
fn agent(env: &Cli, pick: &Path) -> String {
    let script = env.file(
        "where.sh",
        &format!(
            "cat > /dev/null\nif [ \"$UWF_ROLE\" = picker ]; then printf -- '---\\n$status: picked\\nrepoPath: %s\\n---\\nPicked.\\n' \"$(cat {})\"; else printf 'worked in %s\\n' \"$(pwd)\"; fi\n",
            pick.display()
        ),
    );
    format!("cmd:sh {script}")
}

fn an_agent_works_at_its_edge_location_under_the_thread_directory(b: TestBackend) {
    let env = Cli::new(b);
    let project = env.path("project");
    std::fs::create_dir_all(project.join("sub")).unwrap();
    let wf = env.file("where.yaml", WHERE);
    let pick = env.path("pick");
    std::fs::write(&pick, "sub").unwrap();
    let spec = agent(&env, &pick);
    let cwd = project.to_str().unwrap();
    let r = env.json(&["run", &wf, "-p", "t", "--cwd", cwd, "--agent", &spec]);
    assert_eq!(r["status"], "completed", "{r}");
    let id = r["thread"].as_str().unwrap();
    let log = env.log(id);
    // Newest first: the end, the worker, the picker.
    let worker = &log[1];
    assert_eq!(worker["role"], "worker");
    let dir = project.join("sub");
    assert_eq!(worker["meta"]["$cwd"], dir.to_str().unwrap(), "{worker}");
    // The agent really ran there; the picker (no location) ran in the
    // thread's directory and records none.
    let reply = format!("worked in {}", dir.canonicalize().unwrap().display());
    assert!(
        log[0]["summary"]
            .as_str()
            .unwrap_or_default()
            .contains(&reply)
            || log[0]["meta"]["summary"]
                .as_str()
                .unwrap_or_default()
                .contains(&reply),
        "{}",
        log[0]
    );
    assert!(log[2]["meta"].get("$cwd").is_none(), "{}", log[2]);
    env.verify_clean();
}

fn a_missing_location_fails_the_step_naming_it_and_commits_nothing(b: TestBackend) {
    let env = Cli::new(b);
    let project = env.path("project");
    std::fs::create_dir_all(&project).unwrap();
    let wf = env.file("where.yaml", WHERE);
    let pick = env.path("pick");
    std::fs::write(&pick, "nope").unwrap();
    let spec = agent(&env, &pick);
    let o = env.uwf(&[
        "run",
        &wf,
        "-p",
        "t",
        "--cwd",
        project.to_str().unwrap(),
        "--agent",
        &spec,
    ]);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    let missing = project.join("nope");
    let message = format!("directory '{}' does not exist", missing.display());
    assert!(stderr(&o).contains(&message), "{}", stderr(&o));
    assert!(stderr(&o).contains("role 'worker'"), "{}", stderr(&o));
    // The picker's step is kept; the worker's was never written, and the
    // thread waits for it with the failure recorded.
    let list = env.json(&["thread", "list"]);
    let id = list[0]["thread"].as_str().unwrap().to_owned();
    let log = env.log(&id);
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0]["role"], "picker");
    let show = env.show(&id);
    assert_eq!(show["status"], "idle", "{show}");
    assert!(
        show["last_error"].as_str().unwrap().contains(&message),
        "{show}"
    );
    // Made, the directory lets a retry go on from there.
    std::fs::create_dir_all(&missing).unwrap();
    let r = env.json(&["thread", "step", &id, "--count", "5", "--agent", &spec]);
    let last = r.as_array().and_then(|a| a.last()).unwrap();
    assert_eq!(last["status"], "completed", "{r}");
    env.verify_clean();
}

fn without_cwd_a_thread_works_where_it_was_started(b: TestBackend) {
    let env = Cli::new(b);
    let wf = env.file("where.yaml", WHERE);
    let pick = env.path("pick");
    // An absolute location is used as it is.
    let elsewhere = env.path("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(&pick, elsewhere.to_str().unwrap()).unwrap();
    let spec = agent(&env, &pick);
    let t = env.json(&["thread", "start", &wf, "-p", "t"]);
    let id = t["thread"].as_str().unwrap();
    // The CLI runs from the repository root (tests/common/cli.rs).
    assert_eq!(
        env.show(id)["cwd"],
        root().to_str().unwrap(),
        "{}",
        env.show(id)
    );
    let r = env.json(&["thread", "step", id, "--count", "5", "--agent", &spec]);
    let last = r.as_array().and_then(|a| a.last()).unwrap();
    assert_eq!(last["status"], "completed", "{r}");
    assert_eq!(env.log(id)[1]["meta"]["$cwd"], elsewhere.to_str().unwrap());
    // `--cwd` must name an existing directory: bad usage.
    let o = env.uwf(&["thread", "start", &wf, "-p", "t", "--cwd", "/no/such/dir"]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("'/no/such/dir' is not an existing directory"),
        "{}",
        stderr(&o)
    );
}

process_conformance!(
    an_agent_works_at_its_edge_location_under_the_thread_directory,
    a_missing_location_fails_the_step_naming_it_and_commits_nothing,
    without_cwd_a_thread_works_where_it_was_started,
    the_reference_format_example_runs_and_resumes,
);

/// The bundled example in the reference's format, driven by its scenario
/// to the end, then resumed through `$START.resume`.
fn the_reference_format_example_runs_and_resumes(b: TestBackend) {
    let env = Cli::new(b);
    let agent = "script:examples/triage.scenario.yaml";
    let r = env.json(&[
        "run",
        "examples/triage.yaml",
        "-p",
        "the report",
        "--agent",
        agent,
    ]);
    assert_eq!(r["status"], "completed", "{r}");
    let id = r["thread"].as_str().unwrap().to_owned();
    let log = env.log(&id);
    assert_eq!(log[1]["role"], "fixer");
    assert_eq!(
        log[1]["meta"]["$cwd"],
        root().join("examples").to_str().unwrap(),
        "{}",
        log[1]
    );
    let r = env.json(&["thread", "resume", &id, "-p", "And the retry."]);
    let last = r.as_array().and_then(|a| a.last()).unwrap_or(&r).clone();
    assert_eq!(last["status"], "completed", "{r}");
    let log = env.log(&id);
    // The resumed step: the fixer, given the resume edge's prompt and the
    // text, in the thread's directory (the edge's location is null).
    let resumed = &log[1];
    assert_eq!(resumed["role"], "fixer", "{log:?}");
    assert!(resumed["meta"].get("$cwd").is_none(), "{resumed}");
    assert_eq!(
        resumed["input"], "The report came back; fix it again\n\nAnd the retry.",
        "{resumed}"
    );
    // The first fix was told what the triager wrote (`{{ title }}`, `_body`).
    let first_fix = &log[3];
    assert_eq!(
        first_fix["input"], "Fix the flaky test:\n\nThe test sleeps instead of waiting.\n",
        "{first_fix}"
    );
    let input = env.json(&["thread", "show", &id]);
    assert_eq!(input["status"], "completed", "{input}");
    let o = env.uwf(&["thread", "log", &id, "--limit", "2"]);
    assert!(
        stdout(&o).contains("Also removed the retry."),
        "{}",
        stdout(&o)
    );
    env.verify_clean();
}

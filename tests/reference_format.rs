//! Workflows written for the reference's current format load unchanged
//! (SPEC §4, "Compatibility with the reference's later format"):
//! `version: 1`, `$START` edges `new` and `resume`, `_body`, and
//! Liquid-style `{{ x }}` spacing.

mod common;

use common::backend::TestBackend;
use uwf_db::Store;
use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
use uwf_db::engine::{DriveOptions, StartOptions};
use uwf_db::thread::ThreadStatus;
use uwf_db::workflow::{Workflow, parse_workflow};

/// In the reference's style: a version, `new` and `resume` on `$START`,
/// `_body` and a frontmatter value in edge prompts with `{{ x }}` spacing.
const PLANNER: &str = r#"version: 1
name: planner
description: Plan, then write it up
roles:
  planner:
    description: Makes a plan
    goal: Plan the work
    capabilities: []
    procedure: Think
    output: A plan; set $status to planned with a title
    frontmatter:
      oneOf:
        - properties: { $status: { const: planned }, title: { type: string } }
          required: [$status, title]
  writer:
    description: Writes it up
    goal: Write it up
    capabilities: []
    procedure: Write
    output: The write-up; set $status to done
    frontmatter:
      oneOf:
        - properties: { $status: { const: done } }
          required: [$status]
graph:
  $START:
    new: { role: planner, prompt: 'Make a plan' }
    resume: { role: writer, prompt: 'Revise the write-up' }
  planner:
    planned: { role: writer, prompt: "Write up the plan titled {{ title }}:\n\n{{ _body }}" }
  writer:
    done: { role: $END, prompt: 'Written: {{{ _body }}}' }
"#;

/// Answers each role with a fixed reply and records what it was asked.
#[derive(Default)]
struct Recorder {
    asked: Vec<(String, String)>,
}

impl Agent for Recorder {
    fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
        self.asked
            .push((req.role_name.to_owned(), req.instruction.to_owned()));
        let reply = match req.role_name {
            "planner" => "---\n$status: planned\ntitle: Ship <it>\n---\nStep one, then step two.",
            _ => "---\n$status: done\n---\nThe write-up & its table.",
        };
        Ok(reply.to_owned().into())
    }
}

fn load(store: &Store, yaml: &str) -> (Workflow, uwf_db::Hash) {
    let wf = parse_workflow(yaml, None, &|_| false).unwrap_or_else(|p| panic!("refused: {p:#?}"));
    let (hash, _) = store.workflows().add(&wf).unwrap();
    (wf, hash)
}

fn the_reference_format_runs_to_the_end_and_resumes_through_start_resume(b: TestBackend) {
    let store = b.fast();
    let (wf, hash) = load(&store, PLANNER);
    // `new` is stored as `_`: the same workflow as one written with `_`.
    let ours = PLANNER
        .replace("version: 1\n", "")
        .replace("    new: {", "    _: {");
    assert_eq!(
        parse_workflow(&ours, None, &|_| false).unwrap().graph,
        wf.graph
    );

    let mut agent = Recorder::default();
    let (thread, report) = store
        .engine()
        .run_workflow(hash, "the task", &StartOptions::default(), &mut agent)
        .unwrap();
    let results = report.into_result().unwrap();
    assert_eq!(results.last().unwrap().status, ThreadStatus::Completed);
    assert_eq!(
        agent.asked,
        [
            ("planner".to_owned(), "Make a plan".to_owned()),
            (
                "writer".to_owned(),
                // `{{ title }}` with spaces, and `_body`: the previous
                // reply's body. No HTML escaping.
                "Write up the plan titled Ship <it>:\n\nStep one, then step two.".to_owned()
            ),
        ]
    );
    let log = store.threads().log(thread.id, 10, None).unwrap();
    // The end node's summary is the rendered `$END` prompt, with `_body`.
    let end = &log[0].node;
    assert_eq!(
        end.meta.get("summary"),
        Some(&uwf_db::Value::Str(
            "Written: The write-up & its table.".into()
        ))
    );

    // Resuming the completed thread follows `$START.resume`: its role, its
    // prompt plus "\n\n" and the text.
    let mut agent = Recorder::default();
    let options = DriveOptions {
        resume: true,
        resume_text: Some("Add a summary.".into()),
        max_steps: Some(1),
        ..DriveOptions::default()
    };
    let results = store
        .engine()
        .drive(thread.id, &options, &mut agent)
        .into_result()
        .unwrap();
    assert_eq!(
        agent.asked,
        [(
            "writer".to_owned(),
            "Revise the write-up\n\nAdd a summary.".to_owned()
        )]
    );
    assert_eq!(results[0].status, ThreadStatus::Completed);
    assert_eq!(
        store.threads().get(thread.id).unwrap().unwrap().status,
        ThreadStatus::Completed
    );
}

conformance!(the_reference_format_runs_to_the_end_and_resumes_through_start_resume);

/// Without `$START.resume`, a resume starts at the entry edge, as before.
#[test]
fn without_a_resume_edge_a_resume_starts_at_the_entry_edge() {
    let wf = parse_workflow(
        &PLANNER.replace(
            "    resume: { role: writer, prompt: 'Revise the write-up' }\n",
            "",
        ),
        None,
        &|_| false,
    )
    .unwrap();
    assert_eq!(
        wf.first_on_resume().unwrap(),
        ("planner".to_owned(), "Make a plan".to_owned())
    );
}

/// What the format refuses, each with its path and a clear message.
#[test]
fn bad_versions_start_edges_and_body_properties_are_refused() {
    let cases: [(String, &str, &str); 6] = [
        (
            PLANNER.replace("version: 1", "version: 2"),
            "version",
            "unsupported workflow format version 2",
        ),
        (
            PLANNER.replace("version: 1", "version: '1.0'"),
            "version",
            "unsupported workflow format version",
        ),
        (
            PLANNER.replace(
                "    new: {",
                "    _: { role: planner, prompt: 'x' }\n    new: {",
            ),
            "graph.$START",
            "exactly one entry edge",
        ),
        (
            PLANNER.replace("    new: {", "    begin: {"),
            "graph.$START",
            "exactly one entry edge",
        ),
        (
            PLANNER.replace("resume: { role: writer,", "resume: { role: $END,"),
            "graph.$START.resume.role",
            "must lead to a role",
        ),
        (
            PLANNER.replace("title: { type: string }", "_body: { type: string }"),
            "roles.planner.frontmatter",
            "'_body' is reserved",
        ),
    ];
    for (yaml, path, message) in cases {
        let problems = parse_workflow(&yaml, None, &|_| false).unwrap_err();
        assert!(
            problems
                .iter()
                .any(|p| p.path == path && p.message.contains(message)),
            "expected {path}: {message} in {problems:#?}"
        );
    }
    // A location: on an edge into a role, with the variables its prompt
    // may use.
    for (yaml, path, message) in [
        (
            PLANNER.replace(
                "done: { role: $END, prompt: 'Written: {{{ _body }}}' }",
                "done: { role: $END, prompt: 'Written', location: 'x' }",
            ),
            "graph.writer.done.location",
            "not to $END or $SUSPEND",
        ),
        (
            PLANNER.replace(
                "prompt: \"Write up",
                "location: '{{ nowhere }}', prompt: \"Write up",
            ),
            "graph.planner.planned.location",
            "template variable 'nowhere' is not defined",
        ),
    ] {
        let problems = parse_workflow(&yaml, None, &|_| false).unwrap_err();
        assert!(
            problems
                .iter()
                .any(|p| p.path == path && p.message.contains(message)),
            "expected {path}: {message} in {problems:#?}"
        );
    }
    let with_location = PLANNER.replace(
        "prompt: \"Write up",
        "location: '{{ title }}/{{_body}}', prompt: \"Write up",
    );
    let wf = parse_workflow(&with_location, None, &|_| false).unwrap();
    assert_eq!(
        wf.graph["planner"]["planned"].location.as_deref(),
        Some("{{ title }}/{{_body}}")
    );
    // `location: null` is no location.
    let wf = parse_workflow(
        &PLANNER.replace(
            "prompt: 'Make a plan' }",
            "prompt: 'Make a plan', location: null }",
        ),
        None,
        &|_| false,
    )
    .unwrap();
    assert_eq!(wf.graph["$START"]["_"].location, None);

    // `_body` in a `$START` prompt: there is no previous reply.
    let problems = parse_workflow(
        &PLANNER.replace("'Make a plan'", "'Make a plan {{_body}}'"),
        None,
        &|_| false,
    )
    .unwrap_err();
    assert!(
        problems
            .iter()
            .any(|p| p.path == "graph.$START.new.prompt" && p.message.contains("_body")),
        "{problems:#?}"
    );
}

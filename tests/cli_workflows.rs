//! `uwf-db workflow validate` and `workflow add` through the real binary.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;

fn workflow_validate_reports_every_problem_with_its_location(b: TestBackend) {
    let env = Cli::new(b);
    let o = env.uwf(&["workflow", "validate", "tests/fixtures/five-mistakes.yaml"]);
    assert_eq!(code(&o), Some(1));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    for needle in [
        "tests/fixtures/five-mistakes.yaml:6:5: roles.$END",
        ":25:15: graph.writer.finished",
        ":27:9: graph.editor.ok.role",
        ":27:9: graph.editor.ok.prompt: template variable 'mood'",
        ":20:5: roles.orphan",
        "unknown key 'colour'",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    let o = env.json(&["workflow", "validate", "examples/review.yaml"]);
    assert_eq!(o["valid"], true);
    let o = env.uwf(&[
        "--json",
        "workflow",
        "validate",
        "tests/fixtures/five-mistakes.yaml",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["valid"], false);
    assert!(v["problems"].as_array().unwrap().len() >= 5);
    let o = env.json(&["workflow", "add", "examples/review.yaml"]);
    assert_eq!(o["name"], "review");
    assert_eq!(o["hash"].as_str().unwrap().len(), 64);
}

fn workflow_show_draws_the_graph(b: TestBackend) {
    let env = Cli::new(b);
    for wf in ["review", "survey", "planner"] {
        let o = env.uwf(&["workflow", "add", &format!("examples/{wf}.yaml")]);
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    }
    let o = env.uwf(&["workflow", "show", "review", "--format", "mermaid"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "flowchart TD\n  n_start((\"start\"))\n  r1[\"developer\"]\n  r2[\"reviewer\"]\n  \
         n_end(((\"end\")))\n  n_start --> r1\n  r1 -->|review_needed| r2\n  \
         r2 -->|approved| n_end\n  r2 -->|rejected| r1\n"
    );
    // A fan-out role says what it runs; a suspend edge goes to a human.
    let survey = stdout(&env.uwf(&["workflow", "show", "survey", "--format", "dot"]));
    assert!(
        survey.contains("[label=\"build_parts\\nforeach parts ⇢ review (≤ 4 at once)\"]"),
        "{survey}"
    );
    assert!(survey.contains(" -> n_end [label=\"done\"];"), "{survey}");
    let planner = stdout(&env.uwf(&["workflow", "show", "planner", "--format", "mermaid"]));
    assert!(
        planner.contains("  n_suspend{{\"ask a human\"}}\n"),
        "{planner}"
    );
    assert!(planner.contains(" -->|need_info| n_suspend\n"), "{planner}");
    // The text form is unchanged; --json with a picture is refused.
    let text = stdout(&env.uwf(&["workflow", "show", "review"]));
    assert!(
        text.contains("  developer --review_needed--> reviewer"),
        "{text}"
    );
    let o = env.uwf(&["--json", "workflow", "show", "review", "--format", "dot"]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("give one of them"), "{}", stderr(&o));
    let o = env.uwf(&["workflow", "show", "review", "--format", "svg"]);
    assert_eq!(code(&o), Some(2));
    assert!(stderr(&o).contains("invalid value 'svg'"), "{}", stderr(&o));
}

process_conformance!(
    workflow_validate_reports_every_problem_with_its_location,
    workflow_show_draws_the_graph,
);

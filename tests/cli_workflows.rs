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

process_conformance!(workflow_validate_reports_every_problem_with_its_location,);

//! Workflow YAML: parsing, validation with locations, routing, templates,
//! and the registry.

mod common;

use std::collections::BTreeMap;

use common::backend::TestBackend;
use uwf_db::Value;
use uwf_db::thread::{EndSpec, Next};
use uwf_db::workflow::{WorkflowError, parse_workflow};

const REVIEW: &str = include_str!("../examples/review.yaml");
const FIVE: &str = include_str!("fixtures/five-mistakes.yaml");

fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::Str((*v).to_owned())))
        .collect()
}

#[test]
fn the_review_example_parses_and_routes() {
    let wf = parse_workflow(REVIEW, Some("review"), &|_| false).unwrap();
    assert_eq!(wf.max_rounds, 20);
    assert_eq!(
        wf.first().unwrap(),
        ("developer".into(), "Implement the change".into())
    );
    assert_eq!(
        wf.route("developer", &meta(&[("$status", "review_needed")]))
            .unwrap(),
        Next::Role {
            role: "reviewer".into(),
            instruction: "Review the change".into(),
            location: None,
        }
    );
    assert_eq!(
        wf.route(
            "reviewer",
            &meta(&[("$status", "rejected"), ("reason", "no <tests> & docs")])
        )
        .unwrap(),
        Next::Role {
            role: "developer".into(),
            instruction: "Fix this: no <tests> & docs".into(),
            location: None,
        }
    );
    assert_eq!(
        wf.route("reviewer", &meta(&[("$status", "approved")]))
            .unwrap(),
        Next::End(EndSpec {
            return_code: 0,
            summary: "Approved".into(),
            prompt: "Approved".into()
        })
    );
    let err = wf
        .route("reviewer", &meta(&[("$status", "maybe")]))
        .unwrap_err();
    assert!(matches!(err, WorkflowError::UnknownStatus { .. }), "{err}");
    assert!(err.to_string().contains("approved, rejected"), "{err}");
    // Missing $status selects `_`, which the reviewer does not have.
    assert!(wf.route("reviewer", &BTreeMap::new()).is_err());
    // The stored form round-trips.
    let blob = wf.to_blob().unwrap();
    let back = uwf_db::workflow::Workflow::from_blob(blob.encode().unwrap().hash(), &blob).unwrap();
    assert_eq!(back, wf);
}

#[test]
fn five_mistakes_are_all_reported_with_locations() {
    let problems = parse_workflow(FIVE, Some("five-mistakes"), &|_| false).unwrap_err();
    let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
    let has = |needle: &str| text.iter().any(|p| p.contains(needle));
    assert!(has("unknown key 'colour'"), "{text:#?}");
    assert!(has("'$END' is a reserved name"), "{text:#?}");
    assert!(has("status 'finished' is not allowed"), "{text:#?}");
    assert!(has("no edge for status 'drafted'"), "{text:#?}");
    assert!(has("edge target 'publisher' is not a role"), "{text:#?}");
    assert!(has("template variable 'mood' is not defined"), "{text:#?}");
    assert!(has("role 'orphan' is not reachable"), "{text:#?}");
    assert!(
        !has("'notes' is not defined"),
        "notes is a property of the ok variant"
    );
    // Positions: every problem but the flattened unknown key has a line.
    for p in &problems {
        if !p.message.contains("unknown key") && !p.path.starts_with("graph.$START") {
            assert!(p.line.is_some(), "no line for {p}");
        }
    }
    let target = problems
        .iter()
        .find(|p| p.message.contains("publisher"))
        .unwrap();
    assert_eq!(target.line, Some(27), "{target}");
    assert_eq!(target.path, "graph.editor.ok.role");
}

#[test]
fn bad_yaml_and_name_mismatch() {
    let p = parse_workflow("name: [unclosed\n", None, &|_| false).unwrap_err();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].line, Some(1));
    let p = parse_workflow(REVIEW, Some("other"), &|_| false).unwrap_err();
    assert!(
        p[0].message.contains("must match the file stem 'other'"),
        "{p:?}"
    );
}

fn registry_adds_idempotently_and_moves_names(b: TestBackend) {
    let store = b.durable();
    let wf = parse_workflow(REVIEW, Some("review"), &|_| false).unwrap();
    let (h1, changed) = store.workflows().add(&wf).unwrap();
    assert!(changed);
    let (h2, changed) = store.workflows().add(&wf).unwrap();
    assert_eq!((h1, changed), (h2, false), "identical content is a no-op");
    let mut wf2 = wf.clone();
    wf2.max_rounds = 5;
    let (h3, changed) = store.workflows().add(&wf2).unwrap();
    assert!(changed && h3 != h1);
    assert_eq!(
        store
            .workflows()
            .by_name("review")
            .unwrap()
            .map(|(h, w)| (h, (*w).clone()))
            .unwrap(),
        (h3, wf2)
    );
    assert_eq!(
        *store.workflows().load(h1).unwrap(),
        wf,
        "old versions stay readable"
    );
    assert_eq!(
        store.workflows().list().unwrap(),
        vec![("review".to_owned(), h3)]
    );
    assert!(store.workflows().by_name("nope").unwrap().is_none());
}

conformance!(registry_adds_idempotently_and_moves_names,);

/// `!include` reads a file only for a workflow read from a file: YAML
/// given as text (the HTTP API's, MCP's) reads nothing, however the tag is
/// spelled.
#[test]
fn include_in_yaml_text_reads_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret.yaml");
    std::fs::write(&secret, "goal: Leaked\n").unwrap();
    let yaml = format!(
        "name: text\nroles:\n  writer: !include {}\ngraph:\n  $START: {{ _: {{ role: writer, prompt: 'W' }} }}\n  writer: {{ _: {{ role: $END, prompt: 'D' }} }}\n",
        secret.display()
    );
    match parse_workflow(&yaml, Some("text"), &|_| false) {
        Err(problems) => assert!(!problems.is_empty()),
        Ok(wf) => assert_ne!(
            wf.roles["writer"].goal.as_deref(),
            Some("Leaked"),
            "a text workflow read a file"
        ),
    }
}

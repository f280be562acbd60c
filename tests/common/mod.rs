//! Helpers shared by the integration tests: `backend` (the store harness
//! behind the conformance suite), `cli` (running the real binary), and
//! fixtures for blobs and threads built through the library.
#![allow(dead_code)]

pub mod backend;
#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "cli")]
pub mod contract;

use std::collections::BTreeMap;

use uwf_db::{Blob, Hash, StartNode, StateNode, Value, WorkflowNode};

/// A deterministic hash for fixtures: BLAKE3 of the label.
pub fn h(label: &str) -> Hash {
    Hash::of(label.as_bytes())
}

/// One fixture blob of every kind (and the interesting optional fields),
/// named, for the committed test vectors.
pub fn vector_blobs() -> Vec<(&'static str, Blob)> {
    let meta = BTreeMap::from([
        ("$status".to_owned(), Value::Str("rejected".into())),
        ("reason".to_owned(), Value::Str("tests fail".into())),
        ("score".to_owned(), Value::Float(0.75)),
        ("attempts".to_owned(), Value::UInt(300)),
        ("delta".to_owned(), Value::Int(-40)),
        (
            "tags".to_owned(),
            Value::Array(vec![Value::Bool(true), Value::Null]),
        ),
    ]);
    vec![
        ("content_empty", Blob::content("", [])),
        ("content_text", Blob::content("Implement the change", [])),
        (
            "content_artifacts",
            Blob::content("see attached", [h("artifact-a"), h("artifact-b")]),
        ),
        (
            "start_top",
            Blob::Start(StartNode {
                depth: 0,
                max_rounds: 100,
                name: "review".into(),
                parent_state: None,
                prompt: h("prompt"),
                workflow: h("workflow"),
            }),
        ),
        (
            "start_child",
            Blob::Start(StartNode {
                depth: 1,
                max_rounds: 20,
                name: "run-tests".into(),
                parent_state: Some(h("parent-head")),
                prompt: h("child-prompt"),
                workflow: h("child-workflow"),
            }),
        ),
        (
            "state_first",
            Blob::State(StateNode {
                ancestors: vec![],
                child_thread: None,
                compact: None,
                content: h("reply"),
                input: h("instruction"),
                meta: BTreeMap::from([("$status".to_owned(), Value::Str("review_needed".into()))]),
                role: "developer".into(),
                seq: 1,
                start: h("start"),
                timestamp: 1_790_000_000_000,
            }),
        ),
        (
            "state_full",
            Blob::State(StateNode {
                ancestors: vec![h("s3"), h("s2"), h("s1")],
                child_thread: Some(h("child-end")),
                compact: Some(h("summary")),
                content: h("reply2"),
                input: h("instruction2"),
                meta,
                role: "reviewer".into(),
                seq: 4,
                start: h("start"),
                timestamp: 1_790_000_123_456,
            }),
        ),
        (
            "state_end",
            Blob::State(StateNode {
                ancestors: vec![h("s4")],
                child_thread: None,
                compact: None,
                content: h("summary-text"),
                input: h("end-prompt"),
                meta: BTreeMap::from([
                    ("return_code".to_owned(), Value::UInt(0)),
                    ("summary".to_owned(), Value::Str("Approved".into())),
                ]),
                role: "__end__".into(),
                seq: 5,
                start: h("start"),
                timestamp: 1_790_000_200_000,
            }),
        ),
        (
            "workflow",
            Blob::Workflow(WorkflowNode {
                definition: Value::Map(BTreeMap::from([
                    ("name".to_owned(), Value::Str("review".into())),
                    ("maxRounds".to_owned(), Value::UInt(20)),
                ])),
            }),
        ),
    ]
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

use uwf_db::Store;
use uwf_db::thread::{NewThread, Next, StepWrite, ThreadId, ThreadRecord};

/// Stores a placeholder workflow definition named `name`.
pub fn workflow(store: &Store, name: &str) -> Hash {
    store
        .put(&Blob::Workflow(WorkflowNode {
            definition: Value::Map(BTreeMap::from([(
                "name".to_owned(),
                Value::Str(name.into()),
            )])),
        }))
        .unwrap()
}

/// Starts a top-level thread of workflow `name` whose first role is `dev`.
pub fn new_thread(store: &Store, name: &str) -> ThreadRecord {
    try_new_thread(store, name).unwrap()
}

/// [`new_thread`], returning the error: the placeholder workflow blob is put
/// in its own transaction first, so a collection with no grace period may
/// free it before the thread refers to it (`MissingRef`).
pub fn try_new_thread(
    store: &Store,
    name: &str,
) -> Result<ThreadRecord, uwf_db::thread::ThreadError> {
    let wf = workflow(store, name);
    store.threads().low_level().start_thread(NewThread {
        workflow: name.into(),
        workflow_hash: wf,
        prompt: format!("task for {name}"),
        max_rounds: 100,
        depth: 0,
        parent_state: None,
        parent_thread: None,
        next_role: "dev".into(),
        next_instruction: "Implement the change".into(),
        agent: Some("script:test.yaml".into()),
        cwd: None,
        next_location: None,
        labels: Default::default(),
    })
}

/// A role step with `$status`.
pub fn step(role: &str, status: &str, reply: &str) -> StepWrite {
    StepWrite {
        role: role.into(),
        meta: BTreeMap::from([("$status".to_owned(), Value::Str(status.into()))]),
        reply: reply.into(),
        artifacts: vec![],
        instruction: format!("instruction for {role}"),
        child_thread: None,
    }
}

/// Continue with role `next`.
pub fn next(role: &str) -> Next {
    Next::Role {
        role: role.into(),
        instruction: format!("your turn, {role}"),
        location: None,
    }
}

/// Appends `n` steps, one transaction each; returns the last record.
pub fn append_n(store: &Store, id: ThreadId, n: usize) -> ThreadRecord {
    let mut rec = store.threads().get(id).unwrap().unwrap();
    for i in 0..n {
        let w = store
            .threads()
            .low_level()
            .append_step(
                id,
                rec.head,
                step("dev", "again", &format!("step {i}")),
                next("dev"),
            )
            .unwrap();
        rec = w.record;
    }
    rec
}

/// A two-role workflow, `writer` then `reviewer` then `$END`, every edge
/// the default status `_` (so any plain-text reply moves it on).
pub const TWO_ROLES: &str = "name: two\nroles:\n  writer: { goal: Write }\n  reviewer: { goal: Review }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: reviewer, prompt: 'Review it' } }\n  reviewer: { _: { role: $END, prompt: 'Reviewed' } }\n";

/// Registers [`TWO_ROLES`] named `name`; returns its hash.
pub fn two_roles(store: &Store, name: &str) -> Hash {
    let yaml = TWO_ROLES.replacen("name: two", &format!("name: {name}"), 1);
    let wf = uwf_db::workflow::parse_workflow(&yaml, Some(name), &|_| false).unwrap();
    store.workflows().add(&wf).unwrap().0
}

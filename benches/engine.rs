//! Bench `engine`: the engine stepping a scripted workflow in-process vs
//! `append_step` alone writing the same content, at equal durability.
//! Goal (SPEC §9): routing, templates, extraction and validation together
//! add at most 50% (ratio ≥ 0.67).
//!
//! Run: `cargo bench --bench engine`.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{Comparison, report, scratch_dir, time};
use uwf_db::engine::agent::ScriptAgent;
use uwf_db::thread::{EndSpec, NewThread, Next, StepWrite};
use uwf_db::workflow::parse_workflow;
use uwf_db::{Durability, Store, StoreOptions, Value};

const THREADS: usize = 300;

fn open(dir: &Path, durability: Durability) -> Store {
    Store::open(
        dir,
        StoreOptions {
            durability,
            ..StoreOptions::default()
        },
    )
    .unwrap()
}

fn meta(status: &str, reason: Option<&str>) -> BTreeMap<String, Value> {
    let mut m = BTreeMap::from([("$status".to_owned(), Value::Str(status.into()))]);
    if let Some(r) = reason {
        m.insert("reason".into(), Value::Str(r.into()));
    }
    m
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let yaml = std::fs::read_to_string(root.join("examples/review.yaml")).unwrap();
    let wf = parse_workflow(&yaml, Some("review"), &|_| false).unwrap();
    let scenario = root.join("examples/review.scenario.yaml");

    // The four steps of the scenario as the engine commits them.
    let steps: Vec<(StepWrite, Next)> = vec![
        (
            StepWrite {
                role: "developer".into(),
                meta: meta("review_needed", None),
                reply: "Added a --json flag to every command and tests for each shape.\n".into(),
                artifacts: vec![],
                instruction: "Implement the change".into(),
                child_thread: None,
            },
            Next::Role {
                role: "reviewer".into(),
                instruction: "Review the change".into(),
                location: None,
            },
        ),
        (
            StepWrite {
                role: "reviewer".into(),
                meta: meta("rejected", Some("the README does not mention --json")),
                reply: "The code is fine, but users will not find the flag.\n".into(),
                artifacts: vec![],
                instruction: "Review the change".into(),
                child_thread: None,
            },
            Next::Role {
                role: "developer".into(),
                instruction: "Fix this: the README does not mention --json".into(),
                location: None,
            },
        ),
        (
            StepWrite {
                role: "developer".into(),
                meta: meta("review_needed", None),
                reply: "Documented --json in the README with an example.\n".into(),
                artifacts: vec![],
                instruction: "Fix this: the README does not mention --json".into(),
                child_thread: None,
            },
            Next::Role {
                role: "reviewer".into(),
                instruction: "Review the change".into(),
                location: None,
            },
        ),
        (
            StepWrite {
                role: "reviewer".into(),
                meta: meta("approved", None),
                reply: "Ship it.\n".into(),
                artifacts: vec![],
                instruction: "Review the change".into(),
                child_thread: None,
            },
            Next::End(EndSpec {
                return_code: 0,
                summary: "Approved".into(),
                prompt: "Approved".into(),
            }),
        ),
    ];

    let mut rows = Vec::new();
    for durability in [Durability::None, Durability::Sync] {
        let threads = if durability == Durability::Sync {
            THREADS / 5
        } else {
            THREADS
        };
        rows.push(Comparison::run(
            &format!(
                "engine run of a 4-step scripted thread, durability {durability} (ops = steps)"
            ),
            (threads * 4) as u64,
            3,
            || {
                let dir = scratch_dir("engine");
                let store = open(dir.path(), durability);
                let (hash, _) = store.workflows().add(&wf).unwrap();
                let mut agent = ScriptAgent::load(&scenario).unwrap();
                time(|| {
                    for i in 0..threads {
                        let (_, out) = store
                            .engine()
                            .run_workflow(
                                hash,
                                &format!("task {i}"),
                                &Default::default(),
                                &mut agent,
                            )
                            .unwrap();
                        assert!(out.error.is_none(), "{:?}", out.error);
                        assert_eq!(out.results.len(), 4);
                    }
                })
            },
            || {
                let dir = scratch_dir("engine-append");
                let store = open(dir.path(), durability);
                let (hash, _) = store.workflows().add(&wf).unwrap();
                time(|| {
                    for i in 0..threads {
                        let t = store
                            .threads()
                            .low_level()
                            .start_thread(NewThread {
                                workflow: "review".into(),
                                workflow_hash: hash,
                                prompt: format!("task {i}"),
                                max_rounds: 20,
                                depth: 0,
                                parent_state: None,
                                parent_thread: None,
                                next_role: "developer".into(),
                                next_instruction: "Implement the change".into(),
                                agent: None,
                                cwd: None,
                                next_location: None,
                                labels: Default::default(),
                            })
                            .unwrap();
                        let mut head = t.head;
                        for (step, after) in &steps {
                            head = store
                                .threads()
                                .low_level()
                                .append_step(t.id, head, step.clone(), after.clone())
                                .unwrap()
                                .record
                                .head;
                        }
                    }
                })
            },
        ));
    }
    report(
        "engine: routing, templates, extraction, validation vs append_step alone",
        "overhead ≤ 50% (ratio ≥ 0.67) at equal durability",
        &rows,
    );
}

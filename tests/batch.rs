//! Group commit and batch runs through the library API
//! (`docs/design.md` §5d).

mod common;

use std::path::Path;

use common::backend::TestBackend;
use common::{new_thread, next, step};
use uwf_db::engine::agent::{Agent, ScriptAgent};
use uwf_db::engine::batch::BatchOptions;
use uwf_db::thread::{ThreadError, ThreadStatus};
use uwf_db::verify::verify;
use uwf_db::workflow::parse_workflow;
use uwf_db::{Blob, Hash, Store, StoreError};

fn review(store: &Store) -> Hash {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let yaml = std::fs::read_to_string(root.join("examples/review.yaml")).unwrap();
    let wf = parse_workflow(&yaml, Some("review"), &|_| false).unwrap();
    store.add_workflow(&wf).unwrap().0
}

fn agents(n: usize) -> Vec<Box<dyn Agent>> {
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/review.scenario.yaml");
    (0..n)
        .map(|_| Box::new(ScriptAgent::load(&scenario).unwrap()) as Box<dyn Agent>)
        .collect()
}

fn a_durable_batch_commits_every_step_in_groups(b: TestBackend) {
    let store = b.durable();
    let wf = review(&store);
    let prompts: Vec<String> = (0..60).map(|i| format!("change {i}")).collect();
    let mut seen = Vec::new();
    let options = BatchOptions {
        agent_spec: Some("script:examples/review.scenario.yaml".into()),
        ..BatchOptions::default()
    };
    let report = store
        .run_batch(wf, &prompts, &options, agents(8), &mut |item| {
            seen.push(item.clone())
        })
        .unwrap();
    assert_eq!(report.threads, 60);
    assert_eq!(report.completed, 60);
    assert_eq!(report.errors, 0);
    assert_eq!(report.steps, 240);
    // A start and four steps per thread, in fewer commits than writes.
    assert!(report.groups < 300, "{report:?}");
    assert!(report.average_group > 1.0, "{report:?}");
    seen.sort_by_key(|i| i.index);
    assert_eq!(seen.len(), 60);
    for (i, item) in seen.iter().enumerate() {
        assert_eq!(item.index, i);
        let id = item.thread.unwrap();
        let rec = store.thread(id).unwrap().unwrap();
        assert_eq!(rec.status, ThreadStatus::Completed);
        assert_eq!(rec.agent.as_deref(), options.agent_spec.as_deref());
        assert_eq!(store.thread_log(id, 10, None).unwrap().len(), 5);
        let task = store.walk::<StoreError>(&rec.start, |_| Ok(())).unwrap();
        assert!(task >= 2);
    }
    assert!(verify(&store, |_| {}).unwrap().is_ok());
}

fn a_failing_request_is_rolled_back_alone(b: TestBackend) {
    let store = b.fast();
    let t = new_thread(&store, "t");
    let kept = Blob::content("kept", []);
    let rolled_back = Blob::content("rolled back", []);
    let ((), stats) = store.group_commit(0, |g| {
        std::thread::scope(|s| {
            // Hold the writer so that the next requests queue up and are
            // committed as one group.
            s.spawn(|| {
                g.write_op(|_| {
                    std::thread::sleep(std::time::Duration::from_millis(300));
                    Ok::<_, StoreError>(())
                })
                .unwrap();
            });
            std::thread::sleep(std::time::Duration::from_millis(100));
            s.spawn(|| {
                let k = kept.clone();
                g.write_op(move |w| w.put_blob(&k)).unwrap();
            });
            s.spawn(|| {
                let rb = rolled_back.clone();
                let err = g
                    .write_op(move |w| {
                        w.put_blob(&rb)?;
                        // Refers to a blob that does not exist.
                        w.put_blob(&Blob::content("note", [Hash::of(b"absent")]))
                    })
                    .unwrap_err();
                assert!(matches!(err, StoreError::MissingRef { .. }), "{err}");
            });
            s.spawn(|| {
                // A stale head is a conflict, and only this request fails.
                let err = g
                    .append_step(
                        t.id,
                        Hash::of(b"stale"),
                        step("dev", "ok", "x"),
                        next("dev"),
                    )
                    .unwrap_err();
                assert!(matches!(err, ThreadError::Conflict { .. }), "{err}");
                g.append_step(t.id, t.head, step("dev", "ok", "first"), next("dev"))
                    .unwrap();
            });
        });
    });
    assert_eq!(stats.requests, 5, "{stats:?}");
    assert!(
        stats.groups <= 3,
        "the queued requests shared a group: {stats:?}"
    );
    assert!(store.contains(&kept.encode().unwrap().hash()).unwrap());
    assert!(
        !store
            .contains(&rolled_back.encode().unwrap().hash())
            .unwrap()
    );
    assert_eq!(store.thread(t.id).unwrap().unwrap().seq, 1);
    assert!(verify(&store, |_| {}).unwrap().is_ok());
}

fn without_a_group_write_op_is_a_plain_write(b: TestBackend) {
    let store = b.fast();
    let h = store
        .write_op(|w| w.put_blob(&Blob::content("plain", [])))
        .unwrap();
    assert!(store.contains(&h).unwrap());
}

fn a_step_failure_stops_its_thread_only(b: TestBackend) {
    let store = b.fast();
    let wf = review(&store);
    // Agents whose script has no answer for the reviewer: every thread
    // stops after its first step with the failure recorded.
    let scenario = store.scratch().join("short.yaml");
    std::fs::write(
        &scenario,
        "steps:\n  - role: developer\n    output: |\n      ---\n      $status: review_needed\n      ---\n      done\n",
    )
    .unwrap();
    let agents: Vec<Box<dyn Agent>> = (0..3)
        .map(|_| Box::new(ScriptAgent::load(&scenario).unwrap()) as Box<dyn Agent>)
        .collect();
    let prompts: Vec<String> = (0..9).map(|i| format!("p{i}")).collect();
    let report = store
        .run_batch(wf, &prompts, &BatchOptions::default(), agents, &mut |_| {})
        .unwrap();
    assert_eq!((report.threads, report.errors, report.steps), (9, 9, 9));
    for t in store
        .list_threads(&uwf_db::thread::ThreadQuery::default())
        .unwrap()
    {
        assert_eq!(t.status, ThreadStatus::Idle);
        assert!(t.last_error.is_some());
        assert_eq!(t.next_role.as_deref(), Some("reviewer"));
    }
    assert!(verify(&store, |_| {}).unwrap().is_ok());
}

fn a_batch_without_agents_is_refused(b: TestBackend) {
    let store = b.fast();
    let wf = review(&store);
    let err = store
        .run_batch(
            wf,
            &["p".to_owned()],
            &BatchOptions::default(),
            Vec::new(),
            &mut |_| {},
        )
        .unwrap_err();
    assert!(err.to_string().contains("at least one agent"), "{err}");
    // No prompts, no work, no error.
    let report = store
        .run_batch(wf, &[], &BatchOptions::default(), agents(2), &mut |_| {})
        .unwrap();
    assert_eq!(report.threads, 0);
    assert!(
        store
            .list_threads(&uwf_db::thread::ThreadQuery::default())
            .unwrap()
            .is_empty()
    );
}

conformance!(
    a_durable_batch_commits_every_step_in_groups,
    a_failing_request_is_rolled_back_alone,
    without_a_group_write_op_is_a_plain_write,
    a_step_failure_stops_its_thread_only,
    a_batch_without_agents_is_refused,
);

//! Group commit and batch runs through the library API
//! (`docs/design.md` §5d).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::backend::TestBackend;
use common::{new_thread, next, step};
use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest, ScriptAgent};
use uwf_db::engine::batch::BatchOptions;
use uwf_db::thread::{ThreadError, ThreadStatus};
use uwf_db::verify::verify;
use uwf_db::workflow::parse_workflow;
use uwf_db::{Blob, Hash, Store, StoreError};

fn review(store: &Store) -> Hash {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let yaml = std::fs::read_to_string(root.join("examples/review.yaml")).unwrap();
    let wf = parse_workflow(&yaml, Some("review"), &|_| false).unwrap();
    store.workflows().add(&wf).unwrap().0
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
        .engine()
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
        let rec = store.threads().get(id).unwrap().unwrap();
        assert_eq!(rec.status, ThreadStatus::Completed);
        assert_eq!(rec.agent.as_deref(), options.agent_spec.as_deref());
        assert_eq!(store.threads().log(id, 10, None).unwrap().len(), 5);
        let task = store.walk::<StoreError>(&rec.start, |_| Ok(())).unwrap();
        assert!(task >= 2);
    }
    assert!(verify(&store, |_| {}).unwrap().is_ok());
}

/// Sends one 300 ms request for each group writer the backend may run
/// (one on LMDB, `Backend::parallel_writers` on PostgreSQL) on threads of
/// `s` and returns 100 ms later, so that the requests sent next queue up
/// and are committed in few groups. (On PostgreSQL the second holder
/// waits in the queue, since a second writer takes a group only when many
/// requests wait, and usually goes with the requests sent next.) Returns
/// how many holding requests were sent.
fn hold_the_writer<'scope, 'env>(
    s: &'scope std::thread::Scope<'scope, 'env>,
    g: &'env Store,
) -> u64 {
    let writers = Store::backend(g).parallel_writers().max(1);
    for _ in 0..writers {
        s.spawn(move || {
            g.write_op(|_| {
                std::thread::sleep(std::time::Duration::from_millis(300));
                Ok::<_, StoreError>(())
            })
            .unwrap();
        });
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    writers as u64
}

fn a_failing_request_is_rolled_back_alone(b: TestBackend) {
    let store = b.fast();
    let t = new_thread(&store, "t");
    let kept = Blob::content("kept", []);
    let rolled_back = Blob::content("rolled back", []);
    let (holders, stats) = store.group_commit(0, |g| {
        std::thread::scope(|s| {
            let holders = hold_the_writer(s, g);
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
                    .threads()
                    .low_level()
                    .append_step(
                        t.id,
                        Hash::of(b"stale"),
                        step("dev", "ok", "x"),
                        next("dev"),
                    )
                    .unwrap_err();
                assert!(matches!(err, ThreadError::Conflict { .. }), "{err}");
                g.threads()
                    .low_level()
                    .append_step(t.id, t.head, step("dev", "ok", "first"), next("dev"))
                    .unwrap();
            });
            holders
        })
    });
    // The holders' requests and groups, then the four queued requests in
    // at most two groups (the failing one's group runs again).
    assert_eq!(stats.requests, holders + 4, "{stats:?}");
    assert!(
        stats.groups <= holders + 2,
        "the queued requests shared a group: {stats:?}"
    );
    assert!(store.contains(&kept.encode().unwrap().hash()).unwrap());
    assert!(
        !store
            .contains(&rolled_back.encode().unwrap().hash())
            .unwrap()
    );
    assert_eq!(store.threads().get(t.id).unwrap().unwrap().seq, 1);
    assert!(verify(&store, |_| {}).unwrap().is_ok());
}

/// A request that panics on the writer's thread is rolled back alone, the
/// panic comes back in the thread that sent it, and the writer goes on: no
/// sender is left waiting (a dead writer once hung a whole batch runner).
fn a_panicking_request_is_rolled_back_alone_and_panics_its_sender(b: TestBackend) {
    let store = b.fast();
    let kept = Blob::content("kept", []);
    let half = Blob::content("half-written", []);
    let (holders, stats) = store.group_commit(0, |g| {
        let holders = std::thread::scope(|s| {
            let holders = hold_the_writer(s, g);
            let panicked = s.spawn(|| {
                let h = half.clone();
                g.write_op(move |w| -> Result<(), StoreError> {
                    w.put_blob(&h)?;
                    panic!("a bug in a write");
                })
            });
            s.spawn(|| {
                let k = kept.clone();
                g.write_op(move |w| w.put_blob(&k)).unwrap();
            });
            let payload = panicked.join().unwrap_err();
            assert_eq!(payload.downcast_ref::<&str>(), Some(&"a bug in a write"));
            holders
        });
        // The writer is still there.
        g.write_op(|w| w.put_blob(&Blob::content("after", [])))
            .unwrap();
        holders
    });
    assert_eq!(stats.requests, holders + 3, "{stats:?}");
    assert!(store.contains(&kept.encode().unwrap().hash()).unwrap());
    assert!(!store.contains(&half.encode().unwrap().hash()).unwrap());
    assert!(
        store
            .contains(&Blob::content("after", []).encode().unwrap().hash())
            .unwrap()
    );
    assert!(verify(&store, |_| {}).unwrap().is_ok());
}

/// Sender `i`'s answer is the hash of the blob it put, and that blob is
/// stored.
fn assert_sender_stored(store: &Store, i: usize, answer: &Hash) {
    let sent = Blob::content(format!("sender {i}"), []).encode().unwrap();
    assert_eq!(*answer, sent.hash(), "sender {i}");
    assert!(store.contains(answer).unwrap(), "sender {i}");
}

/// Forty requests queued behind a held writer share a group, and each
/// sender is woken with its own answer (one of them refused).
fn every_sender_of_a_group_is_woken_with_its_own_answer(b: TestBackend) {
    let store = b.fast();
    let (answers, stats) = store.group_commit(0, |g| {
        std::thread::scope(|s| {
            let holders = hold_the_writer(s, g);
            let senders: Vec<_> = (0..40)
                .map(|i| {
                    s.spawn(move || {
                        g.write_op(move |w| {
                            if i == 7 {
                                // One refused request: its sender alone
                                // gets the error.
                                return w.put_blob(&Blob::content("x", [Hash::of(b"absent")]));
                            }
                            w.put_blob(&Blob::content(format!("sender {i}"), []))
                        })
                    })
                })
                .collect();
            let answers: Vec<_> = senders.into_iter().map(|h| h.join().unwrap()).collect();
            (holders, answers)
        })
    });
    let (holders, answers) = answers;
    for (i, a) in answers.iter().enumerate() {
        match a {
            Ok(h) => {
                assert_ne!(i, 7);
                assert_sender_stored(&store, i, h);
            }
            Err(e) => {
                assert_eq!(i, 7);
                assert!(matches!(e, StoreError::MissingRef { .. }), "{e}");
            }
        }
    }
    assert_eq!(stats.requests, holders + 40, "{stats:?}");
    // The writers take what is queued: at most a group or two each
    // (PostgreSQL may run several), never one per request.
    assert!(
        stats.groups <= 3 * holders + 1,
        "the queued requests shared groups: {stats:?}"
    );
}

/// Requests that arrive while the group writer waits for the store's one
/// writer (held here by a plain write, as another process's `uwf-db` would
/// hold it) join the group it was beginning: one group, not one for the
/// first request and another for the rest. LMDB and memory only: their
/// writers are serial; PostgreSQL's run in parallel and do not wait so.
fn requests_queued_while_the_writer_waits_join_its_group(b: TestBackend) {
    let store = b.fast();
    let (holding, held) = std::sync::mpsc::channel();
    // Senders about to send: the plain write holds the writer until all 41
    // are (then 100 ms more), so a slow machine cannot split the group.
    let sending = AtomicUsize::new(0);
    let (answers, stats) = std::thread::scope(|outer| {
        let (plain, sending) = (&*store, &sending);
        outer.spawn(move || {
            plain
                .write(|_| {
                    holding.send(()).unwrap();
                    let since = std::time::Instant::now();
                    while sending.load(Ordering::SeqCst) < 41
                        && since.elapsed() < std::time::Duration::from_secs(60)
                    {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    Ok::<_, StoreError>(())
                })
                .unwrap();
        });
        held.recv().unwrap();
        store.group_commit(0, |g| {
            std::thread::scope(|s| {
                let send = |i: usize| {
                    s.spawn(move || {
                        sending.fetch_add(1, Ordering::SeqCst);
                        g.write_op(move |w| w.put_blob(&Blob::content(format!("sender {i}"), [])))
                    })
                };
                // The writer takes the first and waits for the held writer.
                let mut senders = vec![send(0)];
                std::thread::sleep(std::time::Duration::from_millis(200));
                senders.extend((1..=40).map(send));
                senders
                    .into_iter()
                    .map(|h| h.join().unwrap())
                    .collect::<Vec<_>>()
            })
        })
    });
    for (i, a) in answers.iter().enumerate() {
        assert_sender_stored(&store, i, a.as_ref().unwrap());
    }
    assert_eq!(
        (stats.groups, stats.requests),
        (1, 41),
        "the requests sent while the writer waited joined its group"
    );
}

#[test]
fn lmdb_requests_queued_while_the_writer_waits_join_its_group() {
    requests_queued_while_the_writer_waits_join_its_group(TestBackend::Lmdb);
}

#[test]
fn memory_requests_queued_while_the_writer_waits_join_its_group() {
    requests_queued_while_the_writer_waits_join_its_group(TestBackend::Memory);
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
        .engine()
        .run_batch(wf, &prompts, &BatchOptions::default(), agents, &mut |_| {})
        .unwrap();
    assert_eq!((report.threads, report.errors, report.steps), (9, 9, 9));
    for t in store
        .threads()
        .list(&uwf_db::thread::ThreadQuery::default())
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
        .engine()
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
        .engine()
        .run_batch(wf, &[], &BatchOptions::default(), agents(2), &mut |_| {})
        .unwrap();
    assert_eq!(report.threads, 0);
    assert!(
        store
            .threads()
            .list(&uwf_db::thread::ThreadQuery::default())
            .unwrap()
            .is_empty()
    );
}

/// A workflow named `twin` whose end prompt says which store it was
/// registered in: two stores hold different content under one name.
fn twin(store: &Store, version: &str) -> Hash {
    let yaml = format!(
        "name: twin\nroles:\n  worker:\n    goal: Work\n    output: Say done\ngraph:\n  $START:\n    _: {{ role: worker, prompt: 'Work ({version})' }}\n  worker:\n    _: {{ role: $END, prompt: 'Done by version {version}' }}\n"
    );
    let wf = parse_workflow(&yaml, Some("twin"), &|_| false).unwrap();
    store.workflows().add(&wf).unwrap().0
}

/// The text of a content blob.
fn text(store: &Store, hash: &Hash) -> String {
    match store.get(hash).unwrap() {
        Some(Blob::Content(c)) => c.text,
        other => panic!("{hash} is not a content blob: {other:?}"),
    }
}

/// Answers at once.
struct Quick;

impl Agent for Quick {
    fn call(&mut self, _: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
        std::thread::sleep(std::time::Duration::from_millis(2));
        Ok("worked".to_owned().into())
    }
}

/// Answers only when the drive's token is cancelled, and then with an
/// error (as a killed agent would).
struct UntilCancelled(Arc<AtomicUsize>);

impl Agent for UntilCancelled {
    fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        while !req.cancel.is_cancelled() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Err(AgentError::Other("stopped by the token".into()))
    }
}

fn two_stores_in_one_process_keep_their_workflows_and_their_cancellation_apart(
    backend: TestBackend,
) {
    let (a, b) = (backend.fast(), backend.fast());
    let (wf_a, wf_b) = (twin(&a, "A"), twin(&b, "B"));
    assert_ne!(wf_a, wf_b);
    let prompts: Vec<String> = (0..20).map(|i| format!("task {i}")).collect();
    let options_a = BatchOptions::default();
    let options_b = BatchOptions::default();
    let waiting = Arc::new(AtomicUsize::new(0));
    let (report_a, report_b) = std::thread::scope(|s| {
        let batch_a = s.spawn(|| {
            let agents: Vec<Box<dyn Agent>> = (0..2)
                .map(|_| Box::new(UntilCancelled(Arc::clone(&waiting))) as Box<dyn Agent>)
                .collect();
            a.engine()
                .run_batch(wf_a, &prompts, &options_a, agents, &mut |_| {})
                .unwrap()
        });
        // Both of A's drivers are inside an agent call.
        while waiting.load(Ordering::SeqCst) < 2 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut first = true;
        let report_b = b
            .engine()
            .run_batch(
                wf_b,
                &prompts,
                &options_b,
                (0..2).map(|_| Box::new(Quick) as Box<dyn Agent>).collect(),
                &mut |_| {
                    // Cancel A's batch while B's is under way.
                    if std::mem::take(&mut first) {
                        options_a.cancel.cancel();
                    }
                },
            )
            .unwrap();
        (batch_a.join().unwrap(), report_b)
    });
    assert!(options_a.cancel.is_cancelled());
    assert!(!options_b.cancel.is_cancelled());
    // B finished every thread, with its own version of `twin`.
    assert_eq!((report_b.threads, report_b.completed), (20, 20));
    assert_eq!(report_b.errors, 0);
    let all = uwf_db::thread::ThreadQuery::default();
    let threads_b = b.threads().list(&all).unwrap();
    assert_eq!(threads_b.len(), 20);
    for t in &threads_b {
        assert_eq!(t.status, ThreadStatus::Completed);
        assert_eq!(t.workflow_hash, wf_b);
        let end = &b.threads().log(t.id, 1, None).unwrap()[0];
        assert_eq!(text(&b, &end.node.input), "Done by version B");
    }
    // A stopped: the two threads under way were interrupted, none
    // completed, no new one started; they are idle and retryable, with no
    // failure recorded (an interrupt is not the agent's failure).
    assert_eq!(report_a.completed, 0);
    assert_eq!(report_a.threads, 2, "{report_a:?}");
    assert_eq!(report_a.errors, 2);
    let threads_a = a.threads().list(&all).unwrap();
    assert_eq!(threads_a.len(), 2);
    for t in &threads_a {
        assert_eq!(t.status, ThreadStatus::Idle);
        assert_eq!(t.claimed_status, None);
        assert_eq!(t.last_error, None);
        assert_eq!(t.workflow_hash, wf_a);
    }
    // A fresh token drives them on, with A's version.
    let ids: Vec<_> = threads_a.iter().map(|t| t.id).collect();
    let report = a
        .engine()
        .continue_threads(
            &ids,
            &BatchOptions::default(),
            vec![Box::new(Quick)],
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(report.completed, 2);
    for id in ids {
        let end = &a.threads().log(id, 1, None).unwrap()[0];
        assert_eq!(text(&a, &end.node.input), "Done by version A");
    }
}

/// A step that fails says why in a type (`StepFailure`), not only in
/// words; the thread's `last_error` is that failure's text, word for word.
fn step_failures_are_typed_and_recorded_in_their_words(b: TestBackend) {
    use uwf_db::engine::{EngineError, StartOptions, StepFailure};
    struct Says(&'static str);
    impl Agent for Says {
        fn call(&mut self, _: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
            Ok(self.0.to_owned().into())
        }
    }
    struct Down;
    impl Agent for Down {
        fn call(&mut self, _: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
            Err(AgentError::Other("HTTP 429".into()))
        }
    }
    let store = b.fast();
    let review = review(&store);
    let gone = StartOptions {
        cwd: Some("/no/such/directory".into()),
        ..StartOptions::default()
    };
    let cases: [(StartOptions, &mut dyn Agent); 3] = [
        (StartOptions::default(), &mut Down),
        (
            StartOptions::default(),
            &mut Says("no frontmatter, so no $status"),
        ),
        (gone, &mut Says("never asked")),
    ];
    let mut causes = Vec::new();
    for (options, agent) in cases {
        let (thread, report) = store
            .engine()
            .run_workflow(review, "a task", &options, agent)
            .unwrap();
        let Some(EngineError::StepFailed { thread: id, cause }) = report.error else {
            panic!("not a step failure: {:?}", report.error);
        };
        assert_eq!(id, thread.id);
        let record = store.threads().get(id).unwrap().unwrap();
        assert_eq!(record.last_error, Some(cause.to_string()));
        assert_eq!(record.status, ThreadStatus::Idle, "nothing committed");
        causes.push(cause);
    }
    assert!(
        matches!(&causes[0], StepFailure::Agent { role, source: AgentError::Other(m) }
            if role == "developer" && m.to_string() == "HTTP 429"),
        "{:?}",
        causes[0]
    );
    assert_eq!(
        causes[0].to_string(),
        "agent failed on role 'developer': HTTP 429"
    );
    assert!(
        matches!(&causes[1], StepFailure::InvalidReply { role, .. } if role == "developer"),
        "{:?}",
        causes[1]
    );
    assert!(
        causes[1]
            .to_string()
            .starts_with("invalid reply from role 'developer': "),
        "{}",
        causes[1]
    );
    assert!(
        matches!(&causes[2], StepFailure::MissingDirectory { dir, .. }
            if dir == std::path::Path::new("/no/such/directory")),
        "{:?}",
        causes[2]
    );
    // The cause chain goes on below the failure: the agent's own error.
    let source = std::error::Error::source(&causes[0]).map(ToString::to_string);
    assert_eq!(source.as_deref(), Some("HTTP 429"));
}

const SOLVE: &str = "name: solve
roles:
  solver: { goal: Solve one task }
graph:
  $START: { _: { role: solver, prompt: 'Solve it' } }
  solver: { _: { role: $END, prompt: '{{{_body}}}' } }
";

const PLAN: &str = "name: plan
roles:
  planner:
    goal: Split the work
    frontmatter:
      properties: { $status: { const: planned }, tasks: { type: array } }
      required: [$status, tasks]
  solve_all:
    foreach: { items: tasks, as: task, workflow: solve, prompt: 'Solve {{task}}', max_items: 1000, max_concurrency: 4 }
    join: {}
graph:
  $START: { _: { role: planner, prompt: 'Plan' } }
  planner: { planned: { role: solve_all, prompt: 'Solve them all' } }
  solve_all: { done: { role: $END, prompt: '{{completed}} solved' } }
";

/// The planner lists `items` tasks `t0`…; a solver answers at once; every
/// fork counts into the same call counter.
#[derive(Clone)]
struct Planner {
    items: usize,
    calls: Arc<AtomicUsize>,
}

impl Agent for Planner {
    fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if req.role_name == "planner" {
            let tasks: Vec<String> = (0..self.items).map(|i| format!("t{i}")).collect();
            return Ok(format!(
                "---\n$status: planned\ntasks: [{}]\n---\nThe plan\n",
                tasks.join(", ")
            )
            .into());
        }
        // Each child's parent context names that child, though the
        // children of one call share it.
        let own = format!("This thread ({}, workflow `solve`)", req.thread);
        if !req.prompt.contains(&own) {
            return Err(AgentError::Other(
                format!("not named: {}", req.prompt).into(),
            ));
        }
        Ok("solved".to_owned().into())
    }

    fn fork(&self) -> Option<Box<dyn Agent>> {
        Some(Box::new(self.clone()))
    }
}

/// A fan-out makes its children in chunks, each in one transaction that
/// appends to the parent's `fan_out` (`docs/design.md` §5f). A driver that
/// died after the first chunks left a prefix: the next drive makes exactly
/// the items past it, one child each, and a chunk that expects another
/// prefix is refused with nothing written.
fn a_fan_out_cut_off_while_making_children_makes_only_the_rest(b: TestBackend) {
    use uwf_db::engine::DriveOptions;
    use uwf_db::thread::NewThread;
    let store = b.durable();
    let count = |store: &Store| {
        let all = uwf_db::thread::ThreadQuery {
            limit: 10_000,
            ..Default::default()
        };
        store.threads().list(&all).unwrap().len()
    };
    let solve = parse_workflow(SOLVE, Some("solve"), &|_| false).unwrap();
    let (solve_hash, _) = store.workflows().add(&solve).unwrap();
    let plan = parse_workflow(PLAN, Some("plan"), &|n| n == "solve").unwrap();
    let (plan_hash, _) = store.workflows().add(&plan).unwrap();
    let items = 300;
    let calls = Arc::new(AtomicUsize::new(0));
    let mut agent = Planner {
        items,
        calls: calls.clone(),
    };
    let engine = store.engine();
    let parent = engine
        .start_workflow(plan_hash, "the work", &Default::default())
        .unwrap();
    let one = DriveOptions {
        max_steps: Some(1),
        ..DriveOptions::default()
    };
    engine
        .drive(parent.id, &one, &mut agent)
        .into_result()
        .unwrap();
    let at_fan_out = store.threads().get(parent.id).unwrap().unwrap();
    assert_eq!(at_fan_out.next_role.as_deref(), Some("solve_all"));
    // What a driver killed after its first chunk leaves: 10 children, named.
    let child = |i: usize| NewThread {
        workflow: "solve".into(),
        workflow_hash: solve_hash,
        prompt: format!("Solve t{i}"),
        max_rounds: 100,
        depth: 1,
        parent_state: Some(at_fan_out.head),
        parent_thread: Some(parent.id),
        next_role: "solver".into(),
        next_instruction: "Solve it".into(),
        agent: None,
        cwd: None,
        next_location: None,
        labels: Default::default(),
    };
    let low = store.threads().low_level();
    let first = low
        .start_children(parent.id, at_fan_out.head, 0, (0..10).map(child).collect())
        .unwrap();
    // A second driver that read the record before that chunk: refused.
    let before = count(&store);
    let e = low
        .start_children(parent.id, at_fan_out.head, 0, vec![child(0)])
        .unwrap_err();
    assert!(
        matches!(
            e,
            ThreadError::ChildrenConflict {
                expected: 0,
                actual: 10,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(count(&store), before, "nothing written");

    let report = engine.drive(parent.id, &DriveOptions::default(), &mut agent);
    let results = report.into_result().unwrap();
    assert_eq!(results.last().unwrap().status, ThreadStatus::Completed);
    // One planner call, one call per item.
    assert_eq!(calls.load(Ordering::SeqCst), 1 + items);
    assert_eq!(count(&store), 1 + items);
    let log = store.threads().log(parent.id, 10, None).unwrap();
    let joined = log
        .iter()
        .find(|e| e.node.role == "solve_all")
        .expect("the join");
    let results = joined.node.meta["results"].to_json();
    let results = results.as_array().unwrap();
    assert_eq!(results.len(), items);
    for (i, r) in results.iter().enumerate() {
        let id: uwf_db::thread::ThreadId = r["thread"].as_str().unwrap().parse().unwrap();
        if i < first.len() {
            assert_eq!(id, first[i].id, "the prefix kept, item {i}");
        }
        assert_eq!(r["status"], "completed");
        let record = store.threads().get(id).unwrap().unwrap();
        assert_eq!(
            engine.task(&record).unwrap(),
            format!("Solve t{i}"),
            "item {i}'s task"
        );
    }
    assert!(verify(&store, |_| {}).unwrap().is_ok());
}

/// Answers every call with a reported cost, after `gate` lets it.
struct Costly {
    inner: Box<dyn Agent>,
    gate: Arc<std::sync::Barrier>,
    first: bool,
}

impl Agent for Costly {
    fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
        if std::mem::take(&mut self.first) {
            // Each driver's first call waits until the test has looked.
            self.gate.wait();
            self.gate.wait();
        }
        let mut reply = self.inner.call(req)?;
        reply.usage = Some(uwf_db::usage::Usage {
            cost_usd: Some(0.25),
            ..Default::default()
        });
        Ok(reply)
    }
    fn needs_step_count(&self) -> bool {
        self.inner.needs_step_count()
    }
}

/// `BatchOptions::progress`: threads running while their drivers work,
/// every agent call counted and its cost summed, as the report says at
/// the end.
fn a_batch_reports_its_progress_live(b: TestBackend) {
    let store = b.durable();
    let wf = review(&store);
    let prompts: Vec<String> = (0..12).map(|i| format!("change {i}")).collect();
    let live = Arc::new(uwf_db::engine::batch::BatchProgress::default());
    let options = BatchOptions {
        progress: Some(live.clone()),
        ..BatchOptions::default()
    };
    let gate = Arc::new(std::sync::Barrier::new(4));
    let drivers: Vec<Box<dyn Agent>> = agents(3)
        .into_iter()
        .map(|inner| {
            Box::new(Costly {
                inner,
                gate: gate.clone(),
                first: true,
            }) as Box<dyn Agent>
        })
        .collect();
    let report = std::thread::scope(|s| {
        let batch = s.spawn(|| {
            store
                .engine()
                .run_batch(wf, &prompts, &options, drivers, &mut |_| {})
                .unwrap()
        });
        // Every driver is inside its first call: three threads running.
        gate.wait();
        assert_eq!(live.running(), 3);
        assert_eq!((live.calls(), live.cost_usd()), (0, None));
        gate.wait();
        batch.join().unwrap()
    });
    assert_eq!(report.completed, 12);
    assert_eq!(live.running(), 0);
    assert_eq!(live.calls(), 48, "four calls a thread");
    assert_eq!(live.calls(), report.usage.calls);
    assert!(
        (live.cost_usd().unwrap() - 12.0).abs() < 1e-9,
        "{:?}",
        live.cost_usd()
    );
}

conformance!(
    a_batch_reports_its_progress_live,
    a_fan_out_cut_off_while_making_children_makes_only_the_rest,
    a_durable_batch_commits_every_step_in_groups,
    a_failing_request_is_rolled_back_alone,
    a_panicking_request_is_rolled_back_alone_and_panics_its_sender,
    every_sender_of_a_group_is_woken_with_its_own_answer,
    without_a_group_write_op_is_a_plain_write,
    a_step_failure_stops_its_thread_only,
    step_failures_are_typed_and_recorded_in_their_words,
    a_batch_without_agents_is_refused,
    two_stores_in_one_process_keep_their_workflows_and_their_cancellation_apart,
);

/// A backend of three group writers (as a server's) whose first `dies`
/// write transactions panic as they begin: the writer thread taking that
/// group dies with it.
#[derive(Debug)]
struct WritersDie {
    inner: uwf_db::backend::memory::MemoryBackend,
    dies: AtomicUsize,
}

impl uwf_db::backend::Backend for WritersDie {
    fn begin_read(
        &self,
    ) -> Result<Box<dyn uwf_db::backend::ReadTables + '_>, uwf_db::backend::BackendError> {
        self.inner.begin_read()
    }
    fn begin_write(
        &self,
    ) -> Result<Box<dyn uwf_db::backend::WriteTables + '_>, uwf_db::backend::BackendError> {
        if self
            .dies
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            panic!("a group writer dies (as the test asked)");
        }
        self.inner.begin_write()
    }
    fn parallel_writers(&self) -> usize {
        3
    }
    fn location(&self) -> &str {
        self.inner.location()
    }
    fn dir(&self) -> Option<&Path> {
        self.inner.dir()
    }
    fn durability(&self) -> uwf_db::Durability {
        self.inner.durability()
    }
    fn try_lock_claim(
        &self,
        id: uwf_db::backend::ClaimKey,
    ) -> Result<Option<Box<dyn uwf_db::backend::HeldLock>>, uwf_db::backend::BackendError> {
        self.inner.try_lock_claim(id)
    }
    fn claim_locked(
        &self,
        id: uwf_db::backend::ClaimKey,
    ) -> Result<bool, uwf_db::backend::BackendError> {
        self.inner.claim_locked(id)
    }
    fn try_lock_gc(
        &self,
    ) -> Result<Option<Box<dyn uwf_db::backend::HeldLock>>, uwf_db::backend::BackendError> {
        self.inner.try_lock_gc()
    }
    fn storage_stats(
        &self,
    ) -> Result<uwf_db::backend::StorageStats, uwf_db::backend::BackendError> {
        self.inner.storage_stats()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// With several group writers, the first taking every group and the others
/// waiting for a deep queue: when the first dies, the others take its
/// place, and when the next dies too, the last still serves the queue. A
/// request a dying writer held fails with `GroupStopped`; none waits
/// forever. (The handle's scope then reports the writers' panics.)
#[test]
fn when_group_writers_die_the_others_serve_the_queue() {
    let store = Store::from_backend(WritersDie {
        inner: uwf_db::backend::memory::MemoryBackend::new(),
        dies: AtomicUsize::new(2),
    });
    let outcomes = std::sync::Mutex::new(Vec::new());
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        store.group_commit(0, |g| {
            for i in 0..5 {
                let r = g.write_op(move |w| w.put_blob(&Blob::content(format!("request {i}"), [])));
                outcomes.lock().unwrap().push(r);
            }
        })
    }));
    assert!(ran.is_err(), "the dead writers' panics are reported");
    let outcomes = outcomes.into_inner().unwrap();
    assert_eq!(outcomes.len(), 5);
    for (i, r) in outcomes.iter().enumerate() {
        if i < 2 {
            assert!(matches!(r, Err(StoreError::GroupStopped)), "{i}: {r:?}");
        } else {
            let hash = r.as_ref().unwrap();
            assert!(store.contains(hash).unwrap(), "request {i} stored");
        }
    }
}

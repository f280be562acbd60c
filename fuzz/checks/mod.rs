//! The fuzz targets' checks, shared by the cargo-fuzz binaries
//! (`fuzz/fuzz_targets/*.rs`) and by `tests/fuzz_corpora.rs`, which replays
//! every committed corpus file through them under `cargo test` (so CI
//! replays the corpora). Each check must never panic except on a real bug.

use uwf_db::engine::extract::{extract, flat_frontmatter};
use uwf_db::thread::ThreadRecord;
use uwf_db::workflow::{Role, Workflow, parse_workflow};
use uwf_db::{Blob, Hash, Store};

/// A target's check.
pub type Check = fn(&[u8]);

/// The targets and their checks, by name (the corpus directory names).
pub const TARGETS: &[(&str, Check)] = &[
    ("blob_decode", blob_decode),
    ("workflow_yaml", workflow_yaml),
    ("agent_reply", agent_reply),
    ("thread_record", thread_record),
    ("bundle", bundle),
    ("store_model", store_model),
    ("scenario", scenario),
];

/// A scenario file (`script:` agents) never panics the parser; one it
/// accepts answers a first call without panicking either.
pub fn scenario(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = uwf_db::engine::agent::ScriptAgent::parse(std::path::Path::new("fuzz.yaml"), text);
}

/// The blob decoder never panics on arbitrary bytes, and whatever it
/// accepts is canonical: it re-encodes to exactly the input, same hash.
pub fn blob_decode(data: &[u8]) {
    // The canonical-form checker alone must not panic either.
    let _ = uwf_db::codec::check_canonical(data);
    // Neither must the trusted path (used for blobs read back from the store).
    let _ = Blob::decode_trusted(data);
    if let Ok(blob) = Blob::decode(data) {
        let enc = blob.encode().expect("a decoded blob re-encodes");
        assert_eq!(enc.bytes(), data, "accepted bytes are canonical");
        assert_eq!(enc.hash(), Hash::of(data));
        assert_eq!(enc.refs(), blob.collect_refs().as_slice());
    }
}

/// Workflow validation never panics on arbitrary text: it returns a
/// workflow or a list of problems; a workflow it accepts round-trips
/// through its blob.
pub fn workflow_yaml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(wf) = parse_workflow(text, None, &|_| true) {
        let blob = wf.to_blob().expect("a valid workflow encodes");
        let enc = blob.encode().expect("canonical");
        let back = Workflow::from_blob(enc.hash(), &blob).expect("decodes");
        assert_eq!(back, wf);
    }
}

/// The extractor never panics on an arbitrary agent reply (untrusted
/// text), for a role with a schema and for one without; and the
/// frontmatter fast path agrees with the YAML parser on every input it
/// takes.
pub fn agent_reply(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let schema = serde_json::json!({"oneOf": [
        {"properties": {"$status": {"const": "ok"}, "refs": {"type": "array", "items": {"format": "uwf-hash"}}}, "required": ["$status"]},
        {"properties": {"$status": {"const": "no"}, "reason": {"type": "string"}}, "required": ["$status", "reason"]}
    ]});
    let with_schema = Role {
        frontmatter: Some(schema),
        ..Role::default()
    };
    let _ = extract(&with_schema, text);
    let _ = extract(&Role::default(), text);
    if let Some(fast) = flat_frontmatter(text) {
        let parsed: serde_json::Value =
            uwf_db::yaml::from_str(text).expect("the parser takes what the fast path takes");
        assert_eq!(parsed, serde_json::Value::Object(fast), "{text:?}");
    }
}

/// The thread-record decoder (records read back from `threads` and
/// `history`, and records in bundles) never panics, and what it accepts
/// re-encodes to a record that decodes to the same value.
pub fn thread_record(data: &[u8]) {
    if let Ok(record) = ThreadRecord::decode(data) {
        let again = record.encode().expect("a decoded record re-encodes");
        let back = ThreadRecord::decode(&again).expect("a re-encoded record decodes");
        assert_eq!(back, record);
    }
}

/// A bundle (`uwf-db import`, untrusted bytes) never makes the decoder or
/// an import panic; an import either commits or leaves the store empty.
pub fn bundle(data: &[u8]) {
    let _ = uwf_db::bundle::decode(data);
    let store = Store::memory();
    match uwf_db::bundle::import(&store, data, false) {
        Ok(report) => {
            assert_eq!(
                store.blob_count().expect("count"),
                report.new_blobs,
                "an import writes the blobs it reports"
            );
            let problems = uwf_db::verify::verify(&store, |_| {})
                .expect("verify runs")
                .problems;
            assert!(
                problems.is_empty(),
                "an accepted bundle verifies: {problems:?}"
            );
        }
        Err(_) => assert_eq!(store.blob_count().expect("count"), 0, "all or nothing"),
    }
}

/// The model-based target: random operations against a real store and a
/// simple model of it, which must agree after every one, with `verify`
/// clean. See [`model`].
pub fn store_model(data: &[u8]) {
    model::run(data);
}

/// The store under [`store_model`] and the model it is checked against.
pub mod model {
    use std::borrow::Cow;
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::time::Duration;

    use uwf_db::backend::BackendError;
    use uwf_db::backend::memory::MemoryBackend;
    use uwf_db::backend::{
        Backend, Direction, Entries, HeldLock, KeyRange, ReadTables, StorageStats, Table,
        WriteTables,
    };
    use uwf_db::gc::GcOptions;
    use uwf_db::thread::{EndSpec, NewThread, Next, StepWrite, ThreadId, ThreadStatus};
    use uwf_db::{Blob, Durability, Hash, Store, StoreOptions, Value, WorkflowNode};

    /// A memory backend whose writes fail once a countdown reaches zero
    /// (an injected I/O failure or full store, at any write of any
    /// transaction, the commit included).
    #[derive(Debug)]
    pub struct Faulty {
        inner: MemoryBackend,
        /// Writes left before the failure; negative: no failure armed.
        countdown: Arc<AtomicI64>,
        /// Failures injected so far.
        injected: Arc<AtomicI64>,
        full: Arc<std::sync::atomic::AtomicBool>,
    }

    /// The handle a test keeps to arm the failure.
    #[derive(Clone)]
    pub struct Arm {
        countdown: Arc<AtomicI64>,
        injected: Arc<AtomicI64>,
        full: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Arm {
        /// The `n`th write from now fails (as a full store when `full`).
        pub fn fail_after(&self, n: i64, full: bool) {
            self.full.store(full, Ordering::SeqCst);
            self.countdown.store(n, Ordering::SeqCst);
        }
        /// No failure armed.
        pub fn disarm(&self) {
            self.countdown.store(-1, Ordering::SeqCst);
        }
        /// Failures injected so far.
        pub fn injected(&self) -> i64 {
            self.injected.load(Ordering::SeqCst)
        }
    }

    impl Faulty {
        /// A new empty store and its arming handle.
        pub fn store() -> (Store, Arm) {
            let f = Faulty {
                inner: MemoryBackend::new(),
                countdown: Arc::new(AtomicI64::new(-1)),
                injected: Arc::new(AtomicI64::new(0)),
                full: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            };
            let arm = Arm {
                countdown: Arc::clone(&f.countdown),
                injected: Arc::clone(&f.injected),
                full: Arc::clone(&f.full),
            };
            (Store::from_backend(f), arm)
        }
    }

    struct FaultyWrite<'a> {
        inner: Box<dyn WriteTables + 'a>,
        countdown: &'a AtomicI64,
        injected: &'a AtomicI64,
        full: bool,
    }

    impl FaultyWrite<'_> {
        fn tick(&self) -> Result<(), BackendError> {
            if self.countdown.load(Ordering::SeqCst) < 0 {
                return Ok(());
            }
            if self.countdown.fetch_sub(1, Ordering::SeqCst) == 0 {
                self.injected.fetch_add(1, Ordering::SeqCst);
                return Err(if self.full {
                    BackendError::MapFull {
                        path: "fuzz".into(),
                        map_size: 0,
                    }
                } else {
                    BackendError::Io {
                        op: "write",
                        path: "fuzz".into(),
                        source: std::io::Error::other("injected I/O failure"),
                    }
                });
            }
            Ok(())
        }
    }

    impl ReadTables for FaultyWrite<'_> {
        fn get(&self, table: Table, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>, BackendError> {
            self.inner.get(table, key)
        }
        fn range(
            &self,
            table: Table,
            range: KeyRange<'_>,
            direction: Direction,
        ) -> Result<Entries<'_>, BackendError> {
            self.inner.range(table, range, direction)
        }
        fn count(&self, table: Table) -> Result<u64, BackendError> {
            self.inner.count(table)
        }
    }

    impl WriteTables for FaultyWrite<'_> {
        fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), BackendError> {
            self.tick()?;
            self.inner.put(table, key, value)
        }
        fn insert(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<bool, BackendError> {
            self.tick()?;
            self.inner.insert(table, key, value)
        }
        fn delete(&mut self, table: Table, key: &[u8]) -> Result<bool, BackendError> {
            self.tick()?;
            self.inner.delete(table, key)
        }
        fn commit(self: Box<Self>) -> Result<(), BackendError> {
            self.tick()?;
            self.inner.commit()
        }
    }

    impl Backend for Faulty {
        fn begin_read(&self) -> Result<Box<dyn ReadTables + '_>, BackendError> {
            self.inner.begin_read()
        }
        fn begin_write(&self) -> Result<Box<dyn WriteTables + '_>, BackendError> {
            Ok(Box::new(FaultyWrite {
                inner: self.inner.begin_write()?,
                countdown: &self.countdown,
                injected: &self.injected,
                full: self.full.load(Ordering::SeqCst),
            }))
        }
        fn location(&self) -> &str {
            self.inner.location()
        }
        fn dir(&self) -> Option<&std::path::Path> {
            self.inner.dir()
        }
        fn durability(&self) -> Durability {
            self.inner.durability()
        }
        fn try_lock_claim(
            &self,
            id: uwf_db::backend::ClaimKey,
        ) -> Result<Option<Box<dyn HeldLock>>, BackendError> {
            self.inner.try_lock_claim(id)
        }
        fn claim_locked(&self, id: uwf_db::backend::ClaimKey) -> Result<bool, BackendError> {
            self.inner.claim_locked(id)
        }
        fn try_lock_gc(&self) -> Result<Option<Box<dyn HeldLock>>, BackendError> {
            self.inner.try_lock_gc()
        }
        fn storage_stats(&self) -> Result<StorageStats, BackendError> {
            self.inner.storage_stats()
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    /// What the model knows of a thread.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum State {
        Idle,
        Suspended,
        Ended,
    }

    #[derive(Debug, Clone)]
    struct Thread {
        head: Hash,
        state: State,
    }

    /// The input, read a byte at a time (zeros past its end).
    struct Bytes<'d>(&'d [u8]);

    impl Bytes<'_> {
        fn byte(&mut self) -> u8 {
            match self.0.split_first() {
                Some((b, rest)) => {
                    self.0 = rest;
                    *b
                }
                None => 0,
            }
        }
    }

    fn step(n: u8) -> StepWrite {
        StepWrite {
            role: "worker".into(),
            meta: BTreeMap::from([("n".to_owned(), Value::Int(i64::from(n)))]),
            reply: format!("reply {n}"),
            artifacts: Vec::new(),
            instruction: "Work".into(),
            child_thread: None,
        }
    }

    fn next_role() -> Next {
        Next::Role {
            role: "worker".into(),
            instruction: "Work again".into(),
            location: None,
        }
    }

    fn end() -> EndSpec {
        EndSpec {
            return_code: 0,
            summary: "done".into(),
            prompt: "Done".into(),
        }
    }

    /// The store's view of thread `id`, as the model's states.
    fn seen(store: &Store, id: ThreadId) -> Option<(Hash, State)> {
        let r = store.threads().get(id).expect("reading a thread")?;
        let state = match r.status {
            ThreadStatus::Idle => State::Idle,
            ThreadStatus::Suspended => State::Suspended,
            ThreadStatus::Completed | ThreadStatus::Failed | ThreadStatus::Cancelled => {
                State::Ended
            }
            ThreadStatus::Running => panic!("no driver runs here: {r:?}"),
        };
        Some((r.head, state))
    }

    /// Runs the operations `data` encodes, checking the store against
    /// the model after each.
    pub fn run(data: &[u8]) {
        let mut input = Bytes(data);
        let lmdb = input.byte() % 4 == 0;
        let dir = lmdb.then(|| tempfile::tempdir().expect("a temporary directory"));
        let open = |dir: &std::path::Path| {
            Store::open(
                dir,
                StoreOptions {
                    durability: Durability::None,
                    // Small: a long input fills it (a real map-full).
                    max_map_size: Some(1 << 20),
                    ..StoreOptions::default()
                },
            )
            .expect("opening the store")
        };
        let (mut store, arm) = match &dir {
            Some(d) => (open(d.path()), None),
            None => {
                let (s, a) = Faulty::store();
                (s, Some(a))
            }
        };
        let wf = store
            .put(&Blob::Workflow(WorkflowNode {
                definition: Value::Map(BTreeMap::from([(
                    "name".to_owned(),
                    Value::Str("model".into()),
                )])),
            }))
            .expect("the workflow blob");
        // A root, so that a collection keeps it for the threads to come.
        store.pin(&wf).expect("pinning the workflow");
        let mut threads: BTreeMap<ThreadId, Thread> = BTreeMap::new();
        let mut removed: Vec<ThreadId> = Vec::new();
        for _ in 0..64 {
            if input.0.is_empty() {
                break;
            }
            let op = input.byte() % 12;
            let pick = input.byte();
            let ids: Vec<ThreadId> = threads.keys().copied().collect();
            let target = (!ids.is_empty()).then(|| ids[usize::from(pick) % ids.len()]);
            // An injected failure at a random write of this operation.
            let armed = match (&arm, input.byte()) {
                (Some(a), b) if b % 5 == 0 => {
                    a.fail_after(i64::from(b / 5 % 8), b % 2 == 0);
                    true
                }
                _ => false,
            };
            let before = arm.as_ref().map_or(0, Arm::injected);
            // Ok(new model state), or Err(()) when the store refused.
            // Whether the model says the operation must succeed.
            let mut expect_ok = true;
            let outcome: Result<(), String> = match (op, target) {
                (0, _) => {
                    let size = usize::from(input.byte()) * 256;
                    store
                        .put(&Blob::content("x".repeat(size).as_str(), []))
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
                (1, _) => store
                    .threads()
                    .low_level()
                    .start_thread(NewThread {
                        workflow: "model".into(),
                        workflow_hash: wf,
                        prompt: format!("prompt {pick}"),
                        max_rounds: 1000,
                        depth: 0,
                        parent_state: None,
                        parent_thread: None,
                        next_role: "worker".into(),
                        next_instruction: "Work".into(),
                        agent: None,
                        cwd: None,
                        next_location: None,
                        labels: Default::default(),
                    })
                    .map(|r| {
                        threads.insert(
                            r.id,
                            Thread {
                                head: r.head,
                                state: State::Idle,
                            },
                        );
                    })
                    .map_err(|e| e.to_string()),
                (2..=4, Some(id)) => {
                    let t = threads[&id].clone();
                    let wrong = op == 3;
                    expect_ok = !wrong && t.state != State::Ended;
                    let expected = if wrong {
                        Hash::of(b"not the head")
                    } else {
                        t.head
                    };
                    let after = if op == 4 {
                        Next::Suspend {
                            role: "worker".into(),
                            message: "a question".into(),
                        }
                    } else {
                        next_role()
                    };
                    let r =
                        store
                            .threads()
                            .low_level()
                            .append_step(id, expected, step(pick), after);
                    match r {
                        Ok(w) => {
                            assert!(!wrong, "an append with a wrong head was taken");
                            assert!(t.state != State::Ended, "an ended thread took a step");
                            let th = threads.get_mut(&id).expect("the thread");
                            th.head = w.record.head;
                            th.state = if op == 4 {
                                State::Suspended
                            } else {
                                State::Idle
                            };
                            Ok(())
                        }
                        Err(e) => Err(e.to_string()),
                    }
                }
                (5, Some(id)) => {
                    let t = threads[&id].clone();
                    expect_ok = t.state != State::Ended;
                    match store.threads().low_level().end_thread(id, t.head, end()) {
                        Ok(w) => {
                            assert!(t.state != State::Ended, "ended twice");
                            let th = threads.get_mut(&id).expect("the thread");
                            th.head = w.record.head;
                            th.state = State::Ended;
                            Ok(())
                        }
                        Err(e) => Err(e.to_string()),
                    }
                }
                (6, Some(id)) => {
                    let t = threads[&id].clone();
                    expect_ok = t.state == State::Ended;
                    match store.threads().low_level().resume_ended(
                        id,
                        t.head,
                        step(pick),
                        next_role(),
                    ) {
                        Ok(w) => {
                            assert_eq!(t.state, State::Ended, "only an ended thread resumes so");
                            let th = threads.get_mut(&id).expect("the thread");
                            th.head = w.record.head;
                            th.state = State::Idle;
                            Ok(())
                        }
                        Err(e) => Err(e.to_string()),
                    }
                }
                (7, Some(id)) => {
                    let t = threads[&id].clone();
                    expect_ok = t.state != State::Ended;
                    match store
                        .threads()
                        .low_level()
                        .fork_thread(id, t.head, next_role())
                    {
                        Ok(r) => {
                            assert!(t.state != State::Ended, "forked at an end node");
                            threads.insert(
                                r.id,
                                Thread {
                                    head: r.head,
                                    state: State::Idle,
                                },
                            );
                            Ok(())
                        }
                        Err(e) => Err(e.to_string()),
                    }
                }
                (8, Some(id)) => match store.threads().remove(id) {
                    Ok(_) => {
                        threads.remove(&id);
                        removed.push(id);
                        Ok(())
                    }
                    Err(e) => Err(e.to_string()),
                },
                (9, Some(id)) => {
                    let t = threads[&id].clone();
                    expect_ok = false;
                    store
                        .threads()
                        .stage_compact(id, t.head, "a summary")
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
                (10, _) => {
                    let options = GcOptions {
                        grace: Duration::ZERO,
                        ..GcOptions::default()
                    };
                    uwf_db::gc::collect_garbage(&store, &options, &|_| {})
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
                (11, _) => {
                    if let Some(d) = &dir {
                        drop(store);
                        store = open(d.path());
                    }
                    Ok(())
                }
                _ => Ok(()),
            };
            let injected = arm.as_ref().map_or(0, Arm::injected) > before;
            if let Some(a) = &arm {
                a.disarm();
            }
            if let Err(e) = &outcome {
                // A refusal the model does not expect must be the failure
                // injected, or the small LMDB map filling up.
                assert!(
                    !expect_ok || injected || e.contains("full"),
                    "operation {op} failed: {e}"
                );
            }
            let _ = armed;
            // The store and the model agree.
            for (id, t) in &threads {
                let (head, state) = seen(&store, *id).expect("a modelled thread exists");
                assert_eq!(head, t.head, "thread {id}: head");
                assert_eq!(state, t.state, "thread {id}: status");
            }
            for id in &removed {
                assert!(seen(&store, *id).is_none(), "removed thread {id} is back");
            }
            let listed = store
                .threads()
                .list(&uwf_db::thread::ThreadQuery {
                    limit: 10_000,
                    ..Default::default()
                })
                .expect("listing");
            assert_eq!(
                listed.len(),
                threads.len(),
                "the listing holds the modelled threads"
            );
            let report = uwf_db::verify::verify(&store, |_| {}).expect("verify runs");
            assert!(report.problems.is_empty(), "verify: {:?}", report.problems);
            for id in threads.keys() {
                store
                    .threads()
                    .log(*id, 1000, None)
                    .expect("every history reads back whole");
            }
        }
    }
}

//! Bench `batch` (SPEC §9), durable (`sync`), each against a baseline in the
//! same run:
//! - group commit: `append_step` from 32 threads through one group-commit
//!   writer vs raw heed durable transactions putting the same bytes in the
//!   same group sizes (goal ≥ 0.5×);
//! - the engine driving the review scenario with 32 jobs over group commit
//!   vs the engine with one transaction per step (`run`, one thread after
//!   another) (goal ≥ 10×);
//! - fan-out (SPEC §13): one role fanning out to 1,000 child threads (64 at
//!   a time, in a batch of that one parent) vs 1,000 independent threads of
//!   the child workflow in a batch with 64 jobs (goal ≥ 0.8×).
//!
//! Run: `cargo bench --bench batch`. `UWF_BENCH_SCALE=0.1` shrinks it.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use common::{
    Comparison, placeholder_workflow, raw_env, report, scale, scratch_dir, start_thread, step_puts,
    time,
};
use heed::types::Bytes;
use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest, ScriptAgent};
use uwf_db::engine::batch::{BatchOptions, BatchReport};
use uwf_db::store::GroupStats;
use uwf_db::thread::{Next, StepWrite};
use uwf_db::workflow::{Workflow, parse_workflow};
use uwf_db::{Durability, Hash, Store, StoreOptions, Value};

const WRITERS: usize = 32;
const JOBS: usize = 128;

fn open(dir: &Path) -> Store {
    Store::open(
        dir,
        StoreOptions {
            durability: Durability::Sync,
            ..StoreOptions::default()
        },
    )
    .unwrap()
}

/// A durable store in a scratch directory with `workflows` registered in
/// order; the last one's hash.
fn store_with(name: &str, workflows: &[&Workflow]) -> (tempfile::TempDir, Store, Hash) {
    let dir = scratch_dir(name);
    let store = open(dir.path());
    let mut last = None;
    for wf in workflows {
        last = Some(store.workflows().add(wf).unwrap().0);
    }
    (dir, store, last.expect("a workflow to run"))
}

/// `prompts` run as a batch of `hash` with one job per agent.
fn batch(
    store: &Store,
    hash: Hash,
    prompts: &[String],
    agents: Vec<Box<dyn Agent>>,
) -> BatchReport {
    store
        .engine()
        .run_batch(hash, prompts, &BatchOptions::default(), agents, &mut |_| {})
        .unwrap()
}

fn step(w: usize, i: usize) -> StepWrite {
    StepWrite {
        role: "developer".into(),
        meta: BTreeMap::from([("$status".to_owned(), Value::Str("review_needed".into()))]),
        reply: format!("writer {w}, step {i}: changed the code and ran the tests"),
        artifacts: vec![],
        instruction: "Implement the change".into(),
        child_thread: None,
    }
}

/// The bytes one step writes, for the raw side (as in the `threads` bench).
fn step_bytes(w: usize, i: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut record_key = vec![0u8; 16];
    record_key[..8].copy_from_slice(&(w as u64).to_be_bytes());
    step_puts(
        &step(w, i),
        i,
        Hash::of(&(w as u64).to_be_bytes()),
        record_key,
    )
}

fn group_commit_bench(per_writer: usize) -> Comparison {
    let total = WRITERS * per_writer;
    let stats = Mutex::new(GroupStats::default());
    let subject = || {
        let dir = scratch_dir("batch-group");
        let store = open(dir.path());
        let wf = placeholder_workflow(&store, "bench");
        let threads: Vec<_> = (0..WRITERS)
            .map(|w| start_thread(&store, wf, "bench", format!("task {w}"), "developer"))
            .collect();
        let mut d = None;
        let ((), s) = store.group_commit(0, |g| {
            d = Some(time(|| {
                std::thread::scope(|scope| {
                    for (w, t) in threads.iter().enumerate() {
                        scope.spawn(move || {
                            let mut head = t.head;
                            for i in 0..per_writer {
                                let next = Next::Role {
                                    role: "developer".into(),
                                    instruction: "Implement the change".into(),
                                    location: None,
                                };
                                head = g
                                    .threads()
                                    .low_level()
                                    .append_step(t.id, head, step(w, i), next)
                                    .unwrap()
                                    .record
                                    .head;
                            }
                        });
                    }
                });
            }));
        });
        *stats.lock().unwrap() = s;
        d.unwrap()
    };
    let baseline = || {
        let s = *stats.lock().unwrap();
        let group = (s.requests as f64 / s.groups.max(1) as f64)
            .round()
            .max(1.0) as usize;
        let steps: Vec<Vec<(Vec<u8>, Vec<u8>)>> = (0..total)
            .map(|k| step_bytes(k % WRITERS, k / WRITERS))
            .collect();
        let dir = scratch_dir("batch-raw");
        let env = raw_env(dir.path(), true);
        let mut w = env.write_txn().unwrap();
        let blobs: heed::Database<Bytes, Bytes> =
            env.create_database(&mut w, Some("blobs")).unwrap();
        let records: heed::Database<Bytes, Bytes> =
            env.create_database(&mut w, Some("threads")).unwrap();
        w.commit().unwrap();
        time(|| {
            for chunk in steps.chunks(group) {
                let mut w = env.write_txn().unwrap();
                for puts in chunk {
                    for (k, v) in &puts[..3] {
                        blobs.put(&mut w, k, v).unwrap();
                    }
                    records.put(&mut w, &puts[3].0, &puts[3].1).unwrap();
                }
                w.commit().unwrap();
            }
        })
    };
    // The subject runs first in each pair, so the baseline knows the group
    // size it must match.
    let c = Comparison::run(
        &format!(
            "group commit: append_step from {WRITERS} threads vs raw heed txns of the same puts in the same group sizes"
        ),
        total as u64,
        3,
        subject,
        baseline,
    );
    let s = *stats.lock().unwrap();
    println!(
        "(group commit: {} groups of {:.1} steps on average in the last run)",
        s.groups,
        s.average_group()
    );
    c
}

fn engine_bench(threads: usize) -> Comparison {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let yaml = std::fs::read_to_string(root.join("examples/review.yaml")).unwrap();
    let wf = parse_workflow(&yaml, Some("review"), &|_| false).unwrap();
    let scenario = root.join("examples/review.scenario.yaml");
    let agent = || Box::new(ScriptAgent::load(&scenario).unwrap()) as Box<dyn Agent>;
    let sequential = (threads / 8).max(2);
    // Rates in steps per second; both sides are timed per step.
    Comparison::run(
        &format!(
            "engine: batch of {threads} review threads, {JOBS} jobs, vs `run` of {sequential} threads one after another (ops = steps of the batch)"
        ),
        (threads * 4) as u64,
        3,
        || {
            let (_dir, store, hash) = store_with("batch-engine", &[&wf]);
            let prompts: Vec<String> = (0..threads).map(|i| format!("change {i}")).collect();
            let agents = (0..JOBS).map(|_| agent()).collect();
            time(|| {
                let r = batch(&store, hash, &prompts, agents);
                assert_eq!(r.completed as usize, threads);
            })
        },
        || {
            let (_dir, store, hash) = store_with("batch-engine-seq", &[&wf]);
            let mut a = agent();
            let d = time(|| {
                for i in 0..sequential {
                    let (_, out) = store
                        .engine()
                        .run_workflow(
                            hash,
                            &format!("change {i}"),
                            &Default::default(),
                            a.as_mut(),
                        )
                        .unwrap();
                    assert!(out.error.is_none());
                }
            });
            // Scale to the batch's number of steps.
            d * (threads as u32) / (sequential as u32)
        },
    )
}

/// Children driven at once in the fan-out bench, and the baseline's jobs.
const FAN_JOBS: usize = 64;

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
    foreach: { items: tasks, as: task, workflow: solve, prompt: 'Solve {{task}}', max_items: 10000, max_concurrency: 64 }
    join: {}
graph:
  $START: { _: { role: planner, prompt: 'Plan' } }
  planner: { planned: { role: solve_all, prompt: 'Solve them all' } }
  solve_all: { done: { role: $END, prompt: '{{completed}} solved' } }
";

/// The planner lists `items` tasks; a solver answers at once.
#[derive(Clone)]
struct Planner {
    items: usize,
}

impl Agent for Planner {
    fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
        if req.role_name == "planner" {
            let tasks: Vec<String> = (0..self.items).map(|i| format!("t{i}")).collect();
            return Ok(format!(
                "---\n$status: planned\ntasks: [{}]\n---\nThe plan\n",
                tasks.join(", ")
            )
            .into());
        }
        Ok(format!("solved for {}", req.thread).into())
    }

    fn fork(&self) -> Option<Box<dyn Agent>> {
        Some(Box::new(self.clone()))
    }
}

fn fan_out_bench(children: usize) -> Comparison {
    let solve = parse_workflow(SOLVE, Some("solve"), &|_| false).unwrap();
    let plan = parse_workflow(PLAN, Some("plan"), &|n| n == "solve").unwrap();
    let agent = || Box::new(Planner { items: children }) as Box<dyn Agent>;
    Comparison::run(
        &format!(
            "fan-out: one role to {children} child threads ({FAN_JOBS} at a time) vs {children} independent threads in a batch of {FAN_JOBS} jobs (ops = child steps)"
        ),
        children as u64,
        // A fan-out run is short (0.2 s) and its baseline noisy: more runs.
        7,
        || {
            let (_dir, store, hash) = store_with("batch-fan-out", &[&solve, &plan]);
            time(|| {
                let r = batch(&store, hash, &["the work".to_owned()], vec![agent()]);
                assert_eq!(r.completed, 1, "{r:?}");
            })
        },
        || {
            let (_dir, store, hash) = store_with("batch-fan-out-base", &[&solve]);
            let prompts: Vec<String> = (0..children).map(|i| format!("Solve t{i}")).collect();
            let agents = (0..FAN_JOBS).map(|_| agent()).collect();
            time(|| {
                let r = batch(&store, hash, &prompts, agents);
                assert_eq!(r.completed as usize, children);
            })
        },
    )
}

fn main() {
    let rows = vec![
        group_commit_bench(scale(200, 4)),
        engine_bench(scale(2000, 4)),
        fan_out_bench(scale(1000, 8)),
    ];
    report(
        "batch: durable group commit",
        "≥ 0.5× raw heed durable puts in the same group sizes; the engine's batch ≥ 10× one transaction per step; fan-out ≥ 0.8× independent threads",
        &rows,
    );
}

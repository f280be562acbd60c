//! Batch runs (`docs/design.md` §5d): one new thread per prompt, driven by
//! several driver threads at once, every step committed through one
//! group-commit writer, so durable throughput is not one fsync per step.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use serde::Serialize;

use super::EngineError;
use super::agent::Agent;
use super::drive::StepResult;
use crate::hash::Hash;
use crate::store::Store;
use crate::thread::{ThreadId, ThreadStatus};

/// How to run a batch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BatchOptions {
    /// Most steps in one commit group (`0`: the default).
    pub max_group: usize,
    /// The agent spec stored on each thread (so `thread step` can go on).
    pub agent_spec: Option<String>,
    /// Loop protection for every thread (default: the workflow's).
    pub max_rounds: Option<u32>,
}

/// One thread of a batch, when its drive ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchItem {
    /// The prompt's position in the batch.
    pub index: usize,
    /// The thread (none if it could not be started).
    pub thread: Option<ThreadId>,
    /// Its status when the drive ended.
    pub status: Option<ThreadStatus>,
    /// The last step's result.
    pub result: Option<StepResult>,
    /// Steps committed.
    pub steps: usize,
    /// Why the drive stopped early (recorded on the thread as for `run`).
    pub error: Option<String>,
}

/// What a batch did.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct BatchReport {
    /// Threads driven.
    pub threads: u64,
    /// Ended with return code 0.
    pub completed: u64,
    /// Ended as failed (`maxRounds`, or a child that failed).
    pub failed: u64,
    /// Waiting for a human.
    pub suspended: u64,
    /// Stopped by a step failure (still idle, with the error recorded), or
    /// never started.
    pub errors: u64,
    /// Steps committed in all.
    pub steps: u64,
    /// Wall time (ms).
    pub elapsed_ms: u64,
    /// Commit groups.
    pub groups: u64,
    /// Steps and other writes per group.
    pub average_group: f64,
}

impl Store {
    /// Drives one new thread of `workflow` per prompt, one driver thread per
    /// agent in `agents` (so their number is the parallelism), committing
    /// through one group-commit writer. `on_item` sees each thread as its
    /// drive ends, on the calling thread.
    pub fn run_batch(
        &self,
        workflow: Hash,
        prompts: &[String],
        options: &BatchOptions,
        agents: Vec<Box<dyn Agent>>,
        on_item: &mut dyn FnMut(&BatchItem),
    ) -> Result<BatchReport, EngineError> {
        // Fails early on an unknown or invalid workflow.
        self.load_workflow(workflow)?;
        self.drive_pool(
            prompts.len(),
            options,
            agents,
            on_item,
            &|store, index, agent| {
                drive_one(store, workflow, index, &prompts[index], options, agent)
            },
        )
    }

    /// Drives existing threads on, as a batch: each runs until it ends or
    /// suspends (a thread left `running` by a driver that died is taken
    /// over; one a live driver holds is reported as an error). For
    /// finishing what an interrupted batch left.
    pub fn continue_threads(
        &self,
        threads: &[ThreadId],
        options: &BatchOptions,
        agents: Vec<Box<dyn Agent>>,
        on_item: &mut dyn FnMut(&BatchItem),
    ) -> Result<BatchReport, EngineError> {
        self.drive_pool(
            threads.len(),
            options,
            agents,
            on_item,
            &|store, index, agent| {
                let id = threads[index];
                let outcome = store.run_thread(id, usize::MAX, agent);
                let after = store.thread(id).ok().flatten();
                BatchItem::of(index, id, after.map(|r| r.underlying_status()), outcome)
            },
        )
    }

    /// `items` pieces of work, one driver thread per agent, over one
    /// group-commit handle; `work` does piece `index` with the driver's
    /// agent.
    fn drive_pool(
        &self,
        items: usize,
        options: &BatchOptions,
        agents: Vec<Box<dyn Agent>>,
        on_item: &mut dyn FnMut(&BatchItem),
        work: &(dyn Fn(&Store, usize, &mut dyn Agent) -> BatchItem + Sync),
    ) -> Result<BatchReport, EngineError> {
        let started = Instant::now();
        if agents.is_empty() && items > 0 {
            return Err(EngineError::NoAgents);
        }
        let next = AtomicUsize::new(0);
        let mut report = BatchReport::default();
        let ((), stats) = self.group_commit(options.max_group, |store| {
            let (tx, rx) = crossbeam_channel::unbounded::<BatchItem>();
            std::thread::scope(|scope| {
                for mut agent in agents {
                    let tx = tx.clone();
                    let next = &next;
                    scope.spawn(move || {
                        loop {
                            if super::claim::interrupted() {
                                break;
                            }
                            let index = next.fetch_add(1, Ordering::Relaxed);
                            if index >= items {
                                break;
                            }
                            if tx.send(work(store, index, &mut *agent)).is_err() {
                                break;
                            }
                        }
                    });
                }
                drop(tx);
                for item in rx {
                    report.add(&item);
                    on_item(&item);
                }
            });
        });
        report.groups = stats.groups;
        report.average_group = stats.average_group();
        report.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(report)
    }
}

fn drive_one(
    store: &Store,
    workflow: Hash,
    index: usize,
    prompt: &str,
    options: &BatchOptions,
    agent: &mut dyn Agent,
) -> BatchItem {
    match store.run_workflow(
        workflow,
        prompt,
        options.agent_spec.clone(),
        options.max_rounds,
        agent,
    ) {
        Ok((record, outcome)) => {
            BatchItem::of(index, record.id, Some(record.underlying_status()), outcome)
        }
        Err(e) => BatchItem {
            index,
            thread: None,
            status: None,
            result: None,
            steps: 0,
            error: Some(e.to_string()),
        },
    }
}

impl BatchItem {
    /// The item for thread `id` after a drive: the status its last step
    /// left, else `unstepped` (the status it had).
    fn of(
        index: usize,
        id: ThreadId,
        unstepped: Option<ThreadStatus>,
        outcome: super::drive::RunOutcome,
    ) -> BatchItem {
        let last = outcome.results.last();
        BatchItem {
            index,
            thread: Some(id),
            status: last.map(|r| r.status).or(unstepped),
            result: last.cloned(),
            steps: outcome.results.len(),
            error: outcome.error.map(|e| e.to_string()),
        }
    }
}

impl BatchReport {
    fn add(&mut self, item: &BatchItem) {
        self.threads += 1;
        self.steps += item.steps as u64;
        if item.error.is_some() {
            self.errors += 1;
            return;
        }
        match item.status {
            Some(ThreadStatus::Completed) => self.completed += 1,
            Some(ThreadStatus::Failed) => self.failed += 1,
            Some(ThreadStatus::Suspended) => self.suspended += 1,
            _ => {}
        }
    }
}

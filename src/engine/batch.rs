//! Batch runs (`docs/design.md` §5d): one new thread per prompt, driven by
//! several driver threads at once, every step committed through one
//! group-commit writer, so durable throughput is not one fsync per step.

use super::Engine;
use std::collections::HashSet;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::EngineError;
use super::agent::{Agent, AgentError, AgentReply, AgentRequest};
use super::cancel::Cancel;
use super::drive::{DriveOptions, DriveReport, StepResult};
use super::{StartOptions, claim};
use crate::hash::Hash;
use crate::thread::{Labels, ThreadError, ThreadId, ThreadQuery, ThreadStatus, check_labels};
use crate::usage::{StepUsage, UsageTotals};

/// How to run a batch.
#[derive(Debug, Clone, Default)]
pub struct BatchOptions {
    /// Most steps in one commit group (`0`: the default).
    pub max_group: usize,
    /// The agent spec stored on each thread (so `thread step` can go on).
    pub agent_spec: Option<String>,
    /// Loop protection for every thread (default: the workflow's).
    pub max_rounds: Option<u32>,
    /// Each thread's working directory ([`StartOptions::cwd`]).
    pub cwd: Option<std::path::PathBuf>,
    /// The token the batch runs under: cancelling it starts no new thread,
    /// kills the agents running and leaves their threads retryable.
    pub cancel: Cancel,
    /// Labels for every thread the batch starts (a prompt's own labels,
    /// [`BatchPrompt::labels`], are added over them).
    pub labels: Labels,
}

/// One prompt of [`Engine::run_batch_prompts`]: the task and the labels of
/// its thread.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchPrompt {
    /// The task prompt.
    pub prompt: String,
    /// Labels of this prompt's thread, over [`BatchOptions::labels`].
    pub labels: Labels,
}

impl From<String> for BatchPrompt {
    fn from(prompt: String) -> Self {
        BatchPrompt {
            prompt,
            labels: Labels::new(),
        }
    }
}

/// What a batch's per-item callback answers: go on, or start no new
/// thread (the drives under way finish). A callback returning `()` always
/// goes on.
pub trait ItemFlow {
    /// Whether to start no new thread.
    fn stop(self) -> bool;
}

impl ItemFlow for () {
    fn stop(self) -> bool {
        false
    }
}

impl ItemFlow for ControlFlow<()> {
    fn stop(self) -> bool {
        self.is_break()
    }
}

/// One thread of a batch, when its drive ended.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
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
    /// Why the drive stopped early (recorded on the thread as for `run`);
    /// in JSON, its message.
    #[serde(serialize_with = "error_message")]
    #[schemars(with = "Option<String>")]
    pub error: Option<Arc<EngineError>>,
}

fn error_message<S: serde::Serializer>(
    error: &Option<Arc<EngineError>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match error {
        Some(e) => s.serialize_some(&e.to_string()),
        None => s.serialize_none(),
    }
}

/// What a batch did.
#[derive(Debug, Clone, PartialEq, Default, Serialize, schemars::JsonSchema)]
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
    /// Threads of a `continue` run that another runner took (or finished)
    /// between the listing and this runner's claim: not driven here, and
    /// not counted in `threads`.
    pub skipped: u64,
    /// Wall time (ms).
    pub elapsed_ms: u64,
    /// Commit groups.
    pub groups: u64,
    /// Steps and other writes per group.
    pub average_group: f64,
    /// The store filled up (its maximum map size or its disk): the batch
    /// started no thread after that, so some prompts (or idle threads) were
    /// not driven and are not counted in `threads`.
    pub store_full: bool,
    /// Every agent call the batch made (steps, re-asks, summaries, child
    /// workflows' steps, failed attempts) and what they reported costing.
    pub usage: UsageTotals,
}

impl Engine {
    /// Drives one new thread of `workflow` per prompt, one driver thread per
    /// agent in `agents` (so their number is the parallelism), committing
    /// through one group-commit writer. `on_item` sees each thread as its
    /// drive ends, on the calling thread; returning
    /// [`ControlFlow::Break`] starts no new thread (for a reader that went
    /// away), and the drives under way finish.
    ///
    /// ```
    /// use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
    /// use uwf_db::engine::batch::{BatchItem, BatchOptions};
    ///
    /// /// Answers every role in plain text (the default status `_`).
    /// struct Echo;
    /// impl Agent for Echo {
    ///     fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
    ///         Ok(format!("{} did it", req.role_name).into())
    ///     }
    /// }
    ///
    /// // `review`: writer, then reviewer, then $END (as in `Engine::start_workflow`).
    /// # use uwf_db::Store;
    /// # use uwf_db::workflow::parse_workflow;
    /// # let store = Store::memory();
    /// # let yaml = "name: review\nroles:\n  writer: { goal: Write }\n  reviewer: { goal: Review }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: reviewer, prompt: 'Review it' } }\n  reviewer: { _: { role: $END, prompt: 'Reviewed' } }\n";
    /// # let wf = parse_workflow(yaml, Some("review"), &|_| false).map_err(|p| format!("{p:?}"))?;
    /// # let (workflow, _) = store.workflows().add(&wf)?;
    /// let prompts: Vec<String> = (1..=8).map(|i| format!("haiku #{i}")).collect();
    /// // Two agents: two driver threads.
    /// let agents: Vec<Box<dyn Agent>> = vec![Box::new(Echo), Box::new(Echo)];
    /// let mut ended = Vec::new();
    /// let options = BatchOptions::default();
    /// let report = store.engine().run_batch(workflow, &prompts, &options, agents, &mut |item: &BatchItem| {
    ///     ended.push((item.index, item.steps));
    /// })?;
    /// assert_eq!((report.threads, report.completed, report.errors), (8, 8, 0));
    /// assert_eq!(report.steps, 16);
    /// ended.sort();
    /// assert_eq!(ended, (0..8).map(|i| (i, 2)).collect::<Vec<_>>());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run_batch<R: ItemFlow>(
        &self,
        workflow: Hash,
        prompts: &[String],
        options: &BatchOptions,
        agents: Vec<Box<dyn Agent>>,
        on_item: &mut dyn FnMut(&BatchItem) -> R,
    ) -> Result<BatchReport, EngineError> {
        let prompts: Vec<BatchPrompt> = prompts.iter().cloned().map(BatchPrompt::from).collect();
        self.run_batch_prompts(workflow, &prompts, options, agents, on_item)
    }

    /// [`Engine::run_batch`] with labels per prompt: each thread gets
    /// [`BatchOptions::labels`] and then its prompt's own. Every prompt's
    /// labels are checked before any thread starts.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
    /// use uwf_db::engine::batch::{BatchOptions, BatchPrompt};
    /// struct Echo;
    /// impl Agent for Echo {
    ///     fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
    ///         Ok(format!("{} did it", req.role_name).into())
    ///     }
    /// }
    /// let labels: uwf_db::thread::Labels = [("team".to_string(), "docs".to_string())].into_iter().collect();
    /// let prompts = vec![BatchPrompt { prompt: "a haiku".into(), labels }];
    /// let agents: Vec<Box<dyn Agent>> = vec![Box::new(Echo)];
    /// let report = store.engine().run_batch_prompts(hash, &prompts, &BatchOptions::default(), agents, &mut |_| {})?;
    /// assert_eq!((report.threads, report.completed), (1, 1));
    /// let only = store.threads().list(&Default::default())?;
    /// assert_eq!(only[0].labels.get("team").map(String::as_str), Some("docs"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run_batch_prompts<R: ItemFlow>(
        &self,
        workflow: Hash,
        prompts: &[BatchPrompt],
        options: &BatchOptions,
        agents: Vec<Box<dyn Agent>>,
        on_item: &mut dyn FnMut(&BatchItem) -> R,
    ) -> Result<BatchReport, EngineError> {
        self.start_batch(workflow, Items::Slice(prompts), options, agents, on_item)
    }

    /// A batch of new threads, one per item: fails early on an unknown or
    /// invalid workflow, or a bad label, before any thread starts.
    fn start_batch<R: ItemFlow>(
        &self,
        workflow: Hash,
        prompts: Items<'_, BatchPrompt>,
        options: &BatchOptions,
        agents: Vec<Box<dyn Agent>>,
        on_item: &mut dyn FnMut(&BatchItem) -> R,
    ) -> Result<BatchReport, EngineError> {
        self.store.workflows().load(workflow)?;
        check_labels(&options.labels).map_err(ThreadError::from)?;
        for p in prompts.distinct() {
            check_labels(&merged(&options.labels, &p.labels)).map_err(ThreadError::from)?;
        }
        let mut agents = agents;
        self.drive_pool(
            prompts,
            options,
            &mut agents,
            on_item,
            &|engine, index, prompt, agent| {
                Some(drive_one(engine, workflow, index, prompt, options, agent))
            },
        )
    }

    /// [`Engine::run_batch_prompts`] with `count` threads of one prompt,
    /// in memory independent of `count`: each thread is created when a
    /// driver takes it up. `count` is at most [`MAX_BATCH_THREADS`].
    ///
    /// ```
    /// use uwf_db::engine::EngineError;
    /// use uwf_db::engine::batch::{BatchOptions, BatchPrompt, MAX_BATCH_THREADS};
    /// # use uwf_db::Store;
    /// # use uwf_db::workflow::parse_workflow;
    /// # let store = Store::memory();
    /// # let yaml = "name: review\nroles:\n  writer: { goal: Write }\n  reviewer: { goal: Review }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: reviewer, prompt: 'Review it' } }\n  reviewer: { _: { role: $END, prompt: 'Reviewed' } }\n";
    /// # let wf = parse_workflow(yaml, Some("review"), &|_| false).map_err(|p| format!("{p:?}"))?;
    /// # let (workflow, _) = store.workflows().add(&wf)?;
    /// let prompt = BatchPrompt::from("the same task".to_owned());
    /// let options = BatchOptions::default();
    /// let agent = store.engine().build_agent("cmd:echo done", &Default::default())?;
    /// let report = store.engine().run_batch_repeat(workflow, &prompt, 3, &options, vec![agent], &mut |_| ())?;
    /// assert_eq!(report.threads, 3);
    /// let huge = store.engine().run_batch_repeat(workflow, &prompt, MAX_BATCH_THREADS + 1, &options, vec![], &mut |_| ());
    /// assert!(matches!(huge, Err(EngineError::TooManyThreads { .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run_batch_repeat<R: ItemFlow>(
        &self,
        workflow: Hash,
        prompt: &BatchPrompt,
        count: usize,
        options: &BatchOptions,
        agents: Vec<Box<dyn Agent>>,
        on_item: &mut dyn FnMut(&BatchItem) -> R,
    ) -> Result<BatchReport, EngineError> {
        if count > MAX_BATCH_THREADS {
            return Err(EngineError::TooManyThreads {
                count,
                max: MAX_BATCH_THREADS,
            });
        }
        self.start_batch(
            workflow,
            Items::Repeat(prompt, count),
            options,
            agents,
            on_item,
        )
    }

    /// Drives existing threads on, as a batch: each runs until it ends or
    /// suspends (a thread left `running` by a driver that died is taken
    /// over; one a live driver holds is reported as an error). For
    /// finishing what an interrupted batch left; see
    /// [`Engine::continuable_threads`] for which threads.
    ///
    /// ```
    /// use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
    /// use uwf_db::engine::batch::{BatchItem, BatchOptions};
    /// use uwf_db::engine::{DriveOptions, StartOptions};
    ///
    /// # struct Echo;
    /// # impl Agent for Echo {
    /// #     fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
    /// #         Ok(format!("{} did it", req.role_name).into())
    /// #     }
    /// # }
    /// // `review`: writer, then reviewer, then $END (as in `Engine::start_workflow`).
    /// # use uwf_db::Store;
    /// # use uwf_db::workflow::parse_workflow;
    /// # let store = Store::memory();
    /// # let yaml = "name: review\nroles:\n  writer: { goal: Write }\n  reviewer: { goal: Review }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: reviewer, prompt: 'Review it' } }\n  reviewer: { _: { role: $END, prompt: 'Reviewed' } }\n";
    /// # let wf = parse_workflow(yaml, Some("review"), &|_| false).map_err(|p| format!("{p:?}"))?;
    /// # let (workflow, _) = store.workflows().add(&wf)?;
    /// // Three threads that stopped after their writer's step.
    /// let one_step = DriveOptions { max_steps: Some(1), ..DriveOptions::default() };
    /// for prompt in ["first", "second", "third"] {
    ///     let thread = store.engine().start_workflow(workflow, prompt, &StartOptions::default())?;
    ///     store.engine().drive(thread.id, &one_step, &mut Echo).into_result()?;
    /// }
    ///
    /// let threads = store.engine().continuable_threads("review")?;
    /// assert_eq!(threads.len(), 3);
    /// let agents: Vec<Box<dyn Agent>> = vec![Box::new(Echo)];
    /// let options = BatchOptions::default();
    /// let report = store.engine().continue_threads(&threads, &options, agents, &mut |_: &BatchItem| {})?;
    /// assert_eq!((report.threads, report.completed), (3, 3));
    /// assert_eq!(report.steps, 3); // one reviewer step each
    /// assert!(store.engine().continuable_threads("review")?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn continue_threads<R: ItemFlow>(
        &self,
        threads: &[ThreadId],
        options: &BatchOptions,
        agents: Vec<Box<dyn Agent>>,
        on_item: &mut dyn FnMut(&BatchItem) -> R,
    ) -> Result<BatchReport, EngineError> {
        let mut agents = agents;
        self.continue_ids(threads, options, &mut agents, on_item, false, None)
    }

    /// Drives workflow `name`'s continuable threads
    /// ([`Engine::continuable_threads`]) on, sharing them with any other
    /// runner doing the same on this store, in this process or another,
    /// on this machine or another (`docs/design.md` §5d, "Fleets"): each
    /// thread is driven by whichever runner claims it first; one another
    /// runner took first is skipped (counted in
    /// [`BatchReport::skipped`]), never driven twice. When a pass is done
    /// the runner lists again, so threads a dead runner left are taken
    /// over; a thread whose drive stopped with an error here is not
    /// retried by this run.
    ///
    /// With `wait`, the runner also stays while another live runner holds
    /// a thread of the workflow, polling every `wait`: if that runner dies,
    /// its threads are finished here. Without it, the run ends when a
    /// listing finds nothing this runner can take.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
    /// use uwf_db::engine::batch::BatchOptions;
    /// struct Echo;
    /// impl Agent for Echo {
    ///     fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
    ///         Ok(format!("{} did it", req.role_name).into())
    ///     }
    /// }
    /// // Two threads started and left for any runner to finish.
    /// for task in ["one", "two"] {
    ///     store.engine().start_workflow(hash, task, &Default::default())?;
    /// }
    /// let agents: Vec<Box<dyn Agent>> = vec![Box::new(Echo)];
    /// let report = store.engine().continue_workflow("two", &BatchOptions::default(), None, agents, &mut |_| {})?;
    /// assert_eq!((report.threads, report.completed, report.skipped), (2, 2, 0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn continue_workflow<R: ItemFlow>(
        &self,
        name: &str,
        options: &BatchOptions,
        wait: Option<Duration>,
        agents: Vec<Box<dyn Agent>>,
        on_item: &mut dyn FnMut(&BatchItem) -> R,
    ) -> Result<BatchReport, EngineError> {
        let started = Instant::now();
        let mut agents = agents;
        let mut total = BatchReport::default();
        // Threads driven by this run (whatever the outcome).
        let mut driven: HashSet<ThreadId> = HashSet::new();
        let mut stopped = false;
        while !stopped && !options.cancel.is_stopping() {
            let mut ids: Vec<ThreadId> = self
                .continuable_threads(name)?
                .into_iter()
                .filter(|id| !driven.contains(id))
                .collect();
            if ids.is_empty() {
                match wait {
                    Some(poll) if self.live_drives(name)? => {
                        options.cancel.sleep(poll);
                        continue;
                    }
                    _ => break,
                }
            }
            // Runners start their passes at different threads, so a fleet
            // does not queue up on the oldest one.
            let len = ids.len();
            ids.rotate_left(spread() % len);
            let mut on_driven = |item: &BatchItem| {
                if let Some(id) = item.thread {
                    driven.insert(id);
                }
                let stop = on_item(item).stop();
                stopped |= stop;
                if stop {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            };
            let orphans = Orphans::new(name);
            let pass = self.continue_ids(
                &ids,
                options,
                &mut agents,
                &mut on_driven,
                true,
                Some(&orphans),
            )?;
            total.merge(&pass);
            // Another pass would fail the same way.
            stopped |= pass.store_full;
        }
        total.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(total)
    }

    /// Whether a live runner (another process, or a claim of this store
    /// handle) is driving a thread of workflow `name`.
    fn live_drives(&self, name: &str) -> Result<bool, EngineError> {
        Ok(self.running_threads(name)?.iter().any(|(_, held)| *held))
    }

    /// The `running` threads of workflow `name`, each with whether a live
    /// driver holds its claim.
    fn running_threads(&self, name: &str) -> Result<Vec<(ThreadId, bool)>, EngineError> {
        let query = ThreadQuery {
            statuses: vec![ThreadStatus::Running],
            workflow: Some(name.to_owned()),
            limit: usize::MAX,
            ..ThreadQuery::default()
        };
        let running: Vec<ThreadId> = self.threads().list(&query)?.iter().map(|r| r.id).collect();
        let held = claim::are_held(&self.store, &running)?;
        Ok(running.into_iter().zip(held).collect())
    }

    /// [`Engine::continue_threads`]; with `skip_taken`, a thread another
    /// runner claimed or finished first is skipped instead of reported.
    /// With `orphans`, a driver about to take its next thread first takes
    /// one a dead runner left (see [`Orphans`]); the thread of the pass it
    /// would have taken waits for the next pass.
    fn continue_ids<R: ItemFlow>(
        &self,
        threads: &[ThreadId],
        options: &BatchOptions,
        agents: &mut [Box<dyn Agent>],
        on_item: &mut dyn FnMut(&BatchItem) -> R,
        skip_taken: bool,
        orphans: Option<&Orphans>,
    ) -> Result<BatchReport, EngineError> {
        let drive = DriveOptions {
            agent_spec: options.agent_spec.clone(),
            cancel: options.cancel.clone(),
            ..DriveOptions::default()
        };
        self.drive_pool(
            Items::Slice(threads),
            options,
            agents,
            on_item,
            &|engine, index, &listed, agent| {
                let id = match orphans {
                    Some(o) => o.next(engine).unwrap_or(listed),
                    None => listed,
                };
                let outcome = engine.drive(id, &drive, agent);
                if skip_taken && outcome.results.is_empty() && taken_by_another(&outcome) {
                    return None;
                }
                let after = match engine.threads().get(id) {
                    Ok(r) => r.map(|r| r.underlying_status()),
                    Err(e) => {
                        return Some(BatchItem {
                            thread: Some(id),
                            ..BatchItem::failed(index, e.into())
                        });
                    }
                };
                Some(BatchItem::of(index, id, after, outcome))
            },
        )
    }

    /// The threads of workflow `name` that a driver left `running` and no
    /// longer holds (it died): what another runner takes over first.
    pub(crate) fn orphaned_threads(&self, name: &str) -> Result<Vec<ThreadId>, EngineError> {
        Ok(self
            .running_threads(name)?
            .into_iter()
            .filter_map(|(id, held)| (!held).then_some(id))
            .collect())
    }

    /// The threads of workflow `name` a `batch --continue` drives, oldest
    /// first: idle ones, and running ones whose driver is gone; not
    /// suspended ones (they wait for a human) nor ones a live driver holds.
    ///
    /// ```
    /// use uwf_db::engine::{Cancel, CancelOptions, StartOptions};
    ///
    /// // `review`: writer, then reviewer, then $END (as in `Engine::start_workflow`).
    /// # use uwf_db::Store;
    /// # use uwf_db::workflow::parse_workflow;
    /// # let store = Store::memory();
    /// # let yaml = "name: review\nroles:\n  writer: { goal: Write }\n  reviewer: { goal: Review }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: reviewer, prompt: 'Review it' } }\n  reviewer: { _: { role: $END, prompt: 'Reviewed' } }\n";
    /// # let wf = parse_workflow(yaml, Some("review"), &|_| false).map_err(|p| format!("{p:?}"))?;
    /// # let (workflow, _) = store.workflows().add(&wf)?;
    /// let start = |prompt| store.engine().start_workflow(workflow, prompt, &StartOptions::default());
    /// let (idle, held, cancelled) = (start("idle")?, start("held")?, start("cancelled")?);
    /// store.engine().cancel_thread(cancelled.id, &CancelOptions::default())?;
    /// // Another driver holds this one.
    /// let claim = store.engine().claim(held.id, &Cancel::new())?;
    ///
    /// assert_eq!(store.engine().continuable_threads("review")?, [idle.id]);
    /// claim.release()?;
    /// let mut both = vec![idle.id, held.id];
    /// both.sort();
    /// assert_eq!(store.engine().continuable_threads("review")?, both);
    /// assert!(store.engine().continuable_threads("another workflow")?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn continuable_threads(&self, name: &str) -> Result<Vec<ThreadId>, EngineError> {
        let query = ThreadQuery {
            statuses: vec![ThreadStatus::Idle, ThreadStatus::Running],
            workflow: Some(name.to_owned()),
            limit: usize::MAX,
            ..ThreadQuery::default()
        };
        let idle: Vec<ThreadId> = self
            .threads()
            .list(&query)?
            .into_iter()
            .filter(|r| r.underlying_status() == ThreadStatus::Idle)
            .map(|r| r.id)
            .collect();
        let held = claim::are_held(&self.store, &idle)?;
        let mut ids: Vec<ThreadId> = idle
            .into_iter()
            .zip(held)
            .filter_map(|(id, held)| (!held).then_some(id))
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// The pieces of work in `items`, one driver thread per agent, over one
    /// group-commit handle; `work` does piece `index` with the driver's
    /// agent.
    fn drive_pool<T: Sync, R: ItemFlow>(
        &self,
        items: Items<'_, T>,
        options: &BatchOptions,
        agents: &mut [Box<dyn Agent>],
        on_item: &mut dyn FnMut(&BatchItem) -> R,
        work: &Work<'_, T>,
    ) -> Result<BatchReport, EngineError> {
        let started = Instant::now();
        if agents.is_empty() && !items.is_empty() {
            return Err(EngineError::NoAgents);
        }
        let next = AtomicUsize::new(0);
        let skipped = AtomicUsize::new(0);
        // Set when `on_item` asks to stop: no new thread starts.
        let stop = AtomicBool::new(false);
        // Set when a drive found the store full.
        let full = AtomicBool::new(false);
        let mut report = BatchReport::default();
        let usage = std::sync::Mutex::new(UsageTotals::default());
        let ((), stats) = self.store.group_commit(options.max_group, |store| {
            let engine = &store.engine();
            let (tx, rx) = crossbeam_channel::unbounded::<BatchItem>();
            std::thread::scope(|scope| {
                for agent in agents.iter_mut() {
                    let tx = tx.clone();
                    let (next, stop, full, skipped) = (&next, &stop, &full, &skipped);
                    let usage = &usage;
                    scope.spawn(move || {
                        let mut agent = Metered {
                            inner: &mut **agent,
                            totals: UsageTotals::default(),
                        };
                        loop {
                            if options.cancel.is_stopping() || stop.load(Ordering::SeqCst) {
                                break;
                            }
                            let index = next.fetch_add(1, Ordering::Relaxed);
                            let Some(item) = items.get(index) else {
                                break;
                            };
                            let Some(done) = work(engine, index, item, &mut agent) else {
                                skipped.fetch_add(1, Ordering::Relaxed);
                                continue;
                            };
                            // A full store fails every thread started after
                            // it the same way: start none (the drives under
                            // way end as they will).
                            if done
                                .error
                                .as_deref()
                                .is_some_and(EngineError::is_store_full)
                            {
                                full.store(true, Ordering::SeqCst);
                                stop.store(true, Ordering::SeqCst);
                            }
                            if tx.send(done).is_err() {
                                break;
                            }
                        }
                        match usage.lock() {
                            Ok(mut u) => u.add(&agent.totals),
                            Err(poisoned) => poisoned.into_inner().add(&agent.totals),
                        }
                    });
                }
                drop(tx);
                for item in rx {
                    report.add(&item);
                    if on_item(&item).stop() {
                        stop.store(true, Ordering::SeqCst);
                    }
                }
            });
        });
        report.usage = usage
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        report.skipped = skipped.load(Ordering::Relaxed) as u64;
        report.store_full = full.load(Ordering::SeqCst);
        report.groups = stats.groups;
        report.average_group = stats.average_group();
        report.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(report)
    }
}

fn drive_one(
    engine: &Engine,
    workflow: Hash,
    index: usize,
    prompt: &BatchPrompt,
    options: &BatchOptions,
    agent: &mut dyn Agent,
) -> BatchItem {
    let start = StartOptions {
        agent_spec: options.agent_spec.clone(),
        max_rounds: options.max_rounds,
        cwd: options.cwd.clone(),
        labels: merged(&options.labels, &prompt.labels),
        cancel: options.cancel.clone(),
    };
    match engine.run_workflow(workflow, &prompt.prompt, &start, agent) {
        Ok((record, outcome)) => {
            BatchItem::of(index, record.id, Some(record.underlying_status()), outcome)
        }
        Err(e) => BatchItem::failed(index, e),
    }
}

/// An agent that counts its calls: their wall time and what they reported
/// (a reply's own `usage`, else its frontmatter's `$usage`). A batch wraps
/// each driver's agent in one, so its report counts every call made.
struct Metered<'a> {
    inner: &'a mut dyn Agent,
    totals: UsageTotals,
}

impl Agent for Metered<'_> {
    fn call(&mut self, request: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
        let called = std::time::Instant::now();
        let reply = self.inner.call(request);
        let mut step = StepUsage::default();
        let wall_ms = u64::try_from(called.elapsed().as_millis()).unwrap_or(u64::MAX);
        let reported = match &reply {
            Ok(r) => r
                .usage
                .clone()
                .or_else(|| super::extract::reported_usage(&r.output)),
            Err(_) => None,
        };
        step.add_call(wall_ms, reported.as_ref());
        self.totals.add_step(&step);
        reply
    }

    fn reasks(&self) -> usize {
        self.inner.reasks()
    }

    fn needs_step_count(&self) -> bool {
        self.inner.needs_step_count()
    }
}

/// `base` with `over` added over it.
fn merged(base: &Labels, over: &Labels) -> Labels {
    let mut all = base.clone();
    all.extend(over.iter().map(|(k, v)| (k.clone(), v.clone())));
    all
}

impl BatchItem {
    /// An item whose thread could not be started or read.
    fn failed(index: usize, error: EngineError) -> BatchItem {
        BatchItem {
            index,
            thread: None,
            status: None,
            result: None,
            steps: 0,
            error: Some(Arc::new(error)),
        }
    }

    /// The item for thread `id` after a drive: the status its last step
    /// left, else `unstepped` (the status it had).
    fn of(
        index: usize,
        id: ThreadId,
        unstepped: Option<ThreadStatus>,
        outcome: DriveReport,
    ) -> BatchItem {
        let last = outcome.results.last();
        BatchItem {
            index,
            thread: Some(id),
            status: last.map(|r| r.status).or(unstepped),
            result: last.cloned(),
            steps: outcome.results.len(),
            error: outcome.error.map(Arc::new),
        }
    }
}

/// A batch's piece of work: item `index` driven with a driver's agent; its
/// outcome, or `None` when another runner took it first.
/// How often a `batch --continue` pass looks for threads a dead runner
/// left `running`, which its drivers then take before the rest of the
/// pass ([`Engine::continue_workflow`]).
pub const ORPHAN_CHECK: Duration = Duration::from_secs(5);

/// The threads a dead runner left `running` (their claims no longer held),
/// found while a `batch --continue` pass goes on: when a driver of the pass
/// is about to take its next thread and [`ORPHAN_CHECK`] has passed since
/// the last look, it lists the workflow's `running` threads and keeps the
/// unclaimed ones, which drivers then take before the pass's own list. So a
/// killed runner's threads are taken over within [`ORPHAN_CHECK`] plus the
/// time until one of a survivor's drivers finishes its current thread,
/// however long the pass's queue (it was the whole queue: 25–38 s with a
/// thousand queued calls).
pub(crate) struct Orphans {
    workflow: String,
    state: std::sync::Mutex<OrphanState>,
}

struct OrphanState {
    looked: Instant,
    queue: std::collections::VecDeque<ThreadId>,
    seen: HashSet<ThreadId>,
}

impl Orphans {
    pub(crate) fn new(workflow: &str) -> Orphans {
        Orphans {
            workflow: workflow.to_owned(),
            state: std::sync::Mutex::new(OrphanState {
                looked: Instant::now(),
                queue: std::collections::VecDeque::new(),
                seen: HashSet::new(),
            }),
        }
    }

    /// The next orphan to drive, if any (looking for new ones when it is
    /// time). A failed look finds none: the pass goes on, and the next
    /// pass lists every continuable thread anyway.
    fn next(&self, engine: &Engine) -> Option<ThreadId> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.looked.elapsed() >= ORPHAN_CHECK {
            state.looked = Instant::now();
            if let Ok(found) = engine.orphaned_threads(&self.workflow) {
                for id in found {
                    if state.seen.insert(id) {
                        state.queue.push_back(id);
                    }
                }
            }
        }
        state.queue.pop_front()
    }
}

/// Most threads one batch starts ([`Engine::run_batch_repeat`], and
/// `batch -n`): far more than a batch has ever needed, and small enough
/// that a mistyped count is refused instead of run.
pub const MAX_BATCH_THREADS: usize = 100_000_000;

/// What a batch's drivers take up, by index.
enum Items<'a, T> {
    /// Each of a list.
    Slice(&'a [T]),
    /// One item, so many times.
    Repeat(&'a T, usize),
}

impl<T> Clone for Items<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Items<'_, T> {}

impl<'a, T> Items<'a, T> {
    fn get(self, index: usize) -> Option<&'a T> {
        match self {
            Items::Slice(items) => items.get(index),
            Items::Repeat(item, count) => (index < count).then_some(item),
        }
    }

    /// Each different item once.
    fn distinct(self) -> impl Iterator<Item = &'a T> {
        let (items, one): (&'a [T], Option<&'a T>) = match self {
            Items::Slice(items) => (items, None),
            Items::Repeat(item, count) => (&[], (count > 0).then_some(item)),
        };
        items.iter().chain(one)
    }

    fn is_empty(self) -> bool {
        match self {
            Items::Slice(items) => items.is_empty(),
            Items::Repeat(_, count) => count == 0,
        }
    }
}

type Work<'w, T> = dyn Fn(&Engine, usize, &T, &mut dyn Agent) -> Option<BatchItem> + Sync + 'w;

/// Whether a drive that committed nothing found its thread taken by
/// another runner: claimed by it, or already past what a continue drives
/// (ended or suspended by it).
fn taken_by_another(outcome: &DriveReport) -> bool {
    matches!(
        outcome.error,
        Some(EngineError::Claimed { .. }) | Some(EngineError::NotSteppable { .. })
    )
}

/// A per-process starting offset for a pass over a listing.
fn spread() -> usize {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() as usize
}

impl BatchReport {
    /// Adds a pass of a continue run (its figures, not its wall time).
    fn merge(&mut self, pass: &BatchReport) {
        let groups = self.groups + pass.groups;
        if groups > 0 {
            self.average_group = (self.average_group * self.groups as f64
                + pass.average_group * pass.groups as f64)
                / groups as f64;
        }
        self.groups = groups;
        self.threads += pass.threads;
        self.completed += pass.completed;
        self.failed += pass.failed;
        self.suspended += pass.suspended;
        self.errors += pass.errors;
        self.steps += pass.steps;
        self.skipped += pass.skipped;
        self.store_full |= pass.store_full;
        self.usage.add(&pass.usage);
    }

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

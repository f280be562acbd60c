//! Batch runs (`docs/design.md` §5d): one new thread per prompt, driven by
//! several driver threads at once, every step committed through one
//! group-commit writer, so durable throughput is not one fsync per step.

use super::Engine;
use std::collections::HashSet;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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

mod fleet;
pub use fleet::ORPHAN_CHECK;

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
    /// [`BatchPrompt::labels`], are added over them); for
    /// [`Engine::continue_workflow`], the labels a thread must carry to be
    /// taken (`batch --continue --label K=V`).
    pub labels: Labels,
    /// Live figures for a progress display, updated while the batch runs.
    pub progress: Option<Arc<BatchProgress>>,
}

/// What a running batch is doing now, for a progress display: threads
/// being driven, agent calls made and the cost they reported. Shared with
/// the batch through [`BatchOptions::progress`] and read from any thread
/// while it runs (finished threads come through the batch's `on_item`).
///
/// ```
/// use std::sync::Arc;
/// use uwf_db::engine::batch::{BatchOptions, BatchProgress};
///
/// let live = Arc::new(BatchProgress::default());
/// let options = BatchOptions { progress: Some(live.clone()), ..BatchOptions::default() };
/// // ... run_batch_prompts(.., &options, ..) on one thread, and on another:
/// assert_eq!((live.running(), live.calls(), live.cost_usd()), (0, 0, None));
/// # let _ = options;
/// ```
#[derive(Debug, Default)]
pub struct BatchProgress {
    running: AtomicU64,
    calls: AtomicU64,
    /// Reported cost in nano-dollars (summed as integers: no lock).
    cost_nanos: AtomicU64,
    /// Whether any call reported a cost.
    costed: AtomicBool,
}

impl BatchProgress {
    /// Threads being driven now.
    pub fn running(&self) -> u64 {
        self.running.load(Ordering::Relaxed)
    }

    /// Agent calls made so far (each step's, its re-asks and retries
    /// included).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// The cost the calls reported so far (`None`: none reported one).
    pub fn cost_usd(&self) -> Option<f64> {
        self.costed
            .load(Ordering::Relaxed)
            .then(|| self.cost_nanos.load(Ordering::Relaxed) as f64 / 1e9)
    }

    fn call(&self, usage: &StepUsage) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if let Some(cost) = usage.cost_usd {
            // Finite and non-negative (`Usage::from_json`); saturating.
            let nanos = (cost * 1e9).round().min(u64::MAX as f64) as u64;
            self.cost_nanos.fetch_add(nanos, Ordering::Relaxed);
            self.costed.store(true, Ordering::Relaxed);
        }
    }
}

/// Counts a driver's thread as running while it lives.
struct Running<'a>(Option<&'a BatchProgress>);

impl<'a> Running<'a> {
    fn new(progress: Option<&'a BatchProgress>) -> Self {
        if let Some(p) = progress {
            p.running.fetch_add(1, Ordering::Relaxed);
        }
        Running(progress)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.0 {
            p.running.fetch_sub(1, Ordering::Relaxed);
        }
    }
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
        let usage = Arc::new(std::sync::Mutex::new(UsageTotals::default()));
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
                            inner: AgentHold::Borrowed(&mut **agent),
                            totals: UsageTotals::default(),
                            sink: Arc::clone(usage),
                            live: options.progress.clone(),
                        };
                        loop {
                            if options.cancel.is_stopping() || stop.load(Ordering::SeqCst) {
                                break;
                            }
                            let index = next.fetch_add(1, Ordering::Relaxed);
                            let Some(item) = items.get(index) else {
                                break;
                            };
                            let running = Running::new(options.progress.as_deref());
                            let done = work(engine, index, item, &mut agent);
                            drop(running);
                            let Some(done) = done else {
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
                        // Its totals go into the batch's as it drops.
                        drop(agent);
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
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
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
/// each driver's agent in one, so its report counts every call made; the
/// totals go into the batch's when it is dropped. Its forks (a fan-out's
/// child drivers) are metered into the same totals.
struct Metered<'a> {
    inner: AgentHold<'a>,
    totals: UsageTotals,
    /// The batch's totals.
    sink: Arc<std::sync::Mutex<UsageTotals>>,
    /// The batch's live figures, when asked for.
    live: Option<Arc<BatchProgress>>,
}

/// A metered agent: a driver's own, or a fork of it.
enum AgentHold<'a> {
    Borrowed(&'a mut dyn Agent),
    Owned(Box<dyn Agent>),
}

impl AgentHold<'_> {
    fn get(&self) -> &dyn Agent {
        match self {
            AgentHold::Borrowed(a) => &**a,
            AgentHold::Owned(a) => a.as_ref(),
        }
    }
}

impl Drop for Metered<'_> {
    fn drop(&mut self) {
        self.sink
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .add(&self.totals);
    }
}

impl Agent for Metered<'_> {
    fn call(&mut self, request: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
        let called = std::time::Instant::now();
        let reply = match &mut self.inner {
            AgentHold::Borrowed(a) => a.call(request),
            AgentHold::Owned(a) => a.call(request),
        };
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
        if let Some(live) = &self.live {
            live.call(&step);
        }
        reply
    }

    fn reasks(&self) -> usize {
        self.inner.get().reasks()
    }

    fn needs_step_count(&self) -> bool {
        self.inner.get().needs_step_count()
    }

    fn retry(&self) -> crate::workflow::RetryOverride {
        self.inner.get().retry()
    }

    fn fork(&self) -> Option<Box<dyn Agent>> {
        Some(Box::new(Metered {
            inner: AgentHold::Owned(self.inner.get().fork()?),
            totals: UsageTotals::default(),
            sink: Arc::clone(&self.sink),
            live: self.live.clone(),
        }))
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

//! The synchronous workflow engine: starting threads of registered
//! workflows, stepping them with agents, routing, suspend and resume,
//! child workflows, compaction, cancel and forks that compute their state
//! from the pinned workflow.
//!
//! # The engine surface
//!
//! What an embedder calls, on an [`Engine`] (from [`Store::engine`]), each
//! with an example that runs:
//!
//! - [`Engine::start_workflow`] starts a thread of a registered workflow;
//!   [`Engine::run_workflow`] starts one and drives it to its end.
//! - [`Engine::drive`] steps a thread with an [`agent::Agent`]; with
//!   [`DriveOptions::resume`] it first resumes a suspended or ended one.
//! - [`Engine::fork`] branches a thread; [`Engine::cancel_thread`] ends one.
//! - [`Engine::run_batch`] drives one new thread per prompt on several
//!   driver threads; [`Engine::continuable_threads`] and
//!   [`Engine::continue_threads`] finish what an interrupted batch left.
//! - [`agent::Agent`] is what answers a role step: your own type, or one
//!   built from a spec (`script:FILE`, `cmd:PROGRAM ARGS`) by
//!   [`Engine::build_agent`] or [`Engine::agent_for`].
//! - [`Cancel`] is the token a drive or a batch runs under (for Ctrl-C).
//! - [`crate::gc::collect_garbage`] and [`crate::verify::verify`] look after the store.
//!
//! Raw record mutation without routing or claims is below this layer, in
//! [`Threads::low_level`]. `examples/embed.rs` puts the surface together: an
//! LMDB store, a YAML workflow, an agent written in Rust and a batch.

pub mod agent;
pub mod batch;
mod cancel;
mod child;
pub mod claim;
mod compact;
mod drive;
mod error;
pub mod extract;
mod fanout;
pub mod kept;
pub mod parent;
pub mod prompt;
pub mod prompt_file;
pub mod retry;
pub(crate) mod state;
mod step;
pub mod watch;

pub use cancel::Cancel;
pub use drive::{CancelOptions, DriveOptions, DriveReport, StepResult};
pub use error::{EngineError, StepFailure};
pub use parent::ParentContext;

use std::sync::Arc;

use crate::hash::Hash;
use crate::node::Blob;
use crate::store::Store;
use crate::thread::Threads;
use state::EngineState;

/// The engine over one store: starts workflows, drives threads step by
/// step under a claim, resumes, stops and cancels them, runs batches and
/// watches for changes. A cheap clone (the store handle and the store's
/// engine state: caches and claim bookkeeping, shared by every `Engine`
/// of the same open store). Get one with [`Store::engine`] or
/// [`Engine::new`].
///
/// ```
/// let store = uwf_db::Store::memory();
/// let engine = store.engine();
/// let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
/// let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
/// let (hash, _) = store.workflows().add(&wf)?;
/// let started = engine.start_workflow(hash, "a task", &Default::default())?;
/// assert_eq!(started.next_role.as_deref(), Some("writer"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Engine {
    store: Store,
    pub(crate) state: Arc<EngineState>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// The engine of `store` (the same as [`Store::engine`]).
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// let engine = uwf_db::Engine::new(&store);
    /// assert!(engine.store().same_store(&store));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(store: &Store) -> Engine {
        Engine {
            store: store.clone(),
            state: store.layer_state::<EngineState>(),
        }
    }

    /// The store this engine drives.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// assert!(store.engine().store().same_store(&store));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The thread layer of this engine's store.
    pub(crate) fn threads(&self) -> Threads<'_> {
        self.store.threads()
    }

    /// The engine's state for this store (caches, claims).
    pub(crate) fn engine_state(&self) -> &EngineState {
        &self.state
    }
}

impl Store {
    /// The engine over this store: see [`Engine`].
    ///
    /// ```
    /// let store = uwf_db::Store::memory();
    /// assert!(store.engine().continuable_threads("review")?.is_empty());
    /// # Ok::<(), uwf_db::engine::EngineError>(())
    /// ```
    pub fn engine(&self) -> Engine {
        Engine::new(self)
    }
}
use crate::thread::{END_ROLE, NewThread, Next, ThreadError, ThreadId, ThreadRecord};
use crate::workflow::Workflow;

/// Where a fork starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForkAt {
    /// The source's head.
    Head,
    /// A node of the source's chain.
    Node(Hash),
    /// The parent of the latest step of this role (so the role runs again).
    BeforeRole(String),
}

/// How to start a thread of a workflow ([`Engine::start_workflow`],
/// [`Engine::run_workflow`]).
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// An agent spec stored on the thread (so later drives reuse it).
    pub agent_spec: Option<String>,
    /// Loop protection (default: the workflow's `maxRounds`).
    pub max_rounds: Option<u32>,
    /// The directory the thread's agents work in, and relative edge
    /// `location`s resolve against (recorded on the thread; the CLI gives
    /// `--cwd` or the directory it was called from). `None`: the driver's
    /// working directory, whatever it is at each step.
    pub cwd: Option<std::path::PathBuf>,
    /// Labels stored on the thread (SPEC §11); its forks and child
    /// workflows' threads inherit them.
    pub labels: crate::thread::Labels,
    /// The token the drive of [`Engine::run_workflow`] runs under (starting
    /// alone runs nothing and ignores it).
    pub cancel: Cancel,
}

impl Engine {
    /// Starts a thread of a registered workflow (or one already stored, by
    /// hash) with the task `prompt`; it is `idle` with the first role.
    /// Nothing runs until the thread is driven ([`Engine::drive`]).
    ///
    /// ```
    /// use uwf_db::Store;
    /// use uwf_db::engine::StartOptions;
    /// use uwf_db::thread::ThreadStatus;
    /// use uwf_db::workflow::parse_workflow;
    ///
    /// let store = Store::memory();
    /// // A writer, then a reviewer, then the end; `_` is the status of a
    /// // reply without frontmatter.
    /// let yaml = "
    /// name: review
    /// roles:
    ///   writer: { goal: Write the text }
    ///   reviewer: { goal: Review the text }
    /// graph:
    ///   $START: { _: { role: writer, prompt: 'Write it' } }
    ///   writer: { _: { role: reviewer, prompt: 'Review it' } }
    ///   reviewer: { _: { role: $END, prompt: 'Reviewed' } }
    /// ";
    /// let wf = parse_workflow(yaml, Some("review"), &|_| false).map_err(|p| format!("{p:?}"))?;
    /// let (workflow, _) = store.workflows().add(&wf)?;
    ///
    /// let thread = store.engine().start_workflow(workflow, "a haiku about LMDB", &StartOptions::default())?;
    /// assert_eq!(thread.status, ThreadStatus::Idle);
    /// assert_eq!(thread.workflow, "review");
    /// assert_eq!(thread.next_role.as_deref(), Some("writer"));
    /// assert_eq!(thread.next_instruction.as_deref(), Some("Write it"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start_workflow(
        &self,
        workflow: Hash,
        prompt: &str,
        options: &StartOptions,
    ) -> Result<ThreadRecord, EngineError> {
        let new = self.top_level_thread(workflow, prompt, options)?;
        let task = self.task_to_remember(&new);
        let record = self.threads().low_level().start_thread(new)?;
        if let Some(task) = task {
            self.engine_state().tasks.insert(record.start, task);
        }
        Ok(record)
    }

    /// Starts a thread and drives it until it ends or suspends (what
    /// `uwf-db run` does): the thread is created already claimed, so the
    /// drive costs no separate claim commit. An error before the thread
    /// exists is `Err`; a failure of a step is in the report.
    ///
    /// ```
    /// use uwf_db::engine::StartOptions;
    /// use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
    /// use uwf_db::thread::ThreadStatus;
    ///
    /// /// Answers in plain text and remembers what it was asked.
    /// #[derive(Default)]
    /// struct Scribe(Vec<String>);
    /// impl Agent for Scribe {
    ///     fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
    ///         self.0.push(format!("{}: {}", req.role_name, req.instruction));
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
    /// let mut agent = Scribe::default();
    /// let options = StartOptions::default();
    /// let (thread, report) = store.engine().run_workflow(workflow, "a haiku", &options, &mut agent)?;
    /// let results = report.into_result()?;
    /// assert_eq!(results.len(), 2);
    /// assert_eq!(results[1].status, ThreadStatus::Completed);
    /// assert_eq!(agent.0, ["writer: Write it", "reviewer: Review it"]);
    /// assert_eq!(store.threads().get(thread.id)?.map(|r| r.status), Some(ThreadStatus::Completed));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run_workflow(
        &self,
        workflow: Hash,
        prompt: &str,
        options: &StartOptions,
        agent: &mut dyn agent::Agent,
    ) -> Result<(ThreadRecord, DriveReport), EngineError> {
        let new = self.top_level_thread(workflow, prompt, options)?;
        // The first step's prompt shows the task: known here, not read back.
        let task = self.task_to_remember(&new);
        let id = ThreadId::generate();
        let claim = self.claim_new(id, &options.cancel)?;
        let record = self
            .threads()
            .low_level()
            .start_thread_generated(new, id, true)?;
        if let Some(task) = task {
            self.engine_state().tasks.insert(record.start, task);
        }
        let mut outcome =
            self.run_thread(id, Some(record.clone()), usize::MAX, agent, &options.cancel);
        match outcome.results.last() {
            Some(last) if outcome.error.is_none() && last.current_role.is_none() => {
                claim.released_by_commit();
            }
            _ => {
                if let Err(e) = claim.release()
                    && outcome.error.is_none()
                {
                    outcome.error = Some(e);
                }
            }
        }
        Ok((record, outcome))
    }

    /// The agent to drive thread `id` with, and its spec: `spec` when given,
    /// else the one stored on the thread, else [`EngineError::NoAgent`]. The
    /// agent is built here, so a spec that does not work fails before
    /// anything is stored; give the spec as [`DriveOptions::agent_spec`] to
    /// store it on the thread.
    ///
    /// ```
    /// use uwf_db::engine::agent::AgentOptions;
    /// use uwf_db::engine::{DriveOptions, EngineError, StartOptions};
    /// use uwf_db::thread::ThreadStatus;
    ///
    /// # use uwf_db::Store;
    /// # use uwf_db::workflow::parse_workflow;
    /// # let store = Store::memory();
    /// # let yaml = "name: review\nroles:\n  writer: { goal: Write }\n  reviewer: { goal: Review }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: reviewer, prompt: 'Review it' } }\n  reviewer: { _: { role: $END, prompt: 'Reviewed' } }\n";
    /// # let wf = parse_workflow(yaml, Some("review"), &|_| false).map_err(|p| format!("{p:?}"))?;
    /// # let (workflow, _) = store.workflows().add(&wf)?;
    /// // A thread that stores its agent spec: later drives reuse it.
    /// let options = StartOptions {
    ///     agent_spec: Some("cmd:echo done".into()),
    ///     ..StartOptions::default()
    /// };
    /// let thread = store.engine().start_workflow(workflow, "a task", &options)?;
    /// let (mut agent, spec) = store.engine().agent_for(thread.id, None, &AgentOptions::default())?;
    /// assert_eq!(spec, "cmd:echo done");
    /// let results = store.engine().drive(thread.id, &DriveOptions::default(), &mut *agent).into_result()?;
    /// assert_eq!(results.last().map(|r| r.status), Some(ThreadStatus::Completed));
    ///
    /// // Without a stored spec, the caller names one.
    /// let bare = store.engine().start_workflow(workflow, "a task", &StartOptions::default())?;
    /// let none = store.engine().agent_for(bare.id, None, &AgentOptions::default());
    /// assert!(matches!(none, Err(EngineError::NoAgent { .. })));
    /// let (_agent, spec) = store.engine().agent_for(bare.id, Some("cmd:cat"), &AgentOptions::default())?;
    /// assert_eq!(spec, "cmd:cat");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn agent_for(
        &self,
        id: ThreadId,
        spec: Option<&str>,
        options: &agent::AgentOptions,
    ) -> Result<(Box<dyn agent::Agent>, String), EngineError> {
        let spec = match spec {
            Some(s) => s.to_owned(),
            None => self
                .threads()
                .get(id)?
                .ok_or_else(|| ThreadError::Unknown(id.to_string()))?
                .agent
                .ok_or(EngineError::NoAgent { thread: id })?,
        };
        let agent = self.build_agent(&spec, options)?;
        Ok((agent, spec))
    }

    /// Builds the agent a spec names (`script:FILE` or `cmd:PROGRAM ARGS`),
    /// with this store's directory as a `cmd:` program's `UWF_STORE`.
    ///
    /// ```
    /// use uwf_db::engine::agent::{AgentError, AgentOptions};
    /// use uwf_db::engine::{DriveOptions, EngineError, StartOptions};
    /// use uwf_db::thread::ThreadStatus;
    ///
    /// # use uwf_db::Store;
    /// # use uwf_db::workflow::parse_workflow;
    /// # let store = Store::memory();
    /// # let yaml = "name: review\nroles:\n  writer: { goal: Write }\n  reviewer: { goal: Review }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: reviewer, prompt: 'Review it' } }\n  reviewer: { _: { role: $END, prompt: 'Reviewed' } }\n";
    /// # let wf = parse_workflow(yaml, Some("review"), &|_| false).map_err(|p| format!("{p:?}"))?;
    /// # let (workflow, _) = store.workflows().add(&wf)?;
    /// // `echo` ignores the prompt on stdin; its stdout is the reply.
    /// let mut agent = store.engine().build_agent("cmd:echo looks fine", &AgentOptions::default())?;
    /// let thread = store.engine().start_workflow(workflow, "a task", &StartOptions::default())?;
    /// let results = store.engine().drive(thread.id, &DriveOptions::default(), &mut *agent).into_result()?;
    /// assert_eq!(results.len(), 2);
    /// assert_eq!(results[1].status, ThreadStatus::Completed);
    ///
    /// let bad = store.engine().build_agent("http://localhost", &AgentOptions::default());
    /// assert!(matches!(bad, Err(EngineError::Agent(AgentError::BadSpec(_)))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build_agent(
        &self,
        spec: &str,
        options: &agent::AgentOptions,
    ) -> Result<Box<dyn agent::Agent>, EngineError> {
        let options = agent::AgentOptions {
            store: std::path::PathBuf::from(self.store.location()),
            ..options.clone()
        };
        Ok(agent::AgentSpec::parse(spec)?.build(&options)?)
    }

    /// A top-level thread of a stored workflow, idle with its first role.
    fn top_level_thread(
        &self,
        workflow: Hash,
        prompt: &str,
        options: &StartOptions,
    ) -> Result<NewThread, EngineError> {
        let wf = self.store.workflows().load(workflow)?;
        let templates = Some(&self.engine_state().templates);
        let (role, instruction) = wf.first_in(templates)?;
        let next_location = wf.start_location_in(templates, false)?;
        Ok(NewThread {
            workflow: wf.name.clone(),
            workflow_hash: workflow,
            prompt: prompt.to_owned(),
            max_rounds: options.max_rounds.unwrap_or(wf.max_rounds),
            depth: 0,
            parent_state: None,
            parent_thread: None,
            next_role: role,
            next_instruction: instruction,
            agent: options.agent_spec.clone(),
            cwd: options
                .cwd
                .as_ref()
                .map(|c| c.to_string_lossy().into_owned()),
            next_location,
            labels: options.labels.clone(),
        })
    }

    /// Forks a thread, computing the fork's status once from the node and
    /// the pinned workflow: the start → `idle` with the first role; a step
    /// that routed to a role → `idle` with that role; a step that routed to
    /// `$SUSPEND` → `suspended` with the same role and message. The source
    /// is not changed.
    ///
    /// ```
    /// use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
    /// use uwf_db::engine::{DriveOptions, ForkAt, StartOptions};
    /// use uwf_db::thread::ThreadStatus;
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
    /// let (thread, report) =
    ///     store.engine().run_workflow(workflow, "a haiku", &StartOptions::default(), &mut Echo)?;
    /// assert_eq!(report.into_result()?.len(), 2);
    ///
    /// // A second review of the same text: fork just before the reviewer's step.
    /// let fork = store.engine().fork(thread.id, ForkAt::BeforeRole("reviewer".into()))?;
    /// assert_eq!(fork.status, ThreadStatus::Idle);
    /// assert_eq!(fork.next_role.as_deref(), Some("reviewer"));
    /// assert_eq!(fork.forked_from.map(|o| o.thread), Some(thread.id));
    /// let results = store.engine().drive(fork.id, &DriveOptions::default(), &mut Echo).into_result()?;
    /// assert_eq!(results.len(), 1);
    /// assert_eq!(results[0].status, ThreadStatus::Completed);
    ///
    /// // The head of an ended thread is its end node: resume it instead.
    /// assert!(store.engine().fork(thread.id, ForkAt::Head).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fork(&self, source: ThreadId, at: ForkAt) -> Result<ThreadRecord, EngineError> {
        let record = self
            .threads()
            .get(source)?
            .ok_or_else(|| ThreadError::Unknown(source.to_string()))?;
        let node = match at {
            ForkAt::Head => record.head,
            ForkAt::Node(h) => h,
            ForkAt::BeforeRole(role) => self.before_latest_step(&record, &role)?,
        };
        let wf = self.store.workflows().load(record.workflow_hash)?;
        let state = fork_state(self, &wf, &record, node)?;
        Ok(self
            .threads()
            .low_level()
            .fork_thread(source, node, state)?)
    }

    /// The parent (or the start) of the newest step of `role` on the chain.
    /// When there is none, the error lists the roles that did run (the
    /// whole chain was read to find out, so listing them costs nothing).
    fn before_latest_step(&self, record: &ThreadRecord, role: &str) -> Result<Hash, EngineError> {
        let mut before = None;
        // Newest first, as the log pages come.
        let mut seen: Vec<String> = Vec::new();
        loop {
            let page = self.threads().log(record.id, 256, before)?;
            if let Some(e) = page.iter().find(|e| e.node.role == role) {
                return Ok(e.node.ancestors.first().copied().unwrap_or(record.start));
            }
            seen.extend(
                page.iter()
                    .filter(|e| e.node.role != END_ROLE)
                    .map(|e| e.node.role.clone()),
            );
            match page.last() {
                Some(last) if page.len() == 256 => before = Some(last.hash),
                _ => {
                    let mut ran: Vec<String> = Vec::new();
                    for r in seen.into_iter().rev() {
                        if !ran.contains(&r) {
                            ran.push(r);
                        }
                    }
                    return Err(EngineError::NoSuchStep {
                        thread: record.id,
                        role: role.to_owned(),
                        ran,
                    });
                }
            }
        }
    }
}

fn fork_state(
    engine: &Engine,
    wf: &Workflow,
    record: &ThreadRecord,
    node: Hash,
) -> Result<Next, EngineError> {
    if node == record.start {
        let templates = Some(&engine.engine_state().templates);
        let (role, instruction) = wf.first_in(templates)?;
        let location = wf.start_location_in(templates, false)?;
        return Ok(Next::Role {
            role,
            instruction,
            location,
        });
    }
    let state = match engine.store.get(&node)? {
        Some(Blob::State(s)) => s,
        Some(_) => {
            return Err(ThreadError::WrongKind {
                hash: node,
                expected: "state",
            }
            .into());
        }
        None => return Err(ThreadError::MissingNode { hash: node }.into()),
    };
    if state.role == END_ROLE {
        return Err(ThreadError::ForkAtEnd {
            thread: record.id,
            node,
        }
        .into());
    }
    let body = engine.text(&state.content)?;
    match wf.route_in(
        Some(&engine.engine_state().templates),
        &state.role,
        &state.meta,
        &body,
    )? {
        Next::End(_) => Err(EngineError::ForkAfterEnd {
            thread: record.id,
            node,
        }),
        next => Ok(next),
    }
}

impl Engine {
    /// The task of a thread about to start, for the task cache (its first
    /// step shows it), when it is short (`state::TEXT_CACHE_MAX`): a long
    /// one is read back from the store when needed.
    fn task_to_remember(&self, new: &NewThread) -> Option<state::Task> {
        (new.prompt.len() <= state::TEXT_CACHE_MAX)
            .then(|| (Arc::from(new.prompt.as_str()), new.max_rounds))
    }
}

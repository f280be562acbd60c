//! Stepping threads: one role step at a time, routed before it is
//! committed; failures are recorded, never committed.

use super::Engine;
use super::step::Mode;

use serde::Serialize;

use super::EngineError;
use super::agent::Agent;
use super::cancel::Cancel;
use crate::hash::Hash;
use crate::thread::{EndSpec, ThreadId, ThreadRecord, ThreadStatus};

/// What a step left (SPEC §7's step result).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct StepResult {
    /// The thread.
    pub thread: ThreadId,
    /// The workflow's name.
    pub workflow: String,
    /// The head after the step.
    pub head: Hash,
    /// The status the step left.
    pub status: ThreadStatus,
    /// The next role, when idle.
    pub current_role: Option<String>,
    /// The suspended role, when suspended.
    pub suspended_role: Option<String>,
    /// The suspend message, when suspended.
    pub suspend_message: Option<String>,
    /// Completed, failed or cancelled.
    pub done: bool,
    /// `thread stop` asked the driver to stop after this step.
    #[serde(skip)]
    pub stop_requested: bool,
}

impl StepResult {
    /// The result for a record: the status the step left, never the
    /// driver's own claim.
    pub fn of(r: &ThreadRecord) -> Self {
        let status = r.underlying_status();
        StepResult {
            thread: r.id,
            workflow: r.workflow.clone(),
            head: r.head,
            status,
            current_role: (status == ThreadStatus::Idle)
                .then(|| r.next_role.clone())
                .flatten(),
            suspended_role: r.suspended_role.clone(),
            suspend_message: r.suspend_message.clone(),
            done: status.is_done(),
            stop_requested: r.stop_requested_at.is_some(),
        }
    }
}

/// What a drive did: the steps it committed, and the failure that stopped
/// it early, if any (the steps before it stay committed).
#[derive(Debug)]
#[must_use = "a drive may have stopped with an error"]
pub struct DriveReport {
    /// One result per committed step, in order.
    pub results: Vec<StepResult>,
    /// The failure that stopped the drive, if any.
    pub error: Option<EngineError>,
    /// The drive stopped early, after a committed step, because it was
    /// asked to (`thread stop`, or [`Cancel::stop_after_step`]).
    pub stopped_by_request: bool,
}

impl DriveReport {
    /// The results, or the error when the drive stopped with one.
    pub fn into_result(self) -> Result<Vec<StepResult>, EngineError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.results),
        }
    }

    /// Whether the last step left the thread not idle (ended or suspended).
    fn stopped(&self) -> bool {
        self.results
            .last()
            .is_some_and(|r| r.current_role.is_none())
    }
}

/// How to drive a thread ([`Engine::drive`]).
///
/// With `resume`, a suspended thread runs its suspended role again with the
/// suspend message (plus `resume_text`), and an ended one runs its first
/// role again after the end node; then the drive steps on as usual.
///
/// A planner that asks a human, is resumed with the answer, and goes on:
///
/// ```
/// use uwf_db::Store;
/// use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
/// use uwf_db::engine::{DriveOptions, StartOptions};
/// use uwf_db::thread::ThreadStatus;
/// use uwf_db::workflow::parse_workflow;
///
/// let yaml = "
/// name: planner
/// roles:
///   planner:
///     goal: Plan the task, or ask for what is missing
///     frontmatter:
///       oneOf:
///         - { properties: { $status: { const: planned } }, required: [$status] }
///         - properties: { $status: { const: need_info }, question: { type: string } }
///           required: [$status, question]
///   developer: { goal: Carry out the plan }
/// graph:
///   $START: { _: { role: planner, prompt: 'Plan the task' } }
///   planner:
///     need_info: { role: $SUSPEND, prompt: 'The planner asks: {{{question}}}' }
///     planned: { role: developer, prompt: 'Carry out the plan' }
///   developer: { _: { role: $END, prompt: 'Done' } }
/// ";
///
/// /// Plans once it knows which database to use; remembers every instruction.
/// #[derive(Default)]
/// struct Planner(Vec<String>);
/// impl Agent for Planner {
///     fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
///         self.0.push(req.instruction.to_owned());
///         let reply = match req.role_name {
///             "planner" if req.instruction.contains("LMDB") => "---\n$status: planned\n---\nUse LMDB",
///             "planner" => "---\n$status: need_info\nquestion: Which database?\n---\n",
///             _ => "Done as planned",
///         };
///         Ok(reply.to_owned().into())
///     }
/// }
///
/// let store = Store::memory();
/// let wf = parse_workflow(yaml, Some("planner"), &|_| false).map_err(|p| format!("{p:?}"))?;
/// let (workflow, _) = store.workflows().add(&wf)?;
/// let mut agent = Planner::default();
/// let (thread, report) =
///     store.engine().run_workflow(workflow, "Store the threads", &StartOptions::default(), &mut agent)?;
/// let suspended = report.into_result()?;
/// assert_eq!(suspended.len(), 1);
/// assert_eq!(suspended[0].status, ThreadStatus::Suspended);
/// assert_eq!(suspended[0].suspended_role.as_deref(), Some("planner"));
/// assert_eq!(suspended[0].suspend_message.as_deref(), Some("The planner asks: Which database?"));
///
/// // The human's answer: the planner runs again, then the developer.
/// let resume = DriveOptions {
///     resume: true,
///     resume_text: Some("Use LMDB.".into()),
///     ..DriveOptions::default()
/// };
/// let results = store.engine().drive(thread.id, &resume, &mut agent).into_result()?;
/// assert_eq!(results.len(), 2);
/// assert_eq!(results[1].status, ThreadStatus::Completed);
/// assert_eq!(agent.0[1], "The planner asks: Which database?\n\nUse LMDB.");
/// assert_eq!(agent.0[2], "Carry out the plan");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct DriveOptions {
    /// Most steps to run (the resumed step counts); `None`: until the
    /// thread ends or suspends.
    pub max_steps: Option<usize>,
    /// Resume the thread first (a suspended, completed or failed one)
    /// instead of stepping an idle one.
    pub resume: bool,
    /// With `resume`: text appended to the resume instruction.
    pub resume_text: Option<String>,
    /// An agent spec to store on the thread (so later drives reuse it),
    /// written under the claim before the first step.
    pub agent_spec: Option<String>,
    /// The token the drive runs under.
    pub cancel: Cancel,
}

/// How to cancel a thread ([`Engine::cancel_thread`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CancelOptions {
    /// Cancel even while a live driver holds the thread.
    pub force: bool,
}

/// The meta key under which a step that ran at an edge's `location`
/// records the directory its agent worked in.
pub const CWD_META: &str = "$cwd";

impl Engine {
    /// Drives a thread with `agent`: claims it for the whole drive (a second
    /// driver is refused), stores the agent spec if one is given, resumes
    /// it if asked, then steps it until it ends or suspends or
    /// `max_steps` steps ran. A step that fails records its error on the
    /// thread and stops the drive.
    ///
    /// ```
    /// use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
    /// use uwf_db::engine::{Cancel, DriveOptions, StartOptions};
    /// use uwf_db::thread::ThreadStatus;
    /// use uwf_db::workflow::parse_workflow;
    /// use uwf_db::Store;
    ///
    /// /// Answers every role with plain text (the default status `_`).
    /// struct Echo;
    /// impl Agent for Echo {
    ///     fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
    ///         Ok(format!("did: {}", req.instruction).into())
    ///     }
    /// }
    ///
    /// let store = Store::memory();
    /// let yaml = "name: one\nroles:\n  worker:\n    goal: Work\ngraph:\n  $START:\n    _: { role: worker, prompt: 'Work' }\n  worker:\n    _: { role: $END, prompt: 'Done' }\n";
    /// let parsed = parse_workflow(yaml, None, &|_| false).map_err(|p| format!("{p:?}"))?;
    /// let (workflow, _) = store.workflows().add(&parsed)?;
    /// let thread = store.engine().start_workflow(workflow, "a task", &StartOptions::default())?;
    ///
    /// // The caller owns the token: another thread may `cancel()` it.
    /// let options = DriveOptions { cancel: Cancel::new(), ..DriveOptions::default() };
    /// let results = store.engine().drive(thread.id, &options, &mut Echo).into_result()?;
    /// assert_eq!(results.len(), 1);
    /// assert_eq!(results[0].status, ThreadStatus::Completed);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn drive(
        &self,
        id: ThreadId,
        options: &DriveOptions,
        agent: &mut dyn Agent,
    ) -> DriveReport {
        let span = self.workflow_span(id);
        let report = span.in_scope(|| self.drive_claimed(id, options, agent));
        self.close_workflow_span(&span, id, &report);
        report
    }

    /// [`Self::drive`] inside its span.
    fn drive_claimed(
        &self,
        id: ThreadId,
        options: &DriveOptions,
        agent: &mut dyn Agent,
    ) -> DriveReport {
        let mut report = DriveReport {
            results: Vec::new(),
            error: None,
            stopped_by_request: false,
        };
        let max_steps = options.max_steps.unwrap_or(usize::MAX);
        let cancel = &options.cancel;
        // Hold the thread for the whole drive, not per step.
        let claim = match self.claim(id, cancel) {
            Ok(c) => c,
            Err(e) => {
                report.error = Some(e);
                return report;
            }
        };
        if let Some(spec) = &options.agent_spec
            && let Err(e) = self.store_agent_spec(id, spec)
        {
            report.error = Some(e);
            return report;
        }
        if options.resume && max_steps > 0 {
            match self.resume_thread(id, options.resume_text.as_deref(), agent, cancel) {
                Ok(r) => report.results.push(r),
                Err(e) => {
                    report.error = Some(e);
                    return report;
                }
            }
        }
        if report.results.len() < max_steps && !report.stopped() {
            let more = self.run_steps(id, None, max_steps - report.results.len(), agent, cancel);
            report.results.extend(more.results);
            report.error = more.error;
            report.stopped_by_request = more.stopped_by_request;
        }
        if report.error.is_none()
            && let Err(e) = claim.release()
        {
            report.error = Some(e);
        }
        report
    }

    /// Asks the live driver of thread `id` to stop after the step in
    /// flight (`uwf-db thread stop`): the step is committed, the thread is
    /// left idle, and the drive ends with
    /// [`DriveReport::stopped_by_request`]. Works across processes and
    /// machines (the request is a field of the thread's record, which the
    /// driver reads back with every step it commits). Refused
    /// ([`EngineError::NotRunning`]) when no driver holds the thread.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// let started = store.engine().start_workflow(hash, "task", &Default::default())?;
    /// // Idle: no driver to ask.
    /// assert!(store.engine().request_stop(started.id).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn request_stop(&self, id: ThreadId) -> Result<ThreadRecord, EngineError> {
        let record = self.need_thread(id)?;
        if record.status != ThreadStatus::Running || !super::claim::is_held(&self.store, id)? {
            return Err(EngineError::NotRunning {
                thread: id,
                status: record.underlying_status(),
            });
        }
        let record = self.threads().low_level().update_record(id, |r| {
            if r.status != ThreadStatus::Running {
                return Err(crate::thread::ThreadError::WrongStatus {
                    thread: r.id,
                    status: r.status,
                    action: "stop",
                });
            }
            r.stop_requested_at = Some(crate::store::now_ms());
            Ok(())
        })?;
        // A fan-out's children are asked too: each stops after its step
        // in flight (one not running has no driver to ask).
        for &child in record.fan_out.iter().flatten() {
            let _ = self.threads().low_level().update_record(child, |r| {
                if r.status == ThreadStatus::Running {
                    r.stop_requested_at = Some(crate::store::now_ms());
                }
                Ok(())
            });
        }
        Ok(record)
    }

    /// Clears a stop request on the thread, if it has one.
    fn clear_stop_request(&self, id: ThreadId) -> Result<(), EngineError> {
        if self.need_thread(id)?.stop_requested_at.is_none() {
            return Ok(());
        }
        self.threads().low_level().update_record(id, |r| {
            r.stop_requested_at = None;
            Ok(())
        })?;
        Ok(())
    }

    /// Stores `spec` as the thread's agent, unless it is already.
    fn store_agent_spec(&self, id: ThreadId, spec: &str) -> Result<(), EngineError> {
        if self.need_thread(id)?.agent.as_deref() == Some(spec) {
            return Ok(());
        }
        let spec = spec.to_owned();
        self.threads().low_level().update_record(id, move |r| {
            r.agent = Some(spec.clone());
            Ok(())
        })?;
        Ok(())
    }

    /// Runs one role step of an idle thread with `agent`, from `known`, the
    /// record the driver's previous step committed, when it has one; else
    /// from the record as stored (`docs/design.md` §8f "A driver steps on
    /// from its own commit", item 11). Carrying it saves a read a step (a
    /// round trip on PostgreSQL): a write that moved the head since makes
    /// this step's commit a conflict (`load_checked`), exactly as one
    /// landing while the agent works does, and the commit reads the record
    /// afresh (a stop request, usage, labels). A step whose role runs
    /// children reads the record first ([`Self::next_runs_children`]).
    pub(super) fn step_thread_from(
        &self,
        id: ThreadId,
        known: Option<ThreadRecord>,
        agent: &mut dyn Agent,
        cancel: &Cancel,
    ) -> Result<super::step::Stepped, EngineError> {
        let _claim = self.claim(id, cancel)?;
        let record = match known {
            Some(r) if r.id == id && !self.next_runs_children(&r)? => r,
            _ => self.need_thread(id)?,
        };
        let status = record.underlying_status();
        if status != ThreadStatus::Idle {
            return Err(EngineError::NotSteppable { thread: id, status });
        }
        let role = record.next_role.clone().unwrap_or_default();
        let instruction = record.next_instruction.clone().unwrap_or_default();
        self.run_step(&record, &role, &instruction, Mode::Next, agent, cancel)
    }

    /// Whether `record`'s next role runs children (a child workflow or a
    /// fan-out). Such a step starts threads (copying the parent's labels,
    /// agent and directory into them) before its own commit, so it starts
    /// from the record as stored, never a carried one: a cancelled
    /// parent's step then stops before any child is made.
    fn next_runs_children(&self, record: &ThreadRecord) -> Result<bool, EngineError> {
        let Some(role) = &record.next_role else {
            return Ok(false);
        };
        let wf = self.store.workflows().load(record.workflow_hash)?;
        Ok(wf.roles.get(role).is_some_and(|r| r.runs_children()))
    }

    /// Resumes a suspended thread (its suspended role runs again with the
    /// suspend message, plus `"\n\n"` and `text` when given) or an ended
    /// one (completed or failed: the first role runs after the end node,
    /// with the `$START` prompt, plus `"\n\n"` and `text`). If the step
    /// fails the thread keeps its status, with the error recorded.
    pub(crate) fn resume_thread(
        &self,
        id: ThreadId,
        text: Option<&str>,
        agent: &mut dyn Agent,
        cancel: &Cancel,
    ) -> Result<StepResult, EngineError> {
        self.check_resumable(id)?;
        self.resume_inner(id, text, agent, cancel)
    }

    /// Whether thread `id` can be resumed now: it is suspended, completed
    /// or failed ([`EngineError::NotResumable`] names its status otherwise),
    /// and it is not a child suspended inside its parent
    /// ([`EngineError::ResumeThroughParent`] names the parent). A resume
    /// checks this itself; a caller that must choose an agent first asks
    /// it before, so that a thread that cannot be resumed says so rather
    /// than that it has no agent.
    ///
    /// ```
    /// use uwf_db::engine::{EngineError, StartOptions};
    /// # use uwf_db::Store;
    /// # use uwf_db::workflow::parse_workflow;
    /// # let store = Store::memory();
    /// # let yaml = "name: one\nroles:\n  worker: { goal: Work }\ngraph:\n  $START: { _: { role: worker, prompt: 'Work' } }\n  worker: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = parse_workflow(yaml, Some("one"), &|_| false).map_err(|p| format!("{p:?}"))?;
    /// # let (workflow, _) = store.workflows().add(&wf)?;
    /// let thread = store.engine().start_workflow(workflow, "a task", &StartOptions::default())?;
    /// // Idle: step it instead.
    /// let e = store.engine().check_resumable(thread.id).unwrap_err();
    /// assert!(matches!(e, EngineError::NotResumable { .. }));
    /// assert!(e.to_string().contains("is idle"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_resumable(&self, id: ThreadId) -> Result<(), EngineError> {
        let record = self.need_thread(id)?;
        if let Some(parent) = record.parent_thread
            && let Some(p) = self.threads().get(parent)?
            && p.active_child == Some(id)
            && p.underlying_status() == ThreadStatus::Suspended
        {
            return Err(EngineError::ResumeThroughParent { thread: id, parent });
        }
        match record.underlying_status() {
            ThreadStatus::Suspended | ThreadStatus::Completed | ThreadStatus::Failed => Ok(()),
            status => Err(EngineError::NotResumable { thread: id, status }),
        }
    }

    /// `resume_thread` without the refusal for children of suspended parents.
    pub(super) fn resume_inner(
        &self,
        id: ThreadId,
        text: Option<&str>,
        agent: &mut dyn Agent,
        cancel: &Cancel,
    ) -> Result<StepResult, EngineError> {
        let _claim = self.claim(id, cancel)?;
        let record = self.need_thread(id)?;
        let with_text = |base: &str| match text {
            Some(t) => format!("{base}\n\n{t}"),
            None => base.to_owned(),
        };
        match record.underlying_status() {
            ThreadStatus::Suspended if record.fan_out.is_some() => {
                // Children of a fan-out wait: the answer goes to each
                // suspended child, then the fan-out goes on.
                let role = record.next_role.clone().unwrap_or_default();
                let instruction = record.next_instruction.clone().unwrap_or_default();
                let wf = self.store.workflows().load(record.workflow_hash)?;
                let Some(fan) = wf.roles.get(&role).and_then(|r| r.fan_out.clone()) else {
                    return Err(self.fail(
                        id,
                        super::StepFailure::UnknownRole {
                            role,
                            workflow: wf.name.clone(),
                        },
                    ));
                };
                self.run_fan_out_step(
                    &record,
                    &role,
                    &instruction,
                    &fan,
                    &wf,
                    text,
                    (agent, cancel),
                )
            }
            ThreadStatus::Suspended if record.active_child.is_some() => {
                // Suspended inside a child workflow: resume the innermost
                // suspended child; the parent's step is written when the
                // child ends.
                let child = record.active_child.unwrap_or(id);
                let role = record.next_role.clone().unwrap_or_default();
                let instruction = record.next_instruction.clone().unwrap_or_default();
                let wf = self.store.workflows().load(record.workflow_hash)?;
                self.finish_child(
                    &record,
                    &role,
                    &instruction,
                    child,
                    &wf,
                    (agent, cancel),
                    Some(text),
                )
            }
            ThreadStatus::Suspended => {
                let role = record.suspended_role.clone().unwrap_or_default();
                let instruction = with_text(record.suspend_message.as_deref().unwrap_or_default());
                self.run_step(
                    &record,
                    &role,
                    &instruction,
                    Mode::ResumeSuspended,
                    agent,
                    cancel,
                )
                .map(|(r, _)| r)
            }
            ThreadStatus::Completed | ThreadStatus::Failed => {
                let wf = self.store.workflows().load(record.workflow_hash)?;
                // `$START.resume` when the workflow has one.
                let (role, start_prompt) = wf.resume_in(Some(&self.engine_state().templates))?;
                let instruction = with_text(&start_prompt);
                self.run_step(
                    &record,
                    &role,
                    &instruction,
                    Mode::ResumeEnded,
                    agent,
                    cancel,
                )
                .map(|(r, _)| r)
            }
            status => Err(EngineError::NotResumable { thread: id, status }),
        }
    }

    /// Steps until the thread ends or suspends, or `max_steps` steps ran,
    /// or a step fails (the steps before it stay committed); in an
    /// `invoke_workflow` span (`crate::telemetry`). `known` is the record
    /// as the caller has just written it, if it has (the first step starts
    /// from it: [`Self::step_thread_from`]).
    pub(crate) fn run_thread(
        &self,
        id: ThreadId,
        known: Option<ThreadRecord>,
        max_steps: usize,
        agent: &mut dyn Agent,
        cancel: &Cancel,
    ) -> DriveReport {
        let span = self.workflow_span(id);
        let report = span.in_scope(|| self.run_steps(id, known, max_steps, agent, cancel));
        self.close_workflow_span(&span, id, &report);
        report
    }

    /// The `invoke_workflow` span of a drive of `id`, named after its
    /// workflow (read only when something listens).
    fn workflow_span(&self, id: ThreadId) -> tracing::Span {
        let span = crate::telemetry::workflow_span(id);
        if span.is_disabled() {
            return span;
        }
        if let Ok(Some(record)) = self.threads().get(id) {
            if let Ok(wf) = self.store.workflows().load(record.workflow_hash) {
                crate::telemetry::name_workflow(&span, &wf.name);
            }
            if let Some(parent) = record.parent_thread {
                span.record("uwf.thread.parent", tracing::field::display(parent));
            }
            if let Some(origin) = &record.forked_from {
                span.record(
                    "uwf.thread.forked_from",
                    tracing::field::display(origin.thread),
                );
            }
        }
        span
    }

    /// Records a drive's outcome on its span.
    fn close_workflow_span(&self, span: &tracing::Span, id: ThreadId, report: &DriveReport) {
        if span.is_disabled() {
            return;
        }
        span.record(
            "uwf.steps",
            crate::telemetry::int(report.results.len() as u64),
        );
        if let Some(last) = report.results.last() {
            span.record("uwf.thread.status", last.status.as_str());
        }
        if let Some(e) = &report.error {
            crate::telemetry::record_error(span, e.into());
            tracing::debug!(thread = %id, error = %e, "drive ended with an error");
        }
    }

    /// [`Self::run_thread`] without its span.
    fn run_steps(
        &self,
        id: ThreadId,
        mut known: Option<ThreadRecord>,
        max_steps: usize,
        agent: &mut dyn Agent,
        cancel: &Cancel,
    ) -> DriveReport {
        let mut results = Vec::new();
        let claim = match self.claim(id, cancel) {
            Ok(c) => c,
            Err(e) => {
                return DriveReport {
                    results,
                    error: Some(e),
                    stopped_by_request: false,
                };
            }
        };
        let mut stopped_by_request = false;
        // `known`: the record the last step committed (or the caller's,
        // just written); the next step starts from it.
        while results.len() < max_steps {
            if cancel.is_stopping() && !results.is_empty() {
                stopped_by_request = true;
                break;
            }
            match self.step_thread_from(id, known.take(), agent, cancel) {
                Ok((r, record)) => {
                    known = record;
                    let stop = r.status != ThreadStatus::Idle;
                    let asked = r.stop_requested;
                    results.push(r);
                    if asked {
                        if let Err(e) = self.clear_stop_request(id) {
                            return DriveReport {
                                results,
                                error: Some(e),
                                stopped_by_request: true,
                            };
                        }
                        stopped_by_request = !stop;
                        break;
                    }
                    if stop {
                        break;
                    }
                }
                Err(EngineError::FanOutStopped { .. }) => {
                    // Stopped as asked before a fan-out's join: nothing
                    // was committed, and that is no failure.
                    if let Err(e) = self.clear_stop_request(id) {
                        return DriveReport {
                            results,
                            error: Some(e),
                            stopped_by_request: true,
                        };
                    }
                    stopped_by_request = true;
                    break;
                }
                Err(e) => {
                    return DriveReport {
                        results,
                        error: Some(e),
                        stopped_by_request: false,
                    };
                }
            }
        }
        if results.last().is_some_and(|r| r.current_role.is_none()) {
            // The last commit ended the thread and released it: no need to
            // read the record again (a fan-out's thousand children).
            claim.released_by_commit();
        }
        DriveReport {
            results,
            error: None,
            stopped_by_request,
        }
    }

    /// Cancels an active thread: end node with return code 2, into history;
    /// its suspended children are cancelled too. Refused while a live
    /// driver holds it, unless [`CancelOptions::force`].
    ///
    /// ```
    /// use uwf_db::engine::{Cancel, CancelOptions, EngineError, StartOptions};
    /// use uwf_db::thread::ThreadStatus;
    ///
    /// // `review`: writer, then reviewer, then $END (as in `Engine::start_workflow`).
    /// # use uwf_db::Store;
    /// # use uwf_db::workflow::parse_workflow;
    /// # let store = Store::memory();
    /// # let yaml = "name: review\nroles:\n  writer: { goal: Write }\n  reviewer: { goal: Review }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: reviewer, prompt: 'Review it' } }\n  reviewer: { _: { role: $END, prompt: 'Reviewed' } }\n";
    /// # let wf = parse_workflow(yaml, Some("review"), &|_| false).map_err(|p| format!("{p:?}"))?;
    /// # let (workflow, _) = store.workflows().add(&wf)?;
    /// let thread = store.engine().start_workflow(workflow, "never mind", &StartOptions::default())?;
    ///
    /// // While a driver holds the thread, cancelling needs `force`.
    /// let claim = store.engine().claim(thread.id, &Cancel::new())?;
    /// let refused = store.engine().cancel_thread(thread.id, &CancelOptions::default());
    /// assert!(matches!(refused, Err(EngineError::Claimed { .. })));
    /// claim.release()?;
    ///
    /// let result = store.engine().cancel_thread(thread.id, &CancelOptions::default())?;
    /// assert_eq!(result.status, ThreadStatus::Cancelled);
    /// assert!(result.done);
    /// assert_eq!(store.threads().get(thread.id)?.map(|r| r.status), Some(ThreadStatus::Cancelled));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel_thread(
        &self,
        id: ThreadId,
        options: &CancelOptions,
    ) -> Result<StepResult, EngineError> {
        let force = options.force;
        if !force && super::claim::is_held(&self.store, id)? {
            return Err(EngineError::Claimed { thread: id });
        }
        let record = self.need_thread(id)?;
        if record.status.is_done() {
            return Err(EngineError::AlreadyEnded {
                thread: id,
                status: record.status,
            });
        }
        for child in self.threads().tree(id)?.children {
            if child.thread.status == ThreadStatus::Suspended {
                self.cancel_thread(child.thread.id, options)?;
            }
        }
        // A fan-out's children not ended are cancelled with it.
        for &child in record.fan_out.iter().flatten() {
            if !self.need_thread(child)?.status.is_done() {
                self.cancel_thread(child, options)?;
            }
        }
        let end = EndSpec {
            return_code: 2,
            summary: "cancelled".into(),
            prompt: "Cancelled".into(),
        };
        let w = self
            .threads()
            .low_level()
            .end_thread(id, record.head, end)?;
        Ok(StepResult::of(&w.record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Store;
    use crate::engine::agent::{AgentError, AgentReply, AgentRequest};
    use crate::engine::{EngineError, StartOptions};
    use crate::thread::ThreadError;

    /// Adds workflow `yaml` named `name` (child workflow `one` taken as
    /// registered) and returns its hash.
    fn add(store: &Store, yaml: &str, name: &str) -> crate::Hash {
        let wf = crate::workflow::parse_workflow(yaml, Some(name), &|n| n == "one").unwrap();
        store.workflows().add(&wf).unwrap().0
    }

    /// Answers every call alike (the one edge, `_`, takes it).
    struct Again;
    impl Agent for Again {
        fn call(&mut self, _: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
            Ok("once more".to_owned().into())
        }
    }

    /// A carried record the head has moved past since (another writer
    /// stepped the thread) makes the step's commit a conflict: nothing of
    /// it is written, and the step that moved the head stays.
    #[test]
    fn a_stale_carried_record_is_a_conflict_not_a_merge() {
        let store = Store::memory();
        let yaml = "name: loop\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: writer, prompt: 'Again' } }\n";
        let hash = add(&store, yaml, "loop");
        let engine = store.engine();
        let started = engine
            .start_workflow(hash, "task", &StartOptions::default())
            .unwrap();
        let cancel = Cancel::default();
        let (first, carried) = engine
            .step_thread_from(started.id, Some(started.clone()), &mut Again, &cancel)
            .unwrap();
        let carried = carried.expect("a role step returns its record");
        assert_eq!(carried.head, first.head);
        // As stored, but for the claim (this step's, released since).
        let stored = store.threads().get(started.id).unwrap().unwrap();
        assert_eq!(carried.claimed_status, Some(ThreadStatus::Idle));
        assert_eq!(
            ThreadRecord {
                status: ThreadStatus::Idle,
                claimed_status: None,
                // The release stamps it again (a later millisecond, maybe).
                updated_at: stored.updated_at,
                ..carried.clone()
            },
            stored
        );
        // Another step moves the head past the carried record.
        let (second, _) = engine
            .step_thread_from(started.id, None, &mut Again, &cancel)
            .unwrap();
        assert_ne!(second.head, first.head);
        let e = engine
            .step_thread_from(started.id, Some(carried), &mut Again, &cancel)
            .unwrap_err();
        assert!(
            matches!(
                e,
                EngineError::Thread(ThreadError::Conflict { expected, actual, .. })
                    if expected == first.head && actual == second.head
            ),
            "{e:?}"
        );
        let stored = store.threads().get(started.id).unwrap().unwrap();
        assert_eq!((stored.head, stored.seq), (second.head, 2));
    }

    /// A step whose role runs a child workflow starts from the record as
    /// stored, not a carried one: a parent cancelled since is refused
    /// before any child thread is made.
    #[test]
    fn a_role_running_children_reads_the_record_first() {
        let store = Store::memory();
        add(
            &store,
            "name: one\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n",
            "one",
        );
        let outer = add(
            &store,
            "name: outer\nroles:\n  writer: { goal: Write }\n  sub: { workflow: one }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: sub, prompt: 'Now the child' } }\n  sub: { done: { role: $END, prompt: 'Done' }, failed: { role: $END, prompt: 'Failed' } }\n",
            "outer",
        );
        let engine = store.engine();
        let started = engine
            .start_workflow(outer, "task", &StartOptions::default())
            .unwrap();
        let cancel = Cancel::default();
        let (_, carried) = engine
            .step_thread_from(started.id, Some(started.clone()), &mut Again, &cancel)
            .unwrap();
        let carried = carried.expect("a role step returns its record");
        assert_eq!(carried.next_role.as_deref(), Some("sub"));
        assert!(engine.next_runs_children(&carried).unwrap());
        engine
            .cancel_thread(started.id, &CancelOptions::default())
            .unwrap();
        let e = engine
            .step_thread_from(started.id, Some(carried), &mut Again, &cancel)
            .unwrap_err();
        assert!(
            matches!(
                e,
                EngineError::NotSteppable {
                    status: ThreadStatus::Cancelled,
                    ..
                }
            ),
            "{e:?}"
        );
        let threads = store.threads().list(&Default::default()).unwrap();
        assert_eq!(threads.len(), 1, "no child was made: {threads:?}");
    }
}

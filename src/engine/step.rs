//! One role step: the prompt, the agent call (re-asked on an invalid
//! reply), routing, and the commit or the recorded failure; the step's
//! directory, its task and its role header. The drive loop around it is
//! `drive.rs`.

use std::sync::Arc;
use std::time::Instant;

use super::agent::{Agent, AgentRequest};
use super::cancel::Cancel;
use super::drive::StepResult;
use super::extract::{extract_with, reported_usage};
use super::prompt::{RECENT_STEPS, assemble_with_header, output_format, role_header};
use super::retry::FailedAttempt;
use super::{Engine, EngineError, StepFailure};
use crate::hash::Hash;
use crate::node::Blob;
use crate::thread::{END_ROLE, EndSpec, Next, StepWrite, ThreadError, ThreadId, ThreadRecord};
use crate::usage::{StepUsage, USAGE_META};
use crate::workflow::{RetryOn, RetryPolicy};

/// The directory a step's agent works in: the rendered `location` of the
/// edge into the role (an absolute path as it is; a relative one joined to
/// the thread's `cwd`, or left relative to the driver's directory when the
/// thread has none), else the thread's `cwd`; `None` when neither is set.
pub(crate) fn step_dir(cwd: Option<&str>, location: Option<&str>) -> Option<std::path::PathBuf> {
    use std::path::{Path, PathBuf};
    match (cwd, location) {
        (Some(c), Some(l)) => Some(Path::new(c).join(l)),
        (None, Some(l)) => Some(PathBuf::from(l)),
        (Some(c), None) => Some(PathBuf::from(c)),
        (None, None) => None,
    }
}

/// Which kind of step to run.
#[derive(Clone, Copy)]
pub(super) enum Mode {
    /// The next role of an idle thread.
    Next,
    /// The suspended role, with the resume instruction.
    ResumeSuspended,
    /// The first role after an end node.
    ResumeEnded,
}

/// What a step left, and the thread's record as the step's own commit
/// wrote it (`None` when the step ran a fan-out or a child workflow, whose
/// records other writes may have changed since): the driver steps on from
/// it without reading the record back ([`Engine::step_thread_from`]).
pub(super) type Stepped = (StepResult, Option<ThreadRecord>);

impl Engine {
    pub(super) fn need_thread(&self, id: ThreadId) -> Result<ThreadRecord, EngineError> {
        Ok(self
            .threads()
            .get(id)?
            .ok_or_else(|| ThreadError::Unknown(id.to_string()))?)
    }

    /// Records a failed attempt and returns the error for it.
    pub(super) fn fail(&self, id: ThreadId, cause: StepFailure) -> EngineError {
        self.fail_counted(id, cause, None)
    }

    /// [`Self::fail`], adding the failed attempt's agent calls to the
    /// thread's usage.
    pub(super) fn fail_counted(
        &self,
        id: ThreadId,
        cause: StepFailure,
        usage: Option<StepUsage>,
    ) -> EngineError {
        tracing::warn!(thread = %id, error = %cause, "step failed");
        match self
            .threads()
            .low_level()
            .record_failure_counted(id, &cause.to_string(), usage)
        {
            Ok(_) => EngineError::StepFailed { thread: id, cause },
            Err(e) => e.into(),
        }
    }

    /// The task thread `record` was started with: its start node's
    /// prompt (what `thread show` prints).
    pub fn task(&self, record: &ThreadRecord) -> Result<String, EngineError> {
        Ok(self.task_of(record.start)?.0.to_string())
    }

    /// A thread's task prompt and `max_rounds`, from its start node. Start
    /// nodes are immutable, so they are cached by hash (per store).
    pub(super) fn task_of(&self, start: Hash) -> Result<(Arc<str>, u32), EngineError> {
        let cache = &self.engine_state().tasks;
        if let Some(hit) = cache.get(&start) {
            return Ok(hit);
        }
        let s = self.start_node(start)?;
        let found = (Arc::from(self.text(&s.prompt)?), s.max_rounds);
        cache.insert(start, found.clone());
        Ok(found)
    }

    /// A thread's start node; a blob that is missing or not a start node is
    /// an error.
    pub(super) fn start_node(&self, start: Hash) -> Result<crate::node::StartNode, EngineError> {
        match self.store.get(&start)? {
            Some(Blob::Start(s)) => Ok(s),
            Some(_) => Err(ThreadError::WrongKind {
                hash: start,
                expected: "start",
            }
            .into()),
            None => Err(ThreadError::MissingNode { hash: start }.into()),
        }
    }

    /// The text of a content blob; a blob that is missing or not content
    /// is an error, never an empty text.
    pub(super) fn text(&self, h: &Hash) -> Result<String, EngineError> {
        let cache = &self.engine_state().texts;
        if let Some(text) = cache.get(h) {
            return Ok(text.to_string());
        }
        let text = self.threads().content_text(h)?;
        self.remember_text(*h, &text);
        Ok(text)
    }

    /// Keeps a content blob's text for [`Self::text`] (a short one: see
    /// `TEXT_CACHE_MAX`). Keyed by the blob's hash, so never stale.
    fn remember_text(&self, h: Hash, text: &str) {
        if text.len() <= super::state::TEXT_CACHE_MAX {
            self.engine_state().texts.insert(h, Arc::from(text));
        }
    }

    /// Remembers the texts of a step this driver is about to write (its
    /// reply and instruction), which the next step's prompt shows.
    fn remember_step_texts(&self, step: &StepWrite) {
        let blobs = [
            crate::Blob::content(step.reply.as_str(), step.artifacts.iter().copied()),
            crate::Blob::content(step.instruction.as_str(), []),
        ];
        for (blob, text) in blobs.iter().zip([&step.reply, &step.instruction]) {
            if text.len() <= super::state::TEXT_CACHE_MAX
                && let Ok(encoded) = blob.encode()
            {
                self.remember_text(encoded.hash(), text);
            }
        }
    }

    /// Agent-answered role steps on the chain (steps of `workflow:` roles,
    /// which carry `child_thread`, and end nodes do not count).
    pub(super) fn answered_steps(&self, id: ThreadId) -> Result<usize, EngineError> {
        let mut n = 0;
        let mut before = None;
        loop {
            let page = self.threads().log(id, 1024, before)?;
            n += page
                .iter()
                .filter(|e| {
                    e.node.role != END_ROLE
                        && e.node.child_thread.is_none()
                        && !e.node.meta.contains_key(crate::thread::JOIN_META)
                })
                .count();
            match page.last() {
                Some(last) if page.len() == 1024 => before = Some(last.hash),
                _ => return Ok(n),
            }
        }
    }

    /// One role step, in an `invoke_agent` span (`crate::telemetry`), and
    /// the record it committed ([`Stepped`]).
    pub(super) fn run_step(
        &self,
        record: &ThreadRecord,
        role: &str,
        instruction: &str,
        mode: Mode,
        agent: &mut dyn Agent,
        cancel: &Cancel,
    ) -> Result<Stepped, EngineError> {
        let span = crate::telemetry::agent_span(record.id, role);
        let result =
            span.in_scope(|| self.run_step_here(record, role, instruction, mode, agent, cancel));
        if !span.is_disabled() {
            match &result {
                Ok((r, _)) => {
                    if let Some(next) = &r.current_role {
                        span.record("uwf.next_role", next.as_str());
                    }
                }
                Err(e) => crate::telemetry::record_error(&span, e.into()),
            }
        }
        result
    }

    /// [`Self::run_step`] inside its span.
    fn run_step_here(
        &self,
        record: &ThreadRecord,
        role: &str,
        instruction: &str,
        mode: Mode,
        agent: &mut dyn Agent,
        cancel: &Cancel,
    ) -> Result<Stepped, EngineError> {
        let id = record.id;
        let wf = self.store.workflows().load(record.workflow_hash)?;
        let Some(role_def) = wf.roles.get(role) else {
            return Err(self.fail(
                id,
                StepFailure::UnknownRole {
                    role: role.to_owned(),
                    workflow: wf.name.clone(),
                },
            ));
        };
        if role_def.runs_children() && matches!(mode, Mode::ResumeEnded) {
            // A role that runs children cannot be re-run on an ended thread:
            // its children belong to the run that ended.
            return Err(self.fail(
                id,
                StepFailure::ChildOnResumedEnd {
                    role: role.to_owned(),
                },
            ));
        }
        if let Some(fan) = &role_def.fan_out {
            return self
                .run_fan_out_step(record, role, instruction, fan, &wf, None, (agent, cancel))
                .map(|r| (r, None));
        }
        if let Some(child_workflow) = &role_def.workflow {
            return self
                .run_child_step(
                    record,
                    role,
                    instruction,
                    child_workflow,
                    &wf,
                    (agent, cancel),
                )
                .map(|r| (r, None));
        }
        let (location, dir) = self.step_location(record, role, &wf, mode)?;
        let (task, max_rounds) = self.task_of(record.start)?;
        let context = self.threads().context_of(record, RECENT_STEPS + 1)?;
        let header = self.role_header_of(record.workflow_hash, role, role_def);
        // A child workflow's agent is told whom it works for (§8e); a
        // top-level thread's prompt is unchanged.
        // (`parent_context` answers `None` at once for a top-level thread.)
        let task = match self.parent_section(record)? {
            Some(section) => Arc::from(format!("{task}\n\n{}", section.trim())),
            None => task,
        };
        let prompt = assemble_with_header(
            &header,
            role,
            &task,
            &context,
            &|h| self.text(h),
            instruction,
        )?;

        let policy = agent.retry().apply(wf.retry_of(role));
        let (answered, usage, attempts) = self.ask(
            record,
            (role, role_def, &wf.name, &*policy),
            instruction,
            &prompt,
            dir.as_deref(),
            (agent, cancel),
        )?;
        let Answered {
            extracted,
            prompt: sent,
            stderr,
        } = answered;
        crate::telemetry::record_usage(&usage, attempts.len());
        crate::telemetry::record_content(&sent, &extracted.body);
        let route = match wf.route_in(
            Some(&self.engine_state().templates),
            role,
            &extracted.meta,
            &extracted.body,
        ) {
            Ok(r) => r,
            Err(e) => return Err(self.fail(id, StepFailure::Route(e))),
        };
        let span = tracing::Span::current();
        if !span.is_disabled() {
            span.record(
                "uwf.status",
                crate::workflow::status_of(&extracted.meta).as_str(),
            );
        }
        let rounds = match mode {
            Mode::ResumeEnded => 1,
            _ => record.rounds() + 1,
        };
        let after = with_max_rounds(route, rounds, max_rounds);
        let mut meta = extracted.meta;
        // The exact prompt and the agent's stderr, kept with the step
        // (`kept`); an agent's own keys of those names are dropped, so
        // they always name what the engine kept.
        meta.remove(super::kept::PROMPT_META);
        meta.remove(super::kept::STDERR_META);
        let (kept, named) =
            super::kept::kept_blobs(&sent, &header, stderr.as_deref(), self.keep_prompts()?)?;
        meta.extend(named);
        // What the step's calls cost, kept with the step (crate::usage).
        meta.insert(USAGE_META.to_owned(), usage.to_value());
        if !attempts.is_empty() {
            // The failed attempts before the one that answered (SPEC §13).
            meta.insert(
                super::retry::ATTEMPTS_META.to_owned(),
                crate::node::Value::Array(attempts.iter().map(|a| a.to_value()).collect()),
            );
        }
        if let (Some(dir), Some(_)) = (&dir, &location) {
            // Where the agent worked, kept with the step (SPEC §4).
            meta.insert(
                super::drive::CWD_META.to_owned(),
                crate::node::Value::Str(dir.to_string_lossy().into_owned()),
            );
        }
        let step = StepWrite {
            role: role.to_owned(),
            meta,
            reply: extracted.body,
            artifacts: extracted.artifacts,
            instruction: instruction.to_owned(),
            child_thread: None,
        };
        self.remember_step_texts(&step);
        let written = self.threads().low_level().append_step_kept(
            id,
            record.head,
            record.start,
            kept,
            step,
            after,
            matches!(mode, Mode::ResumeEnded),
        );
        let written = match written {
            Ok(w) => w,
            Err(ThreadError::Store(crate::store::StoreError::MissingRef { missing, .. })) => {
                return Err(self.fail(
                    id,
                    StepFailure::MissingArtifact {
                        role: role.to_owned(),
                        missing,
                    },
                ));
            }
            Err(e) => return Err(e.into()),
        };
        tracing::debug!(
            thread = %id,
            role,
            seq = written.record.seq,
            status = %written.record.status,
            "step committed"
        );
        if self.maybe_compact(&wf, &written.record, agent, cancel)? {
            let latest = self.threads().get(id)?.unwrap_or(written.record);
            return Ok((StepResult::of(&latest), Some(latest)));
        }
        Ok((StepResult::of(&written.record), Some(written.record)))
    }

    /// Where the step's agent works: the edge's location (resolved against
    /// the thread's directory), which must exist; the step fails, with
    /// nothing committed, when it does not. Returns the location as
    /// rendered and the directory.
    fn step_location(
        &self,
        record: &ThreadRecord,
        role: &str,
        wf: &crate::workflow::Workflow,
        mode: Mode,
    ) -> Result<(Option<String>, Option<std::path::PathBuf>), EngineError> {
        let location = match mode {
            Mode::Next => record.next_location.clone(),
            Mode::ResumeEnded => {
                wf.start_location_in(Some(&self.engine_state().templates), true)?
            }
            Mode::ResumeSuspended => None,
        };
        let dir = step_dir(record.cwd.as_deref(), location.as_deref());
        if let Some(dir) = &dir
            && !dir.is_dir()
        {
            let what = if location.is_some() {
                format!("the location of the edge into role '{role}'")
            } else {
                "the thread's working directory".to_owned()
            };
            return Err(self.fail(
                record.id,
                StepFailure::MissingDirectory {
                    dir: dir.clone(),
                    what,
                },
            ));
        }
        Ok((location, dir))
    }

    /// Calls the agent, and again with the problem when its reply is
    /// invalid (up to [`Agent::reasks`] times): the reply's parts, what
    /// every call cost, and the failed attempts before the one that
    /// answered. A failed attempt the retry `policy` covers is made again
    /// after its backoff; a failed call or a reply still invalid otherwise
    /// fails the step (recorded with its cost); a call killed by the token
    /// is [`EngineError::Interrupted`], nothing recorded.
    fn ask(
        &self,
        record: &ThreadRecord,
        (role, role_def, workflow, policy): (&str, &crate::workflow::Role, &str, &RetryPolicy),
        instruction: &str,
        prompt: &str,
        dir: Option<&std::path::Path>,
        (agent, cancel): Driver<'_>,
    ) -> Result<(Answered, StepUsage, Vec<FailedAttempt>), EngineError> {
        let id = record.id;
        let answered = match (agent.needs_step_count(), record.agent_steps) {
            (false, _) => 0,
            (true, Some(n)) => usize::try_from(n).unwrap_or(usize::MAX),
            (true, None) => self.answered_steps(id)?,
        };
        // Every call of this step: each attempt's answer and re-asks.
        let mut usage = StepUsage::default();
        let mut failed: Vec<FailedAttempt> = Vec::new();
        let mut attempt: u32 = 1;
        loop {
            let started = crate::store::now_ms();
            let mut this = StepUsage::default();
            let outcome = self.attempt(
                record,
                (role, role_def, workflow),
                (instruction, prompt, dir, answered),
                (&mut *agent, cancel),
                &mut this,
            );
            usage.add(&this);
            let (cause, failure) = match outcome {
                Ok(extracted) => return Ok((extracted, usage, failed)),
                Err(AttemptError::Interrupted) => return Err(EngineError::Interrupted),
                Err(AttemptError::Failed(cause, failure)) => (cause, failure),
            };
            let retried = cause.is_some_and(|c| policy.retries(c, attempt));
            let (Some(cause), true) = (cause, retried) else {
                let failure = super::retry::after_attempts(failure, &failed);
                return Err(self.fail_counted(id, failure, Some(usage)));
            };
            let delay = policy.delay(attempt, super::retry::jitter(id, attempt));
            tracing::info!(
                thread = %id,
                role,
                attempt,
                cause = cause.as_str(),
                delay_ms = delay.as_millis() as u64,
                error = %failure,
                "attempt failed; trying again"
            );
            failed.push(FailedAttempt {
                at_ms: started,
                cause,
                error: super::retry::short_error(&failure.to_string()),
                usage: this,
                delay_ms: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            });
            if !super::retry::wait(cancel, delay) {
                if cancel.is_cancelled() {
                    return Err(EngineError::Interrupted);
                }
                // Asked to stop after the step in flight: no more tries.
                let earlier = failed.split_last().map_or(&[][..], |(_, rest)| rest);
                let failure = super::retry::after_attempts(failure, earlier);
                return Err(self.fail_counted(id, failure, Some(usage)));
            }
            attempt += 1;
        }
    }

    /// One attempt of a step: the call, and its re-asks while the reply is
    /// invalid. The calls made are added to `usage`.
    fn attempt(
        &self,
        record: &ThreadRecord,
        (role, role_def, workflow): (&str, &crate::workflow::Role, &str),
        (instruction, prompt, dir, answered): (&str, &str, Option<&std::path::Path>, usize),
        (agent, cancel): Driver<'_>,
        usage: &mut StepUsage,
    ) -> Result<Answered, AttemptError> {
        let id = record.id;
        let mut ask = prompt.to_owned();
        let mut reasked = 0;
        loop {
            let request = AgentRequest {
                thread: id,
                workflow,
                role_name: role,
                role: role_def,
                instruction,
                prompt: &ask,
                answered_steps: answered,
                summary_index: None,
                cwd: dir,
                cancel,
            };
            let called = Instant::now();
            let reply = agent.call(&request);
            let wall_ms = u64::try_from(called.elapsed().as_millis()).unwrap_or(u64::MAX);
            let reply = match reply {
                Ok(r) => r,
                // Killed by Ctrl-C: not the agent's failure; nothing is
                // recorded and the thread stays retryable.
                Err(_) if cancel.is_cancelled() => return Err(AttemptError::Interrupted),
                Err(e) => {
                    // An agent CLI that reports an error may say what the
                    // failed call cost: it is counted all the same.
                    let reported = match &e {
                        super::agent::AgentError::Reported { usage, .. } => usage.as_deref(),
                        _ => None,
                    };
                    usage.add_call(wall_ms, reported);
                    let cause = super::retry::cause_of(&e);
                    let failure = StepFailure::Agent {
                        role: role.to_owned(),
                        source: e,
                    };
                    return Err(AttemptError::Failed(cause, failure));
                }
            };
            let extracted = extract_with(
                &self.engine_state().validators,
                Some((record.workflow_hash, role)),
                role_def,
                &reply.output,
            );
            let reported = match (&reply.usage, &extracted) {
                (Some(u), _) => Some(u.clone()),
                (None, Ok(x)) => x.usage.clone(),
                (None, Err(_)) => reported_usage(&reply.output),
            };
            usage.add_call(wall_ms, reported.as_ref());
            match extracted {
                Ok(x) => {
                    return Ok(Answered {
                        extracted: x,
                        prompt: ask,
                        stderr: reply.stderr,
                    });
                }
                Err(e) if reasked < agent.reasks() => {
                    reasked += 1;
                    ask = format!(
                        "{prompt}\n## Your previous reply was invalid\n{e}\nAnswer again, following the output format.\n"
                    );
                }
                Err(e) => {
                    let failure = StepFailure::InvalidReply {
                        role: role.to_owned(),
                        source: e,
                    };
                    return Err(AttemptError::Failed(Some(RetryOn::InvalidReply), failure));
                }
            }
        }
    }
}

/// An attempt's accepted reply, with the exact prompt of the call that
/// gave it (re-asks add to the step's prompt) and what the agent said on
/// stderr.
struct Answered {
    extracted: super::extract::Extracted,
    prompt: String,
    stderr: Option<String>,
}

/// Why an attempt gave no reply.
enum AttemptError {
    /// The token was cancelled: nothing is recorded.
    Interrupted,
    /// The attempt failed; the cause says whether a policy may retry it.
    Failed(Option<RetryOn>, StepFailure),
}

/// The agent and the token a drive runs with.
pub(super) type Driver<'a> = (&'a mut dyn Agent, &'a Cancel);
impl Engine {
    /// The role-only part of a stored workflow's role prompt (see
    /// [`role_header`]), cached per store by workflow hash and role: stored
    /// workflows never change.
    pub(super) fn role_header_of(
        &self,
        workflow: Hash,
        role_name: &str,
        role: &crate::workflow::Role,
    ) -> Arc<str> {
        let cache = &self.engine_state().headers;
        if let Some(h) = cache.lock().get(&workflow).and_then(|m| m.get(role_name)) {
            return Arc::clone(h);
        }
        let h: Arc<str> = Arc::from(role_header(role_name, role, &output_format(role)));
        let mut map = cache.lock();
        if map.len() >= cache.capacity() {
            map.clear();
        }
        map.entry(workflow)
            .or_default()
            .insert(role_name.to_owned(), Arc::clone(&h));
        h
    }
}

/// What follows a routed step, with `maxRounds` applied: the step that
/// reaches the limit is committed; `$END` or `$SUSPEND` wins, otherwise the
/// same transaction ends the thread with return code 1.
pub(super) fn with_max_rounds(next: Next, rounds: u64, max_rounds: u32) -> Next {
    match next {
        Next::Role { .. } if rounds >= u64::from(max_rounds) => Next::End(EndSpec {
            return_code: 1,
            summary: format!("maxRounds ({max_rounds}) reached"),
            prompt: format!("Stopped: maxRounds ({max_rounds}) reached"),
        }),
        other => other,
    }
}

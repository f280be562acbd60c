//! Child workflows: a `workflow: NAME` role runs a whole child thread
//! (the Merkle call stack), driven with the parent's agent; the parent's
//! step is written when the child ends, and a child that suspends suspends
//! its parent (`docs/design.md` §5c).

use super::drive::StepResult;
use super::step::{Driver, with_max_rounds};
use super::{Engine, EngineError, StepFailure};
use crate::node::Blob;
use crate::thread::{NewThread, StepWrite, ThreadId, ThreadRecord, ThreadStatus};
use crate::workflow::Workflow;

/// Deepest child-workflow nesting (a top-level thread has depth 0).
pub const MAX_DEPTH: u32 = 3;

impl Engine {
    /// A step of a `workflow:` role: runs (or continues) the child thread
    /// with the same agent; the parent's step is written when it ends.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_child_step(
        &self,
        record: &ThreadRecord,
        role: &str,
        instruction: &str,
        child_workflow: &str,
        wf: &Workflow,
        driver: Driver<'_>,
    ) -> Result<StepResult, EngineError> {
        let id = record.id;
        let child = match record.active_child {
            Some(c) => c,
            None => {
                let depth = self.start_node(record.start)?.depth + 1;
                if depth > MAX_DEPTH {
                    return Err(self.fail(
                        id,
                        StepFailure::TooDeep {
                            role: role.to_owned(),
                            workflow: child_workflow.to_owned(),
                            depth,
                            limit: MAX_DEPTH,
                        },
                    ));
                }
                let Some((hash, child_wf)) = self.store.workflows().by_name(child_workflow)? else {
                    return Err(self.fail(
                        id,
                        StepFailure::ChildNotRegistered {
                            workflow: child_workflow.to_owned(),
                            role: role.to_owned(),
                        },
                    ));
                };
                let templates = Some(&self.engine_state().templates);
                let (first_role, first_instruction) = child_wf.first_in(templates)?;
                let next_location = child_wf.start_location_in(templates, false)?;
                // The child works where this step would have: the edge's
                // location, resolved against this thread's directory.
                let cwd =
                    super::step::step_dir(record.cwd.as_deref(), record.next_location.as_deref())
                        .map(|d| d.to_string_lossy().into_owned());
                let c = self.threads().low_level().start_thread(NewThread {
                    workflow: child_wf.name.clone(),
                    workflow_hash: hash,
                    prompt: instruction.to_owned(),
                    max_rounds: child_wf.max_rounds,
                    depth,
                    parent_state: Some(record.head),
                    parent_thread: Some(id),
                    next_role: first_role,
                    next_instruction: first_instruction,
                    agent: record.agent.clone(),
                    cwd,
                    next_location,
                    labels: record.labels.clone(),
                })?;
                let child = c.id;
                self.threads().low_level().update_record(id, move |r| {
                    r.active_child = Some(child);
                    Ok(())
                })?;
                c.id
            }
        };
        let latest = self.need_thread(id)?;
        self.finish_child(&latest, role, instruction, child, wf, driver, None)
    }

    /// Drives the child (resuming it first when `resume` is given) until it
    /// ends or suspends. Ended: the parent's step is written (`done` when the
    /// child completed, else `failed`; the child's end summary; its end node
    /// as `child_thread`). Suspended: the parent is suspended too, with the
    /// child's message, and no parent step is written.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish_child(
        &self,
        record: &ThreadRecord,
        role: &str,
        instruction: &str,
        child: ThreadId,
        wf: &Workflow,
        (agent, cancel): Driver<'_>,
        resume: Option<Option<&str>>,
    ) -> Result<StepResult, EngineError> {
        let id = record.id;
        let child_failed = |e: EngineError| {
            self.fail(
                id,
                StepFailure::Child {
                    child,
                    source: Box::new(e),
                },
            )
        };
        if let Some(text) = resume
            && let Err(e) = self.resume_inner(child, text, agent, cancel)
        {
            return Err(child_failed(e));
        }
        if self.need_thread(child)?.underlying_status() == ThreadStatus::Idle {
            let outcome = self.run_thread(child, None, usize::MAX, agent, cancel);
            if let Some(e) = outcome.error {
                return Err(child_failed(e));
            }
        }
        let c = self.need_thread(child)?;
        match c.underlying_status() {
            ThreadStatus::Suspended => {
                let message = c.suspend_message.clone().unwrap_or_default();
                let role = role.to_owned();
                let r = self.threads().low_level().update_record(id, move |r| {
                    // A suspend ends the drive: release the claim in this
                    // same commit, as a suspending step does.
                    r.status = ThreadStatus::Suspended;
                    r.claimed_status = None;
                    r.suspended_role = Some(role.clone());
                    r.suspend_message = Some(message.clone());
                    r.active_child = Some(child);
                    Ok(())
                })?;
                Ok(StepResult::of(&r))
            }
            done if done.is_done() => {
                let status = if done == ThreadStatus::Completed {
                    "done"
                } else {
                    "failed"
                };
                let summary = match self.store.get(&c.head)? {
                    Some(Blob::State(s)) => self.text(&s.content)?,
                    _ => String::new(),
                };
                let meta = std::collections::BTreeMap::from([(
                    "$status".to_owned(),
                    crate::node::Value::Str(status.into()),
                )]);
                let step = StepWrite {
                    role: role.to_owned(),
                    meta,
                    reply: summary,
                    artifacts: Vec::new(),
                    instruction: instruction.to_owned(),
                    child_thread: Some(c.head),
                };
                self.write_children_step(record, wf, step, (agent, cancel))
            }
            other => Err(self.fail(
                id,
                StepFailure::ChildStopped {
                    child,
                    status: other,
                },
            )),
        }
    }
}

impl Engine {
    /// Writes the step of a role that ran children (`workflow:`, fan-out):
    /// routed on its `meta` and `reply`, `maxRounds` applied, appended at
    /// the thread's latest head, compacted when due.
    pub(super) fn write_children_step(
        &self,
        record: &ThreadRecord,
        wf: &Workflow,
        step: StepWrite,
        (agent, cancel): Driver<'_>,
    ) -> Result<StepResult, EngineError> {
        let id = record.id;
        let route = match wf.route_in(
            Some(&self.engine_state().templates),
            &step.role,
            &step.meta,
            &step.reply,
        ) {
            Ok(r) => r,
            Err(e) => return Err(self.fail(id, StepFailure::Route(e))),
        };
        let (_, max_rounds) = self.task_of(record.start)?;
        let after = with_max_rounds(route, record.rounds() + 1, max_rounds);
        let latest = self.need_thread(id)?;
        let w = self
            .threads()
            .low_level()
            .append_step(id, latest.head, step, after)?;
        self.maybe_compact(wf, &w.record, agent, cancel)?;
        Ok(StepResult::of(&self.threads().get(id)?.unwrap_or(w.record)))
    }
}

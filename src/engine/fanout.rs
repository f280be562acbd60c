//! Fan-out roles (SPEC §13; `docs/design.md` §5f): a `foreach:` or
//! `parallel:` role starts its children in one transaction, drives them
//! concurrently (each driver with its own agent, from [`Agent::fork`]), and
//! joins them into the role's step: its content refers to every child's
//! end node and its `results` list them in item order.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};

use super::agent::Agent;
use super::cancel::Cancel;
use super::drive::StepResult;
use super::step::Driver;
use super::{Engine, EngineError, StepFailure};
use crate::hash::Hash;
use crate::node::{Blob, Value};
use crate::thread::{JOIN_META, NewThread, StepWrite, ThreadId, ThreadRecord, ThreadStatus};
use crate::workflow::{FanOut, Workflow};

/// Longest child summary kept in a join's `results` (the body has them
/// whole): 1 KiB.
const RESULT_SUMMARY: usize = 1 << 10;

/// How often the drivers of a fan-out read the parent's record for a stop
/// request.
const STOP_CHECK: std::time::Duration = std::time::Duration::from_millis(50);

/// Children made in one transaction after the first chunk (which is as
/// large as the drivers).
const MAKE_CHUNK: usize = 256;

/// How many waiting children a suspended parent's message names.
const NAMED_WAITING: usize = 5;

/// Where a child stands at the join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    /// It ended `completed`.
    Done,
    /// It ended `failed` or `cancelled`.
    Ended,
    /// Its drive stopped with an error (recorded on it): a retry may mend it.
    Errored,
    /// It waits for a human.
    Waiting,
    /// Not started, or stopped between steps.
    Pending,
}

fn standing(r: &ThreadRecord) -> Standing {
    match r.underlying_status() {
        ThreadStatus::Completed => Standing::Done,
        ThreadStatus::Failed | ThreadStatus::Cancelled => Standing::Ended,
        ThreadStatus::Suspended => Standing::Waiting,
        _ if r.last_error.is_some() => Standing::Errored,
        _ => Standing::Pending,
    }
}

/// `s` cut to `max` bytes at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or_default()
}

impl Engine {
    /// A step of a fan-out role: start the children (once), drive those not
    /// ended, join. `resume`: a suspended parent's answer, given to every
    /// suspended child first.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_fan_out_step(
        &self,
        record: &ThreadRecord,
        role: &str,
        instruction: &str,
        fan: &FanOut,
        wf: &Workflow,
        resume: Option<&str>,
        (agent, cancel): Driver<'_>,
    ) -> Result<StepResult, EngineError> {
        let named = record.fan_out.clone().unwrap_or_default();
        // The children still to make: the items past those the parent
        // names (all of them on the first drive; none once made).
        let rest = self.fan_out_news(record, role, fan, named.len())?;
        if let Some(text) = resume {
            for &child in &named {
                // A failed resume is recorded on the child; the join counts
                // it. Only an interrupt stops here.
                if self.need_thread(child)?.underlying_status() == ThreadStatus::Suspended
                    && let Err(EngineError::Interrupted) =
                        self.resume_inner(child, Some(text), agent, cancel)
                {
                    return Err(EngineError::Interrupted);
                }
            }
        }
        let children = self.drive_children(record, named, rest, fan, agent, cancel)?;
        self.join(
            record.id,
            role,
            instruction,
            fan,
            wf,
            &children,
            (agent, cancel),
        )
    }

    /// The children of a fan-out step from the previous reply, in item
    /// order, past the first `skip` (those the parent names already).
    fn fan_out_news(
        &self,
        record: &ThreadRecord,
        role: &str,
        fan: &FanOut,
        skip: usize,
    ) -> Result<Vec<NewThread>, EngineError> {
        let id = record.id;
        let depth = self.start_node(record.start)?.depth + 1;
        // The previous reply: its frontmatter and body (none when the role
        // is the first of the thread).
        let (meta, body) = match self.store.get(&record.head)? {
            Some(Blob::State(s)) => {
                let body = self.text(&s.content)?;
                (s.meta, body)
            }
            _ => (BTreeMap::new(), String::new()),
        };
        let mut data = serde_json::Map::new();
        for (k, v) in &meta {
            data.insert(k.clone(), v.to_json());
        }
        data.insert(
            crate::workflow::model::BODY_VARIABLE.to_owned(),
            serde_json::Value::String(body),
        );
        let templates = &self.engine_state().templates;
        let render = |template: &str, target: &str, data: &serde_json::Value| {
            templates.render(template, data).map_err(|source| {
                self.fail(
                    id,
                    StepFailure::Route(crate::workflow::WorkflowError::Template {
                        role: role.to_owned(),
                        target: target.to_owned(),
                        source,
                    }),
                )
            })
        };
        // (child workflow, its task) per item, in item order.
        let mut jobs: Vec<(String, String)> = Vec::new();
        if let Some(each) = &fan.foreach {
            let mut parts = each.items.split('.');
            let mut at = parts
                .next()
                .and_then(|first| data.get(first))
                .unwrap_or(&serde_json::Value::Null);
            for part in parts {
                at = at.get(part).unwrap_or(&serde_json::Value::Null);
            }
            let Some(items) = at.as_array() else {
                return Err(self.fail(
                    id,
                    StepFailure::FanOutItems {
                        role: role.to_owned(),
                        detail: format!(
                            "the previous reply's '{}' is not a list (it is {})",
                            each.items,
                            if at.is_null() {
                                "missing".to_owned()
                            } else {
                                at.to_string().chars().take(80).collect()
                            }
                        ),
                    },
                ));
            };
            if items.len() > each.max_items as usize {
                return Err(self.fail(
                    id,
                    StepFailure::FanOutItems {
                        role: role.to_owned(),
                        detail: format!(
                            "the previous reply's '{}' has {} items, more than max_items ({})",
                            each.items,
                            items.len(),
                            each.max_items
                        ),
                    },
                ));
            }
            // Each item's task sees only the variables its template uses:
            // copying the whole previous frontmatter (the list itself
            // among it) for every item would cost the square of the items.
            let used = crate::workflow::template::variables(&each.prompt).unwrap_or_default();
            let base: serde_json::Map<String, serde_json::Value> = data
                .iter()
                .filter(|(k, _)| used.contains(*k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if skip > items.len() {
                return Err(self.fail(
                    id,
                    StepFailure::FanOutItems {
                        role: role.to_owned(),
                        detail: format!(
                            "the thread names {skip} children, more than the {} items of '{}'",
                            items.len(),
                            each.items
                        ),
                    },
                ));
            }
            for (i, item) in items.iter().enumerate().skip(skip) {
                let mut d = base.clone();
                d.insert(each.as_name.clone(), item.clone());
                d.insert("index".to_owned(), serde_json::json!(i + 1));
                let task = render(&each.prompt, &each.workflow, &serde_json::Value::Object(d))?;
                jobs.push((each.workflow.clone(), task));
            }
        }
        let data = serde_json::Value::Object(data);
        for b in fan.branches.iter().skip(skip) {
            jobs.push((b.workflow.clone(), render(&b.prompt, &b.workflow, &data)?));
        }
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        if depth > super::child::MAX_DEPTH {
            return Err(self.fail(
                id,
                StepFailure::TooDeep {
                    role: role.to_owned(),
                    workflow: jobs.first().map(|j| j.0.clone()).unwrap_or_default(),
                    depth,
                    limit: super::child::MAX_DEPTH,
                },
            ));
        }
        // The children work where this step would have.
        let cwd = super::step::step_dir(record.cwd.as_deref(), record.next_location.as_deref())
            .map(|d| d.to_string_lossy().into_owned());
        // Per child workflow: its hash, record and start (the same for
        // every item, worked out once).
        type Start = (
            Hash,
            std::sync::Arc<Workflow>,
            String,
            String,
            Option<String>,
        );
        let mut workflows: BTreeMap<String, Start> = BTreeMap::new();
        let mut news = Vec::with_capacity(jobs.len());
        for (name, task) in jobs {
            let (hash, child_wf, first_role, first_instruction, location) = match workflows
                .entry(name)
            {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    let Some((hash, child_wf)) = self.store.workflows().by_name(e.key())? else {
                        return Err(self.fail(
                            id,
                            StepFailure::ChildNotRegistered {
                                workflow: e.key().clone(),
                                role: role.to_owned(),
                            },
                        ));
                    };
                    let t = Some(templates);
                    let (first_role, first_instruction) = child_wf.first_in(t)?;
                    let location = child_wf.start_location_in(t, false)?;
                    e.insert((hash, child_wf, first_role, first_instruction, location))
                }
            };
            news.push(NewThread {
                workflow: child_wf.name.clone(),
                workflow_hash: *hash,
                prompt: task,
                max_rounds: child_wf.max_rounds,
                depth,
                parent_state: Some(record.head),
                parent_thread: Some(id),
                next_role: first_role.clone(),
                next_instruction: first_instruction.clone(),
                agent: record.agent.clone(),
                cwd: cwd.clone(),
                next_location: location.clone(),
                labels: record.labels.clone(),
            });
        }
        Ok(news)
    }

    /// Makes the children past `named` (`rest`, in chunks, while the first
    /// ones run) and drives the children not ended, up to `max_concurrency`
    /// at once, each driver with its own agent (`agent` and its forks).
    /// Under `fail_fast`, no child starts once more than `tolerate` failed
    /// (the rest are still made: the join names every item). Stops taking
    /// children when the token asks or the parent is asked to stop. The
    /// children, in item order, once every item has one; an interrupt, a
    /// stop before all were made, or a failure to make them is an error.
    fn drive_children(
        &self,
        parent: &ThreadRecord,
        named: Vec<ThreadId>,
        rest: Vec<NewThread>,
        fan: &FanOut,
        agent: &mut dyn Agent,
        cancel: &Cancel,
    ) -> Result<Vec<ThreadId>, EngineError> {
        let mut queue = VecDeque::new();
        let mut failed = 0usize;
        for r in self.threads().need_all(&named)? {
            match standing(&r) {
                Standing::Ended => failed += 1,
                Standing::Pending | Standing::Errored => queue.push_back(r.id),
                Standing::Done | Standing::Waiting => {}
            }
        }
        if queue.is_empty() && rest.is_empty() {
            return Ok(named);
        }
        let workers = (fan.max_concurrency as usize)
            .min(queue.len() + rest.len())
            .max(1);
        let mut forks: Vec<Box<dyn Agent>> = Vec::new();
        while forks.len() + 1 < workers {
            match agent.fork() {
                Some(a) => forks.push(a),
                None => break,
            }
        }
        let wanted = rest.len();
        // The queue, and whether children are still being made.
        let queue = Mutex::new((queue, wanted > 0));
        let arrived = Condvar::new();
        let failed = AtomicUsize::new(failed);
        let interrupted = AtomicBool::new(false);
        let stopped = AtomicBool::new(false);
        let tolerate = fan.tolerate as usize;
        let lock = || queue.lock().unwrap_or_else(PoisonError::into_inner);
        // When a driver last read the parent's record for a stop request.
        let looked: Mutex<Option<std::time::Instant>> = Mutex::new(None);
        let time_to_look = || {
            let mut last = looked.lock().unwrap_or_else(PoisonError::into_inner);
            let due = last.is_none_or(|t| t.elapsed() >= STOP_CHECK);
            if due {
                *last = Some(std::time::Instant::now());
            }
            due
        };
        let halted = || {
            cancel.is_stopping()
                || interrupted.load(Ordering::SeqCst)
                || stopped.load(Ordering::SeqCst)
        };
        // Makes the children in chunks: the first as large as the drivers
        // (every driver has a child at once), the next `MAKE_CHUNK` each.
        let make = || -> Result<Vec<ThreadId>, EngineError> {
            let mut made = Vec::with_capacity(rest.len());
            let mut rest = rest.into_iter().peekable();
            let mut size = workers;
            let result = loop {
                if rest.peek().is_none() || halted() {
                    break Ok(());
                }
                let chunk: Vec<NewThread> = rest.by_ref().take(size).collect();
                size = MAKE_CHUNK;
                match self.threads().low_level().start_children(
                    parent.id,
                    parent.head,
                    named.len() + made.len(),
                    chunk,
                ) {
                    Ok(records) => {
                        let ids: Vec<ThreadId> = records.iter().map(|r| r.id).collect();
                        made.extend_from_slice(&ids);
                        lock().0.extend(ids);
                        arrived.notify_all();
                    }
                    Err(e) => break Err(e.into()),
                }
            };
            lock().1 = false;
            arrived.notify_all();
            result.map(|()| made)
        };
        let work = |agent: &mut dyn Agent| loop {
            if halted() || (fan.fail_fast && failed.load(Ordering::SeqCst) > tolerate) {
                return;
            }
            // `thread stop` of the parent: take no new child. (It reaches
            // the running children too, whose drives then stop; the
            // parent's record, which names every child, is read at most
            // every `STOP_CHECK`, not before each child.)
            if time_to_look()
                && self
                    .threads()
                    .get(parent.id)
                    .ok()
                    .flatten()
                    .is_some_and(|r| r.stop_requested_at.is_some())
            {
                stopped.store(true, Ordering::SeqCst);
                return;
            }
            let next = {
                let mut q = lock();
                loop {
                    if let Some(c) = q.0.pop_front() {
                        break Some(c);
                    }
                    if !q.1 || halted() {
                        break None;
                    }
                    // Waiting for the next chunk (woken at the latest in
                    // `STOP_CHECK` to look for a stop).
                    q = arrived
                        .wait_timeout(q, STOP_CHECK)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            };
            let Some(child) = next else { return };
            let report = self.run_thread(child, None, usize::MAX, agent, cancel);
            match &report.error {
                Some(EngineError::Interrupted) => {
                    interrupted.store(true, Ordering::SeqCst);
                    return;
                }
                Some(_) => {
                    failed.fetch_add(1, Ordering::SeqCst);
                }
                None => {
                    let ended_badly = report.results.last().is_some_and(|r| {
                        matches!(r.status, ThreadStatus::Failed | ThreadStatus::Cancelled)
                    });
                    if ended_badly {
                        failed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
            if report.stopped_by_request {
                stopped.store(true, Ordering::SeqCst);
            }
        };
        // Children driven on worker threads stay children of this step's
        // span (`crate::telemetry`).
        let span = tracing::Span::current();
        let made = std::thread::scope(|s| {
            let work = &work;
            let maker = s.spawn(make);
            for a in forks.iter_mut() {
                let a: &mut dyn Agent = a.as_mut();
                let span = span.clone();
                s.spawn(move || span.in_scope(|| work(a)));
            }
            work(agent);
            maker.join()
        });
        if interrupted.load(Ordering::SeqCst) {
            return Err(EngineError::Interrupted);
        }
        let made = match made {
            Ok(made) => made?,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        if made.len() < wanted {
            // Stopped before every item had its child: the parent names a
            // prefix, and the next drive makes the rest.
            return Err(EngineError::FanOutStopped { thread: parent.id });
        }
        let mut children = named;
        children.extend(made);
        Ok(children)
    }

    /// The join: the role's step from the children's ends, or a suspend of
    /// the parent while children wait, or a step failure a retry may mend.
    #[allow(clippy::too_many_arguments)]
    fn join(
        &self,
        id: ThreadId,
        role: &str,
        instruction: &str,
        fan: &FanOut,
        wf: &Workflow,
        children: &[ThreadId],
        (agent, cancel): Driver<'_>,
    ) -> Result<StepResult, EngineError> {
        let parent = self.need_thread(id)?;
        let mut records = self.threads().need_all(children)?;
        let count = |s: Standing| records.iter().filter(|r| standing(r) == s).count();
        let (ended, errored, waiting, pending) = (
            count(Standing::Ended),
            count(Standing::Errored),
            count(Standing::Waiting),
            count(Standing::Pending),
        );
        let failures = ended + errored;
        let tolerate = fan.tolerate as usize;
        let stopped = cancel.is_stopping() || parent.stop_requested_at.is_some();
        // The join cannot be written yet: record why on the parent.
        let not_yet = |child: ThreadId, error: String| {
            self.fail(
                id,
                StepFailure::FanOut {
                    role: role.to_owned(),
                    failed: failures,
                    tolerate: fan.tolerate,
                    child,
                    error,
                },
            )
        };
        if failures > tolerate && errored > 0 {
            // A retry may mend the errored children: nothing is committed,
            // and the next drive goes on with the same children.
            let first = records
                .iter()
                .find(|r| standing(r) == Standing::Errored)
                .map(|r| (r.id, r.last_error.clone().unwrap_or_default()));
            let (child, error) = first.unwrap_or((id, String::new()));
            return Err(not_yet(child, error));
        }
        if failures <= tolerate && pending > 0 {
            if stopped {
                return Err(EngineError::FanOutStopped { thread: id });
            }
            let child = records
                .iter()
                .find(|r| standing(r) == Standing::Pending)
                .map_or(id, |r| r.id);
            return Err(not_yet(
                child,
                "another driver holds this child; drive the parent again when it is done"
                    .to_owned(),
            ));
        }
        if failures <= tolerate && waiting > 0 {
            return self.suspend_for_children(id, role, &records);
        }
        // The join commits: no child is left to be driven later.
        for r in &mut records {
            if matches!(
                standing(r),
                Standing::Errored | Standing::Pending | Standing::Waiting
            ) {
                let force = super::CancelOptions { force: true };
                self.cancel_thread(r.id, &force)?;
                *r = self.need_thread(r.id)?;
            }
        }
        let status = if failures <= tolerate {
            "done"
        } else {
            "failed"
        };
        self.write_join(
            &parent,
            role,
            instruction,
            fan,
            wf,
            &records,
            status,
            (agent, cancel),
        )
    }

    /// Suspends the parent while children wait for a human: its message
    /// names them (each may be resumed directly, or the parent's resume
    /// answers them all).
    fn suspend_for_children(
        &self,
        id: ThreadId,
        role: &str,
        records: &[ThreadRecord],
    ) -> Result<StepResult, EngineError> {
        let waiting: Vec<&ThreadRecord> = records
            .iter()
            .filter(|r| standing(r) == Standing::Waiting)
            .collect();
        let mut message = format!(
            "{} of {} children wait for a human's answer (resume each with `uwf-db thread resume CHILD -p …`, or this thread to answer them all):",
            waiting.len(),
            records.len()
        );
        for r in waiting.iter().take(NAMED_WAITING) {
            message.push_str(&format!(
                "\n- {}: {}",
                r.id,
                cut(r.suspend_message.as_deref().unwrap_or_default(), 500)
            ));
        }
        if waiting.len() > NAMED_WAITING {
            message.push_str(&format!("\n- and {} more", waiting.len() - NAMED_WAITING));
        }
        let role = role.to_owned();
        let r = self.threads().low_level().update_record(id, move |r| {
            // A suspend ends the drive: the claim goes in this commit.
            r.status = ThreadStatus::Suspended;
            r.claimed_status = None;
            r.suspended_role = Some(role.clone());
            r.suspend_message = Some(message.clone());
            Ok(())
        })?;
        Ok(StepResult::of(&r))
    }

    /// Writes the join step: `$status`, `results`, the counts, the
    /// children's ends (`$children`, and the content's refs), the summaries
    /// as the body; routed like any reply.
    #[allow(clippy::too_many_arguments)]
    fn write_join(
        &self,
        parent: &ThreadRecord,
        role: &str,
        instruction: &str,
        fan: &FanOut,
        wf: &Workflow,
        children: &[ThreadRecord],
        status: &str,
        (agent, cancel): Driver<'_>,
    ) -> Result<StepResult, EngineError> {
        let mut results = Vec::with_capacity(children.len());
        let mut ends = Vec::with_capacity(children.len());
        let mut body = String::new();
        let (mut completed, mut failed) = (0u64, 0u64);
        let summaries = self.threads().head_texts(children)?;
        for (i, (r, summary)) in children.iter().zip(summaries).enumerate() {
            let c = r.id;
            if r.status == ThreadStatus::Completed {
                completed += 1;
            } else {
                failed += 1;
            }
            let key = fan.branches.get(i).map(|b| b.key.clone());
            let title = key.clone().unwrap_or_else(|| format!("item {}", i + 1));
            body.push_str(&format!(
                "## {}. {title} ({})\n{}\n\n",
                i + 1,
                r.status,
                summary.trim_end()
            ));
            results.push(Value::Map(BTreeMap::from([
                ("index".to_owned(), Value::UInt(i as u64 + 1)),
                ("key".to_owned(), key.map_or(Value::Null, Value::Str)),
                ("status".to_owned(), Value::Str(r.status.to_string())),
                (
                    "summary".to_owned(),
                    Value::Str(cut(&summary, RESULT_SUMMARY).to_owned()),
                ),
                ("thread".to_owned(), Value::Str(c.to_string())),
            ])));
            ends.push(r.head);
        }
        let meta = BTreeMap::from([
            ("$status".to_owned(), Value::Str(status.to_owned())),
            ("results".to_owned(), Value::Array(results)),
            ("completed".to_owned(), Value::UInt(completed)),
            ("failed".to_owned(), Value::UInt(failed)),
            ("total".to_owned(), Value::UInt(children.len() as u64)),
            (
                JOIN_META.to_owned(),
                Value::Array(ends.iter().map(|h| Value::Str(h.to_string())).collect()),
            ),
        ]);
        let step = StepWrite {
            role: role.to_owned(),
            meta,
            reply: body,
            artifacts: ends,
            instruction: instruction.to_owned(),
            child_thread: None,
        };
        self.write_children_step(parent, wf, step, (agent, cancel))
    }
}

//! Following a store as other processes (or machines) commit to it (SPEC
//! §11; `docs/design.md` §7d): the steps of one thread, or the status
//! changes of many.
//!
//! Change is detected by polling one snapshot read every [`POLL`]: for a
//! thread, its record (its `seq` says whether steps were committed); for
//! a listing, the newest stretch of the `activity` index (or a label's
//! run). Between polls the caller's thread sleeps on its [`Cancel`]
//! token, so an idle watcher costs one small read per poll and no busy
//! loop, on every backend alike, and cancelling the token ends the watch
//! at once.

use super::Engine;
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::time::Duration;

use super::EngineError;
use super::cancel::Cancel;
use crate::thread::{LogEntry, ThreadId, ThreadQuery, ThreadRecord, ThreadStatus};

/// How often a watcher reads the store: a commit shows within this (plus
/// the read), well inside SPEC §11's 100 ms.
pub const POLL: Duration = Duration::from_millis(40);

/// Steps decoded per read while catching up.
const CATCH_UP: usize = 256;

/// How far back (ms of last activity) each poll of
/// [`Engine::watch_threads`] looks behind the newest change it has seen: a
/// change whose commit becomes visible more than this after the timestamp
/// taken inside it (a writer's clock that far behind, or a commit that
/// slow) is missed.
pub const WINDOW_MS: u64 = 10_000;

/// Most threads one poll of [`Engine::watch_threads`] reads.
const POLL_PAGE: usize = 10_000;

/// How a watch ended.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEnd {
    /// The thread ended or suspended, and every step was handed over: the
    /// record as last read.
    Settled(Box<ThreadRecord>),
    /// The callback asked to stop.
    Stopped,
    /// The token was cancelled.
    Cancelled,
}

impl Engine {
    /// Hands `on_step` every step of thread `id` after the one numbered
    /// `after` (0: from the first), oldest first, as they are committed,
    /// until the thread has ended or suspended and every step was handed
    /// over ([`WatchEnd::Settled`]), `on_step` breaks, or `cancel` is
    /// cancelled. Steps are numbered 1, 2, … along the chain, so a watcher
    /// restarted with the `seq` of the last step it handled misses nothing
    /// and repeats nothing. Memory stays bounded however far behind
    /// `after` is ([`Threads::steps_after`](crate::thread::Threads::steps_after) pages).
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// use std::ops::ControlFlow;
    /// use uwf_db::engine::{Cancel, watch::WatchEnd};
    /// use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
    /// struct Echo;
    /// impl Agent for Echo {
    ///     fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
    ///         Ok(format!("{} did it", req.role_name).into())
    ///     }
    /// }
    /// let (thread, _) = store.engine().run_workflow(hash, "task", &Default::default(), &mut Echo)?;
    /// // From the start (after seq 0): the step, then the end; then it has settled.
    /// let mut roles = Vec::new();
    /// let end = store.engine().watch_steps(thread.id, 0, &Cancel::new(), &mut |entry| {
    ///     roles.push(entry.node.role.clone());
    ///     Ok(ControlFlow::Continue(()))
    /// })?;
    /// assert!(matches!(end, WatchEnd::Settled(_)));
    /// assert_eq!(roles.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn watch_steps(
        &self,
        id: ThreadId,
        after: u64,
        cancel: &Cancel,
        on_step: &mut dyn FnMut(&LogEntry) -> Result<ControlFlow<()>, EngineError>,
    ) -> Result<WatchEnd, EngineError> {
        let mut cursor = after;
        loop {
            let (record, entries) = self.threads().steps_after(id, cursor, CATCH_UP)?;
            for e in &entries {
                if on_step(e)?.is_break() {
                    return Ok(WatchEnd::Stopped);
                }
                cursor = e.node.seq;
            }
            if cursor < record.seq && !entries.is_empty() {
                // More to catch up on: read on without sleeping.
                continue;
            }
            let status = record.underlying_status();
            // (A chain whose numbering has a gap below the head would give
            // no entries while `cursor < seq`: wait rather than spin.)
            if cursor >= record.seq && (status.is_done() || status == ThreadStatus::Suspended) {
                return Ok(WatchEnd::Settled(Box::new(record)));
            }
            if cancel.is_cancelled() {
                return Ok(WatchEnd::Cancelled);
            }
            cancel.sleep(POLL);
        }
    }

    /// Hands `on_change` the threads `query` selects (its first page, as
    /// [`Threads::list`](crate::thread::Threads::list) gives it, oldest first), then every thread
    /// matching its filters whose status or last activity changes, in the
    /// order of their last activity, until `on_change` breaks or `cancel`
    /// is cancelled. Polled: states a thread passed through between two
    /// polls are merged into the last. Every status change moves a
    /// thread's last activity, so none is missed unless its commit becomes
    /// visible more than [`WINDOW_MS`] after its timestamp. Memory is
    /// bounded by the threads changed within twice that window.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// use std::ops::ControlFlow;
    /// use uwf_db::engine::{Cancel, watch::WatchEnd};
    /// let started = store.engine().start_workflow(hash, "task", &Default::default())?;
    /// // The first call hands over every thread the query matches; stop there.
    /// let mut seen = Vec::new();
    /// let end = store.engine().watch_threads(&Default::default(), &Cancel::new(), &mut |record| {
    ///     seen.push(record.id);
    ///     Ok(ControlFlow::Break(()))
    /// })?;
    /// assert!(matches!(end, WatchEnd::Stopped));
    /// assert_eq!(seen, [started.id]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn watch_threads(
        &self,
        query: &ThreadQuery,
        cancel: &Cancel,
        on_change: &mut dyn FnMut(&ThreadRecord) -> Result<ControlFlow<()>, EngineError>,
    ) -> Result<WatchEnd, EngineError> {
        // What was last handed over for each thread.
        let mut seen: HashMap<ThreadId, (ThreadStatus, u64)> = HashMap::new();
        let mut newest = 0u64;
        let mut first = true;
        loop {
            let mut records = if first {
                self.threads().list(query)?
            } else {
                // From the newest change seen, but never from the past
                // when nothing matched yet, nor from a future that one
                // writer's fast clock announced.
                let now = crate::store::now_ms();
                let base = if newest == 0 { now } else { newest.min(now) };
                let since = base.saturating_sub(WINDOW_MS).max(query.since.unwrap_or(0));
                if query.labels.is_empty() {
                    // The window's index entries alone; records only for
                    // the threads that changed since the last poll.
                    self.threads()
                        .changed_since(query, since, POLL_PAGE, &|id, status, at| {
                            seen.get(&id) == Some(&(status, at))
                        })?
                } else {
                    self.threads().list(&ThreadQuery {
                        since: Some(since),
                        limit: POLL_PAGE,
                        offset: 0,
                        before: None,
                        ..query.clone()
                    })?
                }
            };
            // Oldest change first.
            records.reverse();
            for r in &records {
                let at = r.last_activity();
                newest = newest.max(at);
                let now = (r.status, at);
                if seen.get(&r.id) == Some(&now) {
                    continue;
                }
                seen.insert(r.id, now);
                if on_change(r)?.is_break() {
                    return Ok(WatchEnd::Stopped);
                }
            }
            first = false;
            // What fell out of the window cannot show again unchanged.
            let floor = newest.saturating_sub(2 * WINDOW_MS);
            seen.retain(|_, (_, at)| *at >= floor);
            if cancel.is_cancelled() {
                return Ok(WatchEnd::Cancelled);
            }
            cancel.sleep(POLL);
        }
    }
}

//! Reading a thread's chain: the log newest first (paged by ancestors),
//! the steps after a sequence number (watch), context assembly, the Merkle
//! call stack and a child's history. Records and listings are `read.rs`.

use super::read::need;
use super::{END_ROLE, ThreadError, ThreadId, ThreadRecord, Threads, index};
use crate::hash::Hash;
use crate::node::{Blob, Kind, StartNode, StateNode, state_ancestors};
use crate::store::{ReadTxn, StoreError, WriteTxn};

/// Deepest call stack walked (a guard: depth is limited when spawning).
pub(super) const MAX_STACK: usize = 64;

/// One state node of a chain.
#[derive(Debug, Clone, PartialEq)]
pub struct LogEntry {
    /// The node's hash.
    pub hash: Hash,
    /// The node.
    pub node: StateNode,
}

/// What an agent's context is assembled from.
#[derive(Debug, Clone, PartialEq)]
pub struct Context {
    /// The newest compaction summary: its blob and text.
    pub summary: Option<(Hash, String)>,
    /// The steps after the summary (or all, up to the limit), oldest first.
    pub steps: Vec<LogEntry>,
}

/// One level of the Merkle call stack.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// The node at this level (the given node, then each parent state).
    pub node: Hash,
    /// The start node of the thread at this level.
    pub start: Hash,
    /// Its payload (workflow, depth, parent state).
    pub start_node: StartNode,
}

fn state_at(r: &ReadTxn<'_>, hash: &Hash) -> Result<StateNode, ThreadError> {
    match r.get_blob(hash)? {
        Some(Blob::State(s)) => Ok(s),
        Some(_) => Err(ThreadError::WrongKind {
            hash: *hash,
            expected: "state",
        }),
        None => Err(ThreadError::MissingNode { hash: *hash }),
    }
}

/// Visits the chain back from `from` (included) through the ancestor
/// lists: each node names its up-to-11 predecessors, so a page of k nodes
/// needs about k/11 dependent rounds, and only the oldest node of each round
/// is parsed (its `ancestors` alone, see [`state_ancestors`]). `visit` gets
/// each node's hash and canonical bytes, borrowed from the map. The start
/// node is never visited. Returns how many nodes were visited.
fn visit_chain<E: From<ThreadError> + From<StoreError>>(
    r: &ReadTxn<'_>,
    from: Hash,
    limit: usize,
    mut visit: impl FnMut(&Hash, &[u8]) -> Result<(), E>,
) -> Result<usize, E> {
    let mut visited = 0;
    let mut batch = vec![from];
    while visited < limit && !batch.is_empty() {
        let mut oldest = None;
        batch.truncate(limit - visited);
        // On a server backend, the batch's nodes in one read (one round
        // trip); on LMDB, each as it is visited.
        let mut fetched = if r.tables().prefers_batches() {
            Some(r.get_chain_records(&batch)?.into_iter())
        } else {
            None
        };
        for hash in &batch {
            let stored = match fetched.as_mut() {
                Some(records) => records.next().flatten(),
                None => r.get_record(hash)?,
            };
            let Some(stored) = stored else {
                return Err(ThreadError::MissingNode { hash: *hash }.into());
            };
            let record = stored.record()?;
            match record.kind {
                Kind::State => {}
                // The chain's first node: nothing before it is a step.
                Kind::Start if visited == 0 => return Ok(0),
                _ => {
                    return Err(ThreadError::WrongKind {
                        hash: *hash,
                        expected: "state",
                    }
                    .into());
                }
            }
            visit(hash, record.bytes)?;
            visited += 1;
            oldest = Some(stored);
        }
        let oldest = match &oldest {
            Some(stored) => stored.record()?.bytes,
            None => &[],
        };
        batch = match (state_ancestors(oldest), batch.last()) {
            (Some(a), _) => a,
            (None, Some(last)) => decode_state(last, oldest)?.ancestors,
            (None, None) => Vec::new(),
        };
    }
    Ok(visited)
}

fn decode_state(hash: &Hash, bytes: &[u8]) -> Result<StateNode, ThreadError> {
    match Blob::decode_trusted(bytes) {
        Ok(Blob::State(s)) => Ok(s),
        Ok(_) => Err(ThreadError::WrongKind {
            hash: *hash,
            expected: "state",
        }),
        Err(e) => Err(ThreadError::Store(StoreError::Corrupt {
            hash: *hash,
            source: e.into(),
        })),
    }
}

/// Decoded [`visit_chain`].
fn page_from(r: &ReadTxn<'_>, from: Hash, limit: usize) -> Result<Vec<LogEntry>, ThreadError> {
    let mut out = Vec::with_capacity(limit.min(1024));
    visit_chain(r, from, limit, |hash, bytes| {
        out.push(LogEntry {
            hash: *hash,
            node: decode_state(hash, bytes)?,
        });
        Ok::<_, ThreadError>(())
    })?;
    Ok(out)
}

/// Whether `target` (a state node with sequence number `target_seq`) is on
/// the chain ending at `head`: jumps back through ancestor lists, 11 nodes
/// per read.
pub(crate) fn on_chain(
    w: &WriteTxn<'_>,
    head: Hash,
    target: &Hash,
    target_seq: u64,
) -> Result<bool, ThreadError> {
    let mut cur = head;
    loop {
        if cur == *target {
            return Ok(true);
        }
        let node = match w.get_blob(&cur)? {
            Some(Blob::State(s)) => s,
            _ => return Ok(false),
        };
        if node.seq <= target_seq {
            return Ok(false);
        }
        if node.ancestors.contains(target) {
            return Ok(true);
        }
        match node.ancestors.last() {
            Some(oldest) => cur = *oldest,
            None => return Ok(false),
        }
    }
}

/// `seq` of the newest end node strictly before `node` (0 if none): walks
/// back through its ancestors.
pub(crate) fn last_end_before(w: &WriteTxn<'_>, node: &StateNode) -> Result<u64, ThreadError> {
    let mut ancestors = node.ancestors.clone();
    while !ancestors.is_empty() {
        let mut oldest = None;
        for hash in &ancestors {
            let s = match w.get_blob(hash)? {
                Some(Blob::State(s)) => s,
                _ => return Err(ThreadError::MissingNode { hash: *hash }),
            };
            if s.role == END_ROLE {
                return Ok(s.seq);
            }
            oldest = Some(s);
        }
        ancestors = oldest.map(|s| s.ancestors).unwrap_or_default();
    }
    Ok(0)
}
impl Threads<'_> {
    /// The chain's state nodes newest first (end nodes included, the start
    /// excluded), from the head or from just before `before`, at most `limit`.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// let started = store.engine().start_workflow(hash, "task", &Default::default())?;
    /// assert!(store.threads().log(started.id, 10, None)?.is_empty()); // no step yet
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn log(
        &self,
        id: ThreadId,
        limit: usize,
        before: Option<Hash>,
    ) -> Result<Vec<LogEntry>, ThreadError> {
        self.store.read(|r| match log_origin(r, id, before)? {
            Some(from) => page_from(r, from, limit),
            None => Ok(Vec::new()),
        })
    }

    /// One step by its state node's hash (a role step or an end node), as
    /// [`log`](Self::log) gives it; [`ThreadError::WrongKind`] for a blob
    /// that is not a state node.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// let started = store.engine().start_workflow(hash, "task", &Default::default())?;
    /// let id = started.id;
    /// # struct Echo;
    /// # impl uwf_db::engine::agent::Agent for Echo {
    /// #     fn call(&mut self, _: &uwf_db::engine::agent::AgentRequest<'_>) -> Result<uwf_db::engine::agent::AgentReply, uwf_db::engine::agent::AgentError> { Ok("done".to_owned().into()) }
    /// # }
    /// store.engine().drive(id, &Default::default(), &mut Echo).into_result()?;
    /// let newest = store.threads().log(id, 1, None)?.remove(0);
    /// assert_eq!(store.threads().step(newest.hash)?, newest);
    /// // The start node is not a step.
    /// assert!(store.threads().step(started.start).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn step(&self, hash: Hash) -> Result<LogEntry, ThreadError> {
        self.store.read(|r| {
            Ok(LogEntry {
                hash,
                node: state_at(r, &hash)?,
            })
        })
    }

    /// The steps of a thread after `after_seq`, oldest first, at most
    /// `limit` of them (the oldest), with the record they were read with,
    /// all in one snapshot: what `thread watch` prints each time the head
    /// moves. Steps are numbered 1, 2, … along the chain (end nodes too),
    /// so a reader that keeps the `seq` of the last step it printed resumes
    /// with nothing missed or repeated. The chain back to the cursor is
    /// walked without decoding; only the nodes returned are decoded, so
    /// memory stays bounded by `limit` however far behind the cursor is.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// let started = store.engine().start_workflow(hash, "task", &Default::default())?;
    /// let (record, steps) = store.threads().steps_after(started.id, 0, 100)?;
    /// assert_eq!(record.id, started.id);
    /// assert!(steps.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn steps_after(
        &self,
        id: ThreadId,
        after_seq: u64,
        limit: usize,
    ) -> Result<(ThreadRecord, Vec<LogEntry>), ThreadError> {
        self.store.read(|r| {
            let record = need(r, id)?;
            let behind =
                usize::try_from(record.seq.saturating_sub(after_seq)).unwrap_or(usize::MAX);
            if behind == 0 || limit == 0 {
                return Ok((record, Vec::new()));
            }
            // The newest seq to return.
            let last = after_seq.saturating_add(u64::try_from(limit).unwrap_or(u64::MAX));
            let mut seq = record.seq;
            let mut out = Vec::with_capacity(limit.min(behind).min(1024));
            visit_chain(r, record.head, behind, |hash, bytes| {
                if seq <= last {
                    out.push(LogEntry {
                        hash: *hash,
                        node: decode_state(hash, bytes)?,
                    });
                }
                seq = seq.saturating_sub(1);
                Ok::<_, ThreadError>(())
            })?;
            out.reverse();
            out.retain(|e| e.node.seq > after_seq && e.node.seq <= last);
            Ok((record, out))
        })
    }

    /// Like [`Threads::log`] without decoding: `visit` gets each state
    /// node's hash and canonical bytes, borrowed from the map inside one
    /// short read transaction (keep `visit` quick). Returns the count.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// # use uwf_db::thread::{EndSpec, NewThread, Next, StepWrite, ThreadStatus};
    /// # let new = NewThread { workflow: "two".into(), workflow_hash: hash, prompt: "task".into(), max_rounds: 10, depth: 0, parent_state: None, parent_thread: None, next_role: "writer".into(), next_instruction: "Write it".into(), agent: None, cwd: None, next_location: None, labels: Default::default() };
    /// # let step = |reply: &str| StepWrite { role: "writer".into(), meta: Default::default(), reply: reply.into(), artifacts: vec![], instruction: "Write it".into(), child_thread: None };
    /// # let again = || Next::Role { role: "writer".into(), instruction: "Again".into(), location: None };
    /// let low = store.threads().low_level();
    /// # let t = low.start_thread(new)?;
    /// # let w = low.append_step(t.id, t.head, step("a draft"), again())?;
    /// # let head = w.record.head;
    /// let mut sizes = Vec::new();
    /// let n = store.threads().visit_log(t.id, 10, None, |_hash, bytes| {
    ///     sizes.push(bytes.len());
    ///     Ok::<_, uwf_db::thread::ThreadError>(())
    /// })?;
    /// assert_eq!((n, sizes.len()), (1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn visit_log<E: From<ThreadError> + From<StoreError>>(
        &self,
        id: ThreadId,
        limit: usize,
        before: Option<Hash>,
        visit: impl FnMut(&Hash, &[u8]) -> Result<(), E>,
    ) -> Result<usize, E> {
        self.store.read(|r| match log_origin(r, id, before)? {
            Some(from) => visit_chain(r, from, limit, visit),
            None => Ok(0),
        })
    }

    /// State nodes newest first from any node (a child's end node, say).
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// # use uwf_db::thread::{EndSpec, NewThread, Next, StepWrite, ThreadStatus};
    /// # let new = NewThread { workflow: "two".into(), workflow_hash: hash, prompt: "task".into(), max_rounds: 10, depth: 0, parent_state: None, parent_thread: None, next_role: "writer".into(), next_instruction: "Write it".into(), agent: None, cwd: None, next_location: None, labels: Default::default() };
    /// # let step = |reply: &str| StepWrite { role: "writer".into(), meta: Default::default(), reply: reply.into(), artifacts: vec![], instruction: "Write it".into(), child_thread: None };
    /// # let again = || Next::Role { role: "writer".into(), instruction: "Again".into(), location: None };
    /// let low = store.threads().low_level();
    /// # let t = low.start_thread(new)?;
    /// # let w = low.append_step(t.id, t.head, step("a draft"), again())?;
    /// # let head = w.record.head;
    /// let entries = store.threads().log_from(head, 10)?;
    /// assert_eq!(entries.len(), 1);
    /// assert_eq!(entries[0].hash, head);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn log_from(&self, node: Hash, limit: usize) -> Result<Vec<LogEntry>, ThreadError> {
        self.store.read(|r| page_from(r, node, limit))
    }

    /// The context for the thread's next agent call: the staged summary if
    /// there is one (it covers everything up to the head); else walking back
    /// from the head, the steps after the newest node carrying `compact` (that
    /// node included) and its summary; at most `max_steps` steps.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// # use uwf_db::thread::{EndSpec, NewThread, Next, StepWrite, ThreadStatus};
    /// # let new = NewThread { workflow: "two".into(), workflow_hash: hash, prompt: "task".into(), max_rounds: 10, depth: 0, parent_state: None, parent_thread: None, next_role: "writer".into(), next_instruction: "Write it".into(), agent: None, cwd: None, next_location: None, labels: Default::default() };
    /// # let step = |reply: &str| StepWrite { role: "writer".into(), meta: Default::default(), reply: reply.into(), artifacts: vec![], instruction: "Write it".into(), child_thread: None };
    /// # let again = || Next::Role { role: "writer".into(), instruction: "Again".into(), location: None };
    /// let low = store.threads().low_level();
    /// # let t = low.start_thread(new)?;
    /// # let w = low.append_step(t.id, t.head, step("a draft"), again())?;
    /// # let head = w.record.head;
    /// let context = store.threads().context(t.id, 10)?;
    /// assert!(context.summary.is_none()); // nothing compacted yet
    /// assert_eq!(context.steps.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn context(&self, id: ThreadId, max_steps: usize) -> Result<Context, ThreadError> {
        self.store.read(|r| context_in(r, &need(r, id)?, max_steps))
    }

    /// [`Threads::context`] for a record the caller has already read.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// # use uwf_db::thread::{EndSpec, NewThread, Next, StepWrite, ThreadStatus};
    /// # let new = NewThread { workflow: "two".into(), workflow_hash: hash, prompt: "task".into(), max_rounds: 10, depth: 0, parent_state: None, parent_thread: None, next_role: "writer".into(), next_instruction: "Write it".into(), agent: None, cwd: None, next_location: None, labels: Default::default() };
    /// # let step = |reply: &str| StepWrite { role: "writer".into(), meta: Default::default(), reply: reply.into(), artifacts: vec![], instruction: "Write it".into(), child_thread: None };
    /// # let again = || Next::Role { role: "writer".into(), instruction: "Again".into(), location: None };
    /// let low = store.threads().low_level();
    /// # let t = low.start_thread(new)?;
    /// # let w = low.append_step(t.id, t.head, step("a draft"), again())?;
    /// # let head = w.record.head;
    /// let context = store.threads().context_of(&w.record, 10)?;
    /// assert_eq!(context.steps.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn context_of(
        &self,
        record: &ThreadRecord,
        max_steps: usize,
    ) -> Result<Context, ThreadError> {
        self.store.read(|r| context_in(r, record, max_steps))
    }

    /// The context as it was at `node` (a state node, or a start node,
    /// which has no steps): the steps up to `node` after the newest summary
    /// at or before it, and that summary; at most `max_steps` steps. A
    /// child workflow's prompt shows its parent this way, at the parent
    /// state it was started from.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// # use uwf_db::thread::{EndSpec, NewThread, Next, StepWrite, ThreadStatus};
    /// # let new = NewThread { workflow: "two".into(), workflow_hash: hash, prompt: "task".into(), max_rounds: 10, depth: 0, parent_state: None, parent_thread: None, next_role: "writer".into(), next_instruction: "Write it".into(), agent: None, cwd: None, next_location: None, labels: Default::default() };
    /// # let step = |reply: &str| StepWrite { role: "writer".into(), meta: Default::default(), reply: reply.into(), artifacts: vec![], instruction: "Write it".into(), child_thread: None };
    /// # let again = || Next::Role { role: "writer".into(), instruction: "Again".into(), location: None };
    /// let low = store.threads().low_level();
    /// # let t = low.start_thread(new)?;
    /// let first = low.append_step(t.id, t.head, step("a draft"), again())?;
    /// low.append_step(t.id, first.record.head, step("another"), again())?;
    /// // As it was after the first step, and before it (the start node).
    /// assert_eq!(store.threads().context_at(first.record.head, 10)?.steps.len(), 1);
    /// assert!(store.threads().context_at(t.start, 10)?.steps.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn context_at(&self, node: Hash, max_steps: usize) -> Result<Context, ThreadError> {
        self.store.read(|r| context_from(r, node, None, max_steps))
    }

    /// The Merkle call stack of any node, innermost first: the node's own
    /// thread level, then each parent state up to the top-level thread.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// # use uwf_db::thread::{EndSpec, NewThread, Next, StepWrite, ThreadStatus};
    /// # let new = NewThread { workflow: "two".into(), workflow_hash: hash, prompt: "task".into(), max_rounds: 10, depth: 0, parent_state: None, parent_thread: None, next_role: "writer".into(), next_instruction: "Write it".into(), agent: None, cwd: None, next_location: None, labels: Default::default() };
    /// # let step = |reply: &str| StepWrite { role: "writer".into(), meta: Default::default(), reply: reply.into(), artifacts: vec![], instruction: "Write it".into(), child_thread: None };
    /// # let again = || Next::Role { role: "writer".into(), instruction: "Again".into(), location: None };
    /// let low = store.threads().low_level();
    /// # let t = low.start_thread(new)?;
    /// # let w = low.append_step(t.id, t.head, step("a draft"), again())?;
    /// # let head = w.record.head;
    /// let frames = store.threads().call_stack(head)?;
    /// assert_eq!(frames.len(), 1); // a top-level thread: one level
    /// assert_eq!((frames[0].node, frames[0].start), (head, t.start));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_stack(&self, node: Hash) -> Result<Vec<Frame>, ThreadError> {
        self.store.read(|r| {
            let mut frames = Vec::new();
            let mut cur = Some(node);
            while let Some(h) = cur {
                if frames.len() == MAX_STACK {
                    break;
                }
                let start = match r.get_blob(&h)? {
                    Some(Blob::State(s)) => s.start,
                    Some(Blob::Start(_)) => h,
                    Some(_) => {
                        return Err(ThreadError::WrongKind {
                            hash: h,
                            expected: "state or start",
                        });
                    }
                    None => return Err(ThreadError::MissingNode { hash: h }),
                };
                let start_node = match r.get_blob(&start)? {
                    Some(Blob::Start(s)) => s,
                    _ => {
                        return Err(ThreadError::WrongKind {
                            hash: start,
                            expected: "start",
                        });
                    }
                };
                cur = start_node.parent_state;
                frames.push(Frame {
                    node: h,
                    start,
                    start_node,
                });
            }
            Ok(frames)
        })
    }

    /// From a parent's step that ran a child workflow: the child's chain,
    /// newest first (its end node first), at most `limit` nodes.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// # use uwf_db::thread::{EndSpec, NewThread, Next, StepWrite, ThreadStatus};
    /// # let new = NewThread { workflow: "two".into(), workflow_hash: hash, prompt: "task".into(), max_rounds: 10, depth: 0, parent_state: None, parent_thread: None, next_role: "writer".into(), next_instruction: "Write it".into(), agent: None, cwd: None, next_location: None, labels: Default::default() };
    /// # let step = |reply: &str| StepWrite { role: "writer".into(), meta: Default::default(), reply: reply.into(), artifacts: vec![], instruction: "Write it".into(), child_thread: None };
    /// # let again = || Next::Role { role: "writer".into(), instruction: "Again".into(), location: None };
    /// let low = store.threads().low_level();
    /// # let t = low.start_thread(new)?;
    /// # let w = low.append_step(t.id, t.head, step("a draft"), again())?;
    /// # let head = w.record.head;
    /// // This step ran no child workflow.
    /// assert!(store.threads().child_history(head, 10)?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn child_history(
        &self,
        parent_step: Hash,
        limit: usize,
    ) -> Result<Option<Vec<LogEntry>>, ThreadError> {
        self.store
            .read(|r| match state_at(r, &parent_step)?.child_thread {
                Some(child_end) => page_from(r, child_end, limit).map(Some),
                None => Ok(None),
            })
    }
}

/// Where a log page starts: the head, or the parent of `before` (`None`
/// when `before` is the first step).
fn log_origin(
    r: &ReadTxn<'_>,
    id: ThreadId,
    before: Option<Hash>,
) -> Result<Option<Hash>, ThreadError> {
    match before {
        None => index::head(r.tables(), id)?
            .map(Some)
            .ok_or_else(|| ThreadError::Unknown(id.to_string())),
        Some(b) => {
            let record = need(r, id)?;
            let node = state_at(r, &b)?;
            if node.start != record.start {
                return Err(ThreadError::NotOnChain {
                    node: b,
                    thread: id,
                });
            }
            Ok(node.ancestors.first().copied())
        }
    }
}

/// Context assembly inside one read transaction (see [`Threads::context`]).
fn context_in(
    r: &ReadTxn<'_>,
    record: &ThreadRecord,
    max_steps: usize,
) -> Result<Context, ThreadError> {
    context_from(r, record.head, record.staged_compact, max_steps)
}

/// [`context_in`] from a head and a staged summary.
fn context_from(
    r: &ReadTxn<'_>,
    head: Hash,
    staged: Option<Hash>,
    max_steps: usize,
) -> Result<Context, ThreadError> {
    let text = |h: &Hash| -> Result<String, ThreadError> {
        match r.get_blob(h)? {
            Some(Blob::Content(c)) => Ok(c.text),
            Some(_) => Err(ThreadError::WrongKind {
                hash: *h,
                expected: "content",
            }),
            None => Err(ThreadError::MissingNode { hash: *h }),
        }
    };
    if let Some(staged) = staged {
        return Ok(Context {
            summary: Some((staged, text(&staged)?)),
            steps: Vec::new(),
        });
    }
    let mut steps = Vec::new();
    let mut summary = None;
    let mut from = Some(head);
    'walk: while let Some(h) = from {
        let want = max_steps.saturating_sub(steps.len()).clamp(1, 64);
        let page = page_from(r, h, want)?;
        // The next page starts at the parent of this page's oldest node.
        from = page.last().and_then(|e| e.node.ancestors.first().copied());
        if page.len() < want {
            from = None;
        }
        for entry in page {
            let compact = entry.node.compact;
            steps.push(entry);
            if let Some(c) = compact {
                summary = Some((c, text(&c)?));
                break 'walk;
            }
            if steps.len() == max_steps {
                break 'walk;
            }
        }
    }
    steps.reverse();
    Ok(Context { summary, steps })
}

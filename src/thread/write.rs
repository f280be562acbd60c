//! Operations that change threads. Each is one write transaction; each that
//! moves a head is a compare-and-swap on the head the caller expects.
//!
//! The record mutations the engine is built from (start, append, resume
//! from history, end, failure, arbitrary record updates, and forks in
//! `fork.rs`) are on [`LowLevel`], reached through [`Threads::low_level`]:
//! they write exactly what they are told, with no routing, no claims and
//! no workflow. Embedders drive threads through the engine instead
//! ([`Engine::drive`](crate::engine::Engine::drive) and friends). Manual compaction
//! and unlinking, which are user operations, stay on [`Store`].

use std::collections::BTreeMap;

use super::index::{self, Location};
use super::labels::check_labels;
use super::{
    END_ROLE, EndSpec, MAX_ANCESTORS, NewThread, Next, StepWrite, ThreadError, ThreadId,
    ThreadRecord, ThreadStatus, Threads, Written,
};
use crate::backend::Table;
use crate::hash::Hash;
use crate::node::{Blob, EncodedBlob, Kind, StartNode, StateNode, Value, state_ancestors_raw};
use crate::store::{Store, WriteTxn};
use crate::usage::{StepUsage, UsageTotals};

/// Raw record mutation below the engine: see the module docs. Reads are on
/// [`Threads`] (and the store itself through [`LowLevel::store`]).
///
/// ```
/// use uwf_db::Store;
/// let store = Store::memory();
/// let low = store.threads().low_level();
/// // `low.append_step(..)`, `low.update_record(..)`, … write exactly what
/// // they are given; the engine (`store.engine().drive(..)`) is what routes.
/// assert!(low.store().threads().get(uwf_db::thread::ThreadId::generate()).unwrap().is_none());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct LowLevel<'s>(pub(super) &'s Store);

impl<'s> LowLevel<'s> {
    /// The store these writes go to.
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
    /// assert!(low.store().same_store(&store));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn store(&self) -> &'s Store {
        self.0
    }
}

impl<'s> Threads<'s> {
    /// Raw record mutation, below the engine (no routing, no claims):
    /// [`LowLevel`]. For tests, tools and the engine itself.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// let low = store.threads().low_level();
    /// assert!(low.store().same_store(&store));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn low_level(&self) -> LowLevel<'s> {
        LowLevel(self.store)
    }
}

/// What a step's write reads first: the thread's record, its head (the
/// new node's parent) and, when the caller knows it, its start node
/// (`next_position` looks both up). None where naming them would not pay
/// (LMDB, memory).
fn step_reads(
    store: &Store,
    id: ThreadId,
    head: Hash,
    start: Option<Hash>,
) -> Vec<(Table, Vec<u8>)> {
    if !store.prefetches() {
        return Vec::new();
    }
    let mut reads = index::record_reads(id);
    for node in std::iter::once(head).chain(start) {
        reads.push((Table::Blobs, node.as_bytes().to_vec()));
    }
    reads
}

/// `seq` and `ancestors` for the node after the record's head. The head's
/// seq is the record's; its ancestors are read from its bytes without
/// decoding the rest.
fn next_position(
    w: &mut WriteTxn<'_>,
    record: &ThreadRecord,
) -> Result<(u64, Vec<Hash>), ThreadError> {
    let head = record.head;
    // The new node's ref checks will look for both: one read.
    w.note_stored(&[head, record.start])?;
    let Some(stored) = w.get_node_record(&head)? else {
        return Err(ThreadError::MissingNode { hash: head });
    };
    let stored = stored.record()?;
    match stored.kind {
        Kind::Start => Ok((1, Vec::new())),
        Kind::State => {
            let older =
                state_ancestors_raw(stored.bytes).ok_or_else(|| ThreadError::WrongKind {
                    hash: head,
                    expected: "a state node in canonical form",
                })?;
            let mut ancestors = Vec::with_capacity(MAX_ANCESTORS);
            ancestors.push(head);
            ancestors.extend(
                older
                    .chunks_exact(34)
                    .take(MAX_ANCESTORS - 1)
                    .filter_map(|item| item.get(2..).and_then(Hash::from_slice)),
            );
            Ok((record.seq + 1, ancestors))
        }
        _ => Err(ThreadError::WrongKind {
            hash: head,
            expected: "state or start",
        }),
    }
}

/// A step's reply and instruction blobs, encoded (and hashed) before the
/// write transaction, so a group-commit writer does less.
pub(crate) struct StepBlobs {
    content: EncodedBlob,
    input: EncodedBlob,
}

impl StepBlobs {
    fn new(reply: &str, artifacts: &[Hash], instruction: &str) -> Result<StepBlobs, ThreadError> {
        Self::with_input_refs(reply, artifacts, instruction, &[])
    }

    /// With `input_refs` as the input node's refs: what the engine kept of
    /// the call (the exact prompt, the agent's stderr; §5e "Kept with a
    /// step").
    fn with_input_refs(
        reply: &str,
        artifacts: &[Hash],
        instruction: &str,
        input_refs: &[Hash],
    ) -> Result<StepBlobs, ThreadError> {
        Ok(StepBlobs {
            content: Blob::content(reply, artifacts.iter().copied()).encode()?,
            input: Blob::content(instruction, input_refs.iter().copied()).encode()?,
        })
    }
}

/// Writes a state node after `record.head` and moves the head to it. The
/// staged compaction summary, if any, becomes its `compact`.
fn write_state(
    w: &mut WriteTxn<'_>,
    record: &mut ThreadRecord,
    role: &str,
    meta: BTreeMap<String, Value>,
    blobs: &StepBlobs,
    child_thread: Option<Hash>,
) -> Result<Hash, ThreadError> {
    let (seq, ancestors) = next_position(w, record)?;
    w.store_encoded(&blobs.content)?;
    w.store_encoded(&blobs.input)?;
    let node = Blob::State(StateNode {
        ancestors,
        child_thread,
        compact: record.staged_compact.take(),
        content: blobs.content.hash(),
        input: blobs.input.hash(),
        meta,
        role: role.to_owned(),
        seq,
        start: record.start,
        timestamp: w.now_ms(),
    });
    let hash = w.put_blob(&node)?;
    record.head = hash;
    record.seq = seq;
    Ok(hash)
}

/// Writes the end node and turns the record into a history record.
fn write_end(
    w: &mut WriteTxn<'_>,
    record: &mut ThreadRecord,
    end: &EndSpec,
) -> Result<Hash, ThreadError> {
    let meta = BTreeMap::from([
        (
            "return_code".to_owned(),
            Value::UInt(u64::from(end.return_code)),
        ),
        ("summary".to_owned(), Value::Str(end.summary.clone())),
    ]);
    let blobs = StepBlobs::new(&end.summary, &[], &end.prompt)?;
    // Role steps since the last end (the end node is not one).
    let rounds = record.rounds();
    let hash = write_state(w, record, END_ROLE, meta, &blobs, None)?;
    if end.return_code == 1 {
        // Ended by `maxRounds` (SPEC §4): why the thread failed is where
        // `thread show` and `thread list --failed` look for it.
        record.last_error = Some(cap_error(&format!(
            "the thread failed: {} after {rounds} role steps since its start or last resume (raise maxRounds, or resume the thread for a fresh budget)",
            end.summary
        )));
    }
    record.last_end_seq = record.seq;
    // An ended thread is in history: any claim on it is over.
    record.claimed_status = None;
    record.status = ThreadStatus::for_return_code(end.return_code);
    record.completed_at = Some(w.now_ms());
    clear_next(record);
    record.active_child = None;
    Ok(hash)
}

/// Forgets what the next step needed (next role, suspend fields).
fn clear_next(record: &mut ThreadRecord) {
    record.next_role = None;
    record.next_instruction = None;
    record.next_location = None;
    record.suspended_role = None;
    record.suspend_message = None;
}

fn apply_after(
    w: &mut WriteTxn<'_>,
    record: &mut ThreadRecord,
    after: Next,
) -> Result<Option<Hash>, ThreadError> {
    clear_next(record);
    // A claimed thread stays `running` for the whole drive; the step's
    // outcome goes underneath, in `claimed_status`.
    let claimed = record.status == ThreadStatus::Running && record.claimed_status.is_some();
    let status = match after {
        Next::Role {
            role,
            instruction,
            location,
        } => {
            record.next_role = Some(role);
            record.next_instruction = Some(instruction);
            record.next_location = location;
            ThreadStatus::Idle
        }
        Next::Suspend { role, message } => {
            record.suspended_role = Some(role);
            record.suspend_message = Some(message);
            ThreadStatus::Suspended
        }
        Next::End(end) => return write_end(w, record, &end).map(Some),
    };
    if claimed && status == ThreadStatus::Idle {
        record.claimed_status = Some(status);
    } else {
        // A suspend ends the drive: release the claim in this same commit
        // rather than in a transaction of its own.
        record.claimed_status = None;
        record.status = status;
    }
    Ok(None)
}

/// Loads a record for a compare-and-swap write.
pub(super) fn load_checked(
    w: &WriteTxn<'_>,
    id: ThreadId,
    expected_head: Hash,
) -> Result<(ThreadRecord, Location), ThreadError> {
    let (record, location) =
        index::find(w.tables(), id)?.ok_or_else(|| ThreadError::Unknown(id.to_string()))?;
    if record.head != expected_head {
        return Err(ThreadError::Conflict {
            thread: id,
            expected: expected_head,
            actual: record.head,
        });
    }
    Ok((record, location))
}

impl LowLevel<'_> {
    /// Creates a thread: the prompt, the start node and the record, in one
    /// transaction. The workflow blob (and `parent_state`) must exist.
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
    /// let t = low.start_thread(new)?;
    /// assert_eq!((t.status, t.next_role.as_deref()), (ThreadStatus::Idle, Some("writer")));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start_thread(&self, new: NewThread) -> Result<ThreadRecord, ThreadError> {
        self.start_thread_generated(new, ThreadId::generate(), false)
    }

    /// `start_thread` with a given id, optionally already claimed by a
    /// driver (status `running` over `idle`): the caller holds the driver's
    /// lock for `id`, so a start-and-drive costs no separate claim commit.
    /// An id a thread (active or ended) has already is
    /// [`ThreadError::IdTaken`], and nothing is written.
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
    /// let id = uwf_db::thread::ThreadId::generate();
    /// let t = low.start_thread_as(new.clone(), id, true)?; // claimed: status running
    /// assert_eq!((t.id, t.status), (id, ThreadStatus::Running));
    /// // An id a thread has already is refused, and nothing is written.
    /// let again = low.start_thread_as(new, id, false);
    /// assert!(matches!(again, Err(uwf_db::thread::ThreadError::IdTaken(t)) if t == id));
    /// assert_eq!(store.threads().get(id)?.map(|r| r.status), Some(ThreadStatus::Running));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start_thread_as(
        &self,
        new: NewThread,
        id: ThreadId,
        claimed: bool,
    ) -> Result<ThreadRecord, ThreadError> {
        self.start_from(new, id, claimed, IdSource::Given)
    }

    /// `start_thread_as` for an id the caller has just drawn with
    /// [`ThreadId::generate`]: 80 random bits make a collision negligible,
    /// so the start does not look the id up first (an index lookup per
    /// start, a round trip on PostgreSQL).
    pub(crate) fn start_thread_generated(
        &self,
        new: NewThread,
        id: ThreadId,
        claimed: bool,
    ) -> Result<ThreadRecord, ThreadError> {
        self.start_from(new, id, claimed, IdSource::Generated)
    }

    /// Starts a thread with `id`, from `source`.
    fn start_from(
        &self,
        new: NewThread,
        id: ThreadId,
        claimed: bool,
        source: IdSource,
    ) -> Result<ThreadRecord, ThreadError> {
        check_labels(&new.labels)?;
        // What the start reads: the workflow and parent state its start
        // node names (ref checks) and, for a given id, the id's record.
        let mut reads: Vec<(Table, Vec<u8>)> = Vec::new();
        if self.0.prefetches() {
            reads.extend(
                std::iter::once(new.workflow_hash)
                    .chain(new.parent_state)
                    .map(|h| (Table::Blobs, h.as_bytes().to_vec())),
            );
            if source == IdSource::Given {
                reads.extend(index::record_reads(id));
            }
        }
        self.0
            .write_op_reading(reads, move |w| start_in(w, &new, id, claimed, source))
    }

    /// Starts `children` of thread `parent` (a fan-out role's) and appends
    /// them, in order, to its record's `fan_out`, all in one transaction: a
    /// compare-and-swap on the parent's `expected_head` and on `named`, the
    /// number of children it names already, so either every child of the
    /// chunk exists and the parent names it, or none does
    /// (`docs/design.md` §5f). Another `named` is
    /// [`ThreadError::ChildrenConflict`] and writes nothing.
    pub fn start_children(
        &self,
        parent: ThreadId,
        expected_head: Hash,
        named: usize,
        children: Vec<NewThread>,
    ) -> Result<Vec<ThreadRecord>, ThreadError> {
        for c in &children {
            check_labels(&c.labels)?;
        }
        self.0
            .write_op_reading(index::record_reads_for(self.0, parent), move |w| {
                let (mut record, location) = load_checked(w, parent, expected_head)?;
                let actual = record.fan_out.as_ref().map_or(0, Vec::len);
                if actual != named {
                    return Err(ThreadError::ChildrenConflict {
                        thread: parent,
                        expected: named,
                        actual,
                    });
                }
                let old = record.clone();
                let mut made = Vec::with_capacity(children.len());
                for new in &children {
                    made.push(start_in(
                        w,
                        new,
                        ThreadId::generate(),
                        false,
                        IdSource::Generated,
                    )?);
                }
                record
                    .fan_out
                    .get_or_insert_with(Vec::new)
                    .extend(made.iter().map(|r| r.id));
                record.updated_at = w.now_ms().max(old.updated_at);
                index::put(w, Some((&old, location)), &record)?;
                Ok(made)
            })
    }

    /// Removes thread `id` if its head is still `expected_head`, in one
    /// transaction: a writer that moved it meanwhile keeps its thread
    /// ([`ThreadError::Conflict`], nothing removed). Its nodes stay for GC.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// # use uwf_db::thread::{NewThread, Next, StepWrite};
    /// # let new = NewThread { workflow: "two".into(), workflow_hash: hash, prompt: "task".into(), max_rounds: 10, depth: 0, parent_state: None, parent_thread: None, next_role: "writer".into(), next_instruction: "Write it".into(), agent: None, cwd: None, next_location: None, labels: Default::default() };
    /// # let step = |reply: &str| StepWrite { role: "writer".into(), meta: Default::default(), reply: reply.into(), artifacts: vec![], instruction: "Write it".into(), child_thread: None };
    /// # let again = || Next::Role { role: "writer".into(), instruction: "Again".into(), location: None };
    /// let low = store.threads().low_level();
    /// let t = low.start_thread(new)?;
    /// let w = low.append_step(t.id, t.head, step("a draft"), again())?;
    /// assert!(low.remove_thread_at(t.id, t.head).is_err()); // it moved
    /// low.remove_thread_at(t.id, w.record.head)?;
    /// assert!(store.threads().get(t.id)?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn remove_thread_at(
        &self,
        id: ThreadId,
        expected_head: Hash,
    ) -> Result<ThreadRecord, ThreadError> {
        self.0.write(|w| {
            let (record, location) = load_checked(w, id, expected_head)?;
            index::remove(w, &record, location)?;
            Ok(record)
        })
    }

    /// Appends one role step to an active thread (idle, running or
    /// suspended) whose head is `expected_head`: reply and instruction
    /// content nodes, the state node, the head move and the status change in
    /// one transaction; with [`Next::End`] also the end node and the move to
    /// history. A moved head is [`ThreadError::Conflict`] and writes nothing.
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
    /// let t = low.start_thread(new)?;
    /// let w = low.append_step(t.id, t.head, step("a draft"), again())?;
    /// assert_eq!(Some(w.record.head), w.step);
    /// // The head moved: a writer that read the old one is refused.
    /// assert!(low.append_step(t.id, t.head, step("late"), again()).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn append_step(
        &self,
        id: ThreadId,
        expected_head: Hash,
        step: StepWrite,
        after: Next,
    ) -> Result<Written, ThreadError> {
        self.append_step_with(id, expected_head, &[], step, after)
    }

    /// [`append_step`](Self::append_step) that also stores the blobs
    /// `extra` (the artifacts the step names, say) in the same
    /// transaction: one commit, and never a step without its blobs nor,
    /// after a refused step, blobs nothing names.
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// # use uwf_db::thread::{NewThread, Next, StepWrite};
    /// # let new = NewThread { workflow: "two".into(), workflow_hash: hash, prompt: "task".into(), max_rounds: 10, depth: 0, parent_state: None, parent_thread: None, next_role: "writer".into(), next_instruction: "Write it".into(), agent: None, cwd: None, next_location: None, labels: Default::default() };
    /// # let again = || Next::Role { role: "writer".into(), instruction: "Again".into(), location: None };
    /// use uwf_db::Blob;
    /// let low = store.threads().low_level();
    /// let t = low.start_thread(new)?;
    /// let data = Blob::content("a value", []);
    /// let hash = data.encode()?.hash();
    /// let step = StepWrite { role: "writer".into(), meta: Default::default(), reply: "with a value".into(), artifacts: vec![hash], instruction: "Write it".into(), child_thread: None };
    /// low.append_step_with(t.id, t.head, &[data], step, again())?;
    /// assert!(store.contains(&hash)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn append_step_with(
        &self,
        id: ThreadId,
        expected_head: Hash,
        extra: &[Blob],
        step: StepWrite,
        after: Next,
    ) -> Result<Written, ThreadError> {
        let extra = extra
            .iter()
            .map(Blob::encode)
            .collect::<Result<Vec<EncodedBlob>, _>>()?;
        let blobs = StepBlobs::new(&step.reply, &step.artifacts, &step.instruction)?;
        let reads = step_reads(self.0, id, expected_head, None);
        self.append_encoded(id, expected_head, extra, blobs, step, after, false, reads)
    }

    /// A role step with what the engine keeps of its agent call (`kept`:
    /// the exact prompt, the agent's stderr tail, as encoded content
    /// blobs): they
    /// are stored in the step's transaction and are the refs of its input
    /// node, so GC, export and `verify` treat them as the rest of the
    /// chain (`docs/design.md` §5e "Kept with a step"). `resume` appends to
    /// an ended thread ([`resume_ended`](Self::resume_ended)) instead.
    /// `start`: the thread's start node, which the step's write looks up
    /// (fetched with the transaction's first statement).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn append_step_kept(
        &self,
        id: ThreadId,
        expected_head: Hash,
        start: Hash,
        kept: Vec<EncodedBlob>,
        step: StepWrite,
        after: Next,
        resume: bool,
    ) -> Result<Written, ThreadError> {
        let refs: Vec<Hash> = kept.iter().map(EncodedBlob::hash).collect();
        let blobs =
            StepBlobs::with_input_refs(&step.reply, &step.artifacts, &step.instruction, &refs)?;
        let reads = step_reads(self.0, id, expected_head, Some(start));
        self.append_encoded(id, expected_head, kept, blobs, step, after, resume, reads)
    }

    /// Stores `extra`, then appends `step` (to an active thread, or with
    /// `resume` to a completed or failed one), in one transaction.
    #[allow(clippy::too_many_arguments)]
    fn append_encoded(
        &self,
        id: ThreadId,
        expected_head: Hash,
        extra: Vec<EncodedBlob>,
        blobs: StepBlobs,
        step: StepWrite,
        after: Next,
        resume: bool,
        reads: Vec<(Table, Vec<u8>)>,
    ) -> Result<Written, ThreadError> {
        self.0.write_op_reading(reads, move |w| {
            for e in &extra {
                w.store_encoded(e)?;
            }
            let (mut record, location) = load_checked(w, id, expected_head)?;
            if resume {
                if !matches!(
                    record.status,
                    ThreadStatus::Completed | ThreadStatus::Failed
                ) {
                    return Err(ThreadError::WrongStatus {
                        thread: id,
                        status: record.status,
                        action: "resume from history (only completed or failed threads can)",
                    });
                }
            } else if location != Location::Active {
                return Err(ThreadError::WrongStatus {
                    thread: id,
                    status: record.status,
                    action: "append a step (resume it instead)",
                });
            }
            let old = record.clone();
            if resume {
                record.completed_at = None;
            }
            append_in(w, &old, record, location, &step, &blobs, after.clone())
        })
    }

    /// Resumes an ended (completed or failed) thread with a step: returns it
    /// from history to the active index and appends the step after its end
    /// node, in one transaction. If anything fails the thread stays in
    /// history unchanged.
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
    /// let t = low.start_thread(new)?;
    /// let done = EndSpec { return_code: 0, summary: "done".into(), prompt: "Done".into() };
    /// let ended = low.end_thread(t.id, t.head, done)?;
    /// assert_eq!(ended.record.status, ThreadStatus::Completed);
    /// let w = low.resume_ended(t.id, ended.record.head, step("one more"), again())?;
    /// assert_eq!(w.record.status, ThreadStatus::Idle);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resume_ended(
        &self,
        id: ThreadId,
        expected_head: Hash,
        step: StepWrite,
        after: Next,
    ) -> Result<Written, ThreadError> {
        let blobs = StepBlobs::new(&step.reply, &step.artifacts, &step.instruction)?;
        let reads = step_reads(self.0, id, expected_head, None);
        self.append_encoded(
            id,
            expected_head,
            Vec::new(),
            blobs,
            step,
            after,
            true,
            reads,
        )
    }

    /// Ends an active thread without a step (cancel, or an end decided
    /// outside a step): writes the end node and moves it to history.
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
    /// let t = low.start_thread(new)?;
    /// let done = EndSpec { return_code: 0, summary: "done".into(), prompt: "Done".into() };
    /// let w = low.end_thread(t.id, t.head, done)?;
    /// assert_eq!((w.record.status, Some(w.record.head)), (ThreadStatus::Completed, w.end));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn end_thread(
        &self,
        id: ThreadId,
        expected_head: Hash,
        end: EndSpec,
    ) -> Result<Written, ThreadError> {
        self.0
            .write_op_reading(index::record_reads_for(self.0, id), move |w| {
                let (mut record, location) = load_checked(w, id, expected_head)?;
                if location != Location::Active {
                    return Err(ThreadError::WrongStatus {
                        thread: id,
                        status: record.status,
                        action: "end it again",
                    });
                }
                let old = record.clone();
                let end_hash = write_end(w, &mut record, &end)?;
                record.updated_at = w.now_ms();
                index::put(w, Some((&old, location)), &record)?;
                Ok(Written {
                    record,
                    step: None,
                    end: Some(end_hash),
                })
            })
    }

    /// Records a failed attempt on the thread (no node, no head move): the
    /// status stays, `last_error` is set until the next committed step.
    /// An error longer than [`MAX_LAST_ERROR`] keeps its start and its end
    /// around a `[… N bytes cut …]` marker: the record is rewritten on
    /// every claim, so it must stay small whatever an agent printed.
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
    /// let t = low.start_thread(new)?;
    /// let r = low.record_failure(t.id, "the agent timed out")?;
    /// assert_eq!((r.last_error.as_deref(), r.head), (Some("the agent timed out"), t.head));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn record_failure(&self, id: ThreadId, error: &str) -> Result<ThreadRecord, ThreadError> {
        self.record_failure_counted(id, error, None)
    }

    /// [`LowLevel::record_failure`], adding the failed attempt's agent
    /// calls to the thread's usage totals.
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
    /// let t = low.start_thread(new)?;
    /// let paid = uwf_db::usage::StepUsage { calls: 2, ..Default::default() };
    /// let r = low.record_failure_counted(t.id, "HTTP 429", Some(paid))?;
    /// assert_eq!(r.usage.map(|u| u.calls), Some(2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn record_failure_counted(
        &self,
        id: ThreadId,
        error: &str,
        usage: Option<StepUsage>,
    ) -> Result<ThreadRecord, ThreadError> {
        let error = cap_error(error);
        self.update_record(id, move |r| {
            r.last_error = Some(error.clone());
            if let Some(u) = &usage {
                r.usage.get_or_insert_with(UsageTotals::default).add_step(u);
            }
            Ok(())
        })
    }

    /// Changes fields of a record that move no head (status claims, the
    /// active child, the agent spec), in one transaction.
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
    /// let t = low.start_thread(new)?;
    /// let r = low.update_record(t.id, |r| {
    ///     r.agent = Some("cmd:true".into());
    ///     Ok(())
    /// })?;
    /// assert_eq!((r.agent.as_deref(), r.head), (Some("cmd:true"), t.head));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn update_record(
        &self,
        id: ThreadId,
        mut change: impl FnMut(&mut ThreadRecord) -> Result<(), ThreadError> + Send + 'static,
    ) -> Result<ThreadRecord, ThreadError> {
        self.0
            .write_op_reading(index::record_reads_for(self.0, id), move |w| {
                let (mut record, location) = index::find(w.tables(), id)?
                    .ok_or_else(|| ThreadError::Unknown(id.to_string()))?;
                let old = record.clone();
                change(&mut record)?;
                record.id = old.id;
                record.head = old.head;
                record.start = old.start;
                record.updated_at = w.now_ms().max(old.updated_at);
                index::put(w, Some((&old, location)), &record)?;
                Ok(record)
            })
    }
}

/// Where a new thread's id came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum IdSource {
    /// Given by the caller (a LangGraph chain's id made from its thread):
    /// a thread may have it already, [`ThreadError::IdTaken`].
    Given,
    /// Drawn just now by [`ThreadId::generate`]: not looked up.
    Generated,
}

/// Writes a new thread's start node and record (`start_thread_as`).
fn start_in(
    w: &mut WriteTxn<'_>,
    new: &NewThread,
    id: ThreadId,
    claimed: bool,
    source: IdSource,
) -> Result<ThreadRecord, ThreadError> {
    if source == IdSource::Given && index::find(w.tables(), id)?.is_some() {
        return Err(ThreadError::IdTaken(id));
    }
    let prompt = w.put_blob(&Blob::content(new.prompt.as_str(), []))?;
    let start = w.put_blob(&Blob::Start(StartNode {
        depth: new.depth,
        max_rounds: new.max_rounds,
        name: new.workflow.clone(),
        parent_state: new.parent_state,
        prompt,
        workflow: new.workflow_hash,
    }))?;
    let now = w.now_ms();
    let record = ThreadRecord {
        active_child: None,
        agent: new.agent.clone(),
        agent_steps: Some(0),
        claimed_status: claimed.then_some(ThreadStatus::Idle),
        stop_requested_at: None,
        completed_at: None,
        created_at: now,
        cwd: new.cwd.clone(),
        fan_out: None,
        forked_from: None,
        head: start,
        id,
        labels: new.labels.clone(),
        last_end_seq: 0,
        last_error: None,
        next_instruction: Some(new.next_instruction.clone()),
        next_location: new.next_location.clone(),
        next_role: Some(new.next_role.clone()),
        parent_thread: new.parent_thread,
        seq: 0,
        staged_compact: None,
        start,
        status: if claimed {
            ThreadStatus::Running
        } else {
            ThreadStatus::Idle
        },
        suspend_message: None,
        suspended_role: None,
        updated_at: now,
        usage: None,
        workflow: new.workflow.clone(),
        workflow_hash: new.workflow_hash,
    };
    index::put(w, None, &record)?;
    Ok(record)
}

/// Appends a step to `record`; `old` is the record as stored (its index
/// entries are the ones to replace).
fn append_in(
    w: &mut WriteTxn<'_>,
    old: &ThreadRecord,
    mut record: ThreadRecord,
    location: Location,
    step: &StepWrite,
    blobs: &StepBlobs,
    after: Next,
) -> Result<Written, ThreadError> {
    let hash = write_state(
        w,
        &mut record,
        &step.role,
        step.meta.clone(),
        blobs,
        step.child_thread,
    )?;
    record.last_error = None;
    record.active_child = None;
    record.fan_out = None;
    if step.child_thread.is_none() && !step.meta.contains_key(super::JOIN_META) {
        record.agent_steps = record.agent_steps.map(|n| n + 1);
    }
    if let Some(usage) = StepUsage::of_meta(&step.meta) {
        record
            .usage
            .get_or_insert_with(UsageTotals::default)
            .add_step(&usage);
    }
    let end = apply_after(w, &mut record, after)?;
    record.updated_at = w.now_ms();
    index::put(w, Some((old, location)), &record)?;
    Ok(Written {
        record,
        step: Some(hash),
        end,
    })
}

/// Largest `last_error` stored on a thread record: 20 KiB.
pub const MAX_LAST_ERROR: usize = 20 << 10;

/// `error`, or its first 2 KiB and last 17 KiB around a marker when it is
/// longer than [`MAX_LAST_ERROR`] (cut at character boundaries).
fn cap_error(error: &str) -> String {
    if error.len() <= MAX_LAST_ERROR {
        return error.to_owned();
    }
    let mut head = 2 << 10;
    while !error.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = error.len() - (17 << 10);
    while !error.is_char_boundary(tail) {
        tail += 1;
    }
    let (start, rest) = error.split_at(head);
    let end = rest.get(tail - head..).unwrap_or_default();
    format!("{start}\n[… {} bytes cut …]\n{end}", tail - head)
}

#[cfg(test)]
mod cap_tests {
    use super::*;

    #[test]
    fn a_long_error_keeps_its_start_and_end() {
        assert_eq!(cap_error("short"), "short");
        let long = format!(
            "{}{}{}",
            "a".repeat(5000),
            "é".repeat(20_000),
            "z".repeat(100)
        );
        let capped = cap_error(&long);
        assert!(capped.len() <= MAX_LAST_ERROR + 64, "{}", capped.len());
        assert!(capped.starts_with("aaaa"));
        assert!(capped.ends_with("zzz"));
        assert!(capped.contains("bytes cut"));
    }
}

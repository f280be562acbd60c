//! Forks: a new thread whose head is an existing node of the source's chain
//! (`docs/design.md` §5b). Nothing is copied; the chain check jumps back
//! through ancestor lists, 11 nodes per read.

use super::index;
use super::write::LowLevel;
use super::{END_ROLE, Next, ThreadError, ThreadId, ThreadRecord, ThreadStatus};
use crate::hash::Hash;
use crate::node::Blob;

impl LowLevel<'_> {
    /// Forks `source` at `at` (its start or any role step on its chain; not
    /// an end node): a new record pointing at the shared node, nothing
    /// copied. Checking that `at` is on the chain reads about
    /// `distance / 11` nodes back from the head (none for a fork at the head).
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
    /// let fork = low.fork_thread(t.id, head, again())?;
    /// assert_ne!(fork.id, t.id);
    /// assert_eq!(fork.head, head); // nothing copied: the fork shares the chain
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fork_thread(
        &self,
        source: ThreadId,
        at: Hash,
        state: Next,
    ) -> Result<ThreadRecord, ThreadError> {
        self.fork_thread_labelled(source, at, state, None, None)
    }

    /// [`fork_thread`](Self::fork_thread) whose fork carries `labels`
    /// instead of the source's, set in the same transaction (so no reader
    /// ever finds the fork under the source's labels), and the id `id` when
    /// given ([`ThreadError::IdTaken`] if a thread has it).
    ///
    /// ```
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// # use uwf_db::thread::{NewThread, Next};
    /// # let new = NewThread { workflow: "two".into(), workflow_hash: hash, prompt: "task".into(), max_rounds: 10, depth: 0, parent_state: None, parent_thread: None, next_role: "writer".into(), next_instruction: "Write it".into(), agent: None, cwd: None, next_location: None, labels: [("copy".to_string(), "no".to_string())].into() };
    /// # let again = || Next::Role { role: "writer".into(), instruction: "Again".into(), location: None };
    /// let low = store.threads().low_level();
    /// let t = low.start_thread(new)?;
    /// let labels = [("copy".to_string(), "yes".to_string())].into();
    /// let fork = low.fork_thread_labelled(t.id, t.head, again(), Some(labels), None)?;
    /// assert_eq!(fork.labels["copy"], "yes");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fork_thread_labelled(
        &self,
        source: ThreadId,
        at: Hash,
        state: Next,
        labels: Option<super::Labels>,
        id: Option<ThreadId>,
    ) -> Result<ThreadRecord, ThreadError> {
        if let Some(l) = &labels {
            super::labels::check_labels(l)?;
        }
        self.0.write(|w| {
            if let Some(id) = id
                && index::find(w.tables(), id)?.is_some()
            {
                return Err(ThreadError::IdTaken(id));
            }
            let (src, _) = index::find(w.tables(), source)?
                .ok_or_else(|| ThreadError::Unknown(source.to_string()))?;
            if let (ThreadStatus::Suspended, Some(child)) = (src.status, src.active_child) {
                return Err(ThreadError::ForkInsideChild {
                    thread: source,
                    child,
                });
            }
            let (seq, last_end_seq) = if at == src.start {
                (0, 0)
            } else {
                let node = match w.get_blob(&at)? {
                    Some(Blob::State(s)) => s,
                    Some(_) => {
                        return Err(ThreadError::WrongKind {
                            hash: at,
                            expected: "state",
                        });
                    }
                    None => return Err(ThreadError::MissingNode { hash: at }),
                };
                if node.role == END_ROLE {
                    return Err(ThreadError::ForkAtEnd {
                        thread: source,
                        node: at,
                    });
                }
                if node.start != src.start || !super::chain::on_chain(w, src.head, &at, node.seq)? {
                    return Err(ThreadError::NotOnChain {
                        node: at,
                        thread: source,
                    });
                }
                let last_end = if node.seq > src.last_end_seq {
                    src.last_end_seq
                } else {
                    super::chain::last_end_before(w, &node)?
                };
                (node.seq, last_end)
            };
            let now = w.now_ms();
            let (
                status,
                next_role,
                next_instruction,
                next_location,
                suspended_role,
                suspend_message,
            ) = match state.clone() {
                Next::Role {
                    role,
                    instruction,
                    location,
                } => (
                    ThreadStatus::Idle,
                    Some(role),
                    Some(instruction),
                    location,
                    None,
                    None,
                ),
                Next::Suspend { role, message } => (
                    ThreadStatus::Suspended,
                    None,
                    None,
                    None,
                    Some(role),
                    Some(message),
                ),
                Next::End(_) => {
                    return Err(ThreadError::ForkIntoEnd {
                        thread: source,
                        node: at,
                    });
                }
            };
            let record = ThreadRecord {
                active_child: None,
                agent: src.agent.clone(),
                agent_steps: None,
                claimed_status: None,
                stop_requested_at: None,
                completed_at: None,
                created_at: now,
                cwd: src.cwd.clone(),
                fan_out: None,
                forked_from: Some(super::ForkOrigin {
                    node: at,
                    thread: source,
                }),
                head: at,
                id: id.unwrap_or_else(ThreadId::generate),
                labels: labels.clone().unwrap_or_else(|| src.labels.clone()),
                last_end_seq,
                last_error: None,
                next_instruction,
                next_location,
                next_role,
                parent_thread: src.parent_thread,
                seq,
                staged_compact: None,
                start: src.start,
                status,
                suspend_message,
                suspended_role,
                updated_at: now,
                usage: None,
                workflow: src.workflow.clone(),
                workflow_hash: src.workflow_hash,
            };
            index::put(w, None, &record)?;
            Ok(record)
        })
    }
}

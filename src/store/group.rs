//! Group commit (`docs/design.md` §5d): one writer thread takes write
//! requests from a `crossbeam-channel`, runs every request waiting in one
//! LMDB transaction, commits once, and only then answers each request (from
//! a thread of its own, so the writer goes on to its next group). If a
//! request fails, the transaction is dropped and the group runs again
//! without it, so a failing request is rolled back alone.
//!
//! A request that panics is rolled back alone the same way, and the panic
//! is resumed in the thread that sent it (as it would be without group
//! commit). Should the writer thread itself die, the queue dies with it:
//! every request waiting or sent later fails with
//! [`StoreError::GroupStopped`] instead of waiting forever.
//!
//! A server backend may have several groups in flight
//! (`Backend::parallel_writers` writer threads). The first writer works as
//! above; the others sleep until a sender finds [`PARALLEL_MIN`] requests
//! waiting and leaves a token, then take a group beside the first. Should
//! the first writer die, a channel only it holds closes and wakes the
//! others, each of which then takes every request it can; the queue dies
//! with the last of them (`docs/design.md` §5d, "Groups in parallel").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::Thread;

use crossbeam_channel::{Receiver, Sender, bounded, select, unbounded};

use super::{Store, StoreError, StoreInner, WriteTxn};
use crate::backend::Table;

/// Most requests in one group when none is given.
pub const DEFAULT_MAX_GROUP: usize = 256;

/// With several writers (a server backend), a second group goes beside
/// the first only once this many requests wait (or `max_group`, if
/// smaller): a transaction costs the server about as much as several
/// steps, so small groups side by side cost more than they save
/// (`docs/design.md` §5d, "Groups in parallel").
pub(crate) const PARALLEL_MIN: usize = 32;

/// A request: runs in the group's transaction (perhaps more than once),
/// says whether it succeeded, and is told when its group is durable.
struct Request {
    job: Box<dyn FnMut(&mut WriteTxn<'_>) -> bool + Send>,
    /// Keys the job reads first (its thread's record): fetched for the
    /// whole group with its `BEGIN` on a server backend.
    reads: Vec<(Table, Vec<u8>)>,
    ack: Arc<Ack>,
}

/// Where a request is answered. The waiting thread parks (no spinning:
/// with many drivers waiting, spinning would steal the writer's CPU) and
/// the answering thread (or, without one, the writer) unparks it.
struct Ack {
    outcome: Mutex<Option<Result<(), StoreError>>>,
    /// The request's job panicked: the payload, resumed by the sender.
    panicked: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    waiter: Thread,
}

impl Ack {
    fn answer(&self, outcome: Result<(), StoreError>) {
        let mut slot = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(outcome);
        }
        drop(slot);
        self.waiter.unpark();
    }

    fn wait(&self) -> Result<(), StoreError> {
        loop {
            if let Some(r) = self
                .outcome
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
            {
                return r;
            }
            std::thread::park();
        }
    }
}

impl Drop for Request {
    /// A request dropped unanswered (the writer stopped) must not leave its
    /// sender parked forever.
    fn drop(&mut self) {
        self.ack.answer(Err(StoreError::GroupStopped));
    }
}

/// The sending side, shared by the clones of a group-commit handle.
pub(crate) struct GroupSender {
    tx: Sender<Request>,
    /// With more than one writer: where a sender that finds
    /// `parallel_min` requests waiting (its own included) leaves a token,
    /// which wakes a writer beside the first.
    queue_deep: Option<Sender<()>>,
    /// [`PARALLEL_MIN`], or `max_group` if smaller.
    parallel_min: usize,
}

/// What the writer did.
#[derive(Debug, Default)]
struct Counters {
    groups: AtomicU64,
    requests: AtomicU64,
}

/// Group-commit figures for a finished [`Store::group_commit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct GroupStats {
    /// Transactions committed (one fsync each in `sync` durability).
    pub groups: u64,
    /// Write requests they held.
    pub requests: u64,
}

impl GroupStats {
    /// Requests per group.
    pub fn average_group(&self) -> f64 {
        if self.groups == 0 {
            0.0
        } else {
            self.requests as f64 / self.groups as f64
        }
    }
}

impl Store {
    /// Runs `f` with a handle of this store whose thread writes go through
    /// one writer thread that commits them in groups (`max_group` at most,
    /// `0` for the default), then waits for the writer to finish. Every
    /// write through the handle returns only once its group is durable.
    /// Clones of the handle must not outlive `f`: the writer stops when the
    /// last one is dropped.
    ///
    /// ```
    /// use uwf_db::{Blob, Store};
    /// let store = Store::memory();
    /// let (hashes, _stats) = store.group_commit(0, |grouped| {
    ///     std::thread::scope(|s| {
    ///         let puts: Vec<_> = (0..4)
    ///             .map(|i| {
    ///                 let g = grouped.clone();
    ///                 s.spawn(move || g.write_op(move |w| w.put_blob(&Blob::content(format!("{i}"), []))))
    ///             })
    ///             .collect();
    ///         puts.into_iter().map(|p| p.join().unwrap()).collect::<Result<Vec<_>, _>>()
    ///     })
    /// });
    /// assert_eq!(hashes?.len(), 4);
    /// assert_eq!(store.blob_count()?, 4);
    /// # Ok::<(), uwf_db::StoreError>(())
    /// ```
    pub fn group_commit<R>(
        &self,
        max_group: usize,
        f: impl FnOnce(&Store) -> R,
    ) -> (R, GroupStats) {
        let max_group = if max_group == 0 {
            DEFAULT_MAX_GROUP
        } else {
            max_group
        };
        let (tx, rx) = unbounded::<Request>();
        let counters = Counters::default();
        let out = std::thread::scope(|scope| {
            let inner = &self.inner;
            let counters = &counters;
            // The senders of a committed group are woken from a thread of
            // their own: a wake-up is a system call each, and made by a
            // writer they would hold it from its next group (about 17%
            // of group commit's throughput on 2 cores). Should that thread
            // be missing, a writer wakes them itself.
            let (answers, answered) = unbounded::<Answered>();
            let spawned = std::thread::Builder::new()
                .name("uwf-group-answer".into())
                .spawn_scoped(scope, move || {
                    for (batch, outcome) in answered {
                        answer_all(batch, &outcome);
                    }
                });
            drop(spawned);
            // The writers own the receiver: if they die, the queue goes
            // with them and no sender waits for an answer that will not
            // come. A server backend that commits in parallel gets more
            // than one (`Backend::parallel_writers`): the first takes
            // every group it can; the others sleep until a sender says the
            // queue is deep, and take a group beside it then. Should the
            // first end (a panic; a thread that could not be started), the
            // channel it alone holds closes, which wakes the others: from
            // then on each takes every request it can.
            let writers = inner.backend.parallel_writers().max(1);
            let parallel_min = PARALLEL_MIN.min(max_group);
            let (queue_deep, queue_deep_rx) = bounded::<()>(1);
            let (first_alive, first_alive_rx) = bounded::<()>(0);
            let mut first_alive = Some(first_alive);
            for _ in 0..writers {
                let rx = rx.clone();
                let answers = answers.clone();
                let role = match first_alive.take() {
                    Some(alive) => Role::First { _alive: alive },
                    None => Role::Beside {
                        queue_deep: queue_deep_rx.clone(),
                        first_alive: first_alive_rx.clone(),
                        parallel_min,
                    },
                };
                let spawned = std::thread::Builder::new()
                    .name("uwf-group-commit".into())
                    .spawn_scoped(scope, move || {
                        writer(inner, rx, role, max_group, counters, &answers)
                    });
                if let Err(e) = spawned {
                    // No writer: every write through the handle fails with
                    // `GroupStopped` (its request is dropped unanswered).
                    drop(e);
                }
            }
            drop(rx);
            drop(answers);
            let grouped = Store {
                inner: Arc::clone(&self.inner),
                group: Some(Arc::new(GroupSender {
                    tx,
                    // With one writer no one waits for the token: the
                    // sending side is dropped here.
                    queue_deep: (writers > 1).then_some(queue_deep),
                    parallel_min,
                })),
            };
            f(&grouped)
            // `grouped` drops here; the writer ends when its last clone does.
        });
        let stats = GroupStats {
            groups: counters.groups.load(Ordering::Relaxed),
            requests: counters.requests.load(Ordering::Relaxed),
        };
        (out, stats)
    }

    /// Runs `f` in a write transaction and commits it: through the group
    /// writer when this handle has one (then `f` runs on the writer's thread,
    /// in the transaction of a group, and this returns once the group is
    /// durable), else as [`Store::write`]. `f` may run more than once: when
    /// another request of its group fails, the group runs again without that
    /// one. It must have no effects outside the transaction.
    ///
    /// ```
    /// use uwf_db::{Blob, Store};
    /// let store = Store::memory();
    /// // Outside a group commit it is a plain write transaction.
    /// let hash = store.write_op(|w| w.put_blob(&Blob::content("x", [])))?;
    /// assert!(store.contains(&hash)?);
    /// # Ok::<(), uwf_db::StoreError>(())
    /// ```
    pub fn write_op<R, E>(
        &self,
        f: impl FnMut(&mut WriteTxn<'_>) -> Result<R, E> + Send + 'static,
    ) -> Result<R, E>
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        self.write_op_reading(Vec::new(), f)
    }

    /// [`Store::write_op`] for a job that reads `reads` first (a thread's
    /// record): a server backend fetches them with the transaction's
    /// `BEGIN` — for every request of a group at once, their order locks
    /// taken in one sorted pass (`docs/design.md` §8f).
    pub(crate) fn write_op_reading<R, E>(
        &self,
        reads: Vec<(Table, Vec<u8>)>,
        mut f: impl FnMut(&mut WriteTxn<'_>) -> Result<R, E> + Send + 'static,
    ) -> Result<R, E>
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let Some(group) = &self.group else {
            return self.write_reading(&reads, f);
        };
        let slot: Arc<Mutex<Option<Result<R, E>>>> = Arc::new(Mutex::new(None));
        let ack = Arc::new(Ack {
            outcome: Mutex::new(None),
            panicked: Mutex::new(None),
            waiter: std::thread::current(),
        });
        let job_slot = Arc::clone(&slot);
        let job = Box::new(move |w: &mut WriteTxn<'_>| {
            let r = f(w);
            let ok = r.is_ok();
            *job_slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            ok
        });
        group
            .tx
            .send(Request {
                job,
                reads,
                ack: Arc::clone(&ack),
            })
            .map_err(|_| StoreError::GroupStopped)?;
        if let Some(queue_deep) = &group.queue_deep
            && group.tx.len() >= group.parallel_min
        {
            // Full means a token waits already.
            let _ = queue_deep.try_send(());
        }
        let done = ack.wait();
        if let Some(payload) = ack
            .panicked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            // `f` panicked on the writer's thread: panic here, where it
            // would have without group commit (its writes were discarded).
            std::panic::resume_unwind(payload);
        }
        let result = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
        match done {
            Ok(()) => result.unwrap_or_else(|| Err(StoreError::GroupStopped.into())),
            // The group was not stored: a request that failed on its own
            // says why; one that succeeded reports the commit's failure.
            Err(e) => match result {
                Some(Err(own)) => Err(own),
                _ => Err(e.into()),
            },
        }
    }
}

/// A group's requests and its commit's outcome, for the answering thread.
type Answered = (Vec<Request>, Result<(), Arc<StoreError>>);

/// Tells each request of a group the group's outcome and wakes its sender.
fn answer_all(batch: Vec<Request>, outcome: &Result<(), Arc<StoreError>>) {
    for req in batch {
        req.ack.answer(match outcome {
            Ok(()) => Ok(()),
            Err(e) => Err(e.for_each_request()),
        });
    }
}

/// What a writer thread of a group-commit handle does.
enum Role {
    /// Takes the next request as it comes, and the rest waiting with it.
    /// Holds the only sender of a channel that closes when it ends.
    First { _alive: Sender<()> },
    /// The same, once the first writer is gone.
    Any,
    /// Sleeps until a token says `parallel_min` requests wait (another
    /// group is then usually in flight: the first writer takes what waits
    /// whenever it is free) and takes a group then; or until the first
    /// writer is gone, and is [`Role::Any`] from then on.
    Beside {
        queue_deep: Receiver<()>,
        first_alive: Receiver<()>,
        parallel_min: usize,
    },
}

/// A writer thread: one group per loop, until every sender is gone; each
/// group's senders are answered through `answers`.
fn writer(
    inner: &StoreInner,
    rx: Receiver<Request>,
    mut role: Role,
    max_group: usize,
    counters: &Counters,
    answers: &Sender<Answered>,
) {
    loop {
        let mut batch = Vec::new();
        match &role {
            Role::First { .. } | Role::Any => match rx.recv() {
                Ok(first) => batch.push(first),
                Err(_) => return,
            },
            Role::Beside {
                queue_deep,
                first_alive,
                parallel_min,
            } => {
                // Still deep after its last group: no token may come (every
                // request may be sent already), so it goes on at once.
                if rx.len() < *parallel_min {
                    select! {
                        recv(queue_deep) -> token => if token.is_err() {
                            // Every sender is gone: no one waits for an
                            // answer, and the first writer drains the rest.
                            return;
                        },
                        recv(first_alive) -> _ => {
                            // Nothing is ever sent on it: closed, the
                            // first writer is gone.
                            role = Role::Any;
                            continue;
                        },
                    }
                    if rx.len() < *parallel_min {
                        continue;
                    }
                }
                gather(&rx, &mut batch, max_group);
                if batch.is_empty() {
                    continue;
                }
            }
        }
        // The rest of the group is gathered once its transaction has begun.
        let outcome = commit_group(inner, &mut batch, &rx, max_group).map_err(Arc::new);
        counters.groups.fetch_add(1, Ordering::Relaxed);
        counters
            .requests
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        // Only now, the group durable (or refused), are its senders told.
        if let Err(crossbeam_channel::SendError((batch, outcome))) = answers.send((batch, outcome))
        {
            answer_all(batch, &outcome);
        }
    }
}

/// Adds the requests waiting in `rx` to `batch`, up to `max_group`.
fn gather(rx: &Receiver<Request>, batch: &mut Vec<Request>, max_group: usize) {
    while batch.len() < max_group {
        match rx.try_recv() {
            Ok(r) => batch.push(r),
            Err(_) => break,
        }
    }
}

/// Runs the group in one transaction and commits it. A request that fails
/// is left out and the rest run again in a fresh transaction (its own
/// error is in its result); so every request either is in the commit or
/// failed alone. Returns the commit's outcome.
///
/// The requests waiting in `rx` join the group once its first transaction
/// has begun: on LMDB beginning waits for the store's one writer, which may
/// be another process's, and what queued meanwhile would otherwise wait for
/// a transaction of its own (`docs/design.md` §5d).
fn commit_group(
    inner: &StoreInner,
    batch: &mut Vec<Request>,
    rx: &Receiver<Request>,
    max_group: usize,
) -> Result<(), StoreError> {
    // Empty until the group is gathered (a group is never empty).
    let mut left_out = Vec::new();
    let (mut lost, mut conflicts) = (0, 0);
    loop {
        let mut txn = super::begin_with_retries(|| WriteTxn::begin(inner))?;
        if left_out.is_empty() {
            gather(rx, batch, max_group);
            left_out = vec![false; batch.len()];
        }
        let reads: Vec<(Table, &[u8])> = batch
            .iter()
            .zip(&left_out)
            .filter(|(_, out)| !**out)
            .flat_map(|(req, _)| req.reads.iter().map(|(t, k)| (*t, k.as_slice())))
            .collect();
        txn.prefetch(&reads)?;
        let mut failed = None;
        for (i, (req, out)) in batch.iter_mut().zip(&left_out).enumerate() {
            if *out {
                continue;
            }
            let ran =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (req.job)(&mut txn)));
            let ok = match ran {
                Ok(ok) => ok,
                // Left out like a failed request; its sender resumes the
                // panic. The transaction it may have half-written is dropped.
                Err(payload) => {
                    *req.ack.panicked.lock().unwrap_or_else(|p| p.into_inner()) = Some(payload);
                    false
                }
            };
            if !ok {
                failed = Some(i);
                break;
            }
        }
        match failed {
            // The connection was lost under it, not the request's fault:
            // nothing was applied, all run again on a new connection.
            Some(_) if txn.connection_lost() && lost < super::LOST_CONNECTION_TRIES => {
                lost += 1;
                tracing::warn!(
                    requests = batch.len(),
                    "connection lost under a group commit; running the group again"
                );
            }
            // A deadlock with another group (or another process's
            // writer): not the request's fault either; all run again.
            Some(_) if txn.serialization_failed() && conflicts < super::SERIALIZATION_RETRIES => {
                conflicts += 1;
            }
            // Dropping the transaction discards everything it wrote.
            Some(i) => {
                if let Some(out) = left_out.get_mut(i) {
                    *out = true;
                }
            }
            None => match txn.commit() {
                Err(StoreError::Backend(crate::backend::BackendError::Serialization {
                    ..
                })) if conflicts < super::SERIALIZATION_RETRIES => {
                    conflicts += 1;
                }
                done => {
                    tracing::trace!(
                        requests = batch.len(),
                        left_out = left_out.iter().filter(|o| **o).count(),
                        "group committed"
                    );
                    return done;
                }
            },
        }
    }
}

//! Group commit (`docs/design.md` §5d): one writer thread takes write
//! requests from a `crossbeam-channel`, runs every request waiting in one
//! LMDB transaction (each in a nested transaction, so one failing request is
//! rolled back alone), commits once, and only then answers each request.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};

use super::{Store, StoreError, StoreInner, WriteTxn};

/// Most requests in one group when none is given.
pub const DEFAULT_MAX_GROUP: usize = 256;

/// A request: runs in a nested transaction, says whether it succeeded (so
/// its nested transaction is kept), and is told when its group is durable.
struct Request {
    job: Box<dyn FnOnce(&mut WriteTxn<'_>) -> bool + Send>,
    done: Sender<Result<(), StoreError>>,
}

/// The sending side, shared by the clones of a group-commit handle.
pub(crate) struct GroupSender {
    tx: Sender<Request>,
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
            scope.spawn(move || writer(inner, &rx, max_group, counters));
            let grouped = Store {
                inner: Arc::clone(&self.inner),
                group: Some(Arc::new(GroupSender { tx })),
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
    /// in a nested transaction of a group, and this returns once the group
    /// is durable), else as [`Store::write`].
    pub fn write_op<R, E>(
        &self,
        f: impl FnOnce(&mut WriteTxn<'_>) -> Result<R, E> + Send + 'static,
    ) -> Result<R, E>
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let Some(group) = &self.group else {
            return self.write(f);
        };
        let (result_tx, result_rx) = bounded::<Result<R, E>>(1);
        let (done_tx, done_rx) = bounded::<Result<(), StoreError>>(1);
        let job = Box::new(move |w: &mut WriteTxn<'_>| {
            let r = f(w);
            let ok = r.is_ok();
            let _ = result_tx.send(r);
            ok
        });
        group
            .tx
            .send(Request { job, done: done_tx })
            .map_err(|_| StoreError::GroupStopped)?;
        match done_rx.recv() {
            Ok(Ok(())) => result_rx
                .try_recv()
                .unwrap_or_else(|_| Err(StoreError::GroupStopped.into())),
            // The group was not stored: a request that failed on its own
            // says why; one that succeeded reports the commit's failure.
            Ok(Err(e)) => match result_rx.try_recv() {
                Ok(Err(own)) => Err(own),
                _ => Err(e.into()),
            },
            Err(_) => Err(StoreError::GroupStopped.into()),
        }
    }
}

/// The writer thread: one group per loop, until every sender is gone.
fn writer(inner: &StoreInner, rx: &Receiver<Request>, max_group: usize, counters: &Counters) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < max_group {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let n = batch.len() as u64;
        let mut done = Vec::with_capacity(batch.len());
        let outcome = commit_group(inner, batch, &mut done);
        counters.groups.fetch_add(1, Ordering::Relaxed);
        counters.requests.fetch_add(n, Ordering::Relaxed);
        for d in done {
            let _ = d.send(match &outcome {
                Ok(()) => Ok(()),
                Err(e) => Err(e.for_each_request()),
            });
        }
    }
}

fn commit_group(
    inner: &StoreInner,
    batch: Vec<Request>,
    done: &mut Vec<Sender<Result<(), StoreError>>>,
) -> Result<(), StoreError> {
    let mut txn = WriteTxn::begin(inner);
    let mut failure = None;
    for req in batch {
        done.push(req.done);
        if failure.is_some() {
            continue;
        }
        let result = txn
            .as_mut()
            .map_err(|e| e.for_each_request())
            .and_then(|t| {
                let mut child = t.nested()?;
                if (req.job)(&mut child) {
                    child.commit()?;
                }
                Ok(())
            });
        if let Err(e) = result {
            failure = Some(e);
        }
    }
    match failure {
        Some(e) => Err(e),
        None => txn?.commit(),
    }
}

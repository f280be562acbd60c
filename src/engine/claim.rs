//! Driver claims: a thread is held by one driving process at a time.
//!
//! A claim is the backend's claim lock on the thread
//! ([`Backend::try_lock_claim`](crate::backend::Backend::try_lock_claim):
//! on LMDB an open-file-description lock on one byte of
//! `<store>/claims.lock`; in memory, a set in the backend), held for the
//! whole drive, plus the record's status `running` (the status underneath
//! kept in `claimed_status`). The lock dies with its holder, so a driver
//! killed with `kill -9` leaves a record that says `running` but a lock
//! anyone can take: the next driver takes it over. Each store handle tracks
//! the claims it holds (in its engine state), so nested calls reuse the
//! outer claim. A claim is taken under a [`Cancel`] token, which gives the
//! thread its status back when it is cancelled.

use super::Engine;
use std::collections::HashMap;
use std::sync::Arc;

use super::EngineError;
use super::cancel::Cancel;
use crate::backend::HeldLock;
use crate::store::Store;
use crate::thread::{ThreadError, ThreadId, ThreadRecord, ThreadStatus};

/// A held claim; dropping it releases the thread (status back from
/// `running` to what the drive left) and the lock. [`Claim::release`] does
/// the same and reports a failure to write the record.
#[derive(Debug)]
pub struct Claim {
    store: Store,
    id: ThreadId,
    /// The backend's lock, when this claim took it (not a nested claim);
    /// dropping it (with the store handle's copy, which `forget` drops
    /// first) unlocks.
    lock: Option<Arc<dyn HeldLock>>,
    /// The token the claim was taken under (it releases the claim when
    /// cancelled).
    cancel: Cancel,
}

// The locking primitive is the backend's (`Backend::try_lock_claim`): on
// LMDB one byte of `<store>/claims.lock` per thread (`docs/design.md` §4b).

/// Takes the thread's claim lock: `Ok(None)` when a live holder elsewhere
/// (another process, or another store handle) has it.
fn try_lock(store: &Store, id: ThreadId) -> Result<Option<Box<dyn HeldLock>>, EngineError> {
    Ok(store.backend().try_lock_claim(id.to_bytes())?)
}

/// Whether a live holder elsewhere has the thread's claim lock.
fn is_locked(store: &Store, id: ThreadId) -> Result<bool, EngineError> {
    Ok(store.backend().claim_locked(id.to_bytes())?)
}

/// The threads this store handle holds claims on: [`Held::lock`] them.
fn held(store: &Store) -> Held {
    Held(store.layer_state::<super::state::EngineState>())
}

/// The store's engine state, kept alive while its claim map is locked.
struct Held(Arc<super::state::EngineState>);

impl Held {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ThreadId, Option<Arc<dyn HeldLock>>>> {
        self.0.claims.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether a live driver (another process, or a claim of this store
/// handle) holds the thread. A lock file that cannot be read is an error,
/// not "not held".
pub fn is_held(store: &Store, id: ThreadId) -> Result<bool, EngineError> {
    if held(store).lock().contains_key(&id) {
        return Ok(true);
    }
    is_locked(store, id)
}

/// [`is_held`] for many threads, in their order, with one probe of the
/// backend.
pub fn are_held(store: &Store, ids: &[ThreadId]) -> Result<Vec<bool>, EngineError> {
    let mut held_here = Vec::with_capacity(ids.len());
    {
        let state = held(store);
        let held = state.lock();
        held_here.extend(ids.iter().map(|id| held.contains_key(id)));
    }
    if held_here.iter().all(|h| *h) {
        return Ok(held_here);
    }
    let keys: Vec<_> = ids.iter().map(|id| id.to_bytes()).collect();
    let elsewhere = store.backend().claims_locked(&keys)?;
    Ok(held_here
        .into_iter()
        .zip(elsewhere)
        .map(|(here, there)| here || there)
        .collect())
}

impl Engine {
    /// This engine's claim map: its own state, no lookup in the store.
    fn held(&self) -> Held {
        Held(Arc::clone(&self.state))
    }
}

impl Engine {
    /// Unlinks a thread ([`Threads::remove`](crate::thread::Threads::remove)) unless a live driver
    /// holds it ([`EngineError::RemoveDriven`]): what `thread rm` does.
    /// Its blobs stay until garbage collection frees them.
    ///
    /// ```
    /// use uwf_db::Store;
    /// use uwf_db::engine::StartOptions;
    /// # let store = Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// let thread = store.engine().start_workflow(hash, "task", &StartOptions::default())?;
    /// let removed = store.engine().remove_undriven_thread(thread.id)?;
    /// assert_eq!(removed.id, thread.id);
    /// assert!(store.threads().get(thread.id)?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn remove_undriven_thread(&self, id: ThreadId) -> Result<ThreadRecord, EngineError> {
        if is_held(&self.store, id)? {
            return Err(EngineError::RemoveDriven { thread: id });
        }
        Ok(self.threads().remove(id)?)
    }

    /// Takes the driver's lock for a thread that does not exist yet (see
    /// [`LowLevel::start_thread_as`](crate::thread::LowLevel::start_thread_as)); dropping the claim releases it.
    ///
    /// ```
    /// use uwf_db::engine::{Cancel, claim};
    /// use uwf_db::thread::ThreadId;
    /// let store = uwf_db::Store::memory();
    /// let id = ThreadId::generate();
    /// let held = store.engine().claim_new(id, &Cancel::new())?;
    /// assert!(claim::is_held(&store, id)?);
    /// drop(held);
    /// assert!(!claim::is_held(&store, id)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn claim_new(&self, id: ThreadId, cancel: &Cancel) -> Result<Claim, EngineError> {
        self.lock_claim(id, false, cancel)
    }

    /// Claims a thread for a drive under `cancel` (cancelling it releases
    /// the claim). Refused while another live driver holds it; a claim left
    /// by a dead driver is taken over. Claiming a thread this store handle
    /// already holds returns a claim that releases nothing.
    ///
    /// ```
    /// use uwf_db::engine::{Cancel, claim};
    /// use uwf_db::thread::ThreadStatus;
    /// # let store = uwf_db::Store::memory();
    /// # let yaml = "name: two\nroles:\n  writer: { goal: Write }\ngraph:\n  $START: { _: { role: writer, prompt: 'Write it' } }\n  writer: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let wf = uwf_db::workflow::parse_workflow(yaml, Some("two"), &|_| false).unwrap();
    /// # let (hash, _) = store.workflows().add(&wf)?;
    /// let started = store.engine().start_workflow(hash, "task", &Default::default())?;
    /// let held = store.engine().claim(started.id, &Cancel::new())?;
    /// assert!(claim::is_held(&store, started.id)?);
    /// assert_eq!(store.threads().get(started.id)?.ok_or("gone")?.status, ThreadStatus::Running);
    /// drop(held);
    /// assert!(!claim::is_held(&store, started.id)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn claim(&self, id: ThreadId, cancel: &Cancel) -> Result<Claim, EngineError> {
        self.lock_claim(id, true, cancel)
    }

    fn lock_claim(&self, id: ThreadId, mark: bool, cancel: &Cancel) -> Result<Claim, EngineError> {
        if cancel.is_cancelled() {
            return Err(EngineError::Interrupted);
        }
        let outer = {
            let state = self.held();
            let mut held = state.lock();
            match held.get(&id) {
                Some(lock) => Some(lock.clone()),
                None => {
                    held.insert(id, None);
                    None
                }
            }
        };
        if let Some(lock) = outer {
            // Nested: the outer claim of this store handle covers it, if
            // its lock is still held (a lock in a lost server connection
            // may belong to another runner by now).
            if let Some(lock) = lock {
                lock.check()?;
            }
            return Ok(Claim {
                store: self.store.clone(),
                id,
                lock: None,
                cancel: cancel.clone(),
            });
        }
        let unhold = || {
            self.held().lock().remove(&id);
        };
        let file: Arc<dyn HeldLock> = match try_lock(&self.store, id) {
            Ok(Some(f)) => Arc::from(f),
            Ok(None) => {
                unhold();
                return Err(EngineError::Claimed { thread: id });
            }
            Err(e) => {
                unhold();
                return Err(e);
            }
        };
        let marked = if !mark {
            Ok(())
        } else {
            self.threads()
                .low_level()
                .update_record(id, |r| {
                    // A stop asked of an earlier driver is not this one's.
                    r.stop_requested_at = None;
                    match (r.status, r.claimed_status) {
                        // A dead driver's claim: keep the status underneath.
                        (ThreadStatus::Running, Some(_)) => {
                            tracing::debug!(thread = %r.id, "a dead driver's thread taken over");
                        }
                        (s, _) if s.is_done() => {}
                        (s, _) => {
                            r.claimed_status = Some(s);
                            r.status = ThreadStatus::Running;
                        }
                    }
                    Ok(())
                })
                .map(|_| ())
        };
        if let Err(e) = marked {
            drop(file);
            unhold();
            return Err(e.into());
        }
        self.held().lock().insert(id, Some(Arc::clone(&file)));
        cancel.claim_taken(&self.store, id, release_status);
        let claim = Claim {
            store: self.store.clone(),
            id,
            lock: Some(file),
            cancel: cancel.clone(),
        };
        // Cancelled while the claim was being taken: `cancel` may have
        // missed it; dropping it releases it.
        if cancel.is_cancelled() {
            return Err(EngineError::Interrupted);
        }
        Ok(claim)
    }
}

/// Gives a claimed thread its status back (`running` → what the drive left
/// underneath), without touching the lock. Usually the drive's last commit
/// (an end or a suspend) did it already and nothing is written.
///
/// A lost server connection is retried on a new one (a few times, briefly
/// apart): a drive that failed because its connection was cut would else
/// leave its thread `running` until another driver takes it over.
fn restore_status(store: &Store, id: ThreadId) -> Result<(), EngineError> {
    let mut attempt = 0;
    loop {
        match restore_status_once(store, id) {
            Err(e) if attempt < 3 && connection_lost(&e) => {
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_millis(100 * attempt));
            }
            other => return other,
        }
    }
}

fn connection_lost(e: &EngineError) -> bool {
    match e {
        EngineError::Store(s) | EngineError::Thread(ThreadError::Store(s)) => {
            s.is_connection_lost()
        }
        _ => false,
    }
}

fn restore_status_once(store: &Store, id: ThreadId) -> Result<(), EngineError> {
    let claimed = store
        .threads()
        .get(id)?
        .is_some_and(|r| r.status == ThreadStatus::Running || r.claimed_status.is_some());
    if claimed {
        store.threads().low_level().update_record(id, |r| {
            if let (ThreadStatus::Running, Some(s)) = (r.status, r.claimed_status) {
                r.status = s;
            }
            r.claimed_status = None;
            Ok(())
        })?;
    }
    Ok(())
}

/// For [`Cancel::cancel`]: gives the thread its status back at once (the
/// lock and the bookkeeping go when the drive drops its claim, so no other
/// claim of this store handle can slip in between). A failure leaves the
/// record `running`, which the next driver takes over as a dead driver's.
pub(crate) fn release_status(store: &Store, id: ThreadId) {
    let _ = restore_status(store, id);
}

impl Claim {
    /// Ends a drive whose last commit already released the thread (an end
    /// or a suspend writes the final status itself): unlocks without
    /// reading or writing the record again.
    pub fn released_by_commit(mut self) {
        if let Some(file) = self.lock.take() {
            self.forget();
            drop(file);
        }
    }

    /// Releases the claim now: the record's status back from `running`,
    /// then the lock. A record that cannot be read or written is an error
    /// (the lock is released all the same; the next driver takes the
    /// `running` record over).
    pub fn release(mut self) -> Result<(), EngineError> {
        match self.lock.take() {
            Some(file) => {
                let restored = restore_status(&self.store, self.id);
                self.forget();
                drop(file);
                restored
            }
            None => Ok(()),
        }
    }

    /// Forgets the claim in the store handle's and the token's bookkeeping.
    fn forget(&self) {
        held(&self.store).lock().remove(&self.id);
        self.cancel.claim_released(&self.store, self.id);
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(file) = self.lock.take() {
            // Drop cannot report; `Claim::release` does.
            let _ = restore_status(&self.store, self.id);
            self.forget();
            drop(file);
        }
    }
}

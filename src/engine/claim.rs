//! Driver claims: a thread is held by one driving process at a time.
//!
//! A claim is an exclusive open-file-description lock (`F_OFD_SETLK`) on one
//! byte of `<store>/claims.lock`, at an offset derived from the thread id,
//! held for the whole drive, plus the record's status `running` (the status
//! underneath kept in `claimed_status`). One lock file serves every thread,
//! so a claim costs one `fcntl`, not a file creation. The lock dies with its
//! process, so a driver killed with `kill -9` leaves a record that says
//! `running` but a lock anyone can take: the next driver takes it over.
//! Each store handle tracks the claims it holds (in its engine state), so
//! nested calls reuse the outer claim (OFD locks of one open file never
//! conflict with each other). A claim is taken under a [`Cancel`] token,
//! which gives the thread its status back when it is cancelled.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::sync::Arc;

use nix::fcntl::{FcntlArg, fcntl};
use nix::libc;

use super::EngineError;
use super::cancel::Cancel;
use crate::store::{Store, StoreError};
use crate::thread::{ThreadId, ThreadStatus};

/// A held claim; dropping it releases the thread (status back from
/// `running` to what the drive left) and the lock. [`Claim::release`] does
/// the same and reports a failure to write the record.
#[derive(Debug)]
pub struct Claim {
    store: Store,
    id: ThreadId,
    /// The lock file, when this claim took the lock (not a nested claim).
    lock: Option<Arc<File>>,
    /// The token the claim was taken under (it releases the claim when
    /// cancelled).
    cancel: Cancel,
}

// The locking primitive: one byte of `<store>/claims.lock` per thread,
// behind these few functions so it can move behind the storage backend.

/// The store's lock file, opened once per store handle and kept in its
/// engine state.
fn lock_file(store: &Store) -> Result<Arc<File>, EngineError> {
    let mut slot = store
        .engine_state()
        .claims
        .lock_file
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(f) = slot.as_ref() {
        return Ok(Arc::clone(f));
    }
    let path = store.path().join("claims.lock");
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|source| StoreError::Io {
            op: "open the claim lock file",
            path,
            source,
        })?;
    let f = Arc::new(f);
    *slot = Some(Arc::clone(&f));
    Ok(f)
}

/// The byte a thread's claim locks: its id folded into 62 bits.
fn lock_range(id: ThreadId, kind: libc::c_short) -> libc::flock {
    let offset = u128::from_be_bytes(id.to_bytes()) % (1u128 << 62);
    libc::flock {
        l_type: kind,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: i64::try_from(offset).unwrap_or(0),
        l_len: 1,
        l_pid: 0,
    }
}

/// Takes the thread's lock byte: `Ok(Some(file))` when taken (the file
/// holds it until [`unlock`]), `Ok(None)` when another open lock file (a
/// live driver in another process, or another store handle) holds it.
fn try_lock(store: &Store, id: ThreadId) -> Result<Option<Arc<File>>, EngineError> {
    let file = lock_file(store)?;
    let lock = lock_range(id, libc::F_WRLCK as libc::c_short);
    match fcntl(&*file, FcntlArg::F_OFD_SETLK(&lock)) {
        Ok(_) => Ok(Some(file)),
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => Ok(None),
        Err(e) => Err(StoreError::Io {
            op: "lock the claim lock file",
            path: store.path().join("claims.lock"),
            source: std::io::Error::from(e),
        }
        .into()),
    }
}

/// Whether another open lock file holds the thread's lock byte.
fn is_locked(store: &Store, id: ThreadId) -> Result<bool, EngineError> {
    let file = lock_file(store)?;
    let mut probe = lock_range(id, libc::F_WRLCK as libc::c_short);
    fcntl(&*file, FcntlArg::F_OFD_GETLK(&mut probe)).map_err(|e| StoreError::Io {
        op: "probe the claim lock file",
        path: store.path().join("claims.lock"),
        source: std::io::Error::from(e),
    })?;
    Ok(probe.l_type != libc::F_UNLCK as libc::c_short)
}

/// Gives the thread's lock byte back. Unlocking a byte this file holds
/// cannot fail in a way that leaves it held short of the file closing, so
/// an error is ignored: the lock dies with the file at the latest.
fn unlock(file: &File, id: ThreadId) {
    let _ = fcntl(
        file,
        FcntlArg::F_OFD_SETLK(&lock_range(id, libc::F_UNLCK as libc::c_short)),
    );
}

/// The threads this store handle holds claims on.
fn held(store: &Store) -> std::sync::MutexGuard<'_, HashSet<ThreadId>> {
    store
        .engine_state()
        .claims
        .held
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Whether a live driver (another process, or a claim of this store
/// handle) holds the thread. A lock file that cannot be read is an error,
/// not "not held".
pub fn is_held(store: &Store, id: ThreadId) -> Result<bool, EngineError> {
    if held(store).contains(&id) {
        return Ok(true);
    }
    is_locked(store, id)
}

impl Store {
    /// Takes the driver's lock for a thread that does not exist yet (see
    /// [`Store::start_thread_as`]); dropping the claim releases it.
    pub fn claim_new(&self, id: ThreadId, cancel: &Cancel) -> Result<Claim, EngineError> {
        self.lock_claim(id, false, cancel)
    }

    /// Claims a thread for a drive under `cancel` (cancelling it releases
    /// the claim). Refused while another live driver holds it; a claim left
    /// by a dead driver is taken over. Claiming a thread this store handle
    /// already holds returns a claim that releases nothing.
    pub fn claim(&self, id: ThreadId, cancel: &Cancel) -> Result<Claim, EngineError> {
        self.lock_claim(id, true, cancel)
    }

    fn lock_claim(&self, id: ThreadId, mark: bool, cancel: &Cancel) -> Result<Claim, EngineError> {
        if cancel.is_cancelled() {
            return Err(EngineError::Interrupted);
        }
        if !held(self).insert(id) {
            // Nested: the outer claim of this store handle covers it.
            return Ok(Claim {
                store: self.clone(),
                id,
                lock: None,
                cancel: cancel.clone(),
            });
        }
        let unhold = || {
            held(self).remove(&id);
        };
        let file = match try_lock(self, id) {
            Ok(Some(f)) => f,
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
            self.update_record(id, |r| {
                match (r.status, r.claimed_status) {
                    // A dead driver's claim: keep the status underneath.
                    (ThreadStatus::Running, Some(_)) => {}
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
            unlock(&file, id);
            unhold();
            return Err(e.into());
        }
        cancel.claim_taken(self, id);
        let claim = Claim {
            store: self.clone(),
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
fn restore_status(store: &Store, id: ThreadId) -> Result<(), EngineError> {
    let claimed = store
        .thread(id)?
        .is_some_and(|r| r.status == ThreadStatus::Running || r.claimed_status.is_some());
    if claimed {
        store.update_record(id, |r| {
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
            unlock(&file, self.id);
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
                unlock(&file, self.id);
                restored
            }
            None => Ok(()),
        }
    }

    /// Forgets the claim in the store handle's and the token's bookkeeping.
    fn forget(&self) {
        held(&self.store).remove(&self.id);
        self.cancel.claim_released(&self.store, self.id);
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(file) = self.lock.take() {
            // Drop cannot report; `Claim::release` does.
            let _ = restore_status(&self.store, self.id);
            self.forget();
            unlock(&file, self.id);
        }
    }
}

//! Driver claims: a thread is held by one driving process at a time.
//!
//! A claim is an exclusive open-file-description lock (`F_OFD_SETLK`) on one
//! byte of `<store>/claims.lock`, at an offset derived from the thread id,
//! held for the whole drive, plus the record's status `running` (the status
//! underneath kept in `claimed_status`). One lock file serves every thread,
//! so a claim costs one `fcntl`, not a file creation. The lock dies with its
//! process, so a driver killed with `kill -9` leaves a record that says
//! `running` but a lock anyone can take: the next driver takes it over.
//! Within one process the held claims are tracked so nested calls reuse the
//! outer claim (OFD locks of one open file never conflict with each other).

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::sync::{Arc, LazyLock, Mutex};

use nix::fcntl::{FcntlArg, fcntl};
use nix::libc;

use super::EngineError;
use crate::store::{Store, StoreError};
use crate::thread::{ThreadId, ThreadStatus};

/// Agent process groups running now, killed by [`interrupt`].
static AGENTS: LazyLock<Mutex<HashSet<u32>>> = LazyLock::new(|| Mutex::new(HashSet::new()));

/// Set by [`interrupt`]: no new claim is taken and no new agent runs.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether [`interrupt`] was called in this process.
pub fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Stores with claims held now, so [`interrupt`] can release them.
static CLAIMED: LazyLock<Mutex<Vec<(Store, ThreadId)>>> = LazyLock::new(|| Mutex::new(Vec::new()));

/// A held claim; dropping it releases the thread (status back from
/// `running` to what the drive left) and the lock.
#[derive(Debug)]
pub struct Claim {
    store: Store,
    id: ThreadId,
    /// The lock file, when this claim took the lock (not a nested claim).
    lock: Option<Arc<File>>,
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
    pub fn claim_new(&self, id: ThreadId) -> Result<Claim, EngineError> {
        self.lock_claim(id, false)
    }

    /// Claims a thread for a drive. Refused while another live driver holds
    /// it; a claim left by a dead driver is taken over. Claiming a thread
    /// this process already holds returns a claim that releases nothing.
    pub fn claim(&self, id: ThreadId) -> Result<Claim, EngineError> {
        self.lock_claim(id, true)
    }

    fn lock_claim(&self, id: ThreadId, mark: bool) -> Result<Claim, EngineError> {
        if interrupted() {
            return Err(EngineError::Interrupted);
        }
        if !held(self).insert(id) {
            // Nested: the outer claim of this store handle covers it.
            return Ok(Claim {
                store: self.clone(),
                id,
                lock: None,
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
        CLAIMED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((self.clone(), id));
        Ok(Claim {
            store: self.clone(),
            id,
            lock: Some(file),
        })
    }
}

fn release(store: &Store, id: ThreadId) {
    // Usually the drive's last commit (an end or a suspend) released it.
    let claimed = store
        .thread(id)
        .ok()
        .flatten()
        .is_some_and(|r| r.status == ThreadStatus::Running || r.claimed_status.is_some());
    let _ = claimed
        && store
            .update_record(id, |r| {
                if let (ThreadStatus::Running, Some(s)) = (r.status, r.claimed_status) {
                    r.status = s;
                }
                r.claimed_status = None;
                Ok(())
            })
            .is_ok();
    forget(store, id);
}

impl Claim {
    /// Ends a drive whose last commit already released the thread (an end
    /// or a suspend writes the final status itself): unlocks without
    /// reading or writing the record again.
    pub fn released_by_commit(mut self) {
        if let Some(file) = self.lock.take() {
            forget(&self.store, self.id);
            unlock(&file, self.id);
        }
    }
}

/// Forgets a claim this process held, without touching the record.
fn forget(store: &Store, id: ThreadId) {
    held(store).remove(&id);
    CLAIMED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|(s, t)| !(*t == id && s.path() == store.path()));
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(file) = &self.lock {
            release(&self.store, self.id);
            unlock(file, self.id);
        }
    }
}

/// Registers a running agent's process group (for [`interrupt`]).
pub(crate) fn agent_started(pgid: u32) {
    AGENTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(pgid);
    // Started while `interrupt` ran: it may have missed this group.
    if interrupted() {
        super::agent::kill_group(pgid);
    }
}

/// Forgets a finished agent's process group.
pub(crate) fn agent_finished(pgid: u32) {
    AGENTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&pgid);
}

/// For a Ctrl-C handler: kills every running agent's process group and
/// releases every claim this process holds, leaving the threads retryable.
/// (The caller then exits; the library never does.)
pub fn interrupt() {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
    let groups: Vec<u32> = AGENTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain()
        .collect();
    for pgid in groups {
        super::agent::kill_group(pgid);
    }
    let claims: Vec<(Store, ThreadId)> = CLAIMED.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for (store, id) in claims {
        release(&store, id);
    }
}

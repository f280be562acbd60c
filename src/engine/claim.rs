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

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex};

use nix::fcntl::{FcntlArg, fcntl};
use nix::libc;

use super::EngineError;
use crate::store::{Store, StoreError};
use crate::thread::{ThreadId, ThreadStatus};

/// Claims held by this process: (store path, thread).
static HELD: LazyLock<Mutex<HashSet<(PathBuf, ThreadId)>>> =
    LazyLock::new(|| Mutex::new(HashSet::new()));

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

/// The store's lock file, opened once per process.
fn lock_file(store: &Store) -> std::io::Result<Arc<File>> {
    static FILES: LazyLock<Mutex<HashMap<PathBuf, Arc<File>>>> =
        LazyLock::new(|| Mutex::new(HashMap::new()));
    let mut files = FILES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(f) = files.get(store.path()) {
        return Ok(Arc::clone(f));
    }
    let f = Arc::new(
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(store.path().join("claims.lock"))?,
    );
    files.insert(store.path().to_path_buf(), Arc::clone(&f));
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

/// Whether a live driver (another process, or a claim of this process)
/// holds the thread.
pub fn is_held(store: &Store, id: ThreadId) -> bool {
    let key = (store.path().to_path_buf(), id);
    if HELD
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&key)
    {
        return true;
    }
    let Ok(file) = lock_file(store) else {
        return false;
    };
    let mut probe = lock_range(id, libc::F_WRLCK as libc::c_short);
    match fcntl(&*file, FcntlArg::F_OFD_GETLK(&mut probe)) {
        Ok(_) => probe.l_type != libc::F_UNLCK as libc::c_short,
        Err(_) => false,
    }
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
        let key = (self.path().to_path_buf(), id);
        {
            let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
            if held.contains(&key) {
                return Ok(Claim {
                    store: self.clone(),
                    id,
                    lock: None,
                });
            }
            held.insert(key.clone());
        }
        let unhold = || {
            HELD.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        };
        let path = self.path().join("claims.lock");
        let file = match lock_file(self) {
            Ok(f) => f,
            Err(e) => {
                unhold();
                return Err(EngineError::Store(StoreError::Io {
                    op: "open the claim lock file",
                    path,
                    source: e,
                }));
            }
        };
        let lock = lock_range(id, libc::F_WRLCK as libc::c_short);
        match fcntl(&*file, FcntlArg::F_OFD_SETLK(&lock)) {
            Ok(_) => {}
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => {
                unhold();
                return Err(EngineError::Claimed { thread: id });
            }
            Err(e) => {
                unhold();
                return Err(EngineError::Store(StoreError::Io {
                    op: "lock the claim lock file",
                    path,
                    source: std::io::Error::from(e),
                }));
            }
        }
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

fn unlock(file: &File, id: ThreadId) {
    let _ = fcntl(
        file,
        FcntlArg::F_OFD_SETLK(&lock_range(id, libc::F_UNLCK as libc::c_short)),
    );
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
    HELD.lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&(store.path().to_path_buf(), id));
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

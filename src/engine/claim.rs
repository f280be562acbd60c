//! Driver claims: a thread is held by one driving process at a time.
//!
//! A claim is an exclusive OS file lock on `<store>/claims/<thread id>`,
//! held for the whole drive, plus the record's status `running` (the status
//! underneath kept in `claimed_status`). The lock dies with its process, so
//! a driver killed with `kill -9` leaves a record that says `running` but a
//! lock anyone can take: the next driver takes it over. Within one process
//! the held claims are tracked so nested calls reuse the outer claim.

use std::collections::HashSet;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::PathBuf;
use std::sync::{LazyLock, Mutex};

use super::EngineError;
use crate::store::{Store, StoreError};
use crate::thread::{ThreadId, ThreadStatus};

/// Claims held by this process: (store path, thread).
static HELD: LazyLock<Mutex<HashSet<(PathBuf, ThreadId)>>> =
    LazyLock::new(|| Mutex::new(HashSet::new()));

/// Agent process groups running now, killed by [`interrupt`].
static AGENTS: LazyLock<Mutex<HashSet<u32>>> = LazyLock::new(|| Mutex::new(HashSet::new()));

/// Stores with claims held now, so [`interrupt`] can release them.
static CLAIMED: LazyLock<Mutex<Vec<(Store, ThreadId)>>> = LazyLock::new(|| Mutex::new(Vec::new()));

/// A held claim; dropping it releases the thread (status back from
/// `running` to what the drive left) and the lock.
#[derive(Debug)]
pub struct Claim {
    store: Store,
    id: ThreadId,
    _lock: Option<File>,
}

fn claim_path(store: &Store, id: ThreadId) -> PathBuf {
    store.path().join("claims").join(id.to_string())
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
    let Ok(file) = File::open(claim_path(store, id)) else {
        return false;
    };
    match file.try_lock() {
        Ok(()) => false,
        Err(TryLockError::WouldBlock) => true,
        Err(TryLockError::Error(_)) => false,
    }
}

impl Store {
    /// Claims a thread for a drive. Refused while another live driver holds
    /// it; a claim left by a dead driver is taken over. Claiming a thread
    /// this process already holds returns a claim that releases nothing.
    pub fn claim(&self, id: ThreadId) -> Result<Claim, EngineError> {
        let key = (self.path().to_path_buf(), id);
        {
            let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
            if held.contains(&key) {
                return Ok(Claim {
                    store: self.clone(),
                    id,
                    _lock: None,
                });
            }
            held.insert(key.clone());
        }
        let unhold = || {
            HELD.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        };
        let path = claim_path(self, id);
        let io = |e: std::io::Error| {
            EngineError::Store(StoreError::Io {
                op: "open the claim file",
                path: path.clone(),
                source: e,
            })
        };
        let opened = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| {
                OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&path)
            });
        let file = match opened {
            Ok(f) => f,
            Err(e) => {
                unhold();
                return Err(io(e));
            }
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                unhold();
                return Err(EngineError::Claimed { thread: id });
            }
            Err(TryLockError::Error(e)) => {
                unhold();
                return Err(io(e));
            }
        }
        let marked = self.update_record(id, |r| {
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
        });
        if let Err(e) = marked {
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
            _lock: Some(file),
        })
    }
}

fn release(store: &Store, id: ThreadId) {
    let _ = store.update_record(id, |r| {
        if let (ThreadStatus::Running, Some(s)) = (r.status, r.claimed_status) {
            r.status = s;
        }
        r.claimed_status = None;
        Ok(())
    });
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
        if self._lock.is_some() {
            release(&self.store, self.id);
        }
    }
}

/// Registers a running agent's process group (for [`interrupt`]).
pub(crate) fn agent_started(pgid: u32) {
    AGENTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(pgid);
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

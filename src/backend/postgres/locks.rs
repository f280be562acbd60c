//! Claims and the GC lock on PostgreSQL: advisory locks that die with the
//! session holding them.

use std::fmt;
use std::sync::{Arc, Mutex};

use postgres::Client;
use postgres::types::Type;

use super::PostgresBackend;
use crate::backend::HeldLock;
use crate::store::StoreError;
use crate::thread::ThreadId;

/// A claim's advisory lock key: the thread id's 16 bytes folded into 63
/// bits (the two halves XORed, sign bit cleared).
pub(crate) fn claim_key(id: ThreadId) -> i64 {
    let v = u128::from_be_bytes(id.to_bytes());
    let folded = ((v >> 64) as u64) ^ (v as u64);
    i64::try_from(folded >> 1).unwrap_or(0)
}

/// A session advisory lock; unlocked when dropped.
struct AdvisoryLock {
    session: Arc<Mutex<Client>>,
    held: Arc<Mutex<std::collections::HashSet<i64>>>,
    key: i64,
}

impl fmt::Debug for AdvisoryLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdvisoryLock")
            .field("key", &self.key)
            .finish()
    }
}

impl HeldLock for AdvisoryLock {}

impl Drop for AdvisoryLock {
    fn drop(&mut self) {
        // If the session is gone, so is the lock.
        let mut session = self.session.lock().unwrap_or_else(|p| p.into_inner());
        let _ = session.query_typed("SELECT pg_advisory_unlock($1)", &[(&self.key, Type::INT8)]);
        drop(session);
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
    }
}

impl PostgresBackend {
    fn advisory(&self, sql: &str, key: i64) -> Result<bool, StoreError> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        let rows = locks
            .query_typed(sql, &[(&key, Type::INT8)])
            .map_err(|e| self.error("taking an advisory lock".into(), e))?;
        Ok(rows
            .first()
            .and_then(|r| r.try_get::<_, Option<bool>>(0).ok().flatten())
            .unwrap_or(false))
    }

    pub(super) fn try_advisory(&self, key: i64) -> Result<Option<Box<dyn HeldLock>>, StoreError> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.contains(&key) || !self.advisory("SELECT pg_try_advisory_lock($1)", key)? {
            return Ok(None);
        }
        held.insert(key);
        Ok(Some(Box::new(AdvisoryLock {
            session: Arc::clone(&self.locks),
            held: Arc::clone(&self.held),
            key,
        })))
    }
}

//! Claims and the GC lock on PostgreSQL: transaction-scoped advisory locks,
//! each held by a transaction kept open on a connection of its own.
//!
//! A held lock is a connection inside `BEGIN` that took
//! `pg_try_advisory_xact_lock(key)`; releasing it is `ROLLBACK`. Because
//! the lock lives in a transaction, not a session, it works behind a
//! transaction-mode pooler (the pooler pins one server connection to the
//! client for the transaction's life), and it is gone as soon as the
//! server ends that transaction: the holder rolls back, exits, is killed,
//! or its connection is lost. The transaction writes nothing and, at
//! `READ COMMITTED`, holds no snapshot between statements, so keeping it
//! open does not hold back vacuum.
//!
//! **Takeover bound** (`docs/design.md` §4b): a holder that exits or is
//! killed closes its socket and the server releases its locks at once. A
//! holder whose machine or network vanishes without a word is detected by
//! the server's TCP keepalive, which the lock transaction sets for itself
//! (`SET LOCAL`, so nothing leaks to a pooled connection): probes after
//! [`KEEPALIVE_IDLE_S`] idle seconds, every [`KEEPALIVE_INTERVAL_S`],
//! given up after [`KEEPALIVE_COUNT`] unanswered, and `tcp_user_timeout`
//! for data never acknowledged: at most [`TAKEOVER_BOUND_S`] seconds.

use std::fmt;
use std::sync::{Arc, Mutex};

use postgres::Client;

use super::PostgresBackend;
use crate::backend::BackendError;
use crate::backend::ClaimKey;
use crate::backend::HeldLock;

/// Idle seconds before the server probes a lock holder's connection.
pub const KEEPALIVE_IDLE_S: u32 = 10;
/// Seconds between unanswered probes.
pub const KEEPALIVE_INTERVAL_S: u32 = 5;
/// Unanswered probes after which the server drops the connection.
pub const KEEPALIVE_COUNT: u32 = 3;
/// The longest a silently vanished holder keeps its locks, in seconds.
pub const TAKEOVER_BOUND_S: u32 = KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_COUNT;

/// Connections kept for reuse by locks.
const LOCK_POOL_SIZE: usize = 16;

/// A claim's advisory lock key: the thread id's 16 bytes folded into 63
/// bits (the two halves XORed, sign bit cleared).
pub(crate) fn claim_key(id: ClaimKey) -> i64 {
    let v = u128::from_be_bytes(id);
    let folded = ((v >> 64) as u64) ^ (v as u64);
    i64::try_from(folded >> 1).unwrap_or(0)
}

/// Idle connections for locks, shared by the backend and its held locks
/// (which give their connection back when released).
pub(super) type LockPool = Arc<Mutex<Vec<Client>>>;

/// A transaction-scoped advisory lock held by an open transaction; rolled
/// back (so unlocked) when dropped.
struct AdvisoryLock {
    client: Mutex<Option<Client>>,
    pool: LockPool,
    location: String,
    key: i64,
}

impl fmt::Debug for AdvisoryLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdvisoryLock")
            .field("key", &self.key)
            .finish()
    }
}

impl HeldLock for AdvisoryLock {
    fn check(&self) -> Result<(), BackendError> {
        let mut slot = self.client.lock().unwrap_or_else(|p| p.into_inner());
        let alive = match slot.as_mut() {
            Some(client) => client
                .batch_execute("SELECT 1")
                .map_err(|e| super::lock_lost_detail(&e)),
            None => Err("the connection was lost earlier and given up".into()),
        };
        alive.map_err(|detail| {
            // The server ended the transaction with the connection: the
            // lock is gone; this connection is never reused.
            slot.take();
            BackendError::LockLost {
                location: self.location.clone(),
                detail,
            }
        })
    }
}

impl Drop for AdvisoryLock {
    fn drop(&mut self) {
        let slot = self.client.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(mut client) = slot.take()
            && client.batch_execute("ROLLBACK").is_ok()
        {
            give_back(&self.pool, client);
        }
        // A connection that cannot roll back is dropped: closing it ends
        // the transaction, and the lock with it.
    }
}

fn give_back(pool: &LockPool, client: Client) {
    if client.is_closed() {
        return;
    }
    let mut idle = pool.lock().unwrap_or_else(|p| p.into_inner());
    if idle.len() < LOCK_POOL_SIZE {
        idle.push(client);
    }
}

impl PostgresBackend {
    /// Takes advisory lock `key` in a transaction of its own connection:
    /// `None` when another transaction (anywhere) holds it.
    pub(super) fn try_advisory(&self, key: i64) -> Result<Option<Box<dyn HeldLock>>, BackendError> {
        let mut client = self.connect_or_reuse(|| {
            let mut idle = self.lock_pool.lock().unwrap_or_else(|p| p.into_inner());
            while let Some(c) = idle.pop() {
                if !c.is_closed() {
                    return Some(c);
                }
            }
            None
        })?;
        let begin = format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; \
             SET LOCAL idle_in_transaction_session_timeout = 0; \
             SET LOCAL statement_timeout = 0; \
             SET LOCAL tcp_keepalives_idle = {KEEPALIVE_IDLE_S}; \
             SET LOCAL tcp_keepalives_interval = {KEEPALIVE_INTERVAL_S}; \
             SET LOCAL tcp_keepalives_count = {KEEPALIVE_COUNT}; \
             SET LOCAL tcp_user_timeout = {}",
            TAKEOVER_BOUND_S * 1000
        );
        client
            .batch_execute(&begin)
            .map_err(|e| self.error("taking an advisory lock".into(), e))?;
        // A simple query, not the extended protocol: an unnamed portal
        // would stay open, holding its snapshot (and vacuum's horizon)
        // for the lock's whole life. The key is a number we formatted.
        let taken = client
            .simple_query(&format!("SELECT pg_try_advisory_xact_lock({key})"))
            .map_err(|e| self.error("taking an advisory lock".into(), e))?
            .iter()
            .find_map(|m| match m {
                postgres::SimpleQueryMessage::Row(row) => row.get(0).map(|v| v == "t"),
                _ => None,
            })
            .unwrap_or(false);
        if !taken {
            if client.batch_execute("ROLLBACK").is_ok() {
                give_back(&self.lock_pool, client);
            }
            return Ok(None);
        }
        Ok(Some(Box::new(AdvisoryLock {
            client: Mutex::new(Some(client)),
            pool: Arc::clone(&self.lock_pool),
            location: self.location.clone(),
            key,
        })))
    }
}

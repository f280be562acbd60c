//! Claims and the GC lock on PostgreSQL: session advisory locks, all held
//! by one connection of the backend (its lock session), however many
//! drivers hold claims (`docs/design.md` §8f).
//!
//! The session opens a transaction when it connects and never ends it: a
//! transaction-mode pooler pins one server connection to the client for a
//! transaction's life, so session locks taken inside it stay on that
//! server connection, and a pooler whose client leaves mid-transaction
//! closes the server connection rather than reuse it. The locks are
//! session-level (`pg_try_advisory_lock`), so each is released on its own
//! (`pg_advisory_unlock`) without ending the transaction. The transaction
//! writes nothing and, at `READ COMMITTED`, holds no snapshot between
//! statements, so keeping it open does not hold back vacuum.
//!
//! The locks are gone as soon as the server ends the session: the holder
//! exits, is killed, or its connection is lost. The session remembers the
//! keys it holds, so a second take of one this handle holds is refused (as
//! another session's would be). When the connection is lost, every lock
//! of it is lost: a held lock knows the session generation it was taken
//! in, and [`HeldLock::check`] fails once that session is gone.
//!
//! **Takeover bound** (`docs/design.md` §4b): a holder that exits or is
//! killed closes its socket and the server releases its locks at once. A
//! holder whose machine or network vanishes without a word is detected by
//! the server's TCP keepalive, which the lock session sets for itself
//! (`SET LOCAL`, so nothing leaks to a pooled connection): probes after
//! [`KEEPALIVE_IDLE_S`] idle seconds, every [`KEEPALIVE_INTERVAL_S`],
//! given up after [`KEEPALIVE_COUNT`] unanswered, and `tcp_user_timeout`
//! for data never acknowledged: at most [`TAKEOVER_BOUND_S`] seconds.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// How recent an answer of the lock session a [`HeldLock::check`] takes
/// as proof that the session is alive, instead of pinging it
/// (`docs/design.md` §8f item 12): a driver stepping every few seconds (an
/// LLM's) still pings before each step; a busy runner's hundreds of
/// checks a second cost at most one ping each 10 ms.
pub const CHECK_TRUSTS: Duration = Duration::from_millis(10);

/// A claim's advisory lock key: the thread id's 16 bytes folded into 63
/// bits (the two halves XORed, sign bit cleared).
pub(crate) fn claim_key(id: ClaimKey) -> i64 {
    i64::try_from(fold_id(id) >> 1).unwrap_or(0)
}

/// A thread id's 16 bytes folded into 64 bits (the two halves XORed): the
/// key of its claim and of its order lock (`txn.rs`).
pub(super) fn fold_id(id: ClaimKey) -> u64 {
    let v = u128::from_be_bytes(id);
    ((v >> 64) as u64) ^ (v as u64)
}

/// The lock session of a backend: one connection, opened when a lock is
/// first taken, and what it holds.
#[derive(Default, Clone)]
pub(super) struct LockSession(Arc<Mutex<Session>>);

#[derive(Default)]
struct Session {
    client: Option<Client>,
    /// Bumped each time a connection is opened: a lock taken in an
    /// earlier one is lost.
    generation: u64,
    /// The keys held in the current connection.
    held: HashSet<i64>,
    /// When the newest statement that succeeded on the current connection
    /// was sent: a [`HeldLock::check`] asked less than [`CHECK_TRUSTS`]
    /// after it (or before it) needs no ping of its own (see `check`).
    answered: Option<Instant>,
    /// Pings sent by checks (for tests and benchmarks).
    pings: u64,
}

impl LockSession {
    fn lock(&self) -> std::sync::MutexGuard<'_, Session> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pings sent by [`HeldLock::check`] so far.
    pub(super) fn pings(&self) -> u64 {
        self.lock().pings
    }
}

/// One advisory lock of a lock session; released when dropped.
struct AdvisoryLock {
    session: LockSession,
    generation: u64,
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

/// The first row's first column of a simple query's answer.
fn first_value(messages: &[postgres::SimpleQueryMessage]) -> Option<String> {
    messages.iter().find_map(|m| match m {
        postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
        _ => None,
    })
}

impl HeldLock for AdvisoryLock {
    /// Whether the session still holds the lock: a ping (`SELECT 1`) of
    /// its connection, unless the session answered a statement sent less
    /// than [`CHECK_TRUSTS`] before the check was asked, or after it
    /// (`docs/design.md` §8f item 12). Drivers of many threads share one
    /// session, so the checks of a busy runner would queue on it, each
    /// proving no more than the one answered just before.
    fn check(&self) -> Result<(), BackendError> {
        let asked = Instant::now();
        let mut session = self.session.lock();
        let lost = |detail: String| BackendError::LockLost {
            location: self.location.clone(),
            detail,
        };
        if session.generation != self.generation || !session.held.contains(&self.key) {
            return Err(lost("the connection was lost earlier and given up".into()));
        }
        if session
            .answered
            .is_some_and(|at| asked.saturating_duration_since(at) < CHECK_TRUSTS)
        {
            return Ok(());
        }
        let sent = Instant::now();
        let session = &mut *session;
        let alive = match session.client.as_mut() {
            Some(client) => {
                session.pings += 1;
                client
                    .batch_execute("SELECT 1")
                    .map_err(|e| super::lock_lost_detail(&e))
            }
            None => Err("the connection was lost earlier and given up".into()),
        };
        if alive.is_ok() {
            session.answered = Some(sent);
        }
        alive.map_err(|detail| {
            // The server ended the session with the connection: every lock
            // of it is gone; this connection is never reused.
            session.client = None;
            session.held.clear();
            lost(detail)
        })
    }
}

impl Drop for AdvisoryLock {
    fn drop(&mut self) {
        let mut session = self.session.lock();
        if session.generation != self.generation || !session.held.remove(&self.key) {
            return;
        }
        let unlocked = session.client.as_mut().is_some_and(|client| {
            // A number we formatted.
            client
                .simple_query(&format!("SELECT pg_advisory_unlock({})", self.key))
                .is_ok()
        });
        if !unlocked {
            // Closing the connection releases every lock of the session
            // (the others' holders find them lost).
            session.client = None;
            session.held.clear();
        }
    }
}

impl PostgresBackend {
    /// Takes advisory lock `key` in this handle's lock session: `None`
    /// when another session (anywhere) or this handle holds it.
    pub(super) fn try_advisory(&self, key: i64) -> Result<Option<Box<dyn HeldLock>>, BackendError> {
        let mut session = self.locks.lock();
        if session.client.as_ref().is_none_or(Client::is_closed) {
            session.client = None;
            session.held.clear();
            let super::Reused::Fresh(mut client) = self.connect_or_reuse(|| None::<()>)? else {
                unreachable!("nothing to reuse")
            };
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
                .map_err(|e| self.error("opening the lock session".into(), e))?;
            session.client = Some(*client);
            session.generation += 1;
            session.answered = None;
        }
        if session.held.contains(&key) {
            return Ok(None);
        }
        // A simple query, not the extended protocol: an unnamed portal
        // would stay open, holding its snapshot (and vacuum's horizon).
        // The key is a number we formatted.
        let Some(client) = session.client.as_mut() else {
            return Err(BackendError::ConnectionLost {
                location: self.location.clone(),
                op: "taking an advisory lock".into(),
            });
        };
        let sent = Instant::now();
        let answer = client.simple_query(&format!("SELECT pg_try_advisory_lock({key})"));
        let taken = match answer {
            Ok(messages) => first_value(&messages).is_some_and(|v| v == "t"),
            Err(e) => {
                // Whatever failed, the session's transaction is unusable:
                // give it up (and every lock in it).
                session.client = None;
                session.held.clear();
                return Err(self.error("taking an advisory lock".into(), e));
            }
        };
        session.answered = Some(sent);
        if !taken {
            return Ok(None);
        }
        session.held.insert(key);
        Ok(Some(Box::new(AdvisoryLock {
            session: self.locks.clone(),
            generation: session.generation,
            location: self.location.clone(),
            key,
        })))
    }
}

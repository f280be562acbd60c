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
//! keys it holds and is taking, so a second take of one of them by this
//! handle is refused (as another session's would be: the server's session
//! locks are re-entrant, so it would grant it). The drivers' takes,
//! releases and liveness pings share the connection in rounds, one round
//! trip each (see [`LockSession`]). When the connection is lost, every lock
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

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
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
/// first taken, what it holds, and the requests waiting for its next
/// round trip.
///
/// **Rounds** (`docs/design.md` §8f item 16). Takes, releases and pings of
/// all the backend's drivers share the one connection, so they are sent
/// in rounds: a caller that finds no round in flight sends one itself
/// (the leader), holding every request queued until then, and callers
/// that arrive while it is in flight queue theirs for the next. A round
/// is one simple query — the releases, then the takes, in one statement
/// each (`SELECT pg_advisory_unlock(a), pg_advisory_unlock(b); SELECT
/// pg_try_advisory_lock(c), …`), or `SELECT 1` when it carries only
/// pings — so a busy runner's claims cost a round trip per round, not
/// one per take and one per release. A take or a ping waits for the
/// answer of the round that carries it (a ping still queued when a round
/// sent less than [`CHECK_TRUSTS`] before its check was asked is
/// answered meanwhile is withdrawn). A release does not wait while a
/// round is in flight or a take or ping is queued: the leader, or the
/// waiting taker's or checker's round, carries it, and every caller
/// sends the releases left queued before it returns; otherwise the
/// releasing caller sends it. Either way a release is on the server at
/// most one round after it was asked.
#[derive(Default, Clone)]
pub(super) struct LockSession(Arc<Shared>);

#[derive(Default)]
struct Shared {
    session: Mutex<Session>,
    /// Signalled when a round ends.
    answered: Condvar,
}

#[derive(Default)]
struct Session {
    /// The connection; out of it while a leader sends a round.
    client: Option<Client>,
    /// Bumped each time a connection is opened: a lock taken in an
    /// earlier one is lost.
    generation: u64,
    /// The keys held in the current connection.
    held: HashSet<i64>,
    /// Keys queued or in flight to be taken (a second take of one is
    /// refused at once, as a take of a held key is).
    taking: HashSet<i64>,
    /// Requests for the next round.
    queue: Queue,
    /// A leader is sending a round (it holds the connection).
    sending: bool,
    /// Answers of finished rounds to callers that wait, by ticket.
    answers: HashMap<u64, Answer>,
    next_ticket: u64,
    /// When the newest round that succeeded on the current connection
    /// was sent: a [`HeldLock::check`] asked less than [`CHECK_TRUSTS`]
    /// after it (or before it) needs no ping of its own (see `check`).
    answered: Option<Instant>,
    /// Rounds that reached the server carrying a ping (for tests and benchmarks).
    pings: u64,
    /// Rounds that reached the server (round trips of the lock session).
    rounds: u64,
}

/// What waits for the next round.
#[derive(Default)]
struct Queue {
    /// Tickets and keys to take.
    takes: Vec<(u64, i64)>,
    /// Keys to release, with the generation they were taken in.
    releases: Vec<(u64, i64)>,
    /// Tickets of checks that need an answer of the session.
    pings: Vec<u64>,
}

impl Queue {
    /// Whether a caller waits for the next round (it will send it).
    fn has_waiters(&self) -> bool {
        !self.takes.is_empty() || !self.pings.is_empty()
    }
}

/// The answer of a round to one waiting request.
#[derive(Debug)]
enum Answer {
    /// A take: whether the lock was granted, and in which connection.
    Taken { granted: bool, generation: u64 },
    /// A ping: the session answered.
    Alive,
    /// The round failed (the session and its locks are given up): what
    /// the server or the connection said.
    Failed(String),
}

/// The most requests one round carries (a longer queue takes more rounds).
const ROUND_MAX: usize = 1000;

impl LockSession {
    fn lock(&self) -> MutexGuard<'_, Session> {
        self.0.session.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, Session>) -> MutexGuard<'a, Session> {
        self.0
            .answered
            .wait(guard)
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Rounds so far that reached the server carrying a ping.
    pub(super) fn pings(&self) -> u64 {
        self.lock().pings
    }

    /// Rounds so far that reached the server (each one round trip).
    pub(super) fn rounds(&self) -> u64 {
        self.lock().rounds
    }
}

/// One advisory lock of a lock session; released when dropped.
struct AdvisoryLock {
    session: LockSession,
    location: String,
    generation: u64,
    key: i64,
}

/// Opens the lock session's connection (for a round that takes locks).
type Connect<'c> = &'c dyn Fn() -> Result<Client, BackendError>;

impl fmt::Debug for AdvisoryLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdvisoryLock")
            .field("key", &self.key)
            .finish()
    }
}

/// The rows of a simple query's answer, in order.
fn rows(messages: &[postgres::SimpleQueryMessage]) -> Vec<&postgres::SimpleQueryRow> {
    messages
        .iter()
        .filter_map(|m| match m {
            postgres::SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        })
        .collect()
}

impl LockSession {
    /// Queues a request that waits for its answer and waits for it,
    /// sending rounds itself when none is in flight. A ping (`trust`:
    /// when its check was asked) still queued when a round sent less than
    /// [`CHECK_TRUSTS`] before that has been answered meanwhile is
    /// withdrawn and answered by that round.
    fn ask<'a>(
        &'a self,
        mut session: MutexGuard<'a, Session>,
        location: &str,
        connect: Option<Connect<'_>>,
        trust: Option<Instant>,
        queue: impl FnOnce(&mut Queue, u64),
    ) -> Result<Answer, BackendError> {
        let ticket = session.next_ticket;
        session.next_ticket += 1;
        queue(&mut session.queue, ticket);
        loop {
            if let Some(answer) = session.answers.remove(&ticket) {
                // Releases queued during this caller's round, with no
                // waiter to carry them: send them before returning.
                drop(self.flush_releases(session, location));
                return Ok(answer);
            }
            if let Some(asked) = trust
                && session
                    .answered
                    .is_some_and(|at| asked.saturating_duration_since(at) < CHECK_TRUSTS)
                && let Some(i) = session.queue.pings.iter().position(|t| *t == ticket)
            {
                session.queue.pings.remove(i);
                drop(self.flush_releases(session, location));
                return Ok(Answer::Alive);
            }
            if session.sending {
                session = self.wait(session);
                continue;
            }
            let (next, error) = self.round(session, location, connect);
            session = next;
            if let Some(error) = error
                && matches!(session.answers.get(&ticket), Some(Answer::Failed(_)))
            {
                session.answers.remove(&ticket);
                drop(self.flush_releases(session, location));
                return Err(error);
            }
        }
    }

    /// Sends rounds while only releases are queued and no round is in
    /// flight (a queued take or ping has a waiter that will send them).
    fn flush_releases<'a>(
        &'a self,
        mut session: MutexGuard<'a, Session>,
        location: &str,
    ) -> MutexGuard<'a, Session> {
        while !session.sending && !session.queue.releases.is_empty() && !session.queue.has_waiters()
        {
            session = self.round(session, location, None).0;
        }
        session
    }

    /// Sends one round of the queued requests (at most [`ROUND_MAX`]),
    /// with the session's mutex released while it is in flight; answers
    /// each waiting request and wakes the waiters. The error is what the
    /// caller should report if its own request failed. Only a round with
    /// `connect` opens a connection when there is none; without it, takes
    /// stay queued for a caller that can (their waiters wake).
    fn round<'a>(
        &'a self,
        mut session: MutexGuard<'a, Session>,
        location: &str,
        connect: Option<Connect<'_>>,
    ) -> (MutexGuard<'a, Session>, Option<BackendError>) {
        let generation = session.generation;
        let client = session.client.take().filter(|c| !c.is_closed());
        let queue = &mut session.queue;
        // Releases of an earlier connection, or of one that is gone, are
        // moot: the server released them with it.
        queue
            .releases
            .retain(|(g, _)| *g == generation && client.is_some());
        let mut budget = ROUND_MAX;
        let releases = drain_up_to(&mut queue.releases, &mut budget);
        let takes = if client.is_some() || connect.is_some() {
            drain_up_to(&mut queue.takes, &mut budget)
        } else {
            Vec::new()
        };
        let pings = drain_up_to(&mut queue.pings, &mut budget);
        session.sending = true;
        drop(session);

        // A connection: the current one, or (for takes) a new one, in
        // which every lock of the earlier one is gone.
        let fresh = client.is_none() && !takes.is_empty();
        let sql = round_sql(&releases, &takes, !pings.is_empty());
        let mut sent = Instant::now();
        let mut reached_server = false;
        // A panic in the client (a bug) must not leave the session
        // `sending` for ever: caught, the round fails like a lost
        // connection, and the panic goes on in this caller after.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let opened = match (client, connect) {
                (Some(client), _) => Some(Ok(client)),
                (None, Some(connect)) if fresh => Some(connect()),
                (None, _) => None,
            };
            let result: Result<Option<(Client, Vec<bool>)>, BackendError> = match opened {
                None if pings.is_empty() => Ok(None),
                None => Err(BackendError::LockLost {
                    location: location.to_owned(),
                    detail: "the connection was lost earlier and given up".into(),
                }),
                Some(Err(e)) => Err(e),
                Some(Ok(client)) if sql.is_empty() => Ok(Some((client, Vec::new()))),
                Some(Ok(mut client)) => {
                    sent = Instant::now();
                    reached_server = true;
                    match client.simple_query(&sql) {
                        Ok(messages) => {
                            let granted: Vec<bool> = match rows(&messages).last() {
                                Some(row) if !takes.is_empty() => {
                                    (0..row.len()).map(|i| row.get(i) == Some("t")).collect()
                                }
                                _ => Vec::new(),
                            };
                            if granted.len() == takes.len() {
                                Ok(Some((client, granted)))
                            } else {
                                Err(BackendError::BadSchema {
                                    table: "the lock session",
                                    detail: format!(
                                        "{} answers to {} advisory lock takes",
                                        granted.len(),
                                        takes.len()
                                    ),
                                })
                            }
                        }
                        Err(e) => Err(super::pg_error(
                            location,
                            "taking or releasing advisory locks".into(),
                            e,
                        )),
                    }
                }
            };
            result
        }));
        let (result, panicked) = match outcome {
            Ok(result) => (result, None),
            Err(panic) => (
                Err(BackendError::ConnectionLost {
                    location: location.to_owned(),
                    op: "taking or releasing advisory locks (the client panicked)".into(),
                }),
                Some(panic),
            ),
        };

        let mut session = self.lock();
        session.sending = false;
        if reached_server {
            session.rounds += 1;
            if !pings.is_empty() {
                session.pings += 1;
            }
        }
        for (_, key) in &takes {
            session.taking.remove(key);
        }
        let error = match result {
            Ok(None) => None,
            Ok(Some((client, granted))) => {
                if fresh {
                    session.generation = generation + 1;
                    session.held.clear();
                }
                let generation = session.generation;
                for (&(ticket, key), granted) in takes.iter().zip(granted) {
                    if granted {
                        session.held.insert(key);
                    }
                    session.answers.insert(
                        ticket,
                        Answer::Taken {
                            granted,
                            generation,
                        },
                    );
                }
                for &ticket in &pings {
                    session.answers.insert(ticket, Answer::Alive);
                }
                if reached_server {
                    session.answered = Some(sent);
                }
                session.client = Some(client);
                None
            }
            Err(error) => {
                // Whatever failed, the session's transaction is unusable:
                // give it up, and every lock in it (the server releases
                // them when the connection closes).
                session.client = None;
                session.held.clear();
                session.generation = generation + 1;
                let detail = error.to_string();
                for &(ticket, _) in &takes {
                    session
                        .answers
                        .insert(ticket, Answer::Failed(detail.clone()));
                }
                for &ticket in &pings {
                    session
                        .answers
                        .insert(ticket, Answer::Failed(detail.clone()));
                }
                Some(error)
            }
        };
        self.0.answered.notify_all();
        if let Some(panic) = panicked {
            drop(session);
            std::panic::resume_unwind(panic);
        }
        (session, error)
    }
}

/// A round's simple query: the releases, then the takes, one `SELECT`
/// each; `SELECT 1` when it carries only pings; empty when nothing.
fn round_sql(releases: &[(u64, i64)], takes: &[(u64, i64)], pings: bool) -> String {
    use std::fmt::Write as _;
    let mut sql = String::new();
    for (f, keys) in [
        ("pg_advisory_unlock", releases),
        ("pg_try_advisory_lock", takes),
    ] {
        if keys.is_empty() {
            continue;
        }
        if !sql.is_empty() {
            sql.push_str("; ");
        }
        sql.push_str("SELECT ");
        for (i, (_, key)) in keys.iter().enumerate() {
            if i > 0 {
                sql.push_str(", ");
            }
            // A number we formatted; writing to a `String` cannot fail.
            let _ = write!(sql, "{f}({key})");
        }
    }
    if sql.is_empty() && pings {
        sql.push_str("SELECT 1");
    }
    sql
}

/// Up to `budget` items off the front of `v`.
fn drain_up_to<T>(v: &mut Vec<T>, budget: &mut usize) -> Vec<T> {
    let n = v.len().min(*budget);
    *budget -= n;
    v.drain(..n).collect()
}

impl HeldLock for AdvisoryLock {
    /// Whether the session still holds the lock: a ping (`SELECT 1`, or
    /// any round sent after the check was asked) of its connection,
    /// unless the session answered a round sent less than
    /// [`CHECK_TRUSTS`] before the check was asked, or after it
    /// (`docs/design.md` §8f item 12). Drivers of many threads share one
    /// session, so the checks of a busy runner would queue on it, each
    /// proving no more than the one answered just before.
    fn check(&self) -> Result<(), BackendError> {
        let asked = Instant::now();
        let session = self.session.lock();
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
        match self
            .session
            .ask(session, &self.location, None, Some(asked), |q, ticket| {
                q.pings.push(ticket)
            }) {
            Ok(Answer::Alive) => {
                // The lock must still be of the current connection.
                let session = self.session.lock();
                if session.generation == self.generation && session.held.contains(&self.key) {
                    Ok(())
                } else {
                    Err(lost("the connection was lost earlier and given up".into()))
                }
            }
            Ok(Answer::Failed(detail)) => Err(lost(detail)),
            Ok(Answer::Taken { .. }) => Err(lost("the lock session answered out of turn".into())),
            Err(e @ BackendError::LockLost { .. }) => Err(e),
            Err(BackendError::Postgres { source, .. }) => {
                Err(lost(super::lock_lost_detail(&source)))
            }
            Err(e) => Err(lost(e.to_string())),
        }
    }
}

impl Drop for AdvisoryLock {
    fn drop(&mut self) {
        let mut session = self.session.lock();
        if session.generation != self.generation || !session.held.remove(&self.key) {
            return;
        }
        session.queue.releases.push((self.generation, self.key));
        // With a round in flight, its leader (or a waiting taker) sends
        // this release in the next one; else this caller sends it now.
        drop(self.session.flush_releases(session, &self.location));
    }
}

impl PostgresBackend {
    /// Takes advisory lock `key` in this handle's lock session: `None`
    /// when another session (anywhere) or this handle holds it. The take
    /// goes in the session's next round (see [`LockSession`]).
    pub(super) fn try_advisory(&self, key: i64) -> Result<Option<Box<dyn HeldLock>>, BackendError> {
        let mut session = self.locks.lock();
        if !session.sending && session.client.as_ref().is_some_and(Client::is_closed) {
            // The connection is known to be gone, and every lock of it:
            // this take opens a new session.
            session.client = None;
            session.held.clear();
            session.generation += 1;
        }
        if session.held.contains(&key) || session.taking.contains(&key) {
            return Ok(None);
        }
        session.taking.insert(key);
        let connect = || -> Result<Client, BackendError> {
            let super::Reused::Fresh(mut client) = self.connect_or_reuse(|| None::<()>)? else {
                unreachable!("nothing to reuse")
            };
            // A simple query, not the extended protocol: an unnamed
            // portal would stay open, holding its snapshot (and vacuum's
            // horizon).
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
            Ok(*client)
        };
        let answer = self.locks.ask(
            session,
            &self.location,
            Some(&connect),
            None,
            |q, ticket| {
                q.takes.push((ticket, key));
            },
        );
        match answer {
            Ok(Answer::Taken {
                granted: true,
                generation,
            }) => Ok(Some(Box::new(AdvisoryLock {
                session: self.locks.clone(),
                location: self.location.clone(),
                generation,
                key,
            }))),
            Ok(Answer::Taken { granted: false, .. }) => Ok(None),
            Ok(Answer::Failed(detail)) => Err(BackendError::ConnectionLost {
                location: self.location.clone(),
                op: format!(
                    "taking an advisory lock, in a round of the lock session that failed: {detail}"
                ),
            }),
            Ok(Answer::Alive) => Err(BackendError::ConnectionLost {
                location: self.location.clone(),
                op: "taking an advisory lock (the lock session answered out of turn)".into(),
            }),
            Err(e) => Err(e),
        }
    }
}

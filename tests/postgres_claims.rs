//! Claims across machines on PostgreSQL (`docs/design.md` §4b, "Claims on
//! PostgreSQL"): a claim is an advisory lock held by a transaction on a
//! connection of its own. When that connection is lost (here: the server
//! terminates it, as it does when its TCP keepalive gives up on a
//! vanished machine) another runner takes the thread over at once; the
//! runner that lost it is stopped before its next agent call, and a late
//! step it still tries to commit is refused by the head compare-and-swap.
#![cfg(feature = "postgres")]

mod common;

use common::backend::TestBackend;
use common::{next, step};
use uwf_db::backend::postgres::{CHECK_TRUSTS, PostgresBackend};
use uwf_db::backend::{Backend, BackendError};
use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
use uwf_db::engine::{Cancel, DriveOptions, EngineError, StartOptions};
use uwf_db::thread::{ThreadError, ThreadStatus};
use uwf_db::{Store, StoreError};

/// Counts its calls.
#[derive(Default)]
struct Counting(usize);

impl Agent for Counting {
    fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
        self.0 += 1;
        Ok(format!("{} did it", req.role_name).into())
    }
}

/// The first column of every row `query` returns.
fn first_column<T: for<'a> postgres::types::FromSql<'a>>(
    sql: &mut postgres::Client,
    query: &str,
    params: &[&(dyn postgres::types::ToSql + Sync)],
) -> Vec<T> {
    sql.query(query, params)
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// A fresh PostgreSQL store and a connection of the test's own to its
/// database; `None` (the test does not run) without a server.
fn store_and_sql() -> Option<(common::backend::TestStore, postgres::Client)> {
    if !TestBackend::Postgres.available() {
        return None;
    }
    let test_store = TestBackend::Postgres.fast();
    let url = test_store.store_arg().into_string().unwrap();
    let sql = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    Some((test_store, sql))
}

/// The server processes holding an advisory lock in the test's database.
fn advisory_holders(sql: &mut postgres::Client) -> Vec<i32> {
    first_column(
        sql,
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        &[],
    )
}

#[test]
fn a_claim_lost_with_its_connection_is_taken_over_and_its_holder_stopped() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let test_store = TestBackend::Postgres.fast();
    let a: &Store = &test_store;
    let b = test_store.open_again();
    let url = test_store.store_arg().into_string().unwrap();
    let mut sql = postgres::Client::connect(&url, postgres::NoTls).unwrap();

    let hash = common::two_roles(a, "two");
    let id = a
        .engine()
        .start_workflow(hash, "a task", &StartOptions::default())
        .unwrap()
        .id;
    let stale_head = a.threads().get(id).unwrap().unwrap().head;

    // Runner A claims the thread: one advisory lock, in its own session.
    let claim = a.engine().claim(id, &Cancel::new()).unwrap();
    let holders = advisory_holders(&mut sql);
    assert_eq!(holders.len(), 1, "{holders:?}");
    // B is refused while A's lock is held.
    let refused = b.engine().claim(id, &Cancel::new());
    assert!(
        matches!(refused, Err(EngineError::Claimed { .. })),
        "{refused:?}"
    );

    // A's lock connection is lost: the server ends its transaction.
    let terminated: bool = sql
        .query_one("SELECT pg_terminate_backend($1)", &[&holders[0]])
        .unwrap()
        .get(0);
    assert!(terminated);
    let started = std::time::Instant::now();
    while !advisory_holders(&mut sql).is_empty() {
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        std::thread::sleep(std::time::Duration::from_millis(10));
    }

    // B takes over at once and drives one step.
    let mut agent_b = Counting::default();
    let one = DriveOptions {
        max_steps: Some(1),
        ..DriveOptions::default()
    };
    let report = b.engine().drive(id, &one, &mut agent_b);
    assert!(report.error.is_none(), "{:?}", report.error);
    assert_eq!((report.results.len(), agent_b.0), (1, 1));
    let after_b = b.threads().get(id).unwrap().unwrap();
    assert_eq!(after_b.seq, 1);

    // A, still holding its (lost) claim, is stopped before its agent runs
    // (its session last answered when it claimed, longer ago than a check
    // trusts an answer, so the check pings).
    std::thread::sleep(2 * CHECK_TRUSTS);
    let mut agent_a = Counting::default();
    let report = a.engine().drive(id, &DriveOptions::default(), &mut agent_a);
    assert!(
        matches!(
            report.error,
            Some(EngineError::Store(StoreError::Backend(
                BackendError::LockLost { .. }
            )))
        ),
        "{:?}",
        report.error
    );
    assert!(report.results.is_empty());
    assert_eq!(agent_a.0, 0, "no agent call after the claim was lost");
    let message = report.error.unwrap().to_string();
    assert!(message.contains("lost"), "{message}");

    // A late step from A's stale view of the head is refused, not merged.
    let late = a.threads().low_level().append_step(
        id,
        stale_head,
        step("writer", "_", "a stale runner's late step"),
        next("reviewer"),
    );
    assert!(
        matches!(late, Err(ThreadError::Conflict { .. })),
        "{late:?}"
    );
    drop(claim);
    let record = a.threads().get(id).unwrap().unwrap();
    assert_eq!(record.head, after_b.head, "B's step stands alone");
    assert_eq!(record.status, ThreadStatus::Idle);

    // And B finishes the thread.
    let report = b.engine().drive(id, &DriveOptions::default(), &mut agent_b);
    assert!(report.error.is_none(), "{:?}", report.error);
    assert_eq!(
        b.threads().get(id).unwrap().unwrap().status,
        ThreadStatus::Completed
    );
    assert_eq!(agent_b.0, 2);
}

/// A busy runner's checks of its claims share the lock session's answers
/// (`docs/design.md` §8f item 12): a check less than `CHECK_TRUSTS` after
/// an answer sends no ping, so a thousand checks in a row send at most one
/// each `CHECK_TRUSTS`; a check after the session has been quiet longer
/// pings.
#[test]
fn checks_ping_at_most_once_each_check_trusts() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let test_store = TestBackend::Postgres.fast();
    let store: &Store = &test_store;
    let pg = || {
        store
            .backend()
            .as_any()
            .downcast_ref::<PostgresBackend>()
            .expect("a PostgreSQL store")
            .lock_pings()
    };
    let hash = common::two_roles(store, "two");
    let id = store
        .engine()
        .start_workflow(hash, "a task", &StartOptions::default())
        .unwrap()
        .id;
    let _outer = store.engine().claim(id, &Cancel::new()).unwrap();
    let before = pg();
    let started = std::time::Instant::now();
    for _ in 0..1000 {
        // A nested claim checks the outer claim's lock.
        drop(store.engine().claim(id, &Cancel::new()).unwrap());
    }
    let elapsed = started.elapsed();
    let pings = pg() - before;
    let bound = 1 + elapsed.as_nanos() / CHECK_TRUSTS.as_nanos();
    assert!(
        u128::from(pings) <= bound,
        "{pings} pings in {elapsed:?} (at most {bound})"
    );
    // Quiet for longer than a check trusts an answer: the next one pings.
    std::thread::sleep(2 * CHECK_TRUSTS);
    let before = pg();
    let sent = std::time::Instant::now();
    drop(store.engine().claim(id, &Cancel::new()).unwrap());
    assert_eq!(pg() - before, 1);
    // And the one after it, at once, does not — when both came within
    // `CHECK_TRUSTS` of that ping's sending (on a server slower than that,
    // the second may ping again, but no more).
    drop(store.engine().claim(id, &Cancel::new()).unwrap());
    if sent.elapsed() < CHECK_TRUSTS {
        assert_eq!(pg() - before, 1);
    } else {
        assert!(pg() - before <= 2);
    }
}

/// A claim's transaction holds no snapshot and no transaction id, so an
/// open claim does not hold back vacuum (`backend_xmin` and `backend_xid`
/// are null), and it is `idle in transaction` between statements.
#[test]
fn an_open_claim_does_not_hold_back_vacuum() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let test_store = TestBackend::Postgres.fast();
    let url = test_store.store_arg().into_string().unwrap();
    let mut sql = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let hash = common::two_roles(&test_store, "two");
    let id = test_store
        .engine()
        .start_workflow(hash, "a task", &StartOptions::default())
        .unwrap()
        .id;
    let _claim = test_store.engine().claim(id, &Cancel::new()).unwrap();
    let holders = advisory_holders(&mut sql);
    assert_eq!(holders.len(), 1);
    let row = sql
        .query_one(
            "SELECT state, backend_xmin::text, backend_xid::text FROM pg_stat_activity WHERE pid = $1",
            &[&holders[0]],
        )
        .unwrap();
    let (state, xmin, xid): (String, Option<String>, Option<String>) =
        (row.get(0), row.get(1), row.get(2));
    assert_eq!(state, "idle in transaction");
    assert_eq!((xmin, xid), (None, None));
}

/// The advisory locks held by server process `pid`, as the one-bigint
/// keys `pg_try_advisory_lock(key)` takes.
fn advisory_keys_of(sql: &mut postgres::Client, pid: i32) -> Vec<i64> {
    first_column(
        sql,
        "SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks \
         WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND pid = $1",
        &[&pid],
    )
}

/// Takes and releases of many drivers share the lock session's round
/// trips (`docs/design.md` §8f item 16): 32 threads taking and
/// releasing claims at once cost fewer round trips than requests; a key
/// is never granted to two takers of the session at once (a session's
/// advisory locks are re-entrant on the server, so the session itself
/// must refuse the second); every release reaches the server (after the
/// threads end, another handle takes every key before this session sends
/// anything more).
#[test]
fn concurrent_claims_share_round_trips_and_never_grant_a_key_twice() {
    if !TestBackend::Postgres.available() {
        return;
    }
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const THREADS: usize = 32;
    const ROUNDS: usize = 40;
    const SHARED: usize = 4;
    let test_store = TestBackend::Postgres.fast();
    let store: &Store = &test_store;
    let pg = store
        .backend()
        .as_any()
        .downcast_ref::<PostgresBackend>()
        .expect("a PostgreSQL store");
    // Claim keys: a few every thread competes for, and one of each
    // thread's own (distinct ids whose folded advisory keys differ).
    let key = |i: u64| -> [u8; 16] { (u128::from(i) << 65).to_be_bytes() };
    let shared: Vec<AtomicBool> = (0..SHARED).map(|_| AtomicBool::new(false)).collect();
    let requests = AtomicU64::new(0);
    let contested_wins = AtomicU64::new(0);
    let before = pg.lock_round_trips();
    let barrier = std::sync::Barrier::new(THREADS);
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (shared, requests, contested_wins, barrier) =
                (&shared, &requests, &contested_wins, &barrier);
            scope.spawn(move || {
                barrier.wait();
                for r in 0..ROUNDS {
                    let own = pg
                        .try_lock_claim(key(1000 + t as u64))
                        .unwrap()
                        .expect("a key no one else takes is granted");
                    let s = (t + r) % SHARED;
                    let contested = pg.try_lock_claim(key(s as u64)).unwrap();
                    requests.fetch_add(2, Ordering::Relaxed);
                    if let Some(lock) = contested {
                        assert!(
                            !shared[s].swap(true, Ordering::SeqCst),
                            "key {s} granted twice at once"
                        );
                        contested_wins.fetch_add(1, Ordering::Relaxed);
                        std::thread::yield_now();
                        shared[s].store(false, Ordering::SeqCst);
                        drop(lock);
                        requests.fetch_add(1, Ordering::Relaxed);
                    }
                    drop(own);
                    requests.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    let round_trips = pg.lock_round_trips() - before;
    let requests = requests.into_inner();
    assert!(contested_wins.into_inner() > 0);
    // 32 threads queue behind each round in flight: rounds carry several
    // requests each (one per request would be 3,840 or more round trips).
    assert!(
        round_trips * 4 <= requests,
        "{round_trips} round trips for {requests} takes and releases"
    );
    eprintln!("{requests} takes and releases in {round_trips} round trips");

    // Every release reached the server: another handle takes every key
    // (before this session sends anything more), and this session then
    // holds only what it takes next.
    let other = test_store.open_again();
    let mut taken = Vec::new();
    for i in (0..SHARED as u64).chain((0..THREADS as u64).map(|t| 1000 + t)) {
        let lock = other.backend().try_lock_claim(key(i)).unwrap();
        assert!(lock.is_some(), "key {i} still held after its release");
        taken.push(lock);
    }
    drop(taken);
    let url = test_store.store_arg().into_string().unwrap();
    let mut sql = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let _probe = pg.try_lock_claim(key(99)).unwrap().unwrap();
    let ours = advisory_holders(&mut sql)
        .into_iter()
        .filter(|pid| advisory_keys_of(&mut sql, *pid).contains(&99))
        .count();
    assert_eq!(ours, 1);
}

/// A round that fails (the server ended the lock session) fails the takes
/// in it, gives every lock of the session up, and the next take opens a
/// new session.
#[test]
fn a_lost_lock_session_fails_its_round_and_the_next_take_reconnects() {
    let Some((test_store, mut sql)) = store_and_sql() else {
        return;
    };
    let store: &Store = &test_store;
    let key = |i: u8| -> [u8; 16] { (u128::from(i) << 65).to_be_bytes() };
    let held = store.backend().try_lock_claim(key(1)).unwrap().unwrap();
    let holders = advisory_holders(&mut sql);
    assert_eq!(holders.len(), 1);
    let terminated: bool = sql
        .query_one("SELECT pg_terminate_backend($1)", &[&holders[0]])
        .unwrap()
        .get(0);
    assert!(terminated);
    while !advisory_holders(&mut sql).is_empty() {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // Eight takes at once: the first round goes out on the connection the
    // server ended (the client learns it is closed only by using it) and
    // fails every take it carries; each failed take then succeeds on the
    // new session.
    let barrier = std::sync::Barrier::new(8);
    let failed = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for i in 2..10u8 {
            let (barrier, failed) = (&barrier, &failed);
            scope.spawn(move || {
                barrier.wait();
                let lock = match store.backend().try_lock_claim(key(i)) {
                    Ok(Some(lock)) => lock,
                    Ok(None) => panic!("key {i} refused"),
                    Err(e) => {
                        assert!(e.is_connection_lost(), "{e}");
                        failed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        store.backend().try_lock_claim(key(i)).unwrap().unwrap()
                    }
                };
                drop(lock);
            });
        }
    });
    let failed = failed.into_inner();
    assert!(failed >= 1, "no take failed with the lost session");
    eprintln!("{failed} of 8 takes failed with the lost session");
    // The lock of the lost session is lost, and its key free again.
    std::thread::sleep(2 * CHECK_TRUSTS);
    let lost = held.check();
    assert!(
        matches!(lost, Err(BackendError::LockLost { .. })),
        "{lost:?}"
    );
    drop(held);
    assert!(store.backend().try_lock_claim(key(1)).unwrap().is_some());
}

/// Takes queued behind a round whose connection cannot be opened all fail
/// (`docs/design.md` §8f item 16): the leader with the server's refusal,
/// the takes that shared its round as a lost connection; nothing is held,
/// and once the server takes connections again every key is granted.
#[test]
fn takes_sharing_a_round_that_cannot_connect_all_fail_and_hold_nothing() {
    let Some((test_store, mut sql)) = store_and_sql() else {
        return;
    };
    let store: &Store = &test_store;
    let db: String = sql
        .query_one("SELECT current_database()", &[])
        .unwrap()
        .get(0);
    // The same server, another database: a database's own sessions cannot
    // close it to connections.
    let mut admin =
        postgres::Client::connect(&common::backend::postgres_admin_url(), postgres::NoTls).unwrap();
    let key = |i: u8| -> [u8; 16] { (u128::from(i) << 65).to_be_bytes() };
    // No lock session yet; the server now refuses new connections to the
    // database (those open stay).
    admin
        .batch_execute(&format!("ALTER DATABASE \"{db}\" ALLOW_CONNECTIONS false"))
        .unwrap();
    let barrier = std::sync::Barrier::new(8);
    let shared = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for i in 0..8u8 {
            let (barrier, shared) = (&barrier, &shared);
            scope.spawn(move || {
                barrier.wait();
                let e = store.backend().try_lock_claim(key(i)).unwrap_err();
                if e.to_string()
                    .contains("in a round of the lock session that failed")
                {
                    assert!(e.is_connection_lost(), "{e}");
                    shared.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                } else {
                    assert!(
                        e.to_string()
                            .contains("not currently accepting connections"),
                        "{e}"
                    );
                }
            });
        }
    });
    // The leader's connect takes a round trip or more; the other takes,
    // released by the barrier at once, queue behind it (6 of 8 here).
    let shared = shared.into_inner();
    eprintln!("{shared} of 8 takes failed in a round another take led");
    assert!(shared >= 1, "no take shared the failed round");
    admin
        .batch_execute(&format!("ALTER DATABASE \"{db}\" ALLOW_CONNECTIONS true"))
        .unwrap();
    assert!(advisory_holders(&mut sql).is_empty());
    for i in 0..8u8 {
        assert!(store.backend().try_lock_claim(key(i)).unwrap().is_some());
    }
}

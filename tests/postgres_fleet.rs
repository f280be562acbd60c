//! PostgreSQL writers in parallel, and a few connections per runner
//! (`docs/design.md` §8f): writers of different threads never wait for
//! each other, writers of one thread are ordered (the loser of a race is
//! refused, never merged), the garbage collector's marker waits for the
//! writers in flight, and a handle opens at most `pg_connections`
//! connections for its transactions plus one for all its claims, however
//! many drivers it runs.
#![cfg(feature = "postgres")]

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::time::{Duration, Instant};

use common::backend::TestBackend;
use uwf_db::engine::Cancel;
use uwf_db::engine::StartOptions;
use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
use uwf_db::engine::batch::{BatchItem, BatchOptions};
use uwf_db::gc::GcOptions;
use uwf_db::thread::ThreadError;
use uwf_db::{Blob, Durability, Store, StoreError, StoreOptions};

struct Echo;

impl Agent for Echo {
    fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
        Ok(format!("{} did it", req.role_name).into())
    }
}

fn open(url: &str, connections: usize) -> Store {
    Store::open_location(
        url,
        StoreOptions {
            durability: Durability::None,
            pg_connections: connections,
            ..StoreOptions::default()
        },
    )
    .unwrap()
}

/// Server connections to the test's database, this one left out.
fn connections(sql: &mut postgres::Client) -> usize {
    let n: i64 = sql
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .unwrap()
        .get(0);
    usize::try_from(n).unwrap()
}

/// One handle holds a write transaction open on thread A's side of the
/// store; another handle writes thread B meanwhile and is not made to wait
/// (the old global writer lock would have queued it behind the first).
#[test]
fn writers_of_different_threads_do_not_wait_for_each_other() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let test_store = TestBackend::Postgres.fast();
    let url = test_store.store_arg().into_string().unwrap();
    let a = open(&url, 2);
    let b = open(&url, 2);
    let hash = common::two_roles(&a, "two");
    let thread_b = b
        .engine()
        .start_workflow(hash, "b's task", &StartOptions::default())
        .unwrap();
    let (opened, opened_rx) = mpsc::channel();
    let (done, done_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let a = &a;
        let holder = s.spawn(move || {
            a.write(|w| {
                let stored = w.put_blob(&Blob::content("held open", []))?;
                // A read sends BEGIN (and the store barrier) now.
                assert!(!w.contains(&common::h("nothing"))?);
                opened.send(()).unwrap();
                // Held open until B's write is through, or 20 s.
                let through = done_rx.recv_timeout(Duration::from_secs(20)).is_ok();
                Ok::<_, StoreError>((stored, through))
            })
            .unwrap()
        });
        opened_rx.recv().unwrap();
        let started = Instant::now();
        b.threads()
            .low_level()
            .append_step(
                thread_b.id,
                thread_b.head,
                common::step("writer", "_", "b's step"),
                common::next("reviewer"),
            )
            .unwrap();
        let waited = started.elapsed();
        done.send(()).unwrap();
        let (stored, through) = holder.join().unwrap();
        assert!(through, "B's write waited for A's open transaction");
        assert!(waited < Duration::from_secs(10), "{waited:?}");
        assert!(b.contains(&stored).unwrap());
    });
    assert_eq!(b.threads().get(thread_b.id).unwrap().unwrap().seq, 1);
}

/// Eight writers race to append to one thread from the same head, fifty
/// times: each round exactly one commits and seven are refused with a
/// conflict, and the chain holds exactly the winners' steps.
#[test]
fn writers_of_one_thread_are_ordered_and_losers_refused() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let test_store = TestBackend::Postgres.fast();
    let url = test_store.store_arg().into_string().unwrap();
    let handles: Vec<Store> = (0..8).map(|_| open(&url, 2)).collect();
    let t = common::new_thread(&handles[0], "race");
    let rounds = 50;
    let mut head = t.head;
    for round in 0..rounds {
        let gun = Barrier::new(handles.len());
        let outcomes: Vec<Result<(), ThreadError>> = std::thread::scope(|s| {
            let racers: Vec<_> = handles
                .iter()
                .enumerate()
                .map(|(i, store)| {
                    let gun = &gun;
                    s.spawn(move || {
                        gun.wait();
                        store
                            .threads()
                            .low_level()
                            .append_step(
                                t.id,
                                head,
                                common::step("dev", "ok", &format!("round {round} racer {i}")),
                                common::next("dev"),
                            )
                            .map(|_| ())
                    })
                })
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let won = outcomes.iter().filter(|o| o.is_ok()).count();
        let refused = outcomes
            .iter()
            .filter(|o| matches!(o, Err(ThreadError::Conflict { .. })))
            .count();
        assert_eq!((won, refused), (1, 7), "round {round}: {outcomes:?}");
        head = handles[0].threads().get(t.id).unwrap().unwrap().head;
    }
    let log = handles[0].threads().log(t.id, 1000, None).unwrap();
    assert_eq!(log.len(), rounds, "no lost or merged step");
    assert!(uwf_db::verify::verify(&handles[0], |_| {}).unwrap().is_ok());
}

/// A collection's marker commit waits for the writers in flight (the
/// store barrier taken exclusively): it cannot begin while a writer that
/// has not seen the marker is still open.
#[test]
fn the_gc_marker_waits_for_writers_in_flight() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let test_store = TestBackend::Postgres.fast();
    let url = test_store.store_arg().into_string().unwrap();
    let writer = open(&url, 2);
    let collector = open(&url, 2);
    let committed = AtomicBool::new(false);
    let (opened, opened_rx) = mpsc::channel();
    std::thread::scope(|s| {
        let (writer, committed) = (&writer, &committed);
        s.spawn(move || {
            writer
                .write(|w| {
                    assert!(!w.contains(&common::h("nothing"))?);
                    opened.send(()).unwrap();
                    std::thread::sleep(Duration::from_millis(700));
                    committed.store(true, Ordering::SeqCst);
                    w.put_blob(&Blob::content("written under the barrier", []))
                })
                .unwrap();
        });
        opened_rx.recv().unwrap();
        let options = GcOptions {
            grace: Duration::ZERO,
            ..GcOptions::default()
        };
        uwf_db::gc::collect_garbage(&collector, &options, &|_| {}).unwrap();
        assert!(
            committed.load(Ordering::SeqCst),
            "the collection ran while a writer was open"
        );
    });
}

/// A batch of 64 drivers on a handle allowed 3 connections opens at most
/// 3 for its transactions and 1 for its 64 claims, all 64 claims in that
/// one session; every thread completes.
#[test]
fn sixty_four_drivers_use_a_few_connections() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let test_store = TestBackend::Postgres.fast();
    let url = test_store.store_arg().into_string().unwrap();
    let mut sql = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    // The test harness's own handle holds connections too: closed first.
    let store = open(&url, 3);
    let hash = common::two_roles(&store, "two");
    let mut test_store = test_store;
    test_store.close();
    let before = connections(&mut sql);
    let peak = Arc::new(AtomicUsize::new(0));
    let claims_peak = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (peak, claims_peak, stop) = (peak.clone(), claims_peak.clone(), stop.clone());
        let mut sql = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let n = connections(&mut sql);
                peak.fetch_max(n, Ordering::SeqCst);
                // Claims (the one-bigint advisory form, but for the store
                // barrier every writer holds) and the sessions holding them.
                let row = sql
                    .query_one(
                        "SELECT count(*), count(DISTINCT pid) FROM pg_locks \
                         WHERE locktype = 'advisory' AND granted AND objsubid = 1 \
                         AND ((classid::bigint << 32) | objid::bigint) <> $1 \
                         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                        &[&uwf_db::backend::postgres::WRITER_LOCK],
                    )
                    .unwrap();
                let (claims, sessions): (i64, i64) = (row.get(0), row.get(1));
                assert!(sessions <= 1, "claims held in {sessions} sessions");
                claims_peak.fetch_max(usize::try_from(claims).unwrap(), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let prompts: Vec<String> = (0..400).map(|i| format!("task {i}")).collect();
    let agents: Vec<Box<dyn Agent>> = (0..64).map(|_| Box::new(Echo) as Box<dyn Agent>).collect();
    let report = store
        .engine()
        .run_batch(
            hash,
            &prompts,
            &BatchOptions::default(),
            agents,
            &mut |_: &BatchItem| {},
        )
        .unwrap();
    stop.store(true, Ordering::SeqCst);
    watcher.join().unwrap();
    assert_eq!(
        (report.threads, report.completed, report.errors),
        (400, 400, 0)
    );
    let peak = peak.load(Ordering::SeqCst);
    assert!(
        peak <= before + 3 + 1,
        "{peak} connections at the peak, {before} before (bound: 3 + 1)"
    );
    assert!(
        claims_peak.load(Ordering::SeqCst) > 1,
        "the claims were seen held together"
    );
    // Claims of this handle are refused to it again while held, and
    // released for others.
    let id = store
        .engine()
        .start_workflow(hash, "claimed", &StartOptions::default())
        .unwrap()
        .id;
    let held = store.engine().claim(id, &Cancel::new()).unwrap();
    let other = open(&url, 1);
    assert!(other.engine().claim(id, &Cancel::new()).is_err());
    drop(held);
    other.engine().claim(id, &Cancel::new()).unwrap();
}

/// A handle with two group writers (`pg_connections` 4) keeps one group in
/// flight while few requests wait: with the first writer's group held
/// open, five more requests are not committed beside it; once
/// `PARALLEL_MIN` (32) wait, the second writer commits them as a group of
/// their own while the first is still open (`docs/design.md` §5d, "Groups
/// in parallel").
#[test]
fn a_second_group_goes_beside_the_first_only_when_many_requests_wait() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let test_store = TestBackend::Postgres.fast();
    let url = test_store.store_arg().into_string().unwrap();
    let store = open(&url, 4);
    let (started, started_rx) = mpsc::channel::<()>();
    let (release, release_rx) = mpsc::channel::<()>();
    let committed = Arc::new(AtomicUsize::new(0));
    let (held, stats) = store.group_commit(0, |g| {
        std::thread::scope(|s| {
            let holder = {
                let g = g.clone();
                s.spawn(move || {
                    g.write_op(move |w| {
                        let stored = w.put_blob(&Blob::content("held", []))?;
                        let _ = started.send(());
                        // Held open until released, or 60 s (well after
                        // the test stops waiting for the second writer).
                        let released = release_rx.recv_timeout(Duration::from_secs(60)).is_ok();
                        Ok::<_, StoreError>((stored, released))
                    })
                })
            };
            started_rx.recv_timeout(Duration::from_secs(20)).unwrap();
            let send = |from: usize, to: usize| {
                for i in from..to {
                    let (g, committed) = (g.clone(), committed.clone());
                    s.spawn(move || {
                        g.write_op(move |w| w.put_blob(&Blob::content(format!("queued {i}"), [])))
                            .unwrap();
                        committed.fetch_add(1, Ordering::SeqCst);
                    });
                }
            };
            send(0, 5);
            std::thread::sleep(Duration::from_millis(300));
            let early = committed.load(Ordering::SeqCst);
            send(5, 45);
            // At least the 32 that woke the second writer commit while the
            // first group is still open.
            let deadline = Instant::now() + Duration::from_secs(20);
            while committed.load(Ordering::SeqCst) < 32 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            let beside = committed.load(Ordering::SeqCst);
            release.send(()).unwrap();
            let held = holder.join().unwrap().unwrap();
            (held, early, beside)
        })
    });
    let ((stored, released), early, beside) = held;
    assert_eq!(early, 0, "a small group went beside the open one");
    assert!(beside >= 32, "{beside} committed beside the open group");
    assert!(
        released,
        "the open group was released by the test, not by its timeout"
    );
    assert_eq!(committed.load(Ordering::SeqCst), 45);
    assert!(store.contains(&stored).unwrap());
    assert!(stats.groups >= 2, "{stats:?}");
    assert_eq!(stats.requests, 46);
}

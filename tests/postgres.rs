//! What is PostgreSQL's alone: the query plans behind a page of
//! `thread list`. (Everything else runs in the conformance suite, as
//! `postgres::*`.)
#![cfg(feature = "postgres")]

mod common;

use common::backend::TestBackend;

/// A page of `thread list` reads the `activity` table newest first
/// (`docs/design.md` §4, "Activity entry"); on PostgreSQL that is a range
/// of `uwf_activity` in descending key order, 512 rows per round trip, in
/// exactly this form (`backend/postgres.rs`, `Txn::page`). With 20,000
/// threads' entries it must be served by the primary key's index, never
/// by a sequential scan.
#[test]
fn a_page_of_thread_list_is_an_index_scan() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let store = TestBackend::Postgres.fast();
    let url = store.store_arg().into_string().unwrap();
    let mut sql = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    // 20,000 activity entries: 8-byte time + 16-byte id, as the engine
    // writes them.
    sql.batch_execute(
        "INSERT INTO uwf_activity (k, v) \
         SELECT int8send(1700000000000 + i) || decode(lpad(to_hex(i), 32, '0'), 'hex'), \
                '\\x000072657669657721'::bytea \
         FROM generate_series(1, 20000) AS i; \
         ANALYZE uwf_activity;",
    )
    .unwrap();
    let plans = [
        // The first page, newest first.
        "EXPLAIN SELECT k, v FROM uwf_activity WHERE true ORDER BY k DESC LIMIT 512",
        // A later page or `--until`: below a key.
        "EXPLAIN SELECT k, v FROM uwf_activity WHERE true AND k < '\\x0000018bcfe5a9d0'::bytea \
         ORDER BY k DESC LIMIT 512",
        // `--since` and `--until`: between two keys.
        "EXPLAIN SELECT k, v FROM uwf_activity WHERE true AND k >= '\\x0000018bcfe56800'::bytea \
         AND k < '\\x0000018bcfe5a9d0'::bytea ORDER BY k DESC LIMIT 512",
    ];
    for query in plans {
        let plan: Vec<String> = sql
            .query(query, &[])
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect();
        let plan = plan.join("\n");
        assert!(
            plan.contains("Index Scan Backward using uwf_activity_pkey"),
            "{query}\n{plan}"
        );
        assert!(!plan.contains("Seq Scan"), "{query}\n{plan}");
    }
    // The store still reads them (and lists nothing it cannot decode).
    assert_eq!(store.stats().unwrap().blob_count, 0);
}

// ---------------------------------------------------------------------
// Schema version 2: typed columns, migration, version checks
// (`docs/design.md` §4b, "The PostgreSQL schema").

use std::time::{SystemTime, UNIX_EPOCH};

use common::{append_n, new_thread, next, step, workflow};
use uwf_db::backend::BackendError;
use uwf_db::engine::StartOptions;
use uwf_db::engine::agent::ScriptAgent;
use uwf_db::thread::{EndSpec, NewThread, Next, ThreadId, ThreadQuery, ThreadRecord, ThreadStatus};
use uwf_db::workflow::parse_workflow;
use uwf_db::{Blob, OpenError, Store, StoreOptions};

/// A thread as its typed columns say it is.
#[derive(Debug, PartialEq)]
struct Columns {
    id: String,
    status: String,
    workflow: String,
    created_at: u64,
    updated_at: u64,
    completed_at: Option<u64>,
    head: String,
    seq: i64,
    parent_thread: Option<String>,
    last_error: Option<String>,
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

impl Columns {
    /// What the columns must say of `r`: the id and hashes as the CLI
    /// prints them, times to the millisecond.
    fn of(r: &ThreadRecord) -> Columns {
        Columns {
            id: r.id.to_string(),
            status: r.status.as_str().to_owned(),
            workflow: r.workflow.clone(),
            created_at: r.created_at,
            updated_at: r.updated_at,
            completed_at: r.completed_at,
            head: r.head.to_string(),
            seq: r.seq as i64,
            parent_thread: r.parent_thread.map(|p| p.to_string()),
            last_error: r.last_error.clone(),
        }
    }

    fn from_row(row: &postgres::Row) -> Columns {
        Columns {
            id: row.get("id"),
            status: row.get("status"),
            workflow: row.get("workflow"),
            created_at: ms(row.get("created_at")),
            updated_at: ms(row.get("updated_at")),
            completed_at: row.get::<_, Option<SystemTime>>("completed_at").map(ms),
            head: row.get("head"),
            seq: row.get("seq"),
            parent_thread: row.get("parent_thread"),
            last_error: row.get("last_error"),
        }
    }
}

const SELECT_THREADS: &str = "SELECT id, status, workflow, created_at, updated_at, \
     NULL::timestamptz AS completed_at, head, seq, parent_thread, last_error FROM uwf_threads";
const SELECT_HISTORY: &str = "SELECT id, status, workflow, created_at, updated_at, \
     completed_at, head, seq, parent_thread, last_error FROM uwf_history";

/// The typed columns of thread `id` in the active table and in history.
fn columns_of(sql: &mut postgres::Client, id: ThreadId) -> (Vec<Columns>, Vec<Columns>) {
    let id = id.to_string();
    let active = sql
        .query(&format!("{SELECT_THREADS} WHERE id = $1"), &[&id])
        .unwrap();
    let ended = sql
        .query(&format!("{SELECT_HISTORY} WHERE id = $1"), &[&id])
        .unwrap();
    (
        active.iter().map(Columns::from_row).collect(),
        ended.iter().map(Columns::from_row).collect(),
    )
}

/// Asserts that the typed columns of `id` are exactly what the library
/// reads from the record bytes, in the table where the record lives.
fn assert_columns_match(store: &Store, sql: &mut postgres::Client, id: ThreadId) {
    let (active, ended) = columns_of(sql, id);
    match store.threads().get(id).unwrap() {
        None => assert!(active.is_empty() && ended.is_empty(), "{id} was removed"),
        Some(r) if r.completed_at.is_some() => {
            assert!(active.is_empty(), "{id} ended but is in uwf_threads");
            assert_eq!(ended, vec![Columns::of(&r)]);
        }
        Some(r) => {
            assert!(ended.is_empty(), "{id} is active but in uwf_history");
            assert_eq!(active, vec![Columns::of(&r)]);
        }
    }
}

/// The whole listing (`thread list`) agrees with the view, row for row
/// and in the same order (newest activity first).
fn assert_listing_matches_view(store: &Store, sql: &mut postgres::Client) {
    let listed = store
        .threads()
        .list(&ThreadQuery {
            limit: 1000,
            ..ThreadQuery::default()
        })
        .unwrap();
    let view: Vec<(String, String, bool)> = sql
        .query(
            "SELECT id, status, ended FROM uwf_thread_list ORDER BY last_activity DESC, id DESC",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let want: Vec<(String, String, bool)> = listed
        .iter()
        .map(|r| {
            (
                r.id.to_string(),
                r.status.as_str().to_owned(),
                r.completed_at.is_some(),
            )
        })
        .collect();
    assert_eq!(view, want);
}

fn end(code: u8) -> EndSpec {
    EndSpec {
        return_code: code,
        summary: format!("ended with {code}"),
        prompt: "Approved".into(),
    }
}

/// Threads in every place a record can be: active with steps, active
/// with a failure, a child, ended (failed) in history. Returns their ids.
fn drive_some_threads(store: &Store) -> Vec<ThreadId> {
    let wf = parse_workflow(
        include_str!("../examples/review.yaml"),
        Some("review"),
        &|_| false,
    )
    .unwrap();
    store.workflows().add(&wf).unwrap();
    let a = new_thread(store, "review");
    let a = append_n(store, a.id, 3);
    let b = new_thread(store, "deploy");
    store
        .threads()
        .low_level()
        .record_failure(b.id, "agent exited with status 3")
        .unwrap();
    let child = store
        .threads()
        .low_level()
        .start_thread(NewThread {
            workflow: "review".into(),
            workflow_hash: workflow(store, "review"),
            prompt: "a child".into(),
            max_rounds: 10,
            depth: 1,
            parent_state: Some(a.head),
            parent_thread: Some(a.id),
            next_role: "dev".into(),
            next_instruction: "Implement".into(),
            agent: None,
            cwd: None,
            next_location: None,
            labels: Default::default(),
        })
        .unwrap();
    let ended = new_thread(store, "review");
    let ended = append_n(store, ended.id, 2);
    store
        .threads()
        .low_level()
        .end_thread(ended.id, ended.head, end(1))
        .unwrap();
    vec![a.id, b.id, child.id, ended.id]
}

fn connect(store: &common::backend::TestStore) -> postgres::Client {
    connect_url(&store.store_arg().into_string().unwrap())
}

fn connect_url(url: &str) -> postgres::Client {
    postgres::Client::connect(url, postgres::NoTls).unwrap()
}

/// Text columns are written as array elements in a simple query: a failure
/// whose text holds quotes, backslashes, SQL, non-ASCII and a NUL (which
/// PostgreSQL's text cannot hold) is stored exactly in the record, and its
/// column says the same text with the NUL as U+FFFD; nothing else is run.
#[test]
fn awkward_text_reaches_the_columns_as_text() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let store = TestBackend::Postgres.fast();
    let mut sql = connect(&store);
    drive_some_threads(&store);
    let t = new_thread(&store, "review");
    let awkward = "it's \\'; DROP TABLE uwf_blobs; -- \\x00 ünï 🦀 \0 end";
    store
        .threads()
        .low_level()
        .record_failure(t.id, awkward)
        .unwrap();
    let record = store.threads().get(t.id).unwrap().unwrap();
    assert_eq!(record.last_error.as_deref(), Some(awkward));
    let (rows, _) = columns_of(&mut sql, t.id);
    assert_eq!(
        rows[0].last_error.as_deref(),
        Some(awkward.replace('\0', "\u{fffd}").as_str())
    );
    let blobs: i64 = sql
        .query_one("SELECT count(*) FROM uwf_blobs", &[])
        .unwrap()
        .get(0);
    assert!(blobs > 0);
    assert_eq!(rows[0].status, record.status.as_str());
    assert_eq!(rows[0].updated_at, record.updated_at);
    // Text goes out as an element of an array literal (a prepared
    // statement's argument, `docs/design.md` §8f): what array syntax
    // treats specially arrives as plain text too.
    for text in [
        "NULL",
        "",
        "  spaced  ",
        "\"quoted\"",
        "{a,b}",
        "a,b",
        "}",
        "\\",
        "\\\"",
        "'",
        "''\\''",
        "tab\there\nnewline",
        "{\"NULL\", \\N, '\\x00'}",
    ] {
        store
            .threads()
            .low_level()
            .record_failure(t.id, text)
            .unwrap();
        let (rows, _) = columns_of(&mut sql, t.id);
        assert_eq!(rows[0].last_error.as_deref(), Some(text), "{text:?}");
    }
}

/// The typed columns say what the record bytes say, after every kind of
/// write: start, step, failure, end (the row moves to `uwf_history`),
/// resume from history (it moves back), rm (it goes).
#[test]
fn typed_columns_follow_every_write() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let store = TestBackend::Postgres.fast();
    let mut sql = connect(&store);
    let ids = drive_some_threads(&store);
    for &id in &ids {
        assert_columns_match(&store, &mut sql, id);
    }
    assert_listing_matches_view(&store, &mut sql);
    let [a, b, child, ended] = ids[..] else {
        unreachable!()
    };
    // The child names its parent; the failure is readable.
    let (rows, _) = columns_of(&mut sql, child);
    assert_eq!(rows[0].parent_thread, Some(a.to_string()));
    let (rows, _) = columns_of(&mut sql, b);
    assert_eq!(
        rows[0].last_error.as_deref(),
        Some("agent exited with status 3")
    );
    let (_, rows) = columns_of(&mut sql, ended);
    assert_eq!(rows[0].status, "failed");

    // A step clears the failure and moves head, seq and updated_at.
    let before = store.threads().get(b).unwrap().unwrap();
    let after = store
        .threads()
        .low_level()
        .append_step(b, before.head, step("dev", "ok", "fixed"), next("dev"))
        .unwrap()
        .record;
    assert_ne!(after.head, before.head);
    assert_columns_match(&store, &mut sql, b);
    let (rows, _) = columns_of(&mut sql, b);
    assert_eq!((rows[0].seq, rows[0].last_error.as_deref()), (1, None));

    // Ending moves the row to history with its completion time.
    let head = store.threads().get(a).unwrap().unwrap().head;
    store
        .threads()
        .low_level()
        .end_thread(a, head, end(0))
        .unwrap();
    assert_columns_match(&store, &mut sql, a);
    let (active, history) = columns_of(&mut sql, a);
    assert!(active.is_empty());
    assert_eq!(history[0].status, "completed");
    assert!(history[0].completed_at.is_some());

    // Resuming from history moves it back.
    let r = store.threads().get(ended).unwrap().unwrap();
    store
        .threads()
        .low_level()
        .resume_ended(ended, r.head, step("dev", "ok", "more"), next("rev"))
        .unwrap();
    assert_columns_match(&store, &mut sql, ended);
    assert_eq!(columns_of(&mut sql, ended).0[0].status, "idle");

    // rm removes the row.
    store.threads().remove(child).unwrap();
    assert_columns_match(&store, &mut sql, child);
    assert_eq!(columns_of(&mut sql, child), (vec![], vec![]));

    assert_listing_matches_view(&store, &mut sql);
    for id in ids {
        assert_columns_match(&store, &mut sql, id);
    }
}

/// Statuses as typed columns are the lowercase names the CLI prints.
#[test]
fn status_filters_in_sql_match_the_library() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let store = TestBackend::Postgres.fast();
    let mut sql = connect(&store);
    drive_some_threads(&store);
    for status in ThreadStatus::ALL {
        let listed: Vec<String> = store
            .threads()
            .list(&ThreadQuery {
                statuses: vec![status],
                limit: 1000,
                ..ThreadQuery::default()
            })
            .unwrap()
            .iter()
            .map(|r| r.id.to_string())
            .collect();
        let selected: Vec<String> = sql
            .query(
                "SELECT id FROM uwf_thread_list WHERE status = $1 \
                 ORDER BY last_activity DESC, id DESC",
                &[&status.as_str()],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(selected, listed, "{status}");
    }
}

/// The DDL of schema version 1, as the first PostgreSQL backend wrote it.
fn v1_ddl() -> String {
    let mut ddl = String::from(
        "CREATE TABLE uwf_schema (version integer NOT NULL); \
         INSERT INTO uwf_schema (version) VALUES (1);",
    );
    for table in [
        "meta",
        "blobs",
        "threads",
        "history",
        "history_ids",
        "activity",
        "children",
        "workflows",
        "pins",
    ] {
        ddl.push_str(&format!(
            " CREATE TABLE uwf_{table} (k bytea PRIMARY KEY, v bytea NOT NULL);"
        ));
    }
    ddl
}

const ALL_TABLES: [&str; 9] = [
    "uwf_meta",
    "uwf_blobs",
    "uwf_threads",
    "uwf_history",
    "uwf_history_ids",
    "uwf_activity",
    "uwf_children",
    "uwf_workflows",
    "uwf_pins",
];

fn schema_version(sql: &mut postgres::Client) -> i32 {
    sql.query_one("SELECT max(version) FROM uwf_schema", &[])
        .unwrap()
        .get(0)
}

fn column_names(sql: &mut postgres::Client, table: &str) -> Vec<String> {
    sql.query(
        "SELECT column_name::text FROM information_schema.columns \
         WHERE table_name = $1 ORDER BY ordinal_position",
        &[&table],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

fn reader_options() -> StoreOptions {
    StoreOptions {
        create: false,
        ..StoreOptions::default()
    }
}

/// A version 1 database (the v1 DDL, with every key and value of a store
/// driven through the library copied in) is migrated on first use, by a
/// reading opener too: version 2, typed columns backfilled from the record
/// bytes, indexes and views in place, and the store works on. Two
/// processes opening it at once do not race. A record that does not
/// decode stops the migration with a message naming the thread, and
/// leaves version 1 untouched.
#[test]
fn a_version_1_store_is_migrated_on_first_use() {
    if !TestBackend::Postgres.available() {
        return;
    }
    // The source: a store driven through the library.
    let source = TestBackend::Postgres.fast();
    let ids = drive_some_threads(&source);
    // 300 more, so the backfill takes more than one batch.
    for _ in 0..300 {
        new_thread(&source, "bulk");
    }
    let mut from = connect(&source);

    // The version 1 database, by hand.
    let v1 = TestBackend::Postgres.location();
    let url = v1.arg_str();
    let mut sql = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    sql.batch_execute(&v1_ddl()).unwrap();
    for table in ALL_TABLES {
        for row in from
            .query(&format!("SELECT k, v FROM {table}"), &[])
            .unwrap()
        {
            let (k, v): (Vec<u8>, Vec<u8>) = (row.get(0), row.get(1));
            sql.execute(
                &format!("INSERT INTO {table} (k, v) VALUES ($1, $2)"),
                &[&k, &v],
            )
            .unwrap();
        }
    }
    assert_eq!(column_names(&mut sql, "uwf_threads"), ["k", "v"]);

    // A record that does not decode: the migration stops, names it, and
    // nothing of it stays.
    let bad = ThreadId::generate();
    sql.execute(
        "INSERT INTO uwf_threads (k, v) VALUES ($1, '\\x01'::bytea || $2)",
        &[&&bad.to_bytes()[..], &vec![0u8; 40]],
    )
    .unwrap();
    let err = Store::open_location(&url, reader_options()).unwrap_err();
    assert!(
        matches!(&err, OpenError::Backend(BackendError::UndecodableRecord { thread, table: "uwf_threads", .. }) if *thread == bad.to_string()),
        "{err}"
    );
    assert!(err.to_string().contains(&bad.to_string()), "{err}");
    assert_eq!(schema_version(&mut sql), 1);
    assert_eq!(column_names(&mut sql, "uwf_threads"), ["k", "v"]);
    sql.execute(
        "DELETE FROM uwf_threads WHERE k = $1",
        &[&&bad.to_bytes()[..]],
    )
    .unwrap();

    // Two openers at once (a reader and a writer): both open, one migrates.
    let openers: Vec<_> = [reader_options(), StoreOptions::default()]
        .into_iter()
        .map(|options| {
            let url = url.clone();
            std::thread::spawn(move || Store::open_location(&url, options))
        })
        .collect();
    let mut stores: Vec<Store> = openers
        .into_iter()
        .map(|o| o.join().unwrap().unwrap())
        .collect();
    let store = stores.pop().unwrap();
    // Version 1 → 2 → 3 in one go: the typed columns, then the (empty)
    // label index.
    assert_eq!(schema_version(&mut sql), 3);
    assert_eq!(column_names(&mut sql, "uwf_labels"), ["k", "v"]);
    assert_eq!(
        column_names(&mut sql, "uwf_history"),
        [
            "k",
            "v",
            "id",
            "status",
            "workflow",
            "created_at",
            "updated_at",
            "completed_at",
            "head",
            "seq",
            "parent_thread",
            "last_error"
        ]
    );
    // The required columns are NOT NULL, as in a store created at 2.
    let nullable: Vec<String> = sql
        .query(
            "SELECT column_name::text FROM information_schema.columns \
             WHERE table_name = 'uwf_threads' AND is_nullable = 'YES' ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(nullable, ["last_error", "parent_thread"]);
    let indexes: Vec<String> = sql
        .query(
            "SELECT indexname::text FROM pg_indexes WHERE tablename IN ('uwf_threads', 'uwf_history') \
             ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        indexes,
        [
            "uwf_history_completed",
            "uwf_history_id",
            "uwf_history_pkey",
            "uwf_history_status",
            "uwf_history_workflow",
            "uwf_threads_pkey",
            "uwf_threads_status",
            "uwf_threads_updated",
            "uwf_threads_workflow"
        ]
    );

    // Backfilled from the bytes: every thread, in its table.
    for &id in &ids {
        assert_columns_match(&store, &mut sql, id);
    }
    let bulk: i64 = sql
        .query_one(
            "SELECT count(*) FROM uwf_threads WHERE workflow = 'bulk' AND status = 'idle'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(bulk, 300);
    assert_listing_matches_view(&store, &mut sql);
    let workflows: Vec<(String, String)> = sql
        .query(
            "SELECT name, hash FROM uwf_workflow_list ORDER BY name",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let registered: Vec<(String, String)> = store
        .workflows()
        .list()
        .unwrap()
        .into_iter()
        .map(|(name, hash)| (name, hash.to_string()))
        .collect();
    assert_eq!(registered.len(), 1);
    assert_eq!(workflows, registered);

    // And it works on: a step through the migrated store.
    let active = ids[0];
    let head = store.threads().get(active).unwrap().unwrap().head;
    store
        .threads()
        .low_level()
        .append_step(active, head, step("dev", "ok", "after"), next("rev"))
        .unwrap();
    assert_columns_match(&store, &mut sql, active);
    assert!(uwf_db::verify::verify(&store, |_| {}).unwrap().is_ok());
    drop(stores);
}

/// A store whose schema is newer than this build's is refused with a
/// message that says so, by readers and writers alike, and left alone.
#[test]
fn a_newer_schema_is_refused() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let mut store = TestBackend::Postgres.fast();
    let mut sql = connect(&store);
    store.close();
    sql.batch_execute("UPDATE uwf_schema SET version = 4")
        .unwrap();
    let url = store.store_arg().into_string().unwrap();
    for options in [reader_options(), StoreOptions::default()] {
        let err = Store::open_location(&url, options).unwrap_err();
        assert!(
            matches!(
                err,
                OpenError::Backend(BackendError::UnsupportedSchema {
                    found: 4,
                    supported: 3,
                    ..
                })
            ),
            "{err}"
        );
        let message = err.to_string();
        assert!(
            message.contains("schema version 4") && message.contains("newer uwf-db"),
            "{message}"
        );
    }
    assert_eq!(schema_version(&mut sql), 4);
}

/// The plan of `query`, one line per node.
fn plan(sql: &mut postgres::Client, query: &str) -> String {
    let lines: Vec<String> = sql
        .query(&format!("EXPLAIN {query}"), &[])
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect();
    lines.join("\n")
}

/// The SQL listings `docs/design.md` §4b names, over 20,000 active and
/// 20,000 ended threads: each is served by one of the indexes of schema
/// version 2, never by a sequential scan.
#[test]
fn sql_listings_by_status_workflow_and_time_use_the_indexes() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let store = TestBackend::Postgres.fast();
    let mut sql = connect(&store);
    // Rows as the backend writes them (the values are not records: the
    // store does not read them in this test), with a plausible spread: 1%
    // suspended, 5% running, 0.5% failed, 50 workflows (and a rare one), ended threads over
    // four weeks. Active rows are rewritten by every step, so their order
    // on disk has nothing to do with `updated_at` (a permutation here);
    // ended rows are written once, in completion order.
    sql.batch_execute(
        "INSERT INTO uwf_threads (k, v, id, status, workflow, created_at, updated_at, head, seq) \
         SELECT decode(lpad(to_hex(i), 32, '0'), 'hex'), '\\x00'::bytea, lpad(i::text, 26, '0'), \
                CASE WHEN i % 100 = 0 THEN 'suspended' WHEN i % 20 = 1 THEN 'running' \
                     ELSE 'idle' END, 'w' || (i % 50), \
                timestamptz '2025-01-01' + i * interval '1 minute', \
                timestamptz '2025-01-01' + (i * 7919 % 20000) * interval '1 minute', \
                repeat('0', 64), i \
         FROM generate_series(1, 20000) AS i; \
         INSERT INTO uwf_history (k, v, id, status, workflow, created_at, updated_at, completed_at, \
                                  head, seq) \
         SELECT int4send(20089 + i / 720) || decode(lpad(to_hex(i), 32, '0'), 'hex'), '\\x00'::bytea, \
                lpad(i::text, 26, '0'), \
                CASE WHEN i % 200 = 0 THEN 'failed' WHEN i % 50 = 1 THEN 'cancelled' \
                     ELSE 'completed' END, \
                CASE WHEN i % 200 = 7 THEN 'nightly' ELSE 'w' || (i % 50) END, \
                timestamptz '2025-01-01' + i * interval '2 minutes', \
                timestamptz '2025-01-01' + i * interval '2 minutes', \
                timestamptz '2025-01-01' + i * interval '2 minutes', repeat('0', 64), i \
         FROM generate_series(1, 20000) AS i; \
         ANALYZE uwf_threads; ANALYZE uwf_history;",
    )
    .unwrap();
    // (query, the index its page must walk, newest first)
    let pages = [
        (
            "SELECT id, status, workflow, updated_at FROM uwf_threads \
             ORDER BY updated_at DESC LIMIT 50",
            "Index Scan Backward using uwf_threads_updated",
        ),
        (
            "SELECT id, workflow, updated_at FROM uwf_threads WHERE status = 'suspended' \
             ORDER BY updated_at DESC LIMIT 50",
            "Index Scan Backward using uwf_threads_status",
        ),
        (
            "SELECT id, status, updated_at FROM uwf_threads WHERE workflow = 'w3' \
             ORDER BY updated_at DESC LIMIT 50",
            "Index Scan Backward using uwf_threads_workflow",
        ),
        (
            "SELECT id, workflow, completed_at, last_error FROM uwf_history \
             WHERE status = 'failed' ORDER BY completed_at DESC LIMIT 50",
            "Index Scan Backward using uwf_history_status",
        ),
        (
            "SELECT id, status, completed_at FROM uwf_history WHERE workflow = 'nightly' \
             ORDER BY completed_at DESC LIMIT 50",
            "Index Scan Backward using uwf_history_workflow",
        ),
        (
            "SELECT id, status, workflow FROM uwf_history \
             ORDER BY completed_at DESC LIMIT 50",
            "Index Scan Backward using uwf_history_completed",
        ),
    ];
    for (query, index) in pages {
        let plan = plan(&mut sql, query);
        assert!(plan.contains(index), "{query}\n{plan}");
        // The page comes off the index in order: nothing is sorted.
        assert!(!plan.contains("Sort"), "{query}\n{plan}");
        assert!(!plan.contains("Seq Scan"), "{query}\n{plan}");
    }
    // Queries whose index the planner picks among ours: any, but an index
    // (the view's pages merge the two tables' index scans in order).
    let others = [
        // A workflow's failures on one day.
        "SELECT id, completed_at, last_error FROM uwf_history WHERE workflow = 'w3' \
         AND status = 'failed' AND completed_at >= '2025-01-20' AND completed_at < '2025-01-21'",
        // Everything that ended in an hour.
        "SELECT id, status FROM uwf_history \
         WHERE completed_at >= '2025-01-20 10:00' AND completed_at < '2025-01-20 11:00'",
        // An ended thread by id.
        "SELECT * FROM uwf_history WHERE id = '00000000000000000000012345'",
        // The view: a page of every thread, and of one status.
        "SELECT id, status, last_activity FROM uwf_thread_list \
         ORDER BY last_activity DESC LIMIT 50",
        "SELECT id, status, last_activity FROM uwf_thread_list WHERE status = 'failed' \
         ORDER BY last_activity DESC LIMIT 50",
        "SELECT id, last_activity FROM uwf_thread_list WHERE workflow = 'w3' \
         ORDER BY last_activity DESC LIMIT 50",
    ];
    for query in others {
        let plan = plan(&mut sql, query);
        assert!(
            plan.contains("Index Scan using uwf_")
                || plan.contains("Index Scan Backward using uwf_"),
            "{query}\n{plan}"
        );
        assert!(!plan.contains("Seq Scan"), "{query}\n{plan}");
    }
}

/// A role that may only read (`SELECT`) opens a current store and lists
/// its threads: opening a version 2 store takes no lock and runs no DDL.
/// The same role cannot migrate a version 1 store, and the error says
/// that the migration is what failed and why.
#[test]
fn a_read_only_role_reads_a_current_store_but_cannot_migrate_an_old_one() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let mut store = TestBackend::Postgres.fast();
    let id = new_thread(&store, "review").id;
    let mut sql = connect(&store);
    let (_role, reader_url) = reading_role(&store, &mut sql, "reader", "");

    let reader = Store::open_location(&reader_url, reader_options()).unwrap();
    assert_eq!(reader.threads().get(id).unwrap().unwrap().id, id);
    drop(reader);

    // Back to version 1 (the view depends on the columns).
    store.close();
    sql.batch_execute(
        "DROP VIEW uwf_thread_list; \
         ALTER TABLE uwf_threads DROP COLUMN id, DROP COLUMN status, DROP COLUMN workflow, \
           DROP COLUMN created_at, DROP COLUMN updated_at, DROP COLUMN head, DROP COLUMN seq, \
           DROP COLUMN parent_thread, DROP COLUMN last_error; \
         ALTER TABLE uwf_history DROP COLUMN id, DROP COLUMN status, DROP COLUMN workflow, \
           DROP COLUMN created_at, DROP COLUMN updated_at, DROP COLUMN completed_at, \
           DROP COLUMN head, DROP COLUMN seq, DROP COLUMN parent_thread, DROP COLUMN last_error; \
         UPDATE uwf_schema SET version = 1",
    )
    .unwrap();
    assert_eq!(column_names(&mut sql, "uwf_history"), ["k", "v"]);
    let err = Store::open_location(&reader_url, reader_options()).unwrap_err();
    let mut chain = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        chain.push_str(&format!("\ncaused by: {s}"));
        source = s.source();
    }
    assert!(
        chain.contains("migrating the schema from version 1 to 2")
            && chain.contains("must be owner of table uwf_threads"),
        "{chain}"
    );
    assert_eq!(schema_version(&mut sql), 1);
    // The owner migrates it.
    store.reopen();
    assert_eq!(schema_version(&mut sql), 3);
    assert_columns_match(&store, &mut sql, id);
}

/// A server that refuses a connection for having too many (here a role
/// allowed 2) makes the caller wait and retry, not fail (issue 22): a read
/// that needs a third connection while two are held succeeds once one is
/// given back.
#[test]
fn a_refused_connection_is_waited_for_not_failed() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let store = TestBackend::Postgres.fast();
    let id = new_thread(&store, "review").id;
    let mut sql = connect(&store);
    let (_role, few_url) = reading_role(&store, &mut sql, "few", "CONNECTION LIMIT 2");
    let few = Store::open_location(&few_url, reader_options()).unwrap();
    // Two readers hold the role's two connections for a second.
    let held = std::sync::Arc::new(std::sync::Barrier::new(3));
    let holders: Vec<_> = (0..2)
        .map(|_| {
            let (few, held) = (few.clone(), held.clone());
            std::thread::spawn(move || {
                few.read(|r| {
                    r.get_blob(&uwf_db::Hash::of(b"nothing"))?;
                    held.wait();
                    std::thread::sleep(std::time::Duration::from_secs(1));
                    Ok::<_, uwf_db::StoreError>(())
                })
                .unwrap();
            })
        })
        .collect();
    held.wait();
    let started = std::time::Instant::now();
    let record = few.threads().get(id).unwrap().unwrap();
    assert_eq!(record.id, id);
    let waited = started.elapsed();
    for h in holders {
        h.join().unwrap();
    }
    let backend = few
        .backend()
        .as_any()
        .downcast_ref::<uwf_db::backend::postgres::PostgresBackend>()
        .expect("a PostgreSQL store");
    assert!(backend.connect_waits() > 0, "it was never refused");
    assert!(
        waited >= std::time::Duration::from_millis(300),
        "answered in {waited:?} while both connections were held"
    );
}

/// A login role of this test only (roles are global to the server: named
/// after the test's database plus `suffix`, with `options` such as a
/// connection limit) that may read every table; its URL, and the guard
/// that drops it at the end.
fn reading_role(
    store: &common::backend::TestStore,
    sql: &mut postgres::Client,
    suffix: &str,
    options: &str,
) -> (DropRole, String) {
    let url = store.store_arg().into_string().unwrap();
    let database: String = sql
        .query_one("SELECT current_database()::text", &[])
        .unwrap()
        .get(0);
    let role = format!("{database}_{suffix}");
    sql.batch_execute(&format!(
        "CREATE ROLE {role} LOGIN {options}; GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role};"
    ))
    .unwrap();
    let role_url = url.replacen("root@", &format!("{role}@"), 1);
    assert_ne!(role_url, url, "the test URL names no user to replace");
    (DropRole { url, role }, role_url)
}

/// Drops a test's role (with its grants in the test's database), also
/// when the test fails.
struct DropRole {
    url: String,
    role: String,
}

impl Drop for DropRole {
    fn drop(&mut self) {
        if let Ok(mut sql) = postgres::Client::connect(&self.url, postgres::NoTls) {
            let _ = sql.batch_execute(&format!(
                "REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}; DROP ROLE {role};",
                role = self.role
            ));
        }
    }
}

/// The SQL examples of the README and of `docs/design.md` run on a store
/// with threads in it, and return rows where the store has some.
#[test]
fn the_documented_sql_examples_run() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let store = TestBackend::Postgres.fast();
    let mut sql = connect(&store);
    drive_some_threads(&store);
    let mut ran = 0;
    for doc in [
        include_str!("../README.md"),
        include_str!("../docs/design.md"),
    ] {
        for block in doc.split("```sql\n").skip(1) {
            let block = block.split("```").next().unwrap();
            for statement in block.split(';').filter(|s| !s.trim().is_empty()) {
                sql.query(statement, &[])
                    .unwrap_or_else(|e| panic!("{statement}\n{e:?}"));
                ran += 1;
            }
        }
    }
    assert!(ran >= 8, "only {ran} statements found");
    // The counting example sees every thread.
    let total: i64 = sql
        .query_one("SELECT count(*) FROM uwf_thread_list", &[])
        .unwrap()
        .get(0);
    assert_eq!(total, 4);
}

// ---------------------------------------------------------------------
// Round trips (`docs/design.md` §4b, "Round trips").

/// The round trips the store's transactions have made so far.
fn round_trips(store: &Store) -> u64 {
    store
        .backend()
        .as_any()
        .downcast_ref::<uwf_db::backend::postgres::PostgresBackend>()
        .expect("a PostgreSQL store")
        .round_trips()
}

/// An `append_step` is three round trips, whatever it writes: `BEGIN` with
/// the writer lock, the GC epoch, the thread's record and its head node;
/// the start node; the writes with `COMMIT` (the engine's own step names
/// the start node too, and costs two). Ending a thread (which moves its
/// record to history) is no more.
#[test]
fn an_append_step_costs_three_round_trips() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let store = TestBackend::Postgres.fast();
    let t = new_thread(&store, "rt");
    let mut head = t.head;
    for i in 0..5 {
        let before = round_trips(&store);
        let w = store
            .threads()
            .low_level()
            .append_step(
                t.id,
                head,
                step("dev", "again", &format!("step {i}")),
                next("dev"),
            )
            .unwrap();
        // The first step's head is the start node: fetched with `BEGIN`.
        let expected = if i == 0 { 2 } else { 3 };
        assert_eq!(round_trips(&store) - before, expected, "step {i}");
        head = w.record.head;
    }
    // The same reply again: its blobs are stored already (the refresh of
    // their `touched_at` goes with the commit too).
    let before = round_trips(&store);
    let w = store
        .threads()
        .low_level()
        .append_step(t.id, head, step("dev", "again", "step 4"), next("dev"))
        .unwrap();
    assert_eq!(round_trips(&store) - before, 3);
    // A read of an active thread: one statement, no `BEGIN` or
    // `ROLLBACK` (a single statement sees one snapshot).
    let before = round_trips(&store);
    assert_eq!(
        store.threads().get(t.id).unwrap().unwrap().head,
        w.record.head
    );
    assert_eq!(round_trips(&store) - before, 1);
    let before = round_trips(&store);
    store
        .threads()
        .low_level()
        .end_thread(t.id, w.record.head, end(0))
        .unwrap();
    assert_eq!(round_trips(&store) - before, 3);
    // Of an ended one: the one statement finds only its day, so the read
    // runs again in a transaction: its day comes with `BEGIN`, then its
    // history entry, then `ROLLBACK`.
    let before = round_trips(&store);
    let ended = store.threads().get(t.id).unwrap().unwrap();
    assert_eq!(round_trips(&store) - before, 4);
    assert_eq!(ended.status, ThreadStatus::Completed);
    assert_eq!(ended.seq, 7);
}

/// Adds `examples/review.yaml` to `store`: its hash, and the path of its
/// scenario for the scripted agent.
fn add_review(store: &Store) -> (uwf_db::Hash, std::path::PathBuf) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let yaml = std::fs::read_to_string(root.join("examples/review.yaml")).unwrap();
    let wf = parse_workflow(&yaml, Some("review"), &|_| false).unwrap();
    let review = store.workflows().add(&wf).unwrap().0;
    (review, root.join("examples/review.scenario.yaml"))
}

/// A driver steps on from the record its own commit wrote (`docs/design.md`
/// §8f "A driver steps on from its own commit"): driving the four steps of
/// a review thread costs the round trips of its writes and no read of its
/// record before each step (which cost one each, four in all); and the
/// record it ends with is the one stored.
#[test]
fn a_driven_thread_is_not_read_back_between_its_steps() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let store = TestBackend::Postgres.fast();
    let (review, scenario) = add_review(&store);
    let mut spent = Vec::new();
    for task in ["a task", "another task"] {
        let mut agent = ScriptAgent::load(&scenario).unwrap();
        let before = round_trips(&store);
        let (thread, report) = store
            .engine()
            .run_workflow(review, task, &StartOptions::default(), &mut agent)
            .unwrap();
        spent.push(round_trips(&store) - before);
        assert!(report.error.is_none(), "{:?}", report.error);
        assert_eq!(report.results.len(), 4);
        let stored = store.threads().get(thread.id).unwrap().unwrap();
        assert_eq!(stored.status, ThreadStatus::Completed);
        let last = report.results.last().unwrap();
        assert_eq!((last.head, last.status), (stored.head, stored.status));
    }
    // The second thread finds the workflow and the scenario's texts
    // known: its start and each of its steps are two round trips (`BEGIN`
    // with the reads named ahead — the record and the head node; the
    // writes with `COMMIT`), and its last step writes the end node with it.
    assert_eq!(spent[1], 2 + 4 * 2, "{spent:?}");
}

/// A page of a thread's steps is read with its prompts and replies in one
/// round trip, however long the page: `thread log`, the HTTP API's log
/// page and a diff read them together, where one entry at a time cost two
/// round trips each (its input node, then its reply).
#[test]
fn a_page_of_steps_reads_its_texts_in_one_round_trip() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let store = TestBackend::Postgres.fast();
    let (review, scenario) = add_review(&store);
    let mut agent = ScriptAgent::load(&scenario).unwrap();
    let (thread, report) = store
        .engine()
        .run_workflow(review, "a task", &StartOptions::default(), &mut agent)
        .unwrap();
    assert!(report.error.is_none(), "{:?}", report.error);
    let log = store.threads().log(thread.id, 50, None).unwrap();
    assert_eq!(log.len(), 5, "four steps and the end");
    let before = round_trips(&store);
    let entries = uwf_db::api::LogEntry::read_all(&store, &log, Default::default()).unwrap();
    assert_eq!(round_trips(&store) - before, 1);
    // Each entry has its own step's texts, in the page's order.
    assert_eq!(entries.len(), log.len());
    for (entry, step) in entries.iter().zip(&log) {
        assert_eq!((entry.hash, entry.seq), (step.hash, step.node.seq));
        let text = |hash| match store.get(hash).unwrap() {
            Some(Blob::Content(c)) => c.text,
            other => panic!("{hash} is not content: {other:?}"),
        };
        assert_eq!(entry.content, text(&step.node.content));
        assert_eq!(entry.input, text(&step.node.input));
    }
    assert_eq!(entries.last().unwrap().role, "developer");
    // The text log's read of the replies alone (`Store::get_many`): one
    // round trip too, not a transaction's `BEGIN` and `ROLLBACK`; a
    // repeated hash and a missing one are answered in place.
    let mut replies: Vec<uwf_db::Hash> = log.iter().map(|s| s.node.content).collect();
    replies.push(log[0].node.content);
    replies.push(uwf_db::Hash::of(b"never stored"));
    let before = round_trips(&store);
    let blobs = store.get_many(&replies).unwrap();
    assert_eq!(round_trips(&store) - before, 1);
    assert_eq!(blobs.len(), replies.len());
    assert!(blobs.last().unwrap().is_none());
    for (hash, blob) in replies.iter().zip(&blobs).take(replies.len() - 1) {
        match (blob, store.get(hash).unwrap()) {
            (Some(Blob::Content(got)), Some(Blob::Content(stored))) => {
                assert_eq!(got.text, stored.text, "{hash}")
            }
            other => panic!("{hash}: {other:?}"),
        }
    }
}

/// A thread's last step and its end node, written in one transaction
/// (`Next::End`), cost the round trips of a step: the end node's position
/// comes from the step node this transaction wrote, not from reading it
/// back, which sent the held writes and then the read (five round trips).
#[test]
fn a_last_step_with_its_end_costs_the_round_trips_of_a_step() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let store = TestBackend::Postgres.fast();
    let t = new_thread(&store, "last");
    let low = store.threads().low_level();
    let first = low
        .append_step(t.id, t.head, step("dev", "again", "one"), next("dev"))
        .unwrap();
    let before = round_trips(&store);
    let w = low
        .append_step(
            t.id,
            first.record.head,
            step("dev", "done", "two"),
            Next::End(end(0)),
        )
        .unwrap();
    assert_eq!(round_trips(&store) - before, 3);
    // Both nodes are stored, the end node after the step.
    let ended = store.threads().get(t.id).unwrap().unwrap();
    assert_eq!(ended.status, ThreadStatus::Completed);
    assert_eq!(ended.seq, 3);
    let step_node = w.step.expect("the step's node");
    assert_eq!(w.end, Some(ended.head));
    assert_ne!(ended.head, step_node);
    let Some(Blob::State(end_node)) = store.get(&ended.head).unwrap() else {
        panic!("the head is not a state node");
    };
    assert_eq!(end_node.seq, 3);
    assert_eq!(end_node.ancestors.first(), Some(&step_node));
    let Some(Blob::State(step_blob)) = store.get(&step_node).unwrap() else {
        panic!("the step's node is not a state node");
    };
    assert_eq!(end_node.ancestors.get(1), step_blob.ancestors.first());
}

/// `ReadTxn::get_blobs` (a fan-out's join reads every child's end node and
/// its content with it): twenty blobs cost the round trips of one, in
/// their order, an absent one `None`; and the ref checks of a blob naming
/// many are one read.
#[test]
fn many_blobs_read_or_named_cost_the_round_trips_of_one() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let store = TestBackend::Postgres.fast();
    let blobs: Vec<Blob> = (0..20)
        .map(|i| Blob::content(format!("blob {i}"), []))
        .collect();
    let mut hashes: Vec<_> = blobs.iter().map(|b| store.put(b).unwrap()).collect();
    let absent = Blob::content("never stored", []).encode().unwrap().hash();
    hashes.insert(7, absent);
    // None: nothing is sent, not even a `BEGIN`.
    let before = round_trips(&store);
    assert_eq!(store.read(|r| r.get_blobs(&[])).unwrap(), vec![]);
    assert_eq!(round_trips(&store) - before, 0);
    let before = round_trips(&store);
    let one = store.read(|r| r.get_blobs(&hashes[..1])).unwrap();
    let spent_one = round_trips(&store) - before;
    assert_eq!(one, vec![Some(blobs[0].clone())]);
    let before = round_trips(&store);
    let all = store.read(|r| r.get_blobs(&hashes)).unwrap();
    assert_eq!(round_trips(&store) - before, spent_one);
    let mut expected: Vec<Option<Blob>> = blobs.into_iter().map(Some).collect();
    expected.insert(7, None);
    assert_eq!(all, expected);
    // A blob naming twenty stored blobs (a join's content names every
    // child's end node) checks them in one read: its put costs the round
    // trips of a put naming two.
    hashes.remove(7);
    let before = round_trips(&store);
    store
        .put(&Blob::content("names two", hashes[..2].to_vec()))
        .unwrap();
    let spent_two = round_trips(&store) - before;
    let before = round_trips(&store);
    store
        .put(&Blob::content("names twenty", hashes.clone()))
        .unwrap();
    assert_eq!(round_trips(&store) - before, spent_two);
}

/// The PostgreSQL backend of a store.
fn postgres_backend(store: &Store) -> &uwf_db::backend::postgres::PostgresBackend {
    store
        .backend()
        .as_any()
        .downcast_ref::<uwf_db::backend::postgres::PostgresBackend>()
        .expect("a PostgreSQL store")
}

/// A store on `url` with one connection for transactions, so every
/// statement runs on one session.
fn one_connection(url: &str) -> Store {
    let options = StoreOptions {
        durability: uwf_db::Durability::None,
        pg_connections: 1,
        ..StoreOptions::default()
    };
    Store::open_location(url, options).unwrap()
}

/// [`one_connection`] on `location`, whose statements wait at most 200 ms
/// for a lock (`lock_timeout`).
fn one_connection_waiting_200ms(location: &common::backend::Location) -> Store {
    one_connection(&format!(
        "{}?options=-c%20lock_timeout%3D200",
        location.arg_str()
    ))
}

/// The hot statements are prepared once per connection and run with
/// generic plans (`docs/design.md` §8f, "Prepared statements"). A server
/// that does not keep them as the process knows them — a pooler in
/// transaction mode hands each transaction whichever server connection is
/// free, where a statement is missing (SQLSTATE 26000) or there already
/// (42P05) — turns them off: the read or write in flight runs again with
/// its statements in full, nothing lost and nothing applied twice.
#[test]
fn prepared_statements_are_kept_and_turned_off_when_the_server_loses_them() {
    use uwf_db::backend::postgres::LoseTrack;
    if !TestBackend::Postgres.available() {
        return;
    }
    // The server forgets them all, or the process does (the first query
    // of the next write fails and runs again at once, in full), or the
    // server forgets only those that write (the first query works; the
    // commit fails, and the store runs the whole write again).
    for lose in [
        LoseTrack::Server,
        LoseTrack::Process,
        LoseTrack::ServerWrites,
    ] {
        let location = TestBackend::Postgres.location();
        let store = one_connection(&location.arg_str());
        let pg = postgres_backend(&store);
        let t = new_thread(&store, "prepared");
        let rec = append_n(&store, t.id, 3);
        assert_eq!(store.threads().get(t.id).unwrap().unwrap().seq, rec.seq);
        let start = round_trips(&store);
        store.put(&uwf_db::Blob::content("before", [])).unwrap();
        let put = round_trips(&store) - start;
        assert!(pg.prepares());
        let [statements, generic, custom] = pg.prepared_for_tests(None).unwrap();
        assert!(statements >= 4, "{statements} statements prepared");
        assert!(generic >= statements, "{generic} generic plans");
        assert_eq!(custom, 0, "a custom plan was made");

        let round_trips_before = round_trips(&store);
        pg.prepared_for_tests(Some(lose)).unwrap();
        let blob = uwf_db::Blob::content("after", []);
        let hash = store.put(&blob).unwrap();
        // The lost statements cost the failed query and a `ROLLBACK`, then
        // the put's queries in full: after a failed first query the rest
        // of the put; after a failed commit the whole put again.
        let spent = round_trips(&store) - round_trips_before;
        let expected = match lose {
            LoseTrack::ServerWrites => put + 1 + put,
            _ => 1 + 1 + put,
        };
        assert_eq!(spent, expected, "{lose:?}: a put is {put} round trips");
        assert!(!pg.prepares(), "still preparing ({lose:?})");
        assert_eq!(store.get(&hash).unwrap(), Some(blob));
        // Statements in full from now on: steps and reads work, each
        // step applied once.
        let after = append_n(&store, t.id, 2);
        assert_eq!(after.seq, rec.seq + 2);
        assert_eq!(store.threads().get(t.id).unwrap().unwrap().head, after.head);
        assert_eq!(pg.prepared_for_tests(None).unwrap()[2], 0);
    }
    // A read whose one statement was prepared: retried in full at once.
    let location = TestBackend::Postgres.location();
    let store = one_connection(&location.arg_str());
    let pg = postgres_backend(&store);
    let t = new_thread(&store, "read");
    let rec = append_n(&store, t.id, 2);
    assert_eq!(store.threads().get(t.id).unwrap().unwrap().head, rec.head);
    pg.prepared_for_tests(Some(LoseTrack::Server)).unwrap();
    assert_eq!(store.threads().get(t.id).unwrap().unwrap().head, rec.head);
    assert!(!pg.prepares());
}

/// A transaction whose first query fails after its `BEGIN` (here a lock
/// not granted within `lock_timeout`: a collection holds the store
/// barrier) leaves the server's transaction open and aborted; it is
/// rolled back before the connection is used again, so the next write on
/// that connection works (it failed with 25P02, "current transaction is
/// aborted", before).
#[test]
fn a_failed_first_query_leaves_no_aborted_transaction_behind() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let location = TestBackend::Postgres.location();
    let store = one_connection_waiting_200ms(&location);
    store.put(&uwf_db::Blob::content("first", [])).unwrap();
    let mut holder = connect_url(&location.arg_str());
    holder
        .execute(
            "SELECT pg_advisory_lock($1)",
            &[&uwf_db::backend::postgres::WRITER_LOCK],
        )
        .unwrap();
    let err = store
        .put(&uwf_db::Blob::content("held back", []))
        .unwrap_err();
    assert!(err.to_string().contains("lock timeout"), "{err}");
    holder
        .execute(
            "SELECT pg_advisory_unlock($1)",
            &[&uwf_db::backend::postgres::WRITER_LOCK],
        )
        .unwrap();
    let blob = uwf_db::Blob::content("after", []);
    let hash = store.put(&blob).unwrap();
    assert_eq!(store.get(&hash).unwrap(), Some(blob));
}

/// A transaction committed after one of its statements failed (an error
/// its caller did not pass on) is refused: the server aborted it at that
/// statement, so a `COMMIT` would be answered with a rollback and what the
/// transaction wrote before is gone. Before, the commit said it worked.
/// Its connection is rolled back and serves the next transaction.
#[test]
fn a_commit_after_a_failed_statement_is_refused_not_reported_done() {
    use uwf_db::backend::{BackendError, Table};
    if !TestBackend::Postgres.available() {
        return;
    }
    let location = TestBackend::Postgres.location();
    let store = one_connection_waiting_200ms(&location);
    let backend = store.backend();
    let (mine, theirs) = ([1u8; 32], [2u8; 32]);
    let mut w = backend.begin_write().unwrap();
    assert!(w.insert(Table::Pins, &theirs, b"").unwrap());
    w.commit().unwrap();
    // Another session locks the row; a delete of it waits, then times out.
    let mut other = connect_url(&location.arg_str());
    let mut held = other.transaction().unwrap();
    held.execute(
        "SELECT 1 FROM uwf_pins WHERE k = $1 FOR UPDATE",
        &[&&theirs[..]],
    )
    .unwrap();
    let mut w = backend.begin_write().unwrap();
    assert!(w.insert(Table::Pins, &mine, b"").unwrap());
    let err = w.delete(Table::Pins, &theirs).unwrap_err();
    assert!(err.to_string().contains("lock timeout"), "{err}");
    // The caller carries on regardless.
    let err = w.commit().unwrap_err();
    assert!(matches!(err, BackendError::Aborted { .. }), "{err:?}");
    assert!(
        err.to_string().contains("nothing of it was applied"),
        "{err}"
    );
    held.rollback().unwrap();
    let r = backend.begin_read().unwrap();
    assert_eq!(r.get(Table::Pins, &mine).unwrap(), None);
    assert!(r.get(Table::Pins, &theirs).unwrap().is_some());
    drop(r);
    let mut w = backend.begin_write().unwrap();
    assert!(w.insert(Table::Pins, &mine, b"").unwrap());
    w.commit().unwrap();
}

/// A page of history or of `thread list` costs a handful of round trips,
/// not one per step or thread shown: the nodes of an ancestor list, and
/// the records of a page, are each one `get_many`.
#[test]
fn a_page_of_steps_or_threads_costs_a_few_round_trips() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let writer = TestBackend::Postgres.fast();
    let long = new_thread(&writer, "long");
    append_n(&writer, long.id, 60);
    // A handle that has not seen the nodes (another runner, a new process).
    let store = writer.open_again();
    let newest_50 = |store: &Store| {
        let before = round_trips(store);
        let seen = store
            .threads()
            .visit_log(long.id, 50, None, |_, _| {
                Ok::<_, uwf_db::thread::ThreadError>(())
            })
            .unwrap();
        assert_eq!(seen, 50);
        round_trips(store) - before
    };
    // `BEGIN` with the record; the head; 49 more nodes from ancestor
    // lists of up to 11 (5 reads); `ROLLBACK`.
    assert_eq!(newest_50(&store), 8);
    // The handle that wrote them, and this one once it has read them,
    // keep the nodes (`docs/design.md` §8f, recent nodes): `BEGIN` with
    // the record, `ROLLBACK`.
    assert_eq!(newest_50(&writer), 2);
    assert_eq!(newest_50(&store), 2);

    // 60 threads, half of them ended (in history).
    for i in 0..60 {
        let t = new_thread(&store, "many");
        if i % 2 == 0 {
            store
                .threads()
                .low_level()
                .end_thread(t.id, t.head, end(0))
                .unwrap();
        }
    }
    let q = ThreadQuery {
        limit: 50,
        ..ThreadQuery::default()
    };
    let before = round_trips(&store);
    let page = store.threads().list(&q).unwrap();
    assert_eq!(page.len(), 50);
    assert!(page.iter().any(|t| t.status == ThreadStatus::Completed));
    // `BEGIN`; the activity range; the records in `threads`, the days in
    // `history_ids` and the records in `history` of the ended ones;
    // `ROLLBACK`.
    assert_eq!(round_trips(&store) - before, 6);
}

/// A write whose server connection is cut before it commits (an
/// administrator terminating the store's connections while the
/// transaction runs) applied nothing, and is run again on a new
/// connection instead of failing: its next statement finds the connection
/// gone, and `Store::write` starts over.
#[test]
fn a_write_whose_connection_is_cut_before_its_commit_runs_again() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let store = TestBackend::Postgres.fast();
    let url = store.store_arg().into_string().unwrap();
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let database: String = admin
        .query_one("SELECT current_database()", &[])
        .unwrap()
        .get(0);
    let mut runs = 0;
    let hash = store
        .write(|w| {
            runs += 1;
            if runs == 1 {
                admin
                    .execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                         WHERE datname = $1 AND pid <> pg_backend_pid()",
                        &[&database],
                    )
                    .unwrap();
            }
            // A statement after the cut: the first run fails here.
            w.contains(&uwf_db::Hash::of(b"not stored"))?;
            w.put_blob(&uwf_db::Blob::content("kept", []))
        })
        .unwrap();
    assert_eq!(runs, 2, "run once more after the cut");
    assert!(store.read(|r| r.contains(&hash)).unwrap());
}

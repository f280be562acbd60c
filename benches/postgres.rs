//! Bench `postgres` (issue 9; SPEC §9–§10): the PostgreSQL backend, each
//! figure against a baseline measured in the same run, with the LMDB figure
//! beside it:
//! - durable `append_step`, one step per transaction, vs a raw `postgres`
//!   crate transaction writing the same rows (goal ≥ 0.5×); beside it LMDB
//!   vs a raw heed transaction writing the same rows. The rows are the
//!   writes the store makes, captured from an in-memory store doing the
//!   same steps. For context, the same writes sent raw as literal SQL with
//!   `COMMIT` in one simple query (the floor of how the store sends them);
//! - group commit from 1, 2, 4 and 8 `uwf-db batch` processes sharing one
//!   store: total steps/s, the scaling factor against one process, the
//!   best PostgreSQL fleet against one LMDB process, and the peak of the
//!   server connections the runners held (goals: 4 processes ≥ 2× one,
//!   the best fleet ≥ 3,500 steps/s and ≥ 0.5× one LMDB process); and
//!   what bounds it: how busy the machine was, its CPU and the runners'
//!   a step, and the steps/s its cores would allow at that cost;
//! - `connections`: 8 runners × 64 jobs on 2,000 threads: no thread
//!   failed, and the peak connection count (`pg_stat_activity`);
//! - the newest 50 steps of a 10,000-step thread and the first page of 50
//!   of `list_threads` at 100,000 threads, each against the same on a small
//!   thread or store (goal: O(page), a ratio near 1), and the newest 50
//!   against 50 raw `SELECT`s of the same keys;
//! - the operations each engine call makes at the storage boundary and
//!   the round trips they cost (the backend's own counter), and the
//!   server's settings.
//!
//! The server: `UWF_BENCH_POSTGRES`, else `UWF_TEST_POSTGRES`, else
//! `postgres://root@127.0.0.1:5432/postgres` (a URL whose user may
//! `CREATE DATABASE`). Every store is a database made for it
//! (`uwf_bench_…`), dropped afterwards. With no server reachable the bench
//! says so on stderr and measures nothing.
//!
//! Run: `cargo bench --bench postgres [-- SECTION…]` (sections: `append`,
//! `fleet`, `connections`, `log`, `list`; default all). `UWF_BENCH_SCALE=0.1` shrinks it.

mod common;

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Comparison, children_cpu, raw_env, report, scale, scratch_dir, time};
use heed::types::Bytes;
use postgres::types::{ToSql, Type};
use postgres::{Client, NoTls};
use uwf_db::backend::BackendError;
use uwf_db::backend::memory::MemoryBackend;
use uwf_db::backend::postgres::PostgresBackend;
use uwf_db::backend::{
    Backend, Direction, Entries, Entry, HeldLock, KeyRange, ReadTables, Refresh, StorageStats,
    Table, WriteTables,
};
use uwf_db::thread::{NewThread, Next, StepWrite, ThreadId, ThreadQuery, ThreadRecord};
use uwf_db::{Blob, Durability, Hash, Store, StoreOptions, Value, WorkflowNode};

const DEFAULT_POSTGRES: &str = "postgres://root@127.0.0.1:5432/postgres";

/// Rows the backend fetches per round trip of a range scan
/// (`backend/postgres`'s `PAGE`).
const PG_PAGE: u64 = 512;

fn admin_url() -> String {
    std::env::var("UWF_BENCH_POSTGRES")
        .or_else(|_| std::env::var("UWF_TEST_POSTGRES"))
        .unwrap_or_else(|_| DEFAULT_POSTGRES.to_owned())
}

// ---------------------------------------------------------------------------
// Databases

/// A database made for one store, dropped (with any session on it) when
/// this goes.
struct Db {
    admin: String,
    name: String,
    url: String,
}

impl Db {
    fn create(tag: &str) -> Db {
        let admin = admin_url();
        let name = format!(
            "uwf_bench_{tag}_{}",
            ThreadId::generate().to_string().to_lowercase()
        );
        let mut client = Client::connect(&admin, NoTls).unwrap();
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        let url = match admin.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{name}"),
            None => panic!("the PostgreSQL URL must end in /DATABASE: {admin}"),
        };
        Db { admin, name, url }
    }

    fn client(&self) -> Client {
        Client::connect(&self.url, NoTls).unwrap()
    }

    fn open(&self, durability: Durability) -> Store {
        Store::open_location(&self.url, options(durability)).unwrap()
    }

    /// A handle whose storage operations are counted.
    fn open_counted(&self) -> (Store, Arc<Mutex<Log>>) {
        let backend =
            Arc::new(PostgresBackend::connect(&self.url, Durability::None, true).unwrap());
        let (store, log) = counted(backend.clone(), false);
        log.lock().unwrap().pg = Some(backend);
        (store, log)
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Ok(mut client) = Client::connect(&self.admin, NoTls) {
            let _ = client.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

fn options(durability: Durability) -> StoreOptions {
    StoreOptions {
        durability,
        ..StoreOptions::default()
    }
}

/// Whether the server answers; if not, says so loudly.
fn reachable() -> bool {
    let url = admin_url();
    match Client::connect(&url, NoTls) {
        Ok(_) => true,
        Err(e) => {
            eprintln!(
                "\n!!! PostgreSQL NOT REACHABLE at {url} ({e}): the `postgres` bench did NOT run.\n\
                 !!! Start a server or point UWF_BENCH_POSTGRES (or UWF_TEST_POSTGRES) at one\n\
                 !!! (a URL whose user may CREATE DATABASE).\n"
            );
            false
        }
    }
}

/// Prints the server settings that bound these figures.
fn print_settings() {
    let mut client = Client::connect(&admin_url(), NoTls).unwrap();
    println!("\n## PostgreSQL settings\n");
    println!("| setting | value |");
    println!("|---|---|");
    for name in [
        "server_version",
        "synchronous_commit",
        "fsync",
        "wal_sync_method",
        "full_page_writes",
        "shared_buffers",
        "wal_buffers",
        "commit_delay",
        "max_wal_size",
        "checkpoint_timeout",
    ] {
        let row = client.query_one(&format!("SHOW {name}"), &[]).unwrap();
        let value: String = row.get(0);
        println!("| {name} | {value} |");
    }
    println!(
        "\nserver {} (same machine; connections over TCP on localhost); durability `sync` is \
         the server's `synchronous_commit`, `none` sets it off per session",
        admin_url()
    );
}

// ---------------------------------------------------------------------------
// Counting the storage operations (and capturing the writes)

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    /// A point read (captured in write transactions, for replaying the
    /// store's whole statement sequence).
    Get,
    Put,
    Insert,
    Delete,
}

/// One operation of a write transaction: a get, a put, an insert that
/// wrote, a delete that deleted.
#[derive(Debug, Clone)]
struct Write {
    op: Op,
    table: Table,
    key: Vec<u8>,
    value: Vec<u8>,
    /// For a thread record written to `threads` or `history`: the typed
    /// columns PostgreSQL keeps beside the bytes (schema version 2).
    cols: Option<Cols>,
}

/// The typed columns of a thread record, as the PostgreSQL backend writes
/// them beside `k` and `v` of `uwf_threads` and `uwf_history`
/// (`backend/postgres/columns.rs`), so the raw side writes the same rows.
#[derive(Debug, Clone)]
struct Cols {
    id: String,
    status: &'static str,
    workflow: String,
    created_at: SystemTime,
    updated_at: SystemTime,
    completed_at: Option<SystemTime>,
    head: String,
    seq: i64,
    parent_thread: Option<String>,
    last_error: Option<String>,
    /// The three times in ms, for SQL literals.
    ms: (u64, u64, Option<u64>),
}

/// The typed columns of `table` (none but for the two thread tables).
fn col_names(table: Table) -> &'static [&'static str] {
    match table {
        Table::Threads => &[
            "id",
            "status",
            "workflow",
            "created_at",
            "updated_at",
            "head",
            "seq",
            "parent_thread",
            "last_error",
        ],
        Table::History => &[
            "id",
            "status",
            "workflow",
            "created_at",
            "updated_at",
            "completed_at",
            "head",
            "seq",
            "parent_thread",
            "last_error",
        ],
        _ => &[],
    }
}

fn col_type(name: &str) -> Type {
    match name {
        "created_at" | "updated_at" | "completed_at" => Type::TIMESTAMPTZ,
        "seq" => Type::INT8,
        _ => Type::TEXT,
    }
}

/// A string as an SQL literal (standard-conforming strings).
fn text_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

impl Cols {
    fn of(r: &ThreadRecord) -> Cols {
        let time = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
        Cols {
            id: r.id.to_string(),
            status: r.status.as_str(),
            workflow: r.workflow.clone(),
            created_at: time(r.created_at),
            updated_at: time(r.updated_at),
            completed_at: r.completed_at.map(time),
            head: r.head.to_string(),
            seq: i64::try_from(r.seq).unwrap(),
            parent_thread: r.parent_thread.map(|p| p.to_string()),
            last_error: r.last_error.clone(),
            ms: (r.created_at, r.updated_at, r.completed_at),
        }
    }

    fn value(&self, name: &str) -> &(dyn ToSql + Sync) {
        match name {
            "id" => &self.id,
            "status" => &self.status,
            "workflow" => &self.workflow,
            "created_at" => &self.created_at,
            "updated_at" => &self.updated_at,
            "completed_at" => &self.completed_at,
            "head" => &self.head,
            "seq" => &self.seq,
            "parent_thread" => &self.parent_thread,
            "last_error" => &self.last_error,
            _ => unreachable!("{name}"),
        }
    }

    fn literal(&self, name: &str) -> String {
        let time = |ms: u64| format!("to_timestamp({ms}::double precision / 1000)");
        let opt = |v: &Option<String>| v.as_deref().map_or("NULL".into(), text_literal);
        match name {
            "id" => text_literal(&self.id),
            "status" => text_literal(self.status),
            "workflow" => text_literal(&self.workflow),
            "created_at" => time(self.ms.0),
            "updated_at" => time(self.ms.1),
            "completed_at" => self.ms.2.map_or("NULL".into(), time),
            "head" => text_literal(&self.head),
            "seq" => self.seq.to_string(),
            "parent_thread" => opt(&self.parent_thread),
            "last_error" => opt(&self.last_error),
            _ => unreachable!("{name}"),
        }
    }
}

impl Write {
    /// The parameters of its statement: the key; for a put or an insert
    /// also the value and the typed columns.
    fn params(&self) -> Vec<(&(dyn ToSql + Sync), Type)> {
        let mut p: Vec<(&(dyn ToSql + Sync), Type)> = vec![(&self.key, Type::BYTEA)];
        if matches!(self.op, Op::Put | Op::Insert) {
            p.push((&self.value, Type::BYTEA));
            let names = col_names(self.table);
            if !names.is_empty() {
                let cols = self
                    .cols
                    .as_ref()
                    .expect("a thread record without its columns");
                p.extend(names.iter().map(|n| (cols.value(n), col_type(n))));
            }
        }
        p
    }
}

/// Storage operations, counted at the boundary.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    read_txns: u64,
    write_txns: u64,
    gets: u64,
    writes: u64,
    counts: u64,
    ranges: u64,
    range_rows: u64,
    /// Range queries the PostgreSQL backend sends: one per `PG_PAGE` rows
    /// read, at least one per range.
    range_queries: u64,
    /// Round trips the PostgreSQL backend made (its own counter).
    round_trips: u64,
}

impl Counts {
    fn minus(&self, o: &Counts) -> Counts {
        Counts {
            read_txns: self.read_txns - o.read_txns,
            write_txns: self.write_txns - o.write_txns,
            gets: self.gets - o.gets,
            writes: self.writes - o.writes,
            counts: self.counts - o.counts,
            ranges: self.ranges - o.ranges,
            range_rows: self.range_rows - o.range_rows,
            range_queries: self.range_queries - o.range_queries,
            round_trips: self.round_trips - o.round_trips,
        }
    }
}

#[derive(Debug, Default)]
struct Log {
    counts: Counts,
    /// The PostgreSQL backend under the counter, for its real round trips.
    pg: Option<Arc<PostgresBackend>>,
    /// Keep every committed write transaction's writes in `txns`.
    capture: bool,
    txns: Vec<Vec<Write>>,
}

/// A backend that counts every operation of the one it wraps and can
/// capture the writes of each committed transaction.
#[derive(Debug)]
struct Counted {
    inner: Arc<dyn Backend>,
    log: Arc<Mutex<Log>>,
}

/// A store on `inner` whose operations are counted (and its writes
/// captured when `capture`).
fn counted(inner: Arc<dyn Backend>, capture: bool) -> (Store, Arc<Mutex<Log>>) {
    let log = Arc::new(Mutex::new(Log {
        capture,
        ..Log::default()
    }));
    let store = Store::from_backend(Counted {
        inner,
        log: Arc::clone(&log),
    });
    (store, log)
}

struct CountedRead<'a> {
    t: Box<dyn ReadTables + 'a>,
    log: &'a Mutex<Log>,
}

struct CountedWrite<'a> {
    t: Box<dyn WriteTables + 'a>,
    log: &'a Mutex<Log>,
    writes: RefCell<Vec<Write>>,
}

/// A range whose rows are counted; adds its queries when dropped.
struct CountedRange<'t> {
    inner: Entries<'t>,
    log: &'t Mutex<Log>,
    rows: u64,
}

impl<'t> Iterator for CountedRange<'t> {
    type Item = Result<Entry<'t>, BackendError>;
    fn next(&mut self) -> Option<Self::Item> {
        let item = self.inner.next();
        if item.is_some() {
            self.rows += 1;
        }
        item
    }
}

impl Drop for CountedRange<'_> {
    fn drop(&mut self) {
        let mut log = self.log.lock().unwrap();
        log.counts.range_rows += self.rows;
        log.counts.range_queries += self.rows / PG_PAGE + 1;
    }
}

fn counted_get<'t>(
    t: &'t dyn ReadTables,
    log: &Mutex<Log>,
    trace: Option<&RefCell<Vec<Write>>>,
    table: Table,
    key: &[u8],
) -> Result<Option<Cow<'t, [u8]>>, BackendError> {
    let mut log = log.lock().unwrap();
    log.counts.gets += 1;
    if let Some(trace) = trace.filter(|_| log.capture) {
        trace.borrow_mut().push(Write {
            op: Op::Get,
            table,
            key: key.to_vec(),
            value: Vec::new(),
            cols: None,
        });
    }
    drop(log);
    t.get(table, key)
}

fn counted_range<'t>(
    t: &'t dyn ReadTables,
    log: &'t Mutex<Log>,
    table: Table,
    range: KeyRange<'_>,
    direction: Direction,
) -> Result<Entries<'t>, BackendError> {
    log.lock().unwrap().counts.ranges += 1;
    Ok(Box::new(CountedRange {
        inner: t.range(table, range, direction)?,
        log,
        rows: 0,
    }))
}

fn counted_count(t: &dyn ReadTables, log: &Mutex<Log>, table: Table) -> Result<u64, BackendError> {
    log.lock().unwrap().counts.counts += 1;
    t.count(table)
}

/// The flags of the wrapped transaction (`self.t`), forwarded.
macro_rules! forward_flags {
    () => {
        fn connection_lost(&self) -> bool {
            self.t.connection_lost()
        }
        fn serialization_failed(&self) -> bool {
            self.t.serialization_failed()
        }
        fn needs_transaction(&self) -> bool {
            self.t.needs_transaction()
        }
    };
}

impl ReadTables for CountedRead<'_> {
    forward_flags!();
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>, BackendError> {
        counted_get(&*self.t, self.log, None, table, key)
    }
    fn prefetch(&self, keys: &[(Table, &[u8])]) -> Result<(), BackendError> {
        self.t.prefetch(keys)
    }
    fn prefers_batches(&self) -> bool {
        self.t.prefers_batches()
    }
    fn get_many(
        &self,
        table: Table,
        keys: &[&[u8]],
    ) -> Result<Vec<Option<Cow<'_, [u8]>>>, BackendError> {
        self.log.lock().unwrap().counts.gets += 1;
        self.t.get_many(table, keys)
    }
    fn range(
        &self,
        table: Table,
        range: KeyRange<'_>,
        direction: Direction,
    ) -> Result<Entries<'_>, BackendError> {
        counted_range(&*self.t, self.log, table, range, direction)
    }
    fn count(&self, table: Table) -> Result<u64, BackendError> {
        counted_count(&*self.t, self.log, table)
    }
}

impl ReadTables for CountedWrite<'_> {
    forward_flags!();
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>, BackendError> {
        counted_get(&*self.t, self.log, Some(&self.writes), table, key)
    }
    fn prefetch(&self, keys: &[(Table, &[u8])]) -> Result<(), BackendError> {
        self.t.prefetch(keys)
    }
    fn prefers_batches(&self) -> bool {
        self.t.prefers_batches()
    }
    fn get_many(
        &self,
        table: Table,
        keys: &[&[u8]],
    ) -> Result<Vec<Option<Cow<'_, [u8]>>>, BackendError> {
        if self.log.lock().unwrap().capture {
            // Captured key by key, for the replays.
            return keys
                .iter()
                .map(|key| counted_get(&*self.t, self.log, Some(&self.writes), table, key))
                .collect();
        }
        self.log.lock().unwrap().counts.gets += 1;
        self.t.get_many(table, keys)
    }
    fn range(
        &self,
        table: Table,
        range: KeyRange<'_>,
        direction: Direction,
    ) -> Result<Entries<'_>, BackendError> {
        counted_range(&*self.t, self.log, table, range, direction)
    }
    fn count(&self, table: Table) -> Result<u64, BackendError> {
        counted_count(&*self.t, self.log, table)
    }
}

impl CountedWrite<'_> {
    fn record(&mut self, op: Op, table: Table, key: &[u8], value: &[u8]) {
        let mut log = self.log.lock().unwrap();
        log.counts.writes += 1;
        if log.capture {
            self.writes.get_mut().push(Write {
                op,
                table,
                key: key.to_vec(),
                value: value.to_vec(),
                cols: None,
            });
        }
    }
}

impl WriteTables for CountedWrite<'_> {
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), BackendError> {
        self.t.put(table, key, value)?;
        self.record(Op::Put, table, key, value);
        Ok(())
    }
    fn insert(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<bool, BackendError> {
        let wrote = self.t.insert(table, key, value)?;
        if wrote {
            self.record(Op::Insert, table, key, value);
        } else {
            self.log.lock().unwrap().counts.writes += 1;
        }
        Ok(wrote)
    }
    fn delete(&mut self, table: Table, key: &[u8]) -> Result<bool, BackendError> {
        let deleted = self.t.delete(table, key)?;
        if deleted {
            self.record(Op::Delete, table, key, &[]);
        } else {
            self.log.lock().unwrap().counts.writes += 1;
        }
        Ok(deleted)
    }
    fn remove(&mut self, table: Table, key: &[u8]) -> Result<(), BackendError> {
        if self.log.lock().unwrap().capture {
            return self.delete(table, key).map(|_| ());
        }
        self.log.lock().unwrap().counts.writes += 1;
        self.t.remove(table, key)
    }
    fn insert_or_refresh(
        &mut self,
        table: Table,
        key: &[u8],
        value: &[u8],
        refresh: Refresh,
    ) -> Result<(), BackendError> {
        if self.log.lock().unwrap().capture {
            // The boundary's default, through the counted operations, so
            // the replays see an insert (or a get and a put).
            return uwf_db::backend::insert_then_refresh(self, table, key, value, refresh);
        }
        self.log.lock().unwrap().counts.writes += 1;
        self.t.insert_or_refresh(table, key, value, refresh)
    }
    fn commit(self: Box<Self>) -> Result<(), BackendError> {
        let me = *self;
        me.t.commit()?;
        let mut log = me.log.lock().unwrap();
        if log.capture {
            log.txns.push(me.writes.into_inner());
        }
        Ok(())
    }
}

impl Counted {
    fn counted_write<'a>(
        &'a self,
        t: Box<dyn WriteTables + 'a>,
    ) -> Result<Box<dyn WriteTables + 'a>, BackendError> {
        self.log.lock().unwrap().counts.write_txns += 1;
        Ok(Box::new(CountedWrite {
            t,
            log: &self.log,
            writes: RefCell::new(Vec::new()),
        }))
    }
}

impl Backend for Counted {
    fn begin_read(&self) -> Result<Box<dyn ReadTables + '_>, BackendError> {
        self.log.lock().unwrap().counts.read_txns += 1;
        Ok(Box::new(CountedRead {
            t: self.inner.begin_read()?,
            log: &self.log,
        }))
    }
    fn begin_read_once(&self) -> Result<Box<dyn ReadTables + '_>, BackendError> {
        self.log.lock().unwrap().counts.read_txns += 1;
        Ok(Box::new(CountedRead {
            t: self.inner.begin_read_once()?,
            log: &self.log,
        }))
    }
    fn begin_write(&self) -> Result<Box<dyn WriteTables + '_>, BackendError> {
        self.counted_write(self.inner.begin_write()?)
    }
    fn begin_write_exclusive(&self) -> Result<Box<dyn WriteTables + '_>, BackendError> {
        self.counted_write(self.inner.begin_write_exclusive()?)
    }
    fn parallel_writers(&self) -> usize {
        self.inner.parallel_writers()
    }
    fn location(&self) -> &str {
        self.inner.location()
    }
    fn dir(&self) -> Option<&Path> {
        self.inner.dir()
    }
    fn durability(&self) -> Durability {
        self.inner.durability()
    }
    fn reads_cost_round_trips(&self) -> bool {
        self.inner.reads_cost_round_trips()
    }
    fn try_lock_claim(
        &self,
        id: uwf_db::backend::ClaimKey,
    ) -> Result<Option<Box<dyn HeldLock>>, BackendError> {
        self.inner.try_lock_claim(id)
    }
    fn claim_locked(&self, id: uwf_db::backend::ClaimKey) -> Result<bool, BackendError> {
        self.inner.claim_locked(id)
    }
    fn try_lock_gc(&self) -> Result<Option<Box<dyn HeldLock>>, BackendError> {
        self.inner.try_lock_gc()
    }
    fn storage_stats(&self) -> Result<StorageStats, BackendError> {
        self.inner.storage_stats()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The storage operations `f` makes through a counted store.
fn count_ops(log: &Mutex<Log>, f: impl FnOnce()) -> Counts {
    let snapshot = || {
        let log = log.lock().unwrap();
        let mut c = log.counts;
        c.round_trips = log.pg.as_ref().map_or(0, |pg| pg.round_trips());
        c
    };
    let before = snapshot();
    f();
    snapshot().minus(&before)
}

// ---------------------------------------------------------------------------
// Threads and steps (as in the `threads` bench)

fn placeholder_workflow(store: &Store, name: &str) -> Hash {
    store
        .put(&Blob::Workflow(WorkflowNode {
            definition: Value::Map(BTreeMap::from([(
                "name".to_owned(),
                Value::Str(name.into()),
            )])),
        }))
        .unwrap()
}

fn new_thread(wf: Hash, name: &str, prompt: String) -> NewThread {
    NewThread {
        workflow: name.into(),
        workflow_hash: wf,
        prompt,
        max_rounds: 1_000_000,
        depth: 0,
        parent_state: None,
        parent_thread: None,
        next_role: "developer".into(),
        next_instruction: "Implement the change".into(),
        agent: None,
        cwd: None,
        next_location: None,
        labels: Default::default(),
    }
}

fn start(store: &Store, name: &str) -> ThreadRecord {
    let wf = placeholder_workflow(store, name);
    store
        .threads()
        .low_level()
        .start_thread(new_thread(
            wf,
            name,
            "Implement the change described in the issue".into(),
        ))
        .unwrap()
}

fn step(i: usize) -> StepWrite {
    StepWrite {
        role: "developer".into(),
        meta: BTreeMap::from([("$status".to_owned(), Value::Str("review_needed".into()))]),
        reply: format!(
            "Step {i}: implemented the change, added tests, and updated the documentation."
        ),
        artifacts: vec![],
        instruction: format!("Review round {i}: address the comments"),
        child_thread: None,
    }
}

fn next() -> Next {
    Next::Role {
        role: "reviewer".into(),
        instruction: "Review the change".into(),
        location: None,
    }
}

/// Appends `n` steps (one transaction each).
fn grow(store: &Store, id: ThreadId, head: Hash, n: usize) -> Hash {
    grow_from(store, id, head, 0..n)
}

/// Appends the steps `steps` (one transaction each): a range that no
/// earlier step used gives content not yet stored.
fn grow_from(store: &Store, id: ThreadId, mut head: Hash, steps: std::ops::Range<usize>) -> Hash {
    for i in steps {
        head = store
            .threads()
            .low_level()
            .append_step(id, head, step(i), next())
            .unwrap()
            .record
            .head;
    }
    head
}

/// Starts `n` threads through group commit from 16 writer threads.
fn start_many(store: &Store, n: usize) {
    let wf = placeholder_workflow(store, "wf");
    let writers = 16;
    store.group_commit(0, |g| {
        std::thread::scope(|s| {
            for w in 0..writers {
                s.spawn(move || {
                    for i in (w..n).step_by(writers) {
                        let name = if i % 2 == 0 { "review" } else { "plan" };
                        g.threads()
                            .low_level()
                            .start_thread(new_thread(wf, name, format!("task {i}")))
                            .unwrap();
                    }
                });
            }
        });
    });
}

// ---------------------------------------------------------------------------
// 1. Durable append

/// The writes of starting a thread and appending `n` steps to it, captured
/// from an in-memory store: (the setup transactions, one per step).
fn capture_appends(n: usize) -> (Vec<Vec<Write>>, Vec<Vec<Write>>) {
    let (store, log) = counted(Arc::new(MemoryBackend::new()), true);
    // The record each write transaction left, for the typed columns of
    // its writes to `threads`.
    let with_cols = |record: &ThreadRecord| {
        let mut log = log.lock().unwrap();
        for w in log.txns.last_mut().unwrap() {
            if !col_names(w.table).is_empty() && w.op != Op::Delete && w.op != Op::Get {
                w.cols = Some(Cols::of(record));
            }
        }
    };
    let t = start(&store, "review");
    with_cols(&t);
    let setup = log.lock().unwrap().txns.len();
    let mut head = t.head;
    for i in 0..n {
        let written = store
            .threads()
            .low_level()
            .append_step(t.id, head, step(i), next())
            .unwrap();
        with_cols(&written.record);
        head = written.record.head;
    }
    let mut txns = std::mem::take(&mut log.lock().unwrap().txns);
    let steps = txns.split_off(setup);
    assert_eq!(steps.len(), n);
    (txns, steps)
}

/// How the raw side sends a captured step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replay {
    /// The writes only, as prepared statements between `BEGIN` and
    /// `COMMIT`: the baseline.
    Writes,
    /// The writes only, as literal SQL sent with `COMMIT` in one simple
    /// query after `BEGIN`: two round trips, the floor of the way the store
    /// sends them (context).
    WritesWithCommit,
}

/// A raw client with the statements of every operation, prepared once.
struct RawPg {
    client: Client,
    prepared: HashMap<(Op, Table), postgres::Statement>,
}

impl RawPg {
    fn new(url: &str) -> RawPg {
        let mut client = Client::connect(url, NoTls).unwrap();
        let mut prepared = HashMap::new();
        for table in Table::ALL {
            let name = format!("uwf_{}", table.name());
            let cols = col_names(table);
            let columns: String = cols.iter().map(|c| format!(", {c}")).collect();
            let values: String = (3..cols.len() + 3).map(|i| format!(", ${i}")).collect();
            let updates: String = cols
                .iter()
                .map(|c| format!(", {c} = EXCLUDED.{c}"))
                .collect();
            let insert = format!("INSERT INTO {name} (k, v{columns}) VALUES ($1, $2{values})");
            let upsert = format!("{insert} ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v{updates}");
            for (op, raw) in [
                (Op::Put, upsert),
                (Op::Insert, insert),
                (Op::Delete, format!("DELETE FROM {name} WHERE k = $1")),
            ] {
                let mut types = vec![Type::BYTEA];
                if matches!(op, Op::Put | Op::Insert) {
                    types.push(Type::BYTEA);
                    types.extend(cols.iter().map(|c| col_type(c)));
                }
                prepared.insert((op, table), client.prepare_typed(&raw, &types).unwrap());
            }
        }
        RawPg { client, prepared }
    }

    /// One transaction per entry of `txns`.
    fn replay(&mut self, txns: &[Vec<Write>], mode: Replay) {
        for ops in txns {
            let c = &mut self.client;
            c.batch_execute("BEGIN").unwrap();
            let mut held = String::new();
            for w in ops {
                match (mode, w.op) {
                    (_, Op::Get) => {}
                    (Replay::WritesWithCommit, _) => held.push_str(&literal_sql(w)),
                    (Replay::Writes, _) => {
                        let typed = w.params();
                        let plain: Vec<&(dyn ToSql + Sync)> =
                            typed.iter().map(|(v, _)| *v).collect();
                        c.execute(&self.prepared[&(w.op, w.table)], &plain).unwrap();
                    }
                }
            }
            held.push_str("COMMIT");
            c.batch_execute(&held).unwrap();
        }
    }
}

/// `'\x…'`: bytes as a bytea literal.
fn hex_literal(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(2 * bytes.len() + 4);
    s.push_str("'\\x");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s.push('\'');
    s
}

/// A write as one SQL statement with literal values (the backend's SQL).
fn literal_sql(w: &Write) -> String {
    let table = format!("uwf_{}", w.table.name());
    let (k, v) = (hex_literal(&w.key), hex_literal(&w.value));
    let names = col_names(w.table);
    let (mut columns, mut values, mut updates) = (String::new(), String::new(), String::new());
    if let Some(cols) = w.cols.as_ref().filter(|_| !names.is_empty()) {
        for n in names {
            columns.push_str(&format!(", {n}"));
            values.push_str(&format!(", {}", cols.literal(n)));
            updates.push_str(&format!(", {n} = EXCLUDED.{n}"));
        }
    }
    let insert = format!("INSERT INTO {table} (k, v{columns}) VALUES ({k}, {v}{values})");
    match w.op {
        Op::Get => String::new(),
        Op::Put => format!("{insert} ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v{updates}; "),
        Op::Insert => format!("{insert} ON CONFLICT (k) DO NOTHING; "),
        Op::Delete => format!("DELETE FROM {table} WHERE k = {k}; "),
    }
}

/// Replays `txns` into a raw heed environment, one durable transaction each.
fn replay_heed(
    env: &heed::Env<heed::WithoutTls>,
    dbs: &[heed::Database<Bytes, Bytes>],
    txns: &[Vec<Write>],
) {
    for writes in txns {
        let mut w = env.write_txn().unwrap();
        for x in writes {
            let db = dbs[x.table.index()];
            match x.op {
                Op::Get => {}
                Op::Delete => {
                    db.delete(&mut w, &x.key).unwrap();
                }
                _ => db.put(&mut w, &x.key, &x.value).unwrap(),
            }
        }
        w.commit().unwrap();
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// One run of `n` captured steps replayed raw on a fresh database.
fn raw_append(n: usize, mode: Replay) -> Duration {
    let (setup, steps) = capture_appends(n);
    let db = Db::create("append_raw");
    // The schema, as the backend creates it.
    drop(db.open(Durability::Sync));
    let mut raw = RawPg::new(&db.url);
    raw.replay(&setup, Replay::Writes);
    time(|| raw.replay(&steps, mode))
}

/// Durable `append_step` on PostgreSQL against raw replays of the same
/// steps: the goal's baseline (the writes, prepared), and for context the
/// same writes sent with `COMMIT` in one simple query (the floor of how the
/// store sends them). Each round runs the three in rotating order on fresh
/// databases; medians of `reps` rounds.
fn append_pg(n: usize, reps: usize) -> Vec<Comparison> {
    let store_run = || {
        let db = Db::create("append");
        let store = db.open(Durability::Sync);
        let t = start(&store, "review");
        time(|| {
            grow(&store, t.id, t.head, n);
        })
    };
    let runs: [&dyn Fn() -> Duration; 3] = [&store_run, &|| raw_append(n, Replay::Writes), &|| {
        raw_append(n, Replay::WritesWithCommit)
    }];
    for run in runs {
        run();
    }
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); runs.len()];
    for r in 0..reps {
        for k in 0..runs.len() {
            let i = (k + r) % runs.len();
            times[i].push(runs[i]());
        }
    }
    let medians: Vec<Duration> = times.into_iter().map(median).collect();
    let [store, writes, with_commit]: [Duration; 3] = medians.try_into().unwrap();
    let row = |name: &str, subject, baseline| Comparison {
        name: name.to_owned(),
        ops: n as u64,
        subject,
        baseline,
    };
    vec![
        row(
            "PostgreSQL: durable append_step, one step per txn, vs raw postgres-crate txns writing the same rows (prepared)",
            store,
            writes,
        ),
        row(
            "(context) append_step vs raw: BEGIN, then the same writes as literal SQL with COMMIT in one simple query",
            store,
            with_commit,
        ),
    ]
}

/// What one step does at the storage boundary, by operation and table.
fn print_step_breakdown() {
    let (_, steps) = capture_appends(20);
    let mut by: BTreeMap<(String, &str), usize> = BTreeMap::new();
    for w in steps.iter().flatten() {
        *by.entry((format!("{:?}", w.op).to_lowercase(), w.table.name()))
            .or_default() += 1;
    }
    let parts: Vec<String> = by
        .iter()
        .map(|((op, table), n)| format!("{op} {table} ×{}", *n as f64 / steps.len() as f64))
        .collect();
    println!(
        "(one append_step at the storage boundary: {})",
        parts.join(", ")
    );
}

fn append_bench(n_pg: usize, n_lmdb: usize) -> Vec<Comparison> {
    print_step_breakdown();
    let mut rows = append_pg(n_pg, 5);
    let lmdb = Comparison::run(
        "LMDB: durable append_step, one step per txn, vs raw heed txns of the same rows",
        n_lmdb as u64,
        5,
        || {
            let dir = scratch_dir("pg-append-lmdb");
            let store = Store::open(dir.path(), options(Durability::Sync)).unwrap();
            let t = start(&store, "review");
            time(|| {
                grow(&store, t.id, t.head, n_lmdb);
            })
        },
        || {
            let (setup, steps) = capture_appends(n_lmdb);
            let dir = scratch_dir("pg-append-heed");
            let env = raw_env(dir.path(), true);
            let mut w = env.write_txn().unwrap();
            let dbs: Vec<heed::Database<Bytes, Bytes>> = Table::ALL
                .iter()
                .map(|t| env.create_database(&mut w, Some(t.name())).unwrap())
                .collect();
            w.commit().unwrap();
            replay_heed(&env, &dbs, &setup);
            time(|| replay_heed(&env, &dbs, &steps))
        },
    );
    rows.push(lmdb);
    rows
}

// ---------------------------------------------------------------------------
// 2. Group commit from several processes

/// Where a fleet's store lives.
enum FleetStore {
    Pg(Db),
    Lmdb(tempfile::TempDir),
}

impl FleetStore {
    fn arg(&self) -> String {
        match self {
            FleetStore::Pg(db) => db.url.clone(),
            FleetStore::Lmdb(dir) => dir.path().join("store").display().to_string(),
        }
    }
}

fn uwf() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_uwf-db"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

/// Polls the server connections to `url`'s database (its own left out)
/// until stopped; returns the peak.
struct ConnectionWatch {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<usize>,
}

impl ConnectionWatch {
    fn start(url: &str) -> ConnectionWatch {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut client = Client::connect(url, NoTls).unwrap();
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut peak = 0usize;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let n: i64 = client
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity \
                         WHERE datname = current_database() AND pid <> pg_backend_pid()",
                        &[],
                    )
                    .unwrap()
                    .get(0);
                peak = peak.max(usize::try_from(n).unwrap_or(0));
                std::thread::sleep(Duration::from_millis(5));
            }
            peak
        });
        ConnectionWatch { stop, thread }
    }

    fn peak(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// What one fleet run did.
struct FleetRun {
    wall: Duration,
    steps: u64,
    group: f64,
    /// Threads that ended failed or with an error.
    failed: u64,
    /// Peak server connections (PostgreSQL).
    peak: usize,
    /// Where the CPU went (Linux: `/proc/stat` and `getrusage`).
    cpu: Option<FleetCpu>,
}

/// The machine's CPU over a fleet run: how busy it was, and its CPU and
/// the runner processes' CPU a step (the rest is the server's, the
/// kernel's I/O and this bench's connection watch).
#[derive(Clone, Copy)]
struct FleetCpu {
    busy: f64,
    machine_per_step: Duration,
    runners_per_step: Duration,
}

/// The machine's busy and total CPU ticks since boot (`/proc/stat`).
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal …
    let idle = v.get(3)? + v.get(4)?;
    let total: u64 = v.iter().take(8).sum();
    Some((total - idle, total))
}

/// One fleet run: `procs` processes of `uwf-db batch --jobs JOBS/procs`,
/// each on its own `threads / procs` prompts of the review scenario (4
/// steps a thread), on a fresh store.
fn fleet_run(pg: bool, procs: usize, threads: usize, jobs: usize) -> FleetRun {
    let jobs = jobs / procs;
    let store = if pg {
        FleetStore::Pg(Db::create("fleet"))
    } else {
        FleetStore::Lmdb(scratch_dir("pg-fleet-lmdb"))
    };
    let arg = store.arg();
    let out = uwf()
        .args(["--store", &arg, "workflow", "add", "examples/review.yaml"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let scratch = scratch_dir("pg-fleet-prompts");
    let scenario: PathBuf =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/review.scenario.yaml");
    let share = threads / procs;
    let files: Vec<PathBuf> = (0..procs)
        .map(|p| {
            let f = scratch.path().join(format!("prompts-{p}.txt"));
            let text: String = (0..share)
                .map(|i| format!("process {p}: change {i}\n"))
                .collect();
            std::fs::write(&f, text).unwrap();
            f
        })
        .collect();
    let watch = pg.then(|| ConnectionWatch::start(&arg));
    let (ticks0, children0) = (machine_ticks(), children_cpu());
    let t0 = Instant::now();
    let children: Vec<_> = files
        .iter()
        .map(|f| {
            uwf()
                .args(["--store", &arg, "--json", "batch", "review", "--prompts"])
                .arg(f)
                .arg("--agent")
                .arg(format!("script:{}", scenario.display()))
                .args(["--jobs", &jobs.to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let wall = t0.elapsed();
    let (ticks1, children1) = (machine_ticks(), children_cpu());
    let peak = watch.map_or(0, ConnectionWatch::peak);
    let (mut steps, mut groups, mut failed) = (0u64, 0u64, 0u64);
    for o in &outputs {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let stdout = String::from_utf8_lossy(&o.stdout);
        let last = stdout.lines().last().unwrap();
        let v: serde_json::Value = serde_json::from_str(last).unwrap();
        let s = &v["summary"];
        let completed = s["completed"].as_u64().unwrap_or(0);
        failed += share as u64 - completed.min(share as u64);
        steps += s["steps"].as_u64().unwrap();
        groups += s["groups"].as_u64().unwrap();
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = ticks0.zip(ticks1).and_then(|((b0, t0), (b1, t1))| {
        let total = t1.checked_sub(t0).filter(|t| *t > 0)?;
        let busy = b1.saturating_sub(b0) as f64 / total as f64;
        let steps = steps.max(1) as f64;
        Some(FleetCpu {
            busy,
            machine_per_step: wall.mul_f64(busy * cores as f64 / steps),
            runners_per_step: children1.saturating_sub(children0).div_f64(steps),
        })
    });
    FleetRun {
        wall,
        steps,
        group: steps as f64 / groups.max(1) as f64,
        failed,
        peak,
        cpu,
    }
}

struct FleetRow {
    procs: usize,
    rate: f64,
    group: f64,
    peak: usize,
    cpu: Option<FleetCpu>,
}

/// Steps/s of 1, 2, 4 and 8 processes: the median of `reps` rounds, each
/// round running every count once (in rotating order).
fn fleet(pg: bool, threads: usize, jobs: usize, reps: usize) -> Vec<FleetRow> {
    let counts = [1usize, 2, 4, 8];
    type Round = (f64, f64, usize, Option<FleetCpu>);
    let mut rates: Vec<Vec<Round>> = vec![Vec::new(); counts.len()];
    for r in 0..reps {
        for k in 0..counts.len() {
            let i = (k + r) % counts.len();
            let run = fleet_run(pg, counts[i], threads, jobs);
            assert_eq!(run.failed, 0, "{} threads failed", run.failed);
            rates[i].push((
                run.steps as f64 / run.wall.as_secs_f64(),
                run.group,
                run.peak,
                run.cpu,
            ));
        }
    }
    counts
        .iter()
        .zip(rates)
        .map(|(&procs, mut v)| {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (rate, group, peak, cpu) = v[v.len() / 2];
            FleetRow {
                procs,
                rate,
                group,
                peak,
                cpu,
            }
        })
        .collect()
}

fn fleet_bench(threads_pg: usize, threads_lmdb: usize, jobs: usize) {
    let reps = 3;
    let pg = fleet(true, threads_pg, jobs, reps);
    let lmdb = fleet(false, threads_lmdb, jobs, reps);
    println!("\n## group commit: `uwf-db batch` processes sharing one store (durable)\n");
    println!(
        "each process: `batch review --prompts (its share) --agent script:examples/review.scenario.yaml --jobs {jobs}/N` \
         (N processes, {jobs} drivers in all; 4 steps a thread; the default --pg-connections); \
         PostgreSQL {threads_pg} threads in all, LMDB {threads_lmdb}; \
         wall time from the first spawn to the last exit; median of {reps} rounds; \
         peak connections: the runners' server connections at most, polled from pg_stat_activity\n"
    );
    println!(
        "| processes | PostgreSQL steps/s | scaling | avg group | peak connections | LMDB steps/s | scaling | avg group |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (p, l) in pg.iter().zip(&lmdb) {
        println!(
            "| {} | {:.0} | {:.2}× | {:.1} | {} | {:.0} | {:.2}× | {:.1} |",
            p.procs,
            p.rate,
            p.rate / pg[0].rate,
            p.group,
            p.peak,
            l.rate,
            l.rate / lmdb[0].rate,
            l.group
        );
    }
    let four = pg.iter().find(|r| r.procs == 4).map_or(0.0, |r| r.rate);
    let best = pg.iter().map(|r| r.rate).fold(0.0, f64::max);
    println!(
        "\n4 processes / 1: {:.2}× (goal ≥ 2×); best PostgreSQL fleet: {best:.0} steps/s (goal ≥ 3,500); \
         best fleet / one LMDB process: {:.2}× (goal ≥ 0.5×)",
        four / pg[0].rate,
        best / lmdb[0].rate
    );
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("\nmachine: {cores} cores (the processes, their agents and the server share them)");
    // What bounds the fleet: the machine's CPU a step, from the same runs.
    if pg.iter().all(|r| r.cpu.is_some()) {
        println!(
            "\n### where the CPU went (PostgreSQL; the median run of each count)\n\n\
             machine busy: its CPU over the run (/proc/stat); a step: the machine's CPU, and the \
             runner processes' own (getrusage), per step; the rest is the server's, the kernel's \
             I/O and this bench's connection watch\n"
        );
        println!(
            "| processes | machine busy | machine CPU a step | runners' CPU a step | the rest a step |"
        );
        println!("|---:|---:|---:|---:|---:|");
        for r in &pg {
            if let Some(c) = r.cpu {
                println!(
                    "| {} | {:.0}% | {:.0} µs | {:.0} µs | {:.0} µs |",
                    r.procs,
                    c.busy * 100.0,
                    c.machine_per_step.as_secs_f64() * 1e6,
                    c.runners_per_step.as_secs_f64() * 1e6,
                    c.machine_per_step
                        .saturating_sub(c.runners_per_step)
                        .as_secs_f64()
                        * 1e6
                );
            }
        }
        let least = pg
            .iter()
            .filter_map(|r| r.cpu)
            .map(|c| c.machine_per_step)
            .min()
            .unwrap_or(Duration::ZERO);
        if !least.is_zero() {
            println!(
                "\nCPU ceiling: at the least machine CPU a step above ({:.0} µs), {cores} cores fully \
                 busy would make at most {:.0} steps/s; 4 processes at 2× one process need {:.0}",
                least.as_secs_f64() * 1e6,
                cores as f64 / least.as_secs_f64(),
                2.0 * pg[0].rate
            );
        }
    }
}

/// 8 runners × 64 jobs on one database: every thread completes (none
/// fails for want of a connection), and the peak connection count.
fn connections_bench(threads: usize) {
    let (procs, jobs) = (8, 64);
    let run = fleet_run(true, procs, threads, procs * jobs);
    let mut admin = Client::connect(&admin_url(), NoTls).unwrap();
    let max: String = admin.query_one("SHOW max_connections", &[]).unwrap().get(0);
    println!("\n## connections: {procs} runners × {jobs} jobs, {threads} threads (durable)\n");
    println!(
        "| threads failed | steps/s | peak connections | bound (8 × (4 + 1)) | max_connections |"
    );
    println!("|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {:.0} | {} | {} | {max} |",
        run.failed,
        run.steps as f64 / run.wall.as_secs_f64(),
        run.peak,
        procs * (uwf_db::store::DEFAULT_PG_CONNECTIONS + 1)
    );
}

// ---------------------------------------------------------------------------
// 3. Pages: newest 50 steps, first page of threads

/// Times `fetches` calls of `visit_log(id, 50)`.
fn fetch_log(store: &Store, id: ThreadId, fetches: u64) -> Duration {
    time(|| {
        for _ in 0..fetches {
            let n = store
                .threads()
                .visit_log(id, 50, None, |h, bytes| {
                    std::hint::black_box((h, bytes));
                    Ok::<_, uwf_db::thread::ThreadError>(())
                })
                .unwrap();
            assert_eq!(n, 50);
        }
    })
}

fn log_bench(steps: usize, rows: &mut Vec<Comparison>, ops: &mut Vec<(String, Counts)>) {
    let short_steps = 100;
    // PostgreSQL: built without fsync (the pages read the same either way).
    let db = Db::create("log");
    let store = db.open(Durability::None);
    let built = Instant::now();
    let long = start(&store, "long");
    let long_head = grow(&store, long.id, long.head, steps);
    let short = start(&store, "short");
    grow(&store, short.id, short.head, short_steps);
    println!(
        "(built a {steps}-step and a {short_steps}-step thread on PostgreSQL in {:.1} s)",
        built.elapsed().as_secs_f64()
    );
    let fetches = 200;
    rows.push(Comparison::run(
        &format!(
            "PostgreSQL: newest 50 steps (visit_log) of a {steps}-step thread vs of a {short_steps}-step one"
        ),
        fetches,
        5,
        || fetch_log(&store, long.id, fetches),
        || fetch_log(&store, short.id, fetches),
    ));
    // The raw side: 50 SELECTs of the same keys in one read transaction.
    let keys: Vec<Vec<u8>> = store
        .threads()
        .log(long.id, 50, None)
        .unwrap()
        .iter()
        .map(|e| e.hash.as_bytes().to_vec())
        .collect();
    let mut client = db.client();
    let select = client
        .prepare_typed("SELECT v FROM uwf_blobs WHERE k = $1", &[Type::BYTEA])
        .unwrap();
    let select_any = client
        .prepare_typed(
            "SELECT k, v FROM uwf_blobs WHERE k = ANY($1)",
            &[Type::BYTEA_ARRAY],
        )
        .unwrap();
    let client = Mutex::new(client);
    rows.push(Comparison::run(
        &format!(
            "PostgreSQL: newest 50 steps of a {steps}-step thread vs 50 raw prepared SELECTs of the same keys in one read txn"
        ),
        fetches,
        5,
        || fetch_log(&store, long.id, fetches),
        || {
            let mut c = client.lock().unwrap();
            time(|| {
                for _ in 0..fetches {
                    let mut tx = c
                        .build_transaction()
                        .isolation_level(postgres::IsolationLevel::RepeatableRead)
                        .read_only(true)
                        .start()
                        .unwrap();
                    for k in &keys {
                        std::hint::black_box(tx.query_one(&select, &[k]).unwrap());
                    }
                    tx.commit().unwrap();
                }
            })
        },
    ));
    rows.push(Comparison::run(
        &format!(
            "PostgreSQL: newest 50 steps of a {steps}-step thread vs one raw SELECT … WHERE k = ANY(50 keys) (context)"
        ),
        fetches,
        5,
        || fetch_log(&store, long.id, fetches),
        || {
            let mut c = client.lock().unwrap();
            time(|| {
                for _ in 0..fetches {
                    let got = c.query(&select_any, &[&keys]).unwrap();
                    assert_eq!(got.len(), 50);
                    std::hint::black_box(got);
                }
            })
        },
    ));
    let (counted_store, log) = db.open_counted();
    let c = count_ops(&log, || {
        counted_store
            .threads()
            .visit_log(long.id, 50, None, |_, _| {
                Ok::<_, uwf_db::thread::ThreadError>(())
            })
            .unwrap();
    });
    ops.push((format!("newest 50 steps of a {steps}-step thread"), c));
    let c = count_ops(&log, || {
        grow_from(&counted_store, long.id, long_head, 1_000_000..1_000_020);
    });
    ops.push((
        "append_step, new content (mean of 20)".into(),
        Counts {
            read_txns: c.read_txns / 20,
            write_txns: c.write_txns / 20,
            gets: c.gets / 20,
            writes: c.writes / 20,
            counts: c.counts / 20,
            ranges: c.ranges / 20,
            range_rows: c.range_rows / 20,
            range_queries: c.range_queries / 20,
            round_trips: c.round_trips / 20,
        },
    ));
    let wf = placeholder_workflow(&counted_store, "counted");
    let c = count_ops(&log, || {
        counted_store
            .threads()
            .low_level()
            .start_thread(new_thread(wf, "counted", "task".into()))
            .unwrap();
    });
    ops.push(("start_thread".into(), c));
    drop((counted_store, store));

    // LMDB beside it.
    let dir = scratch_dir("pg-log-lmdb");
    let lstore = Store::open(dir.path(), options(Durability::None)).unwrap();
    let long = start(&lstore, "long");
    grow(&lstore, long.id, long.head, steps);
    let short = start(&lstore, "short");
    grow(&lstore, short.id, short.head, short_steps);
    let fetches = 2000;
    rows.push(Comparison::run(
        &format!(
            "LMDB: newest 50 steps (visit_log) of a {steps}-step thread vs of a {short_steps}-step one"
        ),
        fetches,
        5,
        || fetch_log(&lstore, long.id, fetches),
        || fetch_log(&lstore, short.id, fetches),
    ));
}

fn list_page(store: &Store, lists: u64) -> Duration {
    let q = ThreadQuery {
        limit: 50,
        ..ThreadQuery::default()
    };
    time(|| {
        for _ in 0..lists {
            let page = store.threads().list(&q).unwrap();
            assert_eq!(page.len(), 50);
            std::hint::black_box(page);
        }
    })
}

fn list_bench(threads: usize, rows: &mut Vec<Comparison>, ops: &mut Vec<(String, Counts)>) {
    let small = 1000.min(threads);
    let big_db = Db::create("list_big");
    let small_db = Db::create("list_small");
    let big = big_db.open(Durability::None);
    let small_store = small_db.open(Durability::None);
    let built = Instant::now();
    start_many(&big, threads);
    println!(
        "(started {threads} threads on PostgreSQL through group commit in {:.1} s)",
        built.elapsed().as_secs_f64()
    );
    start_many(&small_store, small);
    let lists = 200;
    rows.push(Comparison::run(
        &format!("PostgreSQL: first page of 50 of {threads} active threads vs of {small}"),
        lists,
        5,
        || list_page(&big, lists),
        || list_page(&small_store, lists),
    ));
    for (db, n) in [(&big_db, threads), (&small_db, small)] {
        let (s, log) = db.open_counted();
        let c = count_ops(&log, || {
            list_page(&s, 1);
        });
        ops.push((format!("thread list, first page of 50 of {n}"), c));
    }
    drop((big, small_store));

    let dir = scratch_dir("pg-list-lmdb");
    let sdir = scratch_dir("pg-list-lmdb-small");
    let big = Store::open(dir.path(), options(Durability::None)).unwrap();
    let small_store = Store::open(sdir.path(), options(Durability::None)).unwrap();
    start_many(&big, threads);
    start_many(&small_store, small);
    let lists = 2000;
    rows.push(Comparison::run(
        &format!("LMDB: first page of 50 of {threads} active threads vs of {small}"),
        lists,
        5,
        || list_page(&big, lists),
        || list_page(&small_store, lists),
    ));
}

fn print_ops(ops: &[(String, Counts)]) {
    println!("\n## statements per operation on PostgreSQL (counted at the storage boundary)\n");
    println!("| operation | txns | point gets | writes | range scans (rows read) | round trips |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (what, c) in ops {
        println!(
            "| {what} | {} | {} | {} | {} ({}) | {} |",
            c.read_txns + c.write_txns,
            c.gets,
            c.writes,
            c.ranges,
            c.range_rows,
            c.round_trips
        );
    }
    println!(
        "\nround trips: counted by the backend (`PostgresBackend::round_trips`): `BEGIN` goes with \
         the first statement and its prefetched keys, held writes with `COMMIT`; point gets and \
         writes are the operations the store asked for (a `get_many` is one), \
         a range scan fetches {PG_PAGE} rows per round trip"
    );
}

fn main() {
    if !reachable() {
        return;
    }
    let sections: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wants = |s: &str| sections.is_empty() || sections.iter().any(|x| x == s);
    print_settings();
    let mut rows = Vec::new();
    let mut ops = Vec::new();
    if wants("append") {
        rows.extend(append_bench(scale(1000, 10), scale(2000, 10)));
    }
    if wants("log") {
        log_bench(scale(10_000, 60), &mut rows, &mut ops);
    }
    if wants("list") {
        list_bench(scale(100_000, 60), &mut rows, &mut ops);
    }
    if !rows.is_empty() {
        report(
            "postgres: PostgreSQL backend vs baselines, LMDB beside it",
            "append ≥ 0.5× raw postgres-crate txns of the same rows; \
             a page O(page): the ratio of a large thread or store to a small one near 1",
            &rows,
        );
    }
    if !ops.is_empty() {
        print_ops(&ops);
    }
    if wants("fleet") {
        fleet_bench(scale(2000, 8), scale(4000, 8), 32);
    }
    if wants("connections") {
        connections_bench(scale(2000, 8));
    }
}

//! The PostgreSQL backend: one store in one database, shared by runner
//! processes on many machines (SPEC §10).
//!
//! **Schema** (version [`SCHEMA_VERSION`], in `uwf_schema`; `schema.rs`):
//! one table per [`Table`], `uwf_<name>(k bytea PRIMARY KEY, v bytea NOT
//! NULL)`, holding exactly the keys and values of `docs/design.md` §4 —
//! bytea compares byte-wise, so every range scan sorts as on LMDB. The
//! thread tables also have typed, indexed columns for people reading the
//! store with SQL, filled from each record as it is written (`columns.rs`);
//! the engine reads only `k` and `v`. Created, or migrated from an older
//! version, on first use; a database with a newer schema version is
//! refused.
//!
//! **Isolation.** A write transaction runs at `READ COMMITTED` and first
//! takes a transaction-scoped advisory lock ([`WRITER_LOCK`]): writers are
//! serialized across every process and machine, as LMDB serializes them
//! on one machine, and each statement of the writer sees every earlier
//! commit. So a read of a record and the write that depends on it never
//! interleave with another writer, and the engine's compare-and-swap works
//! unchanged. (A `REPEATABLE READ` writer would take its snapshot before
//! the lock is granted and fail with serialization errors instead.) A read
//! transaction is `REPEATABLE READ READ ONLY`: one snapshot.
//!
//! **Statements** are sent with `query_typed` (the unnamed statement, no
//! prepare round trip), and transactions are opened and closed with simple
//! queries, so the backend works behind a transaction-mode pooler.
//!
//! **Failures.** A serialization failure or deadlock is
//! [`BackendError::Serialization`] (the store re-runs the transaction); any
//! other error, a lost connection included, fails the transaction in
//! flight with nothing applied, and that connection is dropped rather than
//! returned to the pool.
//!
//! **Locks.** Claims and the GC lock are session advisory locks held by one
//! connection of this backend; PostgreSQL releases them when that session
//! ends (the process exits or dies, or its connection is lost).

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Bound;
use std::sync::{Arc, Mutex};

mod columns;
mod locks;
mod schema;

pub use schema::SCHEMA_VERSION;

use locks::claim_key;
use postgres::types::{ToSql, Type};
use postgres::{Client, NoTls};

use super::{
    Backend, Direction, Entries, Entry, HeldLock, KeyRange, ReadTables, Refresh, StorageStats,
    Table, WriteTables,
};
use crate::backend::BackendError;
use crate::backend::{ClaimKey, Durability};

/// The advisory lock every write transaction takes (an arbitrary constant:
/// `'uwfwrite'` in ASCII).
pub const WRITER_LOCK: i64 = 0x7577_6677_7269_7465;

/// The advisory lock of a running garbage collection (`'uwf gc'`).
const GC_LOCK: i64 = 0x7577_6620_6763;

/// A key and its value, as fetched.
type Row = (Vec<u8>, Vec<u8>);

/// Rows fetched per round trip of a range scan.
const PAGE: i64 = 512;

/// Idle connections kept for reuse.
const POOL_SIZE: usize = 16;

/// `uwf_<table>`.
pub(super) fn sql_table(table: Table) -> &'static str {
    match table {
        Table::Meta => "uwf_meta",
        Table::Blobs => "uwf_blobs",
        Table::Threads => "uwf_threads",
        Table::History => "uwf_history",
        Table::HistoryIds => "uwf_history_ids",
        Table::Activity => "uwf_activity",
        Table::Children => "uwf_children",
        Table::Workflows => "uwf_workflows",
        Table::Pins => "uwf_pins",
        Table::Labels => "uwf_labels",
    }
}

/// A store in a PostgreSQL database.
pub struct PostgresBackend {
    /// How to connect: the URL's settings plus our keepalive defaults.
    config: postgres::Config,
    /// The URL with any password hidden, for messages.
    location: String,
    durability: Durability,
    idle: Mutex<Vec<Client>>,
    /// Idle connections for claims and the GC lock (`locks.rs`).
    lock_pool: locks::LockPool,
    /// Round trips of this handle's transactions ([`PostgresBackend::round_trips`]).
    round_trips: std::sync::atomic::AtomicU64,
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("location", &self.location)
            .field("durability", &self.durability)
            .finish()
    }
}

/// The URL with the password, if any, replaced by `***`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.split_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

pub(super) fn pg_error(location: &str, op: String, e: postgres::Error) -> BackendError {
    use postgres::error::SqlState;
    match e.code() {
        Some(c)
            if *c == SqlState::T_R_SERIALIZATION_FAILURE
                || *c == SqlState::T_R_DEADLOCK_DETECTED =>
        {
            BackendError::Serialization {
                detail: e.to_string(),
            }
        }
        Some(c) if *c == SqlState::DISK_FULL => BackendError::DiskFull {
            path: location.into(),
        },
        _ => BackendError::Postgres {
            detail: describe(&op, &e),
            op,
            location: location.to_owned(),
            source: e,
        },
    }
}

/// Whether `e` says the connection is gone (closed, terminated by an
/// administrator or a server shutdown, an I/O error on the socket): the
/// transaction in flight is over, and a new connection may well work.
pub(crate) fn connection_lost(e: &postgres::Error) -> bool {
    use postgres::error::SqlState;
    e.is_closed()
        || e.code().is_some_and(|c| {
            [
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
                SqlState::IDLE_SESSION_TIMEOUT,
            ]
            .contains(c)
                || c.code().starts_with("08")
        })
        || (e.as_db_error().is_none()
            && std::error::Error::source(e).is_some_and(|c| c.is::<std::io::Error>()))
}

/// What a PostgreSQL error means, in words: the server's own report
/// (severity, SQLSTATE, message, detail, hint) when it sent one, else
/// the client's cause (a refused or lost connection, a timeout); and, for
/// a connection that went away, what became of the transaction in flight
/// (`op` says whether it was committing).
fn describe(op: &str, e: &postgres::Error) -> String {
    use postgres::error::SqlState;
    let mut text = report(e);
    let code = e.code();
    let lost = connection_lost(e);
    if code == Some(&SqlState::INVALID_CATALOG_NAME) {
        text.push_str("; create the database first (createdb NAME)");
    }
    if lost && op != "connecting" {
        if op.contains("commit") {
            text.push_str(
                "; the connection was lost while the transaction committed: the server may or may \
                 not have applied it (read the thread again to see)",
            );
        } else {
            text.push_str("; the connection was lost: nothing of this transaction was applied");
        }
    } else if code.is_some() {
        text.push_str("; nothing of this transaction was applied");
    }
    text
}

/// Why a lock's connection is gone, in words: the server's report when it
/// sent one (an administrator's `pg_terminate_backend` is `FATAL 57P01`),
/// else that the connection was lost and the driver's cause.
fn lock_lost_detail(e: &postgres::Error) -> String {
    if e.as_db_error().is_some() {
        report(e)
    } else {
        format!("the connection was lost: {}", report(e))
    }
}

/// The server's own report (severity, SQLSTATE, message, detail, hint)
/// when it sent one, else the driver's text and every cause under it.
fn report(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut t = format!(
                "the server said {} {}: {}",
                db.severity(),
                db.code().code(),
                db.message()
            );
            if let Some(d) = db.detail() {
                t.push_str(&format!(" (detail: {d})"));
            }
            if let Some(h) = db.hint() {
                t.push_str(&format!(" (hint: {h})"));
            }
            t
        }
        None => {
            // The driver's own text ("db error", "connection closed", "error
            // connecting to server") and every cause under it.
            let mut t = e.to_string();
            let mut cause = std::error::Error::source(e);
            while let Some(c) = cause {
                t.push_str(&format!(": {c}"));
                cause = c.source();
            }
            t
        }
    }
}

/// The connection settings of `url`, with TCP keepalives (probes after
/// [`locks::KEEPALIVE_IDLE_S`] s, every [`locks::KEEPALIVE_INTERVAL_S`] s,
/// [`locks::KEEPALIVE_COUNT`] of them), a `tcp_user_timeout` of
/// [`locks::TAKEOVER_BOUND_S`] s and a 10 s connect timeout, each unless the
/// URL sets it.
fn client_config(url: &str) -> Result<postgres::Config, postgres::Error> {
    use std::time::Duration;
    let mut config: postgres::Config = url.parse()?;
    let given = |name: &str| url.contains(name);
    if !given("keepalives_idle") {
        config.keepalives_idle(Duration::from_secs(locks::KEEPALIVE_IDLE_S.into()));
    }
    if !given("keepalives_interval") {
        config.keepalives_interval(Duration::from_secs(locks::KEEPALIVE_INTERVAL_S.into()));
    }
    if !given("keepalives_retries") {
        config.keepalives_retries(locks::KEEPALIVE_COUNT);
    }
    if !given("tcp_user_timeout") {
        config.tcp_user_timeout(Duration::from_secs(locks::TAKEOVER_BOUND_S.into()));
    }
    if !given("connect_timeout") {
        config.connect_timeout(Duration::from_secs(10));
    }
    Ok(config)
}

impl PostgresBackend {
    /// Connects to the database at `url`, creating the schema on first use
    /// when `create` (else a database without it is
    /// [`BackendError::NotInitialized`]) and refusing a newer one.
    pub fn connect(
        url: &str,
        durability: Durability,
        create: bool,
    ) -> Result<PostgresBackend, BackendError> {
        let location = redact(url);
        let config =
            client_config(url).map_err(|e| pg_error(&location, "reading the URL".into(), e))?;
        let backend = PostgresBackend {
            config,
            location,
            durability,
            idle: Mutex::new(Vec::new()),
            lock_pool: Arc::new(Mutex::new(Vec::new())),
            round_trips: std::sync::atomic::AtomicU64::new(0),
        };
        backend.migrate(create)?;
        Ok(backend)
    }

    /// Connects with the backend's configuration: the URL's settings,
    /// plus TCP keepalives and a connect timeout unless the URL sets its
    /// own (so a connection to a vanished server fails within
    /// [`locks::TAKEOVER_BOUND_S`] seconds instead of hanging).
    pub(super) fn connect_client(&self) -> Result<Client, BackendError> {
        self.config
            .connect(NoTls)
            .map_err(|e| self.error("connecting".into(), e))
    }

    /// How many round trips this handle's transactions have made to the
    /// server so far (each statement or simple query sent and answered;
    /// claims and the GC lock not counted): a figure for benchmarks and
    /// tests of the statements an operation costs.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn round_trip(&self) {
        self.round_trips
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub(super) fn error(&self, op: String, e: postgres::Error) -> BackendError {
        if connection_lost(&e) {
            // What cut one connection (an administrator's terminate, a
            // server restart or failover) has most likely cut the idle
            // ones too: new connections, not a retry per dead one.
            self.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
        pg_error(&self.location, op, e)
    }

    /// A connection from the pool, or a new one.
    pub(super) fn client(&self) -> Result<Client, BackendError> {
        let reused = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match reused {
            Some(c) if !c.is_closed() => Ok(c),
            _ => self.connect_client(),
        }
    }

    /// Gives a connection back (only one outside any transaction).
    pub(super) fn release(&self, client: Client) {
        if client.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < POOL_SIZE {
            idle.push(client);
        }
    }
}

/// Column `i` of a row, typed; a type that does not match (a schema
/// changed by hand) is a clear error, not a panic.
pub(super) fn column<'r, T: postgres::types::FromSql<'r>>(
    row: &'r postgres::Row,
    i: usize,
    table: Table,
) -> Result<T, BackendError> {
    row.try_get(i).map_err(|e| BackendError::BadSchema {
        table: sql_table(table),
        detail: e.to_string(),
    })
}

/// Held-back SQL past which the overlay is sent before the commit, so a
/// large transaction's memory stays bounded.
const HELD_SQL_LIMIT: usize = 4 << 20;

/// A write held back until the commit (or until something must see it
/// on the server).
#[derive(Debug)]
enum Held {
    /// The key's value becomes this (`put`, or an `insert` known to write).
    Put { value: Vec<u8>, sql: String },
    /// The key is gone (`remove`, or a `delete` known to delete).
    Remove { sql: String },
    /// `insert_or_refresh`: the stored value is not known here.
    Refresh { sql: String },
}

impl Held {
    fn sql(&self) -> &str {
        match self {
            Held::Put { sql, .. } | Held::Remove { sql } | Held::Refresh { sql } => sql,
        }
    }
}

/// What a transaction knows and holds, beside its connection.
#[derive(Default)]
struct TxnState {
    client: Option<Client>,
    /// Whether `BEGIN` has been sent.
    started: bool,
    /// Keys to fetch with `BEGIN` ([`ReadTables::prefetch`]).
    prefetch: Vec<(Table, Vec<u8>)>,
    /// Values read from the server in this transaction (`None`: absent),
    /// valid until this transaction writes the key.
    cache: HashMap<(Table, Vec<u8>), Option<Vec<u8>>>,
    /// Writes not yet sent, one per key, the last one winning.
    held: BTreeMap<(Table, Vec<u8>), Held>,
    /// The held writes' SQL, in bytes.
    held_sql: usize,
}

/// A transaction: its connection, its read cache and its held writes
/// (`docs/design.md` §4b, "Round trips"). Reads take `&self`, so the
/// state is in a `RefCell`.
struct Txn<'b> {
    backend: &'b PostgresBackend,
    /// What `BEGIN` is (isolation, the writer lock, `SET LOCAL`s), sent
    /// with the first statement.
    begin: String,
    state: RefCell<TxnState>,
}

/// `decode('…', 'hex')`: bytes as a `bytea` literal of a simple query.
fn bytea_literal(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(2 * bytes.len() + 20);
    s.push_str("decode('");
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s.push_str("', 'hex')");
    s
}

/// Hex text as sent back by `encode(v, 'hex')`, as bytes.
fn from_hex(text: &str) -> Option<Vec<u8>> {
    let digits = text.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    digits
        .chunks_exact(2)
        .map(|pair| {
            let [hi, lo] = pair else { return None };
            let hi = char::from(*hi).to_digit(16)?;
            let lo = char::from(*lo).to_digit(16)?;
            u8::try_from(hi * 16 + lo).ok()
        })
        .collect()
}

impl Txn<'_> {
    fn lost(&self, op: String) -> BackendError {
        BackendError::ConnectionLost {
            location: self.backend.location.clone(),
            op,
        }
    }

    /// Whether the connection is gone (given up after an error, or closed
    /// under it: terminated by the server, say).
    fn connection_lost(&self) -> bool {
        self.state
            .try_borrow()
            .is_ok_and(|s| s.client.as_ref().is_none_or(Client::is_closed))
    }

    /// Runs `f` on the connection once `BEGIN` (with the prefetch) has
    /// been sent.
    fn with<R>(
        &self,
        op: impl Fn() -> String,
        f: impl FnOnce(&mut Client) -> Result<R, postgres::Error>,
    ) -> Result<R, BackendError> {
        let mut state = self.state.borrow_mut();
        self.start(&mut state, None)?;
        let Some(client) = state.client.as_mut() else {
            return Err(self.lost(op()));
        };
        self.backend.round_trip();
        let out = f(client);
        out.map_err(|e| self.fail(&mut state, op(), e))
    }

    /// The error of a statement; a connection it says is lost is given up
    /// at once, so [`ReadTables::connection_lost`] says so even before the
    /// driver has seen the socket close (a terminated backend's `FATAL`
    /// arrives first), and the write reruns on another connection.
    fn fail(&self, state: &mut TxnState, op: String, e: postgres::Error) -> BackendError {
        if connection_lost(&e) {
            state.client = None;
        }
        self.backend.error(op, e)
    }

    /// Sends `BEGIN` unless it was sent, with the prefetched keys and
    /// `also` read in the same round trip into the cache.
    fn start(
        &self,
        state: &mut TxnState,
        also: Option<(Table, &[&[u8]])>,
    ) -> Result<(), BackendError> {
        if state.started {
            return Ok(());
        }
        let mut keys = std::mem::take(&mut state.prefetch);
        if let Some((table, more)) = also {
            keys.extend(more.iter().map(|k| (table, k.to_vec())));
        }
        keys.sort();
        keys.dedup();
        keys.retain(|key| !state.cache.contains_key(key) && !state.held.contains_key(key));
        let mut sql = self.begin.clone();
        if !keys.is_empty() {
            let selects: Vec<String> = keys
                .iter()
                .enumerate()
                .map(|(i, (table, key))| {
                    format!(
                        "SELECT {i}, encode(v, 'hex') FROM {} WHERE k = {}",
                        sql_table(*table),
                        bytea_literal(key)
                    )
                })
                .collect();
            sql.push_str("; ");
            sql.push_str(&selects.join(" UNION ALL "));
        }
        let Some(client) = state.client.as_mut() else {
            return Err(self.lost("starting a transaction".into()));
        };
        self.backend.round_trip();
        let sent = client.simple_query(&sql);
        let messages = sent.map_err(|e| self.fail(state, "starting a transaction".into(), e))?;
        state.started = true;
        let mut found: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
        for message in &messages {
            let postgres::SimpleQueryMessage::Row(row) = message else {
                continue;
            };
            // The writer lock's `SELECT` returns one column; ours two.
            if row.len() != 2 {
                continue;
            }
            let bad = || BackendError::BadSchema {
                table: "a prefetch",
                detail: "a row that is not an index and hex bytes".into(),
            };
            let slot = row
                .get(0)
                .and_then(|i| i.parse::<usize>().ok())
                .and_then(|i| found.get_mut(i))
                .ok_or_else(bad)?;
            *slot = Some(row.get(1).and_then(from_hex).ok_or_else(bad)?);
        }
        state.cache.extend(keys.into_iter().zip(found));
        Ok(())
    }

    /// Sends the held writes (and `then`, say `COMMIT`) as one simple
    /// query; they become cached values.
    fn send_held(&self, state: &mut TxnState, then: &str) -> Result<(), BackendError> {
        let mut sql = String::with_capacity(state.held_sql + then.len() + 200);
        if !state.started {
            sql.push_str(&self.begin);
            sql.push_str("; ");
        }
        for held in state.held.values() {
            sql.push_str(held.sql());
            sql.push_str("; ");
        }
        sql.push_str(then);
        if sql.trim().is_empty() {
            return Ok(());
        }
        let Some(client) = state.client.as_mut() else {
            return Err(self.lost("writing".into()));
        };
        self.backend.round_trip();
        let sent = client.batch_execute(&sql);
        sent.map_err(|e| {
            let op = Self::held_op(&state.held);
            self.fail(state, op, e)
        })?;
        state.started = true;
        state.held_sql = 0;
        for (key, held) in std::mem::take(&mut state.held) {
            match held {
                Held::Put { value, .. } => state.cache.insert(key, Some(value)),
                Held::Remove { .. } => state.cache.insert(key, None),
                Held::Refresh { .. } => state.cache.remove(&key),
            };
        }
        Ok(())
    }

    /// What a failed send of held writes was doing, for its message.
    fn held_op(held: &BTreeMap<(Table, Vec<u8>), Held>) -> String {
        let mut tables: Vec<&str> = held.keys().map(|(t, _)| t.name()).collect();
        tables.dedup();
        if tables.is_empty() {
            "committing".into()
        } else {
            format!("writing {} (sent with the commit)", tables.join(", "))
        }
    }

    /// Sends the held writes first if any is in `table` (`key`: only one
    /// held as a refresh of that key), so the server's answer includes
    /// them.
    fn send_held_for(
        &self,
        state: &mut TxnState,
        table: Table,
        key: Option<&[u8]>,
    ) -> Result<(), BackendError> {
        let needed = match key {
            Some(key) => matches!(
                state.held.get(&(table, key.to_vec())),
                Some(Held::Refresh { .. })
            ),
            None => state.held.keys().any(|(t, _)| *t == table),
        };
        if needed {
            self.send_held(state, "")?;
        }
        Ok(())
    }

    /// What this transaction knows of `key` without asking the server:
    /// `Some(value or absence)`, or `None` when it must ask.
    fn known(state: &TxnState, table: Table, key: &[u8]) -> Option<Option<Vec<u8>>> {
        let k = (table, key.to_vec());
        match state.held.get(&k) {
            Some(Held::Put { value, .. }) => return Some(Some(value.clone())),
            Some(Held::Remove { .. }) => return Some(None),
            Some(Held::Refresh { .. }) => return None,
            None => {}
        }
        state.cache.get(&k).cloned()
    }

    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Cow<'static, [u8]>>, BackendError> {
        {
            let mut state = self.state.borrow_mut();
            self.send_held_for(&mut state, table, Some(key))?;
            if let Some(known) = Self::known(&state, table, key) {
                return Ok(known.map(Cow::Owned));
            }
            if !state.started {
                self.start(&mut state, Some((table, &[key])))?;
                if let Some(known) = Self::known(&state, table, key) {
                    return Ok(known.map(Cow::Owned));
                }
            }
        }
        let sql = format!("SELECT v FROM {} WHERE k = $1", sql_table(table));
        let rows = self.with(
            || format!("reading {table}"),
            |c| c.query_typed(&sql, &[(&key, Type::BYTEA)]),
        )?;
        rows.first()
            .map(|r| column(r, 0, table).map(Cow::Owned))
            .transpose()
    }

    fn get_many(
        &self,
        table: Table,
        keys: &[&[u8]],
    ) -> Result<Vec<Option<Cow<'static, [u8]>>>, BackendError> {
        let mut state = self.state.borrow_mut();
        for key in keys {
            self.send_held_for(&mut state, table, Some(key))?;
        }
        if !state.started {
            self.start(&mut state, Some((table, keys)))?;
        }
        let missing: Vec<&[u8]> = keys
            .iter()
            .copied()
            .filter(|key| Self::known(&state, table, key).is_none())
            .collect();
        if !missing.is_empty() {
            let sql = format!("SELECT k, v FROM {} WHERE k = ANY($1)", sql_table(table));
            let Some(client) = state.client.as_mut() else {
                return Err(self.lost(format!("reading {table}")));
            };
            self.backend.round_trip();
            let read = client.query_typed(&sql, &[(&missing, Type::BYTEA_ARRAY)]);
            let rows = read.map_err(|e| self.fail(&mut state, format!("reading {table}"), e))?;
            for key in &missing {
                state.cache.insert((table, key.to_vec()), None);
            }
            for row in &rows {
                let (k, v): (Vec<u8>, Vec<u8>) = (column(row, 0, table)?, column(row, 1, table)?);
                state.cache.insert((table, k), Some(v));
            }
        }
        Ok(keys
            .iter()
            .map(|key| Self::known(&state, table, key).flatten().map(Cow::Owned))
            .collect())
    }

    fn page(
        &self,
        table: Table,
        lower: &Bound<Vec<u8>>,
        upper: &Bound<Vec<u8>>,
        direction: Direction,
    ) -> Result<Vec<Row>, BackendError> {
        self.send_held_for(&mut self.state.borrow_mut(), table, None)?;
        let mut sql = format!("SELECT k, v FROM {} WHERE true", sql_table(table));
        let mut params: Vec<(&(dyn ToSql + Sync), Type)> = Vec::new();
        for (bound, inclusive, exclusive) in [(lower, ">=", ">"), (upper, "<=", "<")] {
            let (op, key) = match bound {
                Bound::Included(k) => (inclusive, k),
                Bound::Excluded(k) => (exclusive, k),
                Bound::Unbounded => continue,
            };
            params.push((key, Type::BYTEA));
            sql.push_str(&format!(" AND k {op} ${}", params.len()));
        }
        sql.push_str(match direction {
            Direction::Forward => " ORDER BY k ASC",
            Direction::Reverse => " ORDER BY k DESC",
        });
        sql.push_str(&format!(" LIMIT {PAGE}"));
        let rows = self.with(
            || format!("scanning {table}"),
            |c| c.query_typed(&sql, &params),
        )?;
        rows.iter()
            .map(|r| Ok((column(r, 0, table)?, column(r, 1, table)?)))
            .collect()
    }

    fn count(&self, table: Table) -> Result<u64, BackendError> {
        self.send_held_for(&mut self.state.borrow_mut(), table, None)?;
        let sql = format!("SELECT count(*) FROM {}", sql_table(table));
        let rows = self.with(|| format!("counting {table}"), |c| c.query_typed(&sql, &[]))?;
        let n: i64 = rows.first().map_or(Ok(0), |r| column(r, 0, table))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Ends the transaction: `end` (`COMMIT`) after the held writes, in
    /// one round trip; nothing at all when nothing was sent or held. The
    /// connection goes back to the pool when it ended cleanly.
    fn finish(&self, end: &str) -> Result<(), BackendError> {
        let mut state = self.state.borrow_mut();
        let outcome = if !state.started && state.held.is_empty() {
            Ok(())
        } else {
            self.send_held(&mut state, end)
        };
        if let Some(client) = state.client.take()
            && outcome.is_ok()
        {
            self.backend.release(client);
        }
        outcome
    }
}

impl Drop for Txn<'_> {
    fn drop(&mut self) {
        // Not committed: roll back what was sent (held writes are simply
        // forgotten). A connection that cannot is dropped.
        let mut state = self.state.borrow_mut();
        let Some(mut client) = state.client.take() else {
            return;
        };
        if !state.started {
            self.backend.release(client);
            return;
        }
        self.backend.round_trip();
        if client.batch_execute("ROLLBACK").is_ok() {
            self.backend.release(client);
        }
    }
}

/// Pages through a range, one round trip per [`PAGE`] rows.
struct Pages<'t> {
    txn: &'t Txn<'t>,
    table: Table,
    lower: Bound<Vec<u8>>,
    upper: Bound<Vec<u8>>,
    direction: Direction,
    buffered: std::vec::IntoIter<Row>,
    done: bool,
}

impl<'t> Iterator for Pages<'t> {
    type Item = Result<Entry<'t>, BackendError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some((k, v)) = self.buffered.next() {
            return Some(Ok((Cow::Owned(k), Cow::Owned(v))));
        }
        if self.done {
            return None;
        }
        let page = match self
            .txn
            .page(self.table, &self.lower, &self.upper, self.direction)
        {
            Ok(p) => p,
            Err(e) => {
                self.done = true;
                return Some(Err(e));
            }
        };
        if page.len() < usize::try_from(PAGE).unwrap_or(usize::MAX) {
            self.done = true;
        }
        if let Some((last, _)) = page.last() {
            // The next page starts after the last key seen.
            match self.direction {
                Direction::Forward => self.lower = Bound::Excluded(last.clone()),
                Direction::Reverse => self.upper = Bound::Excluded(last.clone()),
            }
        }
        self.buffered = page.into_iter();
        self.buffered
            .next()
            .map(|(k, v)| Ok((Cow::Owned(k), Cow::Owned(v))))
    }
}

fn owned_bound(b: Bound<&[u8]>) -> Bound<Vec<u8>> {
    match b {
        Bound::Included(k) => Bound::Included(k.to_vec()),
        Bound::Excluded(k) => Bound::Excluded(k.to_vec()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

macro_rules! pg_reads {
    ($txn:ident) => {
        impl ReadTables for $txn<'_> {
            fn connection_lost(&self) -> bool {
                self.0.connection_lost()
            }

            fn get(&self, table: Table, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>, BackendError> {
                self.0.get(table, key)
            }

            fn range(
                &self,
                table: Table,
                range: KeyRange<'_>,
                direction: Direction,
            ) -> Result<Entries<'_>, BackendError> {
                Ok(Box::new(Pages {
                    txn: &self.0,
                    table,
                    lower: owned_bound(range.lower),
                    upper: owned_bound(range.upper),
                    direction,
                    buffered: Vec::new().into_iter(),
                    done: false,
                }))
            }

            fn count(&self, table: Table) -> Result<u64, BackendError> {
                self.0.count(table)
            }

            fn prefetch(&self, keys: &[(Table, &[u8])]) -> Result<(), BackendError> {
                let mut state = self.0.state.borrow_mut();
                if !state.started {
                    state
                        .prefetch
                        .extend(keys.iter().map(|(t, k)| (*t, k.to_vec())));
                }
                Ok(())
            }

            fn prefers_batches(&self) -> bool {
                true
            }

            fn get_many(
                &self,
                table: Table,
                keys: &[&[u8]],
            ) -> Result<Vec<Option<Cow<'_, [u8]>>>, BackendError> {
                self.0.get_many(table, keys)
            }
        }
    };
}

struct PgRead<'b>(Txn<'b>);
struct PgWrite<'b>(Txn<'b>);

pg_reads!(PgRead);
pg_reads!(PgWrite);

impl PgWrite<'_> {
    /// Runs a write statement now; returns the rows it returned. The key's
    /// cached value is forgotten (`insert`, `delete` set it after).
    fn now(
        &self,
        op: &str,
        table: Table,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<usize, BackendError> {
        self.0
            .with(|| format!("{op} {table}"), |c| c.query_typed(sql, params))
            .map(|rows| rows.len())
    }

    /// The statement that writes a row (`replace`: over an existing one,
    /// else `DO NOTHING RETURNING 1`), with literal values, for a held
    /// write. The thread tables' typed columns are filled from `value`
    /// ([`columns`]).
    fn literal_write(
        table: Table,
        key: &[u8],
        value: &[u8],
        replace: bool,
    ) -> Result<String, BackendError> {
        let mut names = String::new();
        let mut values = String::new();
        let mut updates = String::new();
        if columns::has_columns(table) {
            let typed = columns::ThreadColumns::of(table, key, value)?;
            for (column, literal) in columns::columns_of(table).zip(typed.literals(table)) {
                names.push_str(", ");
                names.push_str(column.name);
                values.push_str(", ");
                values.push_str(&literal);
                updates.push_str(&format!(", {0} = EXCLUDED.{0}", column.name));
            }
        }
        let conflict = if replace {
            format!("DO UPDATE SET v = EXCLUDED.v{updates}")
        } else {
            "DO NOTHING".into()
        };
        Ok(format!(
            "INSERT INTO {} (k, v{names}) VALUES ({}, {}{values}) ON CONFLICT (k) {conflict}",
            sql_table(table),
            bytea_literal(key),
            bytea_literal(value),
        ))
    }

    /// Holds a write back until the commit (sending the held writes first
    /// when they pass [`HELD_SQL_LIMIT`]).
    fn hold(&mut self, table: Table, key: &[u8], held: Held) -> Result<(), BackendError> {
        let state = self.0.state.get_mut();
        let added = held.sql().len();
        if let Some(old) = state.held.insert((table, key.to_vec()), held) {
            state.held_sql -= old.sql().len().min(state.held_sql);
        }
        state.cache.remove(&(table, key.to_vec()));
        state.held_sql += added;
        if state.held_sql > HELD_SQL_LIMIT {
            let mut state = self.0.state.borrow_mut();
            self.0.send_held(&mut state, "")?;
        }
        Ok(())
    }

    fn hold_put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), BackendError> {
        let sql = Self::literal_write(table, key, value, true)?;
        self.hold(
            table,
            key,
            Held::Put {
                value: value.to_vec(),
                sql,
            },
        )
    }

    /// What the transaction knows of `key` (held or cached), after sending
    /// a held refresh of it.
    fn known(&mut self, table: Table, key: &[u8]) -> Result<Option<Option<Vec<u8>>>, BackendError> {
        let mut state = self.0.state.borrow_mut();
        self.0.send_held_for(&mut state, table, Some(key))?;
        Ok(Txn::known(&state, table, key))
    }

    fn forget(&mut self, table: Table, key: &[u8]) {
        self.0.state.get_mut().cache.remove(&(table, key.to_vec()));
    }
}

impl WriteTables for PgWrite<'_> {
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), BackendError> {
        self.hold_put(table, key, value)
    }

    fn insert(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<bool, BackendError> {
        match self.known(table, key)? {
            Some(Some(_)) => return Ok(false),
            // Known absent: the writer lock keeps it so until the commit.
            Some(None) => return self.hold_put(table, key, value).map(|()| true),
            None => {}
        }
        let mut params: Vec<(&(dyn ToSql + Sync), Type)> =
            vec![(&key, Type::BYTEA), (&value, Type::BYTEA)];
        let typed;
        let sql = if columns::has_columns(table) {
            typed = columns::ThreadColumns::of(table, key, value)?;
            params.extend(typed.params(table));
            columns::write_sql(table, false)
        } else {
            format!(
                "INSERT INTO {} (k, v) VALUES ($1, $2) ON CONFLICT (k) DO NOTHING RETURNING 1",
                sql_table(table)
            )
        };
        let wrote = self.now("writing", table, &sql, &params)? == 1;
        self.forget(table, key);
        if wrote {
            self.0
                .state
                .get_mut()
                .cache
                .insert((table, key.to_vec()), Some(value.to_vec()));
        }
        Ok(wrote)
    }

    fn delete(&mut self, table: Table, key: &[u8]) -> Result<bool, BackendError> {
        match self.known(table, key)? {
            Some(Some(_)) => {
                self.remove(table, key)?;
                return Ok(true);
            }
            Some(None) => return Ok(false),
            None => {}
        }
        let sql = format!("DELETE FROM {} WHERE k = $1 RETURNING 1", sql_table(table));
        let deleted = self.now("deleting from", table, &sql, &[(&key, Type::BYTEA)])? == 1;
        self.0
            .state
            .get_mut()
            .cache
            .insert((table, key.to_vec()), None);
        Ok(deleted)
    }

    fn remove(&mut self, table: Table, key: &[u8]) -> Result<(), BackendError> {
        let sql = format!(
            "DELETE FROM {} WHERE k = {}",
            sql_table(table),
            bytea_literal(key)
        );
        self.hold(table, key, Held::Remove { sql })
    }

    fn insert_or_refresh(
        &mut self,
        table: Table,
        key: &[u8],
        value: &[u8],
        refresh: Refresh,
    ) -> Result<(), BackendError> {
        match self.known(table, key)? {
            // Known absent: an insert.
            Some(None) => return self.hold_put(table, key, value),
            // Known stored: refresh it here.
            Some(Some(stored)) => {
                return match refresh.apply(&stored) {
                    Some(new) => self.hold_put(table, key, &new),
                    None => Ok(()),
                };
            }
            None => {}
        }
        if columns::has_columns(table) {
            // Not a blob table: no held form; the boundary's default.
            return super::insert_then_refresh(self, table, key, value, refresh);
        }
        let name = sql_table(table);
        let (from, end) = (refresh.offset + 1, refresh.offset + 8);
        let sql = format!(
            "INSERT INTO {name} (k, v) VALUES ({}, {}) ON CONFLICT (k) DO UPDATE \
             SET v = overlay({name}.v PLACING {} FROM {from} FOR 8) \
             WHERE length({name}.v) >= {end} AND substring({name}.v FROM {from} FOR 8) < {}",
            bytea_literal(key),
            bytea_literal(value),
            bytea_literal(&refresh.stamp.to_be_bytes()),
            bytea_literal(&refresh.below.to_be_bytes()),
        );
        self.hold(table, key, Held::Refresh { sql })
    }

    fn commit(self: Box<Self>) -> Result<(), BackendError> {
        self.0.finish("COMMIT")
    }
}

impl fmt::Debug for Txn<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Txn")
    }
}

impl PostgresBackend {
    /// A transaction that sends `begin` with its first statement.
    fn begin(&self, begin: String) -> Result<Txn<'_>, BackendError> {
        Ok(Txn {
            backend: self,
            begin,
            state: RefCell::new(TxnState {
                client: Some(self.client()?),
                ..TxnState::default()
            }),
        })
    }
}

impl Backend for PostgresBackend {
    fn begin_read(&self) -> Result<Box<dyn ReadTables + '_>, BackendError> {
        Ok(Box::new(PgRead(self.begin(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY".into(),
        )?)))
    }

    fn begin_write(&self) -> Result<Box<dyn WriteTables + '_>, BackendError> {
        // `SET LOCAL`, not a session setting, so nothing leaks to other
        // clients of a pooled server connection.
        let relaxed = match self.durability {
            Durability::None => "SET LOCAL synchronous_commit = off; ",
            _ => "",
        };
        Ok(Box::new(PgWrite(self.begin(format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; {relaxed}SELECT pg_advisory_xact_lock({WRITER_LOCK})"
        ))?)))
    }

    fn location(&self) -> &str {
        &self.location
    }

    fn dir(&self) -> Option<&std::path::Path> {
        None
    }

    fn durability(&self) -> Durability {
        self.durability
    }

    fn try_lock_claim(&self, id: ClaimKey) -> Result<Option<Box<dyn HeldLock>>, BackendError> {
        self.try_advisory(claim_key(id))
    }

    fn claim_locked(&self, id: ClaimKey) -> Result<bool, BackendError> {
        // Held by any session, this backend's own included.
        let mut client = self.client()?;
        let rows = client
            .query_typed(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND ((classid::bigint << 32) | objid::bigint) = $1 AND objsubid = 1",
                &[(&claim_key(id), Type::INT8)],
            )
            .map_err(|e| self.error("probing a claim".into(), e))?;
        self.release(client);
        let n: i64 = rows.first().map_or(Ok(0), |r| column(r, 0, Table::Meta))?;
        Ok(n > 0)
    }

    fn claims_locked(&self, ids: &[ClaimKey]) -> Result<Vec<bool>, BackendError> {
        if ids.len() < 2 {
            return ids.iter().map(|&id| self.claim_locked(id)).collect();
        }
        // Every advisory lock held in this database, in one query.
        let mut client = self.client()?;
        let rows = client
            .query_typed(
                "SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks \
                 WHERE locktype = 'advisory' AND granted AND objsubid = 1 \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[],
            )
            .map_err(|e| self.error("probing claims".into(), e))?;
        self.release(client);
        let held = rows
            .iter()
            .map(|r| column::<i64>(r, 0, Table::Meta))
            .collect::<Result<std::collections::HashSet<i64>, _>>()?;
        Ok(ids
            .iter()
            .map(|&id| held.contains(&claim_key(id)))
            .collect())
    }

    fn try_lock_gc(&self) -> Result<Option<Box<dyn HeldLock>>, BackendError> {
        self.try_advisory(GC_LOCK)
    }

    fn storage_stats(&self) -> Result<StorageStats, BackendError> {
        let mut client = self.client()?;
        let rows = client
            .query_typed("SELECT pg_total_relation_size('uwf_blobs')", &[])
            .map_err(|e| self.error("reading statistics".into(), e))?;
        self.release(client);
        let bytes: i64 = rows.first().map_or(Ok(0), |r| column(r, 0, Table::Blobs))?;
        Ok(StorageStats {
            blob_bytes: u64::try_from(bytes).unwrap_or(0),
            ..StorageStats::default()
        })
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

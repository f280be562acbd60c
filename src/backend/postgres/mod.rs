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
//! [`StoreError::Serialization`] (the store re-runs the transaction); any
//! other error, a lost connection included, fails the transaction in
//! flight with nothing applied, and that connection is dropped rather than
//! returned to the pool.
//!
//! **Locks.** Claims and the GC lock are session advisory locks held by one
//! connection of this backend; PostgreSQL releases them when that session
//! ends (the process exits or dies, or its connection is lost).

use std::borrow::Cow;
use std::cell::RefCell;
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
    Backend, Direction, Entries, Entry, HeldLock, KeyRange, ReadTables, StorageStats, Table,
    WriteTables,
};
use crate::store::{Durability, StoreError};
use crate::thread::ThreadId;

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

pub(super) fn pg_error(location: &str, op: String, e: postgres::Error) -> StoreError {
    use postgres::error::SqlState;
    match e.code() {
        Some(c)
            if *c == SqlState::T_R_SERIALIZATION_FAILURE
                || *c == SqlState::T_R_DEADLOCK_DETECTED =>
        {
            StoreError::Serialization {
                detail: e.to_string(),
            }
        }
        Some(c) if *c == SqlState::DISK_FULL => StoreError::DiskFull {
            path: location.into(),
        },
        _ => StoreError::Postgres {
            op,
            location: location.to_owned(),
            source: e,
        },
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
    /// [`StoreError::NotInitialized`]) and refusing a newer one.
    pub fn connect(
        url: &str,
        durability: Durability,
        create: bool,
    ) -> Result<PostgresBackend, StoreError> {
        let location = redact(url);
        let config =
            client_config(url).map_err(|e| pg_error(&location, "reading the URL".into(), e))?;
        let backend = PostgresBackend {
            config,
            location,
            durability,
            idle: Mutex::new(Vec::new()),
            lock_pool: Arc::new(Mutex::new(Vec::new())),
        };
        backend.migrate(create)?;
        Ok(backend)
    }

    /// Connects with the backend's configuration: the URL's settings,
    /// plus TCP keepalives and a connect timeout unless the URL sets its
    /// own (so a connection to a vanished server fails within
    /// [`locks::TAKEOVER_BOUND_S`] seconds instead of hanging).
    pub(super) fn connect_client(&self) -> Result<Client, StoreError> {
        self.config
            .connect(NoTls)
            .map_err(|e| self.error("connecting".into(), e))
    }

    pub(super) fn error(&self, op: String, e: postgres::Error) -> StoreError {
        pg_error(&self.location, op, e)
    }

    /// A connection from the pool, or a new one.
    pub(super) fn client(&self) -> Result<Client, StoreError> {
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
) -> Result<T, StoreError> {
    row.try_get(i).map_err(|e| StoreError::BadSchema {
        table: sql_table(table),
        detail: e.to_string(),
    })
}

/// A transaction's connection, shared by its reads (which take `&self`).
struct Txn<'b> {
    backend: &'b PostgresBackend,
    client: RefCell<Option<Client>>,
}

impl Txn<'_> {
    fn with<R>(
        &self,
        op: impl Fn() -> String,
        f: impl FnOnce(&mut Client) -> Result<R, postgres::Error>,
    ) -> Result<R, StoreError> {
        let mut slot = self.client.borrow_mut();
        let Some(client) = slot.as_mut() else {
            return Err(StoreError::ConnectionLost {
                location: self.backend.location.clone(),
                op: op(),
            });
        };
        f(client).map_err(|e| self.backend.error(op(), e))
    }

    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Cow<'static, [u8]>>, StoreError> {
        let sql = format!("SELECT v FROM {} WHERE k = $1", sql_table(table));
        let rows = self.with(
            || format!("reading {table}"),
            |c| c.query_typed(&sql, &[(&key, Type::BYTEA)]),
        )?;
        rows.first()
            .map(|r| column(r, 0, table).map(Cow::Owned))
            .transpose()
    }

    fn page(
        &self,
        table: Table,
        lower: &Bound<Vec<u8>>,
        upper: &Bound<Vec<u8>>,
        direction: Direction,
    ) -> Result<Vec<Row>, StoreError> {
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

    fn count(&self, table: Table) -> Result<u64, StoreError> {
        let sql = format!("SELECT count(*) FROM {}", sql_table(table));
        let rows = self.with(|| format!("counting {table}"), |c| c.query_typed(&sql, &[]))?;
        let n: i64 = rows.first().map_or(Ok(0), |r| column(r, 0, table))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Ends the transaction; the connection goes back to the pool when it
    /// ended cleanly.
    fn finish(&self, sql: &str) -> Result<(), StoreError> {
        let outcome = self.with(|| "ending a transaction".into(), |c| c.batch_execute(sql));
        if let Some(client) = self.client.borrow_mut().take()
            && outcome.is_ok()
        {
            self.backend.release(client);
        }
        outcome
    }
}

impl Drop for Txn<'_> {
    fn drop(&mut self) {
        // Not committed: roll back. A connection that cannot is dropped.
        if self.client.borrow().is_some() {
            let _ = self.finish("ROLLBACK");
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
    type Item = Result<Entry<'t>, StoreError>;

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
            fn get(&self, table: Table, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>, StoreError> {
                self.0.get(table, key)
            }

            fn range(
                &self,
                table: Table,
                range: KeyRange<'_>,
                direction: Direction,
            ) -> Result<Entries<'_>, StoreError> {
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

            fn count(&self, table: Table) -> Result<u64, StoreError> {
                self.0.count(table)
            }
        }
    };
}

struct PgRead<'b>(Txn<'b>);
struct PgWrite<'b>(Txn<'b>);

pg_reads!(PgRead);
pg_reads!(PgWrite);

impl PgWrite<'_> {
    fn rows(
        &self,
        op: &str,
        table: Table,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<usize, StoreError> {
        self.0
            .with(|| format!("{op} {table}"), |c| c.query_typed(sql, params))
            .map(|rows| rows.len())
    }
}

impl PgWrite<'_> {
    /// Writes a row; `replace` overwrites an existing one (`put`), else an
    /// existing row is kept (`insert`). Returns the rows the statement
    /// returned (`insert`: 1 when it wrote). The thread tables' typed
    /// columns are filled from `value` ([`columns`]).
    fn write(
        &self,
        table: Table,
        key: &[u8],
        value: &[u8],
        replace: bool,
    ) -> Result<usize, StoreError> {
        let mut params: Vec<(&(dyn ToSql + Sync), Type)> =
            vec![(&key, Type::BYTEA), (&value, Type::BYTEA)];
        if !columns::has_columns(table) {
            let sql = if replace {
                format!(
                    "INSERT INTO {} (k, v) VALUES ($1, $2) \
                     ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
                    sql_table(table)
                )
            } else {
                format!(
                    "INSERT INTO {} (k, v) VALUES ($1, $2) ON CONFLICT (k) DO NOTHING RETURNING 1",
                    sql_table(table)
                )
            };
            return self.rows("writing", table, &sql, &params);
        }
        let typed = columns::ThreadColumns::of(table, key, value)?;
        params.extend(typed.params(table));
        self.rows(
            "writing",
            table,
            &columns::write_sql(table, replace),
            &params,
        )
    }
}

impl WriteTables for PgWrite<'_> {
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.write(table, key, value, true).map(|_| ())
    }

    fn insert(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<bool, StoreError> {
        self.write(table, key, value, false).map(|n| n == 1)
    }

    fn delete(&mut self, table: Table, key: &[u8]) -> Result<bool, StoreError> {
        let sql = format!("DELETE FROM {} WHERE k = $1 RETURNING 1", sql_table(table));
        self.rows("deleting from", table, &sql, &[(&key, Type::BYTEA)])
            .map(|n| n == 1)
    }

    fn commit(self: Box<Self>) -> Result<(), StoreError> {
        self.0.finish("COMMIT")
    }
}

impl fmt::Debug for Txn<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Txn")
    }
}

impl PostgresBackend {
    fn begin(&self, sql: &str) -> Result<Txn<'_>, StoreError> {
        let mut client = self.client()?;
        client
            .batch_execute(sql)
            .map_err(|e| self.error("starting a transaction".into(), e))?;
        Ok(Txn {
            backend: self,
            client: RefCell::new(Some(client)),
        })
    }
}

impl Backend for PostgresBackend {
    fn begin_read(&self) -> Result<Box<dyn ReadTables + '_>, StoreError> {
        Ok(Box::new(PgRead(self.begin(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
        )?)))
    }

    fn begin_write(&self) -> Result<Box<dyn WriteTables + '_>, StoreError> {
        // `SET LOCAL`, not a session setting, so nothing leaks to other
        // clients of a pooled server connection.
        let relaxed = match self.durability {
            Durability::None => "SET LOCAL synchronous_commit = off; ",
            _ => "",
        };
        Ok(Box::new(PgWrite(self.begin(&format!(
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

    fn try_lock_claim(&self, id: ThreadId) -> Result<Option<Box<dyn HeldLock>>, StoreError> {
        self.try_advisory(claim_key(id))
    }

    fn claim_locked(&self, id: ThreadId) -> Result<bool, StoreError> {
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

    fn claims_locked(&self, ids: &[ThreadId]) -> Result<Vec<bool>, StoreError> {
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

    fn try_lock_gc(&self) -> Result<Option<Box<dyn HeldLock>>, StoreError> {
        self.try_advisory(GC_LOCK)
    }

    fn storage_stats(&self) -> Result<StorageStats, StoreError> {
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

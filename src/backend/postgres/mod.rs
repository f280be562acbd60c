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
//! **Isolation.** A write transaction runs at `READ COMMITTED`, takes the
//! store barrier ([`WRITER_LOCK`]) in shared mode with its `BEGIN` (a
//! collection's marker and sweep take it exclusively), and takes a
//! thread's order lock before it reads the thread's record: writers of
//! different threads run in parallel, two of one thread are ordered, and
//! the engine's compare-and-swap works unchanged (`docs/design.md` §8f). A
//! read transaction is `REPEATABLE READ READ ONLY`: one snapshot.
//!
//! **Statements.** A transaction is a few simple queries, one round trip
//! each. The hot statements — a group's locks and reads, its writes, a
//! thread's record — are named prepared statements whose rows are arrays
//! (`prepared.rs`): prepared once per connection and then only executed,
//! so the server neither parses nor plans them again. A server that does
//! not keep them between transactions (a pooler in transaction mode)
//! turns them off, and they are sent in full. The rest are unnamed
//! statements (`query_typed`).
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
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Bound;
use std::sync::Arc;

mod columns;
mod error;
mod locks;
mod pool;
mod prepared;
mod schema;
mod txn;
mod write;

pub(crate) use error::connection_lost;
use error::*;
use txn::*;

pub use locks::CHECK_TRUSTS;
pub use pool::DEFAULT_CONNECTIONS;
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

/// The store barrier (an arbitrary constant: `'uwfwrite'` in ASCII): every
/// write transaction takes this advisory lock in shared mode, so writers
/// never wait for each other on it; the few transactions that must not
/// interleave with any writer (a garbage collection's marker and sweep,
/// the retention policy, a copy's marker, a migration) take it exclusively
/// ([`Backend::begin_write_exclusive`]; `docs/design.md` §8f).
pub const WRITER_LOCK: i64 = 0x7577_6677_7269_7465;

/// The advisory lock of a running garbage collection (`'uwf gc'`).
const GC_LOCK: i64 = 0x7577_6620_6763;

/// A key and its value, as fetched.
type Row = (Vec<u8>, Vec<u8>);

/// Rows fetched per round trip of a range scan.
const PAGE: i64 = 512;

/// The first pause before asking again a server that has too many
/// connections.
pub const CONNECT_BACKOFF_FIRST: std::time::Duration = std::time::Duration::from_millis(50);
/// The longest pause between two such attempts.
pub const CONNECT_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(2);
/// How long a connection is waited for before the caller fails.
pub const CONNECT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether the server refused the connection for having too many
/// (SQLSTATE 53300: `max_connections`, or a role's or database's limit).
fn too_many_connections(e: &postgres::Error) -> bool {
    e.code() == Some(&postgres::error::SqlState::TOO_MANY_CONNECTIONS)
}

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
    /// The transactions' connections, at most `--pg-connections`.
    pool: Arc<pool::Pool>,
    /// The session that holds this handle's claims and GC lock (`locks.rs`).
    locks: locks::LockSession,
    /// Round trips of this handle's transactions ([`PostgresBackend::round_trips`]).
    round_trips: std::sync::atomic::AtomicU64,
    /// Whether the hot statements are sent as prepared statements
    /// (`prepared.rs`): until the server is found not to keep them.
    prepares: std::sync::atomic::AtomicBool,
    /// Connection attempts refused for too many clients and retried.
    connect_waits: std::sync::atomic::AtomicU64,
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("location", &self.location)
            .field("durability", &self.durability)
            .finish()
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
        Self::connect_with(url, durability, create, DEFAULT_CONNECTIONS)
    }

    /// [`PostgresBackend::connect`] with at most `connections` connections
    /// for transactions (at least one; [`DEFAULT_CONNECTIONS`] when not
    /// told), plus one that holds this handle's claims: the connections a
    /// runner opens do not grow with its drivers.
    pub fn connect_with(
        url: &str,
        durability: Durability,
        create: bool,
        connections: usize,
    ) -> Result<PostgresBackend, BackendError> {
        let location = redact(url);
        let config =
            client_config(url).map_err(|e| pg_error(&location, "reading the URL".into(), e))?;
        let backend = PostgresBackend {
            config,
            location,
            durability,
            pool: pool::Pool::new(connections),
            locks: locks::LockSession::default(),
            round_trips: std::sync::atomic::AtomicU64::new(0),
            prepares: std::sync::atomic::AtomicBool::new(true),
            connect_waits: std::sync::atomic::AtomicU64::new(0),
        };
        backend.migrate(create)?;
        Ok(backend)
    }

    /// Connects with the backend's configuration: the URL's settings,
    /// plus TCP keepalives and a connect timeout unless the URL sets its
    /// own (so a connection to a vanished server fails within
    /// [`locks::TAKEOVER_BOUND_S`] seconds instead of hanging).
    ///
    /// A server that refuses the connection because it has too many
    /// (`max_connections`, a role's or database's connection limit:
    /// SQLSTATE 53300) is asked again with backoff, from
    /// [`CONNECT_BACKOFF_FIRST`] doubling to [`CONNECT_BACKOFF_MAX`], for up
    /// to [`CONNECT_PATIENCE`]: a runner waits for a connection rather than
    /// fail a thread for want of one. The error after that says how long it
    /// waited.
    ///
    /// A connection `reuse` gives is taken instead whenever it has one:
    /// while the server refuses new connections, one this process gives
    /// back to its pool (its own idle connections count against the limit)
    /// ends the wait.
    pub(super) fn connect_or_reuse<T>(
        &self,
        reuse: impl Fn() -> Option<T>,
    ) -> Result<Reused<T>, BackendError> {
        let started = std::time::Instant::now();
        let mut pause = CONNECT_BACKOFF_FIRST;
        let mut first = true;
        loop {
            // The first attempt connects: `reuse` is for the wait.
            if !first && let Some(reused) = reuse() {
                return Ok(Reused::Pooled(reused));
            }
            first = false;
            match self.config.connect(NoTls) {
                Ok(client) => return Ok(Reused::Fresh(Box::new(client))),
                Err(e) if too_many_connections(&e) && started.elapsed() < CONNECT_PATIENCE => {
                    let waits = self
                        .connect_waits
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if waits.is_multiple_of(100) {
                        // Said once, then every hundredth wait.
                        tracing::warn!(
                            waits = waits + 1,
                            pause_ms = pause.as_millis() as u64,
                            "PostgreSQL refuses new connections (too many clients); waiting to connect"
                        );
                    }
                    // Spread the retries of many waiting threads.
                    let jitter = u64::from(started.elapsed().subsec_nanos() % 50);
                    std::thread::sleep(pause + std::time::Duration::from_millis(jitter));
                    pause = (pause * 2).min(CONNECT_BACKOFF_MAX);
                }
                Err(e) if too_many_connections(&e) => {
                    let op = format!(
                        "connecting (the server refused new connections for {} s: too many clients; \
                         raise max_connections or run fewer jobs)",
                        started.elapsed().as_secs()
                    );
                    return Err(self.error(op, e));
                }
                Err(e) => return Err(self.error("connecting".into(), e)),
            }
        }
    }

    /// How many times this handle waited because the server had too many
    /// connections (the backoff of opening a connection).
    pub fn connect_waits(&self) -> u64 {
        self.connect_waits
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many round trips of this handle's lock session carried a
    /// liveness ping of a check of its claims ([`HeldLock::check`]; at
    /// most one each [`CHECK_TRUSTS`]): a figure for tests and
    /// benchmarks.
    pub fn lock_pings(&self) -> u64 {
        self.locks.pings()
    }

    /// How many round trips this handle's lock session has made so far:
    /// its rounds that reached the server, each carrying every take,
    /// release and ping queued while the one before was in flight
    /// (`locks.rs`): a figure for tests and benchmarks.
    pub fn lock_round_trips(&self) -> u64 {
        self.locks.rounds()
    }

    /// How many round trips this handle's transactions have made to the
    /// server so far (each statement or simple query sent and answered;
    /// claims and the GC lock not counted): a figure for benchmarks and
    /// tests of the statements an operation costs.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether this handle sends its hot statements as named prepared
    /// statements (`docs/design.md` §8f): until a server connection is
    /// found not to keep them between transactions (a pooler in
    /// transaction mode), when they are sent in full from then on.
    pub fn prepares(&self) -> bool {
        self.prepares.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// For tests of `docs/design.md` §8f's prepared statements: what the
    /// sessions of the idle connections have prepared — statements, then
    /// executions with a generic plan and with a custom plan, summed over
    /// the sessions, from `pg_prepared_statements` — then, when told, a
    /// loss of track ([`LoseTrack`]).
    #[doc(hidden)]
    pub fn prepared_for_tests(&self, lose: Option<LoseTrack>) -> Result<[i64; 3], BackendError> {
        let mut seen = [0i64; 3];
        let mut failed = None;
        self.pool.each_idle(|client, prepared| {
            let row = client.query_one(
                "SELECT count(*), coalesce(sum(generic_plans), 0)::int8, \
                 coalesce(sum(custom_plans), 0)::int8 FROM pg_prepared_statements",
                &[],
            );
            match row {
                Ok(row) => {
                    for (i, n) in seen.iter_mut().enumerate() {
                        *n += row.get::<_, i64>(i);
                    }
                }
                Err(e) => failed = Some(e),
            }
            let on_server = match lose {
                Some(LoseTrack::Server) => "DEALLOCATE ALL".to_owned(),
                Some(LoseTrack::ServerWrites) => client
                    .query(
                        "SELECT name FROM pg_prepared_statements \
                         WHERE statement ~ '(INSERT|DELETE|UPDATE) '",
                        &[],
                    )
                    .map(|rows| {
                        rows.iter()
                            .map(|r| format!("DEALLOCATE {}; ", r.get::<_, String>(0)))
                            .collect()
                    })
                    .unwrap_or_default(),
                Some(LoseTrack::Process) => {
                    prepared.forget();
                    String::new()
                }
                None => String::new(),
            };
            if !on_server.is_empty()
                && let Err(e) = client.batch_execute(&on_server)
            {
                failed = Some(e);
            }
        });
        match failed {
            Some(e) => Err(self.error("reading pg_prepared_statements".into(), e)),
            None => Ok(seen),
        }
    }

    /// Prepared statements off for good, said once (at `info`: behind a
    /// transaction-mode pooler every process says it, and there is
    /// nothing to do about it).
    pub(super) fn stop_preparing(&self, e: &postgres::Error) {
        if self
            .prepares
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::info!(
                error = %report(e),
                "PostgreSQL did not keep this connection's prepared statements between transactions \
                 (a pooler in transaction mode?); sending statements in full from now on"
            );
        }
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
            self.pool.clear_idle();
        }
        pg_error(&self.location, op, e)
    }

    /// A connection from the pool, or a new one: waits while
    /// `--pg-connections` are in use (up to [`CONNECT_PATIENCE`]).
    fn client(&self) -> Result<pool::Conn, BackendError> {
        match self.pool.take(CONNECT_PATIENCE) {
            Some(pool::Slot::Idle(conn)) => Ok(*conn),
            Some(pool::Slot::Open) => {
                // While the server refuses new connections, one this
                // process gives back ends the wait (it is reused, and the
                // reserved slot freed).
                let opened = self.connect_or_reuse(|| {
                    let conn = self.pool.idle()?;
                    self.pool.closed();
                    Some(conn)
                });
                match opened {
                    Ok(Reused::Fresh(client)) => Ok(self.pool.lend(*client)),
                    Ok(Reused::Pooled(conn)) => Ok(conn),
                    Err(e) => {
                        self.pool.closed();
                        Err(e)
                    }
                }
            }
            None => Err(BackendError::PoolExhausted {
                location: self.location.clone(),
                connections: self.pool.max(),
                waited_s: CONNECT_PATIENCE.as_secs(),
            }),
        }
    }

    /// Gives a connection back (only one outside any transaction).
    fn release(&self, conn: pool::Conn) {
        self.pool.give_back(conn);
    }

    /// Connections this handle has open for transactions now (its claims'
    /// session not counted).
    pub fn open_connections(&self) -> usize {
        self.pool.open()
    }
}

/// How [`PostgresBackend::prepared_for_tests`] loses track of the idle
/// connections' prepared statements, as a pooler in transaction mode
/// would.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoseTrack {
    /// The server forgets them all (`DEALLOCATE ALL`); the process is not
    /// told.
    Server,
    /// The server forgets the statements that write; the process is not
    /// told (a transaction's first query, which only locks and reads,
    /// still works; its commit does not).
    ServerWrites,
    /// The process forgets them; the server keeps them.
    Process,
}

/// What [`PostgresBackend::connect_or_reuse`] found.
pub(super) enum Reused<T> {
    /// A new connection.
    Fresh(Box<Client>),
    /// One given back meanwhile.
    Pooled(T),
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

impl PostgresBackend {
    /// A transaction that sends `begin` with its first statement.
    fn begin(&self, begin: String, write: bool) -> Result<Txn<'_>, BackendError> {
        Ok(Txn {
            backend: self,
            begin,
            write,
            state: RefCell::new(TxnState {
                client: Some(self.client()?),
                ..TxnState::default()
            }),
        })
    }

    /// A write transaction taking the store barrier in `mode` (`_shared`
    /// or not).
    fn begin_writer(&self, mode: &str) -> Result<Box<dyn WriteTables + '_>, BackendError> {
        // `SET LOCAL`, not a session setting, so nothing leaks to other
        // clients of a pooled server connection.
        let relaxed = match self.durability {
            Durability::None => "SET LOCAL synchronous_commit = off; ",
            _ => "",
        };
        Ok(Box::new(PgWrite(self.begin(
            format!(
                "BEGIN ISOLATION LEVEL READ COMMITTED; {relaxed}SELECT pg_advisory_xact_lock{mode}({WRITER_LOCK})"
            ),
            true,
        )?)))
    }
}

impl Backend for PostgresBackend {
    fn begin_read(&self) -> Result<Box<dyn ReadTables + '_>, BackendError> {
        Ok(Box::new(PgRead(self.begin(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY".into(),
            false,
        )?)))
    }

    fn begin_read_once(&self) -> Result<Box<dyn ReadTables + '_>, BackendError> {
        let txn = self.begin(String::new(), false)?;
        txn.state.borrow_mut().once = true;
        Ok(Box::new(PgRead(txn)))
    }

    fn begin_write(&self) -> Result<Box<dyn WriteTables + '_>, BackendError> {
        self.begin_writer("_shared")
    }

    fn begin_write_exclusive(&self) -> Result<Box<dyn WriteTables + '_>, BackendError> {
        self.begin_writer("")
    }

    fn reads_cost_round_trips(&self) -> bool {
        true
    }

    fn parallel_writers(&self) -> usize {
        // Half the connections write groups; the rest serve the drivers'
        // reads.
        (self.pool.max() / 2).max(1)
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

//! One PostgreSQL transaction: the connection it runs on, its writes held
//! back until the commit (or until a read must see them), paged range
//! scans, and the reads of `ReadTables`.

use super::*;

/// Held-back SQL past which the overlay is sent before the commit, so a
/// large transaction's memory stays bounded.
pub(super) const HELD_SQL_LIMIT: usize = 4 << 20;

/// A write held back until the commit (or until something must see it
/// on the server), as its row's elements of array literals
/// ([`prepared::array_literal`]): the held writes of a table are sent as
/// one statement per kind ([`held_statements`]), so a group of steps costs
/// the server a few statements to run, not a few per step.
#[derive(Debug)]
pub(super) enum Held {
    /// The key's value becomes this (`put`, or an `insert` known to
    /// write); `row` is its other elements (the key, then the typed
    /// columns: [`PgWrite::row_elements`]).
    Put { value: Vec<u8>, row: Vec<String> },
    /// The key is gone (`remove`, or a `delete` known to delete); `key`
    /// is its element.
    Remove { key: String },
    /// `insert_or_refresh`: the stored value is not known here. `key` (its
    /// element) and `value` are what to insert.
    Refresh {
        key: String,
        value: Vec<u8>,
        bounds: RefreshBounds,
    },
}

/// What a held refresh rewrites: the 8-byte field at `from` (1-based),
/// when it is below `below`, becomes `stamp`; `required` refreshes wait
/// for a row another writer is refreshing, the others skip it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct RefreshBounds {
    pub(super) from: usize,
    pub(super) below: u64,
    pub(super) stamp: u64,
    pub(super) required: bool,
}

impl Held {
    /// Bytes of SQL it adds (for [`HELD_SQL_LIMIT`]).
    pub(super) fn sql_len(&self) -> usize {
        match self {
            Held::Put { value, row } => {
                2 * value.len() + 1 + row.iter().map(|e| e.len() + 1).sum::<usize>()
            }
            Held::Refresh { key, value, .. } => 2 * value.len() + key.len() + 2,
            Held::Remove { key } => key.len() + 1,
        }
    }
}

/// The statements that apply `held`, with their arguments, table by table
/// and, within a table, in key order: each run of neighbouring keys held
/// the same way is one statement — a put of many rows (`INSERT … ON
/// CONFLICT DO UPDATE`), a delete of many keys, an insert-or-refresh —
/// so a group of steps costs the server a few statements, not a few per
/// step. Puts and refreshes write and lock their rows in key order, as
/// when each key was its own statement, so two transactions writing the
/// same rows queue rather than deadlock (a remove's scan may visit its
/// rows in heap order: [`prepared::Kind::Remove`]). Each key is held
/// once, so no statement writes a row twice.
pub(super) fn held_statements(
    held: &BTreeMap<(Table, Vec<u8>), Held>,
) -> Vec<(Arc<prepared::Statement>, Vec<String>)> {
    let mut out = Vec::new();
    let mut run: Option<(Table, RunKind)> = None;
    let mut rows: Vec<(&[String], &[u8])> = Vec::new();
    for ((table, _), h) in held {
        let (kind, row) = match h {
            Held::Put { value, row } => (RunKind::Put, (row.as_slice(), value.as_slice())),
            Held::Remove { key } => (RunKind::Remove, (std::slice::from_ref(key), &[][..])),
            Held::Refresh { key, value, bounds } => (
                RunKind::Refresh(*bounds),
                (std::slice::from_ref(key), value.as_slice()),
            ),
        };
        let next = (*table, kind);
        if run.as_ref() != Some(&next) {
            if let Some((t, kind)) = run.take() {
                out.push(run_statement(t, &kind, &rows));
            }
            rows.clear();
            run = Some(next);
        }
        rows.push(row);
    }
    if let Some((t, kind)) = run {
        out.push(run_statement(t, &kind, &rows));
    }
    out
}

/// How a run of held writes is written ([`held_statements`]).
#[derive(PartialEq)]
enum RunKind {
    Put,
    Remove,
    Refresh(RefreshBounds),
}

/// The statement writing `rows` (in key order) of `table`, and its
/// arguments: one array literal a column, but the values: one `bytea` of
/// them all with their starts and lengths ([`prepared::values_args`]).
fn run_statement(
    table: Table,
    kind: &RunKind,
    rows: &[(&[String], &[u8])],
) -> (Arc<prepared::Statement>, Vec<String>) {
    let column = |i: usize, ty: &str| {
        prepared::array_literal(
            rows.iter()
                .filter_map(|(r, _)| r.get(i))
                .map(String::as_str),
            ty,
        )
    };
    let values = || {
        let [bytes, starts, lengths] = prepared::values_args(rows.iter().map(|(_, v)| *v));
        [column(0, "bytea[]"), bytes, starts, lengths]
    };
    match kind {
        RunKind::Put => {
            let mut args = values().to_vec();
            for (i, c) in columns::columns_of(table).enumerate() {
                args.push(column(i + 1, c.array_type));
            }
            (prepared::statement(&prepared::Kind::Put(table)), args)
        }
        RunKind::Remove => (
            prepared::statement(&prepared::Kind::Remove(table)),
            vec![column(0, "bytea[]")],
        ),
        RunKind::Refresh(b) => (
            prepared::statement(&prepared::Kind::Refresh(table, b.required)),
            values()
                .into_iter()
                .chain([
                    bytea_literal(&b.stamp.to_be_bytes()),
                    b.from.to_string(),
                    bytea_literal(&b.below.to_be_bytes()),
                ])
                .collect(),
        ),
    }
}

/// Appends the planner settings of a transaction that executes prepared
/// statements ([`prepared::LOCAL_SETTINGS`]) to its first query.
fn push_settings(sql: &mut String, prepared: &mut prepared::Prepared) {
    let st = prepared::statement(&prepared::Kind::Settings);
    push_statement(sql, Some(prepared), &st, &[]);
}

/// Appends `st` with `args` to `sql`, after a `"; "` when `sql` has
/// statements: `EXECUTE` of the prepared statement on a session that
/// keeps them (`prepared`), else the statement in full.
pub(super) fn push_statement(
    sql: &mut String,
    prepared: Option<&mut prepared::Prepared>,
    st: &prepared::Statement,
    args: &[String],
) {
    if !sql.is_empty() {
        sql.push_str("; ");
    }
    match prepared {
        Some(p) => p.push(sql, st, args),
        None => prepared::push_in_full(sql, st, args),
    }
}

/// What a transaction knows and holds, beside its connection.
#[derive(Default)]
pub(super) struct TxnState {
    pub(super) client: Option<pool::Conn>,
    /// Whether `BEGIN` has been sent and answered.
    pub(super) started: bool,
    /// Whether `BEGIN` has been sent, answered or not (a transaction
    /// may be open on the server).
    pub(super) begun: bool,
    /// Keys to fetch with `BEGIN` ([`ReadTables::prefetch`]).
    pub(super) prefetch: Vec<(Table, Vec<u8>)>,
    /// Values read from the server in this transaction (`None`: absent),
    /// valid until this transaction writes the key.
    pub(super) cache: foldhash::HashMap<(Table, Vec<u8>), Option<Vec<u8>>>,
    /// Writes not yet sent, one per key, the last one winning.
    pub(super) held: BTreeMap<(Table, Vec<u8>), Held>,
    /// The held writes' SQL, in bytes.
    pub(super) held_sql: usize,
    /// The order locks ([`order_lock`]) this write transaction holds.
    pub(super) locked: std::collections::HashSet<(i32, i32)>,
    /// A statement failed for a serialization failure or a deadlock: the
    /// transaction is over and may be run again from the start.
    pub(super) serialization_failed: bool,
    /// What a statement that failed was doing: the server has aborted the
    /// transaction, and a `COMMIT` would be answered with a rollback.
    pub(super) failed: Option<String>,
    /// A one-statement read ([`Backend::begin_read_once`]): its statement
    /// is sent without `BEGIN` (`started` then means it was sent), and a
    /// second one is refused.
    pub(super) once: bool,
    /// A one-statement read was refused a second statement.
    pub(super) needs_transaction: bool,
}

/// The transaction-scoped advisory lock (two `int4` keys, a lock space of
/// its own: claims use the one-`bigint` form) that orders the write
/// transactions reading the record at `key` of `table`
/// (`docs/design.md` §8f): a thread's id, whichever of `threads`,
/// `history_ids` or `history` holds its record, or a workflow's name.
/// `None` for the tables read without one (blobs, meta, the indexes a
/// thread's record owns, pins).
pub(super) fn order_lock(table: Table, key: &[u8]) -> Option<(i32, i32)> {
    let id: &[u8] = match table {
        Table::Threads | Table::HistoryIds => key,
        // A u32 day, then the id.
        Table::History => key.get(4..)?,
        Table::Workflows => {
            let h = blake3::hash(key);
            let (a, b) = h.as_bytes().split_first_chunk::<4>()?;
            let b = b.first_chunk::<4>()?;
            return Some((
                i32::from_be_bytes(*a) ^ 0x5766_0000,
                i32::from_be_bytes(*b) ^ 0x5766_0000,
            ));
        }
        _ => return None,
    };
    let folded = super::locks::fold_id(<[u8; 16]>::try_from(id).ok()?);
    Some(((folded >> 32) as u32 as i32, folded as u32 as i32))
}

/// The arguments of the statement taking `locks` (sorted) in order
/// ([`prepared::Kind::Locks`]): one statement whatever their number — a
/// function scan yields its rows in array order, and each row's lock is
/// taken as the row is produced, so two transactions locking the same
/// records take them in one order and cannot deadlock on them.
pub(super) fn order_locks_args(locks: &[(i32, i32)]) -> Option<Vec<String>> {
    if locks.is_empty() {
        return None;
    }
    let (a, b): (Vec<String>, Vec<String>) = locks
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .unzip();
    Some(vec![
        prepared::array_literal(a.iter().map(String::as_str), "int4[]"),
        prepared::array_literal(b.iter().map(String::as_str), "int4[]"),
    ])
}

/// A transaction: its connection, its read cache and its held writes
/// (`docs/design.md` §4b, "Round trips"). Reads take `&self`, so the
/// state is in a `RefCell`.
pub(super) struct Txn<'b> {
    pub(super) backend: &'b PostgresBackend,
    /// What `BEGIN` is (isolation, the store barrier, `SET LOCAL`s), sent
    /// with the first statement.
    pub(super) begin: String,
    /// A write transaction: its reads of a thread's record or a workflow
    /// take that record's order lock first.
    pub(super) write: bool,
    pub(super) state: RefCell<TxnState>,
}

/// `E'\\x…'::bytea`: bytes as a `bytea` literal of a simple query. A
/// typed constant, not `decode('…', 'hex')`: the server turns it into bytes
/// while parsing, where a function call is looked up by name and folded by
/// the planner, per literal — most of a group's statement text is these.
/// The `E''` form means the same whatever `standard_conforming_strings`
/// is.
pub(super) fn bytea_literal(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(2 * bytes.len() + 16);
    s.push_str("E'\\\\x");
    // Not `write!` per byte: that cost the runner a microsecond per dozen
    // bytes, and every blob goes out this way.
    crate::hash::push_hex(&mut s, bytes);
    s.push_str("'::bytea");
    s
}

/// Hex text as sent back by `encode(v, 'hex')`, as bytes.
pub(super) fn from_hex(text: &str) -> Option<Vec<u8>> {
    crate::hash::unhex(text)
}

impl Txn<'_> {
    pub(super) fn lost(&self, op: String) -> BackendError {
        BackendError::ConnectionLost {
            location: self.backend.location.clone(),
            op,
        }
    }

    /// Whether the connection is gone (given up after an error, or closed
    /// under it: terminated by the server, say).
    pub(super) fn connection_lost(&self) -> bool {
        self.state
            .try_borrow()
            .is_ok_and(|s| s.client.as_ref().is_none_or(|c| c.is_closed()))
    }

    /// Runs `f` on the connection once `BEGIN` (with the prefetch) has
    /// been sent.
    pub(super) fn with<R>(
        &self,
        op: impl Fn() -> String,
        f: impl FnOnce(&mut Client) -> Result<R, postgres::Error>,
    ) -> Result<R, BackendError> {
        let mut state = self.state.borrow_mut();
        if state.once {
            // The one statement, unless it was sent.
            Self::once_more(&mut state)?;
            state.started = true;
        } else {
            self.start(&mut state, None)?;
        }
        let Some(client) = state.client.as_mut() else {
            return Err(self.lost(op()));
        };
        self.backend.round_trip();
        let out = f(client);
        out.map_err(|e| self.fail(&mut state, op(), e))
    }

    /// Refuses a second statement to a one-statement read.
    pub(super) fn once_more(state: &mut TxnState) -> Result<(), BackendError> {
        if state.once && state.started {
            state.needs_transaction = true;
            return Err(BackendError::NeedsTransaction);
        }
        Ok(())
    }

    /// Whether a one-statement read was refused a second statement.
    pub(super) fn needs_transaction(&self) -> bool {
        self.state.try_borrow().is_ok_and(|s| s.needs_transaction)
    }

    /// The error of a statement; a connection it says is lost is given up
    /// at once, so [`ReadTables::connection_lost`] says so even before the
    /// driver has seen the socket close (a terminated backend's `FATAL`
    /// arrives first), and the write reruns on another connection.
    pub(super) fn fail(
        &self,
        state: &mut TxnState,
        op: String,
        e: postgres::Error,
    ) -> BackendError {
        if connection_lost(&e) {
            state.client = None;
        }
        if let Some(client) = state.client.as_mut() {
            client.prepared.failed();
        }
        state.failed.get_or_insert_with(|| op.clone());
        if prepared::lost_statements(&e) {
            // The session did not keep its prepared statements (a pooler
            // in transaction mode): nothing of the transaction is
            // applied, and it runs again with its statements in full.
            self.backend.stop_preparing(&e);
            state.serialization_failed = true;
            return BackendError::Serialization {
                detail: format!(
                    "{} (this connection's prepared statements were not kept between \
                     transactions: a pooler in transaction mode? They are sent in full from now on)",
                    report(&e)
                ),
            };
        }
        let error = self.backend.error(op, e);
        if matches!(error, BackendError::Serialization { .. }) {
            state.serialization_failed = true;
        }
        error
    }

    /// Whether a statement of this transaction failed for a serialization
    /// failure or a deadlock (the whole transaction may run again).
    pub(super) fn serialization_failed(&self) -> bool {
        self.state
            .try_borrow()
            .is_ok_and(|s| s.serialization_failed)
    }

    /// Whether reading `key` must first take an order lock not yet held.
    pub(super) fn needs_lock(&self, state: &TxnState, table: Table, key: &[u8]) -> bool {
        self.write && order_lock(table, key).is_some_and(|l| !state.locked.contains(&l))
    }

    /// Sends `BEGIN` unless it was sent, with the prefetched keys and
    /// `also` read in the same round trip into the cache.
    pub(super) fn start(
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
        self.fetch(state, keys)
    }

    /// Reads `keys` into the cache in one round trip (with `BEGIN` when it
    /// was not sent yet): first every order lock they need and this
    /// transaction does not hold, in one order (so two transactions
    /// locking the same records cannot deadlock on them), then the values.
    /// At `READ COMMITTED` each statement of the query takes its own
    /// snapshot, so a value read after its lock was granted includes every
    /// write of the lock's previous holder, which committed before
    /// releasing it.
    pub(super) fn fetch(
        &self,
        state: &mut TxnState,
        mut keys: Vec<(Table, Vec<u8>)>,
    ) -> Result<(), BackendError> {
        keys.sort();
        keys.dedup();
        let mut locks: Vec<(i32, i32)> = if self.write {
            keys.iter()
                .filter_map(|(table, key)| order_lock(*table, key))
                .filter(|l| !state.locked.contains(l))
                .collect()
        } else {
            Vec::new()
        };
        locks.sort_unstable();
        locks.dedup();
        // A locked key is read again even if cached: its value may have
        // changed before the lock was granted.
        keys.retain(|key| {
            let relock = order_lock(key.0, &key.1).is_some_and(|l| locks.binary_search(&l).is_ok());
            !state.held.contains_key(key) && (relock || !state.cache.contains_key(key))
        });
        if state.started && keys.is_empty() && locks.is_empty() {
            return Ok(());
        }
        if state.once {
            if keys.is_empty() {
                return Ok(());
            }
            Self::once_more(state)?;
        }
        let lock_args = order_locks_args(&locks);
        // The values as one statement, a `SELECT` per table (one snapshot,
        // taken after the locks were granted): a row says its table's
        // place in `tables` and its key.
        let tables: Vec<Table> = {
            let mut t: Vec<Table> = keys.iter().map(|(table, _)| *table).collect();
            t.dedup();
            t
        };
        let read_args: Vec<String> = keys
            .chunk_by(|a, b| a.0 == b.0)
            .map(|run| prepared::bytea_array(run.iter().map(|(_, k)| k.as_slice())))
            .collect();
        let build = |prepared: Option<&mut prepared::Prepared>, started: bool| {
            let mut prepared = prepared;
            let mut sql = if started {
                String::new()
            } else {
                self.begin.clone()
            };
            if let Some(p) = prepared.as_deref_mut()
                && !started
            {
                push_settings(&mut sql, p);
            }
            if let Some(args) = &lock_args {
                let st = prepared::statement(&prepared::Kind::Locks);
                push_statement(&mut sql, prepared.as_deref_mut(), &st, args);
            }
            if !tables.is_empty() {
                let st = prepared::statement(&prepared::Kind::Read(tables.clone()));
                push_statement(&mut sql, prepared, &st, &read_args);
            }
            sql
        };
        let op = if state.started {
            "reading thread records"
        } else {
            "starting a transaction"
        };
        let prepares = self.backend.prepares();
        let Some(client) = state.client.as_mut() else {
            return Err(self.lost(op.into()));
        };
        let sql = build(prepares.then_some(&mut client.prepared), state.started);
        state.begun |= !self.begin.is_empty();
        self.backend.round_trip();
        let mut sent = client.simple_query(&sql);
        if let Err(e) = &sent
            && prepares
            && !state.started
            && prepared::lost_statements(e)
        {
            // The session did not keep its statements (a pooler in
            // transaction mode): nothing was read yet, so the first query
            // runs again at once, in full, after ending the transaction
            // its `BEGIN` left aborted.
            self.backend.stop_preparing(e);
            client.prepared.failed();
            let ended = self.begin.is_empty() || {
                self.backend.round_trip();
                client.batch_execute("ROLLBACK").is_ok()
            };
            if ended {
                let sql = build(None, false);
                self.backend.round_trip();
                sent = client.simple_query(&sql);
            }
        }
        let messages = sent.map_err(|e| self.fail(state, op.into(), e))?;
        if let Some(client) = state.client.as_mut() {
            client.prepared.answered();
        }
        state.started = true;
        state.locked.extend(locks);
        let mut found: foldhash::HashMap<(Table, Vec<u8>), Vec<u8>> =
            foldhash::HashMap::with_capacity_and_hasher(keys.len(), Default::default());
        for message in &messages {
            let postgres::SimpleQueryMessage::Row(row) = message else {
                continue;
            };
            // A lock's `SELECT` returns one column; ours three.
            if row.len() != 3 {
                continue;
            }
            let bad = || BackendError::BadSchema {
                table: "a prefetch",
                detail: "a row that is not a table's place, hex key and hex bytes".into(),
            };
            let table = row
                .get(0)
                .and_then(|i| i.parse::<usize>().ok())
                .and_then(|i| tables.get(i))
                .ok_or_else(bad)?;
            let key = row.get(1).and_then(from_hex).ok_or_else(bad)?;
            let value = row.get(2).and_then(from_hex).ok_or_else(bad)?;
            found.insert((*table, key), value);
        }
        for key in keys {
            let value = found.remove(&key);
            state.cache.insert(key, value);
        }
        Ok(())
    }

    /// Sends the held writes (and `then`, say `COMMIT`) as one simple
    /// query; they become cached values.
    pub(super) fn send_held(&self, state: &mut TxnState, then: &str) -> Result<(), BackendError> {
        let mut sql = String::with_capacity(state.held_sql + then.len() + 1000);
        if !state.started {
            sql.push_str(&self.begin);
        }
        let prepares = self.backend.prepares();
        let Some(client) = state.client.as_mut() else {
            return Err(self.lost("writing".into()));
        };
        if prepares && !state.started && !state.held.is_empty() {
            push_settings(&mut sql, &mut client.prepared);
        }
        for (st, args) in held_statements(&state.held) {
            push_statement(
                &mut sql,
                prepares.then_some(&mut client.prepared),
                &st,
                &args,
            );
        }
        if !then.is_empty() {
            if !sql.is_empty() {
                sql.push_str("; ");
            }
            sql.push_str(then);
        }
        if sql.trim().is_empty() {
            return Ok(());
        }
        state.begun |= !self.begin.is_empty();
        self.backend.round_trip();
        let sent = client.batch_execute(&sql);
        sent.map_err(|e| {
            let op = Self::held_op(&state.held);
            self.fail(state, op, e)
        })?;
        if let Some(client) = state.client.as_mut() {
            client.prepared.answered();
        }
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
    pub(super) fn held_op(held: &BTreeMap<(Table, Vec<u8>), Held>) -> String {
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
    pub(super) fn send_held_for(
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
    pub(super) fn known(state: &TxnState, table: Table, key: &[u8]) -> Option<Option<Vec<u8>>> {
        let k = (table, key.to_vec());
        match state.held.get(&k) {
            Some(Held::Put { value, .. }) => return Some(Some(value.clone())),
            Some(Held::Remove { .. }) => return Some(None),
            Some(Held::Refresh { .. }) => return None,
            None => {}
        }
        state.cache.get(&k).cloned()
    }

    pub(super) fn get(
        &self,
        table: Table,
        key: &[u8],
    ) -> Result<Option<Cow<'static, [u8]>>, BackendError> {
        {
            let mut state = self.state.borrow_mut();
            self.send_held_for(&mut state, table, Some(key))?;
            if !self.needs_lock(&state, table, key)
                && let Some(known) = Self::known(&state, table, key)
            {
                return Ok(known.map(Cow::Owned));
            }
            if !state.started || self.needs_lock(&state, table, key) {
                let mut keys = std::mem::take(&mut state.prefetch);
                keys.push((table, key.to_vec()));
                self.fetch(&mut state, keys)?;
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

    pub(super) fn get_many(
        &self,
        table: Table,
        keys: &[&[u8]],
    ) -> Result<Vec<Option<Cow<'static, [u8]>>>, BackendError> {
        // Nothing to read: no `BEGIN` either (a join with no children).
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut state = self.state.borrow_mut();
        for key in keys {
            self.send_held_for(&mut state, table, Some(key))?;
        }
        if !state.started || keys.iter().any(|k| self.needs_lock(&state, table, k)) {
            let mut all = std::mem::take(&mut state.prefetch);
            all.extend(keys.iter().map(|k| (table, k.to_vec())));
            self.fetch(&mut state, all)?;
        }
        let missing: Vec<&[u8]> = keys
            .iter()
            .copied()
            .filter(|key| Self::known(&state, table, key).is_none())
            .collect();
        if !missing.is_empty() {
            Self::once_more(&mut state)?;
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

    pub(super) fn page(
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

    pub(super) fn count(&self, table: Table) -> Result<u64, BackendError> {
        self.send_held_for(&mut self.state.borrow_mut(), table, None)?;
        let sql = format!("SELECT count(*) FROM {}", sql_table(table));
        let rows = self.with(|| format!("counting {table}"), |c| c.query_typed(&sql, &[]))?;
        let n: i64 = rows.first().map_or(Ok(0), |r| column(r, 0, table))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Ends the transaction: `end` (`COMMIT`) after the held writes, in
    /// one round trip; nothing at all when nothing was sent or held; an
    /// error, sending nothing, when a statement of it failed (the server
    /// aborted it). The connection goes back to the pool when it ended
    /// cleanly, else after `Drop`'s rollback.
    pub(super) fn finish(&self, end: &str) -> Result<(), BackendError> {
        let mut state = self.state.borrow_mut();
        let outcome = if let Some(op) = state.failed.clone() {
            // Not sent: the server would answer `COMMIT` with a rollback,
            // and the caller must not believe it committed. `Drop` rolls
            // the connection back.
            Err(if state.serialization_failed {
                BackendError::Serialization {
                    detail: format!("a statement failed while {op}"),
                }
            } else {
                BackendError::Aborted {
                    location: self.backend.location.clone(),
                    op,
                }
            })
        } else if !state.begun && state.held.is_empty() {
            Ok(())
        } else {
            self.send_held(&mut state, end)
        };
        // After a failure the connection stays: `Drop` rolls it back and
        // gives it back (or closes it when that fails).
        if outcome.is_ok()
            && let Some(client) = state.client.take()
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
        if !state.begun || state.once {
            // Nothing begun (a one-statement read began nothing). A
            // query that sent `BEGIN` and failed left its transaction
            // open and aborted: it is rolled back below, or the next
            // transaction on the connection would fail (25P02).
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
pub(super) struct Pages<'t> {
    pub(super) txn: &'t Txn<'t>,
    pub(super) table: Table,
    pub(super) lower: Bound<Vec<u8>>,
    pub(super) upper: Bound<Vec<u8>>,
    pub(super) direction: Direction,
    pub(super) buffered: std::vec::IntoIter<Row>,
    pub(super) done: bool,
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

pub(super) fn owned_bound(b: Bound<&[u8]>) -> Bound<Vec<u8>> {
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

            fn serialization_failed(&self) -> bool {
                self.0.serialization_failed()
            }

            fn needs_transaction(&self) -> bool {
                self.0.needs_transaction()
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

pub(super) struct PgRead<'b>(pub(super) Txn<'b>);
pub(super) struct PgWrite<'b>(pub(super) Txn<'b>);

pg_reads!(PgRead);
pg_reads!(PgWrite);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_locks_are_one_statement_in_order() {
        assert_eq!(order_locks_args(&[]), None);
        assert_eq!(
            order_locks_args(&[(-5, 7)]),
            Some(vec![
                "E'{-5}'::int4[]".to_owned(),
                "E'{7}'::int4[]".to_owned()
            ])
        );
        assert_eq!(
            order_locks_args(&[(i32::MIN, -1), (-5, 7), (3, i32::MAX)]),
            Some(vec![
                "E'{-2147483648,-5,3}'::int4[]".to_owned(),
                "E'{-1,7,2147483647}'::int4[]".to_owned()
            ])
        );
        let st = prepared::statement(&prepared::Kind::Locks);
        let mut sql = String::new();
        push_statement(&mut sql, None, &st, &order_locks_args(&[(1, 2)]).unwrap());
        assert_eq!(
            sql,
            "SELECT pg_advisory_xact_lock(a, b) FROM unnest((E'{1}'::int4[]), \
             (E'{2}'::int4[])) AS l (a, b)"
        );
    }

    #[test]
    fn hex_literals_round_trip_every_byte() {
        let bytes: Vec<u8> = (0..=255).collect();
        let literal = bytea_literal(&bytes);
        let hex = literal
            .strip_prefix("E'\\\\x")
            .and_then(|l| l.strip_suffix("'::bytea"))
            .unwrap();
        assert_eq!(&hex[..8], "00010203");
        assert_eq!(&hex[hex.len() - 4..], "feff");
        assert_eq!(from_hex(hex), Some(bytes));
        assert_eq!(from_hex("DEADbeef"), Some(vec![0xde, 0xad, 0xbe, 0xef]));
        assert_eq!(from_hex("abc"), None);
        assert_eq!(from_hex("zz"), None);
        assert_eq!(bytea_literal(&[]), "E'\\\\x'::bytea");
    }
}

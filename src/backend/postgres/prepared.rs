//! The hot statements as named prepared statements, their rows as arrays
//! (`docs/design.md` §8f, "Prepared statements").
//!
//! A step's transactions are a few simple queries (one round trip each:
//! the group's `BEGIN` with its locks and reads, the writes with `COMMIT`,
//! a thread's record read). Sent as text with literal rows, each statement
//! was parsed, analysed and planned by the server every time — half of the
//! server's CPU a step. Here each such statement has one shape whatever
//! its number of rows (the rows are arrays: `unnest($1::bytea[], …)`,
//! `k = ANY($1::bytea[])`), is `PREPARE`d once per connection, in the same
//! simple query as its first use, and is then sent as `EXECUTE name(…)`,
//! which the server parses in a moment and runs with the plan it keeps.
//!
//! A statement's name is `uwf_` and 16 hex digits of the BLAKE3 hash of
//! its text: one name is one text, in every process and version, so an
//! `EXECUTE` can only ever run the statement it means.
//!
//! Where the server does not keep a session's statements between
//! transactions — a pooler in transaction mode (PgBouncer, which passes
//! SQL `PREPARE` through as text) hands each transaction whichever server
//! connection is free — a statement is then missing (SQLSTATE 26000) or
//! already there (42P05). Either error turns prepared statements off for
//! the backend ([`super::PostgresBackend::prepares`]) and the transaction
//! runs again with the same statements sent in full: their text with the
//! arrays in place of the parameters (`Txn::fetch`, `Txn::fail`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex};

use super::columns;
use super::sql_table;
use crate::backend::Table;

/// What a prepared statement does.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Kind {
    /// Puts rows (`INSERT … ON CONFLICT DO UPDATE`) of a table: `$1` keys,
    /// `$2`–`$4` the values ([`values_args`]), then the typed columns'
    /// arrays of a thread table.
    Put(Table),
    /// Deletes the rows whose keys `$1` lists.
    Remove(Table),
    /// Inserts `$1` keys with the values `$2`–`$4` ([`values_args`]) where
    /// absent, and refreshes the stored ones' stamp: the 8 bytes at `$6`
    /// (1-based), when below `$7`, become `$5`. `true`: wait for a row another writer is
    /// refreshing (else skip it).
    Refresh(Table, bool),
    /// Reads `k` and `v` of the listed keys of each table, `$i` the keys
    /// of the `i`th: rows of `(place, hex key, hex value)`.
    Read(Vec<Table>),
    /// Takes the transaction's order locks, `$1` and `$2` their two
    /// `int4` keys, in array order.
    Locks,
    /// Sets the planner settings of a transaction that executes prepared
    /// statements ([`LOCAL_SETTINGS`]).
    Settings,
}

/// A statement with parameters `$1`, `$2`, … (arrays, or for a refresh's
/// bounds scalars).
#[derive(Debug)]
pub(super) struct Statement {
    /// `uwf_` and 16 hex digits of the hash of `types` and `body`.
    pub(super) name: String,
    /// The hash's first 8 bytes: the name, as a number.
    id: u64,
    /// The parameters' types, in order.
    types: Vec<&'static str>,
    /// The text, parameters as `$n`.
    body: String,
}

/// The statements made so far, by what they do.
static STATEMENTS: LazyLock<Mutex<HashMap<Kind, Arc<Statement>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The statement that does `kind`.
pub(super) fn statement(kind: &Kind) -> Arc<Statement> {
    let mut made = STATEMENTS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = made.get(kind) {
        return Arc::clone(s);
    }
    let (types, body) = text(kind);
    let mut hasher = blake3::Hasher::new();
    for t in &types {
        hasher.update(t.as_bytes());
        hasher.update(b",");
    }
    hasher.update(body.as_bytes());
    let hash = hasher.finalize();
    let first = hash
        .as_bytes()
        .first_chunk::<8>()
        .copied()
        .unwrap_or_default();
    let mut name = String::from("uwf_");
    crate::hash::push_hex(&mut name, &first);
    let s = Arc::new(Statement {
        name,
        id: u64::from_be_bytes(first),
        types,
        body,
    });
    made.insert(kind.clone(), Arc::clone(&s));
    s
}

/// The parameter types and text of `kind`.
fn text(kind: &Kind) -> (Vec<&'static str>, String) {
    match kind {
        Kind::Put(table) => {
            let name = sql_table(*table);
            // Keys as an array; the values as one `bytea` of them all, cut
            // by their starts and lengths ([`values_args`]).
            let mut types = vec!["bytea[]", "bytea", "int4[]", "int4[]"];
            let mut names = String::new();
            let mut selected = String::new();
            let mut updates = String::new();
            for column in columns::columns_of(*table) {
                types.push(column.array_type);
                names.push_str(", ");
                names.push_str(column.name);
                selected.push_str(", u.");
                selected.push_str(column.name);
                updates.push_str(&format!(", {0} = EXCLUDED.{0}", column.name));
            }
            let mut arrays = String::from("$1, $3, $4");
            for i in 5..=types.len() {
                arrays.push_str(&format!(", ${i}"));
            }
            // A function scan yields its rows in array order, the keys'
            // order: rows are written and locked in key order.
            let body = format!(
                "INSERT INTO {name} (k, v{names}) \
                 SELECT u.k, substring($2 FROM u.o FOR u.l){selected} \
                 FROM unnest({arrays}) AS u (k, o, l{names}) \
                 ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v{updates}"
            );
            (types, body)
        }
        // The scan may visit the keys in any order (a bitmap scan goes by
        // heap position). Two transactions removing the same rows are
        // rare — a thread's own rows (its record as it moves, its activity
        // and label entries) are written under its order lock — and a
        // deadlock between two runs again like any other (40P01).
        Kind::Remove(table) => (
            vec!["bytea[]"],
            format!("DELETE FROM {} WHERE k = ANY($1)", sql_table(*table)),
        ),
        Kind::Refresh(table, required) => {
            // A statement that waits for no other writer in the common
            // case, blobs stored already and refreshed recently (the same
            // reply in many threads; §8f):
            // - a row is inserted only when its key is absent from the
            //   statement's snapshot, so a stored blob another transaction
            //   is refreshing is not waited for (`ON CONFLICT` alone waits
            //   for that transaction to end);
            // - the refresh locks only the rows that are due (not `ON
            //   CONFLICT DO UPDATE … WHERE`, which locks a stored row even
            //   when it leaves it alone), in key order (`ORDER BY k FOR
            //   UPDATE`), and one that is not required skips a row another
            //   writer is refreshing now (`SKIP LOCKED`); a row locked
            //   after a wait is checked again (READ COMMITTED re-reads it);
            // - the `UPDATE` leaves alone the rows this statement inserted
            //   (a new blob is stamped already).
            let name = sql_table(*table);
            let skip = if *required { "" } else { " SKIP LOCKED" };
            (
                vec![
                    "bytea[]", "bytea", "int4[]", "int4[]", "bytea", "int4", "bytea",
                ],
                format!(
                    "WITH new (k, v) AS (SELECT u.k, substring($2 FROM u.o FOR u.l) \
                     FROM unnest($1, $3, $4) AS u (k, o, l)), \
                     inserted AS (INSERT INTO {name} (k, v) SELECT k, v FROM new \
                     WHERE NOT EXISTS (SELECT 1 FROM {name} WHERE {name}.k = new.k) \
                     ON CONFLICT (k) DO NOTHING RETURNING k) \
                     UPDATE {name} SET v = overlay(v PLACING $5 FROM $6 FOR 8) \
                     WHERE k IN (SELECT k FROM {name} WHERE k = ANY($1) \
                     AND length(v) >= $6 + 7 AND substring(v FROM $6 FOR 8) < $7 \
                     ORDER BY k FOR UPDATE{skip}) \
                     AND k NOT IN (SELECT k FROM inserted)"
                ),
            )
        }
        Kind::Read(tables) => {
            let selects: Vec<String> = tables
                .iter()
                .enumerate()
                .map(|(i, table)| {
                    format!(
                        "SELECT {i}, encode(k, 'hex'), encode(v, 'hex') FROM {} WHERE k = ANY(${})",
                        sql_table(*table),
                        i + 1
                    )
                })
                .collect();
            (vec!["bytea[]"; tables.len()], selects.join(" UNION ALL "))
        }
        // A function scan yields its rows in array order, and each row's
        // lock is taken as the row is produced: two transactions locking
        // the same records take them in one order.
        Kind::Locks => (
            vec!["int4[]", "int4[]"],
            "SELECT pg_advisory_xact_lock(a, b) FROM unnest($1, $2) AS l (a, b)".into(),
        ),
        Kind::Settings => (Vec::new(), LOCAL_SETTINGS.into()),
    }
}

/// The planner settings of a transaction that executes prepared
/// statements, sent with its first query (`set_config(…, true)`: for this
/// transaction only, so nothing is left on a server connection that a
/// pooler may hand to another client), itself a prepared statement
/// ([`Kind::Settings`]: parsed and planned once a connection, where a
/// `SELECT` sent in full cost a cold read of a log page a quarter of its
/// time):
///
/// - `plan_cache_mode = force_generic_plan`: plans made once for any
///   arguments, the point of preparing. The default (`auto`) plans anew
///   for each `EXECUTE` whenever its estimate of a generic plan's cost is
///   above the last custom plans', which for these statements (a handful
///   of rows, against a guess of ten or a hundred) it always is.
/// - no sequential scan, hash join or merge join: every statement here
///   reads and writes rows by key, a few at a time, and a generic plan is
///   kept until the table's statistics change. Made while a fresh store's
///   tables are nearly empty, it would scan (or hash) a whole table on
///   every `EXECUTE` as the table grows, until autovacuum analyses it
///   (measured: a fresh store's batch ran at 0.6–0.8× the speed of
///   statements sent in full). Index probes are right at any size. These
///   matter when a plan is made, at an `EXECUTE` of this transaction.
pub(super) const LOCAL_SETTINGS: &str = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true), \
     set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true), \
     set_config('enable_mergejoin', 'off', true)";

/// The statements one connection's session has prepared, as far as this
/// process knows.
#[derive(Debug, Default)]
pub(super) struct Prepared {
    /// Prepared and known to be there.
    ids: HashSet<u64>,
    /// Prepared by the query in flight: known once it is answered.
    pending: Vec<u64>,
    /// A query failed on this session: what it prepared is not known, so
    /// the next query starts again from nothing (`DEALLOCATE ALL`).
    unknown: bool,
}

impl Prepared {
    /// Appends `st` run with `args` (the parameters' literals, in order)
    /// to `sql`: `EXECUTE`, after a `PREPARE` the first time on this
    /// session (after `DEALLOCATE ALL` when the session's statements are
    /// not known).
    pub(super) fn push(&mut self, sql: &mut String, st: &Statement, args: &[String]) {
        if self.unknown {
            sql.push_str("DEALLOCATE ALL; ");
            self.ids.clear();
            self.pending.clear();
            self.unknown = false;
        }
        if !self.ids.contains(&st.id) && !self.pending.contains(&st.id) {
            sql.push_str("PREPARE ");
            sql.push_str(&st.name);
            if !st.types.is_empty() {
                sql.push_str(" (");
                sql.push_str(&st.types.join(", "));
                sql.push(')');
            }
            sql.push_str(" AS ");
            sql.push_str(&st.body);
            sql.push_str("; ");
            self.pending.push(st.id);
        }
        sql.push_str("EXECUTE ");
        sql.push_str(&st.name);
        // Each argument pushed in place: `join` would copy a group's
        // values once more.
        for (i, arg) in args.iter().enumerate() {
            sql.push_str(if i == 0 { " (" } else { ", " });
            sql.push_str(arg);
        }
        if !args.is_empty() {
            sql.push(')');
        }
    }

    /// Forgets what the session has prepared, as a process would that
    /// lost track (for tests).
    pub(super) fn forget(&mut self) {
        *self = Prepared::default();
    }

    /// The query in flight was answered: what it prepared is there.
    pub(super) fn answered(&mut self) {
        self.ids.extend(self.pending.drain(..));
    }

    /// The query in flight failed: nothing is known of the session's
    /// statements any more.
    pub(super) fn failed(&mut self) {
        self.pending.clear();
        self.unknown = true;
    }

    /// Statements prepared on this session.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.ids.len()
    }
}

/// Whether `e` says a session's prepared statement was missing (SQLSTATE
/// 26000) or already there (42P05): the server did not keep the
/// session's statements as this process knows them.
pub(super) fn lost_statements(e: &postgres::Error) -> bool {
    use postgres::error::SqlState;
    e.code().is_some_and(|c| {
        *c == SqlState::INVALID_SQL_STATEMENT_NAME || *c == SqlState::DUPLICATE_PSTATEMENT
    })
}

/// Appends `st` with `args` in place of its parameters to `sql`: the
/// statement sent in full, where prepared statements are off.
pub(super) fn push_in_full(sql: &mut String, st: &Statement, args: &[String]) {
    let mut rest = st.body.as_str();
    while let Some(at) = rest.find('$') {
        let (before, from_dollar) = rest.split_at(at);
        let after = from_dollar.get(1..).unwrap_or_default();
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let (number, tail) = after.split_at(digits);
        let arg = number
            .parse::<usize>()
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|n| args.get(n));
        sql.push_str(before);
        match arg {
            Some(arg) => {
                sql.push('(');
                sql.push_str(arg);
                sql.push(')');
            }
            None => {
                sql.push('$');
                sql.push_str(number);
            }
        }
        rest = tail;
    }
    sql.push_str(rest);
}

/// `E'{…}'::type[]`: an array literal of elements written for it
/// ([`bytea_element`], [`columns::ThreadColumns::elements`], numbers).
///
/// Sized once from the elements' lengths: a group's array of blob values
/// runs to hundreds of kilobytes, and growing it by doubling was 4% of a
/// PostgreSQL runner's instructions (callgrind, a 200-thread batch).
pub(super) fn array_literal<'a>(
    elements: impl Iterator<Item = &'a str> + Clone,
    ty: &str,
) -> String {
    let len: usize = elements.clone().map(|e| e.len() + 1).sum();
    let mut s = String::with_capacity(len + ty.len() + 8);
    s.push_str("E'{");
    for (i, e) in elements.enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(e);
    }
    s.push_str("}'::");
    s.push_str(ty);
    s
}

/// The values of a run of rows as three arguments: one `E'\\x…'::bytea`
/// of them all, one after another, then each one's start in it (1-based)
/// and its length, as `int4[]`s; the statement cuts them apart with
/// `substring` ([`Kind::Put`], [`Kind::Refresh`]). Each value's hex is
/// written straight into the literal, which is sized once.
///
/// Not a `bytea[]`: the server reads an array literal character by
/// character, twice (`ArrayCount`, `ReadArrayStr`) before each element's
/// hex, and with the values a group's arrays were most of the bytes it
/// read — `array_in` and those two were 5.8% of the whole machine under a
/// one-runner batch (`perf record -a`). One `bytea` is decoded straight
/// from its hex.
pub(super) fn values_args<'a>(values: impl Iterator<Item = &'a [u8]> + Clone) -> [String; 3] {
    use std::fmt::Write as _;
    let len: usize = values.clone().map(|v| 2 * v.len()).sum();
    let mut bytes = String::with_capacity(len + 16);
    bytes.push_str("E'\\\\x");
    let mut starts = String::from("E'{");
    let mut lengths = String::from("E'{");
    let mut start = 1usize;
    for (i, value) in values.enumerate() {
        if i > 0 {
            starts.push(',');
            lengths.push(',');
        }
        crate::hash::push_hex(&mut bytes, value);
        // Writing to a `String` cannot fail.
        let _ = write!(starts, "{start}");
        let _ = write!(lengths, "{}", value.len());
        start += value.len();
    }
    bytes.push_str("'::bytea");
    starts.push_str("}'::int4[]");
    lengths.push_str("}'::int4[]");
    [bytes, starts, lengths]
}

/// Bytes as an element of an array literal in an `E''` string: `\x` and
/// hex, its backslash escaped once for the array and once for the string.
pub(super) fn bytea_element(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(2 * bytes.len() + 5);
    push_bytea_element(&mut s, bytes);
    s
}

fn push_bytea_element(s: &mut String, bytes: &[u8]) {
    s.push_str("\\\\\\\\x");
    crate::hash::push_hex(s, bytes);
}

/// `E'{…}'::bytea[]` of `keys`, each a [`bytea_element`], written in
/// place.
pub(super) fn bytea_array<'a>(keys: impl Iterator<Item = &'a [u8]>) -> String {
    let mut s = String::from("E'{");
    for (i, key) in keys.enumerate() {
        if i > 0 {
            s.push(',');
        }
        push_bytea_element(&mut s, key);
    }
    s.push_str("}'::bytea[]");
    s
}

/// Text as an element of an array literal in an `E''` string: in double
/// quotes (so `NULL`, braces, commas and spaces are plain text), a
/// backslash or a double quote escaped for the array, every backslash
/// then escaped for the string and a quote doubled, and a NUL —
/// PostgreSQL's text cannot hold one — as U+FFFD (the record's `v` bytes
/// keep the exact text). Safe because the driver sets `client_encoding =
/// UTF8` at connection: no byte of a multi-byte character can look like a
/// quote or a backslash.
pub(super) fn text_element(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\\\\\"),
            '"' => out.push_str("\\\\\""),
            '\0' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_name_is_one_text() {
        let a = statement(&Kind::Put(Table::Blobs));
        let b = statement(&Kind::Put(Table::Threads));
        assert_ne!(a.name, b.name);
        assert_eq!(a.name.len(), 4 + 16);
        assert!(Arc::ptr_eq(&a, &statement(&Kind::Put(Table::Blobs))));
        let skip = statement(&Kind::Refresh(Table::Blobs, false));
        let wait = statement(&Kind::Refresh(Table::Blobs, true));
        assert_ne!(skip.name, wait.name);
        assert!(skip.body.contains("SKIP LOCKED") && !wait.body.contains("SKIP LOCKED"));
    }

    #[test]
    fn a_statement_is_prepared_once_a_session_and_again_after_a_failure() {
        let st = statement(&Kind::Remove(Table::Pins));
        let args = [array_literal(["\\\\\\\\x01"].into_iter(), "bytea[]")];
        let mut p = Prepared::default();
        let mut sql = String::new();
        p.push(&mut sql, &st, &args);
        assert_eq!(
            sql,
            format!(
                "PREPARE {0} (bytea[]) AS \
                 DELETE FROM uwf_pins WHERE k = ANY($1); EXECUTE {0} (E'{{\\\\\\\\x01}}'::bytea[])",
                st.name
            )
        );
        // Not answered yet: a second use in the same query prepares nothing.
        let mut again = String::new();
        p.push(&mut again, &st, &args);
        assert!(again.starts_with("EXECUTE "), "{again}");
        p.answered();
        assert_eq!(p.len(), 1);
        let mut third = String::new();
        p.push(&mut third, &st, &args);
        assert!(third.starts_with("EXECUTE "), "{third}");
        p.failed();
        let mut after = String::new();
        p.push(&mut after, &st, &args);
        assert!(after.starts_with("DEALLOCATE ALL; PREPARE "), "{after}");
    }

    #[test]
    fn in_full_the_arguments_replace_the_parameters() {
        let st = statement(&Kind::Refresh(Table::Blobs, true));
        let args: Vec<String> = ["K", "V", "O", "L", "S", "9", "B"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut sql = String::new();
        push_in_full(&mut sql, &st, &args);
        assert!(!sql.contains('$'), "{sql}");
        assert!(sql.contains("unnest((K), (O), (L))"), "{sql}");
        assert!(sql.contains("substring((V) FROM u.o FOR u.l)"), "{sql}");
        assert!(sql.contains("PLACING (S) FROM (9) FOR 8"), "{sql}");
        assert!(sql.contains("length(v) >= (9) + 7"), "{sql}");
        // Ten parameters and more: `$10` is not `$1` then a 0.
        let put = statement(&Kind::Put(Table::History));
        let n = put.types.len();
        assert!(n >= 12, "{n}");
        let args: Vec<String> = (1..=n).map(|i| format!("a{i}")).collect();
        let mut sql = String::new();
        push_in_full(&mut sql, &put, &args);
        assert!(!sql.contains('$'), "{sql}");
        assert!(sql.contains("substring((a2) FROM u.o FOR u.l)"), "{sql}");
        assert!(sql.contains("unnest((a1), (a3), (a4), (a5)"), "{sql}");
        assert!(
            sql.contains(&format!(
                "(a10), (a11), (a12){}",
                if n == 12 { ")" } else { "," }
            )),
            "{sql}"
        );
    }

    #[test]
    fn values_are_one_bytea_cut_by_starts_and_lengths() {
        let values: [&[u8]; 4] = [&[0xab, 0xcd], &[], &[1], &[0xff; 3]];
        let [bytes, starts, lengths] = values_args(values.iter().copied());
        assert_eq!(bytes, "E'\\\\xabcd01ffffff'::bytea");
        assert_eq!(starts, "E'{1,3,3,4}'::int4[]");
        assert_eq!(lengths, "E'{2,0,1,3}'::int4[]");
        // Cut apart as the statement does (`substring(b FROM s FOR l)`,
        // 1-based), each value is its own bytes again.
        let all: Vec<u8> = values.concat();
        let starts = [1usize, 3, 3, 4];
        let lengths = [2usize, 0, 1, 3];
        for (i, v) in values.iter().enumerate() {
            assert_eq!(&all[starts[i] - 1..starts[i] - 1 + lengths[i]], *v);
        }
        assert_eq!(
            values_args(std::iter::empty()),
            [
                "E'\\\\x'::bytea".to_owned(),
                "E'{}'::int4[]".to_owned(),
                "E'{}'::int4[]".to_owned()
            ]
        );
    }

    #[test]
    fn elements_escape_for_the_array_and_the_string() {
        assert_eq!(bytea_element(&[0, 0xab]), "\\\\\\\\x00ab");
        assert_eq!(
            bytea_array([&[1u8][..], &[]].into_iter()),
            array_literal(
                [bytea_element(&[1]), bytea_element(&[])]
                    .iter()
                    .map(String::as_str),
                "bytea[]"
            )
        );
        assert_eq!(text_element("plain"), "\"plain\"");
        assert_eq!(
            text_element("it's a \\ and a \" and a \0"),
            "\"it''s a \\\\\\\\ and a \\\\\" and a \u{fffd}\""
        );
        assert_eq!(
            array_literal(["1", "-2"].into_iter(), "int4[]"),
            "E'{1,-2}'::int4[]"
        );
    }
}

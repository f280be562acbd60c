//! The typed columns of `uwf_threads` and `uwf_history` (schema version 2):
//! what SQL users list and filter threads by, projected from each thread
//! record as this backend writes it.
//!
//! The `v` bytes stay authoritative: the engine reads and compares only
//! `k` and `v`, and the columns are never read back by it. They are
//! computed here, from the very bytes being written, with the thread
//! record decoder — not handed down by the layer above — so whatever writes
//! a record (the thread index, a copy between stores, the migration's
//! backfill) the columns say what the bytes say. That makes this the one
//! place the backend knows a thread record's layout, which
//! `docs/design.md` §4b allows: the layouts are ours and fixed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use postgres::types::{ToSql, Type};

use super::sql_table;
use crate::backend::BackendError;
use crate::backend::Table;
use crate::record::id::ThreadId;
use crate::record::thread::ThreadRecord;

/// A typed column of the thread tables.
pub(super) struct Column {
    /// The column's name.
    pub name: &'static str,
    /// Its SQL type.
    pub sql_type: &'static str,
    /// The type its parameter is sent as.
    pub param_type: Type,
    /// The SQL type of an array of it (a prepared statement's parameter).
    pub array_type: &'static str,
    /// `NOT NULL`.
    pub required: bool,
    /// Only `uwf_history` has it.
    pub history_only: bool,
}

const fn column(
    name: &'static str,
    sql_type: &'static str,
    param_type: Type,
    required: bool,
) -> Column {
    Column {
        name,
        sql_type,
        param_type,
        array_type: array_of(sql_type),
        required,
        history_only: false,
    }
}

/// The array type of `sql_type` (one of the columns' types).
const fn array_of(sql_type: &'static str) -> &'static str {
    match sql_type.as_bytes() {
        b"text" => "text[]",
        b"timestamptz" => "timestamptz[]",
        _ => "bigint[]",
    }
}

/// How many typed columns there are.
const COLUMN_COUNT: usize = 10;

/// Every typed column, in the order of [`ThreadColumns::values`].
pub(super) static COLUMNS: [Column; COLUMN_COUNT] = [
    column("id", "text", Type::TEXT, true),
    column("status", "text", Type::TEXT, true),
    column("workflow", "text", Type::TEXT, true),
    column("created_at", "timestamptz", Type::TIMESTAMPTZ, true),
    column("updated_at", "timestamptz", Type::TIMESTAMPTZ, true),
    Column {
        name: "completed_at",
        sql_type: "timestamptz",
        param_type: Type::TIMESTAMPTZ,
        array_type: "timestamptz[]",
        required: true,
        history_only: true,
    },
    column("head", "text", Type::TEXT, true),
    column("seq", "bigint", Type::INT8, true),
    column("parent_thread", "text", Type::TEXT, false),
    column("last_error", "text", Type::TEXT, false),
];

/// Whether `table` has typed columns.
pub(super) fn has_columns(table: Table) -> bool {
    matches!(table, Table::Threads | Table::History)
}

/// The typed columns `table` has (empty for a table of bytes only).
pub(super) fn columns_of(table: Table) -> impl Iterator<Item = &'static Column> {
    COLUMNS
        .iter()
        .filter(move |c| has_columns(table) && (table == Table::History || !c.history_only))
}

/// The typed columns of one thread record.
#[derive(Debug)]
pub(super) struct ThreadColumns {
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
}

/// The latest time a column takes: the end of year 9999 UTC, in ms. Far
/// beyond any real record, and well inside PostgreSQL's range (a larger
/// value would overflow the driver's conversion).
const LATEST_MS: u64 = 253_402_300_799_999;

impl ThreadColumns {
    /// Decodes the record `value` stored under `key` in `table` (`threads`
    /// or `history`). A value that does not decode, or whose times cannot
    /// be stored, is [`BackendError::UndecodableRecord`].
    pub fn of(table: Table, key: &[u8], value: &[u8]) -> Result<ThreadColumns, BackendError> {
        let bad = |detail: String| BackendError::UndecodableRecord {
            table: sql_table(table),
            thread: thread_of_key(key),
            detail,
        };
        let record = ThreadRecord::decode(value).map_err(|e| bad(e.to_string()))?;
        let time = |field: &str, ms: u64| {
            (ms <= LATEST_MS)
                .then(|| UNIX_EPOCH + Duration::from_millis(ms))
                .ok_or_else(|| bad(format!("{field} {ms} ms is past the year 9999")))
        };
        let completed_at = record
            .completed_at
            .map(|ms| time("completed_at", ms))
            .transpose()?;
        if table == Table::History && completed_at.is_none() {
            return Err(bad("a record in history has no completed_at".into()));
        }
        Ok(ThreadColumns {
            id: record.id.to_string(),
            status: record.status.as_str(),
            workflow: without_nul(record.workflow),
            created_at: time("created_at", record.created_at)?,
            updated_at: time("updated_at", record.updated_at)?,
            completed_at,
            head: record.head.to_string(),
            seq: i64::try_from(record.seq)
                .map_err(|_| bad(format!("seq {} does not fit a bigint", record.seq)))?,
            parent_thread: record.parent_thread.map(|p| p.to_string()),
            last_error: record.last_error.map(without_nul),
        })
    }

    /// The values of [`COLUMNS`], in order.
    fn values(&self) -> [&(dyn ToSql + Sync); COLUMN_COUNT] {
        [
            &self.id,
            &self.status,
            &self.workflow,
            &self.created_at,
            &self.updated_at,
            &self.completed_at,
            &self.head,
            &self.seq,
            &self.parent_thread,
            &self.last_error,
        ]
    }

    /// The values of `table`'s typed columns as elements of array
    /// literals (a prepared statement's arguments), in the order of
    /// [`columns_of`]: text as a quoted, escaped element
    /// ([`text_element`]), times as exact UTC milliseconds
    /// ([`utc_literal`]), no value as `NULL`.
    pub fn elements(&self, table: Table) -> Vec<String> {
        let text = super::prepared::text_element;
        fn time(t: &SystemTime) -> String {
            let ms = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
            format!("\"{}\"", utc_literal(ms))
        }
        let optional = |s: &Option<String>| s.as_deref().map_or("NULL".to_owned(), text);
        let all: [String; COLUMN_COUNT] = [
            text(&self.id),
            text(self.status),
            text(&self.workflow),
            time(&self.created_at),
            time(&self.updated_at),
            self.completed_at.as_ref().map_or("NULL".to_owned(), time),
            text(&self.head),
            self.seq.to_string(),
            optional(&self.parent_thread),
            optional(&self.last_error),
        ];
        COLUMNS
            .iter()
            .zip(all)
            .filter(|(c, _)| table == Table::History || !c.history_only)
            .map(|(_, v)| v)
            .collect()
    }

    /// The parameters of `table`'s typed columns, in the order of
    /// [`columns_of`].
    pub fn params(&self, table: Table) -> Vec<(&(dyn ToSql + Sync), Type)> {
        COLUMNS
            .iter()
            .zip(self.values())
            .filter(|(c, _)| table == Table::History || !c.history_only)
            .map(|(c, v)| (v, c.param_type.clone()))
            .collect()
    }
}

/// `s` with each NUL as U+FFFD: PostgreSQL's text cannot hold a NUL, and
/// a column is a projection for SQL readers (the record's `v` bytes keep
/// the exact text), so an agent's error text with a NUL in it is still
/// written, as a parameter or as a literal.
fn without_nul(s: String) -> String {
    if s.contains('\0') {
        s.replace('\0', "\u{fffd}")
    } else {
        s
    }
}

/// `ms` after the Unix epoch as a UTC timestamp PostgreSQL reads exactly:
/// `YYYY-MM-DD HH:MM:SS.mmm+00` (days to a civil date by Howard Hinnant's
/// algorithm, proleptic Gregorian).
fn utc_literal(ms: u128) -> String {
    let secs = ms / 1000;
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
    let rest = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:03}+00",
        rest / 3600,
        rest / 60 % 60,
        rest % 60,
        ms % 1000
    )
}

/// The thread a key of `threads` (its id) or `history` (day, then id)
/// names, for messages: the id when the key ends in one, else the key in
/// hex.
fn thread_of_key(key: &[u8]) -> String {
    key.len()
        .checked_sub(16)
        .and_then(|start| key.get(start..))
        .and_then(ThreadId::from_slice)
        .map(|id| id.to_string())
        .unwrap_or_else(|| key.iter().map(|b| format!("{b:02x}")).collect())
}

/// The statement that writes a row of `table` with its typed columns:
/// parameters `$1` = key, `$2` = value, then [`ThreadColumns::params`].
/// `replace`: an existing row is overwritten (`put`); else it is kept and
/// the statement returns no row (`insert`).
pub(super) fn write_sql(table: Table, replace: bool) -> String {
    let names: Vec<&str> = columns_of(table).map(|c| c.name).collect();
    let placeholders: Vec<String> = (3..names.len() + 3).map(|i| format!("${i}")).collect();
    let mut sql = format!(
        "INSERT INTO {} (k, v, {}) VALUES ($1, $2, {}) ON CONFLICT (k) ",
        sql_table(table),
        names.join(", "),
        placeholders.join(", ")
    );
    if replace {
        sql.push_str("DO UPDATE SET v = EXCLUDED.v");
        for name in &names {
            sql.push_str(&format!(", {name} = EXCLUDED.{name}"));
        }
    } else {
        sql.push_str("DO NOTHING RETURNING 1");
    }
    sql
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_has_every_column_and_threads_all_but_completed_at() {
        assert_eq!(columns_of(Table::History).count(), COLUMNS.len());
        let threads: Vec<&str> = columns_of(Table::Threads).map(|c| c.name).collect();
        assert_eq!(threads.len(), COLUMNS.len() - 1);
        assert!(!threads.contains(&"completed_at"));
        assert_eq!(columns_of(Table::Blobs).count(), 0);
    }

    #[test]
    fn the_write_statement_names_every_column_once() {
        let sql = write_sql(Table::Threads, true);
        assert!(sql.starts_with(
            "INSERT INTO uwf_threads (k, v, id, status, workflow, created_at, updated_at, head, seq, \
             parent_thread, last_error) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
        ));
        assert!(sql.ends_with("last_error = EXCLUDED.last_error"));
        assert!(write_sql(Table::History, false).ends_with("DO NOTHING RETURNING 1"));
    }

    #[test]
    fn a_value_that_does_not_decode_names_the_thread() {
        let id = ThreadId::generate();
        let err = ThreadColumns::of(Table::Threads, &id.to_bytes(), b"\x01garbage").unwrap_err();
        assert!(
            matches!(&err, BackendError::UndecodableRecord { thread, table: "uwf_threads", .. } if *thread == id.to_string()),
            "{err}"
        );
        let err = ThreadColumns::of(Table::History, b"\x00\x01", b"").unwrap_err();
        assert!(err.to_string().contains("0001"), "{err}");
    }

    #[test]
    fn times_are_exact_utc_text() {
        assert_eq!(utc_literal(0), "1970-01-01 00:00:00.000+00");
        assert_eq!(utc_literal(1_795_798_799_976), "2026-11-27 16:59:59.976+00");
        assert_eq!(utc_literal(951_782_400_000), "2000-02-29 00:00:00.000+00");
        assert_eq!(utc_literal(4_102_444_799_999), "2099-12-31 23:59:59.999+00");
        // 2100 is not a leap year; the latest time a column takes.
        assert_eq!(utc_literal(4_107_542_400_000), "2100-03-01 00:00:00.000+00");
        assert_eq!(utc_literal(LATEST_MS.into()), "9999-12-31 23:59:59.999+00");
    }
}

//! The PostgreSQL schema: its tables, indexes and views, its version, and
//! the migration run on first use (`docs/design.md` §4b, "The PostgreSQL
//! schema").
//!
//! Version 1: every table `uwf_<name>(k bytea PRIMARY KEY, v bytea NOT
//! NULL)`. Version 2 adds the typed columns of `uwf_threads` and
//! `uwf_history` ([`super::columns`]), their indexes, and two views for
//! people reading the store with SQL. Version 3 adds `uwf_labels` (the
//! label index, empty in a store written before labels existed).

use postgres::Client;
use postgres::types::{ToSql, Type};

use super::columns::{self, ThreadColumns};
use super::{PostgresBackend, WRITER_LOCK, column, sql_table};
use crate::backend::BackendError;
use crate::backend::Table;
use crate::backend::format::{FORMAT_VERSION, FORMAT_VERSION_KEY};

/// The schema version this build creates and reads.
pub const SCHEMA_VERSION: i32 = 3;

/// The indexes of version 2: `(name, table, columns)`. Each serves a query
/// people run (`docs/design.md` §4b lists them); each is also one more
/// index entry per write of its table, and `uwf_threads` is rewritten by
/// every step, so it has only three.
const INDEXES: [(&str, Table, &str); 7] = [
    // Active threads, newest first.
    ("uwf_threads_updated", Table::Threads, "updated_at"),
    // Active threads by status, newest first.
    ("uwf_threads_status", Table::Threads, "status, updated_at"),
    // A workflow's active threads, newest first.
    (
        "uwf_threads_workflow",
        Table::Threads,
        "workflow, updated_at",
    ),
    // Ended threads by status (failures today), newest first.
    ("uwf_history_status", Table::History, "status, completed_at"),
    // A workflow's ended threads, newest first.
    (
        "uwf_history_workflow",
        Table::History,
        "workflow, completed_at",
    ),
    // Everything that ended in a time range.
    ("uwf_history_completed", Table::History, "completed_at"),
    // An ended thread by id (history grows without bound; the active set
    // is what runs now, and is scanned).
    ("uwf_history_id", Table::History, "id"),
];

/// The views of version 2, for people: every thread (active ∪ ended) with
/// its last activity, and the registered workflows.
const VIEWS: &str = "\
CREATE OR REPLACE VIEW uwf_thread_list AS
  SELECT id, status, workflow, created_at, updated_at,
         NULL::timestamptz AS completed_at, updated_at AS last_activity,
         head, seq, parent_thread, last_error, false AS ended
    FROM uwf_threads
  UNION ALL
  SELECT id, status, workflow, created_at, updated_at,
         completed_at, completed_at AS last_activity,
         head, seq, parent_thread, last_error, true AS ended
    FROM uwf_history;
CREATE OR REPLACE VIEW uwf_workflow_list AS
  SELECT convert_from(k, 'UTF8') AS name, encode(v, 'hex') AS hash
    FROM uwf_workflows;";

/// Rows of a thread table decoded and updated per round trip by the
/// migration's backfill (memory stays bounded, whatever the table's size).
const BACKFILL_BATCH: usize = 256;

impl PostgresBackend {
    /// Brings the database to [`SCHEMA_VERSION`]: nothing when it is there
    /// already (no lock, no DDL, so an opener without the right to change
    /// tables opens it too); else, in one transaction holding the writer
    /// lock (two processes opening at once do not race), creates the schema
    /// (when `create`; else a database without one is
    /// [`BackendError::NotInitialized`]) or migrates an older one. A newer
    /// version is [`BackendError::UnsupportedSchema`].
    ///
    /// An older schema is migrated whatever `create` says: migrations are
    /// applied on first use, and this build writes only the new layout.
    pub(super) fn migrate(&self, create: bool) -> Result<(), BackendError> {
        let mut client = self.client()?;
        let (found, server) = self.stored_version(&mut client)?;
        if server < 120_000 {
            // Prepared statements need `plan_cache_mode` (PostgreSQL 12).
            self.prepares
                .store(false, std::sync::atomic::Ordering::Relaxed);
        }
        match found {
            Some(v) if v == SCHEMA_VERSION => {
                self.release(client);
                return Ok(());
            }
            Some(v) if v > SCHEMA_VERSION => return Err(self.too_new(v)),
            None if !create => {
                self.release(client);
                return Err(BackendError::NotInitialized {
                    path: self.location.clone().into(),
                });
            }
            _ => {}
        }
        // `uwf_schema` is created only when there was none: even `IF NOT
        // EXISTS` needs the right to create tables.
        let create_version_table = if found.is_none() {
            "CREATE TABLE IF NOT EXISTS uwf_schema (version integer NOT NULL);"
        } else {
            ""
        };
        client
            .batch_execute(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock({WRITER_LOCK}); {create_version_table}"
            ))
            .map_err(|e| self.error("starting the schema transaction".into(), e))?;
        let outcome = self.create_or_upgrade(&mut client);
        let end = if outcome.is_ok() {
            "COMMIT"
        } else {
            "ROLLBACK"
        };
        client
            .batch_execute(end)
            .map_err(|e| self.error("ending the schema transaction".into(), e))?;
        outcome?;
        self.release(client);
        Ok(())
    }

    /// The version in `uwf_schema` (`None` when there is no schema) and
    /// the server's version number (`server_version_num`), read in the
    /// same statement.
    ///
    /// A store opened with its schema in place — every command after the
    /// first — reads both in one statement; only where `uwf_schema` is
    /// missing (SQLSTATE 42P01: a new database) does a second statement
    /// read the server's version alone. Each round trip at open is one a
    /// short command (an agent's `uwf-db thread show`) pays on a fresh
    /// server session.
    fn stored_version(&self, client: &mut Client) -> Result<(Option<i32>, i32), BackendError> {
        let both = client.query_typed(
            "SELECT max(version), current_setting('server_version_num')::int4 FROM uwf_schema",
            &[],
        );
        match both {
            Ok(rows) => {
                let Some(r) = rows.first() else {
                    return Err(BackendError::BadSchema {
                        table: "uwf_schema",
                        detail: "max(version) returned no row".into(),
                    });
                };
                return Ok((version_of(r)?, column::<i32>(r, 1, Table::Meta)?));
            }
            Err(e) if e.code() == Some(&postgres::error::SqlState::UNDEFINED_TABLE) => {}
            Err(e) => return Err(self.error("reading the schema version".into(), e)),
        }
        // No schema. One a concurrent `init` makes meanwhile is read
        // again inside the schema transaction (`create_or_upgrade`).
        let rows = client
            .query_typed("SELECT current_setting('server_version_num')::int4", &[])
            .map_err(|e| self.error("reading the server's version".into(), e))?;
        let server = match rows.first() {
            Some(r) => column::<i32>(r, 0, Table::Meta)?,
            None => 0,
        };
        Ok((None, server))
    }

    /// `max(version)` of `uwf_schema` (which exists).
    fn read_version(&self, client: &mut Client) -> Result<Option<i32>, BackendError> {
        let rows = client
            .query_typed("SELECT max(version) FROM uwf_schema", &[])
            .map_err(|e| self.error("reading the schema version".into(), e))?;
        rows.first()
            .map(version_of)
            .transpose()
            .map(Option::flatten)
    }

    fn too_new(&self, found: i32) -> BackendError {
        BackendError::UnsupportedSchema {
            location: self.location.clone(),
            found,
            supported: SCHEMA_VERSION,
        }
    }

    /// Inside the schema transaction, with the writer lock held: reads the
    /// version again (another process may have just created or migrated
    /// the schema) and does what is left.
    fn create_or_upgrade(&self, client: &mut Client) -> Result<(), BackendError> {
        match self.read_version(client)? {
            None => self.create_schema(client),
            Some(1) => {
                self.migrate_from_1(client)?;
                self.migrate_from_2(client)?;
                self.set_version(client)
            }
            Some(2) => {
                self.migrate_from_2(client)?;
                self.set_version(client)
            }
            Some(SCHEMA_VERSION) => Ok(()),
            Some(v) if v > SCHEMA_VERSION => Err(self.too_new(v)),
            Some(v) => Err(BackendError::BadSchema {
                table: "uwf_schema",
                detail: format!("unknown schema version {v}"),
            }),
        }
    }

    /// A new store: every table at the current version, its indexes and
    /// views, the version and the store's format version.
    fn create_schema(&self, client: &mut Client) -> Result<(), BackendError> {
        let mut ddl = String::new();
        for table in Table::ALL {
            let mut columns = String::from("k bytea PRIMARY KEY, v bytea NOT NULL");
            for c in columns::columns_of(table) {
                columns.push_str(&format!(", {} {}", c.name, c.sql_type));
                if c.required {
                    columns.push_str(" NOT NULL");
                }
            }
            ddl.push_str(&format!(
                "CREATE TABLE IF NOT EXISTS {} ({columns});\n",
                sql_table(table)
            ));
        }
        ddl.push_str(&indexes_and_views());
        client
            .batch_execute(&ddl)
            .map_err(|e| self.error("creating the schema".into(), e))?;
        let version: [(&(dyn ToSql + Sync), Type); 1] = [(&SCHEMA_VERSION, Type::INT4)];
        let format_version = FORMAT_VERSION.to_be_bytes();
        client
            .query_typed("INSERT INTO uwf_schema (version) VALUES ($1)", &version)
            .and_then(|_| {
                client.query_typed(
                    "INSERT INTO uwf_meta (k, v) VALUES ($1, $2) ON CONFLICT (k) DO NOTHING",
                    &[
                        (&FORMAT_VERSION_KEY.as_bytes(), Type::BYTEA),
                        (&&format_version[..], Type::BYTEA),
                    ],
                )
            })
            .map_err(|e| self.error("writing the schema version".into(), e))?;
        Ok(())
    }

    /// Version 1 → 2: adds the typed columns (nullable), fills them from
    /// every record in batches, then makes the required ones `NOT NULL`,
    /// builds the indexes and views (the caller goes on to version 3 and
    /// records it) — all in the
    /// caller's transaction, so a failure (a record that does not decode, a
    /// lost connection) leaves version 1 as it was.
    fn migrate_from_1(&self, client: &mut Client) -> Result<(), BackendError> {
        let op = || "migrating the schema from version 1 to 2".to_owned();
        for table in [Table::Threads, Table::History] {
            let name = sql_table(table);
            let add: Vec<String> = columns::columns_of(table)
                .map(|c| format!("ADD COLUMN {} {}", c.name, c.sql_type))
                .collect();
            client
                .batch_execute(&format!("ALTER TABLE {name} {};", add.join(", ")))
                .map_err(|e| self.error(op(), e))?;
            self.backfill(client, table)?;
            let required: Vec<String> = columns::columns_of(table)
                .filter(|c| c.required)
                .map(|c| format!("ALTER COLUMN {} SET NOT NULL", c.name))
                .collect();
            client
                .batch_execute(&format!("ALTER TABLE {name} {};", required.join(", ")))
                .map_err(|e| self.error(op(), e))?;
        }
        client
            .batch_execute(&indexes_and_views())
            .map_err(|e| self.error(op(), e))?;
        Ok(())
    }

    /// Version 2 → 3: the label index table (empty: no record written
    /// before it has labels).
    fn migrate_from_2(&self, client: &mut Client) -> Result<(), BackendError> {
        client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {} (k bytea PRIMARY KEY, v bytea NOT NULL);",
                sql_table(Table::Labels)
            ))
            .map_err(|e| self.error("migrating the schema from version 2 to 3".into(), e))
    }

    /// Records [`SCHEMA_VERSION`] at the end of a migration.
    fn set_version(&self, client: &mut Client) -> Result<(), BackendError> {
        client
            .query_typed(
                "UPDATE uwf_schema SET version = $1",
                &[(&SCHEMA_VERSION, Type::INT4)],
            )
            .map_err(|e| self.error("recording the schema version".into(), e))?;
        Ok(())
    }

    /// Fills the typed columns of every row of `table` from its record, in
    /// key order, [`BACKFILL_BATCH`] rows per round trip each way.
    fn backfill(&self, client: &mut Client, table: Table) -> Result<(), BackendError> {
        let name = sql_table(table);
        let op = || format!("filling the typed columns of {name}");
        let first = format!("SELECT k, v FROM {name} ORDER BY k LIMIT {BACKFILL_BATCH}");
        let next =
            format!("SELECT k, v FROM {name} WHERE k > $1 ORDER BY k LIMIT {BACKFILL_BATCH}");
        let mut after: Option<Vec<u8>> = None;
        loop {
            let rows = match &after {
                None => client.query_typed(&first, &[]),
                Some(k) => client.query_typed(&next, &[(k, Type::BYTEA)]),
            }
            .map_err(|e| self.error(op(), e))?;
            let mut batch = Vec::with_capacity(rows.len());
            for row in &rows {
                let key: Vec<u8> = column(row, 0, table)?;
                let value: Vec<u8> = column(row, 1, table)?;
                let typed = ThreadColumns::of(table, &key, &value)?;
                batch.push((key, typed));
            }
            let Some((last, _)) = batch.last() else {
                return Ok(());
            };
            after = Some(last.clone());
            let mut params: Vec<(&(dyn ToSql + Sync), Type)> = Vec::new();
            for (key, typed) in &batch {
                params.push((key, Type::BYTEA));
                params.extend(typed.params(table));
            }
            client
                .query_typed(&backfill_sql(table, batch.len()), &params)
                .map_err(|e| self.error(op(), e))?;
            if batch.len() < BACKFILL_BATCH {
                return Ok(());
            }
        }
    }
}

/// `UPDATE` of `rows` rows' typed columns from a `VALUES` list, each row
/// `(k, the columns of table)`.
fn backfill_sql(table: Table, rows: usize) -> String {
    let names: Vec<&str> = columns::columns_of(table).map(|c| c.name).collect();
    let width = names.len() + 1;
    let values: Vec<String> = (0..rows)
        .map(|r| {
            let row: Vec<String> = (1..=width).map(|c| format!("${}", r * width + c)).collect();
            format!("({})", row.join(", "))
        })
        .collect();
    let set: Vec<String> = names.iter().map(|n| format!("{n} = u.{n}")).collect();
    format!(
        "UPDATE {table} AS t SET {set} FROM (VALUES {values}) AS u(k, {names}) WHERE t.k = u.k",
        table = sql_table(table),
        set = set.join(", "),
        values = values.join(", "),
        names = names.join(", "),
    )
}

/// The indexes and views of the current version (idempotent).
fn indexes_and_views() -> String {
    let mut ddl = String::new();
    for (name, table, columns) in INDEXES {
        ddl.push_str(&format!(
            "CREATE INDEX IF NOT EXISTS {name} ON {} ({columns});\n",
            sql_table(table)
        ));
    }
    ddl.push_str(VIEWS);
    ddl
}

/// The schema version in column 0 of `row` (`max(version)`: null when
/// `uwf_schema` is empty).
fn version_of(row: &postgres::Row) -> Result<Option<i32>, BackendError> {
    row.try_get::<_, Option<i32>>(0)
        .map_err(|e| BackendError::BadSchema {
            table: "uwf_schema",
            detail: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backfill_update_numbers_every_row() {
        let sql = backfill_sql(Table::Threads, 2);
        assert!(
            sql.contains("($1, $2, $3, $4, $5, $6, $7, $8, $9, $10), ($11, $12,"),
            "{sql}"
        );
        assert!(sql.ends_with("$20)) AS u(k, id, status, workflow, created_at, updated_at, head, seq, parent_thread, last_error) WHERE t.k = u.k"), "{sql}");
    }
}

//! The PostgreSQL schema: its tables, its version, and the migration run
//! on first use.

use postgres::types::Type;

use super::{PostgresBackend, WRITER_LOCK, sql_table};
use crate::backend::Table;
use crate::store::{FORMAT_VERSION, FORMAT_VERSION_KEY, StoreError};

/// The schema version this build creates and reads.
pub const SCHEMA_VERSION: i32 = 1;

impl PostgresBackend {
    /// Creates the tables and the schema version in one transaction under
    /// the writer lock (so two processes starting at once do not race), or
    /// checks the version of an existing schema.
    pub(super) fn migrate(&self, create: bool) -> Result<(), StoreError> {
        let mut client = self.client()?;
        if !create {
            let exists: Option<bool> = client
                .query_typed("SELECT to_regclass('uwf_schema') IS NOT NULL", &[])
                .map_err(|e| self.error("looking for the schema".into(), e))?
                .first()
                .and_then(|r| r.try_get(0).ok());
            if exists != Some(true) {
                return Err(StoreError::NotInitialized {
                    path: self.location.clone().into(),
                });
            }
        }
        let mut ddl = format!(
            "BEGIN; SELECT pg_advisory_xact_lock({WRITER_LOCK}); \
             CREATE TABLE IF NOT EXISTS uwf_schema (version integer NOT NULL);"
        );
        for table in Table::ALL {
            ddl.push_str(&format!(
                " CREATE TABLE IF NOT EXISTS {} (k bytea PRIMARY KEY, v bytea NOT NULL);",
                sql_table(table)
            ));
        }
        client
            .batch_execute(&ddl)
            .map_err(|e| self.error("creating the schema".into(), e))?;
        let found: Option<i32> = client
            .query_typed("SELECT max(version) FROM uwf_schema", &[])
            .map_err(|e| self.error("reading the schema version".into(), e))?
            .first()
            .and_then(|row| row.try_get(0).ok().flatten());
        let outcome = match found {
            Some(v) if v > SCHEMA_VERSION => Err(StoreError::UnsupportedSchema {
                location: self.location.clone(),
                found: v,
                supported: SCHEMA_VERSION,
            }),
            Some(_) => Ok(()),
            None => client
                .query_typed(
                    "INSERT INTO uwf_schema (version) VALUES ($1)",
                    &[(&SCHEMA_VERSION, Type::INT4)],
                )
                .and_then(|_| {
                    client.query_typed(
                        "INSERT INTO uwf_meta (k, v) VALUES ($1, $2) ON CONFLICT (k) DO NOTHING",
                        &[
                            (&FORMAT_VERSION_KEY.as_bytes(), Type::BYTEA),
                            (&&FORMAT_VERSION.to_be_bytes()[..], Type::BYTEA),
                        ],
                    )
                })
                .map(|_| ())
                .map_err(|e| self.error("writing the schema version".into(), e)),
        };
        let end = if outcome.is_ok() {
            "COMMIT"
        } else {
            "ROLLBACK"
        };
        client
            .batch_execute(end)
            .map_err(|e| self.error("creating the schema".into(), e))?;
        outcome?;
        self.release(client);
        Ok(())
    }
}

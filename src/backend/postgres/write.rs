//! `WriteTables` on PostgreSQL: puts, inserts, deletes and refreshes held
//! back or sent, and the commit.

use super::*;

impl PgWrite<'_> {
    /// Runs a write statement now; returns the rows it returned. The key's
    /// cached value is forgotten (`insert`, `delete` set it after).
    pub(super) fn now(
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
    pub(super) fn literal_write(
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
    pub(super) fn hold(
        &mut self,
        table: Table,
        key: &[u8],
        held: Held,
    ) -> Result<(), BackendError> {
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

    pub(super) fn hold_put(
        &mut self,
        table: Table,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), BackendError> {
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
    pub(super) fn known(
        &mut self,
        table: Table,
        key: &[u8],
    ) -> Result<Option<Option<Vec<u8>>>, BackendError> {
        let mut state = self.0.state.borrow_mut();
        self.0.send_held_for(&mut state, table, Some(key))?;
        Ok(Txn::known(&state, table, key))
    }

    pub(super) fn forget(&mut self, table: Table, key: &[u8]) {
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
            // Known absent: a thread's record stays so while this
            // transaction holds its order lock; a blob another writer
            // puts meanwhile has the same bytes (content addressing).
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
            return crate::backend::insert_then_refresh(self, table, key, value, refresh);
        }
        let name = sql_table(table);
        let (from, end) = (refresh.offset + 1, refresh.offset + 8);
        // Statements that wait for no other writer in the common
        // case, a blob stored already and refreshed recently (the same
        // reply in many threads; §8f):
        // - the insert is tried only when the key is absent from the
        //   statement's snapshot, so a stored blob that another
        //   transaction is refreshing is not waited for (`ON CONFLICT`
        //   alone waits for that transaction to end);
        // - the refresh locks the row only when it is due (not `ON
        //   CONFLICT DO UPDATE … WHERE`, which locks the stored row even
        //   when it leaves it alone), and a refresh that is not required
        //   skips a row another writer is refreshing right now.
        let k = bytea_literal(key);
        let due = format!(
            "k = {k} AND length(v) >= {end} AND substring(v FROM {from} FOR 8) < {}",
            bytea_literal(&refresh.below.to_be_bytes())
        );
        let target = if refresh.required {
            due
        } else {
            format!("k = (SELECT k FROM {name} WHERE {due} FOR UPDATE SKIP LOCKED)")
        };
        // One statement: the `UPDATE` leaves alone a row this statement
        // inserted (a new blob is stamped already).
        let sql = format!(
            "WITH inserted AS (INSERT INTO {name} (k, v) SELECT {k}, {} \
             WHERE NOT EXISTS (SELECT 1 FROM {name} WHERE k = {k}) \
             ON CONFLICT (k) DO NOTHING RETURNING 1) \
             UPDATE {name} SET v = overlay(v PLACING {} FROM {from} FOR 8) \
             WHERE {target} AND NOT EXISTS (SELECT 1 FROM inserted)",
            bytea_literal(value),
            bytea_literal(&refresh.stamp.to_be_bytes()),
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

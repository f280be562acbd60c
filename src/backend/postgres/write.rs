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

    /// The elements of a held put's row but its value: the key and, for
    /// the thread tables, their typed columns filled from `value`
    /// ([`columns`]), in the order of the put statement's arrays
    /// ([`prepared::Kind::Put`]).
    pub(super) fn row_elements(
        table: Table,
        key: &[u8],
        value: &[u8],
    ) -> Result<Vec<String>, BackendError> {
        let mut row = vec![prepared::bytea_element(key)];
        if columns::has_columns(table) {
            let typed = columns::ThreadColumns::of(table, key, value)?;
            row.extend(typed.elements(table));
        }
        Ok(row)
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
        let added = held.sql_len();
        if let Some(old) = state.held.insert((table, key.to_vec()), held) {
            state.held_sql -= old.sql_len().min(state.held_sql);
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
        let row = Self::row_elements(table, key, value)?;
        self.hold(
            table,
            key,
            Held::Put {
                value: value.to_vec(),
                row,
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
        let element = prepared::bytea_element(key);
        self.hold(table, key, Held::Remove { key: element })
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
        let bounds = RefreshBounds {
            from: refresh.offset + 1,
            below: refresh.below,
            stamp: refresh.stamp,
            required: refresh.required,
        };
        let held = Held::Refresh {
            key: prepared::bytea_element(key),
            value: value.to_vec(),
            bounds,
        };
        self.hold(table, key, held)
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

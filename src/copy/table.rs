//! Copying one table in chunks: each chunk's rows compared with the
//! destination's (reconciled, so a rerun after an interruption resumes
//! where it stopped), written in one transaction, and digested
//! (`docs/design.md` §4c). The whole copy's order, options and report are
//! `mod.rs`.

use super::*;

/// Rows and bytes per destination transaction.
#[derive(Clone, Copy)]
pub(super) struct Chunk {
    pub(super) rows: usize,
    pub(super) bytes: usize,
}

/// A table's rows as they go by: count, bytes and digest.
pub(super) struct Digest {
    pub(super) hasher: blake3::Hasher,
    pub(super) rows: u64,
    pub(super) bytes: u64,
}
impl Digest {
    pub(super) fn new() -> Self {
        Digest {
            hasher: blake3::Hasher::new(),
            rows: 0,
            bytes: 0,
        }
    }

    pub(super) fn add(&mut self, key: &[u8], value: &[u8]) {
        for part in [key, value] {
            self.hasher.update(&(part.len() as u64).to_be_bytes());
            self.hasher.update(part);
        }
        self.rows += 1;
        self.bytes += (key.len() + value.len()) as u64;
    }

    pub(super) fn finish(&self, table: Table) -> TableDigest {
        TableDigest {
            table,
            rows: self.rows,
            bytes: self.bytes,
            digest: self.hasher.finalize().to_hex().to_string(),
        }
    }
}

/// What one destination transaction did.
#[derive(Default)]
pub(super) struct ChunkOutcome {
    /// Source rows (from the front of the buffer) it handled.
    pub(super) taken: usize,
    /// The last key it handled, on either side.
    pub(super) last: Option<Vec<u8>>,
    pub(super) written: u64,
    pub(super) deleted: u64,
    /// Both sides are exhausted and handled: the table is done.
    pub(super) finished: bool,
}

pub(super) type Row = (Vec<u8>, Vec<u8>);

/// One copy in progress: the destination and how to write it.
pub(super) struct Copy<'a> {
    pub(super) dst: &'a Store,
    pub(super) from: &'a str,
    pub(super) to: &'a str,
    pub(super) chunk: Chunk,
    pub(super) cancel: Option<&'a Cancel>,
}
impl Copy<'_> {
    pub(super) fn dest_err(&self, source: StoreError) -> CopyError {
        CopyError::Destination {
            location: self.to.to_owned(),
            source,
        }
    }

    pub(super) fn source_err(&self, source: StoreError) -> CopyError {
        CopyError::Source {
            location: self.from.to_owned(),
            source,
        }
    }

    /// Checks the source, claims the destination and copies every table
    /// from the snapshot `src`. Returns whether this run continued an
    /// unfinished copy, and each table's outcome.
    pub(super) fn all_tables(
        &self,
        src: &dyn ReadTables,
        progress: &mut impl FnMut(CopyProgress),
    ) -> Result<(bool, Vec<TableCopy>), CopyError> {
        if let Some(marker) = UnfinishedCopy::read(src).map_err(|e| self.source_err(e))? {
            return Err(CopyError::SourceUnfinished {
                location: self.from.to_owned(),
                from: marker.source,
            });
        }
        let format = read_format_version(src, self.from).map_err(|e| self.source_err(e))?;
        let resumed = self.claim(format)?;

        let mut total = 0;
        for table in copy_order() {
            total += match table {
                // A few keys, some of which are not copied.
                Table::Meta => moved_meta_keys(src),
                _ => src.count(table).map_err(StoreError::from),
            }
            .map_err(|e| self.source_err(e))?;
        }
        progress(CopyProgress::Started { total, resumed });
        let mut done = 0;
        let mut tables = Vec::new();
        for table in copy_order() {
            tables.push(self.table(src, table, &mut |rows| {
                done += rows;
                progress(CopyProgress::Copied { table, done, total });
            })?);
        }
        Ok((resumed, tables))
    }

    /// In one destination transaction: continue an unfinished copy of this
    /// source (`true`), or mark an empty store as one (`false`), or refuse.
    pub(super) fn claim(&self, source_format: u32) -> Result<bool, CopyError> {
        self.dst
            .write_exclusive(|w| {
                let t = w.tables();
                let format = read_format_version(t, self.to)?;
                if format != source_format {
                    return Ok(Err(CopyError::FormatMismatch {
                        source_version: source_format,
                        destination_version: format,
                    }));
                }
                match UnfinishedCopy::read(t)? {
                    Some(marker) if marker.source == self.from => return Ok(Ok(true)),
                    Some(marker) => {
                        return Ok(Err(CopyError::OtherCopy {
                            location: self.to.to_owned(),
                            other: marker.source,
                            from: self.from.to_owned(),
                        }));
                    }
                    None => {}
                }
                if let Some(what) = first_content(t)? {
                    return Ok(Err(CopyError::DestinationNotEmpty {
                        location: self.to.to_owned(),
                        from: self.from.to_owned(),
                        what,
                    }));
                }
                let marker = UnfinishedCopy {
                    source: self.from.to_owned(),
                    started_at: now_ms(),
                };
                w.tables_mut()
                    .put(Table::Meta, COPY_MARKER_KEY.as_bytes(), &marker.encode())?;
                Ok(Ok(false))
            })
            .map_err(|e| self.dest_err(e))?
    }

    /// Makes `table` in the destination equal to `table` in the snapshot
    /// `src`, a chunk per destination transaction. `handled` gets the
    /// number of source rows each committed chunk covered.
    pub(super) fn table(
        &self,
        src: &dyn ReadTables,
        table: Table,
        handled: &mut dyn FnMut(u64),
    ) -> Result<TableCopy, CopyError> {
        let mut rows = src
            .range(table, KeyRange::ALL, Direction::Forward)
            .map_err(|e| self.source_err(e.into()))?;
        let mut source_done = false;
        // Source rows read and not yet committed; `buffered` their bytes.
        let mut pending: VecDeque<Row> = VecDeque::new();
        let mut buffered = 0;
        // Every key up to and including `cursor` is equal on both sides.
        let mut cursor: Option<Vec<u8>> = None;
        let mut digest = Digest::new();
        let (mut written, mut deleted) = (0, 0);
        loop {
            if self.cancel.is_some_and(Cancel::is_cancelled) {
                return Err(CopyError::Cancelled {
                    location: self.to.to_owned(),
                });
            }
            while !source_done && pending.len() < self.chunk.rows && buffered < self.chunk.bytes {
                match rows.next() {
                    Some(entry) => {
                        let (key, value) = entry.map_err(|e| self.source_err(e.into()))?;
                        if copied(table, &key) {
                            buffered += key.len() + value.len();
                            pending.push_back((key.into_owned(), value.into_owned()));
                        }
                    }
                    None => source_done = true,
                }
            }
            let outcome = self
                .dst
                .write(|w| {
                    let after = cursor.as_deref();
                    let theirs = destination_rows(w.tables(), table, after, self.chunk)?;
                    reconcile(w.tables_mut(), table, &pending, source_done, theirs)
                })
                .map_err(|e| self.dest_err(e))?;
            for (key, value) in pending.drain(..outcome.taken) {
                buffered -= key.len() + value.len();
                digest.add(&key, &value);
            }
            written += outcome.written;
            deleted += outcome.deleted;
            if outcome.last.is_some() {
                cursor = outcome.last;
            }
            handled(outcome.taken as u64);
            if outcome.finished {
                break;
            }
        }
        let d = digest.finish(table);
        Ok(TableCopy {
            table,
            rows: d.rows,
            bytes: d.bytes,
            written,
            deleted,
            digest: d.digest,
        })
    }

    /// Deletes the marker: the destination is a finished copy.
    pub(super) fn finish(&self) -> Result<(), CopyError> {
        self.dst
            .write_exclusive(|w| {
                Ok(match UnfinishedCopy::read(w.tables())? {
                    Some(marker) if marker.source == self.from => {
                        w.tables_mut()
                            .delete(Table::Meta, COPY_MARKER_KEY.as_bytes())?;
                        Ok(())
                    }
                    _ => Err(CopyError::Mismatch {
                        table: Table::Meta,
                        detail: format!(
                            "the copy marker was changed or removed during the copy (expected \
                             an unfinished copy of {})",
                            self.from
                        ),
                    }),
                })
            })
            .map_err(|e| self.dest_err(e))?
    }
}

/// How many `meta` rows a copy moves.
pub(super) fn moved_meta_keys(t: &dyn ReadTables) -> Result<u64, StoreError> {
    let mut n = 0;
    for entry in t.range(Table::Meta, KeyRange::ALL, Direction::Forward)? {
        n += u64::from(copied(Table::Meta, &entry?.0));
    }
    Ok(n)
}

/// The first thing that makes a store non-empty: a row in any table but
/// `meta`, or a `meta` key besides the format version and the keys a copy
/// does not move.
pub(super) fn first_content(t: &dyn ReadTables) -> Result<Option<String>, StoreError> {
    for table in copy_order() {
        for entry in t.range(table, KeyRange::ALL, Direction::Forward)? {
            let (key, _) = entry?;
            if table != Table::Meta {
                return Ok(Some(format!("its {table} table has rows")));
            }
            if copied(table, &key) && *key != *FORMAT_VERSION_KEY.as_bytes() {
                return Ok(Some(format!(
                    "its meta table has the setting '{}'",
                    String::from_utf8_lossy(&key)
                )));
            }
        }
    }
    Ok(None)
}

/// The destination's rows of `table` after `after`, at most a chunk of
/// them, and whether they are all of them.
pub(super) fn destination_rows(
    t: &dyn ReadTables,
    table: Table,
    after: Option<&[u8]>,
    chunk: Chunk,
) -> Result<(Vec<Row>, bool), StoreError> {
    let range = after.map_or(KeyRange::ALL, KeyRange::after);
    let mut rows = Vec::new();
    let mut bytes = 0;
    for entry in t.range(table, range, Direction::Forward)? {
        let (key, value) = entry?;
        if !copied(table, &key) {
            continue;
        }
        if rows.len() >= chunk.rows || bytes >= chunk.bytes {
            return Ok((rows, false));
        }
        bytes += key.len() + value.len();
        rows.push((key.into_owned(), value.into_owned()));
    }
    Ok((rows, true))
}

/// One chunk: makes the destination's rows equal to the source's for every
/// key both sides are known up to. `ours` are the source rows read so far
/// (`source_done`: all of them), `theirs` the destination's next rows.
pub(super) fn reconcile(
    t: &mut dyn crate::backend::WriteTables,
    table: Table,
    ours: &VecDeque<Row>,
    source_done: bool,
    (theirs, dest_done): (Vec<Row>, bool),
) -> Result<ChunkOutcome, StoreError> {
    // Beyond the last row read on a side that has more, that side is not
    // known yet: stop at the smaller of those keys.
    let limit = [
        (!source_done).then(|| ours.back().map(|(k, _)| k.as_slice())),
        (!dest_done).then(|| theirs.last().map(|(k, _)| k.as_slice())),
    ]
    .into_iter()
    .flatten()
    .flatten()
    .min();
    let known = |row: &&Row| limit.is_none_or(|l| row.0.as_slice() <= l);
    let mut out = ChunkOutcome {
        finished: limit.is_none(),
        ..ChunkOutcome::default()
    };
    let (mut i, mut j) = (0, 0);
    let mut last: Option<&[u8]> = None;
    loop {
        let handled = match (ours.get(i).filter(known), theirs.get(j).filter(known)) {
            (None, None) => break,
            (Some((key, value)), None) => {
                t.put(table, key, value)?;
                out.written += 1;
                i += 1;
                key
            }
            (None, Some((key, _))) => {
                t.delete(table, key)?;
                out.deleted += 1;
                j += 1;
                key
            }
            (Some((key, value)), Some((their_key, their_value))) => match key.cmp(their_key) {
                std::cmp::Ordering::Less => {
                    t.put(table, key, value)?;
                    out.written += 1;
                    i += 1;
                    key
                }
                std::cmp::Ordering::Greater => {
                    t.delete(table, their_key)?;
                    out.deleted += 1;
                    j += 1;
                    their_key
                }
                std::cmp::Ordering::Equal => {
                    if value != their_value {
                        t.put(table, key, value)?;
                        out.written += 1;
                    }
                    i += 1;
                    j += 1;
                    key
                }
            },
        };
        last = Some(handled);
    }
    out.taken = i;
    out.last = last.map(<[u8]>::to_vec);
    Ok(out)
}

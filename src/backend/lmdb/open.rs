//! Opening the LMDB databases of a store: one per table, created or
//! found, the format version checked, and whether values carry checksums.

use super::*;

/// One LMDB database per table, in [`Table::ALL`] order; `None` for a
/// table a store opened read-only does not have yet (it was made before
/// the table was, and cannot be given it: it reads as empty).
#[derive(Clone, Copy)]
pub(super) struct TableDbs(pub(super) [Option<Database<Bytes, Bytes>>; Table::ALL.len()]);

impl TableDbs {
    #[allow(clippy::indexing_slicing)] // `Table::index` is below `Table::ALL.len()` by construction
    pub(super) fn get(&self, table: Table) -> Option<Database<Bytes, Bytes>> {
        self.0[table.index()]
    }
}

/// Why a store is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpenFor {
    /// To read and write it: the format version must be readable and ours.
    Use,
    /// To read what can still be read of a damaged store (`salvage`):
    /// read-only, and a format version that cannot be read (its page is
    /// damaged) is no reason to refuse; the layout is then told from the
    /// rows themselves ([`guess_checksums`]).
    Salvage,
}

/// Opens the databases, creating them (and writing the format version) in a
/// new store; checks the format version of an existing one. Returns them
/// and whether the store's values carry checksums (`sum.rs`): a new store's
/// do, an existing one's do when its version value is 8 bytes (the version
/// and its trailer) and not when it is 4 (the legacy layout).
pub(super) fn open_databases(
    env: &Env<WithoutTls>,
    path: &Path,
    purpose: OpenFor,
    read_only: bool,
    fail: &dyn Fn(&str, heed::Error) -> BackendError,
) -> Result<(TableDbs, bool), BackendError> {
    // Fast path: an existing store needs only a read transaction, so opening
    // it never waits for another process's write transaction.
    let rtxn = env.read_txn().map_err(|e| fail("opening", e))?;
    let mut found = Vec::with_capacity(Table::ALL.len());
    for table in Table::ALL {
        found.push(
            env.open_database::<Bytes, Bytes>(&rtxn, Some(table.name()))
                .map_err(|e| fail("opening a database", e))?,
        );
    }
    // Every table there, or a store this process may not write (one made
    // before a table was added, say): no write transaction.
    let complete = found.iter().all(Option::is_some);
    let has_meta = found.get(Table::Meta.index()).is_some_and(Option::is_some);
    if complete || (read_only && has_meta) {
        let dbs = TableDbs(<[_; Table::ALL.len()]>::try_from(found).map_err(|_| {
            BackendError::MissingFormat {
                path: path.to_path_buf(),
                detail: "could not open every database".into(),
            }
        })?);
        let stored = match dbs.get(Table::Meta) {
            Some(meta) => meta
                .get(&rtxn, FORMAT_VERSION_KEY.as_bytes())
                .map_err(|e| fail("reading the format version", e))
                .map(|v| v.map(<[u8]>::to_vec)),
            None => Ok(None),
        };
        // Committing makes the database handles usable by later
        // transactions (LMDB), whatever the version read gave.
        rtxn.commit().map_err(|e| fail("opening", e))?;
        let checked = stored.and_then(|stored| {
            let (version, checksums) = layout(path, stored.as_deref())?;
            check_format(path, version)?;
            Ok(checksums)
        });
        return match (checked, purpose) {
            (Ok(checksums), _) => Ok((dbs, checksums)),
            // A newer format, told by a version whose checksum matches,
            // is not damage: salvage would misread it.
            (Err(e @ BackendError::UnsupportedFormat { .. }), _) | (Err(e), OpenFor::Use) => Err(e),
            (Err(_), OpenFor::Salvage) => {
                let checksums = guess_checksums(env, &dbs);
                Ok((dbs, checksums))
            }
        };
    }
    drop(rtxn);

    let mut wtxn = env.write_txn().map_err(|e| fail("creating", e))?;
    let mut created = Vec::with_capacity(Table::ALL.len());
    for table in Table::ALL {
        created.push(
            env.create_database::<Bytes, Bytes>(&mut wtxn, Some(table.name()))
                .map_err(|e| fail("creating a database", e))?,
        );
    }
    let dbs: [Database<Bytes, Bytes>; Table::ALL.len()] =
        created
            .try_into()
            .map_err(|_| BackendError::MissingFormat {
                path: path.to_path_buf(),
                detail: "could not create every database".into(),
            })?;
    let [meta, blobs] = [Table::Meta, Table::Blobs].map(|t| {
        #[allow(clippy::indexing_slicing)] // `Table::index` is below `Table::ALL.len()`
        dbs[t.index()]
    });
    let dbs = TableDbs(dbs.map(Some));
    let stored = meta
        .get(&wtxn, FORMAT_VERSION_KEY.as_bytes())
        .map_err(|e| fail("reading the format version", e))?
        .map(<[u8]>::to_vec);
    let checksums = match stored {
        Some(v) => {
            let (version, checksums) = layout(path, Some(&v))?;
            check_format(path, version)?;
            checksums
        }
        None => {
            let has_data = !blobs
                .is_empty(&wtxn)
                .map_err(|e| fail("reading the blobs database", e))?;
            if has_data {
                return Err(BackendError::MissingFormat {
                    path: path.to_path_buf(),
                    detail: "blobs are stored but the version key is absent".into(),
                });
            }
            // A new store: the checksummed layout.
            let key = FORMAT_VERSION_KEY.as_bytes();
            meta.put(
                &mut wtxn,
                key,
                &sum::with_sum(Table::Meta, key, &FORMAT_VERSION.to_be_bytes()),
            )
            .map_err(|e| fail("writing the format version", e))?;
            true
        }
    };
    wtxn.commit().map_err(|e| fail("creating", e))?;
    Ok((dbs, checksums))
}

/// Whether the values of a store whose format version cannot be read carry
/// checksums, told by the first rows that can be read: a row whose last
/// four bytes are its checksum votes for the checksummed layout, any other
/// row for the legacy one (a legacy value ends with its checksum by chance
/// one time in 2^32). No row read: the checksummed layout (there is nothing
/// to misread). Reads stop at a table's first error.
pub(super) fn guess_checksums(env: &Env<WithoutTls>, dbs: &TableDbs) -> bool {
    /// Rows read before deciding.
    const VOTES: usize = 16;
    let (mut with, mut without) = (0usize, 0usize);
    let Ok(rtxn) = env.read_txn() else {
        return true;
    };
    let tables = [
        Table::Threads,
        Table::History,
        Table::Workflows,
        Table::Pins,
        Table::Blobs,
        Table::Meta,
    ];
    for table in tables {
        let Some(Ok(rows)) = dbs.get(table).map(|db| db.iter(&rtxn)) else {
            continue;
        };
        for row in rows.take(VOTES) {
            let Ok((key, value)) = row else { break };
            if sum::strip(table, key, value).is_some() {
                with += 1;
            } else {
                without += 1;
            }
        }
        if with + without >= VOTES {
            break;
        }
    }
    with >= without
}

/// The format version value of a stored one, and whether the store has the
/// checksummed layout (8 bytes: the version and a trailer that matches) or
/// the legacy one (4 bytes); anything else is left to [`check_format`].
pub(super) fn layout<'v>(
    path: &Path,
    stored: Option<&'v [u8]>,
) -> Result<(Option<&'v [u8]>, bool), BackendError> {
    match stored {
        Some(v) if v.len() == 4 + sum::SUM_LEN => {
            match sum::strip(Table::Meta, FORMAT_VERSION_KEY.as_bytes(), v) {
                Some(version) => Ok((Some(version), true)),
                None => Err(BackendError::DamagedPage {
                    path: path.join("data.mdb"),
                    op: "reading the format version".into(),
                    detail: "the format version does not match its checksum".into(),
                }),
            }
        }
        other => Ok((other, false)),
    }
}

pub(super) fn check_format(path: &Path, stored: Option<&[u8]>) -> Result<(), BackendError> {
    let missing = |detail: String| BackendError::MissingFormat {
        path: path.to_path_buf(),
        detail,
    };
    let value = stored.ok_or_else(|| missing("the version key is absent".into()))?;
    match parse_format(value) {
        Some(FORMAT_VERSION) => Ok(()),
        Some(found) => Err(BackendError::UnsupportedFormat {
            path: path.to_path_buf(),
            found,
        }),
        None => Err(missing(format!(
            "the version value has {} bytes, not 4",
            value.len()
        ))),
    }
}

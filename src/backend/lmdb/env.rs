//! The one audited module with `unsafe`: opening the LMDB environment.
//!
//! heed marks environment opening and unsafe flags as `unsafe` because LMDB
//! maps the data file into memory; what the caller must guarantee, and how
//! this module does, is written at each block.

#![allow(unsafe_code)]

use std::path::Path;

use heed::{Env, EnvFlags, EnvOpenOptions, WithoutTls};

use super::Durability;

/// Reader slots in the lock file (64 bytes each). LMDB's default of 126 is
/// too small for a batch runner's thread pool plus concurrent CLI readers.
pub(super) const MAX_READERS: u32 = 1024;

/// Named databases the environment can hold (see `docs/design.md`).
pub(super) const MAX_DBS: u32 = 16;

/// How a store that cannot be written here is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadOnly {
    /// The lock file is writable: readers register as usual.
    WithLocks,
    /// The lock file cannot be written (or made): no locks at all.
    WithoutLocks,
}

/// Opens the environment at `path` (a directory that exists).
///
/// The caller must not open the same path twice in one process; the store's
/// registry in `store/mod.rs` guarantees that by returning the already-open
/// environment instead.
pub(super) fn open_env(
    path: &Path,
    map_size: usize,
    durability: Durability,
    read_only: Option<ReadOnly>,
) -> heed::Result<Env<WithoutTls>> {
    // Read transactions without thread-local storage, so a read transaction
    // may move between threads and a worker pool never pins reader slots.
    let mut options = EnvOpenOptions::new().read_txn_without_tls();
    options
        .map_size(map_size)
        .max_readers(MAX_READERS)
        .max_dbs(MAX_DBS);
    if durability == Durability::None {
        // SAFETY: NO_SYNC skips the fsync at commit. LMDB stays consistent
        // after a process crash (the OS keeps the written pages); only a
        // system crash may lose or corrupt the latest transactions. That is
        // exactly the documented meaning of `--durability none`, which the
        // user chooses explicitly and which `stats` and summaries display.
        unsafe {
            options.flags(EnvFlags::NO_SYNC);
        }
    }
    match read_only {
        None => {}
        // SAFETY: READ_ONLY makes LMDB refuse write transactions and map
        // the file read-only; it takes reader slots in the lock file as
        // usual, so writers elsewhere still see this reader.
        Some(ReadOnly::WithLocks) => unsafe {
            options.flags(EnvFlags::READ_ONLY);
        },
        // SAFETY: without a lock file this reader is invisible to writers,
        // which may reuse pages it reads. Used only where no writer can
        // run through this file system's view of the lock file (a
        // read-only file system, or a lock file this user may not write,
        // whose owner may still write: then a read may see damage that is
        // not there, which `verify` reports and a rerun clears). LMDB's
        // own answer for read-only media is the same flag.
        Some(ReadOnly::WithoutLocks) => unsafe {
            options.flags(EnvFlags::READ_ONLY | EnvFlags::NO_LOCK);
        },
    }
    // SAFETY: LMDB requires that the mapped file is not modified behind its
    // back and that one process does not open the same environment twice.
    // The files are only ever changed through LMDB (by this process or by
    // other processes using LMDB's own lock file, which LMDB supports), and
    // the store registry opens each path once per process. Stores on network
    // file systems are not supported, as LMDB's locking needs a local one.
    unsafe { options.open(path) }
}

//! Checks of the LMDB data file before it is mapped: LMDB trusts its meta
//! pages, so a file shorter than they say (truncated by a full disk, a bad
//! copy, a stray `truncate`) would be mapped past its end and the first
//! read there would kill the process with SIGBUS. Reading the two meta
//! pages with plain file reads first turns that into a clear error.
//!
//! The layout read here is LMDB's (`mdb.c`, 64-bit little-endian builds):
//! a page header of 16 bytes, then `MDB_meta`: `mm_magic` (u32 at 16),
//! `mm_version` (u32 at 20), `mm_address`, `mm_mapsize`, two `MDB_db` of 48
//! bytes from 40 (the first one's `md_pad`, at 40, holds the page size),
//! `mm_last_pg` (u64 at 136) and `mm_txnid` (u64 at 144). The meta page
//! with the larger transaction id is the current one.

use std::io::Read;
use std::path::Path;

use crate::backend::BackendError;

/// `MDB_MAGIC`.
const MAGIC: u32 = 0xBEEF_C0DE;
/// Bytes of a meta page this check reads.
const META_BYTES: usize = 152;

/// One meta page's fields.
#[derive(Debug, Clone, Copy)]
struct Meta {
    page_size: u64,
    last_page: u64,
    txnid: u64,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn meta(page: &[u8]) -> Option<Meta> {
    if u32_at(page, 16)? != MAGIC {
        return None;
    }
    Some(Meta {
        page_size: u64::from(u32_at(page, 40)?),
        last_page: u64_at(page, 136)?,
        txnid: u64_at(page, 144)?,
    })
}

/// The files of an LMDB store that LMDB or the store's locks open.
pub(crate) const STORE_FILES: [&str; 4] = ["data.mdb", "lock.mdb", "claims.lock", "gc.lock"];

/// Refuses a store whose files are not what the store itself makes:
/// each of [`STORE_FILES`] that exists must be a regular file (not a
/// symbolic link, a directory, a FIFO, a device), and owned by this user
/// when `writing` (a store opened read-only may be another user's).
/// LMDB opens `data.mdb` and `lock.mdb` following links and writes its
/// lock table into `lock.mdb`, so a link planted there would have it
/// overwrite the file it points to.
///
/// What this cannot close: a file swapped in between this check and
/// LMDB's open. Doing that needs write access to the store directory,
/// which is the owner's alone (0700) in a store this crate created.
pub(super) fn store_files(dir: &Path, writing: bool) -> Result<(), BackendError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let me = nix::unistd::geteuid().as_raw();
    let mut found = Vec::new();
    for name in STORE_FILES {
        let path = dir.join(name);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(BackendError::Io {
                    op: "inspect",
                    path,
                    source,
                });
            }
        };
        let kind = meta.file_type();
        let detail = if kind.is_symlink() {
            let target = std::fs::read_link(&path)
                .map(|t| format!(" to {}", t.display()))
                .unwrap_or_default();
            Some(format!("is a symbolic link{target}"))
        } else if kind.is_dir() {
            Some("is a directory".to_owned())
        } else if kind.is_fifo() {
            Some("is a named pipe".to_owned())
        } else if kind.is_socket() {
            Some("is a socket".to_owned())
        } else if kind.is_block_device() || kind.is_char_device() {
            Some("is a device".to_owned())
        } else if !kind.is_file() {
            Some("is not a regular file".to_owned())
        } else if writing && meta.uid() != me {
            Some(format!(
                "is a file another user owns (uid {}, not {me})",
                meta.uid()
            ))
        } else {
            None
        };
        if let Some(detail) = detail {
            found.push(format!("{} {detail}", path.display()));
        }
    }
    if found.is_empty() {
        Ok(())
    } else {
        Err(BackendError::PlantedFile { files: found })
    }
}

/// Whether the store in `dir` must open read-only here, how, and why:
/// its file system is read-only, or this user may not write its data file,
/// or may not write (or create) its lock file. `None`: it is writable, or
/// has no data file yet (creating one is the writer's business, and fails
/// with its own error).
pub(super) fn read_only(dir: &Path) -> Option<(super::env::ReadOnly, String)> {
    use super::env::ReadOnly;
    use nix::unistd::{AccessFlags, access};
    let data = dir.join("data.mdb");
    if !data.exists() {
        return None;
    }
    let reason = |e: nix::errno::Errno, what: &str| match e {
        nix::errno::Errno::EROFS => "its file system is read-only".to_owned(),
        _ => format!("this user may not write {what}"),
    };
    let lock = dir.join("lock.mdb");
    let lock_writable = if lock.exists() {
        access(&lock, AccessFlags::W_OK).map_err(|e| reason(e, "its lock file"))
    } else {
        access(dir, AccessFlags::W_OK).map_err(|e| reason(e, "its directory"))
    };
    let data_writable = access(&data, AccessFlags::W_OK).map_err(|e| reason(e, "its data file"));
    match (data_writable, lock_writable) {
        (Ok(()), Ok(())) => None,
        (Err(why), Ok(())) => Some((ReadOnly::WithLocks, why)),
        (Ok(()), Err(why)) | (Err(_), Err(why)) => Some((ReadOnly::WithoutLocks, why)),
    }
}

/// Refuses a data file (`<dir>/data.mdb`) that LMDB would map past its
/// end: empty, shorter than two pages, without a valid meta page, or
/// shorter than its current meta page's last page. A missing file is left
/// to the caller (a new store, or [`BackendError::NotInitialized`]).
///
/// A file that is empty or has no valid meta page yet may be one another
/// process is creating this very moment (LMDB writes the meta pages just
/// after creating the file, under its own lock, which this check does not
/// take): such a file is looked at again a few times, 50 ms apart, before
/// it is called damaged.
pub(super) fn data_file(dir: &Path) -> Result<(), BackendError> {
    let mut tries = 0;
    loop {
        match data_file_once(dir) {
            Err(BackendError::DamagedDataFile { detail, .. })
                if tries < 4 && (detail.contains("empty") || detail.contains("meta pages")) =>
            {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

fn data_file_once(dir: &Path) -> Result<(), BackendError> {
    let path = dir.join("data.mdb");
    let damaged = |detail: String| BackendError::DamagedDataFile {
        path: path.clone(),
        detail,
    };
    let mut file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(BackendError::Io {
                op: "open the data file",
                path,
                source,
            });
        }
    };
    let size = file
        .metadata()
        .map_err(|source| BackendError::Io {
            op: "inspect the data file",
            path: path.clone(),
            source,
        })?
        .len();
    if size == 0 {
        return Err(damaged("it is empty (0 bytes)".into()));
    }
    let mut first = vec![0u8; META_BYTES];
    let read_first = file.read_exact(&mut first).is_ok();
    let meta0 = read_first.then(|| meta(&first)).flatten();
    // The second meta page starts one page in; without a readable first
    // one, try LMDB's usual page size.
    let page_size = meta0.map_or(4096, |m| m.page_size);
    let mut second = vec![0u8; META_BYTES];
    let meta1 = {
        use std::os::unix::fs::FileExt;
        file.read_exact_at(&mut second, page_size)
            .ok()
            .and_then(|()| meta(&second))
    };
    let (current, current_page) = match (meta0, meta1) {
        (Some(a), Some(b)) => {
            if b.txnid > a.txnid {
                (b, &second)
            } else {
                (a, &first)
            }
        }
        (Some(m), None) => (m, &first),
        (None, Some(m)) => (m, &second),
        (None, None) => {
            return Err(damaged(format!(
                "it is {size} bytes and neither of its two meta pages is valid (no LMDB magic number)"
            )));
        }
    };
    if !current.page_size.is_power_of_two() || !(512..=65536).contains(&current.page_size) {
        return Err(damaged(format!(
            "its meta page gives a page size of {} bytes",
            current.page_size
        )));
    }
    let needed = current
        .last_page
        .checked_add(1)
        .and_then(|pages| pages.checked_mul(current.page_size))
        .ok_or_else(|| damaged(format!("its meta page names page {}", current.last_page)))?;
    // The size was taken before the meta pages were read: a writer in
    // another process may have committed meanwhile, and LMDB writes a
    // transaction's pages (growing the file) before its meta page. So look
    // at the size again, after the meta pages: a live file is never
    // shorter than what its newest meta names.
    let size = if size < needed {
        file.metadata().map_or(size, |m| m.len().max(size))
    } else {
        size
    };
    // A healthy file may end before its last page by pages the last
    // transaction took and gave back, which LMDB never writes: short by
    // free pages only is whole (`pages::missing_pages_are_free`).
    if size < needed
        && super::pages::missing_pages_are_free(
            &file,
            current.page_size,
            current_page,
            size / current.page_size,
            current.last_page,
        )
    {
        return Ok(());
    }
    if size < needed {
        return Err(damaged(format!(
            "it is {size} bytes, but its last committed transaction (id {}) uses pages up to {} of {} bytes, so LMDB expects at least {needed} bytes: it was truncated",
            current.txnid, current.last_page, current.page_size
        )));
    }
    Ok(())
}

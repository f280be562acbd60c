//! Locks beside an LMDB store, which die with their process.
//!
//! **Claims**: an exclusive open-file-description lock (`F_OFD_SETLK`) on
//! one byte of `<store>/claims.lock`, at offset `u128::from_be_bytes(id) mod
//! 2^62` (the thread id's 16 bytes, big-endian, folded into 62 bits so the
//! offset fits a signed 64-bit `off_t` on every platform). One lock file
//! serves every thread, so a claim costs one `fcntl`, not a file creation.
//! Two ids that fold to the same byte would block each other (a false
//! "held"), which needs a collision in 62 bits. Locks of one open file
//! description never conflict with each other, so within a process the
//! engine tracks the claims it holds itself.
//!
//! **GC**: an exclusive `flock` of `<store>/gc.lock`.

use std::fs::{File, TryLockError};
use std::path::Path;

use nix::fcntl::{FcntlArg, fcntl};
use nix::libc;

use crate::backend::BackendError;
use crate::backend::{ClaimKey, HeldLock};

/// The byte a thread's claim locks.
pub(super) fn claim_offset(id: ClaimKey) -> i64 {
    let folded = u128::from_be_bytes(id) % (1u128 << 62);
    // < 2^62, so it always fits.
    i64::try_from(folded).unwrap_or(0)
}

fn lock_range(id: ClaimKey, kind: libc::c_short) -> libc::flock {
    libc::flock {
        l_type: kind,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: claim_offset(id),
        l_len: 1,
        l_pid: 0,
    }
}

/// A held claim: unlocked on drop.
#[derive(Debug)]
struct ClaimLock {
    file: File,
    id: ClaimKey,
}

impl HeldLock for ClaimLock {}

impl Drop for ClaimLock {
    fn drop(&mut self) {
        // Unlocking a range we hold cannot fail in a way we could act on;
        // the lock dies with the process anyway.
        let _ = fcntl(
            &self.file,
            FcntlArg::F_OFD_SETLK(&lock_range(self.id, libc::F_UNLCK as libc::c_short)),
        );
    }
}

fn io_error(op: &'static str, dir: &Path, e: nix::errno::Errno) -> BackendError {
    BackendError::Io {
        op,
        path: dir.join("claims.lock"),
        source: std::io::Error::from(e),
    }
}

pub(super) fn try_lock_claim(
    file: &File,
    dir: &Path,
    id: ClaimKey,
) -> Result<Option<Box<dyn HeldLock>>, BackendError> {
    let lock = lock_range(id, libc::F_WRLCK as libc::c_short);
    match fcntl(file, FcntlArg::F_OFD_SETLK(&lock)) {
        Ok(_) => {
            let file = file.try_clone().map_err(|source| BackendError::Io {
                op: "share the claim lock file",
                path: dir.join("claims.lock"),
                source,
            })?;
            Ok(Some(Box::new(ClaimLock { file, id })))
        }
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => Ok(None),
        Err(e) => Err(io_error("lock the claim lock file", dir, e)),
    }
}

pub(super) fn claim_locked(file: &File, dir: &Path, id: ClaimKey) -> Result<bool, BackendError> {
    // F_OFD_GETLK reports a conflicting lock of another open file
    // description; our own locks (one description) never conflict, so the
    // engine checks its own claims first.
    let mut probe = lock_range(id, libc::F_WRLCK as libc::c_short);
    fcntl(file, FcntlArg::F_OFD_GETLK(&mut probe))
        .map_err(|e| io_error("probe the claim lock file", dir, e))?;
    Ok(probe.l_type != libc::F_UNLCK as libc::c_short)
}

/// Opens (creating it if need be) a lock file of the store: mode 0600
/// whatever the umask, never through a symbolic link (`O_NOFOLLOW`), and
/// only if this user owns it. A lock file that another user could write,
/// or that points elsewhere, would let them take or break the store's
/// locks, so one that is not ours is refused; an old one of ours with a
/// looser mode is tightened.
pub(super) fn open_lock_file(
    path: &Path,
    read: bool,
    op: &'static str,
) -> Result<File, BackendError> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let io = |op: &'static str| {
        let path = path.to_path_buf();
        move |source| BackendError::Io { op, path, source }
    };
    let file = File::options()
        .create(true)
        .truncate(false)
        .read(read)
        .write(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
        .map_err(|source| {
            if source.raw_os_error() == Some(nix::errno::Errno::ELOOP as i32) {
                BackendError::Io {
                    op: "open a lock file, which is a symbolic link (refused: a store's lock files are never followed)",
                    path: path.to_path_buf(),
                    source,
                }
            } else {
                io(op)(source)
            }
        })?;
    let meta = file.metadata().map_err(io("inspect the lock file"))?;
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(BackendError::Io {
            op: "use a lock file that another user owns (refused)",
            path: path.to_path_buf(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        });
    }
    if meta.mode() & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io("restrict the lock file to its owner"))?;
    }
    Ok(file)
}

/// `claims.lock` opened for reading only, never through a link (`None`:
/// there is none, so nothing holds a claim), for a store open read-only.
pub(super) fn open_claims_read_only(dir: &Path) -> Result<Option<File>, BackendError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("claims.lock");
    match File::options()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(&path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(BackendError::Io {
            op: "open the claim lock file",
            path,
            source,
        }),
    }
}

/// The held GC lock (the file's `flock` is released when it closes).
#[derive(Debug)]
struct GcLock {
    _file: File,
}

impl HeldLock for GcLock {}

pub(super) fn try_lock_gc(dir: &Path) -> Result<Option<Box<dyn HeldLock>>, BackendError> {
    let path = dir.join("gc.lock");
    let file = open_lock_file(&path, false, "open the GC lock file")?;
    match file.try_lock() {
        Ok(()) => Ok(Some(Box::new(GcLock { _file: file }))),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(source)) => Err(BackendError::Io {
            op: "lock",
            path,
            source,
        }),
    }
}

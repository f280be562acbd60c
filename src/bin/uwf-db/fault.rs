//! A damaged LMDB page ends the process with a message and exit code 3,
//! not a bare SIGSEGV, SIGBUS or SIGABRT.
//!
//! LMDB keeps no page checksums: it trusts every page of the data file. A
//! page zeroed or overwritten on disk can send it through a garbage pointer
//! (SIGSEGV), past the end of the file (SIGBUS), or into one of its own
//! consistency assertions (`abort`, SIGABRT). No store error can be returned
//! from there, so while an LMDB store is open this module's handler turns
//! those three signals into a message that names the data file and says
//! what to do (`verify`, `salvage`), then `_exit(3)`. Nothing half-written
//! can remain: a write transaction that had not committed dies with the
//! process, and LMDB discards it.
//!
//! Two faults are not damage and keep Rust's own handling: a stack
//! overflow (a SIGSEGV at an address just below the stack pointer is handed
//! to the handler Rust installed, which says "stack overflow" and aborts)
//! and the abort that follows it. A PostgreSQL store needs none of this.

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::libc;
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

/// Exit code of a process stopped by a damaged data file (README, SPEC §7).
pub const DAMAGED: i32 = 3;

/// The message's text after the signal's name, made when the store opens
/// (the handler may not allocate), on a page of its own that is read-only
/// once written ([`sealed`]): a damaged page can send LMDB writing through
/// the heap before it faults (seen in a loop of `tests/cli_salvage.rs`:
/// the message came out as zeros, or as bytes of a record), never
/// through this.
static MESSAGE: OnceLock<&'static [u8]> = OnceLock::new();
/// The SIGSEGV and SIGBUS actions in force before ours (Rust's stack
/// overflow handler), for faults that are not the data file's.
static PREVIOUS: OnceLock<[SigAction; 2]> = OnceLock::new();
/// A stack overflow was handed to Rust's handler, which aborts next.
static OVERFLOWED: AtomicBool = AtomicBool::new(false);

/// Bytes below the stack pointer within which a fault is a stack overflow.
const STACK_WINDOW: usize = 1 << 20;

/// Installs the handler for the LMDB store in `dir` (called before the
/// store is opened: opening already reads pages). Installing twice is
/// harmless; the first store's path is the one named.
pub fn guard_lmdb_store(dir: &Path) {
    let data = dir.join("data.mdb");
    let text = format!(
        " while reading the store {dir}: its data file {data} is damaged \
         (LMDB keeps no page checksums and trusts every page). Nothing was changed. \
         `uwf-db --store {dir} verify` lists what can still be read; \
         `uwf-db salvage {dir} NEW-STORE` copies everything readable into a new store.\n",
        dir = dir.display(),
        data = data.display(),
    );
    install(text);
}

/// [`guard_lmdb_store`] for a salvage's reader (`salvage-read`): the
/// message is one short line, the reason the salvage reports for the
/// rows this reader could not read.
pub fn guard_lmdb_reader(dir: &Path) {
    install(format!(
        " on a damaged page of {}\n",
        dir.join("data.mdb").display()
    ));
}

fn install(text: String) {
    if MESSAGE.set(sealed(text.into_bytes())).is_err() {
        return;
    }
    let ours = SigAction::new(
        SigHandler::SigAction(on_fault),
        SaFlags::SA_ONSTACK | SaFlags::SA_SIGINFO,
        SigSet::empty(),
    );
    let mut previous = Vec::with_capacity(2);
    for signal in [Signal::SIGSEGV, Signal::SIGBUS, Signal::SIGABRT] {
        // SAFETY: `on_fault` is async-signal-safe: it reads atomics and a
        // `OnceLock` that was set before this call (an atomic load), calls
        // `write` and `_exit`, or hands the fault to the previous handler
        // with the arguments the kernel gave.
        match unsafe { sigaction(signal, &ours) } {
            Ok(old) if signal != Signal::SIGABRT => previous.push(old),
            Ok(_) => {}
            // Not installed: the signal keeps its default action.
            Err(_) => previous.push(SigAction::new(
                SigHandler::SigDfl,
                SaFlags::empty(),
                SigSet::empty(),
            )),
        }
    }
    if let Ok(previous) = <[SigAction; 2]>::try_from(previous) {
        let _ = PREVIOUS.set(previous);
    }
}

/// `text` on pages of its own mapped read-only (a stray write there
/// faults instead of changing it); on the heap, leaked, if the system
/// will not map them.
fn sealed(text: Vec<u8>) -> &'static [u8] {
    let len = text.len().max(1);
    // SAFETY: an anonymous private mapping of `len` bytes, checked for
    // failure; `text.len()` bytes are copied into it (it is at least that
    // long and does not overlap `text`); it is never unmapped, so the
    // slice made of it lives for the rest of the process, and after
    // `mprotect` nothing writes it.
    unsafe {
        let page = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if page == libc::MAP_FAILED {
            return Vec::leak(text);
        }
        std::ptr::copy_nonoverlapping(text.as_ptr(), page.cast::<u8>(), text.len());
        if libc::mprotect(page, len, libc::PROT_READ) != 0 {
            libc::munmap(page, len);
            return Vec::leak(text);
        }
        std::slice::from_raw_parts(page.cast::<u8>(), text.len())
    }
}

extern "C" fn on_fault(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    if signal == libc::SIGABRT && OVERFLOWED.load(Ordering::SeqCst) {
        // Rust's stack-overflow report ends in `abort`: let it.
        return;
    }
    if signal == libc::SIGSEGV && stack_overflow(info, context) {
        OVERFLOWED.store(true, Ordering::SeqCst);
        hand_back(0, signal, info, context);
        return;
    }
    let name: &[u8] = match signal {
        libc::SIGSEGV => b"\nuwf-db: fatal: invalid memory access (SIGSEGV)",
        libc::SIGBUS => b"\nuwf-db: fatal: read past the end of the data file (SIGBUS)",
        _ => b"\nuwf-db: fatal: LMDB stopped on a failed consistency check (SIGABRT)",
    };
    // SAFETY: `write` and `_exit` are async-signal-safe; the buffers are
    // valid for their lengths (a static and a set `OnceLock`).
    unsafe {
        libc::write(2, name.as_ptr().cast(), name.len());
        if let Some(message) = MESSAGE.get() {
            libc::write(2, message.as_ptr().cast(), message.len());
        }
        libc::_exit(DAMAGED);
    }
}

/// Whether the fault's address lies just below (or at) the stack pointer
/// of the faulting thread: a stack overflow, not a bad page.
fn stack_overflow(info: *mut libc::siginfo_t, context: *mut c_void) -> bool {
    if info.is_null() || context.is_null() {
        return false;
    }
    // SAFETY: the kernel passes a valid `siginfo_t` to an SA_SIGINFO
    // handler, and `si_addr` is the field a SIGSEGV fills.
    let addr = unsafe { (*info).si_addr() } as usize;
    let Some(sp) = stack_pointer(context) else {
        return false;
    };
    addr <= sp.saturating_add(4096) && addr.saturating_add(STACK_WINDOW) >= sp
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn stack_pointer(context: *mut c_void) -> Option<usize> {
    // SAFETY: the kernel passes a valid `ucontext_t` as the third argument
    // of an SA_SIGINFO handler.
    let uc = unsafe { &*(context as *const libc::ucontext_t) };
    usize::try_from(uc.uc_mcontext.gregs[libc::REG_RSP as usize]).ok()
}

#[cfg(all(target_os = "linux", target_arch = "aarch64"))]
fn stack_pointer(context: *mut c_void) -> Option<usize> {
    // SAFETY: as above.
    let uc = unsafe { &*(context as *const libc::ucontext_t) };
    usize::try_from(uc.uc_mcontext.sp).ok()
}

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
fn stack_pointer(_context: *mut c_void) -> Option<usize> {
    None
}

/// Runs the handler that was in force before ours for `signal` (index 0:
/// SIGSEGV, 1: SIGBUS); with none, restores the default action so the
/// fault, when it recurs on return, ends the process as it would have.
fn hand_back(index: usize, signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    let previous = PREVIOUS.get().map(|p| p[index].handler());
    match previous {
        // SAFETY: the previous handler was installed for this signal and
        // is called with the kernel's own arguments, as the kernel would.
        Some(SigHandler::SigAction(f)) => f(signal, info, context),
        Some(SigHandler::Handler(f)) => f(signal),
        _ => {
            // SAFETY: `signal` is a valid signal number; SIG_DFL is a valid
            // disposition; `signal` is async-signal-safe.
            unsafe {
                libc::signal(signal, libc::SIG_DFL);
            }
        }
    }
}

//! Supervising an agent's program: it dies with the driver, its exit is
//! seen without reaping it, and its stderr's tail is kept for the error.

use std::process::Command;

/// On Linux, makes the agent's program die (SIGKILL) when the driver dies,
/// however it dies: a driver killed with SIGKILL runs no cleanup, and its
/// agent would otherwise run on as an orphan (design.md, "Signals").
///
/// The kernel sends the parent-death signal when the *thread* that forked
/// the child ends, not the process. The thread that spawns an agent is the
/// one that waits for it ([`CmdAgent::call`] returns only after the program
/// has exited or been killed), so that thread outlives the agent unless the
/// whole process dies, which is the case this covers. The signal reaches
/// the program itself, the leader of the agent's process group; processes
/// it started and that outlive it are not covered (see design.md).
/// Elsewhere this does nothing: the driver's own exits (end of step,
/// timeout, cancel, signals it handles) kill the group themselves.
pub(super) fn die_with_driver(command: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let driver = nix::unistd::getpid();
        #[allow(unsafe_code)]
        // SAFETY: the closure runs in the forked child before exec, where
        // only async-signal-safe calls are allowed: it makes two raw system
        // calls (prctl, getppid) and builds at most an OS-code `io::Error`,
        // which does not allocate; it takes no lock. `driver` is a plain
        // integer copied in.
        unsafe {
            command.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
                // The driver died between fork and prctl: nobody would
                // send the signal, so do not start the program (the error
                // ends the child before exec).
                if nix::unistd::getppid() != driver {
                    return Err(std::io::Error::from(nix::errno::Errno::ESRCH));
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = command;
}

/// Whether the agent's program has exited, without reaping it: until it is
/// reaped its pid stays taken, so killing its process group afterwards
/// cannot reach a process that was given the pid since (with
/// `pid_max` at 32768, a busy batch runs through the pid space in
/// seconds).
pub(super) fn has_exited(child: &mut std::process::Child) -> std::io::Result<bool> {
    #[cfg(target_os = "linux")]
    {
        use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        loop {
            match waitid(Id::Pid(pid), flags) {
                Ok(WaitStatus::StillAlive) => return Ok(false),
                Ok(_) => return Ok(true),
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(std::io::Error::from(e)),
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        child.try_wait().map(|s| s.is_some())
    }
}

/// The last `keep` bytes of a stream, and how many came before them.
pub(super) struct Tail {
    keep: usize,
    bytes: std::collections::VecDeque<u8>,
    cut: u64,
}

impl Tail {
    pub(super) fn new(keep: usize) -> Self {
        Tail {
            keep,
            bytes: std::collections::VecDeque::new(),
            cut: 0,
        }
    }

    pub(super) fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend(chunk);
        let over = self.bytes.len().saturating_sub(self.keep);
        if over > 0 {
            self.bytes.drain(..over);
            self.cut += over as u64;
        }
    }

    /// The kept text, trimmed, after a `[… N bytes cut]` line when
    /// something was cut.
    pub(super) fn text(self) -> String {
        let bytes: Vec<u8> = self.bytes.into_iter().collect();
        let text = String::from_utf8_lossy(&bytes);
        let text = text.trim();
        if self.cut == 0 {
            text.to_owned()
        } else {
            format!("[… {} bytes cut]\n{text}", self.cut)
        }
    }
}

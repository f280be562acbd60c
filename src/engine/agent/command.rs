//! `cmd:PROGRAM ARGS`: an external program answers, the prompt on its
//! stdin and the reply on its stdout, under a timeout and a reply cap.
//! [`CmdAgent::run`] (the process, whatever its exit) is shared with
//! `claude:`, which reads its stdout as JSON instead.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::process::{Tail, die_with_driver, has_exited};
use super::{Agent, AgentError, AgentOptions, AgentReply, AgentRequest, STDERR_TAIL};
use crate::engine::cancel::kill_group;

/// `cmd:PROGRAM ARGS`: the prompt on stdin, `UWF_THREAD`, `UWF_ROLE`,
/// `UWF_STORE` in the environment, stdout is the reply. The program runs in
/// its own process group, killed whole on timeout or when the drive's
/// [`Cancel`](crate::engine::Cancel) token is cancelled.
#[derive(Debug, Clone)]
pub struct CmdAgent {
    program: String,
    args: Vec<String>,
    store: PathBuf,
    timeout: Duration,
    reasks: usize,
    max_reply: usize,
}

impl CmdAgent {
    /// A command agent running `argv` (program, then arguments); an empty
    /// `argv` is [`AgentError::NoProgram`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use uwf_db::engine::agent::{Agent, AgentError, AgentOptions, CmdAgent};
    ///
    /// let options = AgentOptions {
    ///     timeout: Duration::from_secs(60),
    ///     reasks: 0,
    ///     ..AgentOptions::default()
    /// };
    /// let agent = CmdAgent::new(vec!["llm".into(), "--quiet".into()], &options)?;
    /// assert_eq!(agent.reasks(), 0);
    /// assert!(matches!(CmdAgent::new(vec![], &options), Err(AgentError::NoProgram)));
    /// # Ok::<(), AgentError>(())
    /// ```
    pub fn new(argv: Vec<String>, options: &AgentOptions) -> Result<Self, AgentError> {
        let mut words = argv.into_iter();
        let program = words.next().ok_or(AgentError::NoProgram)?;
        Ok(CmdAgent {
            program,
            args: words.collect(),
            store: options.store.clone(),
            timeout: options.timeout,
            reasks: options.reasks,
            max_reply: options.max_reply_bytes,
        })
    }
}

impl Agent for CmdAgent {
    fn reasks(&self) -> usize {
        self.reasks
    }

    fn fork(&self) -> Option<Box<dyn Agent>> {
        Some(Box::new(self.clone()))
    }

    fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
        let run = self.run(req)?;
        if !run.status.success() {
            return Err(AgentError::Exit {
                status: run.status.to_string(),
                stderr: run.stderr,
            });
        }
        let output = String::from_utf8(run.stdout).map_err(|_| AgentError::NotUtf8)?;
        Ok(AgentReply {
            output,
            stderr: Some(run.stderr).filter(|s| !s.is_empty()),
            ..AgentReply::default()
        })
    }
}

/// How a program run by [`CmdAgent::run`] ended: its exit status, all of
/// its stdout (at most the reply cap) and the tail of its stderr.
pub(super) struct Finished {
    /// The program's exit status.
    pub(super) status: std::process::ExitStatus,
    /// Its stdout, whole.
    pub(super) stdout: Vec<u8>,
    /// The last [`STDERR_TAIL`] bytes of its stderr, trimmed.
    pub(super) stderr: String,
}

impl CmdAgent {
    /// This agent with `extra` arguments after its own.
    pub(super) fn with_args(&self, extra: &[String]) -> CmdAgent {
        let mut agent = self.clone();
        agent.args.extend(extra.iter().cloned());
        agent
    }

    /// Runs the program once for `req` (prompt on stdin, in the step's
    /// directory, its own process group, under the timeout and the reply
    /// cap, registered with the drive's token) and returns how it ended,
    /// whatever its exit status: [`CmdAgent`] refuses a failed exit,
    /// [`ClaudeAgent`](super::ClaudeAgent) reads the JSON a failed run
    /// still prints.
    pub(super) fn run(&self, req: &AgentRequest<'_>) -> Result<Finished, AgentError> {
        let (program, mut command) = self.command_for(req);
        die_with_driver(&mut command);
        let mut child = command.spawn().map_err(|source| AgentError::Spawn {
            program: program.clone(),
            source,
        })?;
        let pid = child.id();
        req.cancel.agent_started(pid);
        let stdin = child.stdin.take();
        let prompt = req.prompt.to_owned();
        // Feed stdin and drain stdout/stderr on threads so no pipe fills up.
        let writer = std::thread::spawn(move || {
            if let Some(mut s) = stdin {
                let _ = s.write_all(prompt.as_bytes());
            }
        });
        // stdout up to the cap: past it the group is killed (from the
        // reading thread, at once) and the reply is refused.
        let max_reply = self.max_reply;
        let too_large = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let out = read_stdout(child.stdout.take(), pid, max_reply, &too_large);
        let err = read_stderr_tail(child.stderr.take());
        let started = Instant::now();
        loop {
            match has_exited(&mut child) {
                Ok(true) => break,
                Ok(false) if started.elapsed() >= self.timeout => {
                    kill_group(pid);
                    req.cancel.agent_finished(pid);
                    let _ = child.wait();
                    return Err(AgentError::Timeout(self.timeout));
                }
                Ok(false) => std::thread::sleep(Duration::from_millis(5)),
                Err(source) => {
                    kill_group(pid);
                    req.cancel.agent_finished(pid);
                    let _ = child.wait();
                    return Err(AgentError::Spawn { program, source });
                }
            }
        }
        // The program may have left children holding the pipes: end them.
        // The program is not reaped yet, so its pid (the group's id) cannot
        // have been given to another process: this kills its group only.
        kill_group(pid);
        req.cancel.agent_finished(pid);
        // The pipes close when the last process holding them ends; one
        // that left the group (setsid) may hold them on. Wait for them no
        // longer than the timeout (a second at least after the exit), then
        // give up on the reply and leave the reading threads behind.
        let deadline = (started + self.timeout).max(Instant::now() + Duration::from_secs(1));
        while !(writer.is_finished() && out.is_finished() && err.is_finished()) {
            if Instant::now() >= deadline {
                let _ = child.wait();
                return Err(AgentError::OutputHeld {
                    seconds: started.elapsed().as_secs(),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = writer.join();
        let stdout = out.join().unwrap_or_default();
        let stderr = err.join().map(Tail::text).unwrap_or_default();
        // Reaped last: the reading thread's kill (a reply over the cap)
        // also happens while the pid is still the program's.
        let status = match child.wait() {
            Ok(status) => status,
            Err(source) => return Err(AgentError::Spawn { program, source }),
        };
        if too_large.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(AgentError::ReplyTooLarge {
                limit: self.max_reply,
            });
        }
        Ok(Finished {
            status,
            stdout,
            stderr,
        })
    }

    /// The program's command for one call: its arguments, `UWF_THREAD`,
    /// `UWF_ROLE` and `UWF_STORE`, piped stdio, a process group of its own,
    /// and the step's directory (a relative program path made absolute
    /// first: it names a file from where the driver runs). Returns the
    /// program as run.
    fn command_for(&self, req: &AgentRequest<'_>) -> (String, Command) {
        use std::os::unix::process::CommandExt;
        let mut program = self.program.clone();
        let mut command = Command::new(&program);
        if let Some(dir) = req.cwd {
            // A relative program path names a file from where the driver
            // runs, not from the agent's directory.
            let path = std::path::Path::new(&program);
            if path.is_relative()
                && path.components().count() > 1
                && let Ok(here) = std::env::current_dir()
            {
                program = here.join(path).to_string_lossy().into_owned();
                command = Command::new(&program);
            }
            command.current_dir(dir);
        }
        command
            .args(&self.args)
            .env("UWF_THREAD", req.thread.to_string())
            .env("UWF_ROLE", req.role_name)
            .env("UWF_STORE", &self.store)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // The program leads a process group of its own: cancelling,
            // a timeout or the end of the step kills the whole group, and a
            // terminal's Ctrl-C reaches the driver only.
            .process_group(0);
        (program, command)
    }
}

/// Reads the program's stdout up to `max_reply` bytes: past it the group
/// is killed (from this thread, at once), `too_large` set and nothing kept.
fn read_stdout(
    stdout: Option<std::process::ChildStdout>,
    pid: u32,
    max_reply: usize,
    too_large: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<u8>> {
    let too_large = std::sync::Arc::clone(too_large);
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(s) = stdout {
            let limit = u64::try_from(max_reply)
                .unwrap_or(u64::MAX)
                .saturating_add(1);
            let _ = s.take(limit).read_to_end(&mut buf);
            if buf.len() > max_reply {
                too_large.store(true, std::sync::atomic::Ordering::SeqCst);
                kill_group(pid);
                buf.clear();
                buf.shrink_to_fit();
            }
        }
        buf
    })
}

/// Reads the program's stderr, keeping its last [`STDERR_TAIL`] bytes.
fn read_stderr_tail(stderr: Option<std::process::ChildStderr>) -> std::thread::JoinHandle<Tail> {
    std::thread::spawn(move || {
        let mut tail = Tail::new(STDERR_TAIL);
        if let Some(mut s) = stderr {
            let mut chunk = [0u8; 8192];
            loop {
                match s.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => tail.push(chunk.get(..n).unwrap_or_default()),
                }
            }
        }
        tail
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Cancel;
    use crate::engine::agent::AgentSpec;
    use crate::thread::ThreadId;
    use crate::workflow::Role;

    /// `has_exited` sees the exit but leaves the program a zombie, so its
    /// pid (and its group's id) stays taken until `wait` reaps it.
    #[cfg(target_os = "linux")]
    #[test]
    fn an_exited_program_is_not_reaped_until_waited_for() {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new("true").process_group(0).spawn().unwrap();
        let pid = child.id();
        let started = Instant::now();
        while !has_exited(&mut child).unwrap() {
            assert!(started.elapsed() < Duration::from_secs(30), "never exited");
            std::thread::sleep(Duration::from_millis(5));
        }
        // Still there, as a zombie: its pid is not free for reuse.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let state = stat.rsplit(") ").next().unwrap().chars().next().unwrap();
        assert_eq!(state, 'Z', "{stat}");
        assert!(
            has_exited(&mut child).unwrap(),
            "asking again still says so"
        );
        assert!(child.wait().unwrap().success());
        // Reaped now: there is nothing left to wait for.
        assert!(has_exited(&mut child).is_err());
    }

    #[test]
    fn the_tail_keeps_the_last_bytes_and_counts_the_rest() {
        let mut t = Tail::new(4);
        t.push(b"abc");
        t.push(b"defgh");
        assert_eq!(t.text(), "[… 4 bytes cut]\nefgh");
        let mut t = Tail::new(10);
        t.push(b" short ");
        assert_eq!(t.text(), "short");
    }

    /// A program that leaves a process of its own session holding its
    /// stdout: the call ends at the timeout with `OutputHeld`, not when
    /// that process does.
    #[cfg(target_os = "linux")]
    #[test]
    fn output_held_open_past_the_exit_fails_at_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("daemon.pid");
        let script = format!(
            "cat >/dev/null; setsid sh -c 'echo $$ > {f}; exec sleep 30' & \
             while [ ! -s {f} ]; do sleep 0.01; done; echo answer",
            f = pid_file.display()
        );
        let options = AgentOptions {
            timeout: Duration::from_secs(2),
            ..AgentOptions::default()
        };
        let mut agent = CmdAgent::new(vec!["sh".into(), "-c".into(), script], &options).unwrap();
        let role = Role::default();
        let cancel = Cancel::new();
        let request = AgentRequest {
            thread: ThreadId::generate(),
            workflow: "w",
            role_name: "r",
            role: &role,
            instruction: "i",
            prompt: "p",
            answered_steps: 0,
            cwd: None,
            summary_index: None,
            cancel: &cancel,
        };
        let started = Instant::now();
        let e = agent.call(&request).unwrap_err();
        let took = started.elapsed();
        assert!(
            matches!(e, AgentError::OutputHeld { seconds: 2..=19 }),
            "{e}"
        );
        assert!(took < Duration::from_secs(20), "took {took:?}");
        if let Ok(pid) = std::fs::read_to_string(&pid_file) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid.trim().parse().unwrap()),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    #[test]
    fn a_cmd_agent_needs_a_program() {
        let e = CmdAgent::new(Vec::new(), &AgentOptions::default()).unwrap_err();
        assert!(matches!(e, AgentError::NoProgram), "{e}");
        assert!(matches!(
            AgentSpec::parse("cmd:  "),
            Err(AgentError::BadSpec(_))
        ));
        let a = CmdAgent::new(vec!["echo".into(), "hi".into()], &AgentOptions::default());
        assert!(a.is_ok());
    }
}

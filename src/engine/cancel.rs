//! Cancellation tokens: the caller of a drive or a batch owns one, and
//! cancelling it stops only the work started under it.
//!
//! Work started under a token registers with it: the process groups of
//! `cmd:` agents it runs and the claims it takes. [`Cancel::cancel`] marks
//! the token, kills those process groups and releases those claims before it
//! returns, so a Ctrl-C handler can call it and then exit at once with the
//! threads left retryable. Tokens share nothing with each other: cancelling
//! one batch leaves every other batch, on this store or another, running.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::store::Store;
use crate::thread::ThreadId;

/// A cancellation token (cheap to clone; clones are the same token).
///
/// ```
/// use uwf_db::engine::Cancel;
///
/// let cancel = Cancel::new();
/// let for_handler = cancel.clone();
/// assert!(!cancel.is_cancelled());
/// for_handler.cancel();
/// assert!(cancel.is_cancelled());
/// assert!(!Cancel::new().is_cancelled());
/// ```
#[derive(Debug, Clone, Default)]
pub struct Cancel {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    cancelled: AtomicBool,
    /// Stop after the steps in flight (a first Ctrl-C in `batch`).
    stopping: AtomicBool,
    /// Process groups of agents running under the token.
    agents: Mutex<HashSet<u32>>,
    /// Claims taken under the token and not yet released, each with the
    /// function that gives its thread its status back (the claim module's:
    /// the token names no module above it).
    claims: Mutex<Vec<(Store, ThreadId, Release)>>,
}

/// Gives a claimed thread its status back when its token is cancelled.
pub(crate) type Release = fn(&Store, ThreadId);

/// Kills process group `pid` (SIGKILL); a group already gone is no error.
pub(crate) fn kill_group(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The sets hold no invariant a panic could break.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Cancel {
    /// A token not cancelled yet.
    pub fn new() -> Self {
        Cancel::default()
    }

    /// Whether [`Cancel::cancel`] was called on this token (or a clone).
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }

    /// Asks the work under the token to stop gracefully: every drive stops
    /// after the step in flight is committed (its agent is not killed), and
    /// a batch starts no new thread. [`Cancel::cancel`] still stops at once.
    ///
    /// ```
    /// use uwf_db::engine::Cancel;
    /// let cancel = Cancel::new();
    /// cancel.stop_after_step();
    /// assert!(cancel.is_stopping());
    /// assert!(!cancel.is_cancelled());
    /// ```
    pub fn stop_after_step(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
    }

    /// Whether [`Cancel::stop_after_step`] (or [`Cancel::cancel`]) was called.
    pub fn is_stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::SeqCst) || self.is_cancelled()
    }

    /// Sleeps for `duration`, or less when the token is cancelled
    /// meanwhile (checked every 50 ms).
    pub fn sleep(&self, duration: std::time::Duration) {
        let until = std::time::Instant::now() + duration;
        while !self.is_cancelled() {
            let now = std::time::Instant::now();
            if now >= until {
                break;
            }
            std::thread::sleep((until - now).min(std::time::Duration::from_millis(50)));
        }
    }

    /// Cancels: no new drive, claim or agent starts under the token; the
    /// process groups of its running agents are killed (their steps fail as
    /// [`EngineError::Interrupted`](super::EngineError::Interrupted), and
    /// nothing is recorded); the threads it claimed get their status back
    /// (retryable) before this returns. Idempotent.
    ///
    /// A Ctrl-C handler (here another thread) cancels a drive whose agent
    /// waits on the token:
    ///
    /// ```
    /// use std::time::Duration;
    /// use uwf_db::Store;
    /// use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
    /// use uwf_db::engine::{Cancel, DriveOptions, EngineError, StartOptions};
    /// use uwf_db::thread::ThreadStatus;
    /// use uwf_db::workflow::parse_workflow;
    ///
    /// /// Waits for an answer that never comes, until the drive is cancelled.
    /// struct Slow;
    /// impl Agent for Slow {
    ///     fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
    ///         while !req.cancel.is_cancelled() {
    ///             std::thread::sleep(Duration::from_millis(1));
    ///         }
    ///         Err(AgentError::Other("stopped waiting".into()))
    ///     }
    /// }
    ///
    /// # let yaml = "name: one\nroles:\n  worker: { goal: Work }\ngraph:\n  $START: { _: { role: worker, prompt: 'Work' } }\n  worker: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let store = Store::memory();
    /// # let wf = parse_workflow(yaml, Some("one"), &|_| false).map_err(|p| format!("{p:?}"))?;
    /// # let (workflow, _) = store.workflows().add(&wf)?;
    /// let thread = store.engine().start_workflow(workflow, "a task", &StartOptions::default())?;
    /// let cancel = Cancel::new();
    /// let handler = cancel.clone();
    /// std::thread::spawn(move || {
    ///     std::thread::sleep(Duration::from_millis(20));
    ///     handler.cancel();
    /// });
    /// let options = DriveOptions { cancel: cancel.clone(), ..DriveOptions::default() };
    /// let report = store.engine().drive(thread.id, &options, &mut Slow);
    /// assert!(matches!(report.error, Some(EngineError::Interrupted)));
    ///
    /// // Nothing was recorded: the thread is idle again, not failed.
    /// let record = store.threads().get(thread.id)?.ok_or("no thread")?;
    /// assert_eq!(record.status, ThreadStatus::Idle);
    /// assert_eq!(record.last_error, None);
    /// // Nothing new starts under a cancelled token.
    /// let again = store.engine().drive(thread.id, &options, &mut Slow);
    /// assert!(matches!(again.error, Some(EngineError::Interrupted)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        {
            // Killed under the lock: an agent forgets its group
            // (`agent_finished`, under the same lock) before it reaps its
            // program, so every pid here still names that program's group.
            let mut agents = lock(&self.inner.agents);
            for pgid in agents.drain() {
                kill_group(pgid);
            }
        }
        let claims: Vec<(Store, ThreadId, Release)> = lock(&self.inner.claims).clone();
        for (store, id, release) in claims {
            release(&store, id);
        }
    }

    /// Registers a running agent's process group (an agent that starts
    /// processes in a group of their own calls this). Started while the token
    /// was being cancelled: the group is killed at once.
    ///
    /// ```
    /// use std::os::unix::process::CommandExt;
    /// use std::process::Command;
    /// use uwf_db::engine::Cancel;
    ///
    /// let cancel = Cancel::new();
    /// // An agent's program, in a process group of its own.
    /// let mut child = Command::new("sleep").arg("30").process_group(0).spawn()?;
    /// cancel.agent_started(child.id());
    /// cancel.cancel(); // kills the group
    /// assert!(!child.wait()?.success());
    /// cancel.agent_finished(child.id());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn agent_started(&self, pgid: u32) {
        lock(&self.inner.agents).insert(pgid);
        if self.is_cancelled() {
            kill_group(pgid);
        }
    }

    /// Forgets a finished agent's process group. Call it before reaping
    /// the program, so that the token never kills a group whose id has
    /// been given to another process since.
    pub fn agent_finished(&self, pgid: u32) {
        lock(&self.inner.agents).remove(&pgid);
    }

    /// Registers a claim taken under the token, with what gives its thread
    /// its status back on [`Cancel::cancel`].
    pub(crate) fn claim_taken(&self, store: &Store, id: ThreadId, release: Release) {
        lock(&self.inner.claims).push((store.clone(), id, release));
    }

    /// Forgets a released claim.
    pub(crate) fn claim_released(&self, store: &Store, id: ThreadId) {
        lock(&self.inner.claims).retain(|(s, t, _)| !(*t == id && s.same_store(store)));
    }
}

//! Agents: what answers a role step. Built in: `script:FILE` (a scripted
//! scenario, for tests and examples) and `cmd:PROGRAM ARGS` (an external
//! program such as an LLM CLI).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::cancel::{Cancel, kill_group};
use crate::hash::Hash;
use crate::thread::ThreadId;
use crate::workflow::Role;

/// Default time a `cmd:` agent may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// What an agent is asked.
#[derive(Debug, Clone)]
pub struct AgentRequest<'a> {
    /// The thread.
    pub thread: ThreadId,
    /// The thread's workflow name.
    pub workflow: &'a str,
    /// The role's name.
    pub role_name: &'a str,
    /// The role's definition.
    pub role: &'a Role,
    /// The instruction (rendered edge prompt, or the resume instruction).
    pub instruction: &'a str,
    /// The assembled prompt (what a `cmd:` agent reads on stdin).
    pub prompt: &'a str,
    /// Agent-answered role steps the thread already has.
    pub answered_steps: usize,
    /// The directory to work in (the edge's `location` resolved against
    /// the thread's `cwd`; it exists): a `cmd:` agent is started there.
    /// `None`: the driver's working directory.
    pub cwd: Option<&'a std::path::Path>,
    /// For a summarising call: how many summaries the thread already has.
    pub summary_index: Option<usize>,
    /// The token the drive runs under: an agent that starts processes
    /// registers them with it (see [`Cancel::agent_started`]) or checks it
    /// while it waits, so that cancelling stops it.
    pub cancel: &'a Cancel,
}

/// An agent's answer: text, plus the final state of a child thread when the
/// agent ran one.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentReply {
    /// Markdown with YAML frontmatter.
    pub output: String,
    /// The final state of a child thread the agent ran.
    pub child_thread: Option<Hash>,
    /// What the call cost, as the agent reports it (a `$usage` key in the
    /// frontmatter is used when this is `None`): recorded with the step.
    pub usage: Option<crate::usage::Usage>,
}

impl From<String> for AgentReply {
    fn from(output: String) -> Self {
        AgentReply {
            output,
            child_thread: None,
            usage: None,
        }
    }
}

/// Why an agent gave no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// A `cmd:` agent's reply passed [`AgentOptions::max_reply_bytes`]: its
    /// process group was killed.
    #[error(
        "the agent's reply passed {limit} bytes: the agent was killed and the step failed (raise --max-reply-size if such replies are expected)"
    )]
    ReplyTooLarge {
        /// The cap, in bytes.
        limit: usize,
    },
    /// A `cmd:` agent's program exited, but a process it started outside
    /// its process group (a daemon, say) kept its output pipes open until
    /// the timeout: the reply cannot be known to be whole.
    #[error(
        "the agent exited but a process it started outside its process group kept its output open until the timeout ({seconds} s after the start): no reply was taken and the step failed"
    )]
    OutputHeld {
        /// Seconds from the start of the call to giving up.
        seconds: u64,
    },
    /// The spec is not `script:FILE` or `cmd:PROGRAM ARGS`.
    #[error("unknown agent spec '{0}': use script:FILE or cmd:PROGRAM ARGS")]
    BadSpec(String),
    /// The scenario file cannot be read.
    #[error("cannot read scenario {path}: {source}")]
    ScenarioUnreadable {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The scenario file is not YAML of the expected shape.
    #[error("scenario {path} is not a valid scenario: {source}")]
    ScenarioYaml {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The scenario file cannot be used.
    #[error("scenario {path}: {detail}")]
    Scenario {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The scenario's next step is for another role.
    #[error("scenario step {index} is for role '{expected}', but the thread asks role '{actual}'")]
    RoleMismatch {
        /// The step index.
        index: usize,
        /// The role the scenario has.
        expected: String,
        /// The role the thread runs.
        actual: String,
    },
    /// The scenario has no more steps.
    #[error("scenario has no step {index} (it has {len}); the thread asks role '{actual}'")]
    PastEnd {
        /// The step index.
        index: usize,
        /// Steps in the scenario.
        len: usize,
        /// The role asked.
        actual: String,
    },
    /// The program could not be started.
    #[error("cannot run agent program '{program}': {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The program exited with an error.
    #[error("agent program exited with {status}: {stderr}")]
    Exit {
        /// The exit status.
        status: String,
        /// Its stderr (trimmed).
        stderr: String,
    },
    /// The program took too long; its process group was killed.
    #[error("agent program timed out after {0:?}; its process group was killed")]
    Timeout(Duration),
    /// The program's output is not UTF-8.
    #[error("agent output is not UTF-8")]
    NotUtf8,
    /// A `cmd:` agent needs a program to run.
    #[error("a cmd: agent needs a program to run (cmd:PROGRAM ARGS)")]
    NoProgram,
    /// An embedder's agent failed; the cause is kept as the source.
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

/// Something that answers role steps.
///
/// An agent gets the role, the instruction and the assembled prompt
/// ([`AgentRequest`]) and answers with markdown whose YAML frontmatter
/// carries `$status` (what the workflow routes on) and the role's other
/// fields. An embedder's agent is a Rust type; this one calls no model and
/// gets its first answer wrong, to show the re-ask:
///
/// ```
/// use uwf_db::Store;
/// use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
/// use uwf_db::engine::StartOptions;
/// use uwf_db::thread::ThreadStatus;
/// use uwf_db::workflow::parse_workflow;
///
/// /// Approves, but forgets the frontmatter the first time.
/// #[derive(Default)]
/// struct Judge {
///     prompts: Vec<String>,
/// }
///
/// impl Agent for Judge {
///     fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
///         self.prompts.push(req.prompt.to_owned());
///         if self.prompts.len() == 1 {
///             return Ok("Looks good to me".to_owned().into());
///         }
///         Ok("---\n$status: approved\n---\nLooks good to me".to_owned().into())
///     }
///     /// One more try after a reply the role's schema refuses.
///     fn reasks(&self) -> usize {
///         1
///     }
/// }
///
/// let yaml = "
/// name: judge
/// roles:
///   judge:
///     goal: Approve the change
///     frontmatter: { properties: { $status: { const: approved } }, required: [$status] }
/// graph:
///   $START: { _: { role: judge, prompt: 'Judge the change' } }
///   judge: { approved: { role: $END, prompt: 'Approved' } }
/// ";
/// let store = Store::memory();
/// let wf = parse_workflow(yaml, Some("judge"), &|_| false).map_err(|p| format!("{p:?}"))?;
/// let (workflow, _) = store.add_workflow(&wf)?;
/// let mut judge = Judge::default();
/// let (thread, report) =
///     store.run_workflow(workflow, "Add a --json flag", &StartOptions::default(), &mut judge)?;
/// assert_eq!(report.into_result()?[0].status, ThreadStatus::Completed);
/// // The prompt holds the task; the second one says why the first reply was refused.
/// assert!(judge.prompts[0].contains("Add a --json flag"));
/// assert!(judge.prompts[1].contains("Your previous reply was invalid"));
///
/// // The stored step is the accepted reply, frontmatter and all.
/// let log = store.thread_log(thread.id, 10, None)?;
/// let step = log.iter().find(|e| e.node.role == "judge").ok_or("no judge step")?;
/// assert_eq!(step.node.meta["$status"], uwf_db::Value::Str("approved".into()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// An agent that fails returns an error (an embedder's own as
/// [`AgentError::Other`]): the step commits nothing, the error is recorded
/// on the thread, and the thread stays as it was, ready to be driven again.
///
/// ```
/// use uwf_db::Store;
/// use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
/// use uwf_db::engine::{EngineError, StartOptions};
/// use uwf_db::thread::ThreadStatus;
/// use uwf_db::workflow::parse_workflow;
///
/// struct Offline;
/// impl Agent for Offline {
///     fn call(&mut self, _: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
///         Err(AgentError::Other("the model is offline".into()))
///     }
/// }
///
/// # let yaml = "name: one\nroles:\n  worker: { goal: Work }\ngraph:\n  $START: { _: { role: worker, prompt: 'Work' } }\n  worker: { _: { role: $END, prompt: 'Done' } }\n";
/// # let store = Store::memory();
/// # let wf = parse_workflow(yaml, Some("one"), &|_| false).map_err(|p| format!("{p:?}"))?;
/// # let (workflow, _) = store.add_workflow(&wf)?;
/// let (thread, report) =
///     store.run_workflow(workflow, "a task", &StartOptions::default(), &mut Offline)?;
/// assert!(report.results.is_empty());
/// assert!(matches!(report.error, Some(EngineError::StepFailed { .. })));
/// let record = store.thread(thread.id)?.ok_or("no thread")?;
/// assert_eq!(record.status, ThreadStatus::Idle);
/// assert!(record.last_error.is_some_and(|e| e.contains("the model is offline")));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Agent: Send {
    /// Answers one request.
    fn call(&mut self, request: &AgentRequest<'_>) -> Result<AgentReply, AgentError>;
    /// How many times to re-ask after an invalid reply (frontmatter).
    fn reasks(&self) -> usize {
        0
    }
    /// Whether the agent reads [`AgentRequest::answered_steps`] (counting
    /// may walk a forked thread's history, so it is skipped otherwise).
    fn needs_step_count(&self) -> bool {
        false
    }
}

/// A parsed `--agent` spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentSpec {
    /// `script:FILE`.
    Script(PathBuf),
    /// `cmd:PROGRAM ARGS…`, split like shell words.
    Cmd(Vec<String>),
}

impl AgentSpec {
    /// Parses `script:FILE` or `cmd:PROGRAM ARGS`.
    ///
    /// ```
    /// use uwf_db::engine::agent::{AgentError, AgentSpec};
    ///
    /// let spec = AgentSpec::parse("cmd:llm --model 'small one'")?;
    /// assert_eq!(spec, AgentSpec::Cmd(vec!["llm".into(), "--model".into(), "small one".into()]));
    /// assert_eq!(AgentSpec::parse("script:s.yaml")?, AgentSpec::Script("s.yaml".into()));
    /// assert!(matches!(AgentSpec::parse("llm"), Err(AgentError::BadSpec(_))));
    /// # Ok::<(), AgentError>(())
    /// ```
    pub fn parse(spec: &str) -> Result<AgentSpec, AgentError> {
        if let Some(file) = spec.strip_prefix("script:") {
            return Ok(AgentSpec::Script(PathBuf::from(file)));
        }
        if let Some(line) = spec.strip_prefix("cmd:") {
            let words = shell_words::split(line)
                .map_err(|e| AgentError::BadSpec(format!("{spec} ({e})")))?;
            if words.is_empty() {
                return Err(AgentError::BadSpec(spec.to_owned()));
            }
            return Ok(AgentSpec::Cmd(words));
        }
        Err(AgentError::BadSpec(spec.to_owned()))
    }
}

#[derive(Debug, Clone, Deserialize)]
struct ScriptStep {
    role: String,
    output: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepList {
    steps: Vec<ScriptStep>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    #[serde(default)]
    steps: Option<Vec<ScriptStep>>,
    #[serde(default)]
    workflows: Option<BTreeMap<String, StepList>>,
    #[serde(default)]
    compact: Vec<String>,
}

/// `script:FILE`: step *i* answers when the thread already has *i*
/// agent-answered role steps.
#[derive(Debug, Clone)]
pub struct ScriptAgent {
    path: PathBuf,
    scenario: Scenario,
}

impl ScriptAgent {
    /// Loads a scenario file: `steps:` (step *i* is the role and the reply
    /// for a thread with *i* answered steps), or `workflows:` (steps per
    /// workflow name, for child workflows).
    ///
    /// ```
    /// use uwf_db::Store;
    /// use uwf_db::engine::StartOptions;
    /// use uwf_db::engine::agent::ScriptAgent;
    /// use uwf_db::thread::ThreadStatus;
    /// use uwf_db::workflow::parse_workflow;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let file = dir.path().join("scenario.yaml");
    /// std::fs::write(&file, "steps:\n  - role: worker\n    output: All done\n")?;
    /// let mut agent = ScriptAgent::load(&file)?;
    ///
    /// # let yaml = "name: one\nroles:\n  worker: { goal: Work }\ngraph:\n  $START: { _: { role: worker, prompt: 'Work' } }\n  worker: { _: { role: $END, prompt: 'Done' } }\n";
    /// # let store = Store::memory();
    /// # let wf = parse_workflow(yaml, Some("one"), &|_| false).map_err(|p| format!("{p:?}"))?;
    /// # let (workflow, _) = store.add_workflow(&wf)?;
    /// let options = StartOptions::default();
    /// let (_, report) = store.run_workflow(workflow, "a task", &options, &mut agent)?;
    /// assert_eq!(report.into_result()?[0].status, ThreadStatus::Completed);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load(path: &Path) -> Result<ScriptAgent, AgentError> {
        let bad = |detail: String| AgentError::Scenario {
            path: path.to_path_buf(),
            detail,
        };
        let text = crate::input::read_text_capped(path, crate::input::MAX_SCENARIO, "scenario")
            .map_err(|e| match e {
                crate::input::InputError::Unreadable { source, .. } => {
                    AgentError::ScenarioUnreadable {
                        path: path.to_path_buf(),
                        source,
                    }
                }
                other => bad(other.to_string()),
            })?;
        ScriptAgent::parse(path, &text)
    }

    /// A scenario from its text (`path` names it in errors): what
    /// [`ScriptAgent::load`] does after reading the file.
    ///
    /// ```
    /// use std::path::Path;
    /// use uwf_db::engine::agent::{AgentError, ScriptAgent};
    /// assert!(ScriptAgent::parse(Path::new("s.yaml"), "steps: []").is_ok());
    /// let e = ScriptAgent::parse(Path::new("s.yaml"), "steps: [").unwrap_err();
    /// assert!(matches!(e, AgentError::ScenarioYaml { .. }));
    /// ```
    pub fn parse(path: &Path, text: &str) -> Result<ScriptAgent, AgentError> {
        let scenario: Scenario =
            crate::yaml::from_str(text).map_err(|e| AgentError::ScenarioYaml {
                path: path.to_path_buf(),
                source: Box::new(e),
            })?;
        if scenario.steps.is_none() == scenario.workflows.is_none() {
            return Err(AgentError::Scenario {
                path: path.to_path_buf(),
                detail: "give exactly one of `steps:` or `workflows:`".into(),
            });
        }
        Ok(ScriptAgent {
            path: path.to_path_buf(),
            scenario,
        })
    }
}

impl Agent for ScriptAgent {
    fn needs_step_count(&self) -> bool {
        true
    }

    fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
        if let Some(i) = req.summary_index {
            return self
                .scenario
                .compact
                .get(i)
                .cloned()
                .map(AgentReply::from)
                .ok_or_else(|| AgentError::Scenario {
                    path: self.path.clone(),
                    detail: format!(
                        "no compact answer {i} (it has {})",
                        self.scenario.compact.len()
                    ),
                });
        }
        let steps = match (&self.scenario.steps, &self.scenario.workflows) {
            (Some(s), _) => s,
            (None, Some(w)) => {
                &w.get(req.workflow)
                    .ok_or_else(|| AgentError::Scenario {
                        path: self.path.clone(),
                        detail: format!("no steps for workflow '{}'", req.workflow),
                    })?
                    .steps
            }
            (None, None) => {
                return Err(AgentError::Scenario {
                    path: self.path.clone(),
                    detail: "give exactly one of `steps:` or `workflows:`".into(),
                });
            }
        };
        let i = req.answered_steps;
        let step = steps.get(i).ok_or_else(|| AgentError::PastEnd {
            index: i,
            len: steps.len(),
            actual: req.role_name.to_owned(),
        })?;
        if step.role != req.role_name {
            return Err(AgentError::RoleMismatch {
                index: i,
                expected: step.role.clone(),
                actual: req.role_name.to_owned(),
            });
        }
        Ok(step.output.clone().into())
    }
}

/// How built-in agents run ([`AgentSpec::build`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentOptions {
    /// The store directory, given to `cmd:` programs as `UWF_STORE`
    /// ([`Store::build_agent`](crate::Store::build_agent) fills it in).
    pub store: PathBuf,
    /// How long a `cmd:` program may take before its process group is
    /// killed.
    pub timeout: Duration,
    /// How many times a `cmd:` agent is re-asked after an invalid reply.
    pub reasks: usize,
    /// The largest reply (stdout) a `cmd:` agent may give: past it the
    /// program's process group is killed and the call fails with
    /// [`AgentError::ReplyTooLarge`], so an endless reply costs bounded
    /// memory. Default [`DEFAULT_MAX_REPLY`].
    pub max_reply_bytes: usize,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            store: PathBuf::new(),
            timeout: DEFAULT_TIMEOUT,
            reasks: DEFAULT_REASKS,
            max_reply_bytes: DEFAULT_MAX_REPLY,
        }
    }
}

/// Default largest reply of a `cmd:` agent: 16 MiB.
pub const DEFAULT_MAX_REPLY: usize = 16 << 20;

/// The tail of a `cmd:` agent's stderr kept for its error: 16 KiB.
pub const STDERR_TAIL: usize = 16 << 10;

/// Default re-asks of a `cmd:` agent after an invalid reply.
pub const DEFAULT_REASKS: usize = 2;

impl AgentSpec {
    /// The agent this spec names: a loaded scenario, or a command agent.
    /// ([`Store::build_agent`](crate::Store::build_agent) parses and builds
    /// in one call, with the store's directory filled in.)
    ///
    /// ```
    /// use uwf_db::engine::agent::{AgentError, AgentOptions, AgentSpec};
    ///
    /// let agent = AgentSpec::parse("cmd:cat")?.build(&AgentOptions::default())?;
    /// assert_eq!(agent.reasks(), AgentOptions::default().reasks);
    /// let missing = AgentSpec::parse("script:/no/such/scenario.yaml")?;
    /// let missing = missing.build(&AgentOptions::default());
    /// assert!(matches!(missing, Err(AgentError::ScenarioUnreadable { .. })));
    /// # Ok::<(), AgentError>(())
    /// ```
    pub fn build(&self, options: &AgentOptions) -> Result<Box<dyn Agent>, AgentError> {
        Ok(match self {
            AgentSpec::Script(file) => Box::new(ScriptAgent::load(file)?),
            AgentSpec::Cmd(argv) => Box::new(CmdAgent::new(argv.clone(), options)?),
        })
    }
}

/// `cmd:PROGRAM ARGS`: the prompt on stdin, `UWF_THREAD`, `UWF_ROLE`,
/// `UWF_STORE` in the environment, stdout is the reply. The program runs in
/// its own process group, killed whole on timeout or when the drive's
/// [`Cancel`] token is cancelled.
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
fn die_with_driver(command: &mut Command) {
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
fn has_exited(child: &mut std::process::Child) -> std::io::Result<bool> {
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

impl Agent for CmdAgent {
    fn reasks(&self) -> usize {
        self.reasks
    }

    fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
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
        let out = {
            let stdout = child.stdout.take();
            let too_large = std::sync::Arc::clone(&too_large);
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
        };
        // stderr: only its last STDERR_TAIL bytes are kept.
        let err = {
            let stderr = child.stderr.take();
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
        };
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
        if !status.success() {
            return Err(AgentError::Exit {
                status: status.to_string(),
                stderr,
            });
        }
        String::from_utf8(stdout)
            .map(AgentReply::from)
            .map_err(|_| AgentError::NotUtf8)
    }
}

/// The last `keep` bytes of a stream, and how many came before them.
struct Tail {
    keep: usize,
    bytes: std::collections::VecDeque<u8>,
    cut: u64,
}

impl Tail {
    fn new(keep: usize) -> Self {
        Tail {
            keep,
            bytes: std::collections::VecDeque::new(),
            cut: 0,
        }
    }

    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend(chunk);
        let over = self.bytes.len().saturating_sub(self.keep);
        if over > 0 {
            self.bytes.drain(..over);
            self.cut += over as u64;
        }
    }

    /// The kept text, trimmed, after a `[… N bytes cut]` line when
    /// something was cut.
    fn text(self) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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

//! Agents: what answers a role step. This file holds the trait, requests,
//! replies, errors and specs; the built-in agents are `script:FILE`
//! (`script.rs`: a scripted scenario, for tests and examples),
//! `cmd:PROGRAM ARGS` (`command.rs`: an external program such as an LLM
//! CLI, supervised by `process.rs`) and `claude:[ARGS]` (`claude.rs`:
//! Claude Code in print mode, or a compatible agent CLI, run like `cmd:`
//! and read from its JSON result).

mod claude;
mod command;
mod process;
mod script;

pub use claude::{CLAUDE_PROGRAM, CLAUDE_PROGRAM_VAR, ClaudeAgent, ClaudeSpec};
pub use command::CmdAgent;
pub use script::ScriptAgent;

use std::path::PathBuf;
use std::time::Duration;

use super::cancel::Cancel;
use crate::hash::Hash;
use crate::thread::ThreadId;
use crate::workflow::Role;

/// Default time a `cmd:` or `claude:` agent may take.
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
    /// The assembled prompt (what a `cmd:` or `claude:` agent reads on
    /// stdin).
    pub prompt: &'a str,
    /// Agent-answered role steps the thread already has.
    pub answered_steps: usize,
    /// The directory to work in (the edge's `location` resolved against
    /// the thread's `cwd`; it exists): a `cmd:` or `claude:` agent is
    /// started there.
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
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AgentReply {
    /// Markdown with YAML frontmatter.
    pub output: String,
    /// The final state of a child thread the agent ran.
    pub child_thread: Option<Hash>,
    /// What the call cost, as the agent reports it (a `$usage` key in the
    /// frontmatter is used when this is `None`): recorded with the step.
    pub usage: Option<crate::usage::Usage>,
    /// What the agent said on the side (a `cmd:` or `claude:` agent's
    /// stderr, its last [`STDERR_TAIL`] bytes): kept with the step
    /// ([`kept`](crate::engine::kept)), shown by `thread log --stderr`.
    pub stderr: Option<String>,
}

impl From<String> for AgentReply {
    fn from(output: String) -> Self {
        AgentReply {
            output,
            ..AgentReply::default()
        }
    }
}

/// Why an agent gave no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// A `cmd:` (or `claude:`) agent's reply passed
    /// [`AgentOptions::max_reply_bytes`]: its process group was killed.
    #[error(
        "the agent's reply passed {limit} bytes: the agent was killed and the step failed (raise --max-reply-size if such replies are expected)"
    )]
    ReplyTooLarge {
        /// The cap, in bytes.
        limit: usize,
    },
    /// A `cmd:` (or `claude:`) agent's program exited, but a process it
    /// started outside its process group (a daemon, say) kept its output
    /// pipes open until the timeout: the reply cannot be known to be whole.
    #[error(
        "the agent exited but a process it started outside its process group kept its output open until the timeout ({seconds} s after the start): no reply was taken and the step failed"
    )]
    OutputHeld {
        /// Seconds from the start of the call to giving up.
        seconds: u64,
    },
    /// The spec is not `script:FILE`, `cmd:PROGRAM ARGS` or
    /// `claude:[ARGS]` (or its words cannot be used: then the reason
    /// follows it, in parentheses).
    #[error("unknown agent spec '{0}': use script:FILE, cmd:PROGRAM ARGS or claude:[ARGS]")]
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
    /// An agent CLI (`claude:`) answered with an error of its own (its
    /// result said `is_error`, or its subtype is an error): the step fails
    /// with the agent's message.
    #[error("{agent} reported an error: {message}")]
    Reported {
        /// The program that answered.
        agent: String,
        /// What it said (its result text, else its subtype), cut to 4 KiB.
        message: String,
        /// What the failed call cost, as the agent reported it: counted in
        /// the thread's usage with the failed attempt.
        usage: Option<Box<crate::usage::Usage>>,
    },
    /// An agent CLI (`claude:`) printed no result object: it crashed, or
    /// printed something else. (Boxed: it carries four texts, and every
    /// `Result` of the engine carries an `AgentError`.)
    #[error("{0}")]
    NoResult(Box<NoResultReport>),
    /// A `cmd:` agent needs a program to run.
    #[error("a cmd: agent needs a program to run (cmd:PROGRAM ARGS)")]
    NoProgram,
    /// An embedder's agent failed; the cause is kept as the source.
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

/// What [`AgentError::NoResult`] says: which program printed no result
/// object, why its output is none, and what it printed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{agent} printed no JSON result ({problem}); its stdout began: {stdout:?}; its stderr: {stderr:?}"
)]
pub struct NoResultReport {
    /// The program that ran.
    pub agent: String,
    /// What was wrong: the exit status when it failed, and why its stdout
    /// is no result object.
    pub problem: String,
    /// The first 200 bytes of its stdout.
    pub stdout: String,
    /// The tail of its stderr (trimmed).
    pub stderr: String,
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
/// let (workflow, _) = store.workflows().add(&wf)?;
/// let mut judge = Judge::default();
/// let (thread, report) =
///     store.engine().run_workflow(workflow, "Add a --json flag", &StartOptions::default(), &mut judge)?;
/// assert_eq!(report.into_result()?[0].status, ThreadStatus::Completed);
/// // The prompt holds the task; the second one says why the first reply was refused.
/// assert!(judge.prompts[0].contains("Add a --json flag"));
/// assert!(judge.prompts[1].contains("Your previous reply was invalid"));
///
/// // The stored step is the accepted reply, frontmatter and all.
/// let log = store.threads().log(thread.id, 10, None)?;
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
/// # let (workflow, _) = store.workflows().add(&wf)?;
/// let (thread, report) =
///     store.engine().run_workflow(workflow, "a task", &StartOptions::default(), &mut Offline)?;
/// assert!(report.results.is_empty());
/// assert!(matches!(report.error, Some(EngineError::StepFailed { .. })));
/// let record = store.threads().get(thread.id)?.ok_or("no thread")?;
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
    /// What the run changes in the workflow's retry policies (`--retries`,
    /// `--retry-backoff`): nothing, unless the agent was built with
    /// [`AgentOptions::retry`] or overrides this.
    fn retry(&self) -> crate::workflow::RetryOverride {
        crate::workflow::RetryOverride::default()
    }
    /// Another agent like this one, for a fan-out role's children driven
    /// at the same time (SPEC §13): `None` (the default) drives them one at
    /// a time with this agent. The built-in agents fork.
    fn fork(&self) -> Option<Box<dyn Agent>> {
        None
    }
}

/// A built-in agent with the run's retry override (see [`Agent::retry`]).
struct WithRetry {
    inner: Box<dyn Agent>,
    retry: crate::workflow::RetryOverride,
}

impl Agent for WithRetry {
    fn call(&mut self, request: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
        self.inner.call(request)
    }
    fn reasks(&self) -> usize {
        self.inner.reasks()
    }
    fn needs_step_count(&self) -> bool {
        self.inner.needs_step_count()
    }
    fn retry(&self) -> crate::workflow::RetryOverride {
        self.retry
    }
    fn fork(&self) -> Option<Box<dyn Agent>> {
        Some(Box::new(WithRetry {
            inner: self.inner.fork()?,
            retry: self.retry,
        }))
    }
}

/// A parsed `--agent` spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentSpec {
    /// `script:FILE`.
    Script(PathBuf),
    /// `cmd:PROGRAM ARGS…`, split like shell words.
    Cmd(Vec<String>),
    /// `claude:[ARGS…]`: Claude Code in print mode (the program
    /// [`CLAUDE_PROGRAM_VAR`] names, else `claude`), ARGS split like shell
    /// words and given after `-p --output-format json`.
    Claude(ClaudeSpec),
}

impl AgentSpec {
    /// Parses `script:FILE`, `cmd:PROGRAM ARGS` or `claude:[ARGS]`.
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
    ///
    /// `claude:` takes Claude Code's own flags after the colon (none is
    /// fine); the agent fixes the output format, so that flag is refused:
    ///
    /// ```
    /// use uwf_db::engine::agent::{AgentError, AgentSpec, ClaudeSpec};
    ///
    /// let AgentSpec::Claude(spec) = AgentSpec::parse("claude:--model sonnet --allowedTools 'Read,Edit'")? else {
    ///     panic!("not a claude: spec");
    /// };
    /// assert_eq!(
    ///     spec.argv("claude"),
    ///     ["claude", "-p", "--output-format", "json", "--model", "sonnet", "--allowedTools", "Read,Edit"]
    /// );
    /// assert_eq!(AgentSpec::parse("claude:")?, AgentSpec::Claude(ClaudeSpec::default()));
    /// let refused = AgentSpec::parse("claude:--output-format text");
    /// assert!(matches!(refused, Err(AgentError::BadSpec(why)) if why.contains("--output-format")));
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
        if let Some(words) = spec.strip_prefix("claude:") {
            return ClaudeSpec::parse(words)
                .map(AgentSpec::Claude)
                .map_err(|why| AgentError::BadSpec(format!("{spec} ({why})")));
        }
        Err(AgentError::BadSpec(spec.to_owned()))
    }
}

/// How built-in agents run ([`AgentSpec::build`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentOptions {
    /// The store directory, given to `cmd:` and `claude:` programs as
    /// `UWF_STORE` ([`Engine::build_agent`](crate::engine::Engine::build_agent)
    /// fills it in).
    pub store: PathBuf,
    /// How long a `cmd:` or `claude:` program may take before its process
    /// group is killed.
    pub timeout: Duration,
    /// How many times a `cmd:` or `claude:` agent is re-asked after an
    /// invalid reply.
    pub reasks: usize,
    /// The largest reply (stdout; for `claude:` its whole JSON) a `cmd:` or
    /// `claude:` agent may give: past it the program's process group is
    /// killed and the call fails with [`AgentError::ReplyTooLarge`], so an
    /// endless reply costs bounded memory. Default [`DEFAULT_MAX_REPLY`].
    pub max_reply_bytes: usize,
    /// What the run changes in the workflow's retry policies
    /// (`--retries`, `--retry-backoff`; SPEC §13): the agent's
    /// [`Agent::retry`].
    pub retry: crate::workflow::RetryOverride,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            store: PathBuf::new(),
            timeout: DEFAULT_TIMEOUT,
            reasks: DEFAULT_REASKS,
            max_reply_bytes: DEFAULT_MAX_REPLY,
            retry: crate::workflow::RetryOverride::default(),
        }
    }
}

/// Default largest reply of a `cmd:` or `claude:` agent: 16 MiB.
pub const DEFAULT_MAX_REPLY: usize = 16 << 20;

/// The tail of a `cmd:` or `claude:` agent's stderr kept for its error:
/// 16 KiB.
pub const STDERR_TAIL: usize = 16 << 10;

/// Default re-asks of a `cmd:` or `claude:` agent after an invalid reply.
pub const DEFAULT_REASKS: usize = 2;

impl AgentSpec {
    /// The agent this spec names: a loaded scenario, a command agent or a
    /// Claude Code agent.
    /// ([`Engine::build_agent`](crate::engine::Engine::build_agent) parses and builds
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
        let agent: Box<dyn Agent> = match self {
            AgentSpec::Script(file) => Box::new(ScriptAgent::load(file)?),
            AgentSpec::Cmd(argv) => Box::new(CmdAgent::new(argv.clone(), options)?),
            AgentSpec::Claude(spec) => Box::new(ClaudeAgent::new(spec, options)?),
        };
        if options.retry == crate::workflow::RetryOverride::default() {
            return Ok(agent);
        }
        Ok(Box::new(WithRetry {
            inner: agent,
            retry: options.retry,
        }))
    }
}

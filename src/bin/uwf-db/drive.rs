//! `run`, `thread step|resume|cancel|compact`: driving threads.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use uwf_db::Store;
use uwf_db::engine::agent::{Agent, AgentOptions};
use uwf_db::engine::{Cancel, DriveOptions, StartOptions, StepResult};
use uwf_db::thread::ThreadId;

use crate::output::Output;
use crate::{Cli, CliError};

/// How to run agents.
#[derive(Args, Clone)]
pub struct AgentArgs {
    /// The agent: script:FILE, cmd:PROGRAM ARGS or claude:[ARGS] (Claude Code, or the program
    /// $UWF_CLAUDE names; stored on the thread; reused when omitted)
    #[arg(long, value_name = "SPEC")]
    pub agent: Option<String>,
    /// Kill an agent program's process group (cmd:, claude:) after this long (e.g. 90s, 10m)
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = crate::output::parse_duration)]
    pub agent_timeout: Duration,
    /// Re-ask an agent program (cmd:, claude:) this many times after an invalid reply
    #[arg(long, default_value_t = 2)]
    pub reasks: usize,
    /// Largest reply an agent program (cmd:, claude:) may print (e.g. 64KiB, 16MiB): past it the agent is killed
    /// and the step fails
    #[arg(long, value_name = "SIZE", default_value = "16MiB", value_parser = parse_reply_size)]
    pub max_reply_size: usize,
    /// Make a failed agent call again up to N times (timeouts and failed calls, or what the
    /// workflow's retry: names), waiting --retry-backoff, doubled each time, with jitter; 0 turns
    /// the workflow's retries off
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=99))]
    pub retries: Option<u32>,
    /// The wait before the first retry (e.g. 500ms, 2s); replaces the workflow's backoff
    #[arg(long, value_name = "DURATION", value_parser = parse_backoff)]
    pub retry_backoff: Option<Duration>,
}

/// `--retry-backoff`: a duration of at most an hour.
fn parse_backoff(s: &str) -> Result<Duration, String> {
    let d = crate::output::parse_duration(s)?;
    if d > Duration::from_secs(3600) {
        return Err(format!("'{s}' is longer than the longest backoff (1h)"));
    }
    Ok(d)
}

/// `--max-reply-size`: a size of at least one byte.
fn parse_reply_size(s: &str) -> Result<usize, String> {
    match crate::output::parse_size(s)? {
        0 => Err("must be at least 1 byte (0 would refuse every reply)".into()),
        n => usize::try_from(n).map_err(|_| format!("'{s}' is too large")),
    }
}

/// A `--count`: a whole number, at least 1 (0 would run nothing and
/// succeed silently, which hides a mistake in a script).
pub fn parse_count(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1 (0 would do nothing)".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("'{s}' is not a whole number")),
    }
}

/// A batch's `-n N`: a count from 1 to [`MAX_BATCH_THREADS`].
///
/// [`MAX_BATCH_THREADS`]: uwf_db::engine::batch::MAX_BATCH_THREADS
pub fn parse_batch_count(s: &str) -> Result<usize, String> {
    use uwf_db::engine::batch::MAX_BATCH_THREADS;
    let n = parse_count(s).map_err(|e| {
        if s.trim().bytes().all(|b| b.is_ascii_digit())
            && !s.trim().is_empty()
            && e.contains("whole")
        {
            format!("'{s}' is more threads than a batch starts (at most {MAX_BATCH_THREADS})")
        } else {
            e
        }
    })?;
    if n > MAX_BATCH_THREADS {
        return Err(format!(
            "{n} is more threads than a batch starts (at most {MAX_BATCH_THREADS}); run several batches"
        ));
    }
    Ok(n)
}

impl AgentArgs {
    /// How built-in agents run.
    pub fn options(&self) -> AgentOptions {
        AgentOptions {
            timeout: self.agent_timeout,
            reasks: self.reasks,
            max_reply_bytes: self.max_reply_size,
            retry: uwf_db::workflow::RetryOverride {
                retries: self.retries,
                backoff: self.retry_backoff,
            },
            ..AgentOptions::default()
        }
    }

    /// The agent for a thread and its spec (given, else stored).
    pub fn agent_for(
        &self,
        store: &Store,
        id: ThreadId,
    ) -> Result<(Box<dyn Agent>, String), CliError> {
        Ok(store
            .engine()
            .agent_for(id, self.agent.as_deref(), &self.options())?)
    }

    /// The agent a spec names.
    pub fn build(&self, store: &Store, spec: &str) -> Result<Box<dyn Agent>, CliError> {
        Ok(store.engine().build_agent(spec, &self.options())?)
    }
}

fn print_result(out: &mut Output, r: &StepResult) -> Result<(), CliError> {
    let what = match (&r.current_role, &r.suspended_role) {
        (Some(next), _) => format!("idle, next role {next}"),
        (None, Some(role)) => format!(
            "suspended at role {role}: {}\n  answer and go on: {}",
            r.suspend_message.as_deref().unwrap_or_default(),
            uwf_db::api::resume_command(r.thread)
        ),
        _ => r.status.to_string(),
    };
    out.line(format_args!(
        "thread {} ({}) head {}: {what}",
        r.thread,
        r.workflow,
        r.head.short(12)
    ))?;
    Ok(())
}

/// Prints step results as SPEC §7 says: one result, or an array when more
/// than one step was asked for.
pub fn report(
    out: &mut Output,
    results: &[StepResult],
    as_array: bool,
    failure: Option<uwf_db::engine::EngineError>,
) -> Result<(), CliError> {
    if out.json {
        if as_array {
            out.json_value(&results)?;
        } else if let Some(last) = results.last() {
            out.json_value(last)?;
        }
    } else {
        for r in results {
            print_result(out, r)?;
        }
    }
    match failure {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// Drives thread `id` with the agent given (stored on the thread) or the
/// one stored: up to `count` steps, the first a resume when `resume` is
/// given (with its text), and prints the results.
pub fn drive(
    store: &Store,
    id: ThreadId,
    agent: &AgentArgs,
    count: usize,
    resume: Option<Option<&str>>,
    cancel: &Cancel,
    out: &mut Output,
) -> Result<(), CliError> {
    if resume.is_some() {
        // A thread that cannot be resumed says so (with its status) before
        // anything is said about its agent.
        store.engine().check_resumable(id)?;
    }
    let (mut a, spec) = agent.agent_for(store, id)?;
    let resume_text = match resume {
        Some(None) => human_answer(store, id)?,
        Some(Some(text)) => Some(text.to_owned()),
        None => None,
    };
    let options = DriveOptions {
        max_steps: Some(count),
        resume: resume.is_some(),
        resume_text,
        agent_spec: Some(spec),
        cancel: cancel.clone(),
    };
    let report = store.engine().drive(id, &options, a.as_mut());
    if report.stopped_by_request {
        say_stopped(out, id)?;
    }
    crate::drive::report(out, &report.results, count > 1, report.error)
}

/// The answer a suspended thread waits for, when `thread resume` was given
/// no `-p`: read from stdin when it is not a terminal; refused, with the
/// question, when there is none. `None` for a thread that is not
/// suspended (a completed or failed one resumes without an answer).
fn human_answer(store: &Store, id: ThreadId) -> Result<Option<String>, CliError> {
    use std::io::{IsTerminal, Read};
    let Some(r) = store.threads().get(id)? else {
        return Ok(None);
    };
    if r.underlying_status() != uwf_db::thread::ThreadStatus::Suspended {
        return Ok(None);
    }
    // A fan-out parent waits for its children: with none of them still
    // suspended (each was answered directly), it goes on without an answer.
    if let Some(children) = &r.fan_out {
        let mut waiting = false;
        for &c in children {
            waiting |= store
                .threads()
                .get(c)?
                .is_some_and(|c| c.underlying_status() == uwf_db::thread::ThreadStatus::Suspended);
        }
        if !waiting {
            return Ok(None);
        }
    }
    let needs = || {
        CliError::Failed(format!(
            "thread {id} is suspended waiting for a human's answer to: {}\n  answer with -p: {} (or pipe the answer on stdin)",
            r.suspend_message.as_deref().unwrap_or("(no message)"),
            uwf_db::api::resume_command(id)
        ))
    };
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Err(needs());
    }
    let limit = uwf_db::input::MAX_PROMPT;
    let mut text = String::new();
    stdin
        .lock()
        .take(limit as u64 + 1)
        .read_to_string(&mut text)
        .map_err(|e| CliError::Failed(format!("cannot read the answer from stdin: {e}")))?;
    if text.len() > limit {
        return Err(CliError::Failed(format!(
            "the answer on stdin is longer than the longest prompt ({limit} bytes)"
        )));
    }
    let text = text.trim_end();
    if text.trim().is_empty() {
        return Err(needs());
    }
    Ok(Some(text.to_owned()))
}

/// The drive of `id` stopped because `thread stop` asked it to: said on
/// stdout (text) or stderr (`--json`, whose stdout is the results).
fn say_stopped(out: &mut Output, id: ThreadId) -> Result<(), CliError> {
    let text = format!(
        "stopped after the step in flight, as `uwf-db thread stop` asked: thread {id} is idle; `uwf-db thread step {id}` goes on"
    );
    if out.json {
        crate::output::note(text);
    } else {
        out.line(text)?;
    }
    Ok(())
}

/// `--cwd DIR` (clap value parser: bad input exits 2): an existing
/// directory, made absolute.
pub fn parse_dir(s: &str) -> Result<PathBuf, String> {
    let path = std::path::absolute(s).map_err(|e| format!("cannot resolve '{s}': {e}"))?;
    if path.is_dir() {
        Ok(path)
    } else {
        Err(format!("'{s}' is not an existing directory"))
    }
}

/// A new thread's working directory: `--cwd`, else the current one.
pub fn thread_cwd(given: Option<&Path>) -> Result<PathBuf, CliError> {
    match given {
        Some(dir) => Ok(dir.to_path_buf()),
        None => std::env::current_dir()
            .map_err(|e| CliError::Failed(format!("cannot read the current directory: {e}"))),
    }
}

/// `run`: start a thread and drive it until it ends or suspends.
pub fn run(
    cli: &Cli,
    workflow: &str,
    prompt: &str,
    agent: &AgentArgs,
    (max_rounds, cwd, labels): (Option<u32>, Option<&Path>, uwf_db::thread::Labels),
    cancel: &Cancel,
    out: &mut Output,
) -> Result<(), CliError> {
    let cwd = thread_cwd(cwd)?;
    let store = cli.open(true)?;
    let Some(spec) = agent.agent.clone() else {
        return Err(CliError::Failed(
            "run needs an agent: pass --agent script:FILE or --agent 'cmd:PROGRAM ARGS'".into(),
        ));
    };
    let (hash, _) = crate::workflow::resolve(&store, workflow)?;
    let mut a = agent.build(&store, &spec)?;
    let options = StartOptions {
        agent_spec: Some(spec),
        max_rounds,
        cwd: Some(cwd),
        labels,
        cancel: cancel.clone(),
    };
    let (record, outcome) = store
        .engine()
        .run_workflow(hash, prompt, &options, a.as_mut())?;
    let stopped = outcome.stopped_by_request;
    let (results, failure) = (outcome.results, outcome.error);
    if !out.json {
        out.line(format_args!(
            "started thread {} ({})",
            record.id, record.workflow
        ))?;
    }
    if out.json {
        match results.last() {
            Some(r) => out.json_value(r)?,
            None => out.json_value(&StepResult::of(&record))?,
        }
    } else {
        for r in &results {
            print_result(out, r)?;
        }
        if cli.durability_none() {
            out.line("note: --durability none: these commits were not flushed to disk")?;
        }
    }
    if stopped {
        say_stopped(out, record.id)?;
    }
    match failure {
        Some(e) => Err(e.into()),
        None => ended_failed(&store, record.id, &results),
    }
}

/// Exit 1 when the drive ended the thread `failed` (SPEC §13: `maxRounds`,
/// or a child workflow that failed), saying why.
fn ended_failed(store: &Store, id: ThreadId, results: &[StepResult]) -> Result<(), CliError> {
    if results.last().map(|r| r.status) != Some(uwf_db::thread::ThreadStatus::Failed) {
        return Ok(());
    }
    let why = store
        .threads()
        .get(id)?
        .and_then(|r| r.last_error)
        .unwrap_or_else(|| "its last step routed to a failed end".to_owned());
    Err(CliError::Failed(format!("thread {id} ended failed: {why}")))
}

//! `run`, `thread step|resume|cancel|compact`: driving threads.

use std::path::Path;
use std::time::Duration;

use clap::Args;
use serde_json::json;
use uwf_db::Store;
use uwf_db::engine::StepResult;
use uwf_db::engine::agent::{Agent, AgentSpec, CmdAgent, ScriptAgent};
use uwf_db::thread::{ThreadId, ThreadRecord};

use crate::output::Output;
use crate::{Cli, CliError};

/// How to run agents.
#[derive(Args, Clone)]
pub struct AgentArgs {
    /// The agent: script:FILE or cmd:PROGRAM ARGS (stored on the thread; reused when omitted)
    #[arg(long, value_name = "SPEC")]
    pub agent: Option<String>,
    /// Kill a cmd: agent's process group after this long (e.g. 90s, 10m)
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    pub agent_timeout: Duration,
    /// Re-ask a cmd: agent this many times after an invalid reply
    #[arg(long, default_value_t = 2)]
    pub reasks: usize,
}

/// `90s`, `10m`, `1h`, `7d`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a duration (examples: 90s, 10m, 1h)"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86_400.0,
        _ => {
            return Err(format!(
                "unknown duration unit in '{s}' (use ms, s, m, h or d)"
            ));
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("'{s}': {e}"))
}

impl AgentArgs {
    /// The agent for a thread: the given spec (stored on the record), else
    /// the one stored, else an error.
    pub fn agent_for(
        &self,
        store: &Store,
        record: &ThreadRecord,
    ) -> Result<Box<dyn Agent>, CliError> {
        let Some(spec) = self.agent.as_ref().or(record.agent.as_ref()) else {
            return Err(CliError::Failed(format!(
                "thread {} has no agent: pass --agent script:FILE or --agent 'cmd:PROGRAM ARGS'",
                record.id
            )));
        };
        // Build first: a spec that does not work is never stored.
        let agent = self.build(store.path(), spec)?;
        if record.agent.as_ref() != Some(spec) {
            let spec = spec.clone();
            store.update_record(record.id, move |r| {
                r.agent = Some(spec.clone());
                Ok(())
            })?;
        }
        Ok(agent)
    }

    pub fn build(&self, store: &Path, spec: &str) -> Result<Box<dyn Agent>, CliError> {
        match AgentSpec::parse(spec).map_err(uwf_db::engine::EngineError::from)? {
            AgentSpec::Script(file) => Ok(Box::new(
                ScriptAgent::load(&file).map_err(uwf_db::engine::EngineError::from)?,
            )),
            AgentSpec::Cmd(argv) => Ok(Box::new(CmdAgent::new(
                argv,
                store.to_path_buf(),
                self.agent_timeout,
                self.reasks,
            ))),
        }
    }
}

fn print_result(out: &mut Output, r: &StepResult) -> Result<(), CliError> {
    let what = match (&r.current_role, &r.suspended_role) {
        (Some(next), _) => format!("idle, next role {next}"),
        (None, Some(role)) => format!(
            "suspended at role {role}: {}",
            r.suspend_message.as_deref().unwrap_or_default()
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

/// Runs up to `count` steps (the first may be a resume).
pub fn drive(
    store: &Store,
    id: ThreadId,
    agent: &mut dyn Agent,
    count: usize,
    resume: Option<Option<&str>>,
) -> (Vec<StepResult>, Option<uwf_db::engine::EngineError>) {
    let mut results = Vec::new();
    // Hold the thread for the whole drive, not per step.
    let _claim = match store.claim(id) {
        Ok(c) => c,
        Err(e) => return (results, Some(e)),
    };
    if let Some(text) = resume {
        match store.resume_thread(id, text, agent) {
            Ok(r) => results.push(r),
            Err(e) => return (results, Some(e)),
        }
    }
    let stopped = |results: &Vec<StepResult>| {
        results
            .last()
            .is_some_and(|r: &StepResult| r.current_role.is_none())
    };
    if results.len() < count && !stopped(&results) {
        let outcome = store.run_thread(id, count - results.len(), agent);
        results.extend(outcome.results);
        if outcome.error.is_some() {
            return (results, outcome.error);
        }
    }
    (results, None)
}

/// `run`: start a thread and drive it until it ends or suspends.
pub fn run(
    cli: &Cli,
    workflow: &str,
    prompt: &str,
    agent: &AgentArgs,
    max_rounds: Option<u32>,
    out: &mut Output,
) -> Result<(), CliError> {
    let store = cli.open(true)?;
    if agent.agent.is_none() {
        return Err(CliError::Failed(
            "run needs an agent: pass --agent script:FILE or --agent 'cmd:PROGRAM ARGS'".into(),
        ));
    }
    let (hash, _) = crate::workflow::resolve(&store, workflow)?;
    let spec = agent.agent.clone().unwrap_or_default();
    let mut a = agent.build(store.path(), &spec)?;
    let (record, outcome) = store.run_workflow(hash, prompt, Some(spec), max_rounds, a.as_mut())?;
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
            None => out.json_value(&json!({
                "thread": record.id, "workflow": record.workflow, "head": record.head,
                "status": record.status, "current_role": record.next_role,
                "suspended_role": null, "suspend_message": null, "done": false,
            }))?,
        }
    } else {
        for r in &results {
            print_result(out, r)?;
        }
        if cli.durability_none() {
            out.line("note: --durability none: these commits were not flushed to disk")?;
        }
    }
    match failure {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

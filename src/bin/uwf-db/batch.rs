//! `batch`: drive many threads in parallel, committing in groups.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use uwf_db::engine::Cancel;
use uwf_db::engine::batch::{BatchItem, BatchOptions, BatchPrompt, BatchReport};
use uwf_db::thread::Labels;

use crate::drive::AgentArgs;
use crate::output::Output;
use crate::{Cli, CliError};

/// What a batch drives.
enum Work {
    /// New threads, one per prompt.
    Start(Vec<BatchPrompt>),
    /// New threads of one prompt, so many (created as the batch goes).
    Repeat(BatchPrompt, usize),
    /// The workflow's continuable threads (as many as were listed first;
    /// more may come), shared with other runners.
    Continue(usize),
}

/// The prompts: one per non-empty line of `file` (in a `.jsonl` file each
/// line is a JSON string or an object with a `prompt` string and optional
/// `labels`, so prompts may span lines), or `count` copies of `prompt`.
fn prompts(
    file: Option<&Path>,
    count: Option<usize>,
    prompt: Option<&str>,
) -> Result<Work, CliError> {
    match (file, count, prompt) {
        (Some(file), _, _) => Ok(Work::Start(uwf_db::engine::prompt_file::read_prompts(
            file,
        )?)),
        (None, Some(n), Some(p)) => Ok(Work::Repeat(BatchPrompt::from(p.to_owned()), n)),
        _ => Err(CliError::Failed(
            "batch needs --prompts FILE, -n N with -p TEXT, or --continue".into(),
        )),
    }
}

/// What to run: where the threads come from, and how.
pub struct Args<'a> {
    pub file: Option<&'a Path>,
    pub count: Option<usize>,
    pub prompt: Option<&'a str>,
    /// Drive the workflow's idle threads (and those a dead driver left
    /// `running`) on instead of starting new ones.
    pub continue_: bool,
    /// With `continue_`: stay while another runner drives a thread of the
    /// workflow, polling this often, to finish its threads if it dies.
    pub wait: Option<std::time::Duration>,
    /// Driver threads.
    pub jobs: usize,
    /// Most writes per commit group (0: the default).
    pub max_group: usize,
    /// Loop protection for new threads.
    pub max_rounds: Option<u32>,
    /// New threads' working directory.
    pub cwd: PathBuf,
    /// Labels of every new thread.
    pub labels: Labels,
}

pub fn run(
    cli: &Cli,
    workflow: &str,
    agent: &AgentArgs,
    source: &Args<'_>,
    cancel: &Cancel,
    out: &mut Output,
) -> Result<(), CliError> {
    const NEEDS_AGENT: &str = "batch needs an agent: pass --agent script:FILE, --agent 'cmd:PROGRAM ARGS' or --agent 'claude:[ARGS]'";
    if agent.agent.is_none() && !source.continue_ {
        return Err(CliError::Failed(NEEDS_AGENT.into()));
    }
    // With --continue, the threads to drive first (their agent may be reused).
    let (store, hash, wf, work, idle) = if source.continue_ {
        let store = cli.open(false)?;
        let (hash, wf) = crate::workflow::resolve(&store, workflow)?;
        let labels: Vec<(String, String)> = source
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let idle = store
            .engine()
            .continuable_threads_labelled(&wf.name, &labels)?;
        (store, hash, wf, Work::Continue(idle.len()), idle)
    } else {
        let work = prompts(source.file, source.count, source.prompt)?;
        let store = cli.open(true)?;
        let (hash, wf) = crate::workflow::resolve(&store, workflow)?;
        (store, hash, wf, work, Vec::new())
    };
    let total = match &work {
        Work::Start(p) => p.len(),
        Work::Repeat(_, n) => *n,
        Work::Continue(n) => *n,
    };
    if total == 0 && source.wait.is_none() {
        if out.json {
            out.json_value(&uwf_db::api::BatchSummary::of(
                BatchReport::default(),
                store.durability(),
            ))?;
        } else {
            out.line(format_args!(
                "no idle thread of {} to continue (suspended threads wait for `thread resume`)",
                wf.name
            ))?;
        }
        return Ok(());
    }
    let spec = match agent.agent.clone() {
        Some(spec) => spec,
        None => shared_agent(&store, &idle, &wf.name)?.ok_or_else(|| {
            CliError::Failed(format!(
                "{NEEDS_AGENT} (no idle thread of {} has one stored to reuse)",
                wf.name
            ))
        })?,
    };
    let live = std::sync::Arc::new(uwf_db::engine::batch::BatchProgress::default());
    let failed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let options = BatchOptions {
        max_group: source.max_group,
        agent_spec: Some(spec.clone()),
        max_rounds: source.max_rounds,
        cwd: Some(source.cwd.clone()),
        cancel: cancel.clone(),
        labels: source.labels.clone(),
        progress: Some(live.clone()),
    };
    let bar = crate::progress::batch_bar(
        total as u64,
        &format!("{} threads", wf.name),
        live,
        failed.clone(),
    );
    // One agent per driver, built before any thread starts, so a bad spec
    // fails cleanly.
    let jobs = match work {
        Work::Start(_) | Work::Repeat(..) => source.jobs.min(total).max(1),
        // More threads may come (a dead runner's): all the jobs asked for.
        Work::Continue(_) => source.jobs.max(1),
    };
    let agents = (0..jobs)
        .map(|_| agent.build(&store, &spec))
        .collect::<Result<Vec<_>, _>>()?;
    let mut written = Ok(());
    let mut said_full = false;
    let mut on_item = |item: &BatchItem| {
        if bar.length().is_some_and(|len| bar.position() >= len) {
            bar.inc_length(1);
        }
        if item.error.is_some() || item.status == Some(uwf_db::thread::ThreadStatus::Failed) {
            failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        bar.inc(1);
        if out.json && written.is_ok() {
            written = out.json_value(item).and_then(|()| out.flush());
        }
        // A full store fails every drive still under way the same way:
        // say it once (the summary says it again).
        let repeat = item.error.as_deref().is_some_and(|e| {
            let full = e.is_store_full();
            let said = said_full;
            said_full |= full;
            full && said
        });
        if let Some(e) = item.error.as_ref().filter(|_| !repeat) {
            bar.suspend(|| match item.thread {
                Some(t) => eprintln!("thread {t}: {e}"),
                None => eprintln!("prompt {}: {e}", item.index + 1),
            });
        }
        // The reader went away (`batch --json | head -1`): start no new
        // thread; the drives under way finish.
        if written.is_err() {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    };
    let report = match &work {
        Work::Start(prompts) => {
            store
                .engine()
                .run_batch_prompts(hash, prompts, &options, agents, &mut on_item)?
        }
        Work::Repeat(prompt, n) => {
            store
                .engine()
                .run_batch_repeat(hash, prompt, *n, &options, agents, &mut on_item)?
        }
        Work::Continue(_) => store.engine().continue_workflow(
            &wf.name,
            &options,
            source.wait,
            agents,
            &mut on_item,
        )?,
    };
    bar.finish_and_clear();
    written?;
    let summary = uwf_db::api::BatchSummary::of(report, store.durability());
    let report = &summary.summary;
    print_summary(cli, &summary, &wf.name, hash, jobs, out)?;
    check_outcome(report, &work, &wf.name)
}

/// `batch --continue` without `--agent`: the agent the idle threads were
/// driven with, when they all share one (a batch started them with one
/// `--agent`), as `thread step` reuses a thread's. `None` when there is no
/// idle thread; an error when one has no stored agent or they differ, since
/// driving every thread with one of them would run some with an agent they
/// were not started with. A thread that comes later (`--wait`) is driven
/// with it too, as with `--agent`.
fn shared_agent(
    store: &uwf_db::Store,
    idle: &[uwf_db::thread::ThreadId],
    workflow: &str,
) -> Result<Option<String>, CliError> {
    let mut specs = std::collections::BTreeSet::new();
    for &id in idle {
        let Some(record) = store.threads().get(id)? else {
            continue;
        };
        match record.agent {
            Some(spec) => {
                specs.insert(spec);
            }
            None => {
                return Err(CliError::Failed(format!(
                    "thread {id} of {workflow} has no stored agent to reuse: pass --agent"
                )));
            }
        }
    }
    if specs.len() > 1 {
        let listed: Vec<&str> = specs.iter().take(3).map(String::as_str).collect();
        return Err(CliError::Failed(format!(
            "the idle threads of {workflow} were driven with {} different agents ({}{}): pass --agent to drive them all with one",
            specs.len(),
            listed.join(", "),
            if specs.len() > 3 { ", ..." } else { "" }
        )));
    }
    Ok(specs.into_iter().next())
}

/// The batch's summary: JSON, or a table.
fn print_summary(
    cli: &Cli,
    summary: &uwf_db::api::BatchSummary,
    workflow: &str,
    hash: uwf_db::Hash,
    jobs: usize,
    out: &mut Output,
) -> Result<(), CliError> {
    let per_sec = summary.steps_per_sec;
    let report = &summary.summary;
    if out.json {
        out.json_value(&summary)?;
    } else {
        out.table(&[
            ("workflow", format!("{workflow} ({})", hash.short(12))),
            (
                "threads",
                format!(
                    "{}: {} completed, {} failed, {} suspended, {} stopped by an error{}",
                    report.threads,
                    report.completed,
                    report.failed,
                    report.suspended,
                    report.errors,
                    match report.skipped {
                        0 => String::new(),
                        n => format!(" ({n} taken by other runners first)"),
                    }
                ),
            ),
            (
                "steps",
                format!(
                    "{} in {:.2} s ({per_sec:.0} steps/s, {} jobs)",
                    report.steps,
                    report.elapsed_ms as f64 / 1000.0,
                    jobs
                ),
            ),
            (
                "commits",
                format!(
                    "{} groups, {:.1} writes per group",
                    report.groups, report.average_group
                ),
            ),
            ("usage", crate::render::usage_text(&report.usage)),
            (
                "durability",
                if cli.durability_none() {
                    "none (NOT flushed to disk)".to_owned()
                } else {
                    "sync (every group flushed before its steps were acknowledged)".to_owned()
                },
            ),
        ])?;
    }
    Ok(())
}

/// Exit 1 when the store filled up, or a thread ended failed or stopped
/// with an error (SPEC §13), saying how many and what to do.
fn check_outcome(report: &BatchReport, work: &Work, workflow: &str) -> Result<(), CliError> {
    if report.store_full {
        let not_started = match work {
            Work::Start(prompts) => prompts.len().saturating_sub(report.threads as usize),
            Work::Repeat(_, n) => n.saturating_sub(report.threads as usize),
            Work::Continue(_) => 0,
        };
        return Err(CliError::Failed(format!(
            "the store is full, so the batch stopped starting threads ({not_started} prompts not \
             started, {} threads stopped with an error); raise --max-map-size (or free disk \
             space), then `uwf-db batch {} --continue` drives the stopped threads on",
            report.errors, workflow
        )));
    }
    let mut problems = Vec::new();
    if report.failed > 0 {
        problems.push(format!("{} ended failed", report.failed));
    }
    if report.errors > 0 {
        problems.push(format!("{} stopped with an error", report.errors));
    }
    if !problems.is_empty() {
        return Err(CliError::Failed(format!(
            "{} of {} threads did not complete: {} (the reason is recorded on each thread: `uwf-db thread list --failed` finds them, `uwf-db thread show ID` says why)",
            report.failed + report.errors,
            report.threads,
            problems.join(", "),
        )));
    }
    Ok(())
}

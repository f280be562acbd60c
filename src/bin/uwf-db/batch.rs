//! `batch`: drive many threads in parallel, committing in groups.

use std::path::Path;

use serde_json::json;
use uwf_db::engine::batch::{BatchItem, BatchOptions};

use crate::drive::AgentArgs;
use crate::output::{self, Output};
use crate::{Cli, CliError};

/// The prompts: one per non-empty line of `file` (in a `.jsonl` file each
/// line is a JSON string or an object with a `prompt` string, so prompts
/// may span lines), or `count` copies of `prompt`.
fn prompts(
    file: Option<&Path>,
    count: Option<usize>,
    prompt: Option<&str>,
) -> Result<Vec<String>, CliError> {
    match (file, count, prompt) {
        (Some(file), _, _) => {
            let text = std::fs::read_to_string(file)
                .map_err(|e| CliError::Failed(format!("cannot read {}: {e}", file.display())))?;
            let json = file.extension().is_some_and(|e| e == "jsonl");
            let mut prompts = Vec::new();
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() {
                    continue;
                }
                if !json {
                    prompts.push(line.to_owned());
                    continue;
                }
                let value: serde_json::Value = serde_json::from_str(line).map_err(|e| {
                    CliError::Failed(format!("{}:{}: not JSON: {e}", file.display(), n + 1))
                })?;
                match value.as_str().or_else(|| value["prompt"].as_str()) {
                    Some(p) => prompts.push(p.to_owned()),
                    None => {
                        return Err(CliError::Failed(format!(
                            "{}:{}: expected a JSON string or an object with a \"prompt\" string",
                            file.display(),
                            n + 1
                        )));
                    }
                }
            }
            if prompts.is_empty() {
                return Err(CliError::Failed(format!(
                    "{} holds no prompts (one per non-empty line; JSON Lines for .jsonl)",
                    file.display()
                )));
            }
            Ok(prompts)
        }
        (None, Some(n), Some(p)) => Ok(vec![p.to_owned(); n]),
        _ => Err(CliError::Failed(
            "batch needs --prompts FILE, or -n N with -p TEXT".into(),
        )),
    }
}

#[allow(clippy::too_many_arguments)]
pub fn run(
    cli: &Cli,
    workflow: &str,
    agent: &AgentArgs,
    file: Option<&Path>,
    count: Option<usize>,
    prompt: Option<&str>,
    jobs: usize,
    max_group: usize,
    max_rounds: Option<u32>,
    out: &mut Output,
) -> Result<(), CliError> {
    let Some(spec) = agent.agent.clone() else {
        return Err(CliError::Failed(
            "batch needs an agent: pass --agent script:FILE or --agent 'cmd:PROGRAM ARGS'".into(),
        ));
    };
    let prompts = prompts(file, count, prompt)?;
    let store = cli.open(true)?;
    let (hash, wf) = crate::workflow::resolve(&store, workflow)?;
    let options = BatchOptions {
        max_group,
        agent_spec: Some(spec.clone()),
        max_rounds,
    };
    let bar = output::progress_bar(prompts.len() as u64, &format!("{} threads", wf.name));
    // One agent per driver, built before any thread starts, so a bad spec
    // fails cleanly.
    let jobs = jobs.min(prompts.len()).max(1);
    let agents = (0..jobs)
        .map(|_| agent.build(store.path(), &spec))
        .collect::<Result<Vec<_>, _>>()?;
    let mut written = Ok(());
    let mut on_item = |item: &BatchItem| {
        bar.inc(1);
        if out.json && written.is_ok() {
            written = out.json_value(item).and_then(|()| out.flush());
        }
        if let Some(e) = &item.error {
            bar.suspend(|| match item.thread {
                Some(t) => eprintln!("thread {t}: {e}"),
                None => eprintln!("prompt {}: {e}", item.index + 1),
            });
        }
    };
    let report = store.run_batch(hash, &prompts, &options, agents, &mut on_item)?;
    bar.finish_and_clear();
    written?;
    let per_sec = if report.elapsed_ms == 0 {
        0.0
    } else {
        report.steps as f64 * 1000.0 / report.elapsed_ms as f64
    };
    if out.json {
        out.json_value(&json!({ "summary": report, "steps_per_sec": per_sec,
            "durability": store.durability() }))?;
    } else {
        out.table(&[
            ("workflow", format!("{} ({})", wf.name, hash.short(12))),
            (
                "threads",
                format!(
                    "{}: {} completed, {} failed, {} suspended, {} stopped by an error",
                    report.threads,
                    report.completed,
                    report.failed,
                    report.suspended,
                    report.errors
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
    if report.errors > 0 {
        return Err(CliError::Failed(format!(
            "{} of {} threads stopped with an error (recorded on each thread; `uwf-db thread list --failed` finds them)",
            report.errors, report.threads
        )));
    }
    Ok(())
}

//! Embedding uwf-db: the engine from Rust, with no CLI and no agent program.
//!
//! It opens an LMDB store in a temporary directory (removed at the end),
//! registers a YAML workflow from a string (a writer, and a reviewer that
//! rejects each first draft and approves the second), implements `Agent` in
//! Rust (a struct that answers with markdown frontmatter, as an LLM would),
//! runs a batch of 20 prompts on 4 driver threads with `Engine::run_batch`,
//! prints the batch summary and one thread's log, and verifies the store.
//! It checks its own results: a batch that leaves any thread unfinished
//! makes it exit non-zero.
//!
//! Run it with `cargo run --example embed`.

use std::error::Error;

use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
use uwf_db::engine::batch::{BatchItem, BatchOptions};
use uwf_db::thread::ThreadId;
use uwf_db::workflow::parse_workflow;
use uwf_db::{Blob, Store, StoreOptions, Value};

/// The workflow: `$status` in each reply's frontmatter picks the edge, and
/// each role's `frontmatter` schema says which statuses (and fields) a
/// reply may have; a reply the schema refuses is not committed.
const WORKFLOW: &str = "
name: write-review
description: A writer drafts; a reviewer rejects with a reason or approves
maxRounds: 10
roles:
  writer:
    goal: Write the text the task asks for
    output: Set $status to written
    frontmatter:
      properties: { $status: { const: written } }
      required: [$status]
  reviewer:
    goal: Decide whether the text is ready
    output: Set $status to approved, or to rejected with a reason
    frontmatter:
      oneOf:
        - properties: { $status: { const: approved } }
          required: [$status]
        - properties: { $status: { const: rejected }, reason: { type: string } }
          required: [$status, reason]
graph:
  $START:
    _: { role: writer, prompt: 'Write the text' }
  writer:
    written: { role: reviewer, prompt: 'Review the draft' }
  reviewer:
    rejected: { role: writer, prompt: 'Revise it: {{{reason}}}' }
    approved: { role: $END, prompt: 'Approved' }
";

/// An agent written in Rust. A real one would send `request.prompt` to a
/// model; this one answers from the role and the thread's progress, in the
/// same shape a model is asked for: YAML frontmatter, then the body.
struct RuleBasedAgent {
    /// Calls this agent answered (each agent serves one driver thread).
    calls: usize,
}

impl Agent for RuleBasedAgent {
    fn call(&mut self, request: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
        self.calls += 1;
        let reply = match (request.role_name, request.answered_steps) {
            ("writer", 0) => "---\n$status: written\n---\nA first draft.".to_owned(),
            ("writer", _) => format!(
                "---\n$status: written\n---\nA second draft, after: {}",
                request.instruction
            ),
            // The first review: the writer's draft is the only step before it.
            ("reviewer", 1) => {
                "---\n$status: rejected\nreason: too short\n---\nNeeds more.".to_owned()
            }
            ("reviewer", _) => "---\n$status: approved\n---\nReady.".to_owned(),
            (role, _) => {
                return Err(AgentError::Other(
                    format!("this agent has no answer for role '{role}'").into(),
                ));
            }
        };
        Ok(reply.into())
    }

    /// The agent reads `answered_steps`, so the engine counts them.
    fn needs_step_count(&self) -> bool {
        true
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path().join("store"), StoreOptions::default())?;
    println!("store: {}", store.path().display());

    let workflow =
        parse_workflow(WORKFLOW, Some("write-review"), &|_| false).map_err(|problems| {
            let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
            format!("the workflow is not valid:\n{}", lines.join("\n"))
        })?;
    let (workflow_hash, _) = store.workflows().add(&workflow)?;
    println!("workflow: {} {workflow_hash}", workflow.name);

    // One thread per prompt; one driver thread per agent.
    let prompts: Vec<String> = (1..=20).map(|i| format!("Write note #{i}")).collect();
    let agents: Vec<Box<dyn Agent>> = (0..4)
        .map(|_| Box::new(RuleBasedAgent { calls: 0 }) as Box<dyn Agent>)
        .collect();
    let mut threads: Vec<(usize, ThreadId)> = Vec::new();
    let report = store.engine().run_batch(
        workflow_hash,
        &prompts,
        &BatchOptions::default(),
        agents,
        &mut |item: &BatchItem| {
            if let Some(id) = item.thread {
                threads.push((item.index, id));
            }
        },
    )?;
    println!(
        "batch: {} threads, {} completed, {} failed, {} suspended, {} errors, {} steps in {} commit groups",
        report.threads,
        report.completed,
        report.failed,
        report.suspended,
        report.errors,
        report.steps,
        report.groups
    );
    let expected = prompts.len() as u64;
    if report.threads != expected || report.completed != expected || report.errors != 0 {
        return Err(format!("the batch did not complete every thread: {report:?}").into());
    }
    // writer, reviewer (rejects), writer, reviewer (approves), per thread.
    if report.steps != 4 * expected {
        return Err(format!(
            "expected {} steps, the batch committed {}",
            4 * expected,
            report.steps
        )
        .into());
    }

    // The first prompt's thread, step by step (the log is newest first).
    threads.sort();
    let (_, id) = *threads.first().ok_or("the batch reported no thread")?;
    let record = store.threads().get(id)?.ok_or("the thread is gone")?;
    println!("\nthread {id} ({}, {}):", record.workflow, record.status);
    let mut log = store.threads().log(id, 100, None)?;
    log.reverse();
    for entry in &log {
        let status = match entry.node.meta.get("$status") {
            Some(Value::Str(s)) => s.as_str(),
            _ => "-",
        };
        let reply = match store.get(&entry.node.content)? {
            Some(Blob::Content(c)) => c.text,
            _ => String::new(),
        };
        println!(
            "  {} {:<8} {:<9} {}",
            entry.node.seq,
            entry.node.role,
            status,
            reply.trim()
        );
    }

    let verified = uwf_db::verify::verify(&store, |_| {})?;
    println!(
        "\nverify: {} blobs, {} refs, {} index entries, {} problems",
        verified.blobs_checked,
        verified.refs_checked,
        verified.index_entries_checked,
        verified.problems.len()
    );
    if !verified.is_ok() {
        return Err(format!("verify found problems: {:?}", verified.problems).into());
    }
    Ok(())
}

//! `thread list|show|log|tree|rm`: inspect and unlink threads.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::{Value as Json, json};
use uwf_db::engine::{Cancel, CancelOptions, ForkAt, StartOptions};
use uwf_db::thread::{
    IdPrefix, LogEntry, ThreadId, ThreadQuery, ThreadRecord, ThreadStatus, ThreadTree,
};
use uwf_db::{Blob, Hash, HashPrefix, Store, StoreError};

use crate::output::{self, Output};
use crate::{Cli, CliError, parse_prefix};

/// Parses a thread id or unique prefix (bad input exits 2).
fn parse_id(s: &str) -> Result<IdPrefix, String> {
    s.parse()
        .map_err(|e: uwf_db::thread::ParseIdError| e.to_string())
}

fn parse_status(s: &str) -> Result<ThreadStatus, String> {
    s.trim().parse()
}

#[derive(Subcommand)]
pub enum ThreadCommand {
    /// Start a thread of a workflow without running it
    Start {
        /// A registered workflow name, or a YAML file (registered first)
        workflow: String,
        /// The task prompt
        #[arg(short = 'p', long = "prompt")]
        prompt: String,
        /// The agent spec to store on the thread (script:FILE, cmd:PROGRAM ARGS)
        #[arg(long)]
        agent: Option<String>,
        /// Loop protection (default: the workflow's maxRounds)
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        max_rounds: Option<u32>,
        /// The thread's working directory: its agents run there, and edge
        /// locations resolve against it [default: the current directory]
        #[arg(long, value_name = "DIR", value_parser = crate::drive::parse_dir)]
        cwd: Option<PathBuf>,
    },
    /// Run up to N steps, stopping early at a suspend or an end
    Step {
        /// Thread id or unique prefix
        #[arg(value_parser = parse_id)]
        id: IdPrefix,
        #[command(flatten)]
        agent: crate::drive::AgentArgs,
        /// How many steps at most (1 or more)
        #[arg(short = 'c', long, value_name = "N", default_value_t = 1,
              value_parser = crate::drive::parse_count)]
        count: usize,
    },
    /// Resume a suspended, completed or failed thread (the resumed step is the first of N)
    Resume {
        /// Thread id or unique prefix
        #[arg(value_parser = parse_id)]
        id: IdPrefix,
        /// What the human says (appended to the suspend message)
        #[arg(short = 'p', long = "prompt")]
        prompt: Option<String>,
        #[command(flatten)]
        agent: crate::drive::AgentArgs,
        /// How many steps at most (1 or more)
        #[arg(short = 'c', long, value_name = "N", default_value_t = 1,
              value_parser = crate::drive::parse_count)]
        count: usize,
    },
    /// Cancel: end node with return code 2, into history (suspended children too)
    Cancel {
        /// Thread id or unique prefix
        #[arg(value_parser = parse_id)]
        id: IdPrefix,
        /// Cancel even while a driver holds the thread
        #[arg(long)]
        force: bool,
    },
    /// Stage a compaction summary covering everything up to the head
    Compact {
        /// Thread id or unique prefix
        #[arg(value_parser = parse_id)]
        id: IdPrefix,
        /// The summary
        #[arg(long)]
        summary: String,
    },
    /// Zero-copy fork: at a node, before a role's latest step, or at the head
    Fork {
        /// Thread id or unique prefix
        #[arg(value_parser = parse_id)]
        id: IdPrefix,
        /// Fork at this node of the chain
        #[arg(long, value_parser = parse_prefix, conflicts_with = "from_role")]
        at: Option<HashPrefix>,
        /// Fork at the parent of ROLE's latest step, so ROLE runs again
        #[arg(long, value_name = "ROLE")]
        from_role: Option<String>,
    },
    /// Threads by last activity, newest first
    List {
        /// Only these statuses (comma-separated: idle,running,suspended,completed,failed,cancelled)
        #[arg(long, value_delimiter = ',', value_parser = parse_status)]
        status: Vec<ThreadStatus>,
        /// Only this workflow
        #[arg(long)]
        workflow: Option<String>,
        /// Only threads whose latest attempt failed
        #[arg(long)]
        failed: bool,
        /// Last activity at or after T (RFC 3339, or relative: 30m, 24h, 7d)
        #[arg(long, value_name = "T", value_parser = output::parse_time)]
        since: Option<u64>,
        /// Last activity before T (RFC 3339, or relative)
        #[arg(long, value_name = "T", value_parser = output::parse_time)]
        until: Option<u64>,
        /// Page size
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Matching threads to skip
        #[arg(long, default_value_t = 0)]
        offset: usize,
    },
    /// A thread's record: status, next role, suspend message, last error, origin, family
    Show {
        /// Thread id or unique prefix (at least 6 characters)
        #[arg(value_parser = parse_id)]
        id: IdPrefix,
    },
    /// The chain's state nodes, newest first (end nodes included, the start excluded)
    Log {
        /// Thread id or unique prefix
        #[arg(value_parser = parse_id)]
        id: IdPrefix,
        /// How many nodes
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Start just before this node (exclusive), to page back
        #[arg(long, value_parser = parse_prefix)]
        before: Option<HashPrefix>,
    },
    /// The Merkle call stack: parents up, children down
    Tree {
        /// Thread id or unique prefix
        #[arg(value_parser = parse_id)]
        id: IdPrefix,
    },
    /// Unlink a thread from the index and history (garbage collection frees its blobs)
    Rm {
        /// Thread id or unique prefix
        #[arg(value_parser = parse_id)]
        id: IdPrefix,
    },
}

pub fn run(
    cli: &Cli,
    cmd: &ThreadCommand,
    cancel: &Cancel,
    out: &mut Output,
) -> Result<(), CliError> {
    match cmd {
        ThreadCommand::Start {
            workflow,
            prompt,
            agent,
            max_rounds,
            cwd,
        } => {
            let cwd = crate::drive::thread_cwd(cwd.as_deref())?;
            let store = cli.open(true)?;
            let (hash, _) = crate::workflow::resolve(&store, workflow)?;
            let options = StartOptions {
                agent_spec: agent.clone(),
                max_rounds: *max_rounds,
                cwd: Some(cwd),
                ..StartOptions::default()
            };
            let r = store.start_workflow(hash, prompt, &options)?;
            if out.json {
                out.json_value(&json!({
                    "thread": r.id, "workflow": r.workflow, "head": r.head,
                    "status": r.status, "current_role": r.next_role,
                }))?;
            } else {
                out.line(format_args!(
                    "started thread {} ({}), next role {}",
                    r.id,
                    r.workflow,
                    r.next_role.as_deref().unwrap_or("-")
                ))?;
            }
            Ok(())
        }
        ThreadCommand::Step { id, agent, count } => {
            let store = cli.open(true)?;
            let id = store.resolve_thread(id)?;
            crate::drive::drive(&store, id, agent, *count, None, cancel, out)
        }
        ThreadCommand::Resume {
            id,
            prompt,
            agent,
            count,
        } => {
            let store = cli.open(true)?;
            let id = store.resolve_thread(id)?;
            crate::drive::drive(
                &store,
                id,
                agent,
                *count,
                Some(prompt.as_deref()),
                cancel,
                out,
            )
        }
        ThreadCommand::Cancel { id, force } => {
            let store = cli.open(true)?;
            let id = store.resolve_thread(id)?;
            let r = store.cancel_thread(id, &CancelOptions { force: *force })?;
            crate::drive::report(out, &[r], false, None)
        }
        ThreadCommand::Compact { id, summary } => {
            let store = cli.open(true)?;
            let id = store.resolve_thread(id)?;
            let record = store
                .thread(id)?
                .ok_or_else(|| CliError::Failed(format!("no thread {id}")))?;
            let (hash, _) = store.stage_compact(id, record.head, summary)?;
            if out.json {
                out.json_value(&json!({ "thread": id, "summary": hash }))?;
            } else {
                out.line(format_args!(
                    "staged summary {} on thread {id}",
                    hash.short(12)
                ))?;
            }
            Ok(())
        }
        ThreadCommand::Fork { id, at, from_role } => {
            let store = cli.open(true)?;
            let id = store.resolve_thread(id)?;
            let at = match (at, from_role) {
                (Some(p), _) => ForkAt::Node(store.resolve(p)?),
                (None, Some(role)) => ForkAt::BeforeRole(role.clone()),
                (None, None) => ForkAt::Head,
            };
            let r = store.fork(id, at)?;
            let origin = r.forked_from.map(|f| f.node);
            if out.json {
                out.json_value(&json!({
                    "thread": r.id,
                    "forked_from": { "thread": id, "node": origin },
                    "status": r.status,
                    "current_role": r.next_role,
                }))?;
            } else {
                out.line(format_args!(
                    "forked {id} at {} as {} ({}{})",
                    origin.map_or("-".into(), |h| h.short(12)),
                    r.id,
                    r.status,
                    r.next_role
                        .as_deref()
                        .map(|n| format!(", next role {n}"))
                        .unwrap_or_default()
                ))?;
            }
            Ok(())
        }
        ThreadCommand::List {
            status,
            workflow,
            failed,
            since,
            until,
            limit,
            offset,
        } => {
            let store = cli.open(false)?;
            let query = ThreadQuery {
                statuses: status.clone(),
                workflow: workflow.clone(),
                failed_only: *failed,
                since: *since,
                until: *until,
                limit: *limit,
                offset: *offset,
            };
            let records = store.list_threads(&query)?;
            list(&records, out)
        }
        ThreadCommand::Show { id } => {
            let store = cli.open(false)?;
            let id = store.resolve_thread(id)?;
            let tree = store.thread_tree(id)?;
            let driver_alive = uwf_db::engine::claim::is_held(&store, id)?;
            show(&tree, driver_alive, out)
        }
        ThreadCommand::Log { id, limit, before } => {
            let store = cli.open(false)?;
            let id = store.resolve_thread(id)?;
            let before = before.as_ref().map(|p| store.resolve(p)).transpose()?;
            let entries = store.thread_log(id, *limit, before)?;
            log(&store, &entries, out)
        }
        ThreadCommand::Tree { id } => {
            let store = cli.open(false)?;
            let id = store.resolve_thread(id)?;
            let tree = store.thread_tree(id)?;
            if out.json {
                return Ok(out.json_value(&tree_json(&tree))?);
            }
            let mut depth = 0;
            for p in &tree.parents {
                out.line(format_args!("{}{}", "  ".repeat(depth), tree_line(p)))?;
                depth += 1;
            }
            out.line(format_args!(
                "{}{}  <",
                "  ".repeat(depth),
                tree_line(&tree.thread)
            ))?;
            print_children(&tree.children, depth + 1, out)
        }
        ThreadCommand::Rm { id } => {
            let store = cli.open(false)?;
            let id = store.resolve_thread(id)?;
            if uwf_db::engine::claim::is_held(&store, id)? {
                return Err(CliError::Failed(format!(
                    "thread {id} is being driven by another process; stop that driver first"
                )));
            }
            let removed = store.remove_thread(id)?;
            if out.json {
                out.json_value(&json!({ "thread": id, "removed": true, "head": removed.head }))?;
            } else {
                out.line(format_args!(
                    "removed thread {id} (its blobs stay until `uwf-db gc` frees them)"
                ))?;
            }
            Ok(())
        }
    }
}

fn role_of(r: &ThreadRecord) -> &str {
    match r.status {
        ThreadStatus::Suspended => r.suspended_role.as_deref().unwrap_or("-"),
        _ => r.next_role.as_deref().unwrap_or("-"),
    }
}

fn list(records: &[ThreadRecord], out: &mut Output) -> Result<(), CliError> {
    if out.json {
        return Ok(out.json_value(&records)?);
    }
    if records.is_empty() {
        return Ok(out.line("no threads")?);
    }
    let rows: Vec<[String; 6]> = records
        .iter()
        .map(|r| {
            [
                r.id.to_string(),
                r.status.to_string(),
                r.workflow.clone(),
                role_of(r).to_owned(),
                r.seq.to_string(),
                format!(
                    "{}{}",
                    output::timestamp(r.last_activity()),
                    if r.last_error.is_some() {
                        "  (last attempt failed)"
                    } else {
                        ""
                    }
                ),
            ]
        })
        .collect();
    out.columns(
        &["ID", "STATUS", "WORKFLOW", "ROLE", "STEPS", "LAST ACTIVITY"],
        &rows,
    )?;
    Ok(())
}

fn show(tree: &ThreadTree, driver_alive: bool, out: &mut Output) -> Result<(), CliError> {
    let r = &tree.thread;
    let children: Vec<ThreadId> = tree.children.iter().map(|c| c.thread.id).collect();
    if out.json {
        let mut v = serde_json::to_value(r).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert("children".into(), json!(children));
            o.insert("done".into(), json!(r.status.is_done()));
            o.insert("rounds".into(), json!(r.rounds()));
            o.insert("driver_alive".into(), json!(driver_alive));
        }
        return Ok(out.json_value(&v)?);
    }
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let mut rows = vec![
        ("thread", r.id.to_string()),
        (
            "workflow",
            format!("{} ({})", r.workflow, r.workflow_hash.short(12)),
        ),
        (
            "status",
            match (r.status, driver_alive, r.claimed_status) {
                (ThreadStatus::Running, true, Some(under)) => {
                    format!("running (a driver holds it; {under} underneath)")
                }
                (ThreadStatus::Running, false, Some(under)) => format!(
                    "running, but its driver is gone ({under} underneath; the next driver takes over)"
                ),
                (s, _, _) => s.to_string(),
            },
        ),
        ("head", format!("{} (seq {})", r.head, r.seq)),
        ("start", r.start.to_string()),
    ];
    match r.status {
        ThreadStatus::Suspended => {
            rows.push(("suspended role", opt(&r.suspended_role)));
            rows.push(("suspend message", opt(&r.suspend_message)));
        }
        s if !s.is_done() => {
            rows.push(("next role", opt(&r.next_role)));
            rows.push(("instruction", opt(&r.next_instruction)));
        }
        _ => {}
    }
    rows.push(("last error", opt(&r.last_error)));
    rows.push(("rounds", r.rounds().to_string()));
    rows.push(("created", output::timestamp(r.created_at)));
    rows.push(("updated", output::timestamp(r.updated_at)));
    if let Some(at) = r.completed_at {
        rows.push(("completed", output::timestamp(at)));
    }
    if let Some(f) = r.forked_from {
        rows.push((
            "forked from",
            format!("{} at {}", f.thread, f.node.short(12)),
        ));
    }
    if let Some(p) = r.parent_thread {
        rows.push(("parent", p.to_string()));
    }
    if let Some(c) = r.active_child {
        rows.push(("active child", c.to_string()));
    }
    if !children.is_empty() {
        rows.push((
            "children",
            children
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        ));
    }
    if let Some(c) = r.staged_compact {
        rows.push(("staged summary", c.to_string()));
    }
    rows.push(("agent", opt(&r.agent)));
    if let Some(dir) = &r.cwd {
        rows.push(("directory", dir.clone()));
    }
    if let Some(location) = &r.next_location {
        rows.push(("next location", location.clone()));
    }
    out.table(&rows)?;
    Ok(())
}

fn text_of(store: &Store, hash: &Hash) -> Result<String, CliError> {
    match store.get(hash)? {
        Some(Blob::Content(c)) => Ok(c.text),
        Some(other) => Err(CliError::Failed(format!(
            "blob {hash} is a {} blob, not content",
            other.kind()
        ))),
        None => Err(StoreError::UnknownHash {
            prefix: hash.to_string(),
        }
        .into()),
    }
}

fn log(store: &Store, entries: &[LogEntry], out: &mut Output) -> Result<(), CliError> {
    if out.json {
        let rows = entries
            .iter()
            .map(|e| {
                let n = &e.node;
                Ok(json!({
                    "hash": e.hash,
                    "seq": n.seq,
                    "role": n.role,
                    "status": n.meta.get("$status").map(|v| v.to_json()).filter(|_| n.role != uwf_db::thread::END_ROLE),
                    "meta": uwf_db::Value::Map(n.meta.clone()).to_json(),
                    "content": text_of(store, &n.content)?,
                    "input": text_of(store, &n.input)?,
                    "timestamp": n.timestamp,
                    "child_thread": n.child_thread,
                }))
            })
            .collect::<Result<Vec<Json>, CliError>>()?;
        return Ok(out.json_value(&rows)?);
    }
    if entries.is_empty() {
        return Ok(out.line("no steps yet")?);
    }
    for e in entries {
        let n = &e.node;
        let status = match n.meta.get("$status") {
            Some(uwf_db::Value::Str(s)) => s.clone(),
            _ if n.role == uwf_db::thread::END_ROLE => match n.meta.get("return_code") {
                Some(uwf_db::Value::UInt(c)) => format!("return code {c}"),
                _ => "end".into(),
            },
            _ => "_".into(),
        };
        let content = text_of(store, &n.content)?;
        let first = content.lines().next().unwrap_or("");
        out.line(format_args!(
            "{}  #{:<5} {:<14} {:<16} {}  {}",
            e.hash.short(10),
            n.seq,
            n.role,
            status,
            output::timestamp(n.timestamp),
            first
        ))?;
    }
    Ok(())
}

fn tree_line(r: &ThreadRecord) -> String {
    format!("{}  {}  {}  seq {}", r.id, r.workflow, r.status, r.seq)
}

fn print_children(children: &[ThreadTree], depth: usize, out: &mut Output) -> Result<(), CliError> {
    for c in children {
        out.line(format_args!(
            "{}{}",
            "  ".repeat(depth),
            tree_line(&c.thread)
        ))?;
        print_children(&c.children, depth + 1, out)?;
    }
    Ok(())
}

fn tree_json(t: &ThreadTree) -> Json {
    fn node(t: &ThreadTree) -> Json {
        json!({
            "thread": t.thread.id,
            "workflow": t.thread.workflow,
            "status": t.thread.status,
            "head": t.thread.head,
            "children": t.children.iter().map(node).collect::<Vec<_>>(),
        })
    }
    json!({
        "parents": t.parents.iter().map(|p| json!({
            "thread": p.id, "workflow": p.workflow, "status": p.status, "head": p.head,
        })).collect::<Vec<_>>(),
        "thread": node(t),
    })
}

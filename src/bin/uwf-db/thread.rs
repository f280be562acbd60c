//! `thread list|show|log|tree|rm`: inspect and unlink threads.

use std::path::PathBuf;

use clap::Subcommand;
use uwf_db::api;
use uwf_db::engine::{Cancel, CancelOptions, ForkAt, StartOptions};
use uwf_db::thread::{
    IdPrefix, Labels, LogEntry, ThreadId, ThreadQuery, ThreadRecord, ThreadStatus, ThreadTree,
};
use uwf_db::{HashPrefix, Store};

use crate::output::{self, Output};
use crate::render::{entry_line_with, labels_text, texts_of, usage_text};
use crate::{Cli, CliError, parse_prefix};

/// Parses a thread id or unique prefix (bad input exits 2).
pub fn parse_id(s: &str) -> Result<IdPrefix, String> {
    s.parse()
        .map_err(|e: uwf_db::thread::ParseIdError| e.to_string())
}

/// Parses `KEY=VALUE` (clap value parser: bad input exits 2).
pub fn parse_label_arg(s: &str) -> Result<(String, String), String> {
    uwf_db::thread::parse_label(s).map_err(|e| e.to_string())
}

/// Labels given as `--label` flags (a key given twice: the last wins).
pub fn label_map(labels: &[(String, String)]) -> Labels {
    labels.iter().cloned().collect()
}

fn parse_cursor(s: &str) -> Result<uwf_db::thread::ActivityCursor, String> {
    s.parse()
        .map_err(|e: uwf_db::thread::ParseCursorError| e.to_string())
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
        /// The agent spec to store on the thread (script:FILE, cmd:PROGRAM ARGS, claude:[ARGS])
        #[arg(long)]
        agent: Option<String>,
        /// Loop protection (default: the workflow's maxRounds)
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        max_rounds: Option<u32>,
        /// The thread's working directory: its agents run there, and edge
        /// locations resolve against it [default: the current directory]
        #[arg(long, value_name = "DIR", value_parser = crate::drive::parse_dir)]
        cwd: Option<PathBuf>,
        /// A label for the thread (repeatable): KEY=VALUE
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label_arg)]
        labels: Vec<(String, String)>,
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
        /// What the human says (appended to the suspend message); a suspended thread needs it
        /// (without -p it is read from stdin)
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
        /// Only threads with this label (repeatable, all must match): KEY=VALUE
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label_arg)]
        labels: Vec<(String, String)>,
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
        /// Continue below this position: the cursor a full page names on
        /// stderr (MS-THREAD; stable while threads change, cheap at any depth)
        #[arg(long, value_name = "CURSOR", value_parser = parse_cursor, conflicts_with = "watch")]
        cursor: Option<uwf_db::thread::ActivityCursor>,
        /// Then follow: one line (JSON Lines with --json) per status change of a matching
        /// thread, until interrupted
        #[arg(long)]
        watch: bool,
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
        /// Show the exact prompt each step's agent was sent (kept unless `uwf-db config
        /// keep-prompts off`)
        #[arg(long)]
        prompt: bool,
        /// Show what each step's agent wrote on stderr (its last 16 KiB)
        #[arg(long)]
        stderr: bool,
    },
    /// Print each step as it is committed (oldest first), until the thread ends or suspends
    ///
    /// Steps already committed after --after are printed first. With --json, one `thread log`
    /// entry per line. A watcher that is stopped resumes with --after and the seq of the last
    /// step it printed: nothing is missed or repeated.
    Watch {
        /// Thread id or unique prefix
        #[arg(value_parser = parse_id)]
        id: IdPrefix,
        /// Print only steps after the one with this seq (0: from the first step)
        #[arg(long, value_name = "SEQ", default_value_t = 0)]
        after: u64,
    },
    /// The Merkle call stack: parents up, children down
    Tree {
        /// Thread id or unique prefix
        #[arg(value_parser = parse_id)]
        id: IdPrefix,
        /// Also its forks, and theirs, each with the step it was forked at (reads every
        /// record of the store: no index names a thread's forks)
        #[arg(long)]
        forks: bool,
    },
    /// Ask the live driver of a thread to stop after the step in flight (the step is kept, the
    /// thread left idle, the driver exits 0); `pause` is the same command
    #[command(visible_alias = "pause")]
    Stop {
        /// Thread id or unique prefix
        #[arg(value_parser = parse_id)]
        id: IdPrefix,
    },
    /// Set or remove labels of a thread (any status; its head and status do not change)
    #[command(group = clap::ArgGroup::new("change").multiple(true).required(true)
        .args(["labels", "remove"]))]
    Label {
        /// Thread id or unique prefix
        #[arg(value_parser = parse_id)]
        id: IdPrefix,
        /// Labels to set: KEY=VALUE (a key it has gets the new value)
        #[arg(value_name = "KEY=VALUE", value_parser = parse_label_arg)]
        labels: Vec<(String, String)>,
        /// Remove the label with this key (repeatable)
        #[arg(long, value_name = "KEY")]
        remove: Vec<String>,
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
            labels,
        } => start(cli, workflow, prompt, agent, *max_rounds, cwd, labels, out),
        ThreadCommand::Step { id, agent, count } => {
            let store = cli.open(true)?;
            let id = store.threads().resolve(id)?;
            crate::drive::drive(&store, id, agent, *count, None, cancel, out)
        }
        ThreadCommand::Resume {
            id,
            prompt,
            agent,
            count,
        } => {
            let store = cli.open(true)?;
            let id = store.threads().resolve(id)?;
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
            let id = store.threads().resolve(id)?;
            let r = store
                .engine()
                .cancel_thread(id, &CancelOptions { force: *force })?;
            crate::drive::report(out, &[r], false, None)
        }
        ThreadCommand::Compact { id, summary } => compact(cli, id, summary, out),
        ThreadCommand::Fork { id, at, from_role } => fork(cli, id, at, from_role, out),
        ThreadCommand::List {
            status,
            workflow,
            failed,
            labels,
            since,
            until,
            limit,
            offset,
            cursor,
            watch,
        } => {
            let store = cli.open(false)?;
            let query = ThreadQuery {
                statuses: status.clone(),
                workflow: workflow.clone(),
                failed_only: *failed,
                labels: labels.clone(),
                since: *since,
                until: *until,
                limit: *limit,
                offset: *offset,
                before: *cursor,
            };
            if *watch {
                return crate::watch::list(&store, &query, cancel, out);
            }
            // One more than the page, to know whether another follows.
            let mut records = store.threads().list(&ThreadQuery {
                limit: limit.saturating_add(1),
                ..query
            })?;
            let more = records.len() > *limit;
            records.truncate(*limit);
            list(&records, out)?;
            // Where the next page starts, when there is one (on stderr, so
            // that stdout stays the page alone).
            if more && let Some(last) = records.last() {
                output::note(format_args!(
                    "more: uwf-db thread list --cursor {} (with the same filters)",
                    uwf_db::thread::ActivityCursor::of(last)
                ));
            }
            Ok(())
        }
        ThreadCommand::Label { id, labels, remove } => label(cli, id, labels, remove, out),
        ThreadCommand::Show { id } => {
            let store = cli.open(false)?;
            let id = resolve_for_read(&store, id)?;
            let tree = store.threads().tree(id)?;
            let driver_alive = uwf_db::engine::claim::is_held(&store, id)?;
            let parent = store.engine().parent_context(&tree.thread)?;
            let task = store.engine().task(&tree.thread)?;
            show(&tree, driver_alive, parent, task, out)
        }
        ThreadCommand::Log {
            id,
            limit,
            before,
            prompt,
            stderr,
        } => {
            let store = cli.open(false)?;
            // With `--before`, the thread is resolved first, so an unknown
            // thread is what an error names, before an unknown hash.
            let id = if before.is_some() {
                store.threads().resolve(id)?
            } else {
                resolve_for_read(&store, id)?
            };
            let before = before.as_ref().map(|p| store.resolve(p)).transpose()?;
            let entries = store.threads().log(id, *limit, before)?;
            let texts = api::KeptTexts {
                prompt: *prompt,
                stderr: *stderr,
            };
            log(&store, &entries, texts, out)
        }
        ThreadCommand::Watch { id, after } => crate::watch::thread(cli, id, *after, cancel, out),
        ThreadCommand::Tree { id, forks } => tree(cli, id, *forks, out),
        ThreadCommand::Stop { id } => stop(cli, id, out),
        ThreadCommand::Rm { id } => rm(cli, id, out),
    }
}

/// The thread `prefix` names, for a command whose next read needs its
/// record anyway: a full id is taken as it is, and that read says "no
/// thread matches" when there is none (`ThreadError::Unknown`, as
/// `resolve` would), sparing a read transaction of its own — three round
/// trips of a short command's eleven on PostgreSQL. A shorter prefix is
/// resolved.
fn resolve_for_read(store: &Store, prefix: &IdPrefix) -> Result<ThreadId, CliError> {
    match prefix.as_full_id() {
        Some(id) => Ok(id),
        None => Ok(store.threads().resolve(prefix)?),
    }
}

/// `thread start`.
#[allow(clippy::too_many_arguments)]
fn start(
    cli: &Cli,
    workflow: &str,
    prompt: &str,
    agent: &Option<String>,
    max_rounds: Option<u32>,
    cwd: &Option<std::path::PathBuf>,
    labels: &[(String, String)],
    out: &mut Output,
) -> Result<(), CliError> {
    let cwd = crate::drive::thread_cwd(cwd.as_deref())?;
    let store = cli.open(true)?;
    let (hash, _) = crate::workflow::resolve(&store, workflow)?;
    let options = StartOptions {
        agent_spec: agent.clone(),
        max_rounds,
        cwd: Some(cwd),
        labels: label_map(labels),
        ..StartOptions::default()
    };
    let r = store.engine().start_workflow(hash, prompt, &options)?;
    if out.json {
        out.json_value(&api::ThreadStarted::from(&r))?;
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

/// `thread compact`.
fn compact(cli: &Cli, id: &IdPrefix, summary: &str, out: &mut Output) -> Result<(), CliError> {
    let store = cli.open(true)?;
    let id = store.threads().resolve(id)?;
    let record = store
        .threads()
        .get(id)?
        .ok_or_else(|| CliError::Failed(format!("no thread {id}")))?;
    let (hash, _) = store.threads().stage_compact(id, record.head, summary)?;
    if out.json {
        out.json_value(&api::SummaryStaged {
            summary: hash,
            thread: id,
        })?;
    } else {
        out.line(format_args!(
            "staged summary {} on thread {id}",
            hash.short(12)
        ))?;
    }
    Ok(())
}

/// `thread fork`.
fn fork(
    cli: &Cli,
    id: &IdPrefix,
    at: &Option<HashPrefix>,
    from_role: &Option<String>,
    out: &mut Output,
) -> Result<(), CliError> {
    let store = cli.open(true)?;
    let id = store.threads().resolve(id)?;
    let at = match (at, from_role) {
        (Some(p), _) => ForkAt::Node(store.resolve(p)?),
        (None, Some(role)) => ForkAt::BeforeRole(role.clone()),
        (None, None) => ForkAt::Head,
    };
    let r = store.engine().fork(id, at)?;
    let origin = r.forked_from.map(|f| f.node);
    if out.json {
        out.json_value(&api::ThreadForked::of(id, &r))?;
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

/// `thread label`.
fn label(
    cli: &Cli,
    id: &IdPrefix,
    labels: &[(String, String)],
    remove: &[String],
    out: &mut Output,
) -> Result<(), CliError> {
    let store = cli.open(true)?;
    let id = store.threads().resolve(id)?;
    let r = store.threads().set_labels(id, &label_map(labels), remove)?;
    if out.json {
        out.json_value(&api::LabelsSet {
            labels: r.labels,
            thread: id,
        })?;
    } else {
        out.line(format_args!("thread {id}: {}", labels_text(&r.labels)))?;
    }
    Ok(())
}

/// `thread tree`.
fn tree(cli: &Cli, id: &IdPrefix, with_forks: bool, out: &mut Output) -> Result<(), CliError> {
    let store = cli.open(false)?;
    let id = store.threads().resolve(id)?;
    let tree = store.threads().tree(id)?;
    let forks = match with_forks {
        true => Some(store.threads().forks(id)?),
        false => None,
    };
    if out.json {
        let mut view = api::TreeView::of(&tree);
        view.forks = forks
            .as_deref()
            .map(|f| f.iter().map(api::TreeFork::of).collect());
        return Ok(out.json_value(&view)?);
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
    print_children(&tree.children, depth + 1, out)?;
    if let Some(forks) = forks {
        out.line(match forks.len() {
            0 => "forks: none".to_owned(),
            n => format!("forks: {n}"),
        })?;
        for f in &forks {
            let at = f
                .thread
                .forked_from
                .as_ref()
                .map(|o| format!("  (forked at {})", o.node.short(12)))
                .unwrap_or_default();
            out.line(format_args!(
                "{}{}{at}",
                "  ".repeat(f.depth),
                tree_line(&f.thread)
            ))?;
        }
    }
    Ok(())
}

/// `thread stop`.
fn stop(cli: &Cli, id: &IdPrefix, out: &mut Output) -> Result<(), CliError> {
    let store = cli.open(false)?;
    let id = store.threads().resolve(id)?;
    let record = store.engine().request_stop(id)?;
    if out.json {
        out.json_value(&api::StopRequested {
            stop_requested_at: record.stop_requested_at.map(api::Timestamp),
            thread: id,
        })?;
    } else {
        out.line(format_args!(
            "asked the driver of thread {id} to stop after the step in flight"
        ))?;
    }
    Ok(())
}

/// `thread rm`.
fn rm(cli: &Cli, id: &IdPrefix, out: &mut Output) -> Result<(), CliError> {
    let store = cli.open(false)?;
    let id = store.threads().resolve(id)?;
    let removed = store.engine().remove_undriven_thread(id)?;
    if out.json {
        out.json_value(&api::ThreadRemoved {
            head: removed.head,
            removed: true,
            thread: id,
        })?;
    } else {
        out.line(format_args!(
            "removed thread {id} (its blobs stay until `uwf-db gc` frees them)"
        ))?;
    }
    Ok(())
}

fn role_of(r: &ThreadRecord) -> &str {
    match r.status {
        ThreadStatus::Suspended => r.suspended_role.as_deref().unwrap_or("-"),
        _ => r.next_role.as_deref().unwrap_or("-"),
    }
}

fn list(records: &[ThreadRecord], out: &mut Output) -> Result<(), CliError> {
    if out.json {
        let all: Vec<api::ThreadSummary> = records.iter().map(api::ThreadSummary::from).collect();
        return Ok(out.json_value(&all)?);
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
    if records.iter().any(|r| !r.labels.is_empty()) {
        let rows: Vec<[String; 7]> = rows
            .into_iter()
            .zip(records)
            .map(|([a, b, c, d, e, f], r)| [a, b, c, d, e, labels_text(&r.labels), f])
            .collect();
        out.columns(
            &[
                "ID",
                "STATUS",
                "WORKFLOW",
                "ROLE",
                "STEPS",
                "LABELS",
                "LAST ACTIVITY",
            ],
            &rows,
        )?;
    } else {
        out.columns(
            &["ID", "STATUS", "WORKFLOW", "ROLE", "STEPS", "LAST ACTIVITY"],
            &rows,
        )?;
    }
    Ok(())
}

/// A task for `thread show`'s table: on one line, its first 300
/// characters (a longer one says how long it is; `--json` has it whole).
fn task_text(task: &str) -> String {
    let one_line = task.split_whitespace().collect::<Vec<_>>().join(" ");
    let chars = one_line.chars().count();
    if chars <= 300 {
        return one_line;
    }
    let head: String = one_line.chars().take(300).collect();
    format!("{head}… ({} bytes; --json shows it whole)", task.len())
}

fn show(
    tree: &ThreadTree,
    driver_alive: bool,
    parent: Option<uwf_db::engine::ParentContext>,
    task: String,
    out: &mut Output,
) -> Result<(), CliError> {
    let r = &tree.thread;
    let children: Vec<ThreadId> = tree.children.iter().map(|c| c.thread.id).collect();
    if out.json {
        return Ok(out.json_value(
            &api::ThreadDetail::of(tree, driver_alive)
                .with_parent_context(parent)
                .with_task(task),
        )?);
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
        ("task", task_text(&task)),
    ];
    if !r.labels.is_empty() {
        rows.push(("labels", labels_text(&r.labels)));
    }
    let usage = uwf_db::thread::Threads::tree_usage(tree);
    if !usage.is_empty() {
        let own = r.usage.clone().unwrap_or_default();
        rows.push((
            "usage",
            if own == usage {
                usage_text(&usage)
            } else {
                format!(
                    "{} with its children ({} itself)",
                    usage_text(&usage),
                    usage_text(&own)
                )
            },
        ));
    }
    match r.status {
        ThreadStatus::Suspended => {
            rows.push(("suspended role", opt(&r.suspended_role)));
            rows.push(("suspend message", opt(&r.suspend_message)));
            rows.push((
                "resume with",
                uwf_db::api::resume_command(tree.parents.first().map_or(r.id, |p| p.id)),
            ));
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
    if let Some(pc) = parent {
        // What this child workflow's agents are told of their parent.
        out.line(pc.section.trim_end())?;
    }
    Ok(())
}

fn log(
    store: &Store,
    entries: &[LogEntry],
    texts: api::KeptTexts,
    out: &mut Output,
) -> Result<(), CliError> {
    if out.json {
        let rows = api::LogEntry::read_all(store, entries, texts)?;
        return Ok(out.json_value(&rows)?);
    }
    if entries.is_empty() {
        return Ok(out.line("no steps yet")?);
    }
    if texts == api::KeptTexts::default() {
        // The replies alone, in one read.
        let hashes: Vec<_> = entries.iter().map(|e| e.node.content).collect();
        for (e, content) in entries.iter().zip(texts_of(store, &hashes)?) {
            out.line(entry_line_with(e, &content))?;
        }
        return Ok(());
    }
    for (e, entry) in entries
        .iter()
        .zip(api::LogEntry::read_all(store, entries, texts)?)
    {
        out.line(entry_line_with(e, &entry.content))?;
        let mut section = |title: &str, text: Option<&str>| match text {
            Some(text) => {
                out.line(format_args!("  ── {title} ──"))?;
                for line in text.trim_end().lines() {
                    out.line(format_args!("  │ {line}").to_string().trim_end())?;
                }
                Ok::<_, std::io::Error>(())
            }
            // An end node, a child's step, or nothing was kept.
            None if entry.role != uwf_db::thread::END_ROLE => {
                out.line(format_args!("  ── {title}: none kept ──"))
            }
            None => Ok(()),
        };
        if texts.prompt {
            section("prompt sent", entry.sent_prompt.as_deref())?;
        }
        if texts.stderr {
            section("stderr", entry.stderr_text.as_deref())?;
        }
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

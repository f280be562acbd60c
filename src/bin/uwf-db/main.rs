//! `uwf-db`: run, inspect and verify uwf-db stores.
//!
//! The binary parses arguments, calls the library and formats its answers;
//! it holds no logic of its own. Exit codes (SPEC §7): 0 success, 1 the
//! operation failed or found a problem, 2 bad usage, 3 the store's data
//! file is damaged (refused at open, or a page LMDB could not use: see
//! `fault.rs`), 130 interrupted (SIGINT), 143 terminated (SIGTERM), 129
//! hung up (SIGHUP).

#![deny(unsafe_code)]

mod admin;
mod batch;
mod cas;
mod drive;
mod fault;
mod generate;
#[cfg(feature = "mcp")]
mod mcp;
mod output;
mod progress;
mod render;
mod salvage;
#[cfg(feature = "serve")]
mod serve;
mod telemetry;
mod thread;
mod watch;
mod workflow;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use uwf_db::engine::Cancel;
use uwf_db::{Durability, HashPrefix, Store, StoreError, StoreOptions};

use output::Output;

#[derive(Parser)]
#[command(
    name = "uwf-db",
    version,
    about = "An embedded database and workflow engine for AI-agent threads",
    propagate_version = true
)]
struct Cli {
    /// Store: a directory (LMDB), or a postgres://USER@HOST/DB URL [default: $UWF_STORE, else ~/.uwf]
    #[arg(long, global = true, env = "UWF_STORE", value_name = "DIR|URL")]
    store: Option<PathBuf>,
    /// Print machine-readable JSON
    #[arg(long, global = true)]
    json: bool,
    /// Say more: logs on stderr (-v info, -vv debug, -vvv trace; RUST_LOG overrides) and `prune` lists every thread it unlinks
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    verbose: u8,
    /// Say less: no progress bars and no notes on stderr (answers and errors still print)
    #[arg(short, long, global = true)]
    quiet: bool,
    /// Colour in help, errors and logs: `auto` on a terminal unless NO_COLOR is set
    #[arg(long, global = true, value_enum, value_name = "WHEN", default_value_t = ColorWhen::Auto)]
    color: ColorWhen,
    /// Commit durability: `none` skips fsync (a machine crash may lose recent commits)
    #[arg(long, global = true, value_enum, default_value_t = DurabilityArg::Sync)]
    durability: DurabilityArg,
    /// Largest size the store's data file may reach (e.g. 512MiB, 4GiB) [default: 1TiB]
    #[arg(long, global = true, env = "UWF_MAX_MAP_SIZE", value_name = "SIZE", value_parser = output::parse_size)]
    max_map_size: Option<u64>,
    /// PostgreSQL: the most connections this process opens for transactions, whatever --jobs is (its claims take one more) [default: 4]
    #[arg(long, global = true, env = "UWF_PG_CONNECTIONS", value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1000))]
    pg_connections: Option<u16>,
    #[command(subcommand)]
    command: Command,
}

/// `--color`.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ColorWhen {
    Auto,
    Always,
    Never,
}

impl ColorWhen {
    /// `--color` as given on the command line, read before clap parses it
    /// (clap colours its own help and errors while parsing).
    fn from_args() -> Option<ColorWhen> {
        let mut args = std::env::args_os().skip(1);
        let mut found = None;
        while let Some(a) = args.next() {
            let value = match a.to_str() {
                Some("--") => break,
                Some("--color") => args.next(),
                Some(s) => match s.strip_prefix("--color=") {
                    Some(v) => Some(v.into()),
                    None => continue,
                },
                None => continue,
            };
            found = value.and_then(|v| ColorWhen::from_str(v.to_str()?, true).ok());
        }
        found
    }

    fn clap(self) -> clap::ColorChoice {
        match self {
            ColorWhen::Auto => clap::ColorChoice::Auto,
            ColorWhen::Always => clap::ColorChoice::Always,
            ColorWhen::Never => clap::ColorChoice::Never,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum DurabilityArg {
    Sync,
    None,
}

#[derive(Subcommand)]
enum Command {
    /// Create a store (does nothing if it exists); writes the format version
    Init,
    /// Add and inspect content-addressed blobs
    #[command(subcommand)]
    Cas(cas::CasCommand),
    /// Start a thread and drive it until it ends or suspends
    Run {
        /// A registered workflow name, or a YAML file (registered first)
        workflow: String,
        /// The task prompt
        #[arg(short = 'p', long = "prompt")]
        prompt: String,
        #[command(flatten)]
        agent: drive::AgentArgs,
        /// Loop protection (default: the workflow's maxRounds)
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        max_rounds: Option<u32>,
        /// The thread's working directory: its agents run there, and edge
        /// locations resolve against it [default: the current directory]
        #[arg(long, value_name = "DIR", value_parser = drive::parse_dir)]
        cwd: Option<PathBuf>,
        /// A label for the thread (repeatable): KEY=VALUE
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = thread::parse_label_arg)]
        labels: Vec<(String, String)>,
    },
    /// Drive many threads in parallel, committing their steps in groups
    Batch {
        /// A registered workflow name, or a YAML file (registered first)
        workflow: String,
        #[command(flatten)]
        agent: drive::AgentArgs,
        /// A file with one prompt per non-empty line (one thread each); in a
        /// .jsonl file each line is a JSON string or {"prompt": "..."}
        #[arg(long, value_name = "FILE", conflicts_with_all = ["count", "prompt"])]
        prompts: Option<PathBuf>,
        /// Drive the workflow's idle threads on (and those a dead driver
        /// left running) instead of starting new ones
        #[arg(long = "continue", conflicts_with_all = ["prompts", "count", "prompt"])]
        continue_: bool,
        /// With --continue, in a fleet of runners: stay while another
        /// runner drives a thread of the workflow (polling each second), to
        /// finish its threads if it dies
        #[arg(long, requires = "continue_")]
        wait: bool,
        /// Start N threads with the prompt given by -p (1 or more)
        #[arg(short = 'n', visible_short_alias = 'c', long = "count", value_name = "N",
              requires = "prompt", value_parser = drive::parse_batch_count)]
        count: Option<usize>,
        /// The prompt for -n
        #[arg(short = 'p', long = "prompt", requires = "count")]
        prompt: Option<String>,
        /// Threads driven at once (one agent each)
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
        jobs: u16,
        /// Most writes in one commit group [default: 256]
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        max_group: Option<u32>,
        /// Loop protection (default: the workflow's maxRounds)
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        max_rounds: Option<u32>,
        /// Each new thread's working directory: its agents run there, and
        /// edge locations resolve against it [default: the current directory]
        #[arg(long, value_name = "DIR", value_parser = drive::parse_dir)]
        cwd: Option<PathBuf>,
        /// A label for every new thread (repeatable): KEY=VALUE; a .jsonl
        /// prompt's own "labels" object is added over them. With --continue: take only the
        /// threads that carry every one of these labels
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = thread::parse_label_arg)]
        labels: Vec<(String, String)>,
    },
    /// Register, list, show and validate workflows
    #[command(subcommand)]
    Workflow(workflow::WorkflowCommand),
    /// Serve the HTTP API, live events and the dashboard (http://127.0.0.1:7860/)
    #[cfg(feature = "serve")]
    Serve(serve::ServeArgs),
    /// Serve a Model Context Protocol server on stdin/stdout, for coding agents (Claude Code, Cursor, Codex…)
    #[cfg(feature = "mcp")]
    Mcp(mcp::McpArgs),
    /// Start, inspect, fork and unlink threads
    #[command(subcommand)]
    Thread(thread::ThreadCommand),
    /// Delete blobs no thread, workflow or pin reaches (safe while writers run)
    Gc {
        /// Report what would be deleted; delete nothing
        #[arg(long)]
        dry_run: bool,
        /// Keep blobs stored or re-put this recently, with what they reach (e.g. 0, 90s, 30m, 1h, 7d)
        #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = output::parse_duration)]
        grace: std::time::Duration,
    },
    /// Re-hash every blob and check every ref and index entry; exit 1 on any problem
    Verify,
    /// Counts, sizes, map usage, readers, durability
    Stats,
    /// Show or change the store's settings: `uwf-db config` lists them, `uwf-db config KEY`
    /// shows one, `uwf-db config KEY VALUE` sets it
    ///
    /// keep-prompts (on|off, default on): whether each role step keeps the exact prompt its
    /// agent was sent (`thread log --prompt`); turn it off when prompts hold what must not be
    /// stored. Drivers started after a change follow it; kept prompts stay until their
    /// threads are pruned and collected.
    Config {
        /// The setting
        #[arg(value_parser = ["keep-prompts"])]
        key: Option<String>,
        /// Its new value
        #[arg(requires = "key", value_parser = ["on", "off"])]
        value: Option<String>,
    },
    /// What agents cost: calls, wall time, tokens and dollars of one thread with its child
    /// workflows, or of the whole store
    Usage {
        /// Thread id or unique prefix [default: every thread in the store]
        #[arg(value_parser = thread::parse_id)]
        id: Option<uwf_db::thread::IdPrefix>,
    },
    /// Copy a whole store into a new or empty one (LMDB and PostgreSQL either way), then compare
    /// and verify it; rerunning an interrupted copy continues it
    ///
    /// The copy is of one snapshot of SRC (writers of SRC may go on). Until it finishes, DST is
    /// marked as an unfinished copy: `stats` and `verify` say so and `gc` refuses it. --store is
    /// not used; --durability applies to DST, --max-map-size to both when they are LMDB.
    Copy {
        /// The store to copy: a directory (LMDB) or a postgres:// URL
        #[arg(value_name = "SRC")]
        source: PathBuf,
        /// Where to copy it: a directory or a postgres:// URL, created if absent; it must be
        /// empty, or an unfinished copy of SRC (which the copy continues)
        #[arg(value_name = "DST")]
        destination: PathBuf,
        /// Most rows per destination transaction
        #[arg(long, value_name = "N", default_value_t = 1024,
              value_parser = clap::value_parser!(u32).range(1..))]
        chunk_rows: u32,
    },
    /// Unlink ended threads by policy (every condition given must match); `gc` then frees
    /// their blobs
    ///
    /// Only ended threads (completed, failed, cancelled) are looked at: active, running and
    /// suspended threads are never pruned, nor a child whose parent is kept. `--set` stores the
    /// policy instead, and every `gc` applies it first.
    #[command(group = clap::ArgGroup::new("what").multiple(true).required(true)
        .args(["older_than", "keep_latest", "status", "workflow", "labels", "unset", "show"]))]
    Prune {
        /// Ended more than this long ago (e.g. 90s, 30m, 24h, 30d)
        #[arg(long, value_name = "DURATION", value_parser = output::parse_duration)]
        older_than: Option<std::time::Duration>,
        /// Keep the newest N ended threads of each workflow
        #[arg(long, value_name = "N")]
        keep_latest: Option<u64>,
        /// Only threads that ended so (comma-separated: completed,failed,cancelled)
        #[arg(long, value_delimiter = ',', value_parser = admin::parse_ended_status)]
        status: Vec<uwf_db::thread::ThreadStatus>,
        /// Only threads of this workflow
        #[arg(long, value_name = "NAME")]
        workflow: Option<String>,
        /// Only threads with this label (repeatable, all must match): KEY=VALUE
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = thread::parse_label_arg)]
        labels: Vec<(String, String)>,
        /// List what would be unlinked; unlink nothing
        #[arg(long, conflicts_with_all = ["set", "unset", "show"])]
        dry_run: bool,
        /// Store the policy for `gc` to apply first, instead of pruning now
        #[arg(long, conflicts_with_all = ["unset", "show"])]
        set: bool,
        /// Remove the stored policy
        #[arg(long, conflicts_with_all = ["older_than", "keep_latest", "status", "workflow", "labels", "show"])]
        unset: bool,
        /// Show the stored policy
        #[arg(long, conflicts_with_all = ["older_than", "keep_latest", "status", "workflow", "labels"])]
        show: bool,
    },
    /// Write threads (with their children and every blob they reach) as one self-contained,
    /// deterministic bundle
    Export {
        /// Thread ids or unique prefixes
        #[arg(required = true, value_parser = thread::parse_id)]
        ids: Vec<uwf_db::thread::IdPrefix>,
        /// Write the bundle here [default: stdout]
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Sign the bundle with the secret in KEYFILE (at least 32 bytes, mode 0600; make one
        /// with `head -c 32 /dev/urandom > KEYFILE`): only a holder of the key can make a
        /// bundle that `import --verify KEYFILE` accepts
        #[arg(long, value_name = "KEYFILE")]
        sign: Option<PathBuf>,
    },
    /// Import a bundle: every hash and ref is checked first, then everything is written in
    /// one transaction, or nothing
    Import {
        /// The bundle (`-` for stdin)
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Give the threads new ids (else ids that exist already are refused)
        #[arg(long)]
        new_ids: bool,
        /// Refuse the bundle unless it was signed with the secret in KEYFILE (export --sign)
        #[arg(long, value_name = "KEYFILE")]
        verify: Option<PathBuf>,
        /// DANGEROUS: keep the agent (a command line) and working directory that the bundle's
        /// records name. Without it imported threads have no stored agent, so driving one needs
        /// --agent, and their agents work where the driver does
        #[arg(long)]
        trust_agents: bool,
    },
    /// Copy everything still readable out of a damaged store into a new one, and report what
    /// was lost
    ///
    /// Keeps blobs whose bytes hash to their key (and whose refs were kept too), workflows and
    /// pins that name kept blobs, and threads whose whole history was kept; rebuilds the
    /// indexes. Each read of SRC runs in its own child process, so a page that crashes LMDB
    /// loses only the keys around it. Exit 0 when DST was written and verifies, whatever was
    /// lost (the report and --json say what). --store is not used.
    Salvage {
        /// The damaged store: a directory (LMDB)
        #[arg(value_name = "SRC")]
        source: PathBuf,
        /// The new store: a directory or a postgres:// URL, created if absent; must be empty
        #[arg(value_name = "DST")]
        destination: PathBuf,
    },
    /// Print a shell completion script (e.g. `uwf-db completions bash > ~/.local/share/bash-completion/completions/uwf-db`)
    Completions {
        /// The shell
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write manual pages (uwf-db.1, uwf-db-thread.1, uwf-db-thread-list.1, …)
    ///
    /// With --out, one page per command into DIR (created if absent; e.g.
    /// `uwf-db man --out ~/.local/share/man/man1`, then `man uwf-db-thread-list`); without,
    /// uwf-db(1) on stdout (`uwf-db man | man -l -`).
    Man {
        /// Write every page into this directory
        #[arg(long, value_name = "DIR", conflicts_with = "markdown")]
        out: Option<PathBuf>,
        /// Print the whole CLI reference as one Markdown document instead (docs/cli.md)
        #[arg(long)]
        markdown: bool,
    },
    /// One read of `salvage` (internal: streams a table's rows to stdout)
    #[command(hide = true)]
    SalvageRead {
        /// The table
        table: String,
        /// First key, in hex
        #[arg(long)]
        from: Option<String>,
    },
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Thread(#[from] uwf_db::thread::ThreadError),
    #[error(transparent)]
    Workflow(#[from] uwf_db::workflow::WorkflowError),
    #[error(transparent)]
    Engine(#[from] uwf_db::engine::EngineError),
    #[error(transparent)]
    Gc(#[from] uwf_db::gc::GcError),
    #[error(transparent)]
    Copy(#[from] uwf_db::copy::CopyError),
    #[error(transparent)]
    Bundle(#[from] uwf_db::bundle::BundleError),
    #[error(transparent)]
    Salvage(#[from] uwf_db::salvage::SalvageError),
    #[error(transparent)]
    PromptFile(#[from] uwf_db::engine::prompt_file::PromptFileError),
    #[error("{0}")]
    Failed(String),
    /// The command already reported what it found; exit 1 quietly.
    #[error("")]
    Reported,
    /// The command reported that the data file is damaged; exit 3 quietly.
    #[error("")]
    ReportedDamage,
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
}

/// Parses a hash or a unique prefix (clap value parser: bad input exits 2).
fn parse_prefix(s: &str) -> Result<HashPrefix, String> {
    s.parse().map_err(|e: uwf_db::ParseHashError| e.to_string())
}

impl Cli {
    fn store_path(&self) -> Result<PathBuf, CliError> {
        if let Some(p) = &self.store {
            return Ok(p.clone());
        }
        std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(".uwf"))
            .ok_or_else(|| {
                CliError::Failed(
                    "no store given: pass --store DIR or set UWF_STORE (HOME is not set)".into(),
                )
            })
    }

    /// Whether commits skip fsync.
    fn durability_none(&self) -> bool {
        matches!(self.durability, DurabilityArg::None)
    }

    /// Opens the store; `create` for commands that write.
    fn open(&self, create: bool) -> Result<Store, CliError> {
        Ok(self.open_at(&self.store_path()?, create)?)
    }

    /// Opens the store at `location` (a directory or a `postgres://` URL)
    /// with the global options.
    fn open_at(&self, location: &std::path::Path, create: bool) -> Result<Store, StoreError> {
        let durability = match self.durability {
            DurabilityArg::Sync => Durability::Sync,
            DurabilityArg::None => Durability::None,
        };
        let options = StoreOptions {
            durability,
            max_map_size: self.max_map_size,
            create,
            pg_connections: self.pg_connections.map_or(0, usize::from),
        };
        match location.to_str() {
            Some(url) if uwf_db::backend::is_postgres_url(url) => {
                Store::open_location(url, options).map_err(StoreError::from)
            }
            _ => {
                // Opening already reads pages: guard before it.
                fault::guard_lmdb_store(location);
                Store::open(location, options).map_err(StoreError::from)
            }
        }
    }
}

fn run(cli: &Cli, cancel: &Cancel, out: &mut Output) -> Result<(), CliError> {
    match &cli.command {
        Command::Init => admin::init(cli, out),
        Command::Cas(cmd) => cas::run(cli, cmd, out),
        Command::Thread(cmd) => thread::run(cli, cmd, cancel, out),
        Command::Workflow(cmd) => workflow::run(cli, cmd, out),
        #[cfg(feature = "serve")]
        Command::Serve(args) => serve::run(cli, args, cancel),
        #[cfg(feature = "mcp")]
        Command::Mcp(args) => mcp::run(cli, args, cancel),
        Command::Run {
            workflow,
            prompt,
            agent,
            max_rounds,
            cwd,
            labels,
        } => drive::run(
            cli,
            workflow,
            prompt,
            agent,
            (*max_rounds, cwd.as_deref(), thread::label_map(labels)),
            cancel,
            out,
        ),
        Command::Batch {
            workflow,
            agent,
            prompts,
            continue_,
            wait,
            count,
            prompt,
            jobs,
            max_group,
            max_rounds,
            cwd,
            labels,
        } => batch::run(
            cli,
            workflow,
            agent,
            &batch::Args {
                file: prompts.as_deref(),
                count: *count,
                prompt: prompt.as_deref(),
                continue_: *continue_,
                wait: wait.then(|| std::time::Duration::from_secs(1)),
                jobs: usize::from(*jobs),
                max_group: max_group.map_or(0, |g| g as usize),
                max_rounds: *max_rounds,
                cwd: drive::thread_cwd(cwd.as_deref())?,
                labels: thread::label_map(labels),
            },
            cancel,
            out,
        ),
        Command::Gc { dry_run, grace } => admin::gc(cli, *dry_run, *grace, out),
        Command::Verify => admin::verify(cli, out),
        Command::Stats => admin::stats(cli, out),
        Command::Usage { id } => admin::usage(cli, id.as_ref(), out),
        Command::Config { key, value } => admin::config(cli, key.as_deref(), value.as_deref(), out),
        Command::Copy {
            source,
            destination,
            chunk_rows,
        } => admin::copy(cli, source, destination, *chunk_rows, out),
        Command::Prune {
            older_than,
            keep_latest,
            status,
            workflow,
            labels,
            dry_run,
            set,
            unset,
            show,
        } => {
            let policy = uwf_db::thread::RetentionPolicy {
                older_than_ms: older_than.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                keep_latest: *keep_latest,
                statuses: status.clone(),
                workflow: workflow.clone(),
                labels: thread::label_map(labels),
            };
            let action = match (*set, *unset, *show) {
                (true, _, _) => admin::PruneAction::Set,
                (_, true, _) => admin::PruneAction::Unset,
                (_, _, true) => admin::PruneAction::Show,
                _ if *dry_run => admin::PruneAction::DryRun,
                _ => admin::PruneAction::Prune,
            };
            admin::prune(cli, &policy, action, out)
        }
        Command::Export { ids, output, sign } => {
            admin::export(cli, ids, output.as_deref(), sign.as_deref(), out)
        }
        Command::Import {
            file,
            new_ids,
            verify,
            trust_agents,
        } => admin::import(cli, file, *new_ids, verify.as_deref(), *trust_agents, out),
        Command::Salvage {
            source,
            destination,
        } => salvage::run(cli, source, destination, out),
        Command::Completions { shell } => generate::completions(*shell, out),
        Command::Man { markdown: true, .. } => generate::markdown(out),
        Command::Man { out: dir, .. } => generate::man(dir.as_deref(), out),
        Command::SalvageRead { table, from } => salvage::read_worker(cli, table, from.as_deref()),
    }
}

/// Whether `cause`'s own text says nothing worth a line: the PostgreSQL
/// driver's error, whose text for a server error is a bare "db error"
/// (the server's words are in its source, printed next, and in the
/// `BackendError::Postgres` message above).
fn says_nothing(cause: &(dyn std::error::Error + 'static)) -> bool {
    #[cfg(feature = "postgres")]
    if cause.is::<postgres::Error>() {
        return true;
    }
    let _ = cause;
    false
}

fn main() -> ExitCode {
    let cli = {
        use clap::{CommandFactory, FromArgMatches};
        let color = ColorWhen::from_args().unwrap_or(ColorWhen::Auto);
        let mut command = Cli::command().color(color.clap());
        let matches = command.get_matches_mut();
        // The command tree is thousands of small allocations: freeing them
        // one by one cost about a fifth of a quick read command's own
        // instructions (callgrind, `thread log`; issue 22), for memory the
        // process returns when it ends anyway.
        std::mem::forget(command);
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    };
    // One token per command; SIGINT, SIGTERM and SIGHUP cancel it.
    let cancel = Cancel::new();
    // A batch stops gracefully on a first Ctrl-C (SPEC §11).
    let mode = match cli.command {
        Command::Batch { .. } => SignalMode::Batch,
        #[cfg(feature = "serve")]
        Command::Serve(_) => SignalMode::Serve,
        #[cfg(feature = "mcp")]
        Command::Mcp(_) => SignalMode::Serve,
        _ if quick(&cli.command) => SignalMode::Quick,
        _ => SignalMode::Exit,
    };
    if mode == SignalMode::Quick {
        exit_on_signals();
    } else {
        handle_signals(&cancel, mode);
    }
    output::set_quiet(cli.quiet);
    #[cfg(feature = "serve")]
    let serving = matches!(cli.command, Command::Serve(_));
    #[cfg(not(feature = "serve"))]
    let serving = false;
    let color = match cli.color {
        ColorWhen::Auto => None,
        when => Some(when == ColorWhen::Always),
    };
    telemetry::init(cli.verbose, cli.quiet, color, serving);
    let mut out = Output::new(cli.json);
    out.verbose = cli.verbose;
    let result = run(&cli, &cancel, &mut out).and_then(|()| out.flush().map_err(CliError::from));
    telemetry::flush();
    // The signal thread cancelled the work, which may end here before that
    // thread calls `exit`: the signal's exit code wins either way.
    let signal = SIGNALLED.load(std::sync::atomic::Ordering::SeqCst);
    if signal != 0 {
        return ExitCode::from(u8::try_from(128 + signal).unwrap_or(1));
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `uwf-db ... | head` closing the pipe is not a failure.
        Err(CliError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(CliError::Reported) => ExitCode::from(1),
        Err(CliError::ReportedDamage) => ExitCode::from(fault::DAMAGED as u8),
        Err(e) => {
            let _ = out.flush();
            let damaged = damaged(&e);
            let answer = uwf_db::api::ErrorAnswer {
                error: uwf_db::api::ErrorBody {
                    kind: if damaged {
                        uwf_db::api::ErrorKind::Damaged
                    } else {
                        kind(&e)
                    },
                    message: e.to_string(),
                    causes: causes(&e),
                    hint: hint(&e),
                    exit_code: if damaged { fault::DAMAGED as u8 } else { 1 },
                },
            };
            report_error(&answer, cli.json);
            ExitCode::from(answer.error.exit_code)
        }
    }
}

/// What kind of failure `e` is (the library's layers say; the CLI's own
/// refusals are bad input).
fn kind(e: &CliError) -> uwf_db::api::ErrorKind {
    use uwf_db::api::ErrorKind;
    match e {
        CliError::Store(e) => e.into(),
        CliError::Thread(e) => e.into(),
        CliError::Workflow(e) => e.into(),
        CliError::Engine(e) => e.into(),
        CliError::Gc(e) => e.into(),
        CliError::Copy(e) => e.into(),
        CliError::Bundle(e) => e.into(),
        CliError::Salvage(e) => e.into(),
        CliError::PromptFile(_) | CliError::Failed(_) => ErrorKind::Invalid,
        _ => ErrorKind::Failed,
    }
}

/// The causes of `e` its message does not already say (a driver's terse
/// "db error" hides the server's message in its source).
fn causes(e: &CliError) -> Vec<String> {
    let mut said = e.to_string();
    let mut out = Vec::new();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let text = c.to_string();
        if !says_nothing(c) && !said.contains(&text) {
            said.push_str(&text);
            out.push(text);
        }
        cause = c.source();
    }
    out
}

/// Writes a failed command's error on stderr: under `--json` one JSON line
/// (`api::ErrorAnswer`), else `error:`, `  caused by:` and `hint:` lines.
fn report_error(answer: &uwf_db::api::ErrorAnswer, json: bool) {
    use std::io::Write as _;
    let mut stderr = std::io::stderr().lock();
    if json {
        // The answer is strings and a number: serializing it cannot fail.
        if let Ok(line) = serde_json::to_string(answer) {
            let _ = writeln!(stderr, "{line}");
        }
        return;
    }
    let _ = writeln!(stderr, "error: {}", answer.error.message);
    for cause in &answer.error.causes {
        let _ = writeln!(stderr, "  caused by: {cause}");
    }
    if let Some(hint) = &answer.error.hint {
        let _ = writeln!(stderr, "hint: {hint}");
    }
}

/// The signal [`handle_signals`] received (0: none yet).
static SIGNALLED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// SIGINT (Ctrl-C), SIGTERM (`kill`) and SIGHUP (the terminal went away):
/// cancel the command's token, which kills the agents' process groups and
/// releases the claims so the threads are retryable at once, then exit
/// 128 + the signal's number (130, 143, 129). An open write transaction dies
/// with the process and the store discards it, so nothing half-written
/// remains.
///
/// The signals are blocked here, before any other thread starts, so every
/// thread inherits the mask and only the waiting thread receives them; a
/// handler that runs inside an arbitrary thread could not take locks. The
/// agents do not inherit the mask: `std::process::Command` clears it in the
/// child before exec.
///
/// With `graceful` (a batch), a first SIGINT only asks the work to stop
/// after the steps in flight are committed ([`Cancel::stop_after_step`]):
/// no new thread starts, no agent is killed, and the command ends as it
/// would, with exit 130; a second signal of any of the three acts as above.
/// What the first SIGINT, SIGTERM or SIGHUP does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SignalMode {
    /// Cancel the command and exit with 128 + the signal.
    Exit,
    /// A command with nothing to cancel ([`quick`]): say so and exit with
    /// 128 + the signal, from a handler, with no thread.
    Quick,
    /// A first Ctrl-C stops after the steps in flight (SPEC §11).
    Batch,
    /// Any of them shuts the server down gracefully (it exits 0); a
    /// second one exits at once.
    #[cfg(feature = "serve")]
    Serve,
}

/// Whether a command has nothing a signal must cancel: it only reads or
/// writes the store, in this process, runs no agent, holds no claim,
/// starts no process and has no watch to end, so it need not pay for a
/// signal thread (issue 22, "short commands stay short": agents and scripts
/// run these many times a step). (`cas put -` may wait on its stdin, which
/// needs no cancelling either.)
fn quick(command: &Command) -> bool {
    use thread::ThreadCommand as T;
    match command {
        Command::Thread(t) => matches!(
            t,
            T::List { watch: false, .. }
                | T::Show { .. }
                | T::Log { .. }
                | T::Tree { .. }
                | T::Label { .. }
        ),
        Command::Workflow(_) | Command::Cas(_) | Command::Usage { .. } => true,
        Command::Completions { .. } | Command::Man { .. } => true,
        _ => false,
    }
}

/// The signals that end a command: SIGINT (Ctrl-C), SIGTERM (`kill`) and
/// SIGHUP (the terminal went away).
const ENDING_SIGNALS: [nix::sys::signal::Signal; 3] = [
    nix::sys::signal::Signal::SIGINT,
    nix::sys::signal::Signal::SIGTERM,
    nix::sys::signal::Signal::SIGHUP,
];

/// [`ENDING_SIGNALS`] as a set.
fn ending_signals() -> nix::sys::signal::SigSet {
    let mut set = nix::sys::signal::SigSet::empty();
    for signal in ENDING_SIGNALS {
        set.add(signal);
    }
    set
}

/// What a command ended by `signal` says on stderr, with its newline (a
/// plain match on static text: the quick handler calls it too).
fn said(signal: nix::libc::c_int) -> &'static str {
    match signal {
        nix::libc::SIGTERM => "terminated\n",
        nix::libc::SIGHUP => "hangup\n",
        _ => "interrupted\n",
    }
}

/// [`ENDING_SIGNALS`] for a [`quick`] command: the same word and exit code
/// as [`handle_signals`] (130, 143, 129), from a handler. An open
/// transaction dies with the process and the store discards it.
#[allow(unsafe_code)]
fn exit_on_signals() {
    use nix::libc;
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, sigaction};
    extern "C" fn on_signal(signal: libc::c_int) {
        let said = said(signal);
        // SAFETY: write(2) on the standard error's descriptor and _exit(2)
        // are async-signal-safe; `said` is static text, valid for its
        // length. Nothing of the interrupted code runs after `_exit`.
        unsafe {
            libc::write(libc::STDERR_FILENO, said.as_ptr().cast(), said.len());
            libc::_exit(128 + signal)
        }
    }
    // The three are blocked while the handler runs: a second one cannot
    // interrupt it and print a second word.
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        ending_signals(),
    );
    for signal in ENDING_SIGNALS {
        // SAFETY: the handler calls only write(2) on the standard error's
        // descriptor and _exit(2), both async-signal-safe; it touches no
        // lock, allocation or state the interrupted code may hold. Failure
        // (an invalid signal, which these are not) keeps the default
        // action, which ends the process too.
        let _ = unsafe { sigaction(signal, &action) };
    }
}

fn handle_signals(cancel: &Cancel, mode: SignalMode) {
    let graceful = mode == SignalMode::Batch;
    use nix::sys::signal::Signal;
    use std::io::Write;
    let signals = ending_signals();
    if signals.thread_block().is_err() {
        // The default actions stay: the process dies, and the agents with
        // it (their parent-death signal), but claims wait for takeover.
        return;
    }
    let cancel = cancel.clone();
    std::thread::spawn(move || {
        // `sigwait` fails only for an invalid set, which this is not.
        let Ok(mut signal) = signals.wait() else {
            return;
        };
        #[cfg(feature = "serve")]
        if mode == SignalMode::Serve {
            cancel.stop_after_step();
            let Ok(again) = signals.wait() else { return };
            signal = again;
        }
        if graceful && signal == Signal::SIGINT {
            SIGNALLED.store(signal as i32, std::sync::atomic::Ordering::SeqCst);
            cancel.stop_after_step();
            let _ = writeln!(
                std::io::stderr(),
                "stopping after the steps in flight are committed (no new thread starts); Ctrl-C again kills the agents"
            );
            let Ok(again) = signals.wait() else { return };
            signal = again;
        }
        SIGNALLED.store(signal as i32, std::sync::atomic::Ordering::SeqCst);
        cancel.cancel();
        // Not `eprintln!`, which panics when stderr is gone (a hangup often
        // means the terminal is), and the exit below must happen.
        let _ = write!(std::io::stderr(), "{}", said(signal as i32));
        std::process::exit(128 + signal as i32);
    });
}

/// Whether the error says the store's data file is damaged (exit 3): each
/// layer's error answers for itself; an error carried as another's source
/// (a copy's, a bundle's) is found down the chain.
fn damaged(e: &CliError) -> bool {
    let direct = match e {
        CliError::Store(s) => s.is_damage(),
        CliError::Engine(e) => e.is_damage(),
        CliError::Thread(e) => e.is_damage(),
        CliError::Workflow(e) => e.is_damage(),
        CliError::Gc(e) => e.is_damage(),
        _ => false,
    };
    if direct {
        return true;
    }
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if c.downcast_ref::<StoreError>()
            .is_some_and(StoreError::is_damage)
        {
            return true;
        }
        cause = c.source();
    }
    false
}

/// What to type next, for the errors whose remedy is a command line (the
/// library's messages name the problem, not our flags).
fn hint(e: &CliError) -> Option<String> {
    use uwf_db::engine::EngineError;
    match e {
        CliError::Engine(EngineError::NoAgent { .. }) => {
            Some("pass --agent script:FILE or --agent 'cmd:PROGRAM ARGS'".into())
        }
        CliError::Engine(EngineError::ResumeThroughParent { parent, .. }) => {
            Some(format!("uwf-db thread resume {parent}"))
        }
        _ => None,
    }
}

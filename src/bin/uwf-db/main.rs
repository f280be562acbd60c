//! `uwf-db`: run, inspect and verify uwf-db stores.
//!
//! The binary parses arguments, calls the library and formats its answers;
//! it holds no logic of its own. Exit codes (SPEC §7): 0 success, 1 the
//! operation failed or found a problem, 2 bad usage, 130 interrupted
//! (SIGINT), 143 terminated (SIGTERM), 129 hung up (SIGHUP).

mod admin;
mod batch;
mod cas;
mod drive;
mod output;
mod thread;
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
    /// Commit durability: `none` skips fsync (a machine crash may lose recent commits)
    #[arg(long, global = true, value_enum, default_value_t = DurabilityArg::Sync)]
    durability: DurabilityArg,
    /// Largest size the store's data file may reach (e.g. 512MiB, 4GiB) [default: 1TiB]
    #[arg(long, global = true, env = "UWF_MAX_MAP_SIZE", value_name = "SIZE", value_parser = output::parse_size)]
    max_map_size: Option<u64>,
    #[command(subcommand)]
    command: Command,
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
              requires = "prompt", value_parser = drive::parse_count)]
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
    },
    /// Register, list, show and validate workflows
    #[command(subcommand)]
    Workflow(workflow::WorkflowCommand),
    /// Start, inspect, fork and unlink threads
    #[command(subcommand)]
    Thread(thread::ThreadCommand),
    /// Delete blobs no thread, workflow or pin reaches (safe while writers run)
    Gc {
        /// Report what would be deleted; delete nothing
        #[arg(long)]
        dry_run: bool,
        /// Keep blobs stored or re-put this recently, with what they reach (e.g. 0, 90s, 30m, 1h, 7d)
        #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = drive::parse_duration)]
        grace: std::time::Duration,
    },
    /// Re-hash every blob and check every ref and index entry; exit 1 on any problem
    Verify,
    /// Counts, sizes, map usage, readers, durability
    Stats,
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
    #[error("{0}")]
    Failed(String),
    /// The command already reported what it found; exit 1 quietly.
    #[error("")]
    Reported,
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
        };
        match location.to_str() {
            Some(url) if uwf_db::backend::is_postgres_url(url) => {
                Store::open_location(url, options)
            }
            _ => Store::open(location, options),
        }
    }
}

fn run(cli: &Cli, cancel: &Cancel, out: &mut Output) -> Result<(), CliError> {
    match &cli.command {
        Command::Init => admin::init(cli, out),
        Command::Cas(cmd) => cas::run(cli, cmd, out),
        Command::Thread(cmd) => thread::run(cli, cmd, cancel, out),
        Command::Workflow(cmd) => workflow::run(cli, cmd, out),
        Command::Run {
            workflow,
            prompt,
            agent,
            max_rounds,
            cwd,
        } => drive::run(
            cli,
            workflow,
            prompt,
            agent,
            (*max_rounds, cwd.as_deref()),
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
            },
            cancel,
            out,
        ),
        Command::Gc { dry_run, grace } => admin::gc(cli, *dry_run, *grace, out),
        Command::Verify => admin::verify(cli, out),
        Command::Stats => admin::stats(cli, out),
        Command::Copy {
            source,
            destination,
            chunk_rows,
        } => admin::copy(cli, source, destination, *chunk_rows, out),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // One token per command; SIGINT, SIGTERM and SIGHUP cancel it.
    let cancel = Cancel::new();
    handle_signals(&cancel);
    let mut out = Output::new(cli.json);
    let result = run(&cli, &cancel, &mut out).and_then(|()| out.flush().map_err(CliError::from));
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
        Err(e) => {
            let _ = out.flush();
            eprintln!("error: {e}");
            // Causes the message does not already say (a driver's terse
            // "db error" hides the server's message in its source).
            let mut said = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                let text = c.to_string();
                if !said.contains(&text) {
                    eprintln!("  caused by: {text}");
                    said.push_str(&text);
                }
                cause = c.source();
            }
            if let Some(hint) = hint(&e) {
                eprintln!("hint: {hint}");
            }
            ExitCode::from(1)
        }
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
fn handle_signals(cancel: &Cancel) {
    use nix::sys::signal::{SigSet, Signal};
    use std::io::Write;
    let mut signals = SigSet::empty();
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        signals.add(signal);
    }
    if signals.thread_block().is_err() {
        // The default actions stay: the process dies, and the agents with
        // it (their parent-death signal), but claims wait for takeover.
        return;
    }
    let cancel = cancel.clone();
    std::thread::spawn(move || {
        // `sigwait` fails only for an invalid set, which this is not.
        let Ok(signal) = signals.wait() else { return };
        SIGNALLED.store(signal as i32, std::sync::atomic::Ordering::SeqCst);
        cancel.cancel();
        let said = match signal {
            Signal::SIGTERM => "terminated",
            Signal::SIGHUP => "hangup",
            _ => "interrupted",
        };
        // Not `eprintln!`, which panics when stderr is gone (a hangup often
        // means the terminal is), and the exit below must happen.
        let _ = writeln!(std::io::stderr(), "{said}");
        std::process::exit(128 + signal as i32);
    });
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

//! `uwf-db serve`: the library's answers over HTTP, live events over
//! Server-Sent Events, and the dashboard (`docs/design.md` §8d).
//!
//! The library is synchronous; this module owns a tokio runtime and runs
//! every library call on its blocking pool. One table ([`routes::ROUTES`])
//! makes both the router and the OpenAPI document, so neither can name a
//! route the other lacks. Connections are served by hyper directly (not
//! `axum::serve`) for what a server facing browsers needs: a header read
//! timeout, a cap on open connections, and a graceful drain.

mod assets;
pub(crate) mod error;
mod events;
mod guard;
pub mod metrics;
mod openapi;
mod params;
pub(crate) mod reads;
mod routes;
pub(crate) mod writes;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::{Semaphore, broadcast, watch};
use uwf_db::Store;
use uwf_db::engine::Cancel;
use uwf_db::engine::agent::AgentOptions;

use crate::{Cli, CliError};

/// Open connections served at once; more wait in the listen queue.
const MAX_CONNECTIONS: usize = 4096;
/// A client that has not sent its request headers by then is dropped.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request body.
pub const MAX_BODY: usize = 1 << 20;
/// Threads driven by this server at once (starts and resumes); more are
/// refused with 503 until one ends.
const MAX_DRIVES: usize = 64;
/// Library calls running at once (the runtime's blocking pool).
const BLOCKING_THREADS: usize = 32;
/// How long a shutdown waits for connections and drives to finish.
const DRAIN: Duration = Duration::from_secs(10);

/// `uwf-db serve`'s flags.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on; anything but a loopback address needs --token
    #[arg(long, default_value = "127.0.0.1:7860", value_name = "ADDR:PORT")]
    bind: SocketAddr,
    /// A secret every API request must carry (`Authorization: Bearer TOKEN`,
    /// or `?token=TOKEN` for event streams)
    #[arg(
        long,
        env = "UWF_SERVE_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// An agent requests may drive threads with (repeatable): NAME=SPEC,
    /// or SPEC alone for the agent named `default` (e.g.
    /// default=script:examples/review.scenario.yaml). Requests name an
    /// agent; they never give a spec, so they run only what is named here
    #[arg(long = "agent", value_name = "NAME=SPEC", value_parser = parse_agent)]
    agents: Vec<(String, String)>,
    /// Refuse every write (start, resume, stop, cancel, fork, label)
    #[arg(long)]
    read_only: bool,
    /// A host name (HOST or HOST:PORT) the server answers to besides the
    /// bind address and localhost, when it sits behind a proxy (repeatable)
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_hosts: Vec<String>,
    /// Kill an agent call after this long (e.g. 10m)
    #[arg(long, value_name = "DURATION", value_parser = crate::output::parse_duration)]
    agent_timeout: Option<Duration>,
}

pub fn parse_agent(s: &str) -> Result<(String, String), String> {
    let (name, spec) = match s.split_once('=') {
        Some((name, spec))
            if !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') =>
        {
            (name, spec)
        }
        _ => ("default", s),
    };
    uwf_db::engine::agent::AgentSpec::parse(spec).map_err(|e| e.to_string())?;
    Ok((name.to_owned(), spec.to_owned()))
}

/// What every handler shares.
pub struct AppState {
    pub store: Store,
    /// The agents requests may name, by name.
    pub agents: BTreeMap<String, String>,
    pub agent_options: AgentOptions,
    pub read_only: bool,
    pub token: Option<blake3::Hash>,
    /// Host headers accepted (lowercase); `None`: any (a token guards).
    pub hosts: Option<Vec<String>>,
    /// Status changes from the one poller (`events.rs`).
    pub changes: broadcast::Sender<Arc<events::Change>>,
    /// Becomes `true` when the server shuts down: streams end.
    pub closing: watch::Receiver<bool>,
    /// The command's token (the signal thread's): every drive of this
    /// server runs under it, so a first signal stops them after their step
    /// in flight and a second kills their agents.
    pub cancel: Cancel,
    /// Drives in flight (start with `drive`, resume).
    pub drives: Arc<Semaphore>,
    pub drive_threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    pub backend: &'static str,
}

pub type Shared = Arc<AppState>;

/// `uwf-db serve`.
pub fn run(cli: &Cli, args: &ServeArgs, cancel: &Cancel) -> Result<(), CliError> {
    let loopback = args.bind.ip().is_loopback();
    if !loopback && args.token.is_none() {
        return Err(CliError::Failed(format!(
            "{} is not a loopback address: anyone who can reach it could read and drive your threads; pass --token TOKEN (or set UWF_SERVE_TOKEN), or bind 127.0.0.1",
            args.bind
        )));
    }
    if args.token.as_deref().is_some_and(|t| t.len() < 16) {
        return Err(CliError::Failed(
            "--token is too short: use at least 16 characters (e.g. `openssl rand -hex 16`)".into(),
        ));
    }
    let store = cli.open(true)?;
    let backend = if uwf_db::backend::is_postgres_url(store.location()) {
        "postgres"
    } else {
        "lmdb"
    };
    // Bound before anything else, so that `--bind 127.0.0.1:0` gets a
    // port the host check can name.
    let listener = std::net::TcpListener::bind(args.bind)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| CliError::Failed(format!("cannot listen on {}: {e}", args.bind)))?;
    let local = listener
        .local_addr()
        .map_err(|e| CliError::Failed(format!("cannot listen on {}: {e}", args.bind)))?;
    let hosts = if args.token.is_some() {
        None
    } else {
        let port = local.port();
        let mut hosts = vec![
            local.to_string(),
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
            format!("[::1]:{port}"),
        ];
        if port == 80 {
            hosts.extend(["localhost".into(), "127.0.0.1".into(), "[::1]".into()]);
        }
        hosts.extend(args.allow_hosts.iter().cloned());
        Some(hosts.into_iter().map(|h| h.to_ascii_lowercase()).collect())
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("uwf-serve")
        // Each library call holds a read transaction (an LMDB reader slot,
        // a PostgreSQL connection): bounded well inside the store's limits.
        .max_blocking_threads(BLOCKING_THREADS)
        .build()
        .map_err(|e| CliError::Failed(format!("cannot start the server's runtime: {e}")))?;
    let (close_tx, closing) = watch::channel(false);
    let mut state = AppState::new(store, &args.agents, args.agent_timeout, cancel, closing);
    state.read_only = args.read_only;
    state.token = args.token.as_deref().map(|t| blake3::hash(t.as_bytes()));
    state.hosts = hosts;
    state.backend = backend;
    let state = Arc::new(state);
    let poller = events::start_poller(&state);
    let result = runtime.block_on(serve(state.clone(), listener, cancel.clone(), close_tx));
    finish_drives(&state);
    let _ = poller.join();
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

impl AppState {
    /// The state of a server over `store` whose drives may use `agents`
    /// and run under `cancel`: no token, any host, writes allowed, the LMDB
    /// backend named (the caller sets what differs).
    pub fn new(
        store: Store,
        agents: &[(String, String)],
        agent_timeout: Option<Duration>,
        cancel: &Cancel,
        closing: watch::Receiver<bool>,
    ) -> AppState {
        let (changes, _) = broadcast::channel(events::CHANNEL);
        let backend = if uwf_db::backend::is_postgres_url(store.location()) {
            "postgres"
        } else {
            "lmdb"
        };
        AppState {
            store,
            agents: agents.iter().cloned().collect(),
            agent_options: {
                let mut options = AgentOptions::default();
                if let Some(t) = agent_timeout {
                    options.timeout = t;
                }
                options
            },
            read_only: false,
            token: None,
            hosts: None,
            changes,
            closing,
            cancel: cancel.clone(),
            drives: Arc::new(Semaphore::new(MAX_DRIVES)),
            drive_threads: Mutex::new(Vec::new()),
            backend,
        }
    }
}

/// At shutdown: drives stop after their step in flight (a signal said so
/// already; a failed bind or the end of input did not), waited for at most
/// [`DRAIN`]; then the token is cancelled (agents still running are
/// killed, the poller ends).
pub fn finish_drives(state: &AppState) {
    state.cancel.stop_after_step();
    let deadline = std::time::Instant::now() + DRAIN;
    let handles = std::mem::take(&mut *lock(&state.drive_threads));
    for handle in handles {
        while !handle.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if handle.is_finished() {
            let _ = handle.join();
        }
    }
    state.cancel.cancel();
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn serve(
    state: Shared,
    listener: std::net::TcpListener,
    cancel: Cancel,
    close: watch::Sender<bool>,
) -> Result<(), CliError> {
    let listener = tokio::net::TcpListener::from_std(listener)
        .map_err(|e| CliError::Failed(format!("cannot listen: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| CliError::Failed(format!("cannot listen: {e}")))?;
    // The one line a script waits for (stderr: stdout stays clean).
    eprintln!(
        "uwf-db serve: listening on http://{local}/ (store {}, {} backend{})",
        state.store.location(),
        state.backend,
        if state.read_only { ", read-only" } else { "" }
    );
    let app = routes::router(state.clone());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    // The signal thread stops `cancel`; a thread of its own watches it
    // (not one of the blocking pool's).
    let (stop_tx, mut stopped) = tokio::sync::oneshot::channel::<()>();
    {
        let cancel = cancel.clone();
        std::thread::Builder::new()
            .name("uwf-serve-stop".into())
            .spawn(move || {
                while !cancel.is_stopping() {
                    cancel.sleep(Duration::from_millis(100));
                }
                let _ = stop_tx.send(());
            })
            .map_err(|e| CliError::Failed(format!("cannot start the server: {e}")))?;
    }
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => permit,
            _ = &mut stopped => break,
        };
        let Ok(permit) = permit else { break };
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                // Out of descriptors and the like: wait, do not spin.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stopped => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .max_buf_size(64 * 1024)
            .serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    eprintln!("uwf-db serve: shutting down");
    // Event streams end; requests in flight finish (bounded).
    let _ = close.send(true);
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(DRAIN) => {}
    }
    Ok(())
}

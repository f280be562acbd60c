//! The PostgreSQL backend behind a transaction-mode pooler: PgBouncer
//! (Debian's package) started by the test with `pool_mode = transaction`
//! in front of the test server. The backend's prepared statements are
//! found not to be kept between transactions and turned off (every
//! statement then an unnamed one or a simple query), no setting is made
//! for the session before that (`SET LOCAL` only), and claims and the
//! GC lock are transaction-scoped advisory locks (a transaction pins one
//! server connection), so a whole workload runs through it: a batch with
//! claims and group commit, claims refused and released across handles,
//! listings, a collection and `verify`.
//!
//! Without a `pgbouncer` binary the test says so loudly and passes
//! without running, except under CI, where it fails (`.ci/run` installs
//! the package).
#![cfg(feature = "postgres")]

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::backend::TestBackend;
use uwf_db::engine::agent::{Agent, AgentError, AgentReply, AgentRequest};
use uwf_db::engine::batch::{BatchItem, BatchOptions};
use uwf_db::engine::{Cancel, EngineError, StartOptions};
use uwf_db::gc::GcOptions;
use uwf_db::thread::{ThreadQuery, ThreadStatus};
use uwf_db::{Durability, Store, StoreOptions};

const PGBOUNCER: &str = "/usr/sbin/pgbouncer";

struct Echo;

impl Agent for Echo {
    fn call(&mut self, req: &AgentRequest<'_>) -> Result<AgentReply, AgentError> {
        Ok(format!("{} did it", req.role_name).into())
    }
}

/// A PgBouncer process, killed when dropped.
struct Bouncer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether PgBouncer is installed; loud when not, fatal under CI.
fn pgbouncer_available() -> bool {
    if Path::new(PGBOUNCER).exists() {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{PGBOUNCER} is missing; CI must run the pooler test (apt-get install pgbouncer)");
    }
    eprintln!(
        "\n!!! PgBouncer NOT INSTALLED ({PGBOUNCER}): the transaction-mode pooler test did NOT run.\n\
         !!! Install Debian's package: apt-get install pgbouncer\n"
    );
    false
}

/// Starts PgBouncer in transaction mode in front of the server of `url`.
fn start_bouncer(url: &str) -> Bouncer {
    let config: postgres::Config = url.parse().unwrap();
    let host = match config.get_hosts().first() {
        Some(postgres::config::Host::Tcp(h)) => h.clone(),
        other => panic!("the pooler test needs a TCP server URL, not {other:?}"),
    };
    let server_port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("root").to_owned();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let ini = dir.path().join("pgbouncer.ini");
    let users = dir.path().join("users.txt");
    std::fs::write(&users, format!("\"{user}\" \"\"\n")).unwrap();
    std::fs::write(
        &ini,
        format!(
            "[databases]\n* = host={host} port={server_port}\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {}\npool_mode = transaction\n\
             default_pool_size = 40\nmax_client_conn = 400\n",
            users.display()
        ),
    )
    .unwrap();
    // PgBouncer refuses to run as root; `-u` drops to another user, who
    // must be able to read the files.
    use std::os::unix::fs::PermissionsExt;
    for p in [dir.path(), &ini, &users] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut cmd = Command::new(PGBOUNCER);
    let uid = Command::new("id").arg("-u").output().unwrap().stdout;
    if String::from_utf8_lossy(&uid).trim() == "0" {
        cmd.args(["-u", "postgres"]);
    }
    let child = cmd
        .arg(&ini)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let bouncer = Bouncer {
        child,
        port,
        _dir: dir,
    };
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "PgBouncer did not start on port {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    bouncer
}

#[test]
fn a_whole_workload_runs_behind_pgbouncer_in_transaction_mode() {
    if !TestBackend::Postgres.available() || !pgbouncer_available() {
        return;
    }
    let location = TestBackend::Postgres.location();
    let direct = location.arg_str();
    let bouncer = start_bouncer(&direct);
    // The same database, through the pooler.
    let (server, db) = direct.rsplit_once('/').unwrap();
    let (scheme_user, _) = server.rsplit_once('@').unwrap();
    let url = format!("{scheme_user}@127.0.0.1:{}/{db}", bouncer.port);
    let open = || {
        Store::open_location(
            &url,
            StoreOptions {
                durability: Durability::Sync,
                ..StoreOptions::default()
            },
        )
        .unwrap()
    };
    // Really through the pooler: the server behind it is on another port.
    let mut raw = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let server_port: String = raw
        .simple_query("SHOW port")
        .unwrap()
        .iter()
        .find_map(|m| match m {
            postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap();
    assert_ne!(server_port, bouncer.port.to_string());
    drop(raw);
    let store = open();

    // A batch: 8 driver threads, each claim a transaction pinned to a
    // server connection, every step through group commit.
    let hash = common::two_roles(&store, "two");
    let prompts: Vec<String> = (0..40).map(|i| format!("task {i}")).collect();
    let agents: Vec<Box<dyn Agent>> = (0..8).map(|_| Box::new(Echo) as Box<dyn Agent>).collect();
    let report = store
        .engine()
        .run_batch(
            hash,
            &prompts,
            &BatchOptions::default(),
            agents,
            &mut |_: &BatchItem| {},
        )
        .unwrap();
    assert_eq!(
        (report.threads, report.completed, report.errors),
        (40, 40, 0)
    );
    assert_eq!(report.steps, 80);
    // The pooler hands each transaction whichever server connection is
    // free, so the backend's prepared statements were found missing or
    // there already, and turned off (`docs/design.md` §8f) — without
    // failing a thread.
    let pg = |s: &Store| {
        s.backend()
            .as_any()
            .downcast_ref::<uwf_db::backend::postgres::PostgresBackend>()
            .map(uwf_db::backend::postgres::PostgresBackend::prepares)
    };
    assert_eq!(pg(&store), Some(false));

    // Claims across two handles (two runners) through the pooler.
    let other = open();
    let id = store
        .engine()
        .start_workflow(hash, "claimed", &StartOptions::default())
        .unwrap()
        .id;
    let claim = store.engine().claim(id, &Cancel::new()).unwrap();
    assert!(matches!(
        other.engine().claim(id, &Cancel::new()),
        Err(EngineError::Claimed { .. })
    ));
    assert_eq!(other.engine().continuable_threads("two").unwrap(), []);
    claim.release().unwrap();
    let taken = other.engine().claim(id, &Cancel::new()).unwrap();
    assert!(matches!(
        store.engine().claim(id, &Cancel::new()),
        Err(EngineError::Claimed { .. })
    ));
    taken.release().unwrap();
    assert_eq!(store.engine().continuable_threads("two").unwrap(), [id]);

    // Listings, a collection, verify.
    let completed = store
        .threads()
        .list(&ThreadQuery {
            statuses: vec![ThreadStatus::Completed],
            limit: 100,
            ..ThreadQuery::default()
        })
        .unwrap();
    assert_eq!(completed.len(), 40);
    uwf_db::gc::collect_garbage(&store, &GcOptions::default(), &|_| {}).unwrap();
    let report = uwf_db::verify::verify(&store, |_| {}).unwrap();
    assert!(report.is_ok(), "{report:?}");
    drop((store, other));
    drop(bouncer);
    // Nothing of it was lost on the way: the direct view agrees.
    let direct_store = location.open(Durability::Sync);
    assert_eq!(
        direct_store.engine().continuable_threads("two").unwrap(),
        [id]
    );
}

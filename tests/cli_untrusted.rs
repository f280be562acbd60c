//! Files and numbers from outside (issue 18) through the real binary: a
//! store's planted files are refused before LMDB opens them, `copy` and
//! `salvage` never write among someone's files, and an absurd batch count
//! is refused, not allocated.
#![cfg(feature = "cli")]

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::backend::TestBackend;
use common::cli::*;

/// A store with one completed thread; returns its directory.
fn store_with_a_thread(env: &Cli) -> std::path::PathBuf {
    let o = env.uwf(&[
        "run",
        "examples/review.yaml",
        "-p",
        "t",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    env.location().lmdb_dir().to_path_buf()
}

/// [`store_with_a_thread`] and the thread's id.
fn store_and_thread(env: &Cli) -> (std::path::PathBuf, String) {
    let store = store_with_a_thread(env);
    let id = env.json(&["thread", "list"])[0]["thread"]
        .as_str()
        .unwrap()
        .to_owned();
    (store, id)
}

/// Whether this process is root; if not, says loudly that the calling
/// test checked nothing (and fails under CI, which runs as root).
fn root_or_say(what: &str) -> bool {
    if std::fs::metadata("/proc/self").unwrap().uid() == 0 {
        return true;
    }
    eprintln!("NOT ROOT: this test cannot {what}, and checked nothing");
    assert!(
        std::env::var_os("CI").is_none(),
        "CI runs as root: this test must run there"
    );
    false
}

fn victim(env: &Cli) -> std::path::PathBuf {
    let victim = env.path("victim");
    std::fs::write(&victim, "precious").unwrap();
    victim
}

fn refused_naming(env: &Cli, args: &[&str], says: &[&str]) {
    let o = env.uwf(args);
    assert_ne!(code(&o), Some(0), "{args:?} was not refused");
    let err = stderr(&o);
    assert!(
        err.contains("refusing to open the store"),
        "{args:?}: {err}"
    );
    for s in says {
        assert!(err.contains(s), "{args:?}: no {s:?} in: {err}");
    }
}

#[test]
fn a_planted_lock_mdb_link_is_refused_and_its_target_untouched() {
    let env = Cli::new(TestBackend::Lmdb).without_final_verify();
    let store = store_with_a_thread(&env);
    let victim = victim(&env);
    std::fs::remove_file(store.join("lock.mdb")).unwrap();
    std::os::unix::fs::symlink(&victim, store.join("lock.mdb")).unwrap();
    for args in [
        &["verify"][..],
        &["thread", "list"],
        &["gc"],
        &["stats"],
        &["init"],
    ] {
        refused_naming(&env, args, &["lock.mdb", "symbolic link"]);
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    // Removed, the store opens again: nothing of it was lost.
    std::fs::remove_file(store.join("lock.mdb")).unwrap();
    env.verify_clean();
    assert_eq!(env.json(&["thread", "list"]).as_array().unwrap().len(), 1);
}

#[test]
fn a_planted_data_mdb_link_is_refused() {
    let env = Cli::new(TestBackend::Lmdb).without_final_verify();
    let store = store_with_a_thread(&env);
    // The data file moved elsewhere and linked back: a link is refused
    // whatever it points to.
    let moved = env.path("moved.mdb");
    std::fs::rename(store.join("data.mdb"), &moved).unwrap();
    let before = std::fs::read(&moved).unwrap();
    std::os::unix::fs::symlink(&moved, store.join("data.mdb")).unwrap();
    refused_naming(&env, &["verify"], &["data.mdb", "symbolic link"]);
    refused_naming(&env, &["thread", "list"], &["data.mdb", "symbolic link"]);
    assert_eq!(std::fs::read(&moved).unwrap(), before);
    // A dangling link is refused too, and `init` does not write through it.
    std::fs::remove_file(store.join("data.mdb")).unwrap();
    let nowhere = env.path("nowhere.mdb");
    std::os::unix::fs::symlink(&nowhere, store.join("data.mdb")).unwrap();
    refused_naming(&env, &["init"], &["data.mdb", "symbolic link"]);
    assert!(!nowhere.exists(), "init wrote through the link");
}

#[test]
fn a_fifo_or_directory_in_place_of_a_store_file_is_refused() {
    let env = Cli::new(TestBackend::Lmdb).without_final_verify();
    let store = store_with_a_thread(&env);
    std::fs::remove_file(store.join("lock.mdb")).unwrap();
    nix::unistd::mkfifo(&store.join("lock.mdb"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    // A FIFO would block LMDB's open forever.
    refused_naming(&env, &["verify"], &["lock.mdb", "named pipe"]);
    std::fs::remove_file(store.join("lock.mdb")).unwrap();
    std::fs::create_dir(store.join("lock.mdb")).unwrap();
    refused_naming(&env, &["verify"], &["lock.mdb", "directory"]);
    std::fs::remove_dir(store.join("lock.mdb")).unwrap();
    env.verify_clean();
}

#[test]
fn a_data_file_another_user_owns_is_refused() {
    let env = Cli::new(TestBackend::Lmdb).without_final_verify();
    let store = store_with_a_thread(&env);
    if !root_or_say("give a file to another user") {
        return;
    }
    std::os::unix::fs::chown(store.join("data.mdb"), Some(65534), Some(65534)).unwrap();
    refused_naming(
        &env,
        &["verify"],
        &["data.mdb", "another user owns", "65534"],
    );
    std::os::unix::fs::chown(store.join("data.mdb"), Some(0), Some(0)).unwrap();
    env.verify_clean();
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn copy_and_salvage_never_write_among_other_files() {
    let env = Cli::new(TestBackend::Lmdb);
    let store = store_with_a_thread(&env);
    let dir = env.path("d");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("important.txt"), "keep").unwrap();
    let src = store.to_str().unwrap();
    let dst = dir.to_str().unwrap();
    for args in [&["copy", src, dst][..], &["salvage", src, dst]] {
        let o = env.uwf(args);
        assert_eq!(code(&o), Some(1), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("holds other files (important.txt)"),
            "{args:?}: {}",
            stderr(&o)
        );
        assert_eq!(entries(&dir), ["important.txt"], "{args:?}");
        assert_eq!(
            std::fs::read_to_string(dir.join("important.txt")).unwrap(),
            "keep"
        );
    }
    // A file in place of the destination directory.
    let file = env.path("a-file");
    std::fs::write(&file, "keep").unwrap();
    let o = env.uwf(&["copy", src, file.to_str().unwrap()]);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("not a directory"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
    // An empty directory, or a new one, is fine.
    let empty = env.path("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = env.uwf(&["copy", src, empty.to_str().unwrap()]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(entries(&empty).contains(&"data.mdb".to_owned()));
    std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o700)).unwrap();
}

/// The peak resident memory of a process, from /proc (kB).
fn peak_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[test]
fn an_absurd_batch_count_is_refused_and_a_large_one_is_not_allocated() {
    let env = Cli::new(TestBackend::Lmdb);
    let o = env.uwf(&[
        "batch",
        "examples/review.yaml",
        "-n",
        "999999999999",
        "-p",
        "x",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("at most 100000000"), "{}", stderr(&o));
    assert!(!env.location().exists(), "nothing was created");
    // The largest count allowed starts at once, in memory that does not
    // grow with the count (it allocated 2.3 GB before its first thread).
    let mut child = env.spawn(&[
        "batch",
        "examples/review.yaml",
        "-n",
        "100000000",
        "-p",
        "x",
        "--jobs",
        "2",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    let pid = child.id();
    let mut peak = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut started = false;
    while std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
        peak = peak.max(peak_kb(pid).unwrap_or(0));
        let list = env.uwf(&["--json", "thread", "list", "--limit", "5"]);
        if code(&list) == Some(0) && json_of(&list).as_array().is_some_and(|a| a.len() >= 5) {
            started = true;
            break;
        }
    }
    peak = peak.max(peak_kb(pid).unwrap_or(0));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let _ = child.wait();
    assert!(started, "the batch started threads");
    assert!(peak > 0, "the peak was read");
    assert!(peak < 100 * 1024, "peak {peak} kB");
}

#[test]
fn a_store_this_user_may_only_read_can_be_read() {
    let env = Cli::new(TestBackend::Lmdb);
    let (store, id) = store_and_thread(&env);
    if !root_or_say("run the binary as another user") {
        return;
    }
    // `nobody` may read the store's files, not write them.
    let open = |p: &Path, mode| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode));
    for dir in store.ancestors().take_while(|d| *d != Path::new("/tmp")) {
        open(dir, 0o755).unwrap();
    }
    for entry in std::fs::read_dir(&store).unwrap() {
        open(&entry.unwrap().path(), 0o644).unwrap();
    }
    let before = std::fs::read(store.join("data.mdb")).unwrap();
    let as_nobody = |args: &[&str]| {
        use std::os::unix::process::CommandExt;
        let mut c = env.std_cmd();
        c.uid(65534).gid(65534).env("HOME", "/nonexistent");
        c.args(args).output().unwrap()
    };
    for args in [
        &["verify"][..],
        &["thread", "list"],
        &["thread", "show", &id],
        &["thread", "log", &id],
        &["export", &id],
        &["stats"],
    ] {
        let o = as_nobody(args);
        assert_eq!(code(&o), Some(0), "{args:?}: {}", stderr(&o));
    }
    assert!(stdout(&as_nobody(&["thread", "list"])).contains(&id));
    assert_eq!(&as_nobody(&["export", &id]).stdout[..8], b"UWFBNDL1");
    for args in [
        &["thread", "start", "examples/review.yaml", "-p", "t"][..],
        &["gc"],
        &["thread", "label", &id, "k=v"],
    ] {
        let o = as_nobody(args);
        assert_eq!(code(&o), Some(1), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("open read-only (this user may not write"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    assert_eq!(std::fs::read(store.join("data.mdb")).unwrap(), before);
    open(&store, 0o700).unwrap();
}

/// `uwf-db --store STORE ARGS` in a mount namespace where the store's
/// directory is a read-only bind mount of itself.
fn on_read_only_fs(store: &Path, args: &[&str]) -> std::process::Output {
    let dir = store.to_str().unwrap();
    let mut c = std::process::Command::new("unshare");
    c.args(["-m", "sh", "-c"])
        .arg(
            "mount --bind \"$1\" \"$1\" && mount -o remount,bind,ro \"$1\" && shift && exec \"$@\"",
        )
        .arg("sh")
        .arg(dir)
        .arg(BIN)
        .arg("--store")
        .arg(dir)
        .args(args)
        .env_remove("UWF_STORE")
        .current_dir(root());
    c.output().unwrap()
}

/// Whether [`on_read_only_fs`] works here (else it says why, and fails
/// the test when the user is root).
fn read_only_fs_works(store: &Path) -> bool {
    let probe = on_read_only_fs(store, &["--version"]);
    if code(&probe) != Some(0) {
        eprintln!("unshare -m failed: {}", stderr(&probe));
        assert!(
            !root_or_say("make a mount namespace"),
            "root, and no namespace"
        );
        return false;
    }
    true
}

#[test]
fn a_store_on_a_read_only_file_system_can_be_read() {
    let env = Cli::new(TestBackend::Lmdb);
    let (store, id) = store_and_thread(&env);
    let on_rofs = |args: &[&str]| on_read_only_fs(&store, args);
    if !read_only_fs_works(&store) {
        return;
    }
    for args in [
        &["verify"][..],
        &["thread", "list"],
        &["thread", "show", &id],
        &["thread", "log", &id],
        &["export", &id],
    ] {
        let o = on_rofs(args);
        assert_eq!(code(&o), Some(0), "{args:?}: {}", stderr(&o));
    }
    let o = on_rofs(&["thread", "start", "examples/review.yaml", "-p", "t"]);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("open read-only (its file system is read-only)"),
        "{}",
        stderr(&o)
    );
}

/// A store made before the `labels` table (the format-1 fixture, with
/// its threads) on a read-only file system: the open cannot add the
/// table, which failed every command ("cannot create the store's
/// databases"); the missing table now reads as empty.
#[test]
fn an_old_store_on_a_read_only_file_system_can_be_read() {
    let env = Cli::new(TestBackend::Lmdb);
    let store = env.path("v1-store");
    std::fs::create_dir_all(&store).unwrap();
    let fixture = root().join("tests/fixtures/v1-store/data.mdb");
    std::fs::copy(&fixture, store.join("data.mdb")).unwrap();
    if !read_only_fs_works(&store) {
        return;
    }
    let o = on_read_only_fs(&store, &["--json", "thread", "list"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(json_of(&o).as_array().unwrap().len(), 6, "{}", stdout(&o));
    let o = on_read_only_fs(&store, &["thread", "list", "--label", "k=v"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let o = on_read_only_fs(&store, &["verify"]);
    assert_eq!(code(&o), Some(0), "{}", stdout(&o));
    // Untouched: still without the table.
    assert_eq!(
        std::fs::read(store.join("data.mdb")).unwrap(),
        std::fs::read(&fixture).unwrap()
    );
}

/// The admin URL's server with another database name.
#[cfg(feature = "postgres")]
fn postgres_url_of(database: &str) -> String {
    let admin = std::env::var("UWF_TEST_POSTGRES")
        .unwrap_or_else(|_| common::backend::DEFAULT_POSTGRES.to_owned());
    let (server, _) = admin.rsplit_once('/').unwrap();
    format!("{server}/{database}")
}

#[cfg(feature = "postgres")]
#[test]
fn a_postgres_error_says_what_the_server_said() {
    if !common::backend::postgres_available() {
        return;
    }
    let url = postgres_url_of("uwf_no_such_database_18");
    let o = std::process::Command::new(BIN)
        .args(["--store", &url, "thread", "list"])
        .env_remove("UWF_STORE")
        .output()
        .unwrap();
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("FATAL 3D000"), "{err}");
    assert!(
        err.contains("database \"uwf_no_such_database_18\" does not exist"),
        "{err}"
    );
    // The command that makes it, with the URL's host, port and user.
    let cfg: ::postgres::Config = url.parse().unwrap();
    let host = match &cfg.get_hosts()[0] {
        ::postgres::config::Host::Tcp(h) => h.clone(),
        ::postgres::config::Host::Unix(p) => p.display().to_string(),
    };
    let mut expected = format!("create the database first: createdb -h {host}");
    if let Some(port) = cfg.get_ports().first() {
        expected.push_str(&format!(" -p {port}"));
    }
    if let Some(user) = cfg.get_user() {
        expected.push_str(&format!(" -U {user}"));
    }
    expected.push_str(" uwf_no_such_database_18\n");
    assert!(err.contains(&expected), "{expected:?} not in {err}");
    assert!(!err.contains("transaction"), "no transaction began: {err}");
}

#[cfg(feature = "postgres")]
#[test]
fn a_terminated_connection_is_named_not_a_bare_db_error() {
    if !common::backend::postgres_available() {
        return;
    }
    let env = Cli::new(TestBackend::Postgres);
    let url = env.location().arg_str();
    let (_, database) = url.rsplit_once('/').unwrap();
    let database = database.to_owned();
    let o = env.uwf(&["init"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let child = env.spawn(&[
        "batch",
        "examples/review.yaml",
        "-n",
        "400",
        "-p",
        "t",
        "--jobs",
        "4",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    let mut admin =
        ::postgres::Client::connect(&postgres_url_of("postgres"), ::postgres::NoTls).unwrap();
    let mut killed = 0;
    for _ in 0..20 {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let rows = admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = $1 AND pid <> pg_backend_pid()",
                &[&database],
            )
            .unwrap();
        killed += rows.len();
        if killed >= 8 {
            break;
        }
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(killed > 0, "no connection was terminated");
    assert!(
        err.contains("57P01") || err.contains("the connection was lost"),
        "the errors name what happened: {err}"
    );
    assert!(
        !err.lines().any(|l| l.trim_end().ends_with(": db error")),
        "a bare 'db error': {err}"
    );
    // The batch went on past the lost connections (new ones), and left no
    // thread `running` behind it.
    assert_eq!(out.status.code(), Some(1), "some threads stopped: {err}");
    let running = env.json(&["thread", "list", "--status", "running"]);
    assert_eq!(running.as_array().map(Vec::len), Some(0), "{running}");
    let completed = env.json(&["thread", "list", "--status", "completed", "--limit", "1000"]);
    assert!(
        completed.as_array().map_or(0, Vec::len) > 300,
        "the batch went on: {err}"
    );
    // What it committed is whole.
    env.verify_clean();
}

/// Every offset of `needle` in `hay`.
fn offsets(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    hay.windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect()
}

#[test]
fn a_flipped_byte_in_a_thread_record_is_damage_not_a_wrong_answer() {
    let env = Cli::new(TestBackend::Lmdb).without_final_verify();
    let (store, id) = store_and_thread(&env);
    env.verify_clean();
    // The record names its agent; LMDB may keep older copies of the page,
    // so every copy is changed: `review` → `reviek`.
    let data = store.join("data.mdb");
    let mut bytes = std::fs::read(&data).unwrap();
    let found = offsets(&bytes, b"review.scenario.yaml");
    assert!(!found.is_empty());
    for at in found {
        bytes[at + 5] = b'k';
    }
    std::fs::write(&data, &bytes).unwrap();
    let o = env.uwf(&["thread", "show", &id]);
    assert_eq!(code(&o), Some(3), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains("does not match its checksum"),
        "{}",
        stderr(&o)
    );
    assert!(!stdout(&o).contains("reviek"), "no wrong answer");
    let o = env.uwf(&["verify"]);
    assert_ne!(code(&o), Some(0), "{}", stdout(&o));
    assert!(
        format!("{}{}", stdout(&o), stderr(&o)).contains("does not match its checksum"),
        "{}{}",
        stdout(&o),
        stderr(&o)
    );
}

/// Issue 18, "a busy fleet still takes over quickly": a thread a killed
/// runner left `running` is taken over by a survivor within the orphan
/// check's period plus one of its threads, not after the survivor's whole
/// queue.
fn a_busy_runner_takes_over_a_dead_runners_thread_before_its_queue(b: TestBackend) {
    let env = Cli::new(b);
    let wf = env.file("two.yaml", common::TWO_ROLES);
    let o = env.uwf(&["workflow", "add", &wf]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    for i in 0..40 {
        let o = env.uwf(&["thread", "start", "two", "-p", &format!("queued {i}")]);
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    }
    // The survivor: one driver, 0.3 s a call, 2 calls a thread: its pass
    // over the 40 queued threads takes about 25 s.
    let survivor = env.spawn(&[
        "batch",
        "two",
        "--continue",
        "--wait",
        "--jobs",
        "1",
        "--agent",
        "cmd:sh -c 'sleep 0.3; echo done'",
    ]);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // A runner that started after the survivor listed its threads claims
    // one, waits in its agent, and is killed.
    let t = env.json(&["thread", "start", "two", "-p", "the victim's"]);
    let victim_thread = t["thread"].as_str().unwrap().to_owned();
    let mut victim = env
        .std_cmd()
        .args([
            "thread",
            "step",
            &victim_thread,
            "--agent",
            "cmd:sleep 3600",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    env.wait_until_running(&victim_thread);
    victim.kill().unwrap();
    victim.wait().unwrap();
    let killed = std::time::Instant::now();
    // Taken over and finished while the survivor's queue is far from done.
    let queued_left;
    loop {
        let status = env.show(&victim_thread)["status"].clone();
        if status == "completed" {
            let idle = env.json(&["thread", "list", "--status", "idle", "--limit", "100"]);
            queued_left = idle.as_array().map_or(0, Vec::len);
            break;
        }
        assert!(
            killed.elapsed() < std::time::Duration::from_secs(30),
            "not taken over 30 s after the kill: {status}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let took = killed.elapsed();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(survivor.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let _ = survivor.wait_with_output();
    eprintln!("taken over and finished {took:?} after the kill, {queued_left} queued threads left");
    assert!(
        queued_left >= 10,
        "the survivor finished its queue first ({queued_left} left, {took:?})"
    );
}

process_conformance!(a_busy_runner_takes_over_a_dead_runners_thread_before_its_queue);

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
    if std::fs::metadata("/proc/self").unwrap().uid() != 0 {
        eprintln!("NOT ROOT: this test cannot give a file to another user, and checked nothing");
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs as root: this test must run there"
        );
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

//! File modes of an LMDB store (issue 10, "File modes"): a new store's
//! directory is 0700 and its files 0600 whatever the umask, and lock files
//! are never opened through a symbolic link or when another user owns them.
#![cfg(feature = "cli")]

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use common::backend::TestBackend;
use common::cli::*;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// `uwf-db ARGS` on `store` under umask 000, from the package root.
fn uwf_umask0(store: &Path, args: &[&str]) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg("umask 000; exec \"$0\" \"$@\"")
        .arg(BIN)
        .arg("--store")
        .arg(store)
        .args(args)
        .env_remove("UWF_STORE")
        .current_dir(root())
        .output()
        .unwrap()
}

#[test]
fn a_new_store_is_private_whatever_the_umask() {
    let env = Cli::new(TestBackend::Lmdb);
    let store = env.location().lmdb_dir().to_path_buf();
    let o = uwf_umask0(
        &store,
        &[
            "run",
            "examples/review.yaml",
            "-p",
            "t",
            "--agent",
            "script:examples/review.scenario.yaml",
        ],
    );
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let o = uwf_umask0(&store, &["gc"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(mode(&store), 0o700);
    for file in ["data.mdb", "lock.mdb", "claims.lock", "gc.lock"] {
        assert_eq!(mode(&store.join(file)), 0o600, "{file}");
    }
}

#[test]
fn an_old_loose_lock_file_is_tightened() {
    let env = Cli::new(TestBackend::Lmdb);
    let store = env.location().lmdb_dir().to_path_buf();
    env.json(&["init"]);
    let gc_lock = store.join("gc.lock");
    std::fs::write(&gc_lock, "").unwrap();
    std::fs::set_permissions(&gc_lock, std::fs::Permissions::from_mode(0o666)).unwrap();
    env.json(&["gc"]);
    assert_eq!(mode(&gc_lock), 0o600);
}

#[test]
fn a_lock_file_that_is_a_symlink_is_refused() {
    let env = Cli::new(TestBackend::Lmdb);
    let store = env.location().lmdb_dir().to_path_buf();
    let t = env.json(&["thread", "start", "examples/review.yaml", "-p", "t"]);
    let id = t["thread"].as_str().unwrap().to_owned();
    // Another user, say, swapped the lock files for links to a file of
    // the owner's.
    let victim = env.path("victim");
    std::fs::write(&victim, "precious").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
    for name in ["gc.lock", "claims.lock"] {
        let _ = std::fs::remove_file(store.join(name));
        std::os::unix::fs::symlink(&victim, store.join(name)).unwrap();
    }
    let o = env.uwf(&["gc"]);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("symbolic link"), "{}", stderr(&o));
    assert!(stderr(&o).contains("gc.lock"), "{}", stderr(&o));
    let o = env.uwf(&[
        "thread",
        "step",
        &id,
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("symbolic link"), "{}", stderr(&o));
    assert!(stderr(&o).contains("claims.lock"), "{}", stderr(&o));
    // The file behind the links is untouched, and so is the thread.
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert_eq!(
        mode(&victim),
        0o644,
        "its mode was not tightened through the link"
    );
    // Even a read that probes claims refuses the link.
    let o = env.uwf(&["thread", "show", &id]);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("symbolic link"), "{}", stderr(&o));
    for name in ["gc.lock", "claims.lock"] {
        std::fs::remove_file(store.join(name)).unwrap();
    }
    assert_eq!(env.show(&id)["seq"], 0);
}

#[test]
fn a_lock_file_another_user_owns_is_refused() {
    if nix_is_not_root() {
        return;
    }
    let env = Cli::new(TestBackend::Lmdb);
    let store = env.location().lmdb_dir().to_path_buf();
    env.json(&["init"]);
    let gc_lock = store.join("gc.lock");
    std::fs::write(&gc_lock, "").unwrap();
    // `nobody`: only root can give a file away, which is why the test
    // needs it.
    std::os::unix::fs::chown(&gc_lock, Some(65534), Some(65534)).unwrap();
    let o = env.uwf(&["gc"]);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("another user owns"), "{}", stderr(&o));
    assert_eq!(std::fs::metadata(&gc_lock).unwrap().uid(), 65534);
    std::fs::remove_file(&gc_lock).unwrap();
}

/// Whether the test runs without root (then it cannot chown, and says so).
fn nix_is_not_root() -> bool {
    let not_root = std::fs::metadata("/proc/self")
        .map(|m| m.uid() != 0)
        .unwrap_or(true);
    if not_root {
        eprintln!("not root: the test of a lock file another user owns did not run");
    }
    not_root
}

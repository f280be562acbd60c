//! A full disk is reported as a full disk (issue 10): a batch and a run
//! on a store whose file system fills up say "no space left", never a bare
//! "Input/output error" (LMDB's word for a short write), change nothing
//! they did not acknowledge, and the store verifies afterwards.
//!
//! The file system is a 600 KiB tmpfs mounted for the test, which needs
//! root (CI runs as root); without it the test says loudly that it did not
//! run.
#![cfg(feature = "cli")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::cli::*;

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?.keep();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn uwf_at(store: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_uwf-db"))
        .arg("--store")
        .arg(store)
        .args(args)
        .env_remove("UWF_STORE")
        .current_dir(root())
        .output()
        .unwrap()
}

#[test]
fn a_full_disk_is_reported_as_a_full_disk() {
    let Some(fs) = Tmpfs::mount("600k") else {
        eprintln!(
            "!!! NOT RUN: a_full_disk_is_reported_as_a_full_disk needs root to mount a tmpfs"
        );
        assert!(
            std::env::var_os("CI").is_none() || !nix::unistd::Uid::effective().is_root(),
            "running as root under CI, but mounting a tmpfs failed"
        );
        return;
    };
    let store = fs.0.join("store");
    let o = uwf_at(&store, &["init"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let prompt = "x".repeat(20_000);
    let o = uwf_at(
        &store,
        &[
            "batch",
            "examples/review.yaml",
            "-n",
            "200",
            "-p",
            &prompt,
            "--agent",
            "script:examples/review.scenario.yaml",
        ],
    );
    let err = stderr(&o);
    assert!(err.contains("no space left on the disk holding"), "{err}");
    assert!(!err.contains("Input/output error"), "{err}");
    assert!(err.contains("the store is full"), "{err}");
    // Said once for the batch, not once per thread.
    assert_eq!(err.matches("the store is full").count(), 1, "{err}");
    let o = uwf_at(&store, &["verify"]);
    assert_eq!(code(&o), Some(0), "{}", stdout(&o));

    // A single run into the full store fails the same way, and says so.
    let big = "y".repeat(100_000);
    let o = uwf_at(
        &store,
        &[
            "run",
            "examples/review.yaml",
            "-p",
            &big,
            "--agent",
            "script:examples/review.scenario.yaml",
        ],
    );
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("no space left on the disk holding") || err.contains("is full"),
        "{err}"
    );
    assert!(!err.contains("Input/output error"), "{err}");
    let o = uwf_at(&store, &["verify"]);
    assert_eq!(code(&o), Some(0), "{}", stdout(&o));
}

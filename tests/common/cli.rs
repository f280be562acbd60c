//! The one harness for tests that run the real `uwf-db` binary.
//!
//! A [`Cli`] is a store of some backend that does not exist yet (commands
//! that write create it) plus a scratch directory for the test's files.
//! Every invocation goes through [`Cli::cmd`]: `--store` set, `UWF_STORE`
//! removed, run from the package root so `examples/…` paths resolve. When a
//! `Cli` is dropped after a test that did not panic, `uwf-db verify` must
//! pass on its store.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};

use uwf_db::{Durability, Store};

use super::backend::{Location, TestBackend};

pub const BIN: &str = env!("CARGO_BIN_EXE_uwf-db");

/// The package root: where `examples/` and `tests/fixtures/` are.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub struct Cli {
    location: Location,
    verify_on_drop: bool,
}

impl Cli {
    /// A not-yet-created store of backend `b`.
    pub fn new(b: TestBackend) -> Cli {
        Cli {
            location: b.location(),
            verify_on_drop: true,
        }
    }

    /// For a test that damages its store on purpose: no `verify` on drop.
    pub fn without_final_verify(mut self) -> Cli {
        self.verify_on_drop = false;
        self
    }

    pub fn location(&self) -> &Location {
        &self.location
    }

    /// The `--store` value.
    pub fn store_arg(&self) -> std::ffi::OsString {
        self.location.arg()
    }

    /// A library handle on the same store (durable, as the CLI's default).
    pub fn open_store(&self) -> Store {
        self.location.open(Durability::Sync)
    }

    /// The scratch directory for the test's own files.
    pub fn scratch(&self) -> &Path {
        self.location.scratch()
    }

    /// A path in the scratch directory (the file is not created).
    pub fn path(&self, name: &str) -> PathBuf {
        self.scratch().join(name)
    }

    /// Writes `text` to `name` in the scratch directory; returns its path.
    pub fn file(&self, name: &str, text: &str) -> String {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_owned()
    }

    /// `uwf-db --store STORE`, ready for arguments.
    pub fn cmd(&self) -> assert_cmd::Command {
        assert_cmd::Command::from_std(self.std_cmd())
    }

    /// The same command as a `std::process::Command`, for runs in the
    /// background.
    pub fn std_cmd(&self) -> std::process::Command {
        let mut c = std::process::Command::new(BIN);
        c.arg("--store")
            .arg(self.store_arg())
            .env_remove("UWF_STORE")
            // Logs and traces only where a test asks for them.
            .env_remove("RUST_LOG")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .current_dir(root());
        c
    }

    /// Runs `uwf-db ARGS` with empty stdin.
    pub fn uwf(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }

    /// Runs `uwf-db ARGS` with `input` on stdin.
    pub fn uwf_stdin(&self, args: &[&str], input: &[u8]) -> Output {
        self.cmd()
            .args(args)
            .write_stdin(input.to_vec())
            .output()
            .unwrap()
    }

    /// Runs `uwf-db --json ARGS`, asserts success, parses stdout.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let o = self.uwf(&all);
        assert!(
            o.status.success(),
            "{args:?}: exit {:?}: {}",
            o.status.code(),
            stderr(&o)
        );
        let value = serde_json::from_slice(&o.stdout).unwrap();
        super::contract::check_answer(args, &value);
        value
    }

    /// Starts `uwf-db ARGS` in the background (stdout discarded, stderr
    /// piped).
    pub fn spawn(&self, args: &[&str]) -> Child {
        self.std_cmd()
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// `thread show ID` as JSON.
    pub fn show(&self, id: &str) -> serde_json::Value {
        self.json(&["thread", "show", id])
    }

    /// Waits (at most 20 s, else panics) until `thread show ID` says
    /// `running`: a driver started in the background holds the thread.
    pub fn wait_until_running(&self, id: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while self.show(id)["status"] != "running" {
            assert!(
                std::time::Instant::now() < deadline,
                "no driver claimed thread {id}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// The whole `thread log ID` (up to 1000 entries), newest first.
    pub fn log(&self, id: &str) -> Vec<serde_json::Value> {
        self.json(&["thread", "log", id, "--limit", "1000"])
            .as_array()
            .unwrap()
            .clone()
    }

    /// `uwf-db verify` exits 0.
    pub fn verify_clean(&self) {
        let o = self.uwf(&["verify"]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "verify: {}{}",
            stdout(&o),
            stderr(&o)
        );
    }
}

impl Drop for Cli {
    fn drop(&mut self) {
        if self.verify_on_drop && !std::thread::panicking() && self.location.exists() {
            self.verify_clean();
        }
    }
}

/// Exit code, `None` when killed by a signal.
pub fn code(o: &Output) -> Option<i32> {
    o.status.code()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Parses stdout as JSON after asserting success.
pub fn json_of(o: &Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        stderr(o)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Parses stdout as JSON Lines.
pub fn json_lines(o: &Output) -> Vec<serde_json::Value> {
    stdout(o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// One step of a `script:` agent scenario: `role` answers with frontmatter
/// `front` (YAML lines) and `body`.
pub fn scenario_step(role: &str, front: &str, body: &str) -> String {
    format!(
        "  - role: {role}\n    output: |\n      ---\n{}      ---\n      {body}\n",
        front
            .lines()
            .map(|l| format!("      {l}\n"))
            .collect::<String>()
    )
}

/// A scenario of `(role, frontmatter)` steps, each answering "ROLE answered".
pub fn review_scenario(steps: &[(&str, &str)]) -> String {
    let mut s = String::from("steps:\n");
    for (role, front) in steps {
        s.push_str(&scenario_step(role, front, &format!("{role} answered")));
    }
    s
}

/// The developer's frontmatter in `examples/review.yaml`.
pub const DEV: &str = "$status: review_needed";
/// The reviewer's approval in `examples/review.yaml`.
pub const OK: &str = "$status: approved";

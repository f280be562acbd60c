//! Journey tests for the store commands through the real binary: `init`,
//! `stats`, `cas put/get/has/refs/walk`, `verify`, exit codes for bad usage,
//! a writer and a reader process sharing a store, and a closed pipe.
#![cfg(feature = "cli")]

mod common;

use std::process::{Command, Stdio};

use common::backend::TestBackend;
use common::cli::*;

fn init_is_idempotent_and_read_commands_need_a_store(b: TestBackend) {
    let cli = Cli::new(b);
    let o = cli.uwf(&["stats"]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("uwf-db init"), "{}", stderr(&o));
    assert!(!cli.location().exists());

    let o = cli.uwf(&["--json", "init"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["created"], true);
    assert_eq!(v["format_version"], 1);
    let o = cli.uwf(&["--json", "init"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["created"], false);

    let o = cli.uwf(&["--json", "stats"]);
    assert_eq!(code(&o), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["blob_count"], 0);
    assert_eq!(v["active_threads"], 0);
    assert_eq!(v["ended_threads"], 0);
    assert_eq!(v["durability"], "sync");
    let o = cli.uwf(&["--durability", "none", "stats"]);
    assert!(stdout(&o).contains("NOT durable"), "{}", stdout(&o));
    // LMDB's file, map and reader table are shown for LMDB only.
    let text = stdout(&cli.uwf(&["stats"]));
    let lmdb_lines = ["file size", "map ", "readers"].map(|l| text.contains(l));
    match b {
        TestBackend::Lmdb => assert_eq!(lmdb_lines, [true; 3], "{text}"),
        _ => {
            assert_eq!(lmdb_lines, [false; 3], "{text}");
            assert!(text.contains("flushed by the server"), "{text}");
        }
    }
}

fn put_then_get_raw_hashes_to_the_hash(b: TestBackend) {
    let cli = Cli::new(b);
    let o = cli.uwf_stdin(&["cas", "put", "-"], "hello, wörld\n".as_bytes());
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let hash = stdout(&o).trim().to_owned();
    assert_eq!(hash.len(), 64);

    let raw = cli.uwf(&["cas", "get", "--raw", &hash]);
    assert_eq!(code(&raw), Some(0));
    assert_eq!(blake3::hash(&raw.stdout).to_hex().as_str(), hash);

    // A prefix works and the readable form shows the text.
    let o = cli.uwf(&["cas", "get", &hash[..8]]);
    assert_eq!(code(&o), Some(0));
    assert!(stdout(&o).contains("hello, wörld"));
    assert!(stdout(&o).contains("content"));

    let o = cli.uwf(&["--json", "cas", "get", &hash[..10]]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["hash"], hash.as_str());
    assert_eq!(v["kind"], "content");
    assert_eq!(v["payload"], "hello, wörld\n");

    // Putting the same text again gives the same hash and no new blob.
    let file = cli.path("same.txt");
    std::fs::write(&file, "hello, wörld\n").unwrap();
    let o = cli.uwf(&["--json", "cas", "put", file.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["hash"], hash.as_str());
    assert_eq!(v["new"], false);

    let o = cli.uwf(&["cas", "has", &hash[..6]]);
    assert_eq!(code(&o), Some(0));
    assert_eq!(stdout(&o).trim(), hash);
    let o = cli.uwf(&["cas", "has", "000000"]);
    assert_eq!(code(&o), Some(1));
}

fn non_utf8_input_is_refused_and_nothing_is_stored(b: TestBackend) {
    let cli = Cli::new(b);
    cli.uwf(&["init"]);
    let bad = cli.path("bad.bin");
    std::fs::write(&bad, b"ok so far \xff\xfe").unwrap();
    let o = cli.uwf(&["cas", "put", bad.to_str().unwrap()]);
    assert_eq!(code(&o), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("not UTF-8") && err.contains("offset 10"),
        "{err}"
    );
    let o = cli.uwf(&["--json", "stats"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["blob_count"], 0);
}

fn bad_usage_exits_2_and_unknown_hashes_exit_1(b: TestBackend) {
    let cli = Cli::new(b);
    cli.uwf(&["init"]);
    let o = cli.uwf(&["cas", "get", "xyz"]);
    assert_eq!(code(&o), Some(2));
    let o = cli.uwf(&["cas", "get", "12345"]);
    assert_eq!(code(&o), Some(2), "a 5-character prefix is too short");
    assert!(stderr(&o).contains("at least 6"));
    let o = cli.uwf(&["cas", "get", "abcdef"]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("no blob matches 'abcdef'"),
        "{}",
        stderr(&o)
    );
    let o = cli.uwf(&["no-such-command"]);
    assert_eq!(code(&o), Some(2));
    let o = cli.uwf(&["cas", "put", "/definitely/not/here"]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("/definitely/not/here"));
}

fn refs_walk_and_verify_through_the_binary(b: TestBackend) {
    let cli = Cli::new(b);
    let (leaf, root) = {
        let store = cli.open_store();
        let leaf = store.put(&uwf_db::Blob::content("leaf", [])).unwrap();
        let mid = store.put(&uwf_db::Blob::content("mid", [leaf])).unwrap();
        let root = store
            .put(&uwf_db::Blob::content("root", [mid, leaf]))
            .unwrap();
        (leaf, root)
    };
    let o = cli.uwf(&["cas", "refs", &root.to_string()]);
    assert_eq!(code(&o), Some(0));
    assert_eq!(stdout(&o).lines().count(), 2);

    let o = cli.uwf(&["--json", "cas", "walk", &root.to_string()[..8]]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "root, mid, leaf once each");
    assert_eq!(lines[0]["hash"], root.to_string().as_str());
    assert!(lines.iter().any(|l| l["hash"] == leaf.to_string().as_str()));

    let o = cli.uwf(&["verify"]);
    assert_eq!(code(&o), Some(0), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("verified 3 blobs, 3 refs and 0 index entries: ok"),
        "{}",
        stdout(&o)
    );
}

fn a_writer_process_and_a_reader_process_share_the_store(b: TestBackend) {
    let cli = Cli::new(b);
    let o = cli.uwf_stdin(&["cas", "put", "-"], b"seed");
    let seed = stdout(&o).trim().to_owned();

    // Process 1: one blob per `uwf-db cas put`, durable, in a loop.
    let script = r#"i=0; while [ $i -lt 150 ]; do echo "blob $i" | "$0" --store "$1" cas put - >/dev/null || exit 1; i=$((i+1)); done"#;
    let mut writer = Command::new("sh")
        .args(["-c", script, BIN, &cli.location().arg_str()])
        .spawn()
        .unwrap();

    // Process 2 (and more): verify and get, repeatedly, while it writes.
    let mut rounds = 0;
    loop {
        let done = writer.try_wait().unwrap();
        let v = cli.uwf(&["verify"]);
        assert_eq!(code(&v), Some(0), "verify: {}{}", stdout(&v), stderr(&v));
        let g = cli.uwf(&["cas", "get", "--raw", &seed]);
        assert_eq!(code(&g), Some(0), "{}", stderr(&g));
        assert_eq!(g.stdout, {
            let b = uwf_db::Blob::content("seed", []).encode().unwrap();
            b.bytes().to_vec()
        });
        rounds += 1;
        if let Some(status) = done {
            assert!(status.success(), "writer failed");
            break;
        }
    }
    assert!(rounds >= 2, "the reader ran while the writer wrote");
    let o = cli.uwf(&["--json", "stats"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["blob_count"], 151);
}

fn a_closed_pipe_is_not_an_error(b: TestBackend) {
    let cli = Cli::new(b);
    let big = "line\n".repeat(200_000);
    let o = cli.uwf_stdin(&["cas", "put", "-"], big.as_bytes());
    let hash = stdout(&o).trim().to_owned();
    // Read a few bytes, then close the pipe as `| head` would.
    let mut child = cli
        .std_cmd()
        .args(["cas", "get", &hash])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    use std::io::Read;
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    drop(child.stdout.take());
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(0), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

process_conformance!(
    init_is_idempotent_and_read_commands_need_a_store,
    put_then_get_raw_hashes_to_the_hash,
    non_utf8_input_is_refused_and_nothing_is_stored,
    bad_usage_exits_2_and_unknown_hashes_exit_1,
    refs_walk_and_verify_through_the_binary,
    a_writer_process_and_a_reader_process_share_the_store,
    a_closed_pipe_is_not_an_error,
);

/// A PostgreSQL URL naming a database that does not exist: the server's
/// own words reach the user (they hide in the driver error's source).
#[cfg(feature = "postgres")]
#[test]
fn a_missing_postgres_database_is_named_with_the_servers_message() {
    if !TestBackend::Postgres.available() {
        return;
    }
    let admin = std::env::var("UWF_TEST_POSTGRES")
        .unwrap_or_else(|_| common::backend::DEFAULT_POSTGRES.to_owned());
    let (server, _) = admin.rsplit_once('/').unwrap();
    let url = format!("{server}/uwf_no_such_database");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_uwf-db"))
        .args(["--store", &url, "stats"])
        .env_remove("UWF_STORE")
        .output()
        .unwrap();
    assert_eq!(code(&o), Some(1));
    let err = stderr(&o);
    assert!(err.contains("uwf_no_such_database"), "{err}");
    assert!(
        err.contains("caused by:") && err.contains("does not exist"),
        "{err}"
    );
}

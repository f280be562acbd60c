//! Journey tests: the real `uwf-db` binary in a temporary store.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_uwf-db");

fn uwf(store: &Path, args: &[&str]) -> Output {
    uwf_stdin(store, args, b"")
}

fn uwf_stdin(store: &Path, args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(BIN)
        .arg("--store")
        .arg(store)
        .args(args)
        .env_remove("UWF_STORE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run uwf-db");
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

#[test]
fn init_is_idempotent_and_read_commands_need_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s");
    let o = uwf(&store, &["stats"]);
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("uwf-db init"), "{}", stderr(&o));
    assert!(!store.exists());

    let o = uwf(&store, &["--json", "init"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["created"], true);
    assert_eq!(v["format_version"], 1);
    let o = uwf(&store, &["--json", "init"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["created"], false);

    let o = uwf(&store, &["--json", "stats"]);
    assert_eq!(code(&o), 0);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["blob_count"], 0);
    assert_eq!(v["active_threads"], 0);
    assert_eq!(v["ended_threads"], 0);
    assert_eq!(v["durability"], "sync");
    let o = uwf(&store, &["--durability", "none", "stats"]);
    assert!(stdout(&o).contains("NOT durable"), "{}", stdout(&o));
}

#[test]
fn put_then_get_raw_hashes_to_the_hash() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path();
    let o = uwf_stdin(store, &["cas", "put", "-"], "hello, wörld\n".as_bytes());
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let hash = stdout(&o).trim().to_owned();
    assert_eq!(hash.len(), 64);

    let raw = uwf(store, &["cas", "get", "--raw", &hash]);
    assert_eq!(code(&raw), 0);
    assert_eq!(blake3::hash(&raw.stdout).to_hex().as_str(), hash);

    // A prefix works and the readable form shows the text.
    let o = uwf(store, &["cas", "get", &hash[..8]]);
    assert_eq!(code(&o), 0);
    assert!(stdout(&o).contains("hello, wörld"));
    assert!(stdout(&o).contains("content"));

    let o = uwf(store, &["--json", "cas", "get", &hash[..10]]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["hash"], hash.as_str());
    assert_eq!(v["kind"], "content");
    assert_eq!(v["payload"], "hello, wörld\n");

    // Putting the same text again gives the same hash and no new blob.
    let file = dir.path().join("same.txt");
    std::fs::write(&file, "hello, wörld\n").unwrap();
    let o = uwf(store, &["--json", "cas", "put", file.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["hash"], hash.as_str());
    assert_eq!(v["new"], false);

    let o = uwf(store, &["cas", "has", &hash[..6]]);
    assert_eq!(code(&o), 0);
    assert_eq!(stdout(&o).trim(), hash);
    let o = uwf(store, &["cas", "has", "000000"]);
    assert_eq!(code(&o), 1);
}

#[test]
fn non_utf8_input_is_refused_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path();
    uwf(store, &["init"]);
    let bad = dir.path().join("bad.bin");
    std::fs::write(&bad, b"ok so far \xff\xfe").unwrap();
    let o = uwf(store, &["cas", "put", bad.to_str().unwrap()]);
    assert_eq!(code(&o), 1);
    let err = stderr(&o);
    assert!(
        err.contains("not UTF-8") && err.contains("offset 10"),
        "{err}"
    );
    let o = uwf(store, &["--json", "stats"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["blob_count"], 0);
}

#[test]
fn bad_usage_exits_2_and_unknown_hashes_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path();
    uwf(store, &["init"]);
    let o = uwf(store, &["cas", "get", "xyz"]);
    assert_eq!(code(&o), 2);
    let o = uwf(store, &["cas", "get", "12345"]);
    assert_eq!(code(&o), 2, "a 5-character prefix is too short");
    assert!(stderr(&o).contains("at least 6"));
    let o = uwf(store, &["cas", "get", "abcdef"]);
    assert_eq!(code(&o), 1);
    assert!(
        stderr(&o).contains("no blob matches 'abcdef'"),
        "{}",
        stderr(&o)
    );
    let o = uwf(store, &["no-such-command"]);
    assert_eq!(code(&o), 2);
    let o = uwf(store, &["cas", "put", "/definitely/not/here"]);
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("/definitely/not/here"));
}

#[test]
fn refs_walk_and_verify_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path();
    let (leaf, root) = {
        let store = uwf_db::Store::open(store_dir, uwf_db::StoreOptions::default()).unwrap();
        let leaf = store.put(&uwf_db::Blob::content("leaf", [])).unwrap();
        let mid = store.put(&uwf_db::Blob::content("mid", [leaf])).unwrap();
        let root = store
            .put(&uwf_db::Blob::content("root", [mid, leaf]))
            .unwrap();
        (leaf, root)
    };
    let o = uwf(store_dir, &["cas", "refs", &root.to_string()]);
    assert_eq!(code(&o), 0);
    assert_eq!(stdout(&o).lines().count(), 2);

    let o = uwf(
        store_dir,
        &["--json", "cas", "walk", &root.to_string()[..8]],
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "root, mid, leaf once each");
    assert_eq!(lines[0]["hash"], root.to_string().as_str());
    assert!(lines.iter().any(|l| l["hash"] == leaf.to_string().as_str()));

    let o = uwf(store_dir, &["verify"]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    assert!(
        stdout(&o).contains("verified 3 blobs, 3 refs and 0 index entries: ok"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn a_writer_process_and_a_reader_process_share_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().to_path_buf();
    let o = uwf_stdin(&store, &["cas", "put", "-"], b"seed");
    let seed = stdout(&o).trim().to_owned();

    // Process 1: one blob per `uwf-db cas put`, durable, in a loop.
    let script = r#"i=0; while [ $i -lt 150 ]; do echo "blob $i" | "$0" --store "$1" cas put - >/dev/null || exit 1; i=$((i+1)); done"#;
    let mut writer = Command::new("sh")
        .args(["-c", script, BIN, store.to_str().unwrap()])
        .spawn()
        .unwrap();

    // Process 2 (and more): verify and get, repeatedly, while it writes.
    let mut rounds = 0;
    loop {
        let done = writer.try_wait().unwrap();
        let v = uwf(&store, &["verify"]);
        assert_eq!(code(&v), 0, "verify: {}{}", stdout(&v), stderr(&v));
        let g = uwf(&store, &["cas", "get", "--raw", &seed]);
        assert_eq!(code(&g), 0, "{}", stderr(&g));
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
    let o = uwf(&store, &["--json", "stats"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["blob_count"], 151);
}

#[test]
fn a_closed_pipe_is_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path();
    let big = "line\n".repeat(200_000);
    let o = uwf_stdin(store, &["cas", "put", "-"], big.as_bytes());
    let hash = stdout(&o).trim().to_owned();
    // Read a few bytes, then close the pipe as `| head` would.
    let mut child = Command::new(BIN)
        .args(["--store", store.to_str().unwrap(), "cas", "get", &hash])
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

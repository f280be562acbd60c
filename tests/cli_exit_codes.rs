//! Exit codes and messages through the real binary: `--json` into a closed
//! pipe, permission denied, map sizes out of range, zero counts and rounds,
//! and a batch whose store fills up.
#![cfg(feature = "cli")]

mod common;

use std::process::Stdio;

use common::backend::TestBackend;
use common::cli::*;

/// Runs `uwf-db ARGS` with stdout a pipe whose reader has already gone,
/// as in `uwf-db ... | head -0`: every write fails with EPIPE.
fn into_a_closed_pipe(cli: &Cli, args: &[&str]) -> std::process::Output {
    let (reader, writer) = nix::unistd::pipe().unwrap();
    drop(reader);
    cli.std_cmd()
        .args(args)
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

fn json_output_into_a_closed_pipe_exits_0(b: TestBackend) {
    let cli = Cli::new(b);
    // More JSON than the output buffer holds (8 KiB), so the write happens
    // inside the JSON encoder: 30 threads, and a 20 KB reply in one log.
    let o = cli.uwf(&[
        "batch",
        "examples/review.yaml",
        "-n",
        "30",
        "-p",
        "t",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let big = "x".repeat(20_000);
    let scenario = cli.file(
        "big.yaml",
        &format!("steps:\n{}", scenario_step("developer", DEV, &big)),
    );
    let t = cli.json(&["thread", "start", "examples/review.yaml", "-p", "t"]);
    let id = t["thread"].as_str().unwrap();
    cli.json(&[
        "thread",
        "step",
        id,
        "--agent",
        &format!("script:{scenario}"),
    ]);
    for args in [
        &["--json", "thread", "list"][..],
        &["--json", "thread", "log", id],
        &["thread", "list"],
    ] {
        let o = into_a_closed_pipe(&cli, args);
        assert_eq!(code(&o), Some(0), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).is_empty(), "{args:?}: {}", stderr(&o));
    }
}

fn zero_rounds_and_zero_counts_are_bad_usage(b: TestBackend) {
    let cli = Cli::new(b);
    for args in [
        &[
            "run",
            "examples/review.yaml",
            "-p",
            "t",
            "--max-rounds",
            "0",
        ][..],
        &[
            "thread",
            "start",
            "examples/review.yaml",
            "-p",
            "t",
            "--max-rounds",
            "0",
        ],
        &[
            "batch",
            "examples/review.yaml",
            "-n",
            "1",
            "-p",
            "t",
            "--agent",
            "script:examples/review.scenario.yaml",
            "--max-rounds",
            "0",
        ],
    ] {
        let o = cli.uwf(args);
        assert_eq!(code(&o), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("--max-rounds"), "{}", stderr(&o));
    }
    let t = cli.json(&["thread", "start", "examples/review.yaml", "-p", "t"]);
    let id = t["thread"].as_str().unwrap();
    for args in [
        &["--json", "thread", "step", id, "--count", "0"][..],
        &["--json", "thread", "resume", id, "--count", "0"],
        &[
            "--json",
            "batch",
            "examples/review.yaml",
            "-c",
            "0",
            "-p",
            "t",
        ],
    ] {
        let o = cli.uwf(args);
        assert_eq!(code(&o), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("at least 1"), "{}", stderr(&o));
    }
    assert_eq!(cli.show(id)["seq"], 0, "nothing ran");
}

process_conformance!(
    json_output_into_a_closed_pipe_exits_0,
    zero_rounds_and_zero_counts_are_bad_usage,
);

fn lmdb_cli() -> Cli {
    Cli::new(TestBackend::Lmdb)
}

#[test]
fn a_map_size_the_platform_cannot_map_is_refused() {
    let cli = lmdb_cli();
    assert_eq!(code(&cli.uwf(&["init"])), Some(0));
    // 2^64 - 1 once wrapped to 0 while being rounded up; 2^50 is more than
    // a 64-bit process can address.
    for size in ["18446744073709551615", "1048576TiB"] {
        let o = cli.uwf(&["--max-map-size", size, "stats"]);
        assert_eq!(code(&o), Some(1), "{size}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("cannot reserve") && stderr(&o).contains("--max-map-size"),
            "{size}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn a_maximum_below_the_data_files_size_names_the_size_in_force() {
    let cli = lmdb_cli();
    // About 2 MiB of data.
    let big: String = (0..200_000).map(|i| format!("{i:09}\n")).collect();
    let o = cli.uwf_stdin(&["cas", "put", "-"], big.as_bytes());
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let file = std::fs::metadata(std::path::PathBuf::from(cli.store_arg()).join("data.mdb"))
        .unwrap()
        .len();
    assert!(file > 1 << 20, "{file}");
    let o = cli.uwf(&["--max-map-size", "1MiB", "--json", "stats"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let v = json_of(&o);
    assert!(v["map_size"].as_u64().unwrap() >= file, "{v}");
    let o = cli.uwf(&["--max-map-size", "1MiB", "stats"]);
    assert!(
        stdout(&o).contains("below the data file's size"),
        "{}",
        stdout(&o)
    );
    // A write past the size in force names that size, not the 1 MiB asked.
    let more: String = (0..2_000_000).map(|i| format!("{i:09}\n")).collect();
    let o = cli.uwf_stdin(
        &["--max-map-size", "1MiB", "cas", "put", "-"],
        more.as_bytes(),
    );
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    let in_force = v["map_size"].as_u64().unwrap();
    assert!(
        stderr(&o).contains(&format!("maximum size of {in_force} bytes")),
        "{in_force}: {}",
        stderr(&o)
    );
}

#[test]
fn a_batch_whose_store_fills_up_stops_starting_threads_and_says_so_once() {
    let cli = lmdb_cli();
    let o = cli.uwf(&[
        "--max-map-size",
        "1MiB",
        "batch",
        "examples/review.yaml",
        "-n",
        "500",
        "-p",
        "t",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(
        err.matches("is full").count(),
        2,
        "once, then the summary: {err}"
    );
    assert!(err.contains("stopped starting threads"), "{err}");
    assert!(err.lines().count() <= 3, "{err}");
    // With room, the stopped threads can be driven on.
    let o = cli.uwf(&[
        "batch",
        "examples/review.yaml",
        "--continue",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
}

/// Root ignores file modes, so the denied user is `nobody`, through
/// `setpriv` (skipped where that cannot be done).
#[test]
fn permission_denied_says_so() {
    let cli = lmdb_cli();
    assert_eq!(code(&cli.uwf(&["init"])), Some(0));
    let store = std::path::PathBuf::from(cli.store_arg());
    let setpriv = std::path::Path::new("/usr/bin/setpriv");
    // /proc/self belongs to the process's effective user.
    let root = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) == 0;
    if !root || !setpriv.exists() {
        eprintln!("skipped: needs root and setpriv to run as another user");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    // `nobody` may reach the store's parent but not the store.
    let parent = store.parent().unwrap();
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o000)).unwrap();
    let o = std::process::Command::new(setpriv)
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN])
        .arg("--store")
        .arg(&store)
        .args(["thread", "list"])
        .env_remove("UWF_STORE")
        .output()
        .unwrap();
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("Permission denied"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("uwf-db init"), "{}", stderr(&o));
}

//! A damaged LMDB data file is reported, never a crash (issue 10): a file
//! shorter than its meta page says, or empty, is refused before it is
//! mapped, by every command, with a message that names the file, its size
//! and the size LMDB expects.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;

/// Commands that open the store: readers and writers.
const COMMANDS: &[&[&str]] = &[
    &["thread", "list"],
    &["verify"],
    &["stats"],
    &["gc"],
    &[
        "run",
        "examples/review.yaml",
        "-p",
        "t",
        "--agent",
        "script:examples/review.scenario.yaml",
    ],
];

fn assert_refused(env: &Cli, expect: &[&str]) {
    for args in COMMANDS {
        let o = env.uwf(args);
        // Exit 3 (the data file is damaged) with a message, not SIGBUS
        // (no exit code at all, or 135 from a shell).
        assert_eq!(code(&o), Some(3), "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains("data.mdb is damaged"), "{args:?}: {err}");
        for e in expect {
            assert!(err.contains(e), "{args:?}: {e} not in {err}");
        }
    }
}

#[test]
fn a_truncated_or_empty_data_file_is_refused_by_every_command() {
    let env = Cli::new(TestBackend::Lmdb).without_final_verify();
    env.json(&[
        "run",
        "examples/review.yaml",
        "-p",
        "t",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    let data = env.location().lmdb_dir().join("data.mdb");
    let whole = std::fs::read(&data).unwrap();
    assert!(whole.len() > 4 * 4096);

    // Cut to three pages: the meta pages survive, the rest is gone.
    std::fs::write(&data, &whole[..3 * 4096]).unwrap();
    let expected = format!("so LMDB expects at least {} bytes", whole.len());
    assert_refused(&env, &["it is 12288 bytes", &expected, "truncated"]);
    // Nothing was changed: the file is as it was left.
    assert_eq!(std::fs::metadata(&data).unwrap().len(), 3 * 4096);

    std::fs::write(&data, b"").unwrap();
    assert_refused(&env, &["it is empty (0 bytes)"]);

    // Garbage where the meta pages were.
    std::fs::write(&data, vec![0x5a; 3 * 4096]).unwrap();
    assert_refused(&env, &["neither of its two meta pages is valid"]);

    // Restored, the store is whole again.
    std::fs::write(&data, &whole).unwrap();
    let o = env.uwf(&["verify"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
}

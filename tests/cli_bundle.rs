//! Export and import (issue 12, SPEC §11) through the real binary, on
//! LMDB and PostgreSQL: a bundle moves threads (children included) into
//! another store whole; bundles are deterministic; a damaged bundle, or
//! one whose threads exist, is refused and the store is unchanged.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;

/// A store with a completed parent (ship) and its child (review); returns
/// the parent's id.
fn shipped(env: &Cli) -> String {
    let o = env.uwf(&["workflow", "add", "examples/review.yaml"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let r = env.json(&[
        "run",
        "examples/ship.yaml",
        "-p",
        "ship it",
        "--agent",
        "script:examples/ship.scenario.yaml",
    ]);
    r["thread"].as_str().unwrap().to_owned()
}

fn text_log(env: &Cli, id: &str) -> String {
    let o = env.uwf(&["thread", "log", id, "--limit", "1000"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    stdout(&o)
}

fn threads(env: &Cli) -> Vec<serde_json::Value> {
    env.json(&["thread", "list", "--limit", "1000"])
        .as_array()
        .unwrap()
        .clone()
}

fn export_then_import_gives_the_same_threads(b: TestBackend) {
    let src = Cli::new(b);
    let parent = shipped(&src);
    let bundle = src.path("ship.bundle");
    let o = src.uwf(&["export", &parent, "-o", bundle.to_str().unwrap()]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    // The same threads give the same bytes (to a file or to stdout).
    let bytes = std::fs::read(&bundle).unwrap();
    let o = src.uwf(&["export", &parent]);
    assert_eq!(code(&o), Some(0));
    assert_eq!(o.stdout, bytes, "deterministic");

    let dst = Cli::new(b);
    let o = dst.uwf(&["--json", "import", bundle.to_str().unwrap()]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let report = json_of(&o);
    assert_eq!(
        report["threads"].as_array().unwrap().len(),
        2,
        "the child came along"
    );
    dst.verify_clean();
    assert_eq!(text_log(&dst, &parent), text_log(&src, &parent));
    let child = threads(&src)
        .into_iter()
        .find(|t| !t["parent_thread"].is_null())
        .unwrap();
    let child = child["id"].as_str().unwrap();
    assert_eq!(text_log(&dst, child), text_log(&src, child));
    assert_eq!(dst.show(child)["parent_thread"], parent.as_str());
    // Exported again from the new store: the very same bytes.
    let o = dst.uwf(&["export", &parent]);
    assert_eq!(o.stdout, bytes);

    // A second import of the same threads is refused, and changes nothing.
    let before = threads(&dst);
    let o = dst.uwf(&["import", bundle.to_str().unwrap()]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("already exist"), "{}", stderr(&o));
    assert_eq!(threads(&dst), before);
    // With new ids both copies live, and the copy's child names the
    // copy's parent.
    let r = dst.json(&["import", "--new-ids", bundle.to_str().unwrap()]);
    let pairs = r["threads"].as_array().unwrap();
    let new_parent = pairs
        .iter()
        .find(|p| p[0] == parent.as_str())
        .map(|p| p[1].as_str().unwrap().to_owned())
        .unwrap();
    let new_child = pairs
        .iter()
        .find(|p| p[0] == child)
        .map(|p| p[1].as_str().unwrap().to_owned())
        .unwrap();
    assert_ne!(new_parent, parent);
    assert_eq!(dst.show(&new_child)["parent_thread"], new_parent.as_str());
    assert_eq!(threads(&dst).len(), 4);
    assert_eq!(text_log(&dst, &new_parent), text_log(&src, &parent));
}

fn a_damaged_bundle_is_refused_and_changes_nothing(b: TestBackend) {
    let src = Cli::new(b);
    let parent = shipped(&src);
    let o = src.uwf(&["export", &parent]);
    let bytes = o.stdout;
    let dst = Cli::new(b);
    let o = dst.uwf(&[
        "run",
        "examples/review.yaml",
        "-p",
        "already here",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let before = threads(&dst);
    let stats = dst.json(&["stats"]);
    // One flipped byte anywhere: the checksum says so.
    for at in [20, bytes.len() / 2, bytes.len() - 40] {
        let mut bad = bytes.clone();
        bad[at] ^= 0x01;
        let o = dst.uwf_stdin(&["import", "-"], &bad);
        assert_eq!(code(&o), Some(1), "byte {at}");
        assert!(stderr(&o).contains("not a valid bundle"), "{}", stderr(&o));
    }
    // A changed blob with a recomputed checksum: the blob's hash says so.
    let mut bad = bytes.clone();
    let at = bytes.len() - 40;
    bad[at] ^= 0x01;
    let body = bad.len() - 32;
    let digest = blake3::hash(&bad[..body]);
    bad[body..].copy_from_slice(digest.as_bytes());
    let o = dst.uwf_stdin(&["import", "-"], &bad);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("is damaged"), "{}", stderr(&o));
    // Cut short, empty, not a bundle at all.
    for bad in [
        &bytes[..bytes.len() / 2],
        &[][..],
        b"hello, world, this is not a bundle at all",
    ] {
        let o = dst.uwf_stdin(&["import", "-"], bad);
        assert_eq!(code(&o), Some(1));
        assert!(stderr(&o).contains("not a valid bundle"), "{}", stderr(&o));
    }
    assert_eq!(threads(&dst), before);
    let after = dst.json(&["stats"]);
    assert_eq!(
        after["blob_count"], stats["blob_count"],
        "no blob was written"
    );
    // Unknown ids are named.
    let o = src.uwf(&["export", "01M85T90DDDQKBS4EBF631FVBP"]);
    assert_eq!(code(&o), Some(1));
    assert!(
        stderr(&o).contains("01M85T90DDDQKBS4EBF631FVBP"),
        "{}",
        stderr(&o)
    );
}

process_conformance!(
    export_then_import_gives_the_same_threads,
    a_damaged_bundle_is_refused_and_changes_nothing,
);

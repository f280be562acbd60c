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
    // The summary is a note on stderr, which -q leaves out.
    assert!(
        stderr(&o).starts_with("exported 2 threads and "),
        "{}",
        stderr(&o)
    );
    let o = src.uwf(&["-q", "export", &parent]);
    assert_eq!(
        (o.stdout.as_slice(), stderr(&o).as_str()),
        (bytes.as_slice(), "")
    );

    let dst = Cli::new(b);
    // Trusted, the records come over whole (agent and directory too).
    let o = dst.uwf(&[
        "--json",
        "import",
        "--trust-agents",
        bundle.to_str().unwrap(),
    ]);
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
    let child = child["thread"].as_str().unwrap();
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
    // Imported without --trust-agents: the same history, no agent and no
    // directory of the bundle's maker.
    assert!(!src.show(&parent)["agent"].is_null());
    assert!(dst.show(&new_parent)["agent"].is_null());
    assert!(dst.show(&new_child)["agent"].is_null());
    assert_eq!(r["agents_dropped"], 2);
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

// ---- Issue 18: a bundle is data from a stranger. ----

/// Splits an unsigned bundle, lets `edit` change its records, and frames
/// it again with a recomputed checksum: what anyone can do to a bundle.
fn forge(bundle: &[u8], mut edit: impl FnMut(&mut uwf_db::thread::ThreadRecord)) -> Vec<u8> {
    let parsed = uwf_db::bundle::decode(bundle).unwrap();
    let mut out = b"UWFBNDL1".to_vec();
    out.extend_from_slice(&(parsed.records.len() as u32).to_le_bytes());
    for bytes in &parsed.records {
        let mut record = uwf_db::thread::ThreadRecord::decode(bytes).unwrap();
        edit(&mut record);
        let bytes = record.encode().unwrap();
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(&bytes);
    }
    out.extend_from_slice(&(parsed.blobs.len() as u64).to_le_bytes());
    for (hash, bytes) in &parsed.blobs {
        out.extend_from_slice(hash.as_bytes());
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    let digest = blake3::hash(&out);
    out.extend_from_slice(digest.as_bytes());
    out
}

/// A store with one completed review thread; returns (id, its bundle).
fn reviewed(env: &Cli) -> (String, Vec<u8>) {
    let r = env.json(&[
        "run",
        "examples/review.yaml",
        "-p",
        "review it",
        "--agent",
        "script:examples/review.scenario.yaml",
    ]);
    let id = r["thread"].as_str().unwrap().to_owned();
    let o = env.uwf(&["export", &id]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    (id, o.stdout)
}

fn an_imported_agent_never_runs_unless_trusted(b: TestBackend) {
    let src = Cli::new(b);
    let (id, bundle) = reviewed(&src);
    let dst = Cli::new(b);
    let pwned = dst.path("PWNED");
    let planted = format!("cmd:sh -c 'touch {}'", pwned.display());
    let forged = forge(&bundle, |r| r.agent = Some(planted.clone()));
    let o = dst.uwf_stdin(&["import", "-"], &forged);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("not kept") && stdout(&o).contains("--agent"),
        "the import says the agent was dropped: {}",
        stdout(&o)
    );
    assert!(dst.show(&id)["agent"].is_null(), "no agent is stored");
    // Resumed without --agent: nothing runs, and the error says what to do.
    let o = dst.uwf(&["thread", "resume", &id, "-p", "x"]);
    assert_ne!(code(&o), Some(0));
    assert!(
        stderr(&o).contains("has no agent") && stderr(&o).contains("--agent"),
        "{}",
        stderr(&o)
    );
    assert!(!pwned.exists(), "the bundle's command ran");
    // The same bundle imported with --trust-agents keeps it, and then it
    // runs: the test above could fail.
    let trusting = Cli::new(b);
    let o = trusting.uwf_stdin(&["import", "--trust-agents", "-"], &forged);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert_eq!(trusting.show(&id)["agent"], planted.as_str());
    let _ = trusting.uwf(&["thread", "resume", &id, "-p", "x"]);
    assert!(pwned.exists(), "with --trust-agents the stored agent runs");
}

fn an_edited_record_is_refused_naming_the_thread_and_field(b: TestBackend) {
    let src = Cli::new(b);
    let (id, bundle) = reviewed(&src);
    let parent = shipped(&src);
    let o = src.uwf(&["export", &parent]);
    let ship = o.stdout;
    let dst = Cli::new(b);
    let stranger = "01M85T90DDDQKBS4EBF631FVBP";
    type Edit = Box<dyn Fn(&mut uwf_db::thread::ThreadRecord)>;
    let cases: Vec<(&str, &[u8], Edit, &str)> = vec![
        ("seq 999", &bundle, Box::new(|r| r.seq = 999), "seq:"),
        ("seq 2", &bundle, Box::new(|r| r.seq = 2), "seq:"),
        (
            "running",
            &bundle,
            Box::new(|r| {
                r.claimed_status = Some(r.status);
                r.status = uwf_db::thread::ThreadStatus::Running;
            }),
            "status:",
        ),
        (
            "idle on an end node",
            &bundle,
            Box::new(|r| {
                r.status = uwf_db::thread::ThreadStatus::Idle;
                r.completed_at = None;
            }),
            "status:",
        ),
        (
            "failed with return code 0",
            &bundle,
            Box::new(|r| r.status = uwf_db::thread::ThreadStatus::Failed),
            "status:",
        ),
        (
            "completed_at unset",
            &bundle,
            Box::new(|r| r.completed_at = None),
            "completed_at:",
        ),
        (
            "last_end_seq",
            &bundle,
            Box::new(|r| r.last_end_seq = 1),
            "last_end_seq:",
        ),
        (
            "agent_steps",
            &bundle,
            Box::new(|r| r.agent_steps = Some(1000)),
            "agent_steps:",
        ),
        (
            "workflow name",
            &bundle,
            Box::new(|r| r.workflow = "other".into()),
            "workflow:",
        ),
        (
            "an unknown parent",
            &bundle,
            Box::new(move |r| r.parent_thread = Some(stranger.parse().unwrap())),
            "parent_thread:",
        ),
        (
            "an unknown active child",
            &bundle,
            Box::new(move |r| r.active_child = Some(stranger.parse().unwrap())),
            "active_child:",
        ),
        (
            // The child names its own parent as its active child.
            "an active child that is not its child",
            &ship,
            Box::new(|r| r.active_child = r.parent_thread),
            "active_child:",
        ),
        (
            "a label in a bad shape",
            &bundle,
            Box::new(|r| {
                r.labels.insert("bad key!".into(), "x".into());
            }),
            "labels:",
        ),
        (
            "a negative cost",
            &bundle,
            Box::new(|r| {
                let mut u = r.usage.clone().unwrap_or_default();
                u.cost_usd = -1.0;
                r.usage = Some(u);
            }),
            "usage:",
        ),
    ];
    for (what, bundle, edit, field) in cases {
        let forged = forge(bundle, &*edit);
        let o = dst.uwf_stdin(&["import", "-"], &forged);
        assert_eq!(code(&o), Some(1), "{what}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("the record of thread") && err.contains(field),
            "{what}: {err}"
        );
        assert!(threads(&dst).is_empty(), "{what}: nothing was imported");
        let stats = dst.json(&["stats"]);
        assert_eq!(stats["blob_count"], 0, "{what}: no blob was written");
    }
    // The untouched bundles import, and the edits above were all that
    // made them fail.
    let o = dst.uwf_stdin(&["import", "-"], &forge(&bundle, |_| {}));
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(dst.show(&id)["status"] == "completed");
}

fn a_signed_bundle_needs_its_key(b: TestBackend) {
    use std::os::unix::fs::PermissionsExt;
    let src = Cli::new(b);
    let (id, _) = reviewed(&src);
    let key = src.path("bundle.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let other = src.path("other.key");
    std::fs::write(&other, [8u8; 32]).unwrap();
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o600)).unwrap();
    let key = key.to_str().unwrap();
    let other = other.to_str().unwrap();
    let o = src.uwf(&["export", &id, "--sign", key]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let signed = o.stdout;
    assert_eq!(&signed[..8], b"UWFBNDS1");
    let unsigned = src.uwf(&["export", &id]).stdout;

    let dst = Cli::new(b);
    let o = dst.uwf(&["init"]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let refused = |args: &[&str], input: &[u8], says: &str| {
        let o = dst.uwf_stdin(args, input);
        assert_eq!(code(&o), Some(1), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
        assert!(threads(&dst).is_empty());
    };
    refused(&["import", "-"], &signed, "--verify KEYFILE");
    refused(
        &["import", "--verify", other, "-"],
        &signed,
        "not signed with this key",
    );
    refused(
        &["import", "--verify", key, "-"],
        &unsigned,
        "it is not signed",
    );
    // A signed bundle changed and given a plain checksum: no longer signed.
    let mut resigned = signed.clone();
    resigned[..8].copy_from_slice(b"UWFBNDL1");
    let body = resigned.len() - 32;
    let digest = blake3::hash(&resigned[..body]);
    resigned[body..].copy_from_slice(digest.as_bytes());
    refused(
        &["import", "--verify", key, "-"],
        &resigned,
        "it is not signed",
    );
    // One flipped byte in a signed bundle.
    let mut flipped = signed.clone();
    flipped[20] ^= 1;
    refused(
        &["import", "--verify", key, "-"],
        &flipped,
        "not signed with this key",
    );
    // A key file others may read, and a short one, are refused.
    std::fs::set_permissions(key, std::fs::Permissions::from_mode(0o644)).unwrap();
    refused(&["import", "--verify", key, "-"], &signed, "chmod 600");
    std::fs::set_permissions(key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let short = dst.file("short.key", "password");
    std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
    refused(&["import", "--verify", &short, "-"], &signed, "at least 32");
    // The right key.
    let o = dst.uwf_stdin(&["import", "--verify", key, "-"], &signed);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("signature matched"), "{}", stdout(&o));
    assert_eq!(dst.show(&id)["status"], "completed");
}

process_conformance!(
    export_then_import_gives_the_same_threads,
    a_damaged_bundle_is_refused_and_changes_nothing,
    an_imported_agent_never_runs_unless_trusted,
    an_edited_record_is_refused_naming_the_thread_and_field,
    a_signed_bundle_needs_its_key,
);

//! A tour of the storage core: starts a thread, appends role steps (each one
//! durable, compare-and-swap transaction), forks it, suspends the fork, ends
//! the original (moving it to history), pages its log and verifies the store.
//!
//! The store is a fresh temporary directory, removed at the end, so the tour
//! never writes into your real store (`$UWF_STORE` or `~/.uwf`). To keep it
//! and look around, name a directory:
//!
//! `cargo run --example tour -- /tmp/tour-store`, then
//! `cargo run -- --store /tmp/tour-store thread list`, `thread show ID`,
//! `thread log ID`.

use std::collections::BTreeMap;
use std::error::Error;
use std::path::PathBuf;

use uwf_db::thread::{EndSpec, NewThread, Next, StepWrite};
use uwf_db::{Blob, Store, StoreOptions, Value, WorkflowNode};

fn step(role: &str, status: &str, reply: &str, instruction: &str) -> StepWrite {
    StepWrite {
        role: role.into(),
        meta: BTreeMap::from([("$status".to_owned(), Value::Str(status.into()))]),
        reply: reply.into(),
        artifacts: vec![],
        instruction: instruction.into(),
        child_thread: None,
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    // Only an explicit argument names a lasting store; `UWF_STORE` is not
    // read, since it may well point at the user's real one.
    let mut temp = None;
    let path = match std::env::args_os().nth(1) {
        Some(dir) => PathBuf::from(dir),
        None => temp.insert(tempfile::tempdir()?).path().join("store"),
    };
    let store = Store::open(&path, StoreOptions::default())?;
    println!("store: {}", store.path().display());

    let workflow = store.put(&Blob::Workflow(WorkflowNode {
        definition: Value::Map(BTreeMap::from([(
            "name".to_owned(),
            Value::Str("review".into()),
        )])),
    }))?;
    let t = store.threads().low_level().start_thread(NewThread {
        workflow: "review".into(),
        workflow_hash: workflow,
        prompt: "Add a --json flag to the CLI".into(),
        max_rounds: 20,
        depth: 0,
        parent_state: None,
        parent_thread: None,
        next_role: "developer".into(),
        next_instruction: "Implement the change".into(),
        agent: None,
        cwd: None,
        next_location: None,
        labels: Default::default(),
    })?;
    println!("started thread {} ({})", t.id, t.status);

    let dev = store.threads().low_level().append_step(
        t.id,
        t.head,
        step(
            "developer",
            "review_needed",
            "Added the flag and tests.",
            "Implement the change",
        ),
        Next::Role {
            role: "reviewer".into(),
            instruction: "Review the change".into(),
            location: None,
        },
    )?;
    let rejected = store.threads().low_level().append_step(
        t.id,
        dev.record.head,
        step(
            "reviewer",
            "rejected",
            "The flag is not documented.",
            "Review the change",
        ),
        Next::Role {
            role: "developer".into(),
            instruction: "Fix this: document the flag".into(),
            location: None,
        },
    )?;
    // A stale head is refused: compare-and-swap.
    let stale = store.threads().low_level().append_step(
        t.id,
        dev.record.head,
        step("reviewer", "approved", "LGTM", "Review the change"),
        Next::Role {
            role: "tester".into(),
            instruction: "Run the tests".into(),
            location: None,
        },
    );
    println!(
        "append with a stale head: {}",
        stale.err().map_or("accepted?!".into(), |e| e.to_string())
    );

    // Fork at the developer's step: the reviewer runs again on the fork, and
    // this time the fork suspends to ask a human.
    let fork = store.threads().low_level().fork_thread(
        t.id,
        dev.record.head,
        Next::Role {
            role: "reviewer".into(),
            instruction: "Review the change".into(),
            location: None,
        },
    )?;
    let suspended = store.threads().low_level().append_step(
        fork.id,
        fork.head,
        step(
            "reviewer",
            "need_info",
            "Which output format?",
            "Review the change",
        ),
        Next::Suspend {
            role: "reviewer".into(),
            message: "Which JSON shape do you want?".into(),
        },
    )?;
    println!(
        "forked {} at seq {} -> {}",
        fork.id, fork.seq, suspended.record.status
    );

    let fixed = store.threads().low_level().append_step(
        t.id,
        rejected.record.head,
        step(
            "developer",
            "review_needed",
            "Documented the flag.",
            "Fix this: document the flag",
        ),
        Next::Role {
            role: "reviewer".into(),
            instruction: "Review the change".into(),
            location: None,
        },
    )?;
    let done = store.threads().low_level().append_step(
        t.id,
        fixed.record.head,
        step("reviewer", "approved", "Approved.", "Review the change"),
        Next::End(EndSpec {
            return_code: 0,
            summary: "Approved".into(),
            prompt: "Approved and merged".into(),
        }),
    )?;
    println!("thread {} {} (moved to history)", t.id, done.record.status);

    for e in store.threads().log(t.id, 50, None)? {
        println!("  #{} {:<10} {}", e.node.seq, e.node.role, e.hash.short(12));
    }
    let report = uwf_db::verify::verify(&store, |_| {})?;
    println!(
        "verify: {} blobs, {} refs, {} index entries: {}",
        report.blobs_checked,
        report.refs_checked,
        report.index_entries_checked,
        if report.is_ok() {
            "ok".to_owned()
        } else {
            format!("{} problems", report.problems.len())
        }
    );
    if temp.is_some() {
        println!("the store was temporary; pass a directory to keep it");
    } else {
        println!(
            "try: cargo run -- --store {0} thread list; cargo run -- --store {0} thread log {1}",
            path.display(),
            &t.id.to_string()[..10]
        );
    }
    Ok(())
}

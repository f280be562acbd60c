//! A tour of the storage core on the default store (`$UWF_STORE`, else
//! `~/.uwf`): writes a small thread-shaped chain of blobs, reads it back by
//! prefix, walks it and verifies the store.
//!
//! Run: `cargo run --example tour`

use std::collections::BTreeMap;
use std::error::Error;
use std::path::PathBuf;

use uwf_db::{Blob, StartNode, StateNode, Store, StoreError, StoreOptions, Value, WorkflowNode};

fn main() -> Result<(), Box<dyn Error>> {
    let path = std::env::var_os("UWF_STORE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".uwf")))
        .ok_or("set UWF_STORE or HOME")?;
    let store = Store::open(&path, StoreOptions::default())?;
    println!("store: {}", store.path().display());

    // One atomic, durable transaction: the workflow, the task, the start node
    // and two steps. Each blob's refs are checked inside the transaction.
    let head = store.write(|w| {
        let workflow = w.put_blob(&Blob::Workflow(WorkflowNode {
            definition: Value::Map(BTreeMap::from([(
                "name".to_owned(),
                Value::Str("review".into()),
            )])),
        }))?;
        let prompt = w.put_blob(&Blob::content("Add a --json flag to the CLI", []))?;
        let start = w.put_blob(&Blob::Start(StartNode {
            depth: 0,
            max_rounds: 20,
            name: "review".into(),
            parent_state: None,
            prompt,
            workflow,
        }))?;
        let mut ancestors = Vec::new();
        let mut head = start;
        for (seq, (role, status, reply)) in [
            ("developer", "review_needed", "Added the flag and tests."),
            ("reviewer", "approved", "Looks good."),
        ]
        .into_iter()
        .enumerate()
        {
            let content = w.put_blob(&Blob::content(reply, []))?;
            let input = w.put_blob(&Blob::content(format!("Your turn, {role}"), []))?;
            head = w.put_blob(&Blob::State(StateNode {
                ancestors: ancestors.clone(),
                child_thread: None,
                compact: None,
                content,
                input,
                meta: BTreeMap::from([("$status".to_owned(), Value::Str(status.into()))]),
                role: role.into(),
                seq: seq as u64 + 1,
                start,
                timestamp: w.now_ms(),
            }))?;
            ancestors.insert(0, head);
        }
        Ok::<_, StoreError>(head)
    })?;
    println!("head: {head}");

    let prefix = head.to_string()[..8].parse()?;
    println!(
        "{} resolves to {}",
        &head.to_string()[..8],
        store.resolve(&prefix)?
    );

    println!("reachable from the head:");
    store.walk(&head, |b| {
        println!(
            "  {}  {:<8}  {} bytes",
            b.hash.short(16),
            b.kind,
            b.bytes.len()
        );
        Ok::<_, StoreError>(())
    })?;

    let report = uwf_db::verify::verify(&store, |_| {})?;
    println!(
        "verify: {} blobs, {} refs, {}",
        report.blobs_checked,
        report.refs_checked,
        if report.is_ok() {
            "ok".to_owned()
        } else {
            format!("{} problems", report.problems.len())
        }
    );
    println!("try: cargo run -- cas get {}", head.short(8));
    Ok(())
}

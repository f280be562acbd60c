//! Journey tests for `uwf-db thread ...` on threads made through the library.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{append_n, new_thread, next, step};
use uwf_db::thread::{EndSpec, Next, ThreadId};
use uwf_db::{Store, StoreOptions};

const BIN: &str = env!("CARGO_BIN_EXE_uwf-db");

fn uwf(store: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("--store")
        .arg(store)
        .args(args)
        .env_remove("UWF_STORE")
        .output()
        .unwrap()
}

fn json(o: &Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// A store with a completed thread of 3 steps, an idle one and a fork.
fn fixture(dir: &Path) -> (ThreadId, ThreadId, ThreadId) {
    let store = Store::open(dir, StoreOptions::default()).unwrap();
    let done = new_thread(&store, "review");
    let r = append_n(&store, done.id, 2);
    store
        .append_step(
            done.id,
            r.head,
            step("rev", "approved", "Looks good\nsecond line"),
            Next::End(EndSpec {
                return_code: 0,
                summary: "Approved".into(),
                prompt: "Approved and tested".into(),
            }),
        )
        .unwrap();
    let idle = new_thread(&store, "plan");
    store
        .append_step(idle.id, idle.head, step("dev", "ok", "one"), next("rev"))
        .unwrap();
    store
        .record_failure(idle.id, "agent exited with status 3")
        .unwrap();
    let log = store.thread_log(done.id, 10, None).unwrap();
    let fork = store
        .fork_thread(
            done.id,
            log[2].hash,
            uwf_db::thread::Next::Role {
                role: "dev".into(),
                instruction: "again".into(),
            },
        )
        .unwrap();
    (done.id, idle.id, fork.id)
}

#[test]
fn list_filters_and_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let (done, idle, fork) = fixture(dir.path());
    let all = json(&uwf(dir.path(), &["--json", "thread", "list"]));
    let ids: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 3);
    assert_eq!(ids[0], fork.to_string(), "newest activity first");
    let completed = json(&uwf(
        dir.path(),
        &["--json", "thread", "list", "--status", "completed"],
    ));
    assert_eq!(completed[0]["id"], done.to_string().as_str());
    assert_eq!(completed.as_array().unwrap().len(), 1);
    let failed = json(&uwf(dir.path(), &["--json", "thread", "list", "--failed"]));
    assert_eq!(failed[0]["id"], idle.to_string().as_str());
    assert_eq!(failed[0]["last_error"], "agent exited with status 3");
    let plan = json(&uwf(
        dir.path(),
        &["--json", "thread", "list", "--workflow", "plan"],
    ));
    assert_eq!(plan.as_array().unwrap().len(), 1);
    let none = json(&uwf(
        dir.path(),
        &["--json", "thread", "list", "--until", "1h"],
    ));
    assert!(
        none.as_array().unwrap().is_empty(),
        "nothing older than an hour"
    );
    let recent = json(&uwf(
        dir.path(),
        &["--json", "thread", "list", "--since", "1h", "--limit", "2"],
    ));
    assert_eq!(recent.as_array().unwrap().len(), 2);
    let paged = json(&uwf(
        dir.path(),
        &["--json", "thread", "list", "--offset", "2"],
    ));
    assert_eq!(paged.as_array().unwrap().len(), 1);
    let o = uwf(dir.path(), &["thread", "list"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.starts_with("ID "), "{text}");
    assert!(text.contains("(last attempt failed)"));
    let o = uwf(dir.path(), &["thread", "list", "--status", "bogus"]);
    assert_eq!(o.status.code(), Some(2));
    let o = uwf(dir.path(), &["thread", "list", "--since", "yesterday"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn show_log_and_tree() {
    let dir = tempfile::tempdir().unwrap();
    let (done, idle, fork) = fixture(dir.path());
    let id = done.to_string();
    let show = json(&uwf(dir.path(), &["--json", "thread", "show", &id[..10]]));
    assert_eq!(show["status"], "completed");
    assert_eq!(show["done"], true);
    let show = json(&uwf(
        dir.path(),
        &["--json", "thread", "show", &fork.to_string()],
    ));
    assert_eq!(show["forked_from"]["thread"], id.as_str());
    assert_eq!(show["next_role"], "dev");
    let text =
        String::from_utf8_lossy(&uwf(dir.path(), &["thread", "show", &idle.to_string()]).stdout)
            .into_owned();
    assert!(text.contains("agent exited with status 3"), "{text}");

    let log = json(&uwf(dir.path(), &["--json", "thread", "log", &id]));
    let log = log.as_array().unwrap();
    assert_eq!(log.len(), 4, "three steps and the end node");
    assert_eq!(log[0]["role"], "__end__");
    assert_eq!(log[0]["status"], serde_json::Value::Null);
    assert_eq!(log[0]["content"], "Approved");
    assert_eq!(log[0]["input"], "Approved and tested");
    assert_eq!(log[1]["status"], "approved");
    assert_eq!(log[1]["content"], "Looks good\nsecond line");
    assert_eq!(log[1]["seq"], 3);
    for key in [
        "hash",
        "seq",
        "role",
        "status",
        "meta",
        "content",
        "input",
        "timestamp",
        "child_thread",
    ] {
        assert!(log[0].get(key).is_some(), "missing {key}");
    }
    // --limit and --before (exclusive) page back.
    let page = json(&uwf(
        dir.path(),
        &["--json", "thread", "log", &id, "--limit", "2"],
    ));
    assert_eq!(page.as_array().unwrap().len(), 2);
    let before = page[1]["hash"].as_str().unwrap();
    let rest = json(&uwf(
        dir.path(),
        &["--json", "thread", "log", &id, "--before", &before[..12]],
    ));
    let seqs: Vec<u64> = rest
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, vec![2, 1]);

    let tree = json(&uwf(dir.path(), &["--json", "thread", "tree", &id]));
    assert_eq!(tree["thread"]["thread"], id.as_str());
    assert!(tree["parents"].as_array().unwrap().is_empty());
}

#[test]
fn ids_errors_and_rm() {
    let dir = tempfile::tempdir().unwrap();
    let (done, _, _) = fixture(dir.path());
    let o = uwf(dir.path(), &["thread", "show", "01"]);
    assert_eq!(o.status.code(), Some(2), "too short");
    let o = uwf(dir.path(), &["thread", "show", "7ZZZZZZZ"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no thread matches"));
    let id = done.to_string();
    let o = json(&uwf(dir.path(), &["--json", "thread", "rm", &id]));
    assert_eq!(o["removed"], true);
    let o = uwf(dir.path(), &["thread", "show", &id]);
    assert_eq!(o.status.code(), Some(1));
    let o = uwf(dir.path(), &["verify"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

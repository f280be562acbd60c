//! Journey tests for `uwf-db thread ...` on threads made through the
//! library: list filters and shapes, show, log paging, tree, ids and rm.
#![cfg(feature = "cli")]

mod common;

use common::backend::TestBackend;
use common::cli::*;
use common::{append_n, new_thread, next, step};
use uwf_db::thread::{EndSpec, Next, ThreadId};

/// A store with a completed thread of 3 steps, an idle one and a fork.
fn fixture(cli: &Cli) -> (ThreadId, ThreadId, ThreadId) {
    let store = cli.open_store();
    let done = new_thread(&store, "review");
    let r = append_n(&store, done.id, 2);
    store
        .threads()
        .low_level()
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
        .threads()
        .low_level()
        .append_step(idle.id, idle.head, step("dev", "ok", "one"), next("rev"))
        .unwrap();
    store
        .threads()
        .low_level()
        .record_failure(idle.id, "agent exited with status 3")
        .unwrap();
    let log = store.threads().log(done.id, 10, None).unwrap();
    let fork = store
        .threads()
        .low_level()
        .fork_thread(
            done.id,
            log[2].hash,
            uwf_db::thread::Next::Role {
                role: "dev".into(),
                instruction: "again".into(),
                location: None,
            },
        )
        .unwrap();
    (done.id, idle.id, fork.id)
}

fn list_filters_and_shapes(b: TestBackend) {
    let cli = Cli::new(b);
    let (done, idle, fork) = fixture(&cli);
    let all = json_of(&cli.uwf(&["--json", "thread", "list"]));
    let ids: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["thread"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 3);
    assert_eq!(ids[0], fork.to_string(), "newest activity first");
    let completed = json_of(&cli.uwf(&["--json", "thread", "list", "--status", "completed"]));
    assert_eq!(completed[0]["thread"], done.to_string().as_str());
    assert_eq!(completed.as_array().unwrap().len(), 1);
    let failed = json_of(&cli.uwf(&["--json", "thread", "list", "--failed"]));
    assert_eq!(failed[0]["thread"], idle.to_string().as_str());
    assert_eq!(failed[0]["last_error"], "agent exited with status 3");
    let plan = json_of(&cli.uwf(&["--json", "thread", "list", "--workflow", "plan"]));
    assert_eq!(plan.as_array().unwrap().len(), 1);
    let none = json_of(&cli.uwf(&["--json", "thread", "list", "--until", "1h"]));
    assert!(
        none.as_array().unwrap().is_empty(),
        "nothing older than an hour"
    );
    let recent = json_of(&cli.uwf(&["--json", "thread", "list", "--since", "1h", "--limit", "2"]));
    assert_eq!(recent.as_array().unwrap().len(), 2);
    let paged = json_of(&cli.uwf(&["--json", "thread", "list", "--offset", "2"]));
    assert_eq!(paged.as_array().unwrap().len(), 1);
    let o = cli.uwf(&["thread", "list"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.starts_with("ID "), "{text}");
    assert!(text.contains("(last attempt failed)"));
    let o = cli.uwf(&["thread", "list", "--status", "bogus"]);
    assert_eq!(o.status.code(), Some(2));
    let o = cli.uwf(&["thread", "list", "--since", "yesterday"]);
    assert_eq!(o.status.code(), Some(2));
}

fn show_log_and_tree(b: TestBackend) {
    let cli = Cli::new(b);
    let (done, idle, fork) = fixture(&cli);
    let id = done.to_string();
    let show = json_of(&cli.uwf(&["--json", "thread", "show", &id[..10]]));
    assert_eq!(show["status"], "completed");
    assert_eq!(show["done"], true);
    let show = json_of(&cli.uwf(&["--json", "thread", "show", &fork.to_string()]));
    assert_eq!(show["forked_from"]["thread"], id.as_str());
    assert_eq!(show["next_role"], "dev");
    let text = String::from_utf8_lossy(&cli.uwf(&["thread", "show", &idle.to_string()]).stdout)
        .into_owned();
    assert!(text.contains("agent exited with status 3"), "{text}");

    let log = json_of(&cli.uwf(&["--json", "thread", "log", &id]));
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
    let page = json_of(&cli.uwf(&["--json", "thread", "log", &id, "--limit", "2"]));
    assert_eq!(page.as_array().unwrap().len(), 2);
    let before = page[1]["hash"].as_str().unwrap();
    let rest = json_of(&cli.uwf(&["--json", "thread", "log", &id, "--before", &before[..12]]));
    let seqs: Vec<u64> = rest
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, vec![2, 1]);

    let tree = json_of(&cli.uwf(&["--json", "thread", "tree", &id]));
    assert_eq!(tree["thread"]["thread"], id.as_str());
    assert!(tree["parents"].as_array().unwrap().is_empty());
}

fn ids_errors_and_rm(b: TestBackend) {
    let cli = Cli::new(b);
    let (done, _, _) = fixture(&cli);
    let o = cli.uwf(&["thread", "show", "01"]);
    assert_eq!(o.status.code(), Some(2), "too short");
    let o = cli.uwf(&["thread", "show", "7ZZZZZZZ"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no thread matches"));
    let id = done.to_string();
    let o = json_of(&cli.uwf(&["--json", "thread", "rm", &id]));
    assert_eq!(o["removed"], true);
    let o = cli.uwf(&["thread", "show", &id]);
    assert_eq!(o.status.code(), Some(1));
    let o = cli.uwf(&["verify"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

/// `thread rm` refuses a thread a live driver holds (the library's
/// `remove_undriven_thread`), and removes it once the driver is done.
fn rm_refuses_a_driven_thread(b: TestBackend) {
    let cli = Cli::new(b);
    let started = cli.json(&["thread", "start", "examples/review.yaml", "-p", "task"]);
    let id = started["thread"].as_str().unwrap().to_owned();
    let mut driver = cli.spawn(&["thread", "step", &id, "--agent", "cmd:sleep 3"]);
    cli.wait_until_running(&id);
    let o = cli.uwf(&["thread", "rm", &id]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("is being driven by another process; stop that driver first"),
        "{}",
        stderr(&o)
    );
    driver.wait().unwrap();
    assert_ne!(cli.show(&id)["status"], "running");
    let o = cli.json(&["thread", "rm", &id]);
    assert_eq!(o["removed"], true);
}

/// `thread list --cursor`: a page with more after it names where the next
/// starts (on stderr); following it lists every thread once, newest first.
fn list_pages_by_cursor(b: TestBackend) {
    let cli = Cli::new(b);
    let mut started = Vec::new();
    for i in 0..5 {
        let t = cli.json(&[
            "thread",
            "start",
            "examples/review.yaml",
            "-p",
            &format!("t{i}"),
        ]);
        started.push(t["thread"].as_str().unwrap().to_owned());
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut args = vec!["--json", "thread", "list", "--limit", "2"];
        if let Some(c) = &cursor {
            args.extend(["--cursor", c.as_str()]);
        }
        let o = cli.uwf(&args);
        assert_eq!(code(&o), Some(0), "{}", stderr(&o));
        let page: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        for t in page.as_array().unwrap() {
            seen.push(t["thread"].as_str().unwrap().to_owned());
        }
        let err = stderr(&o);
        match err.split("--cursor ").nth(1) {
            Some(rest) => cursor = Some(rest.split_whitespace().next().unwrap().to_owned()),
            None => break,
        }
    }
    // The last page was full (4 = 2 pages of 2) or short (the 5th): either
    // way nothing is missed or repeated.
    started.reverse();
    assert_eq!(seen, started);
    // A page that holds the last thread names no next page; one short of
    // it does.
    let o = cli.uwf(&["thread", "list", "--limit", "5"]);
    assert!(
        !stderr(&o).contains("more:"),
        "nothing follows: {}",
        stderr(&o)
    );
    assert_eq!(stdout(&o).lines().count(), 6, "a header and five threads");
    let o = cli.uwf(&["thread", "list", "--limit", "4"]);
    assert!(
        stderr(&o).contains("more: uwf-db thread list --cursor "),
        "{}",
        stderr(&o)
    );
    let o = cli.uwf(&["thread", "list", "--cursor", "nope"]);
    assert_eq!(code(&o), Some(2), "bad usage: {}", stderr(&o));
    assert!(stderr(&o).contains("is not a cursor"), "{}", stderr(&o));
}

process_conformance!(
    list_pages_by_cursor,
    list_filters_and_shapes,
    show_log_and_tree,
    ids_errors_and_rm,
    rm_refuses_a_driven_thread,
);

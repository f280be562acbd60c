//! Two processes append to one thread with the same expected head: exactly
//! one commits, the other gets a conflict, and the chain has no lost or
//! duplicated step. The child processes are this test binary running the
//! ignored `child_appender` test.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use uwf_db::thread::{ThreadError, ThreadId};
use uwf_db::{Store, StoreOptions};

#[test]
#[ignore = "helper: run by race_between_processes in a child process"]
fn child_appender() {
    let (Ok(store), Ok(thread), Ok(head), Ok(go)) = (
        std::env::var("UWF_TEST_STORE"),
        std::env::var("UWF_TEST_THREAD"),
        std::env::var("UWF_TEST_HEAD"),
        std::env::var("UWF_TEST_GO"),
    ) else {
        return;
    };
    let store = Store::open(&store, StoreOptions::default()).unwrap();
    let id: ThreadId = thread.parse().unwrap();
    let head = head.parse().unwrap();
    // Wait for the starting gun so both processes race.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !Path::new(&go).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let tag = std::process::id().to_string();
    match store.append_step(
        id,
        head,
        common::step("dev", "ok", &tag),
        common::next("dev"),
    ) {
        Ok(_) => println!("RESULT:OK"),
        Err(ThreadError::Conflict { .. }) => println!("RESULT:CONFLICT"),
        Err(e) => println!("RESULT:ERROR {e}"),
    }
}

#[test]
fn race_between_processes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let (id, mut head) = {
        let store = Store::open(&path, StoreOptions::default()).unwrap();
        let t = common::new_thread(&store, "race");
        (t.id, t.head)
    };
    let rounds = 5;
    for round in 0..rounds {
        let go = dir.path().join(format!("go-{round}"));
        let children: Vec<_> = (0..2)
            .map(|_| {
                Command::new(std::env::current_exe().unwrap())
                    .args(["--ignored", "--exact", "child_appender", "--nocapture"])
                    .env("UWF_TEST_STORE", &path)
                    .env("UWF_TEST_THREAD", id.to_string())
                    .env("UWF_TEST_HEAD", head.to_string())
                    .env("UWF_TEST_GO", &go)
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        std::fs::write(&go, b"go").unwrap();
        let results: Vec<String> = children
            .into_iter()
            .map(|c| String::from_utf8(c.wait_with_output().unwrap().stdout).unwrap())
            .collect();
        let ok = results.iter().filter(|o| o.contains("RESULT:OK")).count();
        let conflict = results
            .iter()
            .filter(|o| o.contains("RESULT:CONFLICT"))
            .count();
        assert_eq!((ok, conflict), (1, 1), "round {round}: {results:?}");
        let store = Store::open(&path, StoreOptions::default()).unwrap();
        head = store.thread(id).unwrap().unwrap().head;
    }
    let store = Store::open(&path, StoreOptions::default()).unwrap();
    let log = store.thread_log(id, 100, None).unwrap();
    assert_eq!(log.len(), rounds, "no lost or duplicated step");
    assert!(uwf_db::verify::verify(&store, |_| {}).unwrap().is_ok());
}

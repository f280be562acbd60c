//! Two processes append to one thread with the same expected head: exactly
//! one commits, the other gets a conflict, and the chain has no lost or
//! duplicated step. The child processes are this test binary running the
//! ignored `child_appender` test, told the backend and the store in
//! `UWF_TEST_BACKEND` and `UWF_TEST_STORE`.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::backend::TestBackend;
use uwf_db::Durability;
use uwf_db::thread::{ThreadError, ThreadId};

#[test]
#[ignore = "helper: run by race_between_processes in a child process"]
fn child_appender() {
    let (Ok(backend), Ok(store), Ok(thread), Ok(head), Ok(go)) = (
        std::env::var("UWF_TEST_BACKEND"),
        std::env::var("UWF_TEST_STORE"),
        std::env::var("UWF_TEST_THREAD"),
        std::env::var("UWF_TEST_HEAD"),
        std::env::var("UWF_TEST_GO"),
    ) else {
        return;
    };
    let backend = TestBackend::from_name(&backend).unwrap();
    let store = backend.open_arg(&store, Durability::Sync);
    let id: ThreadId = thread.parse().unwrap();
    let head = head.parse().unwrap();
    // Wait for the starting gun so both processes race.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !Path::new(&go).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let tag = std::process::id().to_string();
    match store.threads().low_level().append_step(
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

fn race_between_processes(b: TestBackend) {
    let mut store = b.durable();
    let (id, mut head) = {
        let t = common::new_thread(&store, "race");
        (t.id, t.head)
    };
    // Only the children hold the store while they race.
    store.close();
    let arg = store.location().arg_str();
    let rounds = 5;
    for round in 0..rounds {
        let go = store.scratch().join(format!("go-{round}"));
        let children: Vec<_> = (0..2)
            .map(|_| {
                Command::new(std::env::current_exe().unwrap())
                    .args(["--ignored", "--exact", "child_appender", "--nocapture"])
                    .env("UWF_TEST_BACKEND", b.name())
                    .env("UWF_TEST_STORE", &arg)
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
        store.reopen();
        head = store.threads().get(id).unwrap().unwrap().head;
        store.close();
    }
    store.reopen();
    let log = store.threads().log(id, 100, None).unwrap();
    assert_eq!(log.len(), rounds, "no lost or duplicated step");
    assert!(uwf_db::verify::verify(&store, |_| {}).unwrap().is_ok());
}

process_conformance!(race_between_processes);
